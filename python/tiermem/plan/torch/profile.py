"""A training step's graph from two recorded iterations (thesis §3.4: kernel profiles).

The same iteration is recorded with every tensor in fast memory and with every tensor on
the slow device (:class:`~tiermem.plan.torch.record.Recorder` on ``all-fast`` and
``all-slow`` runs of the same model and inputs). A kernel's time with all operands fast is its
base time; the extra time the all-slow run measured is split over its operands in proportion
to each operand's extra cost per byte on the slow device for that use (reads at the read
bandwidth; new tensors at the write bandwidth; an in-place update both, its write part kept
as the operand's ``write_seconds``). On a duplex device (reads and writes on independent
channels: an ``emulated`` one) the measured extra time is the longer channel's, so the
operands' costs are scaled to make their longer channel's sum the measured time. This is
AutoTM's profile of every operand placement, measured twice per kernel instead of once per
placement and apportioned by the cost model of the emulated devices; ``tiermem plan`` reports predicted against
measured times, kernel by kernel, so the apportioning is checked, not assumed.

The all-slow less all-fast difference of one kernel is noisy on a shared machine; kernels
with the same signature are pooled, within the recording and across captures through a
:class:`~tiermem.plan.torch.kernel_profiles.KernelProfiles` cache on disk.
"""

from __future__ import annotations

import logging
from typing import Any

from ... import dram_figures
from ..graph import Device, Graph, GraphError, Kernel, Operand, Tensor
from .kernel_profiles import KernelProfiles
from .record import Recorder

__all__ = ["graph_from_recordings"]

log = logging.getLogger(__name__)


def graph_from_recordings(
    name: str,
    fast: Recorder,
    slow: Recorder,
    devices: list[tuple[str, int | None, bool]],
    traits: list[dict[str, Any]],
    copy_gbps: list[list[float | None]],
    step_seconds: float = 0.0,
    profiles: KernelProfiles | None = None,
    copy_contention: float = 0.0,
) -> Graph:
    """The graph of the recorded iteration: kernels and tensors from ``fast`` (an all-fast
    run), operand extra times from ``slow`` (an all-slow run of the same step). ``devices``:
    ``(name, capacity, duplex)`` fastest first; ``traits``: each device's ``read_gbps`` and
    ``write_gbps``; ``step_seconds``: the all-slow run's measured step, whose time outside
    its kernels becomes the graph's overhead (:func:`tiermem.plan.torch.capture` runs it
    under the plan executor, so that the overhead includes the executor's work). A kernel's
    extra time is the mean over the kernels that share its signature, in this recording and
    in ``profiles`` (which gains this recording's samples; the caller saves it).
    ``copy_contention``: the graph's (:func:`~tiermem.plan.torch.contention.copy_contention`
    measures it)."""
    for rec in (fast, slow):
        if rec.mismatch:
            raise GraphError(
                f"{name}: the model's ops are not the same every iteration ({rec.mismatch}), so it cannot be planned"
            )
    if not fast.kernels:
        raise GraphError(f"{name}: the recorder saw no kernels (was a whole iteration run after the warm-up?)")
    if len(fast.kernels) != len(slow.kernels):
        raise GraphError(
            f"{name}: the model ran {len(fast.kernels)} kernels in one run and {len(slow.kernels)} in the other: "
            "its ops change from run to run, so it cannot be planned"
        )
    for k, (a, b) in enumerate(zip(fast.kernels, slow.kernels, strict=True)):
        if a[0] != b[0] or a[2] != b[2]:
            raise GraphError(f"{name}: kernel {k} differs between runs ({a[0]} vs {b[0]}): the model's ops are not repeatable")
    keys = list(fast.tensors)
    index = {k: i for i, k in enumerate(keys)}
    n = len(fast.kernels)
    tensors = []
    for key in keys:
        info = fast.tensors[key]
        free_after = None
        if not info["persistent"]:
            free_after = info.get("freed_at", n - 1)
        tensors.append(
            Tensor(key, int(info["bytes"]), info["kind"], bool(info["persistent"]), free_after, str(info.get("label", "")))
        )
    last_use: dict[str, int] = {}
    for k, (_, _, ops) in enumerate(fast.kernels):
        for key, _ in ops:
            last_use[key] = k
    tensors = [
        t
        if t.free_after is None or t.free_after > last_use[t.key]
        else Tensor(t.key, t.bytes, t.kind, t.persistent, None, t.label)
        for t in tensors
    ]
    nd = len(devices)
    extras = _pooled_extras(fast, slow, profiles)
    kernels = []
    per_byte = [_per_byte(traits[d], devices[d][0]) for d in range(nd)]
    slowest = devices[-1][2]
    for (kname, t_fast, ops), extra in zip(fast.kernels, extras, strict=True):
        # Per operand and device, the model's (read, write) extra cost over the fastest
        # device: bytes times the extra cost per byte of each channel the use touches.
        costs = []
        for key, use in ops:
            b = fast.tensors[key]["bytes"]
            r, w = use != "make", use != "read"
            costs.append([(b * (c[0] - per_byte[0][0]) * r, b * (c[1] - per_byte[0][1]) * w) for c in per_byte])
        # Scaled so that the slowest device's model time (the longer channel's sum on a
        # duplex device, both channels' on another) is the measured extra time; other
        # devices scale by the same factor.
        rs, ws = sum(c[-1][0] for c in costs), sum(c[-1][1] for c in costs)
        scale = extra / ((max(rs, ws) if slowest else rs + ws) or 1.0)
        operands = []
        for (key, use), c in zip(ops, costs, strict=True):
            per = tuple(max(0.0, scale * (r + w)) for r, w in c)
            written = tuple(max(0.0, min(s, scale * w)) for s, (_, w) in zip(per, c, strict=True))
            operands.append(Operand(index[key], use, per, written if use == "write" else None))
        kernels.append(Kernel(kname, t_fast, tuple(operands)))
    overhead = max(0.0, step_seconds - sum(t for _, t, _ in slow.kernels))
    devs = [Device(dn, cap, duplex) for dn, cap, duplex in devices]
    # A pair of devices without an expected copy rate (plain NUMA nodes) copies at DRAM's.
    copy = [
        [c if c is not None or i == j else float(dram_figures()["copy_gbps"]) for j, c in enumerate(row)]
        for i, row in enumerate(copy_gbps)
    ]
    return Graph(name, devs, copy, tensors, kernels, overhead, copy_contention)


def _per_byte(trait: dict[str, Any], name: str) -> tuple[float, float]:
    """Seconds per byte read and written on a device; one that states no figures (a NUMA
    node of plain DRAM) has the machine's DRAM figures (:func:`tiermem.dram_figures`)."""
    read, write = trait.get("read_gbps"), trait.get("write_gbps")
    if read is None or write is None:
        figures = dram_figures()
        log.info("device %s states no bandwidth: the graph uses DRAM's (%s)", name, figures["source"])
        read, write = read or figures["read_gbps"], write or figures["write_gbps"]
    return 1.0 / float(read), 1.0 / float(write)


def _pooled_extras(fast: Recorder, slow: Recorder, profiles: KernelProfiles | None) -> list[float]:
    """Each kernel's extra time all-slow over all-fast: the mean difference over the kernels
    of its signature here and the samples ``profiles`` holds, clipped at zero once."""
    sigs = fast.signatures if len(fast.signatures) == len(fast.kernels) else [k[0] for k in fast.kernels]
    groups: dict[str, list[float]] = {}
    for sig, (_, t_fast, _), (_, t_slow, _) in zip(sigs, fast.kernels, slow.kernels, strict=True):
        groups.setdefault(sig, []).append(t_slow - t_fast)
    mean: dict[str, float] = {}
    for sig, diffs in groups.items():
        n, total = profiles.pooled(sig) if profiles is not None else (0, 0.0)
        mean[sig] = max(0.0, (total + sum(diffs)) / (n + len(diffs)))
        if profiles is not None:
            profiles.add(sig, len(diffs), sum(diffs))
    return [mean[sig] for sig in sigs]
