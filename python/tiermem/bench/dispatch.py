"""``tiermem bench dispatch``: what one tiered op costs beyond the op itself.

Three ways to run the same small op, side by side in one run, alternating:

* **plain**: ordinary CPU tensors (the op alone);
* **floor**: a trivial ``__torch_dispatch__`` wrapper subclass that unwraps its operands,
  calls the op and wraps the results: the least any Python-level tensor subclass pays;
* **tiered**: :class:`~tiermem.torch.tensors.TieredTensor` operands of a
  :class:`~tiermem.torch.tensors.Tiering` (variant ``LM``, everything in fast memory), so the
  figure is dispatch overhead, never a slow device's time.

The ratio to the floor is the figure of merit: it is what tiering adds to the least a
subclass costs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..report.load import MachineLoad
from ..report.output import show, write_json

__all__ = ["OPS", "run", "run_cli"]

#: The ops measured, each on 16x16 float32 operands (``add`` is ``a + a``).
OPS = ("add", "mul_add", "relu", "linear", "sum")


def _floor_class() -> type:
    import torch
    from torch.utils._pytree import tree_map

    class Wrapped(torch.Tensor):
        """A wrapper subclass that does nothing but unwrap, call and wrap."""

        elem: torch.Tensor

        @staticmethod
        def __new__(cls, elem: torch.Tensor) -> Any:
            r = torch.Tensor._make_wrapper_subclass(
                cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device, requires_grad=elem.requires_grad
            )
            r.elem = elem
            return r

        __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
            def unwrap(x: Any) -> Any:
                return x.elem if isinstance(x, Wrapped) else x

            def wrap(x: Any) -> Any:
                return Wrapped(x) if isinstance(x, torch.Tensor) else x

            return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))

    return Wrapped


def _cases(make: Callable[[Any], Any]) -> dict[str, Callable[[], Any]]:
    """The ops over tensors made by ``make`` (plain -> the variant's tensor)."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = make(torch.randn(16, 16, generator=g))
    b = make(torch.randn(16, 16, generator=g))
    w = make(torch.randn(16, 16, generator=g))
    bias = make(torch.randn(16, generator=g))
    lin = torch.nn.functional.linear
    return {
        "add": lambda: a + a,
        "mul_add": lambda: a * b + a,
        "relu": lambda: torch.relu(a),
        "linear": lambda: lin(a, w, bias),
        "sum": lambda: a.sum(),
    }


def _per_call_us(fn: Callable[[], Any], calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Measure every op in every form; the median over rounds of the mean time per call."""
    import torch

    from ..report.progress import Progress
    from ..torch.tensors import Tiering

    rounds, calls = (5, 200) if quick else (15, 1000)
    torch.set_num_threads(1)
    tiering = Tiering({"dram": "64 MiB", "emulated:optane-pmem": "64 MiB"}, variant="LM")
    floor_cls = _floor_class()
    forms = {"plain": _cases(lambda t: t), "floor": _cases(floor_cls), "tiered": _cases(tiering.tensor)}
    times: dict[str, dict[str, list[float]]] = {op: {f: [] for f in forms} for op in OPS}
    with MachineLoad() as load, Progress(rounds * len(OPS), "bench dispatch", progress) as bar:
        for fs in forms.values():  # warm up: plans, caches, allocator
            for fn in fs.values():
                _per_call_us(fn, 20)
        for _ in range(rounds):
            for op in OPS:
                for f, fs in forms.items():
                    times[op][f].append(_per_call_us(fs[op], calls))
                bar.step(op)
    tiering.close()
    ops = []
    for op in OPS:
        med = {f: statistics.median(ts) for f, ts in times[op].items()}
        ops.append(
            {
                "op": op,
                "tiered_us": round(med["tiered"], 2),
                "plain_us": round(med["plain"], 2),
                "floor_us": round(med["floor"], 2),
                "ratio_to_floor": round(med["tiered"] / med["floor"], 3),
                "ratio_to_plain": round(med["tiered"] / med["plain"], 2),
            }
        )
    return {
        "benchmark": "dispatch",
        "tensor": "16x16 float32",
        "threads": 1,
        "rounds": rounds,
        "calls_per_round": calls,
        "statistic": "median over rounds of the mean per call",
        "variant": "LM, all in fast memory",
        "load": load.summary(),
        "load_line": load.line(),
        "ops": ops,
    }


def print_report(res: dict[str, Any]) -> None:
    from ..report.table import print_table

    print_table(
        ["op", "plain µs", "floor µs", "tiered µs", "tiered / floor", "tiered / plain"],
        [
            [
                o["op"],
                f"{o['plain_us']:.1f}",
                f"{o['floor_us']:.1f}",
                f"{o['tiered_us']:.1f}",
                f"{o['ratio_to_floor']:.2f}x",
                f"{o['ratio_to_plain']:.1f}x",
            ]
            for o in res["ops"]
        ],
        title="per-op cost of a 16x16 float32 op, one thread",
    )
    show(res["load_line"])


def run_cli(args: Any) -> int:
    res = run(quick=args.quick)
    print_report(res)
    if args.json:
        write_json({k: v for k, v in res.items() if k != "load_line"}, args.json)
    return 0
