"""Past one machine: embedding tables sharded over the ranks of ``torch.distributed``
(:class:`ShardedEmbeddings`, planned by :func:`plan_shards`), DLRM trained with them
(:func:`launch`, :func:`train_rank`).

The plan's names import without torch (the command line offers them as choices); the
rest loads on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .plan import PLACEMENTS, SHARDINGS, Shard, ShardCache, ShardPlan, plan_caches, plan_shards

if TYPE_CHECKING:
    from .collection import EmbeddingBagCollection
    from .embeddings import ShardedEmbeddings
    from .train import DistOptions, launch, train_rank

__all__ = [
    "PLACEMENTS",
    "SHARDINGS",
    "DistOptions",
    "EmbeddingBagCollection",
    "Shard",
    "ShardCache",
    "ShardPlan",
    "ShardedEmbeddings",
    "launch",
    "plan_caches",
    "plan_shards",
    "train_rank",
]

_LAZY = {
    "EmbeddingBagCollection": "collection",
    "ShardedEmbeddings": "embeddings",
    "DistOptions": "train",
    "launch": "train",
    "train_rank": "train",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # loaded once: later lookups find it directly
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
