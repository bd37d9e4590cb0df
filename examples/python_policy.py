"""A policy written in Python against the data-manager API (thesis Tables 4.4 and 4.5).

This one keeps at most `limit` objects in fast memory and evicts the largest first.
"""

import tiermem
from tiermem.policies import SLOW


class LargestFirst:
    name = "largest-first"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sizes: dict[int, int] = {}

    def _in_fast(self, api, obj):
        return api.device_of(api.primary(obj)) == 0

    def _make_room(self, api, nbytes):
        fast = sorted((o for o in self.sizes if self._in_fast(api, o) and api.pins(o) == 0), key=lambda o: -self.sizes[o])
        while fast and (len(fast) >= self.limit or not api.fits(0, nbytes)):
            api.evict_object(fast.pop(0))  # Listing 4.1: write back if dirty, else just drop

    def alloc(self, api, nbytes, place):
        if place == SLOW:
            obj = api.create_object(len(api.devices()) - 1, nbytes)
        else:
            self._make_room(api, nbytes)
            obj = api.create_object(0, nbytes) or api.create_object(1, nbytes)
        self.sizes[obj] = nbytes
        return obj

    def before_access(self, api, obj, write):
        if not self._in_fast(api, obj):
            self._make_room(api, self.sizes[obj])
            api.prefetch_object(obj, 0, False)  # Listing 4.2: keeps the slow copy linked

    def unsafe_free(self, api, obj):
        api.destroy_object(obj)
        del self.sizes[obj]


m = tiermem.Manager({"dram": "16 MiB", "emulated:cxl": "256 MiB"}, policy=LargestFirst(limit=3))
small = m.array(1 << 16, "uint8", fill=1)
big = m.array(1 << 22, "uint8", fill=2)
mid = m.array(1 << 20, "uint8", fill=3)
extra = m.array(1 << 18, "uint8", fill=4)  # a fourth object: the largest (`big`) is evicted
print({name: a.device for name, a in [("small", small), ("big", big), ("mid", mid), ("extra", extra)]})
assert big.device == "emulated:cxl" and small.in_fast
m.check()
