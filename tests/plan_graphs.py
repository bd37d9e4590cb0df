"""Small planner graphs the planner's tests share."""

from __future__ import annotations

from tiermem.plan import Device, Graph, Kernel, Operand, Tensor

MiB = 1 << 20


def spaced(cap: int = 4 * MiB) -> Graph:
    """Five kernels with room between uses: an activation ``x`` made at 0 and read at 3 and
    4 (a prefetch ahead can overlap kernel 2, a write behind kernel 1), and a weight read at
    0, 1 and 4 (a prefetch ahead can overlap kernel 3)."""
    tensors = [Tensor("w", MiB, "parameter", True), Tensor("x", 2 * MiB), Tensor("y", 2 * MiB)]
    kernels = [
        Kernel("f1", 1e-3, (Operand(0, "read", (0.0, 4e-4)), Operand(1, "make", (0.0, 9e-4)))),
        Kernel("f2", 1e-3, (Operand(0, "read", (0.0, 4e-4)), Operand(2, "make", (0.0, 9e-4)))),
        Kernel("f3", 2e-3, (Operand(2, "read", (0.0, 9e-4)),)),
        Kernel("b1", 1e-3, (Operand(1, "read", (0.0, 9e-4)),)),
        Kernel("sgd", 1e-4, (Operand(1, "read", (0.0, 9e-4)), Operand(0, "write", (0.0, 6e-4)))),
    ]
    return Graph("spaced", [Device("fast", cap), Device("slow", None)], [[None, 5.0], [5.0, None]], tensors, kernels)
