"""strata's lookup_pooled and torch's embedding_bag called in alternation, one call each in turn,
as a model that mixes strata lookups with torch ops calls them (peers.py times each contender in
a block of calls instead).

After a parallel op, torch's OpenMP threads spin for a while (the default OMP_WAIT_POLICY);
a strata call made then finds one core taken by a spinning thread. Run this once as is and once
with OMP_WAIT_POLICY=PASSIVE, or with OMP_NUM_THREADS=1 STRATA_NUM_THREADS=1 (one thread each,
so nothing spins) to see the kernels alone:

    build/peer-venv/bin/python python/bench/alternate.py [float16|float32|bfloat16] [rows]

with STRATA_LIBRARY and PYTHONPATH as scripts/bench-peers.sh sets them. The output is checked
against embedding_bag before anything is timed; the load average is printed.
"""

import os
import statistics
import sys
import time

import numpy as np


def main() -> None:
    import strata
    import torch
    import torch.nn.functional as F

    dtype = sys.argv[1] if len(sys.argv) > 1 else "float16"
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    dim, bags, hot = 128, 10_000, 20
    rng = np.random.default_rng(1)
    w = torch.from_numpy(rng.random((rows, dim), dtype=np.float32)).to(tdt)
    table = strata.Table.from_array(w, copy=False)
    keys = torch.from_numpy(rng.integers(0, rows, bags * hot, dtype=np.int64))
    offsets = torch.arange(0, bags * hot + 1, hot, dtype=torch.int64)
    out = torch.empty((bags, dim), dtype=tdt)
    ref = F.embedding_bag(keys, w, offsets, mode="sum", include_last_offset=True)
    strata.lookup_pooled(table, keys, offsets, None, "sum", out=out)
    if not torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2):
        sys.exit("alternate.py: strata differs from embedding_bag; nothing timed")

    def s_call():
        strata.lookup_pooled(table, keys, offsets, None, "sum", out=out)

    def t_call():
        F.embedding_bag(keys, w, offsets, mode="sum", include_last_offset=True)

    ratios, s_med, t_med = [], [], []
    for _ in range(15):
        ts, tt = [], []
        for i in range(10):
            # Alternate which goes first, so neither always follows the other.
            for f, into in ((s_call, ts), (t_call, tt)) if i % 2 else ((t_call, tt), (s_call, ts)):
                t0 = time.perf_counter()
                f()
                into.append(time.perf_counter() - t0)
        s_med.append(statistics.median(ts))
        t_med.append(statistics.median(tt))
        ratios.append(s_med[-1] / t_med[-1])
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "STRATA_NUM_THREADS") if k in os.environ)
    print(f"{rows} x {dim} {dtype}, {bags} bags of {hot}, sum, adopted, alternating calls {env or '(default environment)'}")
    print(f"  strata lookup_pooled {statistics.median(s_med) * 1e3:6.2f} ms   embedding_bag {statistics.median(t_med) * 1e3:6.2f} ms")
    print(f"  strata / embedding_bag {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}, 15 rounds)"
          f"   load average {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    main()
