"""DLRM trained over ``torch.distributed``: tables sharded (:class:`ShardedEmbeddings`), the
dense part data-parallel (DDP), each rank on its share of every global batch: synthetic
batches (every rank draws the global batch and keeps its share), or a Criteo file of which
each rank reads its own byte range (:func:`~tiermem.dlrm.data.criteo.line_ranges`), the
global batch being the ranks' local batches in rank order. The run stops, on every rank at
the same step, when any rank's range runs out.

:func:`launch` starts ``nproc`` processes on this machine (gloo over loopback), runs
:func:`train_rank` in each and returns rank 0's result; a rank that fails ends the others
(each collective is bounded by ``timeout``) and the launch raises with that rank's error.
The same :func:`train_rank` runs under ``torchrun`` across hosts (it reads the rank and
world from the environment when ``init_method="env://"``).
"""

from __future__ import annotations

import datetime
import gc
import hashlib
import itertools
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .._files import write_json_atomic
from ..dlrm.data.batch import Batch
from ..dlrm.data.criteo import CriteoReader, line_ranges
from ..dlrm.data.synthetic import SyntheticData
from ..dlrm.model import DLRM, DLRMConfig
from ..dlrm.trainer import SLACK_SHARE, profile_traces
from ..embedding import EmbeddingTable, Placement
from ..embedding.cacheplan import Costs, TablePlan, cache_fast_bytes, hot_rows, meta_bytes
from ..exceptions import InvalidArgumentError
from ..manager import Manager
from .checkpoint import load_sharded, save_sharded
from .embeddings import ShardedEmbeddings
from .plan import PLACEMENTS, Shard, ShardPlan, plan_caches, plan_shards, shard_trace

__all__ = ["DistOptions", "launch", "train_rank"]

SLOW = "emulated:optane-pmem"


@dataclass
class DistOptions:
    """One distributed run: the model, how its tables are sharded and placed, the data."""

    config: DLRMConfig
    sharding: str = "table"
    placement: str = "dram"
    steps: int = 50
    lr: float = 0.01
    seed: int = 0
    data_seed: int = 0
    dist: str = "uniform"
    #: Share of each shard's rows its DRAM cache holds (``cached`` and ``block``).
    cache: float = 0.25
    #: Fast memory per rank for its shards' caches (``cached``): when set, split over the
    #: shards by their hit-rate curves on a profile of the first ``profile_steps`` global
    #: batches (:func:`~tiermem.dist.plan.plan_caches`) instead of ``cache`` each.
    fast_bytes: int = 0
    profile_steps: int = 4
    #: Directory of the block files (``block``); each rank writes under ``rank<r>/``.
    directory: str = ""
    #: Steps left out of the time split (the first touch of every page and socket).
    warmup: int = 0
    #: Seconds any collective may wait before the step fails.
    timeout: float = 60.0
    #: Checkpoint folder (:mod:`tiermem.dist.checkpoint`); saved every ``checkpoint_every``
    #: steps and after the last, resumed from with ``resume``.
    checkpoint: str = ""
    checkpoint_every: int = 0
    resume: bool = False
    #: Test hook: this rank exits abruptly (``os._exit``) at the start of this step.
    die: tuple[int, int] | None = None
    #: A Criteo TSV file to train on instead of synthetic data (each rank reads its part),
    #: and what to do with its malformed lines (``skip`` or ``error``).
    criteo: str = ""
    bad_lines: str = "skip"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise InvalidArgumentError(f"placement {self.placement!r}: known are {', '.join(PLACEMENTS)}")
        if self.placement == "block" and not self.directory:
            raise InvalidArgumentError("placement 'block' needs a directory for the table files")
        if (self.resume or self.checkpoint_every) and not self.checkpoint:
            raise InvalidArgumentError("resume and checkpoint_every need a checkpoint folder")
        if self.fast_bytes and self.placement != "cached":
            raise InvalidArgumentError(
                f"a fast budget plans the caches of placement 'cached'; placement {self.placement!r} "
                + ("keeps every row in DRAM" if self.placement == "dram" else "sizes its caches by --cache (not planned yet)")
            )
        if self.fast_bytes < 0 or self.profile_steps < 1:
            raise InvalidArgumentError(
                f"fast_bytes ({self.fast_bytes}) must be at least 0 and profile_steps ({self.profile_steps}) positive"
            )
        if self.criteo and len(self.config.rows) != 26:
            raise InvalidArgumentError(f"Criteo data has 26 categorical features; the model has {len(self.config.rows)} tables")
        if self.steps < 1 or self.timeout <= 0 or not 0 <= self.warmup < self.steps:
            raise InvalidArgumentError(
                f"steps ({self.steps}) and timeout ({self.timeout}) must be positive, warmup ({self.warmup}) below steps"
            )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["config"] = self.config.to_dict()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DistOptions:
        d = dict(d)
        d["config"] = DLRMConfig.from_dict(d["config"])
        d["die"] = tuple(d["die"]) if d.get("die") else None
        return cls(**d)


def _table_maker(o: DistOptions, rank: int, plan: ShardPlan) -> Any:
    c = o.config

    def make(s: Shard) -> EmbeddingTable:
        dim = s.width(c.dim)  # a column shard's share of the table's width
        rb = c.row_bytes * dim // c.dim
        if o.placement == "dram":
            m = Manager([("dram", s.rows * rb + (2 << 20))], policy="all_fast")
            return EmbeddingTable(s.rows, dim, dtype=c.dtype, manager=m)
        planned = plan.cache_of(s)
        cache = o.cache
        if o.placement == "block":
            # A block table reads a call's rows through its cache: it must hold the most rows
            # a global batch can touch in this shard.
            cache = max(cache, min(1.0, (c.batch_size * c.bag + 16) / s.rows))
        fast = int(s.rows * rb * cache) + 16 * s.rows + (4 << 20)
        if planned is not None:  # caches planned by the curves (placement cached)
            fast = meta_bytes([s.rows]) + int(cache_fast_bytes(s.rows, rb, planned.rows / s.rows)) + (4 << 20)
        if o.placement == "cached":
            m = Manager([("dram", fast), (SLOW, s.rows * rb + (2 << 20))], policy="all_fast")
            if planned is None:
                return EmbeddingTable(s.rows, dim, dtype=c.dtype, manager=m, device=1, cache=cache, policy="dynamic")
            share = TablePlan(s.rows, rb, planned.rows if planned.policy else 0, planned.policy, 0.0, 0.0)
            return EmbeddingTable(s.rows, dim, manager=m, placement=share.placement(1, c.dtype, SLACK_SHARE))
        d = os.path.join(o.directory, f"rank{rank}")
        os.makedirs(d, exist_ok=True)
        m = Manager([("dram", fast)], policy="all_fast")
        cols = f"-c{s.c0}-{s.c1}" if s.c1 else ""
        path = os.path.join(d, f"t{s.table}-r{s.lo}-{s.hi}{cols}.tmb")
        place = Placement(device=f"table:{path}", cache=cache, cacheslack=0.0, dtype=c.dtype)
        return EmbeddingTable(s.rows, dim, manager=m, placement=place)

    return make


def _profile(o: DistOptions, world: int) -> list[np.ndarray]:
    """Each table's row ids over the first ``profile_steps`` global batches (every rank
    reads the same, so every rank plans the same caches)."""
    if o.criteo:
        parts = [list(itertools.islice(_rank_batches(o, r, world, 0)[0], o.profile_steps)) for r in range(world)]
        batches = [Batch.concat(list(b)) for b in zip(*parts, strict=False)]
    else:
        c = o.config
        data = SyntheticData(c.rows, c.dense_features, c.batch_size, c.bag, dist=o.dist, seed=o.data_seed)
        batches = [data.batch(s) for s in range(o.profile_steps)]
    return profile_traces(batches, len(o.config.rows))


def _plan(o: DistOptions, world: int, traces: list[np.ndarray] | None) -> ShardPlan:
    """The shard plan, with caches planned from the profile's ``traces`` when given."""
    c = o.config
    plan = plan_shards(c.rows, c.dim, world, o.sharding)
    if traces is None:
        return plan
    costs = Costs.of(Manager([("dram", 1 << 20), (SLOW, 1 << 20)], policy="all_fast"), 0, 1)
    return plan_caches(plan, traces, [o.fast_bytes] * world, c.row_bytes, costs)


def _fill_static(plan: ShardPlan, emb: ShardedEmbeddings, traces: list[np.ndarray]) -> None:
    """Fill each planned ``static`` cache with its shard's most used rows of the profile."""
    for s, t in zip(emb.shards, emb.tables, strict=True):
        planned = plan.cache_of(s)
        if planned is None or planned.policy != "static":
            continue
        t.fill_cache_rows(hot_rows(shard_trace(traces[s.table], s), s.rows))


class _Dense(torch.nn.Module):
    """The model after the lookup, as DDP wraps it."""

    def __init__(self, model: DLRM) -> None:
        super().__init__()
        self.bottom, self.top = model.bottom, model.top
        self.model = [model]  # not a submodule: DDP must not see the embeddings

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.model[0].dense_forward(dense, emb)

    @staticmethod
    def state(m: _Dense, opt: torch.optim.Optimizer) -> dict[str, Any]:
        return {"model": m.state_dict(), "optimizer": opt.state_dict()}

    @staticmethod
    def load(m: _Dense, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        m.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])


#: A rank's training, run inside its process group: ``body(options, rank, world)``.
Body = Callable[["DistOptions", int, int], dict[str, Any]]


def train_rank(o: DistOptions, rank: int, world: int, init_method: str, body: Body | None = None) -> dict[str, Any]:
    """Train ``o.steps`` steps as rank ``rank`` of ``world``; returns the global loss of
    every step (the mean over every rank's samples) and this rank's time split. ``body``
    trains something else in the same process group (the TorchRec peer)."""
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=o.timeout)
    )
    try:
        return (body or _train)(o, rank, world)
    finally:
        # The model, DDP and the tables are gone (with _train's frame) before the group:
        # a process group torn down at interpreter exit instead can abort in gloo's threads.
        gc.collect()
        dist.destroy_process_group()


def _train(o: DistOptions, rank: int, world: int) -> dict[str, Any]:
    c = o.config
    if c.batch_size % world:
        raise InvalidArgumentError(f"the global batch of {c.batch_size} does not split evenly over {world} ranks")
    _agree(o, world)
    traces = _profile(o, world) if o.fast_bytes else None
    plan = _plan(o, world, traces)
    emb = ShardedEmbeddings(plan, _table_maker(o, rank, plan), lr=o.lr)
    model = DLRM(c, emb, seed=o.seed)
    if traces is not None:
        _fill_static(plan, emb, traces)  # after the model wrote the rows
    dense = DistributedDataParallel(_Dense(model))
    opt = torch.optim.SGD(model.dense_parameters(), lr=o.lr)
    loss_fn = torch.nn.BCELoss()
    first, position = 0, None
    if o.resume:
        saved = load_sharded(o.checkpoint, emb, c.to_dict())
        _Dense.load(dense.module, opt, saved["dense"])
        first = saved["step"]
        if o.criteo:
            if saved["data"] is None:
                raise InvalidArgumentError(
                    f"the checkpoint in {o.checkpoint!r} was saved by {saved['saved_world']} ranks, each at its own place "
                    f"in its part of {o.criteo!r}: a Criteo run resumes on as many ranks (this run has {world})"
                )
            position = int(saved["data"]["position"])
    losses, split = [], {"lookup": 0.0, "exchange": 0.0, "dense": 0.0, "update": 0.0}
    x = emb.traffic
    batches, reader = _rank_batches(o, rank, world, first, position)
    ran_out, saved_at = None, first
    for step in range(first, o.steps):
        if o.die is not None and o.die == (rank, step):
            os._exit(3)
        b = next(batches, None)
        if o.criteo and (ran_out := _first_out(b is None, world)) is not None:
            break
        assert b is not None  # synthetic data never runs out
        t0, x0 = time.perf_counter(), x.seconds
        e_out = emb(b.indices, b.offsets)
        t1, x1 = time.perf_counter(), x.seconds
        e = e_out.detach().requires_grad_()
        loss = loss_fn(dense(b.dense, e), b.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t2, x2 = time.perf_counter(), x.seconds
        e_out.backward(e.grad)
        t3, x3 = time.perf_counter(), x.seconds
        total = loss.detach().clone()
        dist.all_reduce(total)
        t4 = time.perf_counter()
        losses.append(float(total) / world)
        done = step + 1
        if o.checkpoint and (done == o.steps or (o.checkpoint_every and done % o.checkpoint_every == 0)):
            _save(o, emb, done, _Dense.state(dense.module, opt), reader)
            saved_at = done
        if step - first >= o.warmup:
            split["lookup"] += (t1 - t0) - (x1 - x0)
            split["exchange"] += (x1 - x0) + (x3 - x2) + (t4 - t3)  # and the loss's all-reduce
            split["dense"] += t2 - t1
            split["update"] += (t3 - t2) - (x3 - x2)
    done = first + len(losses)
    if o.checkpoint and ran_out is not None and saved_at != done:  # the data ran out: keep what was trained
        _save(o, emb, done, _Dense.state(dense.module, opt), reader)
    # Nobody tears its connections down while another rank still uses them.
    dist.barrier()
    timed = max(1, len(losses) - o.warmup)
    return {
        "rank": rank,
        "world": world,
        "first_step": first,
        "losses": losses,
        "data_ran_out": ran_out,
        "seconds": split,
        "seconds_per_iter": sum(split.values()) / timed,
        "timed_steps": timed,
        "traffic": x.as_dict(),
        "plan": plan.to_dict(),
    }


def _save(o: DistOptions, emb: ShardedEmbeddings, step: int, dense: dict[str, Any], reader: CriteoReader | None) -> None:
    """Every rank's checkpoint after ``step``, with its reader's position (where its next
    batch starts) when it reads a Criteo file."""
    data = {"position": reader.position} if reader is not None else None
    save_sharded(o.checkpoint, emb, step, o.config.to_dict(), dense, data)


def _rank_batches(
    o: DistOptions, rank: int, world: int, first: int, position: int | None = None
) -> tuple[Iterator[Batch], CriteoReader | None]:
    """This rank's batches from step ``first``: its share of each synthetic global batch, or
    its own Criteo batches (a local batch of ``batch_size / world`` from its part of the file,
    from byte ``position`` when resuming, parsed two ahead on a thread), and the reader."""
    c = o.config
    if o.criteo:
        lo, hi = line_ranges(o.criteo, world)[rank]
        if position is not None and not lo <= position <= hi:
            raise InvalidArgumentError(f"rank {rank}'s saved position {position} is outside its part {lo}..{hi} of {o.criteo!r}")
        start = lo if position is None else position
        r = CriteoReader(o.criteo, c.rows, c.batch_size // world, bad_lines=o.bad_lines, start=start, end=hi, prefetch=2)
        return iter(r), r
    data = SyntheticData(c.rows, c.dense_features, c.batch_size, c.bag, dist=o.dist, seed=o.data_seed)
    return (data.batch(s).shard(rank, world) for s in itertools.count(first)), None


def _first_out(out: bool, world: int) -> int | None:
    """The lowest rank whose data ran out this step (None: every rank has a batch). Every
    rank calls it at the same step, so all of them stop together."""
    flag = torch.tensor([dist.get_rank() if out else world], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return None if int(flag) == world else int(flag)


def _agree(o: DistOptions, world: int) -> None:
    """Every rank must run the same options: a mismatch is an error on every rank."""
    # Digests, not the options: all_gather_object would unpickle what peers send.
    mine = json.dumps({k: v for k, v in o.to_json().items() if k not in ("die", "directory")}, sort_keys=True)
    digest = torch.frombuffer(bytearray(hashlib.sha256(mine.encode()).digest()), dtype=torch.uint8)
    every = [torch.empty_like(digest) for _ in range(world)]
    dist.all_gather(every, digest)
    for r, theirs in enumerate(every):
        if not torch.equal(theirs, digest):
            raise InvalidArgumentError(
                f"rank {r}'s options differ from rank {dist.get_rank()}'s: every rank must train the same run"
            )


def write_result(path: str, res: dict[str, Any]) -> None:
    """Write a rank's result as JSON (atomically: temporary name, fsync, rename)."""
    write_json_atomic(path, res)


def exit_now(code: int = 0) -> None:
    """End a rank's process now, its output flushed, without running C++ static destructors
    (torch's and gloo's threads can abort the process while they run at exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _worker(rank: int, world: int, port: int, options: dict[str, Any], out: str, body: Body | None) -> None:
    torch.set_num_threads(1)
    res = train_rank(DistOptions.from_json(options), rank, world, f"tcp://127.0.0.1:{port}", body)
    if rank == 0:
        write_result(out, res)
    exit_now(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(o: DistOptions, nproc: int, body: Body | None = None) -> dict[str, Any]:
    """Run ``o`` on ``nproc`` local processes; returns rank 0's result. A rank's failure
    ends the others and raises ``torch.multiprocessing.ProcessRaisedException`` (or
    ``ProcessExitedException``) naming that rank, with its traceback. ``body`` (a
    module-level function: the ranks are spawned) trains instead of tiermem's ranks."""
    import torch.multiprocessing as mp

    if nproc < 1:
        raise InvalidArgumentError(f"--nproc must be at least 1, got {nproc}")
    with tempfile.TemporaryDirectory(prefix="tiermem-dist-") as d:
        out = os.path.join(d, "rank0.json")
        mp.start_processes(
            _worker, args=(nproc, _free_port(), o.to_json(), out, body), nprocs=nproc, join=True, start_method="spawn"
        )
        with open(out) as f:
            res: dict[str, Any] = json.load(f)
    return res


def single_process_losses(o: DistOptions, world: int = 1) -> list[float]:
    """The same run in one process, on the single-process trainer's model and step (for
    comparison with :func:`launch` over ``world`` processes, which sets a Criteo run's
    global batches; synthetic ones do not depend on it)."""
    from ..dlrm.trainer import Trainer

    c = o.config
    tr = Trainer(c, "all-fast", lr=o.lr, seed=o.seed)
    try:
        if o.criteo:  # the ranks' local batches side by side, in rank order
            parts = [_rank_batches(o, r, world, 0)[0] for r in range(world)]
            batches: Iterator[Batch] = (Batch.concat(list(b)) for b in zip(*parts, strict=False))
        else:
            data = SyntheticData(c.rows, c.dense_features, c.batch_size, c.bag, dist=o.dist, seed=o.data_seed)
            batches = (data.batch(s) for s in range(o.steps))
        return [tr.train_step(b)[0] for b in itertools.islice(batches, o.steps)]
    finally:
        tr.close()


def max_difference(a: list[float], b: list[float]) -> float:
    """Largest absolute difference of two loss curves of the same length."""
    if len(a) != len(b):
        raise InvalidArgumentError(f"loss curves of {len(a)} and {len(b)} steps")
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) if a else 0.0
