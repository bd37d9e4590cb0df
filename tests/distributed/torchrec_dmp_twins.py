"""Run by test_torchrec_dmp.py in its own process: TorchRec's DLRM sharded over two ranks by
``DistributedModelParallel`` and TorchRec's planner, twice on the same batches from the
same weights (each rank half of every batch):

* TorchRec's way: its ``EmbeddingBagCollection``, FBGEMM's CPU kernels (``fused``),
  ``EXACT_ROWWISE_ADAGRAD``;
* tiermem's: ``tiermem.torchrec.EmbeddingBagCollection`` on the meta device, sharded by
  ``tiermem.torchrec.EmbeddingBagCollectionSharder`` into table files (a 30 % cache),
  planned with tiermem's estimators; the same optimizer.

Each sharding kind the test names is forced by constraints on both. At the end each run
saves a DCP checkpoint (TorchRec's ShardedTensors; tiermem's ``tdcp.state_dict``). Rank 0
writes both loss curves as JSON.

Usage: python torchrec_dmp_twins.py DIR SHARDING STEPS"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "embedding"))
import torchrec_dlrm_twins as tw

WORLD = 2


def fused_params() -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": tw.LR, "eps": 1e-8}


def train(model: torch.nn.Module, steps: int, rank: int) -> list[float]:
    dense_params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(dense_params, lr=tw.LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    lo, hi = rank * tw.BATCH // WORLD, (rank + 1) * tw.BATCH // WORLD
    for step in range(steps):
        dense, kjt, labels = tw.batch(step)
        feats = kjt.to_dict()
        from torchrec import KeyedJaggedTensor

        mine = KeyedJaggedTensor.from_jt_dict(
            {
                k: type(jt)(values=jt.values()[jt.offsets()[lo] : jt.offsets()[hi]], lengths=jt.lengths()[lo:hi])
                for k, jt in feats.items()
            }
        )
        loss = loss_fn(model(dense[lo:hi], mine).squeeze(-1), labels[lo:hi])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / WORLD)
    return losses


def shard(model: torch.nn.Module, sharder: Any, sharding: str, kernel: str, planner: Any) -> Any:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    plan = planner.collective_plan(model, [sharder], dist.group.WORLD)
    return DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), plan=plan, sharders=[sharder], device=torch.device("cpu")
    )


def rank_main(rank: int, port: int, out: str, sharding: str, steps: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torchrec import EmbeddingBagCollection as TorchRecEBC
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    from tiermem.embedding import Placement
    from tiermem.torch import dcp as tdcp
    from tiermem.torchrec import EmbeddingBagCollection
    from tiermem.torchrec import EmbeddingBagCollectionSharder as TieredSharder
    from tiermem.torchrec.planner import planner

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        start = {k: v.detach().clone() for k, v in tw.dlrm(TorchRecEBC(tables=tw.configs())).state_dict().items()}

        def dense() -> dict[str, torch.Tensor]:  # copies: assign=True makes them the model's own
            return {k: v.clone() for k, v in start.items() if "embedding_bags" not in k}

        topo = Topology(world_size=WORLD, compute_device="cpu")

        def constraints(kernel: str) -> dict[str, Any]:
            # Column shards of 4 of the 8 columns: two per table.
            return {
                n: ParameterConstraints(sharding_types=[sharding], compute_kernels=[kernel], min_partition=4)
                for n, _ in tw.TABLES
            }

        # TorchRec's way.
        model = tw.dlrm(TorchRecEBC(tables=tw.configs(), device=torch.device("meta")))
        model.load_state_dict(dense(), strict=False, assign=True)
        sharder = EmbeddingBagCollectionSharder(fused_params=fused_params())
        theirs_dmp = shard(
            model, sharder, sharding, "fused", EmbeddingShardingPlanner(topology=topo, constraints=constraints("fused"))
        )
        for key, value in theirs_dmp.state_dict().items():
            if "embedding_bags" in key:
                for sh in value.local_shards():
                    r0, c0 = sh.metadata.shard_offsets
                    n, w = sh.tensor.shape
                    with torch.no_grad():
                        sh.tensor.copy_(start[key][r0 : r0 + n, c0 : c0 + w])
        theirs = train(theirs_dmp, steps, rank)
        dcp.save(theirs_dmp.state_dict(), checkpoint_id=os.path.join(out, "theirs"))

        # tiermem's: one import, a placement, the sharder and its planner.
        model = tw.dlrm(EmbeddingBagCollection(tables=tw.configs(), device=torch.device("meta")))
        model.load_state_dict(dense(), strict=False, assign=True)
        sharder = TieredSharder(placement=Placement(device=f"table:{out}", cache=0.3), fused_params=fused_params())
        ours_dmp = shard(
            model,
            sharder,
            sharding,
            "customized_kernel",
            planner(topo, sharder, tw.BATCH // WORLD, constraints("customized_kernel")),
        )
        sd = tdcp.state_dict(ours_dmp)
        for key, value in sd.items():  # the start rows, into each rank's shards
            if isinstance(value, tdcp.TableRows) and value.optimizer is None:
                for p in value.parts:
                    p.table.load(start[key][p.row0 : p.row0 + p.rows, p.col0 : p.col0 + p.cols].contiguous().numpy())
        ours = train(ours_dmp, steps, rank)
        dcp.save(tdcp.state_dict(ours_dmp), checkpoint_id=os.path.join(out, "ours"))
        if rank == 0:
            with open(os.path.join(out, "curves.json"), "w") as f:
                json.dump({"theirs": theirs, "ours": ours}, f)
    finally:
        dist.destroy_process_group()


def _logged(rank: int, *args: Any) -> None:
    """``rank_main``, its error printed by the rank that raised it (the first to fail takes
    the others' connections down, and they would report only that)."""
    try:
        rank_main(rank, *args)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        raise


def main() -> None:
    import torch.multiprocessing as mp

    from tiermem.dist.train import _free_port

    out, sharding, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mp.spawn(_logged, args=(_free_port(), out, sharding, steps), nprocs=WORLD)
    print(open(os.path.join(out, "curves.json")).read())


if __name__ == "__main__":
    main()
