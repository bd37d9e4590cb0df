"""Argument types for the command line: a bad value is a usage error naming the option and
why (argparse prints it with the usage, exit status 2), never a traceback."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def integer(low: int, high: int = 10**12) -> Callable[[str], int]:
    """An integer from ``low`` to ``high``."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} is outside {low}..{high}")
        return v

    parse.__name__ = "integer"
    return parse


def number(low: float, high: float = math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """A finite number from ``low`` (excluded if ``low_open``) to ``high``."""

    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        if not math.isfinite(v) or v < low or (low_open and v == low) or v > high:
            side = "above" if low_open else "at least"
            raise argparse.ArgumentTypeError(
                f"{s} must be a finite number {side} {low}" + (f" and at most {high}" if math.isfinite(high) else "")
            )
        return v

    parse.__name__ = "number"
    return parse


def int_list(sep: str, low: int = 1) -> Callable[[str], tuple[int, ...]]:
    """Integers (each at least ``low``) separated by ``sep``, e.g. ``512-256-64``."""

    def parse(s: str) -> tuple[int, ...]:
        parts = s.split(sep)
        try:
            vals = tuple(int(p) for p in parts)
        except ValueError:
            bad = next(p for p in parts if not p.strip().lstrip("-").isdigit())
            raise argparse.ArgumentTypeError(
                f"{bad!r} in {s!r} is not an integer (expected integers separated by {sep!r})"
            ) from None
        if any(v < low for v in vals):
            raise argparse.ArgumentTypeError(f"every value in {s!r} must be at least {low}")
        return vals

    parse.__name__ = "list"
    return parse
