"""Quantized pooled lookups side by side: strata's float32, int8 and int4 tables against
PyTorch's float32 ``embedding_bag`` and its quantized FBGEMM kernels
(``torch.ops.quantized.embedding_bag_byte_rowwise_offsets`` / ``..._4bit_...``), on the same
fused rows (strata adopts the very uint8 tensor the peer reads), one process, interleaved.

    STRATA_LIBRARY=target/release/libstrata.so PYTHONPATH=python/src \
        build/peer-venv/bin/python python/bench/quantized.py [--rows N] [--dim D] [--rounds R]

Prints each contender's median and spread over the rounds, its ratio to strata's float32
pooled lookup, bytes per row, and the load average; and the plain gather of the same keys
(float32 rows against int8 rows dequantized to float32). Outputs are checked against each other before anything is timed.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

import strata


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--bags", type=int, default=10_000)
    ap.add_argument("--hot", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.rows, a.dim), dtype=np.float32)
    xt = torch.from_numpy(x)
    try:
        import fbgemm_gpu  # noqa: F401
    except ImportError:
        raise SystemExit("quantized bench: fbgemm_gpu is needed for FBGEMM's quantizers") from None
    q8 = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(xt)
    q4 = torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(xt, 4)
    t32 = strata.Table.from_array(xt, copy=False)
    t8 = strata.Table.from_array(q8, storage="int8", copy=False)
    t4 = strata.Table.from_array(q4, storage="int4", copy=False)
    keys = torch.from_numpy(rng.integers(0, a.rows, size=a.bags * a.hot).astype(np.int64))
    offsets = torch.arange(0, a.bags * a.hot + 1, a.hot, dtype=torch.int64)
    out = torch.empty((a.bags, a.dim), dtype=torch.float32)

    plain = torch.empty((keys.numel(), a.dim), dtype=torch.float32)
    contenders = {
        "plain lookup, strata float32": lambda: t32.lookup(keys, plain),
        "plain lookup, strata int8": lambda: t8.lookup(keys, plain),
        "strata float32": lambda: t32.lookup_pooled(keys, offsets, out=out),
        "strata int8": lambda: t8.lookup_pooled(keys, offsets, out=out),
        "strata int4": lambda: t4.lookup_pooled(keys, offsets, out=out),
        "embedding_bag float32": lambda: torch.nn.functional.embedding_bag(keys, xt, offsets[:-1], mode="sum"),
        "FBGEMM int8 (embedding_bag_byte_rowwise_offsets)": lambda: torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
            q8, keys, offsets, False, 0, False, None, None, True
        ),
        "FBGEMM int4 (embedding_bag_4bit_rowwise_offsets)": lambda: torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(
            q4, keys, offsets, False, 0, False, None, None, True
        ),
    }
    # Check before timing: strata against FBGEMM's dequantized rows, pooled in key order.
    for name, table, q, deq in (
        ("int8", t8, q8, torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat),
        ("int4", t4, q4, lambda t: torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(t, 4)),
    ):
        rows = deq(q)
        want = torch.nn.functional.embedding_bag(keys, rows, offsets[:-1], mode="sum")
        got = table.lookup_pooled(keys, offsets)
        assert np.allclose(got, want.numpy(), rtol=1e-5, atol=1e-4), name
        peer = contenders[f"FBGEMM {name} (embedding_bag_{'byte' if name == 'int8' else '4bit'}_rowwise_offsets)"]()
        assert np.allclose(peer.numpy(), want.numpy(), rtol=1e-4, atol=1e-3), f"FBGEMM {name}"
    times = {k: [] for k in contenders}
    for f in contenders.values():
        f()
    for _ in range(a.rounds):
        for name, f in contenders.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    base = float(np.median(times["strata float32"]))
    size = {"float32": a.dim * 4, "int8": a.dim + 8, "int4": a.dim // 2 + 4}
    print(f"# {a.rows} x {a.dim}, {a.bags} bags of {a.hot} uniform keys, sum; {a.rounds} rounds, interleaved; load {os.getloadavg()}")
    for name, ts in times.items():
        med = float(np.median(ts))
        kind = next(k for k in size if k in name)
        print(f"{name:52s} {med * 1e3:7.2f} ms  ({min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f})  / strata float32 {med / base:5.2f}  bytes/row {size[kind]}")
    p32, p8 = (float(np.median(times[f"plain lookup, strata {k}"])) for k in ("float32", "int8"))
    print(f"plain lookup: strata float32 / strata int8 (speed-up of int8): {p32 / p8:.2f}")
    s8 = float(np.median(times["strata int8"]))
    s4 = float(np.median(times["strata int4"]))
    print(f"strata int8 / FBGEMM int8: {s8 / float(np.median(times['FBGEMM int8 (embedding_bag_byte_rowwise_offsets)'])):.2f}")
    print(f"strata int4 / FBGEMM int4: {s4 / float(np.median(times['FBGEMM int4 (embedding_bag_4bit_rowwise_offsets)'])):.2f}")


if __name__ == "__main__":
    main()
