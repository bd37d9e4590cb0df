"""``tiermem bench ssd``: embedding tables on the real disk (block tables, Bandana's store).

Everything here runs on the machine's disk (a scratch directory on it), never on emulated
memory. For each trace (the query-structured one, Zipf and uniform queries, or a trace
file), layouts (original order, SHP and, where rows carry meaning, K-means and SHP started
from it) are trained on the first part of the queries and everything is measured on the
rest. On the generated query trace, ``groups`` (the generator's own co-access groups, which
no trained layout is told: :func:`tiermem.embedding.block.traces.groups_layout`) runs beside them as the
reference for what a layout could gain there:

* **layouts**: the held-out fan-out of each (and of ``shp+kmeans``, SHP started from the
  K-means layout, where rows carry meaning), and of KaHyPar's partition of the same
  hypergraph on a smaller reference table when ``kahypar`` is installed;
* **miniature caches**: at 1 % block sampling, the prefetch threshold ``t`` (and ``row:T``'s
  ``T``) each cache size should use, against the best of exact simulations, and the 1 %
  SHARDS estimate of the hit-rate curve (rows sampled by access count, and by hash as
  SHARDS does) against the exact (stack-distance) curve. The miniature caches simulate the table cache's
  own second chance over pages, in the replay's calls (which, unsampled, predicts a block
  table's misses and blocks read exactly);
* **cases**: a block table replays the held-out queries (one bag per query, batches of
  queries per call) for each layout, admission (``row``, the baseline; ``row:T``, no
  prefetch but rows the training trace held at most ``T`` times admitted cold; ``block``;
  ``threshold:t``; ``shadow``; ``T`` and ``t`` as the miniature caches pick them) and cache
  size (1-20 % of the table): effective bandwidth increase over the baseline (original
  order, ``row``, same cache: with the same lookups served, useful bytes are equal, so it
  is the baseline's blocks read over the case's), hit rate beside Belady's at the same
  capacity, device reads per second against the calibrated random-read rate, lookups per
  second;
* **miss path**: a table's reads when every lookup misses, against the disk's random 4 KiB
  reads at the same depth and ``fio``'s (when installed), measured round by round
  alternately; the JSON's ``ratio`` is over our reads, ``ratio_to_fio`` over fio's;
* **dlrm**: DLRM steps per second with tables on the disk (``block``: the budget split over
  the tables' caches by their miniature caches; ``block-even``: the same fraction of each,
  side by side) against ``all-fast`` and FBGEMM in DRAM (same model, same batches), for each
  model of ``--dlrm-model NAME[:SCALE],...`` in turn: by default the demo preset (lookup-bound:
  the disk sets its pace) and the MLPerf model at 4 % of its rows (dense-bound: the prefetch
  pipeline hides the reads), with ``--quick`` the demo preset at a quarter of its rows;
  ``--no-dlrm`` leaves it out.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import _tiermem
from .._sizes import format_bytes
from ..embedding import EmbeddingTable
from ..embedding.block import admission, layout, traces
from ..embedding.block.admission import SPLITS
from ..embedding.block.traces import QueryTraceConfig, Trace
from ..exceptions import InvalidArgumentError
from ..report.load import MachineLoad
from ..report.output import show, write_outputs
from ..report.progress import Progress
from ..report.scratch import scratch_dir
from ..report.table import print_table

__all__ = ["run", "run_cli", "QUERY_TRACE"]

#: The query-structured trace's shape, modelled on Bandana's table 2 (the table its
#: admission study uses): about 90 lookups per query (§3, Table 1: 92.8), drawn from a few
#: co-accessed groups; the generator's defaults otherwise.
QUERY_TRACE = {"groups_per_query": 4.0, "rows_per_group": 22.0}
DIM = 32
THRESHOLDS = admission.THRESHOLDS
SAMPLE_RATE = 0.01


def _zipf_trace(rows: int, queries: int, per_query: int, alpha: float, seed: int) -> Trace:
    """Queries of ``per_query`` lookups, each row drawn Zipf(``alpha``) over a shuffled table."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, rows + 1, dtype=np.float64) ** alpha
    cdf = np.cumsum(w) / w.sum()
    perm = rng.permutation(rows)
    picks = perm[np.minimum(np.searchsorted(cdf, rng.random(queries * per_query)), rows - 1)]
    return Trace(np.arange(queries + 1, dtype=np.int64) * per_query, picks.astype(np.int64), rows)


def _uniform_trace(rows: int, queries: int, per_query: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace(
        np.arange(queries + 1, dtype=np.int64) * per_query,
        rng.integers(0, rows, queries * per_query, dtype=np.int64),
        rows,
    )


#: The layout of a generated query trace's own groups (:func:`tiermem.embedding.block.traces.groups_layout`),
#: run beside the trained layouts as the reference for what a layout could gain there.
GROUPS = "groups"


def _traces(rows: int, queries: int, trace_file: str | None) -> list[tuple[str, Trace, np.ndarray | None, np.ndarray | None]]:
    """(name, trace, row values for semantic layouts or None, the trace's groups layout or None)."""
    if trace_file:
        t = Trace.load(trace_file)
        if t.queries < 2:
            raise InvalidArgumentError(
                f"trace file {trace_file!r}: {t.queries} queries; bench ssd needs at least 2 (layouts train on "
                "the first part of the trace and are measured on the rest)"
            )
        return [(Path(trace_file).stem, t, None, None)]
    cfg = QueryTraceConfig(rows=rows, queries=queries, **QUERY_TRACE)  # type: ignore[arg-type]
    q = traces.query_trace(cfg)
    per = max(1, round(len(q.rows) / q.queries))
    return [
        (
            "query",
            q,
            traces.group_embeddings(cfg, DIM),
            traces.groups_layout(cfg, _tiermem.block_geometry(DIM)["rows_per_block"]),
        ),
        ("zipf", _zipf_trace(rows, queries, per, 1.05, 1), None, None),
        ("uniform", _uniform_trace(rows, queries, per, 2), None, None),
    ]


def _worst(exact: list[float], estimate: list[float]) -> float:
    """The largest difference between two hit-rate curves at the same sizes."""
    return max(abs(a - b) for a, b in zip(exact, estimate, strict=True))


def _device_max(path: Path, size: int, depth: int) -> tuple[float, str]:
    """The disk's random 4 KiB reads per second at ``depth``: ``tiermem calibrate``'s
    figure when it measured at this depth, else measured now on ``path``."""
    try:
        with open(_tiermem.calibration_path(), encoding="utf-8") as f:
            q = json.load(f).get("block_depth") or {}
        if depth in q.get("depths", []):
            return float(q["reads_per_s"][q["depths"].index(depth)]), "tiermem calibrate"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rate, _ = _tiermem.random_reads_per_s(path, size, depth, max(4096, 256 * depth), 3)
    return rate, "measured now"


def _fio(path: Path, depth: int, seconds: int) -> float | None:
    """``fio``'s random 4 KiB read IOPS on ``path`` at ``depth`` (io_uring, direct), or None
    when fio is not installed."""
    if shutil.which("fio") is None:
        return None
    cmd = [
        "fio", "--name=ssd", f"--filename={path}", "--rw=randread", "--bs=4k", "--direct=1",
        "--ioengine=io_uring", f"--iodepth={depth}", f"--runtime={seconds}", "--time_based",
        "--readonly", "--output-format=json",
    ]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
        return float(json.loads(out)["jobs"][0]["read"]["iops"])
    except (subprocess.SubprocessError, ValueError, KeyError, IndexError, OSError):
        return None


def _replay(t: EmbeddingTable, trace: Trace, batch: int) -> dict[str, float]:
    """Look up every query of ``trace`` (one bag each), ``batch`` queries per call; the
    block table's counters and the time it took."""
    before = t.block_info or {}
    start = time.perf_counter()
    for q in range(0, trace.queries, batch):
        e = min(trace.queries, q + batch)
        lo, hi = int(trace.offsets[q]), int(trace.offsets[e])
        t.lookup(trace.rows[lo:hi], trace.offsets[q:e] - lo)
    secs = time.perf_counter() - start
    after = t.block_info or {}
    return {k: float(after[k] - before.get(k, 0)) for k in ("accesses", "misses", "blocks_read", "prefetched")} | {
        "seconds": secs
    }


def _batch_for(cache_rows: int, trace: Trace) -> int:
    """Queries per call: their distinct rows must fit half the cache (a block table stages
    every row of a call)."""
    sample = [len(np.unique(trace.query(q))) for q in range(min(200, trace.queries))]
    per = max(1.0, float(np.percentile(sample, 99)))
    return int(max(1, min(256, cache_rows // (2 * per))))


def _pick_t(
    kind: str, lay: np.ndarray, rpb: int, trace: Trace, counts: np.ndarray, cap: int, rate: float, batch: int
) -> tuple[int, list[float]]:
    """The ``T`` of admission ``kind`` (``threshold`` or ``row``) whose simulated cache
    (the table cache itself, ``batch`` queries per call) reads the fewest blocks of
    ``trace``, and each one's blocks."""
    res = admission.simulate(
        trace, lay, rows_per_block=rpb, cache_rows=cap, row_bytes=DIM * 4,
        admissions=[f"{kind}:{t}" for t in THRESHOLDS], counts=counts, rate=rate, batch=batch,
    )  # fmt: skip
    blocks = [r["blocks_read"] for r in res.values()]
    return THRESHOLDS[int(np.argmin(blocks))], blocks


#: The full bench's DLRM models: the demo preset, whose 100-row bags of 1 KiB rows make every
#: step lookup-bound (the disk's random reads set its pace), and the MLPerf model at 4 % of its
#: rows (3.6 GiB of tables), one lookup per table and a wide top MLP, whose dense part hides
#: the reads as in production training.
FULL_DLRM_MODELS = "demo,mlperf:0.04"


def dlrm_config(spec: str | None, quick: bool) -> Any:
    """The DLRM that one ``--dlrm-model`` entry names: ``NAME`` or ``NAME:SCALE``, a preset
    (:data:`tiermem.dlrm.model.PRESETS`) with its rows multiplied by ``SCALE``; by default the
    demo preset, a quarter of its rows with ``quick``."""
    from ..dlrm.model import DLRMConfig

    if spec is None:
        return DLRMConfig.preset("demo", scale=0.25 if quick else 1.0)
    name, _, scale = spec.partition(":")
    try:
        factor = float(scale) if scale else 1.0
    except ValueError:
        raise InvalidArgumentError(f"--dlrm-model {spec!r}: the scale after ':' must be a number, got {scale!r}") from None
    try:
        return DLRMConfig.preset(name, scale=factor)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"--dlrm-model {spec!r}: {e}") from None


def dlrm_configs(specs: str | None, quick: bool) -> list[Any]:
    """The DLRMs ``--dlrm-model`` names, comma-separated (each as :func:`dlrm_config`); by
    default :data:`FULL_DLRM_MODELS`, or the demo preset at a quarter of its rows with
    ``quick``."""
    if specs is None:
        return [dlrm_config(None, True)] if quick else dlrm_configs(FULL_DLRM_MODELS, False)
    parts = specs.split(",")
    if any(not p.strip() for p in parts):
        raise InvalidArgumentError(f"--dlrm-model {specs!r}: an empty entry; give NAME[:SCALE] entries separated by commas")
    configs = [dlrm_config(p.strip(), quick) for p in parts]
    if len({(c.name, c.rows) for c in configs}) < len(configs):
        raise InvalidArgumentError(f"--dlrm-model {specs!r}: a model named twice (the same preset at the same scale)")
    return configs


def _dlrm(d: Path, quick: bool, config: Any) -> list[dict[str, Any]]:
    """DLRM ``config`` (:func:`dlrm_config`) trained on Zipf inputs in lockstep: tables on the
    disk (``block``, a fast budget of a quarter of the tables split by the caches' curves, and
    ``block-even``, split evenly) against ``all-fast`` and FBGEMM in DRAM, same model, same
    batches."""
    from ..dlrm.peers import fbgemm_modules
    from ..dlrm.report import run_modes

    budget = config.table_bytes // 4
    modes = ["all-fast", "block"] + (["fbgemm"] if fbgemm_modules()[0] is not None else [])
    warmup, iters = (3, 6) if quick else (5, 20)
    res = run_modes(
        config, modes, ["zipf"], iters=iters, warmup=warmup, fast_budget=budget, slow=f"block:{d}",
        lr=0.01, seed=0, label="bench ssd: dlrm", block_splits=SPLITS,
    )  # fmt: skip
    out = []
    blk = _tiermem.block_geometry(config.dim, config.dtype)["block_bytes"]
    for r in res["runs"]:
        disk = r["bytes"].get("disk")
        placement = {"fbgemm": "fbgemm-dram", "block/even": "block-even"}.get(r["label"], r["label"])
        out.append(
            {
                "placement": placement,
                "model": config.name,
                "rows": sum(config.rows),
                "dist": r["dist"],
                "seconds_per_iter": r["seconds_per_iter"],
                "breakdown": r["breakdown"],
                "table_bytes": config.table_bytes,
                "dram_cache_bytes": budget if r["mode"] == "block" else config.table_bytes,
                # The disk's 4 KiB blocks per timed step (block placements only).
                "blocks_read_per_iter": disk["read"] / blk / r["iters"] if disk else None,
                "blocks_written_per_iter": disk["written"] / blk / r["iters"] if disk else None,
                "fast_bytes_peak": r["fast_bytes_peak"],
                "bytes": r["bytes"],
                "hit_rate": r["hit_rate"],
                "vs_all_fast": r.get("speedup_vs_all-fast"),
                "disk_io": r.get("disk_io"),
                # Write requests (log chunks, compaction runs) per row written back.
                "write_ios_per_dirty_row": _per_row(r.get("disk_io")),
            }  # fmt: skip
        )
    return out


def _per_row(io: dict[str, int] | None) -> float | None:
    """Write requests per row written back, or None without rows written."""
    if not io or not io["rows_written"]:
        return None
    return io["write_requests"] / io["rows_written"]


def _admission_kind(adm: str) -> str:
    """An admission with its tuned threshold left out (``row:16`` and ``row:4`` are the same
    kind, tuned per layout), so cases of two layouts compare kind to kind."""
    kind, sep, _ = adm.partition(":")
    return f"{kind}:T" if sep and kind in ("row", "threshold") else adm


def _compare_cases(cases: list[dict[str, Any]], miss: dict[str, Any]) -> None:
    """Each case's effective bandwidth over the original layout's with row admission, and
    over the groups layout's with the same kind of admission (``ratio_to_groups``: how much
    of the possible gain a trained layout reaches)."""
    base = {(c["trace"], c["cache_fraction"]): c for c in cases if c["layout"] == "original" and c["admission"] == "row"}
    for c in cases:
        b = base[(c["trace"], c["cache_fraction"])]
        c["effective_bandwidth_increase"] = b["blocks_read"] / max(1.0, c["blocks_read"])
        c["device_max_reads_per_s"] = miss["device_reads_per_s"]
    groups = {(c["trace"], c["cache_fraction"], _admission_kind(c["admission"])): c for c in cases if c["layout"] == GROUPS}
    for c in cases:
        g = groups.get((c["trace"], c["cache_fraction"], _admission_kind(c["admission"])))
        c["ratio_to_groups"] = None if g is None else c["effective_bandwidth_increase"] / g["effective_bandwidth_increase"]


def _device_limits(runs: list[dict[str, Any]], miss: dict[str, Any]) -> None:
    """Each disk placement's device limit: its model's ``all-fast`` step plus its blocks
    read at ``fio``'s random-read rate (the disk's own, without fio), the time the step
    would take if every miss cost only the device's read; and its step over that."""
    rate = miss.get("fio_reads_per_s") or miss["device_reads_per_s"]
    for r in runs:
        fast = next(
            (x for x in runs if x["placement"] == "all-fast" and (x["model"], x["rows"]) == (r["model"], r["rows"])), None
        )
        if r["blocks_read_per_iter"] is None or fast is None:
            continue
        r["device_limit_seconds_per_iter"] = fast["seconds_per_iter"] + r["blocks_read_per_iter"] / rate
        r["ratio_to_device_limit"] = r["seconds_per_iter"] / r["device_limit_seconds_per_iter"]


def run(
    quick: bool,
    directory: str | None = None,
    trace_file: str | None = None,
    train_fraction: float = 0.5,
    fractions: list[float] | None = None,
    progress: bool | None = None,
    dlrm: bool = True,
    rows: int | None = None,
    queries: int | None = None,
    dlrm_model: str | None = None,
) -> dict[str, Any]:
    """Measure and return the JSON-able results (``rows``/``queries``: the generated
    traces' size instead of the default; ``dlrm_model``: see :func:`dlrm_configs`)."""
    models = dlrm_configs(dlrm_model, quick) if dlrm else []
    if not 0 < train_fraction < 1:
        raise InvalidArgumentError(f"--train-fraction must be in (0, 1), got {train_fraction!r}")
    rows = rows or 1 << (17 if quick else 20)
    queries = queries or (30_000 if quick else 200_000)
    fracs = fractions or ([0.05] if quick else [0.01, 0.05, 0.2])
    if any(not 0 < f <= 1 for f in fracs):
        raise InvalidArgumentError(f"cache fractions must be in (0, 1], got {fracs}")
    d = scratch_dir(directory) / f"tiermem-bench-ssd-{os.getpid()}"
    all_traces = _traces(rows, queries, trace_file)
    rpb = _tiermem.block_geometry(DIM)["rows_per_block"]
    biggest = max(t.rows_total for _, t, _, _ in all_traces)
    need = 3 * _tiermem.block_file_bytes(biggest, DIM) + (320 << 20)  # table, relayout copy, miss-path file
    # The DLRMs run one after another, each model's files removed before the next.
    # Training tables log their written rows after their data until compacted: up to twice the file.
    need += max((2 * sum(_tiermem.block_file_bytes(r, m.dim, m.dtype) for r in m.rows) for m in models), default=0)
    d.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(d).free
    if free < need:
        shutil.rmtree(d, ignore_errors=True)
        raise InvalidArgumentError(
            f"{d.parent} has {format_bytes(free)} free; bench ssd needs {format_bytes(need)} for tables of "
            f"{biggest} rows: free some space, pass --dir on a larger disk, or --quick"
        )
    depth = _tiermem.block_depth()
    layouts_out: list[dict[str, Any]] = []
    minis: list[dict[str, Any]] = []
    cases: list[dict[str, Any]] = []
    try:
        # Admissions per layout: four each, and shadow on SHP.
        n_cases = sum(len(fracs) * (9 + 8 * (v is not None) + 4 * (g is not None)) for _, _, v, g in all_traces)
        with MachineLoad() as load, Progress(n_cases + 4 + len(models), "bench ssd", progress) as bar:
            for name, trace, values, groups in all_traces:
                train, test = trace.split(train_fraction)
                counts = layout.query_counts(train)
                kinds = ["original", "shp"] + (["kmeans", "shp+kmeans"] if values is not None else [])
                lays = layout.make_many(kinds, trace=train, rows_per_block=rpb, weights=values)
                if groups is not None:
                    lays[GROUPS] = groups
                for k, lay in lays.items():
                    layouts_out.append(
                        {
                            "trace": name,
                            "layout": k,
                            "fanout_train": layout.fanout(lay, rpb, train),
                            "fanout_heldout": layout.fanout(lay, rpb, test),
                        }  # fmt: skip
                    )
                bar.step(f"{name}: layouts")
                n = trace.rows_total
                path = d / f"{name}.tmb"
                table = EmbeddingTable(n, DIM, device=f"block:{path}", cache=0.01, depth=depth)
                init = values if values is not None else np.random.default_rng(0).standard_normal((n, DIM), np.float32)
                table.load(init)
                table.sync()
                del table
                for k, lay in lays.items():
                    _relayout(path, n, lay)
                    for frac in fracs:
                        cap = max(1, int(n * frac))
                        # The miniature caches run online beside the cache, on the live
                        # (held-out) queries at 1 %, as Bandana's do, with the counts of the
                        # layout's training trace: simulating the training queries instead
                        # would favour low thresholds (every counted row comes back there).
                        # Exact simulations of the same queries judge their pick.
                        batch = _batch_for(cap, test)
                        t_mini, _ = _pick_t("threshold", lay, rpb, test, counts, cap, SAMPLE_RATE, batch)
                        t_row, _ = _pick_t("row", lay, rpb, test, counts, cap, SAMPLE_RATE, batch)
                        if k == "shp":
                            t_best, exact = _pick_t("threshold", lay, rpb, test, counts, cap, 1.0, batch)
                            t_row_best, exact_row = _pick_t("row", lay, rpb, test, counts, cap, 1.0, batch)
                            sizes = [max(1, int(n * f)) for f in (0.01, 0.02, 0.05, 0.1, 0.2)]
                            exact_curve = _tiermem.lru_curve(test.rows, sizes)
                            sampled = _tiermem.shards_curve(test.rows, SAMPLE_RATE, sizes, sampling="count")
                            hashed = _tiermem.shards_curve(test.rows, SAMPLE_RATE, sizes, n)
                            minis.append(
                                {
                                    "trace": name,
                                    "cache_fraction": frac,
                                    "sample_rate": SAMPLE_RATE,
                                    "t_picked": t_mini,
                                    "t_best": t_best,
                                    "gain_picked_over_best": exact[THRESHOLDS.index(t_best)] / exact[THRESHOLDS.index(t_mini)],
                                    "row_t_picked": t_row,
                                    "row_t_best": t_row_best,
                                    "row_gain_picked_over_best": exact_row[THRESHOLDS.index(t_row_best)]
                                    / exact_row[THRESHOLDS.index(t_row)],
                                    "curve_sizes": sizes,
                                    "curve_exact": exact_curve,
                                    "curve_sampled": sampled,
                                    "curve_sampled_hash": hashed,
                                    "curve_max_error": _worst(exact_curve, sampled),
                                    "curve_max_error_hash": _worst(exact_curve, hashed),
                                }  # fmt: skip
                            )
                        belady = _tiermem.belady_hits(test.rows, cap) / max(1, len(test.rows))
                        admits = ["row", f"row:{t_row}", "block", f"threshold:{t_mini}", "tinylfu"] + (
                            ["shadow:1.5"] if k == "shp" else []
                        )
                        for adm in admits:
                            cases.append(
                                _case(path, n, frac, adm, counts, train, test, depth, batch)
                                | {"trace": name, "layout": k, "belady_hit_rate": belady}
                            )
                            bar.step(f"{name} {k} {adm} {frac:.0%}")
            miss = _miss_path(d, depth, 3 if quick else 5)
            bar.step("miss path")
            ref = _reference_layouts(min(rows, 1 << (13 if quick else 15)))
            bar.step("reference partitioner")
            dlrm_runs = []
            for m in models:
                dlrm_runs += _dlrm(d, quick, m)
                bar.step(f"dlrm {m.name}")
        _compare_cases(cases, miss)
        _device_limits(dlrm_runs, miss)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {
        "benchmark": "ssd",
        "device": "block (the real disk)",
        "dir": str(d.parent),
        "rows_per_block": rpb,
        "dim": DIM,
        "depth": depth,
        "train_fraction": train_fraction,
        "query_trace": QUERY_TRACE,
        "load": load.summary(),
        "load_line": load.line(),
        "layouts": layouts_out,
        "reference_layouts": ref,
        "miniature_caches": minis,
        "miss_path": miss,
        "miss_path_ratio_to_fio": miss["ratio_to_fio"],
        "write_ios_per_dirty_row": _per_row(_summed_io([r for r in dlrm_runs if r["placement"] == "block"])),
        "cases": cases,
        "dlrm": dlrm_runs,
    }


def _summed_io(runs: list[dict[str, Any]]) -> dict[str, int] | None:
    """The disk I/O counters of ``runs``, summed (None without any)."""
    ios = [r["disk_io"] for r in runs if r.get("disk_io")]
    return {k: sum(io[k] for io in ios) for k in ios[0]} if ios else None


def _relayout(path: Path, n: int, lay: np.ndarray) -> None:
    t = EmbeddingTable(n, DIM, device=f"block:{path}", cache=0.01)
    t.relayout(lay, 256 << 20)
    del t


def _case(
    path: Path, n: int, frac: float, admission: str, counts: np.ndarray, train: Trace, test: Trace, depth: int, batch: int
) -> dict[str, Any]:
    """One block table replaying the held-out queries, ``batch`` per call, after warming on
    the end of the training queries."""
    t = EmbeddingTable(n, DIM, device=f"block:{path}", cache=frac, cacheslack=0.0, admission=admission, depth=depth)
    t.set_access_counts(counts)
    cache_rows = int(t.cache_info["capacity"] // (DIM * 4)) if t.cache_info else 1
    _, warm = train.split(0.8)
    _replay(t, warm, batch)
    r = _replay(t, test, batch)
    del t
    return {
        "admission": admission,
        "cache_fraction": frac,
        "cache_rows": cache_rows,
        "batch_queries": batch,
        "accesses": r["accesses"],
        "blocks_read": r["blocks_read"],
        "prefetched": r["prefetched"],
        "hit_rate": 1.0 - r["misses"] / max(1.0, r["accesses"]),
        "device_reads_per_s": r["blocks_read"] / r["seconds"],
        "lookups_per_s": r["accesses"] / r["seconds"],
        "seconds": r["seconds"],
    }


def _miss_path(d: Path, depth: int, rounds: int) -> dict[str, Any]:
    """Every lookup a miss: batches of rows in distinct blocks of a 256 MiB table, against
    the disk's random reads at the same depth on the same file (ours, and ``fio``'s when
    installed), alternating round by round: the shared disk's rate moves between rounds."""
    geo = _tiermem.block_geometry(DIM)
    per, block = geo["rows_per_block"], geo["block_bytes"]
    n = (256 << 20) // block * per
    path = d / "miss.tmb"
    t = EmbeddingTable(n, DIM, device=f"block:{path}", cache=4096 * 2 / n, cacheslack=0.0, depth=depth)
    rng = np.random.default_rng(5)
    table_rates, device_rates, fio_rates = [], [], []
    blocks = n // per
    for _ in range(rounds):
        before = (t.block_info or {})["blocks_read"]
        start = time.perf_counter()
        for _ in range(8):
            rows = rng.choice(blocks, 4096, replace=False) * per
            t.lookup(rows, np.arange(4096))
        secs = time.perf_counter() - start
        table_rates.append(((t.block_info or {})["blocks_read"] - before) / secs)
        rate, engine = _tiermem.random_reads_per_s(path, n // per * block, depth, 32768, 1)
        device_rates.append(rate)
        fio = _fio(path, depth, 1)
        if fio is not None:
            fio_rates.append(fio)
    calibrated, source = _device_max(path, n // per * block, depth)
    del t
    tr, dr = statistics.median(table_rates), statistics.median(device_rates)
    fr = statistics.median(fio_rates) if fio_rates else None
    return {
        "depth": depth,
        "engine": engine,
        "table_blocks_per_s": tr,
        "device_reads_per_s": dr,
        "ratio": tr / dr,
        "calibrated_reads_per_s": calibrated,
        "calibrated_source": source,
        "fio_reads_per_s": fr,
        "ratio_to_fio": None if fr is None else tr / fr,
        "statistic": f"median of {rounds} alternating rounds",
    }


def _reference_layouts(rows: int) -> dict[str, Any]:
    """SHP against KaHyPar on one smaller query trace (KaHyPar is slow at full size)."""
    cfg = QueryTraceConfig(rows=rows, queries=rows // 2, **QUERY_TRACE)  # type: ignore[arg-type]
    train, test = traces.query_trace(cfg).split(0.5)
    rpb = _tiermem.block_geometry(DIM)["rows_per_block"]
    out: dict[str, Any] = {"rows": rows, "queries": cfg.queries}
    lays = layout.make_many(layout.KINDS, trace=train, rows_per_block=rpb, weights=traces.group_embeddings(cfg, DIM))
    for k, lay in lays.items():
        out[k] = layout.fanout(lay, rpb, test)
    start = time.perf_counter()
    kh = layout.kahypar_layout(train, rpb)
    out["kahypar"] = None if kh is None else layout.fanout(kh, rpb, test)
    out["kahypar_seconds"] = None if kh is None else time.perf_counter() - start
    return out


def run_cli(args: Any) -> int:
    fr = None
    if args.cache:
        try:
            fr = [float(x) / 100 for x in args.cache.split(",")]
        except ValueError:
            raise InvalidArgumentError(f"--cache takes percentages such as 1,5,20, got {args.cache!r}") from None
    res = run(
        args.quick,
        args.dir,
        args.trace,
        args.train_fraction,
        fr,
        dlrm=not args.no_dlrm,
        rows=args.rows,
        queries=args.queries,
        dlrm_model=args.dlrm_model,
    )
    print_table(
        ["trace", "layout", "fan-out (held out)"],
        [[x["trace"], x["layout"], f"{x['fanout_heldout']:.2f}"] for x in res["layouts"]],
        title=f"layouts of {res['rows_per_block']} rows per 4 KiB block (trained on {res['train_fraction']:.0%})",
    )
    ref = res["reference_layouts"]
    kh = "not installed" if ref["kahypar"] is None else f"{ref['kahypar']:.2f} ({ref['kahypar_seconds']:.0f} s)"
    show(
        f"reference ({ref['rows']} rows): original {ref['original']:.2f}, SHP {ref['shp']:.2f}, "
        f"K-means {ref['kmeans']:.2f}, SHP+K-means {ref['shp+kmeans']:.2f}, KaHyPar {kh}"
    )
    print_table(
        [
            "trace",
            "layout",
            "admission",
            "cache",
            "eff. bandwidth",
            "vs groups",
            "hit rate",
            "Belady",
            "dev reads/s",
            "lookups/s",
        ],
        [
            [
                c["trace"],
                c["layout"],
                c["admission"],
                f"{c['cache_fraction']:.0%}",
                f"{c['effective_bandwidth_increase']:.2f}x",
                "-" if c.get("ratio_to_groups") is None else f"{c['ratio_to_groups']:.2f}",
                f"{c['hit_rate']:.3f}",
                f"{c['belady_hit_rate']:.3f}",
                f"{c['device_reads_per_s']:,.0f}",
                f"{c['lookups_per_s']:,.0f}",
            ]  # fmt: skip
            for c in res["cases"]
        ],
        title="block tables on the real disk: held-out queries (effective bandwidth over original + row)",
    )
    if any(c["layout"] == GROUPS for c in res["cases"]):
        show(
            f"'{GROUPS}' lays out the generated trace's own co-access groups, which no trained layout is told: "
            "the reference for how much of a layout's possible gain the trained ones reach."
        )
    print_table(
        [
            "trace",
            "cache",
            "t (1% sample)",
            "t (exact)",
            "gain of picked / best",
            "row:T (1%, exact)",
            "curve max error (count, hash)",
        ],
        [
            [
                m["trace"],
                f"{m['cache_fraction']:.0%}",
                m["t_picked"],
                m["t_best"],
                f"{m['gain_picked_over_best']:.3f}",
                f"{m['row_t_picked']}, {m['row_t_best']}",
                f"{m['curve_max_error']:.4f}, {m['curve_max_error_hash']:.4f}",
            ]  # fmt: skip
            for m in res["miniature_caches"]
        ],
        title="miniature caches (SHP layout)",
    )
    m = res["miss_path"]
    fio = (
        "not installed" if m["fio_reads_per_s"] is None else f"{m['fio_reads_per_s']:,.0f} (table {m['ratio_to_fio']:.2f} of it)"
    )
    show(
        f"miss path at depth {m['depth']} ({m['engine']}): table {m['table_blocks_per_s']:,.0f} blocks/s, disk "
        f"{m['device_reads_per_s']:,.0f} reads/s, ratio {m['ratio']:.2f}; calibrated {m['calibrated_reads_per_s']:,.0f} "
        f"({m['calibrated_source']}); fio {fio}"
    )
    for model in dict.fromkeys((r["model"], r["rows"]) for r in res["dlrm"]):  # a preset at two scales: two tables
        _print_dlrm([r for r in res["dlrm"] if (r["model"], r["rows"]) == model])
    show(res["load_line"])
    write_outputs({k: v for k, v in res.items() if k != "load_line"}, args, plot_ssd)
    return 0


def _print_dlrm(runs: list[dict[str, Any]]) -> None:
    """One DLRM model's placements side by side, and the block splits against each other."""
    print_table(
        [
            "placement",
            "ms/iter",
            "lookup/update/dense ms",
            "vs all-fast",
            "device limit ms",
            "vs limit",
            "table",
            "DRAM for it",
            "disk GB r/w",
            "write I/Os per row",
        ],
        [
            [
                r["placement"],
                f"{1e3 * r['seconds_per_iter']:.1f}",
                "/".join(f"{1e3 * r['breakdown'][k]:.1f}" for k in ("lookup", "update", "dense")),
                "-" if r["vs_all_fast"] is None else f"{r['vs_all_fast']:.2f}x",
                "-" if r.get("device_limit_seconds_per_iter") is None else f"{1e3 * r['device_limit_seconds_per_iter']:.1f}",
                "-" if r.get("ratio_to_device_limit") is None else f"{r['ratio_to_device_limit']:.2f}x",
                format_bytes(r["table_bytes"]),
                format_bytes(r["dram_cache_bytes"]),
                "-"
                if "disk" not in r["bytes"]
                else f"{r['bytes']['disk']['read'] / 1e9:.2f}/{r['bytes']['disk']['written'] / 1e9:.2f}",
                "-" if r.get("write_ios_per_dirty_row") is None else f"{r['write_ios_per_dirty_row']:.4f}",
            ]  # fmt: skip
            for r in runs
        ],
        title=f"DLRM ({runs[0]['model']} preset, {runs[0]['rows']:,} rows) on Zipf inputs: tables on the "
        "disk (budget split by the caches' curves; block-even: evenly) against all-fast and FBGEMM in DRAM; "
        "device limit: all-fast's step plus the blocks read at fio's random-read rate",
    )
    split = {r["placement"]: r for r in runs}
    if "block" in split and "block-even" in split:
        a, b = split["block"], split["block-even"]
        show(
            f"block's split by curves over the even split: {a['seconds_per_iter'] / b['seconds_per_iter']:.2f}x the "
            f"step time, {a['blocks_read_per_iter'] / max(1.0, b['blocks_read_per_iter']):.2f}x the blocks read, "
            f"{a['blocks_written_per_iter'] / max(1.0, b['blocks_written_per_iter']):.2f}x the blocks written"
        )


def plot_ssd(res: dict[str, Any], path: str) -> None:
    """Effective bandwidth increase and hit rate (beside Belady's) per case; with DLRM runs,
    each placement's training speed over ``all-fast``, per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = res["cases"]
    labels = [f"{c['trace']}\n{c['layout']}\n{c['admission']}\n{c['cache_fraction']:.0%}" for c in cases]
    dlrm = [r for r in res["dlrm"] if r["vs_all_fast"] is not None]
    rows = 3 if dlrm else 2
    fig, axes = plt.subplots(rows, 1, figsize=(max(8, 0.6 * len(cases)), 4 * rows))
    a, b = axes[0], axes[1]
    x = np.arange(len(cases))
    a.bar(x, [c["effective_bandwidth_increase"] for c in cases])
    a.axhline(1.0, color="grey", lw=0.8)
    a.set_ylabel("effective bandwidth\n(x original + row)")
    a.set_xticks(x, [])
    b.bar(x - 0.2, [c["hit_rate"] for c in cases], 0.4, label="cache")
    b.bar(x + 0.2, [c["belady_hit_rate"] for c in cases], 0.4, label="Belady (optimal)")
    b.set_ylabel("hit rate")
    b.legend()
    b.set_xticks(x, labels, fontsize=6)
    if dlrm:
        d = axes[2]
        xd = np.arange(len(dlrm))
        d.bar(xd, [r["vs_all_fast"] for r in dlrm], color=["C2" if r["placement"].startswith("block") else "C7" for r in dlrm])
        d.axhline(1.0, color="grey", lw=0.8)
        d.set_ylabel("DLRM steps/s\n(x all-fast)")
        d.set_xticks(xd, [f"{r['model']}\n{r['placement']}" for r in dlrm], fontsize=7)
    fig.suptitle("block tables on the real disk (tiermem bench ssd)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
