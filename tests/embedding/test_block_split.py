"""A fast budget split over block tables' caches by their miniature caches
(``tiermem.embedding.block.admission.split``), and DLRM's mode ``block`` built on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem.embedding.block import admission
from tiermem.embedding.block.traces import Trace
from tiermem.embedding.cacheplan import SLOT_OVERHEAD, split_greedy

RPB, RB = 15, 256  # rows per 4 KiB block and bytes per row of a 64-wide float32 table


def _trace(rows: int, rng: np.random.Generator, hot: int | None, queries: int = 4000, bag: int = 8) -> Trace:
    """``queries`` bags over a table of ``rows`` rows: uniform over its first ``hot`` rows
    (scattered by a fixed permutation), or over all of them."""
    pick = rng.integers(0, hot or rows, queries * bag)
    perm = np.random.default_rng(rows).permutation(rows)
    return Trace(np.arange(0, queries * bag + 1, bag, dtype=np.int64), perm[pick].astype(np.int64), rows)


def test_a_skewed_table_gets_the_budget_a_uniform_one_would_waste(rng: np.random.Generator) -> None:
    traces = [_trace(6000, rng, hot=600), _trace(6000, rng, hot=None)]
    budget = int(900 * (RB + SLOT_OVERHEAD))
    sp = admission.split(traces, rows_per_block=RPB, row_bytes=RB, budget=budget, floors=[100, 100], batch=64)
    assert sp.cache_rows[0] >= 600 > sp.cache_rows[1] >= 100
    assert sum(sp.cache_rows) * (RB + SLOT_OVERHEAD) <= budget
    assert [abs(r - 450) <= 1 for r in sp.even_rows] == [True, True]
    assert sum(sp.blocks_read) < 0.8 * sum(sp.even_blocks_read)
    # The predicted blocks are the miniature cache's at that size, every access simulated.
    for t, tr in enumerate(traces):
        lay = np.arange(tr.rows_total)
        for rows, read in ((sp.cache_rows[t], sp.blocks_read[t]), (sp.even_rows[t], sp.even_blocks_read[t])):
            sim = admission.simulate(
                tr, lay, rows_per_block=RPB, cache_rows=rows, row_bytes=RB, admissions=["row"], rate=1.0, batch=64
            )
            assert sim["row"]["blocks_read"] == read


def test_alike_tables_split_evenly_and_floors_hold(rng: np.random.Generator) -> None:
    traces = [_trace(3000, rng, hot=None) for _ in range(3)]
    budget = int(1500 * (RB + SLOT_OVERHEAD))
    sp = admission.split(traces, rows_per_block=RPB, row_bytes=RB, budget=budget, floors=[200, 900, 200], batch=64)
    assert sp.cache_rows[1] >= 900 and min(sp.cache_rows) >= 200
    assert sum(sp.cache_rows) * (RB + SLOT_OVERHEAD) <= budget
    # A uniform table's curve is a line: what is left after the floors goes to the tables
    # alike (within one step of the size axis each).
    step = (budget / (RB + SLOT_OVERHEAD) - 1300) / admission.SPLIT_STEPS
    assert abs(sp.cache_rows[0] - sp.cache_rows[2]) <= step + 1


def test_split_greedy_follows_each_curves_hull() -> None:
    # Item 0 gains 10 for its first 2 units then nothing; item 1 gains 3 per unit; item 2's
    # first point is a dip the hull steps over.
    costs = [[0, 2, 4], [0, 1, 2, 3], [5, 6, 7]]
    values = [[0, 10, 10], [0, 3, 6, 9], [0, -1, 8]]
    assert split_greedy(costs, values, 5) == [1, 1, 2]
    assert split_greedy(costs, values, 0) == [0, 0, 0]
    assert split_greedy(costs, values, 100) == [1, 3, 2]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(floors=[0, 1]), r"table 0: a floor of 0 rows is outside 1\.\.6000"),
        (dict(floors=[1, 7000]), r"table 1: a floor of 7000 rows is outside 1\.\.6000"),
        (dict(floors=[1]), "one floor and one layout per table"),
        (dict(floors=[5000, 5000]), r"least caches \(10000 rows.*do not fit a budget of"),
        (dict(layouts=[np.arange(6000), np.arange(10)]), r"table 1: the layout must hold one position per row \(6000\)"),
        (dict(row_bytes=0), "must be at least 1"),
    ],
)
def test_bad_split_input_is_refused_by_name(kwargs: dict, match: str, rng: np.random.Generator) -> None:
    traces = [_trace(6000, rng, hot=None, queries=50)] * 2
    args = dict(rows_per_block=RPB, row_bytes=RB, budget=1 << 20) | kwargs
    with pytest.raises(tiermem.InvalidArgumentError, match=match):
        admission.split(traces, **args)
    with pytest.raises(tiermem.InvalidArgumentError, match="at least one table"):
        admission.split([], rows_per_block=RPB, row_bytes=RB, budget=1 << 20)


torch = pytest.importorskip("torch")


def test_dlrm_block_mode_splits_by_curves_and_trains_the_even_splits_curve(disk_dir: Path) -> None:
    from tiermem.dlrm.data import SyntheticData
    from tiermem.dlrm.model import DLRMConfig
    from tiermem.dlrm.trainer import Trainer

    # Tables of unequal size under one Zipf law: the curves give the budget where it saves reads.
    c = DLRMConfig(rows=(3_000, 20_000, 60_000), dim=16, bottom_mlp=(16,), top_mlp=(8, 1), bag=4, batch_size=64)
    d = SyntheticData(c.rows, c.dense_features, c.batch_size, c.bag, dist="zipf", alpha=1.2, seed=3)
    prof = [d.batch(i) for i in range(6)]
    runs = {}
    for how in admission.SPLITS:
        t = Trainer(c, "block", slow=f"block:{disk_dir}", fast_budget=c.table_bytes // 4, profile=prof, lr=0.1, block_split=how)
        try:
            caps = [int(tab.cache_info["capacity"]) // tab.row_bytes for tab in t.tables]
            r = t.train((d.batch(i) for i in range(6, 16)), 10)
            assert r.fast_bytes_peak <= r.fast_budget
            runs[how] = (t.block_split, caps, r.losses)
        finally:
            t.close()
    (sp, caps, losses), (none, even_caps, even_losses) = runs["curves"], runs["even"]
    assert none is None and sp is not None and losses == even_losses
    assert [abs(a - b) <= max(64, 0.01 * b) for a, b in zip(caps, sp.cache_rows)] == [True] * 3
    assert sum(sp.blocks_read) <= sum(sp.even_blocks_read)
    fractions = [a / r for a, r in zip(even_caps, c.rows)]  # one fraction, caches in whole frames
    assert max(fractions) <= 1.15 * min(fractions)
    with pytest.raises(tiermem.InvalidArgumentError, match="block_split 'hot': known are curves, even"):
        Trainer(c, "block", slow=f"block:{disk_dir}", profile=prof, block_split="hot")


@pytest.mark.parametrize("how", ["curves", "even", "curves,even"])
def test_train_cli_reports_the_block_split(how: str, disk_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tiermem.cli.main import main

    out = tmp_path / "r.json"
    args = ["train", "dlrm", "--rows", "3000,20000,60000", "--dim", "16", "--bottom-mlp", "16", "--top-mlp", "8-1"]
    args += ["--bag", "4", "--batch-size", "64", "--iters", "2", "--warmup", "3", "--modes", "all-fast,block"]
    args += ["--slow", f"block:{disk_dir}", "--block-split", how, "--json", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    runs = {r["label"]: r for r in json.loads(out.read_text())["runs"]}
    want = {"curves": ["all-fast", "block"], "even": ["all-fast", "block"], "curves,even": ["all-fast", "block", "block/even"]}
    assert list(runs) == want[how]
    assert [runs[k]["block_split_mode"] for k in want[how][1:]] == how.split(",")
    if how == "even":
        assert "block_split" not in runs["block"] and "block: caches of" not in text
    else:
        sp = runs["block"]["block_split"]
        assert len(sp["cache_rows"]) == len(sp["even_rows"]) == 3 and all(r >= 1 for r in sp["cache_rows"])
        ratio = sum(sp["blocks_read"]) / sum(sp["even_blocks_read"])
        assert f"block: caches of {min(sp['cache_rows']):,}-{max(sp['cache_rows']):,} rows" in text
        assert f"{ratio:.2f}x the blocks an even split's read" in text
    if how == "curves,even":
        assert runs["block"]["losses"] == runs["block/even"]["losses"]
        assert "block/even" in text


@pytest.mark.parametrize("bad", ["hot", "curves,curves", ","])
def test_train_cli_refuses_a_bad_block_split(bad: str, disk_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tiermem.cli.main import main

    args = ["train", "dlrm", "--rows", "3000,20000", "--dim", "16", "--bottom-mlp", "16", "--top-mlp", "8-1"]
    assert main([*args, "--modes", "block", "--slow", f"block:{disk_dir}", "--block-split", bad]) == 2
    assert f"--block-split {bad!r}: give curves or even, or both comma-separated" in capsys.readouterr().err


def test_bench_ssd_trains_both_splits_beside_all_fast(disk_dir: Path) -> None:
    from tiermem.bench.ssd import _dlrm
    from tiermem.dlrm.model import DLRMConfig

    c = DLRMConfig(rows=(3_000, 20_000, 60_000), dim=16, bottom_mlp=(16,), top_mlp=(8, 1), bag=4, batch_size=64, name="tiny")
    runs = {r["placement"]: r for r in _dlrm(disk_dir, True, c)}
    assert {"all-fast", "block", "block-even"} <= set(runs)
    for p in ("block", "block-even"):
        assert runs[p]["blocks_read_per_iter"] > 0 and runs[p]["blocks_written_per_iter"] >= 0
        assert runs[p]["dram_cache_bytes"] == c.table_bytes // 4
    assert runs["all-fast"]["blocks_read_per_iter"] is None
