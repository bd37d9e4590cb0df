"""``tiermem demo``: train a DLRM whose embedding tables are four times the fast-memory
budget the demo sets itself, on uniform and Zipf(1) inputs, in every mode, and compare."""

from __future__ import annotations

import datetime
import os
from typing import Any


def run_demo(args: Any) -> int:
    import torch

    from .._sizes import format_bytes
    from ..torch.dlrm import MODES, DLRMConfig
    from .dlrm_report import report, run_modes, write

    quick = bool(args.quick)
    config = DLRMConfig.preset("demo", scale=0.5 if quick else 1.0)
    budget = config.table_bytes // 4
    warmup, iters = (4, 8) if quick else (10, 40)
    torch.manual_seed(0)
    print(f"tiermem demo: a DLRM with {format_bytes(config.table_bytes)} of embedding tables, "
          f"{format_bytes(budget)} of fast memory (DRAM) for them, the rest on emulated:optane-pmem; "
          f"{len(MODES)} modes x uniform and Zipf(1) inputs", flush=True)
    res = run_modes(config, MODES, ("uniform", "zipf"), iters=iters, warmup=warmup, fast_budget=budget,
                    slow="emulated:optane-pmem", lr=0.01, seed=0, label="demo")
    res["quick"] = quick
    print(report(res))
    out = args.out or os.path.join("results", "demo-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    paths = write(res, out, args.json)
    print("wrote " + ", ".join(paths))
    return 0
