"""Tiered tensors: train unmodified ``torch.nn`` models whose tensors live in tiered memory
(see :mod:`tiermem.torch.tensors.tiering`)."""

from .tensor import TieredTensor
from .tiering import VARIANTS, Tiering, Variant

__all__ = ["Tiering", "TieredTensor", "Variant", "VARIANTS"]
