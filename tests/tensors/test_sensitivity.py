"""Sensitivity from a step's profile: each tensor's gain in the fastest device, and traits that
let the ``gain`` commit strategy give fast memory to the tensors that save the most."""

from __future__ import annotations

import itertools

import pytest
from plan_graphs import spaced

from tiermem import Manager
from tiermem.plan import gains, recommend_traits

MiB = 1 << 20


def test_gains_sum_each_tensors_uses() -> None:
    rows = {r["key"]: r for r in gains(spaced())}
    # w: read 4e-4 twice, written 6e-4; x: made 9e-4, read twice 9e-4; y: made and read once.
    assert rows["w"]["gain_seconds"] == pytest.approx(1.4e-3)
    assert rows["x"]["gain_seconds"] == pytest.approx(2.7e-3)
    assert rows["y"]["gain_seconds"] == pytest.approx(1.8e-3)
    assert [r["key"] for r in gains(spaced())] == ["w", "x", "y"]  # 1.40, 1.35, 0.90 ms per MiB
    assert rows["x"]["uses"] == 3


def test_recommended_traits_place_the_best_set_under_gain() -> None:
    g = spaced()
    rec = recommend_traits(g)
    assert rec["w"]["priority"] == 3 and rec["y"]["priority"] == 1 and rec["w"]["preferred"] == "hbw"
    m = Manager({"dram": 3 * MiB, "emulated:optane-pmem": 16 * MiB}, policy="first_touch")
    arrs = m.commit([(t.bytes, "uint8", rec[t.key]) for t in g.tensors], "gain")
    fast = {t.key for t, a in zip(g.tensors, arrs, strict=True) if a.device == "dram"}
    saved = sum(rec[k]["gain"] for k in fast)
    # No other set that fits in 3 MiB saves more.
    best = max(
        sum(rec[t.key]["gain"] for t in c)
        for n in range(len(g.tensors) + 1)
        for c in itertools.combinations(g.tensors, n)
        if sum(t.bytes for t in c) <= 3 * MiB
    )
    assert fast == {"w", "x"} and saved == pytest.approx(best)
    assert len(recommend_traits(g, top=2)) == 2
