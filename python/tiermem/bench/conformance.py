"""``tiermem bench conformance``: PyTorch's own operator database run through tiered tensors.

Every op of ``torch.testing._internal.common_methods_invocations.op_db`` (PyTorch's
``OpInfo`` database, BSD-3, which its own ``test_ops.py`` runs) with CPU samples in each
dtype asked for (float32 and bfloat16 by default, where the op supports them): each sample
runs on plain tensors and again with every strided CPU tensor of the sample made tiered,
under a :class:`~tiermem.torch.tensors.Tiering` whose fast memory is smaller than the
samples, and the results are compared at the dtype's tolerances (PyTorch's
``assert_close`` defaults). A sample is

* **passed**: equal results;
* **refused**: tiermem raised a :class:`~tiermem.TiermemError` naming the op before it ran
  (an in-place op that changes a tiered tensor's shape or storage, say);
* **failed**: a wrong result, or an error from inside PyTorch. Each is a bug to fix.

Samples plain PyTorch itself fails are not counted. Ops whose outputs are uninitialised
memory (``empty`` and kin) are compared by shape, dtype and strides only.

The same runs for PyTorch's module database (``common_modules.module_db``) in train, eval and
eval under ``no_grad``: see :mod:`tiermem.bench.module_conformance`. The JSON holds
``{"ops": [{"op", "dtype", "samples", "passed", "refused", "failed", "why"}], "modules":
[{"module", "dtype", "mode", "samples", "passed", "refused", "failed", "plain_failed",
"why"}], "module_entries": {dtype: {"entries", "all_passed"}}, ...}``.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from typing import Any

from ..report.load import MachineLoad
from ..report.output import show, write_json
from .module_conformance import count_sample

__all__ = ["run", "run_cli", "DTYPES", "MODULE_DTYPES", "UNINITIALIZED"]

#: The dtypes ops run in unless told otherwise.
DTYPES = ("float32", "bfloat16")
#: The dtypes modules run in unless told otherwise (module_db's entries support float32 and
#: float64, few bfloat16).
MODULE_DTYPES = ("float32", "float64", "bfloat16")
#: Ops whose results are uninitialised memory: their values are not compared.
UNINITIALIZED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"})
#: The fast and slow devices: fast memory smaller than most samples' operands together.
DEVICES = {"dram": "256 KiB", "emulated:optane-pmem": "256 MiB"}


def _compare(name: str, got: Any, want: Any) -> None:
    import torch

    if name in UNINITIALIZED:
        g, w = got, want
        assert isinstance(g, torch.Tensor) and (g.shape, g.dtype) == (w.shape, w.dtype), (g, w)
        return
    torch.testing.assert_close(got, want, equal_nan=True)


def run_op(op: Any, dtype: Any, samples: int | None, tiering: Any) -> dict[str, Any]:
    """One op in one dtype: its first ``samples`` CPU samples (all with None), each plain and
    tiered. Returns the counts and, per failure or refusal, the first line of why."""
    import torch
    from torch.utils._pytree import tree_map

    from ..torch.tensors import TieredTensor

    def tier(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, TieredTensor) and x.layout == torch.strided and not x.is_quantized:
            return tiering.tensor(x)
        return x

    def plain(x: Any) -> Any:
        return x.to_plain() if isinstance(x, TieredTensor) else x

    counts: Counter[str] = Counter()
    why: dict[str, str] = {}
    try:
        gen = op.sample_inputs("cpu", dtype, requires_grad=False)
        sample_list = [s for _, s in zip(range(samples if samples is not None else 1 << 30), gen, strict=False)]
    except Exception as e:  # the op's own sample generator
        return {"samples": 0, "passed": 0, "refused": 0, "failed": 0, "why": {"samples": f"{type(e).__name__}: {e}"[:200]}}
    for s in sample_list:
        try:
            want = op(s.input, *s.args, **s.kwargs)
        except Exception:
            continue  # plain PyTorch fails it too: not counted
        counts["samples"] += 1

        def tiered(s: Any = s) -> Any:
            inp, args, kwargs = tree_map(tier, (s.input, s.args, s.kwargs))
            return tree_map(plain, op(inp, *args, **kwargs))

        count_sample(counts, why, tiered, lambda got, want=want: _compare(op.name, got, want))
    return {
        "samples": counts["samples"],
        "passed": counts["passed"],
        "refused": counts["refused"],
        "failed": counts["failed"],
        "why": why,
    }


def run(
    quick: bool = False,
    dtypes: tuple[str, ...] = DTYPES,
    samples: int | None = None,
    progress: bool = True,
    module_dtypes: tuple[str, ...] = MODULE_DTYPES,
) -> dict[str, Any]:
    """Run every op of ``op_db`` and every entry of ``module_db`` in each of ``dtypes``;
    ``samples``: the first N samples (module inputs per mode) of each (``quick``: 2; else
    all)."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    from ..report.progress import Progress
    from ..torch.tensors import Tiering
    from .module_conformance import run_module

    if samples is None and quick:
        samples = 2
    rows, mrows = [], []
    t0 = time.perf_counter()
    with (
        MachineLoad() as load,
        Progress(len(op_db) * len(dtypes) + len(module_db) * len(module_dtypes), "bench conformance", progress) as bar,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        # ...but a kernel resizing an output tiermem made for it is a failure.
        warnings.filterwarnings("error", message="An output with one or more elements was resized")
        tiering = Tiering(DEVICES, "LM")
        try:
            for dname in dtypes:
                dtype = getattr(torch, dname)
                for op in op_db:
                    if dtype in op.supported_dtypes("cpu"):
                        r = run_op(op, dtype, samples, tiering)
                        rows.append({"op": op.name, "variant": op.variant_test_name, "dtype": dname} | r)
                    bar.step(op.name)
            for dname in module_dtypes:
                dtype = getattr(torch, dname)
                for info in module_db:
                    if dtype in info.supported_dtypes("cpu"):
                        for r in run_module(info, dtype, samples, tiering):
                            mrows.append({"module": info.name, "dtype": dname} | r)
                    bar.step(info.name)
        finally:
            tiering.close()
    total: Counter[str] = Counter()
    for r in rows:
        for k in ("samples", "passed", "refused", "failed"):
            total[k] += r[k]
    return {
        "benchmark": "conformance",
        "source": "torch.testing._internal.common_methods_invocations.op_db",
        "torch": torch.__version__,
        "quick": quick,
        "samples_per_op": samples,
        "dtypes": list(dtypes),
        "module_dtypes": list(module_dtypes),
        "devices": DEVICES,
        "ops": rows,
        "modules": mrows,
        "module_entries": _entries(mrows),
        "totals": dict(total),
        "pass_rate": total["passed"] / max(1, total["samples"]),
        "passed_or_refused": (total["passed"] + total["refused"]) / max(1, total["samples"]),
        "seconds": time.perf_counter() - t0,
        "load": load.summary(),
        "load_line": load.line(),
    }


def _entries(mrows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per dtype: module_db entries run, and those whose every input passed in every mode
    (train, eval, eval under no_grad)."""
    ok: dict[str, dict[str, bool]] = {}
    for r in mrows:
        d = ok.setdefault(r["dtype"], {})
        d[r["module"]] = d.get(r["module"], True) and r["passed"] == r["samples"]
    return {dt: {"entries": len(d), "all_passed": sum(d.values())} for dt, d in ok.items()}


def print_report(res: dict[str, Any]) -> None:
    from ..report.table import print_table

    by: dict[str, Counter[str]] = {}
    for r in res["ops"]:
        c = by.setdefault(r["dtype"], Counter())
        for k in ("samples", "passed", "refused", "failed"):
            c[k] += r[k]
        c["ops"] += 1
        c["ops_all_passed"] += r["passed"] == r["samples"]
    print_table(
        ["dtype", "ops", "ops all passed", "samples", "passed", "refused", "failed", "pass rate"],
        [
            [
                d,
                c["ops"],
                c["ops_all_passed"],
                c["samples"],
                c["passed"],
                c["refused"],
                c["failed"],
                f"{c['passed'] / max(1, c['samples']):.1%}",
            ]
            for d, c in by.items()
        ],
        title=f"PyTorch's op_db through tiered tensors ({res['torch']}; samples per op: {res['samples_per_op'] or 'all'})",
    )
    mby: dict[tuple[str, str], Counter[str]] = {}
    for r in res["modules"]:
        c = mby.setdefault((r["dtype"], r["mode"]), Counter())
        for k in ("samples", "passed", "refused", "failed", "plain_failed"):
            c[k] += r[k]
    if mby:
        print_table(
            ["dtype", "mode", "inputs", "passed", "refused", "failed", "plain PyTorch failed"],
            [[d, m, c["samples"], c["passed"], c["refused"], c["failed"], c["plain_failed"]] for (d, m), c in mby.items()],
            title="PyTorch's module_db through tiered modules (outputs, and parameter gradients in train)",
        )
        for d, e in res["module_entries"].items():
            show(f"module_db {d}: {e['all_passed']} of {e['entries']} entries pass every input in train, eval and eval+no_grad")
    bad = [r for r in res["ops"] if r["failed"] or r["refused"]]
    bad += [
        {
            "op": r["module"],
            "variant": r["mode"],
            "dtype": r["dtype"],
            "samples": r["samples"],
            "refused": r["refused"],
            "failed": r["failed"],
            "why": r["why"],
        }
        for r in res["modules"]
        if r["failed"] or r["refused"]
    ]
    if bad:
        print_table(
            ["op", "dtype", "samples", "refused", "failed", "why (first)"],
            [
                [
                    r["op"] + (f".{r['variant']}" if r["variant"] else ""),
                    r["dtype"],
                    r["samples"],
                    r["refused"],
                    r["failed"],
                    r["why"].get("failed") or r["why"].get("refused", ""),
                ]
                for r in bad
            ],
            title="what is refused (by name, before it runs) and what fails",
        )
    show(
        f"pass rate {res['pass_rate']:.1%}, passed or refused {res['passed_or_refused']:.1%} of {res['totals'].get('samples', 0)} samples in {res['seconds']:.0f} s"
    )
    show(res["load_line"])


def run_cli(args: Any) -> int:
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip()) if args.dtypes else DTYPES
    res = run(quick=args.quick, dtypes=dtypes, samples=args.samples, module_dtypes=dtypes if args.dtypes else MODULE_DTYPES)
    print_report(res)
    if args.json:
        write_json({k: v for k, v in res.items() if k != "load_line"}, args.json)
    return 0
