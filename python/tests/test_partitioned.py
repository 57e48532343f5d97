"""The ``__partitioned__`` protocol (IntelPython DPPY-Spec, as Heat implements it) through ctypes.

Descriptions are written as the Python dicts Heat's ``DNDarray.__partitioned__`` produces
(``shape``, ``partition_tiling``, ``partitions`` keyed by grid position, ``get``, ``locals``) and
turned into ``strata_partitioned`` by :class:`Described`. Local data reaches strata either as
``&managed->dl_tensor`` of real NumPy ``__dlpack__`` capsules, or as opaque handles that strata
resolves through a ctypes ``get`` callback. Every lookup writes into a poisoned output and is
compared with NumPy indexing of the full global array.

Only the single-process part of issue 5 exists: ``comm`` is always NULL here (a non-NULL one is
refused by this build).
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import subprocess
import textwrap
from ctypes import CFUNCTYPE, POINTER, Structure, byref, c_char_p, c_int32, c_int64, c_void_p

import numpy as np
import pytest

from test_ctypes import (  # noqa: F401  (rng is a fixture)
    HEADER,
    REPO,
    _fn,
    STATUS_NAME,
    STATUS_T,
    STRATA_INVALID_ARGUMENT,
    STRATA_INVALID_LAYOUT,
    STRATA_NULL_ARGUMENT,
    STRATA_OK,
    STRATA_UNSUPPORTED_DEVICE,
    STRATA_UNSUPPORTED_DTYPE,
    TABLE_P,
    DLTensor,
    HandTensor,
    Table,
    Tensor,
    adopt,
    assert_same_f32,
    from_dlpack,
    kDLBfloat,
    kDLCUDA,
    kDLFloat,
    last_error,
    lib,
    lookup,
    poisoned,
    rng,
    strata_table_options,
    run_child,
    table_options,
)

# ---------------------------------------------------------------------------------------------
# The declarations of include/strata.h, from the generated header (see test_ctypes.HEADER).
# Every struct starts with size_t struct_size (set to sizeof by its constructor, as
# strata_<name>_default() does); arrays of them are strided by their elements' struct_size.
# ---------------------------------------------------------------------------------------------

strata_partition_location = HEADER.structs["strata_partition_location"]
strata_partition = HEADER.structs["strata_partition"]
strata_partitioned = HEADER.structs["strata_partitioned"]
# const DLTensor *(*)(void *user, void *handle). ctypes callbacks may only return simple types,
# so the result is a c_void_p (an address, or None for NULL).
strata_partition_get_fn = HEADER.types["strata_partition_get_fn"]


def location(rank=-1, device_id=-1, pid=0, host=None):
    """A location as strata_partition_location_default() makes it, with the fields given."""
    return strata_partition_location(rank, device_id, pid, host)


def element(array, i):
    """Element i of an array strata made: its elements are struct_size bytes apart."""
    base = ctypes.addressof(array.contents)
    return array._type_.from_address(base + i * ctypes.c_size_t.from_address(base).value)


PARTITIONED_P = POINTER(strata_partitioned)
strata_partitioned_validate = _fn("strata_partitioned_validate")
strata_table_from_partitioned = _fn("strata_table_from_partitioned")
strata_table_partitioned = _fn("strata_table_partitioned")
strata_partitioned_free = _fn("strata_partitioned_free")
strata_partitioned_default = _fn("strata_partitioned_default")
strata_partition_default = _fn("strata_partition_default")
strata_partition_location_default = _fn("strata_partition_location_default")

# ---------------------------------------------------------------------------------------------
# __partitioned__ dicts as Heat produces them
# ---------------------------------------------------------------------------------------------


def heat_split0(global_arr, nranks, *, rank=None):
    """``DNDarray.__partitioned__`` of a [rows, ...] array with ``split=0`` over ``nranks`` ranks:
    rows spread as Heat's ``comm.chunk`` does (the first ``rows % nranks`` ranks get one more row:
    27 over 4 is 7/7/7/6), one partition per rank at grid position (r, 0, ...), location [r].

    ``rank=None`` is a single process holding every partition: data everywhere, every grid
    position in ``locals``. ``rank=r`` is what rank r sees: only its own partition has data, and
    ``locals`` is ``[(r, 0, ...)]``. Each rank's data is its own array (a copy), as in Heat.
    """
    rows, nd = global_arr.shape[0], global_arr.ndim
    base, extra = divmod(rows, nranks)
    counts = [base + (r < extra) for r in range(nranks)]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    rest = (0,) * (nd - 1)
    partitions = {}
    for r in range(nranks):
        s, n = starts[r], counts[r]
        local = rank is None or rank == r
        partitions[(r, *rest)] = {
            "start": (s, *rest),
            "shape": (n, *global_arr.shape[1:]),
            "data": global_arr[s : s + n].copy() if local else None,
            "location": [r],
            "dtype": str(global_arr.dtype),
            "device": "cpu",
        }
    return {
        "shape": tuple(global_arr.shape),
        "partition_tiling": (nranks, *(1,) * (nd - 1)),
        "partitions": partitions,
        "locals": [(r, *rest) for r in range(nranks)] if rank is None else [(rank, *rest)],
        "get": lambda x: x,
    }


def heat_split_none(global_arr, nranks):
    """``DNDarray.__partitioned__`` with ``split=None``: one partition at (0, 0, ...) covering the
    whole array, replicated on every rank (location [0, 1, ..., nranks-1]). The data is the array
    itself (no copy): Heat's ``larray`` of a non-distributed array is the whole array.

    (Heat's own code, as of 1.x, overwrites the one entry once per rank, so that it ends with
    location [nranks-1]; the spec's replication, a list of every owner, is what a consumer must
    accept and what is written here.)"""
    zero = (0,) * global_arr.ndim
    return {
        "shape": tuple(global_arr.shape),
        "partition_tiling": (1,) * global_arr.ndim,
        "partitions": {
            zero: {
                "start": zero,
                "shape": tuple(global_arr.shape),
                "data": global_arr,
                "location": list(range(nranks)),
                "dtype": str(global_arr.dtype),
                "device": "cpu",
            }
        },
        "locals": [zero],
        "get": lambda x: x,
    }


class ObjRef:
    """An opaque reference to a partition held in a store (as Ray's ObjectRef or a Dask future)."""

    def __init__(self, key):
        self.key = key

    def __repr__(self):
        return f"ObjRef({self.key!r})"


def as_handles(parts):
    """The same description with every ``data`` replaced by an :class:`ObjRef` into a store, and
    ``get`` resolving it (None stays None). Returns (new dict, store)."""
    store = {}
    out = dict(parts)
    out["partitions"] = {}
    for pos, e in parts["partitions"].items():
        e = dict(e)
        if e["data"] is not None:
            store[pos] = e["data"]
            e["data"] = ObjRef(pos)
        out["partitions"][pos] = e
    out["get"] = lambda ref: store.get(ref.key)
    return out, store


# ---------------------------------------------------------------------------------------------
# dict -> strata_partitioned
# ---------------------------------------------------------------------------------------------

GET_USER = 0x5EED


def _ints(values):
    values = list(values)
    return (c_int64 * max(1, len(values)))(*values)


class Described:
    """A ``strata_partitioned`` made from a ``__partitioned__`` dict. Everything the C struct
    points to (arrays, capsules, the callback) lives as long as this object.

    ``data_as``: "dlpack" passes each non-None ``data`` as a DLTensor (NumPy arrays through a real
    ``__dlpack__`` capsule; a :class:`HandTensor` as is; anything else is first turned into an
    array with the dict's ``get``); "handle" passes each non-None ``data`` as an opaque handle that
    the ctypes ``get`` callback resolves with the dict's ``get`` (and exports through a capsule).
    A dict {grid position: "dlpack" | "handle"} chooses per entry. ``with_get=False`` leaves
    ``get`` NULL.

    Locations: an int is an MPI rank; a tuple (host, pid[, device]) is the latest draft's form.

    A dict that lacks a grid position of its tiling cannot be expressed in C (the partitions are
    an array of exactly prod(tiling) entries): that raises ValueError here, before strata."""

    def __init__(self, parts, *, data_as="dlpack", with_get=True):
        self.py_get = parts.get("get")
        self.shape = _ints(parts["shape"])
        self.tiling = _ints(parts["partition_tiling"])
        nd = len(parts["shape"])
        grid = list(itertools.product(*(range(t) for t in parts["partition_tiling"])))
        missing = [g for g in grid if g not in parts["partitions"]]
        if missing:
            raise ValueError(f"no entry for grid position {missing[0]}")
        self.alive = []  # ctypes buffers, capsules, tensors
        self.handles = {}  # handle value -> data object
        self.calls = []  # (user, handle) per call of the callback
        self.entries = (strata_partition * max(1, len(grid)))()
        for i, pos in enumerate(grid):
            e = parts["partitions"][pos]
            c = self.entries[i]
            c.struct_size = ctypes.sizeof(strata_partition)
            start, shape = _ints(e["start"]), _ints(e["shape"])
            locs = (strata_partition_location * max(1, len(e["location"])))()
            for j, loc in enumerate(e["location"]):
                if isinstance(loc, tuple):
                    host, pid, *dev = loc
                    locs[j] = location(-1, dev[0] if dev else -1, pid, host.encode())
                else:
                    locs[j] = location(loc)
            self.alive += [start, shape, locs]
            c.start = ctypes.cast(start, POINTER(c_int64))
            c.shape = ctypes.cast(shape, POINTER(c_int64))
            c.locations = ctypes.cast(locs, POINTER(strata_partition_location))
            c.num_locations = len(e["location"])
            kind = data_as.get(pos, "dlpack") if isinstance(data_as, dict) else data_as
            data = e["data"]
            if data is None:
                continue
            if kind == "dlpack":
                c.data = ctypes.cast(self._export(data), POINTER(DLTensor))
            elif kind == "handle":
                h = 0x1000 + 16 * i
                self.handles[h] = data
                c.handle = h
            else:
                raise ValueError(kind)
        self.desc = strata_partitioned()
        self.desc.struct_size = ctypes.sizeof(strata_partitioned)
        self.desc.ndim = nd
        self.desc.shape = ctypes.cast(self.shape, POINTER(c_int64))
        self.desc.partition_tiling = ctypes.cast(self.tiling, POINTER(c_int64))
        self.desc.partitions = ctypes.cast(self.entries, POINTER(strata_partition))
        local_list = parts.get("locals")
        if local_list is not None:
            self.locals = _ints([x for pos in local_list for x in pos])
            self.desc.locals = ctypes.cast(self.locals, POINTER(c_int64))
            self.desc.num_locals = len(local_list)
        self.callback = strata_partition_get_fn(self._get)
        if with_get:
            self.desc.get = self.callback
            self.desc.get_user = GET_USER
        self.ptr = ctypes.pointer(self.desc)

    def _export(self, data):
        """Address of a DLTensor for ``data``, kept alive."""
        if not isinstance(data, (np.ndarray, HandTensor)) and self.py_get is not None:
            data = self.py_get(data)
        t = data if isinstance(data, HandTensor) else Tensor(data)
        self.alive.append(t)
        return ctypes.addressof(t.ptr.contents)

    def _get(self, user, handle):
        # Exceptions cannot cross the C boundary: anything unexpected returns NULL and shows up
        # in self.calls for the test to check.
        self.calls.append((user, handle))
        data = self.handles.get(handle)
        if data is None:
            return None
        resolved = self.py_get(data)
        if resolved is None:
            return None
        return self._export(resolved)


# ---------------------------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------------------------


def _bogus_table():
    return ctypes.cast(c_void_p(0x10), TABLE_P)  # poisoned out-parameter: must be cleared


def from_partitioned(desc_ptr, opts=None, comm=None, *, status=STRATA_OK, msg=()):
    """strata_table_from_partitioned; on failure checks the status, that *out was cleared, and
    that the message holds every fragment of ``msg``."""
    out = _bogus_table()
    c = None if comm is None else byref(c_int32(comm))
    s = strata_table_from_partitioned(desc_ptr, c, None if opts is None else byref(opts), byref(out))
    assert s == status, (
        f"strata_table_from_partitioned: got {STATUS_NAME.get(s, s)}, want {STATUS_NAME.get(status)}; "
        f"last error: {last_error()!r}"
    )
    if s != STRATA_OK:
        assert not out, "*out must be NULL on failure"
        expect_error(s, status, *msg)
        return None
    return Table(out)


def expect_error(status_got, status, *fragments):
    msg = last_error()
    assert status_got == status, f"got {STATUS_NAME.get(status_got, status_got)}, want {STATUS_NAME[status]}: {msg!r}"
    for f in fragments:
        assert f in msg, f"{f!r} not in the message {msg!r}"
    return msg


def validate(d):
    return strata_partitioned_validate(d.ptr if isinstance(d, Described) else d)


def expected_rows(global_arr, keys, default):
    keys = np.asarray(keys)
    ok = (keys >= 0) & (keys < global_arr.shape[0])
    want = np.full((len(keys), global_arr.shape[1]), default, np.float32)
    want[ok] = global_arr[keys[ok]]
    return want, int(ok.sum())


def check_lookups(table, global_arr, rng, *, default=0.0, n=300):
    """Random row numbers, some out of range on both sides: equal to global[keys] or the default."""
    rows = global_arr.shape[0]
    keys = rng.integers(-4, rows + 4, size=n, dtype=np.int64)
    keys[:4] = [0, rows - 1, -1, rows]
    out = poisoned((n, global_arr.shape[1]))
    hits, misses = lookup(table, keys, out)
    want, nhit = expected_rows(global_arr, keys, default)
    assert_same_f32(out, want)
    assert (hits, misses) == (nhit, n - nhit)


def lookup_one(table, key, dim):
    out = poisoned((1, dim))
    lookup(table, np.array([key], np.int64), out)
    return out[0]


def describe_table(table):
    p = PARTITIONED_P()
    s = strata_table_partitioned(table.h, byref(p))
    assert s == STRATA_OK, last_error()
    assert p
    return p


_NP_DTYPE = {(kDLFloat, 32): np.float32, (kDLFloat, 16): np.float16, (kDLBfloat, 16): np.uint16}


def read_dltensor(t: DLTensor) -> np.ndarray:
    """A NumPy copy of a host DLTensor's elements (non-negative strides; NULL strides = row-major)."""
    dt = np.dtype(_NP_DTYPE[(t.dtype.code, t.dtype.bits)])
    assert t.dtype.lanes == 1
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides:
        strides = [t.strides[i] for i in range(t.ndim)]
    else:
        strides = [int(np.prod(shape[i + 1 :])) for i in range(t.ndim)]
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dt)
    assert min(strides) >= 0
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    buf = (ctypes.c_char * (span * dt.itemsize)).from_address(t.data + t.byte_offset)
    base = np.frombuffer(buf, dtype=dt)
    return np.lib.stride_tricks.as_strided(base, shape, [s * dt.itemsize for s in strides]).copy()


def _arr(p, n):
    return [p[i] for i in range(n)]


# ---------------------------------------------------------------------------------------------
# ABI
# ---------------------------------------------------------------------------------------------


def test_layouts_and_signatures_match_the_header(tmp_path):
    """Sizes and offsets of the three structs as the C compiler sees them, and the four functions
    and the callback type with exactly the signatures bound here (a mismatch is an incompatible
    pointer assignment, an error under -Werror)."""
    structs = {
        "struct strata_partition_location": strata_partition_location,
        "struct strata_partition": strata_partition,
        "struct strata_partitioned": strata_partitioned,
    }
    lines = []
    for cname, py in structs.items():
        lines.append(f'printf("{cname}|size|%zu\\n", sizeof({cname}));')
        for fname, _ in py._fields_:
            lines.append(f'printf("{cname}|{fname}|%zu\\n", offsetof({cname}, {fname}));')
    flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{REPO / 'include'}"]
    sig = tmp_path / "sig.c"
    sig.write_text(
        "#include \"strata.h\"\n"
        "static const DLTensor *get(void *user, void *handle) { (void)user; return (const DLTensor *)handle; }\n"
        "strata_status (*v)(const struct strata_partitioned *) = strata_partitioned_validate;\n"
        "strata_status (*f)(const struct strata_partitioned *, const int32_t *, const struct strata_table_options *,"
        " struct strata_table **) = strata_table_from_partitioned;\n"
        "strata_status (*p)(const struct strata_table *, struct strata_partitioned **) = strata_table_partitioned;\n"
        "void (*fr)(struct strata_partitioned *) = strata_partitioned_free;\n"
        "struct strata_partitioned d = {sizeof(struct strata_partitioned), 0, 0, 0, 0, 0, 0, get, 0};\n"
        "struct strata_partitioned (*dd)(void) = strata_partitioned_default;\n"
        "struct strata_partition (*pd)(void) = strata_partition_default;\n"
        "struct strata_partition_location (*ld)(void) = strata_partition_location_default;\n"
    )
    r = subprocess.run(["cc", "-c", *flags, str(sig), "-o", os.devnull], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    src = tmp_path / "layout.c"
    src.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"strata.h\"\nint main(void) {\n"
        + "\n".join(lines)
        + "\n  return 0;\n}\n"
    )
    exe = tmp_path / "layout"
    r = subprocess.run(["cc", *flags, str(src), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines():
        cname, field, value = line.split("|")
        got[(cname, field)] = int(value)
    for cname, py in structs.items():
        assert got[(cname, "size")] == ctypes.sizeof(py), cname
        for fname, _ in py._fields_:
            assert got[(cname, fname)] == getattr(py, fname).offset, f"{cname}.{fname}"
    header = (REPO / "include" / "strata.h").read_text()
    for name in ("strata_partitioned_validate", "strata_table_from_partitioned", "strata_table_partitioned",
                 "strata_partitioned_free"):
        assert f"{name}(" in header


def test_initialisers_set_struct_size():
    d = strata_partitioned_default()
    assert d.struct_size == ctypes.sizeof(strata_partitioned) == 72
    assert d.ndim == 0 and not d.shape and not d.partitions and not d.locals and not d.get and not d.get_user
    p = strata_partition_default()
    assert p.struct_size == ctypes.sizeof(strata_partition) == 56
    assert not p.start and not p.shape and not p.data and not p.handle and not p.locations and p.num_locations == 0
    loc = strata_partition_location_default()
    assert (loc.struct_size, loc.rank, loc.device_id, loc.pid, loc.host) == (ctypes.sizeof(strata_partition_location), -1, -1, 0, None)


def test_struct_sizes_are_checked(rng):
    """Each struct's struct_size under the rules of every strata struct, and the arrays
    (partitions, each partition's locations): one struct_size for every element, its stride."""
    d = Described(_base(rng))
    d.desc.struct_size = 0
    msg = expect_error(validate(d), STRATA_INVALID_ARGUMENT, "desc: struct_size is 0",
                       "initialise it with strata_partitioned_default()")
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT)
    assert last_error() == msg
    d = Described(_base(rng))
    d.entries[2].struct_size = 48
    expect_error(validate(d), STRATA_INVALID_ARGUMENT,
                 "desc: partitions[2].struct_size = 48, but partitions[0].struct_size = 56", "strata_partition_default()")
    d = Described(_base(rng))
    d.entries[0].struct_size = 0x1234_5678
    expect_error(validate(d), STRATA_INVALID_ARGUMENT,
                 "desc: partitions[0].struct_size = 305419896 is not the size of any version of strata_partition")
    d = Described(_base(rng))
    d.entries[1].locations[0].struct_size = 0
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "desc: partitions[1].locations[0].struct_size is 0",
                 "strata_partition_location_default()")


class newer_partition(Structure):
    """A strata_partition of a newer strata: one more field."""

    _fields_ = strata_partition._fields_ + [("extra", ctypes.c_uint64)]


def test_a_newer_callers_larger_partitions_are_read_with_their_stride(rng):
    g = rng.standard_normal((27, 8)).astype(np.float32)
    d = Described(heat_split0(g, 4))
    wide = (newer_partition * 4)()
    for i in range(4):
        ctypes.memmove(ctypes.addressof(wide[i]), ctypes.addressof(d.entries[i]), ctypes.sizeof(strata_partition))
        wide[i].struct_size = ctypes.sizeof(newer_partition)
    d.desc.partitions = ctypes.cast(wide, POINTER(strata_partition))
    assert validate(d) == STRATA_OK, last_error()
    with from_partitioned(d.ptr) as t:
        check_lookups(t, g, rng)
    wide[3].extra = 1  # a field this strata does not know, set: refused
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "desc: partitions[3].struct_size = 64, and byte 56 is not zero")


# ---------------------------------------------------------------------------------------------
# Consumer: tables from Heat-shaped descriptions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("locals_", ["heat", "null"])
def test_heat_split0_uneven_rows_copies(rng, locals_):
    """27 rows over 4 ranks (7/7/7/6), every partition held by this process, comm NULL: a dense
    table whose key is the global row number. Several partitions are copied: the sources may
    change or go away afterwards."""
    g = rng.standard_normal((27, 8)).astype(np.float32)
    parts = heat_split0(g, 4)
    assert [e["shape"] for e in parts["partitions"].values()] == [(7, 8), (7, 8), (7, 8), (6, 8)]
    assert [e["start"] for e in parts["partitions"].values()] == [(0, 0), (7, 0), (14, 0), (21, 0)]
    if locals_ == "null":
        del parts["locals"]
    assert validate(Described(parts, with_get=False)) == STRATA_OK, last_error()  # get unneeded
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    t = from_partitioned(d.ptr, table_options(default_value=-2.5))
    assert d.calls == [], "DLPack data must not go through get"
    with t:
        info = t.info()
        assert (info.rows, info.dim, info.keyed, info.adopted) == (27, 8, False, False)
        check_lookups(t, g, rng, default=-2.5)
        # It copied: overwrite every source, drop the description, and the table is unchanged.
        for e in parts["partitions"].values():
            e["data"][:] = 1e6
        del d
        gc.collect()
        check_lookups(t, g, rng, default=-2.5)


def test_heat_split0_more_ranks_than_rows(rng):
    """Heat with 3 rows over 4 ranks: 1/1/1/0, the last partition empty (start 3, shape (0, 5))."""
    g = rng.standard_normal((3, 5)).astype(np.float32)
    parts = heat_split0(g, 4)
    assert [e["shape"][0] for e in parts["partitions"].values()] == [1, 1, 1, 0]
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    with from_partitioned(d.ptr) as t:
        assert len(t) == 3
        check_lookups(t, g, rng)


def test_heat_split0_float16(rng):
    g = rng.standard_normal((27, 6)).astype(np.float16)
    d = Described(heat_split0(g, 4))
    with from_partitioned(d.ptr) as t:
        assert t.info().dtype.bits == 16
        check_lookups(t, g.astype(np.float32), rng)


@pytest.mark.parametrize("data_as", ["dlpack", "handle"])
def test_heat_split_none_replicated_is_zero_copy(rng, data_as):
    """split=None: one partition replicated on ranks 0..3. The table borrows the array: a write
    into the NumPy source after building it is what the next lookup sees, and the table's own
    description points at the same memory."""
    g = rng.standard_normal((27, 8)).astype(np.float32)
    parts = heat_split_none(g, 4)
    assert list(parts["partitions"]) == [(0, 0)] and parts["partitions"][(0, 0)]["location"] == [0, 1, 2, 3]
    if data_as == "handle":
        parts, _ = as_handles(parts)
    d = Described(parts, data_as=data_as)
    assert validate(d) == STRATA_OK, last_error()
    with from_partitioned(d.ptr, table_options(default_value=7.0)) as t:
        check_lookups(t, g, rng, default=7.0)
        g[5] = np.arange(8, dtype=np.float32) + 100
        g[26, 3] = -42.0
        assert_same_f32(lookup_one(t, 5, 8), np.arange(8) + 100)
        assert lookup_one(t, 26, 8)[3] == -42.0
        check_lookups(t, g, rng, default=7.0)
        p = describe_table(t)
        try:
            view = p.contents.partitions[0].data.contents
            assert view.data + view.byte_offset == g.ctypes.data
            g[0, 0] = 1234.5
            assert read_dltensor(view)[0, 0] == 1234.5
        finally:
            strata_partitioned_free(p)


@pytest.mark.parametrize("source", ["contiguous", "padded_rows"])
def test_tiling_1x1_single_partition_is_zero_copy(rng, source):
    """tiling (1, 1), location [0]: borrowed, also when rows are padded (row stride 12 > dim 8)."""
    big = rng.standard_normal((40, 12)).astype(np.float32)
    g = big[:, :8] if source == "padded_rows" else np.ascontiguousarray(big[:, :8])
    parts = {
        "shape": (40, 8),
        "partition_tiling": (1, 1),
        "partitions": {(0, 0): {"start": (0, 0), "shape": (40, 8), "data": g, "location": [0]}},
        "get": lambda x: x,
    }
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    with from_partitioned(d.ptr) as t:
        check_lookups(t, g, rng)
        g[39] = -1.0
        g[0, 7] = 3.25
        assert_same_f32(lookup_one(t, 39, 8), np.full(8, -1.0))
        assert lookup_one(t, 0, 8)[7] == 3.25
        check_lookups(t, g, rng)


def test_tiling_1x1_column_strided_partition_copies(rng):
    """A single partition whose elements are not unit-stride cannot be borrowed: it is copied,
    and later writes to the source do not reach the table."""
    big = rng.standard_normal((20, 16)).astype(np.float32)
    g = big[:, ::2]
    d = Described({"shape": (20, 8), "partition_tiling": (1, 1),
                   "partitions": {(0, 0): {"start": (0, 0), "shape": (20, 8), "data": g, "location": [0]}}})
    with from_partitioned(d.ptr) as t:
        check_lookups(t, g, rng)
        before = g.copy()
        big[:] = 0
        check_lookups(t, before, rng)


def test_several_partitions_with_any_strides_are_copied_exactly(rng):
    """The copy path reads each partition through its own strides: column stride 2, reversed
    rows, reversed columns, column-major."""
    g = rng.standard_normal((27, 8)).astype(np.float32)
    parts = heat_split0(g, 4)
    def every_other_column(a):
        big = np.zeros((a.shape[0], 2 * a.shape[1]), a.dtype)
        big[:, ::2] = a
        return big[:, ::2]

    views = {
        (0, 0): every_other_column,
        (1, 0): lambda a: a[::-1].copy()[::-1],
        (2, 0): lambda a: a[:, ::-1].copy()[:, ::-1],
        (3, 0): np.asfortranarray,
    }
    for pos, make in views.items():
        e = parts["partitions"][pos]
        e["data"] = make(e["data"])
        np.testing.assert_array_equal(e["data"], g[e["start"][0]:e["start"][0] + e["shape"][0]])
    assert [e["data"].strides for e in parts["partitions"].values()] == [(64, 8), (-32, 4), (32, -4), (4, 24)]
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    with from_partitioned(d.ptr) as t:
        check_lookups(t, g, rng)


def test_misaligned_local_data_names_the_partition():
    buf = np.zeros(64, np.float32)
    ht = HandTensor(buf, (kDLFloat, 32, 1), shape=[3, 4], strides=[4, 1], byte_offset=2)
    d = Described({"shape": (3, 4), "partition_tiling": (1, 1),
                   "partitions": {(0, 0): {"start": (0, 0), "shape": (3, 4), "data": ht, "location": [0]}}})
    s = validate(d)
    assert s in (STRATA_INVALID_ARGUMENT, STRATA_INVALID_LAYOUT), STATUS_NAME.get(s, s)
    assert "partition (0,0)" in last_error() and "aligned" in last_error()


# One partition borrowed without a copy must be read exactly as its strides say. Each case runs
# in a child process: a wrong borrow may read past the caller's buffer.
_BORROW_CASES = {
    "one_row_contiguous": """
        full = np.arange(16, dtype=np.float32).reshape(1, 16)
        data = want = full[:, :8]
    """,
    "dim1_reversed_rows": """
        data = want = np.arange(5, dtype=np.float32).reshape(5, 1)[::-1]
    """,
    "one_row_column_stride_2": """
        full = np.arange(16, dtype=np.float32).reshape(1, 16)
        data = want = full[:, ::2]
    """,
    "one_row_reversed_columns": """
        full = np.arange(16, dtype=np.float32).reshape(1, 16)
        data = want = full[:, ::-1]
    """,
    "dim1_broadcast_rows": """
        buf = np.array([7, 1, 2, 3, 4], np.float32)
        data = HandTensor(buf, (kDLFloat, 32, 1), shape=[5, 1], strides=[0, 1])
        want = np.full((5, 1), 7, np.float32)
    """,
}
@pytest.mark.parametrize("case", [
    k for k in _BORROW_CASES
])
def test_single_partition_is_read_through_its_strides(case):
    body = textwrap.dedent(_BORROW_CASES[case]) + textwrap.dedent("""
        from test_partitioned import Described, from_partitioned
        shape = tuple(want.shape)
        d = Described({"shape": shape, "partition_tiling": (1, 1),
                       "partitions": {(0, 0): {"start": (0, 0), "shape": shape, "data": data, "location": [0]}}})
        with from_partitioned(d.ptr) as t:
            out = np.full(shape, np.nan, np.float32)
            lookup(t, np.arange(shape[0], dtype=np.int64), out)
        print("GOT", out.ravel().tolist())
        print("SAME", bool(np.array_equal(out, want)))
    """)
    r = run_child(body)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "SAME True" in r.stdout, r.stdout


def test_locations_as_host_pid_device_tuples(rng):
    """The latest draft's (ip, pid[, device]) locations are accepted like ranks."""
    g = rng.standard_normal((10, 4)).astype(np.float32)
    parts = heat_split0(g, 2)
    parts["partitions"][(0, 0)]["location"] = [("10.0.0.1", 4242)]
    parts["partitions"][(1, 0)]["location"] = [("10.0.0.2", 4343, 0), ("10.0.0.3", 99)]
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    with from_partitioned(d.ptr) as t:
        check_lookups(t, g, rng)


@pytest.mark.parametrize("layout", ["split0", "split_none", "tiling_1x1"])
def test_handles_and_get_callback_give_the_same_tables(rng, layout):
    """data as opaque references resolved by a ctypes get callback (with the user pointer) gives
    the same lookups as DLPack data; get is called once per local handle per call."""
    g = rng.standard_normal((27, 8)).astype(np.float32)
    if layout == "split0":
        parts = heat_split0(g, 4)
    elif layout == "split_none":
        parts = heat_split_none(g, 4)
    else:
        parts = heat_split_none(g, 1)
        del parts["locals"]
    hparts, store = as_handles(parts)
    assert all(isinstance(e["data"], ObjRef) for e in hparts["partitions"].values())
    d = Described(hparts, data_as="handle")
    assert not any(e.data for e in d.entries[: len(store)]) and all(e.handle for e in d.entries[: len(store)])
    assert validate(d) == STRATA_OK, last_error()
    assert sorted(h for _, h in d.calls) == sorted(d.handles)
    assert all(u == GET_USER for u, _ in d.calls)
    d.calls.clear()
    with from_partitioned(d.ptr, table_options(default_value=0.5)) as t:
        assert sorted(h for _, h in d.calls) == sorted(d.handles)
        check_lookups(t, g, rng, default=0.5)
        # The same through DLPack data, for comparison.
        with from_partitioned(Described(parts).ptr, table_options(default_value=0.5)) as t2:
            keys = rng.integers(-3, 30, size=200)
            a, b = poisoned((200, 8)), poisoned((200, 8))
            lookup(t, keys, a)
            lookup(t2, keys, b)
            assert_same_f32(a, b)


def test_spmd_handles_only_local_ones_are_resolved(rng):
    """Rank 2's view with every partition given as a reference (Ray-style) and locals [(2, 0)]:
    valid, and get is asked only for the local partition. Without a communicator a table
    needs every partition: (0, 0) has none here."""
    g = rng.standard_normal((27, 8)).astype(np.float32)
    parts, store = as_handles(heat_split0(g, 4))
    parts["locals"] = [(2, 0)]
    d = Described(parts, data_as="handle")
    assert validate(d) == STRATA_OK, last_error()
    assert [h for _, h in d.calls] == [d.entries[2].handle]
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT,
                     msg=("partition (0,0) has no local data", "every partition must be local"))


def test_spmd_heat_rank_view_validates(rng):
    """What rank 1 of 4 sees from Heat (data only in its partition, locals [(1, 0)]) is valid."""
    g = rng.standard_normal((27, 8)).astype(np.float32)
    for r in range(4):
        d = Described(heat_split0(g, 4, rank=r))
        assert validate(d) == STRATA_OK, last_error()


# ---------------------------------------------------------------------------------------------
# Validation: every rule, its status, and a message with the grid position and the rule
# ---------------------------------------------------------------------------------------------


def _base(rng):
    return heat_split0(rng.standard_normal((27, 8)).astype(np.float32), 4)


def _entry(parts, pos, **kw):
    parts["partitions"][pos].update(kw)
    return parts


def _tiling_2x2(rng, last_shape=(13, 4)):
    g = rng.standard_normal((27, 8)).astype(np.float32)
    spec = {(0, 0): ((0, 0), (14, 4)), (0, 1): ((0, 4), (14, 4)), (1, 0): ((14, 0), (13, 4)),
            (1, 1): ((14, 4), last_shape)}
    return {
        "shape": (27, 8),
        "partition_tiling": (2, 2),
        "partitions": {pos: {"start": s, "shape": n,
                             "data": np.ascontiguousarray(g[s[0]:s[0] + n[0], s[1]:s[1] + n[1]]),
                             "location": [i]} for i, (pos, (s, n)) in enumerate(spec.items())},
    }


def _mixed(rng):
    return Described(_base(rng), data_as={(1, 0): "handle", (3, 0): "handle"})


def _handles_without_get(rng):
    parts, _ = as_handles(_base(rng))
    return Described(parts, data_as="handle", with_get=False)


def _local_without_data(rng):
    parts = heat_split0(rng.standard_normal((27, 8)).astype(np.float32), 4, rank=2)
    parts["locals"] = [(2, 0), (1, 0)]
    return Described(parts)


def _get_returns_null_for_a_local(rng):
    parts, store = as_handles(_base(rng))
    del store[(3, 0)]
    return Described(parts, data_as="handle")


def _shape_mismatch(rng):
    parts = _base(rng)
    e = parts["partitions"][(1, 0)]
    e["data"] = e["data"][:6].copy()
    return Described(parts)


def _shape_mismatch_through_get(rng):
    parts, store = as_handles(_base(rng))
    store[(1, 0)] = store[(1, 0)][:, :7].copy()
    return Described(parts, data_as="handle")


def _dtype_mismatch(rng):
    parts = _base(rng)
    e = parts["partitions"][(2, 0)]
    e["data"] = e["data"].astype(np.float16)
    return Described(parts)


# (id, builder of a Described, status, fragments of the message)
RULES = [
    ("exceeds_shape",
     lambda rng: Described(_entry(_base(rng), (3, 0), shape=(10, 8))),
     STRATA_INVALID_ARGUMENT, ["partition (3,0): start[0]+shape[0] = 31 exceeds shape[0] = 27"]),
    ("exceeds_shape_dim1",
     lambda rng: Described(_entry(_base(rng), (1, 0), start=(7, 1))),
     STRATA_INVALID_ARGUMENT, ["partition (1,0): start[1]+shape[1] = 9 exceeds shape[1] = 8"]),
    ("gap",
     lambda rng: Described(_entry(_base(rng), (2, 0), start=(15, 0), shape=(6, 8))),
     STRATA_INVALID_ARGUMENT, ["partition (2,0): start[0] = 15; expected 14", "leaves a gap"]),
    ("overlap",
     lambda rng: Described(_entry(_base(rng), (1, 0), start=(5, 0), shape=(9, 8))),
     STRATA_INVALID_ARGUMENT, ["partition (1,0): start[0] = 5; expected 7", "overlaps the previous partition"]),
    ("first_not_at_zero",
     lambda rng: Described(_entry(_base(rng), (0, 0), start=(1, 0), shape=(6, 8))),
     STRATA_INVALID_ARGUMENT, ["partition (0,0): start[0] = 1; expected 0", "leaves a gap"]),
    ("tiling_zero",
     lambda rng: Described(dict(_base(rng), partition_tiling=(4, 0))),
     STRATA_INVALID_ARGUMENT, ["partition_tiling[1] = 0", "at least 1 partition per dimension"]),
    # Wrong number of partitions: not expressible in C. `partitions` is an array that strata reads
    # as exactly prod(partition_tiling) entries, so there is no count to disagree with; a dict
    # with a grid position missing is refused by Described itself (test_missing_grid_position...).
    ("misaligned_grid_slice_dim1",
     lambda rng: Described(_entry(_base(rng), (2, 0), shape=(7, 6))),
     STRATA_INVALID_ARGUMENT,
     ["partition (2,0): start[1] = 0, shape[1] = 6; expected 0 and 8 like partition (0,0) in the same grid slice"]),
    ("misaligned_grid_slice_2x2",
     lambda rng: Described(_tiling_2x2(rng, last_shape=(12, 4))),
     STRATA_INVALID_ARGUMENT,
     ["partition (1,1): start[0] = 14, shape[0] = 12; expected 14 and 13 like partition (1,0) in the same grid slice"]),
    ("does_not_reach_the_end",
     lambda rng: Described(_entry(_base(rng), (3, 0), shape=(5, 8))),
     STRATA_INVALID_ARGUMENT, ["the partitions end at 26 along dimension 0; expected shape[0] = 27"]),
    ("does_not_reach_the_end_dim1",
     lambda rng: Described({**_base(rng), "shape": (27, 9)}),
     STRATA_INVALID_ARGUMENT, ["the partitions end at 8 along dimension 1; expected shape[1] = 9"]),
    ("empty_location",
     lambda rng: Described(_entry(_base(rng), (2, 0), location=[])),
     STRATA_INVALID_ARGUMENT, ["partition (2,0): location is empty; expected at least one owner"]),
    ("mixed_data_kinds", _mixed,
     STRATA_INVALID_ARGUMENT, ["partition (1,0) carries an opaque handle but partition (0,0) carries DLPack data",
                               "expected the same kind of data in every entry"]),
    ("handles_without_get", _handles_without_get,
     STRATA_INVALID_ARGUMENT, ["partition (0,0) carries an opaque handle but get is NULL; expected a get callback"]),
    ("locals_outside_the_grid",
     lambda rng: Described(dict(_base(rng), locals=[(0, 0), (4, 0)])),
     STRATA_INVALID_ARGUMENT, ["locals[1] = [4, 0] is outside partition_tiling [4, 1]"]),
    ("locals_outside_the_grid_dim1",
     lambda rng: Described(dict(_base(rng), locals=[(1, 1)])),
     STRATA_INVALID_ARGUMENT, ["locals[0] = [1, 1] is outside partition_tiling [4, 1]"]),
    ("local_without_data", _local_without_data,
     STRATA_INVALID_ARGUMENT, ["partition (1,0) is listed in locals but has no data; expected local data"]),
    ("local_handle_get_returns_null", _get_returns_null_for_a_local,
     STRATA_INVALID_ARGUMENT, ["partition (3,0) is listed in locals but has no data"]),
    ("local_data_shape_differs", _shape_mismatch,
     STRATA_INVALID_ARGUMENT, ["partition (1,0): data has shape [6, 8]; expected the partition's shape [7, 8]"]),
    ("local_data_shape_differs_through_get", _shape_mismatch_through_get,
     STRATA_INVALID_ARGUMENT, ["partition (1,0): data has shape [7, 7]; expected the partition's shape [7, 8]"]),
    ("dtype_mismatch", _dtype_mismatch,
     STRATA_INVALID_ARGUMENT, ["partition (2,0): data has dtype float16; expected float32 like partition (0,0)"]),
]


@pytest.mark.parametrize("build,status,fragments", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_validation_rule(rng, build, status, fragments):
    """Each rule broken alone: validate and strata_table_from_partitioned both refuse it with the
    same status and message."""
    d = build(rng)
    msg = expect_error(validate(d), status, *fragments)
    assert msg.startswith("desc: ") or msg.startswith("desc->"), msg
    from_partitioned(d.ptr, status=status)
    assert last_error() == msg


@pytest.mark.parametrize("rule", ["does_not_reach_the_end", "mixed_data_kinds", "handles_without_get"])
def test_description_wide_rules_name_a_partition(rng, rule):
    """Rules whose message is about the whole description could still point at the entry where
    it shows: the last partition along the dimension that falls short, the first entry of the
    other data kind, the first entry with a handle."""
    build, status, _ = next(r[1:] for r in RULES if r[0] == rule)
    d = build(rng)
    assert validate(d) == status
    assert "partition (" in last_error(), last_error()


def test_missing_grid_position_cannot_be_described(rng):
    """A dict without an entry for every grid position (the protocol's "one entry per grid
    position") has no C form: the helper refuses it instead of inventing one."""
    parts = _base(rng)
    del parts["partitions"][(2, 0)]
    with pytest.raises(ValueError, match=r"grid position \(2, 0\)"):
        Described(parts)


def test_null_and_malformed_pointers(rng):
    assert validate(None) == STRATA_NULL_ARGUMENT
    assert "desc" in last_error()
    d = Described(_base(rng))
    d.desc.partitions = None
    expect_error(validate(d), STRATA_NULL_ARGUMENT, "desc->partitions")
    d = Described(_base(rng))
    d.desc.shape = None
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "shape is NULL")
    d = Described(_base(rng))
    d.entries[1].start = None
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "partition (1,0): start is NULL")
    d = Described(_base(rng))
    d.entries[2].locations = None
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "partition (2,0): location is empty")
    d = Described(_entry(_base(rng), (1, 0), start=(-7, 0)))
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "partition (1,0): start[0] = -7", "non-negative")
    d = Described(_base(rng))
    d.desc.ndim = 0
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "ndim = 0")
    d = Described(_base(rng))
    huge = _ints([1 << 20, 1 << 20])
    d.desc.partition_tiling = ctypes.cast(huge, POINTER(c_int64))
    expect_error(validate(d), STRATA_INVALID_ARGUMENT, "too many partitions")
    d = Described(_base(rng))
    out = _bogus_table()
    expect_error(strata_table_from_partitioned(None, None, None, byref(out)), STRATA_NULL_ARGUMENT, "desc")
    assert not out
    expect_error(strata_table_from_partitioned(d.ptr, None, None, None), STRATA_NULL_ARGUMENT, "out")


# ---------------------------------------------------------------------------------------------
# strata_table_from_partitioned: what it accepts beyond a valid description
# ---------------------------------------------------------------------------------------------


def test_from_partitioned_refuses_column_splits(rng):
    g = rng.standard_normal((27, 8)).astype(np.float32)
    parts = {
        "shape": (27, 8),
        "partition_tiling": (1, 2),
        "partitions": {(0, 0): {"start": (0, 0), "shape": (27, 4), "data": g[:, :4].copy(), "location": [0]},
                       (0, 1): {"start": (0, 4), "shape": (27, 4), "data": g[:, 4:].copy(), "location": [1]}},
    }
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT,
                     msg=("partition_tiling [1, 2] splits the columns", "tables are split along rows"))
    d = Described(_tiling_2x2(rng))
    assert validate(d) == STRATA_OK, last_error()
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT)
    assert "partition_tiling [2, 2] splits the columns" in last_error()


def test_from_partitioned_refuses_3d(rng):
    """Heat's own docstring example: shape (27, 3, 2), tiling (4, 1, 1): valid, but not [rows, dim]."""
    g = rng.standard_normal((27, 3, 2)).astype(np.float32)
    parts = heat_split0(g, 4)
    assert parts["partition_tiling"] == (4, 1, 1)
    assert [e["shape"] for e in parts["partitions"].values()] == [(7, 3, 2)] * 3 + [(6, 3, 2)]
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT)
    assert "ndim = 3; expected 2 ([rows, dim])" in last_error()
    d = Described(heat_split0(rng.standard_normal(27).astype(np.float32), 4))
    assert validate(d) == STRATA_OK, last_error()
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT)
    assert "ndim = 1; expected 2" in last_error()


def test_from_partitioned_refuses_a_communicator(rng):
    d = Described(_base(rng))
    from_partitioned(d.ptr, comm=0, status=STRATA_UNSUPPORTED_DEVICE)
    msg = last_error()
    assert msg.startswith("comm: ") and "MPI" in msg, msg


def test_from_partitioned_needs_every_partition_without_a_communicator(rng):
    """Heat rank 1's view (no data for (0,0), (2,0), (3,0)) is valid but, with comm NULL, not a table."""
    g = rng.standard_normal((27, 8)).astype(np.float32)
    d = Described(heat_split0(g, 4, rank=1))
    assert validate(d) == STRATA_OK
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT,
                     msg=("partition (0,0) has no local data; without a communicator every partition must be local",))
    # The same without locals: a partition without data (and no handle) is simply not local.
    parts = _base(rng)
    del parts["locals"]
    parts["partitions"][(3, 0)]["data"] = None
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    from_partitioned(d.ptr, status=STRATA_INVALID_ARGUMENT)
    assert "partition (3,0) has no local data" in last_error()


def test_from_partitioned_dtype_device_and_options(rng):
    g = rng.standard_normal((27, 8))
    from_partitioned(Described(heat_split0(g, 4)).ptr, status=STRATA_UNSUPPORTED_DTYPE)
    assert "float64" in last_error()
    parts = heat_split_none(g.astype(np.float32), 1)
    arr = parts["partitions"][(0, 0)]["data"]
    parts["partitions"][(0, 0)]["data"] = HandTensor(arr, (kDLFloat, 32, 1), device=kDLCUDA)
    d = Described(parts)
    assert validate(d) == STRATA_OK, last_error()
    from_partitioned(d.ptr, status=STRATA_UNSUPPORTED_DEVICE)
    bad = table_options()
    bad.missing_key = 7
    from_partitioned(Described(heat_split0(g.astype(np.float32), 4)).ptr, bad, status=STRATA_INVALID_ARGUMENT)


# ---------------------------------------------------------------------------------------------
# Producer: strata_table_partitioned, and round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_table_partitioned_describes_a_dense_table(rng, dtype):
    g = rng.standard_normal((27, 8)).astype(dtype)
    with from_dlpack(g) as t:
        p = describe_table(t)
        try:
            d = p.contents
            assert d.ndim == 2
            assert _arr(d.shape, 2) == [27, 8]
            assert _arr(d.partition_tiling, 2) == [1, 1]
            assert not d.locals and d.num_locals == 0
            part = element(d.partitions, 0)
            assert _arr(part.start, 2) == [0, 0] and _arr(part.shape, 2) == [27, 8]
            assert part.num_locations == 1
            loc = element(part.locations, 0)
            assert (d.struct_size, part.struct_size, loc.struct_size) == (
                ctypes.sizeof(strata_partitioned), ctypes.sizeof(strata_partition), ctypes.sizeof(strata_partition_location))
            assert loc.rank == 0 and loc.device_id == -1 and loc.host is None
            assert loc.pid in (0, os.getpid())
            view = part.data.contents
            assert view.ndim == 2 and view.device.device_type == 1
            assert (view.dtype.code, view.dtype.bits, view.dtype.lanes) == (kDLFloat, 8 * g.itemsize, 1)
            assert _arr(view.shape, 2) == [27, 8]
            np.testing.assert_array_equal(read_dltensor(view), g)
            # get(user, handle) resolves the handle to the same tensor; NULL resolves to NULL.
            assert d.get and part.handle
            assert d.get(d.get_user, part.handle) == ctypes.addressof(view)
            assert d.get(d.get_user, None) is None
            assert validate(p) == STRATA_OK, last_error()
        finally:
            strata_partitioned_free(p)


@pytest.mark.parametrize("through", ["data", "handle_and_get"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_trip_produce_then_consume(rng, through, dtype):
    """strata_table_partitioned -> strata_table_from_partitioned: the same lookups, without a copy
    (the new table reads the first table's memory). Through the DLTensor, or with data cleared so
    that the handle and the produced get are used."""
    g = rng.standard_normal((50, 16)).astype(dtype)
    with from_dlpack(g, opts=table_options(default_value=-1.0)) as t:
        p = describe_table(t)
        try:
            src = p
            if through == "handle_and_get":
                copy = strata_partitioned.from_buffer_copy(p.contents)
                part = strata_partition.from_buffer_copy(p.contents.partitions[0])
                part.data = None
                copy.partitions = ctypes.pointer(part)
                src = ctypes.pointer(copy)
            assert validate(src) == STRATA_OK, last_error()
            with from_partitioned(src, table_options(default_value=-1.0)) as t2:
                keys = rng.integers(-5, 56, size=400)
                a, b = poisoned((400, 16)), poisoned((400, 16))
                assert lookup(t, keys, a) == lookup(t2, keys, b)
                assert_same_f32(a, b)
                want, _ = expected_rows(g.astype(np.float32), keys, -1.0)
                assert_same_f32(b, want)
                p2 = describe_table(t2)
                try:
                    assert p2.contents.partitions[0].data.contents.data == p.contents.partitions[0].data.contents.data
                finally:
                    strata_partitioned_free(p2)
        finally:
            strata_partitioned_free(p)


def test_round_trip_of_an_adopted_table_points_at_the_numpy_array(rng):
    g = rng.standard_normal((30, 4)).astype(np.float32)
    t, _cap = adopt(g)
    with t:
        p = describe_table(t)
        try:
            view = p.contents.partitions[0].data.contents
            assert view.data + view.byte_offset == g.ctypes.data
            with from_partitioned(p) as t2:
                check_lookups(t2, g, rng)
        finally:
            strata_partitioned_free(p)


def test_round_trip_of_an_empty_table(rng):
    g = np.zeros((0, 8), np.float32)
    with from_dlpack(g) as t:
        p = describe_table(t)
        try:
            assert _arr(p.contents.shape, 2) == [0, 8]
            assert validate(p) == STRATA_OK, last_error()
            with from_partitioned(p) as t2:
                assert len(t2) == 0
                check_lookups(t2, g, rng, n=20)
        finally:
            strata_partitioned_free(p)


def test_table_partitioned_errors(rng):
    strata_partitioned_free(None)  # a no-op
    g = rng.standard_normal((10, 4)).astype(np.float32)
    keys = np.arange(100, 110, dtype=np.int64)
    with from_dlpack(g, keys) as t:
        p = ctypes.cast(c_void_p(0x10), PARTITIONED_P)
        expect_error(strata_table_partitioned(t.h, byref(p)), STRATA_INVALID_ARGUMENT, "table", "keyed")
        assert not p, "*out must be NULL on failure"
    p = PARTITIONED_P()
    expect_error(strata_table_partitioned(None, byref(p)), STRATA_NULL_ARGUMENT, "table")
    with from_dlpack(g) as t:
        expect_error(strata_table_partitioned(t.h, None), STRATA_NULL_ARGUMENT, "out")
