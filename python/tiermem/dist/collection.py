"""TorchRec's ``EmbeddingBagCollection`` sharded over the ranks of ``torch.distributed``:
the configs, the ``KeyedJaggedTensor`` in and ``KeyedTensor`` out of
:class:`tiermem.torchrec.EmbeddingBagCollection`, each rank holding its shards of the
tables (:class:`~tiermem.dist.embeddings.ShardedEmbeddings`) as tiered tables placed as
asked.

Tables may differ in width and pooling, and several features may read one table (their
bags are looked up together, one optimizer step per batch). Each rank passes its own
samples; the fused optimizer applies ``grad_scale`` (``1 / world`` by default) to the
gradient, so ranks whose losses are means over their samples, with DDP averaging the dense
gradients, train the global batch's curve.

``state_dict()`` holds each table as a handle of its global shape
(:class:`tiermem.torch.dcp.TableRows`, its keys TorchRec's ``embedding_bags.<table>.weight``)
for ``torch.distributed.checkpoint``: a checkpoint saved on any number of ranks, or by the
single-process collection, loads here (with :class:`tiermem.torch.dcp.LoadPlanner`) and the
other way round. ``load_state_dict`` also takes whole tensors (each rank keeps its part).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Unpack

import torch
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..embedding import EmbeddingTable, OptimizerConfig, Placement
from ..exceptions import InvalidArgumentError
from ..torch.dcp import Piece, TableRows
from ..torchrec.collection import (
    DATA_TYPES,
    POOLING,
    TableOptions,
    check_features,
    check_options,
    embedding_names,
    init_shard,
    per_table,
)
from .embeddings import ShardedEmbeddings
from .plan import SHARDINGS, Shard, plan_shards

__all__ = ["EmbeddingBagCollection"]


class EmbeddingBagCollection(torch.nn.Module):
    """TorchRec's ``EmbeddingBagCollection`` with its tables sharded over ``group``'s ranks
    (see the module's note).

    Args:
        tables: TorchRec ``EmbeddingBagConfig`` objects (pooling SUM or MEAN; FP32, FP16
            or BF16 rows).
        is_weighted: refused for now (the sharded lookup takes no per-sample weights).
        device: ``None`` or the CPU.
        sharding: ``"table"``, ``"row"`` or ``"column"`` (:func:`~tiermem.dist.plan_shards`).
        group: the process group (default the world); every rank builds the collection
            with the same configs.
        grad_scale: what the output's gradient is multiplied by before the update.
        options: placement, optimizer (or ``fused_params``), manager and init as
            :class:`tiermem.torchrec.TableOptions`; a ``table:DIR`` placement gives each
            shard its own file, ``DIR/<table>.rows<lo>-<hi>.cols<c0>-<c1>.tbl``.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: Any = None,
        *,
        sharding: str = "row",
        group: Any = None,
        grad_scale: float | None = None,
        **options: Unpack[TableOptions],
    ) -> None:
        super().__init__()
        optimizer = check_options(tables, EmbeddingBagConfig, device, options)
        if is_weighted:
            raise InvalidArgumentError("weighted features are not sharded yet: use tiermem.torchrec's collection in one process")
        for c in tables:
            if c.pooling not in POOLING:
                raise InvalidArgumentError(f"table {c.name!r}: pooling {c.pooling} is not supported (SUM or MEAN)")
        if sharding not in SHARDINGS:
            raise InvalidArgumentError(f"sharding {sharding!r}: known are {', '.join(SHARDINGS)}")
        if not torch.distributed.is_initialized():
            raise InvalidArgumentError("a sharded collection needs torch.distributed initialised (init_process_group)")
        self._configs = list(tables)
        self._feature_names = [list(c.feature_names) for c in tables]
        self._names_by_table = embedding_names(tables)
        self._embedding_names = [n for ns in self._names_by_table for n in ns]
        self._lengths_per_embedding = [c.embedding_dim for c, ns in zip(tables, self._names_by_table) for _ in ns]
        world = torch.distributed.get_world_size(group)
        plan = plan_shards([c.num_embeddings for c in tables], [c.embedding_dim for c in tables], world, sharding)
        given = {k: options[k] for k in ("lr", "eps") if options.get(k) is not None}
        self.optim = OptimizerConfig.of(optimizer, **given)
        placement, init = options.get("placement"), options.get("init", "auto")

        def make_table(s: Shard) -> EmbeddingTable:
            c = tables[s.table]
            c0, c1 = s.cols(c.embedding_dim)
            place = per_table(placement, c.name, f"{c.name}.rows{s.lo}-{s.hi}.cols{c0}-{c1}")
            if c.data_type != DataType.FP32:  # FP32 (the default) leaves the storage type to the placement
                dtype = str(DATA_TYPES[c.data_type]).removeprefix("torch.")
                place = dataclasses.replace(place or Placement(), dtype=dtype)
            t = EmbeddingTable(s.rows, c1 - c0, placement=place, manager=options.get("manager"))
            if not t.attached or init == "overwrite":
                t.reset_optimizer()
                init_shard(t, c.num_embeddings, c.init_fn)
            return t

        self.sharded = ShardedEmbeddings(
            plan,
            make_table,
            optimizer=self.optim,
            mode=[POOLING[c.pooling] for c in tables],
            grad_scale=grad_scale,
            group=group,
            names=[c.name for c in tables],
        )
        self._stack = max(len(fs) for fs in self._feature_names)

    @property
    def optimizer(self) -> str:
        """The fused optimizer's name."""
        return self.optim.name

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return False

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """This rank's samples in, their pooled rows out (every rank calls it together)."""
        feats = check_features(features, self._feature_names, False)
        b = -1
        indices, offsets = [], []
        for fnames in self._feature_names:
            jts = [feats[f] for f in fnames]
            for f, jt in zip(fnames, jts, strict=True):
                if b < 0:
                    b = jt.lengths().numel()
                if jt.lengths().numel() != b:
                    raise InvalidArgumentError(f"feature {f!r} has {jt.lengths().numel()} samples, the first feature {b}")
            # Every table gets as many bags per sample (its features', then empty ones), so the
            # sharded lookup sees one batch of ``stack * b`` bags for all.
            lengths = torch.cat([jt.lengths() for jt in jts] + [torch.zeros(b * (self._stack - len(jts)), dtype=torch.int64)])
            indices.append(torch.cat([jt.values() for jt in jts]).to(torch.int64))
            offsets.append(torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths.to(torch.int64), 0)]))
        out = self.sharded(indices, offsets)
        pooled: list[torch.Tensor] = []
        for t, fnames in enumerate(self._feature_names):
            c0, c1 = self.sharded._col0[t], self.sharded._col0[t + 1]
            pooled.extend(out[k * b : (k + 1) * b, c0:c1] for k in range(len(fnames)))
        return KeyedTensor(
            keys=self._embedding_names, values=torch.cat(pooled, dim=1), length_per_key=self._lengths_per_embedding
        )

    # Checkpoints --------------------------------------------------------------------------
    def dcp_pieces(self, prefix: str) -> list[Piece]:
        """This rank's shards as parts of their global tables (:mod:`tiermem.torch.dcp`)."""
        split = self.sharded.plan.sharding == "column"
        return [
            Piece(
                f"{prefix}embedding_bags.{self._configs[s.table].name}.",
                t,
                self._configs[s.table].num_embeddings,
                self._configs[s.table].embedding_dim,
                s.lo,
                s.cols(self._configs[s.table].embedding_dim)[0],
                split,
                self.optim.name,
            )
            for s, t in zip(self.sharded.shards, self.sharded.tables, strict=True)
        ]

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        parts: dict[str, list[Piece]] = {}
        for p in self.dcp_pieces(prefix):
            parts.setdefault(p.prefix + "weight", []).append(p)
        for key, ps in parts.items():
            destination[key] = TableRows((ps[0].rows, ps[0].dim), [(p.table, p.row0, p.col0) for p in ps])

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        for p in self.dcp_pieces(prefix):
            key = p.prefix + "weight"
            w = state_dict.get(key)
            if w is None:
                missing_keys.append(key)
            elif isinstance(w, TableRows):
                continue  # a handle (from state_dict()): DCP loads those
            elif tuple(w.shape) != (p.rows, p.dim):
                error_msgs.append(f"size mismatch for {key}: checkpoint {tuple(w.shape)}, table {(p.rows, p.dim)}")
            else:
                n, width = p.table.num_embeddings, p.table.embedding_dim
                part = w.detach()[p.row0 : p.row0 + n, p.col0 : p.col0 + width]
                p.table.load(part.to(torch.float32).contiguous().numpy())

    def extra_repr(self) -> str:
        return f"tables={[c.name for c in self._configs]}, {self.sharded.extra_repr()}, optimizer={self.optim.name!r}"
