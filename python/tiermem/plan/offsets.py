"""Heap offsets for a plan (offline dynamic storage allocation), so that a plan that fits by
bytes also fits the fast heap, whatever its fragmentation.

A plan keeps a tensor on a fast device over *residencies*: runs of kernels from a use on the
device through every gap it is held there, to the use or tail that ends it (a persistent
tensor held across the iteration boundary has one residency wrapping round the step). A
residency occupies one span of the device's heap for all its kernels; two residencies whose
kernels meet cannot share bytes. :func:`assign` gives each residency an offset, largest
first (or in the other :data:`ORDERS`, keeping the lowest layout), into the smallest gap
that fits among the spans already placed that it meets (greedy by size, as offline planners
of inference memory do), and reports the height: the highest
byte any span reaches. A plan whose height exceeds the device is planned again below it
(:func:`tiermem.plan.solve.fit`, the thesis's iterative limit reduction, with the heap
simulated instead of run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._tiermem import MEMORY_ALIGN
from .graph import Graph
from .plan import gaps

__all__ = ["MEMORY_ALIGN", "ORDERS", "Residency", "residencies", "assign", "Offsets"]


@dataclass(frozen=True)
class Residency:
    tensor: int
    device: int
    uses: tuple[int, ...]  # the tensor's use indices it covers
    spans: tuple[tuple[int, int], ...]  # kernel ranges [lo, hi] (inclusive) it occupies
    bytes: int  # rounded to the heap's alignment


@dataclass
class Offsets:
    """Each use's heap offset (``None`` at home, or where no offset fits), and per fast
    device the height the offsets reach."""

    at_use: list[list[int | None]]
    height: list[int]


def _rounded(n: int) -> int:
    return -(-n // MEMORY_ALIGN) * MEMORY_ALIGN


def residencies(g: Graph, at_use: list[list[int]], held: list[list[bool]]) -> list[Residency]:
    """Every residency of the plan ``(at_use, held)`` on a fast device."""
    home = g.home
    out: list[Residency] = []
    for t, us in enumerate(g.uses):
        at = at_use[t]
        parent = list(range(len(us)))

        def root(j: int) -> int:
            while parent[j] != j:
                parent[j] = parent[parent[j]]
                j = parent[j]
            return j

        covered: dict[int, list[tuple[int, int]]] = {}
        gl = gaps(g, t)
        for gi, (jb, ja, ranges) in enumerate(gl):
            d = at[jb]
            if not (held[t][gi] and d < home and (ja is None or at[ja] == d)):
                continue
            if ja is not None:
                parent[root(ja)] = root(jb)
            covered.setdefault(jb, []).extend((lo, hi - 1) for lo, hi in ranges if hi > lo)
        groups: dict[int, list[int]] = {}
        for j in range(len(us)):
            if at[j] < home:
                groups.setdefault(root(j), []).append(j)
        size = _rounded(g.tensors[t].bytes)
        for js in groups.values():
            spans = [(us[j][0], us[j][0]) for j in js]
            for j in js:
                spans.extend(covered.get(j, ()))
            out.append(Residency(t, at[js[0]], tuple(js), _merge(spans), size))
    return out


def _merge(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    spans.sort()
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((a, b) for a, b in merged)


def assign(g: Graph, at_use: list[list[int]], held: list[list[bool]]) -> Offsets:
    """Offsets for every residency of the plan, per fast device: the lowest of the layouts
    in :data:`ORDERS`. A residency that would reach past its device's capacity gets none
    (the executor then lets the heap choose)."""
    res = residencies(g, at_use, held)
    offsets: list[list[int | None]] = [[None] * len(us) for us in g.uses]
    height = [0] * g.home
    for d in range(g.home):
        cap = g.devices[d].capacity
        mine = [r for r in res if r.device == d]
        if not mine:
            continue
        offs, height[d] = min((_layout(mine, order) for order in ORDERS.values()), key=lambda x: x[1])
        for r, off in zip(mine, offs, strict=True):
            if cap is None or off + r.bytes <= cap:
                for j in r.uses:
                    offsets[r.tensor][j] = off
    return Offsets(offsets, height)


def _lifetime(r: Residency) -> int:
    return sum(hi - lo + 1 for lo, hi in r.spans)


#: The orders the layout tries (the lowest is kept): largest first (ties: longest lived
#: first), largest area (bytes times kernels) first, and in time order (as a heap
#: allocating on the fly would, but into the smallest gap that is free for a whole life).
ORDERS: dict[str, Callable[[Residency], tuple[int, int]]] = {
    "size": lambda r: (-r.bytes, -_lifetime(r)),
    "area": lambda r: (-r.bytes * _lifetime(r), -r.bytes),
    "time": lambda r: (r.spans[0][0], -r.bytes),
}


def _layout(rs: list[Residency], order: Callable[[Residency], tuple[int, int]]) -> tuple[list[int], int]:
    """Offsets of ``rs`` (in their order) placed in ``order``, each into the smallest gap
    that fits among the spans already placed that meet it in time; and the height."""
    lo_of: list[int] = []  # per placed span: first kernel, last kernel, owner
    hi_of: list[int] = []
    owner_of: list[int] = []
    offs = [0] * len(rs)
    top = 0
    for i in sorted(range(len(rs)), key=lambda i: order(rs[i])):
        r = rs[i]
        owners: list[int] = []
        if lo_of:
            lo = np.asarray(lo_of)
            hi = np.asarray(hi_of)
            meets = np.zeros(len(lo), dtype=bool)
            for a, b in r.spans:
                meets |= (lo <= b) & (a <= hi)
            owners = np.unique(np.asarray(owner_of)[meets]).tolist()
        off = _best_gap(sorted((offs[o], offs[o] + rs[o].bytes) for o in owners), r.bytes)
        offs[i] = off
        for a, b in r.spans:
            lo_of.append(a)
            hi_of.append(b)
            owner_of.append(i)
        top = max(top, off + r.bytes)
    return offs, top


def _best_gap(taken: list[tuple[int, int]], size: int) -> int:
    """The start of the smallest free gap of at least ``size`` bytes between the ``taken``
    spans (sorted by start; they may overlap one another), or the top of them all."""
    best: tuple[int, int] | None = None  # (gap size, offset)
    end = 0
    for a, b in taken:
        if a - end >= size and (best is None or a - end < best[0]):
            best = (a - end, end)
        end = max(end, b)
    return best[1] if best is not None else end
