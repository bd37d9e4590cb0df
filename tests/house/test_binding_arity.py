"""The binding stays thin: no function or method it exposes takes more than six arguments
(settings travel as one tuple or dict the facade builds, e.g. a table's placement), so a
new setting does not grow every signature between Python and the core."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "crates" / "tiermem-py" / "src"
MOST = 6
FN = re.compile(r"\n\s*(?:pub(?:\(crate\))? )?fn (\w+)(?:<[^>]*>)?\((.*?)\)\s*(?:->|\{|where)", re.S)


def _arguments(params: str) -> list[str]:
    """The parameters a Python caller passes: not self, the GIL token or the class."""
    depth, cur, out = 0, "", []
    for ch in params:
        depth += ch in "<(["
        depth -= ch in ">)]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    skip = re.compile(r"^\s*(&?\s*(mut\s+)?)?(self|slf|py|_py|cls)\b|Python<")
    return [p for p in (x.strip() for x in out) if p and not skip.search(p)]


def test_no_binding_function_takes_more_than_six_arguments() -> None:
    wide = []
    for path in sorted(SRC.rglob("*.rs")):
        text = path.read_text(encoding="utf-8")
        for m in FN.finditer(text):
            before = text[max(0, m.start() - 400) : m.start()]
            exposed = "#[pyfunction]" in before.split("\n}\n")[-1] or "#[pymethods]" in text
            if exposed and len(_arguments(m.group(2))) > MOST:
                wide.append(f"{path.relative_to(SRC)}: {m.group(1)} takes {len(_arguments(m.group(2)))}")
    assert not wide, wide
