"""What watches a :class:`~tiermem.torch.tensors.Tiering` as it runs a step.

A :class:`Tiering` runs ops; an :class:`Observer` is told about each one and may act on it.
The look-ahead copy thread of the ``async`` variant (:mod:`.lookahead`), the recorder that
turns a step into a planner's graph and the executor that follows a plan
(:mod:`tiermem.plan.torch`) are observers; so is anything a user adds with
:meth:`Tiering.watch`. An observer overrides the hooks it needs; the tiering calls only
overridden ones, so an op with no observer pays for none.

An op's life, with the hooks in order (``pos`` is the op's position in the iteration)::

    op_start(pos, name, objs)  -> Moves | None   before the op opens: moves to make first
    [one call into the core: the moves, every guard, every output]
    op_open(pos, moves_done)                     its operands are open (start overlapped work)
    made(pos, k, obj)                            each new tensor of the op (also inputs copied in)
    [the kernel runs]
    op_closing(pos)            -> list[int]      objects to evict once its guards close
    [one call into the core: charges, guards closed, soft-evictions, those evictions]
    softevicted(pos, objs)                       operands it soft-evicted (if any)
    op_end(event)                                the op as it ran (:class:`OpEnd`)

and around them: :meth:`Observer.iteration` at the start of each iteration, :meth:`Observer.freed`
when a tensor dies, :meth:`Observer.place` to choose where new tensors go (one observer
at most: the placer), :meth:`Observer.close` when the tiering closes. A plan's moves thus
ride on the op's own two calls into the core (``Manager::op_open``/``op_close``).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .tensor import TensorObject

if TYPE_CHECKING:  # pragma: no cover
    from .tiering import Tiering

__all__ = ["Observer", "OpEnd", "Moves", "HOOKS"]


class Moves(NamedTuple):
    """Moves an observer asks for before an op: objects to bring into fast memory, each at
    a heap offset or anywhere (``(object id, offset or None)``), and objects to evict."""

    prefetch: list[tuple[int, int | None]]
    evict: list[int]


class OpEnd(NamedTuple):
    """One op as it ran: its position, name, each operand and how the op used it
    (``"read"``, ``"write"`` or ``"make"``), its seconds from before its operands opened to
    after they closed (0 unless an observer is :attr:`~Observer.timed`), the operands it
    soft-evicted, its signature (a zero-argument callable: computed only if asked; see
    :func:`~tiermem.torch.tensors.tensor.signature`), and how many of the evictions asked
    by :meth:`Observer.op_closing` were refused (an object pinned or freed meanwhile)."""

    pos: int
    name: str
    uses: list[tuple[TensorObject, str]]
    seconds: float
    softevicted: list[TensorObject]
    signature: Callable[[], str]
    refused: int


class Observer:
    """Base class of what watches a tiering (see the module docs). Every hook does nothing."""

    #: The key of :meth:`stats` in :meth:`Tiering.stats`.
    name = "observer"
    #: Whether :attr:`OpEnd.seconds` is wanted (timing costs two clock reads per op).
    timed = False
    #: Whether the tiering should name its objects (:attr:`Tiering.labels`: parameters and
    #: buffers by name, optimizer state by its parameter's) and track the module running
    #: (:attr:`Tiering.scope`; two hooks per module call).
    names_tensors = False

    def attach(self, tiering: "Tiering") -> None:
        """Called once, when the observer starts watching ``tiering``."""

    def iteration(self, iteration: int) -> None:
        """An iteration starts (0 when attached, then after each ``end_iteration``)."""

    def place(self, pos: int, k: int, sizes: list[int]) -> tuple[list[int], list[int | None]]:
        """Where outputs ``k``, ``k + 1``, ... (``sizes`` bytes long) of the op at ``pos``
        go: a place code and a heap offset (None: anywhere) each. Asked of the placer only;
        the lists may be kept and handed out again (they are not changed)."""
        raise NotImplementedError

    def op_start(self, pos: int, name: str, objs: list[TensorObject]) -> "Moves | None":
        """Before the op at ``pos`` opens its operands ``objs``; moves to make first."""
        return None

    def op_open(self, pos: int, moves_done: tuple[int, int]) -> None:
        """The op's operands are open and its outputs made; ``moves_done`` says how the
        moves asked by :meth:`op_start` went: ``(prefetches that found no room, moves
        refused)``."""

    def made(self, pos: int, k: int, obj: TensorObject) -> None:
        """Op ``pos`` made its ``k``-th new tensor."""

    def op_closing(self, pos: int) -> list[int] | None:
        """The op ran; object ids to evict once its guards close."""
        return None

    def softevicted(self, pos: int, objs: list[TensorObject]) -> None:
        """Op ``pos`` closed and soft-evicted its read operands ``objs`` (told only when
        there were some: a cheaper hook than :meth:`op_end` for what needs only these)."""

    def op_end(self, event: OpEnd) -> None:
        """The op closed (see :class:`OpEnd`)."""

    def freed(self, oid: int) -> None:
        """A tensor's object died."""

    def close(self) -> None:
        """The tiering closes: stop threads, finish what is in flight."""

    def stats(self) -> dict[str, Any] | None:
        """Counts for :meth:`Tiering.stats` under :attr:`name`, or None."""
        return None


#: The hooks a tiering dispatches to overriding observers only.
HOOKS = ("iteration", "op_start", "op_open", "made", "op_closing", "softevicted", "op_end", "freed", "close")


def overridden(obs: Observer, hook: str) -> bool:
    """Whether ``obs`` overrides ``hook`` of :class:`Observer`."""
    return getattr(type(obs), hook) is not getattr(Observer, hook)
