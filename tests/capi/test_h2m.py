"""The H2M interface as H2M's users meet it: the slides' allocation_traits example
(`examples/c/allocation_traits.c`, written from the slides' API only) built against an
installed tree through pkg-config and run on the sysfs fixtures of the slides' machines
and a CXL machine, placements read from its verbose log; the behaviour checks
(`h2m_checks.c`: every bad input, views, commit strategies, migration, fork, eight
threads) plain and under AddressSanitizer; `H2M_NODES_*` honoured beside `TIERMEM_NODES_*`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import INCLUDE, ROOT

CC: str = shutil.which("cc") or shutil.which("gcc") or ""
pytestmark = pytest.mark.skipif(not CC, reason="no C compiler on PATH")
FIXTURES = ROOT / "tests" / "fixtures" / "sysfs"


def _env(fixture: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("H2M_", "TIERMEM_NODE"))}
    return dict(env, TIERMEM_SYSFS=str(FIXTURES / fixture), **extra)


def _run(exe: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def installed(lib: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Compiler flags for a tree installed with make install, found through pkg-config."""
    if shutil.which("pkg-config") is None:
        pytest.skip("no pkg-config on PATH")
    prefix = tmp_path_factory.mktemp("prefix")
    r = subprocess.run(["make", "-s", "install", f"PREFIX={prefix}"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (prefix / "include" / "h2m.h").exists()
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "tiermem"], capture_output=True, text=True, env=env, check=True)
    return [*flags.stdout.split(), f"-Wl,-rpath,{prefix}/lib"]


@pytest.fixture(scope="module")
def slides_example(installed: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("h2m") / "allocation_traits"
    src = ROOT / "examples" / "c" / "allocation_traits.c"
    r = subprocess.run(
        [CC, "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", str(src), "-o", str(exe), *installed],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return exe


def _placements(log: str) -> tuple[list[int], list[tuple[int, int]]]:
    allocated = [int(n) for n in re.findall(r"allocated \d+ bytes at \S+ on node (\d+)", log)]
    moved = [(int(a), int(b)) for a, b in re.findall(r"moved \S+ from node (\d+) \S+ to node (\d+)", log)]
    return allocated, moved


# The calling thread runs on this machine's node 0, so it allocates from node 0's view: the
# nearest node of each space. A's traits change to large_cap, whose first node it moves to.
@pytest.mark.parametrize(
    ("fixture", "allocated", "moved"),
    [
        ("knl-snc4-flat", [4, 0, 4], [(4, 0)]),  # MCDRAM is hbw, DDR low_lat and large_cap
        ("cascadelake-optane", [0, 0, 0], [(0, 2)]),  # Optane nodes 2 and 3 are large_cap
        ("cxl-expander", [0, 0, 0], [(0, 2)]),  # the CXL expander (node 2) is large_cap
    ],
)
def test_slides_example_places_as_the_fixture_says(
    slides_example: Path, fixture: str, allocated: list[int], moved: list[tuple[int, int]]
) -> None:
    r = _run(slides_example, _env(fixture, H2M_VERBOSE="1"), "96")
    assert "results checked" in r.stdout
    assert _placements(r.stderr) == (allocated, moved), r.stderr
    assert "Resulting view from numa node 0 and memspace h2m_atv_mem_space_hbw" in r.stderr


def test_h2m_node_variables_are_honoured_beside_tiermems(slides_example: Path) -> None:
    r = _run(slides_example, _env("cascadelake-optane", H2M_VERBOSE="1", H2M_NODES_HBW="2,3"), "64")
    assert "Mapping h2m_atv_mem_space_hbw -> 2,3 (environment: TIERMEM_NODES_HBW=2,3)" in r.stderr
    assert _placements(r.stderr)[0] == [2, 0, 2]
    both = _env("cascadelake-optane", H2M_VERBOSE="1", H2M_NODES_HBW="2,3", TIERMEM_NODES_HBW="1")
    assert _placements(_run(slides_example, both, "64").stderr)[0] == [1, 0, 1]
    bad = subprocess.run(
        [str(slides_example)], capture_output=True, text=True, timeout=300, env=_env("cascadelake-optane", H2M_NODES_HBW="9")
    )
    assert bad.returncode != 0 and "h2m_init failed: 2" in bad.stderr


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "asan"])
def test_h2m_behaviour(lib: Path, tmp_path: Path, sanitize: bool) -> None:
    exe = tmp_path / "h2m_checks"
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if sanitize else []
    cmd = [
        CC,
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-std=c11",
        *flags,
        f"-I{INCLUDE}",
        str(ROOT / "tests" / "capi" / "h2m_checks.c"),
        "-o",
        str(exe),
        f"-L{lib}",
        "-ltiermem",
        f"-Wl,-rpath,{lib}",
        "-lpthread",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if sanitize and r.returncode != 0 and "asan" in r.stderr.lower():
        pytest.skip("the C compiler has no AddressSanitizer runtime")
    assert r.returncode == 0, r.stderr
    out = _run(exe, _env("cascadelake-optane", TIERMEM_NODE_BYTES="0-1=1MiB;2-3=64MiB"), "3")
    assert "0 failed" in out.stdout and "FAIL" not in out.stdout, out.stdout
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr


def test_cmake_package_builds_the_examples(installed: list[str], tmp_path: Path) -> None:
    """find_package(tiermem) from an installed tree: the shared and the static target."""
    if shutil.which("cmake") is None:
        pytest.skip("no cmake on PATH (make sysdeps installs it)")
    prefix = next(f[2:] for f in installed if f.startswith("-L"))[: -len("/lib")]
    build = tmp_path / "build"
    for cmd in (
        [
            "cmake",
            "-S",
            str(ROOT / "examples" / "c"),
            "-B",
            str(build),
            f"-DCMAKE_PREFIX_PATH={prefix}",
            f"-DCMAKE_C_COMPILER={CC}",
        ],
        ["cmake", "--build", str(build)],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "results checked" in _run(build / "stream", dict(os.environ), "100000").stdout
    assert "results checked" in _run(build / "allocation_traits", _env("knl-snc4-flat"), "64").stdout


def test_examples_are_valgrind_clean(slides_example: Path, lib: Path, tmp_path: Path) -> None:
    """Memcheck finds no error and no definite leak in the slides' example, the STREAM triad
    and the behaviour checks (a second of threads)."""
    if shutil.which("valgrind") is None:
        pytest.skip("no valgrind on PATH (make sysdeps installs it)")
    stream = tmp_path / "stream"
    checks = tmp_path / "h2m_checks"
    link = [f"-I{INCLUDE}", f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}", "-lpthread"]
    for src, exe in ((ROOT / "examples" / "c" / "stream.c", stream), (ROOT / "tests" / "capi" / "h2m_checks.c", checks)):
        r = subprocess.run(
            [CC, "-O1", "-g", "-std=c11", str(src), "-o", str(exe), *link], capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr
    vg = ["valgrind", "-q", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite"]
    runs = [
        ([str(slides_example), "32"], _env("cxl-expander")),
        ([str(stream), "20000"], dict(os.environ)),
        ([str(checks), "1"], _env("cascadelake-optane", TIERMEM_NODE_BYTES="0-1=1MiB;2-3=64MiB")),
    ]
    for args, env in runs:
        r = subprocess.run([*vg, *args], capture_output=True, text=True, timeout=900, env=env)
        assert r.returncode == 0, f"{args[0]}: {r.stdout[-2000:]}{r.stderr[-4000:]}"


PY_TRIAD = """
import json, sys
import numpy as np
import tiermem
n = int(sys.argv[1]); nb = n * 8; cap = 3 * nb + (1 << 20)
m = tiermem.Manager({"hbw": cap, "large_cap": cap}, policy="lru_in_place")
a, b, c = (m.array(n, "float64", where="fast") for _ in range(3))
with b.write() as x:
    x[:] = np.arange(n)
with c.write() as x:
    x[:] = 2.0
def triad():
    with a.write() as out, b.read() as bb, c.read() as cc:
        np.add(bb, 3.0 * cc, out=out)
        m._native.charge([(a.id, 0, nb), (b.id, nb, 0), (c.id, nb, 0)], 1)
triad()
for x in (a, b, c):
    x.evict()
triad()
assert (a.to_numpy() == np.arange(n) + 6.0).all()
print(json.dumps(m.stats()))
"""


def test_stream_through_space_names_is_charged_as_python_is(lib: Path, tmp_path: Path) -> None:
    """The native API's devices named by space on a fixture (hbw: DRAM; large_cap: an
    emulated Optane): STREAM in C (examples/c/stream.c) is charged what the same steps
    through the Python API are charged (PY_TRIAD), byte for byte and stall nanosecond for
    nanosecond, both reading one calibration's DRAM figures."""
    exe = tmp_path / "stream"
    link = [f"-I{INCLUDE}", f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(
        [CC, "-O2", "-std=c11", str(ROOT / "examples" / "c" / "stream.c"), "-o", str(exe), *link],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    calibration = tmp_path / "calibration.json"
    dram = {"read_gbps": 12.0, "write_gbps": 9.0, "copy_gbps": 7.0, "latency_ns": 90.0, "source": "calibrated"}
    calibration.write_text(json.dumps({"dram": dram}))
    env = _env("cascadelake-optane", TIERMEM_NODE_DEVICES="2,3=emulated:optane-pmem", TIERMEM_CALIBRATION=str(calibration))
    out = _run(exe, env, "200000", "large_cap", "hbw").stdout
    assert re.search(r"hbw [\d.]+ GB/s, large_cap [\d.]+ GB/s \(device 1\); results checked", out), out
    keys = ("bytes_read", "bytes_written", "kernel_stall_ns", "moves_in", "moves_out")
    c_side = {
        name: dict(zip(keys, map(int, figures)))
        for name, *figures in re.findall(
            r"^device \d+ (.+?): read (\d+) written (\d+) stall_ns (\d+) moves_in (\d+) moves_out (\d+)$", out, re.M
        )
    }
    py = _run(Path(sys.executable), env, "-c", PY_TRIAD, "200000").stdout
    py_side = {name: {k: s[k] for k in keys} for name, s in json.loads(py).items()}
    assert list(c_side) == ["hbw (dram)", "large_cap (emulated:optane-pmem)"]
    assert c_side == py_side
    assert c_side["large_cap (emulated:optane-pmem)"]["kernel_stall_ns"] > 0


@pytest.mark.parametrize(
    ("example", "args", "fixture"),
    [
        ("stream.c", ["100000"], None),
        ("allocation_traits.c", ["64"], "knl-snc4-flat"),
        ("staging_kernels.c", [str(ROOT / "tests" / "capi" / "staging_line.json")], None),
    ],
)
def test_examples_under_address_sanitizer(lib: Path, tmp_path: Path, example: str, args: list[str], fixture: str | None) -> None:
    """Each C example built with AddressSanitizer and UndefinedBehaviorSanitizer runs clean."""
    exe = tmp_path / example.removesuffix(".c")
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fopenmp", "-g", "-O1", "-std=c11"]
    cmd = [CC, *flags, f"-I{INCLUDE}", str(ROOT / "examples" / "c" / example), "-o", str(exe)]
    r = subprocess.run([*cmd, f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}", "-lm"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and ("asan" in r.stderr.lower() or "omp.h" in r.stderr):
        pytest.skip("the C compiler lacks AddressSanitizer or OpenMP")
    assert r.returncode == 0, r.stderr
    env = _env(fixture) if fixture else dict(os.environ)
    out = _run(exe, env, *args)
    assert "results checked" in out.stdout or "0 wrong" in out.stdout, out.stdout
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr
