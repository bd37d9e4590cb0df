"""Tiered tensors: train unmodified ``torch.nn`` models whose tensors live in tiered memory
(see :mod:`tiermem.torch.tensors.tiering`)."""

from .observer import Moves, Observer, OpEnd
from .tensor import TensorObject, TieredTensor
from .tiering import VARIANTS, EagerFallbackWarning, Tiering, Variant
from .train import TrainStep

__all__ = [
    "Tiering",
    "TieredTensor",
    "Variant",
    "VARIANTS",
    "EagerFallbackWarning",
    "Observer",
    "OpEnd",
    "Moves",
    "TrainStep",
    "TensorObject",
]
