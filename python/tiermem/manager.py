"""The :class:`Manager` facade: devices, a policy, tiered arrays, counters."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import _tiermem
from ._sizes import parse_size
from .array import TieredArray
from .exceptions import InvalidArgumentError
from .traits import Traits, TraitsLike

__all__ = ["Manager", "DeviceList"]

#: Devices, fastest first: ``{"dram": "256 MiB", "emulated:optane-pmem": "2 GiB"}``, or a
#: list of ``(spec, capacity)`` pairs or ``"spec=capacity"`` strings.
DeviceList = Mapping[str, int | str] | Iterable[tuple[str, int | str] | str]

#: Place names and the codes the core takes them by (the core's ``Place::CODES``).
_PLACES: dict[str, int] = dict(_tiermem.PLACES)


def _parse_devices(devices: DeviceList) -> list[tuple[str, int]]:
    if isinstance(devices, Mapping):
        items = list(devices.items())
    elif isinstance(devices, (str, bytes)):
        raise InvalidArgumentError("devices must be a mapping or a list, not a single string")
    else:
        items = []
        for d in devices:
            if isinstance(d, str):
                spec, sep, size = d.rpartition("=")
                if not sep:
                    raise InvalidArgumentError(f"device {d!r} needs a capacity: '{d}=256MiB'")
                items.append((spec, size))
            else:
                items.append((d[0], d[1]))
    if not items:
        raise InvalidArgumentError("a manager needs at least one device")
    return [(str(s), parse_size(c, f"capacity of {s!r}")) for s, c in items]


def _layout(shape: int | Iterable[int], dtype: Any) -> tuple[tuple[int, ...], np.dtype, int]:
    """A checked shape, dtype and byte count for a tiered array."""
    shp = (shape,) if isinstance(shape, int) else tuple(shape)
    if not shp or any(not isinstance(s, (int, np.integer)) or isinstance(s, bool) for s in shp):
        raise InvalidArgumentError(f"shape must be positive integers, got {shape!r}")
    if any(s <= 0 for s in shp):
        raise InvalidArgumentError(f"every dimension must be above zero, got shape {shp}")
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0:
        raise InvalidArgumentError(f"dtype {dt} cannot live in tiered memory (objects or empty)")
    nbytes = math.prod(int(s) for s in shp) * dt.itemsize
    if nbytes >= 2**63:
        raise InvalidArgumentError(f"array of shape {shp} and dtype {dt} overflows: {nbytes} bytes")
    return tuple(int(s) for s in shp), dt, nbytes


class Manager:
    """Manages objects over devices ordered fastest first, under a policy.

    Args:
        devices: devices and their capacities, fastest first, e.g.
            ``{"dram": "256 MiB", "emulated:optane-pmem": "2 GiB"}``. Kinds: ``dram``,
            ``numa:N``, ``interleave:NODES``, ``mapped:PATH``, ``block:PATH``,
            ``emulated:PROFILE``, or a memory space (``hbw``, ``low_lat``, ``large_cap``,
            ``interleave:SPACE``).
        policy: ``"lru"`` (default), ``"lru_in_place"`` (as lru, but guards use data where it is), ``"all_fast"``, ``"all_slow"``, ``"first_touch"``,
            ``"2lm_model"`` (every object on the slowest device, the fastest device as the 2LM
            model's cache; ``"2lm_model:LINE"`` for coarser lines, see :mod:`tiermem.twolm`),
            or an object implementing the policy protocol (see :mod:`tiermem.policies`).
        copy_threads: optional ``{(src, dst): threads}`` for the copy engine.

    Raises:
        UnknownDeviceError, InvalidArgumentError, DeviceFullError, DeviceIOError: for bad
        specs, sizes, paths, or a heap larger than the machine.
    """

    def __init__(
        self,
        devices: DeviceList,
        policy: str | Any = "lru",
        *,
        copy_threads: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        parsed = _parse_devices(devices)
        self._native = _tiermem.Manager(parsed, policy)
        self._devices = parsed
        self._copy_threads = {tuple(k): int(v) for k, v in (copy_threads or {}).items()}
        self._python_policy = None if isinstance(policy, str) else policy
        # The core's names: a spec's `?overwrite` option is not part of the device's name.
        self.device_names: list[str] = [d["name"] for d in self._native.devices()]
        self._traited: _tiermem.Traited | None = None
        self._traited_lock = threading.Lock()
        for (src, dst), n in (copy_threads or {}).items():
            self._native.set_pair_threads(src, dst, int(n))

    @property
    def config(self) -> dict[str, Any]:
        """What built this manager, as plain JSON-able data (device capacities as rounded
        up by the devices); :meth:`from_config` rebuilds an equivalent manager from it."""
        return {
            "devices": [[spec, cap] for spec, cap in self._devices],
            "policy": self.policy,
            "copy_threads": [[s, d, n] for (s, d), n in self._copy_threads.items()],
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any], policy: Any = None) -> Manager:
        """Rebuild a manager from :attr:`config`. A Python policy cannot be serialised: pass
        the object as ``policy`` (it overrides the name in the config)."""
        try:
            devices = [(str(s), c) for s, c in config["devices"]]
            threads = {(str(s), str(d)): int(n) for s, d, n in config.get("copy_threads", [])}
            pol = policy if policy is not None else str(config["policy"])
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgumentError(f"not a tiermem manager config: {e!r}") from e
        return cls(devices, pol, copy_threads=threads)

    @property
    def policy(self) -> str:
        """Name of the policy."""
        return str(self._native.policy_name())

    def _place(self, where: str | int) -> int:
        if isinstance(where, int) and not isinstance(where, bool):
            if not 0 <= where < len(self.device_names):
                raise InvalidArgumentError(f"device index {where} out of range 0..{len(self.device_names) - 1}")
            return where
        if where in _PLACES:
            return _PLACES[where]
        if where in self.device_names:
            return self.device_names.index(where)
        raise InvalidArgumentError(f"where={where!r}: use 'auto', 'fast', 'slow', a device index or one of {self.device_names}")

    def array(
        self,
        shape: int | Iterable[int],
        dtype: Any = "float32",
        where: str | int = "auto",
        fill: Any = None,
    ) -> TieredArray:
        """Allocate a tiered array.

        Args:
            shape: dimensions (all positive).
            dtype: any fixed-size numpy dtype.
            where: ``"auto"`` (the policy decides), ``"fast"`` (``alloc_fast``), ``"slow"``
                (``alloc_slow``), or a device name or index.
            fill: optional value to initialise every element with.
        """
        shp, dt, nbytes = _layout(shape, dtype)
        obj = self._native.alloc(nbytes, self._place(where))
        arr = TieredArray(self, obj, shp, dt)
        if fill is not None:
            with arr.write(overwrite=True) as v:
                v.fill(fill)
        return arr

    # ------------------------------------------------------------------ traits (H2M)

    def _traits(self) -> _tiermem.Traited:
        with self._traited_lock:  # one registry per manager, whichever thread comes first
            if self._traited is None:
                self._traited = _tiermem.Traited(self._native)
            return self._traited

    def alloc(self, shape: int | Iterable[int], dtype: Any = "float32", traits: TraitsLike | None = None) -> TieredArray:
        """Allocate a tiered array where its traits (:mod:`tiermem.traits`) say: the first
        device of its required or preferred space with room, then the others as its
        ``fallback`` allows. Best with a policy that does not move data on its own
        (``first_touch``); under ``lru`` the traits choose where it starts."""
        return self.commit([(shape, dtype, traits)])[0]

    def commit(
        self, declarations: Iterable[tuple[int | Iterable[int], Any, TraitsLike | None]], strategy: str = "fifo"
    ) -> list[TieredArray]:
        """Allocate ``(shape, dtype, traits)`` declarations together, claiming devices in
        ``strategy``'s order (``fifo``, ``size``, ``priority``, ``gain``); returns the arrays
        in declaration order. All or nothing: a declaration that cannot be placed frees the
        others and raises."""
        decls = [(*_layout(s, d), Traits.of(t)) for s, d, t in declarations]
        placed = self._traits().commit([(nb, t.pairs) for _, _, nb, t in decls], strategy)
        return [TieredArray(self, obj, shp, dt) for (obj, _), (shp, dt, _, _) in zip(placed, decls, strict=True)]

    def update_traits(self, array: TieredArray, traits: TraitsLike) -> None:
        """Give an array allocated by traits new ones; it moves at :meth:`apply_migration`."""
        self._traits().update_traits(int(array.id), Traits.of(traits).pairs)

    def traits_of(self, array: TieredArray) -> dict[str, Any] | None:
        """The typed traits an array was allocated or last updated with (None: no traits)."""
        return self._traits().traits_of(int(array.id))

    def apply_migration(self, arrays: Iterable[TieredArray] | None = None, strategy: str = "fifo") -> list[dict[str, Any]]:
        """Place the arrays allocated by traits again (``arrays``: only these) by their
        current traits, in ``strategy``'s order, and move those whose device changes (moves
        to slower devices first, making room). Returns per object ``object``, ``from``,
        ``to``, ``now`` (device indices) and ``note`` (why ``now`` is not ``to``: an open
        guard pins it, or no contiguous room)."""
        only = None if arrays is None else [int(a.id) for a in arrays]
        return self._traits().apply_migration(only, strategy)

    def memory_spaces(self) -> dict[str, Any]:
        """The memory spaces over this manager's devices: ``{"names": [...], "spaces":
        [[space, [device indices], why]]}``."""
        return self._traits().spaces()

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters per device: bytes read and written (copy engine and kernels), moves in
        and out, evictions, dirty write-backs, write-backs elided, allocation failures."""
        return self._native.stats()

    def reset_stats(self) -> None:
        """Zero every counter and restart peak-use measurement."""
        self._native.reset_stats()

    def usage(self) -> dict[str, dict[str, int]]:
        """Bytes used now, the peak since creation or the last :meth:`reset_stats`, and the
        capacity, per device."""
        return {n: {"used": u, "peak": p, "capacity": c} for n, u, p, c in self._native.usage()}

    @property
    def devices(self) -> list[dict[str, Any]]:
        """Device descriptions (kind, capacity, byte-addressable, real or emulated, figures)."""
        return self._native.devices()

    def check(self) -> None:
        """Raise ``AssertionError`` if any manager invariant is broken (for tests)."""
        self._native.check()

    def policy_stats(self) -> dict[str, Any] | None:
        """What the policy counts itself, or None: for ``2lm_model``, the model's thesis Table 2.2
        events (``read_hit``, ..., ``write_hit``, ``write_miss_clean``, ``ddo``), traffic and
        hit rate."""
        s = self._native.policy_stats()
        if s is None:
            return None
        if isinstance(s.get("events"), list):
            s["events"] = dict(zip(_tiermem.TwoLmModel.EVENT_NAMES, s["events"]))
        return s

    @property
    def object_count(self) -> int:
        """Live objects."""
        return int(self._native.object_count())

    @contextmanager
    def record(self, interval: float = 0.01) -> Iterator[list[dict[str, Any]]]:
        """Record bytes read and written per device every ``interval`` seconds::

        with m.record(0.005) as trace:
            work()
        trace  # [{"t": 0.005, "read": {...}, "written": {...}}, ...]
        """
        rec = self._native.record(float(interval))
        samples: list[dict[str, Any]] = []
        try:
            yield samples
        finally:
            samples.extend(rec.finish())

    def __repr__(self) -> str:
        devs = ", ".join(f"{n}: {u['used']}/{u['capacity']}" for n, u in self.usage().items())
        return f"Manager(policy={self.policy!r}, {devs})"
