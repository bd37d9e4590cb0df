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

import json
import logging
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
from .traits import COMMIT_STRATEGIES, TRAIT_KEYS, Traits

__version__: str = _tiermem.__version__

# The library logs through loggers under "tiermem" and leaves their output to the
# application (the `tiermem` command configures it).
logging.getLogger(__name__).addHandler(logging.NullHandler())

#: The built-in policies' names (the core's registry; ``2lm_model:LINE`` is also accepted).
BUILTIN_POLICIES: tuple[str, ...] = tuple(_tiermem.POLICIES)


def topology() -> dict[str, Any]:
    """NUMA nodes (sizes, CPUs, distances, kernel memory tiers), available memory, THP mode."""
    return _tiermem.topology()


#: The memory spaces (H2M's and OpenMP's), and the environment variables that override them.
MEMORY_SPACES: tuple[str, ...] = tuple(_tiermem.MEMORY_SPACES)
MEMORY_SPACE_ENV: dict[str, str] = dict(zip(MEMORY_SPACES, _tiermem.MEMORY_SPACE_ENV, strict=True))


def memory_spaces(sysfs: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Which NUMA nodes each memory space (``hbw``, ``low_lat``, ``large_cap``) maps to and
    why, and for each node its candidates by distance: ``{"spaces": [{"space", "nodes",
    "source", "why"}], "views": [{"node", "by_distance": [[node, distance]], "spaces":
    [[space, nodes]]}], "notes": [...]}``. Sources, first that applies: the overrides
    (``TIERMEM_NODES_HBW``, ``..._LOW_LAT``, ``..._LARGE_CAP``: node lists), the firmware's
    HMAT figures, the kernel's memory tiers, ``tiermem calibrate``'s ``numa:N`` figures,
    nodes with CPUs (capacity for ``large_cap``). ``sysfs``: read this root instead of
    ``/sys`` (the test fixtures' machines); ``env``: overrides instead of the environment.
    A malformed override or one naming a missing node raises
    :class:`~tiermem.exceptions.InvalidArgumentError` naming it."""
    measured: dict[int, tuple[float | None, float | None]] = {}
    for name, fig in _calibrated_devices().items():
        if name.startswith("numa:") and name[5:].isdigit():
            measured[int(name[5:])] = (fig.get("seq_read_gbps"), fig.get("latency_ns"))
    return _tiermem.memory_spaces(sysfs, env, measured)


def _read_calibration() -> dict[str, Any] | None:
    """``tiermem calibrate``'s results, or None when it has not run or its file is
    unreadable (``info`` and discovery then go without them)."""
    try:
        with open(calibration_path(), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _calibrated_devices() -> dict[str, Any]:
    """``tiermem calibrate``'s per-device figures (none without a calibration)."""
    devices = (_read_calibration() or {}).get("devices")
    return devices if isinstance(devices, dict) else {}


def profiles() -> list[dict[str, Any]]:
    """The emulated device profiles, as ratios of this machine's DRAM, with their sources."""
    return _tiermem.profiles()


def dram_figures() -> dict[str, Any]:
    """This machine's DRAM bandwidth and latency: from ``tiermem calibrate``'s file, else
    measured by this process or, when another process on this machine measured in the last
    minute, theirs (``source`` says which: ``calibrated``, ``measured`` or ``shared``)."""
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
    "memory_spaces",
    "MEMORY_SPACES",
    "Traits",
    "TRAIT_KEYS",
    "COMMIT_STRATEGIES",
    "MEMORY_SPACE_ENV",
    "profiles",
    "dram_figures",
    "calibration_path",
    "parse_size",
    "format_bytes",
    *_exceptions.__all__,
    "__version__",
]
