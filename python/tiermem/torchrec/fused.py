"""The collections' fused optimizer as TorchRec presents one: the tables update themselves in
backward, and their optimizer state travels through the optimizer's own ``state_dict``
(as TorchRec's ``KeyedOptimizer`` of a sharded model's ``fused_optimizer``), keyed by the
weight's ``state_dict`` key, while the module's ``state_dict`` holds the weights alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..embedding.config import OptimizerConfig
from ..exceptions import InvalidArgumentError
from ..torch.embedding import TieredEmbeddingBag

__all__ = ["FBGEMM_OPTIMIZERS", "FUSED_PARAMS", "FusedOptimizer", "OPTIMIZER_KEYS", "drop_optimizer_keys", "optimizer_config"]

#: FBGEMM's optimizer types (``EmbOptimType`` names) and the optimizers tiermem runs for them.
FBGEMM_OPTIMIZERS = {
    "EXACT_SGD": "sgd",
    "SGD": "sgd",
    "EXACT_ADAGRAD": "adagrad",
    "EXACT_ROWWISE_ADAGRAD": "rowwise_adagrad",
    "ROWWISE_ADAGRAD": "rowwise_adagrad",
    "ADAM": "adam",
    "PARTIAL_ROWWISE_ADAM": "partial_rowwise_adam",
    "LAMB": "lamb",
    "PARTIAL_ROWWISE_LAMB": "partial_rowwise_lamb",
    "LARS_SGD": "lars_sgd",
}
#: The ``fused_params`` keys TorchRec's sharders hand FBGEMM, and the
#: :class:`~tiermem.embedding.OptimizerConfig` settings they are.
FUSED_PARAMS = {
    "learning_rate": "lr",
    "eps": "eps",
    "weight_decay": "weight_decay",
    "beta1": "beta1",
    "beta2": "beta2",
    "momentum": "momentum",
    "eta": "eta",
}
#: FBGEMM's ``WeightDecayMode`` names and tiermem's forms (``NONE``: no decay).
_DECAY_MODES = {"L2": "l2", "DECOUPLE": "decoupled", "NONE": None}

#: The keys a tiered module's own ``state_dict`` adds for its optimizer state, which the
#: collections leave to :class:`FusedOptimizer`.
OPTIMIZER_KEYS = ("optimizer_state", "optimizer_meta")


def drop_optimizer_keys(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """A ``state_dict`` post-hook: the weights alone, TorchRec's keys."""
    for k in [k for k in state_dict if k.startswith(prefix) and k.rsplit(".", 1)[-1] in OPTIMIZER_KEYS]:
        del state_dict[k]


def _name(v: Any) -> str:
    """An enum member's name, or the string itself."""
    return str(getattr(v, "name", v))


def optimizer_config(fused_params: Mapping[str, Any]) -> OptimizerConfig:
    """The optimizer TorchRec's ``fused_params`` ask for (``optimizer``: an ``EmbOptimType``
    or its name; ``learning_rate``, ``eps``, ``weight_decay``, ``weight_decay_mode``,
    ``beta1``, ``beta2``, ``momentum``, ``eta``). Any other key, an optimizer tiermem does
    not run and a decay mode it has not are refused by name: none is silently dropped."""
    params = dict(fused_params)
    if "optimizer" not in params:
        raise InvalidArgumentError(f"fused_params name no 'optimizer' (one of {', '.join(FBGEMM_OPTIMIZERS)})")
    kind = _name(params.pop("optimizer")).upper()
    if kind not in FBGEMM_OPTIMIZERS:
        raise InvalidArgumentError(f"fused_params optimizer {kind}: tiermem runs {', '.join(FBGEMM_OPTIMIZERS)}")
    mode = _name(params.pop("weight_decay_mode", "NONE" if kind.endswith("ROWWISE_ADAGRAD") else None))
    unknown = sorted(set(params) - set(FUSED_PARAMS))
    if unknown:
        raise InvalidArgumentError(
            f"fused_params {unknown} are not optimizer settings tiermem takes; known: {sorted(FUSED_PARAMS)}"
        )
    settings = {FUSED_PARAMS[k]: v for k, v in params.items()}
    if mode != "None":
        if mode not in _DECAY_MODES:
            raise InvalidArgumentError(f"weight_decay_mode {mode}: tiermem has {', '.join(_DECAY_MODES)}")
        if _DECAY_MODES[mode] is None:  # FBGEMM's NONE: no decay, whatever weight_decay says
            settings["weight_decay"] = 0.0
        else:
            settings["weight_decay_mode"] = _DECAY_MODES[mode]
    return OptimizerConfig.of(FBGEMM_OPTIMIZERS[kind], **settings)


class FusedOptimizer:
    """The tables' optimizer: ``step`` and ``zero_grad`` do nothing (backward applied the
    update); ``state_dict`` is ``{"state": {weight key: {"optimizer", "steps", "state"}},
    "param_groups": [{"optimizer", "lr", "params"}]}`` and ``load_state_dict`` restores it,
    refusing keys that are not this model's tables and state of another optimizer."""

    def __init__(self, bags: Mapping[str, TieredEmbeddingBag]) -> None:
        self._bags = dict(bags)

    @property
    def params(self) -> dict[str, torch.Tensor]:
        """Each table's weight (a copy of the rows), by ``state_dict`` key."""
        return {k: b.weight for k, b in self._bags.items()}

    def step(self, closure: Any = None) -> None:
        """Nothing: backward updated the rows."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: the tables keep no gradients."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for k, b in self._bags.items():
            st = b.table.optimizer_state()
            kind, values, steps = st if st is not None else (b.optim.name, torch.zeros(0).numpy(), 0)
            state[k] = {"optimizer": kind, "steps": torch.tensor(steps), "state": torch.from_numpy(values)}
        groups = [{"optimizer": b.optim.name, "lr": b.optim.lr, "params": [k]} for k, b in self._bags.items()]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state = state_dict.get("state")
        if not isinstance(state, Mapping):
            raise InvalidArgumentError("an optimizer state_dict has a 'state' mapping; this one has none")
        strangers, missing = sorted(set(state) - set(self._bags)), sorted(set(self._bags) - set(state))
        if strangers or missing:
            raise InvalidArgumentError(f"the optimizer state does not match the tables: not here {strangers}, missing {missing}")
        for k, b in self._bags.items():
            s = state[k]
            if s["optimizer"] != b.optim.name:
                raise InvalidArgumentError(f"{k}: the saved state is {s['optimizer']!r}'s, this table runs {b.optim.name!r}")
            if s["state"].numel():
                b.table.set_optimizer_state(s["optimizer"], s["state"].numpy(), int(s["steps"]))

    def __repr__(self) -> str:
        return f"FusedOptimizer({', '.join(f'{k}: {b.optim.name}' for k, b in self._bags.items())})"
