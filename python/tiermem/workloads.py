"""Index workloads for embedding tables (tests and benchmarks).

Three distributions (thesis §5.4.1.1 and Meta's published locality statistics):

- ``uniform``: every row equally likely (little reuse; the hard case for caches);
- ``zipf``: Zipf(alpha) over popularity ranks, ranks scrambled per table by a maximum-length
  LFSR with its own seed so popular rows are not neighbours (alpha = 1 is much reuse);
- ``production``: per batch, the share of distinct rows used 1, 2, 3-4, 5-8, ... times
  follows the histograms Meta published with its embedding-lookup datasets
  (``META_REUSE``); rows used more than once keep their popularity rank from batch to batch,
  rows used once are drawn afresh. It sits between the two extremes.

Generation runs in the Rust core (parallel over tables, reproducible from ``seed`` and the
batch number ``step``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import _tiermem
from .exceptions import InvalidArgumentError

__all__ = ["DISTRIBUTIONS", "META_REUSE", "REUSE_BUCKETS", "batch", "reuse_histogram"]

#: Index distributions the generators draw from (the core's registry).
DISTRIBUTIONS: tuple[str, ...] = tuple(_tiermem.DISTRIBUTIONS)

#: Reuse-factor buckets: a row used (lo, hi] times in a batch (the last is open-ended); the
#: core's ``REUSE_BUCKETS``, whose last bucket is capped where generators need a bound.
REUSE_BUCKETS: list[tuple[int, int | None]] = [(lo, hi) for lo, hi in _tiermem.REUSE_BUCKETS[:-1]]
REUSE_BUCKETS.append((_tiermem.REUSE_BUCKETS[-1][0], None))

#: Share of distinct rows per reuse bucket, averaged over the datasets of each release of
#: facebookresearch/dlrm_datasets (MIT licence): "Histogram of col sizes" in the locality
#: statistics published with them (2021: 856 tables, batch 65536, 17 datasets; 2022: 788
#: tables, batch 131072, 16 datasets).
META_REUSE = {
    "meta-2021": [
        0.4259,
        0.1642,
        0.1654,
        0.1205,
        0.0729,
        0.0311,
        0.011,
        0.0041,
        0.002,
        0.001,
        0.0009,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ],
    "meta-2022": [0.342, 0.144, 0.149, 0.138, 0.112, 0.068, 0.029, 0.01, 0.004, 0.002, 0.001, 0.001, 0.0, 0.0, 0.0, 0.0, 0.0],
}


def batch(
    dist: str,
    rows: Sequence[int],
    batch_size: int,
    bag: int,
    *,
    seed: int = 0,
    step: int = 0,
    alpha: float = 1.0,
    histogram: str | Sequence[float] = "meta-2022",
) -> list[np.ndarray]:
    """One batch of fixed-size bags per table: ``rows[t]`` rows, ``batch_size`` bags of
    ``bag`` indices. Returns each table's int64 indices (``batch_size * bag``); the offsets
    are ``arange(0, batch_size * bag + 1, bag)``."""
    if dist not in DISTRIBUTIONS:
        raise InvalidArgumentError(f"distribution {dist!r}: known are {', '.join(DISTRIBUTIONS)}")
    if batch_size <= 0 or bag <= 0:
        raise InvalidArgumentError(f"batch size and bag size must be positive, got {batch_size} and {bag}")
    hist = None
    if dist == "production":
        hist = list(META_REUSE[histogram]) if isinstance(histogram, str) else [float(x) for x in histogram]
    outs = [np.empty(batch_size * bag, np.int64) for _ in rows]
    _tiermem.generate_into((dist, float(alpha), hist), [int(r) for r in rows], outs, int(bag), int(seed), int(step))
    return outs


def reuse_histogram(values: np.ndarray) -> list[float]:
    """Share of distinct rows of ``values`` in each of ``REUSE_BUCKETS``."""
    return list(_tiermem.reuse_histogram(np.ascontiguousarray(values, np.int64)))
