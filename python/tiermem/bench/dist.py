"""``tiermem bench dist``: DLRM with sharded tables at 1, 2 and 4 processes on this
machine (gloo over loopback), table-wise and row-wise: seconds per step and their split
(lookup, exchange, dense, update), against the scaling model of
:mod:`tiermem.dist.scaling` priced with the collectives measured at each process count;
then the model extrapolated to 8-512 ranks on a network (``--bandwidth``, ``--latency``)
for tables of ``--rows`` rows in all.

On this two-core machine, four processes share two cores: the model prices the wait for a
peer that is not running in the collectives, probed with four busy ranks; the extrapolation
assumes a core per rank.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from statistics import median
from typing import Any

from ..dist import DistOptions, launch
from ..dist.scaling import PHASES, Network, StepModel, probe
from ..dlrm.model import DLRMConfig
from ..report.output import measured_cli
from ..report.progress import Progress
from ..report.table import table

PROCS = (1, 2, 4)
#: Runs of each measured point and calibration (without ``--quick``); the median counts.
REPEATS = 3
PEER_NOTE = (
    "TorchRec's DistributedModelParallel, table-wise on gloo (fbgemm's CPU tables with SGD fused into backward), every "
    "row in DRAM, beside tiermem's table-wise run in DRAM on the same model and batches; its row-wise sharding needs an "
    "asynchronous reduce_scatter that gloo lacks"
)
SHARDINGS = ("table", "row")


def _config(quick: bool) -> DLRMConfig:
    rows = tuple([40_000 if quick else 200_000] * 8)
    return DLRMConfig(
        rows=rows, dim=16, bottom_mlp=(64, 16), top_mlp=(64, 1), bag=4, batch_size=512 if quick else 2048, name="bench-dist"
    )


def _peer(c: DLRMConfig, steps: int, warmup: int, n: int, ours: dict[str, Any], repeats: int) -> dict[str, Any]:
    """TorchRec's ``DistributedModelParallel`` on ``n`` processes, table-wise, beside
    tiermem's table-wise run with every row in DRAM (the same thing, both ways), in turn
    ``repeats`` times: the median of each."""
    from ..dist import torchrec_peer
    from ..dist.train import max_difference

    o = DistOptions(c, sharding="table", placement="dram", steps=steps, warmup=warmup)
    pairs = [(launch(o, n), torchrec_peer.run(o, n)) for _ in range(repeats)]
    mine, peer = _median_run([m for m, _ in pairs]), _median_run([p for _, p in pairs])
    return {
        "nproc": n,
        "sharding": "table",
        "seconds_per_iter": peer["seconds_per_iter"],
        "tiermem_dram_seconds_per_iter": mine["seconds_per_iter"],
        "tiermem_seconds_per_iter": ours["seconds_per_iter"],
        "speedup_dram": peer["seconds_per_iter"] / mine["seconds_per_iter"],
        "max_loss_difference": max_difference(peer["losses"], mine["losses"]),
    }


def _launch(c: DLRMConfig, sharding: str, placement: str, steps: int, warmup: int, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tiermem-bench-dist-") as d:
        return launch(DistOptions(c, sharding=sharding, placement=placement, steps=steps, warmup=warmup, directory=d), n)


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median seconds per step (the machine's noise moves whole runs by 5-10 %)."""
    return sorted(runs, key=lambda r: r["seconds_per_iter"])[len(runs) // 2]


def _median_of(c: DLRMConfig, sharding: str, placement: str, steps: int, warmup: int, n: int, repeats: int) -> dict[str, Any]:
    """:func:`_median_run` of ``repeats`` runs of ``n`` processes, with every run's figure
    in ``repeats``."""
    rs = [_launch(c, sharding, placement, steps, warmup, n) for _ in range(repeats)]
    return {**_median_run(rs), "repeats": sorted(r["seconds_per_iter"] for r in rs)}


def _side(c: DLRMConfig, sharding: str, placement: str, steps: int, warmup: int, n: int) -> list[dict[str, Any]]:
    """``n`` one-process runs of ``c`` at once (no collective between them)."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _launch(c, sharding, placement, steps, warmup, 1), range(n)))


def _slowest(runs: list[dict[str, Any]], parts: tuple[str, ...]) -> dict[str, float]:
    """The seconds per step in ``parts`` of the split of the run slowest in them (the rank
    its peers wait for)."""
    r = max(runs, key=lambda r: sum(r["seconds"][k] for k in parts))
    return {k: r["seconds"][k] / r["timed_steps"] for k in parts}


def _side_by_side(
    c: DLRMConfig, sharding: str, placement: str, steps: int, warmup: int, n: int, repeats: int, cores: int
) -> dict[str, float]:
    """:func:`_side_by_side_once` ``repeats`` times: the median of each figure."""
    once = [_side_by_side_once(c, sharding, placement, steps, warmup, n, cores) for _ in range(repeats)]
    return {k: median(o[k] for o in once) for k in once[0]}


def _side_by_side_once(
    c: DLRMConfig, sharding: str, placement: str, steps: int, warmup: int, n: int, cores: int
) -> dict[str, float]:
    """A rank's own compute when ``n`` ranks share the machine, from ``min(n, cores)``
    one-process runs at once (each with a core, contending for memory as running ranks do;
    past a core per rank, the time-sharing is priced in the collectives): of the per-rank
    batch (a rank's dense work, and table-wise its lookups and updates: ``T / n`` tables for
    all ``B`` samples are as many rows as ``T`` tables for ``B / n``). A row-wise rank
    instead pools a bag of every table for each of the ``B`` samples, each bag holding the
    ``1 / n`` of its indices that fall in the rank's rows: its lookup and update come from
    runs of batch ``B``, bags of ``bag / n``, on tables of ``rows / n``."""
    k = min(n, cores)
    part = _side(replace(c, batch_size=c.batch_size // n), sharding, placement, steps, warmup, k)
    sparse = part
    if sharding == "row" and n > 1:
        shard_shape = replace(c, rows=tuple(max(1, r // n) for r in c.rows), bag=max(1, round(c.bag / n)))
        sparse = _side(shard_shape, sharding, placement, steps, warmup, k)
    if sparse is part:
        out = _slowest(part, PHASES)
    else:
        out = {**_slowest(part, ("dense",)), **_slowest(sparse, ("lookup", "update"))}
    return {**out, "compute_seconds": sum(out.values())}


def run(
    quick: bool,
    placement: str = "cached",
    rows: int = 1 << 32,
    bandwidth: float = 12.5e9,
    latency: float = 20e-6,
    progress: bool | None = None,
) -> dict[str, Any]:
    """One process at the per-rank batches (the model's compute), the collectives probed
    at each process count (its network), then the runs it predicts."""
    c = _config(quick)
    steps, warmup = (12, 4) if quick else (40, 10)
    repeats = 1 if quick else REPEATS
    runs: list[dict[str, Any]] = []
    nets: dict[tuple[int, str], Network] = {}
    models: dict[str, StepModel] = {}
    calibration: dict[str, list[dict[str, float]]] = {}
    cores = len(os.sched_getaffinity(0))
    from ..dist import torchrec_peer

    why_not = torchrec_peer.unavailable()
    peers: list[dict[str, Any]] = []
    with Progress(len(PROCS) * (3 * len(SHARDINGS) + (why_not is None)), "bench dist", progress) as bar:
        for sh in SHARDINGS:
            points = []
            for n in PROCS:
                points.append(
                    {"nproc": n, "batch": c.batch_size // n, **_side_by_side(c, sh, placement, steps, warmup, n, repeats, cores)}
                )
                bar.step(f"{sh}: {n} x 1 process")
            # The line for ranks with a core each (the extrapolation), from the counts that had.
            alone = [p for p in points if p["nproc"] <= cores]
            fixed, per_sample = StepModel.fit([p["batch"] for p in alone], [p["compute_seconds"] for p in alone])
            calibration[sh] = points
            models[sh] = StepModel(
                c.batch_size,
                c.num_tables,
                c.bag,
                c.dim,
                c.dense_parameters(),
                sh,
                fixed,
                per_sample,
                cores,
                measured={p["nproc"]: {k: p[k] for k in PHASES} for p in points},
            )
        for n in PROCS:
            for sh in SHARDINGS:
                # Between two collectives a rank computes for its step's compute over the
                # calls: its own work (past a core per rank, the time-sharing is in the probe).
                nets[n, sh] = probe(n, models[sh].gaps(n))
                bar.step(f"probe {sh} x{n}")
                r = _median_of(c, sh, placement, steps, warmup, n, repeats)
                per = {k: v / r["timed_steps"] for k, v in r["seconds"].items()}
                p = models[sh].step(n, nets[n, sh])
                runs.append(
                    {
                        "nproc": n,
                        "sharding": sh,
                        "seconds_per_iter": r["seconds_per_iter"],
                        "repeats": r["repeats"],
                        "exchange_seconds": per["exchange"],
                        "split": per,
                        "bytes_sent_per_iter": r["traffic"]["bytes_sent"] / steps,
                        "predicted_seconds_per_iter": p["seconds"],
                        "predicted_compute_seconds": p["compute"],
                        "predicted_exchange_seconds": p["exchange"],
                        "predicted_sparse_bytes_per_iter": p["sparse_bytes"],
                        "error": p["seconds"] / r["seconds_per_iter"] - 1,
                        "losses": r["losses"],
                    }
                )
                bar.step(f"{sh} x{n}")
                if sh == "table" and why_not is None:
                    peers.append(_peer(c, steps, warmup, n, r, repeats))
                    bar.step(f"torchrec x{n}")
    net = Network(latency, bandwidth)
    plan = []
    for sh in SHARDINGS:
        wide = replace(models[sh], cores=1 << 20, measured={})
        for n in (8, 16, 32, 64, 128, 256, 512):
            p = wide.step(n, net)
            plan.append({"nproc": n, "sharding": sh, "rows_per_rank": rows / n, "bytes_per_rank": rows / n * c.row_bytes, **p})
    return {
        "benchmark": "dist",
        "quick": quick,
        "config": c.to_dict(),
        "placement": placement,
        "cores": cores,
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "calibration": calibration,
        "models": {sh: {"fixed": m.fixed, "per_sample": m.per_sample} for sh, m in models.items()},
        "networks": {
            sh: {
                str(n): {"latency": v.latency, "bandwidth": v.bandwidth, "kinds": v.kinds}
                for (n, s), v in nets.items()
                if s == sh
            }
            for sh in SHARDINGS
        },
        "runs": runs,
        "extrapolation": {"rows": rows, "latency": latency, "bandwidth": bandwidth, "ranks": plan},
        "torchrec": None if why_not is not None else {"sharding": "table", "placement": "dram", "runs": peers},
        "torchrec_note": why_not or PEER_NOTE,
    }


def report(res: dict[str, Any]) -> str:
    from .._sizes import format_bytes

    body = [
        [
            str(r["nproc"]),
            r["sharding"],
            f"{r['seconds_per_iter'] * 1e3:.2f}",
            *(f"{r['split'][k] * 1e3:.2f}" for k in ("lookup", "exchange", "dense", "update")),
            f"{r['predicted_seconds_per_iter'] * 1e3:.2f}",
            f"{r['error'] * 100:+.0f}%",
            format_bytes(int(r["bytes_sent_per_iter"])),
        ]
        for r in res["runs"]
    ]
    head = ["procs", "sharding", "ms/step", "lookup", "exchange", "dense", "update", "model ms", "model err", "sent/step"]
    x = res["extrapolation"]
    plan = [
        [
            p["sharding"],
            str(p["nproc"]),
            f"{p['rows_per_rank']:.3g}",
            format_bytes(int(p["bytes_per_rank"])),
            f"{p['seconds'] * 1e3:.3f}",
            f"{p['compute'] * 1e3:.3f}",
            f"{p['exchange'] * 1e3:.3f}",
        ]
        for p in x["ranks"]
    ]
    worst = max(abs(r["error"]) for r in res["runs"])
    return "\n".join(
        [
            f"sharded DLRM ({res['placement']} placement, {res['cores']} cores, {res['steps']} steps of which "
            f"{res['warmup']} untimed, median of {res['repeats']} runs); model: a rank's compute from min(N, cores) one-process runs of the per-rank batch side by "
            "side (row-wise lookups and updates: the whole batch's bags, 1/N of their indices, 1/N of the rows), "
            "each kind of collective probed in a step's order between ranks busy for a rank's own compute; "
            f"largest model error {worst * 100:.0f}%",
            table(head, body),
            "",
            f"extrapolated ({x['rows']:.3g} rows, network {x['bandwidth'] / 1e9:.1f} GB/s and "
            f"{x['latency'] * 1e6:.0f} us per collective, a core per rank):",
            table(["sharding", "ranks", "rows/rank", "table/rank", "ms/step", "compute", "exchange"], plan),
            "torchrec: " + res["torchrec_note"],
            *_peer_table(res["torchrec"]),
        ]
    )


def _peer_table(peer: dict[str, Any] | None) -> list[str]:
    if peer is None:
        return []
    body = [
        [
            str(p["nproc"]),
            f"{p['seconds_per_iter'] * 1e3:.2f}",
            f"{p['tiermem_dram_seconds_per_iter'] * 1e3:.2f}",
            f"{p['speedup_dram']:.2f}x",
            f"{p['tiermem_seconds_per_iter'] * 1e3:.2f}",
            f"{p['max_loss_difference']:.2g}",
        ]
        for p in peer["runs"]
    ]
    head = ["procs", "torchrec ms", "tiermem dram ms", "tiermem speedup", "tiermem cached ms", "max loss diff"]
    return [table(head, body)]


def run_cli(args: Any) -> int:
    from ..report.plot import plot_dist

    return measured_cli(
        args,
        lambda: run(args.quick, args.placement, args.rows, args.bandwidth, args.latency),
        report,
        plot_dist,
    )
