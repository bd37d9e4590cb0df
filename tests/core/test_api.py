"""The Python surface: arrays, placement, hints, counters, traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tiermem


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "complex64", "bool"])
def test_arrays_hold_what_numpy_holds(two_tier: tiermem.Manager, rng: np.random.Generator, dtype: str) -> None:
    ref = (rng.standard_normal((37, 41)) * 100).astype(dtype)
    a = two_tier.array(ref.shape, dtype)
    with a.write() as v:
        v[...] = ref
    a.evict()
    assert a.device == "emulated:cxl"
    np.testing.assert_array_equal(a.to_numpy(), ref)
    with a.read() as v:
        # Operations on the view agree with NumPy on a plain copy.
        np.testing.assert_array_equal(v * 2 + 1, ref * 2 + 1)
        np.testing.assert_array_equal(np.sort(v, axis=0), np.sort(ref, axis=0))
        assert v.shape == ref.shape and v.dtype == ref.dtype
        assert not v.flags.writeable


def test_lru_moves_and_counts(two_tier: tiermem.Manager) -> None:
    a = two_tier.array(600_000, "uint8", fill=1)
    b = two_tier.array(600_000, "uint8", fill=2)  # DRAM (1 MiB) cannot hold both
    assert (a.device, b.device) == ("emulated:cxl", "dram")
    assert a.placement == {"device": "emulated:cxl", "siblings": [], "dirty": False, "pins": 0}
    with a.read() as v:
        assert int(v[0]) == 1
    assert a.in_fast and not b.in_fast
    # `a` came back for a read: its slow copy is kept and clean, so evicting copies nothing.
    assert a.placement["siblings"] == ["emulated:cxl"]
    before = two_tier.stats()["emulated:cxl"]["bytes_written"]
    a.evict()
    s = two_tier.stats()
    assert s["emulated:cxl"]["bytes_written"] == before
    assert s["dram"]["writebacks_elided"] == 1
    assert s["dram"]["dirty_writebacks"] == 2
    two_tier.reset_stats()
    assert all(v == 0 for d in two_tier.stats().values() for v in d.values())
    two_tier.check()


def test_free_releases_space_and_never_writes_back(two_tier: tiermem.Manager) -> None:
    a = two_tier.array(500_000, "uint8", fill=3)
    a.free()
    a.free()  # idempotent on the facade
    assert two_tier.usage()["dram"] == {"used": 0, "peak": 500_032, "capacity": 1 << 20}
    two_tier.reset_stats()
    assert two_tier.usage()["dram"]["peak"] == 0
    assert two_tier.stats()["emulated:cxl"]["bytes_written"] == 0
    with pytest.raises(tiermem.NoSuchObjectError):
        two_tier._native.evict(a.id)


def test_where_places_explicitly(two_tier: tiermem.Manager) -> None:
    assert two_tier.array(10, where="slow").device == "emulated:cxl"
    assert two_tier.array(10, where="fast").device == "dram"
    assert two_tier.array(10, where="emulated:cxl").device == "emulated:cxl"
    assert two_tier.array(10, where=0).device == "dram"


def test_softevict_and_prefetch_hints(two_tier: tiermem.Manager) -> None:
    a = two_tier.array(300_000, "uint8", fill=1)
    b = two_tier.array(300_000, "uint8", fill=2)
    c = two_tier.array(300_000, "uint8", fill=3)
    a.softevict()
    d = two_tier.array(300_000, "uint8", fill=4)
    assert not a.in_fast and b.in_fast and c.in_fast and d.in_fast
    a.prefetch(force=True)
    assert a.in_fast
    assert int(a.to_numpy()[0]) == 1


def test_garbage_collected_arrays_free_their_memory(two_tier: tiermem.Manager) -> None:
    for _ in range(50):
        two_tier.array(400_000, "uint8", fill=1)
    assert two_tier.object_count == 0
    assert two_tier.usage()["dram"]["used"] == 0


def test_record_traces_bytes_per_device(two_tier: tiermem.Manager) -> None:
    with two_tier.record(0.002) as trace:
        a = two_tier.array(800_000, "uint8", fill=1)
        for _ in range(3):
            a.evict()
            a.prefetch(force=True)
            with a.write() as v:
                v[0] = 2
    assert trace and all({"t", "read", "written"} <= set(s) for s in trace)
    written = sum(s["written"]["emulated:cxl"] for s in trace)
    assert written == two_tier.stats()["emulated:cxl"]["bytes_written"] > 0
    assert [s["t"] for s in trace] == sorted(s["t"] for s in trace)


def test_devices_describe_themselves(two_tier: tiermem.Manager) -> None:
    d = {x["name"]: x for x in two_tier.devices}
    assert d["dram"]["real"] == "real" and d["emulated:cxl"]["real"] == "emulated"
    assert d["emulated:cxl"]["read_gbps"] > 0 and d["emulated:cxl"]["profile_source"]
    assert "lru" in repr(two_tier)


def test_device_list_forms_are_equivalent() -> None:
    for devs in ({"dram": "1 MiB"}, [("dram", 1 << 20)], ["dram=1MiB"]):
        m = tiermem.Manager(devs, policy="all_fast")
        assert m.usage()["dram"]["capacity"] == 1 << 20


def test_topology_and_profiles() -> None:
    topo = tiermem.topology()
    assert topo["cpus"] >= 1 and topo["mem_available"] > 0
    # The DRAM probe's buffers: twice the last-level cache (at least 64 MiB) unless the room
    # the process has left is smaller (the sizing rule is tested in the core).
    llc, probe = topo["last_level_cache"], tiermem._tiermem.dram_probe_bytes()
    assert llc >= 0 and 8 << 20 <= probe <= max(2 * llc, 64 << 20)
    names = {p["name"] for p in tiermem.profiles()}
    assert {"optane-pmem", "cxl"} <= names
    optane = next(p for p in tiermem.profiles() if p["name"] == "optane-pmem")
    assert 1 / 8 <= optane["write_ratio"] <= 1 / 6 and 0.3 <= optane["read_ratio"] <= 0.35
    assert optane["latency_ratio"] >= 3


def _figures_in_processes(calibration: Path, n: int) -> list[dict]:
    """``tiermem.dram_figures()`` of ``n`` processes started together, with no DRAM figures
    in the calibration file ``calibration``."""
    env = {**os.environ, "TIERMEM_CALIBRATION": str(calibration)}
    code = "import json, tiermem; print(json.dumps(tiermem.dram_figures()))"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return [json.loads(o) for o in outs]


def test_processes_started_together_measure_dram_once(tmp_path: Path) -> None:
    # Whatever the order they reach the probe in, one process measures and the others take its
    # figures (they would measure each other's traffic otherwise), all within a minute.
    cal = tmp_path / "cal" / "calibration.json"
    figs = _figures_in_processes(cal, 3)
    assert sorted(f["source"] for f in figs) == ["measured", "shared", "shared"]
    assert len({(f["read_gbps"], f["write_gbps"], f["latency_ns"]) for f in figs}) == 1
    (kept,) = cal.parent.glob("dram-probe-*.json")  # named by this boot of this machine
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert kept.name == f"dram-probe-{boot}.json" and json.loads(kept.read_text())["boot_id"] == boot
    # A stale measurement (or another boot's, or a damaged file) is measured afresh and replaced.
    for stale in ({**json.loads(kept.read_text()), "measured_at": 0.0}, "{damaged"):
        kept.write_text(stale if isinstance(stale, str) else json.dumps(stale))
        (f,) = _figures_in_processes(cal, 1)
        assert f["source"] == "measured" and json.loads(kept.read_text())["dram"]["read_gbps"] == f["read_gbps"]
    # A folder anyone may write in is never trusted with figures: each process measures.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert [f["source"] for f in _figures_in_processes(open_dir / "calibration.json", 2)] == ["measured"] * 2
    assert not list(open_dir.glob("dram-probe-*"))


def _anon_huge_bytes() -> int:
    with open("/proc/self/smaps_rollup", encoding="utf-8") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.skipif(tiermem.topology()["thp"] in ("never", "unavailable"), reason="THP disabled here")
def test_memory_heaps_are_prefaulted_on_huge_pages() -> None:
    before = _anon_huge_bytes()
    m = tiermem.Manager({"dram": "64 MiB"}, policy="all_fast")
    assert m.devices[0]["huge_pages"] is True
    # Pre-faulted at creation, on transparent huge pages (most of them, fragmentation allowing).
    assert _anon_huge_bytes() - before >= 32 << 20


def test_numa_device_on_an_existing_node() -> None:
    node = tiermem.topology()["nodes"][0]["id"]
    m = tiermem.Manager({"dram": "1 MiB", f"numa:{node}": "4 MiB"}, policy="all_slow")
    a = m.array(1000, "int32", fill=-3)
    assert a.device == f"numa:{node}"
    assert int(a.to_numpy().sum()) == -3000
    assert m.devices[1]["kind"] == "numa" and m.devices[1]["real"] == "real"


def test_config_round_trips_through_json() -> None:
    import json

    m = tiermem.Manager(
        {"dram": "1 MiB", "emulated:cxl": "3000000"}, policy="first_touch", copy_threads={("dram", "emulated:cxl"): 1}
    )
    cfg = json.loads(json.dumps(m.config))
    assert cfg["devices"] == [["dram", 1 << 20], ["emulated:cxl", 3_000_000]]
    again = tiermem.Manager.from_config(cfg)
    assert again.config == m.config
    assert again._native.threads_for(0, 1) == 1
    with pytest.raises(tiermem.InvalidArgumentError, match="not a tiermem manager config"):
        tiermem.Manager.from_config({"policy": "lru"})
