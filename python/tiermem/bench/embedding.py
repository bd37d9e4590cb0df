"""``tiermem bench embedding``: ensemble lookups and lookup + SGD updates through tiermem,
``torch.nn.functional.embedding_bag`` (with torch's sparse-gradient SGD) and FBGEMM's CPU
table-batched embeddings, on the same tables and indices in one run.

Two grids:

- **kernels**: tables in DRAM, every row width (16/64/256), bag size (1/40), distribution
  (uniform/zipf/production) and op; with the gather roofline (random reads of the same rows,
  no arithmetic, best of several prefetch distances) for reducing lookups.
- **tiers** (width 64, bag 40): tables entirely on ``emulated:optane-pmem``, cached tables
  over it (dynamic policy, cache 10/25/50/100 % of the table; 100 % is pre-filled so every
  row is cached) and the DRAM table, per distribution and op, with hit rates.

Every timing is the best of several repetitions; each repetition uses a fresh batch of
indices (the same batches for every system), so caches are not flattered by replays.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import workloads
from ..dlrm.peers import fbgemm_modules
from ..embedding import EmbeddingCollection, EmbeddingTable
from ..manager import Manager
from ..report.load import MachineLoad
from ..report.output import show, write_outputs
from ..report.progress import Progress
from ..report.table import table
from .timing import best, best_pair

SLOW = "emulated:optane-pmem"
CACHE_PCTS = (10, 25, 50, 100)
#: Tiered placements: (cache % or None for all on the slow device, cache policy).
TIERS = ((None, "simple"), *((p, "dynamic") for p in CACHE_PCTS), (10, "admit"), (25, "admit"))
PREFETCH_DISTANCES = (0, 4, 8, 16)
LR = 0.01


def sizes(quick: bool) -> dict[str, Any]:
    """Tables, rows per table (scaled so a 256-wide table is no larger than a 64-wide one),
    batch and repetitions."""
    if quick:
        return {"tables": 8, "rows": 100_000, "batch": 2048, "reps": 3}
    return {"tables": 8, "rows": 1_000_000, "batch": 16384, "reps": 3}


def _rows_for(width: int, rows: int) -> int:
    return rows if width <= 64 else rows * 64 // width


#: Optimizer and row-type variants timed beside the SGD float32 cases (width 64, bags of
#: 40, the first distribution, rows in DRAM): (name, tiermem's optimizer, storage type,
#: torch's sparse optimizer (its nearest: torch has no row-wise Adagrad), FBGEMM's optimizer
#: or None where its CPU build has none).
VARIANTS: tuple[tuple[str, str, str, str, str | None], ...] = (
    ("adam", "adam", "float32", "SparseAdam", None),
    ("rowwise_adagrad", "rowwise_adagrad", "float32", "Adagrad", "EXACT_ROWWISE_ADAGRAD"),
    ("float16 sgd", "sgd", "float16", "SGD", "EXACT_SGD"),
)


class _Torch:
    """The plain PyTorch way: one ``F.embedding_bag`` per table, ``torch.cat``, sparse
    gradients and a ``torch.optim`` sparse optimizer (SGD unless told)."""

    def __init__(self, torch: Any, weights: list[Any], optimizer: str = "SGD") -> None:
        self.torch = torch
        self.params = [torch.nn.Parameter(w) for w in weights]
        self.opt = getattr(torch.optim, optimizer)(self.params, lr=LR)

    def lookup(self, b: list[tuple[Any, Any]]) -> Any:
        F = self.torch.nn.functional
        with self.torch.no_grad():
            return self.torch.cat([F.embedding_bag(v, w, o, mode="sum") for (v, o), w in zip(b, self.params)], 1)

    def train(self, b: list[tuple[Any, Any]], grad: Any) -> None:
        F = self.torch.nn.functional
        out = self.torch.cat([F.embedding_bag(v, w, o, mode="sum", sparse=True) for (v, o), w in zip(b, self.params)], 1)
        out.backward(grad)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class _Fbgemm:
    """FBGEMM's CPU table-batched embeddings, the optimizer fused (``EXACT_SGD`` unless
    told), float32 rows or ``FP16``."""

    def __init__(
        self, mods: Any, torch: Any, tables: int, rows: int, width: int, optimizer: str = "EXACT_SGD", dtype: str = "float32"
    ) -> None:
        EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, TBE = mods
        from fbgemm_gpu.split_embedding_configs import SparseType

        self.torch = torch
        self.tbe = TBE(
            embedding_specs=[(rows, width, EmbeddingLocation.HOST, ComputeDevice.CPU)] * tables,
            optimizer=getattr(EmbOptimType, optimizer),
            learning_rate=LR,
            pooling_mode=PoolingMode.SUM,
            weights_precision=SparseType.FP16 if dtype == "float16" else SparseType.FP32,
        )

    def lookup(self, idx: Any, off: Any) -> Any:
        with self.torch.no_grad():
            return self.tbe(idx, off)

    def train(self, idx: Any, off: Any, grad: Any) -> None:
        self.tbe(idx, off).backward(grad)


def _copy_rows(src: EmbeddingTable, dst: EmbeddingTable) -> None:
    chunk = max(1, (64 << 20) // (4 * src.embedding_dim))
    buf = np.empty((chunk, src.embedding_dim), np.float32)
    for start in range(0, src.num_embeddings, chunk):
        n = min(chunk, src.num_embeddings - start)
        src._native.read_rows(start, buf[:n])
        dst._native.write_rows(start, buf[:n])


def run(quick: bool = False, progress: bool | None = None) -> dict[str, Any]:
    import torch

    cfg = sizes(quick)
    T, B, reps = cfg["tables"], cfg["batch"], cfg["reps"]
    # torch's sparse optimizers warn unless the (costly) invariant checks are chosen: the
    # bench's gradients come from torch's own embedding_bag, so they are off.
    torch.sparse.check_sparse_tensor_invariants.disable()
    mods, why_not = fbgemm_modules()
    widths = (16, 64, 256)
    bags_ = (1, 40)
    dists = workloads.DISTRIBUTIONS
    n_kernel = len(widths) * len(bags_) * len(dists)
    n_tier = len(dists) * len(TIERS) + len(VARIANTS)
    cases: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    with Progress(n_kernel + n_tier, "bench embedding", progress) as prog:
        for width in widths:
            rows = _rows_for(width, cfg["rows"])
            table_bytes = rows * width * 4
            m = Manager({"dram": T * table_bytes + (8 << 20)}, policy="all_fast")
            tabs = [EmbeddingTable(rows, width, manager=m) for _ in range(T)]
            weights = []
            for t in tabs:
                w = torch.empty(rows, width).uniform_(-0.05, 0.05)
                t.load(w.numpy())
                weights.append(w)
            coll = EmbeddingCollection(tabs)
            ref = _Torch(torch, weights)
            fb = _Fbgemm(mods, torch, T, rows, width) if mods else None
            for bag in bags_:
                for dist in dists:
                    prog.step(f"w{width} bag{bag} {dist}")
                    batches = _batches(dist, T, rows, B, bag, reps + 1)
                    res = _kernel_case(torch, coll, tabs, ref, fb, batches, width, rng)
                    cases += [_dram_case(op, width, bag, dist, res) for op in ("lookup", "lookup+update")]
                    if width == 64 and bag == 40:
                        for c in _tier_cases(torch, tabs, batches, width, dist, res, prog):
                            cases.append(c)
            del tabs, coll, ref, fb, m
        cases += _variant_cases(torch, mods, cfg, dists[0], rng, prog)
    for c in cases:
        s = c["seconds"]
        c["vs_torch"] = s["torch"] / s["tiermem"]
        c["vs_fbgemm"] = s["fbgemm"] / s["tiermem"] if s.get("fbgemm") else None
        c["vs_roofline"] = c["gbps"] / c["roofline_gbps"] if c.get("roofline_gbps") else None
    return {
        "benchmark": "embedding",
        "quick": quick,
        "config": cfg,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fbgemm": None if why_not else "fbgemm-gpu-cpu",
        "fbgemm_note": why_not,
        "slow_device": {"spec": SLOW, "kind": "emulated"},
        "cases": cases,
    }


def _dram_case(op: str, width: int, bag: int, dist: str, res: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One timed case of rows held directly in DRAM, as the JSON holds it."""
    return {
        "op": op,
        **extra,
        "width": width,
        "bag": bag,
        "dist": dist,
        "placement": "dram",
        "policy": "direct",
        "seconds": res[op],
        "hit_rate": None,
        "roofline_gbps": res["roofline_gbps"] if op == "lookup" else None,
        "gbps": res["gbps"][op],
        "devices": {"dram": "real"},
    }


def _variant_cases(
    torch: Any, mods: Any, cfg: dict[str, Any], dist: str, rng: np.random.Generator, prog: Any
) -> list[dict[str, Any]]:
    """The :data:`VARIANTS`: lookup and lookup+update, tiermem beside torch and FBGEMM (the
    same rows in all three; FBGEMM's entry is None where its CPU build lacks the optimizer)."""
    T, B, reps = cfg["tables"], cfg["batch"], cfg["reps"]
    width, bag = 64, 40
    rows = _rows_for(width, cfg["rows"])
    out = []
    batches = _batches(dist, T, rows, B, bag, reps + 1)
    for name, optimizer, dtype, torch_opt, fb_opt in VARIANTS:
        prog.step(f"variant {name}")
        tdt = {"float32": torch.float32, "float16": torch.float16}[dtype]
        m = Manager({"dram": T * rows * width * 4 + (8 << 20)}, policy="all_fast")
        tabs = [EmbeddingTable(rows, width, manager=m, dtype=dtype) for _ in range(T)]
        weights = []
        for t in tabs:
            w = torch.empty(rows, width).uniform_(-0.05, 0.05).to(tdt)
            t.load(w.float().numpy())
            weights.append(w)
        fb = _Fbgemm(mods, torch, T, rows, width, fb_opt, dtype) if mods and fb_opt else None
        res = _kernel_case(
            torch, EmbeddingCollection(tabs), tabs, _Torch(torch, weights, torch_opt), fb, batches, width, rng, optimizer
        )
        note = None if fb_opt else f"FBGEMM's CPU build has no {name}"
        for op in ("lookup", "lookup+update"):
            out.append(_dram_case(op, width, bag, dist, res, variant=name, optimizer=optimizer, dtype=dtype, fbgemm_note=note))
        del tabs, fb, m
    return out


def _batches(dist: str, T: int, rows: int, B: int, bag: int, n: int) -> list[dict[str, Any]]:
    out = []
    for step in range(n):
        vals = workloads.batch(dist, [rows] * T, B, bag, seed=7, step=step)
        offs = np.arange(0, B * bag + 1, bag, dtype=np.int64)
        out.append({"values": vals, "offsets": offs})
    return out


def _kernel_case(
    torch: Any,
    coll: EmbeddingCollection,
    tabs: list[EmbeddingTable],
    ref: _Torch,
    fb: _Fbgemm | None,
    batches: list[dict[str, Any]],
    width: int,
    rng: np.random.Generator,
    optimizer: str = "sgd",
) -> dict[str, Any]:
    T = len(tabs)
    B = len(batches[0]["offsets"]) - 1
    grad = rng.standard_normal((B, T * width)).astype(np.float32)
    grad_t = torch.from_numpy(grad)
    bags = [[(v, b["offsets"]) for v in b["values"]] for b in batches]
    tbags = [[(torch.from_numpy(v), torch.from_numpy(b["offsets"][:-1])) for v in b["values"]] for b in batches]
    fidx = [torch.from_numpy(np.concatenate(b["values"])) for b in batches]
    bag = len(batches[0]["values"][0]) // B
    foff = [torch.arange(0, len(fi) + 1, bag, dtype=torch.int64) for fi in fidx]
    out = np.empty((B, T * width), np.float32)
    reps = range(1, len(batches))
    # Warm-up on batch 0 for every system, then timed repetitions on fresh batches.
    coll.lookup(bags[0], out=out)
    ref.lookup(tbags[0])
    res: dict[str, Any] = {}
    # Lookups are cheap: every system gets as many samples as the roofline below.
    k = len(PREFETCH_DISTANCES)
    lookup: dict[str, Any] = {
        "tiermem": float("inf"),
        "torch": best([lambda i=i: ref.lookup(tbags[i]) for i in reps for _ in range(k)]),
        "fbgemm": None,
    }
    train: dict[str, Any] = {
        "tiermem": best(
            [lambda i=i: (coll.lookup(bags[i], out=out), coll.update(bags[i], grad, optimizer=optimizer, lr=LR)) for i in reps]
        ),
        "torch": best([lambda i=i: ref.train(tbags[i], grad_t) for i in reps]),
        "fbgemm": None,
    }
    if fb is not None:
        fb.lookup(fidx[0], foff[0])
        lookup["fbgemm"] = best([lambda i=i: fb.lookup(fidx[i], foff[i]) for i in reps for _ in range(k)])
        train["fbgemm"] = best([lambda i=i: fb.train(fidx[i], foff[i], grad_t) for i in reps])
    nbytes = sum(len(v) for v in batches[1]["values"]) * width * (2 if tabs[0].dtype == "float16" else 4)
    from .. import _tiermem

    # The roofline and tiermem's lookup are timed alternately, the same number of times
    # (the roofline at each prefetch distance, the lookup at its default), so neither gets
    # more chances at a lucky sample.
    natives = [t._native for t in tabs]
    gathers = [
        lambda i=i, d=d: _tiermem.gather(natives, batches[i]["values"], [batches[i]["offsets"]] * T, d)
        for i in reps
        for d in PREFETCH_DISTANCES
    ]
    looks = [lambda i=i: coll.lookup(bags[i], out=out) for i in reps for _ in PREFETCH_DISTANCES]
    roof, lookup["tiermem"] = best_pair(gathers, looks)
    res["lookup"], res["lookup+update"] = lookup, train
    res["roofline_gbps"] = nbytes / roof / 1e9
    res["gbps"] = {"lookup": nbytes / lookup["tiermem"] / 1e9, "lookup+update": nbytes / train["tiermem"] / 1e9}
    return res


def _tier_cases(
    torch: Any,
    dram_tabs: list[EmbeddingTable],
    batches: list[dict[str, Any]],
    width: int,
    dist: str,
    base: dict[str, Any],
    prog: Progress,
) -> list[dict[str, Any]]:
    """Each placement's time is measured alternately with the DRAM table's on the same
    batches (``seconds.dram``), so their ratio is not skewed by drift between phases."""
    T = len(dram_tabs)
    rows = dram_tabs[0].num_embeddings
    table_bytes = rows * width * 4
    B = len(batches[0]["offsets"]) - 1
    grad = np.random.default_rng(1).standard_normal((B, T * width)).astype(np.float32)
    bags = [[(v, b["offsets"]) for v in b["values"]] for b in batches]
    nbytes = sum(len(v) for v in batches[1]["values"]) * width * 4
    out = np.empty((B, T * width), np.float32)
    dram_coll = EmbeddingCollection(dram_tabs)
    cases = []
    for pct, policy in TIERS:
        prog.step(f"tiers {dist} {'slow' if pct is None else f'cached:{pct}'}")
        cache_bytes = 0 if pct is None else int(table_bytes * min(1.0, pct / 100 + 0.05)) + (4 << 20)
        m = Manager({"dram": T * cache_bytes + (8 << 20), SLOW: T * table_bytes + (8 << 20)}, policy="all_fast")
        tabs = [
            EmbeddingTable(rows, width, manager=m, device=SLOW, cache=None if pct is None else pct / 100, policy=policy)
            for _ in range(T)
        ]
        for src, dst in zip(dram_tabs, tabs):
            _copy_rows(src, dst)
            if pct == 100:
                dst.fill_cache(0)
        coll = EmbeddingCollection(tabs)
        res = {}
        for op in ("lookup", "lookup+update"):
            # A fresh set of tables per op would double the memory; instead warm on batch 0
            # and measure on the rest, in order, hit rate included.
            coll.lookup(bags[0], out=out)
            for t in tabs:
                t.reset_stats()
            steps = range(1, len(bags))
            if op == "lookup":
                secs, dram = best_pair(
                    [lambda i=i, c=coll: c.lookup(bags[i], out=out) for i in steps],
                    [lambda i=i: dram_coll.lookup(bags[i], out=out) for i in steps],
                )
            else:
                secs, dram = best_pair(
                    [lambda i=i, c=coll: (c.lookup(bags[i], out=out), c.update(bags[i], grad, lr=LR)) for i in steps],
                    [lambda i=i: (dram_coll.lookup(bags[i], out=out), dram_coll.update(bags[i], grad, lr=LR)) for i in steps],
                )
            hits = sum(t.stats()["hits"] for t in tabs)
            misses = sum(t.stats()["misses"] for t in tabs)
            res[op] = (secs, dram, hits / (hits + misses) if pct is not None and hits + misses else None)
        for op, (secs, dram, hr) in res.items():
            cases.append(
                {
                    "op": op,
                    "width": width,
                    "bag": 40,
                    "dist": dist,
                    "placement": SLOW if pct is None else f"cached:{pct}",
                    "policy": policy + (" (pre-filled)" if pct == 100 else ""),
                    "seconds": {"tiermem": secs, "torch": base[op]["torch"], "fbgemm": base[op]["fbgemm"], "dram": dram},
                    "hit_rate": hr,
                    "roofline_gbps": None,
                    "gbps": nbytes / secs / 1e9,
                    "devices": {"dram": "real", SLOW: "emulated"},
                }
            )
        del coll, tabs, m
    return cases


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [
        f"embedding bench: {cfg['tables']} tables x {cfg['rows']:,} rows (width 256: a quarter), batch "
        f"{cfg['batch']:,}, best of {cfg['reps']}, {res['threads']} threads, torch {res['torch']}",
        f"slow tier: {SLOW} (EMULATED: DRAM throttled to published Optane PMem figures)",
    ]
    if res["fbgemm_note"]:
        lines.append(f"fbgemm: not measured: {res['fbgemm_note']}")
    rows = []
    for c in res["cases"]:
        s = c["seconds"]
        rows.append(
            [
                c["op"] + (f" ({c['variant']})" if c.get("variant") else ""),
                c["width"],
                c["bag"],
                c["dist"],
                c["placement"] + (" (emulated)" if SLOW in c["placement"] or "cached" in c["placement"] else ""),
                c["policy"],
                f"{s['tiermem'] * 1e3:.1f}",
                f"{s['torch'] * 1e3:.1f}",
                _fmt(s["fbgemm"] and s["fbgemm"] * 1e3, ".1f"),
                f"{c['vs_torch']:.2f}x",
                _fmt(c["vs_fbgemm"], ".2f"),
                f"{c['gbps']:.1f}",
                _fmt(c["roofline_gbps"], ".1f"),
                _fmt(c["vs_roofline"], ".2f"),
                _fmt(c["hit_rate"], ".2f"),
            ]
        )
    lines.append(
        table(
            [
                "op",
                "width",
                "bag",
                "dist",
                "placement",
                "policy",
                "tiermem ms",
                "torch ms",
                "fbgemm ms",
                "vs torch",
                "vs fbgemm",
                "GB/s",
                "roofline",
                "vs roof",
                "hit rate",
            ],
            rows,
        )
    )
    lines.append(
        "vs torch / vs fbgemm: their time / tiermem's (>1: tiermem faster). Tiered rows compare "
        "against torch and fbgemm with tables in DRAM.\nroofline: random reads of the same rows, no "
        "arithmetic, no output, best prefetch distance (bag-1 lookups also write as many bytes as they read).\n"
        "(adam), (rowwise_adagrad), (float16 sgd): those optimizers and row types against torch's sparse "
        "optimizer of the same name and FBGEMM's (none for Adam: its CPU build has none)."
    )
    lines.extend(headline(res))
    return "\n".join(lines)


def headline(res: dict[str, Any]) -> list[str]:
    """The figures the issue's "done when" asks for, from this run."""

    def find(**kw: Any) -> dict[str, Any] | None:
        for c in res["cases"]:
            if all(c[k] == v for k, v in kw.items()):
                return c
        return None

    out = ["", "headline (width 64, bag 40):"]
    lk = find(op="lookup", width=64, bag=40, dist="uniform", placement="dram")
    up = find(op="lookup+update", width=64, bag=40, dist="uniform", placement="dram")
    if lk:
        out.append(
            f"  lookup vs torch embedding_bag: {lk['vs_torch']:.2f}x; vs gather roofline: {lk['vs_roofline']:.2f}"
            + (f"; vs fbgemm: {lk['vs_fbgemm']:.2f}x" if lk["vs_fbgemm"] else "")
        )
    if up:
        out.append(
            f"  lookup+SGD vs torch sparse SGD: {up['vs_torch']:.2f}x"
            + (f"; vs fbgemm fused SGD: {up['vs_fbgemm']:.2f}x" if up["vs_fbgemm"] else "")
        )
    for dist in ("uniform", "zipf"):
        full = find(op="lookup", width=64, bag=40, dist=dist, placement="cached:100")
        if full:
            out.append(
                f"  cached table, every row cached, vs direct table ({dist}, measured alternately): "
                f"{full['seconds']['tiermem'] / full['seconds']['dram']:.2f}x the time"
            )
    dyn = find(op="lookup", width=64, bag=40, dist="zipf", placement="cached:25", policy="dynamic")
    slow = find(op="lookup", width=64, bag=40, dist="zipf", placement=SLOW)
    if dyn and slow:
        out.append(
            f"  zipf(1), 25% cache (dynamic) vs table on {SLOW} (emulated): "
            f"{slow['seconds']['tiermem'] / dyn['seconds']['tiermem']:.2f}x faster (hit rate {dyn['hit_rate']:.2f})"
        )
    return out


def run_cli(args: Any) -> int:
    t0 = time.perf_counter()
    with MachineLoad() as load:
        res = run(args.quick)
    res["load"] = load.summary()
    res["wall_seconds"] = time.perf_counter() - t0
    show(report(res))
    show(load.line())
    show(f"\n{len(res['cases'])} cases in {res['wall_seconds']:.1f}s")
    from ..report.plot import plot_embedding

    write_outputs(res, args, plot_embedding)
    return 0
