"""A model of a sharded DLRM step against the number of ranks, and the probe that measures
the collectives it is priced with.

Per step, with a global batch of ``B`` samples, ``T`` tables of rows ``dim`` wide, ``bag``
lookups per table per sample, ``P`` dense parameters, on ``n`` ranks sharing ``cores``
cores (``cores >= n`` on a cluster), each rank holding ``H`` shards (``T / n`` table-wise,
``T`` row-wise: a shard of every table)::

    compute(n) = a rank's own compute, measured with min(n, cores) one-process runs of
                 batch B / n side by side (each with a core, contending for memory as
                 running ranks do; past a core per rank the time-sharing is in the
                 collectives' prices; row-wise, the lookups and updates from runs of batch
                 B, bags of bag / n, on tables of rows / n: a row-wise rank pools every
                 sample's bag of each table, holding the 1 / n of its indices in the rank's
                 rows), or, past the measured counts, fixed + per_sample * B / n
    sparse(n)  = (n - 1) / n * (B / n) * T * bag * 8        # indices to their owners
               + (n - 1) * (B / n) * H * 8                  # bag lengths, per shard
               + 2 * (n - 1) * (B / n) * H * dim * 4        # pooled rows out, gradients back
    bytes(n)   = sparse(n) + 2 * (n - 1) / n * 4 * P        # and DDP's all-reduce
    step(n)    = compute(n) + sum(latency(n, kind) for kind in STEP) + bytes(n) / bandwidth(n)

``fixed`` and ``per_sample`` are fitted to the measured compute (lookup, dense and update)
of the counts that had a core per process; ``latency(n, kind)`` and ``bandwidth(n)`` are a
collective's fixed cost by kind and the cost per byte on ``n`` ranks, measured by
:func:`probe` on this machine or given for a network (the extrapolation). The probe makes a
step's collectives in the step's order, each rank computing ``compute(n) / CALLS`` before
each: a collective waits for peers still computing, and past a core per rank for peers that
are not running (gloo's waiting ranks poll, so a waiting rank also takes a core from the
peer it waits for). That wait is part of a collective's price, and it differs by kind: an
``all_reduce`` (a ring) waits on its neighbours round after round, an ``all_to_all`` once.
Row-wise shards send every rank a partial sum of every table, so their bytes per rank do
not fall as ranks are added; table-wise shards' do.
"""

from __future__ import annotations

import datetime
import functools
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

import torch
import torch.distributed as dist

from .._files import write_json_atomic
from .train import _free_port, exit_now

__all__ = ["CALLS", "KINDS", "PHASES", "STEP", "Network", "StepModel", "probe"]

#: The collectives of one step, in order: the batch sizes; the lengths, the values and the
#: pooled rows out; DDP's gradient all-reduce (one bucket); the gradients back; the loss's
#: all-reduce.
STEP = ("all_gather", "all_to_all", "all_to_all", "all_to_all", "all_reduce", "all_to_all", "all_reduce")
CALLS = len(STEP)
#: The parts of a rank's compute (its time split less the exchange).
PHASES = ("lookup", "dense", "update")
KINDS = ("all_gather", "all_to_all", "all_reduce")


@dataclass(frozen=True)
class Network:
    """A collective's fixed cost (s), by kind where measured, and bandwidth (bytes/s) per rank."""

    latency: float
    bandwidth: float
    #: Fixed cost of each kind of collective measured apart (``latency`` for the others).
    kinds: dict[str, float] = field(default_factory=dict)

    def fixed(self, kind: str) -> float:
        return self.kinds.get(kind, self.latency)

    def seconds(self, nbytes: float) -> float:
        """A step's collectives (``STEP``) carrying ``nbytes`` in all."""
        return sum(self.fixed(k) for k in STEP) + nbytes / self.bandwidth


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
    #: A rank's own compute measured for ``n`` ranks (``min(n, cores)`` side by side), by
    #: ``n`` and part of ``PHASES`` (overrides the line).
    measured: dict[int, dict[str, float]] = field(default_factory=dict)

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
        """A rank's own compute per step on ``n`` ranks: what it would take with a core to
        itself (waiting for peers that share a core is priced in the collectives)."""
        if n in self.measured:
            return sum(self.measured[n].values())
        return self.fixed + self.per_sample * self.batch / n

    def gaps(self, n: int) -> list[float]:
        """A rank's own compute before each collective of ``STEP`` on ``n`` ranks, spread
        evenly over them (what :func:`probe` replays). Spread as a step spreads it (the
        lookup before the pooled rows, the dense part before DDP's all-reduce), the model
        came out 9-29 % above two and four processes' measured steps in two runs: long busy
        stretches make a busy loop's peers later than a step's."""
        return [self.compute(n) / CALLS] * CALLS

    def step(self, n: int, net: Network) -> dict[str, float]:
        """Predicted seconds per step on ``n`` ranks: total, compute and exchange."""
        x = net.seconds(self.bytes(n))
        c = self.compute(n)
        return {"seconds": c + x, "compute": c, "exchange": x, "bytes": self.bytes(n), "sparse_bytes": self.sparse_bytes(n)}


def _busy(seconds: float) -> None:
    """Keep this core busy for ``seconds`` (a step's compute between two collectives)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _probe_rank(rank: int, world: int, port: int, sizes: list[int], reps: int, gaps: list[float], out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        torch.set_num_threads(1)
        res = {}
        for size in sizes:
            n = max(world, size // 4 // world * world)
            send = torch.zeros(n, dtype=torch.float32)
            recv = torch.zeros_like(send)
            gathered = [torch.empty_like(send) for _ in range(world)]
            calls: dict[str, Callable[[], Any]] = {
                "all_to_all": functools.partial(dist.all_to_all_single, recv, send),
                "all_reduce": functools.partial(dist.all_reduce, recv),
                "all_gather": functools.partial(dist.all_gather, gathered, send),
            }
            for k in KINDS:  # connect
                calls[k]()
            ts: dict[str, list[float]] = {k: [] for k in KINDS}
            for _ in range(reps):
                # A step's collectives follow one another with no barrier between them.
                dist.barrier()
                for k, gap in zip(STEP, gaps, strict=True):
                    t = time.perf_counter()
                    _busy(gap)
                    calls[k]()
                    ts[k].append(time.perf_counter() - t - gap)
            # The mean, not the median: a step pays every late peer, the slow calls too.
            res[str(size)] = {k: mean(v) for k, v in ts.items()}
        if rank == 0:
            write_json_atomic(out, res)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_now(0)


def probe(world: int, gaps: list[float] | None = None, small: int = 64, large: int = 8 << 20, reps: int = 30) -> Network:
    """Measure a step's collectives (``STEP``, in its order) among ``world`` local
    processes, each rank busy for ``gaps[i]`` seconds before call ``i`` (the step's compute
    between its collectives, :meth:`StepModel.gaps`: a collective between busy processes
    waits for them to be scheduled):
    the mean time of each kind at ``small`` bytes (each rank's part), less the gap, is
    its fixed cost; the ``all_to_all`` at ``large`` bytes gives the cost per byte."""
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tiermem-probe-") as d:
        out = os.path.join(d, "probe.json")
        mp.start_processes(
            _probe_rank,
            args=(world, _free_port(), [small, large], reps, gaps or [0.0] * CALLS, out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        with open(out) as f:
            t: dict[str, dict[str, float]] = json.load(f)
    ts, tl = t[str(small)], t[str(large)]
    sent = (large - small) * max(world - 1, 1) / world
    per_byte = max(tl["all_to_all"] - ts["all_to_all"], 1e-12) / sent
    return Network(latency=ts["all_to_all"], bandwidth=1.0 / per_byte, kinds=dict(ts))
