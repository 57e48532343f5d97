"""strata's Python call against the calls a Python user compares it with, side by side in one run.

    python python/bench/small_calls.py [--rows 100000] [--dim 128] [--small 64] [--large 200000]
                                       [--rounds 15] [--budget 0.05]

A dense float32 table of ``rows x dim``; random int64 keys; outputs preallocated. For ``--small``
keys with ``num_threads=1`` (and ``torch.set_num_threads(1)``) and for ``--large`` keys with every
library's default threads, it times:

  strata (torch)   strata.lookup(table, keys_t, out=out_t, num_threads=n)   PyTorch tensors
  index_select     torch.index_select(vectors_t, 0, keys_t, out=out_t)     the anchor
  strata (numpy)   strata.lookup(table, keys, out=out, num_threads=n)      NumPy arrays
  numpy.take       numpy.take(vectors, keys, axis=0, out=out)               the anchor
  C call alone     strata_lookup through ctypes on DLTensors built once    the floor for Python
  memcpy           numpy.copyto of the output's bytes                      the limit for large

Rounds are interleaved (every case once per round, ``--budget`` seconds each); each round gives
per-call times and the ratios strata / anchor. The small calls run on the calling thread alone,
so they are timed by its CPU time (``time.thread_time``), which other processes sharing the
machine do not inflate; the large batches use several threads and are timed by the wall clock. Printed: the median per-call time of each case,
and each ratio's median with its min-max over the rounds. The issue's target for the small calls
is a ratio of at most 2 against both anchors. No timing here is a test: the tests check results.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import time
from typing import Callable, Dict, List

import numpy as np


def per_call_seconds(f: Callable[[], object], budget: float, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of ``f``, from batches of calls filling about ``budget`` seconds."""
    n = 1
    while True:
        t0 = clock()
        for _ in range(n):
            f()
        dt = clock() - t0
        if dt >= budget / 4 or n >= 1 << 22:
            break
        n *= 4
    reps = max(1, int(n * budget / max(dt, 1e-9)))
    t0 = clock()
    for _ in range(reps):
        f()
    return (clock() - t0) / reps


def c_call_alone(table, keys: np.ndarray, out: np.ndarray, threads: int) -> Callable[[], object]:
    """``strata_lookup`` on DLTensors prepared once: what a call costs with no Python around it."""
    from strata import _ffi

    caps = (keys.__dlpack__(max_version=(1, 0)), out.__dlpack__(max_version=(1, 0)))
    ptrs = [_ffi.PyCapsule_GetPointer(c, b"dltensor_versioned") for c in caps]
    f = _ffi.lib["strata_lookup_managed_versioned"]
    f.restype, f.argtypes = ctypes.c_int32, [ctypes.c_void_p] * 5
    opts = _ffi.strata_lookup_options(None, threads)
    args = (ctypes.cast(table._h, ctypes.c_void_p).value, ptrs[0], ptrs[1], ctypes.addressof(opts), None)

    def call() -> object:
        return f(*args), caps, opts

    return call


def run(label: str, cases: Dict[str, Callable[[], object]], ratios: Dict[str, tuple], rounds: int, budget: float,
        clock: Callable[[], float]) -> None:
    times: Dict[str, List[float]] = {k: [] for k in cases}
    for f in cases.values():  # warm up
        per_call_seconds(f, budget / 5, clock)
    for _ in range(rounds):
        for k, f in cases.items():
            times[k].append(per_call_seconds(f, budget, clock))
    print(f"\n{label}")
    for k, ts in times.items():
        med = statistics.median(ts)
        unit, scale = ("us", 1e6) if med < 1e-3 else ("ms", 1e3)
        print(f"  {k:16s} {med * scale:9.2f} {unit}   (min {min(ts) * scale:.2f}, max {max(ts) * scale:.2f})")
    for name, (a, b) in ratios.items():
        rs = [x / y for x, y in zip(times[a], times[b])]
        print(f"  {name:34s} {statistics.median(rs):5.2f}x   (min {min(rs):.2f}, max {max(rs):.2f}, {rounds} rounds)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--small", type=int, default=64)
    p.add_argument("--large", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--budget", type=float, default=0.05, help="seconds per case per round")
    p.add_argument("--clock", choices=("auto", "wall", "thread"), default="auto",
                   help="auto: the calling thread's CPU time for the one-thread small calls, wall time for the rest")
    a = p.parse_args()

    import strata

    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(20261201)
    vectors = rng.random((a.rows, a.dim), dtype=np.float32)
    print(f"strata {strata.version()} ({strata._ffi.lib._name}), NumPy {np.__version__}, "
          f"PyTorch {torch.__version__ if torch else 'not installed'}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; table {a.rows} x {a.dim} float32 (dense)")
    default_torch_threads = torch.get_num_threads() if torch else 0
    with strata.Table.from_array(vectors) as table:
        vt = torch.from_numpy(vectors) if torch else None
        for n, threads in ((a.small, 1), (a.large, None)):
            keys = rng.integers(0, a.rows, n, dtype=np.int64)
            out, ref = np.empty((n, a.dim), np.float32), vectors[keys]
            cases: Dict[str, Callable[[], object]] = {}
            ratios: Dict[str, tuple] = {}
            if torch is not None:
                torch.set_num_threads(1 if threads == 1 else default_torch_threads)
                kt, ot = torch.from_numpy(keys.copy()), torch.empty((n, a.dim))
                strata.lookup(table, kt, out=ot, num_threads=threads)
                assert np.array_equal(ot.numpy(), ref)
                cases["strata (torch)"] = lambda kt=kt, ot=ot: strata.lookup(table, kt, out=ot, num_threads=threads)
                cases["index_select"] = lambda kt=kt, ot=ot: torch.index_select(vt, 0, kt, out=ot)
                ratios["strata / index_select"] = ("strata (torch)", "index_select")
            strata.lookup(table, keys, out=out, num_threads=threads)
            assert np.array_equal(out, ref)
            cases["strata (numpy)"] = lambda: strata.lookup(table, keys, out=out, num_threads=threads)
            cases["numpy.take"] = lambda: np.take(vectors, keys, axis=0, out=out)
            cases["C call alone"] = c_call_alone(table, keys, out, threads or 0)
            ratios["strata / numpy.take"] = ("strata (numpy)", "numpy.take")
            ratios["strata (numpy) / C call alone"] = ("strata (numpy)", "C call alone")
            if n >= 10_000:
                src = np.ones_like(out)
                cases["memcpy"] = lambda src=src: np.copyto(out, src)
                ratios["strata (numpy) / memcpy"] = ("strata (numpy)", "memcpy")
            tdesc = "num_threads=1, torch threads 1" if threads == 1 else (
                f"default threads (strata {strata.default_num_threads()}, torch {default_torch_threads}, numpy 1)")
            # One thread does all the work of a small call: its CPU time is the cost, and is not
            # inflated by other processes taking the core (wall time is printed by --clock wall).
            thread_clock = threads == 1 and a.clock == "auto" or a.clock == "thread"
            clock, cname = (time.thread_time, "thread CPU time") if thread_clock else (time.perf_counter, "wall time")
            run(f"{n} keys, {tdesc}; {cname}", cases, ratios, a.rounds, a.budget, clock)


if __name__ == "__main__":
    main()
