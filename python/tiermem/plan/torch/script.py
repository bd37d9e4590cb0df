"""A training step from a user's Python file, for ``tiermem plan --script FILE``.

The file is run as a script (``runpy``; it is the user's own code, named on the command
line) and defines either ``step``, a :class:`~tiermem.torch.tensors.TrainStep`, or these
names::

    model      # an nn.Module, or a function of no arguments that builds one
    batch      # the example batch: a tensor, a tuple of them (positional inputs), a dict
               # (keyword inputs), or a function batch(i) giving iteration i's batch
    loss       # loss(output, batch) -> a scalar tensor; optional for a model whose output
               # has a .loss (transformers' models given labels)
    forward    # optional: forward(model, batch) -> output; default model(**batch) for a
               # dict, model(*batch) for a tuple, model(batch) for a tensor
    optimizer  # optimizer(params) -> a torch.optim.Optimizer (torch's or the user's own)
    name       # optional: what reports call the step (default: the file's stem)

A model given as an instance is deep-copied for each run (every run starts from its
weights); a factory is called under ``torch.manual_seed``. A missing or ill-typed name is an
:class:`~tiermem.InvalidArgumentError` that says which and what was expected.
"""

from __future__ import annotations

import copy
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...exceptions import InvalidArgumentError
from ...torch.tensors.train import TrainStep

__all__ = ["load_script", "step_of"]


def _call(model: Any, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def step_of(
    model: Any,
    batch: Any,
    optimizer: Callable[..., Any],
    loss: Callable[[Any, Any], Any] | None = None,
    name: str = "script",
    forward: Callable[[Any, Any], Any] | None = None,
) -> TrainStep:
    """A :class:`TrainStep` from a model (instance or factory), an example batch (or a
    function of the iteration), an optimizer factory, a loss of (output, batch) and how to
    call the model on a batch."""
    import torch

    if isinstance(model, torch.nn.Module):
        base = model
        make: Callable[[], torch.nn.Module] = lambda: copy.deepcopy(base)  # noqa: E731
    elif callable(model):
        make = model
    else:
        raise InvalidArgumentError(f"model: expected an nn.Module or a function that builds one, got {type(model).__name__}")
    if not callable(optimizer):
        raise InvalidArgumentError(f"optimizer: expected a function of the parameters, got {type(optimizer).__name__}")
    for what, f in (("loss", loss), ("forward", forward)):
        if f is not None and not callable(f):
            raise InvalidArgumentError(f"{what}: expected a function of (output or model, batch), got {type(f).__name__}")
    run = forward or _call
    batch_of: Callable[[int], Any] = batch if callable(batch) else (lambda i: batch)

    def loss_of(m: torch.nn.Module, i: int) -> torch.Tensor:
        b = batch_of(i)
        out = run(m, b)
        if loss is not None:
            return loss(out, b)
        value = getattr(out, "loss", None)
        if value is None:
            raise InvalidArgumentError(f"{name}: the model's output has no .loss; define loss(output, batch) in the script")
        return value

    return TrainStep(make, optimizer, loss_of, name=name)


def load_script(path: str | Path) -> TrainStep:
    """The training step the Python file at ``path`` defines (see the module docs)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidArgumentError(f"--script {path}: no such file")
    ns = runpy.run_path(str(p), run_name="__tiermem_plan__")
    step = ns.get("step")
    if step is not None:
        if not isinstance(step, TrainStep):
            raise InvalidArgumentError(f"{path}: step is a {type(step).__name__}, not a tiermem TrainStep")
        return step
    missing = [k for k in ("model", "batch", "optimizer") if k not in ns]
    if missing:
        raise InvalidArgumentError(
            f"{path} defines no {', '.join(missing)}: a plan script defines model, batch, optimizer and loss "
            "(optional for a model whose output has .loss), or step = TrainStep(...)"
        )
    return step_of(ns["model"], ns["batch"], ns["optimizer"], ns.get("loss"), str(ns.get("name", p.stem)), ns.get("forward"))
