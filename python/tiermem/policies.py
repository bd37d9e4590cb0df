"""Writing a policy in Python.

A policy is any object with an ``alloc(api, nbytes, place)`` method; it may also define
``prefetch(api, id, force)``, ``evict(api, id)``, ``softevict(api, id)``,
``read_use(api, id)``, ``write_use(api, id)``, ``unsafe_free(api, id)``,
``before_access(api, id, write)`` and ``after_access(api, id, write)`` (thesis Table 4.5).
Methods left out fall back to the built-in mechanisms (evict: Listing 4.1; prefetch:
Listing 4.2; before_access: stage block-resident data into memory).

``api`` is a :class:`DataApi`, the data-manager API of thesis Table 4.4: ``devices()``,
``create_object(device, nbytes)``, ``destroy_object(id)``, ``primary(id)``,
``set_primary(id, region)``, ``allocate(device, nbytes, id)``, ``free(region)``,
``link(a, b)``, ``unlink(a, b)``, ``copyto(dst, src)``, ``sizeof(region)``,
``getlinked(region, device)``, ``device_of(region)``, ``markdirty(region)``,
``markclean(region)``, ``isdirty(region)``, ``parent(region)``, ``offset(region)``,
``pins(id)``, ``fits(device, nbytes)``, ``evict_object(id)``,
``prefetch_object(id, device=0, force=False)`` and
``evict_from(device, start, nbytes, callback)``. It is valid only during the call it is
passed to. Every call runs under the manager's lock.

``place`` is :data:`FAST`, :data:`SLOW`, :data:`AUTO` (negative codes) or a device index.
"""

from __future__ import annotations

from typing import Any, Protocol

from ._tiermem import PLACES as _PLACES
from ._tiermem import DataApi

__all__ = ["PolicyProtocol", "DataApi", "FAST", "SLOW", "AUTO", "FifoPolicy"]

#: Place codes (the core's ``Place::CODES``, exported by the binding).
FAST, SLOW, AUTO = _PLACES["fast"], _PLACES["slow"], _PLACES["auto"]


class PolicyProtocol(Protocol):
    """The one method a Python policy must have."""

    def alloc(self, api: DataApi, nbytes: int, place: int) -> int: ...


class FifoPolicy:
    """Example policy: new objects in fast memory, evicting the oldest first (FIFO).

    Shows the data-manager API; tests use it to prove Python policies work.
    """

    name = "fifo"

    def __init__(self) -> None:
        self.order: list[int] = []

    def alloc(self, api: DataApi, nbytes: int, place: int) -> int:
        device = place if place >= 0 else (len(api.devices()) - 1 if place == SLOW else 0)
        obj = api.create_object(device, nbytes)
        while obj is None and device == 0 and self._evict_oldest(api):
            obj = api.create_object(device, nbytes)
        if obj is None:
            for d in range(device + 1, len(api.devices())):
                obj = api.create_object(d, nbytes)
                if obj is not None:
                    break
        if obj is None:
            raise MemoryError(f"no device has {nbytes} bytes free")
        self.order.append(obj)
        return obj

    def _evict_oldest(self, api: DataApi) -> bool:
        for obj in list(self.order):
            if api.device_of(api.primary(obj)) == 0 and api.pins(obj) == 0:
                api.evict_object(obj)
                return True
        return False

    def unsafe_free(self, api: DataApi, obj: int) -> None:
        api.destroy_object(obj)
        self.order.remove(obj)

    def before_access(self, api: DataApi, obj: int, write: bool) -> Any:
        # Bring into fast memory if it fits, else use it where it is (staging block data).
        if not api.prefetch_object(obj, 0, False):
            region = api.primary(obj)
            if api.device_of(region) != 0 and self._evict_oldest(api):
                api.prefetch_object(obj, 0, False)
        return None
