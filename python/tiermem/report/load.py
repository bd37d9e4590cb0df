"""The machine's load around a benchmark: load average and CPU steal time at the start and
the end, and whether the run was disturbed (figures from a disturbed run are not claimed)."""

from __future__ import annotations

import os
from typing import Any

#: A run is disturbed when the 1-minute load average exceeds this share of the cores, or
#: more than this share of CPU time was stolen by the hypervisor.
BUSY_LOAD_PER_CORE = 0.5
BUSY_STEAL = 0.05


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _cpu_ticks() -> tuple[int, int]:
    """(total, steal) jiffies of all CPUs since boot, from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return (0, 0)
    nums = [int(x) for x in fields]
    return sum(nums[:8]), (nums[7] if len(nums) > 7 else 0)


class MachineLoad:
    """``with MachineLoad() as load: ...``; then ``load.summary()`` for the JSON and
    ``load.line()`` to print."""

    def __enter__(self) -> MachineLoad:
        self.cores = os.cpu_count() or 1
        self.start = _loadavg()
        self._t0 = _cpu_ticks()
        self.end: list[float] = []
        self.steal = 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end = _loadavg()
        t1 = _cpu_ticks()
        total = t1[0] - self._t0[0]
        self.steal = (t1[1] - self._t0[1]) / total if total > 0 else 0.0

    @property
    def disturbed(self) -> bool:
        limit = BUSY_LOAD_PER_CORE * self.cores
        # The start's 1-minute average still carries whatever ran before; the end's includes
        # this run's own threads, so it is compared with the cores it may use plus the limit.
        return (bool(self.start) and self.start[0] > limit) or self.steal > BUSY_STEAL

    def summary(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "loadavg_start": self.start,
            "loadavg_end": self.end,
            "steal_fraction": round(self.steal, 4),
            "disturbed": self.disturbed,
        }

    def line(self) -> str:
        s = (
            f"machine load: load average {self.start[:1] or '?'} at start, {self.end[:1] or '?'} at end "
            f"({self.cores} cores), steal {100 * self.steal:.1f}%"
        )
        if self.disturbed:
            s += " -- DISTURBED: other work was running; do not quote these figures"
        return s
