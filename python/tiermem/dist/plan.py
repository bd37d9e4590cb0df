"""Where each table's rows live across ranks: table-wise (a table on one rank), row-wise
(a table's rows split in contiguous ranges over every rank) or column-wise (a table's
columns split over every rank, for wide tables: each rank holds every row, a slice of it).

A plan is a list of :class:`Shard` in a fixed global order (table, then rank), each a
rectangle of its table (rows ``lo..hi``, columns ``c0..c1``); a table's shards cover it
once. Each rank holds its shards as tiered tables of ``hi - lo`` rows of ``c1 - c0``; a
lookup of row ``i`` of table ``t`` goes to every shard of ``t`` whose rows hold ``i``, as row
``i - lo``, and each returns its columns of the pooled row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._sizes import format_bytes
from ..exceptions import InvalidArgumentError

__all__ = ["PLACEMENTS", "SHARDINGS", "Shard", "ShardCache", "ShardPlan", "plan_caches", "plan_shards", "shard_trace"]

#: Ways to place tables on ranks.
SHARDINGS = ("table", "row", "column")
#: Where a rank keeps its shards: all in DRAM, in a DRAM cache over an emulated slow
#: device, or in block files on the disk with a DRAM cache.
PLACEMENTS = ("dram", "cached", "block")


@dataclass(frozen=True)
class Shard:
    """Rows ``lo..hi`` and columns ``c0..c1`` of table ``table``, held by rank ``rank``
    (``c1 = 0``: every column, as wide as the plan's ``dim``)."""

    table: int
    rank: int
    lo: int
    hi: int
    c0: int = 0
    c1: int = 0

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    def cols(self, dim: int) -> tuple[int, int]:
        """Its columns of a table ``dim`` wide."""
        return self.c0, self.c1 or dim

    def width(self, dim: int) -> int:
        """Its columns' count in a table ``dim`` wide."""
        c0, c1 = self.cols(dim)
        return c1 - c0


@dataclass(frozen=True)
class ShardCache:
    """A shard's planned cache (:func:`plan_caches`): ``rows`` rows run by ``policy``
    (``"static"``: filled once with the profile's most used rows; ``"dynamic"``: caches what
    it misses; None: no cache, the rows read from the slow tier), the hit rate its curve
    predicts, and the profile's accesses to the shard."""

    rows: int
    policy: str | None
    hit_rate: float
    accesses: int


@dataclass(frozen=True)
class ShardPlan:
    """The shards of every table over ``world`` ranks (see the module's note); with
    :func:`plan_caches`, each shard's cache (``caches``, in the shards' order) from each
    rank's fast memory (``fast``)."""

    rows: tuple[int, ...]
    dim: int
    world: int
    sharding: str
    shards: tuple[Shard, ...]
    caches: tuple[ShardCache, ...] = ()
    fast: tuple[int, ...] = ()
    #: Each table's width when they differ (empty: every table ``dim`` wide).
    dims: tuple[int, ...] = ()

    def dim_of(self, table: int) -> int:
        """Table ``table``'s width."""
        return self.dims[table] if self.dims else self.dim

    def cache_of(self, shard: Shard) -> ShardCache | None:
        """``shard``'s planned cache (None when caches were not planned)."""
        return self.caches[self.shards.index(shard)] if self.caches else None

    def held(self, rank: int) -> list[Shard]:
        """Rank ``rank``'s shards, in the plan's order."""
        return [s for s in self.shards if s.rank == rank]

    def of_table(self, table: int) -> list[Shard]:
        """Table ``table``'s shards, by row range, then by columns."""
        return sorted((s for s in self.shards if s.table == table), key=lambda s: (s.lo, s.c0))

    def rank_bytes(self, row_bytes: int) -> list[int]:
        """Bytes of rows each rank holds (a column shard's share of ``row_bytes``)."""
        out = [0] * self.world
        for s in self.shards:
            d = self.dim_of(s.table)
            out[s.rank] += s.rows * row_bytes * s.width(d) // d
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": list(self.rows),
            "dim": self.dim,
            "world": self.world,
            "sharding": self.sharding,
            "shards": [[s.table, s.rank, s.lo, s.hi, s.c0, s.c1] for s in self.shards],
            "caches": [dataclasses.asdict(c) for c in self.caches],
            "fast": list(self.fast),
            "dims": list(self.dims),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardPlan:
        """The plan :meth:`to_dict` wrote (shards of four numbers, before column shards: every
        column)."""
        return cls(
            tuple(int(r) for r in d["rows"]),
            int(d["dim"]),
            int(d["world"]),
            str(d["sharding"]),
            tuple(Shard(*(int(x) for x in s)) for s in d["shards"]),
            tuple(ShardCache(**c) for c in d.get("caches", ())),
            tuple(int(f) for f in d.get("fast", ())),
            tuple(int(x) for x in d.get("dims", ())),
        )

    def header(self) -> list[str]:
        """The column names of :meth:`table`."""
        head = ["rank", "shards (table[rows, columns])", "rows"]
        return head + ["fast", "cached rows", "predicted hit rate"] if self.caches else head

    def table(self, row_bytes: int) -> list[list[str]]:
        """The plan as rows of text (rank, tables and row ranges, bytes) for a report."""
        sizes = self.rank_bytes(row_bytes)
        body = []
        for r in range(self.world):
            held = self.held(r)
            parts = [f"t{s.table}" + _slice(s, self.rows[s.table], self.dim_of(s.table)) for s in held]
            row = [str(r), " ".join(parts) or "-", format_bytes(sizes[r])]
            if self.caches:
                cs = [c for c in (self.cache_of(s) for s in held) if c is not None]
                acc = sum(c.accesses for c in cs)
                hit = sum(c.hit_rate * c.accesses for c in cs) / acc if acc else 0.0
                row += [format_bytes(self.fast[r]), f"{sum(c.rows for c in cs)}", f"{hit:.3f}"]
            body.append(row)
        return body


def _slice(s: Shard, rows: int, dim: int) -> str:
    """``[lo:hi]``, ``[:, c0:c1]`` or ``[lo:hi, c0:c1]`` for a shard that is not its whole table."""
    r = "" if s.rows == rows else f"{s.lo}:{s.hi}"
    c0, c1 = s.cols(dim)
    c = "" if (c0, c1) == (0, dim) else f"{c0}:{c1}"
    return f"[{r or ':'}, {c}]" if c else f"[{r}]" if r else ""


def _even(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` split into ``parts`` contiguous ranges, as even as they go (the first ones take
    one more)."""
    base, extra = divmod(n, parts)
    out, lo = [], 0
    for k in range(parts):
        hi = lo + base + (1 if k < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _balanced_tables(rows: Sequence[int], world: int) -> list[int]:
    """Owner of each table: largest first onto the least-loaded rank (ties: lowest rank)."""
    load = [0] * world
    owner = [0] * len(rows)
    for t in sorted(range(len(rows)), key=lambda t: (-rows[t], t)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[t] = r
        load[r] += rows[t]
    return owner


def plan_shards(
    rows: Sequence[int],
    dim: int | Sequence[int],
    world: int,
    sharding: str = "table",
    *,
    row_bytes: int | None = None,
    capacity: Sequence[int] | None = None,
) -> ShardPlan:
    """Place tables of ``rows`` rows (``dim`` wide, or ``dim[t]`` each) on ``world`` ranks.

    ``"table"``: each table whole on one rank, the largest first onto the least-loaded
    rank. ``"row"``: each table's rows split into ``world`` contiguous ranges, as even as
    the rows allow (the first ranks take one more). ``"column"``: each table's ``dim``
    columns split so, every rank holding every row of its columns. With ``capacity`` (bytes per rank) and
    ``row_bytes``, a plan that puts more on a rank than it holds is refused, naming the
    rank and the numbers.
    """
    if world < 1:
        raise InvalidArgumentError(f"a shard plan needs at least one rank, got {world}")
    if sharding not in SHARDINGS:
        raise InvalidArgumentError(f"sharding {sharding!r}: known are {', '.join(SHARDINGS)}")
    if not rows or any(r < 1 for r in rows):
        raise InvalidArgumentError(f"every table needs at least one row, got {list(rows)}")
    dims = [int(dim)] * len(rows) if isinstance(dim, int | np.integer) else [int(d) for d in dim]
    if len(dims) != len(rows) or any(d < 1 for d in dims):
        raise InvalidArgumentError(f"one width of at least 1 per table: {dims} for {len(rows)} tables")
    shards: list[Shard] = []
    if sharding == "table":
        owner = _balanced_tables(rows, world)
        shards = [Shard(t, owner[t], 0, r) for t, r in enumerate(rows)]
    elif sharding == "row":
        for t, r in enumerate(rows):
            if r < world:
                raise InvalidArgumentError(f"table {t} has {r} rows, fewer than the {world} ranks it is split over row-wise")
            shards += [Shard(t, k, lo, hi) for k, (lo, hi) in enumerate(_even(r, world))]
    else:
        if min(dims) < world:
            raise InvalidArgumentError(f"tables {min(dims)} wide cannot be split column-wise over {world} ranks")
        for t, r in enumerate(rows):
            shards += [Shard(t, k, 0, r, c0, c1) for k, (c0, c1) in enumerate(_even(dims[t], world))]
    mixed = len(set(dims)) > 1
    plan = ShardPlan(
        tuple(int(r) for r in rows), max(dims), int(world), sharding, tuple(shards), dims=tuple(dims) if mixed else ()
    )
    if capacity is not None:
        if row_bytes is None:
            raise InvalidArgumentError("a capacity check needs the bytes of a row")
        if len(capacity) != world:
            raise InvalidArgumentError(f"{len(capacity)} rank capacities for {world} ranks")
        for r, (need, cap) in enumerate(zip(plan.rank_bytes(row_bytes), capacity, strict=True)):
            if need > cap:
                raise InvalidArgumentError(
                    f"the {sharding}-wise plan puts {format_bytes(need)} of rows on rank {r}, which holds "
                    f"{format_bytes(cap)}: add ranks, shard row-wise, or give rank {r} more memory"
                )
    return plan


def shard_trace(trace: np.ndarray, s: Shard) -> np.ndarray:
    """The accesses of a table's ``trace`` that fall in shard ``s``'s rows, as its rows."""
    tr = np.asarray(trace, np.int64)
    return tr[(tr >= s.lo) & (tr < s.hi)] - s.lo


def plan_caches(plan: ShardPlan, traces: Sequence[np.ndarray], fast: Sequence[int], row_bytes: int, costs: Any) -> ShardPlan:
    """``plan`` with each rank's ``fast[rank]`` bytes split over its shards' caches by their
    hit-rate curves (:func:`tiermem.embedding.cacheplan.plan_within` on each shard's part of
    its table's profile ``traces[t]``, row ids in access order): a rank's fast memory goes
    to the shards where it raises the hit rate most, and a shard whose cache would not pay
    gets none. ``row_bytes`` is a whole row's bytes; ``costs`` a
    :class:`~tiermem.embedding.cacheplan.Costs`. A rank whose fast memory cannot hold its
    shards' pointer tables is refused, naming the rank and the numbers."""
    from ..embedding.cacheplan import meta_bytes, plan_within

    if len(fast) != plan.world or any(f < 0 for f in fast):
        raise InvalidArgumentError(f"one fast capacity of at least 0 bytes per rank: {len(fast)} for {plan.world} ranks")
    if len(traces) != len(plan.rows):
        raise InvalidArgumentError(f"{len(traces)} profiles for {len(plan.rows)} tables")
    caches: dict[Shard, ShardCache] = {}
    for r in range(plan.world):
        held = plan.held(r)
        if not held:
            continue
        need = meta_bytes([s.rows for s in held])
        if fast[r] < need:
            raise InvalidArgumentError(
                f"rank {r}'s fast memory of {format_bytes(fast[r])} does not hold its shards' pointer tables and "
                f"scratch ({format_bytes(need)} for {sum(s.rows for s in held)} rows): give it more, or add ranks"
            )
        parts = [shard_trace(traces[s.table], s) for s in held]
        widths = [row_bytes * s.width(plan.dim_of(s.table)) // plan.dim_of(s.table) for s in held]
        planned = plan_within(parts, [s.rows for s in held], widths, int(fast[r]), costs)
        for s, p, tr in zip(held, planned, parts, strict=True):
            hit = {"static": p.hit_static, "dynamic": p.hit_dynamic}.get(p.policy or "", 0.0)
            caches[s] = ShardCache(p.cache_rows, p.policy, float(hit), int(tr.size))
    none = ShardCache(0, None, 0.0, 0)
    return dataclasses.replace(plan, caches=tuple(caches.get(s, none) for s in plan.shards), fast=tuple(int(f) for f in fast))
