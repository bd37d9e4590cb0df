"""Checkpoints of a sharded run: every rank streams its shards into a file of its own
(:mod:`tiermem.checkpoint`), rank 0 adds the dense model, and a manifest names the set.

Layout of a checkpoint folder::

    manifest.json            {"format", "step", "world", "plan", "config", "folder", "files"}
    step00000040/rank0.ckpt  rank 0's shards, the dense model and optimizer, the step
    step00000040/rank1.ckpt  rank 1's shards

A save writes a new ``stepNNNNNNNN`` folder; once every rank's file is in place (a
barrier), rank 0 replaces the manifest atomically and removes the files the previous
manifest named (and their folder, once empty): nothing else in the checkpoint folder is
touched. The manifest carries a SHA-256 of its own fields, checked on resume with every
field's type and the step rank 0's file records, so a damaged manifest that is still JSON is
refused. A rank that dies mid-save leaves the manifest naming the previous, complete set. Resuming reads the
manifest and fills each of this run's shards from the saved shards whose rows and columns
it overlaps, so a run may resume on a different number of ranks (or sharding: table-, row-
or column-wise) than it saved from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch.distributed as dist

from .. import checkpoint
from .._files import write_json_atomic
from ..exceptions import InvalidArgumentError
from .embeddings import ShardedEmbeddings
from .plan import Shard, ShardPlan

__all__ = ["FORMAT", "load_sharded", "save_sharded"]

FORMAT = "tiermem-sharded-2"
#: Formats read: 1 had no checksum.
_READS = ("tiermem-sharded-1", FORMAT)
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"step\d{8}")
_RANK_FILE = re.compile(r"rank\d+\.ckpt")


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _previous(folder: str) -> tuple[str, list[str]] | None:
    """The step folder and files the manifest in ``folder`` names, if it is one of ours and
    intact (what the next save may remove)."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            m = json.load(f)
        _check_manifest(m, folder)
    except (OSError, ValueError, RecursionError, InvalidArgumentError):
        return None
    return m["folder"], list(m["files"])


def _check_manifest(m: Any, where: str) -> None:
    """Refuse a manifest whose fields are not what a save writes (types, names inside the
    folder) or whose checksum does not match them."""
    path = os.path.join(where, MANIFEST)
    if not isinstance(m, dict) or m.get("format") not in _READS:
        got = m.get("format") if isinstance(m, dict) else type(m).__name__
        raise InvalidArgumentError(f"{path!r} has format {got!r}, expected {FORMAT!r}")
    if m["format"] == FORMAT:
        body = {k: v for k, v in m.items() if k != "sha256"}
        if m.get("sha256") != _digest(body):
            raise InvalidArgumentError(f"{path!r} does not match its checksum (damaged): nothing was restored")
    step, world, sub, files = m.get("step"), m.get("world"), m.get("folder"), m.get("files")
    ok = (
        type(step) is int
        and step >= 0
        and type(world) is int
        and world >= 1
        and isinstance(sub, str)
        and _STEP_DIR.fullmatch(sub) is not None
        and sub == f"step{step:08d}"
        and isinstance(files, list)
        and len(files) == world
        and all(isinstance(f, str) and _RANK_FILE.fullmatch(f) for f in files)
        and isinstance(m.get("plan"), dict)
    )
    if not ok:
        raise InvalidArgumentError(
            f"{path!r} is damaged: its step, world, folder or files are not what a save writes "
            f"(step {step!r}, world {world!r}, folder {sub!r})"
        )


def shard_name(s: Shard) -> str:
    return f"t{s.table}-rows{s.lo}-{s.hi}" + (f"-cols{s.c0}-{s.c1}" if s.c1 else "")


def save_sharded(
    folder: str,
    emb: ShardedEmbeddings,
    step: int,
    config: dict[str, Any],
    dense: dict[str, Any],
    data: dict[str, Any] | None = None,
) -> str:
    """Every rank calls it together after step ``step``; ``dense`` (rank 0's) holds the
    dense model's and optimizer's state, ``data`` this rank's data position (a reader of its
    own part of a file: where the next batch starts). Returns the file this rank wrote."""
    rank, world = emb.rank, emb.world
    sub = f"step{step:08d}"
    os.makedirs(os.path.join(folder, sub), exist_ok=True)
    path = os.path.join(folder, sub, f"rank{rank}.ckpt")
    state: dict[str, Any] = {"rank": rank, "step": step}
    if data is not None:
        state["data"] = data
    if rank == 0:
        state["dense"] = dense
    checkpoint.save(path, state, {shard_name(s): t for s, t in zip(emb.shards, emb.tables, strict=True)})
    dist.barrier(group=emb.group)
    if rank == 0:
        before = _previous(folder)
        body = {
            "format": FORMAT,
            "step": step,
            "world": world,
            "plan": emb.plan.to_dict(),
            "config": config,
            "folder": sub,
            "files": [f"rank{r}.ckpt" for r in range(world)],
        }
        write_json_atomic(os.path.join(folder, MANIFEST), {**body, "sha256": _digest(body)})
        if before is not None and before[0] != sub:
            _remove_saved(os.path.join(folder, before[0]), before[1])
    dist.barrier(group=emb.group)
    return path


def _remove_saved(step_dir: str, files: list[str]) -> None:
    """Remove an earlier save's rank files and their snapshots, then its folder if nothing
    else is in it (a user's file there stays, and so does the folder)."""
    for f in files:
        p = os.path.join(step_dir, f)
        snaps = checkpoint.snapshot_folder(p)
        if os.path.isdir(snaps):
            for s in os.listdir(snaps):
                if s.endswith((".tmb", ".tmb.partial")):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(snaps, s))
            with contextlib.suppress(OSError):
                os.rmdir(snaps)
        with contextlib.suppress(OSError):
            os.unlink(p)
    with contextlib.suppress(OSError):
        os.rmdir(step_dir)


def _manifest(folder: str, config: dict[str, Any]) -> dict[str, Any]:
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"{folder!r} holds no sharded checkpoint (no {MANIFEST})")
    try:
        with open(path) as f:
            m: dict[str, Any] = json.load(f)
    except (ValueError, RecursionError):
        raise InvalidArgumentError(f"{path!r} is not JSON, or nested too deeply (damaged)") from None
    _check_manifest(m, folder)
    if m.get("config") != config:
        diff = sorted(k for k in set(config) | set(m.get("config") or {}) if (m.get("config") or {}).get(k) != config.get(k))
        raise InvalidArgumentError(
            f"the checkpoint in {folder!r} is of another model (differs in {', '.join(diff)}): resume with the model it saved"
        )
    return m


def _cols(s: Shard, o: Shard, dim: int) -> tuple[int, int] | None:
    """The columns two shards of a table share (None: none)."""
    (a0, a1), (b0, b1) = s.cols(dim), o.cols(dim)
    lo, hi = max(a0, b0), min(a1, b1)
    return (lo, hi) if lo < hi else None


def _restore_columns(s: Shard, t: Any, over: list[Shard], dim: int, saved: Callable[[int], checkpoint.Checkpoint]) -> None:
    """Fill shard ``s`` from saved shards split over other columns: each chunk of its rows is
    put together from the saved shards' column slices (a table's shards cover it once), then
    loaded. Optimizer state kept per row cannot be split by columns, so a table saved with
    state is refused."""
    for o in over:
        if saved(o.rank).has_optimizer_state(shard_name(o)):
            raise InvalidArgumentError(
                f"table {s.table} was saved with optimizer state in shards of other columns; resume it with "
                "the column split it saved"
            )
    c0, c1 = s.cols(dim)
    chunk = max(1, checkpoint.CHUNK // (4 * (c1 - c0)))
    for r0 in range(s.lo, s.hi, chunk):
        r1 = min(s.hi, r0 + chunk)
        buf = np.zeros((r1 - r0, c1 - c0), np.float32)
        for o in over:
            lo, hi = max(r0, o.lo), min(r1, o.hi)
            cols = _cols(s, o, dim)
            if lo >= hi or cols is None:
                continue
            o0 = o.cols(dim)[0]
            for start, rows in saved(o.rank).iter_rows(shard_name(o), lo - o.lo, hi - o.lo):
                at = start + o.lo - r0
                buf[at : at + len(rows), cols[0] - c0 : cols[1] - c0] = rows[:, cols[0] - o0 : cols[1] - o0]
        t.load(buf, r0 - s.lo)


def load_sharded(folder: str, emb: ShardedEmbeddings, config: dict[str, Any]) -> dict[str, Any]:
    """Fill this rank's shards from the checkpoint in ``folder`` (saved on any number of
    ranks) and return the saved dense state and step, and, saved on as many ranks, this
    rank's data position (``data``; None otherwise). A missing or damaged file is an
    error naming it; nothing is restored from a file that fails its checks."""
    m = _manifest(folder, config)
    old = ShardPlan.from_dict(m["plan"])
    widths = [old.dim_of(t) for t in range(len(old.rows))]
    if old.rows != emb.plan.rows or widths != emb.dims:
        raise InvalidArgumentError(
            f"the checkpoint's tables are {list(old.rows)} rows x {widths} wide, the model's {list(emb.plan.rows)} x {emb.dims}"
        )
    # Every rank checks every file before restoring anything, so a missing one stops all
    # ranks with the same error (not one rank with it and the others at their next
    # collective with a closed connection).
    paths = [os.path.join(folder, m["folder"], name) for name in m["files"]]
    for rank, path in enumerate(paths):
        if not os.path.isfile(path):
            raise InvalidArgumentError(f"the checkpoint's shard file of rank {rank}, {path!r}, is missing")
    opened: dict[int, checkpoint.Checkpoint] = {}

    def saved(rank: int) -> checkpoint.Checkpoint:
        if rank not in opened:
            opened[rank] = checkpoint.Checkpoint(paths[rank])
        return opened[rank]

    for s, t in zip(emb.shards, emb.tables, strict=True):
        dim = old.dim_of(s.table)
        over = [o for o in old.of_table(s.table) if max(s.lo, o.lo) < min(s.hi, o.hi) and _cols(s, o, dim)]
        if all(o.cols(dim) == s.cols(dim) for o in over):
            for o in over:
                lo, hi = max(s.lo, o.lo), min(s.hi, o.hi)
                saved(o.rank).restore_rows(shard_name(o), t, lo - o.lo, hi - o.lo, lo - s.lo)
        else:
            _restore_columns(s, t, over, dim, saved)
    state = saved(0).state()
    if state.get("step") != m["step"]:
        raise InvalidArgumentError(
            f"{os.path.join(folder, MANIFEST)!r} names step {m['step']}, but rank 0's file records step {state.get('step')!r} (damaged)"
        )
    mine = saved(emb.rank).state() if int(m["world"]) == emb.world else {}
    return {"step": int(m["step"]), "dense": state["dense"], "saved_world": int(m["world"]), "data": mine.get("data")}
