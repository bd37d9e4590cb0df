"""``tiermem demo``: train a DLRM whose embedding tables are four times the fast-memory
budget the demo sets itself, on uniform and Zipf(1) inputs, in every mode, and compare."""

from __future__ import annotations

import datetime
import os
from typing import Any


def run_demo(args: Any) -> int:
    import torch

    from .._sizes import format_bytes
    from ..dlrm.model import MODES, DLRMConfig
    from ..dlrm.report import report, run_modes, write
    from ..dlrm.trainer import available_memory
    from ..report.load import MachineLoad

    quick = bool(args.quick)
    scale = 0.5 if quick else 1.0
    # The five modes run in lockstep, all alive at once: the reference's tables, four slow
    # tiers holding them and four fast budgets of a quarter each: about 6x the tables. Shrink
    # the tables to fit in 60 % of the memory this machine has available.
    full = DLRMConfig.preset("demo", scale=scale).table_bytes
    avail = available_memory()
    if avail and 6 * full > 0.6 * avail:
        scale *= 0.6 * avail / (6 * full)
    config = DLRMConfig.preset("demo", scale=scale)
    budget = config.table_bytes // 4
    warmup, iters = (4, 8) if quick else (10, 40)
    torch.manual_seed(0)
    print(
        f"tiermem demo: a DLRM with {format_bytes(config.table_bytes)} of embedding tables, "
        f"{format_bytes(budget)} of fast memory (DRAM) for them, the rest on emulated:optane-pmem; "
        f"{len(MODES)} modes x uniform and Zipf(1) inputs",
        flush=True,
    )
    with MachineLoad() as load:
        res = run_modes(
            config,
            MODES,
            ("uniform", "zipf"),
            iters=iters,
            warmup=warmup,
            fast_budget=budget,
            slow="emulated:optane-pmem",
            lr=0.01,
            seed=0,
            label="demo",
        )
    res["quick"] = quick
    res["load"] = load.summary()
    print(report(res))
    print(load.line())
    out = args.out or os.path.join("results", "demo-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    paths = write(res, out, args.json)
    print("wrote " + ", ".join(paths))
    return 0
