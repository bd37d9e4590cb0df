"""``tiermem`` command: ``info``, ``calibrate``, ``bench copy``, ``bench embedding``, ``bench dispatch``,
``bench blockio``, ``bench ssd``, ``bench tensors`` (alias ``bench train``), ``bench plan``, ``bench staging``,
``bench traits``, ``bench emulation``, ``bench criteo``, ``plan``, ``train dlrm``,
``stress``, ``demo``."""

from __future__ import annotations

import argparse
import sys

from ..exceptions import InvalidArgumentError, TiermemError
from ._args import int_list, integer, number


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (CI, demos)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiermem", description="Tiered memory for large ML workloads.")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="devices, discovered topology, bandwidth and latency")
    info.add_argument("--json", action="store_true", help="print JSON instead of a report")
    info.add_argument(
        "--sysfs",
        metavar="DIR",
        help="show the memory spaces of the machine whose sysfs tree is DIR (e.g. tests/fixtures/sysfs/knl-snc4-flat)",
    )

    cal = sub.add_parser("calibrate", help="measure every device and keep the figures")
    _add_output(cal)
    cal.add_argument("--dir", help="directory for the block-device scratch file (default: a disk-backed temp dir)")
    cal.add_argument("--size", default="256 MiB", help="scratch size per device (default 256 MiB)")

    bench = sub.add_parser("bench", help="benchmarks: tiermem against its baselines in one run")
    bsub = bench.add_subparsers(dest="bench", required=True)
    copy = bsub.add_parser("copy", help="copy bandwidth per device pair vs memcpy and numpy")
    _add_output(copy)
    copy.add_argument("--dir", help="directory for the block-device file (default: a disk-backed temp dir)")
    copy.add_argument(
        "--devices", nargs="+", help="device specs to include (default: dram, emulated:optane-pmem, emulated:cxl, block)"
    )
    copy.add_argument("--max-size", help="largest copy (default 1 GiB, 256 MiB with --quick)")
    copy.add_argument("--plot", metavar="PNG", help="write a bandwidth-vs-size plot (needs matplotlib)")
    emb = bsub.add_parser("embedding", help="embedding lookups and updates vs torch and FBGEMM, DRAM and tiered")
    _add_output(emb)
    emb.add_argument("--plot", metavar="PNG", help="write a chart of the tiered cases (needs matplotlib)")
    bio = bsub.add_parser("blockio", help="random rows of a block table file vs the disk's random reads (real disk)")
    _add_output(bio)
    bio.add_argument("--dir", help="directory on the disk to measure (default: a disk-backed temp dir)")
    bio.add_argument("--size", help="table file and device size (default 1 GiB, 256 MiB with --quick)")
    ssd = bsub.add_parser("ssd", help="block tables on the real disk: layouts, admission, miniature caches, miss path (Bandana)")
    _add_output(ssd)
    ssd.add_argument("--plot", metavar="PNG", help="write effective bandwidth and hit rates per case (needs matplotlib)")
    ssd.add_argument("--dir", help="directory on the disk for the table files (default: a disk-backed temp dir)")
    ssd.add_argument(
        "--trace", metavar="FILE", help="a trace file (.npz, tiermem.embedding.block.traces) instead of the generated traces"
    )
    ssd.add_argument(
        "--train-fraction", type=float, default=0.5, help="share of the queries layouts and admission train on (default 0.5)"
    )
    ssd.add_argument("--cache", metavar="PCTS", help="cache sizes in percent of the table (default 1,5,20; 5 with --quick)")
    ssd.add_argument("--no-dlrm", action="store_true", help="leave out the DLRM runs")
    ssd.add_argument(
        "--dlrm-model",
        metavar="NAME[:SCALE],...",
        help="the DLRM runs' models, one after another: presets with their rows scaled (default demo,mlperf:0.04: "
        "lookup-bound and dense-bound; demo:0.25 with --quick; e.g. large:0.02)",
    )
    ssd.add_argument(
        "--rows", type=integer(1024, 1 << 30), help="rows of the generated traces' tables (default 2^20, 2^17 with --quick)"
    )
    ssd.add_argument(
        "--queries", type=integer(100, 1 << 30), help="queries per generated trace (default 200000, 30000 with --quick)"
    )
    stg = bsub.add_parser(
        "staging",
        help="pattern-aware staging on six HPC kernels and a suite of SpMV patterns vs slow-only, first-touch, 2LM, always-stage",
    )
    _add_output(stg)
    stg.add_argument(
        "--plot", metavar="PNG", help="write the kernels' variants and the suite's predicted vs measured gains (needs matplotlib)"
    )
    stg.add_argument("--reps", type=integer(1, 100), help="interleaved runs per figure (default 5, 3 with --quick)")
    stg.add_argument(
        "--chunk",
        metavar="SIZE",
        help="the kernels' target (the staged chunk): a power of two such as '1GiB' (default 512 MiB, 8 MiB with --quick)",
    )
    trt = bsub.add_parser(
        "traits", help="a multi-DGEMM application allocated by traits: FIFO, SIZE, PRIORITY, GAIN over fast-memory limits"
    )
    _add_output(trt)
    trt.add_argument("--plot", metavar="PNG", help="write seconds against the fast limit per strategy (needs matplotlib)")
    trt.add_argument("--reps", type=integer(1, 100), help="runs per figure (default 5, 3 with --quick)")
    emu = bsub.add_parser(
        "emulation", help="each emulated profile by access pattern and size against the figures it cites, beside DRAM"
    )
    _add_output(emu)
    emu.add_argument("--plot", metavar="PNG", help="write measured over cited per case (needs matplotlib)")
    cri = bsub.add_parser("criteo", help="the core Criteo reader vs the Python reference on one file: lines/s, identical batches")
    _add_output(cri)
    cri.add_argument("--lines", type=integer(1000, 1 << 32), help="synthetic lines (default 1,000,000; 100,000 with --quick)")
    cri.add_argument("--file", metavar="TSV", help="read this Criteo file instead of a synthetic one")
    cri.add_argument("--reps", type=integer(1, 100), help="core reader runs (default 3, 1 with --quick)")
    dst = bsub.add_parser(
        "dist", help="DLRM with sharded tables at 1, 2 and 4 processes: step time and split against the scaling model"
    )
    _add_output(dst)
    dst.add_argument("--plot", metavar="PNG", help="write measured and modelled step times (needs matplotlib)")
    dst.add_argument(
        "--placement", choices=("dram", "cached", "block"), default="cached", help="where each rank keeps its shards"
    )
    dst.add_argument("--rows", type=integer(1, 1 << 50), default=1 << 32, help="rows in all, for the extrapolation")
    dst.add_argument("--bandwidth", type=number(1, 1e15), default=12.5e9, help="bytes/s per rank, for the extrapolation")
    dst.add_argument("--latency", type=number(0, 1), default=20e-6, help="seconds per collective, for the extrapolation")
    dis = bsub.add_parser("dispatch", help="per-op cost of tiered tensors vs plain tensors and a trivial wrapper subclass")
    _add_output(dis)
    conf = bsub.add_parser(
        "conformance", help="PyTorch's operator and module databases (op_db, module_db) run through tiered tensors"
    )
    _add_output(conf)
    conf.add_argument("--dtypes", default=None, help="comma-separated torch dtypes (default float32,bfloat16)")
    conf.add_argument(
        "--samples", type=integer(1, 1 << 20), default=None, help="samples per op and dtype (default: all; 2 with --quick)"
    )
    tr = bsub.add_parser(
        "tensors",
        aliases=["train"],
        help="train a model with tiered tensors: every variant vs all-fast and the 2LM model (alias: train)",
    )
    _add_output(tr)
    tr.add_argument(
        "--model",
        action="append",
        help="model to train, a name in tiermem.bench.models.WORKLOADS (repeatable; default resnet)",
    )
    tr.add_argument("--ratio", action="append", metavar="SLOW:FAST", help="slow:fast ratio (repeatable; default 1:1 4:1 8:1)")
    tr.add_argument("--variants", help="comma-separated subset of the variants (default all; tiermem.torch.tensors.VARIANTS)")
    tr.add_argument("--iters", type=integer(1, 10**6), help="timed iterations per run (default 2, 1 with --quick)")
    tr.add_argument(
        "--rounds",
        type=integer(1, 1000),
        help="times every run is repeated, all in turn; the best counts (default 2, 1 with --quick)",
    )
    tr.add_argument(
        "--stat",
        choices=("best", "median"),
        default="best",
        help="per run: the best timed iteration over all rounds, or their median (default best)",
    )
    tr.add_argument("--batch", type=integer(1, 1 << 20), help="batch size (default: the model's; small with --quick)")
    tr.add_argument("--slow", default="emulated:optane-pmem", help="slow device spec (default emulated:optane-pmem)")
    tr.add_argument("--out", metavar="DIR", help="write train.json and the plots (time vs budget, bytes per device) to DIR")
    bp = bsub.add_parser(
        "plan",
        help="the planner on the four workloads (planned vs LM, async, first-touch, 2LM, all-fast) and on generated graphs",
    )
    _add_output(bp)
    bp.add_argument("--model", action="append", help="workload (repeatable; default resnet densenet vgg gpt)")
    bp.add_argument("--ratio", action="append", metavar="SLOW:FAST", help="slow:fast ratio (repeatable; default 4:1 8:1)")
    bp.add_argument("--iters", type=integer(1, 10**6), help="timed iterations per run (default 2, 1 with --quick)")
    bp.add_argument(
        "--rounds",
        type=integer(1, 1000),
        help="times every run is repeated, all in turn; the best counts (default 3, 1 with --quick)",
    )
    bp.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per plan (default 60)")
    bp.add_argument(
        "--sizes",
        type=int_list(",", 2),
        help="kernels of the generated graphs the solver is timed on, comma-separated "
        "(default 32,122,242,500,1000,2000; 32,122,500 with --quick)",
    )
    bp.add_argument("--slow", default="emulated:optane-pmem", help="slow device spec (default emulated:optane-pmem)")
    bp.add_argument(
        "--profile-cache",
        metavar="FILE",
        help="pool kernels' measured slow-downs with this kernel profile cache and add to it (default: none, each "
        "capture alone, so runs stay independent)",
    )
    from ..plan.solve import DEFAULT_FORMULATION, FORMULATIONS

    bp.add_argument(
        "--formulation",
        choices=FORMULATIONS,
        default=DEFAULT_FORMULATION,
        help=f"the planned runs' formulation (default {DEFAULT_FORMULATION})",
    )
    bp.add_argument(
        "--pairs",
        type=integer(0, 1000),
        help="planned against all-fast, LM, async and first-touch iteration by iteration, this many timed pairs each "
        "(median; default 3, 1 with --quick; 0: none)",
    )
    pl = sub.add_parser("plan", help="plan where every tensor of a training step lives and when it moves (AutoTM, HiGHS)")
    pl.add_argument("--model", help="bundled workload to record (resnet, densenet, vgg, gpt)")
    pl.add_argument(
        "--script",
        metavar="FILE",
        help="your own step: a Python file defining model, batch, optimizer and loss (or step = TrainStep(...))",
    )
    pl.add_argument("--graph", metavar="FILE", help="plan a saved graph (tiermem-graph-1 JSON) instead of recording a model")
    pl.add_argument("--ratio", default="8:1", metavar="SLOW:FAST", help="slow:fast ratio of the fast budget (default 8:1)")
    pl.add_argument(
        "--formulation",
        choices=FORMULATIONS,
        default=DEFAULT_FORMULATION,
        help="static placement, synchronous moves, or moves that may overlap a kernel on a copy thread (async; "
        f"default {DEFAULT_FORMULATION})",
    )
    pl.add_argument("--time-limit", type=float, default=60.0, help="solver seconds (0: the greedy plan alone; default 60)")
    pl.add_argument("--gap", type=float, default=0.01, help="stop at this certified relative gap (default 0.01)")
    pl.add_argument("--batch", type=integer(1, 1 << 20), help="batch size (default: the workload's)")
    pl.add_argument("--slow", default="emulated:optane-pmem", help="slow device spec (default emulated:optane-pmem)")
    pl.add_argument(
        "--profile-cache",
        metavar="FILE",
        help="kernel profile cache to pool measured slow-downs with and add to (default $TIERMEM_PROFILES, else "
        "~/.cache/tiermem/kernel-profiles.json)",
    )
    pl.add_argument("--no-profile-cache", action="store_true", help="pool kernels within this capture only")
    pl.add_argument("--save-graph", metavar="FILE", help="write the recorded graph (JSON) to FILE")
    pl.add_argument("--save-plan", metavar="FILE", help="write the plan to FILE (default plan-<graph>.json)")
    pl.add_argument(
        "--against",
        metavar="VARIANTS",
        help="comma-separated runtime variants (first-touch, LM, async) to record, price with the same cost model "
        "beside the plan, and offer the solver as starting plans",
    )
    pl.add_argument("--run", action="store_true", help="train under the plan and compare predicted with measured")
    pl.add_argument("--iters", type=integer(2, 10**6), default=3, help="timed iterations of --run (default 3)")
    pl.add_argument("--plot", metavar="PNG", help="with --run: predicted against measured per kernel")
    pl.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    from .train import add_parser as add_train

    add_train(sub)
    st = sub.add_parser(
        "stress", help="random mixes of every operation on several threads, checked against a shadow model under a watchdog"
    )
    st.add_argument("--seconds", type=integer(1, 86400), default=60, help="how long (default 60)")
    st.add_argument("--threads", type=integer(1, 256), default=4, help="worker threads (default 4)")
    st.add_argument("--seed", type=integer(0, 2**31), default=0)
    st.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    demo = sub.add_parser("demo", help="train a DLRM 4x larger than its fast memory in every mode and compare")
    demo.add_argument("--quick", action="store_true", help="half-size tables, fewer iterations (under two minutes)")
    demo.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    demo.add_argument("--out", metavar="DIR", help="results folder (default results/demo-<time>)")
    return parser


def _prepare_outputs(args: argparse.Namespace) -> None:
    """Create the folders ``--json``, ``--plot`` and ``--out`` write into, and check that the
    files can be written, before any work starts, so a long run cannot end in a missing-folder
    or unwritable-file error and lose its results."""
    import os

    from .._files import check_writable

    files = [(opt, p) for opt in ("json", "plot") if isinstance(p := getattr(args, opt, None), str)]
    out = getattr(args, "out", None)
    for d in [*(os.path.dirname(p) for _, p in files), out if isinstance(out, str) else ""]:
        if not d:
            continue
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise InvalidArgumentError(f"cannot create the output folder {d!r}: {e.strerror}") from None
    for opt, p in files:
        check_writable(p, f"--{opt}")


#: Commands that measure: every device of their managers is faulted in before it is used,
#: so no first-touch page fault reaches a timing (the library's default faults the slower
#: devices in on a background thread).
_MEASURING = ("bench", "calibrate", "demo", "train", "stress", "plan")


def _exit_on_signals() -> None:
    """SIGTERM and SIGHUP end the command as Ctrl-C does (an exception, then the exit
    handlers): the files it made are removed on every exit short of SIGKILL."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, stop)


def _configure_logging() -> None:
    """The library logs through ``logging`` (a logger per module under ``tiermem``); the
    command shows warnings and worse on stderr, or the level ``TIERMEM_LOG`` names."""
    import logging
    import os

    name = os.environ.get("TIERMEM_LOG", "WARNING").upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise InvalidArgumentError(f"TIERMEM_LOG={name!r}: a logging level (DEBUG, INFO, WARNING, ERROR)")
    logging.basicConfig(level=level, format="tiermem: %(name)s: %(message)s", stream=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging()
    _exit_on_signals()
    if args.command in _MEASURING:
        import os

        os.environ.setdefault("TIERMEM_PREFAULT", "now")
    try:
        _prepare_outputs(args)
        if args.command == "info":
            from .info import run_info

            return run_info(args)
        if args.command == "calibrate":
            from .calibrate import run_calibrate

            return run_calibrate(args)
        if args.command == "bench" and args.bench == "copy":
            from ..bench.copy import run_cli

            return run_cli(args)
        if args.command == "bench" and args.bench == "embedding":
            from ..bench.embedding import run_cli as run_embedding

            return run_embedding(args)
        if args.command == "bench" and args.bench == "blockio":
            from ..bench.blockio import run_cli as run_blockio

            return run_blockio(args)
        if args.command == "bench" and args.bench == "ssd":
            from ..bench.ssd import run_cli as run_ssd

            return run_ssd(args)
        if args.command == "bench" and args.bench == "staging":
            from ..bench.staging import run_cli as run_staging

            return run_staging(args)
        if args.command == "bench" and args.bench == "traits":
            from ..bench.traits import run_cli as run_traits

            return run_traits(args)
        if args.command == "bench" and args.bench == "emulation":
            from ..bench.emulation import run_cli as run_emulation

            return run_emulation(args)
        if args.command == "bench" and args.bench == "criteo":
            from ..bench.criteo import run_cli as run_criteo

            return run_criteo(args)
        if args.command == "bench" and args.bench == "dist":
            from ..bench.dist import run_cli as run_dist

            return run_dist(args)
        if args.command == "bench" and args.bench == "conformance":
            from ..bench.conformance import run_cli as run_conformance

            return run_conformance(args)
        if args.command == "bench" and args.bench == "dispatch":
            from ..bench.dispatch import run_cli as run_dispatch

            return run_dispatch(args)
        if args.command == "bench" and args.bench in ("tensors", "train"):
            from ..bench.tensors import run_cli as run_train_bench

            return run_train_bench(args)
        if args.command == "bench" and args.bench == "plan":
            from ..bench.plan import run_cli as run_plan_bench

            return run_plan_bench(args)
        if args.command == "plan":
            from ..bench.plan import run_plan_cli

            return run_plan_cli(args)
        if args.command == "train":
            from .train import run_train

            return run_train(args)
        if args.command == "stress":
            from ..stress import main_cli as run_stress

            return run_stress(args)
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args)
    except TiermemError as e:
        print(f"tiermem: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tiermem: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tiermem info | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
