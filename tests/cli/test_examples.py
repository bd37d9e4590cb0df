"""Every script in examples/ runs."""

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
