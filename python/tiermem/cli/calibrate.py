"""``tiermem calibrate``: measure every device once and keep the figures where ``info``, the
emulated profiles and later planners find them."""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any

from .. import _tiermem, calibration_path, profiles
from .._files import write_json_atomic
from .._sizes import format_bytes, parse_size
from ..hpc import staging
from ..manager import Manager
from ..report.progress import Progress
from ..report.scratch import scratch_dir
from ..report.table import table

#: Queue depths the block device is measured at.
DEPTHS = (1, 2, 4, 8, 16, 32, 64)


def _depth_sweep(path: Any, size: int, reps: int) -> dict[str, Any]:
    """Random 4 KiB reads per second from the block device's scratch file at each depth of
    :data:`DEPTHS` (how block tables read), and the best: the depth tables default to."""
    rates = []
    engine = "threads"
    for d in DEPTHS:
        rate, engine = _tiermem.random_reads_per_s(path, size, d, max(2048, 256 * d), reps)
        rates.append(rate)
    best = max(range(len(DEPTHS)), key=lambda k: rates[k])
    # The smallest depth within 3 % of the best: deeper queues cost latency for nothing.
    pick = next(k for k in range(len(DEPTHS)) if rates[k] >= 0.97 * rates[best])
    return {
        "engine": engine,
        "depths": list(DEPTHS),
        "reads_per_s": rates,
        "best_depth": DEPTHS[pick],
        "best_reads_per_s": rates[pick],
        "random_bytes": 4096,
    }


def run_calibrate(args: Any) -> int:
    size = parse_size(args.size, "--size")
    if args.quick:
        size = min(size, 64 << 20)
    reps = 2 if args.quick else 5
    block = scratch_dir(args.dir) / f"tiermem-calibrate-{os.getpid()}.bin"
    specs = ["dram", *[f"emulated:{p['name']}" for p in profiles()], f"block:{block}"]
    specs += [f"numa:{n['id']}" for n in _tiermem.topology()["nodes"]]
    path = calibration_path()
    result: dict[str, Any] = {
        "version": 1,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tiermem": _tiermem.__version__,
        "scratch_bytes": size,
    }
    # Staging lines: dram against every slower memory device (the break-even of Arima & Schulz).
    slower = [s for s in specs[1:] if not s.startswith("block:") and s != "numa:0"]
    steps = 2 + len(specs) + len(specs) ** 2 + len(slower)
    try:
        with Progress(steps, "calibrate") as bar:
            # DRAM first: emulated devices scale their profile to these figures, so they
            # must be on disk before any emulated device is created.
            # Buffers past the last-level cache, or the figures are the cache's.
            result["dram"] = _tiermem.measure_dram(max(size, _tiermem.dram_probe_bytes()), reps)
            result["dram"]["source"] = "calibrated"
            _write(path, result)
            bar.step("dram")
            m = Manager({s: 2 * size + (8 << 20) for s in specs}, policy="first_touch")
            result["devices"] = {}
            for i, s in enumerate(specs):
                result["devices"][s] = m._native.measure_device(i, size, reps)
                bar.step(s)
            result["copy"] = []
            for i, s in enumerate(specs):
                for j, d in enumerate(specs):
                    a = m.array(size, "uint8", where=i)
                    b = m.array(size, "uint8", where=j)
                    best = m._native.copy_objects(b.id, a.id, reps)
                    result["copy"].append({"src": s, "dst": d, "bytes": size, "gbps": size / best / 1e9})
                    a.free()
                    b.free()
                    bar.step(f"{s} -> {d}")
            result["block_depth"] = _depth_sweep(block, size, reps)
            bar.step("block queue depths")
            del m  # its devices' memory goes back before the staging managers take theirs
            result["staging"] = {}
            probe = 1 << max(12, min(23, (size // 8).bit_length() - 1))
            for s in slower:
                cap = probe * 8 + (16 << 20)
                line = staging.calibrate(Manager({"dram": cap, s: cap}, "lru_in_place"), probe, reps=3)
                result["staging"][s] = line.as_dict()
                bar.step(f"staging line dram / {s}")
    finally:
        try:
            os.unlink(block)
        except OSError:
            pass
    # Block devices are keyed by kind for planners: their path changes run to run.
    blk = result["devices"].pop(f"block:{block}")
    result["devices"]["block:" + str(block.parent)] = blk
    for c in result["copy"]:
        for k in ("src", "dst"):
            if c[k] == f"block:{block}":
                c[k] = "block:" + str(block.parent)
    _write(path, result)
    rows = [
        [
            n,
            f"{f['seq_read_gbps']:.2f}",
            f"{f['seq_write_gbps']:.2f}",
            f"{f['rand_read_gbps']:.2f} ({format_bytes(f['random_bytes'])})",
            f"{f['rand_write_gbps']:.2f}",
            f"{f['latency_ns']:.0f}",
        ]
        for n, f in result["devices"].items()
    ]
    print(table(["device", "seq read GB/s", "seq write GB/s", "rand read GB/s", "rand write GB/s", "latency ns"], rows))
    d = result["dram"]
    print(
        f"\nDRAM: read {d['read_gbps']:.1f} GB/s, write {d['write_gbps']:.1f} GB/s, "
        f"copy {d['copy_gbps']:.1f} GB/s, latency {d['latency_ns']:.0f} ns"
    )
    q = result["block_depth"]
    sweep = ", ".join(f"{d}: {r:,.0f}" for d, r in zip(q["depths"], q["reads_per_s"], strict=True))
    print(
        f"block (the real disk), random 4 KiB reads/s by depth ({q['engine']}): {sweep}; tables read at depth {q['best_depth']}"
    )
    for s, line in result["staging"].items():
        r = line["read"]
        print(
            f"staging dram / {s}: read gains random {r['random']:.2f}, strided {r['strided']:.2f}, sequential "
            f"{r['sequential']:.2f} s/GB; copy in {line['t_1st']:.3f}, back {line['t_3rd']:.3f} s/GB"
        )
    print(f"wrote {path}")
    if args.json:
        write_json_atomic(args.json, result)
        print(f"wrote {args.json}")
    return 0


def _write(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_json_atomic(path, data)
