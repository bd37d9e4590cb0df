"""tiermem: tiered memory for large machine-learning workloads.

A :class:`Manager` owns devices ordered fastest first (``dram``, ``numa:N``,
``mapped:PATH``, ``block:PATH``, ``emulated:PROFILE``) and a policy that decides where each
object lives and when it moves. Arrays are reached only inside guards::

    import tiermem
    m = tiermem.Manager({"dram": "64 MiB", "emulated:optane-pmem": "1 GiB"}, policy="lru")
    a = m.array((1024, 1024), "float32", fill=1.0)
    with a.read() as v:
        print(v.sum())

Importing tiermem never imports torch, rich or matplotlib.
"""

from __future__ import annotations

from typing import Any

from . import _tiermem
from . import exceptions as _exceptions
from ._sizes import format_bytes, parse_size
from .array import Guard, GuardedArray, TieredArray
from .exceptions import (
    AllPinnedError,
    BudgetError,
    CorruptFileError,
    DeviceFullError,
    DeviceIOError,
    GuardError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LockOrderError,
    NoSuchObjectError,
    PinnedError,
    PoisonedError,
    PolicyError,
    TiermemError,
    UnknownDeviceError,
)
from .manager import Manager

__version__: str = _tiermem.__version__

#: The built-in policies' names (the core's registry; ``2lm_model:LINE`` is also accepted).
BUILTIN_POLICIES: tuple[str, ...] = tuple(_tiermem.POLICIES)


def topology() -> dict[str, Any]:
    """NUMA nodes (sizes, CPUs, distances, kernel memory tiers), available memory, THP mode."""
    return _tiermem.topology()


def profiles() -> list[dict[str, Any]]:
    """The emulated device profiles, as ratios of this machine's DRAM, with their sources."""
    return _tiermem.profiles()


def dram_figures() -> dict[str, Any]:
    """This machine's DRAM bandwidth and latency (from ``tiermem calibrate``, else measured)."""
    return _tiermem.dram_figures()


def calibration_path() -> str:
    """Where ``tiermem calibrate`` keeps its results."""
    return str(_tiermem.calibration_path())


__all__ = [
    "Manager",
    "TieredArray",
    "Guard",
    "GuardedArray",
    "BUILTIN_POLICIES",
    "topology",
    "profiles",
    "dram_figures",
    "calibration_path",
    "parse_size",
    "format_bytes",
    *_exceptions.__all__,
    "__version__",
]
