"""The block table file from Python: rows round-trip, the file is re-attached by a new owner,
damage is a CorruptFileError naming table, block and file, and `tiermem bench blockio` keeps
its JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem import _tiermem


def test_rows_round_trip_and_reattach(disk_dir: Path) -> None:
    path = disk_dir / "t.tbl"
    f = _tiermem.BlockFile.create(str(path), "emb", (500, 16, "float32"), False, 4)
    assert f.stride == 64 and f.read_engine in ("io_uring", "threads")
    rows = np.array([3, 499, 0, 3], np.uint64)
    src = np.arange(4 * 64, dtype=np.uint8)
    f.write_rows(rows, src)
    f.sync()
    del f
    g = _tiermem.BlockFile.open(str(path), "emb", 4)
    out = np.zeros(2 * 64, np.uint8)
    g.read_rows(np.array([3, 499], np.uint64), out)
    assert (out[:64] == src[3 * 64 :]).all() and (out[64:] == src[64:128]).all()
    with pytest.raises(tiermem.InvalidArgumentError, match="locked"):
        _tiermem.BlockFile.open(str(path), "emb", 4)
    with pytest.raises(tiermem.IndexOutOfRangeError):
        g.read_rows(np.array([500], np.uint64), out[:64])


def test_damage_is_a_corrupt_file_error(disk_dir: Path) -> None:
    path = disk_dir / "t.tbl"
    del_me = _tiermem.BlockFile.create(str(path), "emb7", (100, 16, "float32"), False, 2)
    del del_me
    with open(path, "r+b") as fh:  # a bit of the layout flipped
        fh.seek(4096 + 5)
        b = fh.read(1)
        fh.seek(4096 + 5)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(tiermem.CorruptFileError, match="emb7.*layout checksum") as e:
        _tiermem.BlockFile.open(str(path), "emb7", 2)
    assert e.value.path == str(path) and isinstance(e.value, OSError)


def test_bench_blockio_json(tmp_path: Path, disk_dir: Path) -> None:
    out = tmp_path / "b.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiermem.cli.main",
            "bench",
            "blockio",
            "--quick",
            "--size",
            "16 MiB",
            "--dir",
            str(disk_dir),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["device"].startswith("block") and res["cases"]
    for c in res["cases"]:
        assert c["blocks_per_s"] > 0 and c["device_reads_per_s"] > 0
        assert c["ratio_to_device"] == pytest.approx(c["blocks_per_s"] / c["device_reads_per_s"])
    assert not any(disk_dir.glob("tiermem-blockio-*")), "scratch files left behind"
