"""``tiermem bench blockio``: the miss path of a block-backed table against the disk.

On the real disk (a scratch directory on it), in one run, alternating: the device's random
4 KiB read rate (tiermem's own measurement of a ``block:`` device, the figure ``tiermem
calibrate`` reports, at its queue depth) and a table file's ``read_rows`` over random rows
of a table as large as that device, through io_uring and through the thread pool, at the
same depth. The figure of merit is the table's blocks read per second over the device's
random reads per second: what the store's batching, checksums and copies cost.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import _tiermem
from .._sizes import format_bytes, parse_size
from ..exceptions import InvalidArgumentError
from ..manager import Manager
from ..report.load import MachineLoad
from ..report.output import show, write_json
from ..report.progress import Progress
from ..report.scratch import scratch_dir
from ..report.table import print_table

__all__ = ["run", "run_cli"]

#: Rows per batch of the table's reads (each mostly in its own block).
BATCH = 4096
DEPTH = 16


def _device_reads_per_s(path: Path, size: int, reps: int) -> tuple[float, dict[str, Any]]:
    m = Manager({"dram": "16 MiB", f"block:{path}": size}, policy="all_slow")
    f = m._native.measure_device(1, size - (1 << 20), reps)
    return f["rand_read_gbps"] * 1e9 / f["random_bytes"], f


def _table_blocks_per_s(bf: Any, rng: np.random.Generator, rounds: int) -> float:
    stride = bf.stride
    rows = bf.rows
    rpb, bpr = bf.geometry
    out = np.empty(BATCH * stride, np.uint8)
    best = 0.0
    for _ in range(rounds):
        want = rng.integers(0, rows, BATCH, dtype=np.uint64)
        blocks = len(np.unique(want // rpb)) * bpr
        t = time.perf_counter()
        bf.read_rows(want, out)
        best = max(best, blocks / (time.perf_counter() - t))
    return best


def _open(path: Path, name: str, threads: bool) -> Any:
    """The table file, reading through the thread pool if ``threads`` (else io_uring where
    the kernel allows it)."""
    if threads:
        os.environ["TIERMEM_IO"] = "threads"
    try:
        return _tiermem.BlockFile.open(path, name, DEPTH)
    finally:
        os.environ.pop("TIERMEM_IO", None)


def run(size: int, quick: bool, directory: str | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Measure and return the JSON-able results."""
    d = scratch_dir(directory)
    free = shutil.disk_usage(d).free
    if free < 2 * size + (256 << 20):
        raise InvalidArgumentError(
            f"{d} has {format_bytes(free)} free; the benchmark needs {format_bytes(2 * size + (256 << 20))} "
            "(a device file and a table file of --size each): free some space or pass a smaller --size"
        )
    rounds = 3 if quick else 7
    rng = np.random.default_rng(0)
    dev_path = d / f"tiermem-blockio-dev-{os.getpid()}.bin"
    tab_path = d / f"tiermem-blockio-table-{os.getpid()}.tbl"
    widths = (16, 64)
    cases: list[dict[str, Any]] = []
    device: list[float] = []
    figures: dict[str, Any] = {}
    paths = {w: tab_path.with_suffix(f".{w}.tbl") for w in widths}
    try:
        for w in widths:
            _tiermem.BlockFile.create(paths[w], f"bench{w}", (size // (w * 4), w, "float32"), False, DEPTH)
        engines = list(dict.fromkeys([_open(paths[widths[0]], "probe", False).read_engine, "threads"]))
        per: dict[tuple[int, str], list[float]] = {(w, e): [] for w in widths for e in engines}
        with MachineLoad() as load, Progress(rounds * (1 + len(per)), "bench blockio", progress) as bar:
            for _ in range(rounds):
                rate, figures = _device_reads_per_s(dev_path, size, 1)
                device.append(rate)
                bar.step("device random reads")
                for w, e in per:
                    bf = _open(paths[w], f"bench{w}", e == "threads")
                    per[(w, e)].append(_table_blocks_per_s(bf, rng, 1))
                    del bf  # closes the file (and its lock) for the next engine
                    bar.step(f"width {w} {e}")
        dev = statistics.median(device)
        for (w, e), rates in per.items():
            r = statistics.median(rates)
            cases.append(
                {
                    "width": w,
                    "engine": e,
                    "depth": DEPTH,
                    "blocks_per_s": r,
                    "device_reads_per_s": dev,
                    "ratio_to_device": r / dev,
                }
            )
    finally:
        for p in [dev_path, *paths.values()]:
            p.unlink(missing_ok=True)
    return {
        "benchmark": "blockio",
        "dir": str(d),
        "size_bytes": size,
        "batch_rows": BATCH,
        "rounds": rounds,
        "statistic": "median over rounds of each round's rate",
        "device": "block (the real disk)",
        "device_figures": figures,
        "load": load.summary(),
        "load_line": load.line(),
        "cases": cases,
    }


def run_cli(args: Any) -> int:
    size = parse_size(args.size or ("256 MiB" if args.quick else "1 GiB"), "--size")
    res = run(size, args.quick, args.dir)
    print_table(
        ["width", "engine", "depth", "table blocks/s", "device reads/s", "table / device"],
        [
            [
                c["width"],
                c["engine"],
                c["depth"],
                f"{c['blocks_per_s']:,.0f}",
                f"{c['device_reads_per_s']:,.0f}",
                f"{c['ratio_to_device']:.2f}",
            ]
            for c in res["cases"]
        ],
        title=f"random rows of a {format_bytes(size)} table file on {res['dir']} (real disk)",
    )
    show(res["load_line"])
    if args.json:
        write_json({k: v for k, v in res.items() if k != "load_line"}, args.json)
    return 0
