"""The ``__partitioned__`` protocol (IntelPython DPPY-Spec, as Heat implements it), both ways.

Producer: :func:`describe` is ``Table.__partitioned__``: the table as it is spread (one process:
one partition; a distributed table: tiling (P, 1), every partition with its start, shape and
owners, and data only for this rank's partitions), the data read-only views of the table's own
memory. Consumer: :func:`from_partitioned` builds a table from such a description (Heat's
``DNDarray``, a strata table, or the dict), in one process or collectively over MPI ranks.
"""

from __future__ import annotations

import ctypes
import itertools
import weakref
from ctypes import POINTER, byref, c_int32, c_int64
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _args, _ffi
from ._dlpack import Borrowed, View
from .errors import InvalidArgument



class TableViewOwner:
    """Holds a table and the description strata made of it while views of its memory live:
    the table counts these (weakly) and refuses to close while one is alive."""

    def __init__(self, table: Any, desc: Any) -> None:
        self.table = table
        self.desc = desc

    def __del__(self) -> None:
        try:
            _ffi.strata_partitioned_free(self.desc)
        except Exception:
            pass


def _identity(x: Any) -> Any:
    return x


def _view_as_numpy(view: View) -> Any:
    """A read-only NumPy array over a host view (bfloat16 stays a DLPack view: NumPy has no such dtype)."""
    try:
        arr = np.from_dlpack(view)
    except (BufferError, TypeError, RuntimeError):
        return view
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


def _grid(tiling: Sequence[int]) -> List[Tuple[int, ...]]:
    """Every grid position of ``tiling``, row-major (the order of the protocol's partitions)."""
    return list(itertools.product(*(range(int(t)) for t in tiling)))


def describe(table: Any, views: "weakref.WeakSet[TableViewOwner]") -> Dict[str, Any]:
    """``Table.__partitioned__`` of ``table`` (a :class:`strata.Table`): see its documentation.
    ``views`` is the table's set of live view owners."""
    p = _ffi.PARTITIONED_P()
    _args.check(_ffi.strata_table_partitioned(table._handle(), byref(p)))
    owner = TableViewOwner(table, p)
    d = p.contents
    nd = int(d.ndim)
    shape = tuple(int(d.shape[i]) for i in range(nd))
    tiling = tuple(int(d.partition_tiling[i]) for i in range(nd))
    dtype = table.info.dtype
    partitions: Dict[Tuple[int, ...], Dict[str, Any]] = {}
    local: List[Tuple[int, ...]] = []
    for i, pos in enumerate(_grid(tiling)):
        part = _ffi.sized_element(d.partitions, i)
        entry: Dict[str, Any] = {
            "start": tuple(int(part.start[k]) for k in range(nd)),
            "shape": tuple(int(part.shape[k]) for k in range(nd)),
            "data": None,
            "location": [int(_ffi.sized_element(part.locations, j).rank) for j in range(int(part.num_locations))],
            "dtype": dtype,
            "device": "cpu",
        }
        if part.data:
            t = part.data.contents
            view = View(t, owner)
            dev_type, dev_id = view.__dlpack_device__()
            host = dev_type in (_ffi.kDLCPU, _ffi.kDLCUDAHost)
            entry["data"] = _view_as_numpy(view) if host else view
            entry["dtype"] = _args.dtype_name(t.dtype.code, t.dtype.bits)
            entry["device"] = "cpu" if host else f"dlpack:{dev_type}:{dev_id}"
            local.append(pos)
        partitions[pos] = entry
    if local:
        views.add(owner)
    return {"shape": shape, "partition_tiling": tiling, "partitions": partitions, "locals": local, "get": _identity}


def _ints(values: Sequence[int]) -> Any:
    values = [int(v) for v in values]
    return (c_int64 * max(1, len(values)))(*values)


def _comm_fint(comm: Any) -> Optional[int]:
    """``comm`` as an ``MPI_Fint``: an int as given, an mpi4py communicator through ``py2f()``."""
    if comm is None:
        return None
    py2f = getattr(comm, "py2f", None)
    return int(py2f()) if callable(py2f) else int(comm)


def table_from_partitioned(obj: Any, default_value: float, missing: str, comm: Any) -> Tuple[Any, List[Any]]:
    """The ``strata_table*`` of :func:`strata.from_partitioned` (see there), and the borrowed
    producers the table must keep alive."""

    parts: Mapping[str, Any] = getattr(obj, "__partitioned__", obj)
    if not isinstance(parts, Mapping):
        raise InvalidArgument(f"obj: a {type(obj).__name__}; expected a __partitioned__ dict or an object with one")
    try:
        shape, tiling, entries = parts["shape"], parts["partition_tiling"], parts["partitions"]
    except KeyError as e:
        raise InvalidArgument(f"__partitioned__: no {e.args[0]!r} entry") from None
    get = parts.get("get")
    nd = len(shape)
    if len(tiling) != nd:
        raise InvalidArgument(f"__partitioned__: partition_tiling {tuple(tiling)} has not {nd} entries like shape")
    grid = _grid(tiling)
    keep: List[Any] = []
    c_parts = _ffi.partition_array(len(grid))
    for i, pos in enumerate(grid):
        entry = entries.get(pos)
        if entry is None:
            raise InvalidArgument(f"__partitioned__: partition {pos}: no entry for this grid position of the tiling")
        c = c_parts[i]
        start, pshape = _ints(entry["start"]), _ints(entry["shape"])
        location = entry.get("location", [0])
        locs = (_ffi.strata_partition_location * max(1, len(location)))()
        for j, loc in enumerate(location):
            if isinstance(loc, (tuple, list)):
                host, pid, *dev = loc
                locs[j] = _ffi.partition_location(-1, int(dev[0]) if dev else -1, int(pid), str(host).encode())
            else:
                locs[j] = _ffi.partition_location(int(loc))
        keep += [start, pshape, locs]
        c.start = ctypes.cast(start, POINTER(c_int64))
        c.shape = ctypes.cast(pshape, POINTER(c_int64))
        c.locations = ctypes.cast(locs, POINTER(_ffi.strata_partition_location))
        c.num_locations = len(location)
        data = entry.get("data")
        if data is not None and not hasattr(data, "__dlpack__") and get is not None:
            data = get(data)
        if data is None:
            continue
        b = Borrowed(_args.as_dlpack(data), f"partition {pos}: data")
        keep.append(b)
        c.data = b.tensor
    desc = _ffi.partitioned()
    desc.ndim = nd
    shape_c, tiling_c = _ints(shape), _ints(tiling)
    keep += [shape_c, tiling_c]
    desc.shape = ctypes.cast(shape_c, POINTER(c_int64))
    desc.partition_tiling = ctypes.cast(tiling_c, POINTER(c_int64))
    desc.partitions = ctypes.cast(c_parts, POINTER(_ffi.strata_partition))
    local_list = parts.get("locals")
    if local_list is not None and len(local_list) > 0:
        flat = _ints([x for p in local_list for x in p])
        keep.append(flat)
        desc.locals = ctypes.cast(flat, POINTER(c_int64))
        desc.num_locals = len(local_list)
    opts = _ffi.strata_table_options(float(default_value), _args.choice(_args.MISSING, missing, "missing"), 0, 0.5, 0.9, 0)
    fint = _comm_fint(comm)
    comm_c = None if fint is None else byref(c_int32(fint))
    out = _ffi.TABLE_P()
    _args.check(_ffi.strata_table_from_partitioned(ctypes.pointer(desc), comm_c, byref(opts), byref(out)))
    # Keep every borrowed producer: a single partition is read in place for the table's life.
    return out, [b for b in keep if isinstance(b, Borrowed)]
