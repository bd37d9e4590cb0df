"""What tiermem's shards cost, told to TorchRec's planner: its estimators for shards kept
by :class:`~tiermem.torchrec.sharding.EmbeddingBagCollectionSharder`, from this machine's
measured figures and the caches' hit rates, where TorchRec models an SSD as a flat
100 MB/s::

    plan = planner(topology, sharder, batch_size=512).collective_plan(model, [sharder], pg)

(:func:`planner` is TorchRec's ``EmbeddingShardingPlanner`` whose enumerator carries
:func:`estimators`.)

Per step, a shard looks up ``ids`` rows (its share of every rank's batch: the table's
pooling factors times the global batch, a row-wise shard its rows' share of them) and
each costs, at hit rate ``h``, ``h * fast + (1 - h) * slow``:

* ``fast``: the row's bytes at DRAM's measured read bandwidth (``tiermem.dram_figures``);
* ``slow``: in DRAM, the same; on an emulated device, at its profile's read bandwidth; in a
  table file, one random 4 KiB read at the disk's calibrated rate at the best queue depth
  (``tiermem calibrate``; measured now on a scratch file when it has not run).

``h`` is the hit-rate curve's value at the placement's cache (with a profile of ids per
table, ``traces``; without one, the cache's share of the rows: uniform ids, the
conservative case). Backward (the fused update reads and writes each row) costs twice the
forward. Communication is TorchRec's own estimate, as for FBGEMM's kernels; storage is the
fast memory a shard holds (its cache and row metadata; all its rows in DRAM).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, Perf, ShardEstimator, ShardingOption, Storage, Topology
from torchrec.distributed.types import ShardingType

from .. import _calibrated_devices, _read_calibration, _tiermem, dram_figures
from ..embedding.cacheplan import cache_fast_bytes, curves
from ..embedding.config import Placement, table_dir
from .collection import per_table
from .sharding import KERNEL, EmbeddingBagCollectionSharder

__all__ = ["TieredPerfEstimator", "TieredStorageEstimator", "estimators", "planner", "row_seconds"]

#: A table file reads rows a 4 KiB block at a time.
BLOCK = 4096
#: The scratch file the disk's random reads are measured on when ``tiermem calibrate`` has
#: not run: past the drive's own cache.
SCRATCH_BYTES = 256 << 20


@cache
def _disk_reads_per_s(folder: str) -> tuple[float, str]:
    """Random 4 KiB reads per second from the disk holding ``folder``: calibrated, else
    measured now on a scratch file there (written whole: reads of a hole cost no I/O)."""
    cal = (_read_calibration() or {}).get("block_depth") or {}
    if isinstance(cal.get("best_reads_per_s"), int | float) and cal["best_reads_per_s"] > 0:
        return float(cal["best_reads_per_s"]), "tiermem calibrate"
    size = SCRATCH_BYTES
    if shutil.disk_usage(folder or ".").free < 4 * size:  # little room: a smaller file, read partly from the drive's cache
        size = 16 << 20
    fd, path = tempfile.mkstemp(prefix=".tiermem-plan-", suffix=".bin", dir=folder or None)
    try:
        block = b"\xa5" * (1 << 20)
        for k in range(size >> 20):
            os.pwrite(fd, block, k << 20)
        os.fsync(fd)
        rate, _ = _tiermem.random_reads_per_s(path, size, 16, 4096, 2)
        return float(rate), f"measured now (depth 16, {size >> 20} MiB file)"
    finally:
        os.close(fd)
        os.unlink(path)


def _device_read_bps(device: str) -> float:
    """Read bandwidth of ``device`` (an emulated profile's share of DRAM's, or calibrated)."""
    dram = float(dram_figures()["read_gbps"]) * 1e9
    cal = _calibrated_devices().get(device, {})
    if isinstance(cal.get("seq_read_gbps"), int | float):
        return float(cal["seq_read_gbps"]) * 1e9
    if device.startswith("emulated:"):
        name = device.split(":", 1)[1]
        for p in _tiermem.profiles():
            if p["name"] == name:
                return dram * float(p["read_ratio"])
    return dram


def row_seconds(placement: Placement | None, row_bytes: int) -> tuple[float, float]:
    """Seconds to read one row from fast memory, and from the placement's home (its slow
    tier; DRAM when it has none)."""
    fast = row_bytes / (float(dram_figures()["read_gbps"]) * 1e9)
    device = placement.device if placement is not None else None
    if not isinstance(device, str) or device in ("dram", "numa:0"):
        return fast, fast
    folder = table_dir(device)
    if folder is not None:
        rate, _ = _disk_reads_per_s(folder if os.path.isdir(folder) else os.path.dirname(folder))
        return fast, max(1, -(-row_bytes // BLOCK)) / rate
    return fast, row_bytes / _device_read_bps(device)


def _hit_rate(placement: Placement | None, rows: int, trace: np.ndarray | None) -> float:
    if placement is None or placement.cache is None:
        return 0.0 if placement is not None and placement.device not in (None, "dram") else 1.0
    cached = int(placement.cache * rows)
    if trace is None or not len(trace):
        return min(1.0, cached / rows)
    dynamic, static = curves(np.asarray(trace, np.int64) % rows, rows, [cached])
    return max(static[0], dynamic[0])


def _ids_per_step(so: ShardingOption, shard_rows: int, world: int) -> float:
    table_rows = int(so.tensor.shape[0])
    ids = so.batch_size * world * float(sum(so.input_lengths))
    if so.sharding_type in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value):
        ids *= shard_rows / table_rows
    return ids


class TieredPerfEstimator(ShardEstimator):
    """TorchRec's perf estimator (``EmbeddingPerfEstimator``) for every kernel, and for
    tiermem's shards their compute from this machine's figures (see the module's note)."""

    def __init__(
        self,
        topology: Topology,
        sharder: EmbeddingBagCollectionSharder,
        constraints: dict[str, ParameterConstraints] | None = None,
        traces: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self._topology, self._sharder = topology, sharder
        self._base = EmbeddingPerfEstimator(topology, constraints)
        self._traces = {k: np.asarray(v, np.int64) for k, v in (traces or {}).items()}

    def estimate(self, sharding_options: list[ShardingOption], sharder_data_map: Any = None) -> None:
        ours = [so for so in sharding_options if so.compute_kernel == KERNEL]
        for so in ours:  # TorchRec's communication figures, as for its DRAM kernel
            so.compute_kernel = "fused"
        try:
            self._base.estimate(sharding_options, sharder_data_map=sharder_data_map)
        finally:
            for so in ours:
                so.compute_kernel = KERNEL
        world = self._topology.world_size
        for so in ours:
            place = per_table(self._sharder._settings.placement, so.name)
            for shard in so.shards:
                rows, cols = int(shard.size[0]), int(shard.size[1])
                fast, slow = row_seconds(place, cols * so.tensor.element_size())
                hit = _hit_rate(place, rows, self._traces.get(so.name))
                fwd = _ids_per_step(so, rows, world) * (hit * fast + (1 - hit) * slow)
                base = shard.perf or Perf(0.0, 0.0, 0.0, 0.0)
                shard.perf = dataclasses.replace(base, fwd_compute=fwd, bwd_compute=2 * fwd)


class TieredStorageEstimator(ShardEstimator):
    """The fast memory each of tiermem's shards holds: its cache and row metadata, or all
    its rows when they live in DRAM; nothing on an accelerator."""

    def __init__(self, topology: Topology, sharder: EmbeddingBagCollectionSharder) -> None:
        self._topology, self._sharder = topology, sharder

    def estimate(self, sharding_options: list[ShardingOption], sharder_data_map: Any = None) -> None:
        for so in sharding_options:
            if so.compute_kernel != KERNEL:
                continue
            place = per_table(self._sharder._settings.placement, so.name)
            for shard in so.shards:
                rows, row_bytes = int(shard.size[0]), int(shard.size[1]) * so.tensor.element_size()
                if place is None or place.cache is None and place.device in (None, "dram"):
                    ddr = rows * row_bytes
                else:
                    ddr = cache_fast_bytes(rows, row_bytes, place.cache or 0.0)
                shard.storage = Storage(hbm=0, ddr=int(ddr))


def estimators(
    topology: Topology,
    sharder: EmbeddingBagCollectionSharder,
    constraints: dict[str, ParameterConstraints] | None = None,
    traces: Mapping[str, Sequence[int]] | None = None,
) -> list[ShardEstimator]:
    """The estimators to give TorchRec's ``EmbeddingShardingPlanner`` (``estimator=``) for a
    model sharded by ``sharder``; ``traces``: ids per table name, a profile for the caches'
    hit-rate curves."""
    return [TieredPerfEstimator(topology, sharder, constraints, traces), TieredStorageEstimator(topology, sharder)]


def planner(
    topology: Topology,
    sharder: EmbeddingBagCollectionSharder,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    traces: Mapping[str, Sequence[int]] | None = None,
    **kwargs: Any,
) -> EmbeddingShardingPlanner:
    """TorchRec's ``EmbeddingShardingPlanner`` for ``batch_size`` samples per rank, told
    what tiermem's shards cost (:func:`estimators`); other keywords go to it."""
    enum = EmbeddingEnumerator(topology, batch_size, constraints, estimator=estimators(topology, sharder, constraints, traces))
    # TorchRec's default reservation warns that it over-estimates dense tensors.
    kwargs.setdefault("storage_reservation", FixedPercentageStorageReservation(0.15))
    return EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, enumerator=enum, constraints=constraints, **kwargs)
