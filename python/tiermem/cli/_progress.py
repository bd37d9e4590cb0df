"""A small progress bar on stderr (quiet when stderr is not a terminal, unless forced)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any


class Progress:
    """``with Progress(total, "bench copy") as p: p.step("dram -> dram 64 MiB")``."""

    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total = max(1, total)
        self.label = label
        self.done = 0
        self.t0 = time.monotonic()
        if enabled is None:
            enabled = sys.stderr.isatty() or os.environ.get("TIERMEM_PROGRESS") == "1"
        self.enabled = enabled

    def __enter__(self) -> Progress:
        self._draw("")
        return self

    def step(self, what: str = "") -> None:
        self.done = min(self.total, self.done + 1)
        self._draw(what)

    def _draw(self, what: str) -> None:
        if not self.enabled:
            return
        width = 28
        filled = int(width * self.done / self.total)
        elapsed = time.monotonic() - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        bar = "#" * filled + "-" * (width - filled)
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s eta {eta:4.0f}s {what[:40]:<40}"
        sys.stderr.write(line)
        sys.stderr.flush()

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
