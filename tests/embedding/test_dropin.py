"""Issue 12, item 14: TieredEmbeddingBag as a drop-in for torch.nn.EmbeddingBag — module
conversions, per-sample-weight rules, freezing, error types code written for torch catches,
and from_pretrained. Each case runs torch's module beside ours."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tiermem.torch import TieredEmbeddingBag  # noqa: E402


def _pair(**kw):
    torch.manual_seed(0)
    ref = torch.nn.EmbeddingBag(10, 3, **kw)
    ours = TieredEmbeddingBag(10, 3, _weight=ref.weight.detach().clone(), **kw)
    return ref, ours


@pytest.mark.parametrize("convert", ["to_cpu", "cpu", "float", "double", "half", "to_float64"])
def test_module_conversions_work_on_the_module_and_on_a_model_holding_it(convert: str) -> None:
    ref, ours = _pair(mode="sum")
    f = {
        "to_cpu": lambda m: m.to("cpu"),
        "cpu": lambda m: m.cpu(),
        "float": lambda m: m.float(),
        "double": lambda m: m.double(),
        "half": lambda m: m.half(),
        "to_float64": lambda m: m.to(torch.float64),
    }[convert]
    model = torch.nn.Sequential(ours)
    assert f(model) is model and f(ours) is ours
    f(ref)
    idx = torch.tensor([[1, 2], [3, 9]])
    out, want = ours(idx), ref(idx)
    assert out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=1e-2 if want.dtype == torch.float16 else 1e-6, atol=1e-3)


def test_a_gpu_device_is_refused_with_a_runtime_error() -> None:
    _, ours = _pair()
    with pytest.raises(RuntimeError, match="run on the CPU"):
        ours._apply(lambda t: t.to("meta"))


@pytest.mark.parametrize("bad", ["dtype", "shape", "mode"])
def test_per_sample_weights_are_checked_as_torch_checks_them(bad: str) -> None:
    mode = "mean" if bad == "mode" else "sum"
    ref, ours = _pair(mode=mode)
    idx = torch.arange(21).remainder(10).reshape(7, 3)
    w = {"dtype": torch.ones(7, 3, dtype=torch.float64), "shape": torch.ones(21), "mode": torch.ones(7, 3)}[bad]
    with pytest.raises(Exception) as theirs:
        ref(idx, per_sample_weights=w)
    with pytest.raises(type(theirs.value)):
        ours(idx, per_sample_weights=w)


def test_requires_grad_false_freezes_the_rows() -> None:
    _, ours = _pair(mode="sum")
    before = ours.weight.clone()
    ours.requires_grad_(False)
    idx = torch.tensor([[1, 2]])
    out = ours(idx)
    assert not out.requires_grad
    ours.requires_grad_(True)
    ours(idx).sum().backward()
    assert not torch.equal(ours.weight, before)  # thawed: backward updates again


@pytest.mark.parametrize("case", ["padding_idx", "index", "offsets", "2d_with_offsets"])
def test_errors_are_caught_by_the_types_torch_raises(case: str) -> None:
    def build(cls):
        if case == "padding_idx":
            return cls(10, 3, padding_idx=10)
        return cls(10, 3, mode="sum")

    def use(m):
        if case == "index":
            return m(torch.tensor([[1, 10]]))
        if case == "offsets":
            return m(torch.tensor([1, 2, 3]), torch.tensor([1, 2]))
        return m(torch.tensor([[1, 2]]), torch.tensor([0]))

    with pytest.raises(Exception) as theirs:
        use(build(torch.nn.EmbeddingBag))
    with pytest.raises(type(theirs.value)):
        use(build(TieredEmbeddingBag))


def test_from_pretrained_matches_torch() -> None:
    w = torch.randn(6, 4)
    ref = torch.nn.EmbeddingBag.from_pretrained(w, mode="sum")
    ours = TieredEmbeddingBag.from_pretrained(w, mode="sum")
    idx = torch.tensor([[0, 5], [2, 2]])
    torch.testing.assert_close(ours(idx), ref(idx))
    assert not ours(idx).requires_grad  # frozen by default, as torch's
    thawed = TieredEmbeddingBag.from_pretrained(w, freeze=False, mode="sum", lr=1.0)
    thawed(idx).sum().backward()
    assert not torch.equal(thawed.weight, w)
    with pytest.raises(AssertionError):
        TieredEmbeddingBag.from_pretrained(torch.ones(3))


def test_a_bfloat16_module_takes_bfloat16_per_sample_weights_as_torch_does() -> None:
    torch.manual_seed(0)
    ref = torch.nn.EmbeddingBag(10, 4, mode="sum", dtype=torch.bfloat16)
    ours = TieredEmbeddingBag(10, 4, mode="sum", dtype=torch.bfloat16, _weight=ref.weight.detach().float())
    idx = torch.arange(21).remainder(10).reshape(7, 3)
    w = torch.rand(7, 3).to(torch.bfloat16)
    want = ref(idx, per_sample_weights=w)
    got = ours(idx, per_sample_weights=w)
    # bfloat16 rows and weights; tiermem accumulates in float32 (torch in bfloat16).
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(RuntimeError, match="must match"):
        ours(idx, per_sample_weights=w.to(torch.float64))
