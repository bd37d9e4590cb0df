"""The collections' fused optimizer as TorchRec presents one: the tables update themselves in
backward, and their optimizer state travels through the optimizer's own ``state_dict``
(as TorchRec's ``KeyedOptimizer`` of a sharded model's ``fused_optimizer``), keyed by the
weight's ``state_dict`` key, while the module's ``state_dict`` holds the weights alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..exceptions import InvalidArgumentError
from ..torch.embedding import TieredEmbeddingBag

__all__ = ["FusedOptimizer", "OPTIMIZER_KEYS", "drop_optimizer_keys"]

#: The keys a tiered module's own ``state_dict`` adds for its optimizer state, which the
#: collections leave to :class:`FusedOptimizer`.
OPTIMIZER_KEYS = ("optimizer_state", "optimizer_meta")


def drop_optimizer_keys(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """A ``state_dict`` post-hook: the weights alone, TorchRec's keys."""
    for k in [k for k in state_dict if k.startswith(prefix) and k.rsplit(".", 1)[-1] in OPTIMIZER_KEYS]:
        del state_dict[k]


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
