"""Tiered tables through torch.distributed.checkpoint (``tiermem.torch.dcp``), in one
process: round trips that resume training exactly for every placement, chunks that bound
what is held, checkpoints moving to and from TorchRec's own collection and between
shardings, and the errors a wrong load gets."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection as TorchRecEBC  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

from tiermem import InvalidArgumentError  # noqa: E402
from tiermem.embedding import EmbeddingTable, Placement  # noqa: E402
from tiermem.torch import dcp as tdcp  # noqa: E402
from tiermem.torchrec import EmbeddingBagCollection  # noqa: E402

CONFIGS = [
    EmbeddingBagConfig(name="t_user", num_embeddings=300, embedding_dim=8, feature_names=["user", "friend"]),
    EmbeddingBagConfig(name="t_item", num_embeddings=120, embedding_dim=16, feature_names=["item"]),
]
FEATURES = {"user": 300, "friend": 300, "item": 120}


@pytest.fixture(autouse=True)
def _single_process_dcp() -> Iterator[None]:
    with warnings.catch_warnings():
        # DCP says once per call that it runs without a process group: that is the point here.
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def batch(seed: int, n: int = 6) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(FEATURES) * n,), generator=g)
    values = torch.cat(
        [torch.randint(0, r, (int(lengths[i * n : (i + 1) * n].sum()),), generator=g) for i, r in enumerate(FEATURES.values())]
    )
    return KeyedJaggedTensor.from_lengths_sync(keys=list(FEATURES), values=values, lengths=lengths)


def train(m: torch.nn.Module, seeds: range) -> None:
    for s in seeds:
        (m(batch(s)).values() * torch.linspace(-1, 1, 32)).sum().backward()


def model(seed: int, tmp_path: object = None, placement: str = "dram", optimizer: str = "adam") -> EmbeddingBagCollection:
    torch.manual_seed(seed)
    place = {
        "dram": None,
        "cached": Placement(device="emulated:optane-pmem", cache=0.25),
        "table": Placement(device=f"table:{tmp_path}", cache=0.25),
    }[placement]
    return EmbeddingBagCollection(CONFIGS, placement=place, optimizer=optimizer, lr=0.05, init="overwrite")


def weights(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in m.state_dict().items()}


def load(m: torch.nn.Module, path: object) -> dict:
    sd = tdcp.state_dict(m)
    dcp.load(sd, checkpoint_id=str(path), planner=tdcp.LoadPlanner())
    return sd


@pytest.mark.parametrize("optimizer", ["adam", "rowwise_adagrad", "sgd"])
@pytest.mark.parametrize("placement", ["dram", "cached", "table"])
def test_a_round_trip_resumes_training_exactly(tmp_path, placement: str, optimizer: str, monkeypatch) -> None:
    """Train, save, train on; a model built anew (other initial rows) loads the checkpoint and
    trains the same steps to the same rows, optimizer state and step counts."""
    monkeypatch.setattr(tdcp, "CHUNK_BYTES", 1024)  # many chunks per table
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = model(0, tmp_path / "a", placement, optimizer)
    train(a, range(3))
    dcp.save(tdcp.state_dict(a), checkpoint_id=str(tmp_path / "ckpt"))
    train(a, range(3, 6))
    b = model(1, tmp_path / "b", placement, optimizer)
    load(b, tmp_path / "ckpt")
    train(b, range(3, 6))
    for k, v in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[k], v, rtol=0, atol=0)
    sa, sb = a.fused_optimizer.state_dict()["state"], b.fused_optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k]["steps"] == sb[k]["steps"] == (6 if optimizer != "sgd" else sa[k]["steps"])
        if optimizer != "sgd":
            torch.testing.assert_close(sb[k]["state"], sa[k]["state"], rtol=0, atol=0)


def test_chunks_bound_what_a_save_and_a_load_hold(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tdcp, "CHUNK_BYTES", 4 * 16 * 10)  # ten 16-wide rows
    a = model(0)
    train(a, range(2))
    sd = tdcp.state_dict(a)
    dcp.save(sd, checkpoint_id=str(tmp_path))
    got = load(model(1), tmp_path)
    for d in (sd, got):
        rows = {k: v for k, v in d.items() if isinstance(v, tdcp.TableRows)}
        # Every table here is larger than a chunk: each was read and written a chunk at a time.
        assert rows and all(v.peak_rows == tdcp.CHUNK_BYTES // (4 * v.parts[0].cols) for v in rows.values())


def test_a_table_larger_than_the_chunk_is_never_held_whole(tmp_path) -> None:
    """A 256 MiB table file behind a 1 % cache saves and loads through DCP with the
    process's peak memory growing by far less than the table (it grows by about a chunk)."""
    script = textwrap.dedent(
        f"""
        import warnings, torch, numpy as np
        import torch.distributed.checkpoint as dcp
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from tiermem.embedding import Placement
        from tiermem.torch import dcp as tdcp
        from tiermem.torchrec import EmbeddingBagCollection
        warnings.simplefilter("ignore")
        tdcp.CHUNK_BYTES = 8 << 20
        cfg = [EmbeddingBagConfig(name="big", num_embeddings=1 << 20, embedding_dim=64, feature_names=["f"],
                                  init_fn=lambda w: w.fill_(0.5))]
        m = EmbeddingBagCollection(cfg, placement=Placement(device="table:{tmp_path}/big.tbl", cache=0.01))
        t = m.embedding_bags["big"].table
        def kib(field):
            return int(next(x for x in open("/proc/self/status") if x.startswith(field)).split()[1])
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak (VmHWM) starts again from what is resident now
        base = kib("VmRSS")
        dcp.save(tdcp.state_dict(m), checkpoint_id="{tmp_path}/ckpt")
        t.load(np.zeros((1, 64), np.float32), 7)
        dcp.load(tdcp.state_dict(m), checkpoint_id="{tmp_path}/ckpt", planner=tdcp.LoadPlanner())
        assert float(t.read(7, 1)[0, 0]) == 0.5
        print((kib("VmHWM") - base) // 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=os.environ)
    assert out.returncode == 0, out.stderr[-3000:]
    grew_mib = int(out.stdout.split()[-1])
    assert grew_mib < 96, f"peak memory grew by {grew_mib} MiB saving and loading a 256 MiB table in 8 MiB chunks"


def test_the_default_load_planner_is_refused_by_name(tmp_path) -> None:
    a = model(0)
    dcp.save(tdcp.state_dict(a), checkpoint_id=str(tmp_path))
    with pytest.raises(BaseException, match="LoadPlanner"):
        dcp.load(tdcp.state_dict(model(1)), checkpoint_id=str(tmp_path))


def test_state_of_another_optimizer_is_refused_naming_it(tmp_path) -> None:
    a = model(0, optimizer="adam")
    train(a, range(1))
    dcp.save(tdcp.state_dict(a), checkpoint_id=str(tmp_path))
    b = model(1, optimizer="rowwise_adagrad")
    train(b, range(1))
    before, state = weights(b), b.fused_optimizer.state_dict()["state"]
    with pytest.raises(BaseException, match=r"optimizer\.adam"):
        load(b, tmp_path)
    for k, v in b.state_dict().items():  # refused before anything was written
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    for k, st in b.fused_optimizer.state_dict()["state"].items():  # its optimizer state too
        assert int(st["steps"]) == int(state[k]["steps"]) == 1
        torch.testing.assert_close(st["state"], state[k]["state"], rtol=0, atol=0)


def test_torchrecs_own_collection_loads_ours_and_ours_loads_its(tmp_path) -> None:
    """Weights move both ways under TorchRec's keys; a checkpoint without optimizer state
    (TorchRec's) loads with the tables' state reset."""
    ours = model(0)
    train(ours, range(2))
    dcp.save(tdcp.state_dict(ours), checkpoint_id=str(tmp_path / "ours"))
    theirs = TorchRecEBC(tables=CONFIGS, device=torch.device("cpu"))
    sd = theirs.state_dict()
    dcp.load(sd, checkpoint_id=str(tmp_path / "ours"))
    for k, v in ours.state_dict().items():
        torch.testing.assert_close(theirs.state_dict()[k], v, rtol=0, atol=0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.mul_(2)
    dcp.save(theirs.state_dict(), checkpoint_id=str(tmp_path / "theirs"))
    load(ours, tmp_path / "theirs")
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=0, atol=0)
    for st in ours.fused_optimizer.state_dict()["state"].values():
        assert st["state"].numel() == 0 and int(st["steps"]) == 0


class Split(torch.nn.Module):
    """A table cut into pieces (rows ``cuts``, columns ``cols``), as a sharded collection
    names them to :func:`tiermem.torch.dcp.state_dict`."""

    def __init__(self, rows: int, dim: int, row_cuts: list[int], col_cuts: list[int], optimizer: str | None) -> None:
        super().__init__()
        self.rows, self.dim, self.optimizer = rows, dim, optimizer
        self.pieces = [
            (EmbeddingTable(r1 - r0, c1 - c0), r0, c0)
            for r0, r1 in zip([0, *row_cuts], [*row_cuts, rows])
            for c0, c1 in zip([0, *col_cuts], [*col_cuts, dim])
        ]
        self.split = bool(col_cuts)

    def dcp_pieces(self, prefix: str) -> list[tdcp.Piece]:
        return [
            tdcp.Piece(prefix + "embedding_bags.t_user.", t, self.rows, self.dim, r0, c0, self.split, self.optimizer)
            for t, r0, c0 in self.pieces
        ]

    def whole(self) -> np.ndarray:
        out = np.zeros((self.rows, self.dim), np.float32)
        for t, r0, c0 in self.pieces:
            out[r0 : r0 + t.num_embeddings, c0 : c0 + t.embedding_dim] = t.to_numpy()
        return out

    def state(self) -> np.ndarray:
        out = np.zeros((self.rows, self.dim), np.float32)
        for t, r0, c0 in self.pieces:
            st = t.optimizer_state()
            assert st is not None
            out[r0 : r0 + t.num_embeddings, c0 : c0 + t.embedding_dim] = st[1].reshape(t.num_embeddings, -1)
        return out


@pytest.mark.parametrize(("row_cuts", "col_cuts"), [([100, 250], []), ([], [3]), ([150], [2, 5])])
def test_a_checkpoint_moves_between_a_whole_table_and_shards(tmp_path, row_cuts, col_cuts, monkeypatch) -> None:
    """Whole -> pieces -> whole, with element-wise (Adagrad) state cut as the columns are."""
    monkeypatch.setattr(tdcp, "CHUNK_BYTES", 4 * 8 * 64)
    a = model(0, optimizer="adagrad")
    train(a, range(3))
    want = a.state_dict()["embedding_bags.t_user.weight"].numpy()
    want_state = a.fused_optimizer.state_dict()["state"]["embedding_bags.t_user.weight"]["state"].numpy().reshape(300, 8)
    dcp.save(tdcp.state_dict(a), checkpoint_id=str(tmp_path / "whole"))
    split = Split(300, 8, row_cuts, col_cuts, "adagrad")
    sd = tdcp.state_dict(split)
    assert set(sd) == {
        "embedding_bags.t_user.weight",
        "embedding_bags.t_user.optimizer.adagrad",
        "embedding_bags.t_user.optimizer_steps",
    }
    dcp.load(sd, checkpoint_id=str(tmp_path / "whole"), planner=tdcp.LoadPlanner(allow_partial_load=True))
    np.testing.assert_array_equal(split.whole(), want)
    np.testing.assert_array_equal(split.state(), want_state)
    assert all(t.optimizer_state_info()[2] == 3 for t, _, _ in split.pieces)
    for t, _, _ in split.pieces:
        t.load(t.to_numpy() * 3)
    dcp.save(tdcp.state_dict(split), checkpoint_id=str(tmp_path / "split"))
    b = model(1, optimizer="adagrad")
    sd = tdcp.state_dict(b)
    for k in [k for k in sd if "t_item" in k]:
        del sd[k]
    dcp.load(sd, checkpoint_id=str(tmp_path / "split"), planner=tdcp.LoadPlanner())
    np.testing.assert_array_equal(b.state_dict()["embedding_bags.t_user.weight"].numpy(), want * 3)


def test_row_wise_state_of_column_slices_is_kept_per_slice_and_refused_across_splits(tmp_path) -> None:
    a = Split(300, 8, [], [4], "rowwise_adagrad")
    for t, _, _ in a.pieces:
        t.set_optimizer_state("rowwise_adagrad", np.arange(300, dtype=np.float32), 2)
    sd = tdcp.state_dict(a)
    assert {k for k in sd if ".cols" in k} == {
        "embedding_bags.t_user.optimizer.rowwise_adagrad.cols0_4",
        "embedding_bags.t_user.optimizer.rowwise_adagrad.cols4_8",
    }
    dcp.save(sd, checkpoint_id=str(tmp_path))
    same = Split(300, 8, [120], [4], "rowwise_adagrad")
    for t, _, _ in same.pieces:
        t.set_optimizer_state("rowwise_adagrad", np.zeros(t.num_embeddings, np.float32), 0)
    dcp.load(tdcp.state_dict(same), checkpoint_id=str(tmp_path), planner=tdcp.LoadPlanner())
    for t, r0, _ in same.pieces:
        np.testing.assert_array_equal(t.optimizer_state()[1], np.arange(r0, r0 + t.num_embeddings, dtype=np.float32))
    other = Split(300, 8, [], [2], "rowwise_adagrad")
    for t, _, _ in other.pieces:
        t.set_optimizer_state("rowwise_adagrad", np.zeros(300, np.float32), 0)
    with pytest.raises(BaseException, match="column split"):
        dcp.load(tdcp.state_dict(other), checkpoint_id=str(tmp_path), planner=tdcp.LoadPlanner())


def test_a_handle_refuses_to_be_computed_with() -> None:
    sd = tdcp.state_dict(model(0))
    h = sd["embedding_bags.t_user.weight"]
    assert isinstance(h, torch.Tensor) and h.shape == (300, 8) and h.dtype == torch.float32
    with pytest.raises(InvalidArgumentError, match="holds no data"):
        _ = h + 1
    assert "300 x 8 at (0, 0)" in repr(h)
    with pytest.raises(InvalidArgumentError, match="cannot be pickled.*torch.distributed.checkpoint"):
        torch.save(sd, io.BytesIO())


def test_a_checkpoint_of_another_shape_is_refused(tmp_path) -> None:
    dcp.save(tdcp.state_dict(model(0)), checkpoint_id=str(tmp_path))
    bigger = [EmbeddingBagConfig(**{**CONFIGS[0].__dict__, "num_embeddings": 301}), CONFIGS[1]]
    torch.manual_seed(0)
    b = EmbeddingBagCollection(bigger, optimizer="adam")
    with pytest.raises(BaseException, match="Size mismatch"):
        load(b, tmp_path)
