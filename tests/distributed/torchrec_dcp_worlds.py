"""Run by test_torchrec_dcp.py in its own process: TorchRec's DLRM
(``torchrec.models.dlrm.DLRM``) with tiermem's tables on the disk, checkpointed with
``torch.distributed.checkpoint`` and resumed on another world size:

1. one process, ``tiermem.torchrec.EmbeddingBagCollection`` (every table a table file with a
   30 % cache, FBGEMM's row-wise Adagrad fused), trains ``STEPS`` steps and saves a DCP
   checkpoint after ``A``: the reference curve;
2. two ranks, ``tiermem.dist.EmbeddingBagCollection`` (the same configs, row-wise shards in
   table files), load that checkpoint, train steps ``A..B`` (each rank half of every batch,
   the dense gradients averaged), and save after ``B``;
3. one process again loads the two ranks' checkpoint and trains ``B..STEPS``.

Prints one JSON line: the reference curve and the resumed ones (the global batch's loss).

Usage: python torchrec_dcp_worlds.py DIR"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist

# Two features read t_user; the other tables one each.
TABLES = [("t_user", 3000, ["user", "friend"]), ("t_item", 2000, ["item"]), ("t_ctx", 500, ["ctx"])]
FEATURES = [(f, r) for _, r, fs in TABLES for f in fs]
DIM, DENSE_IN, BATCH, LR = 8, 5, 64, 0.05
STEPS, A, B = 12, 4, 8


def configs() -> list[Any]:
    from torchrec import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=DIM, feature_names=fs) for n, r, fs in TABLES]


def fused_params() -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR, "eps": 1e-8}


def batch(step: int, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """The global batch of ``step``, or rank ``rank``'s share of it (samples in rank order)."""
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(0, 5, (len(FEATURES), BATCH), generator=g)
    values = [(torch.rand(int(lengths[i].sum()), generator=g) ** 3 * r).long() for i, (_, r) in enumerate(FEATURES)]
    dense = torch.randn(BATCH, DENSE_IN, generator=g)
    labels = (torch.rand(BATCH, generator=g) < 0.3).float()
    lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
    mine_v = []
    for i in range(len(FEATURES)):
        start = int(lengths[i, :lo].sum())
        mine_v.append(values[i][start : start + int(lengths[i, lo:hi].sum())])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f for f, _ in FEATURES], values=torch.cat(mine_v), lengths=lengths[:, lo:hi].reshape(-1)
    )
    return dense[lo:hi], kjt, labels[lo:hi]


def dlrm(ebc: Any) -> torch.nn.Module:
    from torchrec.models.dlrm import DLRM

    return DLRM(ebc, dense_in_features=DENSE_IN, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[16, 1])


def train(model: torch.nn.Module, steps: range, rank: int = 0, world: int = 1) -> list[float]:
    """BCE on the logits (each rank's mean over its samples), the dense gradients averaged
    over the ranks, the dense part by SGD; returns the global batch's losses."""
    dense_params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(dense_params, lr=LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    for step in steps:
        dense, kjt, labels = batch(step, rank, world)
        loss = loss_fn(model(dense, kjt).squeeze(-1), labels)
        opt.zero_grad()
        loss.backward()
        if world > 1:
            for p in dense_params:
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total) / world)
        else:
            losses.append(float(loss.detach()))
        opt.step()
    return losses


def save(model: torch.nn.Module, path: str) -> None:
    import torch.distributed.checkpoint as dcp

    from tiermem.torch import dcp as tdcp

    dcp.save({"model": tdcp.state_dict(model)}, checkpoint_id=path)


def load(model: torch.nn.Module, path: str) -> None:
    import torch.distributed.checkpoint as dcp

    from tiermem.torch import dcp as tdcp

    dcp.load({"model": tdcp.state_dict(model)}, checkpoint_id=path, planner=tdcp.LoadPlanner())


def one_process(folder: str, steps: range, resume: str | None, save_after: tuple[int, str] | None) -> list[float]:
    from tiermem.embedding import Placement
    from tiermem.torchrec import EmbeddingBagCollection

    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    place = Placement(device=f"table:{folder}", cache=0.3)
    model = dlrm(EmbeddingBagCollection(tables=configs(), placement=place, fused_params=fused_params()))
    if resume:
        load(model, resume)
    if save_after is None:
        return train(model, steps)
    cut, path = save_after
    first = train(model, range(steps.start, cut))
    save(model, path)
    return first + train(model, range(cut, steps.stop))


def two_ranks(rank: int, world: int, port: int, folder: str, resume: str, save_to: str, out: str) -> None:
    from tiermem.dist import EmbeddingBagCollection
    from tiermem.embedding import Placement

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(1 + rank)  # other initial rows everywhere: the checkpoint must fill them
        place = Placement(device=f"table:{folder}", cache=0.3)
        ebc = EmbeddingBagCollection(tables=configs(), sharding="row", placement=place, fused_params=fused_params())
        model = dlrm(ebc)
        load(model, resume)
        losses = train(model, range(A, B), rank, world)
        save(model, save_to)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(losses, f)
    finally:
        dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from tiermem.dist.train import _free_port

    out = sys.argv[1]
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")  # TorchRec and FBGEMM warn about running on CPU; DCP about one process
    reference = one_process(os.path.join(out, "w1"), range(STEPS), None, (A, os.path.join(out, "ckpt_w1")))
    os.makedirs(os.path.join(out, "w2"), exist_ok=True)
    args = (2, _free_port(), os.path.join(out, "w2"), os.path.join(out, "ckpt_w1"), os.path.join(out, "ckpt_w2"))
    mp.spawn(two_ranks, args=(*args, os.path.join(out, "w2.json")), nprocs=2)
    with open(os.path.join(out, "w2.json")) as f:
        on_two = json.load(f)
    back = one_process(os.path.join(out, "back"), range(B, STEPS), os.path.join(out, "ckpt_w2"), None)
    print(json.dumps({"reference": reference, "two_ranks": on_two, "back_on_one": back}))


if __name__ == "__main__":
    main()
