"""Checkpoints of tiered tables through ``torch.distributed.checkpoint`` (DCP), streamed:
a table larger than DRAM is read and written a chunk of rows at a time, never whole.

:func:`state_dict` is a model's ``state_dict()`` in which every tiered table is a
:class:`TableRows` instead of a tensor: DCP's own planners see it as a tensor of the
table's global shape (a shard of a sharded table sits at its rows and columns) cut into
chunks of about :data:`CHUNK_BYTES`, and saving reads one chunk at a time. Each table with
optimizer state adds ``<prefix>optimizer.<optimizer>`` (its state, ``rows x`` the state's
floats per row) and ``<prefix>optimizer_steps``. Loading needs :class:`LoadPlanner`, which
writes each chunk read into the table and loads nothing as code::

    import torch.distributed.checkpoint as dcp
    from tiermem.torch import dcp as tdcp

    dcp.save({"model": tdcp.state_dict(model)}, checkpoint_id=path)
    dcp.load({"model": tdcp.state_dict(model)}, checkpoint_id=path, planner=tdcp.LoadPlanner())

Keys and global shapes are TorchRec's (``embedding_bags.<table>.weight``), so a checkpoint
moves between world sizes and sharding kinds (DCP reads each chunk from the saved chunks it
overlaps), and to or from TorchRec's own collections (weights; their optimizer state is
FBGEMM's). A checkpoint without optimizer state (saved before any update, or by TorchRec)
loads with the tables' state reset; one holding another optimizer's state is refused.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint._nested_dict import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem, TensorWriteData, WriteItem, WriteItemType

from .. import _tiermem
from ..embedding import EmbeddingTable
from ..exceptions import InvalidArgumentError
from .embedding import TORCH_DTYPES, TieredEmbeddingBag, TieredEmbeddingBagCollection, tables_aside, tiered_tables

__all__ = ["CHUNK_BYTES", "LoadPlanner", "Piece", "TableRows", "TableSteps", "state_dict"]

#: About how many bytes of rows one chunk holds (at least one row): what a save or load
#: holds in DRAM per table at a time.
CHUNK_BYTES = 64 << 20

_STATE = re.compile(r"(.*)optimizer\.([a-z_]+)(?:\.cols(\d+)_(\d+))?$")


@dataclass(frozen=True)
class Piece:
    """A tiered table as part of a global one: ``table`` holds rows ``row0..`` and columns
    ``col0..`` of a ``rows x dim`` table whose keys start with ``prefix``; ``split`` says
    the global table's columns are cut over several pieces."""

    prefix: str
    table: EmbeddingTable
    rows: int
    dim: int
    row0: int = 0
    col0: int = 0
    split: bool = False
    #: The optimizer its module trains with (what state a load expects).
    optimizer: str | None = None


class _Handle(torch.Tensor):
    """A tensor without storage that stands for rows kept elsewhere: DCP's planners take it
    for a tensor (its shape, dtype and checkpointable protocol), and any operation on it is
    refused, naming what to do instead."""

    @staticmethod
    def __new__(cls, shape: tuple[int, ...], dtype: torch.dtype, *args: Any) -> _Handle:
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=torch.device("cpu"))

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        raise InvalidArgumentError(
            f"{cls.__name__} stands for a tiered table in a DCP state dict and holds no data ({func} was called on "
            "it): save it with torch.distributed.checkpoint, load it with tiermem.torch.dcp.LoadPlanner, or read "
            "rows with its read()"
        )

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise InvalidArgumentError(
            f"{type(self).__name__} stands for a tiered table and cannot be pickled (torch.save): save the state "
            "dict with torch.distributed.checkpoint, which streams the table, or use model.state_dict() of a "
            "one-process collection"
        )


class _Part:
    """One tiered table's rows (or state) at ``(row0, col0)`` of a global tensor."""

    def __init__(self, table: EmbeddingTable, row0: int, col0: int, optimizer: str | None) -> None:
        self.table, self.row0, self.col0, self.optimizer = table, int(row0), int(col0), optimizer
        self.cols = _tiermem.optimizer_state_width(optimizer, table.embedding_dim) if optimizer else table.embedding_dim
        if optimizer and self.cols == 0:
            raise InvalidArgumentError(f"optimizer {optimizer!r} keeps no state to checkpoint")
        self.rows = table.num_embeddings

    def read(self, lo: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        """Local rows ``lo..lo + n`` (of the state, for an optimizer's: zeros where it has
        none yet)."""
        if self.optimizer is None:
            return torch.from_numpy(self.table.read(lo, n)).to(dtype)
        out = np.zeros((n, self.cols), np.float32)
        st = self.table.optimizer_state_info()
        if st is not None and st[0] == self.optimizer:
            self.table.read_optimizer_state(lo * self.cols, out.reshape(-1))
        return torch.from_numpy(out)

    def write(self, lo: int, col: int, v: np.ndarray) -> None:
        """Write float32 ``v`` at local row ``lo``, column ``col`` (a part of the columns is
        merged into the rows as they are)."""
        if col != 0 or v.shape[1] != self.cols:
            rows = self.read(lo, len(v), torch.float32).numpy()
            rows[:, col : col + v.shape[1]] = v
            v = rows
        if self.optimizer is None:
            self.table.load(v, lo)
        else:
            st = self.table.optimizer_state_info()
            steps = st[2] if st is not None and st[0] == self.optimizer else 0
            self.table.set_optimizer_state(self.optimizer, v.reshape(-1), steps, lo * self.cols)


class TableRows(_Handle):
    """Tiered tables' rows, or their optimizer's state (``optimizer`` named), as DCP sees a
    tensor: ``size()`` is the global ``shape``; each of ``parts`` (a table and where its
    rows and columns sit in the global tensor) is offered a chunk of rows at a time (see
    the module's note)."""

    @staticmethod
    def __new__(
        cls, shape: tuple[int, int], parts: list[tuple[EmbeddingTable, int, int]], optimizer: str | None = None
    ) -> TableRows:
        dtype = TORCH_DTYPES[parts[0][0].dtype] if optimizer is None and parts else torch.float32
        return _Handle.__new__(cls, (int(shape[0]), int(shape[1])), dtype)  # type: ignore[return-value]

    def __init__(
        self, shape: tuple[int, int], parts: list[tuple[EmbeddingTable, int, int]], optimizer: str | None = None
    ) -> None:
        self.optimizer = optimizer
        self.parts = [_Part(t, r, c, optimizer) for t, r, c in parts]
        full = tuple(self.shape)
        for p in self.parts:
            if p.row0 < 0 or p.col0 < 0 or p.row0 + p.rows > full[0] or p.col0 + p.cols > full[1]:
                raise InvalidArgumentError(f"a {p.rows} x {p.cols} part at ({p.row0}, {p.col0}) does not fit a {full} tensor")
        if len({p.table.dtype for p in self.parts}) > 1:
            raise InvalidArgumentError("the parts of one table must keep one storage type")
        #: Most rows one chunk read or written held (what streaming bounds).
        self.peak_rows = 0
        self._loading = False
        #: Each chunk's global (row, column) offset: its part and first local row.
        self._at: dict[tuple[int, int], tuple[_Part, int, int]] = {}
        for p in self.parts:
            step = max(1, CHUNK_BYTES // (4 * max(1, p.cols)))
            for lo in range(0, p.rows, step):
                self._at[(p.row0 + lo, p.col0)] = (p, lo, min(step, p.rows - lo))

    def _chunks(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=torch.Size(at), sizes=torch.Size((n, p.cols))) for at, (p, _, n) in self._at.items()]

    def _find(self, fqn: str, offset: Any) -> tuple[_Part, int, int]:
        key = (int(offset[0]), int(offset[1])) if offset is not None else None
        if key not in self._at:
            raise InvalidArgumentError(f"{fqn}: DCP asked for a chunk at {offset}, which is not one of this table's")
        return self._at[key]

    # DCP's checkpointable protocol -------------------------------------------------------
    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        self._loading = False
        props = TensorProperties(dtype=self.dtype)
        return [
            WriteItem(
                index=MetadataIndex(fqn, chunk.offsets, k),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk=chunk, properties=props, size=self.shape),
            )
            for k, chunk in enumerate(self._chunks())
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        self._loading = True
        return self._chunks()

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        if self._loading:
            raise InvalidArgumentError(
                f"{index.fqn} is a tiered table: load it with planner=tiermem.torch.dcp.LoadPlanner(), which writes "
                "what DCP reads into the table (the default planner would fill a copy and drop it)"
            )
        p, lo, n = self._find(index.fqn, index.offset)
        self.peak_rows = max(self.peak_rows, n)
        return p.read(lo, n, self.dtype)

    def commit(self, fqn: str, chunk_at: Any, at: Any, values: torch.Tensor) -> None:
        """Write what DCP read for the chunk at global ``chunk_at``, from ``at`` inside it."""
        p, lo, _ = self._find(fqn, chunk_at)
        v = values.detach().to(torch.float32).contiguous().numpy()
        self.peak_rows = max(self.peak_rows, len(v))
        p.write(lo + int(at[0]), int(at[1]), v)

    def __repr__(self) -> str:  # type: ignore[override]
        what = f"optimizer={self.optimizer!r}" if self.optimizer else f"dtype={self.dtype}"
        parts = ", ".join(f"{p.rows} x {p.cols} at ({p.row0}, {p.col0})" for p in self.parts)
        return f"TableRows({tuple(self.shape)}: {parts}; {what})"


class TableSteps(_Handle):
    """The step count of a table's optimizer (a 0-d int64 tensor to DCP)."""

    @staticmethod
    def __new__(cls, tables: list[EmbeddingTable], optimizer: str) -> TableSteps:
        return _Handle.__new__(cls, (), torch.int64)  # type: ignore[return-value]

    def __init__(self, tables: list[EmbeddingTable], optimizer: str) -> None:
        self.tables, self.optimizer = tables, optimizer
        self._loading = False

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        self._loading = False
        chunk = ChunkStorageMetadata(offsets=torch.Size(()), sizes=torch.Size(()))
        props = TensorProperties(dtype=self.dtype)
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(())),
                type=WriteItemType.TENSOR,
                tensor_data=TensorWriteData(chunk=chunk, properties=props, size=self.shape),
            )
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        self._loading = True
        return [ChunkStorageMetadata(offsets=torch.Size(()), sizes=torch.Size(()))]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        if self._loading:
            raise InvalidArgumentError(f"{index.fqn}: load tiered tables with planner=tiermem.torch.dcp.LoadPlanner()")
        st = self.tables[0].optimizer_state_info()
        return torch.tensor(st[2] if st is not None else 0, dtype=torch.int64)

    def write(self, steps: int) -> None:
        # No values: the state (zeros if it is new or of another optimizer) takes the count.
        for t in self.tables:
            t.set_optimizer_state(self.optimizer, np.zeros(0, np.float32), steps)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"TableSteps({self.optimizer!r})"


def _pieces(model: torch.nn.Module) -> list[Piece]:
    """Every tiered table under ``model``: a module with ``dcp_pieces(prefix)`` (a sharded
    collection) names its own; the embedding modules theirs, whole."""
    out: list[Piece] = []
    inside: list[str] = []
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        if any(prefix.startswith(p) for p in inside):
            continue
        fn = getattr(m, "dcp_pieces", None)
        if callable(fn):
            out.extend(fn(prefix))
            inside.append(prefix)
        elif isinstance(m, TieredEmbeddingBag | TieredEmbeddingBagCollection):
            for key, t in tiered_tables(m).items():
                out.append(Piece(prefix + key, t, t.num_embeddings, t.embedding_dim, optimizer=m.optimizer))
    return out


def _optimizer_of(table: EmbeddingTable, model_optimizer: str | None) -> str | None:
    """The optimizer whose state the table keeps (or will): the one it trained with, else
    the module's, when it keeps state."""
    name = table.trained_with or model_optimizer
    if name is None or _tiermem.optimizer_state_width(name, table.embedding_dim) == 0:
        return None
    return name


def state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """``model.state_dict()`` with every tiered table as a :class:`TableRows` (and its
    optimizer state and step count beside it): what ``dcp.save`` streams and ``dcp.load``
    with :class:`LoadPlanner` fills in place."""
    # TorchRec's DistributedModelParallel keys its state as the module it wraps does.
    if type(model).__name__ == "DistributedModelParallel":
        inner = model.module
        assert isinstance(inner, torch.nn.Module)
        model = inner
    with tables_aside():
        out: dict[str, Any] = dict(model.state_dict())
    # key -> (global shape, optimizer, parts)
    groups: dict[str, tuple[tuple[int, int], str | None, list[tuple[EmbeddingTable, int, int]]]] = {}
    steps: dict[str, tuple[str, list[EmbeddingTable]]] = {}

    def add(key: str, shape: tuple[int, int], kind: str | None, part: tuple[EmbeddingTable, int, int]) -> None:
        groups.setdefault(key, (shape, kind, []))[2].append(part)

    for p in _pieces(model):
        t = p.table
        add(p.prefix + "weight", (p.rows, p.dim), None, (t, p.row0, p.col0))
        kind = _optimizer_of(t, p.optimizer)
        if kind is None:
            continue
        k = _tiermem.optimizer_state_width(kind, t.embedding_dim)
        if not p.split:
            add(f"{p.prefix}optimizer.{kind}", (p.rows, k), kind, (t, p.row0, 0))
        elif k == t.embedding_dim:  # element-wise state: cut as the columns are
            add(f"{p.prefix}optimizer.{kind}", (p.rows, p.dim), kind, (t, p.row0, p.col0))
        else:  # state per row of a column slice: kept per slice
            add(f"{p.prefix}optimizer.{kind}.cols{p.col0}_{p.col0 + t.embedding_dim}", (p.rows, k), kind, (t, p.row0, 0))
        steps.setdefault(p.prefix + "optimizer_steps", (kind, []))[1].append(t)
    for key, (shape, kind, parts) in groups.items():
        out[key] = TableRows(shape, parts, kind)
    for key, (kind, tables) in steps.items():
        out[key] = TableSteps(tables, kind)
    return out


class LoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, which also writes what it reads into tiered tables
    (:class:`TableRows`, :class:`TableSteps`) a chunk at a time, and reads a checkpoint's
    non-tensor values as data only (``torch.load(weights_only=True)``)."""

    def set_up_planner(self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is None:
            return
        saved = metadata.state_dict_metadata
        absent = []  # optimizer entries the checkpoint lacks: their tables start over
        for fqn in [f for f, v in self.state_dict.items() if isinstance(v, TableRows | TableSteps)]:
            obj = self.state_dict[fqn]
            if fqn in saved:
                md = saved[fqn]
                if not isinstance(md, TensorStorageMetadata):
                    raise InvalidArgumentError(f"{fqn}: the checkpoint holds a {type(md).__name__} there, not a tensor")
                continue
            m = _STATE.match(fqn) if isinstance(obj, TableRows) else None
            if m is None and isinstance(obj, TableRows):
                continue  # a missing weight: DCP's own error (or allow_partial_load)
            prefix = m.group(1) if m else fqn[: -len("optimizer_steps")]
            other = sorted(k for k in saved if k.startswith(prefix + "optimizer.") and _STATE.match(k))
            if other:
                raise InvalidArgumentError(
                    f"{fqn} is not in the checkpoint, which holds {other} for that table: it was saved with another "
                    "optimizer (or another column split of its state); build the model with that optimizer, or load "
                    "the weights alone (drop the optimizer keys from the state dict)"
                )
            absent.append(fqn)
        # Saved without optimizer state (before any update, or by TorchRec): start over, once
        # every entry has passed its checks (a refused load changes nothing).
        for fqn in absent:
            obj = self.state_dict.pop(fqn)
            for t in [p.table for p in obj.parts] if isinstance(obj, TableRows) else obj.tables:
                t.reset_optimizer()

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        obj = self.state_dict.get(read_item.dest_index.fqn)
        if isinstance(obj, TableRows | TableSteps):
            return torch.empty(tuple(read_item.lengths), dtype=obj.dtype)
        return super().resolve_tensor(read_item)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        obj = self.state_dict.get(read_item.dest_index.fqn)
        if isinstance(obj, TableSteps):
            obj.write(int(tensor))
        elif isinstance(obj, TableRows):
            obj.commit(read_item.dest_index.fqn, read_item.dest_index.offset, read_item.dest_offsets, tensor)
        else:
            super().commit_tensor(read_item, tensor)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        data = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], data)
        else:
            self.state_dict[read_item.dest_index.fqn] = data
