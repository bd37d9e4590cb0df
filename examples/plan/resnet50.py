"""A plan script for ``tiermem plan --script examples/plan/resnet50.py``: torchvision's
ResNet-50 (random weights) with AdamW and cross-entropy.

    tiermem plan --script examples/plan/resnet50.py --ratio 8:1 --run
"""

import torch
import torchvision

name = "tv-resnet50"
BATCH, SIZE, CLASSES = 16, 64, 100


def model() -> torch.nn.Module:
    return torchvision.models.resnet50(num_classes=CLASSES)


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def forward(m: torch.nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return m(b[0])


def loss(output: torch.Tensor, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output, b[1])


def optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.AdamW(params, lr=1e-4)
