"""What a DLRM user would pick instead of tiermem, as embedding modules the trainer runs
side by side with its own: FBGEMM's CPU table-batched embeddings (``fbgemm-gpu-cpu``, the
package that pairs with the pinned torch) with SGD fused into backward, every row in DRAM."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..exceptions import InvalidArgumentError

__all__ = ["FbgemmEmbeddings", "fbgemm_modules"]


def fbgemm_modules() -> tuple[Any, str | None]:
    """FBGEMM's training TBE modules, or None and why they are not importable. FBGEMM's
    import warns about optional operators the CPU package does not build; that noise is
    silenced here (it is not about anything tiermem asked for)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _import_fbgemm(), None
    except Exception as e:  # any import failure: a missing or mismatched package
        return None, f"fbgemm-gpu-cpu is not importable next to this torch ({type(e).__name__}: {e})"


def _import_fbgemm() -> tuple[Any, ...]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    return (EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)


class FbgemmEmbeddings(torch.nn.Module):
    """Every table in one FBGEMM ``SplitTableBatchedEmbeddingBagsCodegen`` on the host
    (CPU), sum pooling, ``EXACT_SGD`` applied in backward: the rows in DRAM, the way FBGEMM
    users train on CPU."""

    def __init__(self, rows: Sequence[int], dim: int, lr: float) -> None:
        super().__init__()
        mods, why_not = fbgemm_modules()
        if mods is None:
            raise InvalidArgumentError(f"mode 'fbgemm' needs FBGEMM: {why_not}")
        EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, TBE = mods
        self.tbe = TBE(
            embedding_specs=[(int(r), int(dim), EmbeddingLocation.HOST, ComputeDevice.CPU) for r in rows],
            optimizer=EmbOptimType.EXACT_SGD,
            learning_rate=float(lr),
            pooling_mode=PoolingMode.SUM,
        )

    def load_rows(self, table: int, start: int, values: np.ndarray) -> None:
        with torch.no_grad():
            w = self.tbe.split_embedding_weights()[table]
            w[start : start + len(values)] = torch.from_numpy(values).to(w.dtype)

    def forward(self, indices: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor]) -> torch.Tensor:
        # One index list for all tables; offsets per (table, sample), then the total.
        idx = torch.cat(list(indices))
        base, parts = 0, []
        for i, o in zip(indices, offsets):
            parts.append(o[:-1] + base)
            base += len(i)
        off = torch.cat([*parts, torch.tensor([base], dtype=torch.int64)])
        return self.tbe(idx, off)

    def step(self) -> None:
        """Nothing: FBGEMM updated the rows in backward."""
