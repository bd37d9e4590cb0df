"""PyTorch integration. Importing this package imports torch; ``import tiermem`` alone never
does.

* Embedding modules over tiered tables (:mod:`.embedding`): :class:`TieredEmbeddingBag`,
  :class:`TieredEmbeddingBagCollection`, drop-in for ``torch.nn.EmbeddingBag``.
* Tiered tensors (:mod:`.tensors`): :class:`Tiering` makes a model's parameters, activations,
  gradients and optimizer state :class:`TieredTensor` objects placed by a policy.

The DLRM application built on both lives in :mod:`tiermem.dlrm`.
"""

from .embedding import TieredEmbeddingBag, TieredEmbeddingBagCollection, tables_aside, tiered_tables
from .tensors import VARIANTS, TieredTensor, Tiering, Variant

__all__ = [
    "TieredEmbeddingBag",
    "TieredEmbeddingBagCollection",
    "tables_aside",
    "tiered_tables",
    "Tiering",
    "TieredTensor",
    "Variant",
    "VARIANTS",
]
