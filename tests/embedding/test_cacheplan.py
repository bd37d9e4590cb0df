"""Cache plans from hit-rate curves (tiermem.embedding.cacheplan): the curves against brute
force, the budget split, the policy each table gets, bad input, and DLRM's ``auto`` mode."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import tiermem
from tiermem.embedding import EmbeddingTable
from tiermem.embedding.cacheplan import Costs, curves, plan

COSTS = Costs(delta_ns=1.0, insert_ns=0.3, source="test")


def _lru(trace: np.ndarray, c: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for r in trace.tolist():
        if r in cache:
            hits += 1
            cache.move_to_end(r)
        elif c > 0:
            cache[r] = None
            if len(cache) > c:
                cache.popitem(last=False)
    return hits / len(trace)


def _static(trace: np.ndarray, rows: int, c: int) -> float:
    half = len(trace) // 2
    counts = np.bincount(trace[:half], minlength=rows)
    top = set(np.argsort(-counts, kind="stable")[:c].tolist())
    second = trace[half:]
    return sum(r in top for r in second.tolist()) / len(second)


@pytest.mark.parametrize("seed", [0, 1])
def test_curves_equal_brute_force_lru_and_static_caches(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = 300
    trace = np.minimum(rng.zipf(1.3, 4000) - 1, rows - 1).astype(np.int64)
    sizes = [0, 1, 7, 30, 120, 300]
    dyn, stat = curves(trace, rows, sizes)
    for c, d, s in zip(sizes, dyn, stat):
        assert d == pytest.approx(_lru(trace, c), abs=1e-12), c
        assert s == pytest.approx(_static(trace, rows, c), abs=1e-12), c


def test_a_long_profile_is_sampled_by_count_within_a_hundredth_of_the_exact_curve() -> None:
    # Longer than EXACT_LIMIT, so curves() takes the 1 % SHARDS sample stratified by count;
    # Zipf(1.05) over 400k rows, caches of 1-20 %. A hashed sample of the same trace is
    # reported beside it (its error depends on which moderately hot rows the hash takes).
    from tiermem import _tiermem
    from tiermem.embedding.cacheplan import EXACT_LIMIT

    rng = np.random.default_rng(3)
    rows = 400_000
    w = 1.0 / np.arange(1, rows + 1) ** 1.05
    trace = rng.permutation(rows)[np.searchsorted(np.cumsum(w) / w.sum(), rng.random(EXACT_LIMIT + 500_000))]
    trace = np.minimum(trace, rows - 1).astype(np.int64)
    sizes = [rows // 100, rows // 50, rows // 20, rows // 10, rows // 5]
    exact = _tiermem.lru_curve(trace, sizes)
    dyn, _ = curves(trace, rows, sizes)
    assert dyn == _tiermem.shards_curve(trace, 0.01, sizes, sampling="count")
    assert dyn != exact, "a sample, not the exact curve"
    worst = max(abs(a - b) for a, b in zip(dyn, exact))
    hashed = _tiermem.shards_curve(trace, 0.01, sizes, rows)
    print(f"1 % sample: by count {worst:.4f}, by hash {max(abs(a - b) for a, b in zip(hashed, exact)):.4f}")
    assert worst < 0.01


def test_a_sampled_curve_refuses_bad_input_by_name() -> None:
    from tiermem import _tiermem

    t = np.arange(10, dtype=np.int64)
    for rate in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(tiermem.InvalidArgumentError, match="sampling rate"):
            _tiermem.shards_curve(t, rate, [1])
    with pytest.raises(tiermem.InvalidArgumentError, match='"hash" or "count", got "rows"'):
        _tiermem.shards_curve(t, 0.1, [1], sampling="rows")
    with pytest.raises(tiermem.InvalidArgumentError, match=r"table_rows \(10\) applies to sampling \"hash\" only"):
        _tiermem.shards_curve(t, 0.1, [1], 10, sampling="count")
    assert _tiermem.shards_curve(t, 1.0, [5], sampling="count") == _tiermem.lru_curve(t, [5])


def _drifting(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Hot rows that move: each tenth of the trace draws from its own small window."""
    parts = [rng.integers(k * rows // 10, k * rows // 10 + rows // 50, n // 10) for k in range(10)]
    return np.concatenate(parts).astype(np.int64)


def test_the_plan_keeps_the_budget_and_picks_each_tables_policy() -> None:
    rng = np.random.default_rng(3)
    rows = [20_000, 20_000, 20_000, 20_000]
    skewed = (np.minimum(rng.zipf(1.2, 60_000), 20_000) - 1).astype(np.int64)
    uniform = rng.integers(0, 20_000, 60_000).astype(np.int64)
    drifting = _drifting(20_000, 60_000, rng)
    unused = np.empty(0, np.int64)
    rb = [256] * 4
    budget = 20_000 * 260 // 2
    got = plan([skewed, uniform, drifting, unused], rows, rb, budget, COSTS)
    assert sum(p.cache_rows * (p.row_bytes + 4) for p in got) <= budget
    by = dict(zip(["skewed", "uniform", "drifting", "unused"], got))
    # A stationary skew is best served by the profile's hottest rows, filled once.
    assert by["skewed"].policy == "static" and by["skewed"].cache_rows > 0
    # Hot rows that move: only a cache that follows the misses hits them.
    assert by["drifting"].policy == "dynamic" and by["drifting"].hit_dynamic > by["drifting"].hit_static
    # A table the profile never touched gets nothing; nor does one whose rows gain least.
    assert by["unused"].policy is None and by["unused"].cache_rows == 0
    # The skewed table's first rows are worth more than the uniform table's.
    small = plan([skewed, uniform], rows[:2], rb[:2], 20_000 * 260 // 20, COSTS)
    assert small[0].cache_rows > small[1].cache_rows


def test_a_high_insertion_cost_turns_dynamic_into_static_or_nothing() -> None:
    rng = np.random.default_rng(4)
    drifting = _drifting(10_000, 40_000, rng)
    cheap = plan([drifting], [10_000], [256], 1_000 * 260, Costs(1.0, 0.01, "t"))[0]
    dear = plan([drifting], [10_000], [256], 1_000 * 260, Costs(1.0, 100.0, "t"))[0]
    assert cheap.policy == "dynamic"
    assert dear.policy in ("static", None)
    # In training an insert also writes back the updated row it displaces: a slow device's
    # dear writes turn the same table away from dynamic caching; read-only tables do not pay it.
    writes = Costs(1.0, 0.01, "t", write_back_ns=100.0)
    assert plan([drifting], [10_000], [256], 1_000 * 260, writes)[0].policy in ("static", None)
    assert plan([drifting], [10_000], [256], 1_000 * 260, writes, dirty=False)[0].policy == "dynamic"


def test_bad_plans_are_refused() -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="outside 0..9"):
        curves(np.array([0, 10]), 10, [1])
    with pytest.raises(tiermem.InvalidArgumentError, match="one profile"):
        plan([np.zeros(3, np.int64)], [10, 10], [4], 100, COSTS)
    with pytest.raises(tiermem.InvalidArgumentError, match="at least 0"):
        plan([np.zeros(3, np.int64)], [10], [4], -1, COSTS)


def test_auto_mode_needs_a_profile() -> None:
    from tiermem.dlrm.model import DLRMConfig
    from tiermem.dlrm.trainer import Trainer

    cfg = DLRMConfig(rows=(300, 200), dim=8, bottom_mlp=(8,), top_mlp=(4, 1), bag=2, batch_size=16)
    with pytest.raises(tiermem.InvalidArgumentError, match="profile"):
        Trainer(cfg, "auto")


def _direct_and_dynamic() -> tuple[EmbeddingTable, EmbeddingTable]:
    """A direct DRAM table and a dynamic cached table (20 %) over emulated CXL, same rows."""
    m = tiermem.Manager([("dram", 8 << 20), ("emulated:cxl", 8 << 20)], policy="all_fast")
    direct = EmbeddingTable(5000, 8)
    t = EmbeddingTable(5000, 8, manager=m, device=1, cache=0.2, policy="dynamic")
    w = np.random.default_rng(0).standard_normal((5000, 8)).astype(np.float32)
    direct.load(w)
    t.load(w)
    return direct, t


def test_a_bypassed_cache_reads_through_and_gives_the_same_rows(disk_dir) -> None:
    direct, t = _direct_and_dynamic()
    idx = np.random.default_rng(1).integers(0, 5000, 400)
    offs = np.arange(0, 400, 4)
    t.lookup(idx[:200], offs[:50])
    g = np.ones((50, 8), np.float32)
    for x in (t, direct):
        x.update(idx[:200], offs[:50], g, optimizer="sgd", lr=0.5)  # cached copies now newer than home
    before = t.cache_info["cached_rows"]
    assert before > 0
    t.set_bypass(True)
    assert t.cache_info["bypass"]
    np.testing.assert_array_equal(t.lookup(idx, offs), direct.lookup(idx, offs))
    assert t.cache_info["cached_rows"] == before, "a bypassed cache caches nothing more"
    t.set_bypass(False)
    t.lookup(idx, offs)
    assert t.cache_info["cached_rows"] > before
    with pytest.raises(tiermem.InvalidArgumentError, match="no cache"):
        direct.set_bypass(True)
    block = EmbeddingTable(5000, 8, device=f"block:{disk_dir / 'b.tmb'}", cache=0.1)
    with pytest.raises(tiermem.InvalidArgumentError, match="cannot bypass"):
        block.set_bypass(True)


def test_a_cache_bypassed_before_it_caches_reads_and_updates_the_home_directly() -> None:
    # Bypassed while empty (as DLRM's dynamic mode does), kernels go to the home rows without
    # the pointer table: lookups and updates equal a direct table's, the tally counts every
    # read a miss, nothing is cached; once the bypass is lifted, lookups cache again.
    direct, t = _direct_and_dynamic()
    t.set_bypass(True)
    rng = np.random.default_rng(2)
    for _ in range(4):
        idx = rng.integers(0, 5000, 400)
        offs = np.arange(0, 400, 4)
        g = rng.standard_normal((100, 8)).astype(np.float32)
        np.testing.assert_array_equal(t.lookup(idx, offs), direct.lookup(idx, offs))
        t.update(idx, offs, g, optimizer="sgd", lr=0.1)
        direct.update(idx, offs, g, optimizer="sgd", lr=0.1)
    np.testing.assert_array_equal(t.to_numpy(), direct.to_numpy())
    s = t.stats()
    assert t.cache_info["cached_rows"] == 0 and s["hits"] == 0 and s["misses"] >= 1600
    t.set_bypass(False)
    np.testing.assert_array_equal(t.lookup(idx, offs), direct.lookup(idx, offs))
    assert t.cache_info["cached_rows"] > 0


@pytest.mark.parametrize(("dist", "bypass"), [("uniform", True), ("zipf", False)])
def test_dynamic_mode_drops_the_caches_whose_curve_says_caching_loses(dist: str, bypass: bool) -> None:
    from tiermem.dlrm.data import SyntheticData
    from tiermem.dlrm.model import DLRMConfig
    from tiermem.dlrm.trainer import Trainer

    cfg = DLRMConfig(rows=(200_000, 100_000), dim=16, bottom_mlp=(16,), top_mlp=(8, 1), bag=20, batch_size=256)
    d = SyntheticData(cfg.rows, cfg.dense_features, cfg.batch_size, cfg.bag, dist=dist, seed=0)
    t = Trainer(cfg, "dynamic", profile=[d.batch(i) for i in range(4)])
    assert t.bypass == [bypass, bypass]
    # A table read through has no cache at all (a direct table on the slow device); the
    # others keep theirs, not bypassed.
    assert all((tab.cache_info is None) == bypass for tab in t.tables)
    assert all(tab.cache_info is None or not tab.cache_info["bypass"] for tab in t.tables)
    t.train((d.batch(i) for i in range(3)), 3)
    t.close()


@pytest.mark.parametrize(
    "policy", ["dynamic", "admit", "tinylfu", "dynamic:tinylfu", "dynamic:second", "dynamic:threshold", "dynamic:shadow"]
)
def test_the_lookup_simulation_predicts_a_real_tables_hits_and_inserts(policy: str) -> None:
    # minicache_lookups runs the table's own way of caching in lookups (second chance over
    # its pages, a reclaim when full, the admission); a real table over the same calls hits
    # and inserts as it says (kernels run in parallel chunks, so the order of inserts within
    # a call differs a little).
    from tiermem import _tiermem

    n, width = 20_000, 32
    m = tiermem.Manager([("dram", 16 << 20), ("emulated:cxl", 16 << 20)], policy="all_fast")
    policy, _, admission = policy.partition(":")
    t = EmbeddingTable(n, width, manager=m, device=1, cache=0.1, cacheslack=0.02, policy=policy, admission=admission or None)
    rng = np.random.default_rng(3)
    calls = [(rng.zipf(1.3, 4_000) - 1) % n for _ in range(30)]
    for c in calls:
        t.lookup(c, np.arange(0, c.size, 20))
    s, info = t.stats(), t.cache_info
    rb = width * 4
    trace = np.concatenate(calls).astype(np.int64)
    offsets = np.arange(0, trace.size + 1, 4_000, dtype=np.int64)
    table = {
        "rows": n,
        "capacity": (info["cachelower"] + info["cacheslack"]) // rb,
        "row_bytes": rb,
        "slack_rows": info["cacheslack"] // rb,
        "policy": policy,
        "admission": admission or None,
    }
    sim = _tiermem.minicache_lookups((offsets, trace), table, 1.0, 1)
    assert sim["accesses"] == trace.size == s["hits"] + s["misses"]
    assert abs(sim["hits"] - s["hits"]) <= 0.01 * trace.size, (sim, s)
    # Parallel chunks can leave the cache full at the end of a call where the sequential
    # simulation left a slot free (or the other way), moving a reclaim by one call and the
    # calls after it a little: up to a reclaim's worth of inserts either way (measured: at
    # most 472 of 9,400 on a quiet machine, 872 with CI's two workers busy, with a slack of
    # 400), bounded here at three.
    slack = info["cacheslack"] // rb
    assert abs(sim["inserts"] - s["rows_cached"]) <= 3 * slack, (sim, s)


def test_lookup_policy_caches_skewed_inputs_on_their_second_miss_and_reads_uniform_ones_through() -> None:
    from tiermem.embedding.cacheplan import lookup_policy

    n = 50_000
    rng = np.random.default_rng(4)
    costs = Costs(delta_ns=0.05, insert_ns=0.03, source="test", write_back_ns=0.2)
    skewed = [(rng.zipf(1.1, 20_000) - 1) % n for _ in range(10)]
    uniform = [rng.integers(0, n, 20_000) for _ in range(10)]
    ch = lookup_policy(skewed, n, n // 4, n // 40, 128, costs)
    assert ch.policy == "admit", ch.results
    assert ch.results["admit"]["inserts"] < ch.results["dynamic"]["inserts"]
    assert lookup_policy(uniform, n, n // 4, n // 40, 128, costs).policy is None
    # Read-only lookups leave rows clean: inserts cost only their fast write, and every-miss
    # caching, with the most hits, wins.
    assert lookup_policy(skewed, n, n // 4, n // 40, 128, costs, dirty=False).policy == "dynamic"
    with pytest.raises(tiermem.InvalidArgumentError, match="outside"):
        lookup_policy([np.array([n])], n, 10, 1, 128, costs)
    with pytest.raises(tiermem.InvalidArgumentError, match="slack_rows"):
        lookup_policy(skewed, n, 10, 11, 128, costs)
    # One policy simulated (the DLRM's tinylfu mode): it, or reading through where it loses.
    only = lookup_policy(skewed, n, n // 4, n // 40, 128, costs, policies=("tinylfu",))
    assert only.policy == "tinylfu" and set(only.results) == {"tinylfu"}
    assert lookup_policy(uniform, n, n // 4, n // 40, 128, costs, policies=("tinylfu",)).policy is None
    with pytest.raises(tiermem.InvalidArgumentError, match="policies"):
        lookup_policy(skewed, n, n // 4, n // 40, 128, costs, policies=())


def test_costs_of_a_device_without_figures_are_measured_or_refused_by_name(monkeypatch) -> None:
    # A NUMA node has no figures in its traits; without a calibration they are measured on an
    # object there (DLRM's dynamic and auto modes over numa:N failed here before); a device
    # too full to measure on is refused, naming calibrate.
    import tiermem.embedding.cacheplan as cp

    monkeypatch.setattr(tiermem, "_calibrated_devices", dict)
    m = tiermem.Manager([("dram", 32 << 20), ("numa:0", 32 << 20)], policy="all_fast")
    assert m.devices[1]["traits"]["read_gbps"] is None
    c = cp.Costs.of(m)
    assert "numa:0 (measured)" in c.source and c.insert_ns > 0 and c.write_back_ns > 0 and c.delta_ns >= 0
    monkeypatch.setattr(tiermem, "_calibrated_devices", lambda: {"numa:0": {"seq_read_gbps": 5.0, "seq_write_gbps": 2.0}})
    c = cp.Costs.of(m)
    assert "numa:0 (calibrated)" in c.source and c.write_back_ns == pytest.approx(0.5)
    monkeypatch.setattr(tiermem, "_calibrated_devices", dict)
    small = tiermem.Manager([("dram", 1 << 20), ("numa:0", 1 << 20)], policy="all_fast")
    with pytest.raises(tiermem.InvalidArgumentError, match="tiermem calibrate"):
        cp.Costs.of(small)
    # DRAM's figures never need room on the manager's device: a 1 MiB one still prices.
    tiny = tiermem.Manager([("dram", 1 << 20), ("emulated:cxl", 1 << 20)], policy="all_fast")
    assert cp.Costs.of(tiny).insert_ns > 0
