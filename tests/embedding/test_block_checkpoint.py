"""Checkpoints of block tables record a snapshot of the table file (made by the kernel),
not the rows: restoring gives back every row and the optimizer state as they were at the
save, whatever was written since; damaged, missing or replaced snapshots are refused by
name; a failed save leaves the previous checkpoint and its snapshots whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem import checkpoint
from tiermem.embedding import EmbeddingTable

ROWS, WIDTH = 3000, 24


def _table(path: Path) -> EmbeddingTable:
    return EmbeddingTable(ROWS, WIDTH, device=f"block:{path}", cache=0.05)


def _train(t: EmbeddingTable, seed: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        v, o = rng.integers(0, ROWS, 256).astype(np.int64), np.arange(0, 256, 4, dtype=np.int64)
        t.lookup(v, o)
        t.update(v, o, rng.standard_normal((64, WIDTH)).astype(np.float32), optimizer="rowwise_adagrad", lr=0.1)


def test_a_block_checkpoint_snapshots_the_file_and_restores_the_rows_of_its_moment(disk_dir: Path) -> None:
    t = _table(disk_dir / "live.tmb")
    t.load(np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32))
    _train(t, 1, 20)  # dirty rows in the cache: the save must write them back first
    want = t.to_numpy()
    want_state = t.optimizer_state()
    ck = str(disk_dir / "ck.bin")
    checkpoint.save(ck, {"step": 20}, {"emb": t})
    snaps = os.listdir(checkpoint.snapshot_folder(ck))
    assert len(snaps) == 1 and snaps[0].startswith("emb-") and snaps[0].endswith(".tmb"), snaps
    # The checkpoint holds no rows: its own file is small, the snapshot is the table file.
    assert os.path.getsize(ck) < ROWS * WIDTH * 4 // 2
    assert os.path.getsize(os.path.join(checkpoint.snapshot_folder(ck), snaps[0])) == os.path.getsize(t.path)
    _train(t, 2, 20)  # the live file moves on
    assert not np.array_equal(t.to_numpy(), want)
    c = checkpoint.Checkpoint(ck)
    assert c.tables() == ["emb"]
    # Into the live block table, and into a DRAM table: both get the rows of the save.
    c.restore_table("emb", t)
    np.testing.assert_array_equal(t.to_numpy(), want)
    dram = EmbeddingTable(ROWS, WIDTH)
    c.restore_table("emb", dram)
    np.testing.assert_array_equal(dram.to_numpy(), want)
    for got in (t.optimizer_state(), dram.optimizer_state()):
        assert got is not None and want_state is not None
        assert got[0] == want_state[0] and got[2] == want_state[2]
        np.testing.assert_array_equal(got[1], want_state[1])
    # A second save at the same path replaces the snapshot and removes the old one.
    checkpoint.save(ck, {"step": 40}, {"emb": t})
    again = os.listdir(checkpoint.snapshot_folder(ck))
    assert len(again) == 1 and again != snaps, (snaps, again)


def test_a_missing_truncated_or_damaged_snapshot_is_refused_by_name(disk_dir: Path) -> None:
    t = _table(disk_dir / "live.tmb")
    t.load(np.ones((ROWS, WIDTH), np.float32))
    ck = str(disk_dir / "ck.bin")
    checkpoint.save(ck, {}, {"emb": t})
    snap = os.path.join(checkpoint.snapshot_folder(ck), os.listdir(checkpoint.snapshot_folder(ck))[0])
    raw = Path(snap).read_bytes()
    # Damaged: one byte of a data block flipped; the block's checksum names table, block, file.
    bad = bytearray(raw)
    bad[-100] ^= 0xFF
    Path(snap).write_bytes(bytes(bad))
    with pytest.raises(tiermem.CorruptFileError, match=r"checksum") as e:
        checkpoint.Checkpoint(ck).restore_table("emb", EmbeddingTable(ROWS, WIDTH))
    assert os.path.basename(snap) in str(e.value), str(e.value)
    # Truncated.
    Path(snap).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(checkpoint.CheckpointError, match="truncated or replaced"):
        checkpoint.Checkpoint(ck)
    # Missing.
    os.unlink(snap)
    with pytest.raises(checkpoint.CheckpointError, match="snapshot .* is missing"):
        checkpoint.Checkpoint(ck)


def test_snapshot_refuses_a_table_without_a_file(tmp_path: Path) -> None:

    with pytest.raises(tiermem.InvalidArgumentError, match="only a block table"):
        EmbeddingTable(10, 4).snapshot(str(tmp_path / "x.tmb"))


def test_a_save_that_fails_on_a_full_disk_leaves_the_previous_checkpoint_whole(disk_dir: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk while the second save copies the table file:
    the save fails naming the snapshot, no partial snapshot or new one is left, and the
    first checkpoint still restores its rows."""
    code = r"""
import os, resource, signal, sys, numpy as np
import tiermem
from tiermem import checkpoint
from tiermem.embedding import EmbeddingTable
d = sys.argv[1]
t = EmbeddingTable(3000, 24, device=f"block:{d}/live.tmb", cache=0.05)
t.load(np.full((3000, 24), 1.0, np.float32))
ck = f"{d}/ck.bin"
checkpoint.save(ck, {"n": 1}, {"emb": t})
t.load(np.full((3000, 24), 2.0, np.float32))
t.sync()
# A snapshot first compacts the table file's row log (writes inside the file); one taken now
# leaves the next nothing to compact, so the limit below catches the copy.
t.snapshot(f"{d}/compacted.tmb")
os.unlink(f"{d}/compacted.tmb")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
size = os.path.getsize(t.path)
resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))
try:
    checkpoint.save(ck, {"n": 2}, {"emb": t})
except OSError as e:
    print("refused:", e)
print("left:", sorted(os.listdir(checkpoint.snapshot_folder(ck))))
"""
    out = subprocess.run([sys.executable, "-c", code, str(disk_dir)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and ".tmb" in out.stdout, out.stdout
    left = os.listdir(checkpoint.snapshot_folder(str(disk_dir / "ck.bin")))
    assert len(left) == 1 and left[0].endswith(".tmb"), out.stdout
    c = checkpoint.Checkpoint(str(disk_dir / "ck.bin"))
    assert c.state() == {"n": 1}
    back = EmbeddingTable(ROWS, WIDTH)
    c.restore_table("emb", back)
    np.testing.assert_array_equal(back.to_numpy(), np.full((ROWS, WIDTH), 1.0, np.float32))
