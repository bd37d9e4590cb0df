"""Where each table's rows live across ranks: table-wise (a table on one rank) or row-wise
(a table's rows split in contiguous ranges over every rank).

A plan is a list of :class:`Shard` in a fixed global order (table, then rank). Each rank
holds its shards as tiered tables of ``hi - lo`` rows; a lookup of row ``i`` of table ``t``
goes to the shard of ``t`` whose range holds ``i``, as row ``i - lo`` of that shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._sizes import format_bytes
from ..exceptions import InvalidArgumentError

__all__ = ["SHARDINGS", "Shard", "ShardPlan", "plan_shards"]

#: Ways to place tables on ranks.
SHARDINGS = ("table", "row")


@dataclass(frozen=True)
class Shard:
    """Rows ``lo..hi`` of table ``table``, held by rank ``rank``."""

    table: int
    rank: int
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class ShardPlan:
    """The shards of every table over ``world`` ranks (see the module's note)."""

    rows: tuple[int, ...]
    dim: int
    world: int
    sharding: str
    shards: tuple[Shard, ...]

    def held(self, rank: int) -> list[Shard]:
        """Rank ``rank``'s shards, in the plan's order."""
        return [s for s in self.shards if s.rank == rank]

    def of_table(self, table: int) -> list[Shard]:
        """Table ``table``'s shards, by row range."""
        return sorted((s for s in self.shards if s.table == table), key=lambda s: s.lo)

    def rank_bytes(self, row_bytes: int) -> list[int]:
        """Bytes of rows each rank holds."""
        out = [0] * self.world
        for s in self.shards:
            out[s.rank] += s.rows * row_bytes
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": list(self.rows),
            "dim": self.dim,
            "world": self.world,
            "sharding": self.sharding,
            "shards": [[s.table, s.rank, s.lo, s.hi] for s in self.shards],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardPlan:
        """The plan :meth:`to_dict` wrote."""
        return cls(
            tuple(int(r) for r in d["rows"]),
            int(d["dim"]),
            int(d["world"]),
            str(d["sharding"]),
            tuple(Shard(*(int(x) for x in s)) for s in d["shards"]),
        )

    def table(self, row_bytes: int) -> list[list[str]]:
        """The plan as rows of text (rank, tables and row ranges, bytes) for a report."""
        sizes = self.rank_bytes(row_bytes)
        body = []
        for r in range(self.world):
            parts = [f"t{s.table}" + ("" if s.rows == self.rows[s.table] else f"[{s.lo}:{s.hi}]") for s in self.held(r)]
            body.append([str(r), " ".join(parts) or "-", format_bytes(sizes[r])])
        return body


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
    dim: int,
    world: int,
    sharding: str = "table",
    *,
    row_bytes: int | None = None,
    capacity: Sequence[int] | None = None,
) -> ShardPlan:
    """Place tables of ``rows`` rows (``dim`` wide) on ``world`` ranks.

    ``"table"``: each table whole on one rank, the largest first onto the least-loaded
    rank. ``"row"``: each table's rows split into ``world`` contiguous ranges, as even as
    the rows allow (the first ranks take one more). With ``capacity`` (bytes per rank) and
    ``row_bytes``, a plan that puts more on a rank than it holds is refused, naming the
    rank and the numbers.
    """
    if world < 1:
        raise InvalidArgumentError(f"a shard plan needs at least one rank, got {world}")
    if sharding not in SHARDINGS:
        raise InvalidArgumentError(f"sharding {sharding!r}: known are {', '.join(SHARDINGS)}")
    if not rows or any(r < 1 for r in rows):
        raise InvalidArgumentError(f"every table needs at least one row, got {list(rows)}")
    shards: list[Shard] = []
    if sharding == "table":
        owner = _balanced_tables(rows, world)
        shards = [Shard(t, owner[t], 0, r) for t, r in enumerate(rows)]
    else:
        for t, r in enumerate(rows):
            if r < world:
                raise InvalidArgumentError(f"table {t} has {r} rows, fewer than the {world} ranks it is split over row-wise")
            base, extra = divmod(r, world)
            lo = 0
            for k in range(world):
                hi = lo + base + (1 if k < extra else 0)
                shards.append(Shard(t, k, lo, hi))
                lo = hi
    plan = ShardPlan(tuple(int(r) for r in rows), int(dim), int(world), sharding, tuple(shards))
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
