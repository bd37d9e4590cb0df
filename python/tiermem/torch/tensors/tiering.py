"""Train unmodified ``torch.nn`` models whose tensors live in tiered memory.

Design (thesis §4.4-4.5, Listing 4.6, brought to eager PyTorch)::

    tiering = Tiering({"dram": "512 MiB", "emulated:optane-pmem": "8 GiB"}, variant="LM")
    model = tiering.module(model)                 # parameters and buffers become tiered
    opt = tiering.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()

* Parameters, buffers, inputs, and everything computed from them (activations, the tensors
  autograd saves for backward, gradients, optimizer state) are :class:`TieredTensor` objects:
  a wrapper subclass whose bytes are one tiermem object. Views share the object.
* Every ATen op on them passes through :meth:`Tiering.dispatch`, which **pins** each
  operand for the length of the op (a guard: the policy cannot move it meanwhile), allocates
  the op's outputs in tiered memory **before** the op runs, and calls the op's ``.out``
  overload so the kernel writes straight into them (ops without one run normally and are
  copied in; see :attr:`Tiering.stats`). Operands on an ``emulated`` device are charged its
  bandwidth for their bytes, like tiermem's own kernels.
* The thesis's knobs (Table 4.7) are variants: ``L`` (new tensors in fast memory; dead
  tensors freed at the end of the iteration, or when memory runs out, like a collector), ``LM`` (+ dead tensors
  freed the moment their last reference goes — CPython's refcount, so autograd releasing a
  saved tensor after its backward node frees it at once, never written back — and the
  inputs of forward ops soft-evicted, Listing 4.6), ``LMP`` (+ every op's inputs prefetched
  into fast memory before it runs), ``async`` (``LM`` + a copy thread that, while the current op
  runs, writes soft-evicted forward inputs behind to the slow device so their eviction copies
  nothing, and prefetches the inputs of the next ops, found in the previous iteration's op
  trace; see :mod:`tiermem.torch.tensors.lookahead`).
  Baselines: ``all-fast``, ``all-slow``, ``first-touch``, ``2lm-model``. ``planned`` follows a
  plan from :mod:`tiermem.plan` (``tiermem.plan.torch.planned(devices, graph, plan)``, a tiering
  watched by the plan's :class:`~tiermem.plan.torch.Executor`).
* What watches the step (the ``async`` variant's copy thread, a planner's recorder, a plan's
  executor, a user's own) is an :class:`~tiermem.torch.tensors.observer.Observer`
  (``Tiering(..., observers=[...])`` or :meth:`Tiering.watch`), told of every op and tensor.
* The fast device's capacity is the budget; nothing tiered exceeds it. An op whose outputs
  alone exceed it raises :class:`~tiermem.BudgetError`; :meth:`Tiering.check` finds such ops
  before training by tracing one step on the meta device.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ..._tiermem import MEMORY_ALIGN
from ...exceptions import BudgetError, DeviceFullError, InvalidArgumentError, TiermemError
from ...manager import DeviceList, Manager
from ...policies import FAST as _FAST
from ...policies import SLOW as _SLOW
from .budget import budget_message, trace_step
from .lookahead import Lookahead
from .observer import HOOKS, Moves, Observer, OpEnd, overridden
from .ops import INPLACE_VIEWS, MATERIALIZED_VIEWS, OUT_UNLESS, OpInfo, inplace_twin, meta_like, op_info
from .tensor import (
    TensorObject,
    TieredTensor,
    check_supported,
    flat_args,
    itemsize,
    plain_over,
    rebuild_args,
    signature,
    span_bytes,
)

__all__ = ["Tiering", "Variant", "VARIANTS", "TieredTensor"]

_ALIGN = MEMORY_ALIGN  # the heap's, from the core


@dataclass(frozen=True)
class Variant:
    """How a :class:`Tiering` runs: the policy and the thesis's knobs."""

    policy: str
    local: bool = True  # L: new tensors in fast memory (else on the slow device)
    prompt_free: bool = True  # M: free dead tensors at once (else at the end of the iteration)
    softevict: bool = False  # M: soft-evict the inputs of forward ops (Listing 4.6)
    lookahead: int = 0  # async: ops ahead whose inputs a copy thread prefetches
    budget: bool = True  # whether the fast device's capacity is a budget to check

    @property
    def prefetch(self) -> bool:
        """P: the policy's guards bring every input into fast memory first (``lru``; the
        others use data where it lives)."""
        return self.policy == "lru"


#: Every variant ``tiermem bench train`` runs.
VARIANTS: dict[str, Variant] = {
    "all-fast": Variant("all_fast", budget=False),
    "all-slow": Variant("all_slow", budget=False),
    "first-touch": Variant("first_touch", budget=False),
    "2lm-model": Variant("2lm_model", budget=False),
    "L": Variant("lru_in_place", prompt_free=False),
    "LM": Variant("lru_in_place", softevict=True),
    "LMP": Variant("lru", softevict=True),
    "async": Variant("lru_in_place", softevict=True, lookahead=2),
    # Outputs go where the plan says, home included; what the plan does not know (parameters
    # as the model is wrapped, the first iteration) starts at home, out of the plan's heap.
    "planned": Variant("planned", local=False, budget=False),
}

_NO_MOVES = (0, 0)


def _round(n: int) -> int:
    return max(_ALIGN, (n + _ALIGN - 1) // _ALIGN * _ALIGN)


#: Plain views kept for reuse (see :func:`_view_over`); when full, the older half is dropped.
_MAX_VIEWS = 4096


def _view_over(views: dict, key: tuple, cache: bool = True) -> torch.Tensor:
    """A plain tensor over ``key = (address, object bytes, (size, stride, dtype, offset))``,
    kept in ``views`` for the next op that finds the same object at the same address with
    the same view. A plain view owns no memory (device memory lives as long as the manager)
    and is used only while the object is pinned at that address."""
    addr, nbytes, (size, stride, dtype, off) = key
    p = plain_over(addr, nbytes, dtype, size, stride, off)
    if cache:
        if len(views) >= _MAX_VIEWS:
            # Oldest first (insertion order): a run whose addresses changed (a plan's first
            # planned iteration) drops the stale views and keeps the ones it just made, instead
            # of making them all again next iteration.
            for old in list(views)[: len(views) // 2]:
                del views[old]
        views[key] = p
    return p


def _meta(x: Any) -> Any:
    """A meta tensor standing for ``x`` (same dtype, shape, strides, offset), or ``x``."""
    if isinstance(x, TieredTensor):
        return meta_like(x, x._obj.nbytes, x._off)
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


class _TierInputs:
    """The forward pre-hook :meth:`Tiering.module` registers: a model's inputs made tiered.
    Pickled (``torch.save(model)``) as a hook that does nothing: the loaded model is plain."""

    def __init__(self, tiering: Tiering) -> None:
        self.tiering = tiering

    def __call__(self, module: Any, args: tuple) -> tuple:
        if torch.compiler.is_compiling():
            _compiled(self.tiering, module)
        return _wrap_inputs(self.tiering, module, args)

    def __reduce__(self) -> Any:
        return (_no_hook, ())


def _check_not_resized(info: OpInfo, plan: Any, pouts: list, ptrs: list[int]) -> None:
    """Raise RuntimeError if an ``.out`` kernel resized an output tiermem made for it (to
    another shape than its meta run gave, or into new memory): what it wrote is not in
    tiered memory, and the op must run as the functional op."""
    for (shape, stride, _, _), p, ptr in zip(plan, pouts, ptrs):
        if p.data_ptr() != ptr or p.shape != shape or p.stride() != stride:
            raise RuntimeError(f"{info.name}: the .out kernel resized its output {shape} -> {tuple(p.shape)}")


class _Scope:
    """A module's forward hooks that keep :attr:`Tiering.scope` (pickled as no-ops, like
    the input hook)."""

    def __init__(self, tiering: Tiering, name: str, enter: bool) -> None:
        self.tiering, self.name, self.enter = tiering, name, enter

    def __call__(self, module: Any, args: tuple, output: Any = None) -> None:
        t = self.tiering
        if self.enter:
            t.scope = self.name
        else:
            # Back to the parent's name (a module's name extends its parent's with ".child").
            t.scope = self.name.rpartition(".")[0]

    def __reduce__(self) -> Any:
        return (_no_hook, ())


class EagerFallbackWarning(UserWarning):
    """``torch.compile`` of a tiered model: its ops on tiered tensors run eagerly through
    tiermem (compiled graphs cover the plain-tensor code around them). Told once per
    Tiering."""


@torch.compiler.disable
def _compiled(tiering: Tiering, module: Any) -> None:
    if tiering._compile_warned:
        return
    tiering._compile_warned = True
    warnings.warn(
        f"torch.compile of a tiered {type(module).__name__}: tiered tensors cannot be traced into a compiled graph "
        "(their data moves between devices while the model runs), so each op on them runs eagerly through tiermem; "
        "results are those of the uncompiled model, and only plain-tensor code around them is compiled",
        EagerFallbackWarning,
        stacklevel=2,
    )


@torch.compiler.disable
def _wrap_inputs(tiering: Tiering, module: Any, args: tuple) -> tuple:
    return tiering._wrap_inputs(module, args)


def _no_hook() -> Callable[..., None]:
    """What a tiered model's input hook is after a round trip through a file: nothing."""
    return _ignore


def _ignore(*_: Any) -> None:
    return None


#: Bytes a plan's outputs span, per plan seen (bounded like the views).
_NEEDS: dict[tuple, int] = {}

#: ``Tiering._plans``' answer for a key not seen yet.
_UNPLANNED = object()


def _bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
    return out


class _Operand:
    """One pinned object of an op: its address and the bytes the op reads and writes."""

    __slots__ = ("obj", "write", "read_bytes", "written_bytes", "addr")

    def __init__(self, obj: TensorObject) -> None:
        self.obj = obj
        self.write = False
        self.read_bytes = 0
        self.written_bytes = 0
        self.addr = 0


class Tiering:
    """Tiered memory for the tensors of a PyTorch model.

    Args:
        devices: fast device first, e.g. ``{"dram": "512 MiB", "emulated:optane-pmem":
            "8 GiB"}``; the fast device's capacity is the budget. Or pass ``manager=``.
        variant: a name in :data:`VARIANTS` or a :class:`Variant`.
        manager: an existing :class:`~tiermem.Manager` (its policy must be the variant's).
        threads: threads ATen kernels write with (for the emulated write cost; default
            ``torch.get_num_threads()``).
        observers: what watches the step (:class:`~tiermem.torch.tensors.observer.Observer`;
            more with :meth:`watch`). The ``planned`` variant needs one that places tensors:
            a plan's :class:`~tiermem.plan.torch.Executor`.
    """

    def __init__(
        self,
        devices: DeviceList | None = None,
        variant: str | Variant = "LM",
        *,
        manager: Manager | None = None,
        threads: int | None = None,
        observers: Sequence[Observer] = (),
    ) -> None:
        if isinstance(variant, str):
            if variant not in VARIANTS:
                raise InvalidArgumentError(f"variant {variant!r}: known are {', '.join(VARIANTS)}")
            self.variant_name, v = variant, VARIANTS[variant]
        else:
            self.variant_name, v = "custom", variant
        if (devices is None) == (manager is None):
            raise InvalidArgumentError("pass devices or manager=, not both and not neither")
        if manager is None:
            manager = Manager(devices, v.policy)  # type: ignore[arg-type]
        elif manager.policy != v.policy.replace("-", "_"):
            raise InvalidArgumentError(
                f"variant {self.variant_name!r} needs policy {v.policy!r}; the manager runs {manager.policy!r}"
            )
        self.variant = v
        self.manager = manager
        self._native = manager._native
        self._fast = manager.device_names[0]
        self.budget = manager.usage()[self._fast]["capacity"]
        self.threads = int(threads or torch.get_num_threads())
        self.iteration = 0
        self._pos = 0
        self._pending: list[int] = []
        self._pending_lock = threading.Lock()
        self._closed = False
        self._compile_warned = False
        #: Object id -> what the user calls it (parameters and buffers by name, optimizer
        #: state as "KEY of NAME"), kept when an observer names tensors.
        self.labels: dict[int, str] = {}
        #: The module running now ("" outside forward), tracked when an observer names tensors.
        self.scope = ""
        self._naming = False
        #: Whether the core's trace follower is told of each op (set by the look-ahead).
        self.tracing = False
        self._plans: dict[Any, Any] = {}
        self._views: dict[tuple, torch.Tensor] = {}
        self._stats = {
            "ops": 0,
            "view_ops": 0,
            "out_ops": 0,
            "fallback_ops": 0,
            "fallback_bytes": 0,
            "inplace_ops": 0,
            "freed_at_once": 0,
            "freed_late": 0,
            "observer_evictions_refused": 0,
            "out_refused": 0,
        }
        self.fallbacks: dict[str, int] = {}
        #: Ops whose ``.out`` overload refused the outputs their meta run gave, with why;
        #: they run as functional ops with their results copied in.
        self.out_refused: dict[str, str] = {}
        #: What watches the step, in the order attached.
        self.observers: list[Observer] = []
        self._hooks: dict[str, list[Callable[..., Any]]] = {h: [] for h in HOOKS}
        self._placer: Observer | None = None
        self._timed = False
        for o in observers:
            self.watch(o)
        if v.lookahead:
            self.watch(Lookahead(v.lookahead))
        if v.policy == "planned" and self._placer is None:
            raise InvalidArgumentError(
                "the planned variant follows a plan: build it with tiermem.plan.torch.planned(devices, graph, plan) "
                "(or pass observers=[tiermem.plan.torch.Executor(graph, plan)])"
            )

    def watch(self, observer: Observer) -> Observer:
        """Let ``observer`` watch this tiering's ops from now on (it is told the current
        iteration first). At most one observer places tensors. Returns ``observer``."""
        if not isinstance(observer, Observer):
            raise InvalidArgumentError(f"an observer must subclass tiermem.torch.tensors.Observer, got {type(observer).__name__}")
        if self._closed:
            raise InvalidArgumentError("this Tiering is closed")
        if overridden(observer, "place"):
            if self._placer is not None:
                raise InvalidArgumentError(
                    f"{type(observer).__name__} places tensors, and {type(self._placer).__name__} already does"
                )
            if self.variant.policy != "planned":
                raise InvalidArgumentError(
                    f"{type(observer).__name__} places tensors by a plan: it needs the planned variant, not {self.variant_name!r}"
                )
            self._placer = observer
        observer.attach(self)
        self._naming = self._naming or observer.names_tensors
        self.observers.append(observer)
        for h in HOOKS:
            if overridden(observer, h):
                self._hooks[h].append(getattr(observer, h))
        self._timed = self._timed or observer.timed
        observer.iteration(self.iteration)
        return observer

    # ------------------------------------------------------------------ objects

    def _alloc(self, nbytes: int, born: tuple[int, int, int] | None) -> TensorObject:
        n = _round(nbytes)
        where = _FAST if self.variant.local else _SLOW
        offset = None
        if self._placer is not None and born is not None:
            codes, offsets = self._placer.place(born[1], born[2], [n])
            where, offset = codes[0], offsets[0]
        try:
            oid = int(self._native.alloc(n, where, offset))
        except DeviceFullError:
            # Without prompt freeing, dead tensors wait for the end of the iteration, like
            # garbage waiting for a collector; when memory runs out, collect now (as the
            # thesis's runtime ran the GC when its heap filled).
            if not self._collect():
                raise
            oid = int(self._native.alloc(n, where, offset))
        obj = TensorObject(self, oid, n, born)
        if born is not None:
            if self.tracing:  # op_open tells the core of the outputs it makes; these, here
                self._native.trace_made(born[1], born[2], oid)
            for h in self._hooks["made"]:
                h(born[1], born[2], obj)
        return obj

    def _release(self, oid: int) -> None:
        if self._closed:
            return
        for h in self._hooks["freed"]:
            h(oid)
        if self.variant.prompt_free:
            self._free(oid)
            self._stats["freed_at_once"] += 1
        else:
            with self._pending_lock:
                self._pending.append(oid)

    def _free(self, oid: int) -> None:
        try:
            self._native.free(oid)
        except Exception:
            pass

    def tensor(self, x: torch.Tensor, requires_grad: bool | None = None) -> TieredTensor:
        """A tiered copy of ``x`` (contiguous), placed by the policy. While a plan runs or a
        graph is recorded, the copy is a kernel of the step (``input``)."""
        return self._tensor(x, requires_grad, kernel=True)

    def _tensor(self, x: torch.Tensor, requires_grad: bool | None, kernel: bool) -> TieredTensor:
        if isinstance(x, TieredTensor):
            return x
        if not isinstance(x, torch.Tensor):
            raise InvalidArgumentError(f"expected a torch.Tensor, got {type(x).__name__}")
        check_supported(x, "tensor")
        x = x.detach()
        born = None
        hooks = self._hooks
        # A copy-in is a kernel of the step ("input") for observers that follow ops.
        watched = kernel and bool(hooks["op_start"] or hooks["op_end"])
        pos, start = 0, 0.0
        if watched:
            pos = self._pos
            self._pos += 1
            born = (self.iteration, pos, 0)
            for h in hooks["op_start"]:
                h(pos, "input", [])  # no operands: nothing to move
            for h in hooks["op_open"]:
                h(pos, _NO_MOVES)
            start = time.perf_counter()
        nbytes = x.numel() * x.element_size()
        storage = x.untyped_storage()
        # A view of a storage not much larger than itself keeps that storage's layout (its
        # strides, offset and the bytes around it), so that ops that read storage, such as
        # as_strided, see what they would see in x; anything else is copied contiguous.
        whole = nbytes > 0 and storage.nbytes() != nbytes and storage.nbytes() <= max(4 * nbytes, 1 << 12)
        obj = self._alloc(storage.nbytes() if whole else nbytes, born)
        if whole:
            stride, offset = x.stride(), x.storage_offset() * x.element_size()
        else:
            stride, offset = torch.empty(x.shape, dtype=x.dtype, device="meta").stride(), 0
        ticket, addr, _ = self._native.open(obj.id, True, True)  # copied in whole
        try:
            if whole:
                src = torch.empty(0, dtype=torch.uint8).set_(storage)
                plain_over(addr, obj.nbytes, torch.uint8, (storage.nbytes(),), (1,), 0).copy_(src)
            else:
                plain_over(addr, obj.nbytes, x.dtype, x.shape, stride, 0).copy_(x)
            self._native.charge([(obj.id, 0, nbytes)], 1)
        finally:
            self._native.close(ticket)
        if watched:
            after: list[int] = []
            for h in hooks["op_closing"]:
                after += h(pos) or ()
            refused = 0
            if after:  # the copy-in is not one op_open/op_close pair: its evictions cross on their own
                try:
                    self._native.plan_moves([], after)
                except TiermemError:
                    refused = len(after)
                    self._stats["observer_evictions_refused"] += refused
            sig = f"input|{x.dtype}|{list(x.shape)}"
            event = OpEnd(pos, "input", [(obj, "make")], time.perf_counter() - start, [], lambda: sig, refused)
            for h in hooks["op_end"]:
                h(event)
        rg = x.requires_grad if requires_grad is None else requires_grad
        return TieredTensor(obj, x.shape, stride, offset, x.dtype, requires_grad=rg)

    def to_plain(self, t: TieredTensor) -> torch.Tensor:
        """An ordinary contiguous copy of a tiered tensor."""
        obj = t._obj
        ticket, addr, _ = self._native.open(obj.id, False)
        try:
            out = plain_over(addr, obj.nbytes, t.dtype, t.shape, t.stride(), t._off).clone(memory_format=torch.contiguous_format)
            self._native.charge([(obj.id, min(obj.nbytes, out.numel() * out.element_size()), 0)], 1)
        finally:
            self._native.close(ticket)
        return out

    # ------------------------------------------------------------------ wrapping

    def module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Make ``model``'s parameters and buffers tiered (in place; shared ones stay shared)
        and its inputs tiered on the way in. Returns ``model``."""
        memo: dict[int, torch.Tensor] = {}
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    if id(p) not in memo:
                        memo[id(p)] = torch.nn.Parameter(
                            self._tensor(p.detach(), None, kernel=False), requires_grad=p.requires_grad
                        )
                    mod._parameters[name] = memo[id(p)]  # type: ignore[assignment]
            for name, b in list(mod._buffers.items()):
                if b is not None:
                    if id(b) not in memo:
                        memo[id(b)] = self._tensor(b, None, kernel=False)
                    mod._buffers[name] = memo[id(b)]
        model.register_forward_pre_hook(_TierInputs(self))
        if self._naming:
            self._name_module(model)
        return model

    def _name_module(self, model: torch.nn.Module) -> None:
        """Label the model's parameters and buffers by name, and track the module running."""
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if isinstance(t, TieredTensor):
                self.labels.setdefault(t._obj.id, name)
        for name, mod in model.named_modules():
            mod.register_forward_pre_hook(_Scope(self, name or type(model).__name__, True))
            mod.register_forward_hook(_Scope(self, name or type(model).__name__, False))

    def _name_state(self, opt: torch.optim.Optimizer) -> None:
        """Label the optimizer's state by its parameters' names ("exp_avg of fc.weight")."""
        labels = self.labels
        for p, state in opt.state.items():
            owner = labels.get(p._obj.id) if isinstance(p, TieredTensor) else None
            if owner is None:
                continue
            for k, v in state.items():
                if isinstance(v, TieredTensor) and v._obj.id not in labels:
                    labels[v._obj.id] = f"{k} of {owner}"

    def __deepcopy__(self, memo: dict[int, Any]) -> Tiering:
        # A deep copy of a tiered model (an EMA copy) lives in the same tiering.
        return self

    def __reduce__(self) -> Any:
        raise InvalidArgumentError(
            "a Tiering holds memory and cannot be pickled; torch.save(model) saves a tiered model's tensors as plain "
            "ones, and its state_dict() is plain too"
        )

    def _wrap_inputs(self, module: Any, args: tuple) -> tuple:
        # Meta tensors (a check's trace of the model) pass through: they hold no data.
        return tree_map(
            lambda x: self.tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, TieredTensor) and not x.is_meta else x,
            args,
        )

    def optimizer(self, opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Mark the end of an iteration after every ``opt.step()``. Returns ``opt``."""
        for g in opt.param_groups:
            for p in g["params"]:
                if not isinstance(p, TieredTensor):
                    raise InvalidArgumentError(
                        "the optimizer holds a parameter that is not tiered: build it from "
                        "model.parameters() after tiering.module(model)"
                    )
        if self._naming:
            opt.register_step_post_hook(lambda o, *_: self._name_state(o))
        opt.register_step_post_hook(lambda *_: self.end_iteration())
        return opt

    def _collect(self) -> int:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for oid in pending:
            self._free(oid)
        self._stats["freed_late"] += len(pending)
        return len(pending)

    def end_iteration(self) -> None:
        """Free what waited for the end of the iteration (variant ``L``) and start the next
        iteration (every observer is told)."""
        self._collect()
        self.iteration += 1
        self._pos = 0
        for h in self._hooks["iteration"]:
            h(self.iteration)

    def close(self) -> None:
        """Close every observer (copy threads stop) and free every pending object; later
        frees are ignored."""
        if self._closed:
            return
        for h in self._hooks["close"]:
            h()
        self.end_iteration()
        self._closed = True

    def stats(self) -> dict[str, Any]:
        """Op counts (``.out`` ops, fallbacks and their bytes, views, in-place), frees, and
        each observer's counts under its name (the copy thread's ``lookahead``, a plan's
        ``plan``)."""
        s: dict[str, Any] = dict(self._stats)
        s["fallbacks"] = dict(self.fallbacks)
        for o in self.observers:
            st = o.stats()
            if st is not None:
                s[o.name] = st
        return s

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one ATen op whose operands include tiered tensors (see the module docs)."""
        info = op_info(func)
        if info.kind == "view":
            materialize = MATERIALIZED_VIEWS.get(info.name)
            if materialize is not None:
                return self.dispatch(materialize, args, kwargs)
            self._stats["view_ops"] += 1
            return self._view(func, args, kwargs)
        if info.kind == "metadata":
            if info.name.split(".")[0] not in INPLACE_VIEWS:
                raise InvalidArgumentError(
                    f"{info.name} changes a tiered tensor's shape or storage in place; use the "
                    "out-of-place form (e.g. reshape() instead of resize_())"
                )
            # Another view of the same object: the tensor takes the view its out-of-place
            # twin gives.
            x = args[0]
            v = self._view(inplace_twin(func), args, kwargs)
            x.data = v
            return x
        return self._run(func, info, args, kwargs)

    def _view(self, func: Any, args: tuple, kwargs: dict) -> Any:
        flat, _ = flat_args(args, kwargs)
        src = None
        metas = []
        for x in flat:
            if isinstance(x, TieredTensor) and src is not None:
                # Another tiered operand (tensor_split's index tensor) is read, not viewed.
                metas.append(x.to_plain())
                continue
            if isinstance(x, TieredTensor):
                src = x
            metas.append(_meta(x))
        a, k = rebuild_args(args, kwargs, metas)
        res = func(*a, **k)
        assert src is not None
        obj = src._obj

        def wrap(r: Any) -> Any:
            if isinstance(r, torch.Tensor):
                return TieredTensor(obj, r.shape, r.stride(), r.storage_offset() * r.element_size(), r.dtype)
            return r

        return type(res)(wrap(r) for r in res) if isinstance(res, (list, tuple)) else wrap(res)

    def _plan(self, func: Any, args: tuple, kwargs: dict, flat: list, lens: tuple) -> tuple[Any, Any]:
        """The op's cache key and its output ``(shape, stride, dtype, object bytes)`` per
        return (None where the op returns none, or its ``.out`` overload was refused), from
        a run on the meta device; cached per op and operand metadata."""
        key_parts: list[Any] = [func, len(args), tuple(kwargs), lens]
        for x in flat:
            if isinstance(x, TieredTensor):
                key_parts.append(x._key)
            elif isinstance(x, torch.Tensor):
                key_parts.append((tuple(x.shape), x.stride(), x.dtype, x.storage_offset() * x.element_size()))
            else:
                key_parts.append(x)
        key: tuple | None = tuple(key_parts)
        try:
            plan = self._plans.get(key, _UNPLANNED)
        except TypeError:  # an unhashable argument: not cached
            key, plan = None, _UNPLANNED
        if plan is not _UNPLANNED:
            return key, plan
        metas = [_meta(x) for x in flat]
        a, k = rebuild_args(args, kwargs, metas)
        try:
            res = func(*a, **k)
        except Exception:
            plan = None
        else:
            rs = res if isinstance(res, (tuple, list)) else (res,)
            # An undefined result (e.g. a gradient convolution_backward was told to skip)
            # cannot be passed as an .out argument: such calls run the plain op.
            plan = (
                None
                if any(r is None for r in rs)
                else tuple(
                    (tuple(r.shape), r.stride(), r.dtype, _round(span_bytes(r.shape, r.stride(), r.element_size()))) for r in rs
                )
            )
        if key is not None:
            self._plans[key] = plan
        return key, plan

    def _run(self, func: Any, info: OpInfo, args: tuple, kwargs: dict) -> Any:
        flat, lens = flat_args(args, kwargs)
        written = self._written(func, info, args, kwargs) if info.written else ()
        operands: dict[int, _Operand] = {}
        nested = False
        for x in flat:
            if isinstance(x, torch.Tensor) and not isinstance(x, TieredTensor):
                if x.layout != torch.strided:
                    raise InvalidArgumentError(
                        f"{info.name}: an operand is a {x.layout} tensor, which tiered tensors cannot be combined with"
                    )
                nested = nested or x.is_nested
            if isinstance(x, TieredTensor):
                obj = x._obj
                op = operands.get(id(obj))
                if op is None:
                    if obj.tiering is not self:
                        raise InvalidArgumentError(
                            f"{info.name}: an operand belongs to another Tiering (its own manager); "
                            "copy it over with tiering.tensor(t.to_plain()) first"
                        )
                    op = operands[id(obj)] = _Operand(obj)
                op.read_bytes += x._span
                if written and id(x) in written:
                    op.write = True
                    op.written_bytes += x._span
        plan = plan_key = None
        skipped: tuple[int, ...] = ()
        dead: list[TensorObject] = []
        unless = OUT_UNLESS.get(info.name)
        # A nested operand has no meta run to plan from: the op runs as itself.
        if info.kind == "functional" and info.out is not None and not nested and (unless is None or unless(args, kwargs)):
            plan_key, plan = self._plan(func, args, kwargs, flat, lens)
            if plan is None and info.name == "convolution_backward.default" and len(args) > 10:
                # A gradient it was told to skip is undefined, which no .out argument can
                # be: compute it too (a bias sum, or the first layer's input gradient) into
                # tiered memory and drop it.
                mask = list(args[10])
                skipped = tuple(i for i, m in enumerate(mask) if not m)
                bias = [args[0].shape[1]]  # a bias gradient has one value per output channel
                args = (*args[:3], bias, *args[4:10], [True] * len(mask), *args[11:])
                flat, lens = flat_args(args, kwargs)
                plan_key, plan = self._plan(func, args, kwargs, flat, lens)
        pos = self._pos
        self._pos += 1
        self._stats["ops"] += 1
        if plan is not None and self.variant.budget:
            self._check_budget(info, plan, operands)
        hooks = self._hooks
        moves = None
        soft_now = self.soft_evicts_now()
        if hooks["op_start"]:
            objs = [op.obj for op in operands.values()]
            for h in hooks["op_start"]:
                m = h(pos, info.name, objs)
                if m is not None:
                    moves = m if moves is None else Moves(moves.prefetch + m.prefetch, moves.evict + m.evict)
        start = time.perf_counter() if self._timed else 0.0
        # One crossing opens the op: an observer's moves, every operand's guard and every
        # planned output (made first when guards bring inputs into fast memory (P), so outputs
        # take fast memory first; else after, so making room for them cannot evict this op's
        # own inputs).
        trace = (pos, info.number, soft_now) if self.tracing else None
        tickets, outs, pouts, done = self._open_op(operands, plan, pos, moves, trace)
        for h in hooks["op_open"]:
            h(pos, done)
        try:
            plains: dict[int, Any] = {}
            views = self._views
            leaves = []
            for x in flat:
                if isinstance(x, TieredTensor):
                    obj = x._obj
                    key = (operands[id(obj)].addr, obj.nbytes, x._key)
                    p = views.get(key)
                    if p is None or plains.get(id(p), x) is not x:
                        # Two tiered tensors with the same view of one object: each gets its
                        # own plain tensor, so results map back to the right one.
                        p = _view_over(views, key, cache=p is None)
                    plains[id(p)] = x
                    leaves.append(p)
                else:
                    leaves.append(x)
            a, k = (tuple(leaves), kwargs) if not lens and not kwargs else rebuild_args(args, kwargs, leaves)
            res = None
            if plan is not None:
                ptrs = [p.data_ptr() for p in pouts]
                try:
                    res = info.out(*a, **k, **dict(zip(info.out_names, pouts)))
                    _check_not_resized(info, plan, pouts, ptrs)
                except RuntimeError as e:
                    # The .out overload's contract differs from the functional op's (an
                    # output dtype: LayerNorm's statistics in bfloat16; an optional output
                    # left undefined; a loss with a reduction resizing its output to the
                    # input's shape): this op and operand signature runs the functional op
                    # from now on, and its outputs made for .out are dropped.
                    self._refuse_out(info.name, plan_key, e)
                    # The kernel may have resized some outputs' cached plain views before
                    # it refused another: drop them all.
                    self._views.clear()
                    dead, outs, plan = outs, [], None
            if plan is not None:
                result = self._adopt_out(info, res, pouts, outs)
                if skipped:
                    result = tuple(None if i in skipped else r for i, r in enumerate(result))
                self._stats["out_ops"] += 1
            else:
                res = func(*a, **k)
                if info.kind == "inplace":
                    self._stats["inplace_ops"] += 1
                result = self._adopt(info, res, plains, operands, outs, tickets, pos)
        except BaseException:
            self._native.op_close(tickets, [], self.threads, [])
            for o in outs + dead:  # what this op allocated is dead: free it now, whatever the variant
                o.tiering = None  # type: ignore[assignment]
                self._free(o.id)
            raise
        charges = [(op.obj.id, op.read_bytes, op.written_bytes) for op in operands.values()]
        charges += [(o.id, 0, o.nbytes) for o in outs]
        soft: list[TensorObject] = []
        if soft_now:
            soft = [op.obj for op in operands.values() if not op.write]
        after: list[int] = []
        for h in hooks["op_closing"]:
            after += h(pos) or ()
        # One crossing closes it: charges, every guard, soft-evictions, an observer's evictions.
        refused = self._native.op_close(tickets, charges, self.threads, [o.id for o in soft], after)
        if refused:
            self._stats["observer_evictions_refused"] += refused
        for o in dead:
            o.tiering = None  # type: ignore[assignment]
            self._free(o.id)
        if soft:
            for h in hooks["softevicted"]:
                h(pos, soft)
        if hooks["op_end"]:
            uses = [(op.obj, "write" if op.write else "read") for op in operands.values()]
            uses += [(o, "make") for o in outs]
            elapsed = time.perf_counter() - start if self._timed else 0.0
            event = OpEnd(pos, info.name, uses, elapsed, soft, lambda: signature(info.name, flat, lens, kwargs), refused)
            for h in hooks["op_end"]:
                h(event)
        return result

    def soft_evicts_now(self) -> bool:
        """Whether the op now running soft-evicts its read inputs after it: a forward op
        (grad enabled, outside backward) under a variant that soft-evicts (Listing 4.6)."""
        return self.variant.softevict and torch.is_grad_enabled() and torch._C._current_autograd_node() is None

    def _refuse_out(self, name: str, key: Any, error: BaseException) -> None:
        """Run op ``name`` with this key's operands as the functional op from now on (its
        ``.out`` overload refused the outputs the meta run gave), and count it."""
        if key is not None:
            self._plans[key] = None
        self._stats["out_refused"] += 1
        self.out_refused.setdefault(name, str(error).split("\n")[0][:200])

    @staticmethod
    def _written(func: Any, info: OpInfo, args: tuple, kwargs: dict) -> set[int]:
        """Ids of the tiered tensors the op writes (its schema's ``(a!)`` arguments)."""
        written = set()
        bound = _bind(func, args, kwargs)
        for name in info.written:
            v = bound.get(name)
            for t in v if isinstance(v, (list, tuple)) else (v,):
                if isinstance(t, TieredTensor):
                    written.add(id(t))
        return written

    def _open_op(
        self,
        operands: dict[int, _Operand],
        plan: Any,
        pos: int,
        moves: Moves | None,
        trace: tuple[int, int, bool] | None = None,
    ) -> tuple[list[int], list[TensorObject], list[torch.Tensor], tuple[int, int]]:
        """Make an observer's ``moves``, open every operand's guard and make and open the
        planned outputs, in one call (which tells the core's trace follower of the op:
        ``trace``). Returns the tickets, the outputs' objects, plain tensors over them and
        how the moves went (``(missed, refused)``)."""
        inputs = [(op.obj.id, op.write) for op in operands.values()]
        sizes = [nb for _, _, _, nb in plan or ()]
        where: int | list[int] = _FAST if self.variant.local else _SLOW
        offsets: list[int | None] = []
        if self._placer is not None and sizes:
            where, offsets = self._placer.place(pos, 0, sizes)
        try:
            tickets, addrs, ids, done = self._native.op_open(inputs, (sizes, where, offsets), self.variant.prefetch, moves, trace)
        except DeviceFullError:
            # Without prompt freeing, dead tensors wait for the end of the iteration, like
            # garbage waiting for a collector; when memory runs out, collect now (as the
            # thesis's runtime ran the GC when its heap filled). The moves were made.
            if not self._collect():
                raise
            tickets, addrs, ids, _ = self._native.op_open(inputs, (sizes, where, offsets), self.variant.prefetch, None, trace)
            done = _NO_MOVES
        for op, addr in zip(operands.values(), addrs):
            op.addr = addr
        outs, pouts = [], []
        views = self._views
        n_in = len(inputs)
        made = self._hooks["made"]
        for k, (oid, (shape, stride, dtype, nb)) in enumerate(zip(ids, plan or ())):
            o = TensorObject(self, oid, nb, (self.iteration, pos, k))
            outs.append(o)
            for h in made:
                h(pos, k, o)
            key = (addrs[n_in + k], nb, (shape, stride, dtype, 0))
            p = views.get(key)
            pouts.append(p if p is not None else _view_over(views, key))
        return tickets, outs, pouts, done

    def _check_budget(self, info: OpInfo, plan: Any, operands: dict[int, _Operand]) -> None:
        need = _NEEDS.get(plan)
        if need is None:
            if len(_NEEDS) >= _MAX_VIEWS:
                _NEEDS.clear()
            need = _NEEDS[plan] = sum(span_bytes(s, st, itemsize(d)) for s, st, d, _ in plan)
        if need > self.budget:
            raise BudgetError(
                budget_message(info.name, [op.obj.nbytes for op in operands.values()], [need], self.budget, self._fast)
            )

    def _adopt_out(self, info: OpInfo, res: Any, pouts: list, outs: list) -> Any:
        """Wrap an ``.out`` call's results (the kernel wrote where it was told: see
        :func:`_check_not_resized`)."""
        rs = res if isinstance(res, (tuple, list)) else (res,)
        wrapped = []
        for r, p, o in zip(rs, pouts, outs):
            if r is not p and (r.data_ptr() != p.data_ptr() or r.stride() != p.stride() or r.shape != p.shape):
                raise InvalidArgumentError(
                    f"{info.name}: the .out kernel returned another tensor than its output; this op cannot run on tiered tensors"
                )
            wrapped.append(TieredTensor(o, r.shape, r.stride(), 0, r.dtype))
        return tuple(wrapped) if isinstance(res, (tuple, list)) else wrapped[0]

    def _adopt(self, info: OpInfo, res: Any, plains: dict, operands: dict, outs: list, opened: list, pos: int) -> Any:
        """Wrap an op's plain results: returned operands map back to their tiered tensors,
        views of operands become tiered views, new tensors are copied into tiered memory."""
        counter = [0]

        def wrap(r: Any) -> Any:
            if not isinstance(r, torch.Tensor):
                return r
            if id(r) in plains:
                return plains[id(r)]
            if r.layout != torch.strided:
                raise InvalidArgumentError(f"{info.name} returns a {r.layout} tensor, which tiered memory cannot hold")
            if r.is_nested:
                # A nested tensor (a transformer's padded-batch fast path) stays plain: it
                # may not alias an operand, whose memory is pinned only while the op runs.
                return self._nested_result(info, r, operands)
            ptr = r.data_ptr()
            for op in operands.values():
                if op.addr <= ptr < op.addr + op.obj.nbytes:
                    return TieredTensor(op.obj, r.shape, r.stride(), ptr - op.addr, r.dtype)
            nb = span_bytes(r.shape, r.stride(), r.element_size())
            o = self._alloc(nb, (self.iteration, pos, counter[0]))
            counter[0] += 1
            outs.append(o)
            ticket, addr, _ = self._native.open(o.id, True, True)
            opened.append(ticket)
            plain_over(addr, o.nbytes, r.dtype, r.shape, r.stride(), 0).copy_(r)
            self._stats["fallback_bytes"] += nb
            return TieredTensor(o, r.shape, r.stride(), 0, r.dtype)

        out = tree_map(wrap, res)
        if counter[0]:
            self._stats["fallback_ops"] += 1
            self.fallbacks[info.name] = self.fallbacks.get(info.name, 0) + 1
        return out

    @staticmethod
    def _nested_result(info: OpInfo, r: torch.Tensor, operands: dict) -> torch.Tensor:
        storage = r.untyped_storage()
        lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        for op in operands.values():
            if op.addr < hi and lo < op.addr + op.obj.nbytes:
                raise InvalidArgumentError(
                    f"{info.name} returns a nested tensor over a tiered operand's memory, which tiered memory cannot hold"
                )
        return r

    # ------------------------------------------------------------------ checks

    def check(self, model: torch.nn.Module, *inputs: Any, loss: Callable[[Any], torch.Tensor] | None = None) -> dict[str, Any]:
        """Trace one training step of ``model`` (tiered or not) on the meta device (no memory
        is used; tensors the forward makes, such as a mask from ``torch.ones``, are traced
        too) and raise :class:`~tiermem.BudgetError` naming the first op whose outputs
        exceed the fast budget. Returns the op count and the largest op's output bytes.
        Raises :class:`~tiermem.InvalidArgumentError` naming why when the step cannot be
        traced (an op the meta device has no kernel for, data-dependent control flow)."""
        try:
            seen = trace_step(model, inputs, loss)
        except Exception as e:
            raise InvalidArgumentError(
                f"check: one step of {type(model).__name__} cannot be traced on the meta device "
                f"({type(e).__name__}: {e}); its budget is checked op by op as it runs"
            ) from e
        worst = max(seen, key=lambda s: s[1], default=("none", 0, []))
        first = next((s for s in seen if s[1] > self.budget), None)
        if self.variant.budget and first is not None:
            raise BudgetError(budget_message(first[0], first[2], [first[1]], self.budget, self._fast))
        return {"traced": True, "ops": len(seen), "largest_op": worst[0], "largest_op_output_bytes": worst[1]}
