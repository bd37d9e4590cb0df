"""Names planted beside a table are never followed or written through; checkpoints of block
tables cross file systems, are read by many processes at once, keep each table's snapshot
apart, never land on a live table, remove only what they wrote, and refuse a damaged
manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem import checkpoint  # noqa: E402
from tiermem.embedding import EmbeddingTable  # noqa: E402
from tiermem.exceptions import InvalidArgumentError, TiermemError  # noqa: E402


def _table(path: Path, rows: int = 400, width: int = 8, fill: float | None = None) -> EmbeddingTable:
    t = EmbeddingTable(rows, width, device=f"block:{path}", cache=0.5)
    if fill is not None:
        t.load(np.full((rows, width), fill, np.float32))
    return t


# Links --------------------------------------------------------------------------------------


def test_a_symlink_planted_at_the_relayout_name_is_never_written_through(disk_dir: Path) -> None:
    """Before: relayout opened PATH.relayout with overwrite, following the link, and renamed
    the link over the table."""
    victim = disk_dir / "victim"
    victim.write_bytes(b"the user's data" * 1000)
    path = disk_dir / "t.tbl"
    t = _table(path, fill=1.0)
    os.symlink(victim, str(path) + ".relayout")
    t.relayout(np.random.default_rng(0).permutation(400))
    assert victim.read_bytes() == b"the user's data" * 1000
    assert path.is_file() and not path.is_symlink()
    assert not os.path.lexists(str(path) + ".relayout")
    np.testing.assert_array_equal(t.to_numpy(), np.full((400, 8), 1.0, np.float32))


def test_table_files_behind_links_are_refused(disk_dir: Path) -> None:
    path = disk_dir / "t.tbl"
    del_me = _table(path, fill=2.0)
    del del_me
    os.link(path, disk_dir / "other-name")
    with pytest.raises(InvalidArgumentError, match="hard links"):
        _table(path)
    os.unlink(disk_dir / "other-name")
    os.symlink(path, disk_dir / "link.tbl")
    with pytest.raises(InvalidArgumentError, match="symbolic link"):
        _table(disk_dir / "link.tbl")
    # A device file's name planted as a link to a user's file: refused, the file untouched.
    (disk_dir / "mine").write_bytes(b"x" * 4096)
    os.symlink(disk_dir / "mine", disk_dir / "dev.bin")
    with pytest.raises(InvalidArgumentError, match="symbolic link"):
        tiermem.Manager({"dram": "1 MiB", f"block:{disk_dir / 'dev.bin'}?overwrite": "4 MiB"})
    assert (disk_dir / "mine").read_bytes() == b"x" * 4096


def test_a_stale_relayout_file_is_removed_when_the_table_opens(disk_dir: Path) -> None:
    path = disk_dir / "t.tbl"
    code = f"""
    import numpy as np, os, signal
    from tiermem.embedding import EmbeddingTable
    t = EmbeddingTable(100000, 64, device="block:{path}", cache=0.05)
    def progress(done, total):
        if done > 0:
            os.kill(os.getpid(), signal.SIGKILL)   # killed midway through a relayout
    t.relayout(np.random.default_rng(0).permutation(100000), budget=1 << 20, on_progress=progress)
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    aside = Path(str(path) + ".relayout")
    assert aside.exists() and aside.stat().st_size > 1 << 20  # full size, left by the kill
    t = EmbeddingTable(100000, 64, device=f"block:{path}", cache=0.05)
    assert not aside.exists()
    assert t.block_info is not None and t.block_info["generation"] == 1


# Checkpoints --------------------------------------------------------------------------------


def test_a_snapshot_crosses_file_systems(disk_dir: Path) -> None:
    """Before: EXDEV from copy_file_range, and --checkpoint stopped at its first save."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(disk_dir).st_dev:
        pytest.skip("no second file system here")
    t = _table(disk_dir / "t.tbl", fill=3.0)
    dst = shm / f"tiermem-snap-{os.getpid()}.tmb"
    try:
        info = t.snapshot(str(dst))
        assert info["how"] in ("stream", "copy") and info["bytes"] == dst.stat().st_size
        assert dst.read_bytes() == (disk_dir / "t.tbl").read_bytes()  # synced first: the same bytes
    finally:
        dst.unlink(missing_ok=True)


def test_snapshots_and_checkpoints_never_land_on_a_live_table_or_a_users_file(disk_dir: Path) -> None:
    a = _table(disk_dir / "a.tbl", fill=1.0)
    b = _table(disk_dir / "b.tbl", fill=2.0)
    with pytest.raises(InvalidArgumentError, match="live table"):
        a.snapshot(str(disk_dir / "b.tbl"))
    with pytest.raises(InvalidArgumentError, match="live table"):
        checkpoint.save(str(disk_dir / "b.tbl"), {"x": 1}, {"a": a})
    (disk_dir / "user.bin").write_bytes(b"keep")
    with pytest.raises(InvalidArgumentError, match="did not make"):
        a.snapshot(str(disk_dir / "user.bin"))
    assert (disk_dir / "user.bin").read_bytes() == b"keep"
    np.testing.assert_array_equal(b.to_numpy(), np.full((400, 8), 2.0, np.float32))
    a.snapshot(str(disk_dir / "snap.tmb"))
    a.snapshot(str(disk_dir / "snap.tmb"))  # an earlier snapshot of ours is replaced


def test_names_differing_in_punctuation_or_script_keep_their_own_snapshots(disk_dir: Path) -> None:
    names = ["user/item", "user_item", "表1", "桌1", "../escape", "."]
    tables = {n: _table(disk_dir / f"t{k}.tbl", rows=50, fill=float(k)) for k, n in enumerate(names)}
    ck = str(disk_dir / "ck")
    checkpoint.save(ck, {"step": 1}, tables)
    files = os.listdir(checkpoint.snapshot_folder(ck))
    assert len(set(files)) == len(names) and all("/" not in f and not f.startswith(".") for f in files)
    c = checkpoint.Checkpoint(ck)
    for k, n in enumerate(names):
        into = EmbeddingTable(50, 8)
        c.restore_table(n, into)
        np.testing.assert_array_equal(into.to_numpy(), np.full((50, 8), float(k), np.float32))


def test_two_processes_restore_one_block_snapshot_at_once(disk_dir: Path) -> None:
    """Before: restoring took the snapshot's exclusive lock, so the second process failed."""
    t = _table(disk_dir / "t.tbl", rows=30000, width=32, fill=5.0)
    ck = str(disk_dir / "ck")
    checkpoint.save(ck, {"step": 1}, {"t": t})
    del t
    code = f"""
    import numpy as np, sys
    from tiermem import checkpoint
    from tiermem.embedding import EmbeddingTable
    c = checkpoint.Checkpoint({ck!r})
    for _ in range(3):
        into = EmbeddingTable(30000, 32)
        c.restore_table("t", into)
        assert float(into.to_numpy().min()) == 5.0
    print("ok")
    """
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 and o.strip() == "ok" for p, (o, _) in zip(procs, outs)), outs


def test_a_snapshot_refuses_writes(disk_dir: Path) -> None:
    from tiermem import _tiermem

    t = _table(disk_dir / "t.tbl", fill=1.0)
    t.snapshot(str(disk_dir / "s.tmb"))
    f = _tiermem.BlockFile.open(str(disk_dir / "s.tmb"), "s", 4, read_only=True)
    with pytest.raises(TiermemError, match="read-only"):
        f.write_rows(np.arange(1, dtype=np.uint64), np.zeros(f.stride, np.uint8))


# Sharded checkpoints ------------------------------------------------------------------------


def _sharded(tmp_path: Path, steps: int, resume: bool = False) -> dict:
    """Two ranks train to ``steps`` with a checkpoint in ``tmp_path/ck``."""
    from tiermem.dist import DistOptions, launch
    from tiermem.dlrm.model import DLRMConfig

    cfg = DLRMConfig(rows=(300, 57, 1000, 8), dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1), bag=3, batch_size=32)
    return launch(DistOptions(cfg, steps=steps, checkpoint=str(tmp_path / "ck"), resume=resume), 2)


def test_a_sharded_save_removes_only_what_it_wrote_and_refuses_a_damaged_manifest(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "step-notes").mkdir()  # the user's own folders beside the checkpoint
    (ck / "steps_plot.png").write_bytes(b"png")
    (ck / "step00000001").mkdir()  # a folder of the right name that no manifest recorded
    (ck / "step00000001" / "mine.txt").write_text("mine")
    _sharded(tmp_path, 2)
    _sharded(tmp_path, 4, resume=True)
    left = sorted(os.listdir(ck))
    assert left == ["manifest.json", "step-notes", "step00000001", "step00000004", "steps_plot.png"], left
    assert (ck / "step00000001" / "mine.txt").read_text() == "mine"
    m = json.loads((ck / "manifest.json").read_text())
    m["step"] = 3  # still valid JSON, the wrong step
    (ck / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(mp.ProcessRaisedException, match="checksum"):
        _sharded(tmp_path, 6, resume=True)


def _reseal(path: Path, edit) -> None:
    """Edit a checkpoint's manifest and re-seal its checksum (as a crafted file would)."""
    import hashlib
    import struct

    trailer = struct.Struct("<Q32s8s")
    b = path.read_bytes()
    n, _, magic = trailer.unpack_from(b, len(b) - trailer.size)
    start = len(b) - trailer.size - n
    m = json.loads(b[start : start + n])
    edit(m)
    raw = json.dumps(m).encode()
    path.write_bytes(b[:start] + raw + trailer.pack(len(raw), hashlib.sha256(raw).digest(), magic))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["sections"][0].pop("offset"), "lacks a field"),
        (lambda m: m["sections"][1].update(file="../../escape.tmb"), "lacks a field"),
        (lambda m: m["sections"][1].update(rows="400"), "lacks a field"),
        (lambda m: m["sections"][2].update(kind="nadam"), "lacks a field"),
        (lambda m: m["sections"][2].update(values=3), "lacks a field"),
        (lambda m: m["sections"].append(m["sections"][0]), "listed twice"),
        (lambda m: m.update(sections="all"), "no list of sections"),
    ],
)
def test_a_resealed_manifest_of_the_wrong_shape_is_refused_by_name(edit, message: str, disk_dir: Path) -> None:
    """Found by the checkpoint fuzz target: a manifest whose checksum matches but whose
    sections lack fields (KeyError), name a snapshot outside its folder, or an unknown
    optimizer, once got past the checks."""
    t = _table(disk_dir / "t.tbl", fill=1.0)
    t.update(np.array([1]), np.array([0]), np.ones((1, 8), np.float32), optimizer="adagrad", lr=0.1)
    ck = disk_dir / "ck"
    checkpoint.save(str(ck), {"step": 1}, {"t": t})
    _reseal(ck, edit)
    with pytest.raises(checkpoint.CheckpointError, match=message):
        checkpoint.Checkpoint(str(ck))


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: the table file's checksum, for crafting headers."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _reseal_header(head: bytes) -> bytes:
    """The header block with its checksum (bytes 68..72, over 0..68) made to match."""
    import struct

    b = bytearray(head)
    struct.pack_into("<I", b, 68, _crc32c(bytes(b[:68])))
    return bytes(b)


def test_a_sparse_file_claiming_2_31_rows_allocates_nothing_for_them(disk_dir: Path) -> None:
    """Before: a 4 KiB header claiming 2^31 rows over a sparse file took 8 GiB (OOM under a
    1 GiB limit). After: the caller's shape is checked first, and without one the layout is
    read in chunks and refused at its first repeated position."""
    from tiermem import _tiermem

    small = disk_dir / "small.tbl"
    _tiermem.BlockFile.create(str(small), "s", (10, 1, "float32"), False, 2)
    head = bytearray(small.read_bytes()[:4096])
    rows = 1 << 31
    geo = _tiermem.block_geometry(1)
    rpb = geo["rows_per_block"]
    data_blocks = -(-rows // rpb)
    layout_blocks = rows * 4 // 4096
    import struct

    struct.pack_into("<Q", head, 12, rows)
    struct.pack_into("<QQ", head, 40, data_blocks, layout_blocks)
    code = f"""
    import resource, struct, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from tiermem import _tiermem
    from tiermem.embedding import EmbeddingTable
    from tiermem.exceptions import TiermemError
    for how in ("shape", "none"):
        try:
            if how == "shape":
                EmbeddingTable(1000, 1, device="block:{disk_dir / "sparse.tbl"}", cache=0.5)
            else:
                _tiermem.BlockFile.open("{disk_dir / "sparse.tbl"}", "t", 2)
            print(how, "opened?!")
        except TiermemError as e:
            print(how, type(e).__name__, str(e)[:160])
    """
    sparse = disk_dir / "sparse.tbl"
    with open(sparse, "wb") as f:
        f.write(_reseal_header(bytes(head)))
        f.truncate((1 + layout_blocks + data_blocks) * 4096)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("shape InvalidArgumentError") and "2147483648 rows" in lines[0], r.stdout
    assert lines[1].startswith("none CorruptFileError") and "layout" in lines[1], r.stdout
    assert os.stat(sparse).st_blocks * 512 < 1 << 20  # it stayed sparse: nothing was written


def test_manifests_nested_too_deeply_are_named_not_a_recursion_error(disk_dir: Path) -> None:
    from tiermem.dist import checkpoint as sharded

    (disk_dir / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidArgumentError, match="nested too deeply"):
        sharded._manifest(str(disk_dir), {})
    assert sharded._previous(str(disk_dir)) is None
