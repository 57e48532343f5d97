"""strata's lookup_pooled against torch's embedding_bag on a table that stays in cache (2,000
rows), the same tensor for both, with its first row placed 0, 4 or 16 bytes past a 64-byte line.

PyTorch's allocator starts tensors on a line; NumPy's memory (which torch.from_numpy shares)
starts 16 bytes past one, and then every 64-byte vector load of a row spans two lines. This
shows what that costs each library:

    build/peer-venv/bin/python python/bench/alignment.py [--dims 64,128] [--dtypes float32,bfloat16,float16]

with STRATA_LIBRARY and PYTHONPATH as scripts/bench-peers.sh sets them (and
OMP_WAIT_POLICY=PASSIVE). Each output is checked against embedding_bag before it is timed; each
line gives the median of 5 blocks of calls, and the load average is printed.
"""

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    import strata
    import torch
    import torch.nn.functional as F

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--calls", type=int, default=300, help="calls a block")
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    rows, bags, hot = 2000, 10_000, 20

    def median_us(f) -> float:
        f()
        blocks = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(a.calls):
                f()
            blocks.append((time.perf_counter() - t0) / a.calls * 1e6)
        return statistics.median(blocks)

    print(f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}, torch threads {torch.get_num_threads()}, "
          f"strata threads {strata.default_num_threads()}")
    for dim in (int(d) for d in a.dims.split(",")):
        for name in a.dtypes.split(","):
            dt = getattr(torch, name)
            values = torch.from_numpy(rng.random((rows, dim), dtype=np.float32)).to(dt)
            for skew in (0, 4, 16):
                e = values.element_size()
                buf = torch.empty(rows * dim + 64 // e, dtype=dt)
                at = ((-buf.data_ptr()) % 64 + skew) // e
                w = buf[at:at + rows * dim].view(rows, dim)
                w.copy_(values)
                table = strata.Table.from_array(w, copy=False)
                k = torch.from_numpy(rng.integers(0, rows, bags * hot))
                off = torch.arange(0, bags * hot + 1, hot)
                out = torch.empty(bags, dim, dtype=dt)
                for psw in (None, torch.rand(bags * hot)) if name == "float32" else (None,):
                    ref = F.embedding_bag(k, w, off, mode="sum", per_sample_weights=psw, include_last_offset=True)
                    strata.lookup_pooled(table, k, off, psw, "sum", out=out)
                    tol = 1e-5 if name == "float32" else 2e-2
                    if not torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol):
                        raise SystemExit(f"strata differs from embedding_bag: dim {dim} {name} skew {skew}")
                    s = median_us(lambda: strata.lookup_pooled(table, k, off, psw, "sum", out=out))
                    t = median_us(lambda: F.embedding_bag(k, w, off, mode="sum", per_sample_weights=psw, include_last_offset=True))
                    print(f"dim {dim:4d} {name:9s} rows {skew:2d} B past a line, {'weighted' if psw is not None else 'sum     '}: "
                          f"strata {s:7.0f} us, embedding_bag {t:7.0f} us, strata / embedding_bag {s / t:.2f}x", flush=True)
                table.close()


if __name__ == "__main__":
    main()
