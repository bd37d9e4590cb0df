"""Heap offsets for a plan (offline dynamic storage allocation), so that a plan that fits by
bytes also fits the fast heap, whatever its fragmentation.

A plan keeps a tensor on a fast device over *residencies*: runs of kernels from a use on the
device through every gap it is held there, to the use or tail that ends it (a persistent
tensor held across the iteration boundary has one residency wrapping round the step). A
residency occupies one span of the device's heap for all its kernels; two residencies whose
kernels meet cannot share bytes. :func:`assign` gives each residency an offset, largest
first, into the smallest gap that fits among the spans already placed that it meets
(greedy by size, as offline planners of inference memory do), or by best fit on the
skyline, whichever of :data:`LAYOUTS` is lowest, and reports the height: the highest
byte any span reaches. A plan whose height exceeds the device is planned again below it
(:func:`tiermem.plan.fit.fit`, the thesis's iterative limit reduction, with the heap
simulated instead of run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._tiermem import MEMORY_ALIGN
from .graph import Graph
from .plan import Moves, Overlap, gaps, moves

__all__ = ["MEMORY_ALIGN", "LAYOUTS", "skyline", "Residency", "residencies", "assign", "Offsets"]


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


def residencies(g: Graph, at_use: list[list[int]], held: list[list[bool]], overlap: Overlap | None = None) -> list[Residency]:
    """Every residency of the plan ``(at_use, held)`` on a fast device; with ``overlap``, a
    residency also covers the kernel its asynchronous prefetch or write home overlaps."""
    home = g.home
    out: list[Residency] = []
    extra = _overlapped(g, moves(g, at_use, held, overlap)) if overlap is not None else {}
    for t, us in enumerate(g.uses):
        at = at_use[t]
        parent = list(range(len(us)))  # uses joined by held gaps share a root
        covered: dict[int, list[tuple[int, int]]] = {}
        for j, k in extra.get(t, ()):
            covered.setdefault(j, []).append((k, k))
        gl = gaps(g, t)
        for gi, (jb, ja, ranges) in enumerate(gl):
            d = at[jb]
            if not (held[t][gi] and d < home and (ja is None or at[ja] == d)):
                continue
            if ja is not None:
                parent[_root(parent, ja)] = _root(parent, jb)
            covered.setdefault(jb, []).extend((lo, hi - 1) for lo, hi in ranges if hi > lo)
        groups: dict[int, list[int]] = {}
        for j in range(len(us)):
            if at[j] < home:
                groups.setdefault(_root(parent, j), []).append(j)
        size = _rounded(g.tensors[t].bytes)
        for js in groups.values():
            spans = [(us[j][0], us[j][0]) for j in js]
            for j in js:
                spans.extend(covered.get(j, ()))
            out.append(Residency(t, at[js[0]], tuple(js), _merge(spans), size))
    return out


def _overlapped(g: Graph, mv: Moves) -> dict[int, list[tuple[int, int]]]:
    """Per tensor, ``(use, kernel)``: a kernel its asynchronous moves overlap, and the use
    whose residency it extends: a prefetch's, the use it fetches for; a write home's, the
    use before the kernel (the tensor's last use there)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for k, row in enumerate(mv.ahead):
        for t, _, j in row:
            out.setdefault(t, []).append((j, k))
    for k, ts in enumerate(mv.behind):
        for t in ts:
            j = max(i for i, (u, _) in enumerate(g.uses[t]) if u < k)
            out.setdefault(t, []).append((j, k))
    return out


def _root(parent: list[int], j: int) -> int:
    while parent[j] != j:
        parent[j] = parent[parent[j]]
        j = parent[j]
    return j


def _merge(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    spans.sort()
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((a, b) for a, b in merged)


def assign(g: Graph, at_use: list[list[int]], held: list[list[bool]], overlap: Overlap | None = None) -> Offsets:
    """Offsets for every residency of the plan, per fast device: the lowest of the layouts
    in :data:`LAYOUTS`. A residency that would reach past its device's capacity gets none
    (the executor then lets the heap choose)."""
    res = residencies(g, at_use, held, overlap)
    offsets: list[list[int | None]] = [[None] * len(us) for us in g.uses]
    height = [0] * g.home
    n = len(g.kernels)
    for d in range(g.home):
        cap = g.devices[d].capacity
        mine = [r for r in res if r.device == d]
        if not mine:
            continue
        offs, height[d] = min((lay(mine, n) for lay in LAYOUTS.values()), key=lambda x: x[1])
        for r, off in zip(mine, offs, strict=True):
            if cap is None or off + r.bytes <= cap:
                for j in r.uses:
                    offsets[r.tensor][j] = off
    return Offsets(offsets, height)


def _lifetime(r: Residency) -> int:
    return sum(hi - lo + 1 for lo, hi in r.spans)


def skyline(rs: list[Residency], n: int) -> tuple[list[int], int]:
    """Best fit on the skyline (as for strip packing, and as profile-guided planners of
    training memory do): residencies spanning the iteration boundary are stacked first;
    then, repeatedly, the lowest stretch of kernels of the skyline (the top of what is placed,
    per kernel) takes the largest residency that lives within it (ties: the longest lived),
    or, when none does, rises to its lower neighbour. Returns offsets (in ``rs``'s order) and
    the height."""
    offs = [0] * len(rs)
    sky = np.zeros(n, dtype=np.int64)
    for i in sorted((i for i, r in enumerate(rs) if len(r.spans) > 1), key=lambda i: -rs[i].bytes):
        base = max(int(sky[lo : hi + 1].max()) for lo, hi in rs[i].spans)
        offs[i] = base
        for lo, hi in rs[i].spans:
            sky[lo : hi + 1] = base + rs[i].bytes
    single = [i for i, r in enumerate(rs) if len(r.spans) == 1]
    lo_of = np.array([rs[i].spans[0][0] for i in single], dtype=np.int64)
    hi_of = np.array([rs[i].spans[0][1] for i in single], dtype=np.int64)
    size = np.array([rs[i].bytes for i in single], dtype=np.int64)
    life = hi_of - lo_of + 1
    left = np.ones(len(single), dtype=bool)
    while left.any():
        k = int(sky.argmin())
        h = int(sky[k])
        a, b = k, k
        while a > 0 and sky[a - 1] == h:
            a -= 1
        while b < n - 1 and sky[b + 1] == h:
            b += 1
        fits = np.flatnonzero(left & (lo_of >= a) & (hi_of <= b))
        if len(fits):
            j = int(fits[np.lexsort((-life[fits], -size[fits]))[0]])
            offs[single[j]] = h
            sky[lo_of[j] : hi_of[j] + 1] = h + size[j]
            left[j] = False
        else:
            sides = [int(sky[a - 1])] if a > 0 else []
            sides += [int(sky[b + 1])] if b < n - 1 else []
            sky[a : b + 1] = min(sides)
    return offs, int(sky.max(initial=0))


def _greedy(order: Callable[[Residency], tuple[int, int]]) -> Callable[[list[Residency], int], tuple[list[int], int]]:
    return lambda rs, n: _layout(rs, order)


#: The layouts tried (the lowest is kept): best fit on the skyline, and placing one by one
#: into the smallest gap free for a residency's whole life, largest first (ties: earliest
#: first, which lays equal sizes out optimally, as colouring an interval graph in order of
#: start does; or longest lived first), largest area (bytes times kernels) first, and in
#: time order (as a heap allocating on the fly would).
LAYOUTS: dict[str, Callable[[list[Residency], int], tuple[list[int], int]]] = {
    "skyline": skyline,
    "size": _greedy(lambda r: (-r.bytes, r.spans[0][0])),
    "size-life": _greedy(lambda r: (-r.bytes, -_lifetime(r))),
    "area": _greedy(lambda r: (-r.bytes * _lifetime(r), -r.bytes)),
    "time": _greedy(lambda r: (r.spans[0][0], -r.bytes)),
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
