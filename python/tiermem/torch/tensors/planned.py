"""Graphs from training steps and plans run on them (the planner's two ends in PyTorch).

Both watch the same event stream of a :class:`~tiermem.torch.tensors.tiering.Tiering`: each op
it runs and each tensor it copies in (a model's inputs) is one *kernel*, numbered by its
position in the iteration. Tensors are named so that the names survive from one iteration,
and one run, to the next: ``"POS.K"`` for the *K*-th tensor the kernel at *POS* made, and
``"pN"`` for the *N*-th object older than the iteration that the iteration used
(parameters, optimizer state), counted in order of first use.

* :class:`Recorder` turns one iteration into the kernels, tensors and per-kernel times of a
  :class:`~tiermem.plan.Graph` (see :func:`tiermem.torch.tensors.profile.graph_from_recordings` and
  :func:`tiermem.bench.plan.capture`).
* :class:`Executor` follows a :class:`~tiermem.plan.Plan`: each new tensor is made on the
  device the plan puts it on at its first use, at the plan's heap offset when it has one
  (:mod:`tiermem.plan.offsets`); before each kernel the plan's prefetches run, each to its
  offset
  (and a persistent tensor's first use finds it where the plan wants it), after it the
  tensors whose gap the plan does not hold are evicted: one call into the core per kernel
  that moves anything. A plan's asynchronous moves (the ``async`` formulation) go to a copy
  thread once the kernel they overlap has opened its operands: a prefetch ahead lands before
  the kernel that uses it waits for it, and a write home behind cleans the tensor, whose
  eviction after that kernel waits for it (and then copies nothing). A copy that failed is
  done synchronously instead, and counted. The first iteration is not the planned step (it makes the
  optimizer's state) and runs unplanned. A kernel or tensor size the plan does not have (the
  model's ops changed) is warned about, and the rest of that iteration runs unplanned with
  its new tensors at home; the plan is trusted again from the next iteration.
"""

from __future__ import annotations

import time
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from ...exceptions import NoSuchObjectError, PinnedError, TiermemError
from ...plan import Graph, Plan, moves
from ...policies import FAST, SLOW
from .tensor import TieredTensor

if TYPE_CHECKING:  # pragma: no cover
    from .tensor import TensorObject
    from .tiering import Tiering

__all__ = ["Recorder", "Executor", "PlanMismatchWarning", "signature"]


class PlanMismatchWarning(UserWarning):
    """The model ran an op the plan does not have at that position."""


class _Names:
    """Stable names of this iteration's objects."""

    def __init__(self) -> None:
        self.iteration = -1
        self.old: dict[int, str] = {}

    def start(self, iteration: int) -> None:
        self.iteration = iteration
        self.old = {}

    def name(self, obj: TensorObject) -> str:
        b = obj.born
        if b is not None and b[0] == self.iteration:
            return f"{b[1]}.{b[2]}"
        n = self.old.get(obj.id)
        if n is None:
            n = self.old[obj.id] = f"p{len(self.old)}"
        return n

    @staticmethod
    def made(pos: int, k: int) -> str:
        return f"{pos}.{k}"


def signature(name: str, flat: list[Any], lens: tuple[int, ...], kwargs: dict[str, Any]) -> str:
    """A kernel's signature, as AutoTM keys its profile cache: the op, and each argument's
    shape, strides, dtype and offset (tensors; tiered ones with their object's size) or value
    (anything else)."""
    parts = [name, repr(lens), ",".join(kwargs)]
    for x in flat:
        if isinstance(x, TieredTensor):
            size, stride, dtype, off = x._key
            parts.append(f"T{x._obj.nbytes}:{list(size)}:{list(stride)}:{dtype}:{off}")
        elif isinstance(x, torch.Tensor):
            parts.append(f"P{list(x.shape)}:{list(x.stride())}:{x.dtype}")
        else:
            parts.append(repr(x)[:64])
    return "|".join(parts)


class Recorder:
    """Records the iterations after ``skip`` whole ones: the first of them gives the kernels
    and tensors; each kernel keeps its shortest time over ``count`` iterations (a shared
    machine's noise only ever adds time). With ``places``, the first recorded iteration also
    keeps the device index each operand was on as its kernel closed (``places``, one list
    per kernel in operand order): what a runtime policy decided, for
    :func:`tiermem.plan.recorded` to price."""

    def __init__(self, skip: int = 1, count: int = 1, places: bool = False) -> None:
        if skip < 1 or count < 1:
            raise ValueError(f"recorder: skip and count must be at least 1, got {skip}, {count}")
        self.skip = skip
        self.count = count
        self.keep_places = places
        self.places: list[list[int]] = []
        self.names = _Names()
        self.active = False
        self.done = False
        self.recorded = 0  # whole iterations recorded
        self.kernels: list[tuple[str, float, list[tuple[str, str]]]] = []
        #: Per kernel, its signature (:func:`signature`): kernels that share one do the same
        #: work on operands of the same shapes, so their profiles are pooled.
        self.signatures: list[str] = []
        self.tensors: dict[str, dict[str, Any]] = {}
        self.mismatch: str | None = None
        self._pos = 0
        self._live: dict[int, str] = {}  # object id -> name, for frees

    @property
    def wants_signatures(self) -> bool:
        """Whether the next kernel's signature is kept (the first recorded iteration's)."""
        return self.active and not self.recorded

    def start_iteration(self, iteration: int) -> None:
        if self.active:
            self.recorded += 1
            if self._pos != len(self.kernels) and self.mismatch is None:
                self.mismatch = f"iteration {iteration - 1} ran {self._pos} kernels, the first recorded one {len(self.kernels)}"
            self.active = False
            self.done = self.recorded >= self.count
        if not self.done and iteration >= self.skip:
            self.active = True
            self._pos = 0
            self.names.start(iteration)

    def kernel(
        self, pos: int, name: str, operands: list[tuple[TensorObject, str]], seconds: float, signature: str | None = None
    ) -> None:
        if not self.active:
            return
        self._pos = pos + 1
        if self.recorded:
            if pos < len(self.kernels) and self.kernels[pos][0] == name:
                k = self.kernels[pos]
                self.kernels[pos] = (k[0], min(k[1], seconds), k[2])
            elif self.mismatch is None:
                self.mismatch = f"kernel {pos} was {name} in one iteration and not in another"
            return
        if self.keep_places:
            self.places.append([obj.tiering._native.placement(obj.id)[0] for obj, _ in operands])
        ops = []
        for obj, use in operands:
            key = self.names.name(obj)
            if key not in self.tensors:
                persistent = not key[0].isdigit()
                kind = "parameter" if persistent and obj.born is None else "state" if persistent else "activation"
                if use == "make" and name == "input":
                    kind = "input"
                self.tensors[key] = {"bytes": obj.nbytes, "kind": kind, "persistent": persistent}
                self._live[obj.id] = key
            ops.append((key, use))
        self.kernels.append((name, seconds, ops))
        self.signatures.append(signature or name)

    def freed(self, oid: int) -> None:
        key = self._live.pop(oid, None)
        if key is not None and self.active and not self.recorded:
            self.tensors[key]["freed_at"] = len(self.kernels) - 1


class Executor:
    """Runs a plan's placement and moves on a Tiering whose policy is ``planned``."""

    def __init__(self, tiering: Tiering, graph: Graph, plan: Plan) -> None:
        plan.check(graph)
        self.t = tiering
        self.graph = graph
        self.plan = plan
        self.names = _Names()
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
                out = self.index.get(_Names.made(pos, k))
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
        # The copy thread of asynchronous moves (if the plan has any), and each tensor's copy
        # in flight.
        overlapped = any(self.moves.ahead) or any(self.moves.behind)
        self._copier = ThreadPoolExecutor(1, "tiermem-plan-copy") if overlapped else None
        self._pending: dict[int, Future[Any]] = {}
        self.trusted = True
        self.objects: dict[int, weakref.ref[TensorObject]] = {}
        self.counts = {
            "prefetches": 0,
            "evictions": 0,
            "unplanned_kernels": 0,
            "first_iteration_kernels": 0,
            "prefetch_missed": 0,  # prefetches that found no room (fragmentation)
            "moves_failed": 0,  # move calls refused (an object pinned or freed meanwhile)
            "move_seconds": 0.0,  # time the step waited on planned moves (the stall)
            "planned_iterations": 0,
            "async_prefetches": 0,  # issued on the copy thread, ahead of their kernel
            "async_writebacks": 0,  # issued on the copy thread, behind their write
            "async_failed": 0,  # copies that did nothing (no room, pinned, already clean): done in line
        }

    def start_iteration(self, iteration: int) -> None:
        self._drain()
        self.names.start(iteration)
        self.objects = {}
        # The first iteration is not the planned step (it makes the optimizer's state, and
        # no previous loss is read at its start): it runs unplanned, its new tensors at home.
        self.trusted = iteration > 0

    def _code(self, d: int) -> int:
        return FAST if d == 0 else SLOW if d == self.graph.home else d

    def _offset(self, t: int, j: int) -> int | None:
        return None if self.plan.offsets is None else self.plan.offsets[t][j]

    def place_of(self, pos: int, k: int, nbytes: int) -> tuple[int, int | None]:
        """The place code and heap offset (None: the heap chooses) for output ``k``
        (``nbytes`` long) of the kernel at ``pos``."""
        t = self.made_t[pos].get(k) if self.trusted and pos < len(self.made_t) else None
        if t is not None and self.graph.tensors[t].bytes != nbytes:
            self._mismatch(pos, f"a tensor of {nbytes} bytes where the plan has {self.graph.tensors[t].bytes}")
            t = None
        if t is None:
            return SLOW, None
        return self._code(self.plan.at_use[t][0]), self._offset(t, 0)

    def _mismatch(self, pos: int, what: str) -> None:
        self.trusted = False
        self.counts["unplanned_kernels"] += 1
        warnings.warn(
            f"the model made {what} at kernel {pos}: its tensors go to the home device for the rest of this "
            "iteration (re-plan with tiermem plan)",
            PlanMismatchWarning,
            stacklevel=5,
        )

    def before(self, pos: int, name: str, objs: list[TensorObject]) -> None:
        """Check the kernel against the plan and bring its operands where the plan has them."""
        g = self.graph
        if self.trusted and (pos >= len(g.kernels) or g.kernels[pos].name != name):
            want = g.kernels[pos].name if pos < len(g.kernels) else "the end of the step"
            self._mismatch(pos, f"{name} where the plan has {want}")
            return
        if not self.trusted:
            self.counts["unplanned_kernels" if self.names.iteration > 0 else "first_iteration_kernels"] += 1
            return
        if pos == 0:  # an iteration that runs (the one a close starts does not)
            self.counts["planned_iterations"] += 1
        watch = self.watch[pos]
        if not watch:
            return
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
        self._moves(fetch, evict, start)

    def _moves(self, fetch: list[tuple[int, int | None]], evict: list[int], start: float) -> None:
        if fetch or evict:
            try:
                self.counts["prefetch_missed"] += self.t._native.plan_moves(fetch, evict)
                self.counts["prefetches"] += len(fetch)
                self.counts["evictions"] += len(evict)
            except (PinnedError, NoSuchObjectError):
                self.counts["moves_failed"] += 1
        self.counts["move_seconds"] += time.perf_counter() - start

    def after_kernel(self, pos: int) -> None:
        """Evict what the plan does not hold in fast memory after this kernel (once its copy
        behind, if any, has finished)."""
        if not self.trusted or pos >= len(self.after) or not self.after[pos]:
            return
        start = time.perf_counter()
        evict = []
        for t in self.after[pos]:
            self._landed(t)
            obj = self._object(t)
            if obj is not None:
                evict.append(obj.id)
        self._moves([], evict, start)

    def during(self, pos: int) -> None:
        """Start the asynchronous moves that overlap the kernel at ``pos`` (its operands are
        open): prefetches ahead, at their offsets, and write homes behind."""
        if not self.trusted or self._copier is None or pos >= len(self.after):
            return
        native = self.t._native
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
        t = self.made_t[pos].get(k) if pos < len(self.made_t) else None
        if t is not None and self.trusted:
            self.objects[t] = weakref.ref(obj)
