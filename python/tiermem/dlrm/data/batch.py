"""One mini-batch of a recommendation model's inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """``dense``: ``(B, F)`` float32; ``indices[t]``: table ``t``'s int64 bag indices;
    ``offsets[t]``: its ``B + 1`` int64 bag boundaries; ``labels``: ``(B,)`` float32 in {0, 1}."""

    dense: torch.Tensor
    indices: list[torch.Tensor]
    offsets: list[torch.Tensor]
    labels: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.dense.shape[0])

    def lookups(self) -> int:
        """Indices over every table."""
        return sum(int(i.numel()) for i in self.indices)
