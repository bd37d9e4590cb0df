"""Tiered tensors for training: same losses and weights as plain PyTorch for every variant,
the budget, bad input, failures inside the model, charging, look-ahead."""

from __future__ import annotations

import gc
import io

import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem.bench.models import GPT, WORKLOADS, build  # noqa: E402
from tiermem.torch.tensors import VARIANTS, TieredTensor, Tiering  # noqa: E402

SLOW = "emulated:optane-pmem"


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 8 * 8, 10),
    )


def batches(n: int, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 3, 32, 32, generator=g, dtype=dtype), torch.randint(0, 10, (16,), generator=g)) for _ in range(n)]


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, data: list) -> list[float]:
    losses = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def tiered(variant: str, fast: str = "3 MiB", slow: str = "64 MiB") -> Tiering:
    return Tiering({"dram": fast if variant != "all-fast" else "64 MiB", SLOW: slow}, variant)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "planned"])  # planned: tests/tensors/test_planned.py
def test_every_variant_trains_like_pytorch(variant: str) -> None:
    data = batches(3)
    ref = small_cnn()
    ref_losses = train(ref, torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9), data)
    t = tiered(variant)
    model = t.module(small_cnn())
    losses = train(model, t.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)), data)
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert isinstance(p, TieredTensor), name
        torch.testing.assert_close(p.to_plain(), q.detach(), atol=1e-5, rtol=1e-5)
    for b, rb in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b.to_plain(), rb)
    u = t.manager.usage()["dram"]
    assert u["peak"] <= u["capacity"]
    t.manager.check()
    t.close()


def test_budget_holds_and_data_moves_to_the_slow_tier() -> None:
    t = tiered("LM", fast="3 MiB")
    model = t.module(small_cnn())
    train(model, t.optimizer(torch.optim.SGD(model.parameters(), lr=0.05)), batches(2))
    stats = t.manager.stats()
    assert stats["dram"]["evictions"] > 0
    assert t.manager.usage()["dram"]["peak"] <= t.budget == 3 << 20
    assert t.stats()["out_ops"] > 0


@pytest.mark.parametrize("variant", ["L", "LM", "async"])
def test_making_room_for_an_output_never_evicts_the_ops_own_input(variant: str) -> None:
    # Fast memory holds four 1 MiB tensors; the op's input is the least recently used, so
    # making room for its output would evict it first were it not pinned before.
    t = tiered(variant, fast="4 MiB")
    n = (1 << 20) // 4
    a, *rest = [t.tensor(torch.full((n,), float(i))) for i in range(4)]
    assert [x.tier for x in (a, *rest)] == ["dram"] * 4
    b = a + 1
    assert a.tier == "dram" and b.tier == "dram"
    assert [x.tier for x in rest].count(SLOW) == 1
    torch.testing.assert_close(b.to_plain(), torch.full((n,), 1.0))
    t.close()


def test_gpt_with_adamw_and_tied_weights_matches_pytorch() -> None:
    def make() -> GPT:
        torch.manual_seed(0)
        return GPT(layers=2, d=32, heads=4, vocab=64, seq=16)

    g = torch.Generator().manual_seed(2)
    data = [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)) for _ in range(3)]

    def run(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[float]:
        out = []
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    ref = make()
    want = run(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    t = Tiering({"dram": "512 KiB", SLOW: "64 MiB"}, "LMP")
    model = t.module(make())
    assert model.head.weight is model.tok.weight, "tied weights stay tied"
    got = run(model, t.optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2)))
    assert got == pytest.approx(want, abs=1e-5)
    t.manager.check()


def test_float64_non_contiguous_and_views() -> None:
    t = tiered("LM")
    x = torch.randn(6, 5, dtype=torch.float64)
    tx = t.tensor(x.t())  # non-contiguous in, stored contiguous
    assert tx.dtype == torch.float64 and tx.shape == (5, 6)
    torch.testing.assert_close(tx.to_plain(), x.t())
    v = tx[1:4, ::2].t()  # a view of a view shares the object
    assert v.object_id == tx.object_id
    torch.testing.assert_close((v * 2).to_plain(), x.t()[1:4, ::2].t() * 2)
    tx[0].fill_(3.0)  # in place through a view writes the object
    assert float(tx.to_plain()[0].sum()) == 18.0
    ref = small_cnn().double()
    data = batches(2, torch.float64)
    want = train(ref, torch.optim.SGD(ref.parameters(), lr=0.05), data)
    model = t.module(small_cnn().double())
    got = train(model, t.optimizer(torch.optim.SGD(model.parameters(), lr=0.05)), data)
    assert got == pytest.approx(want, abs=1e-10)


def test_batched_matmul_reshapes_without_copying() -> None:
    # matmul reshapes its fresh bmm result with _unsafe_view, whose schema does not mark the
    # alias (and which has an .out overload): it must share the object, not copy it.
    t = tiered("all-fast")
    a, b = torch.randn(2, 3, 4, 5), torch.randn(5, 6)
    ta, tb = t.tensor(a), t.tensor(b)
    v = torch.ops.aten._unsafe_view(ta, [6, 4, 5])
    assert v.object_id == ta.object_id
    torch.testing.assert_close(v.to_plain(), a.reshape(6, 4, 5))
    before = t.stats()
    torch.testing.assert_close((ta @ tb).to_plain(), a @ b)
    after = t.stats()
    assert after["view_ops"] > before["view_ops"]
    assert after["out_ops"] - before["out_ops"] == 1  # the mm; its reshape copies nothing
    assert after["fallback_ops"] == before["fallback_ops"]


def test_unsupported_tensors_and_ops_are_refused_clearly() -> None:
    t = tiered("LM")
    with pytest.raises(tiermem.InvalidArgumentError, match="layout"):
        t.tensor(torch.eye(3).to_sparse())
    with pytest.raises(tiermem.InvalidArgumentError, match="torch.Tensor"):
        t.tensor([1.0, 2.0])  # type: ignore[arg-type]
    a = t.tensor(torch.ones(2, 3))
    # t_() became another view of the object (issue 46); changing the storage stays refused.
    with pytest.raises(tiermem.InvalidArgumentError, match="resize_"):
        a.resize_(7)
    with pytest.raises(tiermem.InvalidArgumentError, match="variant"):
        Tiering({"dram": "1 MiB", SLOW: "8 MiB"}, "fastest")
    m = tiermem.Manager({"dram": "1 MiB", SLOW: "8 MiB"}, "lru")
    with pytest.raises(tiermem.InvalidArgumentError, match="needs policy"):
        Tiering(manager=m, variant="LM")
    plain = small_cnn()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    with pytest.raises(tiermem.InvalidArgumentError, match="not tiered"):
        t.optimizer(opt)


def test_operands_of_two_tierings_are_refused() -> None:
    a, b = tiered("LM"), tiered("LM")
    x, y = a.tensor(torch.ones(4)), b.tensor(torch.ones(4))
    with pytest.raises(tiermem.InvalidArgumentError, match="another Tiering"):
        x + y
    torch.testing.assert_close((x + x).to_plain(), torch.full((4,), 2.0))
    a.manager.check()
    b.manager.check()


def test_a_budget_too_small_for_one_op_fails_before_training_and_at_the_op() -> None:
    t = Tiering({"dram": "64 KiB", SLOW: "64 MiB"}, "LM")
    model = small_cnn()
    x = torch.randn(16, 3, 32, 32)
    with pytest.raises(tiermem.BudgetError, match=r"op convolution.default: .* budget \('dram'\) is 64.0 KiB \(65536 bytes\)"):
        t.check(model, x)
    assert t.manager.object_count == 0, "the check allocates nothing"
    model = t.module(model)
    before = t.manager.object_count
    with pytest.raises(tiermem.BudgetError, match="convolution"):
        model(x)
    gc.collect()
    assert t.manager.object_count == before + 0  # the input copy is freed with the failed step
    t.manager.check()
    ok = Tiering({"dram": "4 MiB", SLOW: "64 MiB"}, "LM").check(small_cnn(), x)
    assert ok["ops"] > 10 and ok["largest_op_output_bytes"] > 0


class Boom(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = small_cnn()[:3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.body(x)
        raise RuntimeError("user code failed")


@pytest.mark.parametrize("variant", ["LM", "L", "async"])
def test_an_exception_in_the_model_leaves_the_manager_consistent(variant: str) -> None:
    t = tiered(variant, fast="3 MiB")
    model = t.module(Boom())
    base = t.manager.object_count
    for _ in range(2):
        with pytest.raises(RuntimeError, match="user code failed"):
            model(torch.randn(8, 3, 32, 32))
    gc.collect()
    t.end_iteration()  # variant L frees dead tensors at the iteration's end
    assert t.manager.object_count == base
    t.manager.check()


def test_operands_on_an_emulated_device_are_charged() -> None:
    t = tiered("all-slow")
    a = t.tensor(torch.ones(256, 256))
    b = t.tensor(torch.ones(256, 256))
    t.manager.reset_stats()
    c = a @ b
    s = t.manager.stats()
    nbytes = 256 * 256 * 4
    assert s[SLOW]["bytes_read"] == 2 * nbytes and s[SLOW]["bytes_written"] == nbytes
    assert s["dram"]["bytes_read"] == 0
    assert float(c.to_plain()[0, 0]) == 256.0


def test_prompt_freeing_writes_less_to_the_slow_tier() -> None:
    written = {}
    for v in ("L", "LM"):
        t = tiered(v, fast="3 MiB")
        model = t.module(small_cnn())
        train(model, t.optimizer(torch.optim.SGD(model.parameters(), lr=0.05)), batches(3))
        written[v] = t.manager.stats()[SLOW]["bytes_written"]
        assert t.stats()["freed_late" if v == "L" else "freed_at_once"] > 0
    assert written["LM"] < written["L"]


def test_lookahead_prefetches_from_the_previous_iteration() -> None:
    t = tiered("async", fast="3 MiB")
    model = t.module(small_cnn())
    train(model, t.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)), batches(4))
    t.close()  # the mover finishes what was queued
    la = t.stats()["lookahead"]
    assert la["queued"] > 0 and la["prefetched"] > 0
    assert la["prefetched"] + la["written_behind"] + la["skipped"] == la["queued"] + la["behind_queued"], la


def test_state_dict_saves_plain_tensors() -> None:
    t = tiered("LM")
    model = t.module(small_cnn())
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf)
    assert all(type(v) is torch.Tensor for v in sd.values())
    plain = small_cnn()
    plain.load_state_dict(sd)
    model.load_state_dict(plain.state_dict())  # copy_ into tiered parameters
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.to_plain(), q.detach())


def test_workloads_build_and_refuse_bad_names() -> None:
    # Ours, and the libraries' own models (test_cli.py runs those).
    assert set(WORKLOADS) == {"resnet", "densenet", "vgg", "gpt", "hf:gpt2", "tv:resnet50"}
    for name in ("resnet", "densenet", "vgg", "gpt"):
        w = build(name, 1)
        x, y = w.inputs(0)
        out = w.make()(x if name != "gpt" else x[:, :8])
        assert out.shape[0] == 1
    with pytest.raises(tiermem.InvalidArgumentError, match="known are"):
        build("alexnet")
    with pytest.raises(tiermem.InvalidArgumentError, match="batch"):
        build("vgg", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32])
def test_relu_runs_as_clamp_min_out_bit_for_bit(dtype: torch.dtype) -> None:
    """relu's .out overload is replaced by clamp_min.out (ops.OUT_REPLACEMENTS): the same
    bits as torch.relu, signed zeros and NaNs included, written straight into tiered memory."""
    t = tiered("all-fast")
    if dtype.is_floating_point:
        x = torch.cat([torch.tensor([-0.0, 0.0, float("nan"), float("-inf"), float("inf"), -1.5]), torch.randn(200)])
    else:
        x = torch.randint(-50, 50, (64,))
    x = x.to(dtype)
    before = t.stats()
    got = torch.relu(t.tensor(x)).to_plain()
    after = t.stats()
    want = torch.relu(x)
    bits = _same_width_int(dtype)
    assert torch.equal(got.view(bits), want.view(bits))
    assert after["out_ops"] - before["out_ops"] == 1 and after["fallback_ops"] == before["fallback_ops"]


def _same_width_int(dtype: torch.dtype) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
