"""Block tables from Python (``device="block:PATH"``): the same lookups and updates as a
DRAM table, rows kept across closing and re-attaching the file, every bad configuration
refused with what and why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem.embedding import EmbeddingTable

ROWS, DIM = 2000, 16


def _batches(seed: int, n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lengths = rng.integers(0, 6, 32)
        idx = np.where(rng.random(lengths.sum()) < 0.5, rng.integers(0, 40, lengths.sum()), rng.integers(0, ROWS, lengths.sum()))
        offs = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        out.append((idx.astype(np.int64), offs.astype(np.int64), rng.standard_normal((32, DIM)).astype(np.float32)))
    return out


@pytest.mark.parametrize("prefetch", ["row", "block", "threshold:1", "shadow:1.5"])
def test_block_table_matches_a_dram_table(disk_dir: Path, prefetch: str) -> None:
    path = disk_dir / f"t-{prefetch.replace(':', '_')}.tmb"
    ref = EmbeddingTable(ROWS, DIM)
    t = EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.08, prefetch=prefetch)
    assert t.placement == "block:8" and t.policy == "block" and path.exists()
    w = np.random.default_rng(1).standard_normal((ROWS, DIM)).astype(np.float32)
    ref.load(w)
    t.load(w)
    t.set_access_counts(np.random.default_rng(2).integers(0, 4, ROWS))
    for k, (idx, offs, g) in enumerate(_batches(3, 12)):
        np.testing.assert_array_equal(ref.lookup(idx, offs), t.lookup(idx, offs))
        ref.update(idx, offs, g, optimizer="sgd", lr=0.05)
        t.update(idx, offs, g, optimizer="sgd", lr=0.05)
        if k == 5:
            t.flush()
    np.testing.assert_array_equal(ref.to_numpy(), t.to_numpy())
    info = t.block_info
    assert info is not None and info["prefetch"] == prefetch and info["misses"] > 0 and info["blocks_read"] > 0
    if prefetch == "row":
        assert info["prefetched"] == 0
    if prefetch == "block":
        assert info["prefetched"] > 0
    t.sync()
    del t
    again = EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.05)
    np.testing.assert_array_equal(ref.to_numpy(), again.to_numpy())


def test_bad_block_tables_are_refused(disk_dir: Path) -> None:
    path = disk_dir / "t.tmb"
    with pytest.raises(tiermem.InvalidArgumentError, match="needs? .*cache|DRAM cache"):
        EmbeddingTable(ROWS, DIM, device=f"block:{path}")
    with pytest.raises(tiermem.InvalidArgumentError, match="names no file"):
        EmbeddingTable(ROWS, DIM, device="block:", cache=0.1)
    with pytest.raises(tiermem.InvalidArgumentError, match="prefetch admission 'blocks'"):
        EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.1, prefetch="blocks")
    with pytest.raises(tiermem.InvalidArgumentError, match="depth"):
        EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.1, depth=0)
    t = EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.1)
    # A second owner of the same file is refused while the first has it open.
    with pytest.raises(tiermem.InvalidArgumentError, match="locked"):
        EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.1)
    del t
    # Re-attaching with another shape names both shapes.
    with pytest.raises(tiermem.InvalidArgumentError, match=f"holds {ROWS} rows of width {DIM}"):
        EmbeddingTable(ROWS, 8, device=f"block:{path}", cache=0.1)
    # A batch with more distinct rows than the cache holds is refused with the numbers.
    small = EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.01, cacheslack=0.0)
    with pytest.raises(tiermem.InvalidArgumentError, match="1000 distinct rows"):
        small.lookup(np.arange(1000), np.array([0, 1000]))
    # A foreign file is a CorruptFileError naming it, and is left as it was.
    foreign = disk_dir / "foreign.tmb"
    foreign.write_bytes(b"not a table" * 1000)
    with pytest.raises(tiermem.CorruptFileError, match="foreign.tmb"):
        EmbeddingTable(ROWS, DIM, device=f"block:{foreign}", cache=0.1)
    assert foreign.read_bytes() == b"not a table" * 1000
