"""What an asynchronous copy costs the kernel it overlaps, measured on this machine (the
graph's ``copy_contention``, :mod:`tiermem.plan.graph`).

The planner's asynchronous moves overlap a copy with a kernel. Where the copy threads have
cores of their own (or a DMA engine copies) the kernel loses nothing; where they take cores
from the kernel's threads, the kernel slows while the copy runs. On this project's 2-core CI
machine, with PyTorch's two threads and the copy engine's two, a convolution runs at about
half speed beside a copy: overlapping hides only half of the copy's time. A cost model that
ignored this predicted planned steps 5-10 % faster than they ran.

:func:`copy_contention` measures it: a PyTorch kernel (a convolution on PyTorch's own
threads, as a CNN's) timed alone and beside copies from the slow device to DRAM made by the copy engine
(the copies an asynchronous prefetch makes), alternately over a few rounds. A kernel at rate
``r`` (its time alone over its time beside the copy) loses ``(1 - r)`` of each second of
copy, so the share is ``1 - alone / beside``: the median over the rounds, clipped to [0, 1].
Rounds vary widely on a busy 2-core machine (0.12-0.55 in one run of nine), hence nine.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from ...exceptions import InvalidArgumentError
from ...manager import Manager

__all__ = ["copy_contention"]


def copy_contention(slow_spec: str, rounds: int = 9, nbytes: int = 16 << 20, kernel_seconds: float = 0.05) -> float:
    """The share of an overlapping copy's time (``slow_spec`` to DRAM) that a PyTorch kernel
    loses, in [0, 1]. Takes about ``3 * rounds * kernel_seconds`` plus a warm-up."""
    if rounds < 1 or nbytes < 1 or not kernel_seconds > 0:
        raise InvalidArgumentError(
            f"copy_contention: rounds, nbytes and kernel_seconds must be positive, got {rounds}, {nbytes}, {kernel_seconds}"
        )
    m = Manager({"dram": nbytes + (8 << 20), slow_spec: nbytes + (8 << 20)}, policy="first_touch")
    src = m.array(nbytes, "uint8", where=1)
    dst = m.array(nbytes, "uint8", where=0)
    try:
        copy = m._native.copy_objects(dst.id, src.id, 2)
        x = torch.randn(8, 64, 56, 56)
        w = torch.randn(64, 64, 3, 3)

        def batch(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                torch.conv2d(x, w, padding=1)
            return time.perf_counter() - t0

        batch(3)  # warm-up: PyTorch's thread pool
        n = max(1, round(kernel_seconds / max(batch(3) / 3, 1e-7)))
        reps = max(1, int(4.0 * kernel_seconds / copy) + 1)  # copies outlast the batch

        def copies(started: threading.Event) -> None:
            started.set()
            m._native.copy_objects(dst.id, src.id, reps)

        shares = []
        for _ in range(rounds):
            alone = batch(n)
            started = threading.Event()
            th = threading.Thread(target=copies, args=(started,), name="tiermem-contention-copy", daemon=True)
            th.start()
            started.wait()
            beside = batch(n)
            th.join()
            shares.append(1.0 - alone / beside)
        return min(1.0, max(0.0, statistics.median(shares)))
    finally:
        src.free()
        dst.free()
