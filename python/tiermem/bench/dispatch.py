"""``tiermem bench dispatch``: what one tiered op costs beyond the op itself.

Three ways to run the same small op, side by side in one run, alternating:

* **plain**: ordinary CPU tensors (the op alone);
* **floor**: a trivial ``__torch_dispatch__`` wrapper subclass that unwraps its operands,
  calls the op and wraps the results: the least any Python-level tensor subclass pays;
* **tiered**: :class:`~tiermem.torch.tensors.TieredTensor` operands of a
  :class:`~tiermem.torch.tensors.Tiering`, once per variant (:data:`VARIANTS`, ``planned``
  following a plan made from a recording of the benchmark's own round of ops). Both devices
  are plain DRAM (``dram`` and ``numa:0``), so no variant is charged a slow device's time:
  the figure is dispatch overhead alone.

The ratio to the floor is the figure of merit: it is what tiering adds to the least a
subclass costs. ``tiered_us`` and ``ratio_to_floor`` are ``LM``'s; ``variants`` has every
variant's.

Statistics: a round runs each op :data:`CALLS` times in every form, one form after another;
a round is one iteration of the tiering (so variants that free late or follow a trace see
the same iteration in both modes, and only the number of rounds differs). Times are medians
over rounds; a ratio is the median of each round's paired ratio, which cancels the
machine's slow drifts (the floor alone moves by a third from one minute to the next here).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..report.load import MachineLoad
from ..report.output import show, write_json

__all__ = ["OPS", "DEVICES", "run", "run_cli"]

#: The ops measured, each on 16x16 float32 operands (``add`` is ``a + a``).
OPS = ("add", "mul_add", "relu", "linear", "sum")
#: Two plain DRAM devices: every variant's placements cost the same memory.
DEVICES = {"dram": "64 MiB", "numa:0": "64 MiB"}
#: Calls of each op per form in a round, in both modes.
CALLS = 200


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


def _round(cases: dict[str, Callable[[], Any]], calls: int) -> None:
    """One round of the benchmark's ops, as the measurement runs them (for a recording)."""
    for op in OPS:
        _per_call_us(cases[op], calls)


def _planned(calls: int) -> tuple[Any, dict[str, Callable[[], Any]]]:
    """A planned tiering following the plan that keeps everything at home, made from a
    recording of one round of the ops (iteration 0 copies the operands in; each round is
    one iteration), and the ops over its tensors."""
    from ..plan import at_home
    from ..plan.torch import Recorder, graph_from_recordings, planned
    from ..torch.tensors import Tiering

    rec = Recorder(1, 1)
    t = Tiering(DEVICES, "all-fast", observers=[rec])
    try:
        cases = _cases(t.tensor)  # the copy-ins are iteration 0's, not recorded
        t.end_iteration()
        _round(cases, calls)
        t.end_iteration()
        native = t.manager._native
        traits = [d["traits"] for d in native.devices()]
        copy = [[None, native.expected_copy_gbps(0, 1)], [native.expected_copy_gbps(1, 0), None]]
        devices: list[tuple[str, int | None, bool]] = [("dram", 64 << 20, False), ("numa:0", None, False)]
        g = graph_from_recordings("dispatch", rec, rec, devices, traits, copy)
    finally:
        t.close()
    p = planned(DEVICES, g, at_home(g))
    return p, _cases(p.tensor)


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Measure every op in every form; the median over rounds of the mean time per call."""
    import torch

    from ..report.progress import Progress
    from ..torch.tensors import VARIANTS, Tiering

    rounds, calls = (11, CALLS) if quick else (41, CALLS)
    torch.set_num_threads(1)
    floor_cls = _floor_class()
    forms: dict[str, dict[str, Callable[[], Any]]] = {"plain": _cases(lambda t: t), "floor": _cases(floor_cls)}
    tierings: dict[str, Any] = {}
    for v in VARIANTS:
        if v == "planned":
            tierings[v], forms[v] = _planned(calls)
        else:
            tierings[v] = Tiering(DEVICES, v)
            forms[v] = _cases(tierings[v].tensor)
    variants = list(tierings)
    times: dict[str, dict[str, list[float]]] = {op: {f: [] for f in forms} for op in OPS}
    try:
        with MachineLoad() as load, Progress(rounds * len(OPS), "bench dispatch", progress) as bar:
            for f, fs in forms.items():  # warm up: plans, caches, allocator; a whole round each
                _round(fs, calls)
                if f in tierings:
                    tierings[f].end_iteration()
            for _ in range(rounds):
                for op in OPS:
                    for f, fs in forms.items():
                        times[op][f].append(_per_call_us(fs[op], calls))
                    bar.step(op)
                for t in tierings.values():  # a round is an iteration (the plan's)
                    t.end_iteration()
    finally:
        unplanned = tierings["planned"].stats()["plan"]["runtime_kernels"]
        for t in tierings.values():
            t.close()
    ops: list[dict[str, Any]] = []
    for op in OPS:
        ts = times[op]
        med = {f: statistics.median(t) for f, t in ts.items()}

        def paired(f: str, base: str, ts: dict[str, list[float]] = ts) -> float:
            return statistics.median(a / b for a, b in zip(ts[f], ts[base]))

        ops.append(
            {
                "op": op,
                "tiered_us": round(med["LM"], 2),
                "plain_us": round(med["plain"], 2),
                "floor_us": round(med["floor"], 2),
                "ratio_to_floor": round(paired("LM", "floor"), 3),
                "ratio_to_plain": round(paired("LM", "plain"), 2),
                "variants": {v: {"us": round(med[v], 2), "ratio_to_floor": round(paired(v, "floor"), 3)} for v in variants},
            }
        )
    return {
        "benchmark": "dispatch",
        "tensor": "16x16 float32",
        "threads": 1,
        "rounds": rounds,
        "calls_per_round": calls,
        "statistic": "times: median over rounds of the mean per call; ratios: median over rounds of the paired ratio",
        "variant": "LM (tiered_us); every variant under variants",
        "devices": DEVICES,
        "worst_ratio_to_floor": {v: max(o["variants"][v]["ratio_to_floor"] for o in ops) for v in variants},
        "planned_unplanned_kernels": unplanned,
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
        title="per-op cost of a 16x16 float32 op, one thread (tiered: LM)",
    )
    variants = list(res["worst_ratio_to_floor"])
    print_table(
        ["op", *variants],
        [[o["op"], *(f"{o['variants'][v]['ratio_to_floor']:.2f}x" for v in variants)] for o in res["ops"]],
        title="every variant's cost over the floor (both devices plain DRAM: dispatch alone)",
    )
    show(f"worst over the ops: {', '.join(f'{v} {r:.2f}x' for v, r in res['worst_ratio_to_floor'].items())}")
    if res["planned_unplanned_kernels"]:
        show(f"planned ran {res['planned_unplanned_kernels']} kernels off its plan: its figure is not the planned path's")
    show(res["load_line"])


def run_cli(args: Any) -> int:
    res = run(quick=args.quick)
    print_report(res)
    if args.json:
        write_json({k: v for k, v in res.items() if k != "load_line"}, args.json)
    return 0
