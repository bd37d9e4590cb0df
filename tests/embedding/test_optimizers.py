"""Every fused optimizer over 20 steps, held directly, cached over a slower device and in a
table file on the disk, against an outside reference on the same steps:

* FBGEMM's CPU table-batched embeddings (``fbgemm-gpu-cpu``) for the optimizers its CPU
  build runs: ``EXACT_SGD``, ``EXACT_ADAGRAD`` and ``EXACT_ROWWISE_ADAGRAD``;
* ``torch.optim.SGD`` with momentum and weight decay, and ``torch.optim.Adagrad`` with
  weight decay, on steps that touch every row (where lazy and dense updates agree);
* for the optimizers FBGEMM builds for GPUs only (``adam``, ``partial_rowwise_adam``,
  ``lamb``, ``partial_rowwise_lamb``, ``lars_sgd``) and for row-wise Adagrad's weight decay
  modes (which the CPU build of fbgemm-gpu-cpu 1.9.0 ignores: see
  ``test_fbgemm_cpu_build_ignores_rowwise_adagrad_weight_decay``), NumPy in float64,
  transcribed from FBGEMM's kernel generator (``fbgemm_gpu/codegen/genscript/optimizers.py``,
  pytorch/FBGEMM v1.8.0), with the gradient of each step taken from ``torch.nn.EmbeddingBag``.

float16 rows are checked against FBGEMM's ``FP16`` weights the same way (and where FBGEMM's
CPU kernels round twice, that is shown exactly). Tolerance: 1e-5 relative (and absolute,
for values near zero)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem.embedding import OptimizerConfig  # noqa: E402
from tiermem.torch import TieredEmbeddingBag  # noqa: E402

ROWS, WIDTH, STEPS, BATCH = 160, 16, 20, 16
WHERE = ["direct", "cached", "table file"]


def placement(where: str, tmp_path, every_row: bool = False) -> dict[str, Any]:
    """Keywords that hold the rows ``where``: a table file's cache must hold every row one
    step touches, so steps that touch every row get a cache of the whole table."""
    if where == "cached":
        return {"manager": tiermem.Manager({"dram": "1 MiB", "emulated:optane-pmem": "16 MiB"}), "cache": 0.25}
    if where == "table file":
        return {"where": f"table:{tmp_path / 'rows.tbl'}", "cache": 1.0 if every_row else 0.6}
    return {}


def batches(seed: int, every_row: bool = False) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """STEPS batches (indices, offsets, output weighting), repeated rows and empty bags
    included; with ``every_row`` the last bag holds every row once."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        sizes = rng.integers(0, 6, BATCH)
        sizes[::7] = 0
        idx = [rng.integers(0, ROWS, s) for s in sizes]
        if every_row:
            idx[-1] = rng.permutation(ROWS)
        off = np.concatenate([[0], np.cumsum([len(i) for i in idx])[:-1]])
        r = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
        out.append(
            (torch.from_numpy(np.concatenate(idx).astype(np.int64)), torch.from_numpy(off.astype(np.int64)), torch.from_numpy(r))
        )
    return out


def start(seed: int) -> np.ndarray:
    return np.random.default_rng(seed + 1).standard_normal((ROWS, WIDTH)).astype(np.float32)


def train_ours(opt: OptimizerConfig, mode: str, steps, w0: np.ndarray, **kw: Any) -> TieredEmbeddingBag:
    ours = TieredEmbeddingBag(ROWS, WIDTH, mode=mode, optimizer=opt, _weight=torch.from_numpy(w0.copy()), **kw)
    for idx, off, r in steps:
        (ours(idx, off) * r).sum().backward()
    return ours


def close(ours: TieredEmbeddingBag, want: np.ndarray | torch.Tensor) -> None:
    want_t = torch.as_tensor(want, dtype=torch.float32)
    torch.testing.assert_close(ours.weight, want_t, rtol=1e-5, atol=1e-5)


# --- FBGEMM's CPU kernels --------------------------------------------------------------


def fbgemm() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from fbgemm_gpu.split_embedding_configs import EmbOptimType
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
                ComputeDevice,
                SplitTableBatchedEmbeddingBagsCodegen,
                WeightDecayMode,
            )
        except ImportError as e:  # the test extra pins it; a bare checkout may lack it
            pytest.skip(f"fbgemm-gpu-cpu is not installed: {e}")
    return EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen, WeightDecayMode


def train_fbgemm(kind: str, mode: str, steps, w0: np.ndarray, **settings: Any) -> torch.Tensor:
    EmbOptimType, Location, Pooling, Device, TBE, _ = fbgemm()
    tbe = TBE(
        [(ROWS, WIDTH, Location.HOST, Device.CPU)],
        optimizer=getattr(EmbOptimType, kind),
        pooling_mode=Pooling.SUM if mode == "sum" else Pooling.MEAN,
        **settings,
    )
    with torch.no_grad():
        tbe.split_embedding_weights()[0].copy_(torch.from_numpy(w0))
    for idx, off, r in steps:
        (tbe(idx, torch.cat([off, torch.tensor([len(idx)])])) * r).sum().backward()
    return tbe.split_embedding_weights()[0].detach().clone()


def _fb_cases() -> list[tuple[str, str, dict[str, Any], str | None]]:
    """(our name, FBGEMM's, FBGEMM's settings, our weight_decay_mode)."""
    return [
        ("sgd", "EXACT_SGD", {"learning_rate": 0.1}, None),
        ("adagrad", "EXACT_ADAGRAD", {"learning_rate": 0.1, "eps": 1e-8}, None),
        ("rowwise_adagrad", "EXACT_ROWWISE_ADAGRAD", {"learning_rate": 0.1, "eps": 1e-8}, None),
    ]


@pytest.mark.parametrize("case", _fb_cases(), ids=lambda c: f"{c[0]}-{c[3] or 'no decay'}")
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("where", WHERE)
def test_matches_fbgemm_cpu(case, mode: str, where: str, tmp_path) -> None:
    name, kind, settings, decay = case
    steps, w0 = batches(1), start(1)
    want = train_fbgemm(kind, mode, steps, w0, **settings)
    opt = OptimizerConfig(name, lr=settings["learning_rate"], eps=settings.get("eps"), weight_decay_mode=decay)
    ours = train_ours(opt, mode, steps, w0, **placement(where, tmp_path))
    assert not np.allclose(want.numpy(), w0)  # the steps moved the rows
    close(ours, want)


# --- torch.optim, every row touched ----------------------------------------------------


def train_torch(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], mode: str, steps, w0: np.ndarray
) -> torch.Tensor:
    ref = torch.nn.EmbeddingBag(ROWS, WIDTH, mode=mode, _weight=torch.from_numpy(w0.copy()))
    opt = make(list(ref.parameters()))
    for idx, off, r in steps:
        opt.zero_grad()
        (ref(idx, off) * r).sum().backward()
        opt.step()
    return ref.weight.detach()


TORCH_CASES = {
    "momentum_sgd": (
        OptimizerConfig("momentum_sgd", lr=0.05, momentum=0.9, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
    ),
    "adagrad with weight decay": (
        OptimizerConfig("adagrad", lr=0.1, eps=1e-10, lr_decay=0.01, weight_decay=0.02),
        lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10, lr_decay=0.01, weight_decay=0.02),
    ),
    "sgd with weight decay": (
        OptimizerConfig("sgd", lr=0.1, weight_decay=0.03),
        lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.03),
    ),
}


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
@pytest.mark.parametrize("where", WHERE)
def test_matches_torch_optim_when_every_row_moves(case: str, where: str, tmp_path) -> None:
    opt, make = TORCH_CASES[case]
    steps, w0 = batches(2, every_row=True), start(2)
    want = train_torch(make, "sum", steps, w0)
    close(train_ours(opt, "sum", steps, w0, **placement(where, tmp_path, every_row=True)), want)


# --- FBGEMM's GPU-only optimizers, as NumPy -------------------------------------------


def grads_of(w: np.ndarray, idx: torch.Tensor, off: torch.Tensor, r: torch.Tensor, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows a step touches and their summed gradients, from torch.nn.EmbeddingBag."""
    ref = torch.nn.EmbeddingBag(ROWS, WIDTH, mode=mode, _weight=torch.from_numpy(w.astype(np.float32)))
    (ref(idx, off) * r).sum().backward()
    rows = np.unique(idx.numpy())
    return rows, ref.weight.grad.numpy()[rows].astype(np.float64)


def _norm(x: np.ndarray) -> np.ndarray:
    return np.sqrt((x * x).sum(axis=1, keepdims=True))


def _trust(w: np.ndarray, r: np.ndarray) -> np.ndarray:
    wn, rn = _norm(w), _norm(r)
    return np.where((wn > 0) & (rn > 0), wn / np.where(rn > 0, rn, 1), 1.0)


def numpy_fbgemm(name: str, c: OptimizerConfig, mode: str, steps, w0: np.ndarray) -> np.ndarray:
    """FBGEMM's update for ``name`` (its kernel generator's formulas, float64)."""
    w = w0.astype(np.float64)
    m1 = np.zeros_like(w)
    m2 = np.zeros_like(w) if name in ("adam", "lamb") else np.zeros((ROWS, 1))
    lr, eps, b1, b2, wd = c.lr, c.effective_eps, c.beta1, c.beta2, c.weight_decay
    for t, (idx, off, r) in enumerate(steps, start=1):
        rows, g = grads_of(w, idx, off, r, mode)
        x = w[rows]
        if name == "rowwise_adagrad":  # split_weight_update_cpu
            l2 = wd if c.weight_decay_mode == "l2" else 0.0
            m2[rows] += ((g + l2 * x) ** 2).mean(axis=1, keepdims=True)
            mult = lr / (np.sqrt(m2[rows]) + eps)
            keep = 1 - mult * wd if c.weight_decay_mode == "l2" else 1 - lr * wd
            w[rows] = keep * x - mult * g
            continue
        if name == "lars_sgd":
            wn, gn = _norm(x), _norm(g)
            den = gn + wd * wn
            a = np.where((wn > 0) & (den > 0), lr * c.eta * wn / np.where(den > 0, den, 1), lr)
            m1[rows] = c.momentum * m1[rows] + a * (g + wd * x)
            w[rows] = x - m1[rows]
            continue
        m1[rows] = b1 * m1[rows] + (1 - b1) * g
        sq = g * g if name in ("adam", "lamb") else (g * g).mean(axis=1, keepdims=True)
        m2[rows] = b2 * m2[rows] + (1 - b2) * sq
        step = (m1[rows] / (1 - b1**t)) / (np.sqrt(m2[rows] / (1 - b2**t)) + eps)
        if name in ("adam", "partial_rowwise_adam"):
            w[rows] = x - lr * (step + wd * x)
        else:  # the LAMBs: Adam's step plus decay, scaled by the row's trust ratio
            rt = step + wd * x
            w[rows] = x - lr * _trust(x, rt) * rt
    return w


NUMPY_CASES = {
    "rowwise_adagrad l2": OptimizerConfig("rowwise_adagrad", lr=0.1, weight_decay=0.05, weight_decay_mode="l2"),
    "rowwise_adagrad decoupled": OptimizerConfig("rowwise_adagrad", lr=0.1, weight_decay=0.05, weight_decay_mode="decoupled"),
    "adam": OptimizerConfig("adam", lr=0.02, beta1=0.8, beta2=0.99, weight_decay=0.01),
    "partial_rowwise_adam": OptimizerConfig("partial_rowwise_adam", lr=0.02, beta1=0.8, beta2=0.99, weight_decay=0.01),
    "lamb": OptimizerConfig("lamb", lr=0.02, beta1=0.8, beta2=0.99, weight_decay=0.01),
    "partial_rowwise_lamb": OptimizerConfig("partial_rowwise_lamb", lr=0.02, beta1=0.8, beta2=0.99, weight_decay=0.01),
    "lars_sgd": OptimizerConfig("lars_sgd", lr=0.5, eta=0.01, momentum=0.9, weight_decay=0.001),
}


@pytest.mark.parametrize("name", sorted(NUMPY_CASES))
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("where", WHERE)
def test_matches_fbgemm_formulas(name: str, mode: str, where: str, tmp_path) -> None:
    opt = NUMPY_CASES[name]
    name = opt.name
    steps, w0 = batches(3), start(3)
    want = numpy_fbgemm(name, opt, mode, steps, w0)
    assert not np.allclose(want, w0)
    ours = train_ours(opt, mode, steps, w0, **placement(where, tmp_path))
    close(ours, want)
    kind, state, n = ours.table.optimizer_state()
    per_row = {"adam": 2 * WIDTH, "lamb": 2 * WIDTH, "lars_sgd": WIDTH, "rowwise_adagrad": 1}.get(name, WIDTH + 1)
    assert (kind, n, state.size) == (name, STEPS, ROWS * per_row)


def test_fbgemm_cpu_build_ignores_rowwise_adagrad_weight_decay() -> None:
    """Why row-wise Adagrad's weight decay is checked against FBGEMM's formulas and not its
    CPU kernels: fbgemm-gpu-cpu 1.9.0 accepts ``weight_decay`` with ``L2`` or ``DECOUPLE``
    and trains exactly as without it: its CPU backward
    (``codegen/training/backward/embedding_backward_split_cpu_template.cpp``) hands
    ``weight_decay=0`` to FBGEMM's ``GenerateSparseAdaGrad`` for float32 tables of one
    feature. When this fails, FBGEMM applies it: compare against the kernels directly."""
    *_, WeightDecayMode = fbgemm()
    steps, w0 = batches(5)[:3], start(5)
    plain = train_fbgemm("EXACT_ROWWISE_ADAGRAD", "sum", steps, w0, learning_rate=0.1, eps=1e-8)
    for m in (WeightDecayMode.L2, WeightDecayMode.DECOUPLE):
        decayed = train_fbgemm(
            "EXACT_ROWWISE_ADAGRAD", "sum", steps, w0, learning_rate=0.1, eps=1e-8, weight_decay=0.5, weight_decay_mode=m
        )
        assert torch.equal(plain, decayed), m


def test_optimizer_state_survives_a_checkpoint(tmp_path) -> None:
    """Train 10 steps, save, load into a fresh module, train 10 more: the rows equal 20
    uninterrupted steps (the moments and the step count travel with the rows)."""
    opt = NUMPY_CASES["partial_rowwise_lamb"]
    steps, w0 = batches(4), start(4)
    whole = train_ours(opt, "sum", steps, w0)
    first = train_ours(opt, "sum", steps[:10], w0)
    second = TieredEmbeddingBag(ROWS, WIDTH, mode="sum", optimizer=opt, where=f"table:{tmp_path / 'r.tbl'}", cache=0.5)
    second.load_state_dict(first.state_dict())
    for idx, off, r in steps[10:]:
        (second(idx, off) * r).sum().backward()
    torch.testing.assert_close(second.weight, whole.weight, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("opt", "match"),
    [
        (OptimizerConfig("sgd", momentum=0.9), "use 'momentum_sgd'"),
        (OptimizerConfig("adam", weight_decay=0.1, weight_decay_mode="l2"), "'adam' has no L2 weight decay"),
        (OptimizerConfig("lars_sgd", weight_decay_mode="decoupled"), "'lars_sgd' has no Decoupled"),
        (OptimizerConfig("lamb", beta2=1.0), "beta2 must be in"),
        (OptimizerConfig("momentum_sgd", momentum=-0.5), "momentum"),
        (OptimizerConfig("rowwise_adagrad", weight_decay_mode="l1"), "weight_decay_mode 'l1'"),
    ],
)
def test_bad_settings_are_refused_by_name(opt: OptimizerConfig, match: str) -> None:
    """Refused when the module is built, before any step."""
    with pytest.raises(tiermem.InvalidArgumentError, match=match):
        TieredEmbeddingBag(ROWS, WIDTH, mode="sum", optimizer=opt)


# --- float16 rows ---------------------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
def test_float16_rows_match_fbgemm_fp16_weights(where: str, tmp_path) -> None:
    """float16 rows (float32 accumulation and update, one round to nearest even on store)
    against FBGEMM's ``FP16`` weights, row-wise Adagrad, 20 steps (its CPU kernel rounds
    the same way; SGD and Adagrad: the next test)."""
    from fbgemm_gpu.split_embedding_configs import SparseType

    steps, w0 = batches(6), start(6)
    w0 = w0.astype(np.float16).astype(np.float32)  # representable start
    want = train_fbgemm("EXACT_ROWWISE_ADAGRAD", "sum", steps, w0, weights_precision=SparseType.FP16, learning_rate=0.1, eps=1e-8)
    ours = train_ours(
        OptimizerConfig("rowwise_adagrad", lr=0.1), "sum", steps, w0, dtype=torch.float16, **placement(where, tmp_path)
    )
    assert ours.table.dtype == "float16" and ours.state_dict()["weight"].dtype == torch.float16
    close(ours, want.float())


@pytest.mark.parametrize(("name", "kind"), [("sgd", "EXACT_SGD"), ("adagrad", "EXACT_ADAGRAD")])
def test_float16_sgd_and_adagrad_round_once_where_fbgemm_cpu_rounds_twice(name: str, kind: str) -> None:
    """FBGEMM's CPU SGD and Adagrad kernels write ``w -= step`` on ``at::Half`` rows, which
    rounds the step to float16 before subtracting (then rounds again); tiermem rounds once,
    as FBGEMM's GPU kernels do without stochastic rounding. One step from the same rows:
    ours equals ``fp16(w - step)`` exactly, FBGEMM's equals ``fp16(w - fp16(step))``, and
    they differ by at most one float16 step of the larger of the row and the update."""
    from fbgemm_gpu.split_embedding_configs import SparseType

    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((ROWS, WIDTH)).astype(np.float16).astype(np.float32)
    idx, off = torch.arange(ROWS), torch.arange(ROWS)  # one row per bag: the gradient is r
    r = torch.from_numpy(rng.standard_normal((ROWS, WIDTH)).astype(np.float32))
    step = 0.1 * r.numpy() if name == "sgd" else 0.1 * r.numpy() / (np.abs(r.numpy()) + 1e-8)
    settings = {"learning_rate": 0.1, **({"eps": 1e-8} if name == "adagrad" else {})}
    fb = train_fbgemm(kind, "sum", [(idx, off, r)], w0, weights_precision=SparseType.FP16, **settings).numpy()
    ours = train_ours(
        OptimizerConfig(name, lr=0.1, eps=1e-8 if name == "adagrad" else None), "sum", [(idx, off, r)], w0, dtype=torch.float16
    )
    once = (w0 - step.astype(np.float32)).astype(np.float16)
    twice = (w0 - step.astype(np.float16).astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(ours.weight.numpy().astype(np.float16), once)
    np.testing.assert_array_equal(fb.astype(np.float16), twice)
    ulp = np.spacing(np.maximum(np.abs(once), np.abs(step).astype(np.float16))).astype(np.float32)
    assert (np.abs(fb - ours.weight.numpy()) <= ulp).all()
    assert 0 < (once != twice).mean() < 0.2  # the double rounding shows, and only sometimes
