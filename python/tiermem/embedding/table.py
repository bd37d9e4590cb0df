"""An embedding table in tiered memory, and the NumPy-level normalisation of bags."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _tiermem
from .._tiermem import PLACES
from ..exceptions import IndexOutOfRangeError, InvalidArgumentError
from ..manager import Manager
from .config import Placement, access_counts, row_stride

__all__ = ["EmbeddingTable", "as_bags"]


def _i64(a: Any, what: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what} must be integers, not {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def as_bags(indices: Any, offsets: Any = None, include_last_offset: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Normalise bags to ``(values, offsets)`` int64 arrays with ``len(offsets) == bags + 1``.

    ``indices`` may be 2-D ``(bags, bag_size)`` with ``offsets=None`` (fixed-size bags), or
    1-D with ``offsets`` as ``torch.nn.EmbeddingBag`` takes them."""
    values = _i64(indices, "indices")
    if values.ndim == 2:
        if offsets is not None:
            raise InvalidArgumentError("offsets must be None when indices is 2-D (bags x bag size)")
        b, n = values.shape
        return values.reshape(-1), np.arange(b + 1, dtype=np.int64) * n
    if values.ndim != 1:
        raise InvalidArgumentError(f"indices must be 1-D or 2-D, not {values.ndim}-D")
    if offsets is None:
        raise InvalidArgumentError("offsets has to be a 1-D array when indices is 1-D (the start of each bag)")
    offs = _i64(offsets, "offsets")
    if offs.ndim != 1:
        raise InvalidArgumentError(f"offsets must be 1-D, not {offs.ndim}-D")
    if not include_last_offset:
        offs = np.append(offs, np.int64(len(values)))
    return values, offs


def _private_devices(spec: str, table_bytes: int, place: Placement) -> list[tuple[str, int]]:
    """The devices of a table's private manager (sized in the core:
    ``tiermem_embed::table::private_devices``)."""
    cache = None if place.cache is None else (float(place.cache), float(place.cacheslack))
    return _tiermem.table_private_devices(spec, table_bytes, cache)


def _f32(a: Any, what: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind != "f":
        raise InvalidArgumentError(f"{what} must be floating point, not {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


class EmbeddingTable:
    """An embedding table in tiered memory.

    Args:
        num_embeddings: rows.
        embedding_dim: elements per row (16, 32, 64, 128 and 256 have kernels specialised
            at compile time; any width works).
        placement: a :class:`~tiermem.embedding.config.Placement`: the rows' home (a
            device, a table file ``table:PATH`` or a plain file ``file:PATH``), the cache in
            front of it (size, slack, policy, admission) and the storage type. The loose
            keywords below build one when it is not given (not both).
        manager: the :class:`~tiermem.Manager` whose devices hold the rows. If omitted, a
            private manager is made: ``dram`` plus ``device`` when that is another spec.
        padding_idx: a row left out of every reduction (and of a mean's count) and never
            updated, as ``torch.nn.EmbeddingBag``'s; negative counts from the end.
        model: a :class:`~tiermem.twolm.TwoLmModel`: the rows go on its slow device and every
            access runs through the model of the hardware DRAM cache (the ``2lm-model``
            baseline; ``manager`` defaults to the model's, ``device`` and ``cache`` must be
            left out).
        dtype, device, cache, cacheslack, policy, admission, depth: the
            :class:`~tiermem.embedding.config.Placement` settings of those names. ``device``
            is a device name or index of ``manager`` (default: the fastest device, or the
            slowest one when ``cache`` is given), a device spec without a manager,
            ``"table:PATH"`` (``"block:PATH"`` is its older name: a table file on the disk,
            created if missing and re-attached if it exists, its rows and the optimizer
            state its companion ``PATH.optim`` holds coming back with it; the shape must
            match, else an error names both) or ``"file:PATH"`` (a plain file of rows, read
            with buffered I/O; one tiermem did not make opens only read-only). A table in a
            file needs ``cache``; its cache pages go on the manager's fastest device.
            ``admission`` is what such a cache does with the other rows of a block it reads
            (Bandana §4.3): ``"row"`` (none: the baseline), ``"row:T"`` (none, and a row
            asked for that was seen in at most T queries of the layout's trace goes in
            unmarked, so the next reclaim drops it unless it is hit again), ``"block"``
            (all), ``"threshold:T"`` (rows seen in more than T queries, see
            :meth:`set_access_counts`) or ``"shadow:M"`` (rows in a shadow cache of M times
            the cache's size). ``depth``: a table file's reads in flight (default: the best
            depth ``tiermem calibrate`` found, else 16).

    Raises:
        InvalidArgumentError: bad sizes, dtype, policy or cache fraction; rows or a cache
            larger than their device; a cache with nowhere slower for the base rows.
        DeviceFullError: the device has no contiguous room left for the rows or the cache.
        CorruptFileError: a block table's existing file is damaged, truncated or not a
            table file (it is never overwritten).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        placement: Placement | None = None,
        manager: Manager | None = None,
        padding_idx: int | None = None,
        model: Any = None,
        dtype: str | None = None,
        device: str | int | None = None,
        cache: float | None = None,
        cacheslack: float | None = None,
        policy: str | None = None,
        admission: str | None = None,
        depth: int | None = None,
    ) -> None:
        for name, v in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
        loose: dict[str, Any] = {
            "dtype": dtype,
            "device": device,
            "cache": cache,
            "cacheslack": cacheslack,
            "policy": policy,
            "admission": admission,
            "depth": depth,
        }
        given = {k: v for k, v in loose.items() if v is not None}
        if placement is not None and given:
            raise InvalidArgumentError(f"pass the placement's settings in placement=, not also as {sorted(given)}")
        place = (placement if placement is not None else Placement(**given)).validate()
        dt = place.storage_dtype
        assert dt is not None, "validate() refuses unknown dtypes"
        rows, width = int(num_embeddings), int(embedding_dim)
        stride = row_stride(width, dt)
        table_bytes = rows * stride
        if model is not None:
            if place.home != "memory":
                raise InvalidArgumentError(f"a table in a file lives in its file, not behind the 2LM model ({place.path})")
            if place.cache is not None or place.device is not None:
                raise InvalidArgumentError(
                    "a table behind the 2LM model lives on the model's slow device: leave cache and device out"
                )
            if manager is not None and manager is not model.manager:
                raise InvalidArgumentError("the 2LM model belongs to another manager")
            manager = model.manager
        #: The :class:`~tiermem.embedding.config.Placement` it was built with.
        self.settings = place
        #: A table file's path (``table:``/``file:`` homes), or ``None``.
        self.path: str | None = place.path
        #: Whether the table's file existed (its rows, and a table file's optimizer state,
        #: re-attached).
        self.attached = False
        #: The 2LM model in front of the rows, if any.
        self.model = model
        self.cache_fraction = place.cache
        cache_spec = place.cache_spec(table_bytes, stride)
        if place.path is not None:
            path = place.path
            if manager is None:
                assert cache_spec is not None, "validate() requires a cache for a file home"
                need = min(cache_spec["lower"] + cache_spec["slack"], table_bytes)
                manager = Manager([("dram", max(need + (4 << 20), 1 << 20))], policy="all_fast")
            self.attached = os.path.lexists(path)
            home: dict[str, Any] = {
                "kind": "block" if place.home == "table" else "file",
                "path": path,
                "name": os.path.basename(path) or path,
                "attach": self.attached,
                "depth": place.depth,
                "read_only": place.read_only,
            }
            #: ``dynamic``/``static``/``admit`` (cached), ``block`` (a table file), ``file``
            #: (a plain file), ``simple`` (direct on a slower device than the manager's
            #: fastest, or on a non-DRAM spec), ``direct`` or ``2lm-model``.
            self.policy = "block" if place.home == "table" else "file"
        else:
            if place.cache is not None and manager is None and place.device in (None, "dram"):
                raise InvalidArgumentError(
                    "a cached table keeps its base rows on a slower device: pass device= a spec such as "
                    "'numa:1' or 'emulated:optane-pmem', or a manager with more than one device"
                )
            private_slow = False
            dev_arg = place.device
            if manager is None:
                spec = "dram" if dev_arg is None else str(dev_arg)
                private_slow = spec != "dram"
                manager = Manager(_private_devices(spec, table_bytes, place), policy="all_fast")
                dev_arg = len(manager.device_names) - 1
            if dev_arg is None:
                dev_arg = len(manager.device_names) - 1 if place.cache is not None else 0
            dev = manager._place(dev_arg) if not isinstance(dev_arg, int) else dev_arg
            if dev == PLACES["slow"]:
                dev = len(manager.device_names) - 1
            elif dev < 0:  # fast, or auto: the fastest device
                dev = 0
            if cache_spec is not None and dev == 0:
                raise InvalidArgumentError("a cached table needs its base rows on a slower device than the cache (device 0)")
            home = {"kind": "model", "model": model._native} if model is not None else {"kind": "memory", "device": dev}
            on_slow = dev != 0 or private_slow
            self.policy = place.policy if cache_spec is not None else ("simple" if on_slow else "direct")
            if model is not None:
                self.policy = "2lm-model"
        self.manager = manager
        self._native = _tiermem.Table.new(manager._native, (rows, width, dt), home, cache_spec)
        if padding_idx is not None:
            self._set_padding(padding_idx)

    def _set_padding(self, padding_idx: int) -> None:
        rows = self.num_embeddings
        if not -rows <= int(padding_idx) < rows:
            raise InvalidArgumentError(f"padding_idx {padding_idx} is outside -{rows}..{rows - 1}")
        self._native.set_padding_idx(int(padding_idx) % rows)

    @property
    def trained_with(self) -> str | None:
        """The optimizer the rows were last updated with; for a re-attached block table, the
        one its file's optimizer companion (``PATH.optim``) records. ``None`` before any
        update."""
        return self._native.trained_with()

    def reset_optimizer(self) -> None:
        """Forget the optimizer's state and step count (rows re-initialised, or a switch to
        another optimizer on purpose: a re-attached table refuses updates by another
        optimizer until this is called)."""
        self._native.reset_optimizer()

    # Block tables --------------------------------------------------------------------
    @property
    def block_info(self) -> dict[str, Any] | None:
        """A block table's file, layout generation, admission, queue depth and I/O
        counters (accesses, misses, blocks read, rows prefetched, rows and blocks written,
        rows waiting to be written); ``None`` for other tables."""
        info = self._native.block_info()
        return None if info is None else dict(info)

    @property
    def file_info(self) -> dict[str, Any] | None:
        """A ``file:`` table's path, whether it is read-only, and its I/O counters
        (accesses, misses, rows read, read requests, rows written, rows waiting to be
        written); ``None`` for other tables."""
        info = self._native.file_info()
        return None if info is None else dict(info)

    def sync(self) -> None:
        """Write a block table's updated rows to its file and make it durable (no-op for
        other tables). Closing or dropping the table writes them back too."""
        self._native.sync()

    def snapshot(self, path: str) -> dict[str, Any]:
        """Copy a block table's file to ``path``: its updated rows are written back and
        synced first, then the file is copied whole by the kernel (a reflink, instant and
        copy-on-write, where the filesystem offers one; otherwise an in-kernel copy), under
        the table's lock. ``path`` appears whole or not at all. Returns ``{"how": "reflink" |
        "copy", "generation": layout generation, "bytes": file size}``; a checkpoint records
        this instead of the rows (:mod:`tiermem.checkpoint`).

        Raises:
            InvalidArgumentError: not a block table.
            DeviceIOError: the copy failed (e.g. a full disk); nothing is left at ``path``.
        """
        if self.path is None:
            raise InvalidArgumentError("only a block table has a file to snapshot")
        how, generation = self._native.snapshot(os.fspath(path))
        return {"how": how, "generation": int(generation), "bytes": os.path.getsize(path)}

    def prefetch(self, indices: Any) -> int:
        """Read the rows ``indices`` (any shape of integers) will look up into the cache
        now, so that lookup only hits: the prefetch pipeline calls this with the next batch
        while the current step computes. A block table stages them; a ``dynamic`` cache over
        memory makes room (keeping the cached ones of these rows, and a slack's worth more,
        so the lookup reclaims nothing) and caches them marked. Returns the distinct rows
        that were missing; 0 (and nothing done) for direct tables and for caches that do not
        cache on lookup (``static``), admit on a second miss (``admit``), are bypassed or
        hold every row in place.

        Raises:
            IndexOutOfRangeError: an index outside the table (nothing is read then).
        """
        return int(self._native.prefetch(np.ascontiguousarray(_i64(indices, "indices").reshape(-1))))

    def relayout(self, layout: Any, budget: int = 256 << 20, on_progress: Callable[[int, int], None] | None = None) -> None:
        """Put a block table's rows in ``layout``'s order (row -> position, a permutation,
        e.g. from :mod:`tiermem.embedding.block.layout`): updated rows are written back, the file is
        rewritten aside in chunks of at most ``budget`` bytes and switched in atomically
        (a kill at any moment leaves the old file or the new one, whole). Cached rows stay
        cached. ``on_progress(blocks_written, blocks)``, if given, is called from this
        thread about ten times a second while the relayout runs (e.g. to drive a
        :class:`tiermem.report.progress.Progress` bar with ``advance_to``)."""
        lay = np.asarray(layout)
        if lay.ndim != 1 or lay.dtype.kind not in "iu":
            raise InvalidArgumentError("layout must be a 1-D integer array, one position per row")
        lay = np.ascontiguousarray(lay, np.uint32)
        info = self.block_info if on_progress is not None else None
        if on_progress is None or info is None:
            self._native.relayout(lay, int(budget))  # a table without a file: the core refuses
            return
        failed: list[BaseException] = []

        def work() -> None:
            try:
                self._native.relayout(lay, int(budget))
            except BaseException as e:  # handed to the caller below
                failed.append(e)

        # The relayout releases the GIL and holds the table's lock; this thread only reads
        # its block counter, which takes no lock.
        total = int(info["data_blocks"])
        worker = threading.Thread(target=work, name="tiermem-relayout", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            on_progress(self._native.relayout_progress(), total)
        if failed:
            raise failed[0]
        on_progress(total, total)

    def set_admission(self, admission: str) -> None:
        """Change a block table's admission of a read block's other rows (see the
        constructor)."""
        self._native.set_admission(str(admission))

    def set_access_counts(self, counts: Any) -> None:
        """Per-row counts of queries holding each row in the trace the layout was trained
        on: what ``threshold:T`` and ``row:T`` admission compare against."""
        self._native.set_access_counts(access_counts(counts))

    # Shape ---------------------------------------------------------------------------
    @property
    def num_embeddings(self) -> int:
        return int(self._native.rows)

    @property
    def embedding_dim(self) -> int:
        return int(self._native.width)

    @property
    def dtype(self) -> str:
        return str(self._native.dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes one row takes (in the cache and, for a block table, in its file)."""
        return int(self._native.stride)

    @property
    def padding_idx(self) -> int | None:
        return self._native.padding_idx

    @property
    def placement(self) -> str:
        """``"<device>"`` for a direct table, ``"cached:<pct>"`` for a cached one,
        ``"block:<pct>"`` for a table file, ``"file:<pct>"`` for a plain file (its cache's
        percentage of the table), ``"2lm-model"`` behind the 2LM model."""
        home, cache = self._native.devices
        if self.model is not None:
            return "2lm-model"
        if self.path is not None:
            return f"{self.policy}:{round(100 * (self.cache_fraction or 0))}"
        if cache is None:
            assert home is not None, "a direct table's rows are on a manager device"
            return self.manager.device_names[home]
        return f"cached:{round(100 * (self.cache_fraction or 0))}"

    # Data ----------------------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """A float32 copy of every row (cached and updated rows read their newest value)."""
        out = np.empty((self.num_embeddings, self.embedding_dim), np.float32)
        self._native.read_rows(0, out)
        return out

    def read(self, start: int, count: int) -> np.ndarray:
        """A float32 copy of rows ``start..start + count`` (their newest values), so a
        checkpoint can stream a table a chunk at a time."""
        if start < 0 or count < 0 or start + count > self.num_embeddings:
            raise InvalidArgumentError(f"rows {start}..{start + count} are outside the table's {self.num_embeddings}")
        out = np.empty((count, self.embedding_dim), np.float32)
        self._native.read_rows(int(start), out)
        return out

    def load(self, weights: Any, start: int = 0) -> None:
        """Overwrite rows ``start..start + len(weights)`` (rounded to the storage dtype)."""
        w = _f32(weights, "weights")
        if w.ndim != 2 or w.shape[1] != self.embedding_dim:
            raise InvalidArgumentError(f"weights must be (rows, {self.embedding_dim}), got shape {w.shape}")
        self._native.write_rows(int(start), w)

    # Kernels -------------------------------------------------------------------------
    def lookup(
        self,
        indices: Any,
        offsets: Any = None,
        per_sample_weights: Any = None,
        mode: str = "sum",
        include_last_offset: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Reduce each bag (``sum``/``mean``; ``none`` gives one row per index)."""
        from .collection import EmbeddingCollection

        return EmbeddingCollection([self]).lookup(
            [as_bags(indices, offsets, include_last_offset) if mode != "none" else _plain(indices)],
            None if per_sample_weights is None else [per_sample_weights],
            mode=mode,
            out=out,
        )

    def update(
        self,
        indices: Any,
        offsets: Any,
        grad: Any,
        per_sample_weights: Any = None,
        mode: str = "sum",
        include_last_offset: bool = False,
        **optimizer: Any,
    ) -> dict[str, int]:
        """Apply the backward pass of :meth:`lookup` with the optimizer fused in (see
        :meth:`EmbeddingCollection.update` for the optimizer arguments)."""
        from .collection import EmbeddingCollection

        return EmbeddingCollection([self]).update(
            [as_bags(indices, offsets, include_last_offset) if mode != "none" else _plain(indices)],
            grad,
            None if per_sample_weights is None else [per_sample_weights],
            mode=mode,
            **optimizer,
        )

    def sparse_grad(
        self,
        indices: Any,
        offsets: Any,
        grad: Any,
        per_sample_weights: Any = None,
        mode: str = "sum",
        include_last_offset: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The gradient of :meth:`lookup` as (distinct rows, their gradient rows), without
        changing the table."""
        v, o = as_bags(indices, offsets, include_last_offset) if mode != "none" else _plain(indices)
        w = None if per_sample_weights is None else _f32(per_sample_weights, "per_sample_weights")
        rows, g = _tiermem.sparse_grad(self._native, v, o, w, mode, _f32(grad, "grad").reshape(-1))
        return np.asarray(rows, np.int64), np.asarray(g, np.float32).reshape(-1, self.embedding_dim)

    # Cache ---------------------------------------------------------------------------
    def flush(self, write_back: bool = True) -> int:
        """``flush_dirty`` (default) or ``flush_clean``: drop the oldest cache pages until the
        cache is at most ``cachelower``. Returns rows flushed. ``flush_clean`` refuses to
        drop updated rows."""
        return int(self._native.flush(bool(write_back)))

    def fill_cache_rows(self, rows: Any) -> int:
        """Cache these rows, in the order given (hottest first), until the cache is full; a
        static table then serves them from fast memory and caches nothing more. Returns
        rows cached (0 for a direct table).

        Raises:
            IndexOutOfRangeError: a row outside the table (nothing is cached then).
        """
        r = np.asarray(rows)
        if r.dtype.kind not in "iu" or r.ndim != 1:
            raise InvalidArgumentError(f"rows must be a 1-D integer array, not {r.dtype} of {r.ndim} dimensions")
        if r.size and int(r.min()) < 0:
            raise IndexOutOfRangeError(f"row {int(r.min())} is negative")
        return int(self._native.fill_cache_rows(np.ascontiguousarray(r, np.uint64)))

    def fill_cache(self, seed: int = 0) -> int:
        """Cache rows in a scrambled order until the cache is full. Returns rows cached.

        A cache that holds every row is filled in row order instead, each row in the slot
        of its number: lookups then read the cache pages as a direct table reads its rows,
        without the pointer table (``cache_info["resident"]``), until a row leaves the
        cache (a flush or a smaller ``cachelower``)."""
        return int(self._native.fill_cache(int(seed)))

    @property
    def cache_info(self) -> dict[str, Any] | None:
        """Capacity, size, ``cachelower``, ``cacheslack`` (bytes), ``isfull``, cached rows,
        ``bypass``, and ``resident`` (every row cached at the slot of its number, so lookups
        skip the pointer table; see :meth:`fill_cache`)."""
        info = self._native.cache_info()
        if info is None:
            return None
        out: dict[str, Any] = dict(info)
        for flag in ("isfull", "bypass", "resident"):
            out[flag] = bool(out[flag])
        out["policy"] = self._native.cache_policy()
        return out

    def set_bypass(self, on: bool = True) -> None:
        """Read through the cache without caching misses (hits still hit), or cache them
        again (``on=False``): for a table whose simulated cache says insertions cost more
        than they save (:func:`tiermem.embedding.cacheplan.lookup_policy`).

        Raises:
            InvalidArgumentError: a direct table, or a block table (read only through its
                cache).
        """
        if self._native.cache_info() is None:
            raise InvalidArgumentError("a direct table has no cache to bypass")
        self._native.set_bypass(bool(on))

    def set_cachelower(self, nbytes: int) -> None:
        self._native.set_cachelower(int(nbytes))

    def set_cacheslack(self, nbytes: int) -> None:
        self._native.set_cacheslack(int(nbytes))

    def stats(self) -> dict[str, int]:
        """Hits, misses, rows cached, pages flushed, dirty rows written back."""
        return dict(self._native.stats())

    def reset_stats(self) -> None:
        self._native.reset_stats()

    @property
    def hit_rate(self) -> float | None:
        """Share of row reads served from fast memory since the last reset."""
        s = self._native.stats()
        n = s["hits"] + s["misses"]
        return s["hits"] / n if n else None

    # Optimizer state -----------------------------------------------------------------
    def optimizer_state(self) -> tuple[str, np.ndarray, int] | None:
        """``(kind, values, steps)`` of the fused optimizer's state, or ``None``."""
        info = self._native.optimizer_state_info()
        if info is None:
            return None
        kind, n, steps = info
        values = np.empty(n, np.float32)
        self._native.read_optimizer_state(0, values)
        return kind, values, int(steps)

    def optimizer_state_info(self) -> tuple[str, int, int] | None:
        """``(kind, values, steps)`` of the fused optimizer's state without copying it (its
        length in floats: ``rows x`` the optimizer's floats per row), or ``None``."""
        info = self._native.optimizer_state_info()
        return None if info is None else (str(info[0]), int(info[1]), int(info[2]))

    def read_optimizer_state(self, offset: int, out: np.ndarray) -> None:
        """Copy optimizer-state values ``offset .. offset + len(out)`` into ``out``
        (float32), so the state can be streamed in chunks."""
        self._native.read_optimizer_state(int(offset), out)

    def set_optimizer_state(self, kind: str, values: Any, steps: int, offset: int = 0) -> None:
        """Write optimizer-state values at ``offset`` (whole, or a chunk of it); state of
        another kind, or none yet, starts from zeros."""
        self._native.set_optimizer_state(kind, int(offset), _f32(values, "optimizer state").reshape(-1), int(steps))

    def __repr__(self) -> str:
        return (
            f"EmbeddingTable({self.num_embeddings}, {self.embedding_dim}, dtype={self.dtype!r}, "
            f"placement={self.placement!r}, policy={self.policy!r})"
        )


def _plain(indices: Any) -> tuple[np.ndarray, np.ndarray]:
    v = _i64(indices, "indices").reshape(-1)
    return v, np.arange(len(v) + 1, dtype=np.int64)
