"""Allocation by traits (H2M): say how an allocation is used, and tiermem picks its device.

A trait set names the memory space an allocation requires or prefers (``hbw``, ``low_lat``,
``large_cap``: the manager's devices with the highest read bandwidth, the lowest latency,
the largest capacity), its sensitivity (``bandwidth``, ``latency``), access mode, frequency,
priority, pattern and stride, structure, a measured ``gain`` (seconds a run saves with it
in the fastest device), a ``fallback`` (``next_best`` or ``error``) and a ``partition``
(``nearest`` here; ``blocked`` and ``interleaved`` spread an allocation over a space's
nodes in the C H2M interface, whose allocations may be made of parts) and ``pinned``
(``false`` here; the C H2M interface locks an allocation's own range). Keys and values are
defined and checked in the core (:data:`TRAIT_KEYS`); spaces and sensitivities are OR-ed
with ``|`` or given as a list::

    m = tiermem.Manager({"dram": "1 GiB", "emulated:optane-pmem": "8 GiB"}, policy="first_touch")
    a, b, c = m.commit([(n, "float64", {"preferred": "hbw", "priority": 1}),
                        (n, "float64", Traits(preferred="low_lat", priority=15)),
                        (n, "float64", {"preferred": "hbw", "priority": 5})], strategy="priority")
    m.update_traits(a, {"preferred": "hbw", "priority": 20})
    m.apply_migration()          # a moves to fast memory, c makes room

Commit strategies (:data:`COMMIT_STRATEGIES`): ``fifo`` (as declared), ``size`` (largest
first), ``priority`` (highest first, then largest) and ``gain`` (highest measured gain per
byte first: the fast device's bytes go where they save the most time).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import _tiermem
from .exceptions import InvalidArgumentError

__all__ = ["Traits", "TRAIT_KEYS", "COMMIT_STRATEGIES", "TraitsLike"]

#: The trait keys the core accepts.
TRAIT_KEYS: tuple[str, ...] = tuple(_tiermem.TRAIT_KEYS)
#: The commit strategies.
COMMIT_STRATEGIES: tuple[str, ...] = tuple(_tiermem.COMMIT_STRATEGIES)


def _text(key: str, v: Any) -> str:
    if isinstance(v, bool) or v is None:
        raise InvalidArgumentError(f"trait {key}={v!r}: give a name or a number")
    if isinstance(v, (list, tuple, set, frozenset)):
        return "|".join(_text(key, x) for x in v)
    return str(v)


class Traits:
    """A validated trait set (``Traits(required="hbw", priority=5)``, or from a dict with
    :meth:`of`). ``fields`` holds the typed values the core parsed; bad keys or values raise
    :class:`~tiermem.exceptions.InvalidArgumentError` naming them."""

    __slots__ = ("pairs", "fields")

    def __init__(self, **values: Any) -> None:
        self.pairs: list[tuple[str, str]] = [(str(k), _text(k, v)) for k, v in values.items()]
        self.fields: dict[str, Any] = _tiermem.Traited.parse(self.pairs)

    @classmethod
    def of(cls, t: TraitsLike | None) -> Traits:
        """``t`` as a :class:`Traits` (None: the empty set)."""
        if t is None:
            return cls()
        if isinstance(t, Traits):
            return t
        if isinstance(t, Mapping):
            return cls(**{str(k): v for k, v in t.items()})
        raise InvalidArgumentError(f"traits must be a Traits or a dict, got {type(t).__name__}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Traits) and self.fields == other.fields

    def __hash__(self) -> int:  # by the parsed fields, as equality is
        return hash(json.dumps(self.fields, sort_keys=True))

    def __repr__(self) -> str:
        return "Traits(" + ", ".join(f"{k}={v!r}" for k, v in self.pairs) + ")"


TraitsLike = Traits | Mapping[str, Any]
