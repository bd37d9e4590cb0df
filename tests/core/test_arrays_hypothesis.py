"""Hypothesis: random sequences of array operations keep data and manager invariants."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiermem

ops = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(1, 400_000), st.sampled_from(["auto", "fast", "slow"])),
        st.tuples(st.just("write"), st.integers(0, 50), st.integers(0, 255)),
        st.tuples(st.just("evict"), st.integers(0, 50)),
        st.tuples(st.just("prefetch"), st.integers(0, 50), st.booleans()),
        st.tuples(st.just("soft"), st.integers(0, 50)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    ),
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, policy=st.sampled_from(tiermem.BUILTIN_POLICIES))
def test_random_operations_never_lose_data(ops: list[tuple], policy: str) -> None:
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "4 MiB"}, policy=policy)
    live: list[tuple[tiermem.TieredArray, int]] = []
    for op in ops:
        try:
            if op[0] == "new":
                live.append((m.array(op[1], "uint8", where=op[2], fill=0), 0))
            elif live and op[0] == "write":
                i = op[1] % len(live)
                with live[i][0].write() as v:
                    v[:] = op[2]
                live[i] = (live[i][0], op[2])
            elif live and op[0] == "evict":
                live[op[1] % len(live)][0].evict()
            elif live and op[0] == "prefetch":
                live[op[1] % len(live)][0].prefetch(force=op[2])
            elif live and op[0] == "soft":
                live[op[1] % len(live)][0].softevict()
            elif live and op[0] == "free":
                a, _ = live.pop(op[1] % len(live))
                a.free()
        except (tiermem.DeviceFullError, tiermem.GuardError):
            pass
        m.check()
    for a, value in live:
        got = a.to_numpy()
        assert (got == value).all()
    for a, _ in live:
        a.free()
    assert all(u["used"] == 0 for u in m.usage().values())
