"""A model of a sharded DLRM step against the number of ranks, and the probe that measures
the collectives it is priced with.

Per step, with a global batch of ``B`` samples, ``T`` tables of rows ``dim`` wide, ``bag``
lookups per table per sample, ``P`` dense parameters, on ``n`` ranks sharing ``cores``
cores (``cores >= n`` on a cluster)::

    compute(n)  = (lookup_1 + dense_1 + update_1) / min(n, cores)
    bytes(n)    = (n - 1) / n * (B / n) * T * (8 * (bag + 1) + 2 * 4 * dim)   # indices, lengths,
                  + 2 * (n - 1) / n * 4 * P                                    # pooled out, grads back; DDP
    exchange(n) = calls * latency(n) + bytes(n) / bandwidth(n)
    step(n)     = compute(n) + exchange(n)

``lookup_1``, ``dense_1``, ``update_1`` are one process's measured seconds per step (its
lookup rate); ``latency(n)`` and ``bandwidth(n)`` are a collective's fixed cost and its
cost per byte on ``n`` ranks, measured by :func:`probe` on this machine or given for a
network (the ``extrapolate`` figures).
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from dataclasses import dataclass
from statistics import median
from typing import Any

import torch
import torch.distributed as dist

from .._files import write_json_atomic

__all__ = ["CALLS", "Network", "StepModel", "probe"]

#: Collectives per step: the batch sizes, the lengths, the values, the pooled rows, the
#: gradients back; the loss's all-reduce; DDP's gradient all-reduce (one bucket).
CALLS = 7


@dataclass(frozen=True)
class Network:
    """A collective's fixed cost (s) and bandwidth (bytes/s) per rank."""

    latency: float
    bandwidth: float

    def seconds(self, calls: int, nbytes: float) -> float:
        return calls * self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class StepModel:
    """One process's measured step split and the model's shape (see the module's note)."""

    batch: int
    tables: int
    bag: int
    dim: int
    dense_parameters: int
    lookup_1: float
    dense_1: float
    update_1: float
    cores: int

    def bytes(self, n: int) -> float:
        """Bytes a rank sends per step on ``n`` ranks."""
        if n <= 1:
            return 0.0
        share = (n - 1) / n
        sparse = share * (self.batch / n) * self.tables * (8 * (self.bag + 1) + 2 * 4 * self.dim)
        return sparse + 2 * share * 4 * self.dense_parameters

    def compute(self, n: int) -> float:
        return (self.lookup_1 + self.dense_1 + self.update_1) / min(n, self.cores)

    def step(self, n: int, net: Network) -> dict[str, float]:
        """Predicted seconds per step on ``n`` ranks: total, compute and exchange."""
        x = net.seconds(CALLS, self.bytes(n)) if n > 1 else 0.0
        c = self.compute(n)
        return {"seconds": c + x, "compute": c, "exchange": x, "bytes": self.bytes(n)}


def _probe_rank(rank: int, world: int, port: int, sizes: list[int], reps: int, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        res = {}
        for size in sizes:
            n = max(world, size // 4 // world * world)
            send = torch.zeros(n, dtype=torch.float32)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send)  # connect
            ts = []
            for _ in range(reps):
                dist.barrier()
                t = time.perf_counter()
                dist.all_to_all_single(recv, send)
                ts.append(time.perf_counter() - t)
            res[str(size)] = median(ts)
        if rank == 0:
            write_json_atomic(out, res)
    finally:
        dist.destroy_process_group()


def probe(world: int, small: int = 64, large: int = 8 << 20, reps: int = 20) -> Network:
    """Measure ``all_to_all_single`` among ``world`` local processes: the median time of a
    ``small``-byte and a ``large``-byte exchange (bytes each rank sends) give the fixed cost
    and the cost per byte."""
    import json

    import torch.multiprocessing as mp

    from .train import _free_port

    if world < 2:
        return Network(0.0, float("inf"))
    with tempfile.TemporaryDirectory(prefix="tiermem-probe-") as d:
        out = os.path.join(d, "probe.json")
        mp.start_processes(
            _probe_rank, args=(world, _free_port(), [small, large], reps, out), nprocs=world, join=True, start_method="spawn"
        )
        with open(out) as f:
            t: dict[str, Any] = json.load(f)
    ts, tl = t[str(small)], t[str(large)]
    sent = (large - small) * (world - 1) / world
    per_byte = max(tl - ts, 1e-12) / sent
    return Network(latency=ts, bandwidth=1.0 / per_byte)
