"""``tiermem bench dist`` on a tiny model: every field its JSON promises, and a model whose
parts add up."""

from __future__ import annotations

import pytest

from tiermem.bench import dist as bench_dist
from tiermem.dist import torchrec_peer
from tiermem.dlrm.model import DLRMConfig


def test_bench_dist_reports_runs_against_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DLRMConfig(rows=(500, 300), dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1), bag=2, batch_size=32, name="tiny")
    monkeypatch.setattr(bench_dist, "_config", lambda quick: cfg)
    monkeypatch.setattr(bench_dist, "PROCS", (1, 2))
    monkeypatch.setattr(bench_dist, "SHARDINGS", ("table", "row"))
    res = bench_dist.run(quick=True, rows=1 << 20, progress=False)
    assert [(r["nproc"], r["sharding"]) for r in res["runs"]] == [(1, "table"), (1, "row"), (2, "table"), (2, "row")]
    for r in res["runs"]:
        assert r["seconds_per_iter"] > 0 and r["predicted_seconds_per_iter"] > 0 and r["exchange_seconds"] >= 0
        assert r["seconds_per_iter"] == pytest.approx(sum(r["split"].values()))
        assert r["error"] == pytest.approx(r["predicted_seconds_per_iter"] / r["seconds_per_iter"] - 1)
    # One process sends nothing to others; two send what the model counts for the sparse part.
    one = [r for r in res["runs"] if r["nproc"] == 1]
    assert all(r["bytes_sent_per_iter"] == 0 for r in one)
    for r in (r for r in res["runs"] if r["nproc"] == 2):
        assert r["bytes_sent_per_iter"] > 0 and r["predicted_sparse_bytes_per_iter"] > 0
        if r["sharding"] == "table":  # a table on each rank, fixed bags: the count is exact
            assert r["bytes_sent_per_iter"] == pytest.approx(r["predicted_sparse_bytes_per_iter"])
    # A row-wise rank's lookups are of the whole batch on a shard of the rows: calibrated so.
    for sh in ("table", "row"):
        two = next(p for p in res["calibration"][sh] if p["nproc"] == 2)
        assert two["compute_seconds"] == pytest.approx(two["lookup"] + two["dense"] + two["update"])
    # The probe replays a step: each kind of collective priced, at each count.
    assert set(res["networks"]["row"]["2"]["kinds"]) == {"all_gather", "all_to_all", "all_reduce"}
    x = res["extrapolation"]
    assert [p["nproc"] for p in x["ranks"]] == [8, 16, 32, 64, 128, 256, 512] * 2
    assert all(p["seconds"] == pytest.approx(p["compute"] + p["exchange"]) for p in x["ranks"])
    # TorchRec's DistributedModelParallel beside, table-wise, on the same model and batches:
    # the same loss curve as tiermem's run with every row in DRAM.
    if torchrec_peer.unavailable() is None:
        peer = res["torchrec"]["runs"]
        assert [p["nproc"] for p in peer] == [1, 2]
        for p in peer:
            assert p["max_loss_difference"] <= 1e-5
            assert p["speedup_dram"] == pytest.approx(p["seconds_per_iter"] / p["tiermem_dram_seconds_per_iter"])
        assert "torchrec ms" in bench_dist.report(res)
    else:
        assert res["torchrec"] is None
    assert res["torchrec_note"]
    assert "extrapolated" in bench_dist.report(res)
