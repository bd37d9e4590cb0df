"""Plans on real training steps: a recorded graph, the planned variant's losses equal plain
PyTorch's exactly, the executor's moves, a model whose ops change, bad arguments."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("highspy")

from tiermem.bench.models import Workload  # noqa: E402
from tiermem.bench.plan import capture, record_policy, run_planned  # noqa: E402
from tiermem.bench.tensors import _reference  # noqa: E402
from tiermem.exceptions import InvalidArgumentError  # noqa: E402
from tiermem.plan import FORMULATIONS, Graph, GraphError, evaluate, solve  # noqa: E402
from tiermem.plan.torch import Executor, PlanMismatchWarning, Recorder, graph_from_recordings, planned  # noqa: E402
from tiermem.torch.tensors import Tiering  # noqa: E402

SLOW = "emulated:optane-pmem"


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 32 * 32, 10),
    )


W = Workload("cnn", cnn, 64, (3, 32, 32), 10)


@pytest.fixture(scope="module")
def captured():
    g, facts = capture(W, "4:1", SLOW)
    return g, facts


def test_a_recorded_step_is_a_valid_graph(captured) -> None:
    g, facts = captured
    kinds = {t.kind for t in g.tensors}
    assert {"parameter", "state", "input", "activation"} <= kinds
    assert g.kernels[0].name == "_local_scalar_dense.default"  # the previous step's loss.item()
    assert any(k.name == "input" for k in g.kernels)
    assert g.devices[0].capacity == facts["budget_bytes"]
    # Every slow placement costs at least as much as a fast one, and the profile is a split
    # of a measured difference, so some operand somewhere costs more when slow.
    assert all(o.seconds[0] == 0.0 and o.seconds[1] >= 0 for k in g.kernels for o in k.operands)
    assert sum(o.seconds[1] for k in g.kernels for o in k.operands) > 0
    # The two ReLUs do the same work on same-shaped tensors: one signature, one profile.
    assert facts["profile_signatures"] < len(g.kernels)
    relus = [k for k in g.kernels if k.name == "relu.default"]
    assert len(relus) == 2 and [o.seconds for o in relus[0].operands] == [o.seconds for o in relus[1].operands]
    assert g.footprint() <= facts["footprint_bytes"] * 1.5
    assert facts["budget_bytes"] < facts["footprint_bytes"] / 3
    # Measured by the probe, carried by the graph (and its JSON) to the cost model.
    assert 0.0 <= g.copy_contention <= 1.0 and facts["copy_contention"] == g.copy_contention
    assert Graph.from_json(g.to_json()).copy_contention == g.copy_contention


@pytest.mark.parametrize("formulation", ["static", "sync", "async"])
def test_planned_training_gives_pytorchs_losses_exactly(captured, formulation: str) -> None:
    g, facts = captured
    p = solve(g, formulation, time_limit=20)
    assert p.check(g).overflow is None
    r = run_planned(W, g, p, facts, SLOW, iters=3)
    ref = _reference(W, 5, 0)
    assert r["losses"] == ref["losses"]
    counts = r["tiering"]["plan"]
    assert counts["runtime_kernels"] == 0
    assert counts["first_iteration_kernels"] > 0
    if formulation != "static" and p.check(g).prefetched_bytes:
        assert counts["prefetches"] + counts["async_prefetches"] > 0
    assert len(r["kernel_measured"]) == len(g.kernels)
    assert r["fast_bytes_peak"] <= facts["budget_bytes"]


def test_a_model_whose_ops_change_is_warned_about_and_still_trains(captured) -> None:
    g, facts = captured
    p = solve(g, "sync", time_limit=5)
    t = planned({"dram": facts["budget_bytes"], SLOW: facts["slow_bytes"]}, g, p)
    torch.manual_seed(0)
    model = t.module(cnn())
    opt = t.optimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    torch.manual_seed(0)
    ref_model = cnn()
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.01, momentum=0.9)
    losses, ref_losses = [], []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(5):
            x, y = W.inputs(i)
            if i in (2, 4):  # a different batch size: other shapes, so other ops (and sizes)
                x, y = x[:8], y[:8]
            for m, o, out in ((model, opt, losses), (ref_model, ref_opt, ref_losses)):
                loss = W.loss(m(x), y)
                loss.backward()
                o.step()
                o.zero_grad()
                out.append(float(loss.item()))
    assert losses == pytest.approx(ref_losses, abs=1e-6)
    t.manager.check()
    mismatches = [w for w in seen if issubclass(w.category, PlanMismatchWarning)]
    # Told once, in the third iteration, which and why; the fifth is counted. The fourth
    # (the plan's batch again) follows the plan.
    assert len(mismatches) == 1
    msg = str(mismatches[0].message)
    assert "bytes where the plan has" in msg and "trace changed at kernel" in msg and "iteration 2" in msg, msg
    counts = t.stats()["plan"]
    assert counts["mismatched_iterations"] == 2 and counts["runtime_kernels"] > 0, counts
    assert counts["planned_iterations"] >= 4, counts  # iterations 1 to 4 start planned (and the last loss.item())
    t.close()


def test_plans_and_recordings_are_checked(captured) -> None:
    g, facts = captured
    p = solve(g, "static", time_limit=0)
    with pytest.raises(InvalidArgumentError, match="the planned variant follows a plan"):
        Tiering({"dram": "8 MiB", SLOW: "64 MiB"}, "planned")
    with pytest.raises(InvalidArgumentError, match="needs the planned variant, not 'LM'"):
        Tiering({"dram": "8 MiB", SLOW: "64 MiB"}, "LM", observers=[Executor(g, p)])
    t = planned({"dram": "8 MiB", SLOW: "64 MiB"}, g, p)
    with pytest.raises(InvalidArgumentError, match="already does"):
        t.watch(Executor(g, p))
    with pytest.raises(InvalidArgumentError, match="must subclass"):
        t.watch(object())  # type: ignore[arg-type]
    t.close()
    empty = Recorder()
    with pytest.raises(GraphError, match="saw no kernels"):
        graph_from_recordings(
            "x", empty, empty, [("dram", 1 << 20, False), (SLOW, None, True)], [{}, {}], [[None, 1.0], [1.0, None]]
        )
    a, b = Recorder(), Recorder()
    a.kernels = [("k", 1.0, [])]
    with pytest.raises(GraphError, match="ran 1 kernels in one run and 0"):
        graph_from_recordings("x", a, b, [("dram", 1 << 20, False), (SLOW, None, True)], [{}, {}], [[None, 1.0], [1.0, None]])
    b.mismatch = "kernel 3 was x in one iteration and not in another"
    with pytest.raises(GraphError, match="not the same every iteration"):
        graph_from_recordings("x", a, b, [("dram", 1 << 20, False), (SLOW, None, True)], [{}, {}], [[None, 1.0], [1.0, None]])


def test_a_fitted_plan_runs_at_its_offsets(captured) -> None:
    """The offline heap model is the runtime's: a plan whose offsets fit runs with every
    planned allocation and prefetch at its offset, nothing falling elsewhere."""
    from tiermem.plan import fit

    g, facts = captured
    # A tight budget, so that offsets matter.
    g = g.with_capacity(facts["budget_bytes"] // 2)
    p, tries = fit(g, "sync", time_limit=5)
    assert tries[0]["capacity_bytes"] == g.devices[0].capacity
    assert p.offsets is not None and p.check(g).overflow is None
    fitting = [t for t in tries if t["height_bytes"] <= g.devices[0].capacity]
    assert fitting, tries
    assert any(o is not None for offs in p.offsets for o in offs)
    r = run_planned(W, g, p, facts | {"budget_bytes": g.devices[0].capacity}, SLOW, iters=3)
    counts = r["tiering"]["plan"]
    assert counts["offset_misses"] == 0 and counts["alloc_fallbacks"] == 0, counts
    assert counts["prefetch_missed"] == 0 and counts["runtime_kernels"] == 0, counts
    assert r["losses"] == _reference(W, 5, 0)["losses"]


def test_an_async_plan_copies_on_the_copy_thread_and_trains_exactly(captured) -> None:
    """The async formulation's moves run on the copy thread while the kernel they overlap
    computes; every prefetch lands at its offset and every loss is PyTorch's."""
    from tiermem.plan import Overlap, Plan, assign, evaluate, moves
    from tiermem.plan.plan import gaps

    g, facts = captured
    # Every tensor fast at every use, evicted across every gap with a kernel in it and
    # brought back for its next use; every such move asynchronous where a kernel can be
    # overlapped. The fast device gets its peak (a few kernels' working sets).
    at = [[0] * len(us) for us in g.uses]
    held = [[all(hi <= lo for lo, hi in r) for _, _, r in gaps(g, t)] for t in range(len(g.tensors))]
    ov = Overlap.none(g)
    ov.ahead = [[True] * len(a) for a in ov.ahead]
    ov.behind = [[True] * len(b) for b in ov.behind]
    peak = evaluate(g.with_capacity(1 << 40), at, held, ov).peak[0]
    g = g.with_capacity(-(-peak // (2 << 20)) * (2 << 20) + (4 << 20))  # whole 2 MiB pages, and room to lay out
    c = evaluate(g, at, held, ov)
    assert c.overflow is None, c.overflow
    keys = [t.key for t in g.tensors]
    p = Plan(g.name, "async", [d.name for d in g.devices], keys, at, held, c.seconds, "test", overlap=ov)
    p.offsets = assign(g, at, held, ov).at_use
    m = moves(g, p.at_use, p.held, p.overlap)
    ahead, behind = sum(map(len, m.ahead)), sum(map(len, m.behind))
    assert ahead > 0 and behind > 0
    iters = 3
    r = run_planned(W, g, p, facts | {"budget_bytes": g.devices[0].capacity}, SLOW, iters=iters)
    counts = r["tiering"]["plan"]
    planned = counts["planned_iterations"]
    # Every planned iteration issues them all, but the last, which runs only its first kernel
    # (the final loss.item()).
    assert counts["async_prefetches"] in (ahead * planned, ahead * (planned - 1)), counts
    assert counts["async_writebacks"] in (behind * planned, behind * (planned - 1)), counts
    assert counts["async_failed"] <= counts["async_writebacks"], counts  # only a write-back of a clean tensor
    assert counts["offset_misses"] == 0 and counts["prefetch_missed"] == 0 and counts["runtime_kernels"] == 0, counts
    assert counts["moves_failed"] == 0, counts
    assert r["losses"] == _reference(W, 2 + iters, 0)["losses"]


def test_a_runtime_variants_own_placements_are_priced_by_the_model(captured) -> None:
    g0, facts0 = captured
    # Room for a third of the step (a kernel here needs more than the capture's 4:1 budget).
    budget = g0.footprint() // 3
    g, facts = g0.with_capacity(budget), facts0 | {"budget_bytes": budget}
    p, c = record_policy(W, g, facts, "LM", SLOW)
    assert p.source == "LM as recorded" and len(p.at_use) == len(g.tensors)
    assert {d for ds in p.at_use for d in ds} <= {0, g.home}
    # LM uses data where it lives: it writes tensors home to make room, and never prefetches.
    assert c.prefetched_bytes == 0 and c.written_home_bytes > 0
    assert c.seconds == pytest.approx(evaluate(g, p.at_use, p.held).seconds)
    # With room for the whole step, every tensor stays in fast memory: the all-fast time.
    room = facts["all_fast_room_bytes"]
    roomy = g.with_capacity(room)
    q, c2 = record_policy(W, roomy, facts | {"budget_bytes": room}, "LM", SLOW)
    assert c2.overflow is None and c2.written_home_bytes == 0 and c2.seconds == pytest.approx(g.base_seconds())
    # Another model's step is refused by name.
    other = Workload(
        "cnn2", lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10)), 64, (3, 32, 32), 10
    )
    with pytest.raises(GraphError, match="other kernels or tensors"):
        record_policy(other, g, facts, "LM", SLOW)


def test_bench_plan_quick_json(tmp_path, capsys, small_resnet) -> None:
    import json

    from tiermem.cli.main import main

    out = tmp_path / "plan.json"
    args = ["bench", "plan", "--quick", "--model", "resnet", "--ratio", "8:1", "--sizes", "32", "--json", str(out)]
    assert main(args) == 0
    res = json.loads(out.read_text())
    rows = {r["variant"]: r for r in res["models"]}
    assert {"planned", "LM", "async", "first-touch", "2lm-model", "all-fast"} <= set(rows)
    assert rows["planned"]["predicted_seconds_per_iter"] > 0 and rows["planned"]["max_loss_diff"] == 0.0
    plan = res["plans"][0]
    want = plan["predicted_seconds_per_iter"] / plan["predicted_all_fast"]
    assert rows["planned"]["predicted_vs_all_fast"] == want and want >= 1.0
    assert rows["LM"]["predicted_vs_all_fast"] is None
    assert len(rows["planned"]["times"]) >= 2 and min(rows["planned"]["times"]) <= rows["planned"]["seconds_per_iter"]
    for r in res["models"]:
        assert r["model"] == "resnet" and r["ratio"] == "8:1" and r["seconds_per_iter"] > 0
    assert res["plans"][0]["fit_tries"]
    # Each runtime variant's own placements, priced by the model: never below all-fast, nor
    # below the full budget's bound when they fit it.
    assert [q["variant"] for q in plan["policies"]] == ["first-touch", "LM", "async"]
    bound = plan["budget_bound_seconds"]
    assert bound is not None and bound <= plan["predicted_seconds_per_iter"] * (1 + 1e-9)
    for q in plan["policies"]:
        assert q["predicted_seconds_per_iter"] >= plan["predicted_all_fast"] * (1 - 1e-9)
        if q["overflow"] is None:
            assert q["predicted_seconds_per_iter"] >= bound * (1 - 1e-6)
    # The figures the emulated device was scaled from, and the device's own.
    assert plan["dram_figures"]["source"] in ("calibrated", "measured") and plan["dram_figures"]["write_gbps"] > 0
    assert len(plan["device_traits"]) == 2 and plan["device_traits"][1]["write_gbps"] > 0
    assert [s["formulation"] for s in res["scaling"]] == list(FORMULATIONS)
    for s in res["scaling"]:
        assert 30 <= s["kernels"] <= 34 and s["solve_seconds"] >= 0 and s["objective"] <= s["all_slow_objective"]
        assert s["gap"] is not None and s["gap"] <= 0.02
    # Planned against each paired variant, iteration by iteration, same losses.
    assert (
        res["pairs"] == 1
        and res["paired_warmup"] == 1
        and {q["a"] for q in res["paired"]} == {"all-fast", "LM", "async", "first-touch"}
    )
    for q in res["paired"]:
        assert q["b"] == "planned" and q["max_loss_diff"] == 0.0, q
        assert len(q["a_times"]) == len(q["b_times"]) == 1 and q["median"] == q["b_times"][0] / q["a_times"][0]
        assert q["interval"] == [q["median"], q["median"]] and q["coverage"] == 0.0  # one pair bounds nothing
    af = next(q for q in res["paired"] if q["a"] == "all-fast")
    assert rows["planned"]["paired_vs_all_fast"] == af["median"]
    assert rows["planned"]["predicted_over_paired"] == rows["planned"]["predicted_vs_all_fast"] / af["median"]
    printed = capsys.readouterr().out
    assert "solver on generated AutoTM-shaped graphs" in printed and "iteration by iteration" in printed
    assert "each runtime variant's own placements" in printed
    # The rounds table says how far to trust it, and points to the paired one.
    assert "best iteration of 1 round: a shared machine's speed drifts" in printed
    assert "the paired table below compares planned" in printed


def test_a_runtime_variant_that_could_not_run_is_printed_as_an_error(capsys) -> None:
    from tiermem.bench.plan import _print_policies

    plan = {"model": "m", "ratio": "8:1", "predicted_all_fast": 1.0, "predicted_seconds_per_iter": 1.1}
    plan["budget_bound_seconds"] = 1.05
    plan["policies"] = [
        {"variant": "LM", "error": "BudgetError: op x: its outputs need 9 MiB"},
        {
            "variant": "first-touch",
            "predicted_seconds_per_iter": 1.4,
            "prefetched_bytes": 0,
            "written_home_bytes": 0,
            "overflow": None,
        },
    ]
    _print_policies([plan])
    out = capsys.readouterr().out
    assert "BudgetError: op x" in out and "error" in out
    assert "0.786" in out and "0.750" in out  # plan / first-touch's, bound / first-touch's
