"""TorchRec-shaped tables sharded over ranks (``tiermem.dist.EmbeddingBagCollection``) and
checkpoints that move between world sizes through torch.distributed.checkpoint: TorchRec's
DLRM on table files resumes on two ranks from one's checkpoint, and on one from two's, on
the same loss curve; a sharded collection of mixed widths, shared tables and mean pooling
gives the single-process collection's outputs and rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")
import torch.distributed as dist
import torch.multiprocessing as mp
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tiermem import InvalidArgumentError
from tiermem.dist.train import _free_port


def test_torchrecs_dlrm_resumes_a_dcp_checkpoint_on_another_world_size_on_the_same_curve(tmp_path) -> None:
    script = Path(__file__).with_name("torchrec_dcp_worlds.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    ref, two, back = res["reference"], res["two_ranks"], res["back_on_one"]
    assert len(ref) == 12 and len(two) == 4 and len(back) == 4
    assert two == pytest.approx(ref[4:8], rel=1e-5)
    assert back == pytest.approx(ref[8:12], rel=1e-5)
    # Two ranks kept their row-wise shards in table files of their own.
    names = sorted(p.name for p in (tmp_path / "w2").glob("*.tbl"))
    assert names == sorted(
        f"{t}.rows{lo}-{hi}.cols0-8.tbl"
        for t, n in [("t_user", 3000), ("t_item", 2000), ("t_ctx", 500)]
        for lo, hi in [(0, n // 2), (n // 2, n)]
    )


CONFIGS = [
    EmbeddingBagConfig(name="wide", num_embeddings=40, embedding_dim=8, feature_names=["a", "b"]),
    EmbeddingBagConfig(name="narrow", num_embeddings=30, embedding_dim=4, feature_names=["c"], pooling=PoolingType.MEAN),
    EmbeddingBagConfig(name="odd", num_embeddings=25, embedding_dim=6, feature_names=["d"]),
]
ROWS = {"a": 40, "b": 40, "c": 30, "d": 25}
BATCH, STEPS = 8, 3


def batch(step: int, lo: int = 0, hi: int = BATCH) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(50 + step)
    lengths = torch.randint(0, 4, (len(ROWS), BATCH), generator=g)
    values = [torch.randint(0, r, (int(lengths[i].sum()),), generator=g) for i, r in enumerate(ROWS.values())]
    mine = [v[int(n[:lo].sum()) : int(n[:hi].sum())] for v, n in zip(values, lengths, strict=True)]
    return KeyedJaggedTensor.from_lengths_sync(keys=list(ROWS), values=torch.cat(mine), lengths=lengths[:, lo:hi].reshape(-1))


SCALE = torch.randn(BATCH, 8 + 8 + 4 + 6, generator=torch.Generator().manual_seed(3))


def _rank(rank: int, world: int, port: int, sharding: str, start: dict[str, torch.Tensor], out: str) -> None:
    from tiermem.dist import EmbeddingBagCollection
    from tiermem.torch import dcp as tdcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # The loss is a sum over samples: the ranks' gradients add up to the global one.
        m = EmbeddingBagCollection(CONFIGS, sharding=sharding, optimizer="adagrad", lr=0.1, grad_scale=1.0)
        m.load_state_dict(start, strict=True)
        lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
        outs = []
        for step in range(STEPS):
            y = m(batch(step, lo, hi)).values()
            (y * SCALE[lo:hi]).sum().backward()
            outs.append(y.detach().numpy())
        pieces = {}
        for p in tdcp._pieces(m):
            key = f"{p.prefix}{p.row0}_{p.col0}"
            pieces[key] = p.table.to_numpy()
            st = p.table.optimizer_state()
            assert st is not None
            pieces[key + "_state"] = st[1].reshape(p.table.num_embeddings, -1)
        np.savez(f"{out}.rank{rank}.npz", outs=np.stack(outs), **pieces)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sharding", ["table", "row", "column"])
def test_two_ranks_of_mixed_widths_shared_tables_and_mean_pooling_equal_one_process(tmp_path, sharding: str) -> None:
    from tiermem.torchrec import EmbeddingBagCollection

    torch.manual_seed(0)
    whole = EmbeddingBagCollection(CONFIGS, optimizer="adagrad", lr=0.1)
    start = {k: v.clone() for k, v in whole.state_dict().items()}
    want = []
    for step in range(STEPS):
        y = whole(batch(step)).values()
        (y * SCALE).sum().backward()
        want.append(y.detach().numpy())
    out = str(tmp_path / "res")
    mp.spawn(_rank, args=(2, _free_port(), sharding, start, out), nprocs=2)
    got = [np.load(f"{out}.rank{r}.npz") for r in range(2)]
    np.testing.assert_allclose(np.concatenate([g["outs"] for g in got], axis=1), np.stack(want), rtol=1e-5, atol=1e-6)
    rows = {k: v.numpy() for k, v in whole.state_dict().items()}
    state = {k: v["state"].numpy() for k, v in whole.fused_optimizer.state_dict()["state"].items()}
    seen = 0
    for g in got:
        for key in [k for k in g.files if k != "outs" and not k.endswith("_state")]:
            prefix, at = key.rsplit(".", 1)
            r0, c0 = (int(x) for x in at.split("_"))
            piece = g[key]
            n, w = piece.shape
            full = rows[prefix + ".weight"]
            np.testing.assert_allclose(piece, full[r0 : r0 + n, c0 : c0 + w], rtol=1e-5, atol=1e-6)
            st = state[prefix + ".weight"].reshape(full.shape)
            np.testing.assert_allclose(g[key + "_state"], st[r0 : r0 + n, c0 : c0 + w], rtol=1e-5, atol=1e-6)
            seen += n * w
    assert seen == sum(c.num_embeddings * c.embedding_dim for c in CONFIGS)


def test_a_sharded_collection_refuses_what_it_cannot_take_by_name(one_rank: Any) -> None:
    from tiermem.dist import EmbeddingBagCollection

    with pytest.raises(InvalidArgumentError, match="weighted features are not sharded"):
        EmbeddingBagCollection(CONFIGS, is_weighted=True)
    with pytest.raises(InvalidArgumentError, match="sharding 'diagonal'"):
        EmbeddingBagCollection(CONFIGS, sharding="diagonal")
    with pytest.raises(InvalidArgumentError, match="unknown arguments"):
        EmbeddingBagCollection(CONFIGS, cache_size=3)  # type: ignore[call-arg]
    m = EmbeddingBagCollection(CONFIGS)
    with pytest.raises(InvalidArgumentError, match=r"missing: \['d'\]"):
        m(KeyedJaggedTensor.from_lengths_sync(keys=["a", "b", "c"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 0, 1])))
