"""Training workloads for tiered tensors, in plain ``torch.nn`` (no torchvision): ResNet
(bottleneck blocks), DenseNet (dense blocks and transitions), VGG (3x3 conv stacks) and a
GPT-style stack of pre-norm transformer blocks. Inputs are random.

:data:`WORKLOADS` holds the configurations ``tiermem bench train`` runs: deep, narrow networks
at a batch size whose one-iteration footprint is a few GB on a small machine (the thesis
runs ResNet 200, DenseNet 264 and VGG 416 at footprints of 520 GB, Table 4.6; these keep
the depth-to-footprint shape at a size a 2-core machine trains in seconds). Depth matters: at
8:1 the fast budget is a ninth of the footprint, and it must hold an op's inputs and outputs.
VGG is 44 convolutions at batch 128 (its first-stage activations are 64 MiB against a 202
MiB budget); a 22-layer VGG at batch 256 had 128 MiB activations, so its first-stage ops
could not fit and wrote their outputs straight to the slow device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from ..exceptions import InvalidArgumentError

__all__ = ["ResNet", "DenseNet", "VGG", "GPT", "Workload", "WORKLOADS", "build"]


def _conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            *_conv_bn(cin, mid, 1), *_conv_bn(mid, mid, 3, stride), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        )
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.short(x))


class ResNet(nn.Module):
    """Bottleneck ResNet: ``blocks`` per stage (ResNet-50 is ``(3, 4, 6, 3)``), stage widths
    ``width * 2**i``."""

    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, width, 3)]
        cin = width
        for i, n in enumerate(blocks):
            mid = width * 2**i
            for j in range(n):
                layers.append(_Bottleneck(cin, mid, 2 if (j == 0 and i > 0) else 1))
                cin = mid * 4
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class _DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.Conv2d(cin, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth),
            nn.ReLU(),
            nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


class DenseNet(nn.Module):
    """DenseNet-BC: dense blocks of ``blocks[i]`` layers with growth rate ``growth``,
    transitions halving channels and resolution (DenseNet-121 is ``(6, 12, 24, 16)``, 32)."""

    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 32, classes: int = 1000) -> None:
        super().__init__()
        c = 2 * growth
        layers: list[nn.Module] = [*_conv_bn(3, c, 3)]
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(_DenseLayer(c, growth))
                c += growth
            if i + 1 < len(blocks):
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class VGG(nn.Module):
    """VGG: stages of ``convs[i]`` 3x3 conv + BN + ReLU layers at width ``widths[i]``, a max
    pool after each stage, a linear classifier."""

    def __init__(
        self, convs: tuple[int, ...] = (2, 2, 3, 3, 3), widths: tuple[int, ...] = (64, 128, 256, 512, 512), classes: int = 1000
    ) -> None:
        super().__init__()
        if len(convs) != len(widths):
            raise InvalidArgumentError(f"VGG needs one width per stage: {len(convs)} stages, {len(widths)} widths")
        layers: list[nn.Module] = []
        c = 3
        for n, w in zip(convs, widths):
            for _ in range(n):
                layers += _conv_bn(c, w, 3)
                c = w
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.reshape(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // h) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A GPT-style decoder: token and position embeddings, ``layers`` pre-norm blocks with
    causal attention (written out, so every op is a plain ATen op), a tied output head."""

    def __init__(self, layers: int = 12, d: int = 768, heads: int = 12, vocab: int = 50304, seq: int = 1024) -> None:
        super().__init__()
        if d % heads:
            raise InvalidArgumentError(f"GPT width {d} is not a multiple of {heads} heads")
        self.seq = seq
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*(_Block(d, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq:
            raise InvalidArgumentError(f"sequence of {t} tokens is longer than the model's {self.seq}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.ln(self.blocks(x)))


@dataclass(frozen=True)
class Workload:
    """A model, its random inputs and its loss, at one size."""

    name: str
    make: Callable[[], nn.Module]
    batch: int
    input_shape: tuple[int, ...]  # per sample; a language model: (sequence,)
    classes: int
    #: Inputs are token ids (a language model), not images.
    tokens: bool = False

    def inputs(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random inputs and targets, a pure function of ``seed``."""
        g = torch.Generator().manual_seed(seed)
        if self.tokens:
            idx = torch.randint(0, self.classes, (self.batch, *self.input_shape), generator=g)
            return idx, torch.randint(0, self.classes, (self.batch, *self.input_shape), generator=g)
        x = torch.randn(self.batch, *self.input_shape, generator=g)
        return x, torch.randint(0, self.classes, (self.batch,), generator=g)

    @staticmethod
    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))

    def scaled(self, batch: int) -> Workload:
        return replace(self, batch=batch)


WORKLOADS: dict[str, Workload] = {
    "resnet": Workload("resnet", lambda: ResNet((3, 8, 12, 3), width=16, classes=100), 64, (3, 64, 64), 100),
    "densenet": Workload("densenet", lambda: DenseNet((6, 12, 32, 16), growth=16, classes=100), 24, (3, 64, 64), 100),
    "vgg": Workload("vgg", lambda: VGG((4, 8, 12, 12, 8), (32, 64, 128, 256, 256), classes=100), 128, (3, 64, 64), 100),
    "gpt": Workload("gpt", lambda: GPT(layers=8, d=256, heads=8, vocab=4096, seq=512), 12, (512,), 4096, tokens=True),
    # The libraries' own model classes at the bench's sizes (no weights are downloaded):
    # transformers' GPT-2 shaped as "gpt", torchvision's ResNet-50 at "resnet"'s inputs.
    "hf:gpt2": Workload(
        "hf:gpt2", lambda: _hf_gpt2(layers=8, d=256, heads=8, vocab=4096, seq=512), 12, (512,), 4096, tokens=True
    ),
    "tv:resnet50": Workload("tv:resnet50", lambda: _tv_resnet50(classes=100), 64, (3, 64, 64), 100),
}


class _Logits(nn.Module):
    """A transformers language model whose forward returns its logits (what the bench's
    loss takes)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=idx).logits


def _hf_gpt2(layers: int, d: int, heads: int, vocab: int, seq: int) -> nn.Module:
    try:
        import transformers
    except ImportError as e:
        raise InvalidArgumentError("model 'hf:gpt2' needs transformers (pip install transformers)") from e
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=seq, n_embd=d, n_layer=layers, n_head=heads, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0
    )
    m = transformers.GPT2LMHeadModel(config)
    m.config.use_cache = False
    return _Logits(m)


def _tv_resnet50(classes: int) -> nn.Module:
    try:
        import torchvision
    except ImportError as e:
        raise InvalidArgumentError("model 'tv:resnet50' needs torchvision (pip install torchvision)") from e
    return torchvision.models.resnet50(num_classes=classes)


def build(name: str, batch: int | None = None) -> Workload:
    """A workload by name (``resnet``, ``densenet``, ``vgg``, ``gpt``, and the libraries'
    ``hf:gpt2`` and ``tv:resnet50``), optionally at another batch size."""
    if name not in WORKLOADS:
        raise InvalidArgumentError(f"model {name!r}: known are {', '.join(WORKLOADS)}")
    w = WORKLOADS[name]
    if batch is not None:
        if batch < 1:
            raise InvalidArgumentError(f"batch must be at least 1, got {batch}")
        w = w.scaled(batch)
    return w
