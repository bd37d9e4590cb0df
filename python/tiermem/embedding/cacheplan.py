"""Cache plans from hit-rate curves: how much of a fast-memory budget each table's cache gets,
and whether that cache is filled once from a profile (``static``) or caches what it misses
(``dynamic``), or whether the table is better left uncached.

For each table, a sample of its accesses (a profile: e.g. the first batches of training)
gives two curves against cache size:

* ``dynamic``: the hit rate of an LRU cache (exact stack distances, or for long traces a
  SHARDS sample of the rows stratified by their access counts in the profile,
  :func:`tiermem._tiermem.shards_curve` with ``sampling="count"``); every miss also pays to
  insert the row (write it into fast memory, make room).
* ``static``: the hit rate of a cache holding the rows the profile's first half used most,
  measured on its second half (what a fill from a profile would hit next).

The value of giving table ``t`` a cache of ``c`` rows is its accesses times its row bytes
times the better of ``h_static(c) * delta`` and ``h_dynamic(c) * delta - (1 - h_dynamic(c)) *
insert`` (per byte: ``delta`` is a slow read's extra time over a fast one, ``insert`` a write
into fast memory and, in training (``dirty``), the write-back to the slow device of the
updated row the insert displaces; :class:`Costs` takes them from the devices' traits). The budget
is split greedily by value gained per byte over each curve's upper concave hull, so a table
whose cache would lose gets no cache at all and reads its slow rows directly.

A table whose cache size is already set (DLRM's ``dynamic`` mode) is given the way its
lookups treat misses by :func:`lookup_policy`: its own cache simulated over the profile under
every-miss (``dynamic``) and second-miss (``admit``) admission, valued the same way with the
inserts the simulation counts, or no caching at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import _tiermem
from ..exceptions import InvalidArgumentError, TiermemError
from .config import Placement

__all__ = [
    "Costs",
    "TablePlan",
    "LOOKUP_POLICIES",
    "LookupChoice",
    "lookup_policy",
    "cache_bytes",
    "SLOT_OVERHEAD",
    "cache_fast_bytes",
    "curves",
    "hot_rows",
    "meta_bytes",
    "plan",
    "plan_within",
    "split_greedy",
]

#: Points on each table's size axis (0 .. all rows).
STEPS = 64
#: Traces longer than this are sampled (SHARDS at :data:`RATE`, stratified by count) for the
#: dynamic curve.
EXACT_LIMIT = 2_000_000
RATE = 0.01
#: Fast memory a cached row takes beside its bytes (its slot's metadata), per row.
SLOT_OVERHEAD = _tiermem.cache_slot_metadata_bytes(1 << 16) / (1 << 16)


@dataclass(frozen=True)
class Costs:
    """Per-byte times (nanoseconds) that weigh a hit against an insertion."""

    #: A row read from the slow device, less the same read from fast memory.
    delta_ns: float
    #: Inserting a row into the cache: writing it into fast memory.
    insert_ns: float
    #: Where the figures came from.
    source: str
    #: Writing a row to the slow device: what a reclaim pays to drop an updated (dirty) row
    #: before the lookup that needs the room (:func:`lookup_policy` with ``dirty``).
    write_back_ns: float = 0.0

    @classmethod
    def of(cls, manager: Any, fast: int = 0, slow: int = 1) -> Costs:
        """From the read and write bandwidths of the manager's devices ``fast`` and ``slow``:
        their traits (an emulated device's profile, DRAM once measured:
        :attr:`tiermem.Manager.devices`); else, for DRAM, :func:`tiermem.dram_figures`; else
        ``tiermem calibrate``'s figures for the device; else measured now on an 8 MiB object
        there (a NUMA node nobody calibrated)."""
        devs = manager.devices
        try:
            (fr, fw, fs), (sr, sw, ss) = _bandwidths(manager, fast), _bandwidths(manager, slow)
            delta = 1 / sr - 1 / fr
            insert = 1 / fw
            write_back = 1 / sw
        except (IndexError, KeyError, TypeError, ZeroDivisionError, TiermemError) as e:
            raise InvalidArgumentError(
                f"devices {fast} and {slow} of the manager have no read and write bandwidths and none could be "
                f"measured ({type(e).__name__}: {e}); run `tiermem calibrate`, which measures every NUMA node"
            ) from None
        return cls(
            delta_ns=max(delta, 0.0),
            insert_ns=insert,
            source=f"{devs[fast]['name']} ({fs}) -> {devs[slow]['name']} ({ss})",
            write_back_ns=write_back,
        )


#: The object :func:`_bandwidths` measures a device on when nothing else gives its figures.
MEASURE_BYTES = 8 << 20


def _bandwidths(manager: Any, i: int) -> tuple[float, float, str]:
    """Device ``i``'s sequential read and write bandwidths (GB/s) and where they came from."""
    from .. import _calibrated_devices

    dev = manager.devices[i]
    t = dev["traits"]
    if t.get("read_gbps") and t.get("write_gbps"):
        return float(t["read_gbps"]), float(t["write_gbps"]), "traits"
    if dev["name"] == "dram":
        f = _tiermem.dram_figures()  # calibrate's, else measured on memory of its own
        return float(f["read_gbps"]), float(f["write_gbps"]), str(f.get("source", "measured"))
    cal = _calibrated_devices().get(dev["name"])
    if isinstance(cal, dict) and cal.get("seq_read_gbps") and cal.get("seq_write_gbps"):
        return float(cal["seq_read_gbps"]), float(cal["seq_write_gbps"]), "calibrated"
    f = manager._native.measure_device(i, MEASURE_BYTES, 2)
    return float(f["seq_read_gbps"]), float(f["seq_write_gbps"]), "measured"


@dataclass(frozen=True)
class TablePlan:
    """One table's share: ``cache_rows`` rows of cache (0: none) run by ``policy``
    (``"static"``, ``"dynamic"`` or ``None``), with the hit rates its curves predict."""

    rows: int
    row_bytes: int
    cache_rows: int
    policy: str | None
    hit_static: float
    hit_dynamic: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def placement(self, device: str | int, dtype: str = "float32", slack_share: float = 0.15) -> Placement:
        """The table's :class:`~tiermem.embedding.config.Placement`: base rows on ``device``
        and the planned cache (a ``dynamic`` one keeps ``slack_share`` of it as slack), or
        no cache when the plan gives none."""
        if self.policy is None or self.cache_rows == 0:
            return Placement(device=device, dtype=dtype)
        total = self.cache_rows / self.rows
        lower = total / (1.0 + slack_share) if self.policy == "dynamic" else total
        return Placement(device=device, cache=lower, cacheslack=total - lower, policy=self.policy, dtype=dtype)


def curves(trace: np.ndarray, rows: int, sizes: Sequence[int]) -> tuple[list[float], list[float]]:
    """(dynamic, static) hit rates of ``trace`` (row ids of one table) at each cache size."""
    tr = np.ascontiguousarray(trace, np.int64).reshape(-1)
    if tr.size and (int(tr.min()) < 0 or int(tr.max()) >= rows):
        raise InvalidArgumentError(f"the profile holds rows outside 0..{rows - 1}")
    if tr.size == 0:
        return [0.0] * len(sizes), [0.0] * len(sizes)
    pos = [max(1, int(c)) for c in sizes]
    if tr.size <= EXACT_LIMIT:
        dyn = list(_tiermem.lru_curve(tr, pos))
    else:
        dyn = list(_tiermem.shards_curve(tr, RATE, pos, sampling="count"))
    half = tr.size // 2
    first = np.bincount(tr[:half], minlength=rows)
    second = np.bincount(tr[half:], minlength=rows)
    order = np.argsort(-first, kind="stable")
    cum = np.concatenate([[0], np.cumsum(second[order])]) / max(1, tr.size - half)
    stat = [float(cum[min(int(c), rows)]) for c in sizes]
    dyn = [0.0 if c == 0 else d for c, d in zip(sizes, dyn)]
    return dyn, stat


@dataclass(frozen=True)
class LookupChoice:
    """How a memory-backed table that caches in its lookups should treat its misses on a
    profile (:func:`lookup_policy`)."""

    #: ``"dynamic"`` (cache every miss), ``"admit"`` (cache a row on its second recent
    #: miss) or ``None`` (read through the cache: :meth:`EmbeddingTable.set_bypass`).
    policy: str | None
    #: Per policy simulated: ``accesses``, ``hits``, ``inserts`` (rows copied into the
    #: cache) and ``value_ns`` (what its hits save less what its inserts cost, on the profile).
    results: dict[str, dict[str, float]]


#: The policies :func:`lookup_policy` weighs (each against reading through).
LOOKUP_POLICIES = ("dynamic", "admit")


def lookup_policy(
    calls: Sequence[np.ndarray],
    rows: int,
    cache_rows: int,
    slack_rows: int,
    row_bytes: int,
    costs: Costs,
    *,
    dirty: bool = True,
    policies: Sequence[str] = LOOKUP_POLICIES,
) -> LookupChoice:
    """Which of ``policies`` (by default :data:`LOOKUP_POLICIES`; any policy that caches in
    its lookups, such as ``tinylfu``) a cache of ``cache_rows`` rows (reclaiming at least
    ``slack_rows``) should run on a profile of ``calls`` (one array of row ids per lookup
    call, e.g. per training batch), or none: each policy's own cache is simulated over the
    profile (:func:`tiermem._tiermem.minicache_lookups`: the table's second chance, its
    calls, its admission; sampled at :data:`RATE` beyond :data:`EXACT_LIMIT` accesses) and
    valued at ``hits * delta - inserts * insert`` per row byte; the best positive value
    wins, else the table reads through. With ``dirty`` (training: every row looked up is
    updated), an insert also pays the write-back of the row a reclaim drops to make its
    room (``write_back``), which the lookup that needs the room waits for. A short profile
    counts its first accesses as misses, so the value errs low: towards reading through a
    table whose reuse only a longer run would show. On a skewed input most misses are rows
    used once, whose inserts second-miss admission saves."""
    if cache_rows < 1 or row_bytes < 1 or not 0 <= slack_rows <= cache_rows:
        raise InvalidArgumentError(
            f"cache_rows and row_bytes must be at least 1 and slack_rows in 0..cache_rows, got "
            f"{cache_rows}, {row_bytes}, {slack_rows}"
        )
    parts = [np.ascontiguousarray(c, np.int64).reshape(-1) for c in calls]
    trace = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if trace.size and (int(trace.min()) < 0 or int(trace.max()) >= rows):
        raise InvalidArgumentError(f"the profile holds rows outside 0..{rows - 1}")
    offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
    rate = 1.0 if trace.size <= EXACT_LIMIT else RATE
    insert = costs.insert_ns + (costs.write_back_ns if dirty else 0.0)
    if not policies:
        raise InvalidArgumentError("policies: name at least one policy to simulate")
    results: dict[str, dict[str, float]] = {}
    for policy in policies:
        table = {
            "rows": rows,
            "capacity": cache_rows,
            "row_bytes": row_bytes,
            "slack_rows": slack_rows,
            "policy": policy,
            "admission": None,
        }
        r = dict(_tiermem.minicache_lookups((offsets, trace), table, rate, 1))
        r["value_ns"] = row_bytes * (r["hits"] * costs.delta_ns - r["inserts"] * insert)
        results[policy] = r
    best = max(policies, key=lambda p: results[p]["value_ns"])
    return LookupChoice(best if results[best]["value_ns"] > 0 else None, results)


def _hull(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the upper concave hull of the points (xs increasing, starting at 0)."""
    out: list[int] = []
    for i in range(len(xs)):
        while len(out) >= 2:
            a, b = out[-2], out[-1]
            # Drop b if it lies below the line from a to i; on it, b stays, so a straight
            # stretch of a curve can be taken a step at a time.
            if (ys[b] - ys[a]) * (xs[i] - xs[a]) < (ys[i] - ys[a]) * (xs[b] - xs[a]):
                out.pop()
            else:
                break
        out.append(i)
    return out


def split_greedy(costs: Sequence[Sequence[float]], values: Sequence[Sequence[float]], budget: float) -> list[int]:
    """Split ``budget`` over items (tables) given each one's points: ``costs[t]`` increasing
    from its first point (the item as it starts, paid for already), ``values[t]`` what each
    point is worth. Greedily over the upper concave hull of each item's points, the segment
    with the best value gained per unit of cost first, while it fits; returns the index of
    each item's chosen point."""
    hulls = [_hull([c - cs[0] for c in cs], list(vs)) for cs, vs in zip(costs, values, strict=True)]
    at = [0] * len(hulls)
    left = budget
    while True:
        best, pick = 0.0, -1
        for t, h in enumerate(hulls):
            if at[t] + 1 >= len(h):
                continue
            i, j = h[at[t]], h[at[t] + 1]
            dc = costs[t][j] - costs[t][i]
            gain = (values[t][j] - values[t][i]) / dc if dc > 0 else 0.0
            if dc <= left and gain > best:
                best, pick = gain, t
        if pick < 0:
            break
        h = hulls[pick]
        left -= costs[pick][h[at[pick] + 1]] - costs[pick][h[at[pick]]]
        at[pick] += 1
    return [h[a] for h, a in zip(hulls, at)]


def plan(
    traces: Sequence[np.ndarray],
    rows: Sequence[int],
    row_bytes: Sequence[int],
    budget: int,
    costs: Costs,
    overhead_per_row: float = SLOT_OVERHEAD,
    *,
    dirty: bool = True,
) -> list[TablePlan]:
    """Split ``budget`` bytes of fast memory over the tables' caches (see the module).

    ``traces[t]`` is table ``t``'s profile (row ids in access order); ``overhead_per_row`` is
    the fast memory a cached row costs beside its bytes (its slot's metadata). With ``dirty``
    (training: every row looked up is updated) a dynamic cache's insert also pays the
    write-back of the row it displaces, as in :func:`lookup_policy`; ``dirty=False`` for
    tables that are only read.
    """
    if not len(traces) == len(rows) == len(row_bytes):
        raise InvalidArgumentError("one profile, row count and row size per table")
    if budget < 0:
        raise InvalidArgumentError(f"budget must be at least 0 bytes, got {budget}")
    insert = costs.insert_ns + (costs.write_back_ns if dirty else 0.0)
    per_table = []
    for tr, n, rb in zip(traces, rows, row_bytes):
        sizes = sorted({int(round(n * k / STEPS)) for k in range(STEPS + 1)})
        dyn, stat = curves(tr, n, sizes)
        acc = float(np.asarray(tr).size) * rb
        val_d = [acc * (h * costs.delta_ns - (1 - h) * insert) for h in dyn]
        val_s = [acc * h * costs.delta_ns for h in stat]
        value = [max(0.0, a, b) for a, b in zip(val_d, val_s)]
        cost = [math.ceil(s * (rb + overhead_per_row)) for s in sizes]
        per_table.append((sizes, dyn, stat, value, cost, val_d, val_s))
    picks = split_greedy([p[4] for p in per_table], [p[3] for p in per_table], budget)
    out = []
    for t, (p, k) in enumerate(zip(per_table, picks)):
        sizes, dyn, stat, value, _, val_d, val_s = p
        c = sizes[k]
        policy = None if c == 0 or value[k] <= 0 else ("dynamic" if val_d[k] > val_s[k] else "static")
        out.append(
            TablePlan(
                rows=int(rows[t]),
                row_bytes=int(row_bytes[t]),
                cache_rows=c if policy else 0,
                policy=policy,
                hit_static=float(stat[k]),
                hit_dynamic=float(dyn[k]),
            )
        )
    return out


def cache_bytes(rows: int, row_bytes: int, fraction: float) -> int:
    """Bytes the core reserves for a cache of ``fraction`` of a table (whole frames)."""
    cache_rows = max(1, int(rows * row_bytes * fraction) // row_bytes)
    frame = max(1, min((2 << 20) // row_bytes, -(-cache_rows // 8)))
    return -(-cache_rows // frame) * frame * row_bytes


def cache_fast_bytes(rows: int, row_bytes: int, fraction: float) -> int:
    """Fast memory a cache of ``fraction`` of a table takes: its pages (whole frames) and
    each slot's metadata (:func:`tiermem._tiermem.cache_slot_metadata_bytes`: its back-edge
    and its bit in the bitmap of holes)."""
    pages = cache_bytes(rows, row_bytes, fraction)
    return pages + _tiermem.cache_slot_metadata_bytes(pages // row_bytes)


def meta_bytes(rows: Sequence[int]) -> int:
    """Fast memory cached tables of ``rows`` rows take whatever their caches
    (:func:`tiermem._tiermem.table_row_metadata_bytes`: reindex scratch, pointer table and
    the bitmap of cached rows)."""
    return sum(_tiermem.table_row_metadata_bytes(int(r)) for r in rows)


def plan_within(
    traces: Sequence[np.ndarray],
    rows: Sequence[int],
    row_bytes: Sequence[int],
    budget: int,
    costs: Costs,
    *,
    dirty: bool = True,
) -> list[TablePlan]:
    """:func:`plan` for a fast budget that also holds the tables' :func:`meta_bytes`, its
    caches' pages counted in whole frames (:func:`cache_fast_bytes`): the plan shrinks until
    it fits (no caches at all when the metadata alone fills it)."""
    meta = meta_bytes(rows)
    room = budget - meta
    while True:
        plans = plan(traces, rows, row_bytes, max(0, room), costs, dirty=dirty)
        used = meta + sum(cache_fast_bytes(r, b, p.cache_rows / r) for r, b, p in zip(rows, row_bytes, plans) if p.policy)
        if used <= budget or room <= 0:
            return plans
        room -= int(used - budget) + max(row_bytes)


def hot_rows(trace: np.ndarray, rows: int) -> np.ndarray:
    """The rows of a table of ``rows`` rows that ``trace`` uses, most used first (ties by
    row): what a ``static`` cache is filled with from a profile."""
    counts = np.bincount(np.asarray(trace, np.int64).reshape(-1), minlength=rows)
    return np.argsort(-counts, kind="stable")[: int(np.count_nonzero(counts))]
