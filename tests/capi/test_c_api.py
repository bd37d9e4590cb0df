"""The C API as a C program uses it: the bad-input program (`errors.c`) and the STREAM
triad example (`examples/c/stream.c`) compiled with the system's C compiler against
`libtiermem.so` and `libtiermem.a`, and against an installed tree found through pkg-config
(`make install PREFIX=...`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import INCLUDE, ROOT

CC: str = shutil.which("cc") or shutil.which("gcc") or ""
pytestmark = pytest.mark.skipif(not CC, reason="no C compiler on PATH")


def _cc(src: Path, out: Path, *link: str) -> Path:
    cmd = [CC, "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", f"-I{INCLUDE}", str(src), "-o", str(out), *link]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def _run(exe: Path, *args: str) -> str:
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_bad_input_gets_a_status_and_a_message(lib: Path, tmp_path: Path) -> None:
    exe = _cc(ROOT / "tests" / "capi" / "errors.c", tmp_path / "errors", f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}")
    out = _run(exe)
    assert "0 failed" in out and "FAIL" not in out
    assert "ok unknown spec" in out and "warp-drive" in out


@pytest.mark.parametrize("linkage", ["shared", "static"])
def test_stream_triad_runs_and_checks_its_results(lib: Path, tmp_path: Path, linkage: str) -> None:
    link = (
        [f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}"]
        if linkage == "shared"
        else [str(lib / "libtiermem.a"), "-lpthread", "-ldl", "-lm"]
    )
    exe = _cc(ROOT / "examples" / "c" / "stream.c", tmp_path / "stream", *link)
    out = _run(exe, "200000")
    assert "results checked" in out and "emulated:optane-pmem" in out and "(device 1)" in out


def test_installed_tree_builds_through_pkg_config(lib: Path, tmp_path: Path) -> None:
    if shutil.which("pkg-config") is None:
        pytest.skip("no pkg-config on PATH")
    prefix = tmp_path / "prefix"
    r = subprocess.run(["make", "-s", "install", f"PREFIX={prefix}"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (prefix / "include" / "tiermem.h").read_text() == (INCLUDE / "tiermem.h").read_text()
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "tiermem"], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    assert f"-I{prefix}/include" in flags and "-ltiermem" in flags
    exe = tmp_path / "stream"
    r = subprocess.run(
        [CC, "-O2", "-std=c11", str(ROOT / "examples" / "c" / "stream.c"), "-o", str(exe), *flags, f"-Wl,-rpath,{prefix}/lib"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "results checked" in _run(exe, "100000")
