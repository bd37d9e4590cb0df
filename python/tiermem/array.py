"""Tiered arrays: n-dimensional arrays whose bytes the manager places and moves.

Data is reached only inside a guard::

    with arr.write() as v:     # a numpy view, exclusive, marks the array dirty
        v[:] = 1
    with arr.read() as v:      # a read-only numpy view, shared
        total = v.sum()

While a guard is open the array is pinned: it is never moved, evicted or freed. The view
(and every view sliced from it) raises :class:`~tiermem.GuardError` once the guard has
closed, so data that may since have moved is never read or written through it.
"""

from __future__ import annotations

import math
import sys
import weakref
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .exceptions import GuardError, InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager

__all__ = ["TieredArray", "Guard", "GuardedArray"]


class _Lease:
    """Liveness shared by a guard and every array derived from its view; ``derived`` holds
    (weakly) the checked views derived from it, so the guard can tell at close whether any
    outlives it."""

    __slots__ = ("live", "what", "derived")

    def __init__(self, what: str) -> None:
        self.live = True
        self.what = what
        self.derived: dict[int, weakref.ref[Any]] = {}

    def add(self, view: Any) -> None:
        """Track a checked view derived while the guard is open (until it dies)."""
        key = id(view)
        derived = self.derived

        def forget(_: Any, k: int = key) -> None:
            derived.pop(k, None)

        self.derived[key] = weakref.ref(view, forget)

    def check(self) -> None:
        if not self.live:
            raise GuardError(
                f"view of {self.what} used after its guard closed; open a new "
                "`with arr.read()` / `with arr.write()` (the data may have moved)"
            )


def _check_all(objs: Any) -> None:
    for o in objs:
        if isinstance(o, GuardedArray):
            o._check()
        elif isinstance(o, (list, tuple)):
            _check_all(o)


def _plain(o: Any) -> Any:
    if isinstance(o, GuardedArray):
        return o.view(np.ndarray)
    if isinstance(o, tuple):
        return tuple(_plain(x) for x in o)
    if isinstance(o, list):
        return [_plain(x) for x in o]
    return o


class GuardedArray(np.ndarray):
    """A numpy view of tiered memory that refuses use after its guard closes.

    Indexing, arithmetic, ufuncs, numpy functions, printing and conversions check the
    guard. ``arr.view(np.ndarray)`` and ``np.asarray(arr)`` (which numpy answers without
    asking the subclass) strip the check: do not keep such a view past the guard. Even then
    the device memory stays mapped while any view exists, so a stale view reads stale bytes,
    never unmapped memory.
    """

    _lease: _Lease | None

    def __array_finalize__(self, obj: Any) -> None:
        self._lease = getattr(obj, "_lease", None)
        if self._lease is not None and self._lease.live:
            self._lease.add(self)

    def _check(self) -> None:
        if self._lease is not None:
            self._lease.check()

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        _check_all(inputs)
        out = kwargs.get("out")
        if out is not None:
            _check_all(out)
            kwargs["out"] = _plain(out)
        result = getattr(ufunc, method)(*_plain(inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        _check_all(args)
        _check_all(kwargs.values())
        return func(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})

    def __getitem__(self, key: Any) -> Any:
        self._check()
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check()
        _check_all((value,))
        super().__setitem__(key, _plain(value))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:  # type: ignore[override]
        self._check()
        a = self.view(np.ndarray)
        return a if dtype is None else a.astype(dtype, copy=bool(copy))

    def __iter__(self) -> Any:
        self._check()
        return super().__iter__()

    def __repr__(self) -> str:
        self._check()
        return "Guarded" + repr(self.view(np.ndarray))

    def __str__(self) -> str:
        self._check()
        return str(self.view(np.ndarray))

    def __reduce__(self) -> Any:
        self._check()
        return self.view(np.ndarray).copy().__reduce__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self.view(np.ndarray).__dlpack__(*args, **kwargs)

    def __buffer__(self, flags: int) -> memoryview:
        self._check()
        return memoryview(self.view(np.ndarray))  # type: ignore[arg-type]


def _wrap(name: str) -> Any:
    base = getattr(np.ndarray, name)

    def method(self: GuardedArray, *a: Any, **k: Any) -> Any:
        self._check()
        return base(self.view(np.ndarray), *a, **k)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


# Methods that return views of the same memory keep the subclass (and its lease) when
# called on it directly; every other public method reads or writes data, so it is wrapped to
# check the guard first.
_VIEW_METHODS = {
    "view",
    "reshape",
    "transpose",
    "swapaxes",
    "squeeze",
    "ravel",
    "diagonal",
    "conj",
    "conjugate",
    "setflags",
    "resize",
    "getfield",
}
for _name in sorted(dir(np.ndarray)):
    if _name.startswith("_") or _name in _VIEW_METHODS or not callable(getattr(np.ndarray, _name)):
        continue
    setattr(GuardedArray, _name, _wrap(_name))
for _name in ("__float__", "__int__", "__bool__", "__format__", "__len__", "__contains__"):
    setattr(GuardedArray, _name, _wrap(_name))


class _ArrayInterface:
    """Exposes a raw address to numpy through ``__array_interface__``; keeps the manager
    (and so the device memory) alive as the array's ``base``."""

    __slots__ = ("__array_interface__", "_keep")

    def __init__(self, addr: int, shape: tuple[int, ...], dtype: np.dtype, readonly: bool, keep: Any) -> None:
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "descr": dtype.descr,
            "data": (addr, readonly),
            "version": 3,
        }
        self._keep = keep


class Guard:
    """Context manager returned by :meth:`TieredArray.read` and :meth:`TieredArray.write`.

    Entering pins the array (after the policy has placed it, e.g. brought it to fast
    memory) and yields a view; leaving unpins it and tells the policy it was used. A guard
    closes once.

    A view derived inside the guard may outlive it: a plain ``np.asarray(v)``, a slice
    ``v[2]``, a torch view ``t[0:16]``. Such a view points at the array's memory, so when one
    is alive at close the array is *held* where it is (not moved, evicted or freed; other
    guards still open) until it, and for NumPy the guard's view it came from, are gone: a
    stale view can read stale bytes of this array, never write into another object's memory.
    Views that check their guard (:class:`GuardedArray` slices) also raise
    :class:`~tiermem.GuardError` when used, and hold the array while they live, since a plain
    array can be derived from them. The view of ``with arr.read() as v`` alone does not hold
    the array.
    """

    def __init__(self, array: TieredArray, write: bool, kind: Literal["numpy", "torch"], overwrite: bool = False) -> None:
        if kind not in ("numpy", "torch"):
            raise InvalidArgumentError(f"kind must be 'numpy' or 'torch', got {kind!r}")
        self._array = array
        self._write = write
        self._overwrite = overwrite
        self._kind = kind
        self._lease: _Lease | None = None
        self._ticket: int | None = None
        self._closed = False
        self._tensor: Any = None
        self._view: Any = None
        self._root: Any = None

    def __enter__(self) -> Any:
        if self._closed:
            raise GuardError("this guard was closed already; open a new one with arr.read() / arr.write()")
        if self._lease is not None:
            raise GuardError("this guard is already open; guards are not re-entrant")
        a = self._array
        native = a._manager._native
        ticket, addr, nbytes = native.open(a.id, self._write, self._overwrite)
        try:
            self._lease = _Lease(f"array {a.id}")
            if self._kind == "torch":
                import torch

                # A tensor cannot be read-only, so a torch view is always mapped writable;
                # writing through one from a read guard is not recorded (see the docs).
                plain = np.asarray(_ArrayInterface(addr, a.shape, a.dtype, False, (native, a)))
                self._root = plain
                self._tensor = torch.from_numpy(plain)
                self._ticket = ticket
                return self._tensor
            plain = np.asarray(_ArrayInterface(addr, a.shape, a.dtype, not self._write, (native, a)))
            view = plain.view(GuardedArray)
            view._lease = self._lease
            self._root = plain
            self._view = view
            self._ticket = ticket
            return view
        except BaseException:
            native.close(ticket)
            self._lease = None
            self._view = self._root = self._tensor = None
            raise

    def _escaped(self) -> Any:
        """The root array every view derived inside the guard keeps alive, if such a view is
        alive now (else None).

        Torch: the handed-out tensor is emptied, so the root lives on only through the
        storage of tensors derived from it. NumPy: a plain array derived from the view has
        the root as its base (numpy collapses bases of one type), so the root has more
        references than the guard's own, getrefcount's argument and the view's base; every
        checked view derived from the view is in the lease's ``derived`` set (and a plain
        array derived from one keeps it alive). The view the caller named alone holds
        nothing."""
        root, view = self._root, self._view
        self._root = self._view = None
        if self._kind == "torch":
            ref = weakref.ref(root)
            del root
            return ref()
        # root: `root` here, getrefcount's argument and the base of `view` (held here, so the
        # count does not depend on whether the caller still names it).
        escaped = sys.getrefcount(root) > 3 or (self._lease is not None and len(self._lease.derived) > 0)
        del view
        return root if escaped else None

    def __exit__(self, *exc: Any) -> None:
        if self._closed or self._lease is None:
            raise GuardError("this guard is not open (a guard closes once)")
        self._lease.live = False
        self._closed = True
        if self._tensor is not None:
            # Detach the tensor from tiered memory: later use sees an empty tensor.
            self._tensor.set_()
            self._tensor = None
        native = self._array._manager._native
        ticket = self._ticket
        assert ticket is not None, "an open guard has a ticket"
        self._ticket = None
        alive = self._escaped()
        if alive is None:
            native.close(ticket)
            return
        native.hold(ticket)
        weakref.finalize(alive, _release, native, ticket)


def _release(native: Any, ticket: int) -> None:
    """Release a hold once the last view derived inside its guard is gone."""
    try:
        native.close(ticket)
    except Exception:
        pass


class TieredArray:
    """An n-dimensional array managed by a :class:`~tiermem.Manager`.

    Create with :meth:`Manager.array`. Reach the data with ``with arr.read()`` or
    ``with arr.write()``. Policy hints: :meth:`prefetch`, :meth:`evict`, :meth:`softevict`,
    :meth:`read_use`, :meth:`write_use`, :meth:`free`.
    """

    def __init__(self, manager: Manager, obj_id: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._manager = manager
        self.id = obj_id
        self.shape = shape
        self.dtype = dtype
        self._freed = False

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def read(self, kind: Literal["numpy", "torch"] = "numpy") -> Guard:
        """A shared read guard yielding a read-only numpy view (or a torch tensor)."""
        return Guard(self, False, kind)

    def write(self, kind: Literal["numpy", "torch"] = "numpy", *, overwrite: bool = False) -> Guard:
        """An exclusive write guard yielding a writable view; closing it marks the data dirty.
        ``overwrite=True`` promises every byte is written and none read first (the old
        contents are dead): a cache model such as the ``2lm_model`` policy then charges
        stores only."""
        return Guard(self, True, kind, overwrite)

    def to_numpy(self) -> np.ndarray:
        """A copy of the data in ordinary memory."""
        with self.read() as v:
            return v.copy()

    def prefetch(self, force: bool = False) -> None:
        """Bring into fast memory; with ``force``, evict other data to make room."""
        self._manager._native.prefetch(self.id, force)

    def evict(self) -> None:
        """Move to the next slower device (copies nothing if a current slow copy exists)."""
        self._manager._native.evict(self.id)

    def softevict(self) -> None:
        """Prefer this array the next time fast memory must make room."""
        self._manager._native.softevict(self.id)

    def read_use(self) -> None:
        """Tell the policy the array was read."""
        self._manager._native.read_use(self.id)

    def write_use(self) -> None:
        """Tell the policy the array was written (marks it dirty)."""
        self._manager._native.write_use(self.id)

    def free(self) -> None:
        """Free now; the data is dead and never written back."""
        if not self._freed:
            self._manager._native.free(self.id)
            self._freed = True

    @property
    def in_fast(self) -> bool:
        """Whether the data is in fast memory (the first device)."""
        return bool(self._manager._native.in_fast(self.id))

    @property
    def device(self) -> str:
        """Name of the device holding the primary copy."""
        return self._manager.device_names[self._manager._native.placement(self.id)[0]]

    @property
    def placement(self) -> dict[str, Any]:
        """Primary device, devices holding sibling copies, dirty flag, open guards."""
        d, sib, dirty, pins = self._manager._native.placement(self.id)
        names = self._manager.device_names
        return {"device": names[d], "siblings": [names[s] for s in sib], "dirty": dirty, "pins": pins}

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise GuardError(
            f"{self!r} has no data outside a guard: use `with arr.read() as v:` for a view or `arr.to_numpy()` for a copy"
        )

    def __getitem__(self, key: Any) -> Any:
        raise GuardError(f"index the view of a guard, not the array: `with arr.read() as v: v[...]` ({self!r})")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise GuardError(f"assign through a write guard: `with arr.write() as v: v[...] = value` ({self!r})")

    def __len__(self) -> int:
        return self.shape[0]

    def __del__(self) -> None:
        if not getattr(self, "_freed", True):
            try:
                self._manager._native.free(self.id)
            except Exception:
                pass

    def __repr__(self) -> str:
        where = "freed" if self._freed else self.device
        return f"TieredArray(id={self.id}, shape={self.shape}, dtype={self.dtype}, on={where!r})"
