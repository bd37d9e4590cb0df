"""Hypothesis: embedding lookups and SGD updates match a NumPy reference for any width, bag
layout, mode and weights; a small dynamic cache over a slow device changes nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiermem
from tiermem.embedding import EmbeddingTable


@st.composite
def cases(draw: st.DrawFn) -> dict:
    rows = draw(st.integers(1, 40))
    width = draw(st.sampled_from([1, 3, 16, 17, 32, 64, 100]))
    sizes = draw(st.lists(st.integers(0, 6), min_size=1, max_size=12))
    idx = draw(st.lists(st.integers(0, rows - 1), min_size=sum(sizes), max_size=sum(sizes)))
    mode = draw(st.sampled_from(["sum", "mean", "none"]))
    weighted = mode == "sum" and draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return dict(rows=rows, width=width, sizes=sizes, idx=np.array(idx, np.int64), mode=mode, weighted=weighted, seed=seed)


def reference(w: np.ndarray, c: dict, psw: np.ndarray | None) -> np.ndarray:
    if c["mode"] == "none":
        return w[c["idx"]]
    out = np.zeros((len(c["sizes"]), w.shape[1]))
    start = 0
    for b, n in enumerate(c["sizes"]):
        rows = w[c["idx"][start : start + n]].astype(np.float64)
        if psw is not None:
            rows = rows * psw[start : start + n, None]
        if n:
            out[b] = rows.sum(0) / (n if c["mode"] == "mean" else 1)
        start += n
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cases())
def test_lookup_and_sgd_match_numpy(c: dict) -> None:
    rng = np.random.default_rng(c["seed"])
    w = rng.standard_normal((c["rows"], c["width"])).astype(np.float32)
    psw = rng.random(len(c["idx"])).astype(np.float32) if c["weighted"] else None
    offsets = np.concatenate([[0], np.cumsum(c["sizes"])[:-1]]).astype(np.int64)
    m = tiermem.Manager({"dram": "4 MiB", "emulated:cxl": "4 MiB"})
    direct = EmbeddingTable(c["rows"], c["width"], manager=m, device="dram")
    cached = EmbeddingTable(c["rows"], c["width"], manager=m, cache=0.1, cacheslack=0.05)
    for t in (direct, cached):
        t.load(w)
    want = reference(w, c, psw)
    got = [t.lookup(c["idx"], offsets, psw, mode=c["mode"]) for t in (direct, cached)]
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(got[0], got[1])
    g = rng.standard_normal(want.shape).astype(np.float32)
    for t in (direct, cached):
        t.update(c["idx"], offsets, g, psw, mode=c["mode"], lr=0.5)
    # SGD reference: scatter-add each output gradient into the rows that produced it.
    dense = np.zeros_like(w, dtype=np.float64)
    start = 0
    for b, n in enumerate(c["sizes"] if c["mode"] != "none" else [1] * len(c["idx"])):
        for k in range(start, start + n):
            scale = psw[k] if psw is not None else (1.0 / n if c["mode"] == "mean" else 1.0)
            dense[c["idx"][k]] += scale * g[b]
        start += n
    np.testing.assert_allclose(direct.to_numpy(), w - 0.5 * dense, rtol=1e-4, atol=1e-4)
    assert np.array_equal(direct.to_numpy(), cached.to_numpy())
