"""The package's ``__partitioned__`` code in one process (python/src/strata/_partitioned.py):
what ``Table.__partitioned__`` says of a single-process table, and the consumer's handling of
communicators, handles ``get`` resolves to nothing, and empty ``locals``. The distributed side
runs under mpirun with the real Heat: test_heat.py (scripts/heat-tests.sh)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import strata


def split_rows(g: np.ndarray, counts: list[int]) -> dict:
    """A single-process description of ``g`` split along rows into ``counts``, partition p at
    location [p] (Heat's form, every partition local)."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    return {
        "shape": g.shape,
        "partition_tiling": (len(counts), 1),
        "partitions": {
            (p, 0): {"start": (s, 0), "shape": (n, g.shape[1]), "data": g[s : s + n].copy(), "location": [p]}
            for p, (s, n) in enumerate(zip(starts, counts))
        },
        "locals": [(p, 0) for p in range(len(counts))],
        "get": lambda x: x,
    }


def test_a_single_process_table_is_one_local_partition_of_rank_0() -> None:
    g = np.random.default_rng(1).standard_normal((9, 3)).astype(np.float32)
    with strata.Table.from_array(g) as t:
        d = t.__partitioned__
        assert (d["shape"], d["partition_tiling"], d["locals"]) == ((9, 3), (1, 1), [(0, 0)])
        e = d["partitions"][(0, 0)]
        assert (e["start"], e["shape"], e["location"], e["dtype"], e["device"]) == ((0, 0), (9, 3), [0], "float32", "cpu")
        assert d["get"](e["data"]) is e["data"] and not e["data"].flags.writeable
        np.testing.assert_array_equal(e["data"], g)
        with pytest.raises(BufferError):
            t.close()
        del d, e
        gc.collect()


def test_comm_objects_are_passed_through_py2f() -> None:
    class Comm:
        calls = 0

        def py2f(self) -> int:
            Comm.calls += 1
            return 0

    g = np.ones((4, 2), np.float32)
    want = strata.InvalidArgument if strata.build_features()["mpi"] else strata.UnsupportedDevice
    with pytest.raises(want, match="comm"):
        strata.from_partitioned(split_rows(g, [4]), comm=Comm())
    assert Comm.calls == 1


def test_a_handle_get_resolves_to_none_is_a_partition_without_data() -> None:
    g = np.arange(12, dtype=np.float32).reshape(6, 2)
    d = split_rows(g, [3, 3])
    store = {pos: e["data"] for pos, e in d["partitions"].items()}
    for pos, e in d["partitions"].items():
        e["data"] = ("ref", pos)
    d["get"] = lambda ref: store[ref[1]] if ref[1] == (0, 0) else None
    d["locals"] = None
    with pytest.raises(strata.InvalidArgument, match=r"partition \(1,0\) has no local data"):
        strata.from_partitioned(d)
    d["get"] = lambda ref: store[ref[1]]
    with strata.from_partitioned(d) as t:
        np.testing.assert_array_equal(strata.lookup(t, np.arange(6)), g)


def test_empty_locals_are_no_locals() -> None:
    g = np.arange(8, dtype=np.float32).reshape(4, 2)
    d = split_rows(g, [4])
    d["locals"] = []
    with strata.from_partitioned(d) as t:
        np.testing.assert_array_equal(strata.lookup(t, np.arange(4)), g)
