"""What a plan does to each tensor: how much of its life it spends in fast memory and what it
moves (the per-tensor residency of ``tiermem plan``'s report), and the same summed per kind.
"""

from __future__ import annotations

from typing import Any

from .graph import Graph
from .offsets import residencies
from .plan import Plan, evaluate

__all__ = ["tensor_residency", "residency_by_kind"]


def tensor_residency(g: Graph, p: Plan) -> list[dict[str, Any]]:
    """Per tensor: its key, label (what the user calls it), kind and bytes; its uses and how many are on a fast device; the
    kernels it is live across and how many of them it spends in fast memory; and the bytes
    the plan prefetches and writes home for it per step."""
    cost = evaluate(g, p.at_use, p.held, p.overlap)
    fast_kernels = [0] * len(g.tensors)
    for r in residencies(g, p.at_use, p.held):
        fast_kernels[r.tensor] += sum(hi - lo + 1 for lo, hi in r.spans)
    rows = []
    for t, ten in enumerate(g.tensors):
        lo, hi = g.live_range(t)
        pre, wr = cost.moved[t]
        rows.append(
            {
                "key": ten.key,
                "label": ten.label,
                "kind": ten.kind,
                "bytes": ten.bytes,
                "uses": len(g.uses[t]),
                "fast_uses": sum(1 for d in p.at_use[t] if d < g.home),
                "live_kernels": hi - lo,
                "fast_kernels": min(fast_kernels[t], hi - lo),
                "prefetched_bytes": pre,
                "written_home_bytes": wr,
            }
        )
    return rows


def residency_by_kind(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tensor kind: tensors, bytes, the share of its byte-kernels (bytes times kernels
    live) spent in fast memory, and the bytes moved per step."""
    kinds: dict[str, dict[str, Any]] = {}
    for r in rows:
        k = kinds.setdefault(
            r["kind"],
            {"kind": r["kind"], "tensors": 0, "bytes": 0, "live": 0, "fast": 0, "prefetched_bytes": 0, "written_home_bytes": 0},
        )
        k["tensors"] += 1
        k["bytes"] += r["bytes"]
        k["live"] += r["bytes"] * r["live_kernels"]
        k["fast"] += r["bytes"] * r["fast_kernels"]
        k["prefetched_bytes"] += r["prefetched_bytes"]
        k["written_home_bytes"] += r["written_home_bytes"]
    out = []
    for k in sorted(kinds.values(), key=lambda k: -k["bytes"]):
        live, fast = k.pop("live"), k.pop("fast")
        out.append(k | {"fast_share": fast / live if live else 0.0})
    return out
