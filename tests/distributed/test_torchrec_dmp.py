"""TorchRec's DistributedModelParallel over tiermem's tables (torchrec_dmp_twins.py, in its
own process): TorchRec's DLRM sharded over two ranks by its planner and DMP trains the loss
curve of TorchRec's own collection over FBGEMM's CPU kernels, table- and column-wise, each
shard a table file; the two runs' DCP checkpoints hold the same tables."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec")
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).parents[1] / "embedding"))
import torchrec_dlrm_twins as tw


@pytest.mark.parametrize("sharding", ["table_wise", "column_wise"])
def test_dmp_shards_tiermems_collection_on_fbgemms_curve(tmp_path, sharding: str) -> None:
    script = Path(__file__).with_name("torchrec_dmp_twins.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path), sharding, "8"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res["ours"]) == len(res["theirs"]) == 8
    assert res["ours"] == pytest.approx(res["theirs"], rel=1e-5)
    files = sorted(p.name for p in tmp_path.glob("*.tbl"))
    if sharding == "table_wise":
        assert files == ["t_ctx.rows0-600.cols0-8.tbl", "t_item.rows0-2500.cols0-8.tbl", "t_user.rows0-4000.cols0-8.tbl"]
    else:  # two column shards of every table
        assert len(files) == 6 and all(".cols0-4." in f or ".cols4-8." in f for f in files)

    # Both checkpoints, loaded on one process, hold the same tables.
    from torchrec import EmbeddingBagCollection as TorchRecEBC

    from tiermem.torch import dcp as tdcp
    from tiermem.torchrec import EmbeddingBagCollection

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        theirs = tw.dlrm(TorchRecEBC(tables=tw.configs()))
        sd = theirs.state_dict()
        dcp.load(sd, checkpoint_id=str(tmp_path / "theirs"))
        ours = tw.dlrm(EmbeddingBagCollection(tables=tw.configs()))
        mine = {k: v for k, v in tdcp.state_dict(ours).items() if ".optimizer" not in k}  # weights alone
        dcp.load(mine, checkpoint_id=str(tmp_path / "ours"), planner=tdcp.LoadPlanner())
    got = ours.state_dict()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)
