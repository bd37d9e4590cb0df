"""Issue 12, items 9-10: container memory limits, and device files that are the user's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tiermem


def _make_memory_cgroup(limit: int) -> Path | None:
    """A fresh memory cgroup (v1 or v2) limited to `limit` bytes, or None if not allowed."""
    name = f"tiermem-test-{os.getpid()}-{os.urandom(3).hex()}"
    for base, limit_file in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"), (Path("/sys/fs/cgroup"), "memory.max")):
        if not (base / "cgroup.procs").exists() or not (base / limit_file).exists() and base.name == "memory":
            continue
        d = base / name
        try:
            d.mkdir()
            (d / limit_file).write_text(str(limit))
            return d
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
            try:
                d.rmdir()
            except OSError:
                pass
    return None


def test_item9_capacities_are_checked_against_the_cgroup_limit_and_summed() -> None:
    cg = _make_memory_cgroup(256 << 20)
    if cg is None:
        pytest.skip("cannot create a memory cgroup here (needs root and a writable cgroup fs)")
    code = textwrap.dedent(f"""
        import os, tiermem
        open({str(cg / "cgroup.procs")!r}, 'w').write(str(os.getpid()))
        for spec in ({{'dram': '512 MiB'}}, {{'dram': '150 MiB', 'emulated:cxl': '150 MiB'}}):
            try:
                tiermem.Manager(spec)
                print('created', spec)
            except tiermem.InvalidArgumentError as e:
                print('refused:', e)
        m = tiermem.Manager({{'dram': '64 MiB', 'emulated:cxl': '64 MiB'}})
        a = m.array(32 << 20, 'uint8', fill=1)
        print('fits', int(a.to_numpy()[-1]))
    """)
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])  # -9 would be the OOM killer
    assert p.stdout.count("refused:") == 2 and "created" not in p.stdout, p.stdout
    assert "memory limit of cgroup" in p.stdout and "together" in p.stdout
    assert "fits 1" in p.stdout


def test_item10_an_existing_file_is_refused_and_left_intact(disk_dir: Path) -> None:
    for kind in ("block", "mapped"):
        f = disk_dir / f"notes-{kind}.txt"
        f.write_text("precious\n")
        with pytest.raises(tiermem.InvalidArgumentError, match="existing file of 9 bytes.*overwrite"):
            tiermem.Manager({"dram": "1 MiB", f"{kind}:{f}": "4 MiB"})
        assert f.read_text() == "precious\n"
        m = tiermem.Manager({"dram": "1 MiB", f"{kind}:{f}?overwrite": "4 MiB"})
        a = m.array(1 << 20, "uint8", where=1, fill=3)
        assert int(a.to_numpy().sum()) == 3 << 20
        assert m.device_names[1] == f"{kind}:{f}"
        del a, m
        assert f.exists()  # the user's file: used as asked, not removed


def test_item10_two_managers_cannot_share_a_device_file(disk_dir: Path) -> None:
    for kind in ("block", "mapped"):
        f = disk_dir / f"tier-{kind}.bin"
        m1 = tiermem.Manager({"dram": "1 MiB", f"{kind}:{f}": "4 MiB"})
        assert f.exists()
        with pytest.raises(tiermem.InvalidArgumentError, match="in use by another tiermem manager"):
            tiermem.Manager({"dram": "1 MiB", f"{kind}:{f}": "4 MiB"})
        with pytest.raises(tiermem.InvalidArgumentError, match="in use by another tiermem manager"):
            tiermem.Manager({"dram": "1 MiB", f"{kind}:{f}?overwrite": "4 MiB"})
        a = m1.array(1 << 20, "uint8", where=1, fill=9)
        assert int(a.to_numpy()[0]) == 9
        del a, m1
        assert not f.exists()  # tiermem created it, so tiermem removed it
        tiermem.Manager({"dram": "1 MiB", f"{kind}:{f}": "4 MiB"})  # free again


def test_item10_overwrite_is_only_for_files() -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="only block: and mapped:"):
        tiermem.Manager({"dram?overwrite": "1 MiB"})


def test_item10_block_device_nodes_are_used_or_refused_for_the_right_reason(disk_dir: Path) -> None:
    if shutil.which("losetup") is None or os.geteuid() != 0:
        pytest.skip("needs losetup and root")
    backing = disk_dir / "loop.img"
    with open(backing, "wb") as f:
        f.truncate(8 << 20)
    p = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot attach a loop device: {p.stderr.strip()}")
    dev = p.stdout.strip()
    try:
        with pytest.raises(tiermem.InvalidArgumentError, match="block device.*destroyed.*overwrite"):
            tiermem.Manager({"dram": "1 MiB", f"block:{dev}": "4 MiB"})
        with pytest.raises(tiermem.InvalidArgumentError, match="holds 8388608 bytes, less than"):
            tiermem.Manager({"dram": "1 MiB", f"block:{dev}?overwrite": "16 MiB"})
        m = tiermem.Manager({"dram": "1 MiB", f"block:{dev}?overwrite": "4 MiB"})
        a = m.array(1 << 20, "uint8", where=1, fill=5)
        np.testing.assert_array_equal(a.to_numpy(), np.full(1 << 20, 5, np.uint8))
        del a, m
        assert Path(dev).exists()  # a device node is never removed
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
