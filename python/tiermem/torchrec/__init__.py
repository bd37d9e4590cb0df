"""TorchRec's shape over tiermem's tables: a TorchRec model changes one import.

:class:`EmbeddingBagCollection` takes TorchRec's ``EmbeddingBagConfig`` list, a
``KeyedJaggedTensor`` in and gives a ``KeyedTensor`` out, with TorchRec's table and feature
names, several features per table, per-table widths and pooling, weighted features, and
TorchRec's ``state_dict`` keys (``embedding_bags.<table>.weight``), so checkpoints load
either way. Each table is a :class:`~tiermem.torch.TieredEmbeddingBag` placed as asked (one
placement for all, or one per table name), its optimizer fused into backward; the
module's ``state_dict`` holds the weights alone and ``fused_optimizer`` (a
:class:`FusedOptimizer`, as a sharded TorchRec model's) their optimizer state.

:class:`EmbeddingBagCollectionSharder` lets TorchRec's ``DistributedModelParallel`` shard a
model holding the collection (built on the meta device) table-, row- or column-wise, each
shard a tiered table; :func:`~tiermem.torchrec.planner.planner` is TorchRec's planner told
what those shards cost. Checkpoints of either go through :mod:`tiermem.torch.dcp`.

Importing this package imports torchrec (the ``torchrec`` extra).
"""

from .collection import EmbeddingBagCollection, EmbeddingCollection, TableOptions, embedding_names
from .fused import FusedOptimizer, optimizer_config
from .sharding import EmbeddingBagCollectionSharder

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollection",
    "FusedOptimizer",
    "TableOptions",
    "embedding_names",
    "optimizer_config",
]
