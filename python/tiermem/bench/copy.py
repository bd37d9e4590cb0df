"""``tiermem bench copy``: copy bandwidth for every ordered device pair and size, next to
``memcpy`` on one thread and on all threads and a NumPy copy, measured in the same run."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from .. import _tiermem, dram_figures
from .._sizes import format_bytes, parse_size
from ..manager import Manager
from ..report.load import MachineLoad
from ..report.output import show, write_outputs
from ..report.progress import Progress
from ..report.scratch import scratch_dir
from ..report.table import table
from .timing import best as best_time

FULL_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
QUICK_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def _reps(size: int, quick: bool) -> int:
    """Interleaved repetitions per size: enough that the median of paired ratios holds still
    on a shared machine (three runs within 10 %), more for sizes that take microseconds."""
    base = 15 if quick else 21
    return base if size >= 16 << 20 else base * 4


def _real_memory(d: dict[str, Any]) -> bool:
    return bool(d["byte_addressable"]) and d["real"] == "real"


def _vs_memcpy(si: str, di: str, gbps: float, paired: float, baselines: dict[str, float], info: dict[str, Any]) -> float | None:
    """tiermem against the faster memcpy: DRAM to DRAM, the median of the reps' paired
    ratios; another pair of real memories, its bandwidth over the faster memcpy's median
    (memcpy is a DRAM-to-DRAM baseline: other devices do not compare to it)."""
    if (si, di) == ("dram", "dram"):
        return paired
    if _real_memory(info[si]) and _real_memory(info[di]):
        return gbps / max(baselines["memcpy_1t"], baselines["memcpy_mt"])
    return None


def run(
    devices: list[str],
    sizes: list[int],
    quick: bool,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Measure and return ``{"rows": [...], "devices": {...}, ...}``."""
    top = max(sizes)
    cap = 2 * top + (8 << 20)
    m = Manager({d: cap for d in devices}, policy="first_touch")
    info = {d["name"]: d for d in m.devices}
    cores = os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    pairs = [(s, d) for s in devices for d in devices]
    dram = devices.index("dram")
    with Progress(len(sizes) * len(pairs), "bench copy", progress) as bar:
        for size in sizes:
            reps = _reps(size, quick)
            # DRAM -> DRAM and the baselines on the same two buffers, interleaved rep by rep
            # so that noise on a shared machine hits every contender alike.
            a = m.array(size, "uint8", where=dram, fill=1)
            b = m.array(size, "uint8", where=dram, fill=0)
            times: dict[str, list[float]] = {k: [] for k in ("tiermem", "memcpy_1t", "memcpy_mt", "numpy")}
            m._native.copy_objects(b.id, a.id)  # warm-up: thread pools
            for _ in range(reps):
                times["tiermem"].append(m._native.copy_objects(b.id, a.id))
                with a.read() as va, b.write() as vb:
                    pa = va.__array_interface__["data"][0]
                    pb = vb.__array_interface__["data"][0]
                    na, nb = va.view(np.ndarray), vb.view(np.ndarray)
                    for key, threads in (("memcpy_1t", 1), ("memcpy_mt", cores)):
                        times[key].append(_tiermem.memcpy_seconds(pb, pa, size, threads, 1))
                    times["numpy"].append(best_time([lambda: np.copyto(nb, na)]))  # noqa: B023, F821 - run before the del
                    del na, nb  # plain views must not outlive the guards (they would hold a, b)
            a.free()
            b.free()
            med = {k: float(np.median(v)) for k, v in times.items()}
            baselines = {k: size / med[k] / 1e9 for k in ("memcpy_1t", "memcpy_mt", "numpy")}
            # Each rep's contenders ran back to back: the median of their paired ratios is what
            # a noisy neighbour moves least.
            paired = float(
                np.median(
                    [min(m1, mm) / t for t, m1, mm in zip(times["tiermem"], times["memcpy_1t"], times["memcpy_mt"], strict=True)]
                )
            )
            for si, di in pairs:
                threads = m._native.threads_for(devices.index(si), devices.index(di))
                if (si, di) == ("dram", "dram"):
                    secs = med["tiermem"]
                else:
                    # Write the source first: reading never-written blocks of a file skips the
                    # disk and would flatter block devices.
                    src = m.array(size, "uint8", where=si, fill=1)
                    dst = m.array(size, "uint8", where=di)
                    m._native.copy_objects(dst.id, src.id)  # warm-up
                    secs = m._native.copy_objects(dst.id, src.id, reps)
                    src.free()
                    dst.free()
                gbps = size / secs / 1e9
                expected = m._native.expected_copy_gbps(devices.index(si), devices.index(di))
                rows.append(
                    {
                        "src": si,
                        "dst": di,
                        "size": size,
                        "gbps": gbps,
                        "seconds": secs,
                        "threads": threads,
                        "baselines": dict(baselines),
                        # memcpy is a DRAM-to-DRAM baseline: only real memory pairs compare to it.
                        "vs_memcpy": _vs_memcpy(si, di, gbps, paired, baselines, info),
                        "profile_gbps": expected,
                        "vs_profile": (gbps / expected) if expected else None,
                    }
                )
                bar.step(f"{si} -> {di} {format_bytes(size)}")
    return {
        "benchmark": "copy",
        "quick": quick,
        "devices": {n: d["real"] for n, d in info.items()},
        "device_info": list(info.values()),
        "dram": dram_figures(),
        "kernels": _tiermem.kernel_isa(),
        "cores": cores,
        "rows": rows,
    }


def report(res: dict[str, Any]) -> str:
    """The readable table, largest-size summary and emulation check."""
    from ..report.plot import short_name

    label = {n: short_name(n, k) for n, k in res["devices"].items()}
    sizes = sorted({r["size"] for r in res["rows"]})
    pairs = list(dict.fromkeys((r["src"], r["dst"]) for r in res["rows"]))
    by = {(r["src"], r["dst"], r["size"]): r for r in res["rows"]}
    body = [[f"{label[s]} -> {label[d]}", *(f"{by[(s, d, z)]['gbps']:.2f}" for z in sizes)] for s, d in pairs]
    first = by[(pairs[0][0], pairs[0][1], sizes[0])]
    for key in first["baselines"]:
        body.append(
            [f"baseline {key} (dram -> dram)", *(f"{by[(pairs[0][0], pairs[0][1], z)]['baselines'][key]:.2f}" for z in sizes)]
        )
    if ("dram", "dram") in pairs:
        body.append(["tiermem / faster memcpy (dram -> dram)", *(f"{by[('dram', 'dram', z)]['vs_memcpy']:.2f}x" for z in sizes)])
    out = [
        f"copy bandwidth in GB/s by size ({res['cores']} cores, {res['kernels']} kernels; "
        "baselines copy DRAM to DRAM; DRAM -> DRAM and the baselines are medians of "
        "interleaved reps, the ratio the median of each rep's paired ratio; other pairs are "
        "the best of several reps)",
        table(["pair", *(format_bytes(z).replace(".0 ", " ") for z in sizes)], body),
        "",
    ]
    big = [r for r in res["rows"] if r["src"] == "dram" and r["dst"] == "dram" and r["size"] >= 64 << 20]
    if big:
        worst = min(big, key=lambda r: r["vs_memcpy"])
        out.append(
            f"dram -> dram >= 64 MiB: tiermem reaches {worst['vs_memcpy']:.2f}x the faster memcpy "
            f"(worst size {format_bytes(worst['size'])})"
        )
    top = max(r["size"] for r in res["rows"])
    for r in res["rows"]:
        if r["size"] == top and r["vs_profile"] is not None:
            ok = "within 15%" if abs(r["vs_profile"] - 1) <= 0.15 else "OFF by more than 15%"
            out.append(
                f"{label[r['src']]} -> {label[r['dst']]} at {format_bytes(top)}: "
                f"{r['gbps']:.2f} GB/s vs profile {r['profile_gbps']:.2f} GB/s ({r['vs_profile']:.2f}, {ok})"
            )
    return "\n".join(out)


def default_devices(block_dir: str | None) -> list[str]:
    d = scratch_dir(block_dir)
    return ["dram", "emulated:optane-pmem", "emulated:cxl", f"block:{d / f'tiermem-bench-{os.getpid()}.bin'}"]


def run_cli(args: Any) -> int:
    devices = args.devices or default_devices(args.dir)
    if "dram" not in devices:
        devices = ["dram", *devices]
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.max_size:
        limit = parse_size(args.max_size, "--max-size")
        sizes = [s for s in FULL_SIZES if s <= limit] or [limit]
    t0 = time.perf_counter()
    try:
        with MachineLoad() as load:
            res = run(devices, sizes, args.quick)
        res["load"] = load.summary()
    finally:
        for d in devices:
            if d.startswith("block:"):
                try:
                    os.unlink(d[len("block:") :])
                except OSError:
                    pass
    res["wall_seconds"] = time.perf_counter() - t0
    show(report(res))
    show(load.line())
    show(f"\n{len(res['rows'])} measurements in {res['wall_seconds']:.1f}s")
    from ..report.plot import plot_copy

    write_outputs(res, args, plot_copy)
    return 0
