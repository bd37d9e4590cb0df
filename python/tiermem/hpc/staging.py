"""Pattern-aware staging (Arima & Schulz): decide whether copying a chunk to fast memory
before a loop pays for itself, from a sample of the loop's accesses.

:func:`analyse` samples an index stream as ``threads`` threads would (each its contiguous
share, 2048 addresses into a page-address Bloom filter and 1024 strides into a stride
filter, 2^11 bits each, Arima & Schulz Table 3) and returns the hit rates ``r_paf`` (near 1:
dense, pages reused; near 0: sparse) and ``r_sf`` (near 1: regular strides; near 0:
irregular). :class:`BreakEven` holds a device pair's calibrated gains (s/GB, slow less fast)
on random, long-stride and sequential accesses for reads, writes and both, and the copy
times in and back; :meth:`BreakEven.decide` applies the paper's eq. 3-9::

    r = staging.analyse(index_array, elem_bytes=8)
    d = line.decide(r, u=accesses / elements, read=True, write=False)
    d["stage"], d["t_boost"], d["t_copy"]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _tiermem
from ..exceptions import InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    from ..manager import Manager

__all__ = ["analyse", "BreakEven", "calibrate", "stored_line"]


def analyse(indices: Any, elem_bytes: int = 8, threads: int | None = None) -> dict[str, Any]:
    """``{"r_paf", "r_sf", "samples"}`` of an index stream (any integer array; element ``i``
    at byte ``i * elem_bytes``). ``threads``: the loop's threads (default: this process's
    CPUs). An empty stream, or a negative sampled index, raises
    :class:`~tiermem.exceptions.InvalidArgumentError` naming it."""
    arr = np.ascontiguousarray(np.asarray(indices))
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"indices must be integers, got dtype {arr.dtype}")
    n = threads if threads is not None else len(os.sched_getaffinity(0))
    return _tiermem.analyse_pattern(arr.astype(np.int64, copy=False).ravel(), int(elem_bytes), int(n))


@dataclass(frozen=True)
class BreakEven:
    """One slow/fast device pair's break-even line: gains in s/GB as ``(random, strided,
    sequential)`` for loops that read, write, or both, copy times in (``t_1st``) and back
    (``t_3rd``), s/GB, the calibration patterns' line-filter hit rates ``lines``
    (``(random, strided, sequential)``; all 0 gives the paper's rule) and the lines a core's
    cache holds for one stream, ``cache_lines`` (0: no sweep model; see :meth:`decide`)."""

    read: tuple[float, float, float]
    write: tuple[float, float, float]
    read_write: tuple[float, float, float]
    t_1st: float
    t_3rd: float
    lines: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cache_lines: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The line as the core reads it (``{"read": {"random", "strided", "sequential"},
        ..., "t_1st", "t_3rd", "lines", "cache_lines"}``)."""

        def boosts(b: tuple[float, float, float]) -> dict[str, float]:
            return {"random": b[0], "strided": b[1], "sequential": b[2]}

        return {
            "read": boosts(self.read),
            "write": boosts(self.write),
            "read_write": boosts(self.read_write),
            "t_1st": self.t_1st,
            "t_3rd": self.t_3rd,
            "lines": list(self.lines),
            "cache_lines": self.cache_lines,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BreakEven:
        """The inverse of :meth:`as_dict`."""
        try:

            def boosts(b: dict[str, Any]) -> tuple[float, float, float]:
                return (float(b["random"]), float(b["strided"]), float(b["sequential"]))

            lines = d.get("lines", (0.0, 0.0, 0.0))
            return cls(
                boosts(d["read"]),
                boosts(d["write"]),
                boosts(d["read_write"]),
                float(d["t_1st"]),
                float(d["t_3rd"]),
                (float(lines[0]), float(lines[1]), float(lines[2])),
                int(d.get("cache_lines", 0)),
            )
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise InvalidArgumentError(f"not a break-even line: {e!r}") from e

    def decide(self, rates: dict[str, Any], u: float, read: bool, write: bool, t_th: float = 0.0) -> dict[str, Any]:
        """Stage when ``t_boost - t_copy > t_th`` (eq. 9): ``{"stage", "t_boost", "t_copy",
        "stage_paper", "t_boost_paper"}`` (s/GB). ``u``: accesses to the chunk over its
        elements; ``read``/``write``: whether the loop reads (copy in) and writes (copy back)
        it. ``t_boost`` counts the lines the loop fetches, ``u`` times ``1 - r_lf`` (less when
        the sampled working set, grown along ``ws_exponent`` to ``accesses_per_thread``,
        fits ``cache_lines`` for long, or when the sampled band fits it and only its front
        ``r_front`` fetches), at the gain of
        the fetched lines' own pattern (``r_paf_fetched``, ``r_sf_fetched``); the paper's
        ``t_boost_paper`` counts every reference at the gain of all of them. Rates missing
        from ``rates`` default to what the paper's three imply."""
        paf, sf, lf = float(rates["r_paf"]), float(rates["r_sf"]), float(rates.get("r_lf", 0.0))
        r = {
            "r_paf": paf,
            "r_sf": sf,
            "r_lf": lf,
            "r_paf_fetched": float(rates.get("r_paf_fetched", paf)),
            "r_sf_fetched": float(rates.get("r_sf_fetched", sf)),
            "r_front": float(rates.get("r_front", 1.0 - lf)),
            "band_lines": int(rates.get("band_lines", 0)),
            "ws_exponent": float(rates.get("ws_exponent", 1.0)),
            "sampled_per_thread": float(rates.get("sampled_per_thread", 0.0)),
            "accesses_per_thread": float(rates.get("accesses_per_thread", 0.0)),
            "samples": 0,
        }
        return dict(_tiermem.staging_decision(json.dumps(r), float(u), read, write, json.dumps(self.as_dict()), float(t_th)))


def calibrate(manager: Manager, length: int = 1 << 23, reps: int = 3) -> BreakEven:
    """Calibrate the break-even line between ``manager``'s slowest and fastest devices
    (eq. 7): time the three probe orders (random, a stride over a page, sequential) reading,
    writing and both over a ``uint64`` array of ``length`` (a power of two that fits fast
    memory) on each device, and the copies in and back; each figure the median of ``reps``
    runs. The manager's policy must move only when told (``lru_in_place``)."""
    if length < 4096 or length & (length - 1):
        raise InvalidArgumentError(f"calibration length must be a power of two of at least 4096, got {length}")
    return BreakEven.from_dict(dict(_tiermem.calibrate_staging(manager._native, int(length), int(reps))))


def stored_line(device: str) -> BreakEven | None:
    """The break-even line between ``dram`` and ``device`` (a device spec such as
    ``emulated:optane-pmem`` or ``numa:1``) that ``tiermem calibrate`` kept, or None."""
    from .. import _read_calibration

    doc = (_read_calibration() or {}).get("staging", {})
    return BreakEven.from_dict(doc[device]) if isinstance(doc, dict) and device in doc else None
