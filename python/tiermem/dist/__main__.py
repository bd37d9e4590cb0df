"""One rank of a distributed run, started by hand or by a launcher:
``python -m tiermem.dist OPTIONS.json --init-method env:// [--out RESULT.json]``
(``env://`` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, as
``torchrun`` sets them). Exits non-zero with the error when the run fails."""

from __future__ import annotations

import argparse
import json
import os

from .train import DistOptions, exit_now, train_rank, write_result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tiermem.dist")
    p.add_argument("options", help="a JSON file of DistOptions")
    p.add_argument("--init-method", default="env://")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world", type=int, default=None)
    p.add_argument("--out", help="rank 0 writes its result here")
    a = p.parse_args(argv)
    with open(a.options) as f:
        o = DistOptions.from_json(json.load(f))
    rank = a.rank if a.rank is not None else int(os.environ["RANK"])
    world = a.world if a.world is not None else int(os.environ["WORLD_SIZE"])
    res = train_rank(o, rank, world, a.init_method)
    if rank == 0 and a.out:
        write_result(a.out, res)
    return 0


if __name__ == "__main__":
    exit_now(main())
