"""The planner without a model: graph JSON and its bad input, the cost model against brute
force on small graphs (both formulations, two and three devices), greedy plans always fit,
solver fallbacks, and ``tiermem plan --graph``."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_graphs import MiB, small, spaced

from tiermem.cli.main import main
from tiermem.plan import (
    Graph,
    GraphError,
    Kernel,
    Operand,
    Plan,
    Tensor,
    at_home,
    autotm_graph,
    evaluate,
    greedy,
    residency_by_kind,
    solve,
    tensor_residency,
)
from tiermem.plan.plan import gaps

pytest.importorskip("highspy")


def duplex(g: Graph) -> Graph:
    """``g`` with every device but the fastest duplex (reads and writes on their own channels)."""
    return dataclasses.replace(g, devices=[g.devices[0], *(dataclasses.replace(d, duplex=True) for d in g.devices[1:])])


def held_options(g: Graph, t: int, at: tuple[int, ...]) -> list[list[bool]]:
    """Tensor ``t``'s held flags worth trying at placements ``at``: a flag counts only where
    the tensor is on one fast device at both ends of its gap; elsewhere both values price
    alike, so only one is tried."""
    fixed = [at[jb] == g.home or (ja is not None and at[jb] != at[ja]) for jb, ja, _ in gaps(g, t)]
    return [list(h) for h in itertools.product(*([False] if f else [False, True] for f in fixed))]


def brute(g: Graph, formulation: str) -> float:
    """The best cost over every plan (every device per use and every held flag that can
    change the price)."""
    best = float("inf")
    nd = len(g.devices)
    per_tensor = []
    for t, us in enumerate(g.uses):
        opts = []
        ng = len(gaps(g, t))
        if formulation == "static":
            opts = [([d] * len(us), [True] * ng) for d in range(nd)]
        else:
            for at in itertools.product(range(nd), repeat=len(us)):
                opts += [(list(at), held) for held in held_options(g, t, at)]
        per_tensor.append(opts)
    for combo in itertools.product(*per_tensor):
        at = [c[0] for c in combo]
        held = [c[1] for c in combo]
        c = evaluate(g, at, held)
        if c.overflow is None:
            best = min(best, c.seconds)
    return best


@pytest.mark.parametrize(
    "formulation, devices, channels", [(f, n, c) for f in ("static", "sync") for n in (2, 3) for c in ("shared", "duplex")]
)
def test_solver_finds_the_brute_force_optimum(formulation: str, devices: int, channels: str) -> None:
    g = small(devices=devices)
    if channels == "duplex":
        g = duplex(g)
    p = solve(g, formulation, time_limit=30, target_gap=0.0)
    assert p.source == "highs"
    assert p.predicted_seconds == pytest.approx(brute(g, formulation), rel=1e-9)
    assert p.check(g).seconds == pytest.approx(p.predicted_seconds)
    assert p.bound_seconds is not None and p.bound_seconds <= p.predicted_seconds * (1 + 1e-9)
    assert p.gap is not None and 0 <= p.gap <= 1e-6


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 4), min_size=4, max_size=4),
    cap=st.integers(2, 6),
    extra=st.lists(st.floats(0, 1e-3), min_size=9, max_size=9),
)
def test_sync_plans_are_optimal_and_fit_on_random_small_graphs(sizes: list[int], cap: int, extra: list[float]) -> None:
    g0 = small(cap * MiB)
    tensors = [Tensor(t.key, s * MiB, t.kind, t.persistent) for t, s in zip(g0.tensors, sizes)]
    it = iter(extra)
    kernels = [
        Kernel(k.name, k.seconds, tuple(Operand(o.tensor, o.use, (0.0, next(it))) for o in k.operands)) for k in g0.kernels
    ]
    g = Graph("random", g0.devices, g0.copy_gbps, tensors, kernels)
    at, held = greedy(g, "sync")
    assert evaluate(g, at, held).overflow is None
    p = solve(g, "sync", time_limit=30, target_gap=0.0)
    assert p.predicted_seconds == pytest.approx(brute(g, "sync"), rel=1e-7, abs=1e-12)
    assert p.predicted_seconds <= evaluate(g, at, held).seconds + 1e-12


def test_generated_graphs_plan_fast_and_beat_the_greedy_plan() -> None:
    g = autotm_graph(242, 8.0)
    assert abs(len(g.kernels) - 242) <= 4
    first = solve(g, "sync", time_limit=0)
    assert first.source == "greedy" and first.first_plan_seconds < 1.0
    p = solve(g, "sync", time_limit=60, target_gap=0.02)
    assert p.check(g).overflow is None
    assert p.gap is not None and p.gap <= 0.02
    assert g.base_seconds() <= p.predicted_seconds <= first.predicted_seconds < g.all_on_seconds(g.home)


@pytest.mark.parametrize("contention", [0.0, 0.5])
@pytest.mark.parametrize("channels", ["shared", "duplex"])
def test_the_warm_start_costs_what_the_greedy_plan_costs(contention: float, channels: str) -> None:
    from tiermem.plan.solve import _Vars

    g = dataclasses.replace(autotm_graph(122, 8.0), copy_contention=contention)
    if channels == "duplex":
        g = duplex(g)
    for form in ("static", "sync", "async"):
        at, held = greedy(g, form)
        v = _Vars(g, form)
        x = v.values(at, held)
        assert v.const + float(sum(c * xi for c, xi in zip(v.m.cost, x))) == pytest.approx(evaluate(g, at, held).seconds)
        assert v.plan_of(x)[:2] == (at, held) or form == "static"


def test_a_duplex_device_charges_the_longer_channel() -> None:
    """On a duplex device a kernel's extra time is the longer of its operands' read and write
    parts there; on a shared one, their sum. fwd1 reads w (3e-4 at home) and makes a (8e-4)."""
    shared, dup = small(), duplex(small())
    assert shared.kernel_seconds(0, [1, 1]) == pytest.approx(1e-3 + 3e-4 + 8e-4)
    assert dup.kernel_seconds(0, [1, 1]) == pytest.approx(1e-3 + 8e-4)
    # Only the written operand in fast memory saves anything: its read alone is shorter.
    assert dup.kernel_seconds(0, [0, 1]) == pytest.approx(1e-3 + 8e-4)
    assert dup.kernel_seconds(0, [1, 0]) == pytest.approx(1e-3 + 3e-4)
    assert dup.use_gain(0, 0, 0) == 0.0 and dup.use_gain(0, 1, 0) == pytest.approx(5e-4)
    assert shared.use_gain(0, 0, 0) == pytest.approx(3e-4)
    # sgd updates w in place (9e-4, of which 5e-4 writing) and reads g (3e-4): reads 7e-4.
    assert dup.kernel_seconds(3, [1, 1]) == pytest.approx(1e-4 + 7e-4)
    assert dup.kernel_seconds(3, [0, 1]) == pytest.approx(1e-4 + 5e-4)
    per_kernel = [dup.kernel_seconds(k, [1] * len(ker.operands)) for k, ker in enumerate(dup.kernels)]
    assert dup.all_on_seconds(1) == pytest.approx(sum(per_kernel))
    # A plan's cost is the same sum over its kernels: fwd1's read in fast memory and its
    # write at home gain nothing on a duplex device, and the cost model agrees.
    at = at_home(dup).at_use
    at[0][0] = 0
    held = [[False] * len(gaps(dup, t)) for t in range(len(dup.tensors))]
    assert evaluate(dup, at, held).kernel_seconds == pytest.approx(dup.all_on_seconds(1))
    at[1][0] = 0  # and a, which fwd1 makes: fwd1 has nothing left on the slow device
    assert evaluate(dup, at, held).kernel_seconds == pytest.approx(dup.all_on_seconds(1) - 8e-4)


def test_async_plans_on_a_duplex_device_are_optimal() -> None:
    g = duplex(dataclasses.replace(spaced(), copy_contention=0.5))
    p = solve(g, "async", time_limit=30, target_gap=0.0)
    assert p.source == "highs"
    assert p.predicted_seconds == pytest.approx(brute_async(g), rel=1e-9)


def test_graph_and_plan_json_round_trip(tmp_path: Path) -> None:
    g = duplex(small())
    g.save(tmp_path / "g.json")
    h = Graph.load(tmp_path / "g.json")
    assert h.to_json() == g.to_json()
    p = solve(g, "sync", time_limit=10)
    p.save(tmp_path / "p.json")
    q = Plan.load(tmp_path / "p.json")
    assert q.to_json() == p.to_json()
    assert q.check(h).seconds == pytest.approx(p.predicted_seconds)


def _doc() -> dict:
    return small().to_json()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(format="other"), "not a tiermem graph"),
        (lambda d: d["devices"].pop(), "at least two devices"),
        (lambda d: d["devices"][0].update(capacity=None), "only the last"),
        (lambda d: d["copy_gbps"][0].__setitem__(1, 0), "positive bandwidth"),
        (lambda d: d["kernels"][0].pop("seconds"), "no profile"),
        (lambda d: d["kernels"][1].update(seconds=float("nan")), "no profile"),
        (lambda d: d["kernels"][0]["operands"].reverse() or d["kernels"].reverse(), "before any kernel makes it"),
        (lambda d: d["kernels"][0]["operands"][0].update(tensor=9), "does not exist"),
        (lambda d: d["kernels"][0]["operands"][0].update(use="borrow"), "is not one of"),
        (lambda d: d["kernels"][0]["operands"][0].update(seconds=[0.0]), "one per device"),
        (lambda d: d["kernels"][3]["operands"][1].update(write_seconds=[0.0, 1.0]), "between 0 and its extra time"),
        (lambda d: d["kernels"][3]["operands"][1].update(write_seconds=[0.0]), "needs 2 write_seconds"),
        (lambda d: d["devices"][1].update(duplex="yes"), "expected true or false"),
        (lambda d: d["tensors"][1].update(bytes=0), "positive integer"),
        (lambda d: d["tensors"][1].update(key="w"), "appears twice"),
        (lambda d: d["tensors"][0].update(free_after=2), "never freed"),
        (lambda d: d["tensors"][1].update(free_after=99), "free_after"),
        (lambda d: d.update(kernels="x"), "malformed"),
        (lambda d: d.update(copy_contention=1.5), "copy_contention must lie in"),
        (lambda d: d.update(copy_contention=-0.1), "copy_contention must lie in"),
        (lambda d: d.update(copy_contention="half"), "malformed"),
        (lambda d: d["kernels"][2]["operands"].append({"tensor": 9}), "malformed"),
        # Times a plan would sum to infinity, and a flag given as a string.
        (lambda d: d["kernels"][1].update(seconds=1e308), "no profile .seconds must be a time from 0 to 86400"),
        (lambda d: d["kernels"][0]["operands"][0].update(seconds=[0.0, 1e308]), "extra times from 0 to 86400"),
        (lambda d: d.update(overhead_seconds=1e308), "overhead_seconds must be a time"),
        (lambda d: d["copy_gbps"][0].__setitem__(1, 1e-300), "at least 1e-06"),
        (
            lambda d: d["tensors"][1].update(persistent="false"),
            "malformed graph at tensor 1 .ValueError: expected true or false, got 'false'",
        ),
    ],
)
def test_bad_graphs_are_refused_by_name(edit, message: str, tmp_path: Path) -> None:
    d = _doc()
    edit(d)
    with pytest.raises(GraphError, match=message):
        Graph.from_json(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    assert main(["plan", "--graph", str(path), "--time-limit", "0", "--save-plan", str(tmp_path / "p.json")]) == 2
    assert not (tmp_path / "p.json").exists()


def test_a_budget_below_a_kernels_working_set_is_a_stated_fallback() -> None:
    g = small(cap=3 * MiB)
    p = solve(g, "sync", time_limit=10, target_gap=0.0)
    note = "kernel 2 (bwd) works on 4.0 MiB (3 tensors) but fast holds 3.0 MiB; it and 0 other kernels run with some operands"
    assert note in p.notes[0]
    assert p.predicted_seconds == pytest.approx(brute(g, "sync"))
    assert small().budget_note() is None


def test_files_that_are_not_graphs_or_plans(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(GraphError, match="not JSON"):
        Graph.load(tmp_path / "x.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(GraphError, match="deep.json: JSON nested too deeply"):
        Graph.load(tmp_path / "deep.json")
    with pytest.raises(GraphError, match="cannot read graph"):
        Graph.load(tmp_path / "missing.json")
    with pytest.raises(GraphError, match="not a tiermem plan"):
        Plan.from_json({"format": "x"})
    p = solve(small(), "static", time_limit=0)
    other = autotm_graph(32)
    with pytest.raises(GraphError, match="does not match"):
        p.check(other)


def test_bad_solver_arguments() -> None:
    with pytest.raises(ValueError, match="formulation 'overlap'"):
        solve(small(), "overlap")
    with pytest.raises(ValueError, match="time limit"):
        solve(small(), "sync", time_limit=-1)


def test_plan_command_on_a_saved_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = autotm_graph(32)
    g.save(tmp_path / "g.json")
    out = tmp_path / "p.json"
    rc = main(
        [
            "plan",
            "--graph",
            str(tmp_path / "g.json"),
            "--time-limit",
            "5",
            "--save-plan",
            str(out),
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "sync plan, gap" in text and "all slow" in text and "residency by kind" in text
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["residency"]["tensors"]) == len(g.tensors) and report["residency"]["by_kind"]
    p = Plan.load(out)
    assert p.check(g).seconds == pytest.approx(p.predicted_seconds)
    assert main(["plan", "--graph", str(tmp_path / "g.json"), "--model", "resnet"]) == 2
    assert main(["plan", "--graph", str(tmp_path / "g.json"), "--run"]) == 2
    assert main(["plan", "--graph", str(tmp_path / "g.json"), "--against", "LM"]) == 2
    assert main(["plan", "--graph", str(tmp_path / "g.json"), "--against", "LM,bogus"]) == 2
    err = capsys.readouterr().err
    assert "--run and --against need --model" in err and "--against 'bogus'" in err


def test_residency_report_adds_up_to_the_cost_model() -> None:
    g = autotm_graph(64)
    p = solve(g, "sync", time_limit=5)
    cost = evaluate(g, p.at_use, p.held)
    rows = tensor_residency(g, p)
    assert sum(r["prefetched_bytes"] for r in rows) == cost.prefetched_bytes
    assert sum(r["written_home_bytes"] for r in rows) == cost.written_home_bytes
    assert all(0 <= r["fast_kernels"] <= r["live_kernels"] and 0 <= r["fast_uses"] <= r["uses"] for r in rows)
    assert any(r["fast_kernels"] > 0 for r in rows)
    kinds = residency_by_kind(rows)
    assert sum(k["bytes"] for k in kinds) == sum(t.bytes for t in g.tensors)
    assert all(0.0 <= k["fast_share"] <= 1.0 for k in kinds)
    # Nothing in fast memory, nothing moved: an all-at-home plan.
    home = tensor_residency(g, at_home(g))
    assert all(r["fast_kernels"] == 0 and r["fast_uses"] == 0 and r["prefetched_bytes"] == 0 for r in home)
    assert all(k["fast_share"] == 0.0 for k in residency_by_kind(home))


def brute_async(g: Graph) -> float:
    """The best cost over every plan with asynchronous moves (flags only where a kernel can
    be overlapped)."""
    from tiermem.plan import Overlap
    from tiermem.plan.plan import _segments, ahead_kernel, behind_kernel

    per_tensor = []
    for t, us in enumerate(g.uses):
        gl = gaps(g, t)
        segs = _segments(g, t)
        a_opts = [i for i, gap in enumerate(gl) if ahead_kernel(gap) is not None]
        b_opts = [i for i, (_, seg) in enumerate(segs) if behind_kernel(gl, seg) is not None]
        opts = []
        for at in itertools.product(range(len(g.devices)), repeat=len(us)):
            for held in held_options(g, t, at):
                for af in itertools.product([False, True], repeat=len(a_opts)):
                    for bf in itertools.product([False, True], repeat=len(b_opts)):
                        ahead = [False] * len(gl)
                        behind = [False] * len(segs)
                        for i, f in zip(a_opts, af):
                            ahead[i] = f
                        for i, f in zip(b_opts, bf):
                            behind[i] = f
                        opts.append((list(at), held, ahead, behind))
        per_tensor.append(opts)
    best = float("inf")
    for combo in itertools.product(*per_tensor):
        ov = Overlap([c[2] for c in combo], [c[3] for c in combo])
        c = evaluate(g, [c[0] for c in combo], [c[1] for c in combo], ov)
        if c.overflow is None:
            best = min(best, c.seconds)
    return best


def test_async_plans_are_optimal_and_beat_sync() -> None:
    g = spaced()
    p = solve(g, "async", time_limit=30, target_gap=0.0)
    assert p.source == "highs" and p.overlap is not None
    assert p.predicted_seconds == pytest.approx(brute_async(g), rel=1e-9)
    assert p.predicted_seconds < solve(g, "sync", time_limit=30, target_gap=0.0).predicted_seconds - 1e-5
    c = p.check(g)
    assert c.seconds == pytest.approx(p.predicted_seconds) and c.overlapped_seconds > 0
    # Round trip, overlap included; a flag list of the wrong length is refused by name.
    q = Plan.from_json(json.loads(json.dumps(p.to_json())))
    assert q.overlap == p.overlap and q.check(g).seconds == pytest.approx(c.seconds)
    doc = p.to_json()
    doc["tensors"][1]["ahead"] = [1]
    with pytest.raises(GraphError, match="'x' has 1 ahead"):
        Plan.from_json(doc).check(g)


@pytest.mark.parametrize("contention", [0.25, 0.5, 1.0])
def test_copy_contention_charges_overlapped_kernels(contention: float) -> None:
    """A copy that takes cores from the kernel it overlaps costs that kernel its share of the
    copy's time: the solver still finds the brute-force optimum, which costs at least the
    contention-free one; with the whole copy's time taken, moving ahead or behind gains
    nothing over moving in line."""
    free = spaced()
    g = dataclasses.replace(free, copy_contention=contention)
    p = solve(g, "async", time_limit=30, target_gap=0.0)
    assert p.source == "highs"
    assert p.predicted_seconds == pytest.approx(brute_async(g), rel=1e-9)
    assert p.predicted_seconds >= solve(free, "async", time_limit=30, target_gap=0.0).predicted_seconds - 1e-12
    sync = solve(g, "sync", time_limit=30, target_gap=0.0).predicted_seconds
    if contention == 1.0:
        assert p.predicted_seconds == pytest.approx(sync, rel=1e-9)
    # The cost model charges each overlapped kernel max(copies - kernel, share * copies).
    q = solve(free, "async", time_limit=30, target_gap=0.0)
    c0, c1 = evaluate(free, q.at_use, q.held, q.overlap), evaluate(g, q.at_use, q.held, q.overlap)
    assert c0.overlapped_seconds > 0 and c1.overlapped_seconds == c0.overlapped_seconds
    assert c1.stall_seconds >= max(c0.stall_seconds, contention * c0.overlapped_seconds) - 1e-12
    assert c1.seconds - c1.stall_seconds == pytest.approx(c0.seconds - c0.stall_seconds)


def test_async_moves_are_where_the_executor_does_them() -> None:
    from tiermem.plan import Overlap, moves

    g = spaced(cap=64 * MiB)
    at = [[0, 0, 0], [0, 0, 0], [0, 0]]  # all fast; x and w not held across their long gaps
    held = [[True, False, True], [False, True], [True]]
    ov = Overlap.none(g)
    ov.ahead[0][1] = ov.ahead[1][0] = True  # w's prefetch overlaps kernel 3, x's kernel 2
    ov.behind[1][0] = True  # x's write home overlaps kernel 1
    m = moves(g, at, held, ov)
    assert m.ahead[3] == [(0, 0, 2)] and m.ahead[2] == [(1, 0, 1)]
    assert m.wait[4] == {0} and m.wait[3] == {1}
    assert m.behind[1] == [1] and 1 in m.after[1] and 1 not in m.after[0]  # evicted after the copy
    assert not any(m.before)
    sync = evaluate(g, at, held)
    c = evaluate(g, at, held, ov)
    assert c.prefetched_bytes == sync.prefetched_bytes and c.written_home_bytes == sync.written_home_bytes
    # w, written by sgd and read by the next step before its eviction, is written home after
    # f2 with no kernel between to overlap: the one synchronous move left.
    assert c.move_seconds == pytest.approx(c.stall_seconds + g.copy_seconds(MiB, 0, 1)) and c.seconds < sync.seconds


def test_a_solver_plan_the_cost_model_finds_worse_falls_back_and_says_why(monkeypatch) -> None:
    import dataclasses
    import sys

    mod = sys.modules["tiermem.plan.solve"]
    real = mod.evaluate
    calls = []

    def worse_second(*a):  # the greedy plan's cost first, then HiGHS's plan's, made worse
        c = real(*a)
        calls.append(c)
        return dataclasses.replace(c, seconds=c.seconds + 1.0) if len(calls) == 2 else c

    monkeypatch.setattr(mod, "evaluate", worse_second)
    p = solve(small(), "sync", time_limit=10, target_gap=0.0)
    assert p.source == "greedy (fallback: HiGHS's plan was no better)"
    assert any(n.startswith("HiGHS's plan: objective") and "cost model" in n for n in p.notes), p.notes
