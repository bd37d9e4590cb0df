"""Plots (matplotlib is imported only here, lazily)."""

from __future__ import annotations

import math
from typing import Any

from .._sizes import format_bytes


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: str, dpi: int) -> None:
    """Lay out, write and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def short_name(name: str, kind: str) -> str:
    """``block:/long/path`` -> ``block``; emulated devices say so."""
    if name.startswith("block:"):
        return "block (real SSD)"
    return f"{name} (emulated)" if kind == "emulated" else name


def plot_copy(res: dict[str, Any], path: str) -> None:
    """Copy bandwidth against size: one panel per source device, one line per destination,
    the DRAM memcpy and NumPy baselines in every panel."""
    plt = _pyplot()

    label = {n: short_name(n, k) for n, k in res["devices"].items()}
    sources = list(dict.fromkeys(r["src"] for r in res["rows"]))
    cols = 2
    rows_n = math.ceil(len(sources) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(12, 4 * rows_n), sharex=True, sharey=True, squeeze=False)
    sizes = sorted({r["size"] for r in res["rows"]})
    for ax, src in zip(axes.flat, sources):
        for dst in sources:
            rs = [r for r in res["rows"] if (r["src"], r["dst"]) == (src, dst)]
            ax.plot([r["size"] for r in rs], [r["gbps"] for r in rs], marker="o", ms=3, label=f"to {label[dst]}")
        base = [r for r in res["rows"] if r["src"] == src and r["dst"] == sources[0]]
        for key, style in (("memcpy_1t", ":"), ("memcpy_mt", "--"), ("numpy", "-.")):
            ax.plot([r["size"] for r in base], [r["baselines"][key] for r in base], "k" + style, lw=1, label=f"{key} (DRAM)")
        ax.set_title(f"from {label[src]}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([format_bytes(s).replace(".0", "") for s in sizes], rotation=45, fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(sources) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("GB/s")
    fig.suptitle(f"tiermem copy bandwidth ({res['cores']} cores, {res['kernels']} kernels)")
    _save(plt, fig, path, 100)


def plot_trace(trace: list[dict[str, Any]], path: str, title: str = "bytes moved per device") -> None:
    """Read and write bandwidth per device over time from ``Manager.record()`` samples
    (like thesis Fig. 4.6/4.8): reads above the axis, writes below."""
    plt = _pyplot()

    if not trace:
        raise ValueError("the trace is empty: record for longer than one interval")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ends = [s["t"] for s in trace]
    starts = [0.0, *ends[:-1]]
    dt = [b - a for a, b in zip(starts, ends)]
    t = [*starts, ends[-1]]
    for i, dev in enumerate(trace[0]["read"]):
        color = f"C{i}"
        r = [s["read"][dev] / d / 1e9 if d > 0 else 0 for s, d in zip(trace, dt)]
        w = [-s["written"][dev] / d / 1e9 if d > 0 else 0 for s, d in zip(trace, dt)]
        r, w = [*r, r[-1]], [*w, w[-1]]  # a step per interval, drawn from its start
        ax.step(t, r, where="post", color=color, label=f"{dev} read")
        ax.step(t, w, where="post", color=color, ls="--", label=f"{dev} written")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("seconds")
    ax.set_ylabel("GB/s (reads up, writes down)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    _save(plt, fig, path, 100)


def plot_embedding(res: dict[str, Any], path: str) -> None:
    """Width-64, bag-40 lookups and lookup + updates per distribution: tiermem's time for
    every placement (DRAM, cached over the slow tier, all on the slow tier; hit rates on the
    bars) against torch and FBGEMM with tables in DRAM."""
    plt = _pyplot()

    cases = [c for c in res["cases"] if c["width"] == 64 and c["bag"] == 40]
    dists = list(dict.fromkeys(c["dist"] for c in cases))
    ops = ["lookup", "lookup+update"]
    slow = res["slow_device"]["spec"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):

        def key(c: dict[str, Any]) -> str:
            return c["placement"] + (" admit" if c["policy"] == "admit" else "")

        placements = list(dict.fromkeys(key(c) for c in cases if c["op"] == op))
        n = len(placements) + 2
        width = 0.8 / n
        for d, dist in enumerate(dists):
            row = {key(c): c for c in cases if c["op"] == op and c["dist"] == dist}
            any_c = next(iter(row.values()))
            bars = [(p, row[p]["seconds"]["tiermem"], row[p]["hit_rate"]) for p in placements if p in row]
            bars += [("torch (DRAM)", any_c["seconds"]["torch"], None)]
            if any_c["seconds"].get("fbgemm"):
                bars += [("fbgemm (DRAM)", any_c["seconds"]["fbgemm"], None)]
            for k, (name, secs, hr) in enumerate(bars):
                x = d + (k - n / 2) * width
                label = name.replace(slow, "slow") + (" (emulated)" if name == slow or name.startswith("cached") else "")
                ax.bar(x, secs * 1e3, width, color=f"C{k}", label=label if d == 0 else None)
                if hr is not None:
                    ax.text(x, secs * 1e3, f"{hr:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_xticks(range(len(dists)))
        ax.set_xticklabels(dists)
        ax.set_ylabel("ms per batch (lower is better)")
        ax.set_title(f"{op}: {res['config']['tables']} tables, batch {res['config']['batch']}, width 64, bag 40")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"tiermem embedding tables; slow tier {slow} is EMULATED; numbers on bars: cache hit rate")
    _save(plt, fig, path, 100)


def plot_dlrm(res: dict[str, Any], breakdown_path: str, loss_path: str) -> None:
    """DLRM runs: per-iteration time split into lookup / update / dense per mode, one panel
    per input distribution (thesis Fig. 5.12); and training loss against time per mode."""
    plt = _pyplot()

    runs = res["runs"]
    dists = list(dict.fromkeys(r["dist"] for r in runs))
    emulated = any(k == "emulated" for k in res.get("devices", {}).values())
    note = " (slow tier emulated)" if emulated else ""
    fig, axes = plt.subplots(1, len(dists), figsize=(6 * len(dists), 4.2), squeeze=False, sharey=True)
    colors = {"lookup": "#4c72b0", "update": "#dd8452", "dense": "#55a868"}
    for ax, dist in zip(axes.flat, dists):
        rs = [r for r in runs if r["dist"] == dist]
        x = range(len(rs))
        bottom = [0.0] * len(rs)
        for part in ("lookup", "update", "dense"):
            v = [1e3 * r["breakdown"][part] for r in rs]
            ax.bar(x, v, bottom=bottom, color=colors[part], label=part)
            bottom = [a + b for a, b in zip(bottom, v)]
        ax.set_xticks(list(x), [r["mode"] for r in rs], rotation=20)
        ax.set_title(f"{dist} inputs")
        ax.set_ylabel("ms per iteration")
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(f"DLRM training step by phase{note}; 2lm-model is a model of the hardware cache")
    _save(plt, fig, breakdown_path, 120)

    fig, axes = plt.subplots(1, len(dists), figsize=(6 * len(dists), 4.2), squeeze=False)
    for ax, dist in zip(axes.flat, dists):
        for r in (r for r in runs if r["dist"] == dist):
            if r.get("losses"):
                ax.plot(r["loss_times"][-len(r["losses"]) :], r["losses"], label=r["mode"], lw=1.2)
        ax.set_title(f"{dist} inputs")
        ax.set_xlabel("seconds of this mode's training steps")
        ax.set_ylabel("BCE loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"DLRM loss over time{note}")
    _save(plt, fig, loss_path, 120)


def plot_train(res: dict[str, Any], out_dir: str) -> list[str]:
    """``bench train``: seconds per iteration against the fast budget per variant, all-fast
    and all-slow as lines (thesis Fig. 4.10); and bytes read and written per device and
    variant at the smallest budget (Fig. 4.8). One file of each per model."""
    import os

    plt = _pyplot()
    note = " (slow tier emulated)" if res.get("emulated") else ""
    slow = res["slow_device"]
    paths: list[str] = []

    def finish(fig: Any, ax: Any, file: str) -> str:
        ax.legend(fontsize=8)
        path = os.path.join(out_dir, file)
        _save(plt, fig, path, 120)
        return path

    for name, info in res["models"].items():
        runs = [r for r in res["runs"] if r["model"] == name and "error" not in r]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for pol in dict.fromkeys(r["policy"] for r in runs):
            rs = sorted((r for r in runs if r["policy"] == pol), key=lambda r: r["budget_bytes"] or 0)
            if rs[0]["measured_once"]:
                ax.axhline(rs[0]["seconds_per_iter"], ls="--", lw=1, color="k" if pol == "all-fast" else "r", label=pol)
                continue
            ax.plot([r["budget_bytes"] / 2**20 for r in rs], [r["seconds_per_iter"] for r in rs], "o-", label=pol)
        ax.set_xlabel("fast budget (MiB)")
        ax.set_ylabel("seconds per iteration")
        ax.set_title(f"{name}: footprint {info['footprint_bytes'] / 2**30:.2f} GiB{note}")
        ax.grid(alpha=0.3)
        paths.append(finish(fig, ax, f"{name}-time-vs-budget.png"))

        smallest = min((r for r in runs if not r["measured_once"]), key=lambda r: r["budget_bytes"], default=None)
        if smallest is None:
            continue
        at = [r for r in runs if r["ratio"] == smallest["ratio"]]
        fig, ax = plt.subplots(figsize=(8, 4.2))
        x = range(len(at))
        width = 0.2
        series = [("dram", "read"), ("dram", "written"), (slow, "read"), (slow, "written")]
        for i, (dev, kind) in enumerate(series):
            ax.bar(
                [j + (i - 1.5) * width for j in x],
                [r["bytes"][dev][kind] / 2**30 for r in at],
                width,
                label=f"{'fast' if dev == 'dram' else 'slow'} {kind}",
            )
        ax.set_xticks(list(x), [r["policy"] for r in at], rotation=20)
        ax.set_ylabel("GiB per iteration")
        ax.set_title(f"{name}: bytes per device at {smallest['ratio']} (slow:fast){note}")
        ax.grid(axis="y", alpha=0.3)
        paths.append(finish(fig, ax, f"{name}-bytes.png"))
    return paths


def plot_kernels(predicted: list[float], measured: list[float], path: str, title: str) -> None:
    """``tiermem plan --run --plot``: each kernel's predicted time against its measured time
    under the plan (log axes, the diagonal for reference)."""
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo = max(1e-7, min(min(predicted), min(measured)))
    hi = max(max(predicted), max(measured))
    ax.loglog([lo, hi], [lo, hi], color="grey", lw=1, label="predicted = measured")
    ax.scatter([max(lo, p) for p in predicted], [max(lo, m) for m in measured], s=6, alpha=0.6, label="kernels")
    ax.set_xlabel("predicted seconds")
    ax.set_ylabel("measured seconds")
    ax.set_title(f"{title}: kernels under the plan (slow tier emulated)", fontsize=9)
    ax.legend(fontsize=8)
    _save(plt, fig, path, 120)


def plot_staging(res: dict[str, Any], path: str) -> None:
    """``tiermem bench staging --plot``: each kernel's five variants against slow-only, and
    the suite's predicted against measured staging gain (correct decisions in one colour)."""
    plt = _pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    variants = list(res["staging"][0]["seconds"]) if res["staging"] else []
    width = 0.8 / max(1, len(variants))
    for i, v in enumerate(variants):
        xs = [k + i * width for k in range(len(res["staging"]))]
        a.bar(xs, [r["seconds"][v] / r["seconds"]["slow_only"] for r in res["staging"]], width, label=v)
    a.set_xticks([k + 0.4 - width / 2 for k in range(len(res["staging"]))], [r["kernel"] for r in res["staging"]], fontsize=8)
    a.set_ylabel("time / slow-only")
    a.set_title(f"kernels, slow tier {res['slow_device']}", fontsize=9)
    a.legend(fontsize=7)
    for ok, colour in ((True, "tab:green"), (False, "tab:red")):
        pts = [(r["predicted_gain"], r["measured_gain"]) for r in res["suite"] if r["correct"] == ok]
        if pts:
            b.scatter(*zip(*pts, strict=True), s=12, color=colour, label="correct" if ok else "wrong")
    b.axhline(0, color="grey", lw=0.8)
    b.axvline(0, color="grey", lw=0.8)
    b.set_xscale("symlog")
    b.set_yscale("symlog")
    b.set_xlabel("predicted T_boost / T_copy - 1")
    b.set_ylabel("measured T_boost / T_copy - 1 (device stall)")
    b.set_title(f"SpMV decision suite: {res['suite_accuracy'] * 100:.0f}% correct", fontsize=9)
    b.legend(fontsize=8)
    _save(plt, fig, path, 120)


def plot_traits(res: dict[str, Any], path: str) -> None:
    """``tiermem bench traits --plot``: the DGEMM application's seconds per commit strategy
    against the fast-memory limit, with the all-``large_cap`` and unlimited-``hbw`` lines."""
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for s in dict.fromkeys(r["strategy"] for r in res["traits"]):
        rows = sorted((r["fraction"], r["seconds"]) for r in res["traits"] if r["strategy"] == s)
        ax.plot([f * 100 for f, _ in rows], [t for _, t in rows], marker="o", label=s)
    ax.axhline(res["all_large_cap"], color="grey", ls="--", lw=1, label="all large_cap")
    ax.axhline(res["unlimited_hbw"], color="black", ls=":", lw=1, label="unlimited hbw")
    ax.set_xlabel("fast memory limit, % of the application's bytes")
    ax.set_ylabel("seconds per run")
    ax.set_title(f"DGEMM application by traits, slow tier {res['slow_device']}", fontsize=9)
    ax.legend(fontsize=8)
    _save(plt, fig, path, 120)


def plot_dist(res: dict[str, Any], path: str) -> None:
    """``tiermem bench dist --plot``: measured and modelled seconds per step against the
    process count per sharding (left), and the model extrapolated to more ranks (right)."""
    plt = _pyplot()

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.2))
    for sh in dict.fromkeys(r["sharding"] for r in res["runs"]):
        rows = sorted(
            (r["nproc"], r["seconds_per_iter"], r["predicted_seconds_per_iter"]) for r in res["runs"] if r["sharding"] == sh
        )
        line = ax.plot([n for n, _, _ in rows], [m * 1e3 for _, m, _ in rows], marker="o", label=f"{sh}-wise measured")
        ax.plot(
            [n for n, _, _ in rows], [p * 1e3 for _, _, p in rows], ls="--", color=line[0].get_color(), label=f"{sh}-wise model"
        )
    if res.get("torchrec"):
        peer = sorted(res["torchrec"]["runs"], key=lambda p: p["nproc"])
        for key, label, style, color in (
            ("seconds_per_iter", "TorchRec DMP, table-wise, DRAM", "s-", "grey"),
            ("tiermem_dram_seconds_per_iter", "table-wise, DRAM", "^-", "black"),
        ):
            ax.plot(
                [p["nproc"] for p in peer],
                [p[key] * 1e3 for p in peer],
                style,
                color=color,
                lw=1,
                label=label,
            )
    ax.set_xticks(sorted({r["nproc"] for r in res["runs"]}))
    ax.set_xlabel("processes")
    ax.set_ylabel("ms per step")
    ax.set_title(f"this machine ({res['cores']} cores, {res['placement']} shards)", fontsize=9)
    ax.legend(fontsize=8)
    x = res["extrapolation"]
    for sh in dict.fromkeys(p["sharding"] for p in x["ranks"]):
        pts = [p for p in x["ranks"] if p["sharding"] == sh]
        line = bx.plot([p["nproc"] for p in pts], [p["seconds"] * 1e3 for p in pts], marker="o", label=f"{sh}-wise step")
        bx.plot(
            [p["nproc"] for p in pts],
            [p["exchange"] * 1e3 for p in pts],
            ls=":",
            color=line[0].get_color(),
            label=f"{sh}-wise exchange",
        )
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.set_xlabel("ranks")
    bx.set_ylabel("ms per step (model)")
    bx.set_title(f"extrapolated: {x['bandwidth'] / 1e9:.1f} GB/s, {x['latency'] * 1e6:.0f} us per collective", fontsize=9)
    bx.legend(fontsize=8)
    _save(plt, fig, path, 120)
