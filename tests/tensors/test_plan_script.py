"""`tiermem plan --script FILE`: the planner on a user's own model, batch, loss and optimizer
read from a Python file, planned, trained under the plan and beside the runtime variants;
and each way a script can be wrong, refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tiermem import InvalidArgumentError  # noqa: E402
from tiermem.bench.plan import verdict, verdict_line  # noqa: E402
from tiermem.cli.main import main  # noqa: E402
from tiermem.plan.torch.script import load_script, step_of  # noqa: E402

SCRIPT = """
import torch

name = "user-mlp"


class Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(64, 256)
        self.norm = torch.nn.LayerNorm(256)
        self.out = torch.nn.Linear(256, 10)

    def forward(self, x):
        h = self.inp(x)
        return self.out(h + torch.nn.functional.gelu(self.norm(h)))


def model():
    return Residual()


def batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(128, 64, generator=g), torch.randint(0, 10, (128,), generator=g)


def forward(m, b):
    return m(b[0])


def loss(out, b):
    return torch.nn.functional.cross_entropy(out, b[1])


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3)
"""


def test_a_script_is_planned_run_and_measured_against_the_runtime_variants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "mine.py"
    script.write_text(SCRIPT)
    out = tmp_path / "r.json"
    args = ["plan", "--script", str(script), "--ratio", "4:1", "--time-limit", "0", "--no-profile-cache", "--run"]
    rc = main([*args, "--iters", "2", "--against", "LM,first-touch", "--save-plan", str(tmp_path / "p.json"), "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "user-mlp-4:1" in text and "the plan against the runtime variants" in text
    res = json.loads(out.read_text())
    rows = {r["variant"]: r for r in res["run"]["against"]}
    assert set(rows) == {"planned", "LM", "first-touch"}
    for r in rows.values():
        assert r["losses_equal_plain"], r  # AdamW and the script's loss, every variant equal to plain PyTorch
    assert res["run"]["tiering"]["plan"]["runtime_kernels"] == 0
    # Tensors are named as the user knows them: parameters, their optimizer state, and the
    # module and op that made each activation; in the plan's report too.
    labels = {r["label"] for r in res["residency"]["tensors"]}
    assert {"inp.weight", "out.bias", "exp_avg of inp.weight", "exp_avg_sq of norm.weight"} <= labels, labels
    assert "norm: native_layer_norm.default" in labels, labels
    assert "the 8 largest tensors" in text and "inp.weight" in text
    v = res["verdict"]
    assert v["wins"] in (True, False) and v["best_runtime"] in ("LM", "first-touch")
    assert ("planned wins" in text) == v["wins"] and ("prediction within" in text) == v["prediction_holds"]
    assert v["use"] == (None if v["wins"] else v["best_runtime"])


def test_the_verdict_says_why_a_plan_loses() -> None:
    # planned / LM = 1/0.9, planned / first-touch = 1/1.1; predicted 0.8 of the measured.
    v = verdict({"LM": 1 / 0.9, "first-touch": 1 / 1.1}, 0.8, 0.4, 1.0, 2000)
    assert not v["wins"] and v["use"] == "LM" and not v["prediction_holds"]
    line = verdict_line("m 8:1", v)
    assert "planned LOSES to LM" in line and "use LM" in line and "20% under" in line and "per-op overhead" in line, line
    v = verdict({"LM": 1 / 1.2}, 1.05, 0.1, 1.0, 200)
    assert v["wins"] and v["prediction_holds"] and v["why"] == []
    assert "planned wins, 1.20x faster than the best runtime variant (LM)" in verdict_line("m", v)


def test_a_step_of_an_instance_starts_each_run_from_its_weights() -> None:
    m = torch.nn.Linear(4, 2)
    step = step_of(m, torch.randn(3, 4), lambda ps: torch.optim.SGD(ps, lr=0.1), lambda out, b: out.square().mean())
    first = step.start()
    a = [first.step()[0] for _ in range(2)]
    second = step.start()
    assert [second.step()[0] for _ in range(2)] == a
    assert torch.equal(m.weight, step.model().weight)  # the user's model itself is not trained


@pytest.mark.parametrize(
    "body,match",
    [
        ("x = 1\n", "defines no model, batch, optimizer"),
        ("import torch\nmodel = torch.nn.Linear(2, 2)\nbatch = torch.ones(1, 2)\n", "defines no optimizer"),
        ("model = 3\nbatch = 1\noptimizer = lambda ps: None\n", "model: expected an nn.Module"),
        (
            "import torch\nmodel = torch.nn.Linear(2, 2)\nbatch = torch.ones(1, 2)\noptimizer = 'adam'\n",
            "optimizer: expected a function",
        ),
        ("step = 'mine'\n", "not a tiermem TrainStep"),
    ],
)
def test_a_wrong_script_is_refused_by_name(tmp_path: Path, body: str, match: str) -> None:
    script = tmp_path / "bad.py"
    script.write_text(body)
    with pytest.raises(InvalidArgumentError, match=match):
        load_script(script)


def test_a_missing_script_and_a_model_without_a_loss(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="no such file"):
        load_script(tmp_path / "nope.py")
    step = step_of(torch.nn.Linear(2, 2), torch.ones(1, 2), lambda ps: torch.optim.SGD(ps, lr=0.1), name="noloss")
    with pytest.raises(InvalidArgumentError, match="noloss: the model's output has no .loss"):
        step.start().step()
    assert main(["plan", "--script", str(tmp_path / "nope.py"), "--model", "gpt"]) == 2
