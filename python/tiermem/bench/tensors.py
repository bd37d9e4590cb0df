"""``tiermem bench train``: training iterations of a model with tiered tensors, every
variant side by side in one run (thesis §4.6-4.7, Table 4.7, Fig. 4.8 and 4.10).

For each model: plain PyTorch (the losses every run is checked against), ``all-fast`` (no
budget; its peak fast use is the footprint *F*), ``all-slow``, then at each slow:fast ratio
*a:b* a fast budget of *F·b/(a+b)* (thesis §3.6) for ``first-touch``, ``2lm-model``, ``L``,
``LM``, ``LMP`` and ``async``. Each run builds the model from the same seed, trains
``warmup`` iterations, then times ``iters`` more and counts bytes read and written per
device per iteration. Every run is repeated ``rounds`` times, all variants in turn, and keeps
its best iteration (``stat="best"``; timings on a shared 2-core machine swing by 15%) or the
median of all its timed iterations (``stat="median"``, what the demo reports).
"""

from __future__ import annotations

import gc
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._sizes import format_bytes
from ..exceptions import InvalidArgumentError, TiermemError
from ..plan.torch import Executor
from ..report.load import MachineLoad
from ..report.output import show, write_json
from ..torch.tensors import VARIANTS, Observer, TrainStep
from ..torch.tensors.train import budget_for, measure, measure_all_fast, parse_ratio, slow_capacity
from .models import WORKLOADS, Workload, build

__all__ = [
    "train_step",
    "run",
    "run_cli",
    "parse_ratio",
    "all_fast",
    "budget_for",
    "slow_capacity",
    "RATIOS",
    "TIERED",
    "QUICK_BATCH",
]

RATIOS = ("1:1", "4:1", "8:1")
#: How much slower than plain PyTorch a tiered step may be when the model fits in fast memory.
FITS_TARGET = 0.05
#: Variants run at every ratio (``all-fast`` and ``all-slow`` do not depend on it).
TIERED = ("first-touch", "2lm-model", "L", "LM", "LMP", "async")
QUICK_BATCH = {"resnet": 8, "densenet": 8, "vgg": 8, "gpt": 2, "hf:gpt2": 2, "tv:resnet50": 8}
LR, MOMENTUM = 0.01, 0.9


def train_step(w: Workload, seed: int) -> TrainStep:
    """``w`` as a :class:`~tiermem.torch.tensors.TrainStep`: SGD with momentum, iteration
    *i* on ``w``'s inputs for ``seed + i`` (the same sequence every variant and plain
    PyTorch see)."""

    def loss(model: torch.nn.Module, i: int) -> torch.Tensor:
        x, y = w.inputs(seed + i)
        return w.loss(model(x), y)

    return TrainStep(w.make, lambda ps: torch.optim.SGD(ps, lr=LR, momentum=MOMENTUM), loss, seed=seed, name=w.name)


def _reference(w: Workload, iters: int, seed: int) -> dict[str, Any]:
    """Plain PyTorch: losses and seconds per iteration."""
    gc.collect()
    s = train_step(w, seed).start()
    runs = [s.step() for _ in range(iters)]
    return {"losses": [loss for loss, _ in runs], "times": [t for _, t in runs]}


def _run_variant(
    w: Workload,
    variant: str,
    fast: int,
    slow: int,
    slow_spec: str,
    warmup: int,
    iters: int,
    seed: int,
    observers: Sequence[Observer] = (),
) -> dict[str, Any]:
    """Train ``w`` under one variant for ``warmup`` and then ``iters`` timed iterations
    (:func:`~tiermem.torch.tensors.train.measure`)."""
    return measure(train_step(w, seed), variant, {"dram": fast, slow_spec: slow}, warmup, iters, observers)


def all_fast(
    w: Workload,
    room: int,
    slow_spec: str,
    warmup: int,
    iters: int,
    seed: int,
    make_observers: Callable[[], Sequence[Observer]] = tuple,
) -> tuple[int, dict[str, Any]]:
    """The ``all-fast`` run of ``w`` (:func:`~tiermem.torch.tensors.train.measure_all_fast`)."""
    return measure_all_fast(train_step(w, seed), room, slow_spec, warmup, iters, make_observers)


def run(
    models: list[str],
    ratios: list[str],
    *,
    quick: bool = False,
    iters: int | None = None,
    warmup: int = 1,
    seed: int = 0,
    slow_spec: str = "emulated:optane-pmem",
    variants: list[str] | None = None,
    batch: int | None = None,
    rounds: int | None = None,
    progress: Any = None,
    stat: str = "best",
    plans: dict[tuple[str, str], tuple[Any, Any]] | None = None,
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-able results (see the module docs). ``plans``:
    ``(model, ratio) -> (graph, plan)`` adds the ``planned`` variant there, at the ratio's
    budget like the others, in the same rounds."""
    if stat not in ("best", "median"):
        raise InvalidArgumentError(f"stat {stat!r}: 'best' or 'median'")
    pick = min if stat == "best" else statistics.median
    iters = iters or (1 if quick else 2)
    rounds = rounds or (1 if quick else 2)
    if iters < 1 or rounds < 1 or warmup < 0:
        raise InvalidArgumentError(f"iters and rounds must be at least 1, warmup at least 0 (got {iters}, {rounds}, {warmup})")
    chosen = variants or list(VARIANTS)
    for v in chosen:
        if v not in VARIANTS:
            raise InvalidArgumentError(f"variant {v!r}: known are {', '.join(VARIANTS)}")
    for name in models:
        if name not in WORKLOADS:
            raise InvalidArgumentError(f"model {name!r}: known are {', '.join(WORKLOADS)}")
    parsed = [(r, parse_ratio(r)) for r in ratios]
    out: dict[str, Any] = {
        "slow_device": slow_spec,
        "emulated": slow_spec.startswith("emulated"),
        "quick": quick,
        "iters": iters,
        "rounds": rounds,
        "warmup": warmup,
        "stat": stat,
        "threads": torch.get_num_threads(),
        "runs": [],
        "models": {},
    }
    for name in models:
        w = build(name, QUICK_BATCH[name] if quick and batch is None else batch)
        ref = _reference(w, warmup + iters, seed)
        if progress:
            progress.step(f"{name} pytorch")
        n_params = sum(p.numel() * p.element_size() for p in w.make().parameters())
        room, big = all_fast(w, max((1 if quick else 4) << 30, 8 * n_params), slow_spec, warmup, iters, seed)
        footprint = big["fast_bytes_peak"]
        big["seconds_per_iter"] = pick(big["timed"])
        slow_cap = slow_capacity(footprint)
        info = {
            "batch": w.batch,
            "footprint_bytes": footprint,
            "param_bytes": n_params,
            "pytorch_seconds_per_iter": min(ref["times"][warmup:]),
            "pytorch_losses": ref["losses"],
        }
        out["models"][name] = info
        if progress:
            progress.step(f"{name} all-fast")
        plan: list[tuple[str, str | None, int, int]] = [("all-fast", None, room, 64 << 20)]
        if "all-slow" in chosen:
            plan.append(("all-slow", None, 1 << 20, slow_cap))
        for ratio_name, ratio in parsed:
            budget = budget_for(footprint, ratio)
            plan += [(v, ratio_name, budget, slow_cap) for v in TIERED if v in chosen]
            if plans and (name, ratio_name) in plans:
                plan.append(("planned", ratio_name, budget, slow_cap))
        measured: dict[tuple[str, str | None], dict[str, Any]] = {("all-fast", None): big}
        # Rounds run every variant in turn, so a slow spell of the machine hits all of them;
        # each keeps its best iteration over all rounds.
        for rnd in range(rounds):
            if rnd:
                # Plain PyTorch in every round too: the "fits" row compares it with all-fast
                # (the tiered step when the model fits in fast memory) best against best.
                again = _reference(w, warmup + iters, seed)
                info["pytorch_seconds_per_iter"] = min(info["pytorch_seconds_per_iter"], min(again["times"][warmup:]))
            for v, rname, fast, slow in plan:
                if rnd == 0 and v == "all-fast":
                    continue
                obs: list[Observer] = []
                if v == "planned" and plans and rname is not None:
                    obs = [Executor(*plans[(name, rname)])]
                try:
                    r = _run_variant(w, v, fast, slow, slow_spec, warmup, iters, seed, obs)
                except TiermemError as e:  # reported in its row; the other runs go on
                    r = {"error": f"{type(e).__name__}: {e}"}
                old = measured.get((v, rname))
                if "error" in r or (old is not None and "error" in old):
                    measured[(v, rname)] = r if "error" in r else old  # type: ignore[assignment]
                    continue
                if old is not None:
                    r["times"] = old["times"] + r["times"]
                    r["timed"] = old["timed"] + r["timed"]
                    r["fast_bytes_peak"] = max(old["fast_bytes_peak"], r["fast_bytes_peak"])
                r["seconds_per_iter"] = pick(r["timed"])
                measured[(v, rname)] = r
                if progress:
                    progress.step(f"{name} {v} {rname or ''} round {rnd + 1}")
        base = measured[("all-fast", None)]["seconds_per_iter"]  # over all rounds
        # No cost when the model fits: the tiered step with every tensor in fast memory
        # against plain PyTorch's (the target: within FITS_TARGET).
        info["fits_vs_pytorch"] = base / info["pytorch_seconds_per_iter"]
        for rname, _ratio in parsed:
            for (v, rr), r in measured.items():
                if rr not in (None, rname):
                    continue
                if "error" in r:
                    out["runs"].append(
                        {"model": name, "ratio": rname, "policy": v, "error": r["error"], "measured_once": rr is None}
                    )
                    continue
                diff = max(abs(p - q) for p, q in zip(r["losses"], ref["losses"]))
                out["runs"].append(
                    {
                        "model": name,
                        "ratio": rname,
                        "policy": v,
                        "seconds_per_iter": r["seconds_per_iter"],
                        "times": r["times"],
                        "vs_all_fast": r["seconds_per_iter"] / base,
                        "budget_bytes": None if v in ("all-fast", "all-slow") else r["budget_bytes"],
                        "fast_bytes_peak": r["fast_bytes_peak"],
                        "bytes": r["bytes"],
                        "max_loss_diff": diff,
                        "measured_once": rr is None,
                        "tiering": r["tiering"],
                    }
                )
    return out


def report(res: dict[str, Any]) -> str:
    """The results as tables, one per model and ratio, with the figures the issue asks."""
    from ..report.table import table

    slow = res["slow_device"]
    lines = [
        f"slow device: {res['slow_device']}"
        + (" (emulated)" if res["emulated"] else "")
        + f"; {'median' if res.get('stat') == 'median' else 'best'} of {res['rounds']} rounds x {res['iters']} "
        f"iterations (each after {res['warmup']} warm-up); {res['threads']} threads"
    ]
    for name, info in res["models"].items():
        lines.append(
            f"\n{name}: batch {info['batch']}, footprint {format_bytes(info['footprint_bytes'])}, "
            f"parameters {format_bytes(info['param_bytes'])}, plain PyTorch "
            f"{info['pytorch_seconds_per_iter']:.2f} s/iter"
        )
        if "fits_vs_pytorch" in info:
            over = info["fits_vs_pytorch"] - 1
            lines.append(
                f"fits in fast memory (all-fast, the tiered step when nothing moves): {over:+.1%} against plain PyTorch "
                f"({'within' if over <= FITS_TARGET else 'NOT within'} the {FITS_TARGET:.0%} target)"
            )
        ratios = sorted({r["ratio"] for r in res["runs"] if r["model"] == name}, key=lambda s: -parse_ratio(s)[0])
        for ratio in ratios:
            runs = [r for r in res["runs"] if r["model"] == name and r["ratio"] == ratio]
            rows = []
            for r in runs:
                if "error" in r:
                    rows.append([r["policy"], "failed", r["error"][:60], "", "", "", "", ""])
                    continue
                rows.append(
                    [
                        r["policy"],
                        f"{r['seconds_per_iter']:.3f}",
                        f"{r['vs_all_fast']:.2f}x",
                        "-" if r["budget_bytes"] is None else format_bytes(r["budget_bytes"]),
                        format_bytes(r["fast_bytes_peak"]),
                        format_bytes(r["bytes"][slow]["read"]),
                        format_bytes(r["bytes"][slow]["written"]),
                        f"{r['max_loss_diff']:.1e}",
                    ]
                )
            lines.append(f"ratio {ratio} (slow:fast)")
            lines.append(
                table(
                    ["policy", "s/iter", "vs all-fast", "budget", "fast peak", "slow read/it", "slow written/it", "loss diff"],
                    rows,
                )
            )
            lines.extend(_verdict(runs, slow))
    return "\n".join(lines)


def _verdict(runs: list[dict[str, Any]], slow: str) -> list[str]:
    by = {r["policy"]: r for r in runs if "error" not in r}
    tiered = [by[v] for v in ("L", "LM", "LMP", "async") if v in by]
    if not tiered or "all-fast" not in by:
        return []
    best_r = min(tiered, key=lambda r: r["seconds_per_iter"])
    out = [f"  best tiermem variant: {best_r['policy']} at {best_r['vs_all_fast']:.2f}x all-fast"]
    if "2lm-model" in by:
        m = by["2lm-model"]
        w_ratio = best_r["bytes"][slow]["written"] / max(1, m["bytes"][slow]["written"])
        out.append(
            f"  vs 2lm-model: {m['seconds_per_iter'] / best_r['seconds_per_iter']:.2f}x faster, slow bytes written {w_ratio:.2f}x"
        )
    over = [r["policy"] for r in tiered if r["budget_bytes"] and r["fast_bytes_peak"] > r["budget_bytes"]]
    out.append("  fast memory within budget: " + ("yes" if not over else f"NO ({', '.join(over)})"))
    return out


def run_cli(args: Any) -> int:
    from ..report.progress import Progress

    models = args.model or ["resnet"]
    ratios = args.ratio or list(RATIOS)
    variants = args.variants.split(",") if args.variants else None
    nt = len(TIERED) if variants is None else len([v for v in variants if v in TIERED])
    rounds = args.rounds or (1 if args.quick else 2)
    steps = len(models) * (2 + (1 + nt * len(ratios)) * rounds)
    with MachineLoad() as load, Progress(steps, "bench train") as p:
        res = run(
            models,
            ratios,
            quick=args.quick,
            iters=args.iters,
            slow_spec=args.slow,
            variants=variants,
            batch=args.batch,
            rounds=args.rounds,
            progress=p,
            stat=args.stat,
        )
    res["load"] = load.summary()
    show(report(res))
    show(load.line())
    if args.json:
        write_json(res, args.json)
    if args.out:  # the CLI made the folder before the run
        from ..report.plot import plot_train

        write_json(res, os.path.join(args.out, "train.json"))
        for path in plot_train(res, args.out):
            show(f"wrote {path}")
    return 0
