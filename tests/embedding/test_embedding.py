"""Embedding tables at the NumPy level: bad input, cache behaviour, concurrency, workloads,
and the benchmark's code path at a tiny size."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tiermem
from tiermem import workloads
from tiermem.embedding import EmbeddingCollection, EmbeddingTable


def table(rows: int = 100, width: int = 16, **kw) -> EmbeddingTable:
    t = EmbeddingTable(rows, width, **kw)
    t.load(np.arange(rows * width, dtype=np.float32).reshape(rows, width))
    return t


def test_lookup_none_mode_is_a_gather() -> None:
    t = table()
    idx = np.array([5, 0, 99, 5])
    np.testing.assert_array_equal(t.lookup(idx, mode="none"), t.to_numpy()[idx])
    narrow = table(10, 4)
    out = EmbeddingCollection([t, narrow]).lookup([(idx, np.arange(5)), (np.array([3]), np.array([0, 1]))], mode="none")
    np.testing.assert_array_equal(out[:4], t.to_numpy()[idx])
    np.testing.assert_array_equal(out[4], np.concatenate([narrow.to_numpy()[3], np.zeros(12)]))


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.array([1, 100]), "position 1 holds 100"),
        (np.array([-1, 2]), "position 0 holds -1"),
    ],
)
def test_out_of_range_indices_name_table_position_value(bad: np.ndarray, match: str) -> None:
    t = table()
    before = t.to_numpy()
    with pytest.raises(tiermem.IndexOutOfRangeError, match=match):
        t.lookup(bad, [0])
    with pytest.raises(IndexError, match="table 0"):
        t.update(bad, [0], np.ones((1, 16)), lr=1.0)
    np.testing.assert_array_equal(t.to_numpy(), before)


@pytest.mark.parametrize(
    "offsets, match",
    [
        ([0, 3, 2], r"offsets\[1\] = 3 > offsets\[2\] = 2"),
        ([0, 5], "last offset is 5"),
        ([1, 2], r"offsets\[0\] is 1"),
    ],
)
def test_bad_offsets(offsets: list[int], match: str) -> None:
    t = table()
    last = match.startswith("last")
    with pytest.raises(tiermem.InvalidArgumentError, match=match):
        t.lookup(np.array([1, 2, 3, 4]), offsets, include_last_offset=last)
    with pytest.raises(tiermem.InvalidArgumentError, match=match):
        t.update(np.array([1, 2, 3, 4]), offsets, np.ones((len(offsets) - last, 16)), include_last_offset=last)


def test_mismatched_dtypes_and_widths() -> None:
    t = table()
    with pytest.raises(tiermem.InvalidArgumentError, match="integers"):
        t.lookup(np.array([1.0, 2.0]), [0])
    with pytest.raises(tiermem.InvalidArgumentError, match=r"\(rows, 16\)"):
        t.load(np.ones((3, 8)))
    with pytest.raises(tiermem.InvalidArgumentError, match="grad must have shape"):
        t.update(np.array([1, 2]), [0], np.ones((1, 8)))
    with pytest.raises(tiermem.InvalidArgumentError, match="out must be"):
        t.lookup(np.array([1, 2]), [0], out=np.empty((1, 16), np.float64))
    with pytest.raises(tiermem.InvalidArgumentError, match="per-sample weights need mode 'sum'"):
        t.lookup(np.array([1, 2]), [0], per_sample_weights=[1.0, 2.0], mode="mean")
    with pytest.raises(tiermem.InvalidArgumentError, match="2 per-sample weights for 3"):
        t.lookup(np.array([1, 2, 3]), [0], per_sample_weights=[1.0, 2.0])
    with pytest.raises(tiermem.InvalidArgumentError, match="mode 'max'"):
        t.lookup(np.array([1, 2]), [0], mode="max")
    other = table(width=8)
    coll = EmbeddingCollection([t, other])
    with pytest.raises(tiermem.InvalidArgumentError, match="same batch"):
        coll.lookup([(np.array([1]), np.array([0, 1])), (np.array([1, 2]), np.array([0, 1, 2]))])
    with pytest.raises(tiermem.InvalidArgumentError, match="optimizer"):
        t.update(np.array([1]), [0], np.ones((1, 16)), optimizer="shampoo")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(tiermem.InvalidArgumentError):
            EmbeddingTable(bad, 4)
    with pytest.raises(tiermem.InvalidArgumentError, match="dtype"):
        EmbeddingTable(4, 4, dtype="float64")


def test_cache_larger_than_the_fast_device_is_refused() -> None:
    m = tiermem.Manager({"dram": "1 MiB", "emulated:optane-pmem": "64 MiB"})
    with pytest.raises(tiermem.InvalidArgumentError, match="does not fit fast device 'dram'"):
        EmbeddingTable(100_000, 64, manager=m, cache=0.5)
    with pytest.raises(tiermem.InvalidArgumentError, match="slower device"):
        EmbeddingTable(100, 16, manager=m, device="dram", cache=0.5)
    with pytest.raises(tiermem.InvalidArgumentError, match="pass device="):
        EmbeddingTable(100, 16, cache=0.5)
    with pytest.raises(tiermem.InvalidArgumentError, match="do not fit device 'dram'"):
        EmbeddingTable(1_000_000, 64, manager=m)
    keep = EmbeddingTable(3000, 64, manager=m, device="dram")  # 768 KB of the 1 MiB
    with pytest.raises(tiermem.DeviceFullError, match="'dram' is full"):
        EmbeddingTable(3000, 64, manager=m, device="dram")
    del keep
    assert m.object_count == 0, "failed constructions leave nothing allocated"


def test_tables_live_in_the_manager_and_are_released() -> None:
    m = tiermem.Manager({"dram": "4 MiB", "emulated:cxl": "16 MiB"})
    t = EmbeddingTable(1000, 64, manager=m, cache=0.25)
    u = m.usage()
    assert u["emulated:cxl"]["used"] >= 1000 * 64 * 4 and u["dram"]["used"] > 0
    t.lookup(np.arange(1000), np.arange(0, 1000, 10))
    assert m.stats()["emulated:cxl"]["bytes_read"] > 0
    del t
    assert m.object_count == 0
    m.check()


def test_dynamic_cache_counts_hits_and_flushes() -> None:
    t = table(1000, 16, device="emulated:optane-pmem", cache=0.1, cacheslack=0.05)
    rng = np.random.default_rng(0)
    for _ in range(20):
        t.lookup(rng.integers(0, 1000, 400), np.arange(0, 400, 4))
    s = t.stats()
    assert s["hits"] > 0 and s["misses"] > 0 and s["rows_cached"] > 0 and s["rows_evicted"] > 0, s
    info = t.cache_info
    assert info["size"] <= info["capacity"] and info["policy"] == "dynamic"
    assert 0 < t.hit_rate < 1
    t.set_cachelower(0)
    t.flush()
    assert t.cache_info["cached_rows"] == 0
    with pytest.raises(tiermem.InvalidArgumentError, match="exceeds"):
        t.set_cacheslack(10**12)


def test_admit_policy_caches_rows_on_their_second_miss() -> None:
    t = table(1000, 16, device="emulated:cxl", cache=0.5, policy="admit")
    once = np.arange(0, 100)
    t.lookup(once, [0])
    assert t.cache_info["cached_rows"] == 0, "first misses only mark rows"
    t.lookup(once, [0])
    assert t.cache_info["cached_rows"] == 100
    t.reset_stats()
    t.lookup(once, [0])
    assert t.hit_rate == 1.0
    np.testing.assert_array_equal(t.lookup(once, [0]), table(1000, 16).lookup(once, [0]))


def test_flush_clean_refuses_to_drop_updates() -> None:
    t = table(100, 16, device="emulated:cxl", cache=0.5)
    t.lookup(np.arange(10), [0])
    t.update(np.arange(10), [0], np.ones((1, 16)), lr=1.0)
    t.set_cachelower(0)
    with pytest.raises(tiermem.InvalidArgumentError, match="dirty"):
        t.flush(write_back=False)
    want = t.to_numpy()
    assert t.flush(write_back=True) == 10
    np.testing.assert_array_equal(t.to_numpy(), want)
    assert t.stats()["rows_written_back"] == 10


def test_static_policy_fills_once_and_only_reads() -> None:
    t = table(1000, 16, device="emulated:cxl", cache=0.3, policy="static")
    assert t.cache_info["cached_rows"] == 0, "filled at the first lookup, after loading"
    first = t.lookup(np.arange(1000), np.arange(0, 1000, 10))
    cached = t.cache_info["cached_rows"]
    assert cached > 250
    np.testing.assert_array_equal(first, table(1000, 16).lookup(np.arange(1000), np.arange(0, 1000, 10)))
    t.reset_stats()
    t.lookup(np.arange(1000), np.arange(0, 1000, 10))
    assert t.cache_info["cached_rows"] == cached
    assert abs(t.hit_rate - cached / 1000) < 0.01
    assert t.flush(write_back=False) >= 0, "the filled rows are clean: flush_clean accepts them"


def test_a_cache_filled_with_every_row_reads_like_a_direct_table() -> None:
    # A cache that holds every row, filled, is resident (each row at the slot of its
    # number: lookups skip the pointer table); lookups and updates equal a direct table's,
    # and a flush that drops rows ends residency without changing a value.
    rows, width = 3000, 16
    ref = table(rows, width)
    t = table(rows, width, device="emulated:cxl", cache=1.0, policy="dynamic")
    part = table(rows, width, device="emulated:cxl", cache=0.5, policy="dynamic")
    assert not t.cache_info["resident"]
    assert t.fill_cache(3) == rows and part.fill_cache(3) > 0
    assert t.cache_info["resident"] and not part.cache_info["resident"]
    rng = np.random.default_rng(4)
    for step in range(6):
        idx = rng.integers(0, rows, 800)
        offs = np.arange(0, 800, 8)
        g = rng.standard_normal((100, width)).astype(np.float32)
        want = ref.lookup(idx, offs)
        for x in (t, part):
            np.testing.assert_array_equal(x.lookup(idx, offs), want)
            x.update(idx, offs, g, optimizer="sgd", lr=0.1)
        ref.update(idx, offs, g, optimizer="sgd", lr=0.1)
        if step == 3:
            assert t.cache_info["resident"], "lookups and updates keep every row in its slot"
            t.set_cachelower(t.cache_info["capacity"] // 4)
            t.flush(write_back=True)
            assert not t.cache_info["resident"]
    for x in (t, part):
        np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())


def test_a_dynamic_cache_prefetches_the_next_batch_so_its_lookup_only_hits() -> None:
    # The prefetch pipeline over memory: while a step computes, the next batch's missing
    # rows are cached (room made, the batch's cached rows kept); its lookup then hits every
    # row and reclaims nothing, and lookups and updates stay equal to a direct table's.
    rows, width = 4000, 16
    ref = table(rows, width)
    t = table(rows, width, device="emulated:cxl", cache=0.1, policy="dynamic")
    rng = np.random.default_rng(5)
    batches = [rng.integers(0, rows, 200) for _ in range(12)]
    offs = np.arange(0, 200, 4)
    evicted = 0
    for k, idx in enumerate(batches):
        want = ref.lookup(idx, offs)
        t.reset_stats()
        np.testing.assert_array_equal(t.lookup(idx, offs), want)
        s = t.stats()
        if k > 0:
            assert s["misses"] == 0, f"batch {k}: {s}"
            assert s["rows_evicted"] == 0, "the prefetch left room: the lookup reclaims nothing"
        if k + 1 < len(batches):
            nxt = batches[k + 1]
            assert 0 < t.prefetch(nxt) <= len(np.unique(nxt))
            assert t.prefetch(nxt) == 0, "the second finds them cached"
            evicted += t.stats()["rows_evicted"]
        g = rng.standard_normal((50, width)).astype(np.float32)
        t.update(idx, offs, g, optimizer="sgd", lr=0.1)  # after the prefetch, as in training
        ref.update(idx, offs, g, optimizer="sgd", lr=0.1)
    assert evicted > 0, "the cache filled, and the prefetches made room"
    np.testing.assert_array_equal(t.to_numpy(), ref.to_numpy())
    with pytest.raises(tiermem.IndexOutOfRangeError, match="holds 4000"):
        t.prefetch(np.array([1, 4000]))
    # Caches that do not cache on lookup, or are bypassed, and direct tables prefetch nothing.
    static = table(rows, width, device="emulated:cxl", cache=0.1, policy="static")
    bypassed = table(rows, width, device="emulated:cxl", cache=0.1, policy="dynamic")
    bypassed.set_bypass(True)
    for x in (static, bypassed, ref):
        assert x.prefetch(batches[0]) == 0
    assert bypassed.cache_info["cached_rows"] == 0


def test_flush_during_lookups_from_another_thread() -> None:
    rows, width = 2000, 32
    t = EmbeddingTable(rows, width, device="emulated:cxl", cache=0.1)
    t.load(np.repeat(np.arange(rows, dtype=np.float32)[:, None], width, axis=1))
    errors: list[str] = []
    stop = threading.Event()

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            idx = rng.integers(0, rows, 512)
            out = t.lookup(idx, mode="none")
            if not (out == idx[:, None]).all():
                errors.append("torn or wrong row")

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(2)]
    for th in threads:
        th.start()
    try:
        for _ in range(200):
            idx = np.random.default_rng().integers(0, rows, 64)
            t.update(idx, mode="none", offsets=None, grad=np.zeros((64, width)), lr=0.0)
            t.flush()
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not errors
    np.testing.assert_array_equal(t.to_numpy()[:, 0], np.arange(rows))


def test_workloads_shapes_reuse_and_reproducibility() -> None:
    rows = [1 << 16, 1 << 10]
    for dist in workloads.DISTRIBUTIONS:
        a = workloads.batch(dist, rows, 256, 8, seed=3, step=1)
        b = workloads.batch(dist, rows, 256, 8, seed=3, step=1)
        assert [x.shape for x in a] == [(2048,), (2048,)]
        assert all((x == y).all() for x, y in zip(a, b))
        assert all((x >= 0).all() and (x < r).all() for x, r in zip(a, rows))
    uni = workloads.batch("uniform", [1 << 20], 1024, 64)[0]
    zipf = workloads.batch("zipf", [1 << 20], 1024, 64)[0]
    assert len(np.unique(zipf)) < 0.5 * len(np.unique(uni)), "zipf reuses rows"
    # The LFSR scrambles ranks: the most popular rows are not neighbours.
    top = np.argsort(np.bincount(zipf))[-8:]
    assert np.ptp(top) > 1000
    prod = workloads.batch("production", [1 << 20], 4096, 40, histogram="meta-2021")[0]
    h = workloads.reuse_histogram(prod)
    assert np.abs(np.array(h) - np.array(workloads.META_REUSE["meta-2021"])).max() < 0.02
    with pytest.raises(tiermem.InvalidArgumentError):
        workloads.batch("gauss", [10], 4, 4)
    with pytest.raises(tiermem.InvalidArgumentError):
        workloads.batch("production", [10], 4, 4, histogram=[1.0])


def test_bench_code_path_at_a_tiny_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiermem.bench import embedding as bench

    monkeypatch.setattr(bench, "sizes", lambda quick: {"tables": 2, "rows": 2000, "batch": 64, "reps": 2})
    res = bench.run(quick=True, progress=False)
    ops = {(c["op"], c["placement"]) for c in res["cases"]}
    assert ("lookup", "dram") in ops and ("lookup+update", "cached:25") in ops
    assert ("lookup", bench.SLOW) in ops
    import json
    import re

    res = json.loads(json.dumps(res))  # what --json writes
    for c in res["cases"]:
        assert {"op", "width", "bag", "dist", "placement", "policy", "seconds", "hit_rate", "roofline_gbps"} <= set(c)
        assert set(c["seconds"]) >= {"tiermem", "torch", "fbgemm"}
        assert c["seconds"]["tiermem"] > 0 and c["seconds"]["torch"] > 0
        assert c["dist"] in workloads.DISTRIBUTIONS and c["op"] in ("lookup", "lookup+update")
        assert c["width"] in (16, 64, 256) and c["bag"] in (1, 40)
        assert re.fullmatch(r"dram|cached:\d+|emulated:optane-pmem", c["placement"]), c["placement"]
        if c["placement"].startswith("cached"):
            assert 0 <= c["hit_rate"] <= 1 and c["devices"][bench.SLOW] == "emulated"
        if c["op"] == "lookup" and c["placement"] == "dram":
            assert c["roofline_gbps"] > 0
    assert (res["fbgemm"] is None) == (res["fbgemm_note"] is not None)
    variants = {(c["variant"], c["op"]): c for c in res["cases"] if c.get("variant")}
    assert set(variants) == {(v[0], op) for v in bench.VARIANTS for op in ("lookup", "lookup+update")}
    adam = variants["adam", "lookup+update"]
    assert adam["seconds"]["fbgemm"] is None and "no adam" in adam["fbgemm_note"]
    if res["fbgemm"]:
        assert variants["float16 sgd", "lookup"]["seconds"]["fbgemm"] > 0
    assert variants["float16 sgd", "lookup"]["dtype"] == "float16"
    text = bench.report(res)
    assert "EMULATED" in text and "headline" in text and "lookup+update (adam)" in text


_ISA_SCRIPT = """
import hashlib, numpy as np
from tiermem import _tiermem
from tiermem.embedding import EmbeddingTable
rng = np.random.default_rng(5)
h = hashlib.sha256(_tiermem.kernel_isa().encode() * 0)
for width, dtype in ((16, "float32"), (64, "bfloat16"), (37, "float32"), (32, "float16")):
    t = EmbeddingTable(300, width, dtype=dtype)
    t.load(rng.standard_normal((300, width)).astype(np.float32))
    idx = rng.integers(0, 300, 2000)
    off = np.arange(0, 2000, 20)
    w = rng.random(2000).astype(np.float32)
    for opt in ("sgd", "adagrad", "rowwise_adagrad", "adam", "lamb", "lars_sgd"):
        h.update(t.lookup(idx, off, w).tobytes())
        h.update(t.lookup(idx, off, mode="mean").tobytes())
        t.update(idx, off, rng.standard_normal((100, width)), mode="mean", optimizer=opt, lr=0.1)
    h.update(t.to_numpy().tobytes())
print(_tiermem.kernel_isa(), h.hexdigest())
"""


def test_every_instruction_set_gives_bit_identical_results() -> None:
    import os
    import subprocess
    import sys

    results = {}
    for env in ({}, {"TIERMEM_DISABLE_AVX512": "1"}, {"TIERMEM_DISABLE_NT": "1"}):
        out = subprocess.run(
            [sys.executable, "-c", _ISA_SCRIPT],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout.split()
        results[out[0]] = out[1]
    assert len(set(results.values())) == 1, results
    assert "scalar" in " ".join(results).lower(), results
