"""A model of a sharded DLRM step against the number of ranks, and the probe that measures
the collectives it is priced with.

Per step, with a global batch of ``B`` samples, ``T`` tables of rows ``dim`` wide, ``bag``
lookups per table per sample, ``P`` dense parameters, on ``n`` ranks sharing ``cores``
cores (``cores >= n`` on a cluster), each rank holding ``H`` shards (``T / n`` table-wise,
``T`` row-wise: a shard of every table)::

    compute(n) = a rank's compute measured with n one-process runs of batch B / n side by
                 side (they contend for cores and memory as ranks do; row-wise, the lookups
                 and updates from runs of batch B, bags of bag / n, on tables of rows / n:
                 a row-wise rank pools every sample's bag of each table, holding the 1 / n
                 of its indices in the rank's rows), or, past the measured counts,
                 (fixed + per_sample * B / n) * max(1, n / cores)
    sparse(n)  = (n - 1) / n * (B / n) * T * bag * 8        # indices to their owners
               + (n - 1) * (B / n) * H * 8                  # bag lengths, per shard
               + 2 * (n - 1) * (B / n) * H * dim * 4        # pooled rows out, gradients back
    bytes(n)   = sparse(n) + 2 * (n - 1) / n * 4 * P        # and DDP's all-reduce
    step(n)    = compute(n) + CALLS * latency(n) + bytes(n) / bandwidth(n)

``fixed`` and ``per_sample`` are fitted to the measured compute (lookup, dense and update)
of the counts that had a core per process; ``latency(n)`` and ``bandwidth(n)`` are a collective's
fixed cost and its cost per byte on ``n`` ranks, measured by :func:`probe` on this machine
or given for a network (the extrapolation). Row-wise shards send every rank a partial sum
of every table, so their bytes per rank do not fall as ranks are added; table-wise shards'
do.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import torch
import torch.distributed as dist

from .._files import write_json_atomic
from .train import _free_port, exit_now

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
    """The model's inputs (see the module's note)."""

    batch: int
    tables: int
    bag: int
    dim: int
    dense_parameters: int
    sharding: str
    fixed: float
    per_sample: float
    cores: int
    #: A rank's compute measured with ``n`` ranks side by side, by ``n`` (overrides the line).
    measured: dict[int, float] = field(default_factory=dict)

    @staticmethod
    def fit(batches: list[int], seconds: list[float]) -> tuple[float, float]:
        """``(fixed, per_sample)``: the least-squares line through one process's compute
        seconds at these batch sizes."""
        n = len(batches)
        mb, ms = sum(batches) / n, sum(seconds) / n
        var = sum((b - mb) ** 2 for b in batches)
        k = sum((b - mb) * (t - ms) for b, t in zip(batches, seconds, strict=True)) / var if var else 0.0
        return ms - k * mb, k

    def sparse_bytes(self, n: int) -> float:
        """Bytes of indices, lengths, pooled rows and gradients a rank sends per step."""
        if n <= 1:
            return 0.0
        b = self.batch / n
        held = self.tables / n if self.sharding == "table" else self.tables
        return (n - 1) / n * b * self.tables * self.bag * 8 + (n - 1) * b * held * (8 + 2 * 4 * self.dim)

    def bytes(self, n: int) -> float:
        """All a rank sends per step, DDP's all-reduce included."""
        return self.sparse_bytes(n) + (2 * (n - 1) / n * 4 * self.dense_parameters if n > 1 else 0.0)

    def compute(self, n: int) -> float:
        if n in self.measured:
            return self.measured[n]
        return (self.fixed + self.per_sample * self.batch / n) * max(1.0, n / self.cores)

    def step(self, n: int, net: Network) -> dict[str, float]:
        """Predicted seconds per step on ``n`` ranks: total, compute and exchange."""
        x = net.seconds(CALLS, self.bytes(n))
        c = self.compute(n)
        return {"seconds": c + x, "compute": c, "exchange": x, "bytes": self.bytes(n), "sparse_bytes": self.sparse_bytes(n)}


def _busy(seconds: float) -> None:
    """Keep this core busy for ``seconds`` (a step's compute between two collectives)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _probe_rank(rank: int, world: int, port: int, sizes: list[int], reps: int, gap: float, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        torch.set_num_threads(1)
        res = {}
        for size in sizes:
            n = max(world, size // 4 // world * world)
            send = torch.zeros(n, dtype=torch.float32)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send)  # connect
            ts = []
            for _ in range(reps):
                # A step's collectives follow one another with no barrier between them.
                dist.barrier()
                t = time.perf_counter()
                for _ in range(CALLS):
                    _busy(gap)
                    dist.all_to_all_single(recv, send)
                ts.append((time.perf_counter() - t) / CALLS - gap)
            res[str(size)] = median(ts)
        if rank == 0:
            write_json_atomic(out, res)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_now(0)


def probe(world: int, gap: float = 0.0, small: int = 64, large: int = 8 << 20, reps: int = 20) -> Network:
    """Measure ``all_to_all_single`` among ``world`` local processes, ``CALLS`` at a time
    as a step makes them, each rank busy for ``gap`` seconds before each (the step's
    compute between its collectives: a collective between busy processes waits for them to
    be scheduled): the median time of a ``small``-byte and a ``large``-byte exchange (bytes
    each rank sends), less the gaps, give the fixed cost and the cost per byte."""
    import json

    import torch.multiprocessing as mp


    with tempfile.TemporaryDirectory(prefix="tiermem-probe-") as d:
        out = os.path.join(d, "probe.json")
        mp.start_processes(
            _probe_rank,
            args=(world, _free_port(), [small, large], reps, gap, out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        with open(out) as f:
            t: dict[str, Any] = json.load(f)
    ts, tl = t[str(small)], t[str(large)]
    sent = (large - small) * max(world - 1, 1) / world
    per_byte = max(tl - ts, 1e-12) / sent
    return Network(latency=ts, bandwidth=1.0 / per_byte)
