"""Look-ahead prefetch and write-behind for tiered tensors (the ``async`` variant).

Training repeats the same ops in the same order every iteration. The core follows that
trace (``tiermem_core::manager::trace``): each op tells it, inside the call that opens the
op (``Manager::op_open``), its position and its name; the core records the op's operands as
keys that survive from one iteration to the next (objects older than the iteration by id,
objects this iteration made by the position and output index of the op that made them),
matches the op against the previous iteration's trace (by name from a cursor, allowing a
few ops inserted or dropped), and queues the operands of the next ``depth`` ops to a mover
thread (the core's ``Mover``: a Rust thread that never takes the GIL), which prefetches them
into fast memory while the op computes. Soft-evicted operands (Listing 4.6) are the next
eviction victims, oldest first; once :data:`BEHIND_LAG` of the budget has been soft-evicted
after one that is still allocated, the mover writes it to the slow device and leaves it
clean in fast memory, so the eviction that comes later copies nothing.

An op with no match is not acted on, and every iteration records a fresh trace, so a
changed control flow costs one iteration of look-ahead, never a prefetch of a live object
the trace was not about (object ids are never reused). Following rides on the op's own two
calls into the core: the look-ahead costs a step no crossing of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._tiermem import Mover
from .observer import Observer

if TYPE_CHECKING:  # pragma: no cover
    from .tiering import Tiering

__all__ = ["Lookahead", "BEHIND_LAG"]

#: Share of the fast budget soft-evicted after an object before it is written behind.
#: Soft-evicted objects leave fast memory oldest first; the newest ones (about a budget's
#: worth) never leave before backward uses and frees them, and writing those would waste
#: slow-device bandwidth.
BEHIND_LAG = 0.5


class Lookahead(Observer):
    """The core's trace follower and the mover thread it queues to, attached to a tiering
    (an observer of it for iterations, closing and stats)."""

    name = "lookahead"

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._mover: Mover | None = None
        self._final: tuple[dict[str, int], tuple[int, int, int]] | None = None

    def attach(self, tiering: Tiering) -> None:
        self.tiering = tiering
        self._mover = Mover(tiering._native)
        tiering._native.follow_trace(self._mover, self.depth, int(tiering.budget * BEHIND_LAG))
        tiering.tracing = True

    def iteration(self, iteration: int) -> None:
        if self._mover is not None:
            self.tiering._native.trace_iteration()

    def close(self) -> None:
        if self._mover is not None:
            self.tiering.tracing = False
            self._final = (self.tiering._native.follow_trace(None) or {}, self._mover.stop())
            self._mover = None

    def stats(self) -> dict[str, Any]:
        """Operands queued for prefetch and for write-behind, prefetched, written behind,
        skipped (freed, pinned, no room, or nothing to write), kept (not queued: asked
        for within the last ``depth`` ops, or an operand of the op running then, which stays
        where it is for the next), ops matched after a skip (resyncs) and ops not found in
        the previous trace (mismatches)."""
        if self._mover is None:
            counts, done = self._final or ({}, (0, 0, 0))
        else:
            counts, done = self.tiering._native.trace_counts() or {}, self._mover.counts()
        prefetched, written, skipped = done
        return counts | {"prefetched": prefetched, "written_behind": written, "skipped": skipped}
