"""TorchRec's ``EmbeddingBagCollection`` and ``EmbeddingCollection`` over tiered tables (see
the package docs)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, Unpack

import torch
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

from ..embedding import EmbeddingTable
from ..embedding.config import OptimizerConfig, Placement, table_dir
from ..exceptions import InvalidArgumentError
from ..manager import Manager
from ..torch.embedding import TieredEmbeddingBag
from .fused import FusedOptimizer, drop_optimizer_keys, optimizer_config

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingCollection",
    "TableOptions",
    "check_features",
    "check_options",
    "embedding_names",
    "per_table",
]

#: TorchRec's pooling types and the modes tiermem's tables pool with.
POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}
#: TorchRec's row data types and the storage types tiermem keeps them in (float32
#: accumulation for all).
DATA_TYPES = {DataType.FP32: torch.float32, DataType.FP16: torch.float16, DataType.BF16: torch.bfloat16}
#: A table up to this size is initialised by its config's ``init_fn`` in one call, exactly as
#: TorchRec does; a larger one chunk by chunk (the same distribution for element-wise
#: initialisers, the default uniform and ``normal_`` among them), never whole in DRAM.
WHOLE_INIT_BYTES = 64 << 20


def embedding_names(tables: Sequence[BaseEmbeddingConfig]) -> list[list[str]]:
    """Per table, the output names of its features, TorchRec's way: a feature read by
    several tables is ``FEATURE@TABLE`` in each."""
    count: dict[str, int] = {}
    for c in tables:
        for f in c.feature_names:
            count[f] = count.get(f, 0) + 1
    return [[f"{f}@{c.name}" if count[f] > 1 else f for f in c.feature_names] for c in tables]


def init_shard(t: EmbeddingTable, table_rows: int, init_fn: Callable[[torch.Tensor], Any] | None) -> None:
    """A table's or a shard's rows (of a table of ``table_rows`` rows) from its config's
    ``init_fn`` (TorchRec's default: uniform within ±sqrt(1/table_rows)) on the global RNG,
    a chunk of :data:`WHOLE_INIT_BYTES` at a time: a table that fits one chunk is drawn in
    one call, exactly as TorchRec draws it."""
    rows, dim = t.num_embeddings, t.embedding_dim
    chunk = max(1, WHOLE_INIT_BYTES // (4 * dim))
    bound = (1 / table_rows) ** 0.5
    for start in range(0, rows, chunk):
        w = torch.empty(min(chunk, rows - start), dim)
        if init_fn is None:
            torch.nn.init.uniform_(w, -bound, bound)
        else:
            init_fn(w)
        t.load(w.numpy(), start)


def joined_bags(jts: Sequence[JaggedTensor], weighted: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[int]]:
    """The bags of several features of one table as one lookup's ``(values, offsets with the
    last, weights, bags per feature)``: looked up together, a row several features read gets
    one optimizer step of its summed gradient, as FBGEMM's table-batched kernels give it."""
    sizes = [jt.lengths().numel() for jt in jts]
    if len(jts) == 1:
        jt = jts[0]
        return jt.values(), jt.offsets(), jt.weights() if weighted else None, sizes
    values = torch.cat([jt.values() for jt in jts])
    lengths = torch.cat([jt.lengths() for jt in jts]).to(torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    return values, offsets, torch.cat([jt.weights() for jt in jts]) if weighted else None, sizes


def per_table(placement: Placement | Mapping[str, Placement] | None, table: str, file: str | None = None) -> Placement | None:
    """Table ``table``'s placement: its own from a mapping; from one for every table, a
    ``table:DIR`` device naming a folder gives each table its own file in it,
    ``DIR/<file or table>.tbl``."""
    if isinstance(placement, Mapping):
        placement = placement.get(table)
    if placement is None or not isinstance(placement.device, str):
        return placement
    folder = table_dir(placement.device)
    if folder is None or not os.path.isdir(folder):
        return placement
    return dataclasses.replace(placement, device=f"table:{os.path.join(folder, (file or table) + '.tbl')}")


class _Described(torch.nn.Module):
    """A table on the meta device: its ``weight`` has the table's shape and type, no rows."""

    def __init__(self, c: BaseEmbeddingConfig) -> None:
        super().__init__()
        dtype = DATA_TYPES[c.data_type]
        self.weight = torch.nn.Parameter(torch.empty(c.num_embeddings, c.embedding_dim, device="meta", dtype=dtype))


class TableOptions(TypedDict, total=False):
    """The keyword arguments both collections take besides TorchRec's own.

    Attributes:
        placement: one :class:`~tiermem.embedding.Placement` for every table, or a mapping
            from table name to placement (tables not named get the default placement). One
            placement whose device is ``"table:DIR"`` with ``DIR`` a folder puts each table
            in its own table file there, ``DIR/<table name>.tbl``.
        optimizer, lr, eps: the fused optimizer (as :class:`~tiermem.torch.TieredEmbeddingBag`;
            default ``"sgd"`` at 0.01).
        fused_params: instead, the optimizer as TorchRec's sharders take it
            (``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1, ...}``,
            see :func:`~tiermem.torchrec.fused.optimizer_config`).
        manager: the :class:`~tiermem.Manager` the tables share (default: each its own).
        init: ``"auto"`` (default): a new table starts from its config's ``init_fn`` and a
            table file from an earlier run is re-attached as it is (rows and optimizer
            state), so a rebuilt model resumes; ``"overwrite"``: start every table over.
    """

    placement: Placement | Mapping[str, Placement] | None
    optimizer: str | OptimizerConfig
    fused_params: Mapping[str, Any]
    lr: float
    eps: float | None
    manager: Manager | None
    init: str


def check_options(
    tables: Sequence[BaseEmbeddingConfig], config_type: type[BaseEmbeddingConfig], device: Any, options: Mapping[str, Any]
) -> str | OptimizerConfig:
    """Refuse, naming what and why, configs and options a collection cannot take; returns
    the optimizer (a name, or the config ``fused_params`` give)."""
    unknown = sorted(set(options) - set(TableOptions.__annotations__))
    if unknown:
        raise InvalidArgumentError(f"unknown arguments {unknown}; tiermem's are {sorted(TableOptions.__annotations__)}")
    placement = options.get("placement")
    optimizer: str | OptimizerConfig = options.get("optimizer", "sgd")
    if "fused_params" in options:
        clash = sorted({"optimizer", "lr", "eps"} & set(options))
        if clash:
            raise InvalidArgumentError(f"pass the optimizer in fused_params or as {clash}, not both")
        optimizer = optimizer_config(options["fused_params"])
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        raise InvalidArgumentError(f"device {device!r}: tiered tables run on the CPU (or describe themselves on 'meta')")
    if not tables:
        raise InvalidArgumentError(f"a collection needs at least one {config_type.__name__}")
    names: set[str] = set()
    for c in tables:
        if not isinstance(c, config_type):
            raise InvalidArgumentError(f"tables: expected torchrec {config_type.__name__} objects, got {type(c).__name__}")
        if c.name in names:
            raise InvalidArgumentError(f"table {c.name!r} is configured twice")
        names.add(c.name)
        if not c.feature_names:
            raise InvalidArgumentError(f"table {c.name!r} has no feature_names")
        if len(set(c.feature_names)) != len(c.feature_names):
            raise InvalidArgumentError(f"table {c.name!r} names a feature twice: {c.feature_names}")
        if c.data_type not in DATA_TYPES:
            raise InvalidArgumentError(
                f"table {c.name!r}: data_type {c.data_type.name} is not trainable here; "
                f"known are {', '.join(d.name for d in DATA_TYPES)}"
            )
    if isinstance(placement, Placement) and len(tables) > 1 and per_table(placement, "") is placement:
        if isinstance(placement.device, str) and table_dir(placement.device) is not None:
            raise InvalidArgumentError(
                f"{len(tables)} tables cannot share the one table file {placement.device!r}: name an existing "
                "folder (each table gets its own file in it) or give a placement per table"
            )
    if isinstance(placement, Mapping):
        strangers = sorted(set(placement) - names)
        if strangers:
            raise InvalidArgumentError(f"placement names tables that are not configured: {strangers}")
    return optimizer


def check_features(features: Any, feature_names: Sequence[Sequence[str]], weighted: bool) -> dict[str, JaggedTensor]:
    """The KJT's features by name, once it is checked against the tables' ``feature_names``
    (keys, lengths, device, weights): a mismatch is an error naming the features."""
    if not isinstance(features, KeyedJaggedTensor):
        raise InvalidArgumentError(f"features: expected a torchrec KeyedJaggedTensor, got {type(features).__name__}")
    if features.device().type != "cpu":
        raise InvalidArgumentError(f"features are on {features.device()}: tiered tables look up on the CPU")
    keys = features.keys()
    wanted = {f for fs in feature_names for f in fs}
    extra = [k for k in keys if k not in wanted]
    missing = sorted(wanted - set(keys))
    if extra or missing:
        parts = [f"not configured: {extra}" if extra else "", f"missing: {missing}" if missing else ""]
        raise InvalidArgumentError(
            "the KeyedJaggedTensor's keys do not match the configs' features: " + "; ".join(p for p in parts if p)
        )
    lengths = features.lengths()
    if int(lengths.sum()) != features.values().numel():
        raise InvalidArgumentError(
            f"the KeyedJaggedTensor's lengths add up to {int(lengths.sum())} but it holds {features.values().numel()} values"
        )
    if weighted and features.weights_or_none() is None:
        raise InvalidArgumentError("this collection is weighted but the KeyedJaggedTensor has no weights")
    return features.to_dict()


class _Collection(torch.nn.Module):
    """What both collections share: configs checked, one tiered table per config, and the
    input KJT checked against the features."""

    _attr = ""

    def __init__(
        self,
        tables: Sequence[BaseEmbeddingConfig],
        config_type: type[BaseEmbeddingConfig],
        device: Any,
        mode: Callable[[Any], str],
        options: TableOptions,
    ) -> None:
        super().__init__()
        placement = options.get("placement")
        init = options.get("init", "auto")
        optimizer = check_options(tables, config_type, device, options)
        self._configs = list(tables)
        self._feature_names = [list(c.feature_names) for c in tables]
        self._names_by_table = embedding_names(tables)
        self._embedding_names = [n for ns in self._names_by_table for n in ns]
        bags = torch.nn.ModuleDict()
        self._meta = device is not None and torch.device(device).type == "meta"
        for c in tables:
            if self._meta:  # what TorchRec's sharders read (shapes and types); no rows
                bags[c.name] = _Described(c)
                continue
            place = per_table(placement, c.name)
            bags[c.name] = bag = TieredEmbeddingBag(
                c.num_embeddings,
                c.embedding_dim,
                mode=mode(c),
                include_last_offset=True,
                # FP32 (the default) leaves the storage type to the placement.
                dtype=None if c.data_type == DataType.FP32 else DATA_TYPES[c.data_type],
                placement=place,
                manager=options.get("manager"),
                optimizer=optimizer,
                lr=options.get("lr", 0.01),
                eps=options.get("eps"),
                init=init,
            )
            # A table file from an earlier run is re-attached as it is (its trained rows and
            # optimizer state), unless told to start over.
            if not bag.table.attached or init == "overwrite":
                init_shard(bag.table, c.num_embeddings, c.init_fn)
        setattr(self, self._attr, bags)
        # TorchRec's keys alone: optimizer state travels through fused_optimizer.
        self.register_state_dict_post_hook(drop_optimizer_keys)

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        """The tables' fused optimizer (TorchRec's name for it), whose ``state_dict`` holds
        their optimizer state, keyed as the weights are in this module's ``state_dict``."""
        self._refuse_meta()
        return FusedOptimizer({f"{self._attr}.{name}.weight": bag for name, bag in getattr(self, self._attr).items()})

    @property
    def device(self) -> torch.device:
        """Where lookups run (the CPU; the rows live where each table's placement puts them),
        or ``meta`` for a collection that only describes its tables."""
        return torch.device("meta" if self._meta else "cpu")

    def _refuse_meta(self) -> None:
        if self._meta:
            raise InvalidArgumentError(
                "this collection is on the meta device: it describes its tables for TorchRec's planner and holds no "
                "rows; shard it with DistributedModelParallel and tiermem.torchrec.EmbeddingBagCollectionSharder"
            )

    def _features(self, features: KeyedJaggedTensor, weighted: bool) -> dict[str, JaggedTensor]:
        self._refuse_meta()
        return check_features(features, self._feature_names, weighted)

    def _lookups(self, features: dict[str, JaggedTensor], weighted: bool) -> Any:
        """Per table, in config order: its name, its features' output names, and their rows,
        looked up in one call (FBGEMM's way: a row several features read in a batch gets one
        update of its summed gradient, one optimizer step per batch) and split per feature;
        the unpooled collection makes every id its own bag."""
        bags = getattr(self, self._attr)
        for c, fnames, onames in zip(self._configs, self._feature_names, self._names_by_table):
            jts = [features[f] for f in fnames]
            if self._attr == "embeddings":  # unpooled: every id its own bag
                values = torch.cat([jt.values() for jt in jts]) if len(jts) > 1 else jts[0].values()
                sizes = [jt.values().numel() for jt in jts]
                offsets, weights = torch.arange(values.numel() + 1), None
            else:
                values, offsets, weights, sizes = joined_bags(jts, weighted)
            try:
                rows = bags[c.name](values, offsets, weights)
            except (RuntimeError, ValueError) as e:
                raise InvalidArgumentError(
                    f"feature{'s' if len(fnames) > 1 else ''} {', '.join(map(repr, fnames))} (table {c.name!r}): {e}"
                ) from e
            yield c.name, onames, jts, rows.split(sizes)


class EmbeddingBagCollection(_Collection):
    """TorchRec's ``EmbeddingBagCollection`` (same constructor, forward and ``state_dict``)
    whose tables are tiermem's.

    Args:
        tables: TorchRec ``EmbeddingBagConfig`` objects (``name``, ``num_embeddings``,
            ``embedding_dim``, ``feature_names``, ``pooling`` SUM or MEAN, ``init_fn``).
        is_weighted: the input's weights scale each looked-up row (sum pooling).
        device: ``None`` or the CPU (lookups run there).
        options: where the tables live and how they train (:class:`TableOptions`).

    ``forward(features)`` takes a ``KeyedJaggedTensor`` holding every feature the configs
    name (others, and missing ones, are refused by name) and returns a ``KeyedTensor`` keyed
    as TorchRec keys it (a feature several tables read is ``FEATURE@TABLE``), in config
    order, ``values()`` of shape ``(batch, sum of widths)``.
    """

    _attr = "embedding_bags"

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: Any = None,
        **options: Unpack[TableOptions],
    ) -> None:
        for c in tables:
            if isinstance(c, EmbeddingBagConfig) and c.pooling not in POOLING:
                raise InvalidArgumentError(f"table {c.name!r}: pooling {c.pooling} is not supported (SUM or MEAN)")
        super().__init__(tables, EmbeddingBagConfig, device, lambda c: POOLING[c.pooling], options)
        self._is_weighted = bool(is_weighted)
        self._lengths_per_embedding = [c.embedding_dim for c, ns in zip(tables, self._names_by_table) for _ in ns]

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The configs, as TorchRec's collection returns them."""
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        pooled: list[torch.Tensor] = []
        for _, _, _, rows in self._lookups(self._features(features, self._is_weighted), self._is_weighted):
            pooled.extend(r.float() for r in rows)
        return KeyedTensor(
            keys=self._embedding_names, values=torch.cat(pooled, dim=1), length_per_key=self._lengths_per_embedding
        )


class EmbeddingCollection(_Collection):
    """TorchRec's ``EmbeddingCollection`` (unpooled: one row per id, for sequence features)
    whose tables are tiermem's. Arguments as :class:`EmbeddingBagCollection` (``tables``:
    ``EmbeddingConfig`` objects), and ``need_indices``: each output's ``weights()`` are the
    ids it looked up. ``forward(features)`` returns ``{name: JaggedTensor}`` (values of
    shape ``(ids, width)``, the feature's lengths), named as TorchRec names them;
    ``state_dict`` keys are ``embeddings.<table>.weight``."""

    _attr = "embeddings"

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        device: Any = None,
        need_indices: bool = False,
        **options: Unpack[TableOptions],
    ) -> None:
        # One id per bag, summed: the row itself, its gradient the row's own.
        super().__init__(tables, EmbeddingConfig, device, lambda c: "sum", options)
        self._need_indices = bool(need_indices)

    def embedding_configs(self) -> list[EmbeddingConfig]:
        """The configs, as TorchRec's collection returns them."""
        return self._configs

    def need_indices(self) -> bool:
        return self._need_indices

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        out: dict[str, JaggedTensor] = {}
        for _, names, jts, rows in self._lookups(self._features(features, False), False):
            for name, jt, r in zip(names, jts, rows, strict=True):
                out[name] = JaggedTensor(values=r, lengths=jt.lengths(), weights=jt.values() if self._need_indices else None)
        return out
