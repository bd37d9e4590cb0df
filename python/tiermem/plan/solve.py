"""Solving for a plan: a greedy pass that gives a plan in milliseconds, and integer programs
(HiGHS, through ``highspy``) that improve it and certify how far from optimal it is.

Formulations (``FORMULATIONS``), over any number of devices (the last is home):

* ``static``: one device per tensor for the whole step, nothing moves (AutoTM's static
  formulation, thesis §3.5.1): a binary per tensor and fast device.
* ``sync``: where each tensor is at each use and whether it is held in a fast device across
  each gap between uses, with synchronous prefetches and evictions (thesis §3.5.2). This is
  AutoTM's synchronous formulation reformulated on *uses and gaps* instead of on every
  (tensor, kernel) pair: a tensor's variables change only where it is used, so the model has
  one binary per use and per gap (and fast device) where AutoTM's has them per kernel the
  tensor is live across, and the move costs are exact linear terms (a prefetch is
  ``f[next use] - held``; a write home is charged once per write segment). Kernel times are
  separable per operand (the graph's profile), which removes AutoTM's configuration
  variables; on a duplex device, where a kernel takes the longer of its reads and its
  writes there, one continuous column per such kernel and device, at least each channel's
  sum, stands for it. Memory rows are the interval sums at each kernel.
* ``async``: ``sync`` plus, per prefetch, a binary that issues it one kernel early on a copy
  thread, overlapping the gap's last kernel, and per write segment one that starts its write
  home during the first later kernel that does not use the tensor (held until then; thesis
  §3.7, asynchronous movement). Either occupies the fast device during the kernel it overlaps. Per kernel with
  such candidates, a stall column takes what the overlapping copies exceed of the kernel's
  own (placement-dependent) time, and at least the graph's ``copy_contention`` share of
  their time (what the copy threads take from the kernel's cores).

Both start from the greedy plan, or from a cheaper incumbent the caller gives (a runtime
policy's recorded decisions, :func:`tiermem.plan.recorded`), handed to HiGHS as its incumbent
so a plan exists before the solver's first node; they stop at ``time_limit`` or the target
gap, and report the certified relative gap between the plan's time and HiGHS's bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..exceptions import InvalidArgumentError
from .graph import Graph, GraphError
from .offsets import assign
from .plan import Overlap, Plan, _behind, _held, _segments, ahead_kernel, behind_kernel, evaluate, gaps

__all__ = ["FORMULATIONS", "DEFAULT_FORMULATION", "greedy", "solve"]

FORMULATIONS = ("static", "sync", "async")
#: What ``solve``, ``fit`` and the commands use unless told: ``sync``. With the duplex cost
#: model, ``async`` plans predicted 2-3 % faster than ``sync`` ran slower beside them, iteration
#: by iteration at 8:1 (DenseNet 1.061x in 7 pairs out of 7, ResNet 1.029x): on two cores the
#: copy thread's CPU-driven copies take a core from PyTorch's two threads for more than the
#: measured ``copy_contention`` share, most on short kernels. ``async`` stays for machines whose
#: copies have cores or an engine of their own.
DEFAULT_FORMULATION = "sync"
#: HiGHS sees times in microseconds: kernel and move costs in seconds (1e-9 to 1e-1) sit at
#: its default tolerances (1e-7), which would let it stop at plans a tolerance from optimal.
OBJECTIVE_SCALE = 1e6


# --------------------------------------------------------------------------- greedy


class _Usage:
    """Bytes in use per fast device and kernel, with range queries (numpy)."""

    def __init__(self, g: Graph) -> None:
        self.n = len(g.kernels)
        self.cap = [d.capacity for d in g.devices[:-1]]
        self.u = np.zeros((len(self.cap), self.n), dtype=np.int64)

    def fits(self, d: int, ranges: list[tuple[int, int]], b: int) -> bool:
        cap = self.cap[d]
        assert cap is not None
        return all(hi <= lo or int(self.u[d, lo:hi].max()) + b <= cap for lo, hi in ranges)

    def add(self, d: int, ranges: list[tuple[int, int]], b: int) -> None:
        for lo, hi in ranges:
            self.u[d, lo:hi] += b


def _live_ranges(g: Graph, t: int) -> list[tuple[int, int]]:
    return [g.live_range(t)]


def _gain(g: Graph, t: int, d: int) -> list[float]:
    """Per use, the time saved by having tensor ``t`` on device ``d`` instead of home."""
    return [g.use_gain(k, t, d) for k, _ in g.uses[t]]


def greedy(g: Graph, formulation: str) -> tuple[list[list[int]], list[list[bool]]]:
    """A plan in one pass: tensors whole-step in fast devices by gain per byte-kernel, then
    (``sync``) single uses of the rest, prefetched and evicted around their kernel, by net
    gain per byte, wherever they fit."""
    home = g.home
    nf = home
    use = _Usage(g)
    at = [[home] * len(us) for us in g.uses]
    held = [[False] * len(gaps(g, t)) for t in range(len(g.tensors))]
    cand = []
    for t in range(len(g.tensors)):
        span = sum(hi - lo for lo, hi in _live_ranges(g, t))
        for d in range(nf):
            gain = sum(_gain(g, t, d))
            if gain > 0:
                cand.append((gain / (g.tensors[t].bytes * max(1, span)), t, d))
    cand.sort(reverse=True)
    placed = set()
    for _, t, d in cand:
        if t in placed:
            continue
        b = g.tensors[t].bytes
        rs = _live_ranges(g, t)
        if use.fits(d, rs, b):
            use.add(d, rs, b)
            placed.add(t)
            at[t] = [d] * len(at[t])
            held[t] = [True] * len(held[t])
    if formulation != "static":
        single = []
        for t in range(len(g.tensors)):
            if t in placed:
                continue
            b = g.tensors[t].bytes
            ten = g.tensors[t]
            for d in range(nf):
                for j, gain in enumerate(_gain(g, t, d)):
                    k, u = g.uses[t][j]
                    cost = 0.0 if (j == 0 and not ten.persistent) else g.copy_seconds(b, home, d)
                    if u != "read":
                        cost += g.copy_seconds(b, d, home)
                    if gain - cost > 0:
                        single.append(((gain - cost) / b, t, j, d))
        single.sort(reverse=True)
        done: set[tuple[int, int]] = set()
        for _, t, j, d in single:
            if (t, j) in done:
                continue
            k = g.uses[t][j][0]
            b = g.tensors[t].bytes
            if use.fits(d, [(k, k + 1)], b):
                use.add(d, [(k, k + 1)], b)
                at[t][j] = d
                done.add((t, j))
    return at, held


# --------------------------------------------------------------------------- MIP


class _Model:
    """Columns with their costs, bounds, integrality and entries; rows with bounds."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.integer: list[bool] = []
        self.entries: list[tuple[list[int], list[float]]] = []
        self.row_lo: list[float] = []
        self.row_hi: list[float] = []

    def col(self, cost: float, integer: bool, hi: float = 1.0) -> int:
        self.cost.append(cost)
        self.lo.append(0.0)
        self.hi.append(hi)
        self.integer.append(integer)
        self.entries.append(([], []))
        return len(self.cost) - 1

    def row(self, lo: float, hi: float) -> int:
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        return len(self.row_lo) - 1

    def put(self, c: int, r: int, v: float) -> None:
        self.entries[c][0].append(r)
        self.entries[c][1].append(v)

    def put_range(self, c: int, rows: np.ndarray, v: float) -> None:
        self.entries[c][0].extend(rows.tolist())
        self.entries[c][1].extend([v] * len(rows))

    def lp(self, scale: float = 1.0) -> Any:
        """The model for HiGHS, its objective multiplied by ``scale``."""
        import highspy

        lp = highspy.HighsLp()
        nc, nr = len(self.cost), len(self.row_lo)
        lp.num_col_, lp.num_row_ = nc, nr
        lp.col_cost_ = np.asarray(self.cost) * scale
        lp.col_lower_ = np.asarray(self.lo)
        lp.col_upper_ = np.asarray(self.hi)
        lp.row_lower_ = np.asarray(self.row_lo)
        lp.row_upper_ = np.asarray(self.row_hi)
        starts = np.zeros(nc + 1, dtype=np.int32)
        idx: list[int] = []
        val: list[float] = []
        for c, (rs, vs) in enumerate(self.entries):
            idx.extend(rs)
            val.extend(vs)
            starts[c + 1] = len(idx)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = nc, nr
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = np.asarray(idx, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(val, dtype=np.float64)
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in self.integer]
        return lp


class _Vars:
    """The columns of one formulation and how a plan maps onto them."""

    def __init__(self, g: Graph, formulation: str) -> None:
        self.g = g
        self.static = formulation == "static"
        self.overlap = formulation == "async"
        m = self.m = _Model()
        home = g.home
        nf = home
        n = len(g.kernels)
        cap = [d.capacity for d in g.devices[:nf]]
        scale = 1e-9  # byte rows in GB keep the matrix well scaled
        mem = [[m.row(-np.inf, float(cap[d] or 0) * scale) for d in range(nf)] for _ in range(n)]
        self.mem = mem
        self.const = g.overhead_seconds  # and each kernel's constant time (_kernel_times)
        self.f: list[list[list[int]]] = []  # per tensor, use, fast device: column
        self.h: list[list[list[int]]] = []  # per tensor, gap, fast device: column
        # async: per tensor, gap (prefetch ahead) or write segment (write behind), fast
        # device: column, or None where there is no kernel to overlap.
        self.a: list[list[list[int] | None]] = []
        self.w: list[list[list[int] | None]] = []
        # kernel -> (its overlap row, its contention row or None, stall column)
        self.stall: dict[int, tuple[int, int | None, int]] = {}
        if self.overlap:
            for k in self._overlap_kernels():
                # copies - stall - (kernel's time less its constant part) <= constant part
                # (the bound and the kernel's time terms are set by _kernel_times)
                r = m.row(-np.inf, 0.0)
                c = m.col(1.0, False, np.inf)
                m.put(c, r, -1.0)
                # share * copies - stall <= 0
                rc = m.row(-np.inf, 0.0) if g.copy_contention > 0 else None
                if rc is not None:
                    m.put(c, rc, -1.0)
                self.stall[k] = (r, rc, c)
        for t, us in enumerate(g.uses):
            b = g.tensors[t].bytes
            gl = gaps(g, t)
            ft: list[list[int]] = []
            if self.static:
                xs = []
                for d in range(nf):
                    c = m.col(0.0, True)
                    for lo, hi in _live_ranges(g, t):
                        m.put_range(c, np.asarray([mem[k][d] for k in range(lo, hi)]), b * scale)
                    xs.append(c)
                ft = [xs] * len(us)
                self.f.append(ft)
                self.h.append([xs] * len(gl))
                if nf > 1:
                    r = m.row(-np.inf, 1.0)
                    for c in xs:
                        m.put(c, r, 1.0)
                continue
            for k, _ in us:
                cs = []
                for d in range(nf):
                    c = m.col(0.0, True)
                    m.put(c, mem[k][d], b * scale)
                    cs.append(c)
                ft.append(cs)
                if nf > 1:
                    r = m.row(-np.inf, 1.0)
                    for c in cs:
                        m.put(c, r, 1.0)
            self.f.append(ft)
            ht: list[list[int]] = []
            at_: list[list[int] | None] = []
            for jb, ja, ranges in gl:
                cs = []
                for d in range(nf):
                    c = m.col(0.0, True)
                    for lo, hi in ranges:
                        if hi > lo:
                            m.put_range(c, np.asarray([mem[k][d] for k in range(lo, hi)]), b * scale)
                    # held <= at use before (and after)
                    for end in (jb, ja):
                        if end is None:
                            continue
                        r = m.row(-np.inf, 0.0)
                        m.put(c, r, 1.0)
                        m.put(ft[end][d], r, -1.0)
                    cs.append(c)
                ka = ahead_kernel((jb, ja, ranges)) if self.overlap else None
                acs: list[int] | None = [] if ka is not None else None
                for d, c in enumerate(cs):
                    if ja is not None and not (ja == 0 and not g.tensors[t].persistent):
                        # prefetch (+ prefetch ahead) >= f[ja] - held
                        cost = g.copy_seconds(b, home, d)
                        pc = m.col(cost, False)
                        r = m.row(0.0, np.inf)
                        m.put(pc, r, 1.0)
                        m.put(ft[ja][d], r, -1.0)
                        m.put(c, r, 1.0)
                        if acs is not None and ka is not None:
                            ac = m.col(0.0, True)
                            m.put(ac, r, 1.0)
                            m.put(ac, mem[ka][d], b * scale)
                            self._copy_during(ac, ka, cost)
                            acs.append(ac)
                at_.append(acs if acs else None)
                ht.append(cs)
            self.h.append(ht)
            self.a.append(at_)
            wt: list[list[int] | None] = []
            for w, seg in _segments(g, t):
                bk = behind_kernel(gl, seg) if self.overlap else None
                wcs: list[int] = []
                for d in range(nf):
                    if not seg:
                        continue
                    cost = g.copy_seconds(b, d, home)
                    yc = m.col(cost, False)
                    wc = None
                    if bk is not None:
                        i, kb = bk
                        wc = m.col(0.0, True)
                        self._copy_during(wc, kb, cost)
                        # held across the gaps before it: behind <= held[gap]
                        for gi in seg[:i]:
                            r = m.row(-np.inf, 0.0)
                            m.put(wc, r, 1.0)
                            m.put(self.h[t][gi][d], r, -1.0)
                        # the kernel it overlaps holds the tensor unless its gap does:
                        # occupied >= behind - held[its gap]
                        oc = m.col(0.0, False)
                        m.put(oc, mem[kb][d], b * scale)
                        r = m.row(0.0, np.inf)
                        m.put(oc, r, 1.0)
                        m.put(wc, r, -1.0)
                        m.put(self.h[t][seg[i]][d], r, 1.0)
                        wcs.append(wc)
                    for gi in seg:
                        # written home (+ written behind) >= f[w] - held[gi]
                        r = m.row(0.0, np.inf)
                        m.put(yc, r, 1.0)
                        if wc is not None:
                            m.put(wc, r, 1.0)
                        m.put(ft[w][d], r, -1.0)
                        m.put(self.h[t][gi][d], r, 1.0)
                wt.append(wcs if wcs else None)
            self.w.append(wt)
        self._kernel_times()

    def _kernel_times(self) -> None:
        """Each kernel's time in the objective (and in its stall row, if it has one): its
        base time, plus per device its operands' extra times there, summed into their
        placement columns' costs; or, on a duplex device where the kernel both reads and
        writes, a column ``z`` at least each channel's sum (the longer channel's time)."""
        g, m = self.g, self.m
        home = g.home
        use_at = [{k: j for j, (k, _) in enumerate(us)} for us in g.uses]
        for k, ker in enumerate(g.kernels):
            const = ker.seconds
            coef: dict[int, float] = {}  # column -> seconds it adds to the kernel's time
            cols = [self.f[o.tensor][use_at[o.tensor][k]] for o in ker.operands]  # per operand, per fast device
            zs = []
            for d in range(len(g.devices)):
                parts = [o.parts(d) for o in ker.operands]
                if g.devices[d].duplex and any(r for r, _ in parts) and any(w for _, w in parts):
                    z = m.col(1.0, False, np.inf)
                    zs.append(z)
                    for side in (0, 1):  # z >= this channel's parts of the operands on d
                        r = m.row(0.0, np.inf)
                        m.put(z, r, 1.0)
                        lo = 0.0
                        for cs, part in zip(cols, parts, strict=True):
                            v = part[side]
                            if not v:
                                continue
                            if d < home:
                                m.put(cs[d], r, -v)
                            else:  # on home: 1 - the operand's fast columns
                                lo += v
                                for c in cs:
                                    m.put(c, r, v)
                        m.row_lo[r] = lo
                    continue
                for cs, o in zip(cols, ker.operands, strict=True):
                    v = o.seconds[d]
                    if not v:
                        continue
                    if d < home:
                        coef[cs[d]] = coef.get(cs[d], 0.0) + v
                    else:
                        const += v
                        for c in cs:
                            coef[c] = coef.get(c, 0.0) - v
            self.const += const
            for c, v in coef.items():
                m.cost[c] += v
            if k in self.stall:
                r = self.stall[k][0]
                m.row_hi[r] = const
                for c, v in coef.items():
                    if v:
                        m.put(c, r, -v)
                for z in zs:
                    m.put(z, r, -1.0)

    def _copy_during(self, col: int, k: int, cost: float) -> None:
        """Column ``col`` (a binary) puts a copy of ``cost`` seconds beside kernel ``k``."""
        r, rc, _ = self.stall[k]
        self.m.put(col, r, cost)
        if rc is not None:
            self.m.put(col, rc, self.g.copy_contention * cost)

    def _overlap_kernels(self) -> set[int]:
        """Kernels an asynchronous move may overlap."""
        g = self.g
        out = set()
        for t in range(len(g.tensors)):
            gl = gaps(g, t)
            for gap in gl:
                ka = ahead_kernel(gap)
                if ka is not None:
                    out.add(ka)
            for _, seg in _segments(g, t):
                bk = behind_kernel(gl, seg)
                if bk is not None:
                    out.add(bk[1])
        return out

    def values(self, at: list[list[int]], held: list[list[bool]], overlap: Overlap | None = None) -> np.ndarray:
        """Column values of a plan (the warm start): its binaries, and each move column at
        the least value its rows allow (every row holding one has it with coefficient 1 and
        a lower bound of 0; a stall column, what its kernel's copies exceed of its time), so
        the start's objective is the plan's cost."""
        x = np.zeros(len(self.m.cost))
        g = self.g
        for t in range(len(g.tensors)):
            for j, d in enumerate(at[t]):
                if d < g.home:
                    x[self.f[t][j][d]] = 1.0
            gl = gaps(g, t)
            for gi, (jb, ja, _) in enumerate(gl):
                d = at[t][jb]
                h = held[t][gi] and d < g.home and (ja is None or at[t][ja] == d)
                if h:
                    x[self.h[t][gi][d]] = 1.0
                acs = self.a[t][gi] if self.overlap else None
                if acs is not None and overlap is not None and overlap.ahead[t][gi] and ja is not None:
                    if at[t][ja] < g.home and not h:
                        x[acs[at[t][ja]]] = 1.0
            for si, (w, seg) in enumerate(_segments(g, t)):
                wcs = self.w[t][si] if self.overlap else None
                d = at[t][w]
                if wcs is None or overlap is None or not overlap.behind[t][si] or d >= g.home:
                    continue
                if any(not _held(held[t][gi], at[t], gl[gi][0], gl[gi][1], d) for gi in seg):
                    if _behind(gl, seg, held[t], at[t], d) is not None:
                        x[wcs[d]] = 1.0
        stalls = {c for _, _, c in self.stall.values()}
        m = self.m
        activity = np.zeros(len(m.row_lo))
        for c, (rows, vals) in enumerate(m.entries):
            if m.integer[c] and x[c]:
                np.add.at(activity, rows, np.asarray(vals) * x[c])
        lo = np.asarray(m.row_lo)
        for c, (rows, _) in enumerate(m.entries):
            if not m.integer[c] and c not in stalls:
                need = [lo[r] - activity[r] for r in rows if np.isfinite(lo[r])]
                x[c] = max(0.0, float(max(need))) if need else 0.0
        for c, (rows, vals) in enumerate(m.entries):  # kernel-time columns enter the stall rows
            if not m.integer[c] and c not in stalls and x[c]:
                np.add.at(activity, rows, np.asarray(vals) * x[c])
        for r, rc, c in self.stall.values():
            x[c] = max(0.0, float(activity[r] - self.m.row_hi[r]), 0.0 if rc is None else float(activity[rc]))
        return x

    def plan_of(self, x: np.ndarray) -> tuple[list[list[int]], list[list[bool]], Overlap | None]:
        g = self.g
        at, held = [], []
        ov = Overlap.none(g) if self.overlap else None
        for t in range(len(g.tensors)):
            a = []
            for cs in self.f[t]:
                on = [d for d, c in enumerate(cs) if x[c] > 0.5]
                a.append(on[0] if on else g.home)
            at.append(a)
            hs = []
            for gi, (jb, ja, _) in enumerate(gaps(g, t)):
                d = a[jb]
                hs.append(d < g.home and x[self.h[t][gi][d]] > 0.5)
                acs = self.a[t][gi] if ov is not None else None
                if ov is not None and acs is not None and ja is not None and a[ja] < g.home:
                    ov.ahead[t][gi] = bool(x[acs[a[ja]]] > 0.5)
            held.append(hs)
            if ov is not None:
                for si, (w, _) in enumerate(_segments(g, t)):
                    wcs = self.w[t][si]
                    if wcs is not None and a[w] < g.home:
                        ov.behind[t][si] = bool(x[wcs[a[w]]] > 0.5)
        return at, held, ov


def solve(
    g: Graph,
    formulation: str = DEFAULT_FORMULATION,
    time_limit: float = 60.0,
    target_gap: float = 0.01,
    threads: int | None = None,
    on_progress: Callable[[float, float, float], None] | None = None,
    incumbents: Sequence[Plan] = (),
) -> Plan:
    """The best plan HiGHS finds within ``time_limit`` seconds (``time_limit=0``: the greedy
    plan alone), with heap offsets for its fast residencies (:func:`tiermem.plan.offsets.assign`;
    :func:`tiermem.plan.fit.fit` plans below the capacity when they do not all fit).
    ``on_progress(seconds, incumbent, bound)`` is called on each improvement. ``incumbents``:
    more starting plans (a runtime policy's own decisions, :func:`tiermem.plan.recorded`); the
    cheapest of them and the greedy plan that fits is HiGHS's warm start (with the ``sync`` and
    ``async`` formulations; a ``static`` plan cannot move, so they are not offered to it).
    Falls back to that starting plan, and says so in ``source``, when HiGHS has nothing better
    or is not installed. ``first_plan_seconds`` is the greedy placement's time (a plan the
    executor can run, the heap choosing where); ``solve_seconds`` includes the offsets'
    layouts."""
    plan = _solve(g, formulation, time_limit, target_gap, threads, on_progress, incumbents)
    if plan.source == "highs":  # the starting plan's offsets are laid out already
        t0 = time.perf_counter()
        plan.offsets = assign(g, plan.at_use, plan.held, plan.overlap).at_use
        plan.solve_seconds += time.perf_counter() - t0
    return plan


def _solve(
    g: Graph,
    formulation: str,
    time_limit: float,
    target_gap: float,
    threads: int | None,
    on_progress: Callable[[float, float, float], None] | None,
    incumbents: Sequence[Plan] = (),
) -> Plan:
    if formulation not in FORMULATIONS:
        raise InvalidArgumentError(f"formulation {formulation!r}: known are {', '.join(FORMULATIONS)}")
    if time_limit < 0:
        raise InvalidArgumentError(f"time limit must be >= 0 seconds, got {time_limit}")
    t0 = time.perf_counter()
    at, held = greedy(g, formulation)
    cost = evaluate(g, at, held)
    if cost.overflow:  # the greedy pass only places what fits
        raise GraphError(f"internal: greedy plan overflows ({cost.overflow})")
    first = time.perf_counter() - t0
    names = [d.name for d in g.devices]
    keys = [t.key for t in g.tensors]
    start = "greedy"
    for inc in incumbents if formulation != "static" else ():
        inc.check_graph(g)
        c = evaluate(g, inc.at_use, inc.held)
        if not c.overflow and c.seconds < cost.seconds:
            at, held, cost, start = inc.at_use, inc.held, c, inc.source
    plan = Plan(g.name, formulation, names, keys, at, held, cost.seconds, start, first_plan_seconds=first)
    if start != "greedy":
        plan.notes.append(f"started from {start}, cheaper than the greedy plan")
    note = g.budget_note()
    if note:
        plan.notes.append(note)
    t1 = time.perf_counter()
    plan.offsets = assign(g, at, held).at_use
    # HiGHS's plan is laid out too, within the time limit: keep time for it.
    layout = time.perf_counter() - t1
    if time_limit == 0:
        plan.solve_seconds = time.perf_counter() - t0
        return plan
    try:
        import highspy
    except ImportError:
        plan.source = f"{start} (fallback: highspy is not installed)"
        plan.solve_seconds = time.perf_counter() - t0
        return plan
    v = _Vars(g, formulation)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", float(target_gap))
    if threads:
        h.setOptionValue("threads", int(threads))
    h.passModel(v.m.lp(OBJECTIVE_SCALE))
    h.changeObjectiveOffset(v.const * OBJECTIVE_SCALE)
    sol = highspy.HighsSolution()
    sol.col_value = v.values(at, held).tolist()
    sol.value_valid = True
    h.setSolution(sol)
    # What is left once the model is in, less time for what follows HiGHS: reading its plan
    # back and laying it out (three times the greedy plan's layout: at 2,000 kernels HiGHS's
    # plan took 3.1 s to lay out against the greedy plan's 0.8 s), and HiGHS's own overrun
    # (a tenth of the limit: 1-3 s at 2,000 kernels, even with the interrupts below).
    left = time_limit - (time.perf_counter() - t0) - 3 * layout - 0.1 * time_limit
    h.setOptionValue("time_limit", float(max(0.1, left)))
    if on_progress is not None:

        def cb(e: Any) -> None:
            d = e.data_out
            on_progress(
                time.perf_counter() - t0,
                float(d.objective_function_value) / OBJECTIVE_SCALE,
                float(d.mip_dual_bound) / OBJECTIVE_SCALE,
            )

        h.cbMipImprovingSolution.subscribe(cb)
    # HiGHS checks its own limit only between phases and overran it by up to 3 s at 2,000
    # kernels; its interrupt callbacks come within LP solves too, so they hold the deadline.
    deadline = time.perf_counter() + max(0.1, left)

    def stop(e: Any) -> None:
        if time.perf_counter() > deadline:
            e.data_in.user_interrupt = True

    h.cbMipInterrupt.subscribe(stop)
    h.cbSimplexInterrupt.subscribe(stop)
    h.run()
    info = h.getInfo()
    solved = h.getSolution()
    plan.solve_seconds = time.perf_counter() - t0
    if not solved.value_valid:
        plan.source = (
            f"{start} (fallback: HiGHS found no plan within {time_limit:g} s: {h.modelStatusToString(h.getModelStatus())})"
        )
        return plan
    at2, held2, ov2 = v.plan_of(np.asarray(solved.col_value))
    c2 = evaluate(g, at2, held2, ov2)
    bound = float(info.mip_dual_bound) / OBJECTIVE_SCALE
    if c2.overflow or c2.seconds > cost.seconds * (1 + 1e-9):
        plan.source = f"{start} (fallback: HiGHS's plan was no better)"
        # What to look into: the formulation's objective for its plan against the cost model's.
        plan.notes.append(
            f"HiGHS's plan: objective {float(info.objective_function_value) / OBJECTIVE_SCALE:.6f} s, "
            f"cost model {c2.seconds:.6f} s" + (f", overflows at {c2.overflow}" if c2.overflow else "")
        )
        c2 = cost
    else:
        plan.at_use, plan.held, plan.predicted_seconds, plan.source = at2, held2, c2.seconds, "highs"
        plan.overlap = ov2
    if math.isfinite(bound):
        plan.bound_seconds = bound
        plan.gap = max(0.0, (c2.seconds - bound) / max(c2.seconds, 1e-12))
    else:  # stopped before the root relaxation gave a bound: no gap is certified
        plan.notes.append("HiGHS had no bound yet: the gap is not certified")
    plan.notes.append(f"HiGHS: {h.modelStatusToString(h.getModelStatus())}, {int(info.mip_node_count)} nodes")
    return plan
