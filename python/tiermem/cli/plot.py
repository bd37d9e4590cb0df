"""Plots (matplotlib is imported only here, lazily)."""

from __future__ import annotations

from typing import Any


def plot_copy(res: dict[str, Any], path: str) -> None:
    """Copy bandwidth against size, one line per device pair, memcpy baselines dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    label = {n: (f"{n} (emulated)" if k == "emulated" else n) for n, k in res["devices"].items()}
    pairs = sorted({(r["src"], r["dst"]) for r in res["rows"]})
    for src, dst in pairs:
        rs = [r for r in res["rows"] if (r["src"], r["dst"]) == (src, dst)]
        ax.plot([r["size"] for r in rs], [r["gbps"] for r in rs], marker="o", ms=3, label=f"{label[src]} -> {label[dst]}")
    rs = [r for r in res["rows"] if (r["src"], r["dst"]) == pairs[0]]
    for key, style in (("memcpy_1t", ":"), ("memcpy_mt", "--"), ("numpy", "-.")):
        ax.plot([r["size"] for r in rs], [r["baselines"][key] for r in rs], "k" + style, label=f"{key} (DRAM)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("copy size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title("tiermem copy bandwidth per device pair")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
