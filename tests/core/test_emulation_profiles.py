"""Issue 48, item 5: each emulated profile charges what its device charges for the access
sizes tiermem issues, checked against the figures it cites by measuring the emulated device
with the same access patterns (sequential and random reads and writes of 64 B, 256 B and
4 KiB; the figures: thesis §2.3 for Optane, its 256-byte access granularity from §2.3 and
§5.3; the CXL sources the profile names)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem.bench.emulation import TOLERANCE, run
from tiermem.cli.main import main
from tiermem.report.load import MachineLoad


def test_every_emulated_profile_measures_within_ten_percent_of_its_cited_figures() -> None:
    with MachineLoad() as load:
        res = run(quick=True)
    # Other processes' share of the CPU while it ran (the load average lags a busy loop).
    quiet = load.summary()["others_fraction"] < 0.1
    cases = {(c["profile"], c["op"], c["pattern"], c["access_bytes"]): c for c in res["cases"]}
    names = {p["name"] for p in tiermem._tiermem.profiles()}
    assert {k[0] for k in cases} == names and len(cases) == len(names) * 12
    # Whatever the machine does, no case runs faster than its device: the charge is a floor.
    for c in res["cases"]:
        assert c["gbps"] <= c["cited_gbps"] * (1 + TOLERANCE), c
    held = [c for c in res["cases"] if not c["dram_bound"]]
    off = [c for c in held if not c["within_tolerance"]]
    # Slower than the figure only when the DRAM part itself was slowed: by other work on a
    # busy machine (the suite beside a busy loop put 3 of 13 there), so held to the figure on
    # a quiet one. A quiet machine holds 17 of 24 (every Optane case).
    if quiet:
        assert len(held) >= len(res["cases"]) // 3, res["cases"]
        assert len(off) <= len(held) // 5, off
    # Optane's granularity: a 64-byte random read or write costs a 256-byte one (a quarter
    # of the bandwidth of 256 B), held to its figure where this machine's DRAM outruns it.
    for op in ("read", "write"):
        small, block = cases[("optane-pmem", op, "random", 64)], cases[("optane-pmem", op, "random", 256)]
        # Whatever the machine does: the small one's cited figure is a quarter, and (above)
        # it never runs faster than that.
        assert small["cited_gbps"] == pytest.approx(block["cited_gbps"] / 4)
        if quiet and not small["dram_bound"]:
            assert small["gbps"] < 0.35 * block["gbps"], (small, block)
            assert abs(small["gbps"] / small["cited_gbps"] - 1) <= TOLERANCE, small


def test_a_random_small_row_costs_its_device_block_through_the_embedding_kernels() -> None:
    """The same number of random rows read from an emulated Optane table: 64-byte rows stall
    a little longer than 256-byte ones (each costs a 256-byte read of the device, less the
    DRAM time of what it really moved: 64 bytes), where charged by their bytes they stalled
    0.73x as long (a quarter of the bandwidth term, the same latency term)."""
    from tiermem.embedding import EmbeddingTable

    m = tiermem.Manager({"dram": "64 MiB", "emulated:optane-pmem": "600 MiB"})
    rng = np.random.default_rng(1)
    stalled = {}
    for width in (16, 64):
        t = EmbeddingTable(1_000_000, width, manager=m, device=1)
        idx = rng.integers(0, 1_000_000, 400_000)
        m.reset_stats()
        t.lookup(idx, np.arange(0, 400_001, 40))
        stalled[width] = m.stats()["emulated:optane-pmem"]["kernel_stall_ns"]
        del t
    assert 1.0 < stalled[16] / stalled[64] < 1.3, stalled


def test_bench_emulation_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "emu.json"
    assert main(["bench", "emulation", "--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["benchmark"] == "emulation" and res["load"] and res["cases"]
    for c in res["cases"]:
        assert {"profile", "op", "pattern", "access_bytes", "gbps", "cited_gbps", "ratio_to_cited", "dram_gbps"} <= set(c)
