"""The README's Python examples run and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    blocks = [b.split("<!-- README-EXAMPLE-END -->")[0] for b in text.split("<!-- README-EXAMPLE-START -->")[1:]]
    return [b.split("```python")[1].split("```")[0] for b in blocks]


@pytest.mark.parametrize("index", range(len(_examples())))
def test_readme_examples_run_and_match_their_comments(index: int) -> None:
    code = _examples()[index]
    if "torch" in code:
        pytest.importorskip("torch")
    assert len([line for line in code.strip().splitlines() if line.strip()]) <= 10
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        # `import torchrec` loads fbgemm-gpu-cpu, which warns of the GPU operators its CPU
        # build lacks (not about anything the example does).
        warnings.filterwarnings(
            "ignore",
            message=r"(?s).*(Failed to import: fbgemm_gpu|fbgemm_gpu\.\S+ is now DEPRECATED)",
            category=DeprecationWarning,
        )
        # DCP says it runs without a process group: the example is one process on purpose.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        exec(compile(code, str(README), "exec"), {})
    expected = [
        m.group(1).strip() for line in code.splitlines() if "print(" in line for m in [re.search(r"#\s*(.+)$", line)] if m
    ]
    assert out.getvalue().strip().splitlines() == expected
