"""TorchRec's ``EmbeddingBagCollection`` over tiered tables (see the package docs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..embedding.config import OptimizerConfig, Placement
from ..exceptions import InvalidArgumentError
from ..manager import Manager
from ..torch.embedding import TieredEmbeddingBag

__all__ = ["EmbeddingBagCollection"]

#: TorchRec's pooling types and the modes tiermem's tables pool with.
POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}


class EmbeddingBagCollection(torch.nn.Module):
    """TorchRec's ``EmbeddingBagCollection`` (same constructor, forward and ``state_dict``)
    whose tables are tiermem's.

    Args:
        tables: TorchRec ``EmbeddingBagConfig`` objects (``name``, ``num_embeddings``,
            ``embedding_dim``, ``feature_names``, ``pooling`` SUM or MEAN).
        is_weighted: the input's weights scale each looked-up row (sum pooling).
        device: ``None`` or the CPU (tiered tables run there).
        placement: one :class:`~tiermem.embedding.Placement` for every table, or a mapping
            from table name to placement (tables not named get the default placement).
        optimizer, lr, eps: the fused optimizer (as :class:`~tiermem.torch.TieredEmbeddingBag`).
        manager: the :class:`~tiermem.Manager` the tables share (default: each its own).
        seed: initialise table *i* from ``N(0, 1)`` with seed ``seed + i`` (default: random).

    ``forward(features)`` takes a ``KeyedJaggedTensor`` holding every feature the configs
    name (others, and missing ones, are refused by name) and returns a ``KeyedTensor`` keyed
    by feature, in config order, ``values()`` of shape ``(batch, sum of widths)``.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: Any = None,
        *,
        placement: Placement | Mapping[str, Placement] | None = None,
        optimizer: str | OptimizerConfig = "sgd",
        lr: float = 0.01,
        eps: float | None = None,
        manager: Manager | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if device is not None and torch.device(device).type != "cpu":
            raise InvalidArgumentError(f"device {device!r}: tiered tables run on the CPU")
        if not tables:
            raise InvalidArgumentError("an EmbeddingBagCollection needs at least one EmbeddingBagConfig")
        names: set[str] = set()
        owner: dict[str, str] = {}
        for c in tables:
            if not isinstance(c, EmbeddingBagConfig):
                raise InvalidArgumentError(f"tables: expected torchrec EmbeddingBagConfig objects, got {type(c).__name__}")
            if c.name in names:
                raise InvalidArgumentError(f"table {c.name!r} is configured twice")
            names.add(c.name)
            if c.pooling not in POOLING:
                raise InvalidArgumentError(f"table {c.name!r}: pooling {c.pooling} is not supported (SUM or MEAN)")
            if not c.feature_names:
                raise InvalidArgumentError(f"table {c.name!r} has no feature_names")
            for f in c.feature_names:
                if f in owner:
                    raise InvalidArgumentError(f"feature {f!r} is in tables {owner[f]!r} and {c.name!r}")
                owner[f] = c.name
        if isinstance(placement, Mapping):
            unknown = set(placement) - names
            if unknown:
                raise InvalidArgumentError(f"placement names tables that are not configured: {sorted(unknown)}")
        self._is_weighted = bool(is_weighted)
        self._embedding_bag_configs = list(tables)
        self._feature_names = [list(c.feature_names) for c in tables]
        self._embedding_names = [f for c in tables for f in c.feature_names]
        self._lengths_per_embedding = [c.embedding_dim for c in tables for _ in c.feature_names]
        self.embedding_bags = torch.nn.ModuleDict()
        for i, c in enumerate(tables):
            place = placement.get(c.name) if isinstance(placement, Mapping) else placement
            self.embedding_bags[c.name] = TieredEmbeddingBag(
                c.num_embeddings,
                c.embedding_dim,
                mode=POOLING[c.pooling],
                include_last_offset=True,
                placement=place,
                manager=manager,
                optimizer=optimizer,
                lr=lr,
                eps=eps,
                seed=None if seed is None else seed + i,
            )

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The configs, as TorchRec's collection returns them."""
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def _check(self, features: KeyedJaggedTensor) -> dict[str, Any]:
        if not isinstance(features, KeyedJaggedTensor):
            raise InvalidArgumentError(f"features: expected a torchrec KeyedJaggedTensor, got {type(features).__name__}")
        if features.device().type != "cpu":
            raise InvalidArgumentError(f"features are on {features.device()}: tiered tables look up on the CPU")
        keys = features.keys()
        known = set(self._embedding_names)
        extra = [k for k in keys if k not in known]
        missing = [k for k in self._embedding_names if k not in set(keys)]
        if extra or missing:
            raise InvalidArgumentError(
                "the KeyedJaggedTensor's keys do not match the configs' features: "
                + "; ".join(
                    part
                    for part in (
                        f"not configured: {extra}" if extra else "",
                        f"missing: {missing}" if missing else "",
                    )
                    if part
                )
            )
        lengths = features.lengths()
        if int(lengths.sum()) != features.values().numel():
            raise InvalidArgumentError(
                f"the KeyedJaggedTensor's lengths add up to {int(lengths.sum())} but it holds {features.values().numel()} values"
            )
        if self._is_weighted and features.weights_or_none() is None:
            raise InvalidArgumentError("this collection is weighted but the KeyedJaggedTensor has no weights")
        return features.to_dict()

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        feature_dict = self._check(features)
        pooled = []
        for (name, bag), fnames in zip(self.embedding_bags.items(), self._feature_names):
            for f in fnames:
                jt = feature_dict[f]
                try:
                    res = bag(jt.values(), jt.offsets(), jt.weights() if self._is_weighted else None)
                except (RuntimeError, ValueError) as e:
                    raise InvalidArgumentError(f"feature {f!r} (table {name!r}): {e}") from e
                pooled.append(res.float())
        return KeyedTensor(
            keys=self._embedding_names, values=torch.cat(pooled, dim=1), length_per_key=self._lengths_per_embedding
        )
