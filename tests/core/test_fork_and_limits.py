"""A forked child refuses its parent's tiermem objects with a clear error (it shared their
locks and lost its updates, or hung in the kernel pool) and makes and uses its own; a
process at its thread limit gets a clear error per call, not a PanicException for the rest
of its life, and recovers when the limit lifts; block tables share one I/O pool."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem.embedding import EmbeddingTable

IDX, OFF = np.arange(64) % 500, np.arange(0, 64, 4)


def _in_child(fn) -> int:
    """Run ``fn`` in a forked child; its exit status (0: every assertion held)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        except BaseException as e:  # reported by the status, shown on stderr
            print(f"child: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def test_a_forked_child_refuses_the_parents_objects_and_makes_its_own(disk_dir: Path) -> None:
    mem = EmbeddingTable(500, 16)
    blk = EmbeddingTable(500, 16, device=f"block:{disk_dir / 't.tbl'}", cache=0.5)
    m = tiermem.Manager({"dram": "1 MiB", f"block:{disk_dir / 'dev.bin'}": "4 MiB"})
    a = m.array((1024,), "float32", fill=2.0)
    blk.update(IDX, OFF, np.ones((16, 16), np.float32), optimizer="sgd", lr=1.0)
    before = blk.lookup(IDX, OFF)
    mem.lookup(IDX, OFF)  # the kernel pool has run in the parent

    def child() -> None:
        for what, call in (
            ("table", lambda: mem.lookup(IDX, OFF)),
            ("block table", lambda: blk.update(IDX, OFF, np.ones((16, 16), np.float32), optimizer="sgd", lr=1.0)),
            ("array", lambda: a.read().__enter__()),
        ):
            try:
                call()
            except tiermem.TiermemError as e:
                assert "forked child" in str(e), (what, e)
            else:
                raise AssertionError(f"the parent's {what} worked in the child")
        own = EmbeddingTable(500, 16)  # the child's own objects, and its kernel pool, work
        own.load(np.full((500, 16), 3.0, np.float32))
        assert float(own.lookup(IDX, OFF)[0, 0]) == 12.0
        mine = tiermem.Manager({"dram": "1 MiB"})
        assert mine.array((16,), "float32", fill=1.0).device == "dram"

    assert _in_child(child) == 0
    # The parent's objects are untouched: no update of the child's landed, no file removed.
    np.testing.assert_array_equal(blk.lookup(IDX, OFF), before)
    assert (disk_dir / "dev.bin").exists() and (disk_dir / "t.tbl").exists()
    with a.read() as v:
        assert float(v[0]) == 2.0


def test_a_child_exiting_normally_removes_none_of_the_parents_files(disk_dir: Path) -> None:
    """The child's exit handlers and drops run over inherited objects: they remove nothing
    of the parent's and write nothing back."""
    code = """
    import os, sys, numpy as np, tiermem
    from tiermem.embedding import EmbeddingTable
    from tiermem._files import remove_at_exit
    m = tiermem.Manager({"dram": "1 MiB", "block:dev.bin": "4 MiB"})
    t = EmbeddingTable(100, 8, device="block:scratch.tbl", cache=0.5)
    remove_at_exit("scratch.tbl")
    pid = os.fork()
    if pid == 0:
        del t, m
        sys.exit(0)   # exit handlers and drops run in the child
    os.waitpid(pid, 0)
    print(sorted(os.listdir(".")), flush=True)
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=disk_dir, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['dev.bin', 'scratch.tbl']", r.stdout
    assert "tiermem:" not in r.stderr, r.stderr  # no failed write-back reported by the child
    assert sorted(os.listdir(disk_dir)) == []  # and the parent's exit removed both


def test_block_tables_share_one_io_pool(disk_dir: Path) -> None:
    before = threading.active_count()
    tables = [EmbeddingTable(300, 8, device=f"block:{disk_dir / f't{k}.tbl'}", cache=0.5, depth=16) for k in range(6)]
    names = {t.name for t in threading.enumerate()}  # Python sees only its own threads
    assert threading.active_count() == before and names
    tasks = len(os.listdir("/proc/self/task"))
    more = [EmbeddingTable(300, 8, device=f"block:{disk_dir / f'u{k}.tbl'}", cache=0.5, depth=16) for k in range(6)]
    for t in tables + more:
        t.lookup(np.arange(8), np.array([0, 4]))
    # Six more tables (each used to start 16 I/O threads) add no threads of their own.
    assert len(os.listdir("/proc/self/task")) <= tasks + 16


LIMITED = """
import os, sys, numpy as np
from tiermem.embedding import EmbeddingTable
from tiermem.exceptions import TiermemError
cg = sys.argv[1]
t = EmbeddingTable(500, 16)   # made before the limit; its first lookup starts the kernel pool
with open(os.path.join(cg, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
with open(os.path.join(cg, "pids.current")) as f:
    now = int(f.read())
with open(os.path.join(cg, "pids.max"), "w") as f:
    f.write(str(now))   # no new thread can start
idx, off = np.arange(64) % 500, np.arange(0, 64, 4)
for _ in range(2):
    try:
        t.lookup(idx, off)
        print("no error")
    except TiermemError as e:
        print("error:", e)
with open(os.path.join(cg, "pids.max"), "w") as f:
    f.write("max")
print("after:", t.lookup(idx, off).shape)
"""


def test_a_thread_limit_is_an_error_per_call_and_lifts() -> None:
    root = Path("/sys/fs/cgroup/pids")
    cg = root / f"tiermem-test-{os.getpid()}"
    try:
        cg.mkdir()
    except OSError:
        pytest.skip("no writable pids cgroup here to set a task limit in")
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(LIMITED), str(cg)], capture_output=True, text=True, timeout=120)
    finally:
        cg.rmdir()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(line.startswith("error:") and "thread or task limit" in line for line in lines[:2]), r.stdout
    assert "PanicException" not in r.stdout + r.stderr
    assert lines[2] == "after: (16, 16)", r.stdout


def test_a_stopped_process_holding_the_dram_probe_lock_delays_others_a_bounded_time(tmp_path: Path) -> None:
    """Before: a 2-rank launch still waited after 120 s. After: the probe lock is waited for
    TIERMEM_PROBE_WAIT seconds, then the process measures alone and says so."""
    import signal
    import time

    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    lock = tmp_path / f"dram-probe-{boot}.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl, sys, time; f = open({str(lock)!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGSTOP)
        env = {**os.environ, "TIERMEM_CALIBRATION": str(tmp_path / "calibration.json"), "TIERMEM_PROBE_WAIT": "1"}
        t = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-c", "from tiermem import _tiermem; print(_tiermem.dram_figures()['source'])"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - t
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "alone"
    assert took < 60, took
