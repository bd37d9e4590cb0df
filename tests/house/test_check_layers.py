"""The crates' floor checker (``scripts/check_layers.py``) reads what the compiler reads: it
strips comments and every kind of string without losing code, resolves ``super::`` and
``self::`` paths from the file's module, and catches a planted cycle."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "check_layers.py"


@pytest.fixture(scope="module")
def layers():
    spec = importlib.util.spec_from_file_location("check_layers", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = mod
    spec.loader.exec_module(mod)
    return mod


def refs(layers, code: str, path: list[str]) -> set[str]:
    return layers.references(layers.strip(code), path)


def test_a_continued_string_hides_no_code(layers) -> None:
    # Before: the lexer's `\\.` did not cross the line break, so the string never closed
    # and swallowed the reference after it.
    code = 'let s = "a \\\n b";\nuse crate::cache::X;\n'
    assert refs(layers, code, ["table"]) == {"cache"}


def test_raw_byte_and_char_literals_are_strings_not_code(layers) -> None:
    code = (
        'let a = r#"crate::hidden " quote"#;\n'
        'let b = br"crate::hidden2";\n'
        "let c = '\"'; let d = '\\''; fn f<'a>(x: &'a u8) {}\n"
        "use crate::home::H;\n"
        "/* crate::in_comment /* nested */ crate::still_comment */\n"
        "// crate::line_comment\n"
    )
    assert refs(layers, code, ["table"]) == {"home"}


def test_super_and_self_paths_resolve_from_the_files_module(layers) -> None:
    # src/table.rs: super is the crate root.
    assert refs(layers, "use super::cache::{A, B};\nuse super::{home, locks::x};\n", ["table"]) == {"cache", "home", "locks"}
    # src/blockfile/relayout.rs: super is blockfile, super::super the root.
    assert refs(layers, "use super::format::BLOCK;\nuse super::super::table::T;\n", ["blockfile", "relayout"]) == {
        "blockfile",
        "table",
    }
    # An inline test module: its super is the file's own module.
    assert refs(layers, "mod tests {\n use super::*;\n use super::super::cache::C;\n}\n", ["table"]) == {"cache"}
    assert refs(layers, "use self::inner::x;\n", ["cache"]) == {"cache"}


def test_a_planted_cycle_is_caught(layers) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert layers._cycles(graph) == [["a", "b", "c", "a"]]
    assert layers._cycles({"a": {"b"}, "b": set()}) == []


def test_the_crates_have_no_cycle_and_keep_their_floors(layers) -> None:
    assert layers.check_core() + layers.check_crates() == []
