"""Devices named by memory space (`hbw`, `low_lat`, `large_cap`: the space's node nearest
the calling thread; `interleave:SPACE`: all of its nodes) and interleaved over NUMA nodes
(`interleave:0,2`), on this machine and on the sysfs fixtures (`TIERMEM_SYSFS`); placement
by traits over them matches what the C H2M interface does on the same fixture
(`tests/capi/test_h2m.py`: A, B and C on node 0, A moved to node 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tiermem
from tiermem.exceptions import InvalidArgumentError, UnknownDeviceError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"


def _names(m: tiermem.Manager) -> list[str]:
    return [d["name"] for d in m.devices]


def test_space_names_resolve_to_this_machines_nodes() -> None:
    node = tiermem.memory_spaces()["spaces"][0]["nodes"][0]
    m = tiermem.Manager({"hbw": "8 MiB", "interleave:large_cap": "32 MiB"}, policy="first_touch")
    assert _names(m)[0] == f"hbw (numa:{node})"
    assert _names(m)[1].startswith("interleave:large_cap (interleave:")
    x = m.alloc(1000, "float64", {"required": "large_cap", "fallback": "error"})
    assert x.device == _names(m)[1]
    with x.write() as a:
        a[:] = 3.0
    assert float(x.to_numpy().sum()) == 3000.0


def test_interleaved_devices_and_bad_lists() -> None:
    m = tiermem.Manager({"dram": "8 MiB", "interleave:0": "8 MiB"})
    assert [d["kind"] for d in m.devices] == ["dram", "interleave"]
    with pytest.raises(UnknownDeviceError, match="NUMA node 63 does not exist"):
        tiermem.Manager({"interleave:0,63": "8 MiB"})
    with pytest.raises(InvalidArgumentError, match="is not a NUMA node list"):
        tiermem.Manager({"interleave:zero": "8 MiB"})


def test_traits_over_space_devices_place_as_h2m_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_SYSFS", str(FIXTURES / "cascadelake-optane"))
    monkeypatch.setenv("TIERMEM_NODE_DEVICES", "2,3=emulated:optane-pmem")
    m = tiermem.Manager({"hbw": "16 MiB", "large_cap": "64 MiB"}, policy="first_touch")
    assert _names(m) == ["hbw (dram)", "large_cap (emulated:optane-pmem)"]
    a, b, c = m.commit(
        [
            (1024, "float64", {"preferred": "hbw", "priority": 1}),
            (1024, "float64", {"preferred": "low_lat", "priority": 15}),
            (1024, "float64", {"preferred": "hbw", "priority": 5}),
        ],
        strategy="fifo",
    )
    assert [x.device for x in (a, b, c)] == ["hbw (dram)"] * 3
    m.update_traits(a, {"preferred": "large_cap"})
    m.apply_migration()
    assert [x.device for x in (a, b, c)] == ["large_cap (emulated:optane-pmem)", "hbw (dram)", "hbw (dram)"]


def test_a_space_without_nodes_here_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_SYSFS", str(FIXTURES / "cascadelake-optane"))
    monkeypatch.setenv("TIERMEM_NODES_HBW", "7")
    with pytest.raises(InvalidArgumentError, match="TIERMEM_NODES_HBW"):
        tiermem.Manager({"hbw": "8 MiB"})
