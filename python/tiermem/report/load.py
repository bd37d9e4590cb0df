"""The machine's load around a benchmark: load average and CPU steal time at the start and
the end, the CPU time other processes used meanwhile, and whether the run was disturbed
(figures from a disturbed run are not claimed).

The load average cannot say who was busy: a command that records a model and then times a
run under its plan starts the timed run with its own recording in the 1-minute average. So
a run is judged by the CPU time *other* processes took during it: every CPU's busy time from
``/proc/stat`` less this process's own (``os.times``)."""

from __future__ import annotations

import os
import time
from typing import Any

#: A run is disturbed when other processes used more than this share of the machine's CPU
#: time while it ran (a quarter: half a core of two), or more than ``BUSY_STEAL`` of CPU time
#: was stolen by the hypervisor.
BUSY_OTHERS = 0.25
BUSY_STEAL = 0.05


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _cpu_ticks() -> tuple[int, int, int]:
    """(total, steal, idle) jiffies of all CPUs since boot, from /proc/stat (idle includes
    I/O wait)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return (0, 0, 0)
    nums = [int(x) for x in fields]
    steal = nums[7] if len(nums) > 7 else 0
    idle = sum(nums[3:5]) if len(nums) > 4 else 0
    return sum(nums[:8]), steal, idle


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class MachineLoad:
    """``with MachineLoad() as load: ...``; then ``load.summary()`` for the JSON and
    ``load.line()`` to print."""

    def __enter__(self) -> MachineLoad:
        self.cores = os.cpu_count() or 1
        self.start = _loadavg()
        self._t0 = _cpu_ticks()
        self._own0 = _own_seconds()
        self._wall0 = time.monotonic()
        self.end: list[float] = []
        self.steal = 0.0
        self.others = 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end = _loadavg()
        t1 = _cpu_ticks()
        total = t1[0] - self._t0[0]
        if total > 0:
            self.steal = (t1[1] - self._t0[1]) / total
            busy = total - (t1[1] - self._t0[1]) - (t1[2] - self._t0[2])
            own = (_own_seconds() - self._own0) * os.sysconf("SC_CLK_TCK")
            self.others = max(0.0, busy - own) / total

    @property
    def disturbed(self) -> bool:
        return self.others > BUSY_OTHERS or self.steal > BUSY_STEAL

    def summary(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "loadavg_start": self.start,
            "loadavg_end": self.end,
            "steal_fraction": round(self.steal, 4),
            "others_fraction": round(self.others, 4),
            "disturbed": self.disturbed,
        }

    def line(self) -> str:
        s = (
            f"machine load: load average {self.start[:1] or '?'} at start, {self.end[:1] or '?'} at end "
            f"({self.cores} cores); other processes used {100 * self.others:.1f}% of the CPU time, steal {100 * self.steal:.1f}%"
        )
        if self.disturbed:
            s += " -- DISTURBED: other work was running; do not quote these figures"
        return s
