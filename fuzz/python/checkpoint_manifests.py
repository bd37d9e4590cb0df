"""Fuzz target (atheris, coverage-guided): checkpoint files and sharded manifests.

A single-file checkpoint edited at will (its sections, its manifest, its trailer; a flag
re-seals the manifest's checksum so the fuzzer reaches the checks behind it) either opens
and restores, or is a CheckpointError naming it; never another exception, never code run.
A sharded manifest of any JSON is accepted only when a save could have written it (the
checksum, the types, a folder inside the checkpoint folder), else an InvalidArgumentError.

Run: ``python fuzz/python/checkpoint_manifests.py -max_total_time=600`` (``make fuzz``).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile

import atheris
import numpy as np
import torch  # noqa: F401  (imported before instrumenting: only tiermem is instrumented)

with atheris.instrument_imports(include=["tiermem"]):
    from tiermem import checkpoint
    from tiermem.dist import checkpoint as sharded
    from tiermem.embedding import EmbeddingTable
    from tiermem.exceptions import InvalidArgumentError

# On the disk (block tables refuse memory file systems), removed at exit.
WORK = tempfile.mkdtemp(prefix="tiermem-fuzz-ckpt-", dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
atexit.register(shutil.rmtree, WORK, True)
BASE = os.path.join(WORK, "base.ckpt")
TARGET = os.path.join(WORK, "t.ckpt")


def _base() -> bytes:
    t = EmbeddingTable(40, 4)
    t.load(np.arange(160, dtype=np.float32).reshape(40, 4))
    t.update(np.array([1, 2]), np.array([0, 1]), np.ones((2, 4), np.float32), optimizer="adagrad", lr=0.1)
    checkpoint.save(BASE, {"step": 3, "loss": [0.5, 0.25]}, {"emb": t})
    with open(BASE, "rb") as f:
        return f.read()


BASE_BYTES = _base()
TRAILER = struct.Struct("<Q32s8s")
GOOD_MANIFEST = {
    "format": sharded.FORMAT,
    "step": 4,
    "world": 2,
    "plan": {"rows": [10], "dim": 4},
    "config": {},
    "folder": "step00000004",
    "files": ["rank0.ckpt", "rank1.ckpt"],
}


def _reseal(b: bytearray) -> None:
    if len(b) < TRAILER.size:
        return
    n, _, magic = TRAILER.unpack_from(b, len(b) - TRAILER.size)
    if n > len(b) - TRAILER.size:
        return
    start = len(b) - TRAILER.size - n
    TRAILER.pack_into(b, len(b) - TRAILER.size, n, hashlib.sha256(bytes(b[start : start + n])).digest(), magic)


def one_checkpoint(fdp: atheris.FuzzedDataProvider) -> None:
    b = bytearray(BASE_BYTES)
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        if fdp.ConsumeBool() and b:
            b[fdp.ConsumeIntInRange(0, len(b) - 1)] = fdp.ConsumeInt(1) & 0xFF
        else:
            del b[fdp.ConsumeIntInRange(0, len(b)) :]
    if fdp.ConsumeBool():
        _reseal(b)
    with open(TARGET, "wb") as f:
        f.write(b)
    try:
        c = checkpoint.Checkpoint(TARGET)
        c.state()
        for name in c.tables():
            rows, width = c.table_shape(name)
            if 0 < rows <= 10_000 and 0 < width <= 64:
                c.restore_table(name, EmbeddingTable(rows, width))
    except checkpoint.CheckpointError as e:
        assert TARGET in str(e), e


def one_manifest(fdp: atheris.FuzzedDataProvider) -> None:
    if fdp.ConsumeBool():
        text = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 400))
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            return
    else:
        doc = dict(GOOD_MANIFEST)
        key = fdp.PickValueInList(sorted(GOOD_MANIFEST))
        doc[key] = fdp.PickValueInList([None, 0, -1, 4, 2**63, "x", "../etc", "step00000003", [], {}, ["rank0.ckpt"], True, 1.5])
        if fdp.ConsumeBool():
            body = {k: v for k, v in doc.items() if k != "sha256"}
            doc["sha256"] = sharded._digest(body)
    try:
        sharded._check_manifest(doc, WORK)
    except InvalidArgumentError:
        return
    # Accepted: it must be a manifest a save writes.
    assert doc["folder"] == f"step{doc['step']:08d}" and len(doc["files"]) == doc["world"]
    assert all("/" not in f for f in doc["files"]) and "/" not in doc["folder"]


def test_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        one_checkpoint(fdp)
    else:
        one_manifest(fdp)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
