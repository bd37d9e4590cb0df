"""``tiermem demo``: train a DLRM whose embedding tables are four times the fast-memory
budget the demo sets itself, on uniform and Zipf(1) inputs, in every mode but ``block``
(whose tables live on the disk: ``tiermem train dlrm --slow table:DIR``), and compare,
beside ``all-fast`` (the upper bound) and FBGEMM in DRAM (what a user would pick)."""

from __future__ import annotations

import datetime
import os
from typing import Any


def run_demo(args: Any) -> int:
    import torch

    from .._sizes import format_bytes
    from ..dlrm.model import MODES, DLRMConfig

    modes = tuple(m for m in MODES if m != "block")  # the demo's slow tier is emulated
    from .._sizes import available_memory
    from ..dlrm.report import report, run_modes, write
    from ..report.load import MachineLoad

    quick = bool(args.quick)
    scale = 0.5 if quick else 1.0
    # The modes run in lockstep, all alive at once: three copies in DRAM (reference, all-fast,
    # FBGEMM), four slow tiers holding them and four fast budgets of a quarter each: about 8x
    # the tables. Shrink the tables to fit in 60 % of the memory this machine has available.
    full = DLRMConfig.preset("demo", scale=scale).table_bytes
    avail = available_memory()
    if avail and 8 * full > 0.6 * avail:
        scale *= 0.6 * avail / (8 * full)
    config = DLRMConfig.preset("demo", scale=scale)
    budget = config.table_bytes // 4
    warmup, iters = (4, 8) if quick else (10, 40)
    torch.manual_seed(0)
    print(
        f"tiermem demo: a DLRM with {format_bytes(config.table_bytes)} of embedding tables, "
        f"{format_bytes(budget)} of fast memory (DRAM) for them, the rest on emulated:optane-pmem; "
        f"{len(modes)} modes x uniform and Zipf(1) inputs",
        flush=True,
    )
    with MachineLoad() as load:
        res = run_modes(
            config,
            modes,
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
