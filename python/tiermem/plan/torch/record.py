"""A training step recorded as a planner's graph (the planner's first end in PyTorch).

A :class:`Recorder` is an :class:`~tiermem.torch.tensors.Observer` of a
:class:`~tiermem.torch.tensors.Tiering`: each op it runs and each tensor it copies in (a
model's inputs) is one *kernel*, numbered by its position in the iteration. Tensors are
named so that the names survive from one iteration, and one run, to the next: ``"POS.K"``
for the *K*-th tensor the kernel at *POS* made, and ``"pN"`` for the *N*-th object older
than the iteration that the iteration used (parameters, optimizer state), counted in order
of first use. The kernels, tensors and per-kernel times become a :class:`~tiermem.plan.Graph`
(:func:`~tiermem.plan.torch.profile.graph_from_recordings`, :func:`~tiermem.plan.torch.capture`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...torch.tensors.observer import Observer, OpEnd

if TYPE_CHECKING:  # pragma: no cover
    from ...torch.tensors.tensor import TensorObject

__all__ = ["Recorder", "Names"]


class Names:
    """Stable names of this iteration's objects."""

    def __init__(self) -> None:
        self.iteration = -1
        self.old: dict[int, str] = {}

    def start(self, iteration: int) -> None:
        self.iteration = iteration
        self.old = {}

    def name(self, obj: TensorObject) -> str:
        b = obj.born
        if b is not None and b[0] == self.iteration:
            return f"{b[1]}.{b[2]}"
        n = self.old.get(obj.id)
        if n is None:
            n = self.old[obj.id] = f"p{len(self.old)}"
        return n

    @staticmethod
    def made(pos: int, k: int) -> str:
        return f"{pos}.{k}"


class Recorder(Observer):
    """Records the iterations after ``skip`` whole ones: the first of them gives the kernels
    and tensors; each kernel keeps its shortest time over ``count`` iterations (a shared
    machine's noise only ever adds time). With ``places``, the first recorded iteration also
    keeps the device index each operand was on as its kernel closed (``places``, one list
    per kernel in operand order): what a runtime policy decided, for
    :func:`tiermem.plan.recorded` to price."""

    name = "recorder"
    timed = True
    #: Tensors are labelled by parameter and module names (see :attr:`Observer.names_tensors`).
    names_tensors = True

    def __init__(self, skip: int = 1, count: int = 1, places: bool = False) -> None:
        if skip < 1 or count < 1:
            raise ValueError(f"recorder: skip and count must be at least 1, got {skip}, {count}")
        self.skip = skip
        self.count = count
        self.keep_places = places
        self.places: list[list[int]] = []
        self.names = Names()
        self.active = False
        self.done = False
        self.recorded = 0  # whole iterations recorded
        self.kernels: list[tuple[str, float, list[tuple[str, str]]]] = []
        #: Per kernel, its signature (:func:`signature`): kernels that share one do the same
        #: work on operands of the same shapes, so their profiles are pooled.
        self.signatures: list[str] = []
        self.tensors: dict[str, dict[str, Any]] = {}
        self.mismatch: str | None = None
        self._pos = 0
        self._live: dict[int, str] = {}  # object id -> name, for frees

    @property
    def wants_signatures(self) -> bool:
        """Whether the next kernel's signature is kept (the first recorded iteration's)."""
        return self.active and not self.recorded

    def iteration(self, iteration: int) -> None:
        if self.active:
            self.recorded += 1
            if self._pos != len(self.kernels) and self.mismatch is None:
                self.mismatch = f"iteration {iteration - 1} ran {self._pos} kernels, the first recorded one {len(self.kernels)}"
            self.active = False
            self.done = self.recorded >= self.count
        if not self.done and iteration >= self.skip:
            self.active = True
            self._pos = 0
            self.names.start(iteration)

    def kernel(
        self, pos: int, name: str, operands: list[tuple[TensorObject, str]], seconds: float, signature: str | None = None
    ) -> None:
        if not self.active:
            return
        self._pos = pos + 1
        if self.recorded:
            if pos < len(self.kernels) and self.kernels[pos][0] == name:
                k = self.kernels[pos]
                self.kernels[pos] = (k[0], min(k[1], seconds), k[2])
            elif self.mismatch is None:
                self.mismatch = f"kernel {pos} was {name} in one iteration and not in another"
            return
        if self.keep_places:
            self.places.append([obj.tiering._native.placement(obj.id)[0] for obj, _ in operands])
        ops = []
        for obj, use in operands:
            key = self.names.name(obj)
            if key not in self.tensors:
                persistent = not key[0].isdigit()
                kind = "parameter" if persistent and obj.born is None else "state" if persistent else "activation"
                if use == "make" and name == "input":
                    kind = "input"
                label = obj.tiering.labels.get(obj.id) or (f"{obj.tiering.scope or 'step'}: {name}" if use == "make" else "")
                self.tensors[key] = {"bytes": obj.nbytes, "kind": kind, "persistent": persistent, "label": label}
                self._live[obj.id] = key
            ops.append((key, use))
        self.kernels.append((name, seconds, ops))
        self.signatures.append(signature or name)

    def op_end(self, event: OpEnd) -> None:
        if self.active:
            sig = event.signature() if self.wants_signatures else None
            self.kernel(event.pos, event.name, event.uses, event.seconds, sig)

    def freed(self, oid: int) -> None:
        key = self._live.pop(oid, None)
        if key is not None and self.active and not self.recorded:
            self.tensors[key]["freed_at"] = len(self.kernels) - 1
