"""Checkpoint files: one file, written aside and renamed (:mod:`tiermem._files`), every
section checksummed (SHA-256) and checked before anything is restored, nothing unpickled.

Layout: sections back to back, then a JSON manifest, then a trailer of the manifest's length
(8 bytes, little-endian), its SHA-256 (32 bytes) and the magic ``TMCKPT02`` (8 bytes).
Sections are ``state`` (``torch.save`` of tensors and plain data, read back with
``torch.load(weights_only=True)``, which executes no code) and, per tiered table, its rows
(``float32``, row-major) and optimizer state (``float32``), streamed in chunks between the
table's tier and the file: a table larger than DRAM is never copied into DRAM whole.

A block table (``device="block:PATH"``) is not streamed: its file is already on the disk.
The checkpoint records the file instead. The table is synced and its file snapshotted by the
kernel (:meth:`~tiermem.embedding.EmbeddingTable.snapshot`: a reflink where the filesystem
offers one, else an in-kernel copy) into ``CHECKPOINT.tables/NAME-TOKEN.tmb``, and a manifest
section ``block:NAME`` holds the snapshot's name, layout generation, size and shape. Each save
uses a fresh token and, once the checkpoint is renamed into place, removes the snapshots it no
longer names: a kill at any moment leaves the previous checkpoint with its own snapshots. The
snapshot's blocks keep their checksums, verified as they are read back on restore.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import struct
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from . import _tiermem
from ._files import atomic_write
from .embedding import EmbeddingTable
from .exceptions import InvalidArgumentError

MAGIC = b"TMCKPT02"
FORMAT = "tiermem-checkpoint-3"
#: Formats this module reads (2 had no block tables).
_READS = ("tiermem-checkpoint-2", FORMAT)
_TRAILER = struct.Struct("<Q32s8s")
#: Bytes per streamed chunk.
CHUNK = 32 << 20


class CheckpointError(InvalidArgumentError):
    """A checkpoint file that cannot be used: missing, truncated, damaged (a checksum does
    not match), foreign, or of another model. The message names the file and the reason."""


def _bad(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path!r}: {why}")


class _Writer:
    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.offset = 0
        self.sections: list[dict[str, Any]] = []

    def section(self, name: str, chunks: Iterator[bytes], **meta: Any) -> None:
        h = hashlib.sha256()
        start = self.offset
        for c in chunks:
            self.f.write(c)
            h.update(c)
            self.offset += len(c)
        self.sections.append({"name": name, "offset": start, "length": self.offset - start, "sha256": h.hexdigest(), **meta})


def _table_chunks(t: EmbeddingTable) -> Iterator[bytes]:
    rows = max(1, CHUNK // (4 * t.embedding_dim))
    buf = np.empty((min(rows, t.num_embeddings), t.embedding_dim), np.float32)
    for start in range(0, t.num_embeddings, rows):
        n = min(rows, t.num_embeddings - start)
        t._native.read_rows(start, buf[:n])
        yield buf[:n].tobytes()


def _state_chunks(t: EmbeddingTable, n: int) -> Iterator[bytes]:
    step = CHUNK // 4
    buf = np.empty(min(step, n), np.float32)
    for start in range(0, n, step):
        k = min(step, n - start)
        t.read_optimizer_state(start, buf[:k])
        yield buf[:k].tobytes()


def _as_f32(raw: np.ndarray, n: int, stride: int, width: int, dtype: str) -> np.ndarray:
    """``n`` stored rows of ``stride`` bytes as float32 ``(n, width)`` (bfloat16 widened)."""
    rows = raw.reshape(n, stride)
    if dtype == "float32":
        return rows[:, : 4 * width].view(np.float32)
    half = rows[:, : 2 * width].view(np.uint16).astype(np.uint32) << 16
    return half.view(np.float32)


def snapshot_name(name: str, token: str) -> str:
    """The snapshot file of table ``name`` in a save of ``token``: readable, inside the
    folder (no separators, at most 64 characters of the name) and one per name (a hash of
    the whole name tells ``user/item`` from ``user_item`` and ``表1`` from ``桌1``)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64].lstrip(".") or "table"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{readable}-{digest}-{token}.tmb"


def snapshot_folder(path: str) -> str:
    """Where the checkpoint at ``path`` keeps its block tables' snapshots."""
    return path + ".tables"


def _snapshot(folder: str, name: str, token: str, t: EmbeddingTable) -> dict[str, Any]:
    os.makedirs(folder, exist_ok=True)
    file = snapshot_name(name, token)
    info = t.snapshot(os.path.join(folder, file))
    return {"file": file, "dtype": t.dtype, **info}


def _prune(folder: str, keep: set[str]) -> None:
    """Remove the snapshots (and partial ones) in ``folder`` that ``keep`` does not name."""
    if not os.path.isdir(folder):
        return
    for f in os.listdir(folder):
        if f.endswith((".tmb", ".tmb.partial")) and f not in keep:
            os.unlink(os.path.join(folder, f))


def save(path: str, state: dict[str, Any], tables: dict[str, EmbeddingTable] | None = None) -> None:
    """Write ``state`` (tensors, numbers, strings, lists and dicts of them) and every table of
    ``tables`` (by name) to ``path`` atomically. Block tables are snapshotted beside it
    (:func:`snapshot_folder`), not streamed."""
    import torch

    folder, token = snapshot_folder(path), secrets.token_hex(6)
    made: list[str] = []
    try:
        with atomic_write(path) as f:
            w = _Writer(f)
            blob = io.BytesIO()
            torch.save(state, blob)
            w.section("state", iter([blob.getvalue()]))
            for name, t in (tables or {}).items():
                if t.path is not None:
                    snap = _snapshot(folder, name, token, t)
                    made.append(snap["file"])
                    w.section(f"block:{name}", iter(()), rows=t.num_embeddings, width=t.embedding_dim, **snap)
                else:
                    w.section(f"rows:{name}", _table_chunks(t), rows=t.num_embeddings, width=t.embedding_dim)
                info = t._native.optimizer_state_info()
                if info is not None:
                    kind, n, steps = info
                    w.section(f"optimizer:{name}", _state_chunks(t, n), kind=kind, values=n, steps=int(steps))
            manifest = json.dumps({"format": FORMAT, "sections": w.sections}).encode()
            f.write(manifest)
            f.write(_TRAILER.pack(len(manifest), hashlib.sha256(manifest).digest(), MAGIC))
    except BaseException:
        for m in made:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, m))
        raise
    _prune(folder, set(made))


def _is_int(x: Any, lo: int = 0) -> bool:
    return type(x) is int and x >= lo


def _checked_sections(path: str, sections: Any) -> list[dict[str, Any]]:
    """The manifest's sections, each with the fields a save writes, of their types; a
    snapshot's file name stays inside the snapshot folder. Anything else is damage."""
    if not isinstance(sections, list):
        raise _bad(path, "its manifest has no list of sections (damaged)")
    names: set[str] = set()
    for k, s in enumerate(sections):
        ok = (
            isinstance(s, dict)
            and isinstance(s.get("name"), str)
            and _is_int(s.get("offset"))
            and _is_int(s.get("length"))
            and isinstance(s.get("sha256"), str)
        )
        name = str(s["name"]) if ok else repr(s)[:60]
        if ok and name.startswith(("rows:", "block:")):
            ok = _is_int(s.get("rows"), 1) and _is_int(s.get("width"), 1)
        if ok and name.startswith("rows:"):
            ok = s["length"] == 4 * s["rows"] * s["width"]
        if ok and name.startswith("block:"):
            f = s.get("file")
            ok = (
                isinstance(f, str)
                and f == os.path.basename(f)
                and not f.startswith(".")
                and f.endswith(".tmb")
                and _is_int(s.get("bytes"))
                and _is_int(s.get("generation"))
                and s.get("dtype") in _tiermem.DTYPES
            )
        if ok and name.startswith("optimizer:"):
            ok = s.get("kind") in _tiermem.OPTIMIZERS and _is_int(s.get("values")) and _is_int(s.get("steps"))
            ok = ok and s["length"] == 4 * s["values"]
        if not ok or name in names:
            why = "is listed twice" if ok else "lacks a field a save writes, or has one of another type"
            raise _bad(path, f"its manifest's section {k} ({name}) {why} (damaged)")
        names.add(name)
    return sections


class Checkpoint:
    """A checkpoint file, opened and checked: the manifest and every section's checksum are
    verified here, before anything is restored from it."""

    def __init__(self, path: str) -> None:
        self.path = path
        if not os.path.isfile(path):
            raise _bad(path, "no such file")
        size = os.path.getsize(path)
        if size < _TRAILER.size:
            raise _bad(path, f"{size} bytes is too short to be a tiermem checkpoint (empty or truncated)")
        with open(path, "rb") as f:
            f.seek(size - _TRAILER.size)
            length, digest, magic = _TRAILER.unpack(f.read(_TRAILER.size))
            if magic != MAGIC:
                raise _bad(path, "not a tiermem checkpoint (no tiermem trailer: a foreign, truncated or older-format file)")
            if length > size - _TRAILER.size:
                raise _bad(path, "its manifest length is beyond the file (damaged)")
            f.seek(size - _TRAILER.size - length)
            raw = f.read(length)
            if hashlib.sha256(raw).digest() != digest:
                raise _bad(path, "its manifest does not match its checksum (damaged)")
            try:
                manifest = json.loads(raw)
            except (ValueError, RecursionError):
                raise _bad(path, "its manifest is not JSON, or nested too deeply (damaged)") from None
            if not isinstance(manifest, dict) or manifest.get("format") not in _READS:
                got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
                raise _bad(path, f"format {got!r}, expected one of {', '.join(_READS)}")
            self.sections = {s["name"]: s for s in _checked_sections(path, manifest.get("sections"))}
            end = size - _TRAILER.size - length
            for s in self.sections.values():
                if s["offset"] < 0 or s["offset"] + s["length"] > end:
                    raise _bad(path, f"section {s['name']!r} lies outside the file (damaged)")
                h = hashlib.sha256()
                f.seek(s["offset"])
                left = s["length"]
                while left:
                    c = f.read(min(CHUNK, left))
                    if not c:
                        raise _bad(path, f"section {s['name']!r} is cut short (truncated)")
                    h.update(c)
                    left -= len(c)
                if h.hexdigest() != s["sha256"]:
                    raise _bad(path, f"section {s['name']!r} does not match its checksum (damaged): nothing was restored from it")
        for s in self.sections.values():
            if s["name"].startswith("block:"):
                snap = os.path.join(snapshot_folder(path), s["file"])
                if not os.path.isfile(snap):
                    raise _bad(
                        path,
                        f"table {s['name'][6:]!r}: its snapshot {snap!r} is missing "
                        f"(the folder {snapshot_folder(path)!r} travels with the checkpoint)",
                    )
                if os.path.getsize(snap) != s["bytes"]:
                    raise _bad(
                        path,
                        f"table {s['name'][6:]!r}: its snapshot {snap!r} is {os.path.getsize(snap)} bytes, recorded {s['bytes']} (truncated or replaced)",
                    )

    def state(self) -> dict[str, Any]:
        """The ``state`` section, loaded with ``weights_only=True`` (no code runs)."""
        import torch

        s = self.sections.get("state")
        if s is None:
            raise _bad(self.path, "has no state section")
        with open(self.path, "rb") as f:
            f.seek(s["offset"])
            blob = f.read(s["length"])
        try:
            return torch.load(io.BytesIO(blob), weights_only=True)
        except Exception as e:
            raise _bad(self.path, f"its state cannot be loaded safely ({type(e).__name__}: {e})") from None

    def tables(self) -> list[str]:
        """Names of the tables it holds."""
        return [n.split(":", 1)[1] for n in self.sections if n.startswith(("rows:", "block:"))]

    def restore_table(self, name: str, t: EmbeddingTable) -> None:
        """Stream table ``name``'s rows (and optimizer state) into ``t``, from the
        checkpoint or, for a block table, from its snapshot (any kind of table may receive
        them)."""
        s = self._table_section(name)
        if (s["rows"], s["width"]) != (t.num_embeddings, t.embedding_dim):
            raise _bad(
                self.path, f"table {name!r} is {s['rows']} x {s['width']}, the model's {t.num_embeddings} x {t.embedding_dim}"
            )
        t.reset_optimizer()  # the checkpoint's state (or none) replaces the table's
        self.restore_rows(name, t, 0, s["rows"], 0)

    def table_shape(self, name: str) -> tuple[int, int]:
        """``(rows, width)`` of table ``name``."""
        s = self._table_section(name)
        return int(s["rows"]), int(s["width"])

    def _table_section(self, name: str) -> dict[str, Any]:
        s = self.sections.get(f"rows:{name}") or self.sections.get(f"block:{name}")
        if s is None:
            raise _bad(self.path, f"has no table {name!r} (it has {', '.join(self.tables()) or 'none'})")
        return s

    def restore_rows(self, name: str, t: EmbeddingTable, lo: int, hi: int, at: int) -> None:
        """Stream rows ``lo..hi`` of table ``name`` (and their optimizer state, when it is
        kept per row or per element) into ``t`` from its row ``at``: a table resharded over
        other row ranges is filled from the pieces of the saved ones it overlaps."""
        s = self._table_section(name)
        if not (0 <= lo <= hi <= s["rows"]) or s["width"] != t.embedding_dim or not 0 <= at <= t.num_embeddings - (hi - lo):
            raise _bad(
                self.path,
                f"rows {lo}..{hi} of table {name!r} ({s['rows']} x {s['width']}) do not fit a "
                f"{t.num_embeddings} x {t.embedding_dim} table from row {at}",
            )
        for start, rows in self.iter_rows(name, lo, hi):
            t.load(rows, at + start - lo)
        o = self.sections.get(f"optimizer:{name}")
        if o is not None and o["values"]:
            per_row, odd = divmod(o["values"], s["rows"])
            if odd:
                raise _bad(self.path, f"table {name!r}: its optimizer state ({o['values']} values) is not kept per row")
            with open(self.path, "rb") as f:
                f.seek(o["offset"] + 4 * per_row * lo)
                step = max(per_row, CHUNK // 4 // max(per_row, 1) * per_row)
                total = per_row * (hi - lo)
                for k0 in range(0, total, step):
                    k = min(step, total - k0)
                    t.set_optimizer_state(o["kind"], np.frombuffer(f.read(4 * k), np.float32), o["steps"], per_row * at + k0)

    def has_optimizer_state(self, name: str) -> bool:
        """Whether table ``name`` was saved with optimizer state (an SGD table has none)."""
        o = self.sections.get(f"optimizer:{name}")
        return bool(o is not None and o["values"])

    def iter_rows(self, name: str, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray]]:
        """Rows ``lo..hi`` of table ``name`` as ``(first row, rows)`` chunks of at most
        ``CHUNK`` bytes, from the checkpoint or a block table's snapshot: memory stays
        bounded. A chunk's array may be reused for the next: copy what you keep."""
        s = self._table_section(name)
        if not 0 <= lo <= hi <= s["rows"]:
            raise _bad(self.path, f"rows {lo}..{hi} are outside table {name!r} of {s['rows']} rows")
        width = s["width"]
        rows = max(1, CHUNK // (4 * width))
        if s["name"].startswith("block:"):
            yield from self._snapshot_rows(name, s, rows, lo, hi)
            return
        with open(self.path, "rb") as f:
            f.seek(s["offset"] + 4 * width * lo)
            for start in range(lo, hi, rows):
                n = min(rows, hi - start)
                yield start, np.frombuffer(f.read(4 * n * width), np.float32).reshape(n, width)

    def _snapshot_rows(self, name: str, s: dict[str, Any], rows: int, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray]]:
        """Rows ``lo..hi`` of a block table's snapshot, in chunks of ``rows``: the file is
        opened read-only under a shared lock (processes restoring one checkpoint read it at
        once) and its blocks are checked as they are read."""
        snap = os.path.join(snapshot_folder(self.path), s["file"])
        src = _tiermem.BlockFile.open(snap, name, 4, read_only=True)
        try:
            if src.shape != (s["rows"], s["width"], s["dtype"]):
                raise _bad(
                    self.path,
                    f"table {name!r}: its snapshot {snap!r} holds {src.shape}, recorded {(s['rows'], s['width'], s['dtype'])} (replaced)",
                )
            if src.generation != s["generation"]:
                raise _bad(
                    self.path,
                    f"table {name!r}: its snapshot {snap!r} has layout generation {src.generation}, recorded {s['generation']} (replaced)",
                )
            stride = src.stride
            raw = np.empty(max(1, min(rows, hi - lo)) * stride, np.uint8)
            for start in range(lo, hi, rows):
                n = min(rows, hi - start)
                src.read_rows(np.arange(start, start + n, dtype=np.uint64), raw[: n * stride])
                yield start, _as_f32(raw[: n * stride], n, stride, s["width"], s["dtype"])
        finally:
            del src
