"""Sensitivity from a profile (H2M's "profile-based detection", issue 16 item 3): how much
each tensor of a recorded step is worth in the fastest device, as traits for allocation.

A graph's operand profiles give, per use, the extra seconds a kernel takes with that operand
on each device. A tensor's *gain* is the sum over its uses of what the kernel saves with it
on the fastest device instead of home (the slowest), the kernel's other operands at home
(:meth:`~tiermem.plan.Graph.use_gain`; on a duplex device an operand saves only what its
channel exceeds the other's): what one step saves with the tensor kept fast, moves aside. Ranked by gain per byte, the tensors that pay most for the fast device's
bytes come first: the order of the ``gain`` commit strategy
(:mod:`tiermem.traits`), to which :func:`recommend_traits` hands the measured gains.
"""

from __future__ import annotations

from typing import Any

from .graph import Graph

__all__ = ["gains", "recommend_traits"]


def gains(g: Graph) -> list[dict[str, Any]]:
    """Per tensor, ``{"key", "kind", "bytes", "uses", "gain_seconds", "gain_per_mib"}``,
    highest gain per byte first (ties by key)."""
    per = [0.0] * len(g.tensors)
    for k, ker in enumerate(g.kernels):
        for o in ker.operands:
            per[o.tensor] += g.use_gain(k, o.tensor, 0)
    rows: list[dict[str, Any]] = [
        {
            "key": t.key,
            "kind": t.kind,
            "bytes": t.bytes,
            "uses": len(g.uses[i]),
            "gain_seconds": max(0.0, per[i]),
            "gain_per_mib": max(0.0, per[i]) / (t.bytes / (1 << 20)),
        }
        for i, t in enumerate(g.tensors)
    ]
    rows.sort(key=lambda r: (-r["gain_per_mib"], r["key"]))
    return rows


def recommend_traits(g: Graph, top: int | None = None) -> dict[str, dict[str, Any]]:
    """Traits per tensor key (``Manager.alloc(..., traits=...)``): ``gain`` (its measured
    seconds per step), ``preferred`` ``hbw`` for a tensor that gains, ``large_cap`` for one
    that does not, and ``priority`` its rank by gain per byte (the highest the largest, so
    the ``priority`` strategy orders as ``gain`` does). ``top``: only the best ``top``."""
    rows = gains(g)[:top] if top is not None else gains(g)
    n = len(rows)
    return {
        r["key"]: {
            "gain": r["gain_seconds"],
            "preferred": "hbw" if r["gain_seconds"] > 0 else "large_cap",
            "priority": n - i,
        }
        for i, r in enumerate(rows)
    }
