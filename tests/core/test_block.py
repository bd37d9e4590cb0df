"""`block` devices: data on an SSD file through direct I/O, staged into memory for guards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiermem


@pytest.mark.parametrize("policy", tiermem.BUILTIN_POLICIES)
def test_block_round_trip_under_every_policy(disk_dir: Path, policy: str, rng: np.random.Generator) -> None:
    m = tiermem.Manager({"dram": "8 MiB", f"block:{disk_dir}/slow.bin": "32 MiB"}, policy=policy)
    ref = rng.integers(0, 2**31, size=(333, 777), dtype="int32")  # not a multiple of 4 KiB
    if policy == "2lm_model":  # models a DRAM cache in front of byte-addressable memory only
        with pytest.raises(tiermem.InvalidArgumentError, match="byte-addressable"):
            m.array(ref.shape, "int32")
        assert m.object_count == 0
        return
    where = "fast" if policy == "all_fast" else "slow"
    a = m.array(ref.shape, "int32", where=where)
    with a.write() as v:
        v[...] = ref
    a.evict()
    np.testing.assert_array_equal(a.to_numpy(), ref)
    m.check()
    assert m.devices[1]["byte_addressable"] is False
    # The block device is reached by direct I/O, not by loads: its own reach, routes and
    # alignment (the copy engine's routes table; the guard stages it into memory).
    fast, slow = (d["traits"] for d in m.devices)
    assert (fast["reach"], fast["host_accessible"], fast["alignment"]) == ("host", True, 64)
    assert (slow["reach"], slow["host_accessible"], slow["alignment"]) == ("block", False, 4096)


def test_all_slow_stages_and_writes_back_only_dirty_data(disk_dir: Path) -> None:
    m = tiermem.Manager({"dram": "8 MiB", f"block:{disk_dir}/s.bin": "32 MiB"}, policy="all_slow")
    blk = f"block:{disk_dir}/s.bin"
    a = m.array(1 << 20, "uint8", fill=4)
    assert a.device == blk
    m.reset_stats()
    with a.read() as v:
        assert int(v[123]) == 4
        assert a.device == "dram"  # staged for the guard
    assert a.device == blk
    s = m.stats()
    assert s[blk]["bytes_read"] == 1 << 20 and s[blk]["bytes_written"] == 0  # clean: elided
    with a.write() as v:
        v[:] = 5
    assert m.stats()[blk]["bytes_written"] == 1 << 20
    assert m.usage()["dram"]["used"] == 0
    np.testing.assert_array_equal(a.to_numpy(), np.full(1 << 20, 5, "uint8"))


def test_guard_fails_clearly_when_block_data_cannot_be_staged(disk_dir: Path) -> None:
    m = tiermem.Manager({"dram": "1 MiB", f"block:{disk_dir}/s.bin": "32 MiB"}, policy="first_touch")
    filler = m.array(900_000, "uint8")  # fills DRAM (first touch never moves it)
    b = m.array(900_000, "uint8", where="slow")
    with pytest.raises(tiermem.GuardError, match="not byte-addressable.*900000"):
        b.read().__enter__()
    assert b.placement["pins"] == 0 and filler.device == "dram"
    m.check()


def test_mapped_device_persists_to_its_file(disk_dir: Path) -> None:
    path = disk_dir / "pm.bin"
    m = tiermem.Manager({"dram": "1 MiB", f"mapped:{path}": "4 MiB"}, policy="all_slow")
    a = m.array(4096, "uint8", fill=0xAB)
    assert a.device == f"mapped:{path}"
    with open(path, "rb") as f:
        assert f.read(4096) == b"\xab" * 4096
