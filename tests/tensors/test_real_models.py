"""Real model definitions, not ours: Hugging Face `transformers` models built from small
configs (no weights are downloaded) and torchvision's ResNet-50 and ViT, each tiered beside
a plain copy from the same weights: a few AdamW steps with equal losses, eval under no_grad
with equal outputs, generate() with equal tokens for the causal LMs, bfloat16, autocast,
checkpointing, accumulation and clipping, torch.compile, and DDP on gloo with two processes.

The model classes are the libraries' own (transformers, Apache-2.0; torchvision, BSD-3);
only their sizes are ours."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

from tiermem.torch.tensors import EagerFallbackWarning, TieredTensor, Tiering  # noqa: E402

SLOW = "emulated:optane-pmem"
STEPS = 3
VOCAB, SEQ, BATCH = 128, 16, 2


def _lm_batch(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(10 + i)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


def _seq2seq_batch(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(10 + i)
    return {
        "input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
        "labels": torch.randint(0, VOCAB, (BATCH, SEQ // 2), generator=g),
    }


def _cls_batch(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(10 + i)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), "labels": torch.randint(0, 3, (BATCH,), generator=g)}


def _image_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + i)
    return torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def _hf(cls: str, config: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        m = getattr(transformers, cls)(config)
        m.config.use_cache = False
        return m

    return make


def _cfg(name: str, **kw: Any) -> Any:
    return getattr(transformers, name)(**kw)


SMALL = {"vocab_size": VOCAB}
HF = {
    "gpt2": (
        _hf(
            "GPT2LMHeadModel",
            _cfg(
                "GPT2Config",
                n_embd=32,
                n_layer=2,
                n_head=2,
                n_positions=64,
                **SMALL,
                attn_pdrop=0.0,
                embd_pdrop=0.0,
                resid_pdrop=0.0,
            ),
        ),
        _lm_batch,
    ),
    "llama": (
        _hf(
            "LlamaForCausalLM",
            _cfg(
                "LlamaConfig",
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                **SMALL,
            ),
        ),
        _lm_batch,
    ),
    "bert": (
        _hf(
            "BertForSequenceClassification",
            _cfg(
                "BertConfig",
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=64,
                num_labels=3,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                **SMALL,
            ),
        ),
        _cls_batch,
    ),
    "t5": (
        _hf(
            "T5ForConditionalGeneration",
            _cfg(
                "T5Config",
                d_model=32,
                d_ff=64,
                d_kv=8,
                num_layers=2,
                num_heads=4,
                dropout_rate=0.0,
                decoder_start_token_id=0,
                **SMALL,
            ),
        ),
        _seq2seq_batch,
    ),
}
VISION = {
    "resnet50": lambda: torchvision.models.resnet50(num_classes=10),
    "vit": lambda: torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    ),
}


def _twins(make: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, torch.nn.Module, Tiering]:
    torch.manual_seed(0)
    plain = make()
    t = Tiering({"dram": "512 MiB", SLOW: "2 GiB"}, "LM")
    return plain, t.module(copy.deepcopy(plain)), t


def _plain(x: Any) -> Any:
    return x.to_plain() if isinstance(x, TieredTensor) else x


def _train(model: torch.nn.Module, loss_of: Callable[[torch.nn.Module, int], torch.Tensor], t: Tiering | None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if t is not None:
        opt = t.optimizer(opt)
    losses = []
    for i in range(STEPS):
        loss = loss_of(model, i)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
    return losses


def _trains_and_evaluates_alike(
    plain: torch.nn.Module,
    tiered: torch.nn.Module,
    t: Tiering,
    loss_of: Callable[[torch.nn.Module, int], torch.Tensor],
    evaluate: Callable[[torch.nn.Module], torch.Tensor],
) -> None:
    """AdamW steps with equal losses, then eval under no_grad with equal outputs."""
    want = _train(plain, loss_of, None)
    got = _train(tiered, loss_of, t)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6), (got, want)
    plain.eval()
    tiered.eval()
    with torch.no_grad():
        torch.testing.assert_close(_plain(evaluate(tiered)), evaluate(plain), rtol=1e-5, atol=1e-5)
    t.manager.check()
    t.close()


@pytest.mark.parametrize("name", sorted(HF))
def test_a_transformers_model_trains_and_evaluates_as_plain_pytorch(name: str) -> None:
    make, batch = HF[name]
    plain, tiered, t = _twins(make)

    def loss_of(m: torch.nn.Module, i: int) -> torch.Tensor:
        return m(**batch(i)).loss

    _trains_and_evaluates_alike(plain, tiered, t, loss_of, lambda m: m(**batch(99)).logits)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_causal_lm_generates_the_same_tokens(name: str) -> None:
    make, _ = HF[name]
    plain, tiered, t = _twins(make)
    plain.eval()
    tiered.eval()
    prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = plain.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
        got = tiered.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(_plain(got), want)
    t.close()


@pytest.mark.parametrize("name", sorted(VISION))
def test_a_torchvision_model_trains_and_evaluates_as_plain_pytorch(name: str) -> None:
    plain, tiered, t = _twins(VISION[name])

    def loss_of(m: torch.nn.Module, i: int) -> torch.Tensor:
        x, y = _image_batch(i)
        return torch.nn.functional.cross_entropy(m(x), y)

    _trains_and_evaluates_alike(plain, tiered, t, loss_of, lambda m: m(_image_batch(99)[0]))


def _lm_loss(m: torch.nn.Module, i: int) -> torch.Tensor:
    return m(**_lm_batch(i)).loss


def _image_loss(m: torch.nn.Module, i: int) -> torch.Tensor:
    x, y = _image_batch(i)
    return torch.nn.functional.cross_entropy(m(x.to(next(m.parameters()).dtype)), y)


class _Checkpointed(torch.nn.Module):
    """A block run under torch.utils.checkpoint (its activations recomputed in backward)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


def _checkpointed(m: torch.nn.Module) -> None:
    """Activation checkpointing the library's way (transformers) or by wrapping a stage."""
    if hasattr(m, "activation_checkpointing_enable"):
        m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        m.layer2 = _Checkpointed(m.layer2)


CASES = {"gpt2": (HF["gpt2"][0], _lm_loss), "resnet50": (VISION["resnet50"], _image_loss)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bfloat16_autocast_checkpointing_accumulation_and_clipping(name: str) -> None:
    make, loss_of = CASES[name]
    # Cast to bfloat16 (the tiered model after tiering, the plain one before): equal
    # within bfloat16's tolerance.
    plain, tiered, t = _twins(make)
    plain.to(torch.bfloat16)
    tiered.to(torch.bfloat16)
    torch.testing.assert_close(_plain(loss_of(tiered, 0)), loss_of(plain, 0), rtol=1.6e-2, atol=1e-2)
    t.close()
    # Autocast to bfloat16 on the CPU.
    plain, tiered, t = _twins(make)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = loss_of(plain, 0), loss_of(tiered, 0)
    torch.testing.assert_close(_plain(b), a, rtol=1.6e-2, atol=1e-2)
    b.backward()
    t.close()
    # Activation checkpointing, two micro-batches accumulated, gradients clipped.
    plain, tiered, t = _twins(make)
    for m in (plain, tiered):
        _checkpointed(m)
    norms, params = [], []
    for m in (plain, tiered):
        for i in range(2):
            (loss_of(m, i) / 2).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)))
        params.append([_plain(p.grad) for p in m.parameters() if p.grad is not None])
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)
    for g_plain, g_tiered in zip(*params, strict=True):
        torch.testing.assert_close(g_tiered, g_plain, rtol=1e-4, atol=1e-6)
    t.manager.check()
    t.close()


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_compiled_model_trains_as_plain_pytorch(name: str) -> None:
    """torch.compile of a tiered model: the ops on tiered tensors run eagerly through
    tiermem with one EagerFallbackWarning (PyTorch's own notes on the graph breaks, which
    name no tiermem code, are filtered here), and losses equal the plain model's."""
    make, loss_of = CASES[name]
    torch._dynamo.reset()
    plain, tiered, t = _twins(make)
    want = _train(plain, loss_of, None)
    with pytest.warns(EagerFallbackWarning) as seen:
        got = _train(torch.compile(tiered), loss_of, t)
    assert sum(w.category is EagerFallbackWarning for w in seen) == 1
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6), (got, want)
    t.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_ddp_on_gloo_with_two_processes_trains_as_plain_ddp(name: str) -> None:
    """Two processes (ddp_twins.py), each with its own Tiering: DistributedDataParallel's
    broadcast of rank 0's weights, its gradient buckets' all-reduce and AdamW give each rank
    the plain DDP run's losses and parameters."""
    script = Path(__file__).with_name("ddp_twins.py")
    r = subprocess.run([sys.executable, str(script), name, "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["exitcodes"] == [0, 0] and len(res["ranks"]) == 2, r.stderr[-3000:]
    for rank in res["ranks"]:
        assert rank["tiered"] == pytest.approx(rank["plain"], rel=1e-5, abs=1e-6), rank
        assert rank["parameters_equal"], rank
    assert res["ranks"][0]["plain"] != res["ranks"][1]["plain"]  # each rank saw its own batches
