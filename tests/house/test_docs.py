"""`make docs`'s reference check: a docstring's cross-reference to something that does not
exist is reported by name; one that exists (a class, a method, a dataclass field, a module)
is not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "docs.py"


def _docs():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("tiermem_docs_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_broken_references_are_named_and_good_ones_pass(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "tiermemdocfake.py").write_text(
        '"""Refers to :class:`~tiermem.embedding.EmbeddingTable`, :meth:`tiermem.embedding.EmbeddingTable.lookup`,\n'
        ":mod:`tiermem.embedding.block.admission`, :attr:`tiermem.embedding.config.Placement.admission` and\n"
        ':func:`tiermem.embedding.no_such_function`."""\n'
        "def f():\n"
        '    """And :class:`~tiermem.NoSuchClass`."""\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = _docs().broken_references(["tiermemdocfake"])
    sys.modules.pop("tiermemdocfake", None)
    assert problems == [
        "tiermemdocfake: the docstring refers to tiermem.embedding.no_such_function, which does not exist",
        "tiermemdocfake.f: the docstring refers to tiermem.NoSuchClass, which does not exist",
    ]
