"""``tiermem bench staging``: pattern-aware staging (Arima & Schulz) on the six kernels and a
suite of SpMV access patterns, against slow-only, preferred-fast (``first_touch``), the 2LM
model and always-stage, measured side by side in one run.

Part 1, the kernels (Arima & Schulz Table 6): each kernel's arrays live on the slow device; its
target array is left there (slow-only), copied to fast memory before the kernel and back after
it (always-stage), or copied when the sampled pattern says so (pattern-aware). The same kernel
also runs under ``first_touch`` (arrays in fast memory while it has room, in allocation order)
and under the ``2lm_model`` policy (fast memory as a hardware cache). Fast memory holds 1.25
times the target. Each figure is the median of ``reps`` interleaved runs.

Then the chunked executor (Arima & Schulz §2.2): CG's SpMV over several source vectors, each a
chunk, together several times fast memory; each mode runs the chunks in turn.

Part 2, the decision suite (Arima & Schulz §5.3): SpMV with the structures of Arima & Schulz Table 2
(:mod:`tiermem.hpc.matrices`), rows scaled 1, 1/8 and 1/32, ``x`` on the slow device and the
matrix in fast memory; a decision is correct when its sign agrees with the measured one
(staging faster than not). Our rule and the paper's are scored on the same runs.

The measured ``T_boost`` is the time the emulated slow device held the kernel (its stall
counter), slow-only less staged: both placements run the same compute on the same DRAM, so it
is the difference a quiet clock would show. On this shared two-core machine the wall-clock
difference of a 25 ms SpMV whose gain is within one copy of zero is noise (single pairs range
over +-10 copies), so it is reported beside (``wall_gain``, its quartiles over the rounds, and
the accuracy on the patterns where those quartiles agree in sign).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median
from typing import Any

from .._sizes import available_memory, format_bytes, parse_size
from ..exceptions import InvalidArgumentError
from ..hpc import kernels, matrices, staging
from ..manager import Manager
from ..report.output import measured_cli
from ..report.progress import Progress
from ..report.table import table

SLOW = "emulated:optane-pmem"
VARIANTS = ("slow_only", "first_touch", "2lm_model", "always_stage", "pattern_aware")


@dataclass(frozen=True)
class Case:
    """One kernel of the benchmark: its size parameter for a chunk of so many bytes (the
    target's size, about), its target's bytes at that size, and how to build it on a manager
    (``make(manager, where, size)``)."""

    size: Callable[[int], Any]
    target_bytes: Callable[[Any], int]
    make: Callable[[Manager, Any, Any], kernels.Kernel]


def _side(chunk: int, dims: int) -> int:
    """The side of a ``dims``-dimensional cube of ``float64`` of about ``chunk`` bytes."""
    side = round((chunk / 8) ** (1 / dims))
    while side**dims * 8 > chunk:
        side -= 1
    return side


#: The kernels, in Arima & Schulz Table 6 order, each with a target of about the chunk's bytes
#: (:data:`CHUNK`, or ``--chunk``): large enough that a copy takes long enough to compare the
#: sampling with it as the paper does (its chunks: 2-16 GB).
KERNELS: dict[str, Case] = {
    "RandomAccess": Case(lambda c: c // 8, lambda n: 8 * n, lambda m, w, n: kernels.random_access(m, n, where=w)),
    "PTRANS": Case(lambda c: _side(c, 2), lambda n: 8 * n * n, lambda m, w, n: kernels.ptrans(m, n, where=w)),
    "Jacobi2D": Case(lambda c: (_side(c, 2),) * 2, lambda d: 8 * math.prod(d), lambda m, w, d: kernels.jacobi(m, d, where=w)),
    "Jacobi3D": Case(lambda c: (_side(c, 3),) * 3, lambda d: 8 * math.prod(d), lambda m, w, d: kernels.jacobi(m, d, where=w)),
    "CG": Case(
        lambda c: c // 8,
        lambda n: 8 * n,
        lambda m, w, n: kernels.spmv(m, matrices.generate("uniform", n, row_scale=1 / 8), reps=7, where=w),
    ),
    "FFT": Case(lambda c: c // 16, lambda n: 16 * n, lambda m, w, n: kernels.fft(m, n, where=w)),
}

#: The chunk by default, with ``--quick`` and without.
CHUNK = (8 << 20, 512 << 20)

#: Matrices of the decision suite with ``--quick`` (every Arima & Schulz Table 2 matrix otherwise).
QUICK_MATRICES = (
    "audikw_1",
    "europe_osm",
    "FullChip",
    "G_n_pin_pout",
    "hugebubbles-00020",
    "pkustk14",
    "poisson3Db",
    "road_usa",
    "wiki-Talk",
    "wikipedia-20061104",
)
SCALES = (1.0, 1 / 8, 1 / 32)
#: The chunked CG's chunks and columns (a chunk is a vector of that many ``float64``), with
#: ``--quick`` and without.
CHUNKED = ((4, 1 << 18), (8, 1 << 23))


def _manager(fast: int, big: int, policy: str) -> Manager:
    return Manager({"dram": fast, SLOW: big}, policy)


def _staged(k: kernels.Kernel, reps: int, line: Any) -> dict[str, list[dict[str, Any]]]:
    """Slow-only, always-stage and pattern-aware runs, interleaved in a rotating order, after
    a warm-up run; frees the kernel's arrays."""
    k.run()  # warm-up: pages touched, pools woken
    runs: dict[str, list[dict[str, Any]]] = {}
    modes = ("slow_only", "always_stage", "pattern_aware")
    for rep in range(reps):
        for i in range(len(modes)):  # each rep starts with the next mode: no mode always follows another
            mode = modes[(rep + i) % len(modes)]
            runs.setdefault(mode, []).append(k.staged(mode, line))
    k.free()
    return runs


def _timed(k: kernels.Kernel, reps: int) -> float:
    """Median seconds of ``reps`` runs after a warm-up; frees the kernel's arrays."""
    k.run()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        k.run()
        ts.append(time.perf_counter() - t)
    k.free()
    return median(ts)


def _quartiles(v: list[float]) -> tuple[float, float]:
    q = sorted(v)
    return q[len(q) // 4], q[(3 * len(q)) // 4]


def _gains(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Measured ``T_boost / T_copy - 1`` two ways, and the copy seconds (in and back).

    ``measured_gain`` takes ``T_boost`` from the emulated devices' stall counters (the time
    the slow device held the kernel, slow-only minus staged): both placements run the same
    compute on the same DRAM, so this is the difference a quiet clock would show, without
    the compute's noise. ``wall_gain`` takes it from the kernel's wall-clock seconds, the
    median of the per-round pairs (each round runs every mode once), with the quartiles of
    those pairs; ``wall_resolved`` says whether the quartiles agree in sign."""
    pairs = [(s, a) for s, a in zip(runs["slow_only"], runs["always_stage"], strict=True) if a["staged"]]
    if not pairs:
        nan = float("nan")
        return {
            "measured_gain": nan,
            "wall_gain": nan,
            "wall_gain_quartiles": [nan, nan],
            "wall_resolved": False,
            "copy_seconds": nan,
        }
    copy = median(a["copy_in_seconds"] + a["copy_back_seconds"] for _, a in pairs)
    stall = median(s["stall_seconds"] for s, _ in pairs) - median(a["stall_seconds"] for _, a in pairs)
    wall = [(s["kernel_seconds"] - a["kernel_seconds"]) / copy - 1 for s, a in pairs]
    lo, hi = _quartiles(wall)
    return {
        "measured_gain": stall / copy - 1,
        "wall_gain": median(wall),
        "wall_gain_quartiles": [lo, hi],
        "wall_resolved": (lo > 0) == (hi > 0),
        "copy_seconds": copy,
    }


def _decision_fields(runs: dict[str, list[dict[str, Any]]], gains: dict[str, Any]) -> dict[str, Any]:
    """The pattern-aware run's rates and decisions, scored against the measured gain (and,
    beside it, against the wall-clock one)."""
    pa = runs["pattern_aware"][0]
    d = pa["decision"]
    measured = gains["measured_gain"]
    return {
        "u": pa["u"],
        "r": int(pa["read"]),
        "w": int(pa["write"]),
        "r_paf": pa["rates"]["r_paf"],
        "r_sf": pa["rates"]["r_sf"],
        "r_lf": pa["rates"]["r_lf"],
        "decision": "stage" if d["stage"] else "no",
        "decision_paper": "stage" if d["stage_paper"] else "no",
        "predicted_gain": d["t_boost"] / d["t_copy"] - 1,
        "predicted_gain_paper": d["t_boost_paper"] / d["t_copy"] - 1,
        **gains,
        "correct": d["stage"] == (measured > 0),
        "correct_paper": d["stage_paper"] == (measured > 0),
        "correct_wall": d["stage"] == (gains["wall_gain"] > 0),
    }


def _kernel_row(name: str, case: Case, chunk: int, reps: int, line: Any, big: int) -> dict[str, Any]:
    size = case.size(chunk)
    target = case.target_bytes(size)
    fast = int(target * 1.25) + (4 << 20)
    k = case.make(_manager(fast, big, "lru_in_place"), "slow", size)
    built = next(o["len"] * o["elem_bytes"] for o in k.operands if o["name"] == k.target[0])
    if built != target:
        raise ValueError(f"bench staging: {name}'s target is {built} bytes, its case says {target}")
    runs = _staged(k, reps, line)
    del k
    gains = _gains(runs)
    seconds = {mode: median(r["seconds"] for r in rs) for mode, rs in runs.items()}
    for policy in ("first_touch", "2lm_model"):
        gc.collect()  # the last manager's devices go back before this one's fast memory is taken
        seconds[policy] = _timed(case.make(_manager(fast, big, policy), "auto", size), reps)
    best = min(seconds["slow_only"], seconds["always_stage"])
    return {
        "kernel": name,
        "target": runs["pattern_aware"][0]["target"],
        "target_bytes": target,
        "fast_bytes": fast,
        **_decision_fields(runs, gains),
        "seconds": {v: seconds[v] for v in VARIANTS},
        "pattern_aware_over_best": seconds["pattern_aware"] / best,
        **_analysis_cost(runs, target, gains["copy_seconds"]),
    }


#: The analysis's budget: this share of the chunk's copy time (Arima & Schulz §5.4).
ANALYSIS_BUDGET = 0.001


def _analysis_cost(runs: dict[str, list[dict[str, Any]]], chunk_bytes: int, copy: float) -> dict[str, Any]:
    """The pattern-aware runs' median analysis seconds, and the smallest chunk whose copy
    (at the rate of ``copy`` seconds for ``chunk_bytes``) it stays within
    :data:`ANALYSIS_BUDGET` of: the analysis costs the same whatever the chunk's size, the
    copy grows with it."""
    analysis = median(r["analysis_seconds"] for r in runs["pattern_aware"])
    return {
        "analysis_seconds": analysis,
        "analysis_budget_bytes": analysis / ANALYSIS_BUDGET * chunk_bytes / copy if copy > 0 else float("nan"),
    }


def _suite_row(name: str, scale: float, ncols: int, reps: int, line: Any, big: int) -> dict[str, Any]:
    rowptr, cols, n = matrices.generate(name, ncols, row_scale=scale, max_per_row=32)
    where: dict[str, str | int] = {"rowptr": "fast", "cols": "fast", "vals": "fast", "y": "fast", "x": "slow"}
    fast = int((len(rowptr) * 16 + len(cols) * 12 + n * 8) * 1.1) + (8 << 20)
    runs = _staged(kernels.spmv(_manager(fast, big, "lru_in_place"), (rowptr, cols, n), where=where), reps, line)
    return {
        "matrix": name,
        "structure": matrices.TABLE2[name][0],
        "row_scale": scale,
        **_decision_fields(runs, _gains(runs)),
        "seconds": {mode: median(r["seconds"] for r in rs) for mode, rs in runs.items()},
    }


def _chunked_row(quick: bool, reps: int, line: Any, big: int) -> dict[str, Any]:
    """CG's SpMV over several source vectors, each a chunk (the paper's CG and suite): the
    chunks together are several times fast memory, which holds the matrix, the results and
    one chunk; each mode runs every chunk in turn (:func:`tiermem.hpc.kernels.run_chunks`)."""
    chunks, ncols = CHUNKED[0 if quick else 1]
    rowptr, cols, n = matrices.generate("uniform", ncols, row_scale=1 / 8)
    rows = len(rowptr) - 1
    fast = int((len(rowptr) * 8 + len(cols) * 12 + chunks * rows * 8) * 1.05) + int(ncols * 8 * 1.25) + (1 << 20)
    where: dict[str, str | int] = {"rowptr": "fast", "cols": "fast", "vals": "fast", "x": "slow", "y": "fast"}
    tasks = kernels.spmv_chunks(_manager(fast, big, "lru_in_place"), (rowptr, cols, n), chunks, reps=7, where=where)
    runs: dict[str, list[dict[str, Any]]] = {}
    modes = ("slow_only", "always_stage", "pattern_aware")
    kernels.run_chunks(tasks, "slow_only")  # warm-up
    for rep in range(reps):
        for i in range(len(modes)):
            mode = modes[(rep + i) % len(modes)]
            runs.setdefault(mode, []).append(kernels.run_chunks(tasks, mode, line))
    for t in tasks:
        t.free()
    seconds = {mode: median(r["seconds"] for r in rs) for mode, rs in runs.items()}
    return {
        "kernel": "CG (chunked)",
        "chunks": chunks,
        "chunk_bytes": ncols * 8,
        "fast_bytes": fast,
        "data_over_fast": chunks * ncols * 8 / fast,
        "staged": runs["pattern_aware"][0]["staged"],
        "seconds": seconds,
        "pattern_aware_over_best": seconds["pattern_aware"] / min(seconds["slow_only"], seconds["always_stage"]),
        "analysis_seconds": median(r["analysis_seconds"] for r in runs["pattern_aware"]),
        "copy_seconds": median(r["copy_seconds"] for r in runs["always_stage"]),
    }


def _slow_bytes(quick: bool, chunk: int) -> int:
    """The slow device's capacity: a kernel's arrays (at most four chunks) with room to spare,
    the larger of 8 GiB (2 GiB with ``--quick``) and eight chunks."""
    return max((2 if quick else 8) << 30, 8 * chunk)


def _footprint(chunk: int, slow: int) -> int:
    """Memory the bench may touch at once: two managers' devices (a row's manager and the
    next, freed in turn but not before the next allocates), each a slow device whose heap
    touches new pages as arrays come and go, and fast memory of 1.25 chunks. Measured:
    15.8 GB peak at a 1 GiB chunk (8 GiB slow devices; this bound: 18.5 GiB)."""
    return 2 * (slow + int(1.25 * chunk))


def _check_chunk(chunk: int, slow: int) -> None:
    """Refuse a chunk the kernels cannot take (RandomAccess, CG and FFT need a power of two)
    or this machine cannot hold, before anything is allocated."""
    if chunk < 1 << 20 or chunk & (chunk - 1):
        raise InvalidArgumentError(
            f"bench staging: the chunk must be a power of two of at least 1 MiB (RandomAccess, CG and FFT "
            f"size their arrays by it), got {chunk} bytes"
        )
    need, avail = _footprint(chunk, slow), available_memory()
    if avail and need > avail:
        raise InvalidArgumentError(
            f"bench staging: a chunk of {format_bytes(chunk)} needs about {format_bytes(need)} of memory "
            f"(two managers with {format_bytes(slow)} slow devices), this machine has {format_bytes(avail)} "
            "available; use a smaller --chunk"
        )


def run(quick: bool, reps: int | None = None, progress: bool | None = None, chunk: int | None = None) -> dict[str, Any]:
    """Calibrate, then measure the kernels (targets of ``chunk`` bytes; by default
    :data:`CHUNK`) and the decision suite."""
    reps = reps or (3 if quick else 5)
    chunk = chunk or CHUNK[not quick]
    big = _slow_bytes(quick, chunk)
    _check_chunk(chunk, big)
    names = QUICK_MATRICES if quick else tuple(matrices.TABLE2)
    ncols = 1 << (18 if quick else 20)
    t = time.perf_counter()
    probe = 1 << (22 if quick else 24)
    line = staging.calibrate(_manager(probe * 8 + (16 << 20), probe * 8 + (16 << 20), "lru_in_place"), probe, reps=3)
    calib_seconds = time.perf_counter() - t
    out: dict[str, Any] = {
        "benchmark": "staging",
        "quick": quick,
        "slow_device": f"{SLOW} (emulated)",
        "reps": reps,
        "chunk_bytes": chunk,
        "line": line.as_dict(),
        "calibration_seconds": calib_seconds,
        "staging": [],
        "suite": [],
    }
    with Progress(len(KERNELS) + 1 + len(names) * len(SCALES), "bench staging", progress) as bar:
        for name, case in KERNELS.items():
            out["staging"].append(_kernel_row(name, case, chunk, reps, line, big))
            gc.collect()  # the row's managers give their devices' memory back before the next row's take theirs
            bar.step(name)
        out["chunked"] = _chunked_row(quick, reps, line, big)
        bar.step("CG (chunked)")
        for name in names:
            for scale in SCALES:
                out["suite"].append(_suite_row(name, scale, ncols, reps, line, big))
                bar.step(f"{name} x{scale:g}")
    suite = out["suite"]
    out["suite_accuracy"] = sum(r["correct"] for r in suite) / len(suite)
    out["suite_accuracy_paper"] = sum(r["correct_paper"] for r in suite) / len(suite)
    out["suite_accuracy_wall"] = sum(r["correct_wall"] for r in suite) / len(suite)
    resolved = [r for r in suite if r["wall_resolved"]]
    out["suite_wall_resolved"] = len(resolved)
    out["suite_accuracy_wall_resolved"] = sum(r["correct_wall"] for r in resolved) / len(resolved) if resolved else float("nan")
    return out


def report(res: dict[str, Any]) -> str:
    """Tables of the kernels (Table 6's columns and the five variants) and the suite."""
    rows = []
    for r in res["staging"]:
        sec = r["seconds"]
        rows.append(
            [
                r["kernel"],
                f"{r['target']} {format_bytes(r['target_bytes'])}",
                f"{r['r_paf']:.3f}",
                f"{r['r_sf']:.3f}",
                f"{r['r_lf']:.3f}",
                f"{r['u']:g}",
                r["r"],
                r["w"],
                f"{r['predicted_gain']:.2f} / {r['predicted_gain_paper']:.2f}",
                f"{r['measured_gain']:.2f}",
                f"{r['wall_gain']:.2f}",
                r["decision"] + (" ok" if r["correct"] else " WRONG"),
                *(f"{sec[v] / sec['slow_only']:.2f}" for v in VARIANTS[1:]),
                f"{r['pattern_aware_over_best']:.3f}",
                f"{r['analysis_seconds'] / r['copy_seconds'] * 100:.3f}%",
                format_bytes(int(r["analysis_budget_bytes"])) if math.isfinite(r["analysis_budget_bytes"]) else "-",
            ]
        )
    head = [
        "kernel",
        "target",
        "R_paf",
        "R_sf",
        "R_lf",
        "U",
        "R",
        "W",
        "pred. gain ours/paper",
        "meas. gain",
        "wall gain",
        "decision",
    ]
    head += [f"{v} / slow" for v in VARIANTS[1:]] + ["pattern / best", "analysis / copy", f"{ANALYSIS_BUDGET:.1%} from"]
    lines = [
        f"pattern-aware staging, slow tier {res['slow_device']}; gains are T_boost/T_copy - 1, measured from the "
        f"device's stall counters (wall: from wall-clock pairs); each time the median of {res['reps']} interleaved runs; "
        f"'{ANALYSIS_BUDGET:.1%} from': the smallest chunk whose copy the analysis stays within {ANALYSIS_BUDGET:.1%} of",
        table(head, rows),
        "",
    ]
    c = res.get("chunked")
    if c:
        sec = c["seconds"]
        lines += [
            f"chunked: {c['kernel']}, {c['chunks']} chunks of {format_bytes(c['chunk_bytes'])} "
            f"({c['data_over_fast']:.1f}x fast memory): slow-only {sec['slow_only']:.3f} s, always-stage "
            f"{sec['always_stage']:.3f} s ({sec['slow_only'] / sec['always_stage']:.2f}x), pattern-aware "
            f"{sec['pattern_aware']:.3f} s ({sec['slow_only'] / sec['pattern_aware']:.2f}x, {c['staged']}/{c['chunks']} "
            f"chunks staged; {c['pattern_aware_over_best']:.3f} of the better), analysis "
            f"{c['analysis_seconds'] / c['copy_seconds'] * 100:.3f}% of the copies",
            "",
        ]
    suite = res["suite"]
    wrong = [r for r in suite if not r["correct"]]
    lines.append(
        f"decision suite: {len(suite)} SpMV patterns ({len({r['matrix'] for r in suite})} Table 2 structures x rows "
        f"{', '.join(f'{s:g}' for s in SCALES)}): correct {res['suite_accuracy'] * 100:.0f}% with the line filter, "
        f"{res['suite_accuracy_paper'] * 100:.0f}% with the paper's rule (paper: 79%); against wall-clock gains "
        f"{res['suite_accuracy_wall'] * 100:.0f}%, and {res['suite_accuracy_wall_resolved'] * 100:.0f}% of the "
        f"{res['suite_wall_resolved']} whose wall-clock quartiles agree in sign"
    )
    if wrong:
        body = [
            [
                r["matrix"],
                f"{r['row_scale']:g}",
                f"{r['u']:.2f}",
                f"{r['r_paf']:.2f}",
                f"{r['r_sf']:.2f}",
                f"{r['r_lf']:.2f}",
                f"{r['predicted_gain']:.2f}",
                f"{r['measured_gain']:.2f}",
                f"{r['wall_gain']:.2f}",
                r["decision"],
            ]
            for r in wrong
        ]
        head = ["wrong: matrix", "rows", "U", "R_paf", "R_sf", "R_lf", "predicted", "measured", "wall", "decision"]
        lines.append(table(head, body))
    return "\n".join(lines)


def run_cli(args: Any) -> int:
    from ..report.plot import plot_staging

    chunk = parse_size(args.chunk, "--chunk") if args.chunk else None
    return measured_cli(args, lambda: run(args.quick, args.reps, chunk=chunk), report, plot_staging)
