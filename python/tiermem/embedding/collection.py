"""Many tables looked up and updated in one kernel call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _tiermem
from ..exceptions import InvalidArgumentError
from .config import MODES, PREFETCH, OptimizerConfig
from .table import EmbeddingTable, _f32, _i64

__all__ = ["EmbeddingCollection"]


class EmbeddingCollection:
    """Many tables looked up (and updated) in one kernel call, outputs concatenated along
    columns: ``(bags, sum of widths)``."""

    def __init__(self, tables: Sequence[EmbeddingTable]) -> None:
        if not tables:
            raise InvalidArgumentError("an EmbeddingCollection needs at least one table")
        self.tables = list(tables)
        self.cols = np.cumsum([0] + [t.embedding_dim for t in self.tables])[:-1].tolist()
        self.width = sum(t.embedding_dim for t in self.tables)

    def _weights(
        self, per_sample_weights: Sequence[Any] | None, bags: Sequence[tuple[np.ndarray, np.ndarray]]
    ) -> list[np.ndarray | None]:
        if per_sample_weights is None:
            return [None] * len(bags)
        if len(per_sample_weights) != len(bags):
            raise InvalidArgumentError(f"{len(per_sample_weights)} per-sample weight arrays for {len(bags)} tables")
        return [None if w is None else _f32(w, f"per_sample_weights[{t}]").reshape(-1) for t, w in enumerate(per_sample_weights)]

    def _check(self, bags: Sequence[tuple[np.ndarray, np.ndarray]], mode: str) -> None:
        if mode not in MODES:
            raise InvalidArgumentError(f"mode {mode!r}: supported are {', '.join(MODES)}")
        if len(bags) != len(self.tables):
            raise InvalidArgumentError(f"{len(bags)} sets of bags for {len(self.tables)} tables")

    def _rows(self, bags: Sequence[tuple[np.ndarray, np.ndarray]], mode: str) -> int:
        if mode == "none":
            return sum(len(v) for v, _ in bags)
        return len(bags[0][1]) - 1

    def lookup(
        self,
        bags: Sequence[tuple[Any, Any]],
        per_sample_weights: Sequence[Any] | None = None,
        mode: str = "sum",
        out: np.ndarray | None = None,
        prefetch: int = PREFETCH,
    ) -> np.ndarray:
        """``bags[t] = (values, offsets)`` with ``len(offsets) == bags + 1`` (see
        :func:`as_bags`). Returns (or fills ``out``) a float32 ``(bags, width)`` matrix.
        ``prefetch``: rows read ahead by software prefetch (0: none), capped so that at
        most 128 cache lines are in flight (8 rows of width 256)."""
        self._check(bags, mode)
        bs = [(_i64(v, "values"), _i64(o, "offsets")) for v, o in bags]
        n = self._rows(bs, mode)
        stride = self.width if mode != "none" else max(t.embedding_dim for t in self.tables)
        if out is None:
            # Non-reducing lookups of tables of different widths leave the narrower tables'
            # extra columns untouched: start from zeros then.
            mixed = mode == "none" and any(t.embedding_dim != stride for t in self.tables)
            out = (np.zeros if mixed else np.empty)((n, stride), np.float32)
        elif out.dtype != np.float32 or not out.flags.c_contiguous or out.shape != (n, stride):
            raise InvalidArgumentError(f"out must be a C-contiguous float32 array of shape {(n, stride)}")
        cols = self.cols if mode != "none" else [0] * len(self.tables)
        _tiermem.lookup_into(
            [t._native for t in self.tables],
            ([v for v, _ in bs], [o for _, o in bs], self._weights(per_sample_weights, bs)),
            mode,
            out,
            (stride, cols),
            int(prefetch),
        )
        return out

    def update(
        self,
        bags: Sequence[tuple[Any, Any]],
        grad: Any,
        per_sample_weights: Sequence[Any] | None = None,
        mode: str = "sum",
        *,
        optimizer: str | OptimizerConfig = "sgd",
        **settings: Any,
    ) -> dict[str, int]:
        """Backward of :meth:`lookup` fused with the optimizer. ``optimizer`` is an
        :class:`~tiermem.embedding.OptimizerConfig`, or its name with its settings as keywords
        (``lr``, ``eps``, ``lr_decay``, ``initial_accumulator_value``, ``nt_stores``; see
        there). ``grad`` has the lookup output's shape."""
        self._check(bags, mode)
        opt = OptimizerConfig.of(optimizer, **settings)
        bs = [(_i64(v, "values"), _i64(o, "offsets")) for v, o in bags]
        n = self._rows(bs, mode)
        stride = self.width if mode != "none" else max(t.embedding_dim for t in self.tables)
        g = _f32(grad, "grad")
        if g.shape != (n, stride):
            raise InvalidArgumentError(f"grad must have shape {(n, stride)} (the lookup output's), got {g.shape}")
        cols = self.cols if mode != "none" else [0] * len(self.tables)
        return dict(
            _tiermem.update_from(
                [t._native for t in self.tables],
                ([v for v, _ in bs], [o for _, o in bs], self._weights(per_sample_weights, bs)),
                mode,
                g,
                (stride, cols),
                opt.native(),
            )
        )
