"""``tiermem bench criteo``: the core Criteo reader against the Python reference on the same
file, side by side: lines per second, and whether the two hand out identical batches (labels,
features, hashed indices, positions) and count the same malformed lines.

The file is synthetic (``write_criteo``'s lines, one in fifty then damaged in one of the
ways real dumps are: a truncated line, a stray character in a number, a missing column), or
``--file`` names a real one. Each reader's time is the median of its runs over the whole file,
batches handed out and dropped (the reference, about ten times slower, runs once with
``--quick``); a separate, untimed pass of each digests every batch and position.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from statistics import median
from typing import Any

import numpy as np

from ..dlrm.data.criteo import CAT_FEATURES, INT_FEATURES, CriteoReader, write_criteo
from ..exceptions import InvalidArgumentError
from ..report.output import measured_cli
from ..report.table import table

#: Tables' rows for hashing (the DLRM Kaggle configuration's largest are ~10M).
ROWS = [10_000_000 if k % 3 == 0 else 100_000 for k in range(CAT_FEATURES)]
BATCH = 2048


def _damage(path: str, every: int, seed: int) -> int:
    """Rewrite one line in ``every`` as a malformed one; returns how many."""
    rng = np.random.default_rng(seed)
    tmp = path + ".tmp"
    n = 0
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for i, line in enumerate(src):
            if i % every == every - 1:
                kind = int(rng.integers(3))
                cols = line.rstrip(b"\n").split(b"\t")
                if kind == 0:
                    line = b"\t".join(cols[: len(cols) // 2]) + b"\n"  # truncated
                elif kind == 1:
                    cols[1 + int(rng.integers(INT_FEATURES))] = b"1.5"  # a float where an integer goes
                    line = b"\t".join(cols) + b"\n"
                else:
                    first = 1 + INT_FEATURES
                    cols[first + int(rng.integers(CAT_FEATURES))] = b"zz" + cols[first][:6]  # not hexadecimal
                    line = b"\t".join(cols) + b"\n"
                n += 1
            dst.write(line)
    os.replace(tmp, path)
    return n


def _timed(path: str, engine: str) -> float:
    """Seconds to hand out every batch of the file (what a trainer waits for)."""
    r = CriteoReader(path, ROWS, BATCH, engine=engine, keep_last=True)
    t = time.perf_counter()
    for _ in r:
        pass
    return time.perf_counter() - t


def _digest(path: str, engine: str) -> tuple[str, dict[str, Any]]:
    """A digest of every batch and position, and the reader's counts (an untimed pass)."""
    h = hashlib.blake2b(digest_size=16)
    r = CriteoReader(path, ROWS, BATCH, engine=engine, keep_last=True)
    for b in r:
        for x in (b.labels, b.dense, *b.indices):
            h.update(x.numpy().tobytes())
        h.update(r.position.to_bytes(8, "little"))
    return h.hexdigest(), r.report()


def run(quick: bool, lines: int | None = None, file: str | None = None, reps: int | None = None) -> dict[str, Any]:
    """Read one file with both readers; ``lines`` of synthetic data unless ``file``."""
    reps = reps or (1 if quick else 3)
    tmpdir = None
    try:
        if file is None:
            n = lines or (100_000 if quick else 1_000_000)
            tmpdir = tempfile.mkdtemp(prefix="tiermem-criteo-")
            need = n * 400
            if shutil.disk_usage(tmpdir).free < 2 * need:
                raise InvalidArgumentError(f"bench criteo: {n} lines need about {need >> 20} MiB free in {tmpdir}")
            file = os.path.join(tmpdir, "day.tsv")
            write_criteo(file, n, seed=1)
            damaged = _damage(file, 50, seed=2)
        else:
            damaged = None
            if not os.path.isfile(file):
                what = "is a folder" if os.path.isdir(file) else "does not exist"
                raise InvalidArgumentError(f"bench criteo --file {file!r}: the file {what}")
            if not os.access(file, os.R_OK):
                raise InvalidArgumentError(f"bench criteo --file {file!r}: the file is not readable")
        size = os.path.getsize(file)
        t_core = median(_timed(file, "core") for _ in range(reps))
        t_ref = median(_timed(file, "python") for _ in range(1 if quick else min(reps, 2)))
        core, ref = _digest(file, "core"), _digest(file, "python")
        total = core[1]["lines"]
        return {
            "benchmark": "criteo",
            "quick": quick,
            "file": file if tmpdir is None else "synthetic",
            "bytes": size,
            "lines": total,
            "bad_lines": core[1]["bad_lines"],
            "damaged_lines": damaged,
            "batch_size": BATCH,
            "core_seconds": t_core,
            "python_seconds": t_ref,
            "core_lines_per_second": total / t_core,
            "python_lines_per_second": total / t_ref,
            "core_mb_per_second": size / t_core / 1e6,
            "speedup": t_ref / t_core,
            "identical": core == ref,
        }
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def report(res: dict[str, Any]) -> str:
    rows = [
        ["core", f"{res['core_seconds']:.3f}", f"{res['core_lines_per_second']:,.0f}", f"{res['core_mb_per_second']:.0f}"],
        [
            "python (reference)",
            f"{res['python_seconds']:.3f}",
            f"{res['python_lines_per_second']:,.0f}",
            f"{res['bytes'] / res['python_seconds'] / 1e6:.0f}",
        ],
    ]
    return "\n".join(
        [
            f"Criteo reader on {res['file']} ({res['lines']:,} lines, {res['bytes'] / 1e6:.0f} MB, "
            f"{res['bad_lines']:,} malformed), batches of {res['batch_size']}, one core",
            table(["reader", "seconds", "lines/s", "MB/s"], rows),
            f"core / python: {res['speedup']:.1f}x; batches, positions and counts "
            + ("identical" if res["identical"] else "DIFFER"),
        ]
    )


def run_cli(args: Any) -> int:
    args.plot = None
    return measured_cli(args, lambda: run(args.quick, args.lines, args.file, args.reps), report, lambda res, path: None)
