"""``tiermem info``: the machine's memory devices, topology and figures."""

from __future__ import annotations

import json
from typing import Any

from .. import (
    MEMORY_SPACE_ENV,
    _calibrated_devices,
    _read_calibration,
    _tiermem,
    calibration_path,
    dram_figures,
    memory_spaces,
    profiles,
    topology,
)
from .._sizes import format_bytes
from ..exceptions import InvalidArgumentError
from ..report.table import table


def gather() -> dict[str, Any]:
    """Everything ``info`` shows, as plain data."""
    topo = topology()
    dram = dram_figures()
    cal = _read_calibration()
    measured = _calibrated_devices()
    devices = [
        {
            "name": "dram",
            "kind": "dram",
            "real": "real",
            "byte_addressable": True,
            "available_bytes": topo["mem_available"],
            "read_gbps": dram["read_gbps"],
            "write_gbps": dram["write_gbps"],
            "latency_ns": dram["latency_ns"],
            "figures": dram["source"],
        }
    ]
    for n in topo["nodes"]:
        devices.append(
            {
                "name": f"numa:{n['id']}",
                "kind": "numa",
                "real": "real",
                "byte_addressable": True,
                "available_bytes": n["free_bytes"],
                "cpus": n["cpus"] or "none (memory-only node)",
                "distances": n["distances"],
                "memory_tier": n["memory_tier"],
                "declared": n["declared"],
                "read_gbps": (n["declared"] or {}).get("read_gbps"),
                "write_gbps": (n["declared"] or {}).get("write_gbps"),
                "latency_ns": (n["declared"] or {}).get("read_latency_ns"),
                "figures": (
                    "calibrated"
                    if f"numa:{n['id']}" in measured
                    else "declared (HMAT)"
                    if n["declared"]
                    else "not measured (no HMAT)"
                ),
            }
        )
    for p in profiles():
        devices.append(
            {
                "name": f"emulated:{p['name']}",
                "kind": "emulated",
                "real": "emulated",
                "byte_addressable": True,
                "available_bytes": topo["mem_available"],
                "read_gbps": dram["read_gbps"] * p["read_ratio"],
                "write_gbps": dram["write_gbps"] * p["write_ratio"],
                "latency_ns": dram["latency_ns"] * p["latency_ratio"],
                "figures": f"profile x {dram['source']} DRAM",
                "source": p["source"],
            }
        )
    for name, fig in measured.items():
        for d in devices:
            if d["name"] == name:
                d["measured"] = fig
                if d["kind"] == "numa":  # calibrated figures win over declared ones
                    d["read_gbps"], d["write_gbps"] = fig["seq_read_gbps"], fig["seq_write_gbps"]
                    d["latency_ns"] = fig["latency_ns"]
        if name.startswith("block:") and not any(d["name"] == name for d in devices):
            devices.append(
                {
                    "name": name,
                    "kind": "block",
                    "real": "real",
                    "byte_addressable": False,
                    "figures": "calibrated",
                    "measured": fig,
                    "read_gbps": fig["seq_read_gbps"],
                    "write_gbps": fig["seq_write_gbps"],
                    "latency_ns": fig["latency_ns"],
                }
            )
    return {
        "version": _tiermem.__version__,
        "topology": topo,
        "memory_spaces": _spaces(),
        "dram": dram,
        "kernels": _tiermem.kernel_isa(),
        "calibration_file": calibration_path(),
        "calibrated": cal is not None,
        "devices": devices,
        "kinds": {
            "dram": "anonymous memory, huge pages where allowed, pre-faulted",
            "numa:N": "memory bound to NUMA node N (CXL, HBM, Optane flat mode appear as nodes)",
            "mapped:PATH": "a file mapped shared (persistent memory on a DAX file system)",
            "block:PATH": "an SSD file with direct I/O in aligned blocks (not byte-addressable)",
            "emulated:PROFILE": "DRAM throttled to a published device, labelled emulated",
        },
    }


def _spaces() -> dict[str, Any]:
    """The memory-space mapping; a machine whose sysfs shows no node with memory (or a
    malformed override) gets an empty mapping whose note says why, not a failed ``info``."""
    try:
        return memory_spaces()
    except InvalidArgumentError as e:
        return {"spaces": [], "views": [], "notes": [str(e)]}


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    return "" if x is None else fmt.format(x)


def print_spaces(sp: dict[str, Any]) -> None:
    """The memory-space mapping and each node's view of it, as ``tiermem info`` shows them."""
    print(f"memory spaces (override with {', '.join(MEMORY_SPACE_ENV.values())}):")
    for s in sp["spaces"]:
        nodes = ",".join(str(n) for n in s["nodes"])
        print(f"  {s['space']:<10} -> nodes {nodes:<8} from {s['source']}: {s['why']}")
    print("per source node, candidates by distance and each space in that order:")
    for v in sp["views"]:
        near = " ".join(f"{n}({'?' if d is None else d})" for n, d in v["by_distance"])
        per = "; ".join(f"{name} {' '.join(str(n) for n in nodes)}" for name, nodes in v["spaces"])
        print(f"  node {v['node']}: {near}  |  {per}")
    for n in sp["notes"]:
        print(f"  note: {n}")


def run_info(args: Any) -> int:
    if args.sysfs:
        sp = memory_spaces(sysfs=args.sysfs)
        if args.json:
            print(json.dumps(sp, indent=1))
        else:
            print(f"sysfs tree {args.sysfs}")
            print_spaces(sp)
        return 0
    data = gather()
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    topo = data["topology"]
    llc = f", last-level cache {format_bytes(topo['last_level_cache'])}" if topo["last_level_cache"] else ""
    print(f"tiermem {data['version']}  ({topo['cpus']} CPUs{llc}, copy kernels {data['kernels']}, THP {topo['thp']})")
    print(
        f"DRAM figures: {data['dram']['source']}"
        + ("" if data["calibrated"] else " (run `tiermem calibrate` to keep measured figures)")
    )
    print()
    rows = []
    for d in data["devices"]:
        rows.append(
            [
                d["name"],
                d["real"],
                "yes" if d["byte_addressable"] else "no (blocks)",
                format_bytes(d["available_bytes"]) if d.get("available_bytes") else "",
                _f(d.get("read_gbps")),
                _f(d.get("write_gbps")),
                _f(d.get("latency_ns"), "{:.0f}"),
                d["figures"],
            ]
        )
    print(table(["device", "real", "byte-addr", "available", "read GB/s", "write GB/s", "latency ns", "figures"], rows))
    print()
    print("NUMA topology:")
    for n in topo["nodes"]:
        tier = f", memory tier {n['memory_tier']}" if n["memory_tier"] is not None else ""
        print(
            f"  node {n['id']}: {format_bytes(n['total_bytes'])} total, {format_bytes(n['free_bytes'])} free, "
            f"cpus {n['cpus'] or 'none'}, distances {n['distances']}{tier}"
        )
    if not topo["nodes"]:
        print("  (no NUMA information in sysfs)")
    print()
    print_spaces(data["memory_spaces"])
    print()
    print("device kinds:")
    for k, v in data["kinds"].items():
        print(f"  {k:<18} {v}")
    for d in data["devices"]:
        if d.get("source"):
            print(f"  {d['name']} figures: {d['source']}")
    return 0
