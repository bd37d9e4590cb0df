"""Run by test_real_models.py: two gloo processes train a model under DistributedDataParallel,
plain and then tiered (each rank its own Tiering) from the same weights, and print each rank's
losses and whether its final parameters are equal. Rank 1 builds other weights first, so
DDP's broadcast of rank 0's must reach tiered parameters too.

Usage: python ddp_twins.py MODEL STEPS (MODEL a key of test_real_models.CASES)."""

from __future__ import annotations

import copy
import json
import os
import queue
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _train(model: torch.nn.Module, loss_of: Any, steps: int, rank: int, tiering: Any) -> tuple[list[float], list[torch.Tensor]]:
    from tiermem.torch.tensors import TieredTensor

    d = DistributedDataParallel(model)
    opt = torch.optim.AdamW(d.parameters(), lr=1e-3)
    if tiering is not None:
        opt = tiering.optimizer(opt)
    losses = []
    for i in range(steps):
        loss = loss_of(d, 100 * rank + i)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach().item()))
    plain = [(p.to_plain() if isinstance(p, TieredTensor) else p.detach()).clone() for p in model.parameters()]
    return losses, plain


def worker(rank: int, name: str, steps: int, init: str, q: Any) -> None:
    from test_real_models import CASES  # the models of the single-process tests

    from tiermem.torch.tensors import Tiering

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        make, loss_of = CASES[name]
        torch.manual_seed(rank)
        base = make()
        # Fast memory holds any one op's operands: DDP's first broadcast flattens every
        # parameter into one tensor (a 90 MiB concatenation for ResNet-50).
        t = Tiering({"dram": "128 MiB", "emulated:optane-pmem": "2 GiB"}, "LM")
        want, pw = _train(copy.deepcopy(base), loss_of, steps, rank, None)
        got, pt = _train(t.module(copy.deepcopy(base)), loss_of, steps, rank, t)
        t.manager.check()
        t.close()
        same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(pw, pt, strict=True))
        q.put({"rank": rank, "plain": want, "tiered": got, "parameters_equal": same})
    finally:
        dist.destroy_process_group()


def main() -> int:
    name, steps = sys.argv[1], int(sys.argv[2])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        procs = [ctx.Process(target=worker, args=(r, name, steps, init, q)) for r in range(2)]
        for p in procs:
            p.start()
        results: list[dict[str, Any]] = []
        while len(results) < len(procs):
            try:
                results.append(q.get(timeout=1))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break  # a rank died: its error is on stderr
        for p in procs:
            p.join(60 if len(results) == len(procs) else 1)
            if p.exitcode is None:
                p.kill()
    print(json.dumps({"exitcodes": [p.exitcode for p in procs], "ranks": sorted(results, key=lambda r: r["rank"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
