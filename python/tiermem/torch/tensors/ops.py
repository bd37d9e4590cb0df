"""What tiered-tensor dispatch needs to know about an ATen op, from its schema (cached).

* **view** ops return an alias of an input and touch no data (``t``, ``view``, ``slice``,
  ``detach``, ``split``, ...): their result shares the input's object.
* **in-place** ops write arguments marked ``(a!)`` and return them (``add_``, ``copy_``).
* **metadata** ops change a tensor's view in place: those of :data:`INPLACE_VIEWS`
  (``squeeze_``, ``t_``, ...) make it the view of the same object their out-of-place twin
  gives; the others (``resize_``, ``set_``) are refused.
* **functional** ops make new tensors. Most have an ``.out`` overload with the same
  arguments plus keyword-only outputs (``convolution.out``, ``addmm.out``,
  ``native_batch_norm.out``): their outputs are allocated in tiered memory and written there
  directly. The rest run normally and their outputs are copied in (counted as fallbacks).
  A few ``.out`` overloads are replaced by a faster exact equivalent (``OUT_REPLACEMENTS``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = ["OpInfo", "op_info", "MATERIALIZED_VIEWS", "OUT_UNLESS", "INPLACE_VIEWS", "inplace_twin"]

# In-place ops that give a tensor another view of its own storage: a tiered tensor takes
# the view its out-of-place twin gives (same object, new sizes and strides). ATen uses them
# on intermediates: matmul of a 1-D operand squeezes its result in place.
INPLACE_VIEWS = {
    "squeeze_": "squeeze",
    "unsqueeze_": "unsqueeze",
    "t_": "t",
    "transpose_": "transpose",
    "swapaxes_": "swapaxes",
    "swapdims_": "swapdims",
    "as_strided_": "as_strided",
}

# Ops that change a tensor's shape or storage in place: a tiered tensor's metadata belongs
# to its wrapper, so these are refused with a clear error (those of INPLACE_VIEWS become
# another view of the same object).
METADATA_INPLACE = {
    "set_",
    "resize_",
    "resize_as_",
    "as_strided_",
    "t_",
    "transpose_",
    "squeeze_",
    "unsqueeze_",
    "swapaxes_",
    "swapdims_",
    "detach_",
    "_resize_output_",
}


# Ops that return an alias of their input although their schemas do not say so: ATen calls
# ``_unsafe_view`` to reshape a tensor it has just made (``matmul``), so running its ``.out``
# overload would copy every such result.
UNMARKED_VIEWS = {"_unsafe_view"}

# Views that set a tensor's conjugate or negative bit (lazy conjugation, ``fft.ifft`` of a
# real input): a tiered view cannot carry the bit, so they run as the ops that materialise
# it, with equal values.
MATERIALIZED_VIEWS: dict[str, Any] = {
    "_conj.default": torch.ops.aten.conj_physical.default,
    "_neg_view.default": torch.ops.aten.neg.default,
}


# Functional ops whose ``.out`` overload makes outputs of other shapes than their meta run
# says under some arguments: batch norm outside training returns empty statistics on the
# CPU (its meta run sizes them by channel). Under those arguments they run as the
# functional op, their results copied in.
def _unreduced(i: int) -> Any:
    """The call's ``reduction`` (argument ``i``, default mean) is none."""
    return lambda args, kwargs: (args[i] if len(args) > i else kwargs.get("reduction", 1)) == 0


OUT_UNLESS: dict[str, Any] = {
    "native_batch_norm.default": lambda args, kwargs: bool(args[5] if len(args) > 5 else kwargs.get("training")),
    # binary_cross_entropy.out with a reduction resizes its 0-dim output to the input's
    # shape and returns another value than the functional op (PyTorch 2.14, op_db's
    # samples): only its unreduced form writes into tiered memory directly.
    "binary_cross_entropy.default": _unreduced(3),
    # So do these losses' CPU .out kernels with a reduction (a deprecated resize, with a
    # warning, of the 0-dim output made from their meta runs).
    "mse_loss.default": _unreduced(2),
    "smooth_l1_loss.default": _unreduced(2),
    "huber_loss.default": _unreduced(2),
    "soft_margin_loss.default": _unreduced(2),
    # Its bag bookkeeping outputs are empty in some modes but full-size from the meta run.
    "_embedding_bag_forward_only.default": lambda args, kwargs: False,
    "_embedding_bag.default": lambda args, kwargs: False,
    # A gradient its output_mask skips is an empty tensor from the kernel but a full-size one
    # from the meta run: the .out overload would resize the output made for it (a deprecated
    # resize with a warning). Only a call that wants every gradient writes into tiered memory.
    "native_batch_norm_backward.default": lambda args, kwargs: all(args[9] if len(args) > 9 else kwargs["output_mask"]),
}

# Arguments ops write although their schemas do not say so (legacy schemas): batch norm in
# training updates its running statistics in place.
HIDDEN_WRITES = {
    "native_batch_norm": ("running_mean", "running_var"),
}


def _relu_out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.clamp_min.out(self, 0, out=out)


# ``.out`` overloads replaced by an exact equivalent. ATen's ``relu`` is ``clamp_min(self,
# 0)``, bit for bit (signed zeros and NaNs included; a test checks), but its ``relu.out``
# makes a result and copies it over: on 64 MiB of float32 on this machine it took 26.7 ms
# against 4.1 ms for ``clamp_min.out``, and its allocation's page faults made it the
# noisiest kernel of a recorded step.
OUT_REPLACEMENTS: dict[str, Any] = {"relu.default": _relu_out}


@dataclass(frozen=True)
class OpInfo:
    """Schema facts of one overload."""

    name: str
    kind: str  # "view" | "inplace" | "functional" | "metadata"
    written: tuple[str, ...]  # arguments the op writes (schema-marked, plus HIDDEN_WRITES)
    out: Any  # the matching .out overload (functional ops), or None
    out_names: tuple[str, ...]  # its keyword-only output arguments, in return order
    number: int = -1  # a number per name, the same for the process's life (see op_info)


_CACHE: dict[Any, OpInfo] = {}
_NUMBERS: dict[str, int] = {}


def op_info(func: Any) -> OpInfo:
    info = _CACHE.get(func)
    if info is None:
        info = _classify(func)
        info = _CACHE[func] = replace(info, number=_NUMBERS.setdefault(info.name, len(_NUMBERS)))
    return info


def _classify(func: Any) -> OpInfo:
    schema = func._schema
    base = schema.name.split("::")[-1]
    name = f"{base}.{func._overloadname}"
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    if base in METADATA_INPLACE:
        return OpInfo(name, "metadata", written, None, ())
    rets = schema.returns
    if written:
        return OpInfo(name, "inplace", written, None, ())
    hidden = HIDDEN_WRITES.get(base, ())
    if base in UNMARKED_VIEWS or (rets and any(r.alias_info is not None for r in rets)):
        return OpInfo(name, "view", (), None, ())
    out, names = _out_overload(func)
    if out is not None and name in OUT_REPLACEMENTS:
        out = OUT_REPLACEMENTS[name]
    return OpInfo(name, "functional", hidden, out, names)


def _out_overload(func: Any) -> tuple[Any, tuple[str, ...]]:
    """The overload taking ``func``'s arguments plus keyword-only written outputs, one per
    tensor it returns."""
    schema = func._schema
    args = [(a.name, str(a.type)) for a in schema.arguments]
    nret = len(schema.returns)
    if nret == 0 or not all(str(r.type) == "Tensor" for r in schema.returns):
        return None, ()
    packet = func.overloadpacket
    for oname in packet.overloads():
        cand = getattr(packet, oname)
        if cand is func:
            continue
        cargs = cand._schema.arguments
        outs = [a for a in cargs if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        rest = [(a.name, str(a.type)) for a in cargs if a not in outs]
        if rest == args and len(outs) == nret:
            return cand, tuple(a.name for a in outs)
    return None, ()


_TWINS: dict[Any, Any] = {}


def inplace_twin(func: Any) -> Any:
    """The out-of-place view op of an in-place view op of :data:`INPLACE_VIEWS` (the
    overload with the same arguments: ``transpose_.default`` -> ``transpose.int``), cached."""
    twin = _TWINS.get(func)
    if twin is None:
        want = [(a.name, str(a.type)) for a in func._schema.arguments]
        packet = getattr(torch.ops.aten, INPLACE_VIEWS[func._schema.name.split("::")[-1]])
        for oname in packet.overloads():
            cand = getattr(packet, oname)
            if [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
                twin = _TWINS[func] = cand
                break
        else:
            raise KeyError(f"no out-of-place twin of {func}")
    return twin


def meta_like(t: torch.Tensor, obj_nbytes: int, offset: int) -> torch.Tensor:
    """A meta tensor with ``t``'s dtype, size, strides and (byte) offset into an object of
    ``obj_nbytes`` bytes."""
    isz = t.element_size()
    flat = torch.empty(max(obj_nbytes // isz, 1), dtype=t.dtype, device="meta")
    return flat.as_strided(t.shape, t.stride(), offset // isz)
