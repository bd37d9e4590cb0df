"""Synthetic DLRM inputs (thesis §5.6.2): dense features from ``N(0, 1)``, sparse features
uniform or Zipf(alpha) with each table's popularity ranks scrambled by its own
maximum-length LFSR, and labels drawn from a fixed random "teacher" so that the loss can
actually fall: ``P(click) = sigmoid(dense . w + c * sum over tables of mean bag score / sqrt(tables))``,
where every row of every table has a fixed pseudo-random score in [-1, 1].

Batches are a pure function of ``(seed, step)``, so a resumed run sees the batches it would
have seen."""

from __future__ import annotations

import numpy as np
import torch

from ...exceptions import InvalidArgumentError
from ...workloads import batch as sparse_batch
from .batch import Batch

DISTS = ("uniform", "zipf")


def _row_scores(table: int, rows: np.ndarray, seed: int) -> np.ndarray:
    """A fixed score in [-1, 1] per (table, row): a 64-bit mix (splitmix64's finaliser)."""
    x = rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64((table * 0x632BE59BD9B4E019 + seed) % (1 << 64))
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0


class SyntheticData:
    """Batches for a model with table sizes ``rows``, ``dense_features`` dense inputs,
    ``bag`` lookups per table per sample.

    Args:
        dist: ``"uniform"`` or ``"zipf"`` (with ``alpha``).
        seed: selects the teacher, the LFSR phases and every batch.
    """

    def __init__(
        self,
        rows: tuple[int, ...] | list[int],
        dense_features: int,
        batch_size: int,
        bag: int = 1,
        dist: str = "uniform",
        alpha: float = 1.0,
        seed: int = 0,
    ) -> None:
        if dist not in DISTS:
            raise InvalidArgumentError(f"distribution {dist!r}: known are {', '.join(DISTS)}")
        if batch_size < 1 or bag < 1 or dense_features < 1:
            raise InvalidArgumentError("batch_size, bag and dense_features must be at least 1")
        self.rows = [int(r) for r in rows]
        self.dense_features, self.batch_size, self.bag = int(dense_features), int(batch_size), int(bag)
        self.dist, self.alpha, self.seed = dist, float(alpha), int(seed)
        g = torch.Generator().manual_seed(seed + 7919)
        self._w = torch.randn(self.dense_features, generator=g) / self.dense_features**0.5
        self._c = 2.0

    def batch(self, step: int) -> Batch:
        """Batch number ``step`` (any order, any number of times)."""
        b, n = self.batch_size, self.bag
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        dense = torch.randn(b, self.dense_features, generator=g)
        idx = sparse_batch(self.dist, self.rows, b, n, seed=self.seed, step=step, alpha=self.alpha)
        offs = torch.arange(0, b * n + 1, n, dtype=torch.int64)
        score = np.zeros(b)
        for t, v in enumerate(idx):
            score += _row_scores(t, v, self.seed).reshape(b, n).mean(axis=1)
        logit = dense @ self._w + self._c * torch.from_numpy(score / len(idx) ** 0.5).float()
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        return Batch(dense, [torch.from_numpy(v) for v in idx], [offs] * len(idx), labels)
