"""Byte sizes: parse ``"64 MiB"``, print ``67108864`` as ``64.0 MiB``, and this machine's
available memory."""

from __future__ import annotations

import re

from .exceptions import InvalidArgumentError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_MAX = 2**64 - 1


def parse_size(value: int | str, what: str = "size") -> int:
    """Return ``value`` in bytes; accepts ints and strings like ``"1.5 GiB"`` or ``"512k"``."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be a number of bytes, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _RE.match(value)
        if not m or m.group(2).lower() not in _UNITS:
            raise InvalidArgumentError(f"{what} {value!r} is not a size (examples: 4096, '64 MiB', '2GiB', '1.5G')")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise InvalidArgumentError(f"{what} must be an int or a string like '64 MiB', got {type(value).__name__}")
    if n <= 0:
        raise InvalidArgumentError(f"{what} must be above zero bytes, got {n}")
    if n > _MAX:
        raise InvalidArgumentError(f"{what} of {n} bytes overflows 64 bits")
    return n


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def available_memory() -> int:
    """This machine's MemAvailable in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
