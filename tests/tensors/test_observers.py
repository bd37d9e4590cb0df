"""Observers of a Tiering, the planner's public capture of a user's own step, and the two
crossings a planned op costs."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("highspy")

from tiermem.plan import fit  # noqa: E402
from tiermem.plan.torch import Executor, capture, planned, run_planned  # noqa: E402
from tiermem.torch.tensors import Observer, OpEnd, Tiering, TrainStep  # noqa: E402

SLOW = "emulated:optane-pmem"


class Counting(Observer):
    """Counts every hook it is told of (and overrides only some)."""

    name = "counting"
    timed = True

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.ends: list[OpEnd] = []
        self.made_count = 0

    def iteration(self, iteration: int) -> None:
        self.iterations.append(iteration)

    def made(self, pos: int, k: int, obj: Any) -> None:
        self.made_count += 1

    def op_end(self, event: OpEnd) -> None:
        self.ends.append(event)

    def stats(self) -> dict[str, Any]:
        return {"ops": len(self.ends)}


def test_an_observer_is_told_of_every_op_and_iteration() -> None:
    t = Tiering({"dram": "64 MiB", SLOW: "256 MiB"}, "LM")
    obs = t.watch(Counting())
    model = t.module(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
    opt = t.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert obs.iterations == [0, 1, 2]
    names = [e.name for e in obs.ends]
    assert "input" in names and "addmm.default" in names and "relu.default" in names
    # Positions restart each iteration; every op and copy-in has one, in order.
    firsts = [e for e in obs.ends if e.pos == 0]
    assert len(firsts) == 2
    assert all(e.seconds >= 0 for e in obs.ends) and any(e.seconds > 0 for e in obs.ends)
    assert obs.made_count == sum(1 for e in obs.ends for _, use in e.uses if use == "make")
    assert "addmm.default" in obs.ends[[e.name for e in obs.ends].index("addmm.default")].signature()
    assert t.stats()["counting"] == {"ops": len(obs.ends)}
    t.close()
    t.close()  # closing twice is a no-op


def _step() -> TrainStep:
    """A user's own model (LayerNorm, GELU, a residual) with AdamW and a loss of its own."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(64)
            self.up = torch.nn.Linear(64, 256)
            self.down = torch.nn.Linear(256, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(Block(), Block(), torch.nn.Linear(64, 10))

    def loss(m: torch.nn.Module, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(128, 64, generator=g), torch.randint(0, 10, (128,), generator=g)
        return torch.nn.functional.cross_entropy(m(x), y) + 1e-3 * m[0].up.weight.square().mean()

    return TrainStep(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01), loss, seed=3, name="mine")


def test_a_users_own_step_is_captured_planned_and_trained_exactly() -> None:
    step = _step()
    g, facts = capture(step, "4:1", SLOW)
    assert g.name == "mine-4:1" and g.devices[0].capacity == facts["budget_bytes"]
    # AdamW's two moment buffers per parameter are the step's state.
    assert sum(t.kind == "state" for t in g.tensors) >= 2 * 8
    p, _ = fit(g, "sync", time_limit=10)
    r = run_planned(step, g, p, facts, SLOW, iters=2)
    plain = step.start()
    ref = [plain.step()[0] for _ in range(len(r["losses"]))]
    assert r["losses"] == ref
    counts = r["tiering"]["plan"]
    assert counts["runtime_kernels"] == 0 and counts["moves_failed"] == 0, counts


class _CountingNative:
    """The native manager with its calls from this thread counted by name."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        f = getattr(self._native, name)
        if not callable(f):
            return f

        def counted(*a: Any, **k: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return f(*a, **k)

        return counted


def test_a_planned_op_crosses_into_the_core_twice() -> None:
    """With a plan that moves tensors before and after kernels, every op's moves ride on its
    op_open and op_close: no third call (plan_moves) on the step's thread but the evictions
    after a copy-in (an input is copied in by its own calls, not an op's pair)."""
    from tiermem.plan import Plan, evaluate
    from tiermem.plan.plan import gaps

    step = _step()
    g, facts = capture(step, "4:1", SLOW)
    # Every tensor fast at every use and evicted across every gap: moves before and after
    # most kernels.
    at = [[0] * len(us) for us in g.uses]
    held = [[False] * len(gaps(g, t)) for t in range(len(g.tensors))]
    peak = evaluate(g.with_capacity(1 << 40), at, held).peak[0]
    g = g.with_capacity(-(-peak // (2 << 20)) * (2 << 20) + (4 << 20))
    c = evaluate(g, at, held)
    assert c.overflow is None and c.prefetched_bytes > 0
    p = Plan(g.name, "sync", [d.name for d in g.devices], [t.key for t in g.tensors], at, held, c.seconds, "test")
    t = planned({"dram": g.devices[0].capacity, SLOW: facts["slow_bytes"]}, g, p)
    counter = _CountingNative(t._native)
    t._native = counter
    ex = t.observers[0]
    assert isinstance(ex, Executor)
    ex._native = counter
    s = step.start(t)
    for _ in range(3):
        s.step()
    counts = t.stats()["plan"]
    assert counts["planned_iterations"] >= 1 and counts["prefetches"] + counts["evictions"] > 0, counts
    inputs_evicting = sum(1 for k, ker in enumerate(g.kernels) if ker.name == "input" and ex.after[k])
    assert counter.calls.get("plan_moves", 0) <= inputs_evicting * counts["planned_iterations"], counter.calls
    assert counter.calls["op_open"] == counter.calls["op_close"] == t.stats()["ops"], counter.calls
    s.close()
