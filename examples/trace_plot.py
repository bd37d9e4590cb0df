"""Record bytes moved per device while arrays churn through a small fast tier, and plot it."""

import sys

import tiermem
from tiermem.report.plot import plot_trace

out = sys.argv[1] if len(sys.argv) > 1 else "trace.png"
m = tiermem.Manager({"dram": "16 MiB", "emulated:optane-pmem": "128 MiB"}, policy="lru")
arrays = [m.array(4 << 20, "uint8", fill=i) for i in range(8)]  # 32 MiB over 16 MiB of DRAM
with m.record(0.005) as trace:
    for step in range(3):
        for i, a in enumerate(arrays[step:], start=step):
            if i % 2:
                with a.write() as v:  # dirty: written back when evicted
                    v[:1] = step
            else:
                with a.read() as v:  # clean: its slow copy stays current, eviction is free
                    int(v[0])
        arrays[step].free()  # dead data: never written back
plot_trace(trace, out, "LRU over 16 MiB DRAM + emulated Optane (emulated)")
print(f"{len(trace)} samples, wrote {out}")
