"""Writing a command's results: ``--json FILE`` and ``--plot PNG``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._files import write_json_atomic
from .load import MachineLoad


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
    print(report(res))
    print(load.line())
    write_outputs(res, args, plot)
    return 0
