"""Running DLRM modes side by side and reporting them (``tiermem train dlrm``, ``tiermem demo``)."""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import _tiermem
from .._files import write_json_atomic
from .._sizes import format_bytes
from ..exceptions import InvalidArgumentError
from ..report.progress import Progress
from ..report.table import table


def run_modes(
    config: Any,
    modes: Sequence[str],
    dists: Sequence[str],
    *,
    iters: int,
    warmup: int,
    fast_budget: int,
    slow: str,
    lr: float,
    seed: int,
    alpha: float = 1.0,
    label: str = "train dlrm",
    batches: Callable[[str], Iterator[Any]] | None = None,
    block_splits: Sequence[str] = ("curves",),
) -> dict[str, Any]:
    """Train ``config`` in every mode for every distribution and collect the results.

    The modes of one distribution run in lockstep: every trainer is built (same seed, same
    initial weights), then each iteration's batch is made once and fed to every mode in turn,
    the order rotating, so a noisy stretch of the machine falls on all modes alike.
    ``batches(dist)`` overrides the synthetic data. Mode ``block`` runs once per
    ``block_splits`` entry (its split of the budget, :class:`~tiermem.dlrm.trainer.Trainer`),
    all in the lockstep: the first labelled ``block``, the others ``block/SPLIT``."""
    from .data import SyntheticData
    from .model import PROFILED_MODES
    from .trainer import Trainer

    if not block_splits:
        raise InvalidArgumentError("block_splits: give at least one (e.g. 'curves')")
    # (label, mode, block split) per trainer of a distribution.
    entries = [
        (mode if i == 0 else f"{mode}/{s}", mode, s)
        for mode in modes
        for i, s in enumerate(block_splits if mode == "block" else block_splits[:1])
    ]
    labels = [e[0] for e in entries]
    runs: list[dict[str, Any]] = []
    devices: dict[str, str] = {}
    with Progress(len(dists) * (warmup + iters), label) as p:
        for dist in dists:
            if batches is not None:
                source = batches(dist)
            else:
                d = SyntheticData(
                    config.rows, config.dense_features, config.batch_size, config.bag, dist=dist, alpha=alpha, seed=seed
                )
                source = (d.batch(i) for i in range(warmup + iters))
            first = list(_take(source, max(1, warmup)))
            trainers = {}
            for label, mode, split in entries:
                p.note(f"{dist}: placing the {label} tables")
                trainers[label] = Trainer(
                    config,
                    mode,
                    fast_budget=fast_budget,
                    slow=slow,
                    lr=lr,
                    seed=seed,
                    dist=dist,
                    profile=first if mode in PROFILED_MODES else None,
                    block_split=split,
                )
            # The warm-up batches again, then the rest of the source.
            stream = itertools.chain(first, source)
            take = functools.partial(next, stream, None)
            t0 = time.perf_counter()
            b = take()
            # Every row looked up, in order, up to BOUND_ACCESSES (the bound's trace), when
            # the runs it lies between are there.
            accesses: list[np.ndarray] = []
            kept, timed_from = 0, 0
            limit = BOUND_ACCESSES if {"all-fast", "all-slow"} <= set(modes) else 0
            for k in range(warmup + iters):
                if k == warmup:
                    for t in trainers.values():
                        t.begin_timing()
                if b is None:
                    break
                if k == warmup:
                    timed_from = kept
                if kept < limit:
                    accesses += [_keys(t, ix) for t, ix in enumerate(b.indices)]
                    kept += sum(a.size for a in accesses[-len(b.indices) :])
                # The next batch is made now: the prefetch pipeline reads its rows during this step.
                nxt = take() if k + 1 < warmup + iters else None
                data_s = time.perf_counter() - t0
                order = labels[k % len(labels) :] + labels[: k % len(labels)]
                for label in order:
                    trainers[label].run_iteration(b, timed=k >= warmup, data_seconds=data_s, nxt=nxt)
                p.step(f"{dist} iteration {k + 1}")
                t0 = time.perf_counter()
                b = nxt
            if limit:
                p.note(f"{dist}: the clairvoyant cache's hit rate")
            bound_hits = clairvoyant_hit_rate(accesses, timed_from, fast_budget // config.row_bytes)
            del accesses
            for label in labels:
                t = trainers[label]
                r = t.result()
                run_json = r.to_json()
                run_json["bound_hit_rate"] = bound_hits
                run_json["label"] = label
                run_json["static_fill"] = t.static_fill
                if t.mode == "auto":
                    run_json["cache_plan"] = [p.to_dict() for p in t.cache_plan]
                if t.mode in ("dynamic", "tinylfu"):
                    run_json["bypass"] = t.bypass
                    run_json["lookup_policies"] = [ch.policy for ch in t.lookup_choices]
                if t.mode == "block":
                    run_json["block_split_mode"] = t.block_split_mode
                if t.block_split is not None:
                    run_json["block_split"] = t.block_split.to_dict()
                runs.append(run_json)
                devices.update(r.devices)
            for t in trainers.values():
                t.close()
            del trainers
    _compare(runs)
    # What the emulated devices were scaled from: figures from two runs compare only as these do.
    emulated = any(k == "emulated" for k in devices.values())
    return {
        "dram_figures": _tiermem.dram_figures() if emulated else None,
        "config": config.to_dict(),
        "fast_budget": fast_budget,
        "table_bytes": config.table_bytes,
        "iters": iters,
        "warmup": warmup,
        "runs": runs,
        "devices": devices,
        "timing": "modes in lockstep, order rotating; medians over the timed iterations",
    }


#: Most accesses the clairvoyant bound is computed over (the warm-up's and then the timed
#: iterations' in order; a longer run is bounded over its first timed iterations). Its trace
#: and Belady's next-use array take 16 bytes an access.
BOUND_ACCESSES = 1 << 25


def _keys(table: int, indices: Any) -> np.ndarray:
    """Table ``table``'s row ids as keys distinct across tables (the table in the high bits)."""
    return np.asarray(indices, dtype=np.int64).reshape(-1) + (table << 40)


def clairvoyant_hit_rate(accesses: Sequence[np.ndarray], timed_from: int, capacity_rows: int) -> float | None:
    """The hit rate, over the accesses from ``timed_from`` on, of the optimal cache of
    ``capacity_rows`` rows shared by every table (Belady's MIN, which knows every future
    access, reads through where caching would lose and is warmed by the accesses before
    ``timed_from``); ``None`` without timed accesses."""
    trace = np.concatenate(accesses) if accesses else np.zeros(0, np.int64)
    timed = trace.size - timed_from
    if timed <= 0:
        return None
    return _tiermem.belady_hits(trace, max(0, capacity_rows), timed_from) / timed


def _take(it: Iterator[Any], n: int) -> Iterator[Any]:
    for _, b in zip(range(n), it):
        yield b


def _compare(runs: list[dict[str, Any]]) -> None:
    """Speedups over all-slow and the 2LM model, speed relative to all-fast (the upper
    bound); loss difference from reference; the clairvoyant bound (:func:`bound_seconds`)
    and each run's time over it."""
    for r in runs:
        same = {x["mode"]: x for x in runs if x["dist"] == r["dist"]}
        if (b := bound_seconds(same, r.get("bound_hit_rate"))) is not None:
            r["bound_seconds_per_iter"] = b
            r["ratio_to_bound"] = r["seconds_per_iter"] / b
        for base in ("all-slow", "2lm-model", "all-fast"):
            if base in same:
                r[f"speedup_vs_{base}"] = same[base]["seconds_per_iter"] / r["seconds_per_iter"]
        ref = same.get("reference")
        if ref and ref["losses"] and r["losses"] and len(ref["losses"]) == len(r["losses"]):
            r["max_loss_diff_vs_reference"] = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))


def bound_seconds(runs: dict[str, dict[str, Any]], hit_rate: float | None) -> float | None:
    """The step time of a clairvoyant cache that inserts for free: ``all-fast``'s step plus
    the share of accesses it misses (``1 - hit_rate``) of what reading every row from the
    slow tier adds (``all-slow`` less ``all-fast``); ``None`` without both runs."""
    fast, slow = runs.get("all-fast"), runs.get("all-slow")
    if hit_rate is None or fast is None or slow is None:
        return None
    f, s = fast["seconds_per_iter"], slow["seconds_per_iter"]
    return f + (1.0 - hit_rate) * max(0.0, s - f)


def report(res: dict[str, Any]) -> str:
    """A comparison table per distribution and what was real and emulated."""
    out = []
    c = res["config"]
    out.append(
        f"DLRM '{c['name']}': {len(c['rows'])} tables, {sum(c['rows']):,} rows x {c['dim']} "
        f"({format_bytes(res['table_bytes'])}), batch {c['batch_size']}, {c['bag']} lookups per table per sample"
    )
    out.append(
        f"fast budget {format_bytes(res['fast_budget'])} "
        f"(tables are {res['table_bytes'] / res['fast_budget']:.1f}x larger); "
        f"{res['warmup']} warm-up + {res['iters']} timed iterations, modes in lockstep (medians)"
    )
    for dist in dict.fromkeys(r["dist"] for r in res["runs"]):
        rows = []
        for r in (r for r in res["runs"] if r["dist"] == dist):
            b = r["breakdown"]
            moved = ", ".join(
                f"{k.split(':')[0]} {v['read'] / 1e9:.2f}r/{v['written'] / 1e9:.2f}w"
                for k, v in r["bytes"].items()
                if v["read"] or v["written"]
            )
            rows.append(
                [
                    r.get("label", r["mode"]),
                    f"{1e3 * r['seconds_per_iter']:.1f}",
                    f"{1e3 * b['lookup']:.1f}/{1e3 * b['update']:.1f}/{1e3 * b['dense']:.1f}",
                    _x(r.get("speedup_vs_all-slow")),
                    _x(r.get("speedup_vs_2lm-model")),
                    _x(r.get("speedup_vs_all-fast")),
                    format_bytes(r["fast_bytes_peak"]),
                    "-" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}",
                    moved + ("" if r["bytes_counted"] else " (estimated)"),
                    "-" if r.get("max_loss_diff_vs_reference") is None else f"{r['max_loss_diff_vs_reference']:.1e}",
                ]
            )
        out.append("")
        out.append(f"{dist} inputs")
        out.append(
            table(
                [
                    "mode",
                    "ms/iter",
                    "lookup/update/dense ms",
                    "vs all-slow",
                    "vs 2lm-model",
                    "vs all-fast",
                    "fast used",
                    "hit rate",
                    "GB read/written, timed iterations",
                    "loss diff",
                ],
                rows,
            )
        )
        if line := _bound_line([r for r in res["runs"] if r["dist"] == dist]):
            out.append(line)
        chosen = [f"{r.get('label', r['mode'])}: {w}" for r in res["runs"] if r["dist"] == dist and (w := _choices(r))]
        if chosen:
            out.append("tables' caches as planned from the first batches: " + "; ".join(chosen))
    devs = ", ".join(f"{n} ({k})" for n, k in res["devices"].items())
    out.append("")
    out.append(
        f"devices: {devs}. 'reference' is torch.nn.EmbeddingBag with all rows in DRAM (its bytes are "
        "estimated, torch does not count them); 'all-fast' is tiermem's kernels with all rows in DRAM "
        "(the upper bound); 'fbgemm' is FBGEMM's CPU table-batched embeddings with fused SGD, all rows in "
        "DRAM (bytes not counted); 'block' keeps the tables in files on the real disk; '2lm-model' is tiermem's 2LM model of the hardware DRAM "
        "cache (thesis Table 2.2), not the hardware. ms/iter is the training step; generating the "
        "input is excluded."
    )
    if f := res.get("dram_figures"):
        src = _tiermem.DRAM_SOURCES[f["source"]]
        out.append(
            f"emulated devices scale their profile to DRAM figures {src}: read {f['read_gbps']:.1f} GB/s, "
            f"write {f['write_gbps']:.1f} GB/s, latency {f['latency_ns']:.0f} ns."
        )
    return "\n".join(out)


def _bound_line(runs: list[dict[str, Any]]) -> str:
    """The clairvoyant bound and the best tiered mode beside it."""
    with_bound = [r for r in runs if r.get("bound_seconds_per_iter") is not None]
    if not with_bound:
        return ""
    b, h = with_bound[0]["bound_seconds_per_iter"], with_bound[0]["bound_hit_rate"]
    line = (
        f"clairvoyant bound: {1e3 * b:.1f} ms/iter (a cache of the whole budget that knows every future access, "
        f"hit rate {h:.2f}, inserting for free)"
    )
    from .model import CACHED_MODES

    tiered = [r for r in with_bound if r["mode"] in CACHED_MODES]
    if tiered:
        best = min(tiered, key=lambda r: r["seconds_per_iter"])
        line += f"; best tiered mode {best.get('label', best['mode'])}: {best['ratio_to_bound']:.2f}x the bound"
    return line


def _choices(run: dict[str, Any]) -> str:
    """What a profiled mode chose for its tables, counted: ``dynamic``'s way with misses
    (``admit``, ``dynamic`` or ``read through``), ``auto``'s policies, and ``block``'s
    split of the budget (blocks its miniature caches read, against an even split)."""
    if run.get("block_split"):
        sp = run["block_split"]
        rows = sp["cache_rows"]
        return (
            f"caches of {min(rows):,}-{max(rows):,} rows by the miniature caches' curves, "
            f"{sum(sp['blocks_read']) / max(1.0, sum(sp['even_blocks_read'])):.2f}x the blocks an even split's read"
        )
    if run["mode"] in ("dynamic", "tinylfu") and run.get("lookup_policies"):
        picks = [p or "read through" for p in run["lookup_policies"]]
    elif run["mode"] == "auto" and run.get("cache_plan"):
        picks = [p["policy"] or "no cache" for p in run["cache_plan"]]
    else:
        return ""
    return ", ".join(f"{name} x{picks.count(name)}" for name in dict.fromkeys(picks))


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def write(res: dict[str, Any], out_dir: str | None, json_path: str | None, plot: bool = True) -> list[str]:
    """Write JSON (and plots) into ``out_dir`` and/or ``json_path``; returns paths written."""
    paths = []
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        p = os.path.join(out_dir, "dlrm.json")
        write_json_atomic(p, res)
        paths.append(p)
        if plot:
            from ..report.plot import plot_dlrm

            b, lo = os.path.join(out_dir, "dlrm-breakdown.png"), os.path.join(out_dir, "dlrm-loss.png")
            plot_dlrm(res, b, lo)
            paths += [b, lo]
    if json_path:
        write_json_atomic(json_path, res)
        paths.append(json_path)
    return paths
