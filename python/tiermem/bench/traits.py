"""``tiermem bench traits``: the H2M slides' proof of concept, an application of several
unblocked DGEMMs of different sizes whose buffers are allocated by traits, under a range of
fast-memory limits, with each commit strategy (FIFO, SIZE, PRIORITY and tiermem's GAIN)
against all buffers in ``large_cap`` and unlimited ``hbw``, measured side by side in one run.

Traits are the slides' (from their profile of this DGEMM): ``a`` ``hbw`` priority 1, ``b``
``low_lat`` priority 15, ``c`` ``hbw`` priority 5, declared kernel by kernel (``a``, ``b``,
``c`` of the first DGEMM, then the next). GAIN adds each buffer's measured gain: the seconds
one run of its DGEMM saves with that buffer alone in fast memory (measured once before the
runs by :meth:`Kernel.recommend_traits`, whose traits are reported beside the slides'; its
cost is reported). The fast device is ``dram`` limited
to each fraction of the application's bytes; the slow one is emulated.
"""

from __future__ import annotations

import time
from statistics import median
from typing import Any

import numpy as np

from .._sizes import format_bytes
from ..hpc import kernels
from ..manager import Manager
from ..report.output import measured_cli
from ..report.progress import Progress
from ..report.table import table
from ..traits import COMMIT_STRATEGIES

SLOW = "emulated:optane-pmem"
#: The slides' traits per buffer.
TRAITS: dict[str, dict[str, Any]] = {
    "a": {"preferred": "hbw", "priority": 1},
    "b": {"preferred": "low_lat", "priority": 15},
    "c": {"preferred": "hbw", "priority": 5},
}
SIZES = (256, 384, 512, 640, 768)
QUICK_SIZES = (96, 128, 192, 256)
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)


def _bytes(n: int) -> int:
    return n * n * 8


def profile(sizes: tuple[int, ...], reps: int) -> dict[int, dict[str, dict[str, Any]]]:
    """Each DGEMM's recommended traits per buffer (:meth:`Kernel.recommend_traits`: measured
    gain, sensitivity, space, priority), on a manager that moves only when told."""
    big = 3 * _bytes(max(sizes))
    out = {}
    for n in sizes:
        m = Manager({"dram": big, SLOW: 2 * big}, "lru_in_place")
        k = kernels.dgemm(m, n, where="slow")
        out[n] = k.recommend_traits(reps)
        k.free()
    return out


def run_app(
    sizes: tuple[int, ...],
    fast: int,
    strategy: str,
    reps: int,
    gains: dict[int, dict[str, float]] | None = None,
    space: str | None = None,
) -> dict[str, Any]:
    """Allocate every DGEMM's buffers by traits with ``strategy`` on a fast device of
    ``fast`` bytes (``space``: every buffer preferring that space instead of the slides'
    traits), fill them, and time the application (every DGEMM once) ``reps`` times after a
    warm-up. Returns the median seconds and how many bytes of each buffer kind landed fast."""
    total = sum(3 * _bytes(n) for n in sizes)
    m = Manager({"dram": max(fast, 4096), SLOW: 2 * total + (64 << 20)}, "first_touch")
    decls = []
    for n in sizes:
        for name in "abc":
            traits: dict[str, Any] = dict(TRAITS[name]) if space is None else {"preferred": space}
            if gains is not None:
                traits["gain"] = max(0.0, gains[n][name])
            decls.append(((n, n), np.float64, traits))
    arrays = m.commit(decls, strategy)
    rng = np.random.default_rng(0)
    ks = []
    for i, n in enumerate(sizes):
        a, b, c = arrays[3 * i : 3 * i + 3]
        for arr, fill in ((a, rng.random((n, n))), (b, rng.random((n, n))), (c, np.zeros((n, n)))):
            with arr.write(overwrite=True) as v:
                v[...] = fill
        ks.append(kernels.Kernel(m, "dgemm", {"a": a, "b": b, "c": c}, {"n": n}))
    fast_bytes = {
        name: sum(arrays[3 * i + j].nbytes for i in range(len(sizes)) if arrays[3 * i + j].in_fast)
        for j, name in enumerate("abc")
    }
    for k in ks:  # warm-up
        k.run()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for k in ks:
            k.run()
        ts.append(time.perf_counter() - t0)
    for k in ks:
        k.free()
    return {"seconds": median(ts), "fast_bytes": fast_bytes}


def run(quick: bool, reps: int | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Profile the gains, then run the application for every strategy and fast limit."""
    reps = reps or (3 if quick else 5)
    sizes = QUICK_SIZES if quick else SIZES
    total = sum(3 * _bytes(n) for n in sizes)
    t0 = time.perf_counter()
    recommended = profile(sizes, reps)
    gains = {n: {b: t["gain"] for b, t in per.items()} for n, per in recommended.items()}
    profile_seconds = time.perf_counter() - t0
    strategies = list(COMMIT_STRATEGIES)
    out: dict[str, Any] = {
        "benchmark": "traits",
        "quick": quick,
        "slow_device": f"{SLOW} (emulated)",
        "sizes": list(sizes),
        "app_bytes": total,
        "reps": reps,
        "gains": {str(n): g for n, g in gains.items()},
        "recommended": {str(n): t for n, t in recommended.items()},
        "profile_seconds": profile_seconds,
        "traits": [],
    }
    with Progress(2 + len(FRACTIONS) * len(strategies), "bench traits", progress) as bar:
        for label, fast, space in (("all large_cap", 0, "large_cap"), ("unlimited hbw", total + (16 << 20), "hbw")):
            r = run_app(sizes, fast, "fifo", reps, space=space)
            out[label.replace(" ", "_")] = r["seconds"]
            bar.step(label)
        for frac in FRACTIONS:
            fast = int(total * frac)
            # Interleave strategies within a limit so that the machine's drift hits each alike.
            for s in strategies:
                r = run_app(sizes, fast, s, reps, gains=gains if s == "gain" else None)
                out["traits"].append({"strategy": s, "fast_limit": fast, "fraction": frac, **r})
                bar.step(f"{s} {frac:.0%}")
    return out


def margins(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Per fast limit: each strategy's seconds, whether any differ (by more than 2 %), and
    how much faster than FIFO PRIORITY and GAIN are."""
    rows = []
    for frac in sorted({r["fraction"] for r in res["traits"]}):
        by = {r["strategy"]: r for r in res["traits"] if r["fraction"] == frac}
        secs = [r["seconds"] for r in by.values()]
        fifo = by["fifo"]["seconds"]
        rows.append(
            {
                "fraction": frac,
                "fast_limit": by["fifo"]["fast_limit"],
                "seconds": {s: r["seconds"] for s, r in by.items()},
                "differ": max(secs) > 1.02 * min(secs),
                "priority_vs_fifo": fifo / by["priority"]["seconds"],
                "gain_vs_fifo": fifo / by["gain"]["seconds"],
            }
        )
    return rows


def report(res: dict[str, Any]) -> str:
    rows = margins(res)
    strategies = list(rows[0]["seconds"]) if rows else []
    body = [
        [
            f"{r['fraction']:.0%} ({format_bytes(r['fast_limit'])})",
            *(f"{r['seconds'][s]:.3f}" for s in strategies),
            f"{r['priority_vs_fifo']:.2f}x",
            f"{r['gain_vs_fifo']:.2f}x",
            "yes" if r["differ"] else "no",
        ]
        for r in rows
    ]
    gains = "; ".join(f"n={n}: " + ", ".join(f"{b} {g * 1e3:.0f} ms" for b, g in per.items()) for n, per in res["gains"].items())
    return "\n".join(
        [
            f"DGEMM application ({len(res['sizes'])} unblocked DGEMMs, n = {', '.join(map(str, res['sizes']))}; "
            f"{format_bytes(res['app_bytes'])}), slow tier {res['slow_device']}; seconds per run, median of {res['reps']}",
            table(["fast limit", *strategies, "priority vs fifo", "gain vs fifo", "strategies differ"], body),
            f"baselines: all large_cap {res['all_large_cap']:.3f} s, unlimited hbw {res['unlimited_hbw']:.3f} s",
            f"measured gains (seconds one DGEMM saves with the buffer alone in fast memory; profile took "
            f"{res['profile_seconds']:.1f} s): {gains}",
            "recommended traits (profile; the slides': a hbw prio 1, b low_lat prio 15, c hbw prio 5): "
            + "; ".join(
                f"n={n}: " + ", ".join(f"{b} {t['preferred']} prio {t['priority']}" for b, t in per.items())
                for n, per in res["recommended"].items()
            ),
        ]
    )


def run_cli(args: Any) -> int:
    from ..report.plot import plot_traits

    return measured_cli(args, lambda: run(args.quick, args.reps), report, plot_traits)
