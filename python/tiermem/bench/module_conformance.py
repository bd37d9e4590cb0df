"""PyTorch's module database through tiered tensors, for ``tiermem bench conformance``.

Every entry of ``torch.testing._internal.common_modules.module_db`` (PyTorch's
``ModuleInfo`` database, BSD-3, which its own ``test_modules.py`` runs) with its CPU module
inputs, in three modes: ``train`` (training mode, forward and backward), ``eval`` (eval
mode, autograd on) and ``eval+no_grad``. For each input the module is built once, a plain
twin copied from it, and the other made tiered with :meth:`Tiering.module` (its inputs are
tiered by the module's input hook, as a user's are); both run from the same RNG state and
their outputs, and in ``train`` every parameter's gradient (of the sum of the outputs,
each weighted by a fixed random tensor), are compared at the dtype's tolerances. Lazy
modules run one plain forward first, which sizes their parameters.

A (module, mode, input) is passed, refused (a :class:`~tiermem.TiermemError` naming what
before it ran) or failed, as for ops; inputs plain PyTorch fails are counted apart
(``plain_failed``), not as samples.
"""

from __future__ import annotations

import copy
import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..exceptions import TiermemError

__all__ = ["MODES", "run_module", "count_sample"]

#: The modes each entry runs in: (name, training, autograd on).
MODES = (("train", True, True), ("eval", False, True), ("eval+no_grad", False, False))


def _flat_tensors(x: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _plain(x: Any) -> Any:
    from torch.utils._pytree import tree_map

    from ..torch.tensors import TieredTensor

    return tree_map(lambda t: t.to_plain() if isinstance(t, TieredTensor) else t, x)


def _step(m: Any, fi: Any, rng: Any, grads: bool, weights: list[Any] | None) -> tuple[Any, list[Any]]:
    """One forward (from RNG state ``rng``) and, with ``grads``, a backward of the weighted
    sum of the floating outputs. Returns (outputs, parameter gradients)."""
    import torch

    torch.set_rng_state(rng)
    args, kwargs = copy.deepcopy((fi.args, fi.kwargs))
    with torch.set_grad_enabled(grads or torch.is_grad_enabled()):
        out = m(*args, **kwargs)
    if not grads:
        return out, []
    outs = [t for t in _flat_tensors(out) if t.requires_grad and t.is_floating_point()]
    if not outs:
        return out, []
    ws = weights if weights is not None else []
    loss = sum((o * ws[i]).sum() for i, o in enumerate(outs))
    loss.backward()
    return out, [p.grad for p in m.parameters()]


def _tiered(tiering: Any, m: Any, fi: Any, rng: Any, training: bool, autograd: bool, weights: Any) -> Any:
    """The module made tiered and run as its plain twin was: (outputs, gradients), plain."""
    import torch

    with torch.no_grad() if not autograd else torch.enable_grad():
        tiering.module(m)
        got, got_g = _step(m, fi, rng, training, weights)
        return _plain(got), _plain(got_g)


def _compare(want: Any, want_g: Any, got: Any) -> None:
    import torch

    torch.testing.assert_close(got[0], _plain(want), equal_nan=True)
    torch.testing.assert_close(got[1], want_g, equal_nan=True)


def count_sample(counts: Counter[str], why: dict[str, str], run: Callable[[], Any], compare: Callable[[Any], None]) -> None:
    """Run one sample tiered (``run``) and ``compare`` what it gave with plain PyTorch's:
    counted passed, refused (a :class:`~tiermem.TiermemError`) or failed (any other error,
    or a wrong result), keeping the first line of why for each kind."""
    try:
        got = run()
    except TiermemError as e:
        counts["refused"] += 1
        why.setdefault("refused", f"{type(e).__name__}: {e}".split("\n")[0][:200])
        return
    except Exception as e:
        counts["failed"] += 1
        why.setdefault("failed", f"{type(e).__name__}: {e}".split("\n")[0][:200])
        return
    try:
        compare(got)
        counts["passed"] += 1
    except AssertionError as e:
        counts["failed"] += 1
        why.setdefault("failed", "wrong result: " + " ".join(str(e).split())[:200])


def run_module(info: Any, dtype: Any, samples: int | None, tiering: Any) -> list[dict[str, Any]]:
    """One ``ModuleInfo`` in one dtype: a row per mode with its counts and, per failure or
    refusal, the first line of why."""
    import torch

    rows = []
    for mode, training, autograd in MODES:
        counts: Counter[str] = Counter()
        why: dict[str, str] = {}
        try:
            inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False, training=training)
        except Exception as e:  # the entry's own input generator
            rows.append(
                {
                    "mode": mode,
                    "samples": 0,
                    "passed": 0,
                    "refused": 0,
                    "failed": 0,
                    "plain_failed": 0,
                    "why": {"samples": str(e)[:200]},
                }
            )
            continue
        for mi in inputs[: samples if samples is not None else None]:
            if mi.forward_input is None:
                continue
            rng = torch.get_rng_state()
            weights: list[Any] | None = None
            try:
                with torch.no_grad() if not autograd else torch.enable_grad():
                    torch.manual_seed(0)
                    m = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs).to(dtype)
                    m.train(training)
                    if info.is_lazy:
                        _step(m, mi.forward_input, rng, False, None)
                    twin = copy.deepcopy(m)
                    if training:
                        probe, _ = _step(copy.deepcopy(m), mi.forward_input, rng, False, None)
                        gen = torch.Generator().manual_seed(1)
                        weights = [
                            torch.randn(o.shape, generator=gen).to(o.dtype) for o in _flat_tensors(probe) if o.is_floating_point()
                        ]
                    want, want_g = _step(twin, mi.forward_input, rng, training, weights)
            except Exception:
                counts["plain_failed"] += 1  # plain PyTorch fails it: not a sample
                continue
            counts["samples"] += 1

            tiered = functools.partial(_tiered, tiering, m, mi.forward_input, rng, training, autograd, weights)
            compare = functools.partial(_compare, want, want_g)
            count_sample(counts, why, tiered, compare)
        rows.append(
            {"mode": mode} | {k: counts[k] for k in ("samples", "passed", "refused", "failed", "plain_failed")} | {"why": why}
        )
    return rows
