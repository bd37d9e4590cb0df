"""Query-structured traces and the trace file format (issue 14, item 7): deterministic,
co-accessed, drifting; files round-trip and every malformed file is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem.embedding.block import layout
from tiermem.embedding.block.traces import QueryTraceConfig, Trace, groups_layout, query_trace

SMALL = {"rows": 20_000, "queries": 3000, "group_size": 32, "seed": 3}


def test_same_config_same_trace_and_queries_are_co_accessed() -> None:
    a, b = query_trace(**SMALL), query_trace(**SMALL)
    assert (a.rows == b.rows).all() and (a.offsets == b.offsets).all()
    assert a.rows_total == 20_000 and a.queries == 3000 and int(a.offsets[-1]) == len(a.rows)
    assert ((a.rows >= 0) & (a.rows < 20_000)).all()
    # Co-access: without noise, a query's rows come from few groups, far fewer than if they
    # were drawn independently.
    t = query_trace(**{**SMALL, "noise": 0.0})
    members = np.random.default_rng(3).permutation(20_000)[: (20_000 // 32) * 32].reshape(-1, 32)
    group_of = np.empty(20_000, np.int64)
    group_of[members.ravel()] = np.repeat(np.arange(members.shape[0]), 32)
    sizes = [len(np.unique(group_of[t.query(q)])) / len(t.query(q)) for q in range(t.queries)]
    assert np.mean(sizes) < 0.5
    # Popularity is skewed: the top 1 % of rows takes a large share of lookups.
    counts = np.sort(np.bincount(a.rows, minlength=20_000))[::-1]
    assert counts[:200].sum() > 0.1 * counts.sum()


def test_the_groups_layout_packs_each_groups_hot_rows_into_whole_blocks() -> None:
    cfg = QueryTraceConfig(**SMALL)  # groups of 32 rows
    members = np.random.default_rng(3).permutation(20_000)[: (20_000 // 32) * 32].reshape(-1, 32)
    # Blocks of 32: each group is one whole block, in the generator's popularity order.
    lay = groups_layout(cfg, 32)
    assert lay.dtype == np.uint32 and sorted(lay.tolist()) == list(range(20_000))  # a permutation
    pos = lay[members]
    assert (np.diff(pos, axis=1) == 1).all() and (pos[:, 0] % 32 == 0).all()
    # Blocks of 10: each group's 30 hottest rows fill three blocks of its own; the two
    # coldest of every group share blocks after all of them.
    pos10 = groups_layout(cfg, 10)[members]
    head = members.shape[0] * 30
    assert (pos10[:, :30] < head).all() and (pos10[:, 30:] >= head).all()
    assert (pos10[:, 0] % 10 == 0).all() and (np.diff(pos10[:, :30], axis=1) == 1).all()
    # Without noise, every query's fan-out is the number of groups it drew (one block per
    # group here); SHP, trained on this very trace, does no better on it.
    t = query_trace(cfg, noise=0.0)
    group_of = np.empty(20_000, np.int64)
    group_of[members.ravel()] = np.repeat(np.arange(members.shape[0]), 32)
    drawn = np.mean([len(np.unique(group_of[t.query(q)])) for q in range(t.queries)])
    assert layout.fanout(lay, 32, t) == pytest.approx(drawn)
    assert layout.fanout(lay, 32, t) <= layout.fanout(layout.shp(t, 32), 32, t)
    with pytest.raises(tiermem.InvalidArgumentError, match="rows_per_block"):
        groups_layout(cfg, 0)


def test_drift_moves_popularity() -> None:
    still = query_trace(**{**SMALL, "drift": 0.0, "noise": 0.0})
    moving = query_trace(**{**SMALL, "drift": 1.0, "noise": 0.0})

    def overlap(t: Trace) -> float:
        first, last = t.split(0.5)
        top = lambda x: set(np.argsort(np.bincount(x.rows, minlength=20_000))[-500:])  # noqa: E731
        return len(top(first) & top(last)) / 500

    assert overlap(moving) < overlap(still)


def test_files_round_trip_and_split(tmp_path: Path) -> None:
    t = query_trace(**SMALL)
    p = tmp_path / "t.npz"
    t.save(p)
    u = Trace.load(p)
    assert (u.rows == t.rows).all() and (u.offsets == t.offsets).all() and u.rows_total == t.rows_total
    train, test = u.split(0.25)
    assert train.queries + test.queries == t.queries and test.offsets[0] == 0
    assert np.concatenate([train.rows, test.rows]).tolist() == t.rows.tolist()


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"offsets": np.array([0, 2], np.int64), "rows": np.array([1, 2], np.int64)}, "no 'rows_total'"),
        (
            {"offsets": np.array([0, 2], np.int32), "rows": np.array([1, 2], np.int64), "rows_total": np.int64(5)},
            "offsets must be a 1-D int64",
        ),
        ({"offsets": np.array([1, 2], np.int64), "rows": np.array([1, 2], np.int64), "rows_total": np.int64(5)}, "start at 0"),
        (
            {"offsets": np.array([0, 2, 1, 2], np.int64), "rows": np.array([1, 2], np.int64), "rows_total": np.int64(5)},
            "decrease at query 1",
        ),
        (
            {"offsets": np.array([0, 3], np.int64), "rows": np.array([1, 2], np.int64), "rows_total": np.int64(5)},
            "last offset is 3",
        ),
        (
            {"offsets": np.array([0, 2], np.int64), "rows": np.array([1, 7], np.int64), "rows_total": np.int64(5)},
            r"rows\[1\] = 7",
        ),
        (
            {"offsets": np.array([0, 2], np.int64), "rows": np.array([1, 2], np.int64), "rows_total": np.int64(0)},
            "rows_total is 0",
        ),
        (
            {"offsets": np.array([0, 1], np.int64), "rows": np.array([object()], dtype=object), "rows_total": np.int64(5)},
            "pickled",
        ),
    ],
)
def test_malformed_files_are_refused_by_name(tmp_path: Path, fields: dict, what: str) -> None:
    p = tmp_path / "bad.npz"
    np.savez(p, **fields)
    with pytest.raises(tiermem.InvalidArgumentError, match=what):
        Trace.load(p)


def test_not_an_npz_and_bad_configs(tmp_path: Path) -> None:
    p = tmp_path / "x.npz"
    p.write_bytes(b"hello")
    with pytest.raises(tiermem.InvalidArgumentError, match="not a readable .npz"):
        Trace.load(p)
    with pytest.raises(tiermem.InvalidArgumentError, match="no such file"):
        Trace.load(tmp_path / "missing.npz")
    for bad, what in [
        ({"rows": 0}, "rows must be"),
        ({"group_size": 10**9}, "larger than"),
        ({"noise": 1.5}, "noise must be"),
        ({"row_alpha": -1}, "row_alpha"),
    ]:
        with pytest.raises(tiermem.InvalidArgumentError, match=what):
            QueryTraceConfig(**bad).validate()
