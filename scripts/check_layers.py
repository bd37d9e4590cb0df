#!/usr/bin/env python3
"""Check the Rust crates' floors (run by ``make lint``).

* ``tiermem-core``: every top-level module sits on a floor (``FLOORS``, bottom first) and
  refers (``crate::m``, ``super::`` out of its own module is not allowed) only to modules on
  its own floor or below; modules on one floor do not refer to each other in both
  directions. A module missing from ``FLOORS`` is an error, so a new module gets a floor.
* ``tiermem-embed`` and ``tiermem-hpc`` each depend on ``tiermem-core`` alone among the
  workspace's crates, and on no Python crate; their modules form no cycle.
* ``tiermem-py`` (the binding) is the only crate that depends on ``pyo3``.
* ``tiermem-capi`` (the C ABI) depends on ``tiermem-core`` and ``tiermem-hpc`` (the staging
  decision and its calibration, for HPC codes) among the workspace's crates: C sees memory
  management and staging, not Python or the embedding tables.

References (``crate::``, ``super::`` and ``self::`` paths, groups included, resolved from the
file's module and its inline modules) are read from the source after a lexer removes
comments, strings of every kind and character literals; test modules (``#[cfg(test)] mod
tests``) count too: a unit test may not reach up either.
Exit status 1 with one line per violation.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ROOT / "crates"

#: tiermem-core's floors, bottom first. Modules on one floor may use each other (one way).
FLOORS: list[tuple[str, ...]] = [
    ("error", "process", "lock_order"),
    ("arch",),
    ("sys",),
    ("counters",),
    ("calib",),
    ("device",),
    ("copy",),
    ("heap",),
    ("mechanism",),
    ("model",),
    ("policy",),
    ("manager",),
    ("traits",),
    ("measure",),
]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strip(code: str) -> str:
    """``code`` with comments (nested block comments too), string literals (escapes and line
    continuations, raw ``r#"..."#``, byte and C strings) and character literals blanked out,
    lifetimes kept: what is left is the code's tokens, with newlines where they were."""
    out: list[str] = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
            continue
        if code.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if code.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif code.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if code[i] == "\n" else "")
                    i += 1
            continue
        raw = re.match(r'(?:b|c)?r(#*)"', code[i:]) if c in "bcr" and (i == 0 or not _is_ident(code[i - 1])) else None
        if raw:
            end = '"' + raw.group(1)
            j = code.find(end, i + raw.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * code.count("\n", i, j))
            i = j
            continue
        if c == '"' or (c in "bc" and code.startswith('"', i + 1) and (i == 0 or not _is_ident(code[i - 1]))):
            j = i + (1 if c == '"' else 2)
            while j < n and code[j] != '"':
                j += 2 if code[j] == "\\" else 1
            out.append('""' + "\n" * code.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            # A char literal ('x', '\n', '\u{1F600}', '"') or a lifetime ('a, 'static).
            m = re.match(r"'(?:\\(?:u\{[0-9A-Fa-f]*\}|x[0-9A-Fa-f]{2}|.)|[^\\'\n])'", code[i:])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _is_ident(c: str) -> bool:
    return c.isalnum() or c == "_"


def module_path(src: Path, f: Path) -> list[str]:
    """The module path of file ``f`` under ``src`` (``[]`` for the crate root)."""
    parts = list(f.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return parts


_PATH = re.compile(r"\b(crate|super|self)((?:::(?:super|self))*)::(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}|[A-Za-z_][A-Za-z0-9_]*)")
_INLINE_MOD = re.compile(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{")


def references(code: str, path: list[str]) -> set[str]:
    """The crate's top-level modules the (stripped) ``code`` of the module at ``path`` refers
    to through ``crate::``, ``super::`` and ``self::`` paths, inline modules (``mod tests {
    use super::*; }``) counted: ``super::x`` there is the file's own module."""
    depth_at: list[int] = []  # brace depth each open inline module started at
    mods: list[str] = []
    refs: set[str] = set()
    depth = 0
    starts = {m.start(): m.group(1) for m in _INLINE_MOD.finditer(code)}
    paths = {m.start(): m for m in _PATH.finditer(code)}
    for i, c in enumerate(code):
        if i in starts:
            mods.append(starts[i])
            depth_at.append(depth)
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth_at and depth == depth_at[-1]:
                depth_at.pop()
                mods.pop()
        m = paths.get(i)
        if m is None or (i > 0 and _is_ident(code[i - 1])):
            continue
        here = path + mods
        base = [] if m.group(1) == "crate" else (here[:-1] if m.group(1) == "super" else list(here))
        for step in re.findall(r"super|self", m.group(2)):
            if step == "super":
                base = base[:-1]
        names = [m.group(3)]
        if names[0].startswith("{"):
            names = [g.strip().split("::")[0] for g in names[0][1:-1].split(",")]
        for name in names:
            full = base + ([name] if name and _IDENT.fullmatch(name) else [])
            if full and full[0] != "self":
                refs.add(full[0])
    return refs


def module_graph(crate: str) -> dict[str, set[str]]:
    """Top-level module -> top-level modules it refers to (``lib`` for the crate root)."""
    src = CRATES / crate / "src"
    graph: dict[str, set[str]] = defaultdict(set)
    tops = {module_path(src, f)[0] for f in src.rglob("*.rs") if module_path(src, f)}
    for f in sorted(src.rglob("*.rs")):
        path = module_path(src, f)
        top = path[0] if path else "lib"
        graph[top]
        for m in references(strip(f.read_text(encoding="utf-8")), path):
            if m != top and m in tops:
                graph[top].add(m)
    return graph


def check_core() -> list[str]:
    floor_of = {m: i for i, fl in enumerate(FLOORS) for m in fl}
    graph = module_graph("tiermem-core")
    errors = []
    for mod, uses in sorted(graph.items()):
        if mod == "lib":
            continue
        if mod not in floor_of:
            errors.append(f"tiermem-core: module '{mod}' has no floor; add it to FLOORS in {Path(__file__).name}")
            continue
        for u in sorted(uses):
            if u not in floor_of:
                continue  # reported above as a module without a floor
            if floor_of[u] > floor_of[mod]:
                errors.append(f"tiermem-core: '{mod}' (floor {floor_of[mod]}) uses '{u}' (floor {floor_of[u]}), a floor above it")
            elif floor_of[u] == floor_of[mod] and mod in graph.get(u, ()):
                errors.append(f"tiermem-core: '{mod}' and '{u}' use each other")
    return errors


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    seen: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(n: str) -> None:
        seen[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if seen.get(m) == 1:
                found.append(stack[stack.index(m) :] + [m])
            elif m not in seen:
                visit(m)
        stack.pop()
        seen[n] = 2

    for n in sorted(graph):
        if n not in seen:
            visit(n)
    return found


def _deps(crate: str) -> set[str]:
    manifest = tomllib.loads((CRATES / crate / "Cargo.toml").read_text(encoding="utf-8"))
    return set(manifest.get("dependencies", {}))


def check_crates() -> list[str]:
    errors = []
    workspace = {p.name for p in CRATES.iterdir() if (p / "Cargo.toml").exists()}
    allowed = {"tiermem-embed": {"tiermem-core"}, "tiermem-hpc": {"tiermem-core"}, "tiermem-capi": {"tiermem-core", "tiermem-hpc"}}
    for crate in sorted(set(allowed) & workspace):
        deps = _deps(crate) & workspace
        if not deps <= allowed[crate] or "tiermem-core" not in deps:
            errors.append(f"{crate} may depend on {sorted(allowed[crate])} among the workspace's crates, not {sorted(deps)}")
    for crate in sorted(workspace - {"tiermem-py"}):
        if "pyo3" in _deps(crate):
            errors.append(f"{crate} depends on pyo3; only the binding (tiermem-py) may")
    for crate in sorted({"tiermem-embed", "tiermem-hpc"} & workspace):
        for cyc in _cycles({k: v for k, v in module_graph(crate).items() if k != "lib"}):
            errors.append(f"{crate}: modules use each other in a cycle: " + " -> ".join(cyc))
    return errors


def main() -> int:
    errors = check_core() + check_crates()
    for e in errors:
        print(e)
    if not errors:
        print(f"crate floors: ok ({len(FLOORS)} floors in tiermem-core; tiermem-embed and tiermem-hpc on tiermem-core alone, tiermem-capi on core and hpc)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
