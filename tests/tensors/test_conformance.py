"""PyTorch's operator database (op_db, BSD-3, the samples its own test_ops.py runs) through
tiered tensors, for the ops whose tiered results were wrong or whose errors came from inside
ATen before this suite: every sample passes or is refused by name, none fails. The whole
database runs in `tiermem bench conformance` (a command test below runs it on a slice)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_modules import module_db  # noqa: E402

from tiermem.bench.conformance import DEVICES, run_op  # noqa: E402
from tiermem.bench.module_conformance import MODES, run_module  # noqa: E402
from tiermem.torch.tensors import Observer, TieredTensor, Tiering  # noqa: E402

#: Ops once wrong (as_strided over a view's storage, a conjugate view, batch norm's empty
#: statistics in eval, layer norm's bfloat16 statistics) or failing inside ATen (sparse
#: operands and results), and a few every model uses.
WATCHED = {
    "as_strided": ("passed",),
    "fft.ifft": ("passed",),
    "fft.hfft2": ("passed",),
    "native_batch_norm": ("passed",),
    "native_layer_norm": ("passed",),
    "nn.functional.layer_norm": ("passed",),
    "to_sparse": ("refused",),
    "resize_": ("refused",),
    "quantile": ("passed",),
    "stft": ("passed",),
    "nn.functional.binary_cross_entropy": ("passed",),
    "any": ("passed",),
    "amax": ("passed",),
    "nn.functional.conv2d": ("passed",),
    "matmul": ("passed",),
    "nn.functional.scaled_dot_product_attention": ("passed",),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_watched_ops_pass_or_are_refused_by_name(dtype: torch.dtype) -> None:
    t = Tiering(DEVICES, "LM")
    try:
        ran = 0
        for op in op_db:
            if op.name not in WATCHED or dtype not in op.supported_dtypes("cpu"):
                continue
            r = run_op(op, dtype, 4, t)
            ran += 1
            assert r["failed"] == 0, (op.name, op.variant_test_name, r)
            assert r["samples"] == sum(r[k] for k in ("passed", "refused")), r
            assert any(r[k] for k in WATCHED[op.name]), (op.name, r)
            if r["refused"]:
                assert r["why"]["refused"].startswith("InvalidArgumentError: "), r
        assert ran >= 8
        t.manager.check()
    finally:
        t.close()


#: Modules of module_db every model is made of, and the transformer whose eval under no_grad
#: with a padding mask takes PyTorch's nested-tensor fast path.
WATCHED_MODULES = (
    "nn.Transformer",
    "nn.TransformerEncoder",
    "nn.MultiheadAttention",
    "nn.LSTM",
    "nn.BatchNorm2d",
    "nn.Conv2d",
    "nn.Embedding",
    "nn.LayerNorm",
    "nn.Linear",
    "nn.Dropout",
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_watched_modules_pass_in_train_and_eval(dtype: torch.dtype) -> None:
    t = Tiering(DEVICES, "LM")
    try:
        ran = 0
        for info in module_db:
            if info.name not in WATCHED_MODULES or dtype not in info.supported_dtypes("cpu"):
                continue
            rows = run_module(info, dtype, None, t)
            assert [r["mode"] for r in rows] == [m for m, _, _ in MODES]
            for r in rows:
                assert r["samples"] > 0 and r["passed"] == r["samples"], (info.name, r["mode"], r["why"])
            ran += 1
        assert ran >= 6
        t.manager.check()
    finally:
        t.close()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_padded_transformer_in_eval_takes_the_nested_fast_path_with_tiered_weights() -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    plain = __import__("copy").deepcopy(enc)
    x = torch.randn(3, 5, 16)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    names: list[str] = []

    class Ops(Observer):
        def op_start(self, pos: int, name: str, objs: list) -> None:
            names.append(name)

    t = Tiering(DEVICES, "LM", observers=[Ops()])
    try:
        t.module(enc)
        with torch.no_grad():
            want = plain(x, src_key_padding_mask=mask)
            got = enc(x, src_key_padding_mask=mask)
        torch.testing.assert_close(got.to_plain() if isinstance(got, TieredTensor) else got, want)
        # The nested tensor is made from the tiered input, and each layer's fused kernel
        # runs on it with tiered weights.
        assert "_nested_tensor_from_mask.default" in names, names
        assert names.count("_transformer_encoder_layer_fwd.default") == 2, names
    finally:
        t.close()


@pytest.mark.slow
def test_bench_conformance_quick_json(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiermem.cli.main",
            "bench",
            "conformance",
            "--quick",
            "--dtypes",
            "float32",
            "--samples",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["dtypes"] == ["float32"] and len(res["ops"]) > 500
    for row in res["ops"]:
        assert set(row) >= {"op", "dtype", "samples", "passed", "refused", "failed"}
    assert res["pass_rate"] >= 0.98, res["totals"]
    assert {r["mode"] for r in res["modules"]} == {"train", "eval", "eval+no_grad"}
    e = res["module_entries"]["float32"]
    assert e["entries"] > 100 and e["all_passed"] >= 0.95 * e["entries"], e
    assert "pass rate" in r.stdout and "refused" in r.stdout
