"""Every script in examples/ runs, and every plan script in examples/plan/ (read by
`tiermem plan --script`) gives a step that trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out.png")], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    if script.stem == "trace_plot":
        assert (tmp_path / "out.png").stat().st_size > 10_000


PLAN_SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "examples" / "plan").glob("*.py"))


@pytest.mark.parametrize("script", PLAN_SCRIPTS, ids=[p.stem for p in PLAN_SCRIPTS])
def test_plan_script_trains(script: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    from tiermem.plan.torch.script import load_script

    s = load_script(script).start()
    loss, seconds = s.step()
    assert loss > 0 and seconds > 0
    s.close()
