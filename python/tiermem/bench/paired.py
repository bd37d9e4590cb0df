"""Paired measurement: two variants trained side by side, one iteration each in turn.

This machine's speed moves by 10-50 % within minutes with nothing else running on it (a
shared host), so variants timed one after another, each for a few iterations, differ by
more than the effects measured. Here both variants' models live at once and alternate
iteration by iteration (the order swapped every pair, so a steady drift favours neither);
each pair gives a ratio of two iterations a few seconds apart, and the median over pairs is
the figure, with a distribution-free interval for it (:func:`median_interval`): a ratio whose
interval holds 1 has not been told apart from 1 by this many pairs. Both see the same inputs,
so their losses must be equal, and are checked.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import InvalidArgumentError
from ..torch.tensors import Observer, Tiering
from ..torch.tensors.train import Session
from .models import Workload
from .tensors import train_step

__all__ = ["Side", "paired", "median_interval", "PAIRS", "INTERVAL_LEVEL"]

#: Timed pairs per comparison (after the warm-up iterations).
PAIRS = 3
#: The coverage :func:`median_interval` aims for.
INTERVAL_LEVEL = 0.9


def median_interval(xs: list[float], level: float = INTERVAL_LEVEL) -> tuple[float, float, float]:
    """An interval for the median of the distribution ``xs`` were drawn from, assuming only
    that the draws are independent: the ``k``-th smallest and ``k``-th largest of ``xs``
    for the largest ``k`` whose coverage, ``1 - 2 P(Binomial(n, 1/2) < k)``, is at least
    ``level``; with too few draws for ``level``, the smallest and largest (``k = 1``).
    Returns ``(low, high, coverage)``."""
    n = len(xs)
    if n == 0:
        raise InvalidArgumentError("median_interval: no values")
    if not 0.0 < level < 1.0:
        raise InvalidArgumentError(f"median_interval: level must be in (0, 1), got {level}")
    ys = sorted(xs)

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return ys[k - 1], ys[n - k], coverage(k)


@dataclass
class Side:
    """One side of a pair: a variant with its fast and slow device sizes and what makes its
    observers (a plan's executor), called once for the side's
    :class:`~tiermem.torch.tensors.Tiering`."""

    variant: str
    fast: int
    slow: int
    observers: Callable[[], Sequence[Observer]] = tuple

    def start(self, w: Workload, slow_spec: str, seed: int) -> Session:
        t = Tiering({"dram": self.fast, slow_spec: self.slow}, self.variant, observers=self.observers())
        try:
            return train_step(w, seed).start(t)
        except BaseException:
            t.close()
            raise


def paired(w: Workload, a: Side, b: Side, slow_spec: str, pairs: int = PAIRS, warmup: int = 2, seed: int = 0) -> dict[str, Any]:
    """Train ``a`` and ``b`` in turn, ``warmup`` untimed iterations each and then ``pairs``
    timed pairs. ``ratios``: ``b``'s time over ``a``'s per pair; ``median``: their median;
    ``interval``: :func:`median_interval` of the ratios, ``[low, high]``, and its
    ``coverage``."""
    if pairs < 1 or warmup < 0:
        raise InvalidArgumentError(f"paired: pairs must be at least 1 and warmup at least 0, got {pairs}, {warmup}")
    ta = a.start(w, slow_spec, seed)
    try:
        tb = b.start(w, slow_spec, seed)
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
            lo, hi, cover = median_interval(ratios)
            return {
                "a": a.variant,
                "b": b.variant,
                "a_times": times[0],
                "b_times": times[1],
                "ratios": ratios,
                "median": statistics.median(ratios),
                "interval": [lo, hi],
                "coverage": cover,
                "max_loss_diff": max(abs(x - y) for x, y in zip(*losses, strict=True)),
            }
        finally:
            tb.close()
    finally:
        ta.close()
