#!/usr/bin/env python3
"""Check the Rust crates' floors (run by ``make lint``).

* ``tiermem-core``: every top-level module sits on a floor (``FLOORS``, bottom first) and
  refers (``crate::m``, ``super::`` out of its own module is not allowed) only to modules on
  its own floor or below; modules on one floor do not refer to each other in both
  directions. A module missing from ``FLOORS`` is an error, so a new module gets a floor.
* ``tiermem-embed`` depends on ``tiermem-core`` alone among the workspace's crates, and on
  no Python crate; its modules form no cycle.
* ``tiermem-py`` (the binding) is the only crate that depends on ``pyo3``.

References are read from the source with comments and string literals removed; test
modules (``#[cfg(test)] mod tests``) count too: a unit test may not reach up either.
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
    ("calib", "pattern", "criteo"),
    ("device",),
    ("copy",),
    ("heap",),
    ("mechanism",),
    ("model",),
    ("policy",),
    ("manager",),
    ("traits",),
    ("measure",),
    ("hpc",),
]

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_CRATE_REF = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
_CRATE_GROUP = re.compile(r"\bcrate::\{([^}]*)\}")


def _code(path: Path) -> str:
    return _STRING.sub('""', _COMMENT.sub("", path.read_text(encoding="utf-8")))


def _top_module(src: Path, f: Path) -> str:
    rel = f.relative_to(src)
    return rel.parts[0].removesuffix(".rs")


def module_graph(crate: str) -> dict[str, set[str]]:
    """Top-level module -> top-level modules it refers to (``lib`` for the crate root)."""
    src = CRATES / crate / "src"
    graph: dict[str, set[str]] = defaultdict(set)
    for f in sorted(src.rglob("*.rs")):
        top = _top_module(src, f)
        graph[top]
        code = _code(f)
        grouped = [g.strip().split("::")[0] for grp in _CRATE_GROUP.findall(code) for g in grp.split(",")]
        for m in _CRATE_REF.findall(code) + [g for g in grouped if g]:
            if m != top and m not in ("Error", "Result", "bail", "ensure"):
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
                errors.append(f"tiermem-core: '{mod}' (floor {floor_of[mod]}) uses '{u}' (floor {floor_of[u]}), "
                              "a floor above it")
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
                found.append(stack[stack.index(m):] + [m])
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
    embed = _deps("tiermem-embed")
    if embed & workspace != {"tiermem-core"}:
        errors.append(f"tiermem-embed must depend on tiermem-core alone among the workspace's crates, "
                      f"not {sorted(embed & workspace)}")
    for crate in sorted(workspace - {"tiermem-py"}):
        if "pyo3" in _deps(crate):
            errors.append(f"{crate} depends on pyo3; only the binding (tiermem-py) may")
    for cyc in _cycles({k: v for k, v in module_graph("tiermem-embed").items() if k != "lib"}):
        errors.append("tiermem-embed: modules use each other in a cycle: " + " -> ".join(cyc))
    return errors


def main() -> int:
    errors = check_core() + check_crates()
    for e in errors:
        print(e)
    if not errors:
        print(f"crate floors: ok ({len(FLOORS)} floors in tiermem-core; tiermem-embed on tiermem-core alone)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
