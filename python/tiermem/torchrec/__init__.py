"""TorchRec's shape over tiermem's tables: a TorchRec model changes one import.

:class:`EmbeddingBagCollection` takes TorchRec's ``EmbeddingBagConfig`` list, a
``KeyedJaggedTensor`` in and gives a ``KeyedTensor`` out, with TorchRec's table and feature
names, several features per table, per-table widths and pooling, weighted features, and
TorchRec's ``state_dict`` keys (``embedding_bags.<table>.weight``), so checkpoints load
either way. Each table is a :class:`~tiermem.torch.TieredEmbeddingBag` placed as asked (one
placement for all, or one per table name), its optimizer fused into backward; the
module's ``state_dict`` holds the weights alone and ``fused_optimizer`` (a
:class:`FusedOptimizer`, as a sharded TorchRec model's) their optimizer state.

Importing this package imports torchrec (the ``torchrec`` extra).
"""

from .collection import EmbeddingBagCollection, EmbeddingCollection, TableOptions, embedding_names
from .fused import FusedOptimizer, optimizer_config

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingCollection",
    "FusedOptimizer",
    "TableOptions",
    "embedding_names",
    "optimizer_config",
]
