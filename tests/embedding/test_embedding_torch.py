"""Differential tests: tiermem's embedding tables against torch.nn.EmbeddingBag and
torch.optim (outputs, gradients, SGD, Adagrad and lazy Adam updates; every optimizer against FBGEMM is in test_optimizers.py), FBGEMM's row-wise
Adagrad and Adam with weight decay against NumPy references, and cached tables bit-identical to direct ones under every policy."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem.embedding import EmbeddingTable  # noqa: E402
from tiermem.torch import TieredEmbeddingBag, TieredEmbeddingBagCollection  # noqa: E402

ROWS = 60
# torch's sparse optimizers warn unless sparse invariant checks are chosen explicitly.
torch.sparse.check_sparse_tensor_invariants.enable()


def random_bags(rng: np.random.Generator, bags: int, rows: int = ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D indices and start offsets with empty bags and repeated indices."""
    sizes = rng.integers(0, 7, bags)
    sizes[::5] = 0
    hot = rng.integers(0, rows, 5)
    idx = np.concatenate([np.where(rng.random(s) < 0.5, rng.choice(hot, s), rng.integers(0, rows, s)) for s in sizes])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(offsets.astype(np.int64))


def pair(width: int, mode: str, rng: np.random.Generator, **kw):
    w = torch.from_numpy(rng.standard_normal((ROWS, width)).astype(np.float32))
    ref = torch.nn.EmbeddingBag(ROWS, width, mode=mode, sparse=True, _weight=w.clone())
    ours = TieredEmbeddingBag(ROWS, width, mode=mode, _weight=w.clone(), **kw)
    return ref, ours


@pytest.mark.parametrize("width", [16, 64, 24, 7])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_forward_matches_torch(width: int, mode: str, rng: np.random.Generator) -> None:
    ref, ours = pair(width, mode, rng)
    for _ in range(3):
        idx, off = random_bags(rng, 40)
        torch.testing.assert_close(ours(idx, off), ref(idx, off), rtol=1e-5, atol=1e-5)
    fixed = torch.from_numpy(rng.integers(0, ROWS, (8, 5)))
    torch.testing.assert_close(ours(fixed), ref(fixed), rtol=1e-5, atol=1e-5)
    if mode == "sum":
        idx, off = random_bags(rng, 40)
        psw = torch.from_numpy(rng.random(len(idx)).astype(np.float32))
        torch.testing.assert_close(ours(idx, off, psw), ref(idx, off, psw), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("padding_idx", [3, -1])
def test_padding_idx_matches_torch(mode: str, padding_idx: int, rng: np.random.Generator) -> None:
    ref = torch.nn.EmbeddingBag(ROWS, 16, mode=mode, sparse=True, padding_idx=padding_idx)
    ours = TieredEmbeddingBag(ROWS, 16, mode=mode, padding_idx=padding_idx, optimizer="adagrad", lr=0.1)
    assert torch.equal(ours.weight[padding_idx], torch.zeros(16)), "padding row starts at zero"
    ours.table.load(ref.weight.detach().numpy())
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.1)
    pad = padding_idx % ROWS
    for _ in range(3):
        idx, off = random_bags(rng, 30)
        idx[::3] = pad  # many padding entries, some bags only padding
        torch.testing.assert_close(ours(idx, off), ref(idx, off), rtol=1e-5, atol=1e-5)
        g = torch.randn(30, 16)
        opt.zero_grad()
        (ref(idx, off) * g).sum().backward()
        opt.step()
        (ours(idx, off) * g).sum().backward()
    torch.testing.assert_close(ours.weight, ref.weight.detach(), rtol=1e-5, atol=1e-5)


def test_include_last_offset_and_int32(rng: np.random.Generator) -> None:
    w = torch.randn(ROWS, 16)
    ref = torch.nn.EmbeddingBag(ROWS, 16, mode="sum", include_last_offset=True, _weight=w.clone())
    ours = TieredEmbeddingBag(ROWS, 16, mode="sum", include_last_offset=True, _weight=w.clone())
    idx, off = random_bags(rng, 20)
    off = torch.cat([off, torch.tensor([len(idx)])])
    torch.testing.assert_close(ours(idx.int(), off.int()), ref(idx, off))


def test_bf16_storage_matches_torch(rng: np.random.Generator) -> None:
    w = torch.randn(ROWS, 32).to(torch.bfloat16)
    ours = TieredEmbeddingBag(ROWS, 32, mode="sum", dtype=torch.bfloat16, _weight=w.float())
    idx, off = random_bags(rng, 30)
    want = torch.nn.functional.embedding_bag(idx, w.float(), off, mode="sum")
    torch.testing.assert_close(ours(idx, off), want, rtol=1e-5, atol=1e-5)
    assert ours.state_dict()["weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_gradients_match_torch(mode: str, rng: np.random.Generator) -> None:
    width = 24
    w = rng.standard_normal((ROWS, width)).astype(np.float32)
    t = EmbeddingTable(ROWS, width)
    t.load(w)
    ref = torch.nn.EmbeddingBag(ROWS, width, mode=mode, _weight=torch.from_numpy(w.copy()))
    idx, off = random_bags(rng, 30)
    psw = torch.from_numpy(rng.random(len(idx)).astype(np.float32)) if mode == "sum" else None
    g = torch.from_numpy(rng.standard_normal((30, width)).astype(np.float32))
    (ref(idx, off, psw) * g).sum().backward()
    rows, grads = t.sparse_grad(idx.numpy(), off.numpy(), g.numpy(), None if psw is None else psw.numpy(), mode=mode)
    dense = np.zeros_like(w)
    dense[rows] = grads
    np.testing.assert_allclose(dense, ref.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert len(set(rows.tolist())) == len(rows)


def train(ref, ours, opt, rng, steps: int = 4, psw: bool = False) -> None:
    for _ in range(steps):
        idx, off = random_bags(rng, 32)
        w = torch.from_numpy(rng.random(len(idx)).astype(np.float32)) if psw else None
        r = torch.from_numpy(rng.standard_normal((32, ref.embedding_dim)).astype(np.float32))
        opt.zero_grad()
        (ref(idx, off, w) * r).sum().backward()
        opt.step()
        (ours(idx, off, w) * r).sum().backward()
    torch.testing.assert_close(ours.weight, ref.weight.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [16, 20])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_sgd_matches_torch(width: int, mode: str, rng: np.random.Generator) -> None:
    ref, ours = pair(width, mode, rng, optimizer="sgd", lr=0.1)
    train(ref, ours, torch.optim.SGD(ref.parameters(), lr=0.1), rng, psw=mode == "sum")


def test_sgd_with_nontemporal_stores_matches_torch(rng: np.random.Generator) -> None:
    ref, ours = pair(64, "sum", rng, optimizer="sgd", lr=0.05, nt_stores=True)
    train(ref, ours, torch.optim.SGD(ref.parameters(), lr=0.05), rng)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_adagrad_matches_torch(mode: str, rng: np.random.Generator) -> None:
    kw = dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-10)
    ref, ours = pair(32, mode, rng, optimizer="adagrad", **kw)
    train(ref, ours, torch.optim.Adagrad(ref.parameters(), **kw), rng, steps=5)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("where", ["direct", "cached", "table file"])
def test_adam_matches_torch_sparse_adam(mode: str, where: str, rng: np.random.Generator, tmp_path) -> None:
    """FBGEMM's lazy Adam (no weight decay) is torch.optim.SparseAdam up to where eps sits
    (under sqrt(v_hat) there, sqrt(v) here; 1e-8 either way): 20 steps within 1e-5, held
    directly, cached over a slower device, and in a table file on the disk."""
    kw: dict = {}
    if where == "cached":
        kw = {"manager": tiermem.Manager({"dram": "1 MiB", "emulated:optane-pmem": "16 MiB"}), "cache": 0.25}
    elif where == "table file":
        kw = {"where": f"table:{tmp_path / 'adam.tbl'}", "cache": 0.9}
    ref, ours = pair(16, mode, rng, optimizer="adam", lr=0.01, **kw)
    train(ref, ours, torch.optim.SparseAdam(ref.parameters(), lr=0.01), rng, steps=20)
    kind, state, steps = ours.table.optimizer_state()
    assert kind == "adam" and steps == 20 and state.size == ROWS * 32  # m and v per element


def test_adam_with_weight_decay_matches_numpy_reference(rng: np.random.Generator) -> None:
    width, lr, eps, b1, b2, wd = 8, 0.05, 1e-8, 0.8, 0.99, 0.01
    w = rng.standard_normal((ROWS, width)).astype(np.float64)
    t = EmbeddingTable(ROWS, width)
    t.load(w.astype(np.float32))
    m, v = np.zeros_like(w), np.zeros_like(w)
    for step in range(1, 7):
        idx, off = random_bags(rng, 25)
        g = rng.standard_normal((25, width)).astype(np.float32)
        rows, grads = t.sparse_grad(idx.numpy(), off.numpy(), g, mode="sum")
        cfg = tiermem.embedding.OptimizerConfig("adam", lr=lr, eps=eps, beta1=b1, beta2=b2, weight_decay=wd)
        t.update(idx.numpy(), off.numpy(), g, mode="sum", optimizer=cfg)
        m[rows] = b1 * m[rows] + (1 - b1) * grads
        v[rows] = b2 * v[rows] + (1 - b2) * grads**2
        mh, vh = m[rows] / (1 - b1**step), v[rows] / (1 - b2**step)
        w[rows] -= lr * (mh / (np.sqrt(vh) + eps) + wd * w[rows])
    np.testing.assert_allclose(t.to_numpy(), w, rtol=1e-5, atol=1e-5)
    for bad, match in (({"beta1": 1.0}, "beta1 must be in"), ({"weight_decay": -1}, "weight_decay")):
        with pytest.raises(tiermem.InvalidArgumentError, match=match):
            tiermem.embedding.OptimizerConfig("adam", **bad).validate()


def test_rowwise_adagrad_matches_numpy_reference(rng: np.random.Generator) -> None:
    width, lr, eps = 16, 0.2, 1e-8
    w = rng.standard_normal((ROWS, width)).astype(np.float32)
    t = EmbeddingTable(ROWS, width)
    t.load(w)
    momentum = np.zeros(ROWS, np.float32)
    for _ in range(4):
        idx, off = random_bags(rng, 25)
        g = rng.standard_normal((25, width)).astype(np.float32)
        rows, grads = t.sparse_grad(idx.numpy(), off.numpy(), g, mode="sum")
        t.update(idx.numpy(), off.numpy(), g, mode="sum", optimizer="rowwise_adagrad", lr=lr, eps=eps)
        momentum[rows] += (grads**2).mean(axis=1)
        w[rows] -= (lr / (np.sqrt(momentum[rows]) + eps))[:, None] * grads
    np.testing.assert_allclose(t.to_numpy(), w, rtol=1e-5, atol=1e-5)
    kind, state, steps = t.optimizer_state()
    assert kind == "rowwise_adagrad" and steps == 4
    np.testing.assert_allclose(state, momentum, rtol=1e-5)


@pytest.mark.parametrize(
    "placement",
    [
        dict(where="emulated:optane-pmem"),
        dict(where="emulated:optane-pmem", cache=0.1, policy="dynamic"),
        dict(where="emulated:optane-pmem", cache=0.5, policy="dynamic"),
        dict(where="emulated:optane-pmem", cache=1.0, policy="dynamic"),
        dict(where="emulated:cxl", cache=0.25, policy="static"),
        dict(where="emulated:optane-pmem", cache=0.2, policy="admit"),
    ],
)
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_cached_tables_are_bit_identical_to_direct(placement: dict, optimizer: str, rng: np.random.Generator) -> None:
    w = torch.from_numpy(rng.standard_normal((ROWS, 32)).astype(np.float32))
    direct = TieredEmbeddingBag(ROWS, 32, mode="sum", _weight=w, optimizer=optimizer, lr=0.1)
    other = TieredEmbeddingBag(ROWS, 32, mode="sum", _weight=w, optimizer=optimizer, lr=0.1, **placement)
    for step in range(6):
        idx, off = random_bags(rng, 32)
        r = torch.from_numpy(rng.standard_normal((32, 32)).astype(np.float32))
        a, b = direct(idx, off), other(idx, off)
        assert torch.equal(a, b), f"step {step}: outputs differ"
        (a * r).sum().backward()
        (b * r).sum().backward()
        if step == 3:
            other.table.flush()
    assert torch.equal(direct.weight, other.weight)
    if placement.get("cache"):
        s = other.table.stats()
        assert s["hits"] > 0, s


def test_collection_matches_per_table_torch(rng: np.random.Generator) -> None:
    dims = [16, 8, 64]
    coll = TieredEmbeddingBagCollection([(ROWS, d) for d in dims], mode="sum", seed=3, optimizer="sgd", lr=0.1)
    refs = [
        torch.nn.EmbeddingBag(ROWS, d, mode="sum", sparse=True, _weight=torch.from_numpy(t.to_numpy()))
        for d, t in zip(dims, coll.tables)
    ]
    opt = torch.optim.SGD([p for r in refs for p in r.parameters()], lr=0.1)
    b = 12
    for _ in range(3):
        per = [random_bags(rng, b) for _ in dims]
        indices = torch.cat([i for i, _ in per])
        starts = np.cumsum([0] + [len(i) for i, _ in per])
        offsets = torch.cat([o + int(starts[t]) for t, (_, o) in enumerate(per)] + [torch.tensor([len(indices)])])
        out = coll(indices, offsets)
        want = torch.cat([r(i, o) for r, (i, o) in zip(refs, per)], dim=1)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(want)
        opt.zero_grad()
        (want * g).sum().backward()
        opt.step()
        (out * g).sum().backward()
    for t, r in zip(coll.tables, refs):
        np.testing.assert_allclose(t.to_numpy(), r.weight.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_state_dict_round_trip(tmp_path, rng: np.random.Generator) -> None:
    a = TieredEmbeddingBag(ROWS, 16, mode="sum", optimizer="adagrad", lr=0.1, seed=1)
    idx, off = random_bags(rng, 16)
    a(idx, off).sum().backward()
    torch.save(a.state_dict(), tmp_path / "t.pt")
    b = TieredEmbeddingBag(ROWS, 16, mode="sum", optimizer="adagrad", lr=0.1, seed=2, where="emulated:cxl", cache=0.5)
    b.load_state_dict(torch.load(tmp_path / "t.pt"))
    assert torch.equal(a.weight, b.weight)
    idx, off = random_bags(rng, 16)
    a(idx, off).sum().backward()
    b(idx, off).sum().backward()
    assert torch.equal(a.weight, b.weight), "optimizer state restored too"
    c = TieredEmbeddingBag(ROWS + 1, 16)
    with pytest.raises(RuntimeError, match="size mismatch"):
        c.load_state_dict(a.state_dict())


def test_training_loop_reduces_loss() -> None:
    torch.manual_seed(0)
    emb = TieredEmbeddingBag(1000, 16, mode="mean", where="emulated:optane-pmem", cache=0.2, optimizer="adagrad", lr=0.5, seed=0)
    head = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    idx = torch.randint(0, 1000, (256, 4))
    y = (idx[:, 0] % 2).float()[:, None]
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head(emb(idx)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_constructor_refuses_unsupported_arguments() -> None:
    for kw in (
        dict(scale_grad_by_freq=True),
        dict(padding_idx=10),
        dict(mode="min"),
        dict(dtype=torch.float64),
        dict(optimizer="shampoo"),
    ):
        with pytest.raises(tiermem.InvalidArgumentError):
            TieredEmbeddingBag(10, 4, **kw)
    m = TieredEmbeddingBag(10, 4, mode="sum")
    w = torch.ones(3, requires_grad=True)
    with pytest.raises(tiermem.InvalidArgumentError, match="require grad"):
        m(torch.tensor([1, 2, 3]), torch.tensor([0]), w)


@pytest.mark.parametrize("padding_idx", [None, 3])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_max_mode_matches_torch(padding_idx: int | None, optimizer: str, rng: np.random.Generator) -> None:
    """mode='max': outputs (empty bags zeros, the padding row left out) and training, where
    each column's gradient reaches its arg-max row only."""
    kw = dict(lr=0.1) if optimizer == "sgd" else dict(lr=0.1, eps=1e-10)
    w = torch.from_numpy(rng.standard_normal((ROWS, 12)).astype(np.float32))
    ref = torch.nn.EmbeddingBag(ROWS, 12, mode="max", padding_idx=padding_idx, _weight=w.clone())  # max: dense grads
    ours = TieredEmbeddingBag(ROWS, 12, mode="max", padding_idx=padding_idx, _weight=w.clone(), optimizer=optimizer, **kw)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1) if optimizer == "sgd" else torch.optim.Adagrad(ref.parameters(), **kw)
    for _ in range(5):
        idx, off = random_bags(rng, 32)
        if padding_idx is not None:
            idx[::4] = padding_idx
        r = torch.from_numpy(rng.standard_normal((32, 12)).astype(np.float32))
        want = ref(idx, off)
        torch.testing.assert_close(ours(idx, off), want.detach(), rtol=1e-5, atol=1e-6)
        opt.zero_grad()
        (want * r).sum().backward()
        opt.step()
        (ours(idx, off) * r).sum().backward()
    torch.testing.assert_close(ours.weight, ref.weight.detach(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx, off), ref(idx, off))


@pytest.mark.parametrize(("mode", "norm_type"), [("sum", 2.0), ("mean", 1.0), ("max", 2.0)])
def test_max_norm_matches_torch(mode: str, norm_type: float, rng: np.random.Generator, tmp_path) -> None:
    """max_norm rescales the rows a batch reads before the lookup (in the table, as torch
    does in its weight), here over a table file too; then SGD trains both alike."""
    w = torch.from_numpy(3 * rng.standard_normal((ROWS, 8)).astype(np.float32))
    ref = torch.nn.EmbeddingBag(ROWS, 8, mode=mode, max_norm=2.5, norm_type=norm_type, _weight=w.clone())
    ours = TieredEmbeddingBag(
        ROWS,
        8,
        mode=mode,
        max_norm=2.5,
        norm_type=norm_type,
        _weight=w.clone(),
        lr=0.1,
        where=f"table:{tmp_path / 'n.tbl'}",
        cache=1.0,
    )
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(4):
        idx, off = random_bags(rng, 16)
        r = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
        want = ref(idx, off)
        torch.testing.assert_close(ours(idx, off), want.detach(), rtol=1e-5, atol=1e-5)
        opt.zero_grad()
        (want * r).sum().backward()
        opt.step()
        (ours(idx, off) * r).sum().backward()
    torch.testing.assert_close(ours.weight, ref.weight.detach(), rtol=1e-5, atol=1e-5)
    untouched = sorted(set(range(ROWS)) - set(np.unique(idx.numpy()).tolist()))[:1]
    assert untouched  # some rows were never read, and keep their norm
    with pytest.raises(tiermem.InvalidArgumentError, match="max_norm"):
        TieredEmbeddingBag(ROWS, 8, max_norm=-1.0)
