"""Plans that fit the fast heap: the thesis's iterative limit reduction (§3.7), with the heap
simulated by the plan's own offsets (:mod:`tiermem.plan.offsets`) instead of run.

A plan that fits the fast device by bytes may not fit its heap: tensors of different sizes
come and go, and the spans they leave are not always where the next one needs them. ``fit``
plans at the device's capacity, lays the plan's residencies out in the heap, and while their
height exceeds the capacity plans again at a lower limit (scaled by capacity over height,
at least 1 % lower); once a limit fits, it tries halfway back towards the last that did not,
while tries remain. The plan returned is the one at the highest limit that fits, with its
offsets, for the graph at its real capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._sizes import format_bytes
from .graph import Graph
from .offsets import assign
from .plan import Plan
from .solve import DEFAULT_FORMULATION, _solve

__all__ = ["FIT_TRIES", "fit"]

FIT_TRIES = 6


def fit(
    g: Graph,
    formulation: str = DEFAULT_FORMULATION,
    time_limit: float = 60.0,
    target_gap: float = 0.01,
    tries: int = FIT_TRIES,
    on_try: Callable[[dict[str, Any]], None] | None = None,
    on_progress: Callable[[float, float, float], None] | None = None,
    incumbents: Sequence[Plan] = (),
) -> tuple[Plan, list[dict[str, Any]]]:
    """The best plan whose heap offsets fit ``g``'s fastest device, and each try's figures
    (``capacity_bytes`` planned for, ``height_bytes`` reached, ``predicted_seconds``,
    ``bound_seconds``: HiGHS's bound at that limit, None without one; the first try's is at the
    full capacity, a bound on every plan that fits it);
    ``on_try`` is called with each, ``on_progress`` and ``incumbents`` as
    :func:`~tiermem.plan.solve.solve`'s (each try starts from those that fit its limit)."""
    budget = g.devices[0].capacity
    assert budget is not None
    log: list[dict[str, Any]] = []
    best: tuple[int, Plan] | None = None  # the highest limit that fit
    failed = budget + 1  # the lowest limit that did not
    cap = budget
    last: Plan | None = None
    for _ in range(max(1, tries)):
        # Placed at the lower limit, laid out once against the real capacity.
        p = _solve(g.with_capacity(cap), formulation, time_limit, target_gap, None, on_progress, incumbents)
        off = assign(g, p.at_use, p.held, p.overlap)
        p.offsets = off.at_use
        height = off.height[0]
        log.append(
            {
                "capacity_bytes": cap,
                "height_bytes": height,
                "predicted_seconds": p.predicted_seconds,
                "bound_seconds": p.bound_seconds,
            }
        )
        if on_try is not None:
            on_try(log[-1])
        last = p
        if height <= budget:
            if best is None or cap > best[0]:
                best = (cap, p)
        else:
            failed = min(failed, cap)
        if best is not None and (failed > budget or failed - best[0] <= budget // 100):
            break
        if best is None:
            cap = min(int(cap * budget / height), cap - max(1, budget // 100))
        else:
            cap = (best[0] + failed) // 2
    if best is not None:
        p = best[1]
        if best[0] < budget:
            p.notes.append(
                f"planned for {format_bytes(best[0])} of {format_bytes(budget)} so that its heap offsets fit "
                f"(iterative limit reduction, {len(log)} tries)"
            )
        return p, log
    assert last is not None
    last.notes.append(
        f"the plan's heap offsets still reach past {format_bytes(budget)} after {len(log)} limit reductions: "
        "the residencies above it are placed by the heap"
    )
    return last, log
