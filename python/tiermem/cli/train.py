"""``tiermem train dlrm``: train (or run inference on) a DLRM in one or more modes."""

from __future__ import annotations

import argparse
import itertools
import os
from typing import Any

from .._sizes import format_bytes, parse_size
from ..dist.plan import PLACEMENTS, SHARDINGS
from ..embedding.block.admission import SPLITS
from ..embedding.config import table_dir
from ..exceptions import InvalidArgumentError
from ._args import int_list, integer, number


def add_parser(sub: Any) -> None:
    tr = sub.add_parser("train", help="train models over tiered memory")
    tsub = tr.add_subparsers(dest="model", required=True)
    p = tsub.add_parser(
        "dlrm",
        help="DLRM: reference, all-fast, fbgemm, all-slow, static, dynamic, 2lm-model and block modes side by side",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", default="demo", help="small, mlperf, large or demo")
    p.add_argument("--scale", type=number(0, 1e6, low_open=True), default=1.0, help="multiply every table's rows by this")
    p.add_argument("--dense-scale", type=number(0, 1e3, low_open=True), default=1.0, help="multiply the MLP widths by this")
    p.add_argument("--rows", type=int_list(","), help="rows per table, comma-separated (overrides the preset's)")
    p.add_argument("--dim", type=integer(1, 1 << 24), help="row width (overrides the preset's)")
    p.add_argument(
        "--bottom-mlp", type=int_list("-"), help="bottom MLP widths, e.g. 512-256-64 (the last must equal --dim for dot)"
    )
    p.add_argument("--top-mlp", type=int_list("-"), help="top MLP widths, ending in 1, e.g. 512-256-1")
    p.add_argument("--interaction", choices=("dot", "cat"))
    p.add_argument("--batch-size", type=integer(1, 1 << 24))
    p.add_argument("--bag", type=integer(1, 1 << 16), help="lookups per table per sample (synthetic data)")
    p.add_argument(
        "--modes",
        help="comma-separated modes (tiermem.dlrm.model.MODES; default reference,all-slow,static,dynamic,2lm-model, "
        "or all-fast,fbgemm,block with --slow table:DIR)",
    )
    p.add_argument("--dist", default="zipf", help="uniform, zipf or both comma-separated (synthetic data)")
    p.add_argument("--alpha", type=number(0, 100, low_open=True), default=1.0, help="Zipf exponent")
    p.add_argument("--criteo", metavar="TSV", help="train on a Criteo-format file instead of synthetic data")
    p.add_argument("--bad-lines", choices=("skip", "error"), default="skip", help="malformed Criteo lines")
    p.add_argument("--iters", type=integer(1, 10**9), default=50, help="timed iterations")
    p.add_argument("--warmup", type=integer(0, 10**9), default=5, help="iterations before timing (also the static profile)")
    p.add_argument(
        "--fast-budget",
        help="fast memory for the tables (default: a quarter of them); with --nproc and --placement cached, per rank, "
        "split over its shards by their hit-rate curves",
    )
    p.add_argument(
        "--slow",
        default="emulated:optane-pmem",
        help="slow device spec, or table:DIR (older: block:DIR): mode 'block' keeps the tables in files in DIR on the disk",
    )
    p.add_argument(
        "--block-split",
        default="curves",
        help="mode 'block': the budget over the block tables' caches by their miniature caches' curves over the warm-up "
        "batches (curves, the default) or the same fraction of each (even); both, comma-separated, train side by side",
    )
    p.add_argument(
        "--lr", type=number(0, 1e6, low_open=True), default=0.01, help="SGD learning rate (the DLRM reference's default)"
    )
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0)
    p.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (one mode only)")
    p.add_argument("--checkpoint-every", type=integer(0, 10**9), default=0, help="iterations between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--inference", action="store_true", help="forward passes only; report queries per second")
    p.add_argument("--out", metavar="DIR", help="write dlrm.json and plots into DIR")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument("--quick", action="store_true", help="half-size tables, few iterations")
    d = p.add_argument_group("distributed (tables sharded over --nproc processes, gloo over loopback)")
    d.add_argument("--nproc", type=integer(1, 1024), help="train over this many processes (torch.distributed)")
    d.add_argument("--sharding", choices=SHARDINGS, default="table", help="table-wise, row-wise or column-wise shards")
    d.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="cached",
        help="each rank's shards: in DRAM, cached over --slow, or in files under --slow table:DIR/rank<r>",
    )
    d.add_argument("--cache", type=number(0, 1, low_open=True), default=0.25, help="share of a shard's rows its cache holds")
    d.add_argument("--timeout", type=number(0, 86400, low_open=True), default=60.0, help="seconds a collective may wait")
    d.add_argument("--check-single", action="store_true", help="also train in one process and report the largest loss difference")


def _config(args: Any) -> Any:
    from ..dlrm.model import DLRMConfig

    over: dict[str, Any] = {}
    if args.rows:
        over["rows"] = args.rows
    for name in ("dim", "interaction", "batch_size", "bag"):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    if args.bottom_mlp:
        over["bottom_mlp"] = args.bottom_mlp
    if args.top_mlp:
        over["top_mlp"] = args.top_mlp
    if args.criteo:
        over["bag"] = 1
    scale = args.scale * (0.5 if args.quick else 1.0)
    return DLRMConfig.preset(args.preset, scale=scale, dense_scale=args.dense_scale, **over)


def run_train(args: Any) -> int:
    from ..dlrm.model import MODES, SLOW_MODES
    from ..dlrm.report import report, run_modes, write

    config = _config(args)
    if args.nproc:
        return _distributed(args, config)
    on_disk = table_dir(args.slow) is not None
    default = "all-fast,fbgemm,block" if on_disk else "reference,all-slow,static,dynamic,2lm-model"
    modes = [m.strip() for m in (args.modes or default).split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise InvalidArgumentError(f"modes {unknown}: known are {', '.join(MODES)}")
    if on_disk and (bad := [m for m in modes if m in SLOW_MODES]):
        raise InvalidArgumentError(
            f"--slow {args.slow} is a directory for table files; modes {bad} need a byte-addressable slow device "
            "(e.g. --slow emulated:optane-pmem): run them separately"
        )
    if not on_disk and "block" in modes:
        raise InvalidArgumentError("mode 'block' keeps its tables on the disk: pass --slow table:DIR (a directory on it)")
    dists = [d.strip() for d in args.dist.split(",") if d.strip()]
    budget = parse_size(args.fast_budget, "--fast-budget") if args.fast_budget else config.table_bytes // 4
    iters, warmup = (min(args.iters, 10), min(args.warmup, 3)) if args.quick else (args.iters, args.warmup)
    if args.criteo and len(config.rows) != 26:
        raise InvalidArgumentError(f"Criteo data has 26 categorical features; the model has {len(config.rows)} tables")
    if args.checkpoint:
        from .._files import check_writable

        check_writable(args.checkpoint, "--checkpoint")  # before any work, not after training
    splits = [s.strip() for s in args.block_split.split(",") if s.strip()]
    if not splits or any(s not in SPLITS for s in splits) or len(set(splits)) != len(splits):
        raise InvalidArgumentError(f"--block-split {args.block_split!r}: give {' or '.join(SPLITS)}, or both comma-separated")
    if args.checkpoint or args.inference:
        if len(modes) != 1 or len(dists) != 1 or len(splits) != 1:
            raise InvalidArgumentError("--checkpoint, --resume and --inference take one mode, distribution and block split")
        return _single(args, config, modes[0], dists[0], budget, iters, warmup)
    batches = None
    readers: list[Any] = []
    if args.criteo:
        batches = lambda dist: _criteo(args, config, readers)  # noqa: E731
        dists = ["criteo"]
    from ..report.load import MachineLoad

    with MachineLoad() as load:
        res = run_modes(
            config,
            modes,
            dists,
            iters=iters,
            warmup=warmup,
            fast_budget=budget,
            slow=args.slow,
            lr=args.lr,
            seed=args.seed,
            alpha=args.alpha,
            batches=batches,
            block_splits=splits,
        )
    res["load"] = load.summary()
    if readers:
        res["criteo"] = readers[-1].report()
    print(report(res))
    print(load.line())
    if readers and readers[-1].bad:
        print(f"skipped {readers[-1].bad} malformed lines of {readers[-1].lines}; first: {readers[-1].bad_examples[:3]}")
    paths = write(res, args.out, args.json)
    if paths:
        print("wrote " + ", ".join(paths))
    return 0


def _distributed(args: Any, config: Any) -> int:
    """``--nproc N``: the run over N processes; with ``--check-single``, beside the same run
    in one process."""
    from ..dist import DistOptions, launch
    from ..dist.train import max_difference, single_process_losses
    from ..report.load import MachineLoad

    if args.modes or args.checkpoint or args.inference:
        raise InvalidArgumentError("--nproc trains one run: drop --modes, --checkpoint, --inference")
    directory = ""
    if args.placement == "block":
        found = table_dir(args.slow)
        if found is None:
            raise InvalidArgumentError("--placement block keeps each rank's shards in files: pass --slow table:DIR")
        directory = found
        if not os.path.isdir(directory):
            raise InvalidArgumentError(f"--slow table:{directory}: no such directory")
    dist = args.dist.split(",")[0].strip()
    o = DistOptions(
        config,
        sharding=args.sharding,
        placement=args.placement,
        steps=min(args.iters, 10) if args.quick else args.iters,
        lr=args.lr,
        seed=args.seed,
        data_seed=args.seed,
        dist=dist,
        cache=args.cache,
        directory=directory,
        timeout=args.timeout,
        criteo=args.criteo or "",
        bad_lines=args.bad_lines,
        fast_bytes=parse_size(args.fast_budget, "--fast-budget") if args.fast_budget else 0,
    )
    with MachineLoad() as load:
        res = launch(o, args.nproc)
        ref = single_process_losses(o, args.nproc) if args.check_single else None
    from ..dist import ShardPlan
    from ..report.table import table

    plan = ShardPlan.from_dict(res["plan"])
    print(table(plan.header(), plan.table(config.row_bytes)))
    sec = res["seconds"]
    steps = len(res["losses"])
    print(
        f"dlrm over {args.nproc} processes, {args.sharding}-wise shards, placement {args.placement}: "
        f"{steps} steps, loss {res['losses'][0]:.5f} -> {res['losses'][-1]:.5f}; rank 0 per timed step: "
        + ", ".join(f"{k} {v / res['timed_steps'] * 1e3:.2f} ms" for k, v in sec.items())
    )
    if res.get("data_ran_out") is not None:
        print(f"stopped after {steps} steps: rank {res['data_ran_out']}'s part of {args.criteo} ran out")
    if ref is not None:
        res["single_process_losses"] = ref
        res["max_difference"] = max_difference(res["losses"], ref)
        print(f"largest loss difference from one process over {steps} steps: {res['max_difference']:.3g}")
    res["load"] = load.summary()
    print(load.line())
    if args.json:
        from .._files import write_json_atomic

        write_json_atomic(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _criteo(args: Any, config: Any, readers: list[Any], start: int = 0) -> Any:
    from ..dlrm.data import CriteoReader

    # Two batches parsed ahead on a thread while the model trains (the parser releases the GIL).
    r = CriteoReader(args.criteo, config.rows, config.batch_size, bad_lines=args.bad_lines, start=start, prefetch=2)
    readers.append(r)
    return iter(r)


def _single(args: Any, config: Any, mode: str, dist: str, budget: int, iters: int, warmup: int) -> int:
    """One mode with checkpoints, resume or inference."""
    from ..dlrm.data import SyntheticData
    from ..dlrm.model import PROFILED_MODES
    from ..dlrm.trainer import Trainer
    from ..report.progress import Progress

    readers: list[Any] = []
    synth = SyntheticData(
        config.rows, config.dense_features, config.batch_size, config.bag, dist=dist, alpha=args.alpha, seed=args.seed
    )
    prof = None
    if mode in PROFILED_MODES:
        # The first batches (the warm-up's) profile the input: Criteo's from a reader of
        # their own, so training still starts at the first line.
        n = max(1, warmup)
        prof = list(itertools.islice(_criteo(args, config, []), n)) if args.criteo else [synth.batch(i) for i in range(n)]
    t = Trainer(
        config,
        mode,
        fast_budget=budget,
        slow=args.slow,
        lr=args.lr,
        seed=args.seed,
        dist=dist,
        profile=prof,
        block_split=args.block_split.strip(),
    )
    data_state: dict[str, Any] = {}
    if args.resume:
        if not args.checkpoint or not os.path.isfile(args.checkpoint):
            raise InvalidArgumentError(f"--resume needs an existing --checkpoint, not {args.checkpoint!r}")
        data_state = t.load(args.checkpoint)
        print(f"resumed from {args.checkpoint} at iteration {t.step}")
    if args.criteo:
        batches = _criteo(args, config, readers, int(data_state.get("position", 0)))
        state = lambda: {"position": readers[-1].position}  # noqa: E731
    else:
        drawn = [t.step]  # batches drawn so far: the data state a checkpoint records

        def synthetic() -> Any:
            while True:
                drawn[0] += 1
                yield synth.batch(drawn[0] - 1)

        batches = synthetic()
        state = lambda: {"step": drawn[0]}  # noqa: E731
    total = warmup + iters
    with Progress(total, f"{'infer' if args.inference else 'train'} dlrm {mode}") as p:
        if args.inference:
            r = t.infer(batches, iters, warmup=warmup)
        else:
            r = t.train(
                batches,
                iters,
                warmup=warmup,
                checkpoint=args.checkpoint,
                checkpoint_every=args.checkpoint_every,
                data_state=state,
                on_step=lambda k, loss: p.step(f"loss {loss:.4f}"),
            )
    b = r.breakdown
    print(
        f"{mode} ({dist}): {1e3 * r.seconds_per_iter:.1f} ms per iteration (lookup {1e3 * b['lookup']:.1f}, "
        f"update {1e3 * b['update']:.1f}, dense {1e3 * b['dense']:.1f}); fast memory {format_bytes(r.fast_bytes_peak)} "
        f"of {format_bytes(r.fast_budget)}"
    )
    if r.queries_per_second is not None:
        print(f"inference: {r.queries_per_second:,.0f} queries/s")
    elif r.losses:
        print(f"loss {r.losses[0]:.4f} -> {r.losses[-1]:.4f} over iterations {t.step - len(r.losses) + 1}..{t.step}")
    if readers:
        rep = readers[-1].report()
        print(f"criteo: {rep['lines']} lines read, {rep['bad_lines']} malformed skipped")
    res = {
        "config": config.to_dict(),
        "fast_budget": budget,
        "table_bytes": config.table_bytes,
        "iters": r.iters,
        "warmup": warmup,
        "runs": [r.to_json()],
        "devices": r.devices,
    }
    paths = []
    from ..dlrm.report import write

    paths = write(res, args.out, args.json, plot=not args.inference)
    if paths:
        print("wrote " + ", ".join(paths))
    return 0
