"""What a user does with a model of their own after tiering it: evaluate a transformer under
no_grad, cast it to bfloat16 or float64, copy it (EMA), save and load it, read its outputs
with NumPy, check its budget when its forward makes tensors, compile it. Each beside a plain copy from
the same weights."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem.torch.tensors import EagerFallbackWarning, TieredTensor, Tiering  # noqa: E402

SLOW = "emulated:optane-pmem"


def tiering(fast: str = "64 MiB") -> Tiering:
    return Tiering({"dram": fast, SLOW: "256 MiB"}, "LM")


def twins(make, dtype: torch.dtype | None = None):  # type: ignore[no-untyped-def]
    """A plain model and a tiered copy of the same weights (and their tiering)."""
    torch.manual_seed(0)
    plain = make()
    if dtype is not None:
        plain = plain.to(dtype)
    t = tiering()
    return plain, t.module(copy.deepcopy(plain)), t


def test_a_transformer_evaluates_under_no_grad_as_plain_pytorch() -> None:
    """The fast path of nn.TransformerEncoderLayer and nn.MultiheadAttention in eval:
    aten._native_multi_head_attention, whose .out overload refuses the undefined weights
    output its meta run gives; it runs as the functional op, its results copied in."""
    plain, tiered, t = twins(lambda: torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True))
    plain.eval()
    tiered.eval()
    x = torch.randn(3, 7, 32)
    with torch.no_grad():
        want, got = plain(x), tiered(x)
    assert isinstance(got, TieredTensor)
    torch.testing.assert_close(got.to_plain(), want, rtol=0, atol=0)
    assert t.stats()["out_refused"] >= 1 and t.out_refused, t.stats()
    mha_plain, mha, _ = twins(lambda: torch.nn.MultiheadAttention(32, 4, batch_first=True))
    mha_plain.eval()
    mha.eval()
    with torch.no_grad():
        (a, wa), (b, wb) = mha_plain(x, x, x), mha(x, x, x)
    torch.testing.assert_close(b.to_plain(), a, rtol=0, atol=0)
    torch.testing.assert_close(wb.to_plain(), wa, rtol=0, atol=0)


def test_a_bfloat16_model_trains_as_plain_pytorch() -> None:
    """LayerNorm in bfloat16 returns float32 statistics its .out overload will not write."""
    plain, tiered, t = twins(
        lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU()), torch.bfloat16
    )
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    a, b = plain(x), tiered(x)
    assert b.dtype == torch.bfloat16
    torch.testing.assert_close(b.to_plain(), a, rtol=0, atol=0)
    a.float().sum().backward()
    b.float().sum().backward()
    for p, q in zip(plain.parameters(), tiered.parameters(), strict=True):
        torch.testing.assert_close(q.grad.to_plain(), p.grad, rtol=0, atol=0)
    assert "native_layer_norm.default" in t.out_refused


def test_model_to_dtype_after_tiering_converts_the_tiered_parameters() -> None:
    plain, tiered, t = twins(lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    plain.to(torch.float64)
    tiered.to(torch.float64)
    assert all(isinstance(p, TieredTensor) and p.dtype == torch.float64 for p in tiered.parameters())
    assert all(isinstance(p, torch.nn.Parameter) for p in tiered.parameters())
    x = torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(tiered(x).to_plain(), plain(x), rtol=0, atol=0)
    opt = t.optimizer(torch.optim.SGD(tiered.parameters(), lr=0.1))
    tiered(x).sum().backward()
    opt.step()
    t.manager.check()


def test_a_deep_copy_is_a_tiered_model_of_its_own_in_the_same_tiering() -> None:
    _, tiered, t = twins(lambda: torch.nn.Linear(4, 4))
    ema = copy.deepcopy(tiered)
    assert all(isinstance(p, torch.nn.Parameter) and isinstance(p, TieredTensor) for p in ema.parameters())
    assert {p.object_id for p in ema.parameters()}.isdisjoint({p.object_id for p in tiered.parameters()})
    assert ema.weight.tiering is t
    x = torch.randn(2, 4)
    torch.testing.assert_close(ema(x).to_plain(), tiered(x).to_plain(), rtol=0, atol=0)
    with torch.no_grad():
        ema.weight.mul_(0.5)  # an EMA update touches the copy alone
    assert not torch.equal(ema.weight.to_plain(), tiered.weight.to_plain())


def test_a_saved_tiered_model_and_optimizer_load_as_plain_ones() -> None:
    plain, tiered, t = twins(lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    opt = t.optimizer(torch.optim.AdamW(tiered.parameters(), lr=1e-2))
    x = torch.randn(6, 4)
    tiered(x).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": tiered, "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    # Loaded without unpickling code: only the model's classes and the no-op that stands for
    # the input hook are allowed.
    from tiermem.torch.tensors.tiering import _no_hook

    with torch.serialization.safe_globals([torch.nn.Sequential, torch.nn.Linear, torch.nn.Tanh, _no_hook]):
        back = torch.load(buf, weights_only=True)
    loaded = back["model"]
    assert all(type(p) is torch.nn.Parameter for p in loaded.parameters())
    torch.testing.assert_close(loaded(x), tiered(x).to_plain(), rtol=0, atol=0)
    moments = back["optimizer"]["state"][0]
    assert type(moments["exp_avg"]) is torch.Tensor and moments["exp_avg"].abs().sum() > 0
    with pytest.raises(tiermem.InvalidArgumentError, match="cannot be pickled"):
        torch.save(t, io.BytesIO())


def test_outputs_read_with_numpy_and_tolist() -> None:
    plain, tiered, _ = twins(lambda: torch.nn.Linear(4, 3))
    x = torch.randn(2, 4)
    want, got = plain(x), tiered(x)
    with pytest.raises(RuntimeError, match="requires grad"):
        got.numpy()
    assert (got.detach().numpy() == want.detach().numpy()).all()
    assert got.tolist() == want.tolist()
    assert got.sum().item() == want.sum().item()
    assert "TieredTensor(shape=(2, 3)" in repr(got)


class Masked(torch.nn.Module):
    """A forward that makes tensors of its own: a causal mask and a scale."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.ones(n, n).tril()
        return (self.proj(x) @ x.transpose(1, 2) * mask).softmax(-1) @ x * torch.tensor(0.5)


def test_check_traces_a_forward_that_makes_tensors_and_raises_at_the_op() -> None:
    x = torch.randn(2, 64, 16)
    t = tiering("64 MiB")
    model = t.module(Masked())
    seen = t.check(model, x)
    assert seen["traced"] and seen["ops"] > 5
    model(x).sum().backward()  # and it runs
    tight = Tiering({"dram": "16 KiB", SLOW: "64 MiB"}, "LM")
    with pytest.raises(tiermem.BudgetError, match=r"op \w+"):
        tight.check(Masked(), x)

    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x  # the meta device has no values

    with pytest.raises(tiermem.InvalidArgumentError, match="cannot be traced on the meta device"):
        t.check(DataDependent(), x)


def test_in_place_views_give_the_same_values_and_gradients() -> None:
    """squeeze_, unsqueeze_, t_, transpose_ on tiered tensors (ATen squeezes matmul's result
    in place for a 1-D operand): the tensor becomes another view of its object."""
    t = tiering()
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(4)
    tw = t.tensor(w, requires_grad=True)
    a, b = x @ w, t.tensor(x) @ tw
    assert b.shape == (3,)
    torch.testing.assert_close(b.to_plain(), a, rtol=0, atol=0)
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(tw.grad.to_plain(), w.grad, rtol=0, atol=0)
    z0 = torch.randn(2, 3)
    z = t.tensor(z0)
    oid = z.object_id
    z.t_()
    assert z.shape == (3, 2) and z.object_id == oid
    torch.testing.assert_close(z.to_plain(), z0.t(), rtol=0, atol=0)
    z.unsqueeze_(0).transpose_(0, 2)
    torch.testing.assert_close(z.to_plain(), z0.t().unsqueeze(0).transpose(0, 2), rtol=0, atol=0)
    z.squeeze_()
    torch.testing.assert_close(z.to_plain(), z0, rtol=0, atol=0)
    with pytest.raises(tiermem.InvalidArgumentError, match="resize_"):
        z.resize_(6)
    t.manager.check()


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8))


@pytest.mark.parametrize("how", ["torch.compile", "module.compile"])
def test_a_compiled_tiered_model_trains_as_plain_pytorch_with_one_warning(how: str) -> None:
    """torch.compile cannot trace tiered tensors: each op on them runs eagerly through
    tiermem, with one EagerFallbackWarning, and losses equal the uncompiled plain model's."""
    torch._dynamo.reset()
    plain, tiered, t = twins(_mlp)
    opt_p = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    opt_t = t.optimizer(torch.optim.AdamW(tiered.parameters(), lr=1e-2))
    if how == "torch.compile":
        run = torch.compile(tiered)
    else:
        tiered.compile()
        run = tiered
    g = torch.Generator().manual_seed(3)
    with pytest.warns(EagerFallbackWarning, match="torch.compile of a tiered Sequential") as seen:
        for _ in range(3):
            x = torch.randn(4, 32, generator=g)
            for model, opt in ((plain, opt_p), (run, opt_t)):
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                if model is plain:
                    want = loss.item()
            assert loss.item() == want
    assert sum(w.category is EagerFallbackWarning for w in seen) == 1
    for p, q in zip(plain.parameters(), tiered.parameters(), strict=True):
        torch.testing.assert_close(q.to_plain(), p, rtol=0, atol=0)
    t.close()
