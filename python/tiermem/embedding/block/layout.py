"""Layouts of block tables: which rows share a 4 KiB block of the table file (Bandana §4.2).

A layout is a permutation, row → position (``uint32``); a block holds ``rows_per_block``
consecutive positions. A query that needs rows in ``k`` blocks reads ``k`` blocks: its
*fan-out*. Layouts here:

* :func:`original`: row ``i`` at position ``i``.
* :func:`shp`: supervised, from a query trace: SHP's balanced recursive bisection of the
  query hypergraph, minimising fan-out (§4.2.2; the partitioner is in ``tiermem-embed``).
* :func:`kmeans`: unsupervised, from the rows' values: rows with similar embeddings share
  blocks (§4.2.1, recursive K-means then the clusters' rows in order of distance).
* ``shp+kmeans`` (:func:`make`): both: SHP started from the K-means layout with its blocks
  as extra queries, so rows the training trace holds rarely or never stay with rows of
  similar values instead of filling blocks in order of first use. It generalises best to
  a held-out trace (``bench ssd``'s query trace: fan-out 19.5 against SHP's 25.3).
* :func:`kahypar_layout`: the KaHyPar hypergraph partitioner on the same hypergraph, when
  the ``kahypar`` package is installed (a reference for SHP's fan-out).

:func:`fanout` measures any of them on a (held-out) trace; :func:`query_counts` gives the
per-row query counts that threshold admission compares against.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ... import _tiermem
from ...exceptions import InvalidArgumentError
from .traces import Trace

__all__ = ["original", "shp", "kmeans", "kahypar_layout", "fanout", "query_counts", "make", "make_many", "KINDS"]

#: Layout kinds :func:`make` builds.
KINDS = ("original", "shp", "kmeans", "shp+kmeans")


def original(rows: int) -> np.ndarray:
    """Row ``i`` at position ``i``."""
    return np.arange(rows, dtype=np.uint32)


def shp(trace: Trace, rows_per_block: int, iters: int = 16, start: np.ndarray | None = None) -> np.ndarray:
    """SHP's layout of ``trace.rows_total`` rows from the trace's queries. With ``start``
    (a layout, row → position), the bisection begins from it with every row taking part,
    so rows the trace seldom or never uses stay beside their neighbours there."""
    out = np.empty(trace.rows_total, np.uint32)
    st = None if start is None else np.ascontiguousarray(start, np.uint32)
    _tiermem.layout_shp(out, int(rows_per_block), trace.offsets, trace.rows, int(iters), st)
    return out


def kmeans(weights: np.ndarray, rows_per_block: int, clusters: int | None = None, iters: int = 8, seed: int = 0) -> np.ndarray:
    """A semantic layout by Bandana's recursive K-means (§4.2.1): the rows' values
    (``(rows, dim)``) in ``clusters`` clusters (default one per 32 blocks' worth of rows, at
    most 1,024; the paper's first stage had 256), each cluster's rows in sub-clusters of
    about one block (seeded by k-means++), rows ordered by cluster, sub-cluster and distance
    to the sub-cluster's centre. On ``bench ssd``'s query trace (2^20 rows) the held-out
    fan-out is 29.5 (31.3 with 256 first-stage clusters) against 36.9 for one stage of
    4,096 clusters, in a third of the time."""
    w = np.asarray(weights, np.float32)
    if w.ndim != 2 or len(w) == 0:
        raise InvalidArgumentError(f"weights must be (rows, dim), got shape {w.shape}")
    n, rpb = len(w), max(1, int(rows_per_block))
    k = clusters or max(1, min(1024, n // (32 * rpb)))
    rng = np.random.default_rng(seed)
    label, _ = _lloyd(w, w[rng.choice(n, size=min(k, n), replace=False)].copy(), iters)
    sub = np.zeros(n, np.int64)
    dist = np.zeros(n, np.float32)
    base = 0
    for c in range(int(label.max()) + 1):
        idx = np.flatnonzero(label == c)
        if len(idx) == 0:
            continue
        part = w[idx]
        s, d = _lloyd(part, _kmeans_pp(part, -(-len(idx) // rpb), rng), iters)
        sub[idx], dist[idx] = base + s, d
        base += int(s.max()) + 1
    order = np.lexsort((dist, sub))
    out = np.empty(n, np.uint32)
    out[order] = np.arange(n, dtype=np.uint32)
    return out


def _kmeans_pp(w: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeds: each next centre a row drawn with probability by its squared
    distance to the nearest centre so far."""
    centres = [w[rng.integers(len(w))]]
    d = ((w - centres[0]) ** 2).sum(1, dtype=np.float64)
    for _ in range(1, min(k, len(w))):
        total = float(d.sum())
        i = int(rng.choice(len(w), p=d / total)) if total > 0 else int(rng.integers(len(w)))
        centres.append(w[i])
        d = np.minimum(d, ((w - w[i]) ** 2).sum(1, dtype=np.float64))
    return np.array(centres, np.float32)


def _lloyd(w: np.ndarray, centres: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
    """``iters`` rounds of Lloyd's algorithm from ``centres``: each row's cluster and its
    squared distance to the cluster's centre."""
    sq = (w * w).sum(1)
    label, dist = _assign(w, sq, centres)
    for _ in range(iters):
        sums = np.zeros_like(centres)
        np.add.at(sums, label, w)
        counts = np.bincount(label, minlength=len(centres)).astype(np.float32)
        live = counts > 0
        centres[live] = sums[live] / counts[live, None]
        label, dist = _assign(w, sq, centres)
    return label, dist


def _assign(w: np.ndarray, sq: np.ndarray, centres: np.ndarray, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centre of each row, in chunks (bounded memory)."""
    csq = (centres * centres).sum(1)
    label = np.empty(len(w), np.int64)
    dist = np.empty(len(w), np.float32)
    for s in range(0, len(w), chunk):
        d = sq[s : s + chunk, None] - 2 * w[s : s + chunk] @ centres.T + csq[None, :]
        label[s : s + chunk] = d.argmin(1)
        dist[s : s + chunk] = d[np.arange(len(d)), label[s : s + chunk]]
    return label, dist


def kahypar_layout(trace: Trace, rows_per_block: int) -> np.ndarray | None:
    """KaHyPar's partition of the trace's query hypergraph into blocks (``None`` when the
    ``kahypar`` package is not installed): as many parts as the rows queries use fill
    blocks, perfectly balanced, part ``p`` in block ``p``. Rows no query uses fill the
    blocks' leftover slots and the positions after them."""
    try:
        import kahypar  # optional: the reference partitioner
    except ImportError:
        return None
    n, rpb = trace.rows_total, int(rows_per_block)
    used = np.unique(trace.rows)
    vid = np.full(n, -1, np.int64)
    vid[used] = np.arange(len(used))
    edges = [e for q in range(trace.queries) if len(e := np.unique(vid[trace.query(q)])) > 1]
    k = max(2, -(-len(used) // rpb))
    idx = np.concatenate([[0], np.cumsum([len(e) for e in edges])]).astype(np.uint64)
    pins = np.concatenate(edges).astype(np.uint64) if edges else np.zeros(0, np.uint64)
    h = kahypar.Hypergraph(len(used), len(edges), idx.tolist(), pins.tolist(), k, [1] * len(edges), [1] * len(used))
    ctx = kahypar.Context()
    ctx.loadINIconfiguration(str(Path(__file__).resolve().parents[2] / "data" / "kahypar_km1_recursive.ini"))
    ctx.setK(k)
    ctx.setEpsilon(0.0)  # parts of at most ceil(used / k) <= rows_per_block rows
    ctx.suppressOutput(True)
    kahypar.partition(h, ctx)
    part = np.array([h.blockID(v) for v in range(len(used))], np.int64)
    out = np.full(n, np.iinfo(np.uint32).max, np.uint32)
    order = np.argsort(part, kind="stable")
    rank = np.arange(len(order)) - np.searchsorted(part[order], part[order])  # slot within its part
    if (rank >= rpb).any():
        raise InvalidArgumentError(f"KaHyPar returned a part larger than a block ({rpb} rows)")
    out[used[order]] = (part[order] * rpb + rank).astype(np.uint32)
    free = np.setdiff1d(np.arange(max(n, k * rpb), dtype=np.int64), out[used].astype(np.int64))
    rest = np.setdiff1d(np.arange(n), used)
    out[rest] = free[: len(rest)].astype(np.uint32)
    if int(out.max()) >= n:  # blocks past the table's end: pack positions down, keeping order
        out = np.argsort(np.argsort(out, kind="stable"), kind="stable").astype(np.uint32)
    return out


def fanout(layout: np.ndarray, rows_per_block: int, trace: Trace) -> float:
    """Average blocks per (non-empty) query of ``trace`` under ``layout``."""
    lay = np.ascontiguousarray(layout, np.uint32)
    if len(lay) != trace.rows_total:
        raise InvalidArgumentError(f"a layout of {len(lay)} rows for a trace over {trace.rows_total}")
    return float(_tiermem.layout_fanout(lay, int(rows_per_block), trace.offsets, trace.rows))


def query_counts(trace: Trace) -> np.ndarray:
    """Per row, the queries of ``trace`` that use it (``uint32``)."""
    out = np.empty(trace.rows_total, np.uint32)
    _tiermem.query_counts_into(out, trace.offsets, trace.rows)
    return out


def make(kind: str, *, trace: Trace, rows_per_block: int, weights: Any = None) -> np.ndarray:
    """The layout ``kind`` (one of :data:`KINDS`) for ``trace.rows_total`` rows."""
    return make_many([kind], trace=trace, rows_per_block=rows_per_block, weights=weights)[kind]


def make_many(kinds: Sequence[str], *, trace: Trace, rows_per_block: int, weights: Any = None) -> dict[str, np.ndarray]:
    """The layouts ``kinds`` (each one of :data:`KINDS`) for ``trace.rows_total`` rows, by
    kind; ``kmeans`` and ``shp+kmeans`` share one K-means run."""
    for kind in kinds:
        if kind not in KINDS:
            raise InvalidArgumentError(f"layout {kind!r}: known are {', '.join(KINDS)}")
        if kind in ("kmeans", "shp+kmeans") and weights is None:
            raise InvalidArgumentError(f"a {kind} layout clusters the rows' values: pass weights")
    out: dict[str, np.ndarray] = {}
    semantic = kmeans(weights, rows_per_block) if {"kmeans", "shp+kmeans"} & set(kinds) else None
    for kind in kinds:
        if kind == "original":
            out[kind] = original(trace.rows_total)
        elif kind == "shp":
            out[kind] = shp(trace, rows_per_block)
        else:
            assert semantic is not None
            out[kind] = semantic if kind == "kmeans" else shp(trace, rows_per_block, start=semantic)
    return out
