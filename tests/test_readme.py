"""The README's Python example runs and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- README-EXAMPLE-START -->")[1].split("<!-- README-EXAMPLE-END -->")[0]
    return block.split("```python")[1].split("```")[0]


def test_readme_example_runs_and_matches_its_comments() -> None:
    code = _example()
    assert len([line for line in code.strip().splitlines() if line.strip()]) <= 10
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    expected = [m.group(1).strip() for line in code.splitlines() if "print(" in line
                for m in [re.search(r"#\s*(.+)$", line)] if m]
    assert out.getvalue().strip().splitlines() == expected
