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

With PyTorch 2.4 or newer it then times the custom ops of strata.torch on ``--small`` keys,
allocating their outputs as the ops do (wall time, ``torch.set_num_threads(1)``; the ops use
strata's default threads, which run a call this small on the calling thread):

  ops.lookup         torch.ops.strata.lookup(h, keys)                          eager
  ops.lookup (compiled)  the same op inside torch.compile(fullgraph=True)
  index_select       torch.index_select(vectors, 0, keys)                      the anchor (eager, and compiled)
  ops.lookup_pooled  torch.ops.strata.lookup_pooled(h, keys, offsets, None, "sum"), 8 bags (eager, compiled)
  embedding_bag      F.embedding_bag(keys, vectors, offsets, mode="sum", include_last_offset=True)

``--ops-library libstrata_torch.so`` times the C++ op library's ops (c_examples/torch) instead.

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
        print(f"  {k:23s} {med * scale:9.2f} {unit}   (min {min(ts) * scale:.2f}, max {max(ts) * scale:.2f})")
    for name, (a, b) in ratios.items():
        rs = [x / y for x, y in zip(times[a], times[b])]
        print(f"  {name:37s} {statistics.median(rs):5.2f}x   (min {min(rs):.2f}, max {max(rs):.2f}, {rounds} rounds)")


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
    p.add_argument("--no-ops", dest="ops", action="store_false", help="leave out the torch.ops.strata section")
    p.add_argument("--ops-library", help="time the ops of this libstrata_torch.so instead of strata.torch's")
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
        if torch is not None and a.ops:
            torch.set_num_threads(1)  # a 2-thread pool's wake-ups on a loaded machine cost ms, not us
            ops_section(table, vt, rng, a)


def ops_section(table, vt, rng, a) -> None:
    """torch.ops.strata.lookup / lookup_pooled, eager and compiled, against index_select and
    embedding_bag (every output checked against its anchor first)."""
    import torch
    import torch.nn.functional as F

    if a.ops_library:  # libstrata_torch.so instead of strata.torch (never both in one process)
        torch.ops.load_library(a.ops_library)
        h = torch.ops.strata.table_from_tensors(vt)
        which = f"libstrata_torch.so ({a.ops_library})"
    else:
        try:
            import strata.torch as st
        except ImportError as e:
            print(f"\ntorch.ops.strata: not timed ({e})")
            return
        h = st.handle(table)
        which = "strata.torch (Python custom ops)"
    n = a.small
    kt = torch.from_numpy(rng.integers(0, a.rows, n, dtype=np.int64))
    offsets = torch.from_numpy(np.linspace(0, n, 9).astype(np.int64))  # 8 bags
    op_lookup = lambda: torch.ops.strata.lookup(h, kt)  # noqa: E731
    op_pooled = lambda: torch.ops.strata.lookup_pooled(h, kt, offsets, None, "sum")  # noqa: E731
    index_select = lambda: torch.index_select(vt, 0, kt)  # noqa: E731
    bag = lambda: F.embedding_bag(kt, vt, offsets, mode="sum", include_last_offset=True)  # noqa: E731
    c_lookup = torch.compile(lambda k: torch.ops.strata.lookup(h, k), fullgraph=True)
    c_pooled = torch.compile(lambda k, o: torch.ops.strata.lookup_pooled(h, k, o, None, "sum"), fullgraph=True)
    c_index = torch.compile(lambda k: torch.index_select(vt, 0, k), fullgraph=True)
    assert torch.equal(op_lookup(), index_select()) and torch.equal(c_lookup(kt), index_select())
    assert torch.equal(c_index(kt), index_select())
    torch.testing.assert_close(op_pooled(), bag(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_pooled(kt, offsets), bag(), rtol=1e-5, atol=1e-5)
    cases: Dict[str, Callable[[], object]] = {
        "ops.lookup": op_lookup,
        "ops.lookup (compiled)": lambda: c_lookup(kt),
        "index_select": index_select,
        "index_select (compiled)": lambda: c_index(kt),
        "ops.lookup_pooled": op_pooled,
        "ops.pooled (compiled)": lambda: c_pooled(kt, offsets),
        "embedding_bag": bag,
    }
    ratios = {
        "ops.lookup / index_select": ("ops.lookup", "index_select"),
        "compiled ops.lookup / index_select": ("ops.lookup (compiled)", "index_select"),
        "compiled: ops.lookup / index_select": ("ops.lookup (compiled)", "index_select (compiled)"),
        "ops.lookup_pooled / embedding_bag": ("ops.lookup_pooled", "embedding_bag"),
        "compiled ops.pooled / embedding_bag": ("ops.pooled (compiled)", "embedding_bag"),
    }
    run(f"torch.ops.strata from {which}, {n} keys (8 bags for the pooled ones), outputs allocated, torch threads "
        f"{torch.get_num_threads()}; wall time", cases, ratios, a.rounds, a.budget, time.perf_counter)


if __name__ == "__main__":
    main()
