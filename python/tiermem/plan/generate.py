"""AutoTM-shaped graphs of any size, for measuring the solver without a model: a deep
network's training step (forward layers with residual joins, backward in reverse, an
optimizer step per weight with momentum), with sizes and kernel times drawn like a CNN's
(activations shrink stage by stage, weights grow) and an emulated slow device's costs."""

from __future__ import annotations

import numpy as np

from .graph import Device, Graph, Kernel, Operand, Tensor

__all__ = ["autotm_graph", "SLOW_READ_GBPS", "SLOW_WRITE_GBPS"]

#: The emulated slow device's figures (Optane PMem, per the emulation profile): reads and
#: writes in GB/s, which set both the copy bandwidths and the operands' extra times.
SLOW_READ_GBPS, SLOW_WRITE_GBPS = 6.8, 2.3
FAST_GBPS = 40.0


def autotm_graph(kernels: int, ratio: float = 8.0, seed: int = 0) -> Graph:
    """A training step of about ``kernels`` kernels whose fast device holds
    ``1 / (ratio + 1)`` of the footprint (``ratio`` slow:fast, as ``8:1``)."""
    rng = np.random.default_rng(seed)
    layers = max(2, kernels // 3)
    tensors: list[Tensor] = []
    ks: list[tuple[str, float, list[tuple[int, str]]]] = []

    def tensor(key: str, nbytes: int, kind: str, persistent: bool = False) -> int:
        tensors.append(Tensor(key, int(max(4096, nbytes)), kind, persistent))
        return len(tensors) - 1

    def kernel(name: str, operands: list[tuple[int, str]]) -> None:
        ks.append((name, 0.0, operands))

    stages = 4
    x = tensor("input", 12 << 20, "input")
    kernel("input", [(x, "make")])
    acts, weights, states = [x], [], []
    for i in range(layers):
        stage = i * stages // layers
        size = (12 << 20) * float(rng.uniform(0.6, 1.6)) / 2**stage
        w = tensor(f"w{i}", int((64 << 10) * 4**stage * rng.uniform(0.5, 1.5)), "parameter", True)
        s = tensor(f"m{i}", tensors[w].bytes, "state", True)
        weights.append(w)
        states.append(s)
        y = tensor(f"a{i}", int(size), "activation")
        ops = [(acts[-1], "read"), (w, "read"), (y, "make")]
        if i >= 3 and i % 3 == 0 and tensors[acts[-3]].bytes == tensors[acts[-1]].bytes:
            ops.insert(1, (acts[-3], "read"))
        kernel("forward", ops)
        acts.append(y)
    loss_grad = tensor("dloss", tensors[acts[-1]].bytes, "gradient")
    kernel("loss", [(acts[-1], "read"), (loss_grad, "make")])
    g_out = loss_grad
    for i in reversed(range(layers)):
        gw = tensor(f"dw{i}", tensors[weights[i]].bytes, "gradient")
        gx = tensor(f"da{i}", tensors[acts[i]].bytes, "gradient")
        kernel("backward", [(g_out, "read"), (acts[i], "read"), (weights[i], "read"), (gx, "make"), (gw, "make")])
        kernel("sgd", [(gw, "read"), (states[i], "write"), (weights[i], "write")])
        g_out = gx
    # Kernel times: compute proportional to the bytes touched, plus each operand's extra
    # time when it lives on the slow device (its bytes at the slow device's bandwidth less
    # the fast one's).
    out = []
    for name, _, ops in ks:
        touched = sum(tensors[t].bytes for t, _ in ops)
        base = touched / (FAST_GBPS * 1e9) * float(rng.uniform(1.0, 3.0))
        opers = []
        for t, use in ops:
            b = tensors[t].bytes
            bw = SLOW_READ_GBPS if use == "read" else SLOW_WRITE_GBPS
            opers.append(Operand(t, use, (0.0, b / (bw * 1e9) - b / (FAST_GBPS * 1e9))))
        out.append(Kernel(name, base, tuple(opers)))
    probe = Graph(
        "probe",
        [Device("fast", 1 << 62), Device("slow", None)],
        [[None, SLOW_WRITE_GBPS], [SLOW_READ_GBPS, None]],
        tensors,
        out,
    )
    fast = int(probe.footprint() / (ratio + 1))
    fast = max(fast, max(probe.working_set(k) for k in range(len(out))))
    return Graph(
        f"autotm-{len(out)}",
        [Device("fast", fast), Device("slow (emulated)", None)],
        [[None, SLOW_WRITE_GBPS], [SLOW_READ_GBPS, None]],
        tensors,
        out,
    )
