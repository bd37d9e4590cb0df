"""Writing a command's results: what it shows, ``--json FILE`` and ``--plot PNG``. The one
place a command's output is printed (library code outside ``cli`` and ``report`` logs through
``logging`` instead, and ``tests/house`` checks it prints nothing)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from .._files import write_json_atomic
from .load import MachineLoad


def show(*parts: object, err: bool = False) -> None:
    """Print a command's output (its report, the files it wrote, notes) to stdout, or to
    stderr with ``err``."""
    print(*parts, file=sys.stderr if err else sys.stdout)


def write_json(res: dict[str, Any], path: str) -> None:
    """Write a benchmark's results to ``path`` and say so."""
    write_json_atomic(path, res)
    show(f"wrote {path}")


def write_outputs(res: dict[str, Any], args: Any, plot: Callable[[dict[str, Any], str], None]) -> None:
    """``--json FILE`` and ``--plot PNG`` of a benchmark command."""
    if args.json:
        write_json(res, args.json)
    if args.plot:
        plot(res, args.plot)
        show(f"wrote {args.plot}")


def measured_cli(
    args: Any,
    run: Callable[[], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], str], None],
) -> int:
    """A benchmark command's body: ``run`` under a :class:`MachineLoad`, the load and wall
    time added to its results, ``report`` and the load printed, ``--json`` and ``--plot``."""
    t0 = time.perf_counter()
    with MachineLoad() as load:
        res = run()
    res["load"] = load.summary()
    res["wall_seconds"] = time.perf_counter() - t0
    show(report(res))
    show(load.line())
    write_outputs(res, args, plot)
    return 0
