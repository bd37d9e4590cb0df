"""A user's training step, run the same way under any :class:`Tiering` or in plain PyTorch.

The planner's capture (:func:`tiermem.plan.torch.capture`) and the benchmarks run one step
several times (all-fast, all-slow, under each variant, under a plan) and compare the runs,
so each run must start from the same weights and see the same inputs. A
:class:`TrainStep` says how: a function that builds the model (seeded by the step, so every
call gives the same weights), one that builds the optimizer over its parameters (any
``torch.optim`` optimizer), and the loss of iteration *i*. Backward, the optimizer's step
and ``zero_grad`` are the step's; an iteration ends at the optimizer's step
(:meth:`Tiering.optimizer`).

    step = TrainStep(
        model=lambda: MyModel(),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        loss=lambda model, i: F.cross_entropy(model(xs[i]), ys[i]),
    )
    r = measure(step, Tiering({"dram": "256 MiB", "emulated:optane-pmem": "2 GiB"}), warmup=1, iters=2)
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...exceptions import DeviceFullError, InvalidArgumentError
from .observer import Observer
from .tiering import Tiering

__all__ = ["TrainStep", "Session", "measure", "measure_all_fast", "budget_for", "slow_capacity", "parse_ratio"]

_MIB2 = 2 << 20  # budgets are whole 2 MiB pages, so the fast device's capacity is the budget


def budget_for(footprint: int, ratio: tuple[int, int]) -> int:
    """The fast budget at ``SLOW:FAST``: ``footprint * FAST / (SLOW + FAST)`` in whole 2 MiB
    pages (thesis §3.6)."""
    a, b = ratio
    return max(footprint * b // (a + b) // _MIB2 * _MIB2, _MIB2)


def slow_capacity(footprint: int) -> int:
    """The slow device's size for a model of this footprint (room for every tensor and its
    clean copies)."""
    return int(footprint * 1.4) + (256 << 20)


def parse_ratio(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise InvalidArgumentError(f"ratio {text!r}: write it SLOW:FAST, e.g. 8:1") from None
    if a < 0 or b <= 0:
        raise InvalidArgumentError(f"ratio {text!r}: SLOW must be >= 0 and FAST > 0")
    return a, b


@dataclass(frozen=True)
class TrainStep:
    """How to train a model one iteration at a time (see the module docs). ``model``: a new
    model (called under ``torch.manual_seed(seed)``, so every call gives the same weights);
    ``optimizer``: an optimizer over the given parameters; ``loss``: the loss of iteration
    ``i`` (from 0) of the model; ``name``: what reports call it."""

    model: Callable[[], torch.nn.Module]
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    loss: Callable[[torch.nn.Module, int], torch.Tensor]
    seed: int = 0
    name: str = "step"

    def start(self, tiering: Tiering | None = None) -> Session:
        """The model and optimizer built afresh: tiered under ``tiering``, or plain."""
        return Session(self, tiering)


class Session:
    """One run of a :class:`TrainStep`: its model, optimizer and iteration count."""

    def __init__(self, step: TrainStep, tiering: Tiering | None) -> None:
        self.step_def, self.tiering, self.i = step, tiering, 0
        torch.manual_seed(step.seed)
        model = step.model()
        if tiering is not None:
            model = tiering.module(model)
        opt = step.optimizer(model.parameters())
        if tiering is not None:
            opt = tiering.optimizer(opt)
        self.model, self.opt = model, opt

    def step(self) -> tuple[float, float]:
        """Train one iteration: its loss and seconds."""
        t0 = time.perf_counter()
        loss = self.step_def.loss(self.model, self.i)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        value = float(loss.item())
        self.i += 1
        return value, time.perf_counter() - t0

    def close(self) -> None:
        """Close the tiering (if any) and drop the model and optimizer."""
        if self.tiering is not None:
            self.tiering.close()
        self.model = self.opt = None  # type: ignore[assignment]
        gc.collect()


def measure(
    step: TrainStep,
    variant: str,
    devices: dict[str, int],
    warmup: int,
    iters: int,
    observers: Sequence[Observer] = (),
) -> dict[str, Any]:
    """Train ``step`` under a new :class:`Tiering` of ``variant`` over ``devices`` (fast
    first) watched by ``observers``, for ``warmup`` and then ``iters`` timed iterations.
    Returns the losses, the times, the best timed iteration, the fast device's peak, bytes
    per device per timed iteration, the tiering's stats, the devices' traits and the
    expected copy rates between the first two devices."""
    t = Tiering(devices, variant, observers=observers)
    m = t.manager
    names = list(devices)
    try:
        s = step.start(t)
        losses, times = [], []
        peak = 0
        for i in range(warmup + iters):
            if i == warmup:
                peak = max(peak, m.usage()[names[0]]["peak"])
                m.reset_stats()
            loss, sec = s.step()
            losses.append(loss)
            times.append(sec)
        stats = m.stats()
        peak = max(peak, m.usage()[names[0]]["peak"])
        per_iter = {d: {"read": stats[d]["bytes_read"] // iters, "written": stats[d]["bytes_written"] // iters} for d in names}
        return {
            "losses": losses,
            "seconds_per_iter": min(times[warmup:]),
            "times": times,
            "timed": times[warmup:],
            "budget_bytes": t.budget,
            "fast_bytes_peak": peak,
            "bytes": per_iter,
            "tiering": t.stats(),
            "device_traits": [d["traits"] for d in m._native.devices()],
            "copy_gbps": [m._native.expected_copy_gbps(0, 1), m._native.expected_copy_gbps(1, 0)],
        }
    finally:
        t.close()
        gc.collect()


def measure_all_fast(
    step: TrainStep,
    room: int,
    slow_spec: str,
    warmup: int,
    iters: int,
    make_observers: Callable[[], Sequence[Observer]] = tuple,
) -> tuple[int, dict[str, Any]]:
    """The ``all-fast`` run, which measures the footprint: its fast device starts at
    ``room`` bytes and doubles (up to 16 GiB) until one training run fits. Returns the
    room that fitted and the run (``make_observers``: fresh observers per attempt; the
    last attempt's are in the run's ``observers``)."""
    while True:
        obs = make_observers()
        try:
            r = measure(step, "all-fast", {"dram": room, slow_spec: 64 << 20}, warmup, iters, obs)
            r["observers"] = list(obs)
            return room, r
        except DeviceFullError:
            if room >= 16 << 30:
                raise
            room *= 2
            gc.collect()
