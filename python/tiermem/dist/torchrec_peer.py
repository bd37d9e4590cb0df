"""TorchRec's ``DistributedModelParallel`` on the same DLRM, batches and arithmetic as a
sharded tiermem run: the peer a TorchRec user would run instead, side by side in
``tiermem bench dist``.

- The tables are a TorchRec ``EmbeddingBagCollection`` (sum pooling), sharded table-wise
  by TorchRec's own planner over the ranks, each shard in fbgemm's CPU table-batched
  embeddings with the SGD fused into backward (``FUSED`` kernel, every row in DRAM).
- The dense part is tiermem's DLRM (same bottom and top MLPs, same interaction, same
  initial weights), which DMP wraps in DDP; the tables start from the same rows.
- Each rank trains its share of the same synthetic global batches, as ``KeyedJaggedTensor``
  inputs.
- Each rank's loss is the mean over its own samples. TorchRec divides the pooled rows'
  gradients by the world size in its backward all-to-all (``comm_ops.GRADIENT_DIVISION``, on
  by default), as tiermem's exchange scales them by ``1 / world``: with the run's learning
  rate fused, both make the single-process model's update, and their loss curves can be
  compared (the test does, at a learning rate large enough to part them otherwise).

Only table-wise sharding runs: TorchRec's row-wise sharding reduces pooled embeddings with
an asynchronous ``reduce_scatter``, which gloo does not provide (TorchRec's own test suite
skips it on gloo). :func:`unavailable` says why the peer cannot run at all (no ``torchrec``).
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

from ..dlrm.data import SyntheticData
from ..dlrm.model import DLRM, DLRMConfig, initial_rows, table_seed
from ..exceptions import InvalidArgumentError
from .train import DistOptions, launch

__all__ = ["SHARDINGS", "run", "unavailable"]

#: The shardings the peer runs on gloo.
SHARDINGS = ("table",)


def unavailable() -> str | None:
    """Why the peer cannot run here (``torchrec`` or fbgemm do not import), or None."""
    try:
        with warnings.catch_warnings():  # fbgemm warns of kernels its CPU build lacks
            warnings.simplefilter("ignore")
            import torchrec  # noqa: F401
            from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: F401
    except Exception as e:  # any import failure means there is no peer to run
        return f"torchrec does not import here ({type(e).__name__}: {e})"
    return None


class _NoRows:
    """An embeddings stand-in that holds no rows: the DLRM built over it initialises its
    dense part only (the rows go into TorchRec's shards after sharding)."""

    def rows_held(self, table: int) -> list[tuple[int, int]]:
        return []


class _PeerDLRM(torch.nn.Module):
    """TorchRec's tables under tiermem's dense DLRM."""

    def __init__(self, c: DLRMConfig, seed: int) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

        self.sparse = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=f"t{t}", embedding_dim=c.dim, num_embeddings=r, feature_names=[f"f{t}"], pooling=PoolingType.SUM
                )
                for t, r in enumerate(c.rows)
            ],
            device=torch.device("meta"),
        )
        self.dense = DLRM(c, _NoRows(), seed=seed)

    def forward(self, dense: torch.Tensor, features: Any) -> torch.Tensor:
        # A sharded collection's output lists the tables by shard, not in feature order
        # (TorchRec's own DLRM takes them by name too).
        pooled = self.sparse(features).to_dict()
        return self.dense.dense_forward(dense, torch.cat([pooled[f"f{t}"] for t in range(len(pooled))], dim=1))


def _features(indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> Any:
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor(
        keys=[f"f{t}" for t in range(len(indices))],
        values=torch.cat(indices),
        lengths=torch.cat([torch.diff(o) for o in offsets]),
    )


def _load_rows(model: torch.nn.Module, c: DLRMConfig, seed: int) -> None:
    """Write tiermem's initial rows into this rank's shards of every table."""
    for key, value in model.state_dict().items():
        if not key.endswith(".weight") or ".embedding_bags." not in key:
            continue
        t = int(key.split(".embedding_bags.")[1].split(".")[0][1:])
        for shard in value.local_shards():
            (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            with torch.no_grad():
                for start, rows in initial_rows(c.rows[t], c.dim, table_seed(seed, t), span=(r0, r0 + nr)):
                    shard.tensor[start - r0 : start - r0 + len(rows)] = torch.from_numpy(rows[:, c0 : c0 + nc])


def _train(o: DistOptions, rank: int, world: int) -> dict[str, Any]:
    # TorchRec's planner and DMP warn about running on CPU (storage reservation, DDP, fx
    # tracing), every rank every run: a bench's output would drown in them.
    for name in ("torch.fx._symbolic_trace", "torchrec"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _train_quietly(o, rank, world)


def _train_quietly(o: DistOptions, rank: int, world: int) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    c = o.config
    if c.batch_size % world:
        raise InvalidArgumentError(f"the global batch of {c.batch_size} does not split evenly over {world} ranks")
    model = _PeerDLRM(c, o.seed)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": o.lr})
    planner = EmbeddingShardingPlanner(
        topology=TopologyFactory.create_topology(
            trainer_config=TrainerConfig(world_size=world, local_world_size=world),
            kernel_config=KernelConfig(compute_device="cpu"),
        ),
        constraints={
            f"t{t}": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"]) for t in range(c.num_tables)
        },
    )
    pg = dist.group.WORLD
    plan = planner.collective_plan(model, [sharder], pg)
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=[sharder], device=torch.device("cpu")
    )
    _load_rows(dmp, c, o.seed)
    opt = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda ps: torch.optim.SGD(ps, lr=o.lr)
    )
    loss_fn = torch.nn.BCELoss()
    data = SyntheticData(c.rows, c.dense_features, c.batch_size, c.bag, dist=o.dist, seed=o.data_seed)
    losses, seconds = [], 0.0
    for step in range(o.steps):
        b = data.batch(step).shard(rank, world)
        features = _features(list(b.indices), list(b.offsets))
        t0 = time.perf_counter()
        loss = loss_fn(dmp(b.dense, features), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if step >= o.warmup:
            seconds += time.perf_counter() - t0
        losses.append(float(total) / world)
    dist.barrier()
    timed = o.steps - o.warmup
    return {"rank": rank, "world": world, "losses": losses, "seconds_per_iter": seconds / timed, "timed_steps": timed}


def run(o: DistOptions, nproc: int) -> dict[str, Any]:
    """Train ``o`` with TorchRec's ``DistributedModelParallel`` on ``nproc`` local
    processes; returns rank 0's result (global losses, seconds per step)."""
    why = unavailable()
    if why is not None:
        raise InvalidArgumentError(why)
    if o.sharding not in SHARDINGS:
        raise InvalidArgumentError(
            f"TorchRec's {o.sharding}-wise sharding does not run on gloo (an asynchronous reduce_scatter); "
            f"the peer runs {', '.join(SHARDINGS)}-wise"
        )
    if o.placement != "dram":
        raise InvalidArgumentError(
            f"the peer keeps every row in DRAM (fbgemm's CPU tables); placement {o.placement!r} is tiermem's"
        )
    return launch(o, nproc, body=_train)
