"""Memory spaces mapped to NUMA nodes (H2M's ``hbw``, ``low_lat``, ``large_cap``) on the sysfs
fixtures of the H2M slides' machines and a CXL expander: the mappings, the per-node orderings
by distance exactly as the slides print them, the overrides, and bad input."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tiermem import MEMORY_SPACE_ENV, MEMORY_SPACES, memory_spaces
from tiermem.cli.main import main
from tiermem.exceptions import InvalidArgumentError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"

# The Ice Lake + Optane log of the slides ("H2M: Mapping to Memory Kinds / 3"), verbatim
# after the timestamps.
ICELAKE_LOG = """
Mapping h2m_atv_mem_space_hbw -> DRAM
Mapping h2m_atv_mem_space_low_lat -> DRAM
Mapping h2m_atv_mem_space_large_cap -> NVM
Source node 0 - Sorted by distances: (N: 0, D: 10) (N: 2, D: 17) (N: 1, D: 20) (N: 3, D: 28)
Resulting view from numa node 0 and memspace h2m_atv_mem_space_hbw: 0 2
Resulting view from numa node 0 and memspace h2m_atv_mem_space_low_lat: 0 2
Resulting view from numa node 0 and memspace h2m_atv_mem_space_large_cap: 1 3
Source node 1 - Sorted by distances: (N: 1, D: 10) (N: 3, D: 17) (N: 0, D: 20) (N: 2, D: 28)
Resulting view from numa node 1 and memspace h2m_atv_mem_space_hbw: 0 2
Resulting view from numa node 1 and memspace h2m_atv_mem_space_low_lat: 0 2
Resulting view from numa node 1 and memspace h2m_atv_mem_space_large_cap: 1 3
Source node 2 - Sorted by distances: (N: 2, D: 10) (N: 0, D: 17) (N: 1, D: 28) (N: 3, D: 28)
Resulting view from numa node 2 and memspace h2m_atv_mem_space_hbw: 2 0
Resulting view from numa node 2 and memspace h2m_atv_mem_space_low_lat: 2 0
Resulting view from numa node 2 and memspace h2m_atv_mem_space_large_cap: 1 3
Source node 3 - Sorted by distances: (N: 3, D: 10) (N: 1, D: 17) (N: 0, D: 28) (N: 2, D: 28)
Resulting view from numa node 3 and memspace h2m_atv_mem_space_hbw: 0 2
Resulting view from numa node 3 and memspace h2m_atv_mem_space_low_lat: 0 2
Resulting view from numa node 3 and memspace h2m_atv_mem_space_large_cap: 3 1
"""

# The same machine's DAX (NVM) and DRAM nodes, from the log's node list.
ICELAKE_KINDS = {"DRAM": [0, 2], "NVM": [1, 3]}


def spaces_of(name: str, env: dict[str, str] | None = None) -> dict:
    return memory_spaces(sysfs=str(FIXTURES / name), env=env or {})


def nodes(sp: dict) -> dict[str, list[int]]:
    return {s["space"]: s["nodes"] for s in sp["spaces"]}


def views(sp: dict) -> dict[int, dict[str, list[int]]]:
    return {v["node"]: dict((name, ns) for name, ns in v["spaces"]) for v in sp["views"]}


def test_the_icelake_log_is_reproduced_line_by_line() -> None:
    sp = spaces_of("icelake-optane")
    assert not sp["notes"]
    got = nodes(sp)
    for space, kind in re.findall(r"Mapping h2m_atv_mem_space_(\w+) -> (\w+)", ICELAKE_LOG):
        assert got[space] == ICELAKE_KINDS[kind], space
    by = {v["node"]: [tuple(x) for x in v["by_distance"]] for v in sp["views"]}
    for src, pairs in re.findall(r"Source node (\d+) - Sorted by distances: (.*)", ICELAKE_LOG):
        want = [(int(n), int(d)) for n, d in re.findall(r"\(N: (\d+), D: (\d+)\)", pairs)]
        assert by[int(src)] == want, src
    v = views(sp)
    lines = re.findall(r"view from numa node (\d+) and memspace h2m_atv_mem_space_(\w+): ([\d ]+)", ICELAKE_LOG)
    assert len(lines) == 12
    for src, space, order in lines:
        assert v[int(src)][space] == [int(x) for x in order.split()], (src, space)
    assert [s["source"] for s in sp["spaces"]] == ["memory_tier", "memory_tier", "capacity"]


def test_the_slides_overrides() -> None:
    # "H2M_NODES_HBW=0,1 H2M_NODES_LOW_LAT=2,3 H2M_NODES_LARGE_CAP=1,3" -> "0,1", "2,3", "1,3"
    env = dict(zip(MEMORY_SPACE_ENV.values(), ["0,1", "2,3", "1,3"], strict=True))
    sp = spaces_of("icelake-optane", env)
    assert nodes(sp) == {"hbw": [0, 1], "low_lat": [2, 3], "large_cap": [1, 3]}
    assert all(s["source"] == "environment" for s in sp["spaces"])
    assert views(sp)[2]["low_lat"] == [2, 3] and views(sp)[3]["low_lat"] == [3, 2]


def test_cascade_lake_follows_its_numactl_distances_and_hmat() -> None:
    sp = spaces_of("cascadelake-optane")
    assert nodes(sp) == {"hbw": [0, 1], "low_lat": [0, 1], "large_cap": [2, 3]}
    assert [s["source"] for s in sp["spaces"]] == ["hmat", "hmat", "capacity"]
    matrix = [[10, 21, 17, 28], [21, 10, 28, 17], [17, 28, 10, 28], [28, 17, 28, 10]]  # the slides' numactl -H
    for v in sp["views"]:
        row = matrix[v["node"]]
        assert [tuple(x) for x in v["by_distance"]] == sorted(((n, row[n]) for n in range(4)), key=lambda x: (x[1], x[0]))
    assert views(sp)[1] == {"hbw": [1, 0], "low_lat": [1, 0], "large_cap": [3, 2]}
    assert views(sp)[2] == {"hbw": [0, 1], "low_lat": [0, 1], "large_cap": [2, 3]}


def test_knl_mcdram_is_hbw_but_not_low_lat() -> None:
    sp = spaces_of("knl-snc4-flat")
    assert nodes(sp) == {"hbw": [4, 5, 6, 7], "low_lat": [0, 1, 2, 3], "large_cap": [0, 1, 2, 3]}
    v = views(sp)
    assert v[1]["hbw"] == [5, 4, 6, 7]  # its own quadrant's MCDRAM (31) before the others (41)
    assert v[6]["low_lat"] == [2, 0, 1, 3]  # an MCDRAM node's nearest DDR is its quadrant's
    assert len(sp["views"]) == 8


def test_a_cxl_expander_is_large_cap_and_last_by_distance() -> None:
    sp = spaces_of("cxl-expander")
    assert nodes(sp) == {"hbw": [0, 1], "low_lat": [0, 1], "large_cap": [2]}
    assert sp["spaces"][0]["source"] == "memory_tier" and "memory_tier22" in sp["spaces"][0]["why"]
    assert [tuple(x) for x in sp["views"][1]["by_distance"]] == [(1, 10), (0, 21), (2, 28)]
    assert views(sp)[1]["hbw"] == [1, 0]


def test_this_machine_maps_every_space() -> None:
    sp = memory_spaces(env={})
    assert [s["space"] for s in sp["spaces"]] == list(MEMORY_SPACES)
    assert all(s["nodes"] for s in sp["spaces"])


@pytest.mark.parametrize(
    "value, message",
    [("x", "is not a node list"), ("2-1", "is not a node list"), (" ", "is not a node list"), ("9", "names node 9")],
)
def test_bad_overrides_are_refused_by_name(value: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"TIERMEM_NODES_LOW_LAT=.*{message}"):
        spaces_of("cxl-expander", {"TIERMEM_NODES_LOW_LAT": value})


def test_missing_sysfs_files_are_noted_or_refused(tmp_path: Path) -> None:
    root = tmp_path / "cxl"
    shutil.copytree(FIXTURES / "cxl-expander", root)
    (root / "devices/system/node/node1/distance").unlink()
    (root / "devices/system/node/node2/meminfo").unlink()
    sp = memory_spaces(sysfs=str(root), env={})
    assert nodes(sp)["large_cap"] == [0, 1]  # the expander's size is unknown: in no space
    assert any("node 2: no memory" in n for n in sp["notes"])
    assert any("node 1: its distance row has 0 entries" in n for n in sp["notes"])
    assert [tuple(x) for x in sp["views"][1]["by_distance"]] == [(0, None), (1, None)]
    with pytest.raises(InvalidArgumentError, match="no NUMA node with memory"):
        memory_spaces(sysfs=str(tmp_path / "nothing"), env={})


def test_info_shows_a_fixtures_spaces(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--sysfs", str(FIXTURES / "knl-snc4-flat")]) == 0
    out = capsys.readouterr().out
    assert "hbw        -> nodes 4,5,6,7" in out and "from hmat: HMAT read bandwidth" in out
    assert "node 4: 4(10) 0(31)" in out
