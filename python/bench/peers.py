"""strata's pooled and many-table lookups against the peers a PyTorch user already has, side by
side in one process, interleaved, on the same memory and the same keys (issue 20).

    python python/bench/peers.py [--rounds 7] [--budget 0.3] [--scale 1.0] [--only NAME,...]

Peers: ``torch.nn.functional.embedding_bag`` (FBGEMM's ``EmbeddingSpMDM`` kernels on CPU), a loop
of 26 ``embedding_bag`` calls, TorchRec's ``EmbeddingBagCollection`` and FBGEMM's table-batched
embedding (TBE, fp32, CPU). Workloads (``--scale`` shrinks every row count and batch, for smoke
runs):

  pooled       10K bags of 20 uniform keys, sum and mean, with and without per-sample weights,
               float32, float16 and bfloat16 tables: on a 2,000-row table of dim 64 and 128
               (rows in cache; what is left is the kernel's cost a key), on one table 1M x 128
               with one fixed key set (the same 200K rows, 100 MB, every call) and, on a 4M x 64
               table, 12 key sets in turn (rows mostly not in cache). strata adopts PyTorch's
               tensor (copy=False: both read the same 4 KiB pages) and, separately, reads its
               own copy (huge pages).
  dlrm         26 tables of dim 64 (two of 4M rows, four of 500K, twenty of 10K-100K), B = 2048,
               Poisson pooling factors 1-40 (ragged, some empty bags), uniform and Zipf(1.05)
               keys: strata_lookup_batch of 26 pooled requests, 26 lookup_pooled calls, the loop
               of embedding_bag calls, TorchRec and TBE.
  small        the same 26 tables at B = 1, 16 and 64: lookup_batch against 26 embedding_bag calls.
  quantized    the same 26 tables as int8 and int4 rows (FBGEMM's quantizers; strata adopts the
               fused rows): strata's batch against its float32 batch, FBGEMM's quantized
               inference TBE and a loop of PyTorch's quantized embedding_bag (issue 22).

The float32 sum workloads also time two references on the same tensor (python/bench/plain_pool.c,
built by scripts/bench-peers.sh): a plain prefetching C loop, and the memory's limit, a loop that
reads every cache line of every row and adds nothing; strata / limit near 1 means the memory,
not the kernel, sets the time. Every contender's output is checked against ``embedding_bag``
before anything is timed (the limit's, which pools nothing, is not). Each round
runs every contender once (``--budget`` seconds of calls each); printed are each contender's
median time per call with its min-max over the rounds, and each ratio strata / peer per round
(median, min-max). The load average is printed before and after. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "unknown"


def pages_of(t) -> str:
    """Which pages back the tensor ``t``: the share of its mapping on transparent huge pages."""
    addr = t.data_ptr()
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return "unknown pages"
    i = 0
    while i < len(lines):
        head = lines[i].split()
        lo, hi = (int(x, 16) for x in head[0].split("-"))
        j = i + 1
        fields = {}
        while j < len(lines) and ":" in lines[j].split()[0] and not lines[j][0].isdigit() and "-" not in lines[j].split()[0]:
            k, *v = lines[j].split()
            fields[k.rstrip(":")] = v[0] if v else ""
            j += 1
        if lo <= addr < hi:
            size, huge = int(fields.get("Size", 0)), int(fields.get("AnonHugePages", 0))
            return f"{100 * huge / max(size, 1):.0f}% huge pages"
        i = j
    return "unknown pages"


def per_call(f: Callable[[], object], budget: float) -> float:
    """Seconds per call of ``f`` (wall clock), from enough calls to fill about ``budget``."""
    t0 = time.perf_counter()
    f()
    one = time.perf_counter() - t0
    reps = max(1, int(budget / max(one, 1e-7)))
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps


def fmt(s: float) -> str:
    return f"{s * 1e6:8.1f} us" if s < 1e-3 else f"{s * 1e3:8.2f} ms"


class Bench:
    def __init__(self, rounds: int, budget: float) -> None:
        self.rounds, self.budget = rounds, budget
        self.summary: List[Tuple[str, str, float, float, float]] = []

    def run(self, label: str, cases: Dict[str, Callable[[], object]], ratios: Sequence[Tuple[str, str]]) -> None:
        """Times ``cases`` interleaved and prints them and the ``(strata case, peer case)`` ratios."""
        times: Dict[str, List[float]] = {k: [] for k in cases}
        for f in cases.values():
            per_call(f, self.budget / 4)  # warm up
        for _ in range(self.rounds):
            for k, f in cases.items():
                times[k].append(per_call(f, self.budget))
        print(f"\n{label}   (load average {loadavg()})")
        for k, ts in times.items():
            print(f"  {k:34s} {fmt(statistics.median(ts))}   (min {fmt(min(ts)).strip()}, max {fmt(max(ts)).strip()})")
        for a, b in ratios:
            rs = [x / y for x, y in zip(times[a], times[b])]
            med = statistics.median(rs)
            print(f"  {a + ' / ' + b:60s} {med:5.2f}x   (min {min(rs):.2f}, max {max(rs):.2f}, {self.rounds} rounds)")
            self.summary.append((label, f"{a} / {b}", med, min(rs), max(rs)))


def check(name: str, got, ref, rtol: float, atol: float) -> None:
    import torch

    g, r = got.float(), ref.float()
    if not torch.allclose(g, r, rtol=rtol, atol=atol):
        bad = (g - r).abs().max().item()
        sys.exit(f"peers.py: {name} differs from embedding_bag (max abs difference {bad}); nothing timed")


_plain = []


def plain_loop():
    """python/bench/plain_pool.c, built by scripts/bench-peers.sh (``STRATA_PLAIN_POOL``: its
    path), or None: a plain prefetching C loop on the same tensor, and the memory's limit (every
    line of every row read, nothing added)."""
    if not _plain:
        path = os.environ.get("STRATA_PLAIN_POOL")
        lib = None
        if path:
            lib = ctypes.CDLL(path)
            lib.plain_pool.restype = ctypes.c_int
            lib.plain_pool.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            lib.plain_touch.restype = ctypes.c_int
            lib.plain_touch.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_void_p, ctypes.c_int]
        _plain.append(lib)
    return _plain[0]


def pooled(b: Bench, a, rng) -> None:
    import strata
    import torch
    import torch.nn.functional as F

    def placed(x, skew: int):
        """A copy of `x` whose first row starts `skew` bytes past a 64-byte line."""
        e = x.element_size()
        buf = torch.empty(x.numel() + 64 // e, dtype=x.dtype)
        at = ((-buf.data_ptr()) % 64 + skew) // e
        y = buf[at:at + x.numel()].view(x.shape)
        y.copy_(x)
        return y

    def one(label: str, rows: int, dim: int, bags: int, hot: int, key_sets: int, dtype, mode: str, weighted: bool, own_copy: bool,
            skew: Optional[int] = None) -> None:
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        # As a user gets it (NumPy's memory for float32, PyTorch's for a converted dtype), or
        # placed `skew` bytes past a line.
        w = torch.from_numpy(rng.random((rows, dim), dtype=np.float32)).to(tdt)
        if skew is not None:
            w = placed(w, skew)
        table = strata.Table.from_array(w, copy=own_copy)
        sets = []
        for _ in range(key_sets):
            k = torch.from_numpy(rng.integers(0, rows, bags * hot, dtype=np.int64))
            off = torch.arange(0, bags * hot + 1, hot, dtype=torch.int64)
            psw = torch.from_numpy(rng.random(bags * hot, dtype=np.float32)) if weighted else None
            sets.append((k, off, psw))
        out = torch.empty((bags, dim), dtype=tdt)
        tol = (1e-5, 1e-5) if dtype == "float32" else (2e-2, 2e-2)
        for k, off, psw in sets:
            ref = F.embedding_bag(k, w, off, mode=mode, per_sample_weights=psw, include_last_offset=True)
            strata.lookup_pooled(table, k, off, psw, mode, out=out)
            check(f"strata {label}", out, ref, *tol)
        turn = [0]

        def next_set():
            s = sets[turn[0] % len(sets)]
            turn[0] += 1
            return s

        def s_call():
            k, off, psw = next_set()
            return strata.lookup_pooled(table, k, off, psw, mode, out=out)

        def t_call():
            k, off, psw = next_set()
            return F.embedding_bag(k, w, off, mode=mode, per_sample_weights=psw, include_last_offset=True)

        cases = {"strata lookup_pooled": s_call, "embedding_bag": t_call}
        ratios = [("strata lookup_pooled", "embedding_bag")]
        plain = plain_loop()
        if plain is not None and dtype == "float32" and mode == "sum":
            # A plain C loop and the memory's limit, reading the same tensor as embedding_bag.
            threads = strata.default_num_threads()

            def p_call():
                k, off, psw = next_set()
                plain.plain_pool(ctypes.c_void_p(w.data_ptr()), dim, ctypes.c_void_p(k.data_ptr()), ctypes.c_void_p(off.data_ptr()),
                                 bags, ctypes.c_void_p(psw.data_ptr() if psw is not None else None), ctypes.c_void_p(out.data_ptr()), threads)

            for i, (k, off, psw) in enumerate(sets):
                turn[0] = i
                p_call()
                ref = F.embedding_bag(k, w, off, mode=mode, per_sample_weights=psw, include_last_offset=True)
                check("plain C loop", out, ref, *tol)
            scratch = torch.empty((bags, dim))

            def touch_call():
                k, off, _ = next_set()
                plain.plain_touch(ctypes.c_void_p(w.data_ptr()), dim, ctypes.c_void_p(k.data_ptr()), ctypes.c_void_p(off.data_ptr()),
                                  bags, ctypes.c_void_p(scratch.data_ptr()), threads)

            cases["plain C loop"] = p_call
            cases["read every line (limit)"] = touch_call
            ratios += [("strata lookup_pooled", "plain C loop"), ("strata lookup_pooled", "read every line (limit)")]
        where = "own copy, " + pages_of_table(w, own_copy) if own_copy else "adopted, same memory (" + pages_of(w) + ")"
        where += f"; the peer's rows start {w.data_ptr() % 64} bytes past a 64-byte line"
        b.run(f"pooled {label}: {rows} x {dim} {dtype}, {bags} bags of {hot}, {mode}{', weighted' if weighted else ''}, "
              f"{key_sets} key set(s); strata {where}", cases, ratios)
        table.close()

    def pages_of_table(w, own_copy: bool) -> str:
        return "huge pages" if own_copy and not os.environ.get("STRATA_NO_HUGE_PAGES") else "strata's pages"

    s = a.scale
    rows1, rows4 = max(1000, int(1_000_000 * s)), max(4000, int(4_000_000 * s))
    bags = max(100, int(10_000 * s))
    # In cache: a 2,000-row table (1 MB at dim 128 float32) stays in the last-level cache, and
    # the same key set comes back every call: what is left is the kernel's own cost a key.
    for dim in (64, 128):
        for dtype in ("float32", "float16", "bfloat16"):
            for mode, weighted in (("sum", False), ("mean", False), ("sum", True)):  # embedding_bag weights only sum
                if (dtype != "float32" or dim != 128) and (mode, weighted) == ("mean", False):
                    continue
                if dtype != "float32" and (dim != 128 or weighted):
                    continue
                # float32 twice: on lines (PyTorch's allocator) and 16 bytes past them
                # (NumPy's, what torch.from_numpy shares): every vector load then spans two lines.
                for skew in ((0, 16) if dtype == "float32" else (0,)):
                    one("in cache", 2000, dim, bags, 20, 1, dtype, mode, weighted, False, skew)
    # Small bags in cache (pooling factors 1 and 4, like the DLRM tables' one-key features):
    # what a bag costs beside its keys (its start, the divisor, the store) shows here.
    for hot in (1, 4):
        one("small bags in cache", 2000, 64, bags, hot, 1, "float32", "sum", False, False, 0)
    # One key set over a table far larger than the cache: the same 200K rows (100 MB) every call.
    for dtype in ("float32", "float16", "bfloat16"):
        for mode, weighted in (("sum", False), ("mean", False), ("sum", True)):
            if dtype != "float32" and (mode, weighted) != ("sum", False):
                continue
            one("one key set", rows1, 128, bags, 20, 1, dtype, mode, weighted, False)
    one("one key set", rows1, 128, bags, 20, 1, "float32", "sum", False, True)
    one("not in cache", rows4, 64, bags, 20, 12, "float32", "sum", False, False)
    one("not in cache", rows4, 64, bags, 20, 12, "float32", "sum", False, True)
    one("not in cache", rows4, 64, bags, 20, 12, "float32", "sum", True, False)


def dlrm_tables(scale: float, rng) -> List[int]:
    big = [4_000_000] * 2 + [500_000] * 4
    small = [int(x) for x in np.geomspace(10_000, 100_000, 20)]
    return [max(100, int(r * scale)) for r in big + small]


def dlrm_keys(rows: List[int], batch: int, zipf: bool, rng) -> List[Tuple[object, object]]:
    """Per table: int64 keys and int64 offsets [B + 1], Poisson pooling factors spread over 1-40."""
    import torch

    factors = np.linspace(1, 40, len(rows)).round().astype(int)
    rng.shuffle(factors)
    out = []
    for r, L in zip(rows, factors):
        lengths = rng.poisson(L, batch)
        n = int(lengths.sum())
        if zipf:
            z = (rng.zipf(1.05, n) - 1) % r
            perm = rng.permutation(r)
            k = perm[z]
        else:
            k = rng.integers(0, r, n)
        off = np.zeros(batch + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        out.append((torch.from_numpy(k.astype(np.int64)), torch.from_numpy(off)))
    return out


def dlrm(b: Bench, a, rng, weights, tables, batches: Sequence[int], zipfs: Sequence[bool], small: bool) -> None:
    import strata
    import torch
    import torch.nn.functional as F

    dim = weights[0].shape[1]
    rows = [w.shape[0] for w in weights]
    ebc = torchrec_ebc(weights) if not small else None
    tbe = fbgemm_tbe(weights) if not small else None
    for batch in batches:
        for zipf in zipfs:
            kk = dlrm_keys(rows, batch, zipf, rng)
            outs = [torch.empty((batch, dim)) for _ in weights]
            reqs = [strata.Request(t, k, o, off, None, "sum") for t, (k, off), o in zip(tables, kk, outs)]
            refs = [F.embedding_bag(k, w, off, mode="sum", include_last_offset=True) for w, (k, off) in zip(weights, kk)]
            strata.lookup_batch(reqs)
            for i, (o, r) in enumerate(zip(outs, refs)):
                check(f"strata lookup_batch table {i}", o, r, 1e-5, 1e-5)
            for t, (k, off), o, r in zip(tables, kk, outs, refs):
                o.fill_(float("nan"))
                strata.lookup_pooled(t, k, off, None, "sum", out=o)
                check("strata lookup_pooled", o, r, 1e-5, 1e-5)
            cases: Dict[str, Callable[[], object]] = {
                "strata lookup_batch": lambda: strata.lookup_batch(reqs),
                "strata 26 lookup_pooled": lambda: [strata.lookup_pooled(t, k, off, None, "sum", out=o) for t, (k, off), o in zip(tables, kk, outs)],
                "embedding_bag loop": lambda: [F.embedding_bag(k, w, off, mode="sum", include_last_offset=True) for w, (k, off) in zip(weights, kk)],
            }
            ratios = [("strata lookup_batch", "embedding_bag loop"), ("strata lookup_batch", "strata 26 lookup_pooled")]
            if ebc is not None:
                kjt = ebc_input(kk, batch)
                got = ebc[0](kjt).values()
                check("TorchRec EmbeddingBagCollection", got, torch.cat(refs, dim=1), 1e-5, 1e-5)
                cases["TorchRec EBC"] = lambda kjt=kjt: ebc[0](kjt).values()
                ratios.append(("strata lookup_batch", "TorchRec EBC"))
            if tbe is not None:
                idx = torch.cat([k for k, _ in kk])
                offs = [torch.zeros(1, dtype=torch.int64)]
                base = 0
                for k, off in kk:
                    offs.append(off[1:] + base)
                    base += int(k.numel())
                offs_t = torch.cat(offs)
                with torch.no_grad():
                    got = tbe(idx, offs_t)
                check("FBGEMM TBE", got, torch.cat(refs, dim=1), 1e-4, 1e-4)

                def tbe_call(idx=idx, offs_t=offs_t):
                    with torch.no_grad():
                        return tbe(idx, offs_t)

                cases["FBGEMM TBE fp32"] = tbe_call
                ratios.append(("strata lookup_batch", "FBGEMM TBE fp32"))
            nnz = sum(int(k.numel()) for k, _ in kk)
            b.run(f"{'small batch' if small else 'DLRM-like'}: 26 tables of dim {dim}, B = {batch}, {nnz} keys, "
                  f"{'Zipf(1.05)' if zipf else 'uniform'} keys; strata adopts the same tensors", cases, ratios)


def quantized(b: Bench, a, rng, weights, tables) -> None:
    """The DLRM-like 26 tables quantized (issue 22): strata's int8 and int4 tables (FBGEMM's
    fused rows, adopted) against strata's float32 batch, FBGEMM's quantized inference TBE and a
    loop of PyTorch's quantized embedding_bag calls (FBGEMM's quantized EmbeddingSpMDM)."""
    import strata
    import torch
    import torch.nn.functional as F

    try:
        import fbgemm_gpu  # noqa: F401
    except ImportError as e:
        print(f"quantized: skipped: cannot import fbgemm_gpu ({e})")
        return
    dim = weights[0].shape[1]
    rows = [w.shape[0] for w in weights]
    q8 = [torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(w) for w in weights]
    q4 = [torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(w, 4) for w in weights]
    t8 = [strata.Table.from_array(q, storage="int8", copy=False) for q in q8]
    t4 = [strata.Table.from_array(q, storage="int4", copy=False) for q in q4]
    print(f"\nbytes a row at dim {dim}: float32 {dim * 4}, int8 {q8[0].shape[1]}, int4 {q4[0].shape[1]}")
    deq8 = [torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(q) for q in q8]
    deq4 = [torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(q, 4) for q in q4]
    tbe8, tbe8_rows = quantized_tbe(q8, "int8")
    tbe4, tbe4_rows = quantized_tbe(q4, "int4")
    batch = max(16, int(2048 * a.scale))
    kk = dlrm_keys(rows, batch, False, rng)
    outs = [torch.empty((batch, dim)) for _ in weights]
    reqs = {name: [strata.Request(t, k, o, off, None, "sum") for t, (k, off), o in zip(ts, kk, outs)]
            for name, ts in (("float32", tables), ("int8", t8), ("int4", t4))}
    for name, deq in (("int8", deq8), ("int4", deq4)):
        strata.lookup_batch(reqs[name])
        for i, (o, w, (k, off)) in enumerate(zip(outs, deq, kk)):
            check(f"strata {name} lookup_batch table {i}", o, F.embedding_bag(k, w, off, mode="sum", include_last_offset=True), 1e-5, 1e-4)
    idx = torch.cat([k for k, _ in kk])
    offs, base = [torch.zeros(1, dtype=torch.int64)], 0
    for k, off in kk:
        offs.append(off[1:] + base)
        base += int(k.numel())
    offs_t = torch.cat(offs)
    cases: Dict[str, Callable[[], object]] = {
        "strata lookup_batch float32": lambda: strata.lookup_batch(reqs["float32"]),
        "strata lookup_batch int8": lambda: strata.lookup_batch(reqs["int8"]),
        "strata lookup_batch int4": lambda: strata.lookup_batch(reqs["int4"]),
        "quantized embedding_bag loop int8": lambda: [torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
            q, k, off, False, 0, False, None, None, True) for q, (k, off) in zip(q8, kk)],
        "quantized embedding_bag loop int4": lambda: [torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(
            q, k, off, False, 0, False, None, None, True) for q, (k, off) in zip(q4, kk)],
    }
    for q, deq in ((q8, deq8), (q4, deq4)):
        f = torch.ops.quantized.embedding_bag_byte_rowwise_offsets if q is q8 else torch.ops.quantized.embedding_bag_4bit_rowwise_offsets
        for (k, off), qq, w in zip(kk, q, deq):
            check("quantized embedding_bag", f(qq, k, off, False, 0, False, None, None, True),
                  F.embedding_bag(k, w, off, mode="sum", include_last_offset=True), 1e-4, 1e-3)
    ratios = [("strata lookup_batch int8", "strata lookup_batch float32"), ("strata lookup_batch int4", "strata lookup_batch float32"),
              ("strata lookup_batch int8", "quantized embedding_bag loop int8"), ("strata lookup_batch int4", "quantized embedding_bag loop int4")]
    for name, tbe, trows in (("int8", tbe8, tbe8_rows), ("int4", tbe4, tbe4_rows)):
        if tbe is None:
            continue
        with torch.no_grad():
            got = tbe(idx.int(), offs_t.int())
        want = torch.cat([F.embedding_bag(k, w, off, mode="sum", include_last_offset=True) for w, (k, off) in zip(trows, kk)], dim=1)
        check(f"FBGEMM TBE {name}", got, want, 1e-4, 1e-3)

        def tbe_call(tbe=tbe, idx=idx.int(), offs_t=offs_t.int()):
            with torch.no_grad():
                return tbe(idx, offs_t)

        cases[f"FBGEMM TBE {name}"] = tbe_call
        ratios.append((f"strata lookup_batch {name}", f"FBGEMM TBE {name}"))
    nnz = int(idx.numel())
    b.run(f"quantized DLRM-like: 26 tables of dim {dim}, B = {batch}, {nnz} uniform keys; strata adopts FBGEMM's fused rows", cases, ratios)


def quantized_tbe(fused, kind: str):
    """FBGEMM's inference TBE (CPU) holding the rows of ``fused`` (its layout: the values, then
    float16 scale and bias; int8's float32 scale and bias are rounded to float16), and the rows
    it holds, dequantized."""
    import torch

    try:
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
    except Exception as e:  # noqa: BLE001
        print(f"FBGEMM TBE {kind}: skipped: cannot import it ({type(e).__name__}: {e})")
        return None, None
    sparse = SparseType.INT8 if kind == "int8" else SparseType.INT4
    dims = [(q.shape[1] - 8) if kind == "int8" else (q.shape[1] - 4) * 2 for q in fused]
    specs = [(f"t{i}", q.shape[0], d, sparse, EmbeddingLocation.HOST) for i, (q, d) in enumerate(zip(fused, dims))]
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(embedding_specs=specs, pooling_mode=PoolingMode.SUM, device="cpu",
                                                  output_dtype=SparseType.FP32)
    tbe.fill_random_weights()
    weights, rows = [], []
    for q, d in zip(fused, dims):
        if kind == "int8":
            data = q[:, :d].contiguous()
            sb = q[:, d:].contiguous().view(torch.float32).half()
        else:
            data = q[:, : d // 2].contiguous()
            sb = q[:, d // 2:].contiguous().view(torch.float16)
        weights.append((data, sb.contiguous().view(torch.uint8)))
        sbf = sb.float()
        if kind == "int8":
            vals = data.float()
        else:
            vals = torch.stack([data & 15, data >> 4], dim=2).reshape(data.shape[0], d).float()
        rows.append(vals * sbf[:, :1] + sbf[:, 1:2])
    tbe.assign_embedding_weights(weights)
    return tbe, rows


def torchrec_ebc(weights):
    try:
        import torch
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
    except Exception as e:  # noqa: BLE001 - any import failure means the peer is missing
        print(f"TorchRec: skipped: cannot import it ({type(e).__name__}: {e})")
        return None
    cfg = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=w.shape[1], num_embeddings=w.shape[0],
                              feature_names=[f"f{i}"], pooling=PoolingType.SUM) for i, w in enumerate(weights)]
    ebc = EmbeddingBagCollection(tables=cfg, device=torch.device("meta"))
    for i, w in enumerate(weights):  # the same memory as every other contender
        ebc.embedding_bags[f"t{i}"].weight = torch.nn.Parameter(w, requires_grad=False)
    return [ebc]


def ebc_input(kk, batch: int):
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    values = torch.cat([k for k, _ in kk])
    lengths = torch.cat([off[1:] - off[:-1] for _, off in kk])
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(len(kk))], values=values, lengths=lengths)


def fbgemm_tbe(weights):
    try:
        import torch
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as e:  # noqa: BLE001
        print(f"FBGEMM TBE: skipped: cannot import it ({type(e).__name__}: {e})")
        return None
    specs = [(w.shape[0], w.shape[1], EmbeddingLocation.HOST, ComputeDevice.CPU) for w in weights]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(embedding_specs=specs, pooling_mode=PoolingMode.SUM,
                                                weights_precision=SparseType.FP32, output_dtype=SparseType.FP32,
                                                device=torch.device("cpu"))
    with torch.no_grad():  # TBE keeps its own copy of the rows: it has no way to share them
        for dst, w in zip(tbe.split_embedding_weights(), weights):
            dst.copy_(w)
    return tbe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--budget", type=float, default=0.3, help="seconds of calls per contender per round")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every row count and batch size")
    p.add_argument("--only", default="pooled,dlrm,small,quantized", help="comma-separated: pooled, dlrm, small, quantized")
    a = p.parse_args()
    import strata
    import torch

    try:
        import fbgemm_gpu
        fb = fbgemm_gpu.__version__
    except Exception:  # noqa: BLE001
        fb = "not installed"
    try:
        import torchrec
        tr = getattr(torchrec, "__version__", "installed")
    except Exception:  # noqa: BLE001
        tr = "not installed"
    print(f"strata {strata.version()} ({strata.library_path()}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), fbgemm-gpu-cpu {fb}, torchrec {tr}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, strata threads {strata.default_num_threads()}; load average {loadavg()}")
    only = set(a.only.split(","))
    rng = np.random.default_rng(20261201)
    b = Bench(a.rounds, a.budget)
    if "pooled" in only:
        pooled(b, a, rng)
    if only & {"dlrm", "small", "quantized"}:
        rows = dlrm_tables(a.scale, rng)
        weights = [torch.from_numpy(rng.random((r, 64), dtype=np.float32)) for r in rows]
        tables = [strata.Table.from_array(w, copy=False) for w in weights]
        if "dlrm" in only:
            dlrm(b, a, rng, weights, tables, [max(16, int(2048 * a.scale))], (False, True), False)
        if "small" in only:
            dlrm(b, a, rng, weights, tables, (1, 16, 64), (False,), True)
        if "quantized" in only:
            quantized(b, a, rng, weights, tables)
    print(f"\nsummary (strata's time / the peer's; below 1 is strata faster)   load average {loadavg()}")
    for label, name, med, lo, hi in b.summary:
        print(f"  {med:5.2f}x ({lo:.2f}-{hi:.2f})  {name:58s} {label[:90]}")


if __name__ == "__main__":
    main()
