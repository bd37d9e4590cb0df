"""The Fortran module over the C API: its constants equal the generated header's, and the
Fortran STREAM example (`examples/fortran/stream.f90`: pointers of rank 1 and 2 from
`c_f_pointer`, a move to the slow device, a refused call's status and message) compiles
with gfortran and runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import INCLUDE, ROOT

MODULE = ROOT / "crates" / "tiermem-capi" / "fortran" / "tiermem.f90"
H2M_MODULE = ROOT / "crates" / "tiermem-capi" / "fortran" / "h2m.f90"


def _header_constants(prefix: str) -> dict[str, int]:
    text = (INCLUDE / "tiermem.h").read_text()
    found = {k: int(v) for k, v in re.findall(rf"#define ({prefix}\w+) (-?\d+)", text, re.I)}
    found |= {k: int(v) for k, v in re.findall(rf"^\s*({prefix}\w+) = (-?\d+),?$", text, re.M | re.I)}
    return found


@pytest.mark.parametrize(("module", "prefix"), [(MODULE, "TM_"), (H2M_MODULE, "H2M_")])
def test_the_modules_constants_are_the_headers(module: Path, prefix: str) -> None:
    header = _header_constants(prefix)
    pattern = rf"parameter, public :: ({prefix}\w+) = (-?\d+)"
    ours = {k: int(v) for k, v in re.findall(pattern, module.read_text(), re.I)}
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


def test_fortran_h2m_allocates_migrates_and_frees(lib: Path, tmp_path: Path) -> None:
    """The H2M module: a rank-2 real(8) and a rank-1 integer pointer placed by traits on the
    KNL fixture (the matrix on MCDRAM node 4), migrated to large_cap (DDR node 0) through
    the same pointer, freed, and a second free refused."""
    fc = shutil.which("gfortran")
    if fc is None:
        pytest.skip("no gfortran on PATH (make sysdeps installs it)")
    exe = tmp_path / "h2m_traits"
    for cmd in (
        [fc, "-std=f2018", "-c", str(H2M_MODULE), "-J", str(tmp_path), "-o", str(tmp_path / "h2m.o")],
        [fc, "-std=f2018", "-I", str(tmp_path), str(ROOT / "examples" / "fortran" / "h2m_traits.f90"), str(tmp_path / "h2m.o")]
        + [f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}", "-o", str(exe)],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("H2M_", "TIERMEM_NODE"))}
    env["TIERMEM_SYSFS"] = str(ROOT / "tests" / "fixtures" / "sysfs" / "knl-snc4-flat")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a moved from node 4 to node 0" in r.stdout and "results checked" in r.stdout
