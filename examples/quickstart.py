"""Quick start: two tiers, an LRU policy, guards, hints and counters."""

import numpy as np

import tiermem

# 8 MiB of DRAM in front of 64 MiB of emulated Optane persistent memory.
m = tiermem.Manager({"dram": "8 MiB", "emulated:optane-pmem": "64 MiB"}, policy="lru")

# Three 4 MiB arrays: DRAM holds two at a time, the least recently used one is evicted.
arrays = [m.array((1024, 1024), "float32", fill=float(i)) for i in range(3)]
print([a.device for a in arrays])

with arrays[0].read() as v:  # brought back into DRAM and pinned while the guard is open
    print("sum of array 0:", float(v.sum()))

arrays[1].softevict()  # "I will not need this soon": it goes first next time
with arrays[2].write() as v:  # writes mark the array dirty
    v += 1
print([a.device for a in arrays])

# Freed data is dead: it is never written back to the slow tier.
arrays[2].free()

for device, counters in m.stats().items():
    print(device, {k: v for k, v in counters.items() if v})

# Results are plain NumPy arrays that outlive the guard.
with arrays[0].read() as v:
    total = np.asarray(v.sum(axis=0))
print(total.shape)
