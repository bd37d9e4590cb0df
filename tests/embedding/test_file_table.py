"""File tables from Python (``device="file:PATH"``: rows in a plain file read with buffered
I/O through a staged DRAM cache): the same lookups and updates as a DRAM table, rows kept
across closing and reopening, a user's file opened read-only and never written, a kill at
any moment of a write-back leaving every row wholly old or new, and one ``Placement`` value
building any table."""

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

import tiermem
from tiermem.embedding import EmbeddingTable
from tiermem.embedding.config import Placement

ROWS, DIM = 2000, 16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_file_table_matches_a_dram_table(disk_dir: Path, dtype: str) -> None:
    path = disk_dir / "t.rows"
    ref = EmbeddingTable(ROWS, DIM, dtype=dtype)
    t = EmbeddingTable(ROWS, DIM, dtype=dtype, device=f"file:{path}", cache=0.08)
    assert t.placement == "file:8" and t.policy == "file" and not t.attached
    w = np.random.default_rng(1).standard_normal((ROWS, DIM)).astype(np.float32)
    ref.load(w)
    t.load(w)
    rng = np.random.default_rng(3)
    for k in range(12):
        idx = np.where(rng.random(96) < 0.5, rng.integers(0, 40, 96), rng.integers(0, ROWS, 96)).astype(np.int64)
        offs = np.arange(0, 96, 3, dtype=np.int64)
        g = rng.standard_normal((32, DIM)).astype(np.float32)
        np.testing.assert_array_equal(ref.lookup(idx, offs), t.lookup(idx, offs))
        ref.update(idx, offs, g, optimizer="rowwise_adagrad", lr=0.05)
        t.update(idx, offs, g, optimizer="rowwise_adagrad", lr=0.05)
        if k == 4:
            t.flush()
        if k == 7:
            t.sync()
    np.testing.assert_array_equal(ref.to_numpy(), t.to_numpy())
    info = t.file_info
    assert info is not None and info["misses"] > 0 and info["rows_read"] > 0 and not info["read_only"]
    assert t.block_info is None
    del t
    again = EmbeddingTable(ROWS, DIM, dtype=dtype, device=f"file:{path}", cache=0.05)
    assert again.attached
    np.testing.assert_array_equal(ref.to_numpy(), again.to_numpy())
    assert path.stat().st_size == ROWS * again.row_bytes
    assert not Path(f"{path}.journal").exists()


def test_a_users_file_opens_read_only_and_is_never_written(disk_dir: Path) -> None:
    path = disk_dir / "user.f32"
    w = np.random.default_rng(5).standard_normal((ROWS, DIM)).astype(np.float32)
    w.tofile(path)
    before = path.read_bytes()
    with pytest.raises(tiermem.InvalidArgumentError, match="not made by tiermem.*read-only"):
        EmbeddingTable(ROWS, DIM, device=f"file:{path}", cache=0.1)
    place = Placement(device=f"file:{path}", cache=0.1, read_only=True)
    t = EmbeddingTable(ROWS, DIM, placement=place)
    assert t.settings == place
    np.testing.assert_array_equal(t.to_numpy(), w)
    idx, offs = np.array([3, 7, 1999], np.int64), np.array([0, 2], np.int64)
    np.testing.assert_array_equal(t.lookup(idx, offs), [w[3] + w[7], w[1999]])
    with pytest.raises(tiermem.InvalidArgumentError, match="read-only"):
        t.update(idx, offs, np.ones((2, DIM), np.float32), optimizer="sgd", lr=0.1)
    with pytest.raises(tiermem.InvalidArgumentError, match="read-only"):
        t.load(np.zeros((1, DIM), np.float32))
    t.sync()
    del t
    assert path.read_bytes() == before, "the user's file changed"
    with pytest.raises(tiermem.InvalidArgumentError, match=f"holds {ROWS * DIM * 4} bytes"):
        EmbeddingTable(ROWS + 1, DIM, placement=place)


def test_bad_file_tables_and_placements_are_refused(disk_dir: Path) -> None:
    path = disk_dir / "t.rows"
    with pytest.raises(tiermem.InvalidArgumentError, match="DRAM cache"):
        EmbeddingTable(ROWS, DIM, device=f"file:{path}")
    with pytest.raises(tiermem.InvalidArgumentError, match="names no file"):
        EmbeddingTable(ROWS, DIM, device="file:", cache=0.1)
    with pytest.raises(tiermem.InvalidArgumentError, match="read_only opens a 'file:PATH' home"):
        EmbeddingTable(ROWS, DIM, placement=Placement(device=f"table:{path}", cache=0.1, read_only=True))
    with pytest.raises(tiermem.InvalidArgumentError, match=r"not also as \['cache'\]"):
        EmbeddingTable(ROWS, DIM, placement=Placement(), cache=0.1)
    t = EmbeddingTable(ROWS, DIM, device=f"file:{path}", cache=0.1)
    with pytest.raises(tiermem.InvalidArgumentError, match="locked"):
        EmbeddingTable(ROWS, DIM, device=f"file:{path}", cache=0.1)
    del t
    with pytest.raises(tiermem.InvalidArgumentError, match="holds .* bytes"):
        EmbeddingTable(ROWS, DIM * 2, device=f"file:{path}", cache=0.1)
    link = disk_dir / "link.rows"
    link.symlink_to(path)
    with pytest.raises(tiermem.InvalidArgumentError, match="symbolic link"):
        EmbeddingTable(ROWS, DIM, device=f"file:{link}", cache=0.1)


def test_one_placement_builds_every_kind_of_table(disk_dir: Path) -> None:
    m = tiermem.Manager({"dram": "8 MiB", "emulated:optane-pmem": "8 MiB"})
    w = np.random.default_rng(9).standard_normal((ROWS, DIM)).astype(np.float32)
    places = {
        "direct": Placement(),
        "cached": Placement(device=1, cache=0.1, policy="admit"),
        "table": Placement(device=f"table:{disk_dir / 't.tmb'}", cache=0.1, admission="block"),
        "file": Placement(device=f"file:{disk_dir / 't.rows'}", cache=0.1),
    }
    for what, place in places.items():
        t = EmbeddingTable(ROWS, DIM, placement=place, manager=m)
        assert t.settings == place, what
        t.load(w)
        np.testing.assert_array_equal(t.to_numpy(), w, err_msg=what)
        del t
        loose = EmbeddingTable(
            ROWS, DIM, manager=m, **{k: v for k, v in vars(place).items() if k != "read_only" and v is not None}
        )
        assert loose.settings == place, what
        if place.home != "memory":  # re-attached: the rows are the file's
            np.testing.assert_array_equal(loose.to_numpy(), w, err_msg=what)
        del loose


WIDTHS = (1, 1023, 16384)
CHILD = """
import sys, numpy as np
from tiermem.embedding import EmbeddingTable
path, rows, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = EmbeddingTable(rows, width, device=f"file:{path}", cache=0.5, cacheslack=0.0)
print("ready", flush=True)
g = 1
while True:
    # Every row to generation g, in a shuffled order, through the cache's write-backs.
    v = np.empty((rows, width), np.float32)
    v[:] = (g * 1000 + np.arange(rows))[:, None]
    for r in np.random.default_rng(g).permutation(rows):
        t.load(v[r : r + 1], int(r))
    t.sync()
    g += 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_a_kill_during_write_backs_leaves_every_row_wholly_old_or_new(disk_dir: Path, width: int) -> None:
    rows = 24
    path = disk_dir / "k.rows"
    t = EmbeddingTable(rows, width, device=f"file:{path}", cache=0.5)
    v = np.zeros((rows, width), np.float32)
    v[:] = np.arange(rows)[:, None]
    t.load(v)
    t.sync()
    del t
    rng = random.Random(width)
    for _ in range(3):
        p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD), str(path), str(rows), str(width)], stdout=subprocess.PIPE, text=True
        )
        assert p.stdout is not None and "ready" in p.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        t = EmbeddingTable(rows, width, device=f"file:{path}", cache=0.5)
        got = t.to_numpy()
        del t
        for r in range(rows):
            assert np.all(got[r] == got[r, 0]), f"row {r} of width {width} is torn: {np.unique(got[r])[:4]}"
            assert int(got[r, 0]) % 1000 == r, f"row {r} holds row {int(got[r, 0]) % 1000}'s values"
        assert not Path(f"{path}.journal").exists()
