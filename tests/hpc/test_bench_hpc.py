"""``tiermem bench staging`` and ``tiermem bench traits`` at toy sizes: every variant and
strategy runs, the JSON holds the documented fields, and the reports print."""

from __future__ import annotations

from typing import Any

import pytest

from tiermem.bench import staging as bench_staging
from tiermem.bench import traits as bench_traits
from tiermem.exceptions import InvalidArgumentError


def test_bench_staging_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_staging, "QUICK_MATRICES", ("road_usa", "G_n_pin_pout"))
    monkeypatch.setattr(bench_staging, "CHUNKED", ((3, 1 << 14), (3, 1 << 14)))
    res = bench_staging.run(quick=True, reps=1, progress=False, chunk=1 << 20)
    assert [r["kernel"] for r in res["staging"]] == list(bench_staging.KERNELS)
    assert res["chunk_bytes"] == 1 << 20
    for r in res["staging"]:  # each target is the chunk, or the largest square or cube of float64 within it
        assert (1 << 20) * 0.95 < r["target_bytes"] <= 1 << 20, r
    for r in res["staging"]:
        assert set(r["seconds"]) == set(bench_staging.VARIANTS) and all(v > 0 for v in r["seconds"].values())
        assert r["decision"] in ("stage", "no") and isinstance(r["correct"], bool)
        assert 0 <= r["r_paf"] <= 1 and 0 <= r["r_sf"] <= 1 and r["analysis_seconds"] > 0 and r["copy_seconds"] > 0
        assert {"predicted_gain", "measured_gain", "u", "r", "w"} <= set(r)
        # The chunk at which the analysis is the budgeted share of the copy: its copy takes
        # analysis / budget seconds at the measured rate.
        budget_copy = r["analysis_budget_bytes"] * r["copy_seconds"] / r["target_bytes"]
        assert budget_copy == pytest.approx(r["analysis_seconds"] / bench_staging.ANALYSIS_BUDGET)
    c = res["chunked"]
    assert c["chunks"] == 3 and c["data_over_fast"] > 0 and 0 <= c["staged"] <= 3
    assert set(c["seconds"]) == {"slow_only", "always_stage", "pattern_aware"} and c["copy_seconds"] > 0
    assert len(res["suite"]) == 2 * len(bench_staging.SCALES)
    assert 0 <= res["suite_accuracy"] <= 1 and 0 <= res["suite_accuracy_paper"] <= 1
    assert "decision suite" in bench_staging.report(res)


@pytest.mark.parametrize(("chunk", "why"), [((1 << 20) + 8, "power of two"), (1 << 19, "at least 1 MiB"), (1 << 50, "available")])
def test_bench_staging_refuses_a_bad_chunk(chunk: int, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match=why):
        bench_staging.run(quick=True, reps=1, progress=False, chunk=chunk)


def test_bench_traits_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_traits, "QUICK_SIZES", (64, 96))
    monkeypatch.setattr(bench_traits, "FRACTIONS", (0.5,))
    res: dict[str, Any] = bench_traits.run(quick=True, reps=1, progress=False)
    assert {r["strategy"] for r in res["traits"]} == {"fifo", "size", "priority", "gain"}
    for r in res["traits"]:
        assert r["seconds"] > 0 and r["fast_limit"] == int(res["app_bytes"] * 0.5)
        assert sum(r["fast_bytes"].values()) <= r["fast_limit"]
    # PRIORITY puts every b (priority 15) in fast memory first, then what c (5) fits.
    prio = next(r for r in res["traits"] if r["strategy"] == "priority")
    assert prio["fast_bytes"] == {"a": 0, "b": 64 * 64 * 8 + 96 * 96 * 8, "c": 64 * 64 * 8}
    assert res["all_large_cap"] > 0 and res["unlimited_hbw"] > 0
    assert set(res["gains"]) == {"64", "96"} and set(res["gains"]["64"]) == {"a", "b", "c"}
    assert {t["priority"] for t in res["recommended"]["96"].values()} == {1, 2, 3}
    assert "priority vs fifo" in bench_traits.report(res)
