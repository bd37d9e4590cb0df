"""Which admission a block table should use, from miniature caches (Bandana §4.3.3).

A block table reads whole 4 KiB blocks; its ``admission`` says which of a block's other rows
the cache keeps (``row``, ``row:T``, ``block``, ``threshold:T``; see
:class:`tiermem.embedding.EmbeddingTable`). Which one reads the fewest blocks depends on the
layout, the trace and the cache's size, so measure it: :func:`simulate` runs the table
cache itself (its second chance over pages, rows inserted as staging inserts them) over a
trace in the table's lookup calls, on the blocks whose hash falls in a ``rate`` sample, and
:func:`pick` returns the admission that read the fewest blocks; :func:`tune` does it for a
block table as it is (its rows per block, cache and slack) and gives the table the pick::

    tiermem.embedding.block.admission.tune(t, recent, lay, counts=counts, batch=256)   # -> Pick("row:4", ...)

or, before the table exists::

    from tiermem.embedding.block import admission, layout
    counts = layout.query_counts(train)                 # the layout's training trace
    best = admission.pick(recent, lay, rows_per_block=rpb, cache_rows=50_000,
                          row_bytes=128, counts=counts, batch=256)
    t = EmbeddingTable(n, 32, device="block:/data/t.tmb", cache=50_000 / n, cacheslack=0.0,
                       admission=best.admission)                 # the cache simulated
    t.set_access_counts(counts)

A table with a slack (``cacheslack``, 0.05 of the table by default) holds ``cachelower +
cacheslack`` rows and frees at least the slack at each reclaim: give both (``cache_rows``,
``slack_rows``; :func:`tune` reads them from the table). Unsampled (``rate=1``), with the
table's calls, the simulation predicts a block table's misses and blocks read exactly
(``tests/embedding/test_block_table.py``); ``bench ssd`` reports how the 1 % pick compares with the
exact one on its traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ... import _tiermem
from ...embedding import EmbeddingTable
from ...embedding.cacheplan import SLOT_OVERHEAD, split_greedy
from ...embedding.config import access_counts
from ...exceptions import InvalidArgumentError
from .traces import Trace

__all__ = ["THRESHOLDS", "CANDIDATES", "Pick", "simulate", "pick", "tune", "SPLITS", "Split", "split"]

#: The ``T`` of ``row:T`` and ``threshold:T`` that :data:`CANDIDATES` tries.
THRESHOLDS = (0, 1, 2, 4, 8, 16)
#: The admissions :func:`pick` chooses from by default.
CANDIDATES = ("row", "block", *(f"row:{t}" for t in THRESHOLDS), *(f"threshold:{t}" for t in THRESHOLDS))


@dataclass(frozen=True)
class Pick:
    """The admission that read the fewest blocks, and what each one did."""

    #: The admission to give the table.
    admission: str
    #: Per admission tried: ``accesses``, ``hits`` and ``blocks_read`` (scaled to the whole
    #: trace), and ``hit_rate``.
    results: dict[str, dict[str, float]] = field(default_factory=dict)


def simulate(
    trace: Trace,
    layout: Any,
    *,
    rows_per_block: int,
    cache_rows: int,
    row_bytes: int,
    admissions: Sequence[str] | None = None,
    counts: Any = None,
    rate: float = 0.01,
    batch: int | None = None,
    slack_rows: int = 0,
) -> dict[str, dict[str, float]]:
    """Simulate a block table's cache of ``cache_rows`` rows of ``row_bytes`` bytes over
    ``trace`` for each admission (default :data:`CANDIDATES`, those with a ``T`` only when
    ``counts`` is given): ``batch`` queries per lookup call (``None``: every access alone),
    on the blocks sampled at ``rate``; ``counts`` (per-row query counts of the layout's
    training trace, :func:`tiermem.embedding.block.layout.query_counts`) for ``row:T`` and ``threshold:T``.
    ``cache_rows`` is the table's ``cachelower`` and ``cacheslack`` together, in rows, and
    ``slack_rows`` its ``cacheslack`` (a reclaim frees at least that many).

    Raises:
        InvalidArgumentError: a layout that is not a permutation of the trace's rows, a
            rate outside (0, 1], a batch or size below one, no admission or an unknown one,
            ``shadow`` (not simulated), or ``counts`` negative, missing or of the wrong length for a
            threshold.
    """
    if not isinstance(trace, Trace):
        raise InvalidArgumentError(f"trace must be a tiermem.embedding.block.traces.Trace, got {type(trace).__name__}")
    if cache_rows < 1 or row_bytes < 1 or rows_per_block < 1:
        raise InvalidArgumentError(
            f"cache_rows, row_bytes and rows_per_block must be at least 1, got {cache_rows}, {row_bytes}, {rows_per_block}"
        )
    if not 0 <= slack_rows <= cache_rows:
        raise InvalidArgumentError(f"slack_rows must be in 0..cache_rows ({cache_rows}), got {slack_rows}")
    if batch is not None and batch < 1:
        raise InvalidArgumentError(f"batch must be at least one query per call, got {batch}")
    lay = np.asarray(layout)
    if lay.ndim != 1 or lay.dtype.kind not in "iu" or lay.size != trace.rows_total:
        raise InvalidArgumentError(
            f"the layout must be a 1-D integer array of one position per row of the trace's table "
            f"({trace.rows_total} rows), got shape {lay.shape} of {lay.dtype}"
        )
    lay = np.ascontiguousarray(lay, np.uint32)
    if admissions is None:
        admissions = [a for a in CANDIDATES if counts is not None or ":" not in a]
    if not admissions:
        raise InvalidArgumentError("no admissions to simulate: give at least one (e.g. 'row')")
    cnt = None if counts is None else access_counts(counts)
    model = {"counts": cnt, "rate": rate, "row_bytes": row_bytes, "batch": batch, "slack_rows": slack_rows}
    res = _tiermem.minicache_sweep(lay, rows_per_block, (trace.offsets, trace.rows), [cache_rows], list(admissions), model)
    out = {}
    for a, [r] in zip(admissions, res, strict=True):
        out[a] = dict(r) | {"hit_rate": r["hits"] / r["accesses"] if r["accesses"] else 0.0}
    return out


def pick(trace: Trace, layout: Any, **kwargs: Any) -> Pick:
    """The admission whose simulated cache reads the fewest blocks of ``trace``; arguments
    as :func:`simulate`. Ties go to the earlier admission."""
    res = simulate(trace, layout, **kwargs)
    best = min(res, key=lambda a: res[a]["blocks_read"])
    return Pick(best, res)


def tune(
    table: EmbeddingTable,
    trace: Trace,
    layout: Any,
    *,
    counts: Any = None,
    batch: int | None = None,
    rate: float = 0.01,
    admissions: Sequence[str] | None = None,
) -> Pick:
    """Pick the admission for the block table ``table`` as it is (its rows per block, row
    size, cache and slack; ``layout``: the layout its file holds, row → position) on
    ``trace`` (:func:`simulate`'s other arguments), and give it to the table, with
    ``counts`` when given.

    Raises:
        InvalidArgumentError: ``table`` is not a block table, the trace is of another
            number of rows, or as :func:`simulate`.
    """
    info, cache = table.block_info, table.cache_info
    if info is None or cache is None:
        raise InvalidArgumentError(f"admission is a block table's: this table is {table.placement}")
    if isinstance(trace, Trace) and trace.rows_total != table.num_embeddings:
        raise InvalidArgumentError(f"the trace is of a table of {trace.rows_total} rows, this table has {table.num_embeddings}")
    stride = table.row_bytes
    best = pick(
        trace, layout, rows_per_block=int(info["rows_per_block"]), cache_rows=int(cache["capacity"]) // stride,
        row_bytes=stride, admissions=admissions, counts=counts, rate=rate, batch=batch,
        slack_rows=int(cache["cacheslack"]) // stride,
    )  # fmt: skip
    if counts is not None:
        table.set_access_counts(counts)
    table.set_admission(best.admission)
    return best


#: How a fast budget can be shared between block tables' caches: by their curves
#: (:func:`split`) or the same fraction of each table.
SPLITS = ("curves", "even")
#: Points on each table's size axis in :func:`split`.
SPLIT_STEPS = 16
#: :func:`split` simulates every access of a table's trace up to this many, and a sample of
#: the blocks (at least 1 %) that keeps about this many above it.
SPLIT_ACCESSES = 200_000


@dataclass(frozen=True)
class Split:
    """A fast budget split over block tables' caches by their simulated curves."""

    #: Per table, the rows its cache gets.
    cache_rows: list[int]
    #: Per table, the blocks its simulated cache read at that size (scaled to the trace).
    blocks_read: list[float]
    #: Per table, the rows an even split (the same fraction of every table, above its floor)
    #: would give it, and the blocks its simulated cache read at that size.
    even_rows: list[int]
    even_blocks_read: list[float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split(
    traces: Sequence[Trace],
    *,
    rows_per_block: int,
    row_bytes: int,
    budget: int,
    floors: Sequence[int] | None = None,
    layouts: Sequence[Any] | None = None,
    admission: str = "row",
    batch: int | None = None,
    steps: int = SPLIT_STEPS,
) -> Split:
    """Split ``budget`` bytes of fast memory over block tables' caches (Bandana §4.3.3: the
    budget split by the miniature caches' curves): each table's cache simulated under
    ``admission`` over its ``traces[t]`` (in lookup calls of ``batch`` queries) at
    ``steps`` sizes from ``floors[t]`` rows (the least it must hold; default 1) up to what
    the budget allows, then the budget given greedily to the sizes that save the most blocks
    read per byte (over each curve's upper concave hull); what no curve wants goes to the
    tables in proportion to their rows. A cached row costs its bytes and its
    slot's metadata (:data:`~tiermem.embedding.cacheplan.SLOT_OVERHEAD`); the tables' pointer
    tables are not in ``budget``. ``layouts[t]`` (row → position) defaults to the original
    order. Write-backs of dirty blocks are not simulated: the split minimises blocks read.

    Raises:
        InvalidArgumentError: no tables, floors or layouts not one per table, a floor
            outside 1..rows, floors that cost more than the budget, or as :func:`simulate`.
    """
    n = len(traces)
    if n == 0:
        raise InvalidArgumentError("split needs at least one table's trace")
    if not all(isinstance(t, Trace) for t in traces):
        raise InvalidArgumentError("traces must be tiermem.embedding.block.traces.Trace objects, one per table")
    rows = [int(t.rows_total) for t in traces]
    floors = [1] * n if floors is None else [int(f) for f in floors]
    if len(floors) != n or (layouts is not None and len(layouts) != n):
        raise InvalidArgumentError(f"one floor and one layout per table: {n} traces, {len(floors)} floors")
    for t, (f, r) in enumerate(zip(floors, rows)):
        if not 1 <= f <= r:
            raise InvalidArgumentError(f"table {t}: a floor of {f} rows is outside 1..{r} (its rows)")
    if rows_per_block < 1 or row_bytes < 1 or steps < 1:
        raise InvalidArgumentError(
            f"rows_per_block, row_bytes and steps must be at least 1, got {rows_per_block}, {row_bytes}, {steps}"
        )
    per_row = row_bytes + SLOT_OVERHEAD
    floor_cost = sum(f * per_row for f in floors)
    if floor_cost > budget:
        raise InvalidArgumentError(
            f"the tables' least caches ({sum(floors)} rows, {floor_cost:.0f} bytes with their slots) do not fit "
            f"a budget of {budget} bytes"
        )
    spare = (budget - floor_cost) / per_row  # rows beyond the floors
    even_frac = min(1.0, budget / per_row / sum(rows))
    even = [min(r, max(f, int(r * even_frac))) for f, r in zip(floors, rows)]
    lays = []
    for t in range(n):
        lay = np.arange(rows[t], dtype=np.uint32) if layouts is None else np.ascontiguousarray(layouts[t], np.uint32)
        if lay.shape != (rows[t],):
            raise InvalidArgumentError(f"table {t}: the layout must hold one position per row ({rows[t]}), got {lay.shape}")
        lays.append(lay)

    def blocks_read(t: int, sizes: list[int]) -> list[float]:
        tr = traces[t]
        accesses = max(1, int(tr.offsets[-1]))
        rate = 1.0 if accesses <= SPLIT_ACCESSES else max(0.01, SPLIT_ACCESSES / accesses)
        model = {"counts": None, "rate": rate, "row_bytes": row_bytes, "batch": batch, "slack_rows": 0}
        [res] = _tiermem.minicache_sweep(lays[t], rows_per_block, (tr.offsets, tr.rows), sizes, [admission], model)
        return [float(r["blocks_read"]) for r in res]

    sizes_all = []
    for t in range(n):
        top = min(rows[t], floors[t] + int(spare))
        sizes_all.append(sorted({int(round(floors[t] + (top - floors[t]) * k / steps)) for k in range(steps + 1)} | {even[t]}))
    reads_all = [blocks_read(t, sizes) for t, sizes in enumerate(sizes_all)]
    picks = split_greedy(
        [[s * per_row for s in sizes] for sizes in sizes_all],
        [[-b for b in reads] for reads in reads_all],
        budget - floor_cost,
    )
    cache_rows = [sizes_all[t][k] for t, k in enumerate(picks)]
    reads = [reads_all[t][k] for t, k in enumerate(picks)]
    # What no curve wants (flat past the rows a short trace touched: its misses are first
    # touches no cache saves) goes to the tables in proportion to their rows, as an even
    # split would give it: later accesses reach rows the trace never saw.
    left = (budget - floor_cost) / per_row - sum(r - f for r, f in zip(cache_rows, floors))
    for _ in range(n):
        room = [rows[t] - cache_rows[t] for t in range(n)]
        open_rows = sum(rows[t] for t in range(n) if room[t] > 0)
        if int(left) < 1 or open_rows == 0:
            break
        add = [min(room[t], int(left * rows[t] / open_rows)) if room[t] > 0 else 0 for t in range(n)]
        if not any(add):
            break
        cache_rows = [c + a for c, a in zip(cache_rows, add)]
        left -= sum(add)
    for t in range(n):
        if cache_rows[t] in sizes_all[t]:
            reads[t] = reads_all[t][sizes_all[t].index(cache_rows[t])]
        else:
            [reads[t]] = blocks_read(t, [cache_rows[t]])
    return Split(
        cache_rows=cache_rows,
        blocks_read=reads,
        even_rows=even,
        even_blocks_read=[reads_all[t][sizes_all[t].index(even[t])] for t in range(n)],
    )
