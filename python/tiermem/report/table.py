"""Tables as text (``rich``, imported when a table is made): the first column left-aligned,
the rest right-aligned, a rule under the headers."""

from __future__ import annotations

import io
from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None) -> str:
    """The table as a string, as wide as its contents (never wrapped to a terminal)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(*[str(h) for h in headers], box=box.SIMPLE_HEAD, title=title, pad_edge=False, show_edge=False, header_style="bold")
    for c in t.columns[1:]:
        c.justify = "right"
    for r in rows:
        t.add_row(*["" if c is None else str(c) for c in r])
    buf = io.StringIO()
    Console(file=buf, width=10_000, color_system=None, soft_wrap=True).print(t)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines() if line.strip())


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None) -> None:
    """Print :func:`table`."""
    print(table(headers, rows, title))
