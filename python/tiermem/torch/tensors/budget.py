"""The fast-memory budget of tiered tensors: finding, before training, the op whose
outputs cannot fit (a training step traced on the meta device), and the error that names it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..._sizes import format_bytes
from .ops import op_info

__all__ = ["budget_message", "trace_step"]


def trace_step(
    model: torch.nn.Module, inputs: tuple, loss: Callable[[Any], torch.Tensor] | None
) -> list[tuple[str, int, list[int]]]:
    """``(op, output bytes, [input bytes])`` for every functional op of one training step
    (forward, ``loss`` — default the output's mean — and backward) of ``model`` on
    ``inputs``, run on the meta device: no memory is used; tensors the model makes or holds
    outside its parameters and buffers are moved to the meta device as ops meet them. Raises
    whatever the model raises on meta tensors."""
    from torch.func import functional_call
    from torch.utils._python_dispatch import TorchDispatchMode

    def meta(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            m = torch.empty(t.shape, dtype=t.dtype, device="meta")
            return m.requires_grad_(t.requires_grad) if t.is_floating_point() else m
        return t

    state = {k: meta(v) for k, v in list(model.named_parameters()) + list(model.named_buffers())}
    seen: list[tuple[str, int, list[int]]] = []

    def on_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            # Tensors the forward makes (a mask from torch.ones, a constant it holds) join
            # the trace on the meta device too.
            if "device" in kwargs and not any(isinstance(x, torch.Tensor) for x in tree_flatten(args)[0]):
                kwargs["device"] = torch.device("meta")
            args, kwargs = tree_map(on_meta, (args, kwargs))
            r = func(*args, **kwargs)
            info = op_info(func)
            ins = [x.numel() * x.element_size() for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
            # Factories (no tensor operand) make plain tensors in a real run.
            if info.kind == "functional" and ins:
                outs = sum(x.numel() * x.element_size() for x in tree_flatten(r)[0] if isinstance(x, torch.Tensor))
                seen.append((info.name, outs, ins))
            return r

    with Sizes():
        out = functional_call(model, state, tuple(meta(x) for x in inputs))
        value = loss(out) if loss is not None else out.float().mean()
        value.backward()
    return seen


def budget_message(op: str, inputs: list[int], outputs: list[int], budget: int, device: str) -> str:
    """Why ``op`` cannot run: its operand sizes against the budget of fast ``device``."""

    def fmt(sizes: list[int]) -> str:
        # An op over every parameter (DDP's flattening broadcast) has hundreds: the largest.
        shown = ", ".join(format_bytes(b) for b in (sizes if len(sizes) <= 8 else sorted(sizes, reverse=True)[:8]))
        if len(sizes) > 8:
            shown += f", ... ({len(sizes)} in all, {format_bytes(sum(sizes))})"
        return shown

    need = sum(outputs)
    return (
        f"op {op}: its outputs need {format_bytes(need)} ({need} bytes) of fast memory but the budget "
        f"('{device}') is {format_bytes(budget)} ({budget} bytes) (operands: inputs "
        f"[{fmt(inputs)}], outputs [{fmt(outputs)}]); "
        "give the fast device more capacity or use a smaller batch"
    )
