"""Layouts of block tables (``tiermem.embedding.block.layout``): recursive K-means keeps rows of similar
values together, SHP started from it generalises to a held-out trace, and bad input is
refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from tiermem.embedding.block import layout, traces
from tiermem.embedding.block.traces import QueryTraceConfig
from tiermem.exceptions import InvalidArgumentError

RPB = 31


def _is_permutation(lay: np.ndarray, n: int) -> bool:
    return lay.dtype == np.uint32 and len(lay) == n and np.array_equal(np.sort(lay), np.arange(n))


def _groups(cfg: QueryTraceConfig) -> np.ndarray:
    """Each row's co-access group (the generator's, for checking)."""
    rng = np.random.default_rng(cfg.seed)
    groups = cfg.rows // cfg.group_size
    members = rng.permutation(cfg.rows)[: groups * cfg.group_size].reshape(groups, cfg.group_size)
    out = np.full(cfg.rows, -1)
    out[members.reshape(-1)] = np.repeat(np.arange(groups), cfg.group_size)
    return out


def test_kmeans_puts_rows_of_one_group_in_the_same_blocks() -> None:
    cfg = QueryTraceConfig(rows=1 << 14, queries=10)
    values = traces.group_embeddings(cfg, 32, spread=0.2)
    lay = layout.kmeans(values, RPB)
    assert _is_permutation(lay, cfg.rows)
    gid = _groups(cfg)[np.argsort(lay)]
    blocks = gid[: len(gid) // RPB * RPB].reshape(-1, RPB)
    dominant = np.mean([np.bincount(b).max() for b in blocks])
    shuffled = np.mean([np.bincount(b).max() for b in np.random.default_rng(0).permutation(gid)[: blocks.size].reshape(-1, RPB)])
    assert dominant > 0.7 * RPB > 3 * shuffled, (dominant, shuffled)


def test_shp_from_the_kmeans_layout_generalises_to_held_out_queries() -> None:
    cfg = QueryTraceConfig(rows=1 << 15, queries=6000, groups_per_query=4.0, rows_per_group=22.0)
    train, test = traces.query_trace(cfg).split(0.5)
    values = traces.group_embeddings(cfg, 32)
    lays = layout.make_many(layout.KINDS, trace=train, rows_per_block=RPB, weights=values)
    held = {k: layout.fanout(lay, RPB, test) for k, lay in lays.items()}
    assert held["shp+kmeans"] < 0.9 * held["shp"] < 0.9 * held["original"], held
    assert held["shp+kmeans"] < held["kmeans"], held
    both = lays["shp+kmeans"]
    assert _is_permutation(both, cfg.rows)
    assert np.array_equal(layout.make("shp+kmeans", trace=train, rows_per_block=RPB, weights=values), both)
    # The training trace still pulls its rows together about as SHP alone does.
    assert layout.fanout(both, RPB, train) < 1.2 * layout.fanout(layout.shp(train, RPB), RPB, train)


def test_bad_layout_input_is_refused_by_name() -> None:
    t = traces.query_trace(rows=2000, queries=50, group_size=32)
    with pytest.raises(InvalidArgumentError, match="shp\\+kmeans layout clusters the rows' values: pass weights"):
        layout.make("shp+kmeans", trace=t, rows_per_block=RPB)
    with pytest.raises(InvalidArgumentError, match="layout 'zigzag': known are original, shp, kmeans, shp\\+kmeans"):
        layout.make("zigzag", trace=t, rows_per_block=RPB)
    bad = np.arange(2000, dtype=np.uint32)
    bad[7] = 3
    with pytest.raises(InvalidArgumentError, match="SHP's start layout: .*row 7 at position 3, which another row holds"):
        layout.shp(t, RPB, start=bad)
    with pytest.raises(InvalidArgumentError, match="a layout of 1999 rows for a table of 2000"):
        layout.shp(t, RPB, start=np.arange(1999, dtype=np.uint32))
    with pytest.raises(InvalidArgumentError, match="weights must be \\(rows, dim\\)"):
        layout.kmeans(np.zeros(5, np.float32), RPB)
