"""``tiermem bench emulation``: every ``emulated:`` profile measured with the access patterns
tiermem issues (sequential and random reads and writes of 64 B, 256 B and 4 KiB), beside
the figure the profile cites for the same pattern (its sources: thesis ch. 2 for Optane,
the CXL papers it names) and beside this machine's DRAM doing the same accesses unthrottled.

A profile's cited figure is its bandwidth as a share of this machine's DRAM figures, of
which a random access smaller than the device's access granularity gets the share it asks
for (a 64-byte random read on Optane's 256-byte media: a quarter); sequential accesses
merge into whole blocks. Random accesses are charged with their latency hidden (the cited
bandwidths are at many threads in flight); the latency is a figure of its own
(``tiermem info``). Where this machine's DRAM cannot run a pattern as fast as the device
would (``DRAM-bound``), the emulated device cannot either: such a case is reported, not
held to its figure.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from .. import _tiermem
from .._sizes import format_bytes
from ..manager import Manager
from ..report.output import measured_cli
from ..report.progress import Progress
from ..report.table import table

#: Access sizes measured, bytes.
SIZES = (64, 256, 4096)
#: How close to its cited figure a case must come.
TOLERANCE = 0.10


def run(quick: bool, rounds: int | None = None) -> dict[str, Any]:
    """Measure every profile: ``rounds`` rounds (3 with ``quick``, else 5), each measuring
    DRAM and then every profile once, so a noisy stretch of the machine falls on all alike;
    each case's figure is the median over the rounds."""
    size = (32 if quick else 128) << 20
    rounds = rounds or (3 if quick else 5)
    names = [p["name"] for p in _tiermem.profiles()]
    sources = {p["name"]: p["source"] for p in _tiermem.profiles()}
    managers = {n: Manager({"dram": size + (8 << 20), f"emulated:{n}": size + (8 << 20)}, "all_fast") for n in names}
    samples: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    with Progress(rounds * (len(names) + 1), "bench emulation") as bar:
        for k in range(rounds):
            first = managers[names[0]]
            for f in first._native.measure_accesses(0, size, list(SIZES), 1):
                samples.setdefault(("dram", f["op"], f["pattern"], f["access_bytes"]), []).append(f)
            bar.step(f"round {k + 1}: dram")
            for n in names:
                for f in managers[n]._native.measure_accesses(1, size, list(SIZES), 1):
                    samples.setdefault((n, f["op"], f["pattern"], f["access_bytes"]), []).append(f)
                bar.step(f"round {k + 1}: {n}")
    dram = {key[1:]: median(f["gbps"] for f in fs) for key, fs in samples.items() if key[0] == "dram"}
    cases = []
    for (name, op, pattern, nbytes), fs in samples.items():
        if name == "dram":
            continue
        gbps = median(f["gbps"] for f in fs)
        cited = fs[0]["cited_gbps"]
        here = dram[(op, pattern, nbytes)]
        bound = here < cited * (1 + TOLERANCE)
        cases.append(
            {
                "profile": name,
                "op": op,
                "pattern": pattern,
                "access_bytes": nbytes,
                "gbps": gbps,
                "cited_gbps": cited,
                "ratio_to_cited": gbps / cited,
                "dram_gbps": here,
                "dram_bound": bound,
                "within_tolerance": None if bound else abs(gbps / cited - 1) <= TOLERANCE,
            }
        )
    return {
        "benchmark": "emulation",
        "region_bytes": size,
        "rounds": rounds,
        "statistic": f"median of {rounds} rounds, DRAM and every profile once per round",
        "tolerance": TOLERANCE,
        "dram_figures": _tiermem.dram_figures(),
        "sources": sources,
        "cases": cases,
    }


def report(res: dict[str, Any]) -> str:
    """A table of every case and the profiles' sources."""
    rows = [
        [
            c["profile"],
            c["op"],
            c["pattern"],
            format_bytes(c["access_bytes"]),
            f"{c['gbps']:.2f}",
            f"{c['cited_gbps']:.2f}",
            f"{c['ratio_to_cited']:.2f}",
            f"{c['dram_gbps']:.2f}",
            "DRAM-bound" if c["dram_bound"] else ("ok" if c["within_tolerance"] else "OFF"),
        ]
        for c in res["cases"]
    ]
    held = [c for c in res["cases"] if not c["dram_bound"]]
    ok = sum(bool(c["within_tolerance"]) for c in held)
    out = [
        table(
            ["profile", "op", "pattern", "access", "GB/s", "cited GB/s", "ratio", "DRAM here GB/s", ""],
            rows,
            title=f"emulated devices by access pattern ({res['statistic']}; region {format_bytes(res['region_bytes'])})",
        ),
        f"{ok} of {len(held)} cases within {res['tolerance']:.0%} of their cited figures; "
        f"{len(res['cases']) - len(held)} DRAM-bound here (this machine's DRAM cannot run the pattern as fast as the device would).",
    ]
    f = res["dram_figures"]
    out.append(
        f"cited figures are the profiles' ratios of this machine's DRAM ({f['read_gbps']:.1f} GB/s read, "
        f"{f['write_gbps']:.1f} GB/s write), at each device's access granularity. Sources:"
    )
    out += [f"  {n}: {s}" for n, s in res["sources"].items()]
    return "\n".join(out)


def plot(res: dict[str, Any], path: str) -> None:
    """Measured over cited per case, one bar each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = res["cases"]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(cases)), 4))
    labels = [f"{c['profile']} {c['op'][0]}{c['pattern'][0]} {c['access_bytes']}" for c in cases]
    colors = ["grey" if c["dram_bound"] else ("tab:green" if c["within_tolerance"] else "tab:red") for c in cases]
    ax.bar(range(len(cases)), [c["ratio_to_cited"] for c in cases], color=colors)
    for y in (1 - res["tolerance"], 1 + res["tolerance"]):
        ax.axhline(y, color="black", lw=0.6, ls="--")
    ax.set_xticks(range(len(cases)), labels, rotation=70, fontsize=7)
    ax.set_ylabel("measured / cited")
    ax.set_title("emulated devices against their cited figures (grey: DRAM-bound here)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_cli(args: Any) -> int:
    return measured_cli(args, lambda: run(args.quick), report, plot)
