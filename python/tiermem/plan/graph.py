"""The graph a plan is made for: one training step's kernels in order, the tensors they use,
and the devices, in a documented JSON form (``tiermem plan --save-graph F`` writes it,
``tiermem plan --graph F`` reads it), so graphs can be planned without the model.

JSON form (``"format": "tiermem-graph-1"``)::

    {
      "format": "tiermem-graph-1",
      "name": "resnet",
      "overhead_seconds": 0.004,        # step time outside the kernels (Python, autograd)
      "copy_contention": 0.5,           # share of an overlapped copy's time its kernel loses
      "devices": [                      # fastest first; the last is the home of every tensor
        {"name": "dram", "capacity": 211812352},
        {"name": "emulated:optane-pmem", "capacity": null, "duplex": true}
      ],
      "copy_gbps": [[null, 2.3], [6.8, null]],   # copy_gbps[src][dst], GB/s
      "tensors": [
        {"key": "p7", "bytes": 4096, "kind": "parameter", "persistent": true},
        {"key": "12.0", "bytes": 1048576, "kind": "activation", "persistent": false,
         "free_after": 40}
      ],
      "kernels": [
        {"name": "aten.convolution.default", "seconds": 0.0012,
         "operands": [{"tensor": 0, "use": "read",  "seconds": [0.0, 0.0004]},
                      {"tensor": 1, "use": "make",  "seconds": [0.0, 0.0011]},
                      {"tensor": 2, "use": "write", "seconds": [0.0, 0.0009],
                       "write_seconds": [0.0, 0.0006]}]}
      ]
    }

A kernel's time with its operands placed on devices ``d_i`` is ``seconds`` plus, for each
device, the extra time of the operands placed on it (``operands[i].seconds[d]``: the
profiler's per-operand extra time on each device, zero on the fastest). On a device whose
reads and writes proceed on independent channels (``"duplex": true``; an ``emulated``
device charges each channel apart and waits for the longer), that extra time is the longer
of its operands' read parts and write parts: ``max(sum_i (seconds[d] - write_seconds[d]),
sum_i write_seconds[d])``; on any other device (``duplex`` false, the default) it is their
sum. ``write_seconds`` (at most ``seconds``, per device) is the part of an operand's extra
time spent writing; when absent it is all of it for a ``make`` or ``write`` use and none of it
for a ``read``. ``use`` is ``make`` (the kernel creates the tensor: its first use),
``read`` or ``write`` (an in-place update: later copies of the tensor are stale).
``copy_contention`` (0 when absent) is what an asynchronous copy costs the kernel it
overlaps, as a share of the copy's time: 0 where the copy threads have cores of their own
(or a DMA engine copies), more where they take cores from the kernel's threads (measured by
:func:`tiermem.plan.torch.contention.copy_contention`; on two cores, about one half).
``persistent`` tensors (parameters, optimizer state) exist before the step and after it;
the others are made by a kernel of the step and die after their last use, or after kernel
``free_after`` when given (a gradient that ``zero_grad`` frees after the optimizer's step).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import write_json_atomic
from .._sizes import format_bytes
from ..exceptions import InvalidArgumentError

__all__ = ["FORMAT", "USES", "KINDS", "Device", "Tensor", "Operand", "Kernel", "Graph", "GraphError"]

FORMAT = "tiermem-graph-1"
USES = ("make", "read", "write")
KINDS = ("parameter", "state", "input", "activation", "gradient")


class GraphError(InvalidArgumentError):
    """A graph that is malformed or inconsistent, or that no plan can fit (the message names
    the tensor, kernel or device and the numbers)."""


@dataclass(frozen=True)
class Device:
    name: str
    capacity: int | None  # bytes; None: unbounded (the home device only)
    #: Whether reads and writes proceed on independent channels: a kernel's extra time on
    #: it is the longer of its operands' read and write parts, not their sum.
    duplex: bool = False


@dataclass(frozen=True)
class Tensor:
    key: str
    bytes: int
    kind: str = "activation"
    persistent: bool = False
    free_after: int | None = None  # the kernel after which it is freed, when later than its last use
    #: What the user calls it: a parameter's name, "exp_avg of NAME" for optimizer state,
    #: "MODULE: op" for an activation (empty when not known).
    label: str = ""


@dataclass(frozen=True)
class Operand:
    tensor: int
    use: str
    seconds: tuple[float, ...]  # extra seconds on each device (0 on the fastest)
    #: Of ``seconds``, the part spent writing, per device (None: all of it for a ``make`` or
    #: ``write`` use, none of it for a ``read``).
    write_seconds: tuple[float, ...] | None = None

    def parts(self, d: int) -> tuple[float, float]:
        """The extra time on device ``d`` as ``(reading, writing)`` parts."""
        if self.write_seconds is not None:
            w = self.write_seconds[d]
        else:
            w = 0.0 if self.use == "read" else self.seconds[d]
        return self.seconds[d] - w, w


@dataclass(frozen=True)
class Kernel:
    name: str
    seconds: float  # time with every operand on the fastest device
    operands: tuple[Operand, ...]


@dataclass
class Graph:
    """A step's kernels, tensors and devices, validated on construction."""

    name: str
    devices: list[Device]
    copy_gbps: list[list[float | None]]
    tensors: list[Tensor]
    kernels: list[Kernel]
    #: Step time spent outside the kernels (the framework's own work), added to every plan's.
    overhead_seconds: float = 0.0
    #: Share of an asynchronous copy's time that the kernel it overlaps loses (0: copies
    #: have cores or an engine of their own; 1: the kernel stops while the copy runs).
    copy_contention: float = 0.0
    #: Per tensor, ``(kernel index, use)`` in order (derived).
    uses: list[list[tuple[int, str]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.uses = [[] for _ in self.tensors]
        self._validate()

    # ------------------------------------------------------------------ derived

    @property
    def home(self) -> int:
        """The slowest device: every tensor's copy of last resort."""
        return len(self.devices) - 1

    def copy_seconds(self, nbytes: int, src: int, dst: int) -> float:
        gbps = self.copy_gbps[src][dst]
        assert gbps is not None
        return nbytes / (gbps * 1e9)

    def kernel_seconds(self, k: int, places: Sequence[int]) -> float:
        """Kernel ``k``'s time with its operands on devices ``places`` (one per operand, in
        order): its base time plus each device's extra time, the longer of the read and write
        parts on a duplex device, their sum on any other."""
        ker = self.kernels[k]
        extra: dict[int, list[float]] = {}
        for o, d in zip(ker.operands, places, strict=True):
            if o.seconds[d]:
                r, w = o.parts(d)
                e = extra.setdefault(d, [0.0, 0.0])
                e[0] += r
                e[1] += w
        return ker.seconds + sum(max(r, w) if self.devices[d].duplex else r + w for d, (r, w) in extra.items())

    def base_seconds(self) -> float:
        """The step's time with everything on the fastest device."""
        return self.overhead_seconds + sum(k.seconds for k in self.kernels)

    def all_on_seconds(self, d: int) -> float:
        """The step's time with every tensor on device ``d`` and nothing moving."""
        return self.overhead_seconds + sum(self.kernel_seconds(k, [d] * len(ker.operands)) for k, ker in enumerate(self.kernels))

    def use_gain(self, k: int, tensor: int, d: int) -> float:
        """What kernel ``k`` saves with ``tensor`` on device ``d`` instead of home, its other
        operands at home."""
        home = self.home
        ops = self.kernels[k].operands
        at_home = [home] * len(ops)
        moved = [d if o.tensor == tensor else home for o in ops]
        return self.kernel_seconds(k, at_home) - self.kernel_seconds(k, moved)

    def working_set(self, k: int) -> int:
        return sum(self.tensors[t].bytes for t in {o.tensor for o in self.kernels[k].operands})

    def footprint(self) -> int:
        """Peak bytes live at once (every tensor somewhere)."""
        return max(self.live_bytes(), default=0)

    def live_range(self, t: int) -> tuple[int, int]:
        """The kernels ``[lo, hi)`` tensor ``t`` is live across: the whole step for a
        persistent tensor, else from the kernel that makes it to its last use or
        ``free_after``."""
        us = self.uses[t]
        ten = self.tensors[t]
        if ten.persistent:
            return 0, len(self.kernels)
        return us[0][0], max(us[-1][0], ten.free_after or 0) + 1

    def live_bytes(self) -> list[int]:
        """Bytes live at each kernel."""
        n = len(self.kernels)
        delta = [0] * (n + 1)
        for t in range(len(self.tensors)):
            lo, hi = self.live_range(t)
            delta[lo] += self.tensors[t].bytes
            delta[hi] -= self.tensors[t].bytes
        out, run = [], 0
        for k in range(n):
            run += delta[k]
            out.append(run)
        return out

    # ------------------------------------------------------------------ checks

    def _validate(self) -> None:
        nd = len(self.devices)
        if not _time(self.overhead_seconds):
            raise GraphError(
                f"graph {self.name!r}: overhead_seconds must be a time from 0 to {MAX_SECONDS:g}, got {self.overhead_seconds!r}"
            )
        if not _finite(self.copy_contention) or not 0.0 <= self.copy_contention <= 1.0:
            raise GraphError(f"graph {self.name!r}: copy_contention must lie in [0, 1], got {self.copy_contention!r}")
        if nd < 2:
            raise GraphError(f"graph {self.name!r}: needs at least two devices (fast first), got {nd}")
        for i, dev in enumerate(self.devices):
            if dev.capacity is None and i != nd - 1:
                raise GraphError(f"device {dev.name!r}: only the last (home) device may have no capacity")
            if dev.capacity is not None and (not isinstance(dev.capacity, int) or dev.capacity <= 0):
                raise GraphError(f"device {dev.name!r}: capacity must be a positive number of bytes, got {dev.capacity!r}")
        if len(self.copy_gbps) != nd or any(len(r) != nd for r in self.copy_gbps):
            raise GraphError(f"copy_gbps must be a {nd}x{nd} matrix (source by destination)")
        for s in range(nd):
            for d in range(nd):
                g = self.copy_gbps[s][d]
                if s != d and (g is None or not _finite(g) or g < MIN_GBPS):
                    raise GraphError(
                        f"copy_gbps[{s}][{d}] ({self.devices[s].name} -> {self.devices[d].name}) must be a positive "
                        f"bandwidth in GB/s (at least {MIN_GBPS:g}), got {g!r}"
                    )
        keys: set[str] = set()
        for ten in self.tensors:
            if not isinstance(ten.bytes, int) or ten.bytes <= 0:
                raise GraphError(f"tensor {ten.key!r}: bytes must be a positive integer, got {ten.bytes!r}")
            if ten.kind not in KINDS:
                raise GraphError(f"tensor {ten.key!r}: kind {ten.kind!r} is not one of {', '.join(KINDS)}")
            if ten.key in keys:
                raise GraphError(f"tensor key {ten.key!r} appears twice")
            keys.add(ten.key)
        made = [t.persistent for t in self.tensors]
        for k, ker in enumerate(self.kernels):
            if not _time(ker.seconds):
                raise GraphError(
                    f"kernel {k} ({ker.name}): no profile (seconds must be a time from 0 to {MAX_SECONDS:g}, got {ker.seconds!r})"
                )
            seen: set[int] = set()
            for o in ker.operands:
                if not 0 <= o.tensor < len(self.tensors):
                    raise GraphError(f"kernel {k} ({ker.name}): operand tensor {o.tensor} does not exist")
                key = self.tensors[o.tensor].key
                if o.tensor in seen:
                    raise GraphError(f"kernel {k} ({ker.name}): tensor {key!r} is listed twice (merge its uses)")
                seen.add(o.tensor)
                if o.use not in USES:
                    raise GraphError(f"kernel {k} ({ker.name}): use {o.use!r} of {key!r} is not one of {', '.join(USES)}")
                if len(o.seconds) != nd or any(not _time(s) for s in o.seconds):
                    raise GraphError(
                        f"kernel {k} ({ker.name}): tensor {key!r} needs {nd} extra times from 0 to {MAX_SECONDS:g} "
                        f"(one per device), got {list(o.seconds)}"
                    )
                ws = o.write_seconds
                if ws is not None and (
                    len(ws) != nd or any(not _finite(w) or not 0 <= w <= s for w, s in zip(ws, o.seconds, strict=True))
                ):
                    raise GraphError(
                        f"kernel {k} ({ker.name}): tensor {key!r} needs {nd} write_seconds, each between 0 and its "
                        f"extra time on that device ({list(o.seconds)}), got {list(ws)}"
                    )
                if o.use == "make":
                    if made[o.tensor]:
                        what = "persistent" if self.tensors[o.tensor].persistent else "already made"
                        raise GraphError(f"kernel {k} ({ker.name}) makes tensor {key!r}, which is {what}")
                    made[o.tensor] = True
                elif not made[o.tensor]:
                    raise GraphError(f"kernel {k} ({ker.name}) uses tensor {key!r} before any kernel makes it")
                self.uses[o.tensor].append((k, o.use))
        for t, us in enumerate(self.uses):
            ten = self.tensors[t]
            if not us:
                raise GraphError(f"tensor {ten.key!r} is used by no kernel")
            if ten.persistent and ten.free_after is not None:
                raise GraphError(f"tensor {ten.key!r}: a persistent tensor is never freed (drop free_after)")
            if ten.free_after is not None and not us[-1][0] <= ten.free_after < len(self.kernels):
                raise GraphError(
                    f"tensor {ten.key!r}: free_after {ten.free_after} must lie between its last use "
                    f"(kernel {us[-1][0]}) and the last kernel ({len(self.kernels) - 1})"
                )

    def with_capacity(self, capacity: int) -> Graph:
        """The same graph with the fastest device's capacity set to ``capacity`` bytes (the
        iterative limit reduction plans below the real budget this way)."""
        devs = [Device(self.devices[0].name, int(capacity), self.devices[0].duplex), *self.devices[1:]]
        return Graph(self.name, devs, self.copy_gbps, self.tensors, self.kernels, self.overhead_seconds, self.copy_contention)

    def budget_note(self) -> str | None:
        """When the fast device is smaller than some kernel's working set (its operands
        together), say so, naming the largest such kernel and the numbers: no plan can hold
        that kernel's operands in fast memory at once, so every plan runs it with some on a
        slower device (the stated fallback; the synchronous model allows any operand on any
        device). None when every kernel's working set fits."""
        cap = self.devices[0].capacity
        assert cap is not None
        worst = max(range(len(self.kernels)), key=self.working_set, default=None)
        if worst is None or self.working_set(worst) <= cap:
            return None
        ws = self.working_set(worst)
        over = sum(1 for k in range(len(self.kernels)) if self.working_set(k) > cap)
        return (
            f"kernel {worst} ({self.kernels[worst].name}) works on {format_bytes(ws)} "
            f"({len(self.kernels[worst].operands)} tensors) but {self.devices[0].name} holds {format_bytes(cap)}; "
            f"it and {over - 1} other kernels run with some operands on slower devices in any plan "
            f"(a budget of {format_bytes(ws)} would hold them)"
        )

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "overhead_seconds": self.overhead_seconds,
            "copy_contention": self.copy_contention,
            "devices": [{"name": d.name, "capacity": d.capacity} | ({"duplex": True} if d.duplex else {}) for d in self.devices],
            "copy_gbps": self.copy_gbps,
            "tensors": [
                {"key": t.key, "bytes": t.bytes, "kind": t.kind, "persistent": t.persistent}
                | ({} if t.free_after is None else {"free_after": t.free_after})
                | ({"label": t.label} if t.label else {})
                for t in self.tensors
            ],
            "kernels": [
                {
                    "name": k.name,
                    "seconds": k.seconds,
                    "operands": [
                        {"tensor": o.tensor, "use": o.use, "seconds": list(o.seconds)}
                        | ({} if o.write_seconds is None else {"write_seconds": list(o.write_seconds)})
                        for o in k.operands
                    ],
                }
                for k in self.kernels
            ],
        }

    @classmethod
    def from_json(cls, doc: Any, source: str = "graph") -> Graph:
        """A graph from its JSON form; :class:`GraphError` names what is wrong."""
        try:
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
                raise GraphError(f"{source}: not a tiermem graph (format {got!r}, expected {FORMAT!r})")
            with _at(source, "devices"):
                devices = [Device(str(d["name"]), _opt_int(d["capacity"]), _bool(d.get("duplex", False))) for d in doc["devices"]]
            with _at(source, "copy_gbps"):
                copy = [[None if g is None else float(g) for g in row] for row in doc["copy_gbps"]]
            tensors = []
            for i, t in enumerate(doc["tensors"]):
                with _at(source, f"tensor {i}"):
                    tensors.append(
                        Tensor(
                            str(t["key"]),
                            _int(t["bytes"]),
                            str(t.get("kind", "activation")),
                            _bool(t.get("persistent", False)),
                            _opt_int(t.get("free_after")),
                            str(t.get("label", "")),
                        )
                    )
            kernels: list[Kernel] = []
            for k in doc["kernels"]:
                if "seconds" not in k:
                    raise GraphError(f"{source}: kernel {len(kernels)} ({k.get('name')}) has no profile (no 'seconds')")
                with _at(source, f"kernel {len(kernels)} ({k.get('name')})"):
                    ops = tuple(
                        Operand(
                            _int(o["tensor"]),
                            str(o["use"]),
                            tuple(float(s) for s in o["seconds"]),
                            None if o.get("write_seconds") is None else tuple(float(s) for s in o["write_seconds"]),
                        )
                        for o in k["operands"]
                    )
                    kernels.append(Kernel(str(k["name"]), float(k["seconds"]), ops))
            with _at(source, "overhead_seconds"):
                over = float(doc.get("overhead_seconds", 0.0))
            share = float(doc.get("copy_contention", 0.0))
            return cls(str(doc.get("name", source)), devices, copy, tensors, kernels, over, share)
        except GraphError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise GraphError(f"{source}: malformed graph ({type(e).__name__}: {e})") from None

    def save(self, path: str | Path) -> None:
        """Write the JSON form (to a temporary name, synced and renamed)."""
        write_json_atomic(str(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Graph:
        return cls.from_json(read_json(path, "graph"), str(path))


def read_json(path: str | Path, what: str) -> Any:
    """A JSON file's contents; :class:`GraphError` when it cannot be read or is not JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise GraphError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise GraphError(f"{path}: not JSON ({e})") from None
    except RecursionError:
        raise GraphError(f"{path}: JSON nested too deeply to be a {what}") from None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise ValueError(f"expected an integer, got {x!r}")
    return x


@contextlib.contextmanager
def _at(source: str, where: str) -> Iterator[None]:
    """Name the part of the graph a parse error is in."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise GraphError(f"{source}: malformed graph at {where} ({type(e).__name__}: {e})") from None


#: The longest time a graph may give one kernel or copy: a day. Planned sums of times stay
#: finite however many kernels a graph has.
MAX_SECONDS = 86_400.0


#: The slowest copy a graph may give (1 kB/s): copy times stay finite for any tensor.
MIN_GBPS = 1e-6


def _time(x: Any) -> bool:
    """Whether ``x`` is a time a graph may give: finite, from 0 to :data:`MAX_SECONDS`."""
    return _finite(x) and 0 <= x <= MAX_SECONDS


def _bool(x: Any) -> bool:
    if not isinstance(x, bool):
        raise ValueError(f"expected true or false, got {x!r}")
    return x


def _opt_int(x: Any) -> int | None:
    return None if x is None else _int(x)
