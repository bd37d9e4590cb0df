"""Every bad input the foundation names gives a clear exception naming what and why, and
leaves the manager consistent with no data lost."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tiermem
from tiermem import exceptions as exc


@pytest.mark.parametrize("bad", [0, -5, "0 MiB", "-1", "lots", 2**64, True, 1.5])
def test_bad_capacities(bad: object) -> None:
    with pytest.raises(tiermem.InvalidArgumentError) as e:
        tiermem.Manager({"dram": bad})
    assert isinstance(e.value, ValueError)
    assert "capacity" in str(e.value)


@pytest.mark.parametrize("shape", [0, -3, (4, 0), (), (2, -1), "10", (1.5,)])
def test_bad_shapes(two_tier: tiermem.Manager, shape: object) -> None:
    with pytest.raises(tiermem.InvalidArgumentError):
        two_tier.array(shape)  # type: ignore[arg-type]
    assert two_tier.object_count == 0


def test_overflowing_sizes(two_tier: tiermem.Manager) -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="overflow"):
        two_tier.array((2**40, 2**40), "float64")
    with pytest.raises(tiermem.InvalidArgumentError, match="overflow"):
        tiermem.Manager({"dram": 2**64 - 1})
    with pytest.raises(tiermem.InvalidArgumentError):
        two_tier.array(1, dtype=object)


@pytest.mark.parametrize(
    "spec,match",
    [
        ("hbm", "kinds are dram"),
        ("emulated:quantum", "optane-pmem"),
        ("numa:4096", "NUMA node 4096 does not exist"),
        ("dram:1", "kinds are"),
    ],
)
def test_unknown_devices(spec: str, match: str) -> None:
    with pytest.raises(tiermem.UnknownDeviceError, match=match):
        tiermem.Manager({spec: "1 MiB"})


def test_malformed_specs() -> None:
    for spec in ("numa:x", "block:", "mapped:", "emulated:"):
        with pytest.raises(tiermem.InvalidArgumentError):
            tiermem.Manager({"dram": "1 MiB", spec: "1 MiB"})


def test_missing_and_unwritable_paths(disk_dir: Path) -> None:
    for kind in ("mapped", "block"):
        with pytest.raises(tiermem.DeviceIOError) as e:
            tiermem.Manager({"dram": "1 MiB", f"{kind}:{disk_dir}/no/such/dir/f": "1 MiB"})
        assert isinstance(e.value, OSError) and e.value.errno == 2
        assert "no/such/dir" in str(e.value)
    # A directory is not a writable file, even for root.
    for kind in ("mapped", "block"):
        with pytest.raises(tiermem.DeviceIOError):
            tiermem.Manager({"dram": "1 MiB", f"{kind}:{disk_dir}": "1 MiB"})
    # A path below a regular file cannot be created.
    (disk_dir / "plain").write_text("x")
    for kind in ("mapped", "block"):
        with pytest.raises(tiermem.DeviceIOError) as e:
            tiermem.Manager({"dram": "1 MiB", f"{kind}:{disk_dir}/plain/f": "1 MiB"})
        assert e.value.errno == 20  # ENOTDIR
    # A read-only file (root ignores file modes, so only checked for other users).
    if os.geteuid() != 0:
        ro = disk_dir / "ro.bin"
        ro.write_bytes(b"")
        ro.chmod(0o400)
        for kind in ("mapped", "block"):
            with pytest.raises(tiermem.DeviceIOError) as e:
                tiermem.Manager({"dram": "1 MiB", f"{kind}:{ro}": "1 MiB"})
            assert e.value.errno == 13


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no tmpfs at /dev/shm")
def test_block_device_refuses_tmpfs() -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="tmpfs"):
        tiermem.Manager({"dram": "1 MiB", f"block:/dev/shm/tiermem-{os.getpid()}": "1 MiB"})
    assert not os.path.exists(f"/dev/shm/tiermem-{os.getpid()}")


def test_heap_larger_than_the_machine(disk_dir: Path) -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="larger than"):
        tiermem.Manager({"dram": "64 TiB"})
    with pytest.raises(tiermem.DeviceFullError):
        tiermem.Manager({"dram": "1 MiB", f"block:{disk_dir}/huge": "1000 TiB"})
    with pytest.raises(tiermem.DeviceFullError):
        tiermem.Manager({"dram": "1 MiB", f"mapped:{disk_dir}/huge": "1000 TiB"})


def test_full_device_leaves_manager_consistent() -> None:
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "1 MiB"}, policy="lru")
    a = m.array(900_000, "uint8", fill=1)
    b = m.array(900_000, "uint8", fill=2)  # evicts a to the slow device
    with pytest.raises(tiermem.DeviceFullError, match=r"emulated:cxl.*requested 900000") as e:
        m.array(900_000, "uint8")
    assert isinstance(e.value, MemoryError)
    with pytest.raises(tiermem.DeviceFullError):
        b.evict()  # the slow device holds `a`: nowhere to go
    assert b.in_fast and int(b.to_numpy()[0]) == 2 and int(a.to_numpy()[0]) == 1
    assert m.stats()["dram"]["alloc_failures"] >= 1
    m.check()


def test_all_fast_full_names_numbers() -> None:
    m = tiermem.Manager({"dram": "1 MiB"}, policy="all_fast")
    kept = m.array(600_000, "uint8")
    with pytest.raises(tiermem.DeviceFullError, match=r"'dram' is full: requested 600000 bytes"):
        m.array(600_000, "uint8")
    assert kept.device == "dram"


def test_unknown_policy_and_bad_place(two_tier: tiermem.Manager) -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="built-ins"):
        tiermem.Manager({"dram": "1 MiB"}, policy="fifo")
    with pytest.raises(TypeError, match="alloc"):
        tiermem.Manager({"dram": "1 MiB"}, policy=object())
    with pytest.raises(tiermem.InvalidArgumentError, match="where="):
        two_tier.array(4, where="hbm")
    with pytest.raises(tiermem.InvalidArgumentError, match="out of range"):
        two_tier.array(4, where=9)


def test_first_device_must_be_byte_addressable(disk_dir: Path) -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="byte-addressable"):
        tiermem.Manager({f"block:{disk_dir}/b": "1 MiB", "dram": "1 MiB"})


def test_exception_classes_derive_from_builtins() -> None:
    assert issubclass(exc.DeviceFullError, MemoryError)
    assert issubclass(exc.DeviceIOError, OSError)
    assert issubclass(exc.AllPinnedError, exc.PinnedError)
    assert issubclass(exc.NoSuchObjectError, LookupError)
    assert all(issubclass(getattr(exc, n), exc.TiermemError) for n in exc.__all__)


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np
    import tiermem
    block = sys.argv[1]
    m = tiermem.Manager({"dram": "8 MiB", f"block:{block}": "64 MiB"}, policy="lru")
    keep = m.array(1 << 20, "uint8", where="slow", fill=9)     # lands low in the file
    a = m.array(4 << 20, "uint8", fill=7)
    # From here on the file system "fills up" at 2 MiB: writes past it fail with EFBIG.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
    try:
        a.evict()
    except tiermem.DeviceIOError as e:
        print("ERR", e.errno, "block:" in str(e))
    print("PLACE", a.device, int(a.to_numpy().min()), int(a.to_numpy().max()))
    m.check()
    print("KEEP", int(keep.to_numpy()[0]))
""")


def test_full_disk_while_writing_a_block_region(disk_dir: Path) -> None:
    """A write-back that fails on the disk leaves the object in DRAM with its data."""
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(disk_dir / "slow.bin")], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert "ERR 27 True" in lines  # EFBIG, the device named in the message
    assert "PLACE dram 7 7" in lines
    assert "KEEP 9" in lines


def test_io_error_keeps_errno() -> None:
    e = exc.DeviceIOError(28, "no space")
    assert e.errno == 28 and e.strerror == "no space"
