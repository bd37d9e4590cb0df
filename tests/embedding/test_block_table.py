"""Block tables from Python (``device="block:PATH"``): the same lookups and updates as a
DRAM table, rows kept across closing and re-attaching the file, every bad configuration
refused with what and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem import _tiermem
from tiermem.embedding import EmbeddingTable
from tiermem.embedding.block import admission, layout
from tiermem.embedding.block.traces import Trace
from tiermem.exceptions import InvalidArgumentError

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


@pytest.mark.parametrize("admission", ["row", "row:1", "block", "threshold:1", "shadow:1.5"])
def test_block_table_matches_a_dram_table(disk_dir: Path, admission: str) -> None:
    path = disk_dir / f"t-{admission.replace(':', '_')}.tmb"
    ref = EmbeddingTable(ROWS, DIM)
    t = EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.08, admission=admission)
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
    assert info is not None and info["admission"] == admission and info["misses"] > 0 and info["blocks_read"] > 0
    if admission.startswith("row"):
        assert info["prefetched"] == 0
    if admission == "block":
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
    with pytest.raises(tiermem.InvalidArgumentError, match="admission 'blocks': unknown kind"):
        EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.1, admission="blocks")
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


_CHILD = r"""
import sys, numpy as np
from tiermem.embedding import EmbeddingTable
path, rows, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = EmbeddingTable(rows, dim, device=f"block:{path}", cache=0.05)
rng = np.random.default_rng(0)
k = 0
while True:
    k += 1
    t.load(np.full((rows, dim), k, np.float32))  # rows cached in slots, the rest to the file
    t.sync()
    print("written", k, flush=True)
    t.relayout(rng.permutation(rows))
    print("relaid", k, flush=True)
"""


def test_kill_9_during_write_back_and_relayout_leaves_every_row_at_a_written_value(disk_dir: Path) -> None:
    """A process killed at any moment (mid write, mid relayout) leaves a table file that
    opens and reads every row at the last value synced or the one being written, never a
    torn or damaged block."""
    import signal
    import time

    rows, dim = 20_000, 16
    path = disk_dir / "k.tmb"
    rng = np.random.default_rng(7)
    kills = 0
    for attempt in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), str(rows), str(dim)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.3 + float(rng.random()) * 1.2)
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=60)
        done = [int(x.split()[1]) for x in out.splitlines() if x.startswith("written")]
        if not done:  # killed while creating the file: a half-made file is refused as damaged
            path.unlink(missing_ok=True)
            continue
        kills += 1
        # The dead process's io_uring ring is torn down by the kernel after it exits; its
        # file reference (and so the lock) can outlive it by a moment.
        for _ in range(100):
            try:
                t = EmbeddingTable(rows, dim, device=f"block:{path}", cache=0.05)
                break
            except tiermem.InvalidArgumentError as e:
                assert "locked" in str(e), e
                time.sleep(0.05)
        else:
            raise AssertionError(f"{path} stayed locked 5 s after its owner was killed")
        got = np.unique(t.to_numpy())
        last = done[-1]
        assert set(got.tolist()) <= {float(last), float(last + 1)}, (attempt, last, got[:5])
        del t
        path.unlink()
    assert kills >= 3, "the child never got past its first write: the test checked nothing"


def test_a_full_disk_during_relayout_is_refused_and_the_table_keeps_its_rows(disk_dir: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk: the aside file cannot be written, the error
    names the file, the table still reads every row and no aside file is left behind."""
    path = disk_dir / "f.tmb"
    code = r"""
import resource, signal, sys, os, numpy as np
import tiermem
from tiermem.embedding import EmbeddingTable
path = sys.argv[1]
t = EmbeddingTable(5000, 16, device=f"block:{path}", cache=0.05)
t.load(np.arange(5000 * 16, dtype=np.float32).reshape(5000, 16))
t.sync()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
size = os.path.getsize(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))
try:
    t.relayout(np.random.default_rng(0).permutation(5000))
except OSError as e:
    print("refused:", e)
assert (t.to_numpy() == np.arange(5000 * 16, dtype=np.float32).reshape(5000, 16)).all()
print("aside left:", os.path.exists(path + ".relayout"))
print("generation:", t.block_info["generation"])
"""
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "f.tmb" in out.stdout, out.stdout
    assert "aside left: False" in out.stdout and "generation: 1" in out.stdout, out.stdout
    t = EmbeddingTable(5000, 16, device=f"block:{path}", cache=0.05)
    np.testing.assert_array_equal(t.to_numpy(), np.arange(5000 * 16, dtype=np.float32).reshape(5000, 16))


def test_an_io_error_mid_batch_is_named_and_no_row_loses_its_last_value(disk_dir: Path) -> None:
    """EIO injected into the table file's reads (the second request of a batch fails) and
    writes (a write-back fails): each is a DeviceIOError naming the file and the block; the
    cache and the write-back buffer keep every row's last value, so once the disk heals the
    table matches a DRAM table that saw the same updates, also after reopening."""
    path = disk_dir / "eio.tmb"
    ref = EmbeddingTable(ROWS, DIM)
    t = EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.08, admission="block")
    w = np.random.default_rng(4).standard_normal((ROWS, DIM)).astype(np.float32)
    ref.load(w)
    t.load(w)
    batches = _batches(5, 24)
    failed_reads = failed_writes = 0
    for k, (idx, offs, g) in enumerate(batches):
        if k % 3 == 1:
            t._native.inject_io_faults(reads=1)  # the batch's second read request fails
        if k % 3 == 2:
            t._native.inject_io_faults(writes=0)  # every write-back fails
        updated = False
        try:
            t.lookup(idx, offs)
            # An update stages its rows before its kernel runs: if that fails, no row changed.
            t.update(idx, offs, g, optimizer="sgd", lr=0.05)
            updated = True
            if k % 3 == 2:
                t.sync()
        except tiermem.DeviceIOError as e:
            assert str(path) in str(e) and "block" in str(e), str(e)
            failed_reads += "read" in str(e)
            failed_writes += "read" not in str(e)
        if updated:
            ref.update(idx, offs, g, optimizer="sgd", lr=0.05)
        t._native.inject_io_faults()  # healed
        np.testing.assert_array_equal(t.to_numpy(), ref.to_numpy())
        np.testing.assert_array_equal(t.lookup(idx, offs), ref.lookup(idx, offs))
    assert failed_reads > 0 and failed_writes > 0, (failed_reads, failed_writes)
    t.sync()
    del t
    again = EmbeddingTable(ROWS, DIM, device=f"block:{path}", cache=0.05)
    np.testing.assert_array_equal(again.to_numpy(), ref.to_numpy())


def test_reading_a_whole_block_table_leaves_its_cache_as_it_was(disk_dir: Path) -> None:
    """to_numpy (and checkpoints) read through the cache: cached rows (dirty ones included)
    come from their slots, the rest from the file and the write-back buffer, and nothing is
    cached or evicted by the read."""
    ref = EmbeddingTable(ROWS, DIM)
    t = EmbeddingTable(ROWS, DIM, device=f"block:{disk_dir / 'r.tmb'}", cache=0.05)
    w = np.random.default_rng(6).standard_normal((ROWS, DIM)).astype(np.float32)
    ref.load(w)
    t.load(w)
    for idx, offs, g in _batches(7, 6):
        t.lookup(idx, offs)
        ref.lookup(idx, offs)
        t.update(idx, offs, g, optimizer="sgd", lr=0.05)
        ref.update(idx, offs, g, optimizer="sgd", lr=0.05)
    before = (t.cache_info["cached_rows"], t.block_info["blocks_read"], t.block_info["misses"])
    np.testing.assert_array_equal(t.to_numpy(), ref.to_numpy())
    after = (t.cache_info["cached_rows"], t.block_info["blocks_read"], t.block_info["misses"])
    assert after == before, (before, after)
    # The next lookup still hits what was cached.
    idx, offs, _ = _batches(7, 6)[-1]
    t.reset_stats()
    np.testing.assert_array_equal(t.lookup(idx, offs), ref.lookup(idx, offs))
    assert t.stats()["misses"] == 0


def test_relayout_reports_its_progress_and_keeps_every_row(disk_dir: Path) -> None:
    t = EmbeddingTable(ROWS, DIM, device=f"block:{disk_dir / 'p.tmb'}", cache=0.05)
    w = np.random.default_rng(8).standard_normal((ROWS, DIM)).astype(np.float32)
    t.load(w)
    gen = t.block_info["generation"]
    seen: list[tuple[int, int]] = []
    # A small budget: many chunks, each reported.
    t.relayout(np.random.default_rng(9).permutation(ROWS), budget=8 << 10, on_progress=lambda d, n: seen.append((d, n)))
    total = t.block_info["data_blocks"]
    assert seen and seen[-1] == (total, total), seen[-3:]
    assert all(0 <= d <= n == total for d, n in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    np.testing.assert_array_equal(t.to_numpy(), w)
    assert t.block_info["generation"] == gen + 1


def test_a_cache_larger_than_dram_is_refused_with_the_numbers(disk_dir: Path) -> None:
    m = tiermem.Manager([("dram", 1 << 20)], policy="all_fast")
    with pytest.raises(tiermem.InvalidArgumentError, match="does not fit fast device 'dram'"):
        EmbeddingTable(100_000, 64, device=f"block:{disk_dir / 'c.tmb'}", cache=0.5, manager=m)


def test_torch_modules_on_the_disk_prefetch_and_match_dram(disk_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from tiermem.torch import TieredEmbeddingBag, TieredEmbeddingBagCollection

    one = TieredEmbeddingBag(3000, 16, mode="sum", where=f"block:{disk_dir / 'one.tmb'}", cache=0.1, seed=1)
    ref = TieredEmbeddingBag(3000, 16, mode="sum", seed=1)
    idx = torch.randint(0, 3000, (64, 5), generator=torch.Generator().manual_seed(2))
    assert one.prefetch(idx) > 0 and one.prefetch(idx) == 0  # the second finds them cached
    torch.testing.assert_close(one(idx), ref(idx), rtol=0, atol=0)
    both = TieredEmbeddingBagCollection([(1000, 8), (2000, 8)], where=f"block:{disk_dir}", cache=0.2, seed=3)
    assert [t.path for t in both.tables] == [str(disk_dir / "table0.tmb"), str(disk_dir / "table1.tmb")]
    values = torch.tensor([1, 2, 3, 1500, 7], dtype=torch.int64)  # table 0: 1, 2, 3; table 1: 1500, 7
    with pytest.raises(tiermem.InvalidArgumentError, match="T \\* B \\+ 1"):
        both.prefetch(values, torch.tensor([0, 3], dtype=torch.int64))
    assert both.prefetch(values, torch.tensor([0, 3, 5], dtype=torch.int64)) == 5


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tiermem.cli.main", *args], capture_output=True, text=True, timeout=900)


def test_bench_ssd_json_holds_every_figure(tmp_path: Path, disk_dir: Path) -> None:
    out = tmp_path / "s.json"
    r = _cli(
        "bench", "ssd", "--quick", "--rows", "4096", "--queries", "1500", "--no-dlrm", "--dir", str(disk_dir), "--json", str(out)
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["device"].startswith("block") and res["dlrm"] == []
    assert {c["trace"] for c in res["cases"]} == {"query", "zipf", "uniform"}
    for c in res["cases"]:
        for k in ("layout", "admission", "cache_fraction", "effective_bandwidth_increase", "hit_rate", "belady_hit_rate"):
            assert k in c, k
        assert 0 <= c["hit_rate"] <= 1 and 0 <= c["belady_hit_rate"] <= 1
        assert c["device_reads_per_s"] > 0 and c["device_max_reads_per_s"] > 0
        if c["layout"] == "original" and c["admission"] == "row":
            assert c["effective_bandwidth_increase"] == pytest.approx(1.0)
    held = {(x["trace"], x["layout"]): x["fanout_heldout"] for x in res["layouts"]}
    assert held[("query", "shp")] < held[("query", "original")], held
    assert held[("query", "shp+kmeans")] < held[("query", "original")], held
    assert {c["layout"] for c in res["cases"] if c["trace"] == "query"} == {"original", "shp", "kmeans", "shp+kmeans", "groups"}
    # The generator's own groups: the reference layout, on the generated query trace alone,
    # with every admission; no trained layout reads fewer blocks per query than it.
    groups = [c for c in res["cases"] if c["layout"] == "groups"]
    assert {c["trace"] for c in groups} == {"query"}
    assert [c["admission"].split(":")[0] for c in groups] == ["row", "row", "block", "threshold", "tinylfu"]
    assert held[("query", "groups")] <= min(v for (t, k), v in held.items() if t == "query"), held
    assert {c["admission"].split(":")[0] for c in res["cases"]} >= {"row", "block", "threshold"}
    assert any(c["admission"].startswith("row:") for c in res["cases"]), "row:T, T as the miniature caches pick it"
    assert all(m["row_t_picked"] in (0, 1, 2, 4, 8, 16) for m in res["miniature_caches"])
    assert res["reference_layouts"]["shp+kmeans"] > 0
    miss = res["miss_path"]
    assert miss["ratio"] > 0 and res["miniature_caches"]
    assert (miss["fio_reads_per_s"] is None) == (miss["ratio_to_fio"] is None), miss
    assert res["miss_path_ratio_to_fio"] == miss["ratio_to_fio"] and res["write_ios_per_dirty_row"] is None
    # Each case of the query trace against the groups layout with the same kind of admission.
    for c in res["cases"]:
        if c["layout"] == "groups":
            assert c["ratio_to_groups"] == pytest.approx(1.0)
        elif c["trace"] == "query" and not c["admission"].startswith("shadow"):
            assert c["ratio_to_groups"] > 0, c
        else:
            assert c["ratio_to_groups"] is None, c
    assert not list(disk_dir.glob("tiermem-bench-ssd-*")), "scratch files left behind"


def test_bench_ssd_holds_each_disk_run_to_its_device_limit_and_counts_write_requests() -> None:
    from tiermem.bench.ssd import _device_limits, _per_row, _summed_io

    io = {"blocks_read": 100, "blocks_written": 30, "write_requests": 4, "rows_written": 64}
    runs = [
        {"placement": "all-fast", "model": "demo", "rows": 10, "seconds_per_iter": 0.05, "blocks_read_per_iter": None},
        {"placement": "block", "model": "demo", "rows": 10, "seconds_per_iter": 0.3, "blocks_read_per_iter": 10_000.0},
        {"placement": "block", "model": "other", "rows": 10, "seconds_per_iter": 0.3, "blocks_read_per_iter": 10.0},
    ]
    # fio's rate when it ran, the disk's own reads otherwise.
    _device_limits(runs, {"fio_reads_per_s": 50_000.0, "device_reads_per_s": 1.0})
    assert runs[1]["device_limit_seconds_per_iter"] == pytest.approx(0.05 + 0.2)
    assert runs[1]["ratio_to_device_limit"] == pytest.approx(0.3 / 0.25)
    assert "device_limit_seconds_per_iter" not in runs[0] and "device_limit_seconds_per_iter" not in runs[2]
    _device_limits(runs, {"fio_reads_per_s": None, "device_reads_per_s": 100_000.0})
    assert runs[1]["device_limit_seconds_per_iter"] == pytest.approx(0.15)
    assert _per_row(io) == pytest.approx(4 / 64) and _per_row(None) is None and _per_row(io | {"rows_written": 0}) is None
    assert _summed_io([{"disk_io": io}, {"disk_io": io}, {}]) == {k: 2 * v for k, v in io.items()}
    assert _summed_io([{}]) is None


def test_bench_ssd_refuses_an_unknown_dlrm_model_before_any_work(disk_dir: Path) -> None:
    from tiermem.bench.ssd import dlrm_config, dlrm_configs

    assert dlrm_config("large:0.02", quick=False).rows == (120_000,) * 64
    assert dlrm_config(None, quick=True).name == "demo"
    # A list runs each model; the full bench's default pairs a lookup-bound and a dense-bound model.
    assert [c.name for c in dlrm_configs("demo:0.1, small:0.01", quick=True)] == ["demo", "small"]
    assert [c.name for c in dlrm_configs(None, quick=True)] == ["demo"]
    full = dlrm_configs(None, quick=False)
    assert [c.name for c in full] == ["demo", "mlperf"] and full[1].rows == dlrm_config("mlperf:0.04", False).rows
    for spec, why in [
        ("nope", "known are"),
        ("large:x", "must be a number"),
        ("demo:0", "positive"),
        ("demo,", "empty entry"),
        ("demo:0.5,demo:0.5", "named twice"),
    ]:
        with pytest.raises(tiermem.InvalidArgumentError, match=why) as e:
            dlrm_configs(spec, quick=True)
        assert "--dlrm-model" in str(e.value)
    # Through the command: refused before any table file is written.
    r = _cli("bench", "ssd", "--quick", "--dlrm-model", "nope", "--dir", str(disk_dir))
    assert r.returncode != 0 and "--dlrm-model 'nope'" in r.stderr and "known are" in r.stderr, r.stderr
    assert not list(disk_dir.glob("tiermem-bench-ssd-*"))


def test_bench_ssd_refuses_a_malformed_trace_by_name(tmp_path: Path, disk_dir: Path) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, offsets=np.array([0, 5], np.int64), rows=np.array([1, 2], np.int64), rows_total=np.int64(10))
    r = _cli("bench", "ssd", "--quick", "--no-dlrm", "--trace", str(bad), "--dir", str(disk_dir))
    assert r.returncode != 0 and "bad.npz" in r.stderr and "last offset is 5" in r.stderr, r.stderr


def test_rows_admitted_cold_leave_first_and_lookups_stay_exact(disk_dir: Path) -> None:
    """``row:T``: a row asked for that the layout's trace held in at most T queries goes in
    without the reference mark, so the next reclaim drops it before the rows used again. On
    calls of rows used once among a hot set used every third call, ``row:0`` keeps more of
    the hot set than ``row`` (which marks every row it caches), and both look up exactly
    what a DRAM table does."""
    n, dim = 20_000, 8
    rng = np.random.default_rng(4)
    hot = rng.choice(n, 250, replace=False)
    counts = np.zeros(n, np.int64)
    counts[hot] = 5
    rest = np.setdiff1d(np.arange(n), hot)
    calls = [np.concatenate([hot if k % 3 == 0 else hot[:0], rng.choice(rest, 60, replace=False)]) for k in range(240)]
    w = rng.standard_normal((n, dim)).astype(np.float32)
    ref = EmbeddingTable(n, dim)
    ref.load(w)
    hits = {}
    for adm in ("row", "row:0"):
        path = disk_dir / f"cold-{adm.replace(':', '_')}.tmb"
        t = EmbeddingTable(n, dim, device=f"block:{path}", cache=0.02, cacheslack=0.0, admission=adm)
        t.load(w)
        t.set_access_counts(counts)
        before = t.block_info or {}
        for idx in calls:
            offs = np.array([0], np.int64)
            np.testing.assert_array_equal(ref.lookup(idx, offs), t.lookup(idx, offs))
        info = t.block_info or {}
        assert info["admission"] == adm
        hits[adm] = 1 - (info["misses"] - before["misses"]) / (info["accesses"] - before["accesses"])
        del t
    # Every hot access but the first 250 hits when the cache (400 rows) keeps the hot set.
    best = (80 * 250 - 250) / (80 * 250 + 240 * 60)
    assert hits["row:0"] > best - 0.01 and hits["row"] < best - 0.1, (hits, best)


@pytest.mark.parametrize(("shuffled", "batch", "slack"), [(False, None, 0), (True, None, 0), (True, 5, 0), (True, 5, 40)])
def test_miniature_caches_simulate_the_table_cache_exactly(disk_dir: Path, shuffled: bool, batch: int | None, slack: int) -> None:
    """The miniature caches' second chance (``row_bytes`` given) is the table cache's own:
    unsampled, with the table's lookup calls (one row each, or ``batch`` queries) and its
    slack (``slack`` rows), it predicts a block table's misses and blocks read exactly, for
    every admission that it simulates; Bandana's LRU list does not."""
    n, dim = 3000, 32
    rpb = 4088 // (dim * 4)
    rng = np.random.default_rng(7)
    rows = (rng.zipf(1.3, 8000) % n).astype(np.int64)
    offsets = np.append(np.arange(0, len(rows), 4), len(rows)).astype(np.int64)
    trace = Trace(offsets, rows, n)
    counts = layout.query_counts(trace)
    lay = rng.permutation(n).astype(np.uint32) if shuffled else np.arange(n, dtype=np.uint32)
    admissions = ["row", "row:1", "row:4", "block", "threshold:1", "tinylfu"]
    real = {}
    for adm in admissions:
        path = disk_dir / f"mini-{adm.replace(':', '_')}-{shuffled}-{batch}-{slack}.tmb"
        t = EmbeddingTable(n, dim, device=f"block:{path}", cache=150 / n, cacheslack=slack / n, admission=adm)
        if shuffled:
            t.relayout(lay)
        t.set_access_counts(counts)
        info = t.cache_info or {}
        cache_rows, slack_rows = int(info["capacity"] // (dim * 4)), int(info["cacheslack"] // (dim * 4))
        if batch is None:
            zero = np.zeros(1, np.int64)
            for r in rows:
                t.lookup(r[None], zero)
        else:
            for q in range(0, trace.queries, batch):
                lo, hi = int(offsets[q]), int(offsets[min(q + batch, trace.queries)])
                t.lookup(rows[lo:hi], offsets[q : min(q + batch, trace.queries)] - lo)
        real[adm] = t.block_info or {}
        del t
    sims = admission.simulate(
        trace, lay, rows_per_block=rpb, cache_rows=cache_rows, row_bytes=dim * 4, admissions=admissions, counts=counts,
        rate=1.0, batch=batch, slack_rows=slack_rows,
    )  # fmt: skip
    for adm, sim in sims.items():
        info = real[adm]
        assert sim["accesses"] == info["accesses"] == len(rows)
        assert (sim["accesses"] - sim["hits"], sim["blocks_read"]) == (info["misses"], info["blocks_read"]), (adm, sim, info)
    best = admission.pick(
        trace,
        lay,
        rows_per_block=rpb,
        cache_rows=cache_rows,
        row_bytes=dim * 4,
        admissions=admissions,
        counts=counts,
        rate=1.0,
        batch=batch,
        slack_rows=slack_rows,
    )
    assert best.results == sims and real[best.admission]["blocks_read"] == min(r["blocks_read"] for r in real.values())
    model = {"counts": counts, "rate": 1.0, "row_bytes": None, "batch": batch, "slack_rows": 0}
    lru = _tiermem.minicache_sweep(lay, rpb, (offsets, rows), [cache_rows], admissions, model)
    assert any(other["blocks_read"] != real[adm]["blocks_read"] for adm, [other] in zip(admissions, lru, strict=True))


def test_admission_simulation_refuses_bad_input_by_name() -> None:
    n = 64
    trace = Trace(np.array([0, 3, 6], np.int64), np.array([1, 2, 3, 1, 5, 9], np.int64), n)
    lay = np.arange(n, dtype=np.uint32)
    kw: dict[str, object] = {"rows_per_block": 8, "cache_rows": 16, "row_bytes": 128}
    counts = layout.query_counts(trace)
    with pytest.raises(InvalidArgumentError, match="not a permutation"):
        admission.simulate(trace, np.zeros(n, np.uint32), **kw)
    with pytest.raises(InvalidArgumentError, match=r"one position per row of the trace's table \(64 rows\), got shape \(63,\)"):
        admission.simulate(trace, lay[:-1], **kw)
    with pytest.raises(InvalidArgumentError, match="sampling rate 0"):
        admission.simulate(trace, lay, rate=0.0, **kw)
    with pytest.raises(InvalidArgumentError, match="slack_rows must be in 0..cache_rows"):
        admission.simulate(trace, lay, slack_rows=17, **kw)
    with pytest.raises(InvalidArgumentError, match="no admissions to simulate"):
        admission.pick(trace, lay, admissions=[], **kw)
    with pytest.raises(InvalidArgumentError, match="admission 'rows': unknown kind"):
        admission.simulate(trace, lay, admissions=["rows"], **kw)
    with pytest.raises(InvalidArgumentError, match="batch must be at least one"):
        admission.simulate(trace, lay, batch=0, **kw)
    with pytest.raises(InvalidArgumentError, match="cache_rows"):
        admission.simulate(trace, lay, rows_per_block=8, cache_rows=0, row_bytes=128)
    with pytest.raises(InvalidArgumentError, match="shadow caches are not simulated"):
        admission.simulate(trace, lay, admissions=["shadow:1.5"], **kw)
    with pytest.raises(InvalidArgumentError, match="query count for each of the table's 64 rows"):
        admission.simulate(trace, lay, admissions=["row:2"], **kw)
    with pytest.raises(InvalidArgumentError, match="query count"):
        admission.simulate(trace, lay, admissions=["threshold:2"], counts=counts[:10], **kw)
    with pytest.raises(InvalidArgumentError, match="non-negative integers"):
        admission.simulate(trace, lay, admissions=["row:2"], counts=-np.ones(n, np.int64), **kw)
    with pytest.raises(InvalidArgumentError, match="trace must be"):
        admission.simulate(rows_per_block=8, cache_rows=16, row_bytes=128, trace=[1, 2], layout=lay)  # type: ignore[arg-type]
    # Without counts, pick chooses among the admissions that need none.
    assert set(admission.pick(trace, lay, **kw).results) == {"row", "block"}


def test_tune_gives_a_block_table_the_admission_that_reads_fewest_blocks(disk_dir: Path) -> None:
    """``admission.tune`` simulates the table as it is (default slack, its layout) and sets
    the pick; replaying the trace in the same calls then reads exactly the blocks it
    predicted. A table that is not a block table is refused by name."""
    n, dim, batch = 4000, 16, 4
    rng = np.random.default_rng(11)
    rows = (rng.zipf(1.2, 9000) % n).astype(np.int64)
    offsets = np.append(np.arange(0, len(rows), 3), len(rows)).astype(np.int64)
    trace = Trace(offsets, rows, n)
    counts = layout.query_counts(trace)
    lay = rng.permutation(n).astype(np.uint32)
    t = EmbeddingTable(n, dim, device=f"block:{disk_dir / 'tune.tmb'}", cache=0.04)
    t.relayout(lay)
    best = admission.tune(t, trace, lay, counts=counts, batch=batch, rate=1.0)
    assert set(best.results) == set(admission.CANDIDATES)
    assert best.results[best.admission]["blocks_read"] == min(r["blocks_read"] for r in best.results.values())
    info = t.block_info or {}
    assert info["admission"] == best.admission
    for q in range(0, trace.queries, batch):
        e = min(q + batch, trace.queries)
        t.lookup(rows[int(offsets[q]) : int(offsets[e])], offsets[q:e] - offsets[q])
    after = t.block_info or {}
    assert after["blocks_read"] - info["blocks_read"] == best.results[best.admission]["blocks_read"]
    with pytest.raises(InvalidArgumentError, match="a block table's: this table is"):
        admission.tune(EmbeddingTable(n, dim), trace, lay)
    with pytest.raises(InvalidArgumentError, match="a table of 4001 rows, this table has 4000"):
        admission.tune(t, Trace(offsets, rows, n + 1), np.arange(n + 1, dtype=np.uint32))


@pytest.mark.parametrize(
    ("width", "dtype"), [(8, "float32"), (256, "float32"), (1022, "float32"), (1024, "float32"), (300, "bfloat16")]
)
def test_block_geometry_is_the_files_own(disk_dir: Path, width: int, dtype: str) -> None:
    # The format's figures, as Python reads them (bench ssd sizes its tables and the DLRM
    # trainer counts disk bytes from them): a file of whole blocks holding the rows as said.
    geo = _tiermem.block_geometry(width, dtype)
    rows = 1000
    t = EmbeddingTable(rows, width, dtype=dtype, device=f"block:{disk_dir / f'g{width}.tmb'}", cache=0.1)
    size = (disk_dir / f"g{width}.tmb").stat().st_size
    assert size == _tiermem.block_file_bytes(rows, width, dtype) and size % geo["block_bytes"] == 0
    assert t.block_info is not None and t.block_info["rows_per_block"] == geo["rows_per_block"]
    data_blocks = -(-rows // geo["rows_per_block"]) * geo["blocks_per_row"]
    assert size >= (data_blocks + 1) * geo["block_bytes"]
    assert (geo["rows_per_block"] == 1) or (geo["blocks_per_row"] == 1)
    with pytest.raises(InvalidArgumentError, match="int4.*known: .*int8_rowwise"):
        _tiermem.block_geometry(width, "int4")


def test_bench_ssd_plot_draws_the_cases_and_each_models_dlrm_runs(tmp_path: Path) -> None:
    from tiermem.bench.ssd import plot_ssd

    case = {"trace": "query", "layout": "shp", "admission": "row", "cache_fraction": 0.05}
    cases = [case | {"effective_bandwidth_increase": x, "hit_rate": 0.7, "belady_hit_rate": 0.8} for x in (1.0, 1.8)]
    dlrm = [
        {"model": m, "placement": p, "vs_all_fast": v}
        for m in ("demo", "mlperf")
        for p, v in (("all-fast", None), ("block", 0.9), ("fbgemm-dram", 1.1))
    ]
    for i, runs in enumerate((dlrm, [])):
        out = tmp_path / f"ssd{i}.png"
        plot_ssd({"cases": cases, "dlrm": runs}, str(out))
        assert out.read_bytes().startswith(b"\x89PNG")
