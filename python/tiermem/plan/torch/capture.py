"""Capture any PyTorch training step as a planner's graph, and run it under a plan.

    from tiermem.plan import fit
    from tiermem.plan.torch import capture, run_planned
    from tiermem.torch.tensors import TrainStep

    step = TrainStep(model=make_model, optimizer=lambda ps: torch.optim.AdamW(ps), loss=loss_of)
    graph, facts = capture(step, "8:1")          # all-fast and all-slow runs, recorded
    plan = fit(graph)                             # solved, with heap offsets that fit
    result = run_planned(step, graph, plan, facts)

The step (:class:`~tiermem.torch.tensors.TrainStep`) is the user's: their model, their
optimizer, their loss and inputs. :func:`capture` trains it all-fast (measuring the
footprint, recording every kernel's time with its operands in fast memory) and all-slow
(each kernel's time with its operands on the slow device, under the plan executor so the
step's overhead includes the executor's own work), and makes the graph whose fast device
holds ``FAST/(SLOW+FAST)`` of the footprint (:func:`~tiermem.plan.torch.profile.graph_from_recordings`).
A step whose ops differ between iterations is refused with the first difference named: a
plan is a schedule of one iteration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ... import dram_figures
from ...torch.tensors.train import TrainStep, budget_for, measure, measure_all_fast, parse_ratio, slow_capacity
from ..graph import Graph, GraphError
from ..plan import Cost, Plan, at_home, recorded
from .contention import copy_contention
from .execute import Executor
from .kernel_profiles import KernelProfiles, setup_key
from .profile import graph_from_recordings
from .record import Recorder

__all__ = ["capture", "record_policy", "run_planned", "run_variant", "RECORDED", "DEFAULT_SLOW"]

#: Iterations a capture records per run (each kernel keeps its best time).
RECORDED = 3
#: The slow device a capture emulates unless told otherwise.
DEFAULT_SLOW = "emulated:optane-pmem"
#: Untimed iterations before recording: the first makes the optimizer's state, the second
#: still warms the allocator and caches.
WARMUP = 2


def _devices(facts: dict[str, Any], slow_spec: str) -> dict[str, int]:
    return {"dram": facts["budget_bytes"], slow_spec: facts["slow_bytes"]}


def capture(
    step: TrainStep, ratio: str = "8:1", slow_spec: str = DEFAULT_SLOW, profiles: str | Path | None = None
) -> tuple[Graph, dict[str, Any]]:
    """One training iteration of ``step`` recorded all-fast and all-slow, as a graph whose
    fast device holds ``FAST/(SLOW+FAST)`` (``ratio``, ``"SLOW:FAST"``) of the all-fast
    run's peak. Returns the graph and the two runs' facts (footprint, budget, slow device
    size, step times, the devices' figures). ``profiles``: a kernel profile cache file
    (:mod:`~tiermem.plan.torch.kernel_profiles`) to pool kernels' slow-downs with and add
    this capture's to; without one, kernels are pooled within this capture only."""
    parsed = parse_ratio(ratio)
    # Read (and a damaged file refused) before minutes of recording, not after.
    cache = KernelProfiles(setup_key(["dram", slow_spec]), profiles)
    n_params = sum(p.numel() * p.element_size() for p in step.model().parameters())
    room, big = measure_all_fast(
        step, max(1 << 30, 8 * n_params), slow_spec, WARMUP, RECORDED, lambda: [Recorder(WARMUP, RECORDED)]
    )
    fast_rec = big["observers"][0]
    footprint = big["fast_bytes_peak"]
    slow_cap = slow_capacity(footprint)
    budget = budget_for(footprint, parsed)
    name = f"{step.name}-{ratio}"
    traits = big["device_traits"]
    devices = [("dram", budget, bool(traits[0]["duplex"])), (slow_spec, None, bool(traits[1]["duplex"]))]
    c01, c10 = big["copy_gbps"]
    copy = [[None, c01], [c10, None]]
    # The step's kernels and tensors, without operand costs yet: enough to run at home.
    g0 = graph_from_recordings(name, fast_rec, fast_rec, devices, traits, copy)
    slow_rec = Recorder(WARMUP, RECORDED)
    small = measure(
        step, "planned", {"dram": 1 << 20, slow_spec: slow_cap}, WARMUP, RECORDED, [slow_rec, Executor(g0, at_home(g0))]
    )
    contention = copy_contention(slow_spec)
    g = graph_from_recordings(name, fast_rec, slow_rec, devices, traits, copy, min(small["timed"]), cache, contention)
    cache.save()
    facts = {
        "footprint_bytes": footprint,
        "budget_bytes": budget,
        "slow_bytes": slow_cap,
        "all_fast_seconds": big["seconds_per_iter"],
        "all_slow_seconds": small["seconds_per_iter"],
        "all_fast_room_bytes": room,
        "profile_signatures": len(set(fast_rec.signatures)),
        "profile_signatures_cached": cache.known,
        "copy_contention": contention,
        # The emulated device's figures are ratios of these (a calibration file's, or measured
        # by this process: on a shared machine they differ from process to process).
        "dram_figures": dram_figures(),
        "device_traits": traits,
    }
    return g, facts


def record_policy(
    step: TrainStep, g: Graph, facts: dict[str, Any], variant: str, slow_spec: str = DEFAULT_SLOW
) -> tuple[Plan, Cost]:
    """Train ``step`` under a runtime variant for three iterations and return the
    placements it chose in the third (each operand's device as its kernel closed) as a
    plan, priced by ``g``'s model (:func:`tiermem.plan.recorded`): what the variant did, in
    the terms the solver's plans are judged by. Refuses a run whose kernels or tensors are
    not ``g``'s."""
    rec = Recorder(WARMUP, 1, places=True)
    measure(step, variant, _devices(facts, slow_spec), WARMUP, 1, [rec])
    if rec.mismatch:
        raise GraphError(f"{variant}: the model's ops are not the same every iteration ({rec.mismatch})")
    ops = [(k.name, [(g.tensors[o.tensor].key, o.use) for o in k.operands]) for k in g.kernels]
    if [(n, o) for n, _, o in rec.kernels] != ops:
        raise GraphError(f"{variant}: the step ran other kernels or tensors than graph {g.name!r} holds")
    return recorded(g, rec.places, f"{variant} as recorded")


def run_variant(
    step: TrainStep, variant: str, facts: dict[str, Any], slow_spec: str = DEFAULT_SLOW, iters: int = 2
) -> dict[str, Any]:
    """Train ``step`` under runtime ``variant`` at the capture's device sizes (the
    :func:`~tiermem.torch.tensors.train.measure` results): what a plan is measured against."""
    return measure(step, variant, _devices(facts, slow_spec), WARMUP, max(1, iters))


def run_planned(
    step: TrainStep, g: Graph, p: Plan, facts: dict[str, Any], slow_spec: str = DEFAULT_SLOW, iters: int = 2
) -> dict[str, Any]:
    """Train ``step`` under plan ``p`` (made for ``g``) at the capture's device sizes: the
    step time, the losses, the executor's counts (``tiering["plan"]``) and each kernel's
    measured time (recorded in the second timed iteration) beside its prediction."""
    rec = Recorder(WARMUP, max(1, iters))
    r = measure(step, "planned", _devices(facts, slow_spec), WARMUP, max(1, iters), [rec, Executor(g, p)])
    use_index = [{k: j for j, (k, _) in enumerate(us)} for us in g.uses]
    predicted = [
        g.kernel_seconds(k, [p.at_use[o.tensor][use_index[o.tensor][k]] for o in ker.operands]) for k, ker in enumerate(g.kernels)
    ]
    measured = [s for _, s, _ in rec.kernels]
    r["kernel_predicted"] = predicted
    r["kernel_measured"] = measured if len(measured) == len(predicted) else []
    return r
