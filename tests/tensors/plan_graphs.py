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


def small(cap: int = 4 * MiB, devices: int = 2) -> Graph:
    """Four kernels over a weight, two activations and a gradient."""
    z = (0.0,) * devices

    def sec(*x: float) -> tuple[float, ...]:
        return (0.0, *x)[:devices] if devices > 2 else (0.0, x[-1])

    tensors = [Tensor("w", MiB, "parameter", True), Tensor("a", 2 * MiB), Tensor("b", MiB), Tensor("g", MiB, "gradient")]
    kernels = [
        Kernel("fwd1", 1e-3, (Operand(0, "read", sec(1e-4, 3e-4)), Operand(1, "make", sec(2e-4, 8e-4)))),
        Kernel("fwd2", 1e-3, (Operand(1, "read", sec(2e-4, 6e-4)), Operand(2, "make", sec(1e-4, 4e-4)))),
        Kernel("bwd", 2e-3, (Operand(2, "read", sec(1e-4, 3e-4)), Operand(1, "read", sec(2e-4, 6e-4)), Operand(3, "make", z))),
        Kernel("sgd", 1e-4, (Operand(3, "read", sec(1e-4, 3e-4)), Operand(0, "write", sec(2e-4, 9e-4), sec(1e-4, 5e-4)))),
    ]
    devs = [Device("fast", cap)] + ([Device("mid", 2 * cap)] if devices > 2 else []) + [Device("slow", None)]
    copy = [[None if s == d else 5.0 for d in range(devices)] for s in range(devices)]
    return Graph("small", devs, copy, tensors, kernels)
