"""Library code does not print: a command's output goes through ``tiermem.report`` (the
``report.output.show`` helper) from the CLI's handlers, and diagnostics through ``logging``.
Only ``tiermem/cli`` and ``tiermem/report`` may call ``print``."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "python" / "tiermem"
ALLOWED = ("cli", "report")


def test_no_print_call_in_library_code() -> None:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"print() in library code (use report.output.show from a command, or logging): {found}"
