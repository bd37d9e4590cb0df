"""Run by test_torchrec_dlrm.py in its own process (it starts a one-rank gloo group):
TorchRec's DLRM (``torchrec.models.dlrm.DLRM``) trained twice on the same batches from the
same weights,

* as TorchRec users train it on CPU: ``DistributedModelParallel`` over TorchRec's
  ``EmbeddingBagCollection``, each table in FBGEMM's CPU table-batched embeddings with
  ``EXACT_SGD`` fused into backward;
* with one import changed, ``tiermem.torchrec.EmbeddingBagCollection``, and one placement
  argument putting every table in a table file on the disk (a small cache in DRAM), SGD
  fused;

then tiermem's run again from a checkpoint (``torch.save`` of the model's ``state_dict`` at
the midpoint, loaded into a rebuilt model over fresh table files). Prints one JSON line:
both loss curves and the resumed one.

Usage: python torchrec_dlrm_twins.py DIR STEPS."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist

TABLES = [("t_user", 4000), ("t_item", 2500), ("t_ctx", 600)]
DIM, DENSE_IN, BATCH, LR = 8, 5, 64, 0.05


def configs() -> list[Any]:
    from torchrec import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=DIM, feature_names=[n[2:]]) for n, r in TABLES]


def batch(step: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(0, 5, (len(TABLES) * BATCH,), generator=g)
    values = torch.cat(
        [
            # Skewed rows, as recommendation traffic is: most lookups hit a few hundred.
            (torch.rand(int(lengths[i * BATCH : (i + 1) * BATCH].sum()), generator=g) ** 3 * r).long()
            for i, (_, r) in enumerate(TABLES)
        ]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[n[2:] for n, _ in TABLES], values=values, lengths=lengths)
    dense = torch.randn(BATCH, DENSE_IN, generator=g)
    labels = (torch.rand(BATCH, generator=g) < 0.3).float()
    return dense, kjt, labels


def dlrm(ebc: Any) -> torch.nn.Module:
    from torchrec.models.dlrm import DLRM

    return DLRM(ebc, dense_in_features=DENSE_IN, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[16, 1])


def train(model: torch.nn.Module, steps: range) -> list[float]:
    """BCE on the logits, the dense part by SGD at the tables' rate (the tables update
    themselves in backward)."""
    dense_params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(dense_params, lr=LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    for step in steps:
        dense, kjt, labels = batch(step)
        loss = loss_fn(model(dense, kjt).squeeze(-1), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def torchrec_fbgemm(start: dict[str, torch.Tensor], steps: int) -> list[float]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv

    model = dlrm(EmbeddingBagCollection(tables=configs(), device=torch.device("meta")))
    # Copies: assign=True makes the tensors the model's own, and training moves them.
    dense_state = {k: v.clone() for k, v in start.items() if "embedding_bags" not in k}
    model.load_state_dict(dense_state, strict=False, assign=True)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu"),
        constraints={n: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"]) for n, _ in TABLES},
    )
    plan = planner.collective_plan(model, [sharder], dist.group.WORLD)
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), plan=plan, sharders=[sharder], device=torch.device("cpu")
    )
    for key, value in dmp.state_dict().items():
        if "embedding_bags" in key:
            for shard in value.local_shards():
                r0 = shard.metadata.shard_offsets[0]
                with torch.no_grad():
                    shard.tensor.copy_(start[key.removeprefix("module.")][r0 : r0 + shard.tensor.shape[0]])
    return train(dmp, range(steps))


def tiered(folder: str, start: dict[str, torch.Tensor] | None, steps: range) -> tuple[list[float], torch.nn.Module]:
    from tiermem.embedding import Placement
    from tiermem.torchrec import EmbeddingBagCollection

    os.makedirs(folder, exist_ok=True)
    model = dlrm(EmbeddingBagCollection(tables=configs(), placement=Placement(device=f"table:{folder}", cache=0.3), lr=LR))
    if start is not None:
        model.load_state_dict(start, strict=True)
    return train(model, steps), model


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")  # TorchRec and FBGEMM warn about running on CPU
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        from torchrec import EmbeddingBagCollection

        start = {k: v.detach().clone() for k, v in dlrm(EmbeddingBagCollection(tables=configs())).state_dict().items()}
        theirs = torchrec_fbgemm(start, steps)
        ours, _ = tiered(os.path.join(out, "whole"), start, range(steps))
        half = steps // 2
        first, model = tiered(os.path.join(out, "first"), start, range(half))
        ck = os.path.join(out, "dlrm.pt")
        torch.save(model.state_dict(), ck)
        del model
        state = torch.load(ck, weights_only=True)
        resumed, _ = tiered(os.path.join(out, "resumed"), state, range(half, steps))
        print(json.dumps({"torchrec_fbgemm": theirs, "tiermem": ours, "resumed": first + resumed}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
