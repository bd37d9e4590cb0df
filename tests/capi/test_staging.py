"""Pattern-aware staging over C arrays: the six kernels of `examples/c/staging_kernels.c`
(RandomAccess, PTRANS, Jacobi 2D and 3D, CG, FFT; OpenMP) built and run against the
library, each checking its own result whether staged or not, and each decision equal to
the Python path's (`tiermem.hpc.staging.analyse` and `BreakEven.decide`) on the same index
stream, which the program writes out. The break-even line is `staging_line.json`: one
`tiermem.hpc.staging.calibrate` run on this machine (dram against emulated:optane-pmem,
2^20 elements, 3 reps); any line serves, as both sides read the same one."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tiermem.hpc import staging

from .conftest import INCLUDE, ROOT

CC: str = shutil.which("cc") or shutil.which("gcc") or ""
pytestmark = pytest.mark.skipif(not CC, reason="no C compiler on PATH")
LINE = Path(__file__).with_name("staging_line.json")
KERNELS = ["random_access", "ptrans", "jacobi2d", "jacobi3d", "cg", "fft"]


def test_c_kernels_decide_as_python_does(lib: Path, tmp_path: Path) -> None:
    exe = tmp_path / "staging_kernels"
    src = ROOT / "examples" / "c" / "staging_kernels.c"
    cmd = [CC, "-O2", "-fopenmp", "-Wall", "-Wextra", "-Werror", "-std=c11", f"-I{INCLUDE}", str(src), "-o", str(exe)]
    r = subprocess.run([*cmd, f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}", "-lm"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "omp.h" in r.stderr:
        pytest.skip("the C compiler has no OpenMP")
    assert r.returncode == 0, r.stderr
    dump = tmp_path / "streams"
    dump.mkdir()
    out = subprocess.run([str(exe), str(LINE), str(dump)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 wrong" in out.stdout and len(re.findall(r"^checked ", out.stdout, re.M)) == 6, out.stdout
    line = staging.BreakEven.from_dict(json.loads(LINE.read_text()))
    seen = set()
    for m in re.finditer(
        r"^(\w+) threads=(\d+) elem=(\d+) u=(\S+) read=(\d) write=(\d) .* stage=(\d) t_boost=(\S+) t_copy=(\S+)$",
        out.stdout,
        re.M,
    ):
        name, threads, elem, u, rd, wr, stage, t_boost, t_copy = m.groups()
        idx = np.fromfile(dump / f"{name}.i64", dtype=np.int64)
        rates = staging.analyse(idx, elem_bytes=int(elem), threads=int(threads))
        d = line.decide(rates, u=float(u), read=rd == "1", write=wr == "1")
        assert (int(d["stage"]), d["t_boost"], d["t_copy"]) == pytest.approx(
            (int(stage), float(t_boost), float(t_copy)), rel=1e-12
        ), name
        seen.add(name)
    assert seen == set(KERNELS)
    # The kernels' patterns reach both sides of the line: something stages, something not.
    stages = re.findall(r" stage=(\d) ", out.stdout)
    assert "0" in stages and "1" in stages


def test_staging_calls_refuse_bad_input(lib: Path, tmp_path: Path) -> None:
    prog = tmp_path / "bad.c"
    prog.write_text(
        r"""
#include <stdio.h>
#include <string.h>
#include "tiermem.h"
static int chunk(void *p, size_t off, size_t len, void *ctx) { (void)p; (void)len; (void)ctx; return off ? 7 : 0; }
int main(void) {
    tm_rates r; tm_decision d; tm_break_even *line = NULL; tm_manager *m;
    int64_t neg[3] = {0, -5, 2};
    int fails = 0;
#define EXPECT(call, code, text) do { tm_status s_ = (call); \
    if (s_ != (code) || !strstr(tm_last_error(), text)) { printf("FAIL %s: %d %s\n", #call, s_, tm_last_error()); fails++; } } while (0)
    EXPECT(tm_analyse(NULL, 4, 8, 1, &r), TM_INVALID_ARGUMENT, "indices is NULL");
    EXPECT(tm_analyse(neg, 0, 8, 1, &r), TM_INVALID_ARGUMENT, "empty");
    EXPECT(tm_analyse(neg, 3, 8, 1, &r), TM_INVALID_ARGUMENT, "index 1 is negative");
    EXPECT(tm_analyse(neg, 1, 8, 0, &r), TM_INVALID_ARGUMENT, "threads (0)");
    EXPECT(tm_break_even_from_json("{\"read\": 1}", &line), TM_INVALID_ARGUMENT, "not a break-even line");
    EXPECT(tm_break_even_from_json(NULL, &line), TM_INVALID_ARGUMENT, "json is NULL");
    EXPECT(tm_stage_decide(NULL, &r, 1, 1, 0, 0, &d), TM_INVALID_ARGUMENT, "must not be NULL");
    tm_device devs[2] = {{"dram", 1 << 20}, {"emulated:optane-pmem", 1 << 20}};
    if (tm_manager_new(devs, 2, "lru_in_place", &m) != TM_OK) return 1;
    EXPECT(tm_break_even_calibrate(m, 1000, 1, &line), TM_INVALID_ARGUMENT, "power of two");
    char data[8192];
    EXPECT(tm_stage_run(m, data, sizeof data, 4096, 1, 1, NULL, NULL), TM_INVALID_ARGUMENT, "body is NULL");
    EXPECT(tm_stage_run(m, data, 0, 4096, 1, 1, chunk, NULL), TM_INVALID_ARGUMENT, "is zero");
    EXPECT(tm_stage_run(m, data, sizeof data, 4096, 1, 1, chunk, NULL), TM_INVALID_ARGUMENT, "returned 7 for the chunk at byte 4096");
    EXPECT(tm_stage_run(m, data, sizeof data, 1 << 30, 1, 1, chunk, NULL), TM_OK, "");
    tm_manager_free(m);
    printf("%d failed\n", fails);
    return fails != 0;
}
"""
    )
    exe = tmp_path / "bad"
    r = subprocess.run(
        [CC, "-std=c11", "-Wall", f"-I{INCLUDE}", str(prog), "-o", str(exe), f"-L{lib}", "-ltiermem", f"-Wl,-rpath,{lib}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "0 failed" in out.stdout, out.stdout + out.stderr
