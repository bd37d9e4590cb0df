"""``tiermem plan`` and ``tiermem bench plan``: AutoTM's planner on the training workloads.

``plan``: record one training step of a model twice (all tensors fast, all slow) into a
graph (:mod:`tiermem.plan.torch`), or read one (``--graph``); solve it at a
slow:fast ratio with heap offsets that fit (:func:`tiermem.plan.fit`, each try printed); save
the plan; with ``--run``, train under the plan and report predicted
against measured step and kernel times.

``bench plan``: for each workload and ratio, the planned variant against ``LM``, ``async``,
``first-touch``, ``2lm-model`` and ``all-fast`` in one run (losses checked against plain
PyTorch's), and the solver on generated AutoTM-shaped graphs of 32 to 2,000 kernels: solve
time, certified gap and plan quality against all-slow.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from .._sizes import format_bytes
from ..exceptions import InvalidArgumentError, TiermemError
from ..plan import (
    DEFAULT_FORMULATION,
    FIT_TRIES,
    FORMULATIONS,
    Cost,
    Graph,
    Plan,
    autotm_graph,
    evaluate,
    fit,
    residency_by_kind,
    solve,
    tensor_residency,
)
from ..plan import torch as plan_torch
from ..plan.torch import DEFAULT_SLOW, Executor, default_profiles_path
from ..plan.torch.capture import WARMUP as CAPTURE_WARMUP
from ..plan.torch.script import load_script
from ..report.load import MachineLoad
from ..report.output import show, write_json
from ..report.progress import Progress
from ..report.table import print_table
from ..torch.tensors import TrainStep
from .models import Workload, build
from .paired import PAIRS, Side, paired
from .tensors import QUICK_BATCH, parse_ratio, train_step

__all__ = [
    "capture",
    "verdict",
    "verdict_line",
    "PREDICTION_TOLERANCE",
    "run_planned",
    "scaling",
    "run",
    "run_cli",
    "run_plan_cli",
    "SCALING_SIZES",
    "COMPARED",
    "PAIRED",
    "PAIRED_WARMUP",
    "RECORDED_POLICIES",
    "record_policy",
]

SCALING_SIZES = (32, 122, 242, 500, 1000, 2000)
QUICK_SCALING = (32, 122, 500)
#: The variants ``bench plan`` runs beside ``planned`` (``all-fast`` is always run).
COMPARED = ("first-touch", "2lm-model", "LM", "async")
#: What ``planned`` is paired with, iteration by iteration (:mod:`~tiermem.bench.paired`).
PAIRED = ("all-fast", "LM", "async", "first-touch")
#: The runtime variants whose own placements ``bench plan`` records and prices with the
#: graph's model (:func:`record_policy`), and offers the solver as incumbents (``2lm-model``
#: keeps every tensor on the slow device and models a cache in front of it: not placements).
RECORDED_POLICIES = ("first-touch", "LM", "async")
#: Untimed iterations per side before the pairs. The planned variant's first iteration runs
#: unplanned (it makes the optimizer's state) and its next two still build the view cache
#: over the plan's addresses (measured on DenseNet at 8:1: 2,285 and 288 new views, then
#: none); two warm-up iterations timed that third iteration, 15-25 % over the steady step.
PAIRED_WARMUP = 4
SEED = 0


def capture(
    w: Workload, ratio: str, slow_spec: str = DEFAULT_SLOW, seed: int = SEED, profiles: str | Path | None = None
) -> tuple[Graph, dict[str, Any]]:
    """Workload ``w`` captured (:func:`tiermem.plan.torch.capture` of its
    :func:`~tiermem.bench.tensors.train_step`)."""
    return plan_torch.capture(train_step(w, seed), ratio, slow_spec, profiles)


def record_policy(
    w: Workload, g: Graph, facts: dict[str, Any], variant: str, slow_spec: str, seed: int = SEED
) -> tuple[Plan, Cost]:
    """What ``variant`` did on ``w``, as a plan priced by ``g`` (:func:`tiermem.plan.torch.record_policy`)."""
    return plan_torch.record_policy(train_step(w, seed), g, facts, variant, slow_spec)


def _policy_row(variant: str, c: Cost) -> dict[str, Any]:
    """A runtime variant's recorded placements as the JSON keeps them (:func:`record_policy`)."""
    return {
        "variant": variant,
        "predicted_seconds_per_iter": c.seconds,
        "prefetched_bytes": c.prefetched_bytes,
        "written_home_bytes": c.written_home_bytes,
        "overflow": c.overflow,
    }


def run_planned(
    w: Workload, g: Graph, p: Plan, facts: dict[str, Any], slow_spec: str, iters: int, seed: int = SEED
) -> dict[str, Any]:
    """``w`` trained under the plan (:func:`tiermem.plan.torch.run_planned`)."""
    return plan_torch.run_planned(train_step(w, seed), g, p, facts, slow_spec, iters)


def scaling(
    sizes: tuple[int, ...], time_limit: float, ratio: float = 8.0, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """The solver on generated AutoTM-shaped graphs: solve time, gap, objective against the
    greedy plan's and all-slow's, and how long the first plan took."""
    out = []
    for n in sizes:
        g = autotm_graph(n, ratio)
        for form in FORMULATIONS:
            p = solve(g, form, time_limit=time_limit, target_gap=0.01)
            greedy = solve(g, form, time_limit=0)
            out.append(
                {
                    "kernels": len(g.kernels),
                    "tensors": len(g.tensors),
                    "formulation": form,
                    "solve_seconds": p.solve_seconds,
                    "first_plan_seconds": p.first_plan_seconds,
                    "gap": p.gap,
                    "objective": p.predicted_seconds,
                    "bound": p.bound_seconds,
                    "greedy_objective": greedy.predicted_seconds,
                    "all_slow_objective": g.all_on_seconds(g.home),
                    "all_fast_objective": g.base_seconds(),
                    "source": p.source,
                }
            )
            if progress:
                progress.step(f"{len(g.kernels)} kernels {form}")
    return out


def run(
    models: list[str],
    ratios: list[str],
    *,
    quick: bool = False,
    iters: int | None = None,
    rounds: int | None = None,
    time_limit: float = 60.0,
    slow_spec: str = "emulated:optane-pmem",
    sizes: tuple[int, ...] | None = None,
    progress: bool | None = None,
    profile_cache: str | None = None,
    pairs: int | None = None,
    formulation: str = DEFAULT_FORMULATION,
) -> dict[str, Any]:
    """Record and plan each workload at each ratio, then train every variant of
    :data:`COMPARED` and ``planned`` in the same rounds (``tiermem bench tensors``'s
    machinery: losses against plain PyTorch, best iteration over rounds); then ``planned``
    against each of :data:`PAIRED`, iteration by iteration (:mod:`~tiermem.bench.paired`,
    ``pairs`` timed pairs each; 0: none); then the solver scaling runs. ``profile_cache``:
    see :func:`capture`. ``formulation``: the planned runs' (:data:`~tiermem.plan.FORMULATIONS`).
    Returns the JSON-able results."""
    from .tensors import run as run_variants

    for ratio in ratios:
        parse_ratio(ratio)
    rounds = rounds or (1 if quick else 3)
    iters = iters or (1 if quick else 2)
    sizes = sizes or (QUICK_SCALING if quick else SCALING_SIZES)
    if formulation not in FORMULATIONS:
        raise InvalidArgumentError(f"formulation {formulation!r}: known are {', '.join(FORMULATIONS)}")
    pairs = (1 if quick else PAIRS) if pairs is None else pairs
    if pairs < 0:
        raise InvalidArgumentError(f"pairs must be >= 0, got {pairs}")
    out: dict[str, Any] = {
        "slow_device": slow_spec,
        "emulated": slow_spec.startswith("emulated"),
        "quick": quick,
        "rounds": rounds,
        "iters": iters,
        "models": [],
        "plans": [],
        "scaling": [],
        "pairs": pairs,
        "paired_warmup": 1 if quick else PAIRED_WARMUP,
        "paired": [],
        "verdicts": [],
        "formulation": formulation,
    }
    # Per model: a plan per ratio, plain PyTorch, all-fast, then every round runs each
    # variant at each ratio (and all-fast again), then the pairs; then every formulation per
    # graph size.
    per_model = len(ratios) + 2 + rounds * len(ratios) * (len(COMPARED) + 1) + rounds - 1
    per_model += len(ratios) * len(PAIRED) * bool(pairs) + len(ratios) * len(RECORDED_POLICIES)
    steps = len(models) * per_model + len(FORMULATIONS) * len(sizes)
    with MachineLoad() as load, Progress(steps, "bench plan", progress) as bar:
        for name in models:
            w = build(name, QUICK_BATCH[name] if quick else None)
            plans = {}
            for ratio in ratios:
                g, facts = capture(w, ratio, slow_spec, profiles=profile_cache)
                policies: list[dict[str, Any]] = []
                incumbents = []
                for v in RECORDED_POLICIES:
                    try:
                        q, c = record_policy(w, g, facts, v, slow_spec)
                        policies.append(_policy_row(v, c))
                        incumbents.append(q)
                    except TiermemError as e:  # a variant that cannot run this budget (as in its rounds)
                        policies.append({"variant": v, "error": f"{type(e).__name__}: {e}"})
                    bar.step(f"{name} {ratio}: {v}'s placements recorded")
                p, tries = fit(g, formulation, time_limit=time_limit, incumbents=incumbents)
                plans[(name, ratio)] = (g, p)
                out["plans"].append(
                    {
                        "model": name,
                        "ratio": ratio,
                        "kernels": len(g.kernels),
                        "tensors": len(g.tensors),
                        "predicted_seconds_per_iter": p.predicted_seconds,
                        "predicted_all_fast": g.base_seconds(),
                        "predicted_all_slow": g.all_on_seconds(g.home),
                        "gap": p.gap,
                        "solve_seconds": p.solve_seconds,
                        "source": p.source,
                        "notes": p.notes,
                        "fit_tries": tries,
                        "bound_seconds": p.bound_seconds,
                        # The first try's, at the full budget: no plan that fits it is faster.
                        "budget_bound_seconds": tries[0]["bound_seconds"],
                        # Each runtime variant's own placements, priced by the same model.
                        "policies": policies,
                    }
                    | facts
                )
                bar.step(f"{name} {ratio}: planned {len(g.kernels)} kernels")
            res = run_variants(
                [name],
                ratios,
                iters=iters,
                rounds=rounds,
                slow_spec=slow_spec,
                variants=list(COMPARED),
                batch=QUICK_BATCH[name] if quick else None,
                progress=bar,
                plans=plans,
            )
            predicted = {(q["model"], q["ratio"]): q["predicted_seconds_per_iter"] for q in out["plans"]}
            pred_fast = {(q["model"], q["ratio"]): q["predicted_all_fast"] for q in out["plans"]}
            for r in res["runs"]:
                out["models"].append(
                    {
                        "model": name,
                        "ratio": r["ratio"],
                        "variant": r["policy"],
                        "seconds_per_iter": r.get("seconds_per_iter"),
                        # Every iteration of every round, warm-up included, in run order:
                        # how far the machine's speed moved while the variants took turns.
                        "times": r.get("times"),
                        "vs_all_fast": r.get("vs_all_fast"),
                        "predicted_seconds_per_iter": predicted.get((name, r["ratio"])) if r["policy"] == "planned" else None,
                        # The plan's predicted slow-down over all-fast: compared with the
                        # measured vs_all_fast, it leaves out how fast the machine ran that
                        # round (a shared machine's speed drifts by 10-20 % over minutes).
                        "predicted_vs_all_fast": predicted[(name, r["ratio"])] / pred_fast[(name, r["ratio"])]
                        if r["policy"] == "planned" and (name, r["ratio"]) in predicted
                        else None,
                        "max_loss_diff": r.get("max_loss_diff"),
                        "tiering": r.get("tiering"),
                    }
                    | ({"error": r["error"]} if "error" in r else {})
                )
            if pairs:
                for ratio in ratios:
                    out["paired"] += _pairs(
                        w,
                        *plans[(name, ratio)],
                        _plan_row(out, name, ratio),
                        slow_spec,
                        pairs,
                        1 if quick else PAIRED_WARMUP,
                        bar,
                    )
                _paired_into_rows(out, name)
            _verdicts_into(out, name, ratios, plans)
            gc.collect()
        out["scaling"] = scaling(sizes, time_limit, progress=bar)
    out["load"] = load.summary()
    out["load_line"] = load.line()
    return out


#: How far a plan's predicted step may be from its measured one before the report says the
#: prediction does not hold (the done-when figure of the planner's issues).
PREDICTION_TOLERANCE = 0.10
#: The share of a step spent outside its kernels (Python dispatch, autograd) above which
#: per-op overhead, not data movement, decides the step time.
OVERHEAD_DOMINATES = 0.25


def verdict(
    vs: dict[str, float], predicted_over_measured: float, overhead_seconds: float, step_seconds: float, kernels: int
) -> dict[str, Any]:
    """Whether the plan wins against the runtime variants measured beside it (``vs``: variant
    -> the planned step's time over that variant's, paired iteration by iteration where
    there are pairs) and whether its prediction holds (``predicted_over_measured``), with
    why when not, and the variant to use instead when the plan loses (``use``)."""
    err = predicted_over_measured - 1
    notes = []
    if abs(err) > PREDICTION_TOLERANCE:
        notes.append(
            f"the prediction is {abs(err):.0%} {'under' if err < 0 else 'over'} the measured step (a capture times each "
            "kernel over a few iterations of a shared machine: at this size its noise is the plan's margin)"
        )
    share = overhead_seconds / step_seconds if step_seconds else 0.0
    if share > OVERHEAD_DOMINATES:
        notes.append(
            f"per-op overhead dominates: {overhead_seconds * 1e3:.0f} ms of the step ({share:.0%}) is outside its "
            f"{kernels} kernels, so what placement saves is small against it"
        )
    base = {"prediction_holds": abs(err) <= PREDICTION_TOLERANCE, "error": err, "why": notes}
    if not vs:
        return base | {"wins": None, "use": None}
    best, ratio = max(vs.items(), key=lambda kv: kv[1])  # the fastest variant: the largest planned / it
    wins = ratio < 1
    return base | {"wins": wins, "best_runtime": best, "vs_best_runtime": 1 / ratio, "use": None if wins else best}


def verdict_line(name: str, v: dict[str, Any]) -> str:
    """One sentence of :func:`verdict` for the report."""
    if v["wins"] is None:
        head = f"{name}: no runtime variant measured beside the plan"
    elif v["wins"]:
        head = f"{name}: planned wins, {v['vs_best_runtime']:.2f}x faster than the best runtime variant ({v['best_runtime']})"
    else:
        head = (
            f"{name}: planned LOSES to {v['best_runtime']} (it takes {1 / v['vs_best_runtime']:.2f}x its time); "
            f"use {v['use']} for this model at this ratio"
        )
    pred = f"prediction {'within' if v['prediction_holds'] else 'NOT within'} {PREDICTION_TOLERANCE:.0%} ({v['error']:+.0%})"
    return f"{head}; {pred}" + "".join(f"; {w}" for w in v["why"])


def _verdicts_into(out: dict[str, Any], name: str, ratios: list[str], plans: dict[tuple[str, str], tuple[Graph, Plan]]) -> None:
    """The verdict per ratio of model ``name``: from the pairs where there are (the
    machine's drift cancels within a pair), else from the variants taken in turn."""
    for ratio in ratios:
        rows = {r["variant"]: r for r in out["models"] if r["model"] == name and r["ratio"] == ratio}
        mine = rows.get("planned")
        if mine is None or not mine.get("seconds_per_iter"):
            continue
        g, p = plans[(name, ratio)]
        pairs = {q["a"]: q["median"] for q in out["paired"] if q["model"] == name and q["ratio"] == ratio and "median" in q}
        if any(v in pairs for v in RECORDED_POLICIES):
            vs = {v: pairs[v] for v in RECORDED_POLICIES if v in pairs}
            pom = mine.get("predicted_over_paired") or p.predicted_seconds / mine["seconds_per_iter"]
        else:
            vs = {
                v: mine["seconds_per_iter"] / rows[v]["seconds_per_iter"]
                for v in RECORDED_POLICIES
                if v in rows and rows[v].get("seconds_per_iter")
            }
            pom = p.predicted_seconds / mine["seconds_per_iter"]
        out["verdicts"].append(
            {"model": name, "ratio": ratio, "paired": bool(pairs)}
            | verdict(vs, pom, g.overhead_seconds, mine["seconds_per_iter"], len(g.kernels))
        )


def _plan_row(out: dict[str, Any], model: str, ratio: str) -> dict[str, Any]:
    """The ``plans`` row of a model and ratio (its capture's facts included)."""
    return next(q for q in out["plans"] if q["model"] == model and q["ratio"] == ratio)


def _pairs(
    w: Workload, g: Graph, p: Plan, facts: dict[str, Any], slow_spec: str, pairs: int, warmup: int, bar: Any
) -> list[dict[str, Any]]:
    """``planned`` against each of :data:`PAIRED`, iteration by iteration, after ``warmup``
    untimed iterations each."""
    out = []
    budget, slow = facts["budget_bytes"], facts["slow_bytes"]
    planned = Side("planned", budget, slow, lambda: [Executor(g, p)])
    for v in PAIRED:
        other = Side(v, facts["all_fast_room_bytes"], 64 << 20) if v == "all-fast" else Side(v, budget, slow)
        try:
            r = paired(w, other, planned, slow_spec, pairs, warmup)
        except TiermemError as e:
            r = {"a": v, "b": "planned", "error": f"{type(e).__name__}: {e}"}
        out.append({"model": facts["model"], "ratio": facts["ratio"]} | r)
        bar.step(f"{facts['model']} {facts['ratio']}: planned vs {v}, paired")
    return out


def _paired_into_rows(out: dict[str, Any], model: str) -> None:
    """The planned rows gain the paired ratio to all-fast and the prediction over it."""
    for r in out["models"]:
        if r["model"] != model or r["variant"] != "planned":
            continue
        q = next((q for q in out["paired"] if q["model"] == model and q["ratio"] == r["ratio"] and q["a"] == "all-fast"), None)
        if q is None or "error" in q:
            continue
        r["paired_vs_all_fast"] = q["median"]
        if r.get("predicted_vs_all_fast") is not None:
            r["predicted_over_paired"] = r["predicted_vs_all_fast"] / q["median"]


def _print_paired(out: dict[str, Any]) -> None:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for q in out["paired"]:
        key = (q["model"], q["ratio"])
        rows.setdefault(key, {})[q["a"]] = q
    table = []
    for (model, ratio), by in rows.items():
        pr: dict[str, Any] = next(
            (r for r in out["models"] if r["model"] == model and r["ratio"] == ratio and r["variant"] == "planned"), {}
        )
        cells = [model, ratio]
        for v in PAIRED:
            q = by.get(v)
            cells.append("" if q is None else "error" if "error" in q else _with_interval(q))
        pv = pr.get("predicted_vs_all_fast")
        cells.append("" if pv is None else f"{pv:.3f}")
        po = pr.get("predicted_over_paired")
        cells.append("" if po is None else f"{po:.2f}")
        table.append(cells)
    print_table(
        ["model", "ratio"] + [f"planned / {v}" for v in PAIRED] + ["predicted / all-fast", "predicted ÷ measured"],
        table,
        title=f"planned side by side, iteration by iteration (median of {out['pairs']} pairs; "
        f"in brackets, an interval holding the median {_coverage(out):.0%} of the time)",
    )


def _with_interval(q: dict[str, Any]) -> str:
    lo, hi = q["interval"]
    return f"{q['median']:.3f} ({lo:.2f}-{hi:.2f})"


def _coverage(out: dict[str, Any]) -> float:
    """The intervals' coverage (the same for every comparison: it depends on the pairs alone)."""
    return next((q["coverage"] for q in out["paired"] if "coverage" in q), 0.0)


def _print_models(rows: list[dict[str, Any]], rounds: int, paired: bool) -> None:
    """The variants taken in turn, ``rounds`` rounds each; with ``paired``, the paired table
    follows, and the title says which of the two to compare planned by."""
    title = (
        f"each variant in turn, best iteration of {rounds} round{'s' * (rounds != 1)}: a shared machine's speed "
        "drifts 10-20 % over minutes, so ratios between rows move by as much"
        + (" (the paired table below compares planned iteration by iteration)" if paired else "")
    )
    base = {(r["model"], r["ratio"]): r["seconds_per_iter"] for r in rows if r.get("variant") == "all-fast" and "error" not in r}
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["model"], r["ratio"], r["variant"], "error", "", "", "", r["error"][:60]])
            continue
        b = base.get((r["model"], r["ratio"]))
        pred = r["predicted_seconds_per_iter"]
        table.append(
            [
                r["model"],
                r["ratio"],
                r["variant"],
                f"{r['seconds_per_iter'] * 1e3:.1f}",
                f"{r['seconds_per_iter'] / b:.2f}x" if b else "",
                "" if pred is None else f"{pred * 1e3:.1f} ({pred / r['seconds_per_iter']:.2f})",
                "" if r.get("predicted_vs_all_fast") is None else f"{r['predicted_vs_all_fast']:.2f}x",
                f"{r['max_loss_diff']:.1e}",
            ]
        )
    print_table(
        [
            "model",
            "ratio",
            "variant",
            "ms/iter",
            "vs all-fast",
            "predicted ms (÷ measured)",
            "predicted vs all-fast",
            "loss diff",
        ],
        table,
        title=title,
    )


def _print_policies(plans: list[dict[str, Any]]) -> None:
    table = []
    for q in plans:
        base, mine, bound = q["predicted_all_fast"], q["predicted_seconds_per_iter"], q.get("budget_bound_seconds")
        for r in q.get("policies", []):
            if "error" in r:
                table.append([q["model"], q["ratio"], r["variant"], "error", "", "", "", r["error"][:60]])
                continue
            theirs = r["predicted_seconds_per_iter"]
            table.append(
                [
                    q["model"],
                    q["ratio"],
                    r["variant"] + (" (overflows)" if r["overflow"] else ""),
                    f"{theirs / base:.3f}",
                    f"{mine / theirs:.3f}",
                    "" if bound is None else f"{bound / theirs:.3f}",
                    format_bytes(r["prefetched_bytes"]),
                    format_bytes(r["written_home_bytes"]),
                ]
            )
    print_table(
        ["model", "ratio", "variant", "its placements / all-fast", "plan / them", "bound / them", "prefetched", "written home"],
        table,
        title="each runtime variant's own placements, priced by the cost model (bound: HiGHS's lower bound at the "
        "full budget; no plan that fits it is faster under the model)",
    )


def _print_scaling(rows: list[dict[str, Any]]) -> None:
    print_table(
        ["kernels", "formulation", "first plan s", "solve s", "gap", "plan / all-slow", "plan / greedy", "source"],
        [
            [
                r["kernels"],
                r["formulation"],
                f"{r['first_plan_seconds']:.3f}",
                f"{r['solve_seconds']:.1f}",
                "" if r["gap"] is None else f"{r['gap']:.2%}",
                f"{r['objective'] / r['all_slow_objective']:.3f}",
                f"{r['objective'] / r['greedy_objective']:.3f}",
                r["source"],
            ]
            for r in rows
        ],
        title="solver on generated AutoTM-shaped graphs (8:1)",
    )


def _print_residency(rows: list[dict[str, Any]], kinds: list[dict[str, Any]], top: int = 8) -> None:
    print_table(
        ["kind", "tensors", "bytes", "in fast (byte-kernels)", "prefetched / step", "written home / step"],
        [
            [
                k["kind"],
                k["tensors"],
                format_bytes(k["bytes"]),
                f"{k['fast_share']:.0%}",
                format_bytes(k["prefetched_bytes"]),
                format_bytes(k["written_home_bytes"]),
            ]
            for k in kinds
        ],
        title="residency by kind",
    )
    big = sorted(rows, key=lambda r: -r["bytes"] * r["live_kernels"])[:top]
    print_table(
        ["tensor", "name", "kind", "bytes", "fast uses", "kernels in fast / live", "prefetched", "written home"],
        [
            [
                r["key"],
                r.get("label", "")[:48],
                r["kind"],
                format_bytes(r["bytes"]),
                f"{r['fast_uses']}/{r['uses']}",
                f"{r['fast_kernels']}/{r['live_kernels']}",
                format_bytes(r["prefetched_bytes"]),
                format_bytes(r["written_home_bytes"]),
            ]
            for r in big
        ],
        title=f"the {len(big)} largest tensors (bytes x kernels live); every tensor is in --json",
    )


def run_cli(args: Any) -> int:
    """``tiermem bench plan``."""
    models = args.model or ["resnet", "densenet", "vgg", "gpt"]
    ratios = args.ratio or ["4:1", "8:1"]
    res = run(
        models,
        ratios,
        quick=args.quick,
        iters=args.iters,
        rounds=args.rounds,
        time_limit=args.time_limit,
        slow_spec=args.slow,
        sizes=args.sizes,
        profile_cache=args.profile_cache,
        pairs=args.pairs,
        formulation=args.formulation,
    )
    _print_models(res["models"], res["rounds"], bool(res["paired"]))
    _print_policies(res["plans"])
    if res["paired"]:
        _print_paired(res)
    _print_scaling(res["scaling"])
    for v in res["verdicts"]:
        show(verdict_line(f"{v['model']} {v['ratio']}", v))
    show(res["load_line"])
    if args.json:
        write_json(res, args.json)
    return 0


def _run_against(
    step: TrainStep, g: Graph, facts: dict[str, Any], args: Any, planned_run: dict[str, Any]
) -> list[dict[str, Any]]:
    """``plan --run``: plain PyTorch and each runtime variant (``--against``, else all of
    :data:`RECORDED_POLICIES`) trained on the same step at the same sizes, beside the plan's
    run: best step times and whether each one's losses equal plain PyTorch's."""
    import torch

    variants = [v.strip() for v in (args.against or "").split(",") if v.strip()] or list(RECORDED_POLICIES)
    n = CAPTURE_WARMUP + max(1, args.iters)
    torch.manual_seed(0)
    s = step.start()
    plain = [s.step()[0] for _ in range(n)]
    s.close()
    rows = [{"variant": "planned", "seconds_per_iter": planned_run["seconds_per_iter"], "losses": planned_run["losses"]}]
    with Progress(len(variants), "runtime variants at the plan's sizes") as bar:
        for v in variants:
            try:
                r = plan_torch.run_variant(step, v, facts, args.slow, args.iters)
                rows.append({"variant": v, "seconds_per_iter": r["seconds_per_iter"], "losses": r["losses"]})
            except TiermemError as e:  # a variant that cannot run this budget
                rows.append({"variant": v, "error": f"{type(e).__name__}: {e}"})
            bar.step(v)
    for row in rows:
        if "losses" in row:
            row["losses_equal_plain"] = row["losses"] == plain
    print_table(
        ["variant", "ms per step (best)", "vs planned", "losses = plain PyTorch"],
        [
            [
                r["variant"],
                f"{r['seconds_per_iter'] * 1e3:.1f}" if "seconds_per_iter" in r else r["error"][:60],
                f"{r['seconds_per_iter'] / planned_run['seconds_per_iter']:.2f}" if "seconds_per_iter" in r else "",
                "" if "losses_equal_plain" not in r else "yes" if r["losses_equal_plain"] else "NO",
            ]
            for r in rows
        ],
        title=f"{g.name}: the plan against the runtime variants, measured at the same sizes, one after another",
    )
    return rows


def run_plan_cli(args: Any) -> int:
    """``tiermem plan``."""
    if sum(x is not None for x in (args.model, args.graph, args.script)) != 1:
        raise InvalidArgumentError(
            "give one of --model NAME (a bundled workload), --script FILE (your own model, batch, loss and optimizer) "
            "or --graph FILE (a saved graph)"
        )
    facts: dict[str, Any] = {}
    step: TrainStep | None = None
    against = [v.strip() for v in (args.against or "").split(",") if v.strip()]
    for v in against:
        if v not in RECORDED_POLICIES:
            raise InvalidArgumentError(f"--against {v!r}: the runtime variants it records are {', '.join(RECORDED_POLICIES)}")
    if args.graph:
        g = Graph.load(args.graph)
        if args.run or against:
            raise InvalidArgumentError("--run and --against need --model or --script (a saved graph has no model to train)")
    else:
        step = load_script(args.script) if args.script else train_step(build(args.model, args.batch), SEED)
        t0 = time.perf_counter()
        cache = None if args.no_profile_cache else (args.profile_cache or default_profiles_path())
        g, facts = plan_torch.capture(step, args.ratio, args.slow, profiles=cache)
        show(
            f"recorded {len(g.kernels)} kernels, {len(g.tensors)} tensors in {time.perf_counter() - t0:.1f} s; "
            f"footprint {format_bytes(facts['footprint_bytes'])}, fast budget {format_bytes(facts['budget_bytes'])} ({args.ratio})"
        )
        where = f"{facts['profile_signatures_cached']} signatures already in {cache}" if cache else "no profile cache"
        show(f"kernel profiles: {facts['profile_signatures']} distinct kernel signatures pooled ({where})")
    if args.formulation == "async":
        show(f"copy contention: a copy overlapping a kernel costs it {g.copy_contention:.0%} of the copy's time")
    if args.save_graph:
        g.save(args.save_graph)
        show(f"wrote {args.save_graph}")
    policies: list[tuple[str, Plan, Cost]] = []
    for v in against:
        assert step is not None
        with Progress(1, f"recording {v}'s placements") as bar:
            policies.append((v, *plan_torch.record_policy(step, g, facts, v, args.slow)))
            bar.step(v)
    with Progress(FIT_TRIES, f"planning ({args.formulation}; tries of the limit reduction)") as bar:

        def on(secs: float, inc: float, bound: float) -> None:
            bar.note(f"{secs:.0f} s: plan {inc * 1e3:.2f} ms, bound {bound * 1e3:.2f} ms")

        def tried(t: dict[str, Any]) -> None:
            bar.step(
                f"limit {format_bytes(t['capacity_bytes'])}: heap height {format_bytes(t['height_bytes'])}, "
                f"{t['predicted_seconds'] * 1e3:.2f} ms predicted"
            )

        p, tries = fit(
            g, args.formulation, args.time_limit, args.gap, on_try=tried, on_progress=on, incumbents=[q for _, q, _ in policies]
        )
    facts["fit_tries"] = tries
    for t in tries:
        fits = "fits" if t["height_bytes"] <= (g.devices[0].capacity or 0) else "does not fit"
        show(
            f"fit: limit {format_bytes(t['capacity_bytes'])}: heap height {format_bytes(t['height_bytes'])} ({fits}), "
            f"{t['predicted_seconds'] * 1e3:.2f} ms predicted"
        )
    c = evaluate(g, p.at_use, p.held, p.overlap)
    print_table(
        ["", "ms per step"],
        [
            ["all fast (no limit)", f"{g.base_seconds() * 1e3:.2f}"],
            ["all slow", f"{g.all_on_seconds(g.home) * 1e3:.2f}"],
            [f"plan ({p.source})", f"{p.predicted_seconds * 1e3:.2f}"],
            ["  of which moves", f"{c.move_seconds * 1e3:.2f}"],
            ["  best bound", "" if p.bound_seconds is None else f"{p.bound_seconds * 1e3:.2f}"],
        ]
        + (
            [["  bound at the full budget", f"{tries[0]['bound_seconds'] * 1e3:.2f}"]]
            if len(tries) > 1 and tries[0]["bound_seconds"] is not None
            else []
        )
        + [
            [f"{v}'s own placements" + (" (overflow)" if pc.overflow else ""), f"{pc.seconds * 1e3:.2f}"] for v, _, pc in policies
        ],
        title=f"{g.name}: {p.formulation} plan, gap {'n/a' if p.gap is None else f'{p.gap:.2%}'}, "
        f"first plan {p.first_plan_seconds * 1e3:.0f} ms, solved in {p.solve_seconds:.1f} s",
    )
    show(
        f"moves per step: {format_bytes(c.prefetched_bytes)} prefetched, {format_bytes(c.written_home_bytes)} written home; "
        f"fast peak {format_bytes(c.peak[0])} of {format_bytes(g.devices[0].capacity or 0)}"
    )
    rows = tensor_residency(g, p)
    kinds = residency_by_kind(rows)
    _print_residency(rows, kinds)
    for note in p.notes:
        show(f"note: {note}")
    out = args.save_plan or f"plan-{g.name}.json"
    p.save(out)
    show(f"wrote {out}")
    res: dict[str, Any] = {
        "graph": g.name,
        "plan": p.to_json() | {"tensors": len(p.keys)},
        "facts": facts,
        "residency": {"by_kind": kinds, "tensors": rows},
        "predicted_move_seconds": c.move_seconds,
        "policies": [_policy_row(v, pc) for v, _, pc in policies],
    }
    if args.run:
        assert step is not None
        with MachineLoad() as load:
            r = plan_torch.run_planned(step, g, p, facts, args.slow, args.iters)
            vs = _run_against(step, g, facts, args, r)
        res["run"] = {k: r[k] for k in ("seconds_per_iter", "times", "tiering", "kernel_predicted", "kernel_measured")} | {
            "against": vs
        }
        res["load"] = load.summary()
        counts = r["tiering"].get("plan") or {}
        stall = counts.get("move_seconds", 0.0) / max(1, counts.get("planned_iterations", 0))
        res["run"]["stall_seconds_per_iter"] = stall
        show(
            f"planned run: {r['seconds_per_iter'] * 1e3:.1f} ms per step measured, {p.predicted_seconds * 1e3:.1f} ms "
            f"predicted ({p.predicted_seconds / r['seconds_per_iter']:.2f}); stall on moves {stall * 1e3:.1f} ms per step "
            f"({c.move_seconds * 1e3:.1f} ms predicted); executor {counts}"
        )
        mine = r["seconds_per_iter"]
        ratios = {x["variant"]: mine / x["seconds_per_iter"] for x in vs[1:] if "seconds_per_iter" in x}
        res["verdict"] = verdict(ratios, p.predicted_seconds / mine, g.overhead_seconds, mine, len(g.kernels))
        show(verdict_line(g.name, res["verdict"]))
        show(load.line())
        if args.plot and r["kernel_measured"]:
            from ..report.plot import plot_kernels

            plot_kernels(r["kernel_predicted"], r["kernel_measured"], args.plot, g.name)
            show(f"wrote {args.plot}")
    if args.json:
        write_json(res, args.json)
    return 0
