"""A model of the hardware DRAM cache ("2LM", Intel memory mode; thesis Ch.2): the baseline
tiermem's placements are measured against.

The model treats ``cache_bytes`` of the manager's fast device as a direct-mapped,
insert-on-miss cache of ``line``-byte lines in front of its slow device, with a tag and a
dirty bit per line and no knowledge of dead data. Data is not moved: every access tiermem
makes through the model (embedding tables built with ``model=``) is classified and charged
the memory accesses of thesis Table 2.2 — read hit 1, clean miss 3, dirty miss 4, write hit 2,
write misses 4-5, a write-back right after a read of the same line 1 — as bytes on both
devices and, when the slow device is ``emulated``, as time. It is a model, not the hardware:
reports call it "2LM model"::

    m = tiermem.Manager({"dram": "256 MiB", "emulated:optane-pmem": "4 GiB"})
    hw = TwoLmModel(m)                        # all free fast memory as the cache
    t = EmbeddingTable(4_000_000, 64, manager=m, model=hw)
    ...
    hw.stats()["amplification"]
"""

from __future__ import annotations

from typing import Any

from . import _tiermem
from ._sizes import parse_size
from .exceptions import InvalidArgumentError
from .manager import Manager

__all__ = ["TwoLmModel", "EVENTS"]

#: Line events, in the order ``stats()["events"]`` lists them (thesis Table 2.2's columns;
#: the names come from the core).
EVENTS: tuple[str, ...] = tuple(_tiermem.TwoLmModel.EVENT_NAMES)


class TwoLmModel:
    """The 2LM model over ``manager``'s fastest and slowest devices.

    Args:
        manager: the manager whose devices it models.
        cache_bytes: the cache's size (bytes or a size string); default: all free memory on
            the fast device, as memory mode uses all of DRAM. It is reserved on that device.
        line: line size, a power of two of at least 64 (the hardware's); coarser lines
            approximate very large arrays, moving a whole line where the hardware moves 64
            bytes.

    Raises:
        InvalidArgumentError: a bad line size, a cache holding no line or larger than the fast
            device, a manager with one device or a block device as the slow tier.
        DeviceFullError: no contiguous room for the cache on the fast device.
    """

    def __init__(self, manager: Manager, cache_bytes: int | str | None = None, line: int = 64) -> None:
        names = manager.device_names
        if len(names) < 2:
            raise InvalidArgumentError("a 2LM model needs a manager with a fast and a slow device")
        slow = len(names) - 1
        if cache_bytes is None:
            u = manager.usage()[names[0]]
            cache = int(u["capacity"]) - int(u["used"])
        else:
            cache = parse_size(cache_bytes, "cache_bytes")
        self.manager = manager
        self._native = _tiermem.TwoLmModel(manager._native, slow, 0, cache, int(line))

    @property
    def line(self) -> int:
        return int(self._native.line)

    @property
    def cache_bytes(self) -> int:
        return int(self._native.cache_bytes)

    @property
    def devices(self) -> tuple[str, str]:
        """(slow, fast) device names."""
        slow, fast = self._native.devices
        names = self.manager.device_names
        return names[slow], names[fast]

    def stats(self) -> dict[str, Any]:
        """``events`` (name -> lines), ``traffic`` (bytes: fast_read, fast_written, slow_read,
        slow_written), ``amplification`` (memory accesses per demand access) and ``hit_rate``."""
        s = self._native.stats()
        s["events"] = dict(zip(EVENTS, s["events"]))
        return s

    def reset_stats(self) -> None:
        self._native.reset_stats()

    def clear(self) -> None:
        """Empty the cache (every tag invalid, nothing written back)."""
        self._native.clear()

    def __repr__(self) -> str:
        slow, fast = self.devices
        return f"TwoLmModel(2LM model, {self.cache_bytes} bytes of {fast} in front of {slow}, {self.line}-byte lines)"
