"""Progress bars on stderr (``rich``, imported when a bar is made): quiet when stderr is not
a terminal, unless ``TIERMEM_PROGRESS=1`` forces them."""

from __future__ import annotations

import os
import sys
from typing import Any


def _wanted(enabled: bool | None) -> bool:
    if enabled is not None:
        return enabled
    return sys.stderr.isatty() or os.environ.get("TIERMEM_PROGRESS") == "1"


class Progress:
    """``with Progress(total, "bench copy") as p: p.step("dram -> dram 64 MiB")``: a bar of
    ``total`` steps labelled ``label``, each step naming what it finished."""

    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total = max(1, total)
        self.label = label
        self.done = 0
        self.enabled = _wanted(enabled)
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            console = Console(file=sys.stderr, force_terminal=not sys.stderr.isatty() or None)
            self._bar = Bar(
                TextColumn("{task.description} ["),
                BarColumn(bar_width=28),
                TextColumn("]"),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[what]}"),
                console=console,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, what="")
        return self

    def step(self, what: str = "") -> None:
        """One step done; ``what`` names it."""
        self.done = min(self.total, self.done + 1)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, what=what[:40])

    def advance_to(self, done: int, what: str = "") -> None:
        """``done`` steps of ``total`` are finished (work that reports a count, not steps)."""
        self.done = max(self.done, min(self.total, int(done)))
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, what=what[:40])

    def note(self, what: str) -> None:
        """Say what is running now, without finishing a step."""
        if self._bar is not None:
            self._bar.update(self._task, what=what[:40])

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
