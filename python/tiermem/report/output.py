"""Writing a command's results: ``--json FILE`` and ``--plot PNG``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._files import write_json_atomic


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
