"""Round trips with the real Heat (``heat`` from PyPI, over PyTorch and mpi4py), run on every rank
under ``mpirun -n 1``, ``-n 2`` and ``-n 4`` by scripts/heat-tests.sh (against a libstrata built
with the ``mpi`` feature): Heat array -> strata table -> lookups equal to NumPy indexing of the
global array -> ``heat.from_partitioned(table)`` equal to the original, zero copy all the way.

Every test is collective: every rank runs the same tests in the same order. A failure on one
rank would leave the others waiting in a collective call, so, loaded as a plugin too
(``pytest -p test_heat``), this module prints the failure and aborts the job (``MPI_Abort``).
Without heat or mpi4py (the plain Python test run) the module is skipped.
"""

from __future__ import annotations

import gc
import sys
from typing import Any, Generator

import numpy as np
import pytest

ht = pytest.importorskip("heat")
MPI = pytest.importorskip("mpi4py.MPI")
import torch  # noqa: E402  (heat brings it)

import strata  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
DIM = 5


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, None]:
    """On a failure, print it and end every rank (the others may be waiting for this one)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and SIZE > 1:
        sys.stderr.write(f"\n[rank {RANK}] {rep.nodeid} failed ({rep.when}):\n{rep.longreprtext}\n")
        sys.stderr.flush()
        COMM.Abort(1)


# heat.from_partitioned wraps strata's read-only NumPy views with torch.from_numpy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")


def global_array(rows: int, seed: int) -> np.ndarray:
    """The same [rows, DIM] float32 array on every rank."""
    return np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)


def uneven_counts() -> list[int]:
    """Rows per rank unlike Heat's own chunking (3, 5, 7, 9 over 4 ranks)."""
    return [3 + 2 * r for r in range(SIZE)]


def make(layout: str, seed: int) -> tuple[np.ndarray, "ht.DNDarray"]:
    """(global array, Heat array of it) for a layout: "balanced" is Heat's split=0 chunking of 27
    rows (7/7/7/6 over 4 ranks), "uneven" a split=0 array whose ranks hold 3/5/7/9 rows, and
    "replicated" a split=None array (every rank holds every row)."""
    if layout == "balanced":
        g = global_array(27, seed)
        return g, ht.array(g, split=0)
    if layout == "uneven":
        counts = uneven_counts()
        g = global_array(sum(counts), seed)
        start = sum(counts[:RANK])
        return g, ht.array(torch.from_numpy(g[start : start + counts[RANK]].copy()), is_split=0)
    g = global_array(10, seed)
    return g, ht.array(g, split=None)


def check_lookups(t: strata.Table, g: np.ndarray, seed: int, default: float = 0.0) -> None:
    """Collective lookups, each rank with its own keys (a few past the last row: misses), compared
    with NumPy indexing of the global array."""
    rng = np.random.default_rng(seed + 1000 * RANK)
    rows = g.shape[0]
    keys = rng.integers(0, rows + 3, size=(7 + 3 * RANK, 4), dtype=np.int64)
    want = np.where((keys < rows)[..., None], g[np.minimum(keys, rows - 1)], np.float32(default))
    np.testing.assert_array_equal(strata.lookup(t, keys), want)
    out = torch.full((keys.size, DIM), float("nan"))
    strata.lookup(t, torch.from_numpy(keys.reshape(-1).astype(np.int32)), out=out)
    np.testing.assert_array_equal(out.numpy(), want.reshape(-1, DIM))


def local_pointers(desc: dict) -> list[int]:
    """Where this rank's partitions of a strata description live."""
    return [e["data"].ctypes.data for e in desc["partitions"].values() if e["data"] is not None]


@pytest.mark.parametrize("layout", ["balanced", "uneven", "replicated"])
def test_heat_round_trip(layout: str) -> None:
    g, a = make(layout, seed={"balanced": 1, "uneven": 2, "replicated": 3}[layout])
    np.testing.assert_array_equal(a.numpy(), g)
    t = strata.from_partitioned(a, comm=COMM)
    assert (len(t), t.dim) == g.shape
    # zero copy into strata: the table reads Heat's own local tensor
    desc = t.__partitioned__
    assert local_pointers(desc) == [a.larray.data_ptr()]
    check_lookups(t, g, seed=7)
    b = ht.from_partitioned(t)
    # ... and back out: Heat's new array is the same memory
    assert b.larray.data_ptr() == a.larray.data_ptr()
    assert b.gshape == a.gshape and b.lshape == a.lshape
    assert b.split == (a.split if SIZE > 1 else None)  # one rank: one partition, the whole array
    assert ht.equal(b, a)
    np.testing.assert_array_equal(b.numpy(), g)
    # the views Heat holds keep the table open
    del desc
    gc.collect()
    with pytest.raises(BufferError, match="views of its vectors"):
        t.close()
    del b
    gc.collect()
    t.close()
    assert t.closed


def test_distributed_table_describes_itself_as_spread() -> None:
    counts = uneven_counts()
    g, a = make("uneven", seed=3)
    with strata.from_partitioned(a, comm=COMM, default_value=-1.0) as t:
        d = t.__partitioned__
        assert d["shape"] == g.shape and d["partition_tiling"] == (SIZE, 1)
        assert d["locals"] == [(RANK, 0)]
        assert d["get"](d["partitions"][(RANK, 0)]["data"]) is d["partitions"][(RANK, 0)]["data"]
        for r in range(SIZE):
            e = d["partitions"][(r, 0)]
            assert e["start"] == (sum(counts[:r]), 0) and e["shape"] == (counts[r], DIM)
            assert e["location"] == [r] and e["dtype"] == "float32"
            if r == RANK:
                assert not e["data"].flags.writeable
                np.testing.assert_array_equal(e["data"], g[e["start"][0] : e["start"][0] + counts[r]])
            else:
                assert e["data"] is None
        check_lookups(t, g, seed=11, default=-1.0)
        del d, e
        gc.collect()


def test_heats_replicated_description_makes_a_replicated_table() -> None:
    g, a = make("replicated", seed=5)
    heat_desc = a.__partitioned__
    # Heat 1.8 names a single location for its one partition (the last rank, on every rank)
    assert heat_desc["partitions"][(0, 0)]["location"] == [SIZE - 1]
    with strata.from_partitioned(heat_desc, comm=COMM) as t:
        d = t.__partitioned__
        assert d["partition_tiling"] == (1, 1) and d["locals"] == [(0, 0)]
        assert d["partitions"][(0, 0)]["location"] == list(range(SIZE))
        check_lookups(t, g, seed=13)
        del d
        gc.collect()


def test_a_table_built_by_strata_goes_to_heat() -> None:
    """A strata table from a plain dict (each rank's partition its own NumPy rows) -> Heat."""
    counts = uneven_counts()
    g = global_array(sum(counts), seed=17)
    starts = [sum(counts[:r]) for r in range(SIZE)]
    mine = g[starts[RANK] : starts[RANK] + counts[RANK]].copy()
    desc = {
        "shape": g.shape,
        "partition_tiling": (SIZE, 1),
        "partitions": {
            (r, 0): {"start": (starts[r], 0), "shape": (counts[r], DIM), "data": mine if r == RANK else None, "location": [r]}
            for r in range(SIZE)
        },
        "locals": [(RANK, 0)],
        "get": lambda x: x,
    }
    t = strata.from_partitioned(desc, comm=COMM.py2f())
    b = ht.from_partitioned(t)
    assert b.larray.data_ptr() == mine.ctypes.data
    np.testing.assert_array_equal(b.numpy(), g)
    del b
    gc.collect()
    t.close()


@pytest.mark.skipif(SIZE == 1, reason="needs ranks that disagree")
def test_collective_errors_name_the_rank_at_fault() -> None:
    last = SIZE - 1
    g, a = make("balanced", seed=19)
    # options that differ on one rank: every rank names it and quotes its value
    with pytest.raises(strata.InvalidArgument) as e:
        strata.from_partitioned(a, comm=COMM, default_value=2.5 if RANK == last else 0.0)
    assert f"default_value 0 on rank 0 but 2.5 on rank {last}" in str(e.value)
    # data of another dtype on one rank: that rank reports its own error, the others quote it
    desc = dict(a.__partitioned__)
    if RANK == last:
        parts = dict(desc["partitions"])
        mine = dict(parts[(RANK, 0)])
        mine["data"] = mine["data"].double()
        parts[(RANK, 0)] = mine
        desc["partitions"] = parts
    with pytest.raises(strata.UnsupportedDtype) as e:
        strata.from_partitioned(desc, comm=COMM)
    msg = str(e.value)
    assert "dtype float64" in msg
    assert msg.startswith(f"rank {last} failed the collective call: ") == (RANK != last), msg
