"""Every module of the package sits on a floor of the import-linter layers contract (a
top-level module or package missing from it would escape the floors' check)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_top_level_module_is_on_a_floor() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = next(c for c in conf["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    on_floor = {m.strip() for layer in layers for m in layer.split("|")}
    pkg = ROOT / "python" / "tiermem"
    tops = {f"tiermem.{p.stem}" for p in pkg.glob("*.py") if p.stem != "__init__"}
    tops |= {f"tiermem.{p.name}" for p in pkg.iterdir() if (p / "__init__.py").exists()}
    # The native module is below every floor (the contract ignores `from . import _tiermem`).
    missing = sorted(m for m in tops if m not in on_floor and not re.fullmatch(r"tiermem\._tiermem", m))
    assert not missing, f"modules on no floor of pyproject.toml's layers contract: {missing}"
