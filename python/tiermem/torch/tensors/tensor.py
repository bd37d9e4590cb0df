"""Tiered tensors: ``torch.Tensor`` subclasses whose bytes are a tiermem object.

A :class:`TieredTensor` is a wrapper subclass: it carries shape, strides, dtype and an
offset into one tiermem object (:class:`TensorObject`), and no storage of its own. Views of
it (``t()``, ``view``, slicing, ``detach``) share the object. Every ATen op on it goes
through :meth:`TieredTensor.__torch_dispatch__` to its :class:`~tiermem.torch.tensors.tiering.Tiering`,
which pins the operands for the length of the op (see that module).

The object is freed when the last tensor over it is garbage (CPython frees promptly), or,
without prompt freeing, at the end of the iteration.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...array import _ArrayInterface
from ...exceptions import InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    from .tiering import Tiering

__all__ = ["TieredTensor", "TensorObject", "plain_over", "itemsize", "flat_args", "rebuild_args", "signature"]


class TensorObject:
    """One tiermem object holding the bytes of one or more tiered tensors (a base and its
    views). Its lifetime is the lifetime of those tensors."""

    __slots__ = ("tiering", "id", "nbytes", "born", "__weakref__")

    def __init__(self, tiering: Tiering, obj_id: int, nbytes: int, born: tuple[int, int, int] | None) -> None:
        self.tiering = tiering
        self.id = obj_id
        self.nbytes = nbytes
        #: ``(iteration, op position, output index)`` of the op that made it, for look-ahead.
        self.born = born

    def __del__(self) -> None:
        t = getattr(self, "tiering", None)
        if t is not None:
            t._release(self.id)


def plain_over(addr: int, obj_nbytes: int, dtype: torch.dtype, size: Any, stride: Any, offset: int) -> torch.Tensor:
    """An ordinary tensor over ``obj_nbytes`` bytes at ``addr``, viewed as ``dtype`` with the
    given size, strides and byte offset. Valid only while the object is pinned."""
    raw = np.asarray(_ArrayInterface(addr, (obj_nbytes,), np.dtype(np.uint8), False, None))
    flat = torch.from_numpy(raw)
    isz = itemsize(dtype)
    if isz > 1:
        usable = obj_nbytes - obj_nbytes % isz
        flat = flat[:usable].view(dtype)
    elif dtype != torch.uint8:
        flat = flat.view(dtype)
    return flat.as_strided(size, stride, offset // isz)


_ITEMSIZE: dict[torch.dtype, int] = {}


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    n = _ITEMSIZE.get(dtype)
    if n is None:
        n = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype, device="meta").element_size()
    return n


def flat_args(args: tuple, kwargs: dict) -> tuple[list[Any], tuple[int, ...]]:
    """The leaves of an ATen call's arguments (lists of tensors or numbers are one level
    deep) and the lengths of its lists, which with the op fix the structure."""
    leaves: list[Any] = []
    lens: list[int] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            leaves.extend(a)
            lens.append(len(a))
        else:
            leaves.append(a)
    return leaves, tuple(lens)


def rebuild_args(args: tuple, kwargs: dict, leaves: list[Any]) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with their leaves replaced, in :func:`flat_args` order."""
    it = iter(leaves)

    def take(a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return [next(it) for _ in a]
        return next(it)

    new_args = tuple(take(a) for a in args)
    return new_args, {k: take(v) for k, v in kwargs.items()}


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


def span_bytes(size: Any, stride: Any, itemsize: int) -> int:
    """Bytes from the first to one past the last element a strided view can reach."""
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((n - 1) * abs(st) for n, st in zip(size, stride))) * itemsize


#: ``span_bytes`` of a view's ``(size, stride, dtype, offset)`` key, for the keys seen
#: (a step's views repeat every iteration). Bounded: cleared when full.
_SPANS: dict[tuple, int] = {}
_SPANS_MAX = 1 << 16
_CPU = torch.device("cpu")


class TieredTensor(torch.Tensor):
    """A tensor whose data is a tiermem object placed by a policy.

    Made by :meth:`Tiering.tensor`, :meth:`Tiering.module` (parameters and buffers) and by
    every op whose operands include one. Works wherever a CPU tensor does (autograd,
    ``torch.nn``, ``torch.optim``). ``to_plain()`` copies it into an ordinary tensor;
    pickling and ``torch.save`` store that copy.
    """

    _obj: TensorObject
    _off: int
    #: ``(size, stride, dtype, byte offset)``: what a plain view over the object needs, and
    #: the dispatch caches' key (a tiered tensor's metadata never changes).
    _key: tuple[tuple[int, ...], tuple[int, ...], torch.dtype, int]
    #: Bytes of the object the view can reach.
    _span: int

    @staticmethod
    def __new__(
        cls, obj: TensorObject, size: Any, stride: Any, offset: int, dtype: torch.dtype, requires_grad: bool = False
    ) -> TieredTensor:
        isz = _ITEMSIZE.get(dtype) or itemsize(dtype)
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            size,
            strides=stride,
            storage_offset=offset // isz,
            dtype=dtype,
            device=_CPU,
            requires_grad=requires_grad,
        )
        r._obj = obj
        r._off = offset
        key = (tuple(size), tuple(stride), dtype, offset)
        r._key = key
        span = _SPANS.get(key)
        if span is None:
            if len(_SPANS) >= _SPANS_MAX:
                _SPANS.clear()
            span = _SPANS[key] = span_bytes(key[0], key[1], isz)
        r._span = min(span, obj.nbytes)
        return r

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    @torch.compiler.disable(recursive=True)
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # Not traced by torch.compile: an op on tiered tensors runs eagerly, through tiermem
        # (see EagerFallbackWarning).
        tiering = _find_tiering(args, kwargs)
        return tiering.dispatch(func, args, kwargs or {})

    @property
    def tiering(self) -> Tiering:
        """The :class:`~tiermem.torch.tensors.tiering.Tiering` that manages this tensor."""
        return self._obj.tiering

    @property
    def object_id(self) -> int:
        """Id of the tiermem object holding the data."""
        return self._obj.id

    @property
    def tier(self) -> str:
        """Name of the device holding the data now."""
        t = self._obj.tiering
        return t.manager.device_names[t.manager._native.placement(self._obj.id)[0]]

    def to_plain(self) -> torch.Tensor:
        """A copy in an ordinary tensor (same shape, strides made contiguous)."""
        return self._obj.tiering.to_plain(self)

    @property
    def data(self) -> torch.Tensor:
        """The tensor without autograd history (a tiered view of the same object)."""
        return torch._C.TensorBase.data.__get__(self)  # type: ignore[attr-defined]

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        # `module.to(dtype)` and friends replace a parameter's data in place: the wrapper
        # takes the new tensor's metadata, and this object its tiermem object and view.
        if not isinstance(new, TieredTensor):
            if not isinstance(new, torch.Tensor):
                raise InvalidArgumentError(f"data must be a tensor, not {type(new).__name__}")
            new = self._obj.tiering._tensor(new, None, kernel=False)
        torch._C.TensorBase.data.__set__(self, new)  # type: ignore[attr-defined]
        self._obj, self._off, self._key, self._span = new._obj, new._off, new._key, new._span

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The values as a NumPy array (a copy: tiered memory may move), as
        ``torch.Tensor.numpy`` refuses a tensor that requires grad unless ``force``."""
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self.to_plain().numpy()

    def tolist(self) -> Any:
        """The values as (nested) Python numbers."""
        return self.to_plain().tolist()

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        """A copy in the same tiering (an EMA copy of a model stays tiered; a parameter's
        copy is a parameter)."""
        if id(self) in memo:
            return memo[id(self)]
        out: torch.Tensor = self._obj.tiering._tensor(self.to_plain(), self.requires_grad, kernel=False)
        if isinstance(self, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=self.requires_grad)
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, proto: Any) -> Any:
        # Pickled (torch.save) as the plain tensor of its values, a parameter as a plain
        # parameter: a file holds no tiering.
        plain = self.to_plain()
        if isinstance(self, torch.nn.Parameter):
            plain = torch.nn.Parameter(plain, requires_grad=self.requires_grad)
        return plain.__reduce_ex__(proto)

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        try:
            where = self.tier
        except Exception:
            where = "?"
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"TieredTensor(shape={tuple(self.shape)}, dtype={self.dtype}, on={where!r}{grad})"


def _find_tiering(args: Any, kwargs: Any) -> Tiering:
    if args and isinstance(args[0], TieredTensor):  # the usual case
        return args[0]._obj.tiering
    stack = [args, kwargs]
    while stack:
        x = stack.pop()
        if isinstance(x, TieredTensor):
            return x._obj.tiering
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    raise InvalidArgumentError("an op reached TieredTensor dispatch without a tiered operand")


def check_supported(t: torch.Tensor, what: str) -> None:
    """Refuse tensors tiered memory cannot hold, naming why."""
    if t.layout != torch.strided:
        raise InvalidArgumentError(f"{what}: layout {t.layout} cannot be tiered (only dense strided tensors)")
    if t.device.type != "cpu":
        raise InvalidArgumentError(f"{what}: on {t.device}; tiered tensors live in host memory (pass a CPU tensor)")
    if t.is_quantized:
        raise InvalidArgumentError(f"{what}: quantized tensors cannot be tiered")
    if math.prod(t.shape) and t.element_size() == 0:
        raise InvalidArgumentError(f"{what}: dtype {t.dtype} has no fixed size")
