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

    @classmethod
    def concat(cls, parts: list[Batch]) -> Batch:
        """One batch of ``parts``' samples in order (the inverse of :meth:`shard`: the global
        batch of ranks that each read their own share)."""
        if not parts or len({len(p.indices) for p in parts}) != 1:
            raise InvalidArgumentError("concatenating batches needs at least one, each with the same tables")
        idx, offs = [], []
        for t in range(len(parts[0].indices)):
            idx.append(torch.cat([p.indices[t] for p in parts]))
            ends = torch.cumsum(torch.tensor([0] + [int(p.offsets[t][-1]) for p in parts[:-1]]), 0)
            offs.append(torch.cat([parts[0].offsets[t][:1]] + [p.offsets[t][1:] + e for p, e in zip(parts, ends, strict=True)]))
        return cls(torch.cat([p.dense for p in parts]), idx, offs, torch.cat([p.labels for p in parts]))

    def lookups(self) -> int:
        """Indices over every table."""
        return sum(int(i.numel()) for i in self.indices)
