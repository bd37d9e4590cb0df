"""Tiered embedding tables sharded over the ranks of a ``torch.distributed`` group.

Each rank holds its shards (:mod:`tiermem.dist.plan`) as tiered tables, in any placement a
single process can use, and every step exchanges with the others:

1. **Indices** (``all_to_all_single``): each rank sends every shard's owner the part of its
   local bags that falls in the shard's rows (lengths, then values, as rows of the shard).
2. **Lookup**: each owner looks up its shards for the bags of every rank, in rank order
   (the global batch's order, so a table-wise shard sees exactly what one process would).
3. **Pooled embeddings** (``all_to_all_single``): each owner sends each rank its bags'
   pooled rows (a column shard: its columns of them); a rank adds the partial sums of a
   row-wise table's shards and places a column-wise table's slices side by side.
4. **Backward**: the output's gradient goes back to the owners the same way, scaled by
   ``grad_scale`` (``1 / world`` by default: each rank's loss is the mean over its own
   samples and DDP averages the dense gradients, so this is the gradient of the global
   mean), and each owner applies the fused optimizer to its rows.

Collectives run on the group given (gloo on CPUs; NCCL needs the same calls on CUDA
tensors), each bounded by the group's timeout: a rank that dies or cannot be reached ends
the others' step with an error rather than a hang.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..embedding import EmbeddingCollection, EmbeddingTable, OptimizerConfig
from ..exceptions import InvalidArgumentError
from .plan import Shard, ShardPlan

__all__ = ["ShardedEmbeddings", "Traffic"]


class Traffic:
    """What a rank's exchanges cost so far: seconds in collectives, bytes sent to other ranks
    and collectives called."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.bytes_sent = 0
        self.calls = 0

    def as_dict(self) -> dict[str, float]:
        return {"seconds": self.seconds, "bytes_sent": self.bytes_sent, "calls": self.calls}


def _exchange(
    parts: list[np.ndarray], dtype: torch.dtype, recv_counts: list[int], group: Any, traffic: Traffic, rank: int
) -> list[np.ndarray]:
    """``all_to_all_single``: ``parts[d]`` (flat) goes to rank ``d``; returns what each rank
    sent here (flat, ``recv_counts[s]`` elements from rank ``s``)."""
    send = torch.from_numpy(np.concatenate(parts)) if parts else torch.empty(0, dtype=dtype)
    send = send.to(dtype)
    recv = torch.empty(sum(recv_counts), dtype=dtype)
    t = time.perf_counter()
    dist.all_to_all_single(recv, send, recv_counts, [len(p) for p in parts], group=group)
    traffic.seconds += time.perf_counter() - t
    traffic.bytes_sent += (send.numel() - len(parts[rank])) * send.element_size() if parts else 0
    traffic.calls += 1
    out = recv.numpy()
    edges = np.cumsum([0, *recv_counts])
    return [out[edges[s] : edges[s + 1]] for s in range(len(recv_counts))]


class _Routed:
    """One step's routing: what this rank sent to and received from every rank."""

    def __init__(self, sizes: list[int], bags: list[tuple[np.ndarray, np.ndarray]], lengths: list[np.ndarray]) -> None:
        #: Local batch size of every rank.
        self.sizes = sizes
        #: Per held shard, its bags over every rank's samples in rank order.
        self.bags = bags
        #: Per table, the full length of each local bag (for ``mean``).
        self.lengths = lengths


class _ShardedLookup(torch.autograd.Function):
    """Forward: route, look up, return. Backward: route the gradient back, update."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, owner: ShardedEmbeddings, indices: Any, offsets: Any) -> torch.Tensor:
        out, routed = owner._forward(indices, offsets)
        ctx.owner, ctx.routed = owner, routed
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, None]:
        ctx.owner._backward(ctx.routed, grad.detach().to(torch.float32).contiguous().numpy())
        return None, None, None, None


class ShardedEmbeddings(torch.nn.Module):
    """The embedding tables of a model, sharded over the ranks of ``group`` by ``plan``.

    Args:
        plan: the shards (:func:`~tiermem.dist.plan.plan_shards`).
        make_table: ``make_table(shard)`` returns the tiered table that holds ``shard`` on
            this rank (``shard.rows`` rows of ``plan.dim``), placed as this rank wants it.
        lr: the fused SGD's learning rate (or ``optimizer`` an
            :class:`~tiermem.embedding.OptimizerConfig`).
        mode: ``"sum"`` or ``"mean"`` pooling (or one per table).
        grad_scale: what the output's gradient is multiplied by before the update (default
            ``1 / world``; see the module's note).
        group: the process group (default the world).
        names: the tables' names, the keys of a ``KeyedJaggedTensor`` input (default
            ``t0``, ``t1``, ...).

    ``forward(indices, offsets)`` takes this rank's local bags per table (``indices[t]``
    int64, ``offsets[t]`` its ``b + 1`` boundaries; every rank calls it together) and
    returns ``(b, sum of the tables' widths)`` float32 with the tables in order (a plan may
    give each table its own width); backward updates the
    rows. It has the interface of the single-process ``TieredEmbeddings`` of
    :mod:`tiermem.dlrm.model` (``load_rows``, ``step``, and ``rows_held`` so a model writes
    only the rows this rank holds).
    """

    def __init__(
        self,
        plan: ShardPlan,
        make_table: Callable[[Shard], EmbeddingTable],
        *,
        lr: float = 0.01,
        optimizer: OptimizerConfig | None = None,
        mode: str | Sequence[str] = "sum",
        grad_scale: float | None = None,
        group: Any = None,
        names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        modes = [mode] * len(plan.rows) if isinstance(mode, str) else list(mode)
        if len(modes) != len(plan.rows) or any(m not in ("sum", "mean") for m in modes):
            raise InvalidArgumentError(f"mode {mode!r}: sharded tables pool with 'sum' or 'mean', one for all or one per table")
        if not dist.is_initialized():
            raise InvalidArgumentError("ShardedEmbeddings needs torch.distributed initialised (init_process_group)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if plan.world != self.world:
            raise InvalidArgumentError(f"the shard plan is for {plan.world} ranks, the group has {self.world}")
        self.plan, self.modes = plan, modes
        self.mode = modes[0] if len(set(modes)) == 1 else "mixed"
        #: Each table's width and its first output column.
        self.dims = [plan.dim_of(t) for t in range(len(plan.rows))]
        self._col0 = [int(c) for c in np.cumsum([0, *self.dims])]
        self.names = list(names) if names is not None else [f"t{t}" for t in range(len(plan.rows))]
        if len(self.names) != len(plan.rows) or len(set(self.names)) != len(self.names):
            raise InvalidArgumentError(f"{len(plan.rows)} tables need as many distinct names, got {list(self.names)}")
        self.optim = optimizer if optimizer is not None else OptimizerConfig("sgd", lr=lr)
        self.grad_scale = float(grad_scale) if grad_scale is not None else 1.0 / self.world
        self.shards = plan.held(self.rank)
        self.tables = [make_table(s) for s in self.shards]
        for s, t in zip(self.shards, self.tables, strict=True):
            if t.num_embeddings != s.rows or t.embedding_dim != s.width(plan.dim_of(s.table)):
                raise InvalidArgumentError(
                    f"make_table gave a {t.num_embeddings} x {t.embedding_dim} table for shard {s} "
                    f"({s.rows} x {s.width(plan.dim_of(s.table))})"
                )
        self._collection = EmbeddingCollection(self.tables) if self.tables else None
        # Per table, its shards, its distinct row ranges' first rows (for routing: a row goes
        # to every shard of its range, one per column slice) and each shard's range.
        self._by_table = [plan.of_table(t) for t in range(len(plan.rows))]
        los = [sorted({s.lo for s in ss}) for ss in self._by_table]
        self._starts = [np.array(lo, np.int64) for lo in los]
        self._range_of = {s: los[s.table].index(s.lo) for s in plan.shards}
        self._held_by = [plan.held(r) for r in range(self.world)]
        # Columns each rank's shards return per sample, and where each shard's go.
        self._widths = [sum(s.width(plan.dim_of(s.table)) for s in held) for held in self._held_by]
        self._out_cols = {
            s: (self._col0[s.table] + s.cols(plan.dim_of(s.table))[0], s.width(plan.dim_of(s.table))) for s in plan.shards
        }
        self._anchor = torch.zeros((), requires_grad=True)
        #: This rank's exchanges so far (seconds in collectives, bytes sent, calls).
        self.traffic = Traffic()

    # The model's interface ----------------------------------------------------------------
    def rows_held(self, table: int) -> list[tuple[int, int]]:
        """Row ranges of ``table`` this rank holds (of any of its columns)."""
        return sorted({(s.lo, s.hi) for s in self.shards if s.table == table})

    def load_rows(self, table: int, start: int, values: np.ndarray) -> None:
        """Write rows ``start..`` of ``table`` (whole rows): the part this rank holds."""
        end = start + len(values)
        for s, t in zip(self.shards, self.tables, strict=True):
            lo, hi = max(start, s.lo), min(end, s.hi)
            c0, c1 = s.cols(self.plan.dim_of(s.table))
            if s.table == table and lo < hi:
                t.load(np.ascontiguousarray(values[lo - start : hi - start, c0:c1]), lo - s.lo)

    def step(self) -> None:
        """Nothing: rows were updated in backward."""

    def forward(self, indices: Any, offsets: Sequence[Any] | None = None) -> Any:
        """``forward(indices, offsets)`` (per table) returns a tensor; ``forward(kjt)`` with
        TorchRec's ``KeyedJaggedTensor`` (one key per table name) returns a ``KeyedTensor``."""
        if offsets is None:
            return self._keyed(indices)
        if len(indices) != len(self.plan.rows) or len(offsets) != len(self.plan.rows):
            raise InvalidArgumentError(f"{len(indices)} index and {len(offsets)} offset arrays for {len(self.plan.rows)} tables")
        if torch.is_grad_enabled():
            return _ShardedLookup.apply(self._anchor, self, indices, offsets)
        return torch.from_numpy(self._forward(indices, offsets)[0])

    def _keyed(self, kjt: Any) -> Any:
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor
        except ImportError:
            raise InvalidArgumentError(
                "one argument to forward is a KeyedJaggedTensor, and torchrec does not import here: "
                "pass per-table indices and offsets"
            ) from None
        if not isinstance(kjt, KeyedJaggedTensor):
            raise InvalidArgumentError(f"forward takes (indices, offsets) or a KeyedJaggedTensor, not {type(kjt).__name__}")
        keys = list(kjt.keys())
        if sorted(keys) != sorted(self.names):
            raise InvalidArgumentError(f"the KeyedJaggedTensor has keys {keys}, the tables are {self.names}")
        jts = kjt.to_dict()
        out = self([jts[n].values().to(torch.int64) for n in self.names], [jts[n].offsets().to(torch.int64) for n in self.names])
        return KeyedTensor(keys=self.names, length_per_key=list(self.dims), values=out)

    # The exchange ---------------------------------------------------------------------------
    def _local_bags(self, indices: Sequence[Any], offsets: Sequence[Any]) -> tuple[int, list[list[np.ndarray]], list[np.ndarray]]:
        """Split this rank's bags by shard: per destination rank, per shard it holds,
        ``(lengths, values as shard rows)``; and each table's full bag lengths."""
        b = -1
        split: dict[Shard, tuple[np.ndarray, np.ndarray]] = {}
        lengths = []
        for t, (v, o) in enumerate(zip(indices, offsets, strict=True)):
            v = np.ascontiguousarray(np.asarray(v, np.int64)).reshape(-1)
            o = np.ascontiguousarray(np.asarray(o, np.int64)).reshape(-1)
            if b < 0:
                b = len(o) - 1
            if len(o) - 1 != b or b < 0 or o[0] != 0 or o[-1] != len(v) or np.any(np.diff(o) < 0):
                raise InvalidArgumentError(
                    f"table {t}: offsets must run from 0 to its {len(v)} indices, non-decreasing, "
                    f"with one bag per sample ({b} in table 0), got {len(o)} offsets ending at {o[-1] if len(o) else None}"
                )
            if len(v) and (v.min() < 0 or v.max() >= self.plan.rows[t]):
                bad = int(v[(v < 0) | (v >= self.plan.rows[t])][0])
                raise InvalidArgumentError(f"table {t} has {self.plan.rows[t]} rows; index {bad} is outside it")
            n = np.diff(o)
            lengths.append(n)
            if len(self._starts[t]) == 1:  # one row range from row 0 (table- or column-wise): the bags as they are
                for s in self._by_table[t]:
                    split[s] = (n, v)
                continue
            bag = np.repeat(np.arange(b, dtype=np.int64), n)
            where = np.searchsorted(self._starts[t], v, side="right") - 1
            ranges: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            for s in self._by_table[t]:
                k = self._range_of[s]
                if k not in ranges:
                    mine = where == k
                    ranges[k] = (np.bincount(bag[mine], minlength=b).astype(np.int64), v[mine] - s.lo)
                split[s] = ranges[k]
        per_dest = [[*(split[s][0] for s in held), *(split[s][1] for s in held)] for held in self._held_by]
        return b, per_dest, lengths

    def _forward(self, indices: Sequence[Any], offsets: Sequence[Any]) -> tuple[np.ndarray, _Routed]:
        g = self.group
        b, per_dest, lengths = self._local_bags(indices, offsets)
        sizes_t = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        t = time.perf_counter()
        dist.all_gather(sizes_t, torch.tensor([b], dtype=torch.int64), group=g)
        self.traffic.seconds += time.perf_counter() - t
        self.traffic.calls += 1
        sizes = [int(x) for x in sizes_t]
        mine = len(self.shards)
        # Lengths of every held shard's bags from every rank, then the values.
        got_len = _exchange(
            [np.concatenate(p[: len(h)]) if h else np.zeros(0, np.int64) for p, h in zip(per_dest, self._held_by, strict=True)],
            torch.int64,
            [sizes[s] * mine for s in range(self.world)],
            g,
            self.traffic,
            self.rank,
        )
        counts = [[got_len[s][k * sizes[s] : (k + 1) * sizes[s]] for k in range(mine)] for s in range(self.world)]
        # Where each held shard's values start in what each rank sends here.
        starts = [np.cumsum([0, *(int(c.sum()) for c in counts[s])]) for s in range(self.world)]
        got_val = _exchange(
            [np.concatenate(p[len(h) :]) if h else np.zeros(0, np.int64) for p, h in zip(per_dest, self._held_by, strict=True)],
            torch.int64,
            [int(st[-1]) for st in starts],
            g,
            self.traffic,
            self.rank,
        )
        bags = []
        for k in range(mine):
            ns, vs = [], []
            for s in range(self.world):
                ns.append(counts[s][k])
                vs.append(got_val[s][starts[s][k] : starts[s][k + 1]])
            n = np.concatenate(ns)
            bags.append((np.concatenate(vs), np.concatenate([[0], np.cumsum(n)]).astype(np.int64)))
        if self._collection is not None:
            pooled = self._collection.lookup(bags, mode="sum")
        else:
            pooled = np.zeros((sum(sizes), 0), np.float32)
        edges = np.cumsum([0, *sizes])
        got = _exchange(
            [pooled[edges[s] : edges[s + 1]].reshape(-1) for s in range(self.world)],
            torch.float32,
            [b * w for w in self._widths],
            g,
            self.traffic,
            self.rank,
        )
        out = np.zeros((b, self._col0[-1]), np.float32)
        for d, held in enumerate(self._held_by):
            part = got[d].reshape(b, self._widths[d])
            at = 0
            for sh in held:
                col, w = self._out_cols[sh]
                out[:, col : col + w] += part[:, at : at + w]
                at += w
        for t, n in enumerate(lengths):
            if self.modes[t] == "mean":
                out[:, self._col0[t] : self._col0[t + 1]] /= np.maximum(n, 1)[:, None]
        return out, _Routed(sizes, bags, lengths)

    def _backward(self, routed: _Routed, grad: np.ndarray) -> None:
        b = routed.sizes[self.rank]
        if grad.shape != (b, self._col0[-1]):
            raise InvalidArgumentError(f"the gradient has shape {grad.shape}, the output {(b, self._col0[-1])}")
        grad = grad * np.float32(self.grad_scale)
        for t, n in enumerate(routed.lengths):
            if self.modes[t] == "mean":
                grad[:, self._col0[t] : self._col0[t + 1]] /= np.maximum(n, 1)[:, None]
        parts = [
            np.concatenate([grad[:, c : c + w] for c, w in (self._out_cols[s] for s in held)], axis=1).reshape(-1)
            if held
            else np.zeros(0, np.float32)
            for held in self._held_by
        ]
        width = self._widths[self.rank]
        got = _exchange(parts, torch.float32, [n * width for n in routed.sizes], self.group, self.traffic, self.rank)
        if self._collection is None:
            return
        mine = np.concatenate([got[s].reshape(n, width) for s, n in enumerate(routed.sizes)])
        self._collection.update(routed.bags, np.ascontiguousarray(mine), mode="sum", optimizer=self.optim)

    def extra_repr(self) -> str:
        held = ", ".join(
            f"t{s.table}[{s.lo}:{s.hi}, {':'.join(map(str, s.cols(self.plan.dim_of(s.table))))}]" for s in self.shards
        )
        return f"rank={self.rank}/{self.world}, sharding={self.plan.sharding}, held=({held})"
