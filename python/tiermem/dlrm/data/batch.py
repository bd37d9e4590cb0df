"""One mini-batch of a recommendation model's inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...exceptions import InvalidArgumentError


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

    def shard(self, rank: int, world: int) -> Batch:
        """Samples ``rank * B / world`` to ``(rank + 1) * B / world`` (a rank's share of a
        global batch; ``B`` must split evenly)."""
        b = self.size
        if world < 1 or not 0 <= rank < world or b % world:
            raise InvalidArgumentError(f"a batch of {b} cannot be split into {world} equal shares for rank {rank}")
        lo, hi = rank * b // world, (rank + 1) * b // world
        idx, offs = [], []
        for v, o in zip(self.indices, self.offsets, strict=True):
            a, z = int(o[lo]), int(o[hi])
            idx.append(v[a:z])
            offs.append(o[lo : hi + 1] - a)
        return Batch(self.dense[lo:hi], idx, offs, self.labels[lo:hi])

    def lookups(self) -> int:
        """Indices over every table."""
        return sum(int(i.numel()) for i in self.indices)
