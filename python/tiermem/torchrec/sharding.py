"""TorchRec's ``DistributedModelParallel`` over tiermem's tables: a ``ModuleSharder`` for
:class:`tiermem.torchrec.EmbeddingBagCollection` whose compute kernel
(``EmbeddingComputeKernel.CUSTOMIZED_KERNEL``) keeps each shard in a tiered table, placed
as asked, with the optimizer fused into backward.

TorchRec's machinery does the rest as it does for FBGEMM's kernels: its planner picks
table- or column-wise sharding (what TorchRec offers on CPUs), its input distribution
sends each shard its ids, its output distribution returns the pooled rows, and the
gradient comes back to each shard summed over the ranks (TorchRec's semantics). Build the
collection on the meta device, as TorchRec users do::

    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    sharder = EmbeddingBagCollectionSharder(placement=Placement(device="table:DIR", cache=0.3),
                                            fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, ...})
    model = DistributedModelParallel(DLRM(ebc, ...), sharders=[sharder], device=torch.device("cpu"))

Each shard starts from its config's ``init_fn`` (TorchRec's default: uniform within
±sqrt(1/rows)); a ``table:DIR`` placement gives each shard its own file,
``DIR/<table>.rows<lo>-<hi>.cols<c0>-<c1>.tbl``, re-attached by a later run. Checkpoints go
through :mod:`tiermem.torch.dcp` (``tdcp.state_dict(model)``; the sharded collection names
its shards' global rows and columns).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, GroupedEmbeddingConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as _TorchRecSharder
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import DataType, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..embedding.config import OptimizerConfig, Placement
from ..exceptions import InvalidArgumentError
from ..manager import Manager
from ..torch.dcp import Piece
from ..torch.embedding import TieredEmbeddingBag
from .collection import DATA_TYPES, EmbeddingBagCollection, init_shard, joined_bags, per_table
from .fused import optimizer_config

__all__ = ["KERNEL", "SHARDING_TYPES", "EmbeddingBagCollectionSharder", "ShardedTieredEmbeddingBagCollection"]

#: The compute kernel TorchRec's plans name for tiermem's tables.
KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
#: The sharding kinds the sharder offers TorchRec's planner: those TorchRec offers on CPUs.
#: Row-wise shards return partial sums by reduce-scatter, which gloo lacks (TorchRec offers
#: it on GPUs only); :class:`tiermem.dist.EmbeddingBagCollection` shards row-wise on CPUs.
SHARDING_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value)


class _Settings:
    """What every shard of a sharded collection is built with."""

    def __init__(
        self, placement: Placement | Mapping[str, Placement] | None, optimizer: OptimizerConfig, manager: Manager | None
    ):
        self.placement, self.optimizer, self.manager = placement, optimizer, manager


class TieredKernel(BaseEmbedding):
    """One group of shards this rank holds (TorchRec's ``GroupedEmbeddingConfig``), each a
    :class:`~tiermem.torch.TieredEmbeddingBag`; ``forward`` pools the group's features in
    the config's order, as FBGEMM's table-batched kernel does."""

    def __init__(self, config: GroupedEmbeddingConfig, sharding_type: ShardingType | None, settings: _Settings) -> None:
        super().__init__()
        self._config = config
        # Not submodules: TorchRec reads every kernel's state_dict as its tables' weights;
        # these shards checkpoint through tiermem.torch.dcp instead.
        self.bags: list[TieredEmbeddingBag] = []
        #: Per shard: its table's name, rows and width, and where it sits in it.
        self.shards: list[tuple[str, int, int, int, int]] = []
        # Row-wise shards add up partial sums: each pools by sum, TorchRec divides a mean after.
        summed = sharding_type in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD)
        for t in config.embedding_tables:
            md = t.local_metadata
            r0, c0 = (int(md.shard_offsets[0]), int(md.shard_offsets[1])) if md is not None else (0, 0)
            rows, cols = int(t.local_rows), int(t.local_cols)
            place = per_table(settings.placement, t.name, f"{t.name}.rows{r0}-{r0 + rows}.cols{c0}-{c0 + cols}")
            mode = "sum" if summed or t.pooling == PoolingType.SUM else "mean"
            if t.pooling not in (PoolingType.SUM, PoolingType.MEAN):
                raise InvalidArgumentError(f"table {t.name!r}: pooling {t.pooling} is not supported (SUM or MEAN)")
            if t.data_type not in DATA_TYPES:
                raise InvalidArgumentError(f"table {t.name!r}: data_type {t.data_type.name} is not trainable here")
            bag = TieredEmbeddingBag(
                rows,
                cols,
                mode=mode,
                include_last_offset=True,
                dtype=None if t.data_type == DataType.FP32 else DATA_TYPES[t.data_type],
                placement=place,
                manager=settings.manager,
                optimizer=settings.optimizer,
            )
            self.bags.append(bag)
            if not bag.table.attached:
                init_shard(bag.table, int(t.num_embeddings), t.init_fn)
            self.shards.append((t.name, int(t.num_embeddings), int(t.embedding_dim), r0, c0))

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    def reset_rows(self) -> None:
        """Every shard's rows from its config's ``init_fn``, its optimizer state forgotten."""
        for t, bag in zip(self._config.embedding_tables, self.bags, strict=True):
            bag.table.reset_optimizer()
            init_shard(bag.table, int(t.num_embeddings), t.init_fn)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        feats = features.to_dict()
        weighted = features.weights_or_none() is not None
        out: list[torch.Tensor] = []
        for k, t in enumerate(self._config.embedding_tables):
            values, offsets, weights, sizes = joined_bags([feats[f] for f in t.feature_names], weighted)
            rows = self.bags[k](values, offsets, None if weights is None else weights.float())
            out.extend(r.float() for r in rows.split(sizes))
        return torch.cat(out, dim=1) if out else torch.empty(0, 0)

    def flush(self) -> None:
        """Make every shard's updated rows durable in its file (TorchRec calls this before
        a ``state_dict``)."""
        for bag in self.bags:
            bag.table.sync()

    def purge(self) -> None:
        """Nothing: a shard's cache holds rows, not results to drop."""

    def named_parameters_by_table(self) -> Iterator[tuple[str, torch.Tensor]]:
        """None: the rows live in tiered tables (TorchRec asks every kernel)."""
        return iter(())

    def pieces(self, prefix: str) -> list[Piece]:
        return [
            Piece(f"{prefix}embedding_bags.{name}.", bag.table, rows, dim, r0, c0, bag.table.embedding_dim != dim, bag.optimizer)
            for (name, rows, dim, r0, c0), bag in zip(self.shards, self.bags, strict=True)
        ]


class _Lookup(GroupedPooledEmbeddingsLookup):
    """TorchRec's grouped lookup, its kernels tiermem's."""

    def __init__(self, settings: _Settings, **kwargs: Any) -> None:
        # Read by _create_embedding_kernel, which TorchRec's constructor calls.
        object.__setattr__(self, "_settings", settings)
        super().__init__(**kwargs)

    def _create_embedding_kernel(
        self, config: GroupedEmbeddingConfig, device: Any, pg: Any, sharding_type: ShardingType | None, env: Any
    ) -> BaseEmbedding:
        if config.compute_kernel != EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            raise InvalidArgumentError(
                f"tiermem's collection shards with the {KERNEL!r} kernel, the plan names {config.compute_kernel}"
            )
        return TieredKernel(config, sharding_type, self.__dict__["_settings"])


class ShardedTieredEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """TorchRec's sharded collection whose lookups keep their shards in tiered tables."""

    def __init__(self, *args: Any, settings: _Settings, **kwargs: Any) -> None:
        # Read by _create_lookups, which TorchRec's constructor calls.
        object.__setattr__(self, "_tiered_settings", settings)
        object.__setattr__(self, "_made", False)
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_made", True)

    def reset_parameters(self) -> None:
        """Every shard's rows drawn again from its config's ``init_fn`` (TorchRec's
        constructor calls this too: then shards keep the rows they were made with, a
        re-attached table file its trained ones)."""
        if not self.__dict__["_made"]:
            return
        for k in self._kernels():
            k.reset_rows()

    def _create_lookups(self) -> None:
        settings: _Settings = self.__dict__["_tiered_settings"]
        for sharding, kind in zip(self._embedding_shardings, self._sharding_types, strict=True):
            lookup = _Lookup(
                settings,
                grouped_configs=sharding._grouped_embedding_configs,
                pg=sharding._pg,
                device=self._device,
                sharding_type=ShardingType(kind),
                env=sharding._env,
            )
            self._lookups.append(lookup)

    def dcp_pieces(self, prefix: str) -> list[Piece]:
        """This rank's shards as parts of their global tables (:mod:`tiermem.torch.dcp`)."""
        return [p for k in self._kernels() for p in k.pieces(prefix)]

    def _kernels(self) -> list[TieredKernel]:
        return [m for lookup in self._lookups for m in lookup.modules() if isinstance(m, TieredKernel)]


class EmbeddingBagCollectionSharder(_TorchRecSharder):
    """TorchRec's ``ModuleSharder`` for :class:`tiermem.torchrec.EmbeddingBagCollection`
    (see the module's note).

    Args:
        placement: one :class:`~tiermem.embedding.Placement` for every shard, or one per
            table name (``table:DIR`` with ``DIR`` a folder: a file per shard in it).
        fused_params: the optimizer as TorchRec's sharders take it (FBGEMM's
            ``EmbOptimType`` and its keys; default SGD at 0.01).
        manager: the :class:`~tiermem.Manager` every shard shares (default: each its own).
    """

    def __init__(
        self,
        placement: Placement | Mapping[str, Placement] | None = None,
        fused_params: Mapping[str, Any] | None = None,
        manager: Manager | None = None,
    ) -> None:
        optimizer = optimizer_config(fused_params) if fused_params else OptimizerConfig("sgd", lr=0.01).validate()
        self._settings = _Settings(placement, optimizer, manager)
        super().__init__()

    @property
    def module_type(self) -> type[EmbeddingBagCollection]:
        return EmbeddingBagCollection

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return list(SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return [KERNEL]

    def shard(
        self,
        module: EmbeddingBagCollection,
        params: dict[str, Any],
        env: Any,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> ShardedTieredEmbeddingBagCollection:
        if device is not None and device.type != "cpu":
            raise InvalidArgumentError(f"device {device}: tiermem's shards look up on the CPU")
        for name, p in params.items():
            if p.compute_kernel != KERNEL:
                raise InvalidArgumentError(f"table {name!r}: the plan names kernel {p.compute_kernel!r}; tiermem's is {KERNEL!r}")
        return ShardedTieredEmbeddingBagCollection(
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=None,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            settings=self._settings,
        )
