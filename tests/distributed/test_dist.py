"""Sharded tables over torch.distributed: plans, batch shares, and multi-process runs whose
loss curves equal the single-process trainer's; a rank that dies or hangs ends the others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tiermem.dist import DistOptions, ShardPlan, launch, plan_caches, plan_shards
from tiermem.dist.train import max_difference, single_process_losses
from tiermem.dlrm.data.batch import Batch
from tiermem.dlrm.data.criteo import CriteoReader, line_ranges, write_criteo
from tiermem.dlrm.data.synthetic import SyntheticData
from tiermem.dlrm.model import DLRMConfig
from tiermem.embedding.cacheplan import Costs, cache_fast_bytes, meta_bytes
from tiermem.exceptions import InvalidArgumentError

CONFIG = DLRMConfig(rows=(300, 57, 1000, 8), dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1), bag=3, batch_size=32)


def test_table_wise_plans_balance_rows_and_row_wise_splits_cover_every_row() -> None:
    p = plan_shards(CONFIG.rows, 8, 2, "table")
    assert sorted(s.table for s in p.shards) == [0, 1, 2, 3]
    assert {s.table: s.rank for s in p.shards} == {2: 0, 0: 1, 1: 1, 3: 1}  # 1000 | 300 + 57 + 8
    r = plan_shards(CONFIG.rows, 8, 3, "row")
    for t, rows in enumerate(CONFIG.rows):
        ss = r.of_table(t)
        assert [s.rank for s in ss] == [0, 1, 2] and ss[0].lo == 0 and ss[-1].hi == rows
        assert all(a.hi == b.lo for a, b in zip(ss, ss[1:])) and max(s.rows for s in ss) - min(s.rows for s in ss) <= 1
    assert r.rank_bytes(32) == [sum(s.rows for s in r.held(k)) * 32 for k in range(3)]
    assert ShardPlan.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_a_plan_that_does_not_fit_names_the_rank_and_the_numbers() -> None:
    with pytest.raises(InvalidArgumentError, match=r"rank 0, which holds 1\.0 KiB"):
        plan_shards((1000, 10), 8, 2, "table", row_bytes=32, capacity=[1024, 1 << 20])
    with pytest.raises(InvalidArgumentError, match="fewer than the 4 ranks"):
        plan_shards((3,), 8, 4, "row")
    with pytest.raises(InvalidArgumentError, match="sharding 'diagonal'"):
        plan_shards((3,), 8, 1, "diagonal")
    with pytest.raises(InvalidArgumentError, match="8 wide cannot be split column-wise over 16"):
        plan_shards((3,), 8, 16, "column")


def test_column_wise_plans_split_every_table_s_columns_over_the_ranks() -> None:
    p = plan_shards(CONFIG.rows, 8, 3, "column")
    for t, rows in enumerate(CONFIG.rows):
        ss = p.of_table(t)
        assert [s.cols(8) for s in ss] == [(0, 3), (3, 6), (6, 8)] and all((s.lo, s.hi) == (0, rows) for s in ss)
    assert p.rank_bytes(32) == [sum(CONFIG.rows) * 4 * w for w in (3, 3, 2)]
    assert ShardPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.table(32)[2][1].startswith("t0[:, 6:8]")
    # A plan written before column shards (four numbers a shard) reads as whole-width shards.
    old = {"rows": [5], "dim": 8, "world": 1, "sharding": "table", "shards": [[0, 0, 0, 5]]}
    assert ShardPlan.from_dict(old).shards[0].cols(8) == (0, 8)


def test_batch_shares_concatenate_to_the_batch() -> None:
    b = SyntheticData(CONFIG.rows, 13, 32, bag=3, seed=1).batch(0)
    parts = [b.shard(r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p.dense for p in parts]), b.dense)
    for t in range(len(CONFIG.rows)):
        assert torch.equal(torch.cat([p.indices[t] for p in parts]), b.indices[t])
        assert all(int(p.offsets[t][0]) == 0 and len(p.offsets[t]) == 9 for p in parts)
    with pytest.raises(InvalidArgumentError, match="cannot be split into 3"):
        b.shard(0, 3)
    back = Batch.concat(parts)
    assert torch.equal(back.dense, b.dense) and torch.equal(back.labels, b.labels)
    for t in range(len(CONFIG.rows)):
        assert torch.equal(back.indices[t], b.indices[t]) and torch.equal(back.offsets[t], b.offsets[t])
    with pytest.raises(InvalidArgumentError, match="at least one"):
        Batch.concat([])


CRITEO = DLRMConfig(rows=(50,) * 26, dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1), bag=1, batch_size=32)


def test_two_processes_each_read_their_part_of_a_criteo_file(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    path = tmp_path / "day.tsv"
    write_criteo(path, 700, seed=3)
    with open(path, "ab") as f:
        f.write(b"not a criteo line\n")  # skipped in the second rank's part
    o = DistOptions(CRITEO, steps=50, lr=0.5, criteo=str(path))
    res = launch(o, 2)
    # About 350 lines a part, batches of 16 a rank: both stop when the first part runs out.
    parts = [sum(1 for _ in CriteoReader(path, CRITEO.rows, 16, start=lo, end=hi)) for lo, hi in line_ranges(path, 2)]
    assert 18 <= min(parts) < 50 and len(res["losses"]) == min(parts)
    assert res["data_ran_out"] == parts.index(min(parts))
    ref = single_process_losses(o, 2)
    assert max_difference(res["losses"], ref) <= 1e-5, (res["losses"], ref)
    assert abs(res["losses"][-1] - res["losses"][0]) > 1e-3
    with pytest.raises(InvalidArgumentError, match="26 categorical"):
        DistOptions(CONFIG, criteo=str(path))

    # Checkpointed after 6 steps, resumed on as many ranks: each reads on from its position.
    ck = str(tmp_path / "ck")
    first = launch(DistOptions(**{**vars(o), "steps": 6, "checkpoint": ck}), 2)
    resumed = launch(DistOptions(**{**vars(o), "steps": 12, "checkpoint": ck, "resume": True}), 2)
    assert resumed["first_step"] == 6 and len(resumed["losses"]) == 6
    assert max_difference(first["losses"] + resumed["losses"], ref[:12]) <= 1e-5
    # On another number of ranks the parts differ: refused.
    with pytest.raises(mp.ProcessRaisedException, match="resumes on as many ranks"):
        launch(DistOptions(**{**vars(o), "steps": 12, "checkpoint": ck, "resume": True}), 1)


def test_cache_plans_give_each_rank_s_fast_memory_to_the_shards_whose_hit_rate_it_raises_most() -> None:
    rng = np.random.default_rng(0)
    rows = (4000, 4000, 4000, 4000)
    hot = np.minimum(rng.zipf(1.3, 40_000) - 1, 3999)  # a few rows take most accesses
    cold = rng.integers(0, 4000, 40_000)  # every row alike: a cache barely pays
    traces = [hot, hot.copy(), cold, cold.copy()]  # table-wise: t0 and t2 on rank 0, t1 and t3 on rank 1
    costs = Costs(delta_ns=0.5, insert_ns=0.2, source="test")
    base = plan_shards(rows, 8, 2, "table")
    fast = [meta_bytes([4000, 4000]) + 40_000] * 2
    p = plan_caches(base, traces, fast, 32, costs)
    for r in range(2):
        held = p.held(r)
        caches = {s.table: p.cache_of(s) for s in held}
        hot_t = next(t for t in caches if t in (0, 1))
        cold_t = next(t for t in caches if t in (2, 3))
        assert caches[hot_t].rows > caches[cold_t].rows and caches[hot_t].hit_rate > 0.3
        used = sum(cache_fast_bytes(4000, 32, c.rows / 4000) for c in caches.values() if c.policy)
        assert meta_bytes([4000, 4000]) + used <= fast[r]
    assert ShardPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.header()[-1] == "predicted hit rate" and len(p.table(32)[0]) == len(p.header())
    with pytest.raises(InvalidArgumentError, match=r"rank 1's fast memory of 1\.0 KiB does not hold"):
        plan_caches(base, traces, [fast[0], 1024], 32, costs)
    with pytest.raises(InvalidArgumentError, match="3 profiles for 4 tables"):
        plan_caches(base, traces[:3], fast, 32, costs)


def test_two_processes_with_planned_caches_train_the_single_process_curve() -> None:
    o = DistOptions(CONFIG, sharding="row", placement="cached", steps=10, lr=0.5, dist="zipf", fast_bytes=40_000)
    res = launch(o, 2)
    plan = ShardPlan.from_dict(res["plan"])
    assert plan.fast == (40_000, 40_000) and {c.policy for c in plan.caches} & {"static", "dynamic"}
    assert max_difference(res["losses"], single_process_losses(o)) <= 1e-5
    with pytest.raises(InvalidArgumentError, match="keeps every row in DRAM"):
        DistOptions(CONFIG, placement="dram", fast_bytes=1 << 20)


@pytest.mark.parametrize(
    ("sharding", "placement"), [("table", "dram"), ("row", "dram"), ("row", "cached"), ("table", "block"), ("column", "cached")]
)
def test_two_processes_train_the_single_process_loss_curve(sharding: str, placement: str, tmp_path: Path) -> None:
    o = DistOptions(CONFIG, sharding=sharding, placement=placement, steps=12, lr=0.5, directory=str(tmp_path), cache=0.3)
    res = launch(o, 2)
    ref = single_process_losses(o)
    assert len(res["losses"]) == 12 and res["world"] == 2
    assert max_difference(res["losses"], ref) <= 1e-5, (res["losses"], ref)
    # Training moved: the curve is not flat (a lookup that returned zeros would still agree
    # with itself, not with the reference).
    assert abs(res["losses"][-1] - res["losses"][0]) > 1e-3
    if placement == "block":
        assert sorted(os.listdir(tmp_path)) == ["rank0", "rank1"]


def test_torchrec_model_parallel_trains_the_curve_of_tiermem_s_ranks() -> None:
    from tiermem.dist import torchrec_peer

    why = torchrec_peer.unavailable()
    if why is not None:
        pytest.skip(why)
    # Big steps: an update of the wrong size (a gradient scaled by the world size, or not)
    # would part the curves within a few steps.
    o = DistOptions(CONFIG, sharding="table", placement="dram", steps=12, lr=0.5)
    peer, ours = torchrec_peer.run(o, 2), launch(o, 2)
    assert max_difference(peer["losses"], ours["losses"]) <= 1e-5, (peer["losses"], ours["losses"])
    assert abs(peer["losses"][-1] - peer["losses"][0]) > 1e-3
    with pytest.raises(InvalidArgumentError, match="does not run on gloo"):
        torchrec_peer.run(DistOptions(CONFIG, sharding="row", placement="dram"), 2)
    with pytest.raises(InvalidArgumentError, match="every row in DRAM"):
        torchrec_peer.run(DistOptions(CONFIG, placement="cached"), 2)


def _rank(tmp_path: Path, o: DistOptions, rank: int, world: int, port: int, capture: bool = True) -> subprocess.Popen[bytes]:
    opts = tmp_path / "options.json"
    opts.write_text(json.dumps(o.to_json()))
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    err = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "tiermem.dist", str(opts)], env=env, stderr=err)


def _port() -> int:
    from tiermem.dist.train import _free_port

    return _free_port()


@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_rank_that_dies_or_hangs_ends_the_others_with_an_error(how: str, tmp_path: Path) -> None:
    o = DistOptions(CONFIG, steps=10_000, timeout=10.0, die=(1, 3) if how == "dies" else None)
    port = _port()
    procs = [_rank(tmp_path, o, r, 2, port, capture=r == 0) for r in range(2)]
    try:
        if how == "hangs":
            time.sleep(5.0)  # past start-up, into training
            assert procs[1].poll() is None
            os.kill(procs[1].pid, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = procs[0].communicate(timeout=60)
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    assert procs[0].returncode != 0
    assert waited < 60
    text = err.decode(errors="replace")
    assert "Error" in text, text[-2000:]


def test_ranks_with_different_options_refuse_to_train(tmp_path: Path) -> None:
    port = _port()
    a = DistOptions(CONFIG, steps=2)
    b = DistOptions(CONFIG, steps=2, lr=0.02)
    pa = tmp_path / "a"
    pb = tmp_path / "b"
    pa.mkdir()
    pb.mkdir()
    procs = [_rank(pa, a, 0, 2, port), _rank(pb, b, 1, 2, port)]
    errs = [p.communicate(timeout=60)[1].decode(errors="replace") for p in procs]
    assert all(p.returncode != 0 for p in procs)
    assert any("options differ" in e for e in errs), errs


def test_a_checkpoint_from_four_ranks_resumes_on_two_on_the_same_curve(tmp_path: Path) -> None:
    ck = str(tmp_path / "ck")
    base = DistOptions(CONFIG, sharding="row", placement="cached", steps=8, lr=0.5, cache=0.3)
    first = launch(DistOptions(**{**vars(base), "steps": 4, "checkpoint": ck}), 4)
    assert sorted(os.listdir(ck)) == ["manifest.json", "step00000004"]
    resumed = launch(DistOptions(**{**vars(base), "sharding": "table", "checkpoint": ck, "resume": True}), 2)
    assert resumed["first_step"] == 4 and len(resumed["losses"]) == 4
    ref = single_process_losses(base)
    assert max_difference(first["losses"] + resumed["losses"], ref) <= 1e-5, (first["losses"], resumed["losses"], ref)


def test_column_shards_resume_from_row_shards_and_from_other_column_splits(tmp_path: Path) -> None:
    ck = str(tmp_path / "ck")
    base = DistOptions(CONFIG, sharding="column", placement="dram", steps=9, lr=0.5)
    a = launch(DistOptions(**{**vars(base), "sharding": "row", "steps": 3, "checkpoint": ck}), 2)
    b = launch(DistOptions(**{**vars(base), "steps": 6, "checkpoint": ck, "resume": True}), 4)  # 2 columns a rank
    c = launch(DistOptions(**{**vars(base), "checkpoint": ck, "resume": True}), 2)  # 4 columns a rank
    assert (b["first_step"], c["first_step"]) == (3, 6)
    ref = single_process_losses(base)
    assert max_difference(a["losses"] + b["losses"] + c["losses"], ref) <= 1e-5, (a["losses"], b["losses"], c["losses"], ref)


def test_resuming_another_model_or_a_set_missing_a_shard_is_an_error_naming_it(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    ck = str(tmp_path / "ck")
    launch(DistOptions(CONFIG, steps=2, checkpoint=ck), 2)
    other = DLRMConfig(rows=(300, 57, 1000, 9), dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1), bag=3, batch_size=32)
    with pytest.raises(mp.ProcessRaisedException, match="another model .differs in rows"):
        launch(DistOptions(other, steps=4, checkpoint=ck, resume=True), 2)
    os.unlink(os.path.join(ck, "step00000002", "rank1.ckpt"))
    with pytest.raises(mp.ProcessRaisedException, match="shard file of rank 1.*is missing"):
        launch(DistOptions(CONFIG, steps=4, checkpoint=ck, resume=True), 2)


def _dram_table(s: Any) -> Any:
    from tiermem.embedding import EmbeddingTable
    from tiermem.manager import Manager

    return EmbeddingTable(s.rows, 8, manager=Manager([("dram", 64 << 20)], policy="all_fast"))


def test_a_keyed_jagged_tensor_looks_up_as_its_values_and_offsets(one_rank: Any) -> None:
    jt = pytest.importorskip("torchrec.sparse.jagged_tensor")
    from tiermem.dist import ShardedEmbeddings

    plan = plan_shards((50, 20), 8, 1, "row")
    emb = ShardedEmbeddings(plan, _dram_table, names=["user", "item"], lr=0.1)
    for t, rows in enumerate(plan.rows):
        emb.load_rows(t, 0, np.arange(rows * 8, dtype=np.float32).reshape(rows, 8) / 100)
    user, item = torch.tensor([3, 4, 49, 0]), torch.tensor([19, 1, 1])
    kjt = jt.KeyedJaggedTensor.from_lengths_sync(
        keys=["item", "user"], values=torch.cat([item, user]), lengths=torch.tensor([1, 2, 0, 2, 1, 1])
    )
    with torch.no_grad():
        keyed = emb(kjt)
        plain = emb([user, item], [torch.tensor([0, 2, 3, 4]), torch.tensor([0, 1, 3, 3])])
    assert keyed.keys() == ["user", "item"] and torch.equal(keyed.values(), plain)
    assert torch.allclose(keyed["user"][0], torch.from_numpy((np.arange(24, 32) + np.arange(32, 40)) / 100).float())
    with pytest.raises(InvalidArgumentError, match=r"keys \['item'\], the tables are \['user', 'item'\]"):
        emb(jt.KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=item, lengths=torch.tensor([1, 2, 0])))
