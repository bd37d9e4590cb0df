"""A kill at any moment of a table file's write-back, relayout or snapshot leaves every row
wholly old or wholly new, for rows from 4 bytes to 64 KiB (rows wider than a block were torn:
requests of 16 blocks cut a 3-block row in two); a kill during the row log's compaction
reopens to the last values written."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tiermem import _tiermem

ROWS = 24
# Elements of float32: 4 bytes, a row narrower than a block, one a block's payload wide, one
# just wider (two blocks), three blocks, and 64 KiB (17 blocks, more than a 16-block request).
WIDTHS = (1, 1022, 1023, 3000, 16384)

CHILD = f"""
import sys, numpy as np
from tiermem import _tiermem
from tiermem.embedding import EmbeddingTable
path, width, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
start = int(sys.argv[4]) if len(sys.argv) > 4 else 1
rows = np.arange({ROWS}, dtype=np.uint64)
def values(g):
    v = np.empty(({ROWS}, width), np.float32)
    v[:] = (g * 1000 + np.arange({ROWS}))[:, None]
    return v.view(np.uint8).reshape(-1)
if what in ("write", "compact"):
    f = _tiermem.BlockFile.open(path, "t", 4)
    if what == "compact":
        f.set_log_limit(0)  # every write appends, then compacts the log home
    print("ready", flush=True)
    g = start
    while True:
        # Rows in a shuffled batch order, as a cache's write-back hands them over.
        order = np.random.default_rng(g).permutation({ROWS}).astype(np.uint64)
        v = values(g).reshape({ROWS}, -1)[order]
        f.write_rows(order, np.ascontiguousarray(v).reshape(-1))
        print(g, flush=True)  # this generation is written
        g += 1
t = EmbeddingTable({ROWS}, width, device=f"block:{{path}}", cache=1.0)
print("ready", flush=True)
k = 0
while True:
    if what == "relayout":
        t.relayout(np.random.default_rng(k).permutation({ROWS}))
    else:
        t.snapshot(path + ".snap")
    k += 1
"""


def _make(path: Path, width: int) -> None:
    f = _tiermem.BlockFile.create(str(path), "t", (ROWS, width, "float32"), False, 4)
    v = np.zeros((ROWS, width), np.float32)
    v[:] = np.arange(ROWS)[:, None]
    f.write_rows(np.arange(ROWS, dtype=np.uint64), v.view(np.uint8).reshape(-1))
    f.sync()
    del f


def _check(path: Path, width: int) -> set[int]:
    """Every row is one generation's whole (and its own row's); returns the generations."""
    f = _tiermem.BlockFile.open(str(path), "t", 4)
    out = np.empty(ROWS * f.stride, np.uint8)
    f.read_rows(np.arange(ROWS, dtype=np.uint64), out)
    v = out.view(np.float32).reshape(ROWS, width)
    gens = set()
    for r in range(ROWS):
        assert np.all(v[r] == v[r, 0]), f"row {r} of width {width} is torn: {np.unique(v[r])[:4]}"
        g, row = divmod(int(v[r, 0]), 1000)
        assert row == r, f"row {r} holds row {row}'s values"
        gens.add(g)
    return gens


@pytest.mark.slow
@pytest.mark.parametrize("what", ["write", "relayout", "snapshot"])
@pytest.mark.parametrize("width", WIDTHS)
def test_a_kill_leaves_every_row_wholly_old_or_new(disk_dir: Path, width: int, what: str) -> None:
    path = disk_dir / "t.tbl"
    _make(path, width)
    rng = random.Random(width * 7 + len(what))
    seen: set[int] = set()
    for _ in range(3):
        p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD), str(path), str(width), what], stdout=subprocess.PIPE, text=True
        )
        assert p.stdout is not None and "ready" in p.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.25))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        seen |= _check(path, width)
        if what == "snapshot" and (disk_dir / "t.tbl.snap").exists():
            _check(disk_dir / "t.tbl.snap", width)
        if what == "relayout":
            assert seen == {0}  # a relayout moves rows, never changes them
    # The next open removed what a killed relayout or snapshot left beside the table.
    assert not (disk_dir / "t.tbl.relayout").exists()


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_a_kill_during_log_compaction_reopens_to_the_last_values(disk_dir: Path, width: int) -> None:
    # Each write appends every row to the log and compacts it home; the child says which
    # generation it finished. A kill anywhere (appending, writing homes, syncing, cutting
    # the log off) reopens to that generation or the one in flight, every row whole.
    path = disk_dir / "t.tbl"
    _make(path, width)
    rng = random.Random(width)
    start, compactions_seen = 1, 0
    for _ in range(4):
        p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD), str(path), str(width), "compact", str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None and "ready" in p.stdout.readline()
        time.sleep(rng.uniform(0.05, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        done = [int(line) for line in p.stdout.read().split()]
        p.stdout.close()
        last = done[-1] if done else start - 1
        gens = _check(path, width)
        if done:
            assert gens <= {last, last + 1}, f"generation {last} was written last, the rows hold {sorted(gens)}"
            compactions_seen += len(done)
        else:
            assert max(gens) <= start, (gens, start)
        start = max(gens | {last}) + 1
    assert compactions_seen > 0, "no write (and compaction) finished before a kill"
