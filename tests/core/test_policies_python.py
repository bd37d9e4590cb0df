"""Policies written in Python against the data-manager API."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tiermem
from tiermem.policies import FifoPolicy


def test_fifo_policy_evicts_oldest_first() -> None:
    pol = FifoPolicy()
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "16 MiB"}, policy=pol)
    assert m.policy == "fifo"
    arrs = [m.array(300_000, "uint8", fill=i) for i in range(5)]
    assert [a.in_fast for a in arrs] == [False, False, True, True, True]
    for i, a in enumerate(arrs):
        assert int(a.to_numpy()[0]) == i
    arrs[0].free()
    assert arrs[0].id not in pol.order
    m.check()


class Recording:
    """Uses the raw Table 4.4 API: allocate, link, copy, set primary, evict_from."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def alloc(self, api: Any, nbytes: int, place: int) -> int:
        self.calls.append("alloc")
        obj = api.create_object(0, nbytes)
        if obj is None:
            regions: list[int] = []

            def cb(region: int) -> None:
                regions.append(region)
                api.evict_object(api.parent(region))

            span = api.evict_from(0, 0, nbytes, cb)
            assert span is not None and regions
            obj = api.create_object(0, nbytes)
        return obj

    def prefetch(self, api: Any, obj: int, force: bool) -> None:
        self.calls.append("prefetch")
        x = api.primary(obj)
        if api.device_of(x) == 0:
            return
        y = api.allocate(0, api.sizeof(x), obj)
        if y is None:
            return
        api.copyto(y, x)
        api.link(x, y)
        api.set_primary(obj, y)

    def read_use(self, api: Any, obj: int) -> None:
        self.calls.append("read_use")

    def write_use(self, api: Any, obj: int) -> None:
        self.calls.append("write_use")
        assert api.isdirty(api.primary(obj))


def test_table_4_4_api_from_python() -> None:
    pol = Recording()
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "16 MiB"}, policy=pol)
    a = m.array(700_000, "uint8", fill=5)
    b = m.array(700_000, "uint8", fill=6)  # evict_from makes room by evicting `a`
    assert not a.in_fast and b.in_fast
    b.evict()
    a.prefetch()
    assert a.in_fast and a.placement["siblings"] == ["emulated:cxl"]
    assert int(a.to_numpy()[0]) == 5 and int(b.to_numpy()[0]) == 6
    assert {"alloc", "prefetch", "read_use", "write_use"} <= set(pol.calls)
    m.check()


def test_data_api_is_dead_after_its_call() -> None:
    kept: list[Any] = []

    class Leaky:
        def alloc(self, api: Any, nbytes: int, place: int) -> int:
            kept.append(api)
            return api.create_object(0, nbytes)

    m = tiermem.Manager({"dram": "1 MiB"}, policy=Leaky())
    m.array(10)
    with pytest.raises(tiermem.GuardError, match="after the policy call"):
        kept[0].devices()


def test_policy_errors_are_reported_and_nothing_leaks() -> None:
    class Broken:
        name = "broken"

        def alloc(self, api: Any, nbytes: int, place: int) -> int:
            raise ValueError("no room at the inn")

    m = tiermem.Manager({"dram": "1 MiB"}, policy=Broken())
    with pytest.raises(tiermem.PolicyError, match="broken.*ValueError: no room at the inn"):
        m.array(10)

    class Liar:
        def alloc(self, api: Any, nbytes: int, place: int) -> int:
            return 12345

    m = tiermem.Manager({"dram": "1 MiB"}, policy=Liar())
    with pytest.raises(tiermem.NoSuchObjectError):
        m.array(10)
    assert m.object_count == 0


def test_python_policy_sees_manager_rules() -> None:
    class Evil:
        def alloc(self, api: Any, nbytes: int, place: int) -> int:
            return api.create_object(0, nbytes)

        def evict(self, api: Any, obj: int) -> None:
            api.free(api.primary(obj))  # freeing a primary without a replacement

    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "4 MiB"}, policy=Evil())
    a = m.array(100, "uint8", fill=1)
    with a.read():
        with pytest.raises(tiermem.PinnedError):
            a.evict()  # the manager refuses before the policy runs
    with pytest.raises(tiermem.PolicyError, match="is the primary of object"):
        a.evict()  # the data manager refuses to free a live primary
    np.testing.assert_array_equal(a.to_numpy(), np.ones(100, "uint8"))
    m.check()


def test_calling_the_manager_from_inside_a_policy_is_refused_not_deadlocked() -> None:
    holder: dict[str, Any] = {}

    class Reentrant:
        name = "reentrant"

        def alloc(self, api: Any, nbytes: int, place: int) -> int:
            holder["m"].array(4)  # would need the manager lock held by this very call
            return api.create_object(0, nbytes)

    m = tiermem.Manager({"dram": "1 MiB"}, policy=Reentrant())
    holder["m"] = m
    with pytest.raises(tiermem.PolicyError, match="only the DataApi"):
        m.array(10)
    assert m.object_count == 0
