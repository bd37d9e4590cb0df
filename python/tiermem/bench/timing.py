"""Best-of timing shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def best(fns: Iterable[Callable[..., Any]]) -> float:
    """Run each call once, in order; the fastest time in seconds."""
    out = float("inf")
    for fn in fns:
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def best_pair(a: Sequence[Callable[..., Any]], b: Sequence[Callable[..., Any]]) -> tuple[float, float]:
    """Best times of two sets of calls run alternately (a0 b0 a1 b1 ...), so both see the
    same machine state."""
    ta, tb = float("inf"), float("inf")
    for fa, fb in zip(a, b):
        ta = min(ta, best([fa]))
        tb = min(tb, best([fb]))
    return ta, tb
