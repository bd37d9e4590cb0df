"""Look-ahead prefetch and write-behind for tiered tensors (the ``async`` variant).

A mover thread (the core's ``Mover``: a Rust thread fed by a queue, which never takes the
GIL, so queueing costs the step no hand-off) does two things while ops compute. **Write-behind**: a forward op's inputs,
soft-evicted after it (Listing 4.6), are the next eviction victims, oldest first; once
:data:`BEHIND_LAG` of the budget has been soft-evicted after one that is still alive (so it
is saved for backward, not a temporary, and will be evicted), the thread writes it to the
slow device and leaves it clean in fast memory, so the eviction that comes later copies
nothing. **Look-ahead prefetch**, below.

Training repeats the same ops in the same order every iteration. Each op's operands are
recorded as keys that survive from one iteration to the next: ``("p", object id)`` for
objects older than the iteration (parameters, optimizer state) and ``("o", position,
output)`` for objects an op of this iteration made. When op *i* runs and matches the op the
previous iteration ran at *i*, the operands recorded for ops *i+1 ... i+depth* are resolved
to this iteration's objects and queued to a copy thread, which prefetches them into fast
memory (forced, so the policy makes room) while op *i* computes. Ops are matched to the
previous trace by name from a cursor, allowing a few ops inserted or dropped (the first
optimizer step creates its state; a ``loss.item()`` may fall either side of the step); an op
with no match in the window is not acted on, and every iteration records a fresh trace, so a
changed control flow costs one iteration of look-ahead, never a wrong prefetch of a live
object (a stale id is simply not found).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from ..._tiermem import Mover
from .observer import Moves, Observer

if TYPE_CHECKING:  # pragma: no cover
    from .tensor import TensorObject
    from .tiering import Tiering

__all__ = ["Lookahead"]

Key = tuple[str, int, int]
WINDOW = 16
#: Share of the fast budget soft-evicted after an object before it is written behind.
#: Soft-evicted objects leave fast memory oldest first; the newest ones (about a budget's
#: worth) never leave before backward uses and frees them, and writing those would waste
#: slow-device bandwidth.
BEHIND_LAG = 0.5


class Lookahead(Observer):
    """Per-iteration op traces and the copy thread that acts on them (an observer of the
    tiering it is attached to)."""

    name = "lookahead"

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.prev: list[tuple[str, tuple[Key, ...]]] = []
        self.cur: list[tuple[str, tuple[Key, ...]]] = []
        self.made_ids: dict[tuple[int, int], int] = {}
        self._issued_to = 0  # previous-trace positions before this one are issued
        self._fetched: dict[int, int] = {}  # object id -> the op position that queued it
        self.pmap: dict[int, int] = {}  # previous trace position -> this iteration's
        self.cursor = 0
        self._mover: Mover | None = None
        self._final: tuple[int, int, int] | None = None
        self._behind: deque[tuple[int, weakref.ref]] = deque()
        self._marked = 0  # bytes soft-evicted this iteration
        self._lag = 0
        self._counts = {"queued": 0, "behind_queued": 0, "kept": 0, "mismatches": 0, "resyncs": 0}

    def attach(self, tiering: Tiering) -> None:
        self.tiering = tiering
        self._lag = int(tiering.budget * BEHIND_LAG)
        self._mover = Mover(tiering._native)

    def made(self, pos: int, k: int, obj: TensorObject) -> None:
        self.made_ids[(pos, k)] = obj.id

    def softevicted(self, pos: int, objs: list[TensorObject]) -> None:
        for obj in objs:
            self.behind(obj)

    def behind(self, obj: TensorObject) -> None:
        """A forward op soft-evicted ``obj``: write it behind if it lives on (see above)."""
        self._marked += obj.nbytes
        self._behind.append((self._marked, weakref.ref(obj)))
        while self._behind and self._marked - self._behind[0][0] > self._lag:
            alive = self._behind.popleft()[1]()
            if alive is not None and self._mover is not None:
                self._counts["behind_queued"] += 1
                self._mover.writeback(alive.id)

    def op_start(self, pos: int, name: str, objs: list[TensorObject]) -> Moves | None:
        """Record op ``pos``, find it in the previous iteration's trace (allowing a few
        inserted or missing ops), and queue the inputs of the ops after it."""
        it = self.tiering.iteration
        self.cur.append(
            (name, tuple(("o", w[1], w[2]) if (w := o.born) is not None and w[0] == it else ("p", o.id, 0) for o in objs))
        )
        prev = self.prev
        if not prev:
            return None
        c = self.cursor
        if c >= len(prev) or prev[c][0] != name:
            c = self._find(name)  # type: ignore[assignment]
            if c is None:
                return None
        self.pmap[c] = pos
        self.cursor = c + 1
        # Positions after the op are issued once each, in order: from the first not yet issued.
        lo, hi = max(c + 1, self._issued_to), min(c + 1 + self.depth, len(prev))
        if lo >= hi:
            return None
        self._issued_to = hi
        fetched, recent, counts = self._fetched, pos - self.depth, self._counts
        ids: set[int] | None = None
        for j in range(lo, hi):
            for kind, a, b in prev[j][1]:
                if kind == "o":
                    now = self.pmap.get(a)
                    oid = None if now is None else self.made_ids.get((now, b))
                    if oid is None:
                        continue
                else:
                    oid = a
                if ids is None:
                    ids = {o.id for o in objs}
                if fetched.get(oid, recent - 1) >= recent or (oid in ids and not self.tiering.softening):
                    # Asked for within the last `depth` ops (in flight or landed; a
                    # soft-eviction since moves nothing), or an operand of this op, which
                    # stays where it is for the next (pinned now, and not soft-evicted after).
                    counts["kept"] += 1
                    continue
                fetched[oid] = pos
                counts["queued"] += 1
                if self._mover is not None:
                    self._mover.prefetch(oid)
        return None

    def _find(self, name: str) -> int | None:
        """Position of this op in the previous trace: the first match within ``WINDOW`` ops
        after the cursor (an op inserted or dropped since), or None."""
        for c in range(self.cursor, min(self.cursor + WINDOW, len(self.prev))):
            if self.prev[c][0] == name:
                if c != self.cursor:
                    self._counts["resyncs"] += 1
                return c
        self._counts["mismatches"] += 1
        return None

    def iteration(self, iteration: int) -> None:
        if self.cur:
            self.prev = self.cur
        self.cur = []
        self.made_ids = {}
        self.pmap = {}
        self._issued_to = 0
        self._fetched = {}
        self.cursor = 0
        self._behind.clear()
        self._marked = 0

    def close(self) -> None:
        if self._mover is not None:
            self._final = self._mover.stop()
            self._mover = None

    def stats(self) -> dict[str, Any]:
        """Operands queued for prefetch and for write-behind, prefetched, written behind,
        skipped (freed, pinned, no room, or nothing to write), kept (not queued: asked
        for within the last ``depth`` ops, or an operand of the op running then, which stays
        where it is for the next), ops
        matched after a skip (resyncs) and ops not found in the previous trace (mismatches)."""
        done = self._final if self._mover is None else self._mover.counts()
        prefetched, written, skipped = done or (0, 0, 0)
        return dict(self._counts) | {"prefetched": prefetched, "written_behind": written, "skipped": skipped}
