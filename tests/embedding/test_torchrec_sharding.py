"""The sharder's pieces that need no process group: a collection on the meta device
describes its tables (and refuses to look up), and TorchRec's planner, told what tiermem's
shards cost, prices a table file by the disk's random reads, not a flat 100 MB/s."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")
from torchrec.distributed.planner import ParameterConstraints, Topology  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

from tiermem import InvalidArgumentError  # noqa: E402
from tiermem.embedding import Placement  # noqa: E402
from tiermem.torchrec import EmbeddingBagCollection, EmbeddingBagCollectionSharder  # noqa: E402
from tiermem.torchrec.planner import planner, row_seconds  # noqa: E402
from tiermem.torchrec.sharding import KERNEL  # noqa: E402

CONFIGS = [
    EmbeddingBagConfig(name="hot", num_embeddings=100_000, embedding_dim=64, feature_names=["a"]),
    EmbeddingBagConfig(name="cold", num_embeddings=100_000, embedding_dim=64, feature_names=["b"]),
]


def test_a_meta_collection_describes_its_tables_and_refuses_to_look_up() -> None:
    m = EmbeddingBagCollection(CONFIGS, device=torch.device("meta"))
    params = dict(m.named_parameters())
    assert {k: (tuple(v.shape), v.device.type) for k, v in params.items()} == {
        "embedding_bags.hot.weight": ((100_000, 64), "meta"),
        "embedding_bags.cold.weight": ((100_000, 64), "meta"),
    }
    assert m.device.type == "meta"
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    with pytest.raises(InvalidArgumentError, match="meta device.*EmbeddingBagCollectionSharder"):
        m(kjt)
    with pytest.raises(InvalidArgumentError, match="meta device"):
        _ = m.fused_optimizer


def _plan(placement: dict[str, Placement]) -> dict[str, float]:
    """Each table's planned forward compute (seconds per step) on two CPU ranks."""
    topo = Topology(world_size=2, compute_device="cpu")
    sharder = EmbeddingBagCollectionSharder(placement=placement)
    cons = {c.name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=[KERNEL]) for c in CONFIGS}
    plan = planner(topo, sharder, batch_size=256, constraints=cons).plan(
        EmbeddingBagCollection(CONFIGS, device="meta"), [sharder]
    )
    out = {}
    for opts in plan.plan.values():
        for name, p in opts.items():  # type: ignore[attr-defined]
            assert p.compute_kernel == KERNEL
            out[name] = p
    return out


def test_the_planner_prices_a_table_file_by_the_disks_random_reads(tmp_path) -> None:
    fast, slow = row_seconds(Placement(device=f"table:{tmp_path}", cache=0.1), 256)
    dram_fast, dram_slow = row_seconds(None, 256)
    assert dram_fast == dram_slow == fast
    # A miss is one random 4 KiB read: far more than 256 bytes at a flat 100 MB/s.
    assert slow > 256 / 100e6
    assert slow > 20 * fast
    assert slow == pytest.approx(row_seconds(Placement(device=f"table:{tmp_path}", cache=0.5), 4096)[1])
    placed = _plan({"hot": Placement(device="dram"), "cold": Placement(device=f"table:{tmp_path}", cache=0.1)})
    assert set(placed) == {"hot", "cold"}
    # Both tables are planned, each on its own rank (balancing the slow one's cost).
    ranks = {n: p.ranks for n, p in placed.items()}  # type: ignore[attr-defined]
    assert ranks["hot"] != ranks["cold"]


def test_the_sharder_refuses_other_kernels_and_devices() -> None:
    sharder = EmbeddingBagCollectionSharder()
    assert sharder.compute_kernels("table_wise", "cpu") == [KERNEL]
    assert "row_wise" not in sharder.sharding_types("cpu")  # gloo has no reduce-scatter
    m = EmbeddingBagCollection(CONFIGS, device="meta")

    class Fused:
        compute_kernel = "fused"

    with pytest.raises(InvalidArgumentError, match="kernel 'fused'"):
        sharder.shard(m, {"hot": Fused()}, env=None)
    with pytest.raises(InvalidArgumentError, match="look up on the CPU"):
        sharder.shard(m, {}, env=None, device=torch.device("cuda"))
