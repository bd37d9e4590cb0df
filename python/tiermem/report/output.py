"""What every benchmark shares: best-of timing and writing results (JSON, plot)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from .._files import write_json_atomic


def best(fns: Iterable[Callable[[], Any]]) -> float:
    """Run each call once, in order; the fastest time in seconds."""
    out = float("inf")
    for fn in fns:
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def best_pair(a: list[Callable[[], Any]], b: list[Callable[[], Any]]) -> tuple[float, float]:
    """Best times of two sets of calls run alternately (a0 b0 a1 b1 ...), so both see the
    same machine state."""
    ta, tb = float("inf"), float("inf")
    for fa, fb in zip(a, b):
        ta = min(ta, best([fa]))
        tb = min(tb, best([fb]))
    return ta, tb


def write_json(res: dict[str, Any], path: str) -> None:
    """Write a benchmark's results to ``path`` and say so."""
    write_json_atomic(path, res)
    print(f"wrote {path}")


def write_outputs(res: dict[str, Any], args: Any, plot: Callable[[dict[str, Any], str], None]) -> None:
    """``--json FILE`` and ``--plot PNG`` of a benchmark command."""
    if args.json:
        write_json(res, args.json)
    if args.plot:
        plot(res, args.plot)
        print(f"wrote {args.plot}")
