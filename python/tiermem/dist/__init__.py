"""Past one machine: embedding tables sharded over the ranks of ``torch.distributed``
(:class:`ShardedEmbeddings`, planned by :func:`plan_shards`), DLRM trained with them
(:func:`launch`, :func:`train_rank`)."""

from .embeddings import ShardedEmbeddings
from .plan import SHARDINGS, Shard, ShardPlan, plan_shards
from .train import PLACEMENTS, DistOptions, launch, train_rank

__all__ = ["PLACEMENTS", "SHARDINGS", "DistOptions", "Shard", "ShardPlan", "ShardedEmbeddings", "launch", "plan_shards", "train_rank"]
