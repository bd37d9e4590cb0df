"""Training and inference of a :class:`~tiermem.dlrm.model.DLRM` in one placement mode,
timed per phase (thesis Fig. 5.12): embedding lookup, embedding update, dense compute.

Each iteration runs the lookup, then the dense forward and backward on a detached copy of
the pooled embeddings (so the embedding backward can be timed on its own) and the dense
optimizer step, then the embedding backward: for tiered tables the fused SGD update, for
``reference`` the sparse gradient plus ``torch.optim.SGD``. Arithmetic is the same as one
``loss.backward()``: every gradient comes from the weights before this iteration's steps.

Memory: the manager gets the fast budget (``dram``) and a slow device big enough for the
tables; the budget covers what the tables keep in fast memory (cache pages, the 2LM model's
cache and every table's DRAM metadata). Dense weights and activations are ordinary PyTorch
memory in every mode and are not modelled (the 2LM model sees embedding traffic only).

``block`` keeps the tables in files on the real disk (``--slow table:DIR``) behind DRAM
caches of the fast budget; a table too small for a cache that holds one batch's rows stays
in DRAM whole. It runs the prefetch pipeline (as do the dynamic caches of ``dynamic`` and
``auto`` with ``prefetch_memory``): while a step's dense part computes, a background thread
reads the next batch's missing rows into the caches, so its lookup hits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _tiermem, checkpoint
from .._files import remove_at_exit, remove_now
from .._sizes import available_memory, format_bytes
from ..embedding import EmbeddingTable, Placement
from ..embedding.block import admission
from ..embedding.block.traces import Trace
from ..embedding.cacheplan import (
    LOOKUP_POLICIES,
    SLOT_OVERHEAD,
    Costs,
    LookupChoice,
    TablePlan,
    cache_fast_bytes,
    hot_rows,
    lookup_policy,
    meta_bytes,
    plan_within,
)
from ..embedding.config import table_dir
from ..exceptions import InvalidArgumentError
from ..manager import Manager
from ..torch.embedding import tables_aside, tiered_tables
from ..twolm import TwoLmModel
from .data.batch import Batch
from .model import DLRM, DRAM_MODES, MODES, SLOW_MODES, DLRMConfig, ReferenceEmbeddings, TieredEmbeddings
from .peers import FbgemmEmbeddings

__all__ = ["Trainer", "RunResult", "fit_check", "available_memory", "profile_traces", "MODES"]

#: Cache slack as a share of the cache: the room a full dynamic table reclaims at a time
#: (whole pages, so at least one page: an eighth of a small cache, 2 MiB of a large one).
SLACK_SHARE = 0.15


def fit_check(config: DLRMConfig, fast_budget: int = 0) -> None:
    """Refuse, before anything is allocated, a model whose tables (plus the fast budget)
    cannot fit this machine's available memory: every mode keeps the rows in memory (plain
    process memory for ``reference``, a DRAM-backed slow device otherwise, reserved up front)."""
    need = config.table_bytes + fast_budget
    avail = int(available_memory() * 0.9)
    if avail and need > avail:
        raise InvalidArgumentError(
            f"the model's {config.num_tables} embedding tables need {format_bytes(config.table_bytes)} "
            f"({sum(config.rows):,} rows of {config.row_bytes} bytes), plus {format_bytes(fast_budget)} of fast "
            f"budget, but this machine's available memory is {format_bytes(avail)} (90 % of MemAvailable); "
            f"use a smaller scale"
        )


def _check_counts(iters: Any, warmup: Any, every: Any) -> None:
    for name, v, low in (("iters", iters, 1), ("warmup", warmup, 0), ("checkpoint_every", every, 0)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not low <= v <= 10**9:
            raise InvalidArgumentError(f"{name} must be an integer from {low} to 10**9, got {v!r}")


#: The block tables' I/O counters a run reports (:attr:`RunResult.disk_io`).
DISK_IO = ("blocks_read", "blocks_written", "write_requests", "rows_written")


@dataclass
class RunResult:
    """One mode's run: timings, losses, memory and traffic."""

    mode: str
    dist: str
    iters: int
    #: A training step (lookup + dense + update), the input pipeline excluded: the median
    #: over the timed iterations (``breakdown``: each phase's median).
    seconds_per_iter: float
    breakdown: dict[str, float]
    #: Time to produce each batch (synthetic generation or Criteo parsing), not in the step.
    data_seconds_per_iter: float
    #: Loss per iteration, warm-up included, and the trainer's own step time up to each.
    losses: list[float]
    loss_times: list[float]
    fast_budget: int
    fast_bytes_peak: int
    bytes: dict[str, dict[str, int]]
    bytes_counted: bool
    hit_rate: float | None
    devices: dict[str, str]
    twolm: dict[str, Any] | None = None
    queries_per_second: float | None = None
    #: Tables on the disk: over the timed iterations, the blocks read and written, the
    #: write requests (log chunks, compaction runs) and the rows written back.
    disk_io: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def profile_traces(profile: Iterable[Batch], tables: int) -> list[np.ndarray]:
    """Each table's row ids over the profile's batches, in access order (a profile for
    :mod:`tiermem.embedding.cacheplan`)."""
    batches = list(profile)
    return [np.concatenate([b.indices[t].numpy().reshape(-1) for b in batches]) for t in range(tables)]


def _tier_caches(config: DLRMConfig, budget: int) -> tuple[float, float]:
    """Cache fraction and slack fraction (of each table) that keep the cache pages (whole
    frames) plus every table's pointer table, slot metadata and reindex scratch within
    ``budget``."""
    rb = config.row_bytes
    meta = meta_bytes(config.rows)
    least = meta + sum(cache_fast_bytes(r, rb, 0.0) for r in config.rows)  # one cached row each
    if budget < least:
        raise InvalidArgumentError(
            f"a fast budget of {format_bytes(budget)} does not hold the tables' pointer tables and "
            f"one cached row each ({format_bytes(least)}); raise the budget"
        )
    total = min(1.0, (budget - meta) / (1.0 + SLOT_OVERHEAD / rb) / config.table_bytes)
    while total > 0:
        used = meta + sum(cache_fast_bytes(r, rb, total) for r in config.rows)
        if used <= budget:
            break
        total *= 0.995
    return total / (1.0 + SLACK_SHARE), total * SLACK_SHARE / (1.0 + SLACK_SHARE)


class Trainer:
    """A DLRM in one mode, its optimizers and its data.

    Args:
        config: the model.
        mode: one of ``MODES``.
        fast_budget: bytes of fast memory the tables may use (cache pages, the 2LM model's
            cache, DRAM metadata); default a quarter of the tables.
        slow: the slow device spec (default ``emulated:optane-pmem``); for ``block``,
            ``table:DIR`` (or ``block:DIR``), a directory on the disk for the table files (removed by
            :meth:`close`).
        lr: SGD learning rate of the dense layers and the tables (0.01, the DLRM reference's).
        seed: initial weights.
        dist: the input distribution's name (for reports).
        profile: for ``static``, a sample of the input (e.g. its first batches): the cache is
            filled, before training, with the rows this sample uses most, hottest first, then
            with rows in a scrambled order. Without it, ``static`` caches rows in a scrambled
            order only (the thesis's random static partition). For ``block``, how many rows
            a batch touches (which tables are too small for a cache of their share). For
            ``auto`` (required), the accesses whose hit-rate curves plan every table's cache;
            for ``dynamic``, those over which each table's cache is simulated to choose how
            it treats misses (cache each, cache a row's second miss, or read through; without
            a profile every table caches each miss).
        block_split: how mode ``block`` shares the budget between its block tables' caches:
            ``"curves"`` (with a profile: by each table's miniature caches, the sizes that
            save the most blocks read per byte first, every cache holding a batch's rows) or
            ``"even"`` (the same fraction of every table).
        prefetch_memory: run the prefetch pipeline for dynamic caches over memory too (block
            tables always run it): while a step's dense part computes, a background thread
            caches the next batch's missing rows. Off by default: where the copies and the
            slow device's waits take the cores the dense step needs (two cores, an emulated
            device), it costs more than it hides (see ARCHITECTURE.md).
    """

    def __init__(
        self,
        config: DLRMConfig,
        mode: str,
        *,
        fast_budget: int | None = None,
        slow: str = "emulated:optane-pmem",
        lr: float = 0.01,
        seed: int = 0,
        dist: str = "uniform",
        profile: Iterable[Batch] | None = None,
        prefetch_memory: bool = False,
        block_split: str = "curves",
    ) -> None:
        if mode not in MODES:
            raise InvalidArgumentError(f"mode {mode!r}: known are {', '.join(MODES)}")
        if config.dtype != "float32" and mode == "reference":
            raise InvalidArgumentError(
                "mode 'reference' trains float32 tables (torch's sparse SGD on bfloat16 rounds differently)"
            )
        if block_split not in admission.SPLITS:
            raise InvalidArgumentError(f"block_split {block_split!r}: known are {', '.join(admission.SPLITS)}")
        self.config, self.mode, self.lr, self.seed, self.dist = config, mode, float(lr), int(seed), dist
        self.block_split_mode = block_split
        #: Mode ``block`` with a profile: the budget's split over the block tables' caches
        #: by their miniature caches (None: an even split).
        self.block_split: admission.Split | None = None
        self.fast_budget = int(fast_budget if fast_budget is not None else config.table_bytes // 4)
        slow_cap = config.table_bytes + (2 << 20) * (config.num_tables + 1)  # room for alignment
        on_disk = mode == "block"
        directory = table_dir(slow)
        if (on_disk and directory is None) or (mode in SLOW_MODES and directory is not None):
            raise InvalidArgumentError(
                f"mode {mode!r} with --slow {slow!r}: mode 'block' keeps its tables in files on the disk "
                "(--slow table:DIR); the modes with a slow tier need a byte-addressable device (emulated:, numa:)"
            )
        fit_check(config, 0 if mode in ("all-slow", *DRAM_MODES) else self.fast_budget)
        self.manager: Manager | None = None
        self.twolm: TwoLmModel | None = None
        self.tables: list[EmbeddingTable] = []
        #: Table files of mode ``block`` (removed by :meth:`close`).
        self.files: list[str] = []
        self._prefetcher: threading.Thread | None = None
        self._prefetch_error: BaseException | None = None
        #: Mode ``auto``'s plan, one entry per table.
        self.cache_plan: list[TablePlan] = []
        #: Mode ``dynamic`` with a profile: per table, the policy its simulated cache
        #: chose (:func:`~tiermem.embedding.cacheplan.lookup_policy`) and what each did.
        self.lookup_choices: list[LookupChoice] = []
        #: Per table, whether mode ``dynamic`` reads through its cache (caching loses on
        #: the profile); empty for other modes or without a profile.
        self.bypass: list[bool] = []
        self._profile: list[Batch] | None = None
        emb: torch.nn.Module
        if mode == "reference":
            emb = ReferenceEmbeddings(config, lr)
        elif mode == "fbgemm":
            emb = FbgemmEmbeddings(config.rows, config.dim, lr)
        elif mode == "all-fast":
            self.manager = Manager([("dram", config.table_bytes + (2 << 20) * (config.num_tables + 1))], policy="all_fast")
            self.tables = [EmbeddingTable(r, config.dim, dtype=config.dtype, manager=self.manager) for r in config.rows]
            emb = TieredEmbeddings(self.tables, lr)
        elif on_disk:
            self.manager = Manager([("dram", self.fast_budget + (2 << 20) * (config.num_tables + 1))], policy="all_fast")
            self.tables = self._block_tables(directory or "", profile)
            emb = TieredEmbeddings(self.tables, lr)
        else:
            self.manager = self._manager(slow, slow_cap)
            self._profile = list(profile) if mode in ("auto", "dynamic", "tinylfu") and profile is not None else None
            self.tables = self._tables()
            emb = TieredEmbeddings(self.tables, lr)
        self.model = DLRM(config, emb, seed=seed)
        #: How the static cache was filled: "profile" or "scrambled" (None for other modes).
        self.static_fill: str | None = None
        if mode == "static":
            self._fill_static(profile)
        if mode == "auto":
            self._fill_static(self._profile, only=[p.policy == "static" for p in self.cache_plan])
        #: Tables the prefetch pipeline fills ahead: block tables, and with
        #: ``prefetch_memory`` dynamic caches over memory that are not bypassed.
        self.prefetching: list[EmbeddingTable] = [
            t
            for t in self.tables
            if t.path is not None
            or (prefetch_memory and (i := t.cache_info) is not None and i["policy"] in LOOKUP_POLICIES and not i["bypass"])
        ]
        self.embeddings = emb
        self.dense_optimizer = torch.optim.SGD(self.model.dense_parameters(), lr=lr)
        self.loss_fn = torch.nn.BCELoss()
        self.step = 0
        self.losses: list[float] = []
        #: Per iteration, this trainer's own step time so far (seconds).
        self.loss_times: list[float] = []
        self._own = 0.0

    # Placement -------------------------------------------------------------------------
    def _manager(self, slow: str, slow_cap: int) -> Manager:
        if slow.split(":")[0] not in ("emulated", "numa", "mapped", "dram"):
            raise InvalidArgumentError(f"slow device {slow!r}: tables need a byte-addressable device (emulated:, numa:, mapped:)")
        # Room for heap alignment; what the tables take is measured, not this capacity.
        fast = self.fast_budget + (2 << 20) * (self.config.num_tables + 1)
        return Manager([("dram", fast), (slow, slow_cap)], policy="all_fast")

    def _block_tables(self, directory: str, profile: Iterable[Batch] | None) -> list[EmbeddingTable]:
        """Block tables in ``directory`` with caches that share the fast budget; a table
        whose even share could not hold one batch's rows (the most a ``profile`` batch
        touched, with 5 % to spare; else ``batch_size * bag``) stays in DRAM whole, its bytes
        taken from the budget first. With a profile, the rest is split over the block
        tables' caches by their miniature caches' curves (:func:`tiermem.embedding.block.admission.split`,
        each at least a batch's rows; ``block_split="even"``: the same fraction of each)."""
        c, m = self.config, self.manager
        assert m is not None
        if not os.path.isdir(directory):
            raise InvalidArgumentError(f"--slow table:{directory}: no such directory (table files need one on the disk)")
        need = [c.batch_size * c.bag] * c.num_tables
        profile = list(profile) if profile is not None else None
        if profile is not None:
            seen = [0] * c.num_tables
            for b in profile:
                for t, idx in enumerate(b.indices):
                    seen[t] = max(seen[t], len(np.unique(idx.numpy())))
            need = [min(n, seen[t] * 21 // 20 + 16) for t, n in enumerate(need)]
        rb = c.row_bytes
        budget = self.fast_budget - meta_bytes(c.rows)  # pointer tables, bitmaps and reindex scratch
        if budget < 0:
            raise InvalidArgumentError(
                f"a fast budget of {format_bytes(self.fast_budget)} does not hold the tables' pointer tables "
                f"and reindex scratch ({format_bytes(meta_bytes(c.rows))}); raise --fast-budget"
            )
        dram: set[int] = set()
        while True:
            on_disk = [t for t in range(c.num_tables) if t not in dram]
            left = budget - sum(c.rows[t] * rb for t in dram)
            if left < 0 or not on_disk:
                break
            disk_bytes = sum(c.rows[t] * rb for t in on_disk)
            frac = min(1.0, left / (1.0 + SLOT_OVERHEAD / rb) / disk_bytes)
            while sum(cache_fast_bytes(c.rows[t], rb, frac) for t in on_disk) > left:
                frac *= 0.995
                if frac * max(c.rows[t] for t in on_disk) < 1:
                    frac = 0.0  # not one row each fits: every table is small
                    break
            small = {t for t in on_disk if frac * c.rows[t] < min(c.rows[t], need[t]) or frac >= 1.0}
            if not small:
                break
            dram |= small
        if budget - sum(c.rows[t] * rb for t in dram) < 0:
            raise InvalidArgumentError(
                f"a fast budget of {format_bytes(self.fast_budget)} cannot hold the {len(dram)} of {c.num_tables} "
                f"tables ({format_bytes(sum(c.rows[t] * rb for t in dram))}) whose cache share would not hold one "
                "batch's rows, so they stay in DRAM whole; raise --fast-budget"
            )
        on_disk = [t for t in range(c.num_tables) if t not in dram]
        fracs = dict.fromkeys(on_disk, frac)
        if profile and on_disk and 0.0 < frac < 1.0 and self.block_split_mode == "curves":
            fracs = self._split_block_caches(profile, on_disk, need, budget - sum(c.rows[t] * rb for t in dram))
        tag = f"dlrm-{os.getpid()}-{id(self):x}"
        tables = []
        for t, r in enumerate(c.rows):
            if t in dram:
                tables.append(EmbeddingTable(r, c.dim, dtype=c.dtype, manager=m))
                continue
            path = os.path.join(directory, f"{tag}-t{t}.tmb")
            self.files.append(path)
            remove_at_exit(path)  # scratch: gone at exit on every path (Ctrl-C, an error, --checkpoint)
            tables.append(
                EmbeddingTable(
                    r,
                    c.dim,
                    manager=m,
                    placement=Placement(device=f"table:{path}", cache=fracs[t], cacheslack=0.0, dtype=c.dtype),
                )
            )
        return tables

    def _split_block_caches(self, profile: list[Batch], on_disk: list[int], need: list[int], left: int) -> dict[int, float]:
        """Cache fractions of the block tables ``on_disk`` from their miniature caches over
        the profile (:func:`tiermem.embedding.block.admission.split`, lookup calls of a batch each, floors
        ``need``), shrunk until their pages (whole frames) and slots fit ``left`` bytes."""
        c = self.config
        rb = c.row_bytes
        traces = [
            Trace(np.arange(0, len(tr) + 1, c.bag, dtype=np.int64), tr, c.rows[t])
            for t, tr in ((t, np.concatenate([b.indices[t].numpy() for b in profile]).astype(np.int64)) for t in on_disk)
        ]
        geometry = _tiermem.block_geometry(c.dim, c.dtype)
        sp = admission.split(
            traces,
            rows_per_block=int(geometry["rows_per_block"]),
            row_bytes=rb,
            budget=left,
            floors=[min(c.rows[t], need[t]) for t in on_disk],
            batch=c.batch_size,
        )
        self.block_split = sp
        rows = dict(zip(on_disk, sp.cache_rows))
        scale = 1.0
        while sum(cache_fast_bytes(c.rows[t], rb, rows[t] * scale / c.rows[t]) for t in on_disk) > left:
            scale *= 0.995  # whole frames round each cache up
            if scale < 1e-3:  # the even split fit, so this cannot happen; say so if it does
                raise InvalidArgumentError(
                    f"the block tables' caches ({sum(rows.values())} rows) do not fit the {format_bytes(left)} left of "
                    "the fast budget; raise --fast-budget or pass --block-split even"
                )
        return {t: min(1.0, rows[t] * scale / c.rows[t]) for t in on_disk}

    def close(self) -> None:
        """Release the tables and remove mode ``block``'s table files."""
        self._join_prefetch()
        self.tables = []
        self.prefetching = []
        self.embeddings = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
        import gc

        gc.collect()
        for f in self.files:
            remove_now(f)
        self.files = []

    def _prefetch(self, b: Batch) -> None:
        try:
            for t, idx in zip(self.tables, b.indices):
                if any(t is p for p in self.prefetching):
                    t.prefetch(idx.numpy())
        except BaseException as e:  # handed to the training thread by _join_prefetch
            self._prefetch_error = e

    def _join_prefetch(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.join()
            self._prefetcher = None
        if self._prefetch_error is not None:
            e, self._prefetch_error = self._prefetch_error, None
            raise e

    def _tables(self) -> list[EmbeddingTable]:
        c, m = self.config, self.manager
        assert m is not None
        rows = c.rows
        if self.mode == "all-slow":
            return [EmbeddingTable(r, c.dim, dtype=c.dtype, manager=m, device=1) for r in rows]
        if self.mode == "2lm-model":
            # The tags (4 bytes per line) and every table's reindex scratch come out of the budget.
            meta = 4 * sum(rows)
            cache = (self.fast_budget - meta) * 64 // 68
            if cache < 64:
                raise InvalidArgumentError(f"a fast budget of {format_bytes(self.fast_budget)} leaves no room for a 2LM cache")
            self.twolm = TwoLmModel(m, cache_bytes=cache)
            return [EmbeddingTable(r, c.dim, dtype=c.dtype, manager=m, model=self.twolm) for r in rows]
        if self.mode == "auto":
            return self._auto_tables()
        frac, slack = _tier_caches(c, self.fast_budget)
        policies = [self.mode] * len(rows)
        if self.mode in ("dynamic", "tinylfu") and self._profile:
            self._choose_lookup_policies(frac, slack, LOOKUP_POLICIES if self.mode == "dynamic" else ("tinylfu",))
            policies = [ch.policy or self.mode for ch in self.lookup_choices]
        # A table its simulated cache says to read through gets no cache at all: it reads
        # its rows where they live, as all-slow's do, with no pointer table in the way.
        through = [ch.policy is None for ch in self.lookup_choices] or [False] * len(rows)
        return [
            EmbeddingTable(r, c.dim, dtype=c.dtype, manager=m, device=1)
            if bypass
            else EmbeddingTable(
                r, c.dim, manager=m, placement=Placement(device=1, cache=frac, cacheslack=slack, policy=p, dtype=c.dtype)
            )
            for r, p, bypass in zip(rows, policies, through)
        ]

    def _auto_tables(self) -> list[EmbeddingTable]:
        """Mode ``auto``: the fast budget (less every table's pointer table and reindex
        scratch) split by :func:`tiermem.embedding.cacheplan.plan` over the profile."""
        c, m, prof = self.config, self.manager, self._profile
        assert m is not None
        if not prof:
            raise InvalidArgumentError("mode 'auto' plans each table's cache from a profile of the input: pass profile=")
        traces = profile_traces(prof, c.num_tables)
        plans = plan_within(traces, c.rows, [c.row_bytes] * c.num_tables, self.fast_budget, Costs.of(m, 0, 1))
        self.cache_plan = plans
        return [
            EmbeddingTable(r, c.dim, manager=m, placement=p.placement(1, c.dtype, SLACK_SHARE)) for r, p in zip(c.rows, plans)
        ]

    def _choose_lookup_policies(self, frac: float, slack: float, policies: Sequence[str]) -> None:
        """Modes ``dynamic`` and ``tinylfu``: each table's way with misses (one of
        ``policies``: for ``dynamic`` cache every one or cache a row on its second miss, for
        ``tinylfu`` its sketch's admission; or no cache where caching loses: the table then
        reads its rows where they live) from its own cache simulated over the profile
        (:func:`tiermem.embedding.cacheplan.lookup_policy`)."""
        assert self.manager is not None and self._profile
        c = self.config
        costs = Costs.of(self.manager, 0, 1)
        for t, r in enumerate(c.rows):
            calls = [b.indices[t].numpy() for b in self._profile]
            lower, room = int(r * frac), int(r * slack)
            self.lookup_choices.append(
                lookup_policy(calls, r, max(1, lower + room), min(room, lower + room), c.row_bytes, costs, policies=policies)
            )
        self.bypass = [ch.policy is None for ch in self.lookup_choices]

    def _fill_static(self, profile: Iterable[Batch] | None, only: list[bool] | None = None) -> None:
        traces = profile_traces(profile, len(self.tables)) if profile is not None else None
        for t, tab in enumerate(self.tables):
            if only is not None and not only[t]:
                continue
            if traces is not None:
                tab.fill_cache_rows(hot_rows(traces[t], self.config.rows[t]))
            tab.fill_cache(self.seed + t)
        self.static_fill = "profile" if traces is not None else "scrambled"

    def fast_bytes(self) -> int:
        """Fast memory the tables hold now: the manager's fast device in use plus DRAM
        metadata (``reference``: every row)."""
        if self.manager is None:
            return self.config.table_bytes
        used = self.manager.usage()["dram"]["peak"]
        meta = sum(t._native.metadata_bytes for t in self.tables)
        if self.twolm is not None:
            meta += self.twolm._native.metadata_bytes
        return int(used + meta)

    # Training --------------------------------------------------------------------------
    def train_step(self, b: Batch, nxt: Batch | None = None) -> tuple[float, float, float, float]:
        """One iteration; returns (loss, lookup s, dense s, update s). With ``nxt`` (the
        next batch) the prefetching tables start reading its rows once this lookup is done."""
        t0 = time.perf_counter()
        self._join_prefetch()
        emb = self.embeddings(b.indices, b.offsets)
        if nxt is not None and self.prefetching:
            self._prefetcher = threading.Thread(target=self._prefetch, args=(nxt,), name="tiermem-prefetch", daemon=True)
            self._prefetcher.start()
        t1 = time.perf_counter()
        e = emb.detach().requires_grad_()
        p = self.model.dense_forward(b.dense, e)
        loss = self.loss_fn(p, b.labels)
        self.dense_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.dense_optimizer.step()
        t2 = time.perf_counter()
        emb.backward(e.grad)
        self.embeddings.step()
        t3 = time.perf_counter()
        self.step += 1
        v = float(loss.detach())
        self.losses.append(v)
        return v, t1 - t0, t2 - t1, t3 - t2

    def begin_timing(self) -> None:
        """Start the timed part of a run: zero the counters and the per-iteration times."""
        if self.manager is not None:
            self.manager.reset_stats()
        for t in self.tables:
            t.reset_stats()
        if self.twolm is not None:
            self.twolm.reset_stats()
        self._disk0 = self._disk_io()
        self._timed: list[tuple[float, float, float, float]] = []

    def _disk_io(self) -> dict[str, int]:
        """The block tables' I/O so far: :data:`DISK_IO` counters, summed."""
        infos = [i for t in self.tables if (i := t.block_info) is not None]
        return {k: sum(int(i[k]) for i in infos) for k in DISK_IO}

    def run_iteration(self, b: Batch, *, timed: bool, data_seconds: float = 0.0, nxt: Batch | None = None) -> float:
        """One training step on ``b`` (``nxt``: the next batch, for the prefetch pipeline);
        its phase times are kept when ``timed`` (after :meth:`begin_timing`). Returns the
        loss. For running several trainers in lockstep.

        The step's prefetch of ``nxt`` is waited for before it returns, and the wait counts
        as lookup time: the prefetch overlaps this step's own dense and update work only, not
        another trainer's step in lockstep (whose time it would otherwise take a core from)
        nor time outside the step."""
        loss, lk, dn, up = self.train_step(b, nxt)
        w0 = time.perf_counter()
        self._join_prefetch()
        lk += time.perf_counter() - w0
        self._own += lk + dn + up
        self.loss_times.append(self._own)
        if timed:
            self._timed.append((lk, dn, up, data_seconds))
        return loss

    def train(
        self,
        batches: Iterable[Batch],
        iters: int,
        *,
        warmup: int = 0,
        on_step: Callable[[int, float], None] | None = None,
        checkpoint: str | None = None,
        checkpoint_every: int = 0,
        data_state: Callable[[], dict[str, Any]] | None = None,
    ) -> RunResult:
        """Run ``warmup`` then ``iters`` timed iterations from ``batches``.

        ``checkpoint``: a path written every ``checkpoint_every`` iterations, at the end,
        and when interrupted (then the interrupt is raised again). ``data_state()`` describes
        the data source (e.g. a reader's position); it is called right after each batch is
        drawn, and a checkpoint records its value after the last batch a finished step
        consumed."""
        _check_counts(iters, warmup, checkpoint_every)
        it: Iterator[Batch] = iter(batches)
        start = len(self.losses)
        self._seen = 0
        # The data state after the last batch a finished step consumed: tables that prefetch read
        # the next batch ahead (the prefetch pipeline), so the iterator's own state runs one
        # batch ahead of the steps taken and a checkpoint must not record that.
        done = data_state() if data_state else None
        try:
            b: Batch | None = None
            after_b = done
            for k in range(warmup + iters):
                if k == warmup:
                    self.begin_timing()
                t0 = time.perf_counter()
                if b is None:
                    b = next(it, None)
                    if b is None:
                        break
                    after_b = data_state() if data_state else None
                nxt = next(it, None) if self.prefetching and k + 1 < warmup + iters else None
                after_nxt = data_state() if data_state and nxt is not None else None
                self._seen += 1
                loss = self.run_iteration(b, timed=k >= warmup, data_seconds=time.perf_counter() - t0, nxt=nxt)
                done, b, after_b = after_b, nxt, after_nxt
                if on_step:
                    on_step(k, loss)
                if checkpoint and checkpoint_every and self.step % checkpoint_every == 0:
                    self.save(checkpoint, done)
        except KeyboardInterrupt:
            if checkpoint:
                self.save(checkpoint, done)
            raise
        if checkpoint:
            self.save(checkpoint, done)
        return self.result(start)

    def infer(self, batches: Iterable[Batch], iters: int, warmup: int = 1) -> RunResult:
        """Forward passes only; reports queries (samples) per second."""
        _check_counts(iters, warmup, 0)
        it = iter(batches)
        n = 0
        self._seen = 0
        with torch.no_grad():
            for k in range(warmup + iters):
                if k == warmup:
                    self.begin_timing()
                d = time.perf_counter()
                try:
                    b = next(it)
                except StopIteration:
                    break
                self._seen += 1
                a = time.perf_counter()
                emb = self.embeddings(b.indices, b.offsets)
                c = time.perf_counter()
                self.model.dense_forward(b.dense, emb)
                if k >= warmup:
                    self._timed.append((c - a, time.perf_counter() - c, 0.0, a - d))
                    n += b.size
        r = self.result(len(self.losses))
        r.queries_per_second = n / (r.seconds_per_iter * r.iters)
        return r

    def result(self, first_loss: int = 0) -> RunResult:
        """The timed iterations since :meth:`begin_timing` (medians per phase, robust to
        the machine's noise) with the losses from ``first_loss`` on."""
        rows = np.array(getattr(self, "_timed", []), dtype=float).reshape(-1, 4)
        done = len(rows)
        if done == 0:
            seen = getattr(self, "_seen", 0)
            if seen == 0:
                raise InvalidArgumentError(
                    "no iteration ran: the data gave no batch at all (an empty input, or "
                    "one with no valid line or fewer samples than one batch)"
                )
            raise InvalidArgumentError(
                f"no timed iteration ran: the data ran out after {seen} batches, "
                "all spent on warm-up iterations (lower --warmup or give more data)"
            )
        med = np.median(rows, axis=0)
        c = self.config
        devices: dict[str, str] = {}
        bytes_: dict[str, dict[str, int]] = {}
        disk_io: dict[str, int] | None = None
        hit = None
        if self.manager is None:
            devices["dram"] = "real"
            bytes_["dram"] = self._reference_bytes(done)
            counted = False
        else:
            for d in self.manager.devices:
                devices[d["name"]] = d["real"]
            for name, s in self.manager.stats().items():
                bytes_[name] = {"read": int(s["bytes_read"]), "written": int(s["bytes_written"])}
            counted = True
            self._join_prefetch()
            if self.files:
                now, then = self._disk_io(), getattr(self, "_disk0", dict.fromkeys(DISK_IO, 0))
                disk_io = {k: now[k] - then[k] for k in DISK_IO}
                devices["disk"] = "real"
                blk = _tiermem.block_geometry(self.config.dim, self.config.dtype)["block_bytes"]
                bytes_["disk"] = {"read": blk * disk_io["blocks_read"], "written": blk * disk_io["blocks_written"]}
            st = [t.stats() for t in self.tables]
            h, m = sum(s["hits"] for s in st), sum(s["misses"] for s in st)
            hit = h / (h + m) if h + m else None
        return RunResult(
            mode=self.mode,
            dist=self.dist,
            iters=done,
            seconds_per_iter=float(np.median(rows[:, :3].sum(axis=1))),
            breakdown={"lookup": float(med[0]), "dense": float(med[1]), "update": float(med[2])},
            data_seconds_per_iter=float(med[3]),
            losses=self.losses[first_loss:],
            loss_times=self.loss_times[first_loss:],
            fast_budget=self.fast_budget if self.mode != "reference" else c.table_bytes,
            fast_bytes_peak=self.fast_bytes(),
            bytes=bytes_,
            bytes_counted=counted,
            hit_rate=hit,
            devices=devices,
            twolm=self.twolm.stats() if self.twolm is not None else None,
            disk_io=disk_io,
        )

    def _reference_bytes(self, iters: int) -> dict[str, int]:
        # torch does not count its traffic: what the lookups and the sparse update must
        # move at least (every index's row read; each distinct row read and written).
        c = self.config
        per = c.batch_size * c.bag * c.num_tables * c.row_bytes
        return {"read": 2 * per * iters, "written": per * iters}

    # Checkpoints -----------------------------------------------------------------------
    def save(self, path: str, data_state: dict[str, Any] | None = None) -> None:
        """Write a checkpoint (:mod:`tiermem.checkpoint`): atomically, checksummed, tiered
        tables streamed from their tier to the file, block tables' files snapshotted beside
        it."""
        with tables_aside():
            model_state = self.model.state_dict()
        state = {
            "format": "tiermem-dlrm-2",
            "config": self.config.to_dict(),
            "mode": self.mode,
            "step": self.step,
            "losses": list(self.losses),
            "loss_times": list(self.loss_times),
            "model": model_state,
            "dense_optimizer": self.dense_optimizer.state_dict(),
            "data": data_state or {},
            "lr": self.lr,
            "seed": self.seed,
        }
        checkpoint.save(path, state, tiered_tables(self.model))

    def load(self, path: str) -> dict[str, Any]:
        """Restore weights, optimizer state, step and losses; returns the saved data state.
        Every checksum is checked before anything is restored; a damaged, truncated, foreign
        or other-model file is a :class:`~tiermem.checkpoint.CheckpointError` naming it."""
        ck = checkpoint.Checkpoint(path)
        state = ck.state()
        if not isinstance(state, dict) or state.get("format") != "tiermem-dlrm-2":
            raise checkpoint.CheckpointError(f"checkpoint {path!r} is not a tiermem DLRM checkpoint")
        saved = DLRMConfig.from_dict(state["config"])
        if saved != self.config:
            raise checkpoint.CheckpointError(
                f"checkpoint {path!r} is of another model ({saved.name}: {saved.num_tables} tables, "
                f"dim {saved.dim}); this run's is {self.config.num_tables} tables, dim {self.config.dim}"
            )
        tables = tiered_tables(self.model)
        if sorted(tables) != sorted(ck.tables()):
            raise checkpoint.CheckpointError(
                f"checkpoint {path!r} holds tables {sorted(ck.tables())}, this model {sorted(tables)} "
                f"(saved in mode {state.get('mode')!r}, this run is {self.mode!r})"
            )
        with tables_aside():
            self.model.load_state_dict(state["model"])
        for name, t in tables.items():
            ck.restore_table(name, t)
        self.dense_optimizer.load_state_dict(state["dense_optimizer"])
        self.step = int(state["step"])
        self.losses = list(state["losses"])
        self.loss_times = list(state.get("loss_times") or [0.0] * len(self.losses))
        self._own = self.loss_times[-1] if self.loss_times else 0.0
        return dict(state.get("data") or {})
