"""Allocation by traits (H2M): validated trait sets, the commit strategies on the slides'
DGEMM buffers, migration when traits change (data kept, pinned objects left with a note),
and bad input allocating nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tiermem import COMMIT_STRATEGIES, TRAIT_KEYS, Manager, Traits
from tiermem.exceptions import DeviceFullError, InvalidArgumentError

K = 256 << 10  # bytes
N = 2 * K // 8  # float64 elements: 512 KiB per buffer


def manager() -> Manager:
    return Manager({"dram": 4 * K, "emulated:optane-pmem": 64 * K}, policy="first_touch")


def where(m: Manager, a) -> int:
    return m._native.placement(a.id)[0]


def dgemm(m: Manager, strategy: str):
    """The slides' DGEMM buffers: A (hbw, prio 1), B (low_lat, prio 15), C (hbw, prio 5)."""
    return m.commit(
        [
            (N, "float64", {"preferred": "hbw", "priority": 1}),
            (N, "float64", Traits(preferred="low_lat", priority=15)),
            (N, "float64", {"space": "hbw", "priority": 5}),
        ],
        strategy,
    )


def test_vocabularies_come_from_the_core() -> None:
    assert {"required", "preferred", "priority", "gain", "fallback"} <= set(TRAIT_KEYS)
    assert COMMIT_STRATEGIES == ("fifo", "size", "priority", "gain")


def test_traits_are_validated_and_typed() -> None:
    t = Traits(required=["hbw", "low_lat"], sensitivity="bandwidth|latency", pattern="strided", stride=64, priority=2.5)
    assert t.fields["required"] == ["hbw", "low_lat"] and t.fields["stride"] == 64
    assert t.fields["bandwidth_sensitive"] and t.fields["latency_sensitive"] and t.fields["priority"] == 2.5
    assert Traits.of({"priority": 3}) == Traits(priority=3)
    assert Traits(space="hbw") == Traits(preferred="hbw") and hash(Traits(space="hbw")) == hash(Traits(preferred="hbw"))
    for kw, msg in [
        ({"colour": "red"}, 'unknown trait "colour"'),
        ({"required": "fast"}, 'unknown memory space "fast"'),
        ({"stride": 8}, "without pattern=strided"),
        ({"priority": None}, "give a name or a number"),
        ({"access": "sometimes"}, "is not one of read, write, read_write"),
    ]:
        with pytest.raises(InvalidArgumentError, match=msg):
            Traits(**kw)
    with pytest.raises(InvalidArgumentError, match="Traits or a dict"):
        Traits.of(["hbw"])  # type: ignore[arg-type]


def test_the_managers_spaces() -> None:
    m = manager()
    sp = {s: d for s, d, _ in m.memory_spaces()["spaces"]}
    assert sp["hbw"] == [0] and sp["low_lat"] == [0] and sp["large_cap"] == [1]


@pytest.mark.parametrize("strategy, want", [("fifo", [0, 0, 1]), ("size", [0, 0, 1]), ("priority", [1, 0, 0])])
def test_commit_strategies_on_the_dgemm_buffers(strategy: str, want: list[int]) -> None:
    m = manager()
    arrs = dgemm(m, strategy)
    assert [where(m, a) for a in arrs] == want
    m.check()


def test_gain_puts_the_fast_bytes_where_they_save_most() -> None:
    m = manager()
    big_warm = (N * 2, "float64", {"gain": 1.5})  # 1 MiB, 1.5 s/MiB: fills the fast device alone
    small_hot = (N // 2, "float64", {"gain": 1.0})  # 256 KiB, 4 s/MiB
    mid = (N, "float64", {"gain": 1.2})  # 512 KiB, 2.4 s/MiB
    arrs = m.commit([big_warm, small_hot, mid], "gain")
    assert [where(m, a) for a in arrs] == [1, 0, 0]  # 2.2 s saved
    by_size = manager()
    arrs = by_size.commit([big_warm, small_hot, mid], "size")
    assert [where(by_size, a) for a in arrs] == [0, 1, 1]  # 1.5 s saved


def test_migration_follows_new_traits_and_keeps_the_data() -> None:
    m = manager()
    a, b, c = dgemm(m, "priority")
    assert (where(m, a), where(m, c)) == (1, 0)
    with a.write() as v:
        v[:] = np.arange(N)
    with c.write() as v:
        v[:] = -1.0
    m.update_traits(a, {"preferred": "hbw", "priority": 20})
    assert m.traits_of(a)["priority"] == 20
    moved = {r["object"]: r for r in m.apply_migration(strategy="priority")}
    assert moved[a.id]["now"] == 0 and moved[c.id]["now"] == 1 and moved[b.id]["now"] == 0
    assert all(r["note"] is None for r in moved.values())
    with a.read() as v:
        assert np.array_equal(v, np.arange(N))
    with c.read() as v:
        assert (v == -1.0).all()
    m.check()


def test_a_pinned_array_stays_with_a_note() -> None:
    m = manager()
    a, _, _ = dgemm(m, "fifo")
    m.update_traits(a, {"preferred": "large_cap"})
    with a.read():
        (r,) = m.apply_migration([a])
    assert (r["from"], r["to"], r["now"]) == (0, 1, 0) and "pinned" in r["note"]
    (r,) = m.apply_migration([a])
    assert r["now"] == 1 and r["note"] is None
    m.check()


def test_bad_requests_allocate_nothing() -> None:
    m = manager()
    strict = {"required": "hbw", "fallback": "error"}
    with pytest.raises(InvalidArgumentError, match=r"no device the traits allow has room .* \(tried \[dram\]"):
        m.commit([(N, "float64", strict)] * 3)
    assert m.object_count == 0
    with pytest.raises(InvalidArgumentError, match="required spaces hbw and large_cap share no device"):
        m.alloc(N, "float64", {"required": "hbw|large_cap", "fallback": "error"})
    with pytest.raises(DeviceFullError):
        m.commit([(64 * K, "uint8", None)] * 2)
    assert m.object_count == 0
    with pytest.raises(InvalidArgumentError, match="unknown commit strategy"):
        m.commit([(N, "float64", None)], "lifo")
    plain = m.array(N, "float64")
    with pytest.raises(InvalidArgumentError, match="was not allocated with traits"):
        m.update_traits(plain, {"priority": 1})
    with pytest.raises(InvalidArgumentError, match="every dimension must be above zero"):
        m.alloc(0)


def test_threads_allocating_and_migrating_keep_the_invariants() -> None:
    """Whatever the schedule: every array ends on a device, its data intact, and the
    manager's invariants hold."""
    m = Manager({"dram": 16 * K, "emulated:optane-pmem": 256 * K}, policy="first_touch")
    errors: list[BaseException] = []
    made: list = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for i in range(20):
                (arr,) = m.commit([(1024, "float64", {"priority": int(rng.integers(0, 10))})], "priority")
                with arr.write() as v:
                    v[:] = seed * 1000 + i
                with lock:
                    made.append((arr, seed * 1000 + i))
                m.update_traits(arr, {"priority": int(rng.integers(0, 10)), "space": "hbw"})
                m.apply_migration(strategy="priority")
        except BaseException as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for arr, val in made:
        with arr.read() as v:
            assert (v == val).all()
    m.check()
