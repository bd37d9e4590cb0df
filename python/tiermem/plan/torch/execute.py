"""A plan followed as a step runs (the planner's second end in PyTorch).

An :class:`Executor` is the :class:`~tiermem.torch.tensors.Observer` that places tensors
for a :class:`~tiermem.torch.tensors.Tiering` of variant ``planned``
(:func:`planned` builds one): each new tensor is made on the device the plan puts it on at
its first use, at the plan's heap offset when it has one (:mod:`tiermem.plan.offsets`);
before each kernel the plan's prefetches run, each to its offset (and a persistent tensor's
first use finds it where the plan wants it), after it the tensors whose gap the plan does
not hold are evicted. Both ride on the kernel's own two calls into the core (the moves
before it in ``op_open``, the evictions after it in ``op_close``), so a planned op crosses
twice like every other variant's. A plan's asynchronous moves (the ``async`` formulation)
go to a copy thread once the kernel they overlap has opened its operands: a prefetch ahead
lands before the kernel that uses it waits for it, and a write home behind cleans the
tensor, whose eviction after that kernel waits for it (and then copies nothing). A copy that
failed is done synchronously instead, and counted. The first iteration is not the planned
step (it makes the optimizer's state) and runs unplanned. A kernel or tensor size the plan
does not have (the step's trace changed: another batch shape, a data-dependent branch) is
detected at the first differing kernel: the rest of that iteration runs under the runtime
policy (first-touch: new tensors in fast memory while it has room, no planned moves), the
plan is tried again from the next iteration, and the first such change is told in one
:class:`PlanMismatchWarning` that says where and why; every later one is counted
(``mismatched_iterations``, ``runtime_kernels`` in the stats) and logged.
"""

from __future__ import annotations

import logging
import time
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ...exceptions import TiermemError
from ...manager import DeviceList
from ...policies import AUTO, FAST, SLOW
from ...torch.tensors.observer import Moves, Observer
from ...torch.tensors.tiering import Tiering
from ..graph import Graph
from ..plan import Plan, moves
from .record import Names

if TYPE_CHECKING:  # pragma: no cover
    from ...torch.tensors.tensor import TensorObject

__all__ = ["Executor", "PlanMismatchWarning", "planned"]

log = logging.getLogger(__name__)


class PlanMismatchWarning(UserWarning):
    """The step's trace left the plan's: the model ran an op, or made a tensor, the plan does
    not have at that position. Told once per executor."""


def planned(devices: DeviceList, graph: Graph, plan: Plan, threads: int | None = None) -> Tiering:
    """A :class:`~tiermem.torch.tensors.Tiering` of variant ``planned`` over ``devices``
    that follows ``plan`` (made for ``graph``)."""
    return Tiering(devices, "planned", threads=threads, observers=[Executor(graph, plan)])


class Executor(Observer):
    """Follows ``plan`` (made for ``graph``) on the tiering it watches, whose variant must be
    ``planned`` (see the module docs); its counts are the tiering's ``stats()["plan"]``."""

    name = "plan"

    def __init__(self, graph: Graph, plan: Plan) -> None:
        plan.check(graph)
        self.graph = graph
        self.plan = plan
        self.names = Names()
        self.index = {t.key: i for i, t in enumerate(graph.tensors)}
        self.use_at: list[dict[int, int]] = [{} for _ in graph.kernels]  # kernel -> tensor -> use index
        for t, us in enumerate(graph.uses):
            for j, (k, _) in enumerate(us):
                self.use_at[k][t] = j
        self.moves = moves(graph, plan.at_use, plan.held, plan.overlap)
        self.after = self.moves.after
        self.before_k = [{t for t, _ in b} for b in self.moves.before]
        n = len(graph.kernels)
        # Per kernel, the graph's tensor of each output it makes (by output index).
        self.made_t: list[dict[int, int]] = [{} for _ in range(n)]
        for pos in range(n):
            for k in range(len(graph.kernels[pos].operands)):
                out = self.index.get(Names.made(pos, k))
                if out is None:
                    break
                self.made_t[pos][k] = out
        # Per kernel, the operands `before` acts on: those moved or waited for there, evicted
        # after it, at their first use if persistent (the plan puts them where it wants them;
        # the names of objects older than the iteration are given in order of first use, so
        # those kernels are never skipped), or moved asynchronously somewhere (their objects
        # are kept at every use). Most kernels have none, and cost one list lookup.
        tracked = {t for a in self.moves.ahead for t, _, _ in a} | {t for b in self.moves.behind for t in b}
        self.watch: list[frozenset[int]] = []
        for pos in range(n):
            used = self.use_at[pos]
            acts = self.before_k[pos] | self.moves.wait[pos] | set(self.after[pos]) | tracked
            firsts = {t for t, j in used.items() if j == 0 and graph.tensors[t].persistent}
            self.watch.append(frozenset((acts & used.keys()) | firsts))
        # Per kernel, its outputs' places and offsets and sizes, worked out once
        # (`place` hands them out as they are), and the outputs whose objects `made` keeps
        # (those the plan acts on later).
        self.out_places: list[tuple[list[int], list[int | None], list[int]]] = []
        for pos in range(n):
            outs = [self.made_t[pos][k] for k in range(len(self.made_t[pos]))]
            self.out_places.append(
                (
                    [self._code(plan.at_use[t][0]) for t in outs],
                    [self._offset(t, 0) for t in outs],
                    [graph.tensors[t].bytes for t in outs],
                )
            )
        acted = tracked | {t for a in self.after for t in a}
        self.keep_made: list[dict[int, int]] = [{k: t for k, t in m.items() if t in acted} for m in self.made_t]
        # The copy thread of asynchronous moves (if the plan has any), and each tensor's copy
        # in flight.
        overlapped = any(self.moves.ahead) or any(self.moves.behind)
        self._copier = ThreadPoolExecutor(1, "tiermem-plan-copy") if overlapped else None
        self._pending: dict[int, Future[Any]] = {}
        self.trusted = True
        self.mismatched = False  # this iteration left the plan
        self.objects: dict[int, weakref.ref[TensorObject]] = {}
        self._native: Any = None
        self._manager: Any = None
        self._moves_started = 0.0
        self.counts = {
            "prefetches": 0,
            "evictions": 0,
            "first_iteration_kernels": 0,
            # Iterations whose trace left the plan's, and the kernels they ran under the
            # runtime policy after the first difference.
            "mismatched_iterations": 0,
            "runtime_kernels": 0,
            "prefetch_missed": 0,  # prefetches that found no room (fragmentation)
            "moves_failed": 0,  # move calls refused (an object pinned or freed meanwhile)
            # Time the step waited on planned moves (the stall): the calls that opened a
            # kernel with moves, and waits for copies in flight.
            "move_seconds": 0.0,
            "planned_iterations": 0,
            "async_prefetches": 0,  # issued on the copy thread, ahead of their kernel
            "async_writebacks": 0,  # issued on the copy thread, behind their write
            "async_failed": 0,  # copies that did nothing (no room, pinned, already clean): done in line
        }

    def attach(self, tiering: Tiering) -> None:
        self._native = tiering._native
        self._manager = tiering.manager
        self._tiering_stats = tiering._stats

    def stats(self) -> dict[str, Any]:
        c = dict(self.counts)
        # The evictions this executor asked after kernels that the core refused, which
        # the tiering counts (no per-op event needed).
        c["moves_failed"] += self._tiering_stats.get("observer_evictions_refused", 0)
        return c | (self._manager.policy_stats() or {})

    def iteration(self, iteration: int) -> None:
        self._drain()
        self.names.start(iteration)
        self.objects = {}
        # The first iteration is not the planned step (it makes the optimizer's state, and
        # no previous loss is read at its start): it runs unplanned, its new tensors at home.
        self.trusted = iteration > 0
        self.mismatched = False

    def _code(self, d: int) -> int:
        return FAST if d == 0 else SLOW if d == self.graph.home else d

    def _offset(self, t: int, j: int) -> int | None:
        return None if self.plan.offsets is None else self.plan.offsets[t][j]

    def place(self, pos: int, k: int, sizes: list[int]) -> tuple[list[int], list[int | None]]:
        """The place codes and heap offsets (None: the heap chooses) of outputs ``k``,
        ``k + 1``, ... (``sizes`` long) of the kernel at ``pos``: where the plan makes them,
        or at home for what it does not know."""
        if self.trusted and pos < len(self.out_places):
            codes, offsets, planned = self.out_places[pos]
            if k == 0 and sizes == planned:
                return codes, offsets
            for i, nb in enumerate(sizes):
                if k + i < len(planned) and planned[k + i] != nb:
                    self._mismatch(pos, f"a tensor of {nb} bytes where the plan has {planned[k + i]}")
                    break
            else:
                n = len(planned)
                home = [(SLOW, None)] * max(0, k + len(sizes) - n)
                each = list(zip(codes, offsets))[k : k + len(sizes)] + home
                return [c for c, _ in each], [o for _, o in each]
        # The first iteration makes its tensors at home (as the plan's capture did); an
        # iteration that left the plan runs first-touch.
        return [AUTO if self.mismatched else SLOW] * len(sizes), [None] * len(sizes)

    def _mismatch(self, pos: int, what: str) -> None:
        self.trusted = False
        self.mismatched = True
        self.counts["mismatched_iterations"] += 1
        self.counts["runtime_kernels"] += 1
        why = (
            f"the step's trace changed at kernel {pos} of iteration {self.names.iteration}: the model made {what} "
            f"(another batch shape or a data-dependent branch); the rest of this iteration runs under the runtime "
            "policy (first-touch) and the plan is tried again from the next; capture and plan this step again "
            "(tiermem plan) if it keeps changing"
        )
        if self.counts["mismatched_iterations"] == 1:
            warnings.warn(why, PlanMismatchWarning, stacklevel=5)
        else:
            log.info("%s", why)

    def op_start(self, pos: int, name: str, objs: list[TensorObject]) -> Moves | None:
        """Check the kernel against the plan; the moves that bring its operands where the
        plan has them (made by the call that opens the kernel)."""
        g = self.graph
        if self.trusted and (pos >= len(g.kernels) or g.kernels[pos].name != name):
            want = g.kernels[pos].name if pos < len(g.kernels) else "the end of the step"
            self._mismatch(pos, f"{name} where the plan has {want}")
            return None
        if not self.trusted:
            self.counts["runtime_kernels" if self.mismatched else "first_iteration_kernels"] += 1
            return None
        if pos == 0:  # an iteration that runs (the one a close starts does not)
            self.counts["planned_iterations"] += 1
        watch = self.watch[pos]
        if not watch:
            return None
        start = time.perf_counter()
        planned = self.before_k[pos]
        fetch: list[tuple[int, int | None]] = []
        evict: list[int] = []
        late = {t for t in self.moves.wait[pos] if not self._landed(t)}  # fetched here after all
        for obj in objs:
            t = self.index.get(self.names.name(obj))
            if t is None or t not in watch:
                continue
            self.objects[t] = weakref.ref(obj)
            j = self.use_at[pos][t]
            want_fast = self.plan.at_use[t][j] < g.home
            # A planned prefetch; or a persistent tensor's first use, which finds it wherever
            # the last iteration (or its creation) left it.
            first_persistent = j == 0 and g.tensors[t].persistent
            if want_fast and (t in planned or first_persistent or t in late):
                # The planned policy prefetches into the fastest device only.
                fetch.append((obj.id, self._offset(t, j) if self.plan.at_use[t][j] == 0 else None))
            elif not want_fast and first_persistent:
                evict.append(obj.id)
        self.counts["move_seconds"] += time.perf_counter() - start
        if not fetch and not evict:
            return None
        self.counts["prefetches"] += len(fetch)
        self.counts["evictions"] += len(evict)
        self._moves_started = time.perf_counter()
        return Moves(fetch, evict)

    def op_open(self, pos: int, moves_done: tuple[int, int]) -> None:
        """Count how the moves went, then start the asynchronous moves that overlap the
        kernel at ``pos`` (its operands are open): prefetches ahead, at their offsets, and
        write homes behind."""
        if self._moves_started:
            self.counts["move_seconds"] += time.perf_counter() - self._moves_started
            self._moves_started = 0.0
            self.counts["prefetch_missed"] += moves_done[0]
            self.counts["moves_failed"] += moves_done[1]
        if not self.trusted or self._copier is None or pos >= len(self.after):
            return
        native = self._native
        for t, d, j in self.moves.ahead[pos]:
            obj = self._object(t)
            if obj is not None:
                off = self._offset(t, j) if d == 0 else None
                self._pending[t] = self._copier.submit(native.plan_moves, [(obj.id, off)], [])
                self.counts["async_prefetches"] += 1
        for t in self.moves.behind[pos]:
            obj = self._object(t)
            if obj is not None:
                self._pending[t] = self._copier.submit(native.writeback, obj.id)
                self.counts["async_writebacks"] += 1

    def op_closing(self, pos: int) -> list[int] | None:
        """What the plan does not hold in fast memory after this kernel (once its copy
        behind, if any, has finished), evicted by the call that closes the kernel."""
        if not self.trusted or pos >= len(self.after) or not self.after[pos]:
            return None
        evict = []
        for t in self.after[pos]:
            self._landed(t)
            obj = self._object(t)
            if obj is not None:
                evict.append(obj.id)
        self.counts["evictions"] += len(evict)
        return evict

    def _object(self, t: int) -> TensorObject | None:
        ref = self.objects.get(t)
        return ref() if ref is not None else None

    def _landed(self, t: int) -> bool:
        """Wait for tensor ``t``'s copy in flight, if any; whether one was and it succeeded
        (a prefetch that found room; a write home that cleaned the tensor)."""
        f = self._pending.pop(t, None)
        if f is None:
            return False
        start = time.perf_counter()
        try:
            r = f.result()
            # writeback: whether it cleaned the tensor; plan_moves: prefetches that found no room
            ok = r if isinstance(r, bool) else r == 0
        except TiermemError:  # pinned, freed meanwhile, no room: done in line instead
            ok = False
        self.counts["move_seconds"] += time.perf_counter() - start
        self.counts["async_failed"] += not ok
        return ok

    def _drain(self) -> None:
        for t in list(self._pending):
            self._landed(t)

    def close(self) -> None:
        """Wait for the copies in flight and stop the copy thread."""
        self._drain()
        if self._copier is not None:
            self._copier.shutdown(wait=True)
            self._copier = None

    def made(self, pos: int, k: int, obj: TensorObject) -> None:
        if self.trusted and pos < len(self.keep_made):
            t = self.keep_made[pos].get(k)
            if t is not None:
                self.objects[t] = weakref.ref(obj)
