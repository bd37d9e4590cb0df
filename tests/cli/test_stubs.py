"""The stub file lists exactly what the native module exports."""

from __future__ import annotations

import ast
from pathlib import Path

from tiermem import _tiermem


def _stub_names() -> dict[str, set[str]]:
    path = Path(__file__).resolve().parents[2] / "python" / "tiermem" / "_tiermem.pyi"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: dict[str, set[str]] = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")}
            out[node.name] |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            out[""].add(node.name)
        elif isinstance(node, ast.FunctionDef):
            out[""].add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not node.target.id.startswith("_"):
            out[""].add(node.target.id)  # the exported vocabularies
    return out


def test_stub_matches_native_module() -> None:
    stub = _stub_names()
    native = {n for n in dir(_tiermem) if not n.startswith("_")}
    assert stub[""] == native
    for cls in ("Manager", "Recorder", "DataApi", "Table", "TwoLmModel"):
        methods = {n for n in dir(getattr(_tiermem, cls)) if not n.startswith("_")}
        assert stub[cls] == methods, cls
