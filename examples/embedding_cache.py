"""A table four times larger than the DRAM cache given to it: rows on emulated Optane PMem, hot rows
cached in DRAM by the dynamic policy. Prints hit rates and times against the same table
entirely on the slow device, for Zipf(1) and uniform indices.

Run: python examples/embedding_cache.py
"""

import time

import numpy as np

import tiermem
from tiermem import workloads
from tiermem.embedding import EmbeddingTable

ROWS, WIDTH, BATCH, BAG = 200_000, 64, 2048, 20
table_mb = ROWS * WIDTH * 4 / 2**20
m = tiermem.Manager({"dram": f"{table_mb / 4 + 8:.0f} MiB", "emulated:optane-pmem": f"{2 * table_mb + 8:.0f} MiB"})
slow = EmbeddingTable(ROWS, WIDTH, manager=m, device="emulated:optane-pmem")
cached = EmbeddingTable(ROWS, WIDTH, manager=m, cache=0.2, cacheslack=0.05, policy="dynamic")
weights = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32)
slow.load(weights)
cached.load(weights)
offsets = np.arange(0, BATCH * BAG, BAG)
print(f"table {table_mb:.0f} MiB; DRAM cache {cached.cache_info['capacity'] / 2**20:.0f} MiB (emulated:optane-pmem is EMULATED)")
for dist in ("zipf", "uniform"):
    batches = [workloads.batch(dist, [ROWS], BATCH, BAG, seed=1, step=s)[0] for s in range(8)]
    times = {}
    for name, t in (("all on the slow device", slow), ("dynamic cache, 20%", cached)):
        t.lookup(batches[0], offsets)  # warm up
        t.reset_stats()
        start = time.perf_counter()
        for idx in batches[1:]:
            out = t.lookup(idx, offsets)
            t.update(idx, offsets, np.ones_like(out), lr=1e-3)
        times[name] = (time.perf_counter() - start) / (len(batches) - 1)
        hr = t.hit_rate if t.cache_info else None
        print(f"  {dist:8s} {name:24s} {times[name] * 1e3:7.1f} ms/batch" + (f"  hit rate {hr:.2f}" if hr is not None else ""))
    np.testing.assert_array_equal(slow.to_numpy(), cached.to_numpy())
print("bit-identical weights either way; cache stats:", cached.stats())
print("Zipf indices reuse rows, so the cache pays; uniform ones barely do, and copying rows in")
print("and out then costs more than it saves (admission control is future work).")
