"""Paired measurement: two variants trained side by side, one iteration each in turn.

This machine's speed moves by 10-50 % within minutes with nothing else running on it (a
shared host), so variants timed one after another, each for a few iterations, differ by
more than the effects measured. Here both variants' models live at once and alternate
iteration by iteration (the order swapped every pair, so a steady drift favours neither);
each pair gives a ratio of two iterations a few seconds apart, and the median over pairs is
the figure. Both see the same inputs, so their losses must be equal, and are checked.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import InvalidArgumentError
from .models import Workload
from .tensors import Trainer

__all__ = ["Side", "paired", "PAIRS"]

#: Timed pairs per comparison (after the warm-up iterations).
PAIRS = 3


@dataclass
class Side:
    """One side of a pair: a variant with its fast and slow device sizes and any more
    :class:`~tiermem.torch.tensors.Tiering` arguments (a plan and its graph)."""

    variant: str
    fast: int
    slow: int
    tiering: dict[str, Any] = field(default_factory=dict)


def paired(w: Workload, a: Side, b: Side, slow_spec: str, pairs: int = PAIRS, warmup: int = 2, seed: int = 0) -> dict[str, Any]:
    """Train ``a`` and ``b`` in turn, ``warmup`` untimed iterations each and then ``pairs``
    timed pairs. ``ratios``: ``b``'s time over ``a``'s per pair; ``median``: their median."""
    if pairs < 1 or warmup < 0:
        raise InvalidArgumentError(f"paired: pairs must be at least 1 and warmup at least 0, got {pairs}, {warmup}")
    ta = Trainer(w, a.variant, a.fast, a.slow, slow_spec, seed, **a.tiering)
    try:
        tb = Trainer(w, b.variant, b.fast, b.slow, slow_spec, seed, **b.tiering)
        try:
            losses: tuple[list[float], list[float]] = ([], [])
            times: tuple[list[float], list[float]] = ([], [])
            for i in range(warmup + pairs):
                order = ((0, ta), (1, tb)) if i % 2 == 0 else ((1, tb), (0, ta))
                for side, tr in order:
                    loss, sec = tr.step()
                    losses[side].append(loss)
                    if i >= warmup:
                        times[side].append(sec)
            ratios = [y / x for x, y in zip(*times, strict=True)]
            return {
                "a": a.variant,
                "b": b.variant,
                "a_times": times[0],
                "b_times": times[1],
                "ratios": ratios,
                "median": statistics.median(ratios),
                "max_loss_diff": max(abs(x - y) for x, y in zip(*losses, strict=True)),
            }
        finally:
            tb.close()
    finally:
        ta.close()
