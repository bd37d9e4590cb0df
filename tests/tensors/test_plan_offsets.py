"""Heap offsets of plans: residencies cover exactly the bytes the cost model counts, no two
residencies that meet in time share a byte, the layout reaches near the peak, the limit
reduction ends with offsets that fit, and plans with offsets round-trip and are checked."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_graphs import spaced

from tiermem.plan import (
    Device,
    Graph,
    GraphError,
    Kernel,
    Operand,
    Overlap,
    Plan,
    Tensor,
    assign,
    autotm_graph,
    evaluate,
    fit,
    residencies,
    solve,
)
from tiermem.plan.offsets import MEMORY_ALIGN
from tiermem.plan.plan import gaps

pytest.importorskip("highspy")

MiB = 1 << 20


def _small(sizes: list[int], cap: int) -> Graph:
    """Four kernels over a weight, two activations and a gradient (sizes given)."""
    keys = [("w", "parameter", True), ("a", "activation", False), ("b", "activation", False), ("g", "gradient", False)]
    tensors = [Tensor(k, s, kind, p) for (k, kind, p), s in zip(keys, sizes, strict=True)]
    kernels = [
        Kernel("fwd1", 1e-3, (Operand(0, "read", (0.0, 3e-4)), Operand(1, "make", (0.0, 8e-4)))),
        Kernel("fwd2", 1e-3, (Operand(1, "read", (0.0, 6e-4)), Operand(2, "make", (0.0, 4e-4)))),
        Kernel("bwd", 2e-3, (Operand(2, "read", (0.0, 3e-4)), Operand(1, "read", (0.0, 6e-4)), Operand(3, "make", (0.0, 0.0)))),
        Kernel("sgd", 1e-4, (Operand(3, "read", (0.0, 3e-4)), Operand(0, "write", (0.0, 9e-4)))),
    ]
    return Graph("random", [Device("fast", cap), Device("slow", None)], [[None, 5.0], [5.0, None]], tensors, kernels)


def _meets(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    return any(lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in a for lo2, hi2 in b)


def _check_layout(g: Graph, at: list[list[int]], held: list[list[bool]], overlap: Overlap | None = None) -> None:
    res = residencies(g, at, held, overlap)
    # Unbounded, so that every residency gets its offset (one past the capacity gets none).
    off = assign(g.with_capacity(1 << 50), at, held, overlap)
    n = len(g.kernels)
    for d in range(g.home):
        mine = [r for r in res if r.device == d]
        # Per kernel, the residencies' bytes are the cost model's usage: their peak is its peak.
        usage = [sum(g.tensors[r.tensor].bytes for r in mine if any(lo <= k <= hi for lo, hi in r.spans)) for k in range(n)]
        assert max(usage, default=0) == evaluate(g, at, held, overlap).peak[d]
        for r in mine:
            o = off.at_use[r.tensor][r.uses[0]]
            assert o is not None and o % MEMORY_ALIGN == 0
            assert all(off.at_use[r.tensor][j] == o for j in r.uses)
            assert o + r.bytes <= off.height[d]
        for r, s in itertools.combinations(mine, 2):
            if _meets(r.spans, s.spans):
                a, b = off.at_use[r.tensor][r.uses[0]], off.at_use[s.tensor][s.uses[0]]
                assert a is not None and b is not None
                assert a + r.bytes <= b or b + s.bytes <= a, (r, s, a, b)
        assert off.height[d] >= max(usage, default=0)
    # Every use on a fast device is in exactly one residency; home uses in none.
    for t, us in enumerate(g.uses):
        covered = sorted(j for r in res if r.tensor == t for j in r.uses)
        assert covered == [j for j in range(len(us)) if at[t][j] < g.home]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 64).map(lambda k: k * 64 * 1024), min_size=4, max_size=4),
    choice=st.data(),
)
def test_residencies_are_the_cost_models_bytes_and_never_overlap(sizes: list[int], choice: st.DataObject) -> None:
    g = _small(sizes, 64 * MiB)
    at, held = [], []
    for t, us in enumerate(g.uses):
        at.append([choice.draw(st.integers(0, 1)) for _ in us])
        held.append([choice.draw(st.booleans()) for _ in gaps(g, t)])
    _check_layout(g, at, held)


def test_layouts_of_generated_plans_reach_near_their_peak() -> None:
    for n in (122, 500):
        g = autotm_graph(n, 8.0)
        p = solve(g, "sync", time_limit=0)
        _check_layout(g, p.at_use, p.held)
        off = assign(g, p.at_use, p.held)
        assert off.height[0] <= 1.05 * evaluate(g, p.at_use, p.held).peak[0]


def test_fit_ends_with_offsets_that_fit() -> None:
    g = autotm_graph(122, 4.0)
    p0 = solve(g, "sync", time_limit=5)
    assert assign(g, p0.at_use, p0.held).height[0] > g.devices[0].capacity  # this graph needs the reduction
    p, tries = fit(g, "sync", time_limit=5)
    cap = g.devices[0].capacity
    assert tries[0]["capacity_bytes"] == cap and tries[0]["height_bytes"] > cap
    assert any(t["height_bytes"] <= cap for t in tries)
    best = max(t["capacity_bytes"] for t in tries if t["height_bytes"] <= cap)
    assert "planned for" in p.notes[-1]
    assert p.offsets is not None and p.check(g).overflow is None
    # Every fast use has its offset: nothing is left to the heap.
    assert all((o is not None) == (d < g.home) for offs, ds in zip(p.offsets, p.at_use) for o, d in zip(offs, ds))
    assert assign(g, p.at_use, p.held).height[0] <= cap
    assert all(t["capacity_bytes"] <= cap for t in tries) and best < cap
    # The first try's bound is at the full capacity: below every try's plan, the final one's too.
    assert tries[0]["bound_seconds"] is not None
    assert all(tries[0]["bound_seconds"] <= t["predicted_seconds"] * (1 + 1e-9) for t in tries)
    assert tries[0]["bound_seconds"] <= p.predicted_seconds * (1 + 1e-9)


def test_plans_with_offsets_round_trip_and_are_checked(tmp_path: Path) -> None:
    g = autotm_graph(32, 8.0)
    p = solve(g, "sync", time_limit=2)
    assert p.offsets is not None
    p.save(tmp_path / "p.json")
    q = Plan.load(tmp_path / "p.json")
    assert q.offsets == p.offsets and q.to_json() == p.to_json()
    t = next(t for t, ds in enumerate(p.at_use) if g.home in ds)
    j = p.at_use[t].index(g.home)
    bad = Plan.from_json(p.to_json())
    assert bad.offsets is not None
    bad.offsets[t][j] = 0
    with pytest.raises(GraphError, match="heap offset 0 on"):
        bad.check(g)
    bad.offsets[t] = []
    with pytest.raises(GraphError, match="offsets for"):
        bad.check(g)
    old = p.to_json()
    for d in old["tensors"]:
        del d["offsets"]
    assert Plan.from_json(old).offsets is None  # a plan without offsets: the heap chooses


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_residencies_cover_asynchronous_moves(data: st.DataObject) -> None:
    """Random plans with random asynchronous moves on a graph with room between uses: the
    residencies, extended by the kernels the copies overlap, count what the cost model counts."""
    g = spaced(cap=1 << 40)
    at = [data.draw(st.lists(st.integers(0, 1), min_size=len(us), max_size=len(us))) for us in g.uses]
    held = [data.draw(st.lists(st.booleans(), min_size=len(gaps(g, t)), max_size=len(gaps(g, t)))) for t in range(3)]
    ov = Overlap.none(g)
    for t in range(3):
        ov.ahead[t] = data.draw(st.lists(st.booleans(), min_size=len(ov.ahead[t]), max_size=len(ov.ahead[t])))
        ov.behind[t] = data.draw(st.lists(st.booleans(), min_size=len(ov.behind[t]), max_size=len(ov.behind[t])))
    _check_layout(g, at, held, ov)
