"""Exceptions raised by tiermem.

Every core error maps to exactly one class here (the mapping lives in the binding's
``error.rs``), with the error's fields as attributes (``DeviceFullError.free``,
``IndexOutOfRangeError.position``, ...). Each class also derives from the built-in exception
a Python user would catch.

=========================  ==========================  ===========================
core ``Error``             tiermem exception           also catchable as
=========================  ==========================  ===========================
``InvalidArgument``        ``InvalidArgumentError``    ``ValueError``
``UnknownDevice``          ``UnknownDeviceError``      ``ValueError``
``DeviceFull``             ``DeviceFullError``         ``MemoryError``
``Pinned``                 ``PinnedError``             ``RuntimeError``
``AllPinned``              ``AllPinnedError``          ``PinnedError``, ``MemoryError``
``NoSuchObject``           ``NoSuchObjectError``       ``LookupError``
``Io``                     ``DeviceIOError``           ``OSError`` (keeps ``errno``)
``IndexOutOfRange``        ``IndexOutOfRangeError``    ``IndexError``
``Guard``                  ``GuardError``              ``RuntimeError``
``Policy``                 ``PolicyError``             ``RuntimeError``
``LockOrder``              ``LockOrderError``          ``RuntimeError``
``Poisoned``               ``PoisonedError``           ``RuntimeError``
``Corrupt``                ``CorruptFileError``        ``OSError``
=========================  ==========================  ===========================

:class:`BudgetError` is raised by the Python layer alone (tiered tensors, :mod:`tiermem.torch.tensors.tiering`).
"""

from __future__ import annotations

__all__ = [
    "TiermemError",
    "InvalidArgumentError",
    "UnknownDeviceError",
    "DeviceFullError",
    "PinnedError",
    "AllPinnedError",
    "NoSuchObjectError",
    "DeviceIOError",
    "IndexOutOfRangeError",
    "GuardError",
    "PolicyError",
    "LockOrderError",
    "PoisonedError",
    "CorruptFileError",
    "BudgetError",
]


class TiermemError(Exception):
    """Base class of every tiermem error."""


class InvalidArgumentError(TiermemError, ValueError):
    """A value that can never be valid: zero or overflowing sizes, bad specs, bad indices."""


class UnknownDeviceError(TiermemError, ValueError):
    """A device kind, emulated profile or NUMA node that does not exist here."""


class DeviceFullError(TiermemError, MemoryError):
    """A device has no contiguous span large enough (the message gives the numbers)."""

    #: Device name.
    device: str
    #: Bytes asked for, bytes free, the largest contiguous free span and the capacity.
    requested: int
    free: int
    largest: int
    capacity: int


class PinnedError(TiermemError, RuntimeError):
    """The object is held by an open guard, so it cannot be moved, evicted or freed."""

    #: The object, its open guards and holds, and what was refused (absent on
    #: :class:`AllPinnedError`).
    object: int
    pins: int
    held: int
    action: str


class AllPinnedError(PinnedError, MemoryError):
    """A forced operation needed to evict data, but everything in the way is pinned."""

    #: Device name, bytes asked for, bytes pinned, capacity.
    device: str
    requested: int
    pinned_bytes: int
    capacity: int


class NoSuchObjectError(TiermemError, LookupError):
    """The object was freed or never existed."""

    #: The object id.
    object: int


class DeviceIOError(TiermemError, OSError):
    """An operating-system call on a device failed; ``errno`` is kept."""

    #: Device name, the path or resource, and what was being done.
    device: str
    path: str
    what: str


class IndexOutOfRangeError(TiermemError, IndexError):
    """An embedding lookup or update named a row the table does not have (or a negative one);
    the message names the table, the position and the value."""

    #: Table number within the call, position of the index in its values, the index, the
    #: table's rows (set when the core raised it).
    table: int
    position: int
    value: int
    rows: int


class GuardError(TiermemError, RuntimeError):
    """A view was used outside its guard, or guards were opened in a conflicting way."""


class PolicyError(TiermemError, RuntimeError):
    """A policy failed or broke a manager rule (Python policies: the original error text)."""

    #: The policy's name.
    policy: str


class LockOrderError(TiermemError, RuntimeError):
    """A lock was requested where waiting for it could deadlock: on a rayon pool worker, or
    by a thread holding the GIL (the lock order is in ARCHITECTURE.md)."""


class PoisonedError(TiermemError, RuntimeError):
    """An earlier operation panicked midway; the manager refuses every later call rather
    than act on state it cannot vouch for."""


class CorruptFileError(TiermemError, OSError):
    """A file tiermem keeps (an embedding table's block file) is damaged, truncated, foreign
    or contradicts itself; the message names the table, the block and the numbers. Nothing
    is read from it as if it were right."""

    #: The file.
    path: str


class BudgetError(TiermemError, MemoryError):
    """A fast-memory budget too small for one operation's operands (names the op, its
    operand sizes and the budget)."""
