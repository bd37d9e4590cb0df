"""What the C API's tests share: where the library and its header are, and the library
built (here, if `make capi` has not run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "target" / "release"
INCLUDE = ROOT / "crates" / "tiermem-capi" / "include"


@pytest.fixture(scope="session")
def lib() -> Path:
    """The directory of libtiermem.so and libtiermem.a."""
    if not (LIB / "libtiermem.so").exists() or not (LIB / "libtiermem.a").exists():
        subprocess.run(["cargo", "build", "--release", "-p", "tiermem-capi"], cwd=ROOT, check=True, timeout=1800)
    return LIB
