"""Look-ahead prefetch and write-behind for tiered tensors (the ``async`` variant).

A copy thread does two things while ops compute. **Write-behind**: a forward op's inputs,
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

import queue
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

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


class Lookahead:
    """Per-iteration op traces and the copy thread that acts on them."""

    def __init__(self, tiering: Tiering, depth: int) -> None:
        self.tiering = tiering
        self.depth = depth
        self.prev: list[tuple[str, tuple[Key, ...]]] = []
        self.cur: list[tuple[str, tuple[Key, ...]]] = []
        self.made: dict[tuple[int, int], int] = {}
        self.issued: set[int] = set()
        self.pmap: dict[int, int] = {}  # previous trace position -> this iteration's
        self.cursor = 0
        self._queue: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()
        self._behind: deque[tuple[int, weakref.ref]] = deque()
        self._marked = 0  # bytes soft-evicted this iteration
        self._lag = int(tiering.budget * BEHIND_LAG)
        self._counts = {"queued": 0, "prefetched": 0, "skipped": 0, "mismatches": 0, "resyncs": 0, "written_behind": 0}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="tiermem-prefetch", daemon=True)
        self._thread.start()

    def note_made(self, pos: int, k: int, oid: int) -> None:
        self.made[(pos, k)] = oid

    def _key(self, obj: TensorObject) -> Key:
        b = obj.born
        if b is not None and b[0] == self.tiering.iteration:
            return ("o", b[1], b[2])
        return ("p", obj.id, 0)

    def behind(self, obj: TensorObject) -> None:
        """A forward op soft-evicted ``obj``: write it behind if it lives on (see above)."""
        self._marked += obj.nbytes
        self._behind.append((self._marked, weakref.ref(obj)))
        while self._behind and self._marked - self._behind[0][0] > self._lag:
            alive = self._behind.popleft()[1]()
            if alive is not None:
                self._queue.put(("w", alive.id))

    def before_op(self, name: str, pos: int, operands: dict[int, Any]) -> None:
        """Record op ``pos``, find it in the previous iteration's trace (allowing a few
        inserted or missing ops), and queue the inputs of the ops after it."""
        self.cur.append((name, tuple(self._key(op.obj) for op in operands.values())))
        if not self.prev:
            return
        c = self._find(name)
        if c is None:
            return
        self.pmap[c] = pos
        self.cursor = c + 1
        for j in range(c + 1, min(c + 1 + self.depth, len(self.prev))):
            if j in self.issued:
                continue
            self.issued.add(j)
            for kind, a, b in self.prev[j][1]:
                if kind == "o":
                    now = self.pmap.get(a)
                    oid = None if now is None else self.made.get((now, b))
                else:
                    oid = a
                if oid is not None:
                    self._counts["queued"] += 1
                    self._queue.put(("p", oid))

    def _find(self, name: str) -> int | None:
        """Position of this op in the previous trace: the cursor, or the first match within
        ``WINDOW`` ops after it (an op inserted or dropped since)."""
        for c in range(self.cursor, min(self.cursor + WINDOW, len(self.prev))):
            if self.prev[c][0] == name:
                if c != self.cursor:
                    self._counts["resyncs"] += 1
                return c
        self._counts["mismatches"] += 1
        return None

    def end_iteration(self) -> None:
        if self.cur:
            self.prev = self.cur
        self.cur = []
        self.made = {}
        self.pmap = {}
        self.issued = set()
        self.cursor = 0
        self._behind.clear()
        self._marked = 0

    def _work(self) -> None:
        native = self.tiering._native
        while True:
            task = self._queue.get()
            if task is None:
                return
            kind, oid = task
            try:
                if kind == "w":
                    self._counts["written_behind"] += bool(native.writeback(oid))
                else:
                    native.prefetch(oid, True)
                    self._counts["prefetched"] += 1
            except Exception:
                self._counts["skipped"] += 1

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def stats(self) -> dict[str, int]:
        """Operands queued, prefetched, skipped (freed or no room), written behind, ops
        matched after a skip (resyncs) and ops not found in the previous trace (mismatches)."""
        return dict(self._counts)
