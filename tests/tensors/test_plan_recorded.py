"""A runtime policy's decisions as a plan (``plan.recorded``), priced by the cost model, and
plans given to the solver as incumbents."""

from __future__ import annotations

import dataclasses

import pytest
from plan_graphs import MiB, small

from tiermem.plan import GraphError, Plan, at_home, autotm_graph, evaluate, recorded, solve
from tiermem.plan.plan import gaps

pytest.importorskip("highspy")


def places_of(g, at_use: list[list[int]]) -> list[list[int]]:
    """Each kernel's operand devices under ``at_use`` (what a recorder of that plan sees)."""
    use_of = [{k: j for j, (k, _) in enumerate(us)} for us in g.uses]
    return [[at_use[o.tensor][use_of[o.tensor][k]] for o in ker.operands] for k, ker in enumerate(g.kernels)]


def test_everything_at_home_is_the_at_home_plan() -> None:
    g = small()
    p, c = recorded(g, [[g.home] * len(k.operands) for k in g.kernels], "all-slow as recorded")
    assert p.source == "all-slow as recorded" and c.overflow is None
    assert p.at_use == at_home(g).at_use and c.seconds == pytest.approx(g.all_on_seconds(g.home))
    assert c.prefetched_bytes == c.written_home_bytes == 0


def test_a_tensor_made_fast_and_read_slow_later_is_written_home_once() -> None:
    g = small(cap=16 * MiB)
    # "a" (tensor 1) made fast by fwd1, read fast by fwd2, read slow by bwd: held across the
    # first gap, evicted (written home) before bwd. Everything else at home.
    at = [[g.home] * len(us) for us in g.uses]
    at[1] = [0, 0, g.home]
    p, c = recorded(g, places_of(g, at), "LM as recorded")
    assert p.at_use == at
    assert p.held[1] == [True, False]
    assert c.written_home_bytes == 2 * MiB and c.prefetched_bytes == 0
    assert c.seconds == pytest.approx(evaluate(g, p.at_use, p.held).seconds)
    # Read fast again after that: a prefetch too.
    at[1] = [0, g.home, 0]
    p, c = recorded(g, places_of(g, at), "lru as recorded")
    assert p.held[1] == [False, False] and c.prefetched_bytes == 2 * MiB and c.written_home_bytes == 2 * MiB


def test_a_persistent_tensor_fast_at_both_ends_of_the_step_is_held_across_it() -> None:
    g = small(cap=16 * MiB)
    at = [[0] * len(us) for us in g.uses]
    p, c = recorded(g, places_of(g, at), "all-fast as recorded")
    assert all(all(h) for h in p.held)
    assert c.seconds == pytest.approx(g.base_seconds()) and c.prefetched_bytes == c.written_home_bytes == 0
    # On a fast device too small for it, the same placements overflow, and the plan says so.
    p, c = recorded(small(cap=MiB), places_of(g, at), "all-fast as recorded")
    assert c.overflow is not None and any("overflow" in n for n in p.notes)


def test_recording_a_solved_plan_prices_it_no_higher() -> None:
    g = autotm_graph(122, 8.0)
    p = solve(g, "sync", time_limit=10)
    q, c = recorded(g, places_of(g, p.at_use), "replayed")
    assert q.at_use == p.at_use
    # Held wherever the tensor stays on one fast device: never more moves than the plan's.
    for t in range(len(g.tensors)):
        for gi, (jb, ja, _) in enumerate(gaps(g, t)):
            if p.held[t][gi] and p.at_use[t][jb] < g.home and (ja is None or p.at_use[t][ja] == p.at_use[t][jb]):
                assert q.held[t][gi]
    if c.overflow is None:
        assert c.seconds <= p.predicted_seconds + 1e-12


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda pl: pl[:-1], "3 kernels, the graph has 4"),
        (lambda pl: [pl[0][:-1], *pl[1:]], "kernel 0 \\(fwd1\\) has 1 operands, the graph 2"),
        (lambda pl: [[0, 7], *pl[1:]], "operand on device 7 of 2"),
        (lambda pl: [[0, -1], *pl[1:]], "operand on device -1 of 2"),
    ],
)
def test_bad_recorded_placements_are_refused_by_name(edit, message: str) -> None:
    g = small()
    pl = [[g.home] * len(k.operands) for k in g.kernels]
    with pytest.raises(GraphError, match=message):
        recorded(g, edit(pl), "x")


def _cheaper_than_greedy(g) -> Plan:
    greedy = solve(g, "sync", time_limit=0)
    best = solve(g, "sync", time_limit=20)
    assert best.predicted_seconds < greedy.predicted_seconds
    return dataclasses.replace(best, source="LM as recorded", notes=[])


def test_a_cheaper_incumbent_is_the_starting_plan() -> None:
    g = autotm_graph(122, 8.0)
    inc = _cheaper_than_greedy(g)
    first = solve(g, "sync", time_limit=0, incumbents=[inc])
    assert first.source == "LM as recorded" and first.predicted_seconds == pytest.approx(inc.predicted_seconds)
    assert any("started from LM as recorded" in n for n in first.notes)
    assert first.check(g).overflow is None and first.offsets is not None
    # HiGHS, warm-started from it, returns a plan at least as good.
    p = solve(g, "sync", time_limit=10, incumbents=[inc])
    assert p.predicted_seconds <= inc.predicted_seconds + 1e-12
    # A static plan cannot move: incumbents with moves are not offered to it.
    assert solve(g, "static", time_limit=0, incumbents=[inc]).source == "greedy"


def test_an_incumbent_that_overflows_or_costs_more_is_not_taken() -> None:
    g = small()
    everything_fast = [[0] * len(us) for us in g.uses]
    big, c = recorded(g, places_of(g, everything_fast), "all-fast as recorded")
    assert c.overflow is not None
    slow, _ = recorded(g, [[g.home] * len(k.operands) for k in g.kernels], "all-slow as recorded")
    p = solve(g, "sync", time_limit=0, incumbents=[big, slow])
    assert p.source == "greedy"


def test_an_incumbent_for_another_graph_is_refused() -> None:
    inc = solve(autotm_graph(32), "sync", time_limit=0)
    with pytest.raises(GraphError, match="different tensors"):
        solve(small(), "sync", time_limit=0, incumbents=[inc])
