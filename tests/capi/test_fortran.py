"""The Fortran module over the C API: its constants equal the generated header's, and the
Fortran STREAM example (`examples/fortran/stream.f90`: pointers of rank 1 and 2 from
`c_f_pointer`, a move to the slow device, a refused call's status and message) compiles
with gfortran and runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import INCLUDE, ROOT

MODULE = ROOT / "crates" / "tiermem-capi" / "fortran" / "tiermem.f90"


def _header_constants() -> dict[str, int]:
    text = (INCLUDE / "tiermem.h").read_text()
    found = {k: int(v) for k, v in re.findall(r"#define (TM_\w+) (-?\d+)", text)}
    found |= {k: int(v) for k, v in re.findall(r"^\s*(TM_\w+) = (-?\d+),?$", text, re.M)}
    return found


def test_the_modules_constants_are_the_headers() -> None:
    header = _header_constants()
    ours = {k: int(v) for k, v in re.findall(r"parameter, public :: (TM_\w+) = (-?\d+)", MODULE.read_text())}
    assert header and ours == header


def test_fortran_stream_runs_and_checks_its_results(lib: Path, tmp_path: Path) -> None:
    fc = shutil.which("gfortran")
    if fc is None:
        pytest.skip("no gfortran on PATH (make sysdeps installs it)")
    for cmd in (
        [fc, "-std=f2018", "-c", str(MODULE), "-J", str(tmp_path), "-o", str(tmp_path / "tiermem.o")],
        [
            fc,
            "-std=f2018",
            "-I",
            str(tmp_path),
            str(ROOT / "examples" / "fortran" / "stream.f90"),
            str(tmp_path / "tiermem.o"),
            f"-L{lib}",
            "-ltiermem",
            f"-Wl,-rpath,{lib}",
            "-o",
            str(tmp_path / "stream"),
        ],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    r = subprocess.run([str(tmp_path / "stream")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checked on dram and on device 1" in r.stdout and "no object with id 999999" in r.stdout
