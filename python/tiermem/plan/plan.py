"""A plan: where every tensor is at each of its uses and whether it stays in a fast device
between two uses, and what that costs (:func:`evaluate`, the one cost model the solver, the
greedy pass and the tests share).

The model (synchronous moves, thesis §3.5): tensor *t* is used by kernels ``u_0 < u_1 <
...``; at each use it is on one device, and between uses *j* and *j+1* (its *gap* *j*) it is
either **held** in the fast device it was on at both ends, or at home (the slowest device).
A tensor at home before a use on a fast device is **prefetched** (a copy home → fast before
the kernel); one leaving a fast device is **evicted** after the kernel, which writes it home
only if it was written there since its last copy home (a clean home copy stays valid, as the
manager keeps it linked). Persistent tensors have one more gap, from their last use round to
their first (the iteration boundary); a tensor that outlives its last use (a gradient freed
by ``zero_grad``) has a tail gap up to ``free_after``. Memory at each kernel and fast device:
the bytes of tensors used there on it plus those held there across it.

Asynchronous moves (thesis §3.7; the ``async`` formulation, :class:`Overlap`): a prefetch may
instead be issued one kernel early, on a copy thread, overlapping the last kernel of its gap
(the tensor occupies its fast device during that kernel too); a write home may start after
the writing use and overlap the first later kernel that does not use the tensor (held there
until then; it stays there during that kernel, and its eviction, now of a clean copy, waits
for the copy). A kernel with copies overlapping it takes the longer of its own time and
theirs, and at least its own time plus the graph's ``copy_contention`` share of theirs (the
cores the copies take from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import write_json_atomic
from .graph import Graph, GraphError, read_json

__all__ = [
    "Plan",
    "PLAN_FORMAT",
    "Cost",
    "Overlap",
    "Moves",
    "gaps",
    "ahead_kernel",
    "behind_kernel",
    "evaluate",
    "moves",
    "at_home",
    "recorded",
]

PLAN_FORMAT = "tiermem-plan-1"


def gaps(g: Graph, t: int) -> list[tuple[int, int | None, list[tuple[int, int]]]]:
    """Tensor ``t``'s gaps: ``(use before, use after or None for a tail, kernel ranges
    [lo, hi) strictly between)``."""
    us = [k for k, _ in g.uses[t]]
    n = len(g.kernels)
    out: list[tuple[int, int | None, list[tuple[int, int]]]] = []
    for j in range(len(us) - 1):
        out.append((j, j + 1, [(us[j] + 1, us[j + 1])]))
    ten = g.tensors[t]
    if ten.persistent:
        out.append((len(us) - 1, 0, [(us[-1] + 1, n), (0, us[0])]))
    elif ten.free_after is not None and ten.free_after > us[-1]:
        out.append((len(us) - 1, None, [(us[-1] + 1, min(n, ten.free_after + 1))]))
    return out


def _segments(g: Graph, t: int) -> list[tuple[int, list[int]]]:
    """Write segments: ``(write use, gaps after it up to the next write)``; a tensor
    evicted from a fast device within a segment it was written in there is written home
    once."""
    uses = g.uses[t]
    writes = [j for j, (_, u) in enumerate(uses) if u != "read"]
    gl = gaps(g, t)
    by_before = {gb: i for i, (gb, _, _) in enumerate(gl)}
    out = []
    m = len(uses)
    for w in writes:
        seg, j = [], w
        while True:
            gi = by_before.get(j)
            if gi is None:
                break
            seg.append(gi)
            nxt = gl[gi][1]
            if nxt is None or uses[nxt][1] != "read" or nxt == w:
                break
            j = nxt
            if len(seg) > m:
                break
        out.append((w, seg))
    return out


def ahead_kernel(gap: tuple[int, int | None, list[tuple[int, int]]]) -> int | None:
    """The kernel an asynchronous prefetch across this gap overlaps: the gap's last kernel
    (None for a gap with no kernel, a tail, or the iteration boundary, where the tensor's
    object is not known yet)."""
    _, ja, ranges = gap
    if ja is None or ja == 0:
        return None
    lo, hi = ranges[-1]
    return hi - 1 if hi > lo else None


def behind_kernel(gl: list[tuple[int, int | None, list[tuple[int, int]]]], seg: list[int]) -> tuple[int, int] | None:
    """Where a write home behind, of a write segment with gaps ``seg``, can run: ``(i,
    kernel)``, the first kernel of the segment's first gap ``seg[i]`` with one in this
    iteration (the gaps before it have none: the tensor's next uses follow at once, and it
    must be held across them). None if no gap of the segment has a kernel."""
    for i, gi in enumerate(seg):
        lo, hi = gl[gi][2][0]
        if hi > lo:
            return i, lo
    return None


@dataclass
class Overlap:
    """A plan's asynchronous moves: per tensor and gap, whether its prefetch runs ahead,
    overlapping :func:`ahead_kernel`; per tensor and write segment (in the order of
    ``_segments``), whether its write home runs behind, overlapping :func:`behind_kernel`
    (which needs the segment's gaps before it held). A flag where there is no such kernel,
    or no move, is ignored."""

    ahead: list[list[bool]]
    behind: list[list[bool]]

    @classmethod
    def none(cls, g: Graph) -> Overlap:
        return cls(
            [[False] * len(gaps(g, t)) for t in range(len(g.tensors))],
            [[False] * len(_segments(g, t)) for t in range(len(g.tensors))],
        )


def _behind(
    gl: list[tuple[int, int | None, list[tuple[int, int]]]], seg: list[int], hl: list[bool], at: list[int], d: int
) -> tuple[int, int] | None:
    """:func:`behind_kernel` if the plan holds the tensor on ``d`` across the segment's gaps
    before it, else None (the write home is then synchronous)."""
    bk = behind_kernel(gl, seg)
    if bk is None or not all(_held(hl[gi], at, gl[gi][0], gl[gi][1], d) for gi in seg[: bk[0]]):
        return None
    return bk


def _held(h: bool, at: list[int], jb: int, ja: int | None, d: int) -> bool:
    """Whether a gap is held on fast device ``d`` (it must be there at both ends)."""
    return h and at[jb] == d and (ja is None or at[ja] == d)


@dataclass
class Cost:
    seconds: float  # predicted step time
    kernel_seconds: float
    move_seconds: float
    prefetched_bytes: int
    written_home_bytes: int
    peak: list[int]  # peak bytes per fast device
    overflow: str | None  # the first kernel and device over capacity, or None
    # Per tensor: (bytes prefetched, bytes written home) per step.
    moved: list[tuple[int, int]] = field(default_factory=list)
    overlapped_seconds: float = 0.0  # copy time of asynchronous moves, hidden or not
    stall_seconds: float = 0.0  # of which not hidden by the kernels they overlap (or taken from them)


def evaluate(g: Graph, at_use: list[list[int]], held: list[list[bool]], overlap: Overlap | None = None) -> Cost:
    """The cost of a plan (with ``overlap``: its asynchronous moves), and whether it fits."""
    home = g.home
    nf = home
    n = len(g.kernels)
    usage = [[0] * (n + 1) for _ in range(nf)]
    places = [[home] * len(k.operands) for k in g.kernels]  # each operand's device at its kernel
    busy = [0.0] * n  # copy seconds overlapping each kernel
    mv = 0.0
    pre = wr = 0
    op_of: dict[tuple[int, int], int] = {}  # (kernel, tensor) -> operand index
    for k, ker in enumerate(g.kernels):
        for i, o in enumerate(ker.operands):
            op_of[(k, o.tensor)] = i

    def occupy(d: int, lo: int, hi: int, b: int) -> None:
        usage[d][lo] += b
        usage[d][hi] -= b

    moved = []
    for t, us in enumerate(g.uses):
        b = g.tensors[t].bytes
        at = at_use[t]
        pre_t = wr_t = 0
        if len(at) != len(us):
            raise GraphError(f"plan: tensor {g.tensors[t].key!r} has {len(at)} placements for {len(us)} uses")
        for j, (k, _) in enumerate(us):
            d = at[j]
            places[k][op_of[(k, t)]] = d
            if d < home:
                occupy(d, k, k + 1, b)
        gl = gaps(g, t)
        hl = held[t]
        for gi, (jb, ja, ranges) in enumerate(gl):
            d = at[jb]
            h = hl[gi] and d < home and (ja is None or at[ja] == d)
            if h:
                for lo, hi in ranges:
                    occupy(d, lo, hi, b)
            if ja is not None and at[ja] < home and not h and not (ja == 0 and not g.tensors[t].persistent):
                c = g.copy_seconds(b, home, at[ja])
                ka = ahead_kernel(gl[gi]) if overlap is not None and overlap.ahead[t][gi] else None
                if ka is None:
                    mv += c
                else:
                    busy[ka] += c
                    occupy(at[ja], ka, ka + 1, b)
                pre_t += b
        for si, (w, seg) in enumerate(_segments(g, t)):
            d = at[w]
            if d < home and any(not _held(hl[gi], at, gl[gi][0], gl[gi][1], d) for gi in seg):
                c = g.copy_seconds(b, d, home)
                bk = _behind(gl, seg, hl, at, d) if overlap is not None and overlap.behind[t][si] else None
                if bk is None:
                    mv += c
                else:
                    busy[bk[1]] += c
                    gap = gl[seg[bk[0]]]
                    if not _held(hl[seg[bk[0]]], at, gap[0], gap[1], d):
                        occupy(d, bk[1], bk[1] + 1, b)
                wr_t += b
        pre += pre_t
        wr += wr_t
        moved.append((pre_t, wr_t))
    kt = [g.kernel_seconds(k, places[k]) for k in range(n)]  # each kernel's time with its operands as placed
    ks = g.overhead_seconds + sum(kt)
    share = g.copy_contention
    stall = sum(max(0.0, a - k, share * a) for a, k in zip(busy, kt, strict=True))
    mv += stall
    peak, overflow = [], None
    for d in range(nf):
        run, best = 0, 0
        cap = g.devices[d].capacity
        for k in range(n):
            run += usage[d][k]
            best = max(best, run)
            if overflow is None and cap is not None and run > cap:
                overflow = f"kernel {k} ({g.kernels[k].name}): {run} bytes on {g.devices[d].name} (capacity {cap})"
        peak.append(best)
    return Cost(ks + mv, ks, mv, pre, wr, peak, overflow, moved, sum(busy), stall)


@dataclass
class Moves:
    """What the executor does, per kernel: ``before``, ``(tensor, device)`` prefetched before
    it; ``after``, tensors evicted after it; ``ahead``, ``(tensor, device, use)`` prefetched
    on the copy thread while it runs, to be there for that use; ``behind``, tensors written
    home on the copy thread while it runs; ``wait``, tensors whose copy must have finished
    before it runs (an eviction also waits for its tensor's copy)."""

    before: list[list[tuple[int, int]]]
    after: list[list[int]]
    ahead: list[list[tuple[int, int, int]]]
    behind: list[list[int]]
    wait: list[set[int]]


def moves(g: Graph, at_use: list[list[int]], held: list[list[bool]], overlap: Overlap | None = None) -> Moves:
    """The moves of a plan, kernel by kernel."""
    n = len(g.kernels)
    home = g.home
    m = Moves(
        [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)], [set() for _ in range(n)]
    )
    for t, us in enumerate(g.uses):
        at = at_use[t]
        gl = gaps(g, t)
        late: dict[int, int] = {}  # gap -> the kernel after which its eviction waits (write-behind)
        for si, (w, seg) in enumerate(_segments(g, t)):
            d = at[w]
            if overlap is None or not overlap.behind[t][si] or d >= home:
                continue
            if any(not _held(held[t][gi], at, gl[gi][0], gl[gi][1], d) for gi in seg):
                bk = _behind(gl, seg, held[t], at, d)
                if bk is not None:
                    m.behind[bk[1]].append(t)
                    late[seg[bk[0]]] = bk[1]
        for gi, (jb, ja, _) in enumerate(gl):
            d = at[jb]
            h = held[t][gi] and d < home and (ja is None or at[ja] == d)
            if d < home and not h:
                m.after[late.get(gi, us[jb][0])].append(t)
            if ja is not None and at[ja] < home and not h and not (ja == 0 and not g.tensors[t].persistent):
                ka = ahead_kernel(gl[gi]) if overlap is not None and overlap.ahead[t][gi] else None
                if ka is None:
                    m.before[us[ja][0]].append((t, at[ja]))
                else:
                    m.ahead[ka].append((t, at[ja], ja))
                    m.wait[us[ja][0]].add(t)
    return m


@dataclass
class Plan:
    """Where each tensor is at each use (device index per use) and whether it is held in
    fast memory across each gap; with the solver's account of it."""

    graph: str
    formulation: str
    devices: list[str]
    keys: list[str]
    at_use: list[list[int]]
    held: list[list[bool]]
    predicted_seconds: float
    source: str  # "highs", "greedy" (the heuristic), or "greedy (fallback: ...)"
    gap: float | None = None  # certified relative gap to the best bound, when solved
    bound_seconds: float | None = None
    solve_seconds: float = 0.0
    first_plan_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # Each use's heap offset on its fast device (None at home, or where the heap chooses);
    # None for a plan without offsets (see tiermem.plan.offsets).
    offsets: list[list[int | None]] | None = None
    # Its asynchronous moves (the async formulation); None: every move synchronous.
    overlap: Overlap | None = None

    def check_graph(self, g: Graph) -> None:
        """Refuses a plan made for another graph (different tensors)."""
        if self.keys != [t.key for t in g.tensors]:
            raise GraphError(f"plan for graph {self.graph!r} does not match graph {g.name!r} (different tensors)")

    def check(self, g: Graph) -> Cost:
        """The plan's cost on ``g``; refuses a plan made for another graph or that overflows."""
        self.check_graph(g)
        if self.overlap is not None:
            _check_overlap(g, self.overlap)
        c = evaluate(g, self.at_use, self.held, self.overlap)
        if c.overflow:
            raise GraphError(f"plan overflows: {c.overflow}")
        if self.offsets is not None:
            _check_offsets(g, self)
        return c

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "graph": self.graph,
            "formulation": self.formulation,
            "devices": self.devices,
            "source": self.source,
            "predicted_seconds": self.predicted_seconds,
            "gap": self.gap,
            "bound_seconds": self.bound_seconds,
            "solve_seconds": self.solve_seconds,
            "first_plan_seconds": self.first_plan_seconds,
            "notes": self.notes,
            "tensors": [
                {"key": k, "at_use": a, "held": [int(h) for h in hs]}
                | ({} if self.offsets is None else {"offsets": self.offsets[i]})
                | (
                    {}
                    if self.overlap is None
                    else {"ahead": [int(x) for x in self.overlap.ahead[i]], "behind": [int(x) for x in self.overlap.behind[i]]}
                )
                for i, (k, a, hs) in enumerate(zip(self.keys, self.at_use, self.held, strict=True))
            ],
        }

    @classmethod
    def from_json(cls, doc: Any, source: str = "plan") -> Plan:
        try:
            if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
                raise GraphError(f"{source}: not a tiermem plan (expected format {PLAN_FORMAT!r})")
            ts = doc["tensors"]
            return cls(
                str(doc["graph"]),
                str(doc["formulation"]),
                [str(d) for d in doc["devices"]],
                [str(t["key"]) for t in ts],
                [[int(d) for d in t["at_use"]] for t in ts],
                [[bool(h) for h in t["held"]] for t in ts],
                float(doc["predicted_seconds"]),
                str(doc["source"]),
                None if doc.get("gap") is None else float(doc["gap"]),
                None if doc.get("bound_seconds") is None else float(doc["bound_seconds"]),
                float(doc.get("solve_seconds", 0.0)),
                float(doc.get("first_plan_seconds", 0.0)),
                [str(n) for n in doc.get("notes", [])],
                _offsets(ts),
                _overlap(ts),
            )
        except GraphError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise GraphError(f"{source}: malformed plan ({type(e).__name__}: {e})") from None

    def save(self, path: str | Path) -> None:
        write_json_atomic(str(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_json(read_json(path, "plan"), str(path))


def at_home(g: Graph) -> Plan:
    """The plan that keeps every tensor at home and moves nothing (what a capture's all-slow
    run follows, so that its step includes the executor's own work)."""
    at = [[g.home] * len(us) for us in g.uses]
    held = [[False] * len(gaps(g, t)) for t in range(len(g.tensors))]
    c = evaluate(g, at, held)
    return Plan(g.name, "static", [d.name for d in g.devices], [t.key for t in g.tensors], at, held, c.seconds, "at home")


def recorded(g: Graph, places: list[list[int]], source: str) -> tuple[Plan, Cost]:
    """What a runtime policy did, as a plan: ``places[k]`` is the device index of each of
    kernel ``k``'s operands, in order, as the policy ran it (``Recorder(places=True)``). A
    tensor is held across a gap when it is on the same fast device at both ends, and moves
    where the placements of its uses change; the plan is priced by the same model as the
    solver's plans (:func:`evaluate`). Returns the plan (``source`` names the policy) and its
    cost, which says whether it overflows the fast device: a policy that makes room as it
    goes may hold more at some kernel than the model's account of the same placements."""
    if len(places) != len(g.kernels):
        raise GraphError(f"recorded placements: {len(places)} kernels, the graph has {len(g.kernels)}")
    nd = len(g.devices)
    at: list[list[int | None]] = [[None] * len(us) for us in g.uses]
    use_of = [{k: j for j, (k, _) in enumerate(us)} for us in g.uses]
    for k, (ker, pl) in enumerate(zip(g.kernels, places, strict=True)):
        if len(pl) != len(ker.operands):
            raise GraphError(
                f"recorded placements: kernel {k} ({ker.name}) has {len(pl)} operands, the graph {len(ker.operands)}"
            )
        for o, d in zip(ker.operands, pl, strict=True):
            if not 0 <= d < nd:
                raise GraphError(f"recorded placements: kernel {k} ({ker.name}) has an operand on device {d} of {nd}")
            at[o.tensor][use_of[o.tensor][k]] = d
    at_use = [[g.home if d is None else d for d in ds] for ds in at]
    held = [
        [at_use[t][jb] < g.home and (ja is None or at_use[t][ja] == at_use[t][jb]) for jb, ja, _ in gaps(g, t)]
        for t in range(len(g.tensors))
    ]
    c = evaluate(g, at_use, held)
    names = [d.name for d in g.devices]
    plan = Plan(g.name, "sync", names, [t.key for t in g.tensors], at_use, held, c.seconds, source)
    if c.overflow:
        plan.notes.append(f"as the model accounts it, the policy's placements overflow: {c.overflow}")
    return plan, c


def _offsets(ts: list[Any]) -> list[list[int | None]] | None:
    if not ts or "offsets" not in ts[0]:
        return None
    return [[None if o is None else int(o) for o in t["offsets"]] for t in ts]


def _overlap(ts: list[Any]) -> Overlap | None:
    if not ts or "ahead" not in ts[0]:
        return None
    return Overlap([[bool(x) for x in t["ahead"]] for t in ts], [[bool(x) for x in t["behind"]] for t in ts])


def _check_overlap(g: Graph, ov: Overlap) -> None:
    """One flag per gap and per write segment of every tensor."""
    if len(ov.ahead) != len(g.tensors) or len(ov.behind) != len(g.tensors):
        raise GraphError(f"plan: asynchronous moves for {len(ov.ahead)} tensors, the graph has {len(g.tensors)}")
    for t, ten in enumerate(g.tensors):
        ng, ns = len(gaps(g, t)), len(_segments(g, t))
        if len(ov.ahead[t]) != ng or len(ov.behind[t]) != ns:
            raise GraphError(
                f"plan: tensor {ten.key!r} has {len(ov.ahead[t])} ahead and {len(ov.behind[t])} behind flags for "
                f"{ng} gaps and {ns} write segments"
            )


def _check_offsets(g: Graph, p: Plan) -> None:
    """Offsets name a use on a fast device each, inside its capacity."""
    assert p.offsets is not None
    if len(p.offsets) != len(p.at_use):
        raise GraphError(f"plan: offsets for {len(p.offsets)} tensors, placements for {len(p.at_use)}")
    for t, (offs, at) in enumerate(zip(p.offsets, p.at_use, strict=True)):
        if len(offs) != len(at):
            raise GraphError(f"plan: tensor {g.tensors[t].key!r} has {len(offs)} offsets for {len(at)} uses")
        for o, d in zip(offs, at, strict=True):
            if o is None:
                continue
            cap = g.devices[d].capacity
            if d == g.home or o < 0 or (cap is not None and o + g.tensors[t].bytes > cap):
                raise GraphError(
                    f"plan: tensor {g.tensors[t].key!r} has heap offset {o} on {g.devices[d].name} "
                    f"(capacity {cap}, {g.tensors[t].bytes} bytes)"
                )
