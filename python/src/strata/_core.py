"""Tables, servers, lookups and the ``__partitioned__`` protocol over libstrata."""

from __future__ import annotations

import ctypes
import itertools
import os
import weakref
from ctypes import byref, c_char_p, c_int32, c_uint64
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union, cast

import numpy as np

from . import _args, _fast, _ffi
from ._dlpack import Borrowed, exportable
from ._partitioned import TableViewOwner, describe
from ._partitioned import table_from_partitioned
from .errors import InvalidArgument, NullArgument, ReadOnly, UnsupportedDevice, UnsupportedDtype, error_for

PathLike = Union[str, "os.PathLike[str]"]

_MISSING = _args.MISSING
#: How a table stores its rows (``strata_storage``); "as_given" keeps the vectors' dtype.
_STORAGE = {"as_given": 0, "float32": 1, "float16": 2, "bfloat16": 3, "int8": 4, "int4": 5, "fp8": 6}
_PLACEMENT = {"static": _ffi.STRATA_GPU_STATIC, "uvm": _ffi.STRATA_GPU_UVM, "cache": _ffi.STRATA_GPU_CACHE}
_SHARDING = {"replicate": _ffi.STRATA_GPU_REPLICATE, "shard": _ffi.STRATA_GPU_SHARD}
_OUT_DTYPES = ("float32", "float16", "bfloat16")
#: Poolings by name (TensorFlow's ``combiner`` names). "none" is a plain lookup (batch requests only).
_POOLING = {"sum": _ffi.STRATA_POOL_SUM, "mean": _ffi.STRATA_POOL_MEAN, "sqrtn": _ffi.STRATA_POOL_SQRTN}
_POOLING_OR_NONE = {"none": _ffi.STRATA_POOL_NONE, **_POOLING}

Pooling = Union[str, int]


_check = _args.check
_choice = _args.choice
_dtype_name = _args.dtype_name
_as_dlpack = _args.as_dlpack


def _options(
    default_value: float,
    missing: str,
    gpu_placement: str,
    gpu_cache_fraction: float,
    hit_rate_threshold: float,
    gpu_sharding: str,
    storage: str = "as_given",
) -> _ffi.strata_table_options:
    opts = _ffi.strata_table_options(
        float(default_value),
        _choice(_MISSING, missing, "missing"),
        _choice(_PLACEMENT, gpu_placement, "gpu_placement"),
        float(gpu_cache_fraction),
        float(hit_rate_threshold),
        _choice(_SHARDING, gpu_sharding, "gpu_sharding"),
    )
    opts.storage = _choice(_STORAGE, storage, "storage")
    return opts


def _stream_value(stream: Any) -> Optional[int]:
    """A CUDA stream as an integer handle: None, an int, or a stream object of PyTorch
    (``.cuda_stream``), CuPy (``.ptr``) or anything with ``__cuda_stream__`` (the CUDA Python
    stream protocol, returning (version, handle))."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise InvalidArgument(f"stream: {stream!r} is not a CUDA stream (an int, or an object with .cuda_stream or .ptr)")


@dataclass(frozen=True)
class TableInfo:
    """``strata_table_info``: rows, dim, the vectors' dtype ("float32", "float16", "bfloat16"),
    whether rows are found by key (else by row number), memory-mapped, adopted, and bytes used."""

    rows: int
    dim: int
    dtype: str
    keyed: bool
    mapped: bool
    adopted: bool
    index_bytes: int
    vector_bytes: int
    #: How rows are stored: the dtype's name, or "int8"/"int4"/"fp8" for quantized rows (whose
    #: ``dtype`` is "uint8").
    storage: str = ""


#: strata_storage values and their names (strata_table_info.storage, 0.3.1).
_STORAGE_NAMES = {1: "float32", 2: "float16", 3: "bfloat16", 4: "int8", 5: "int4", 6: "fp8"}


def _storage_of(dtype: str, rows: int, dim: int, vector_bytes: int) -> str:
    """How rows are stored, from their bytes (a library before 0.3.1 has no storage field)."""
    if dtype != "uint8":
        return dtype
    per_row = vector_bytes // rows if rows else 0
    return {dim + 8: "int8", dim // 2 + 4: "int4", dim + 4: "fp8"}.get(per_row, "uint8")


@dataclass(frozen=True)
class LookupStats:
    """Hits and misses of one lookup (per tier for server tables)."""

    hits: int
    misses: int
    volatile_hits: int
    persistent_hits: int


def _stats_of(st: _ffi.strata_lookup_stats) -> LookupStats:
    return LookupStats(int(st.hits), int(st.misses), int(st.volatile_hits), int(st.persistent_hits))


_C = TypeVar("_C", bound="_Closeable")

#: Every Table by its serial number (never reused), for integrations that carry tables as ints
#: (strata.torch, strata.jax): a closed or collected table's number finds nothing.
_serials = itertools.count(1)
live_tables: "weakref.WeakValueDictionary[int, Table]" = weakref.WeakValueDictionary()


class _Closeable:
    """``with`` blocks and garbage collection both end in :meth:`close`."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # a half-built object, or interpreter shutdown
            pass


class Table(_Closeable):
    """An embedding table: rows of ``dim`` floats found by key (or by row number for dense
    tables). Make one with :meth:`from_array`, :meth:`open`, :func:`from_partitioned` or
    :meth:`Server.table`.

    Close it with :meth:`close` or a ``with`` block; garbage collection closes it too. Any
    number of threads may look up one table at once; closing it while a lookup runs is not
    allowed. A closed table raises :class:`NullArgument`."""

    def __init__(self, handle: Any, *, keepalive: Sequence[Any] = (), owner: Optional["Server"] = None) -> None:
        if not handle:
            raise NullArgument("table: strata returned a NULL table")
        self._h: Any = handle
        self._addr = ctypes.cast(handle, ctypes.c_void_p).value  # for the fast paths' request arrays
        self._keepalive = list(keepalive)  # producers and capsules the table borrows
        self._owner = owner  # the server owning a server table
        self._views: "weakref.WeakSet[TableViewOwner]" = weakref.WeakSet()
        self.serial: int = next(_serials)  # the int handle of strata.torch and strata.jax
        live_tables[self.serial] = self
        self.on_close: List[Callable[[], None]] = []  # run once before the table goes (strata.jax's registry)

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_array(
        cls,
        vectors: Any,
        keys: Any = None,
        default_value: float = 0.0,
        missing: str = "fill",
        *,
        copy: bool = True,
        gpu_placement: str = "static",
        gpu_cache_fraction: float = 0.5,
        hit_rate_threshold: float = 0.9,
        gpu_sharding: str = "replicate",
        storage: str = "as_given",
    ) -> "Table":
        """A table from ``vectors`` ([rows, dim] float32, float16 or bfloat16, host memory, any
        DLPack producer) and ``keys`` (None for a dense table, key = row number; else a 1-D
        integer tensor of ``rows`` unique keys).

        ``storage``: how the table stores its rows. "as_given" (the default) keeps the vectors'
        dtype; "float32", "float16" or "bfloat16" convert; "int8" and "int4" quantize each row
        as FBGEMM's ``FloatToFused8BitRowwiseQuantized`` and
        ``FloatToFusedNBitRowwiseQuantizedSBHalf`` (4 bits) do, bit for bit; "fp8" stores
        ``float8_e4m3fn`` values of ``x / scale`` with a float32 scale a row (max |x| / 448). Rows FBGEMM or
        TorchRec already quantized (uint8 ``[rows, row_bytes]`` in that fused layout) are taken
        as they are with ``storage="int8"``/``"int4"``, copied or (``copy=False``) adopted.
        Lookups dequantize (``q * scale + bias`` in float32) inside the gather and the pooling.

        ``missing``: "fill" gives missing keys ``default_value`` in every element; "error"
        makes a lookup with a missing key raise :class:`KeyNotFound`.

        Ownership: ``copy=True`` (the default) copies; the arrays may change or go afterwards.
        ``copy=False`` adopts ``vectors`` through its DLPack capsule without a copy: the table
        keeps the producer's memory alive until it is closed, and the array must not change
        meanwhile (rows need unit element stride). ``keys`` are always copied.

        The ``gpu_*`` and ``hit_rate_threshold`` options are for CUDA builds (HPS's
        ``gpucacheper`` and ``hit_rate_threshold``); libraries that predate them ignore them."""
        opts = _options(default_value, missing, gpu_placement, gpu_cache_fraction, hit_rate_threshold, gpu_sharding, storage)
        v = Borrowed(exportable(vectors), "vectors")
        k = None if keys is None else Borrowed(_as_dlpack(keys), "keys")
        out = _ffi.TABLE_P()
        kp = None if k is None else k.tensor
        if copy:
            _check(_ffi.strata_table_from_dlpack(v.tensor, kp, byref(opts), byref(out)))
            return cls(out)
        if v.versioned:
            _check(_ffi.strata_table_adopt_dlpack_versioned(v.managed_v, kp, byref(opts), byref(out)))
        else:
            _check(_ffi.strata_table_adopt_dlpack(v.managed, kp, byref(opts), byref(out)))
        v.consume()  # the table calls the deleter now
        return cls(out, keepalive=[v.capsule])

    @classmethod
    def open(
        cls,
        path: PathLike,
        dim: int,
        default_value: float = 0.0,
        missing: str = "fill",
        *,
        gpu_placement: str = "static",
        gpu_cache_fraction: float = 0.5,
        hit_rate_threshold: float = 0.9,
        gpu_sharding: str = "replicate",
        storage: str = "as_given",
    ) -> "Table":
        """A table in HugeCTR's sparse format: the folder ``path`` holds ``key`` (int64 per row)
        and ``emb_vector`` (float32, rows x ``dim``). The vectors are memory-mapped, not
        copied: the files must not be truncated while the table is open. A ``storage`` other
        than "as_given"/"float32" converts or quantizes the rows at load into the table's own
        memory (see :meth:`from_array`)."""
        opts = _options(default_value, missing, gpu_placement, gpu_cache_fraction, hit_rate_threshold, gpu_sharding, storage)
        out = _ffi.TABLE_P()
        _check(_ffi.strata_table_open(os.fsencode(path), int(dim), byref(opts), byref(out)))
        return cls(out)

    # ---- lifetime ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._h or (self._owner is not None and self._owner.closed)

    def _handle(self) -> Any:
        if self.closed:
            raise NullArgument("table: the table is closed")
        return self._h

    def close(self) -> None:
        """Frees the table (server tables are the server's: this only forgets them). Raises
        ``BufferError`` while a view of its vectors from ``__partitioned__`` is still held.
        Closing twice is fine."""
        if not self._h:
            return
        if len(self._views):
            raise BufferError("table: views of its vectors (from __partitioned__) are still in use")
        self._run_close_hooks()
        h, self._h = self._h, None
        if self._owner is None:
            _ffi.strata_table_free(h)
        self._keepalive.clear()

    def _run_close_hooks(self) -> None:
        hooks, self.on_close = self.on_close, []
        for hook in hooks:
            hook()

    # ---- queries -----------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """Elements per row."""
        return int(_ffi.strata_table_dim(self._handle()))

    def __len__(self) -> int:
        return int(_ffi.strata_table_len(self._handle()))

    @property
    def info(self) -> TableInfo:
        i = _ffi.strata_table_info()
        _check(_ffi.strata_table_get_info(self._handle(), byref(i)))
        dtype = _dtype_name(i.dtype.code, i.dtype.bits)
        return TableInfo(
            int(i.rows),
            int(i.dim),
            dtype,
            bool(i.keyed),
            bool(i.mapped),
            bool(i.adopted),
            int(i.index_bytes),
            int(i.vector_bytes),
            _STORAGE_NAMES.get(int(getattr(i, "storage", 0))) or _storage_of(dtype, int(i.rows), int(i.dim), int(i.vector_bytes)),
        )

    def stats(self) -> Dict[str, int]:
        """Cumulative counters of a server table's tiers (all zero for static tables)."""
        s = _ffi.strata_table_stats()
        _check(_ffi.strata_table_get_stats(self._handle(), byref(s)))
        return {f[0]: int(getattr(s, f[0])) for f in s._fields_}

    def __repr__(self) -> str:
        if self.closed:
            return "<strata.Table (closed)>"
        return f"<strata.Table rows={len(self)} dim={self.dim}>"

    # ---- lookups -----------------------------------------------------------------------------

    def lookup(
        self,
        keys: Any,
        out: Any = None,
        stream: Any = None,
        num_threads: Optional[int] = None,
        *,
        dtype: str = "float32",
    ) -> Any:
        """:func:`lookup` on this table."""
        return lookup(self, keys, out, stream, num_threads, dtype=dtype)

    def lookup_with_stats(
        self,
        keys: Any,
        out: Any = None,
        stream: Any = None,
        num_threads: Optional[int] = None,
        *,
        dtype: str = "float32",
    ) -> Tuple[Any, LookupStats]:
        """:func:`lookup` that also returns hits and misses. On a CUDA stream, asking for them
        makes the call wait for the stream."""
        st = _ffi.strata_lookup_stats()
        result = _lookup(self, keys, out, stream, num_threads, dtype, st)
        return result, _stats_of(st)

    def lookup_pooled(
        self,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        pooling: Pooling = "sum",
        out: Any = None,
        stream: Any = None,
        num_threads: Optional[int] = None,
        *,
        dtype: str = "float32",
    ) -> Any:
        """:func:`lookup_pooled` on this table."""
        return lookup_pooled(self, keys, offsets, weights, pooling, out, stream, num_threads, dtype=dtype)

    def lookup_pooled_with_stats(
        self,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        pooling: Pooling = "sum",
        out: Any = None,
        stream: Any = None,
        num_threads: Optional[int] = None,
        *,
        dtype: str = "float32",
    ) -> Tuple[Any, LookupStats]:
        """:func:`lookup_pooled` that also returns hits and misses (counted per key)."""
        st = _ffi.strata_lookup_stats()
        result = _lookup_pooled(self, keys, offsets, weights, pooling, out, stream, num_threads, dtype, st)
        return result, _stats_of(st)

    # ---- updates (server tables with a writable tier) -----------------------------------------

    def upsert(self, keys: Any, vectors: Any) -> None:
        """Inserts or overwrites rows of a server table (``keys`` 1-D, ``vectors`` [n, dim]);
        read during the call only. Static tables raise :class:`ReadOnly`."""
        k, v = Borrowed(_as_dlpack(keys), "keys"), Borrowed(_as_dlpack(vectors), "vectors")
        _check(_ffi.strata_table_upsert(self._handle(), k.tensor, v.tensor))

    def erase(self, keys: Any) -> int:
        """Removes ``keys`` from a server table; returns how many it held."""
        k = Borrowed(_as_dlpack(keys), "keys")
        n = c_uint64()
        _check(_ffi.strata_table_erase(self._handle(), k.tensor, byref(n)))
        return int(n.value)

    # ---- __partitioned__ (producer) -----------------------------------------------------------

    @property
    def __partitioned__(self) -> Dict[str, Any]:
        """The table as a ``__partitioned__`` description (Heat's shape), as it is spread: one
        process's table is one partition (tiling (1, 1)) at (0, 0) owned by rank 0; a distributed
        table has tiling (P, 1), every partition with its ``start``, ``shape`` and ``location``
        (the ranks holding it), and ``data`` only for this rank's partitions (None for the others),
        which ``locals`` lists. ``data`` is a read-only view of the table's vectors (a NumPy array
        for host tables, else a DLPack producer), and ``get`` the identity, so
        ``heat.from_partitioned(table)`` rebuilds the array on every rank. No copy: the views keep
        the table alive, and :meth:`close` refuses while one is held. Not collective. Dense tables
        only (keyed and server tables raise :class:`InvalidArgument`)."""
        return describe(self, self._views)


def from_partitioned(
    obj: Any,
    default_value: float = 0.0,
    missing: str = "fill",
    *,
    comm: Any = None,
) -> "Table":
    """A dense table (key = global row number) from a ``__partitioned__`` description: an object
    with a ``__partitioned__`` property (Heat's ``DNDarray``, a strata :class:`Table`) or the
    dict itself, with ``shape`` [rows, dim], ``partition_tiling`` (P, 1), ``partitions`` keyed
    by grid position (each with ``start``, ``shape``, ``data``, ``location``), ``locals`` and
    ``get``. ``data`` is any DLPack producer, or a handle that ``get`` resolves to one (a handle
    ``get`` resolves to None is a partition without data here).

    ``comm``: an MPI communicator, as an mpi4py communicator or its ``MPI_Fint``
    (``comm.py2f()``), for a description spread over ranks: collective, every rank passes its own
    description, with data for the partitions it holds (those its locations or its ``locals``
    name). The owners of a partition are the union of what the ranks say, so Heat's replicated
    (``split=None``) arrays, which every rank describes with a single location, make a table
    replicated on every rank. None: one process holding every partition.

    Ownership: a single partition (per rank) with unit element stride is borrowed without a copy
    (the table keeps its producer alive, and the data must not change while the table is open);
    several partitions in one process are copied."""
    handle, keepalive = table_from_partitioned(obj, default_value, missing, comm)
    return Table(handle, keepalive=keepalive)


# ---- lookups ---------------------------------------------------------------------------------


def _framework(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def _allocate(keys_obj: Any, device: Tuple[int, int], shape: Tuple[int, ...], dtype: str) -> Any:
    """An output of ``shape`` for keys ``keys_obj``: NumPy for host keys, the keys' own framework
    (PyTorch, CuPy, or the array API namespace) on its device for GPU keys."""
    if dtype not in _OUT_DTYPES:
        raise UnsupportedDtype(f"dtype: {dtype!r}; expected one of {', '.join(_OUT_DTYPES)}")
    fw = _framework(keys_obj)
    if device[0] in (_ffi.kDLCPU, _ffi.kDLCUDAHost):
        if dtype == "bfloat16":
            if fw == "torch":
                import torch

                return torch.empty(shape, dtype=torch.bfloat16)
            try:
                import ml_dtypes
            except ImportError:
                raise UnsupportedDtype(
                    "dtype: 'bfloat16' needs ml_dtypes for NumPy outputs; pass out= (e.g. a torch.bfloat16 tensor)"
                ) from None
            return np.empty(shape, dtype=ml_dtypes.bfloat16)
        return np.empty(shape, dtype=dtype)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=keys_obj.device)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(device[1]):
            return cupy.empty(shape, dtype=dtype)
    ns = getattr(keys_obj, "__array_namespace__", None)
    if ns is not None and fw not in ("jax", "jaxlib"):
        xp = ns()
        return xp.empty(shape, dtype=getattr(xp, dtype), device=keys_obj.device)
    raise UnsupportedDevice(
        f"out: cannot allocate a device output for {fw} keys on device {device} "
        "(JAX arrays are immutable); pass out= from a framework with mutable arrays"
    )


def _as_framework_of(keys_obj: Any, arr: Any) -> Any:
    """The host result ``arr`` (NumPy) in the keys' framework, without a copy where possible."""
    fw = _framework(keys_obj)
    if isinstance(keys_obj, np.ndarray) or fw == "numpy" or not isinstance(arr, np.ndarray):
        return arr
    try:
        if fw == "torch":
            import torch

            # getattr: torch's stubs do not re-export from_dlpack (mypy --strict with torch installed)
            return getattr(torch, "from_dlpack")(arr)
        if fw in ("jax", "jaxlib"):
            import jax.numpy as jnp

            return jnp.from_dlpack(arr)
        ns = getattr(keys_obj, "__array_namespace__", None)
        if ns is not None and hasattr(ns(), "from_dlpack"):
            return ns().from_dlpack(arr)
    except Exception:
        pass
    return arr


def lookup(
    table: Table,
    keys: Any,
    out: Any = None,
    stream: Any = None,
    num_threads: Optional[int] = None,
    *,
    dtype: str = "float32",
) -> Any:
    """Looks ``keys`` up in ``table``: one row of ``table.dim`` values per key.

    ``keys``: any DLPack producer (NumPy, PyTorch, CuPy, JAX; lists are turned into NumPy) of
    int32, int64, uint32 or uint64, any shape and strides. ``out``: None, or a writable DLPack
    tensor of float32, float16 or bfloat16 with shape ``[*keys.shape, dim]`` or
    ``[keys.size, dim]`` on the keys' device, filled in place and returned. With ``out=None``
    a ``[*keys.shape, dim]`` array of ``dtype`` is allocated: NumPy for NumPy keys, the keys'
    framework otherwise (through ``from_dlpack``, or on the keys' GPU).

    ``stream``: the CUDA stream (int handle, or a PyTorch/CuPy stream object) strata enqueues on
    for GPU tensors; producers are asked for their tensors on that stream, as the array API
    says. ``num_threads``: for host tensors, None/0 the library default, 1 inline on this
    thread, n at most n threads.

    The tensors are borrowed for the call only. Raises a :class:`StrataError` subclass with
    strata's message: :class:`KeyNotFound` for a missing key in a ``missing="error"`` table,
    :class:`ReadOnly` for a read-only ``out``, :class:`UnsupportedDtype`, ...
    """
    if out is not None and stream is None and type(table) is Table:
        # Small host calls: see _fast (no capsules for PyTorch, one per NumPy array).
        h = table._h
        if h and (table._owner is None or table._owner._h):
            status = _fast.lookup(h, keys, out, num_threads)
            if status is not None:
                if status != _ffi.STRATA_OK:
                    raise error_for(status, _ffi.last_error())
                return out
    return _lookup(table, keys, out, stream, num_threads, dtype, None)


def _lookup(
    table: Table,
    keys: Any,
    out: Any,
    stream: Any,
    num_threads: Optional[int],
    dtype: str,
    stats: Optional[_ffi.strata_lookup_stats],
) -> Any:
    if not isinstance(table, Table):
        raise InvalidArgument(f"table: a {type(table).__name__}; expected a strata.Table")
    h = table._handle()
    s = _stream_value(stream)
    if s == 0:
        s = None  # 0 is ambiguous in the array API; CUDA's legacy default stream is what NULL means here
    keys = _as_dlpack(keys)
    k = Borrowed(keys, "keys", s)
    result = out
    if out is None:
        result = _allocate(keys, k.device, (*k.shape, table.dim), dtype)
    o = Borrowed(exportable(result), "out", s)
    if o.read_only and not k.versioned:
        raise ReadOnly("out: the tensor is flagged read-only (DLPACK_FLAG_BITMASK_READ_ONLY); expected a writable one")
    opts = _ffi.strata_lookup_options(s, 0 if num_threads is None else int(num_threads))
    st = None if stats is None else byref(stats)
    if k.versioned and o.versioned:
        # The versioned entry point refuses a read-only out itself, with strata's message.
        status = _ffi.strata_lookup_managed_versioned(h, k.managed_v, o.managed_v, byref(opts), st)
    else:
        status = _ffi.strata_lookup(h, k.tensor, o.tensor, byref(opts), st)
    _check(status)
    del k, o  # the capsules go now; `keys` and `result` stay alive
    if out is not None:
        return out
    return _as_framework_of(keys, result)


# ---- pooled and batched lookups --------------------------------------------------------------


def _pooling_value(pooling: Pooling, what: str, allow_none: bool) -> int:
    """A pooling name ("sum", "mean", "sqrtn"; "none" where allowed) as its ``strata_pooling``
    value. An int is passed on as it is, for strata to check (and name ``what`` if refused)."""
    if isinstance(pooling, (int, np.integer)) and not isinstance(pooling, bool):
        return int(pooling)
    names = _POOLING_OR_NONE if allow_none else _POOLING
    if not isinstance(pooling, str):
        raise InvalidArgument(f"{what}: {pooling!r}; expected one of {', '.join(map(repr, names))}")
    return _choice(names, pooling, what)


def _as_weights(x: Any) -> Any:
    """Weights as a DLPack producer: ``x`` itself when it speaks DLPack (strata checks its dtype),
    else ``np.asarray(x, float32)`` (lists and scalars of numbers)."""
    return x if hasattr(x, "__dlpack__") else np.asarray(x, dtype=np.float32)


def _require(fn: Optional[Any], name: str) -> Any:
    if fn is None:
        raise NotImplementedError(
            f"{name}: the loaded libstrata ({version()}) predates it; load a newer library (STRATA_LIBRARY)"
        )
    return fn


class _Prepared:
    """One lookup's tensors, borrowed for a call: keys, optional offsets and weights, and out
    (allocated when None). ``prefix`` starts every message ("requests[3]." in a batch)."""

    def __init__(
        self,
        table: Any,
        keys: Any,
        out: Any,
        offsets: Any,
        weights: Any,
        pooled: bool,
        dtype: str,
        stream: Optional[int],
        prefix: str,
    ) -> None:
        if not isinstance(table, Table):
            raise InvalidArgument(f"{prefix}table: a {type(table).__name__}; expected a strata.Table")
        self.handle = table._handle()
        self.keys_obj = _as_dlpack(keys)
        self.out_given = out
        self.k = Borrowed(self.keys_obj, prefix + "keys", stream)
        self.off = None if offsets is None else Borrowed(_as_dlpack(offsets), prefix + "offsets", stream)
        self.w = None if weights is None else Borrowed(_as_weights(weights), prefix + "weights", stream)
        result = out
        if out is None:
            shape = _pooled_shape(self.k, self.off, table.dim) if pooled else (*self.k.shape, table.dim)
            result = _allocate(self.keys_obj, self.k.device, shape, dtype)
        self.result = result
        self.o = Borrowed(exportable(result), prefix + "out", stream)
        if self.o.read_only:
            raise ReadOnly(
                f"{prefix}out: the tensor is flagged read-only (DLPACK_FLAG_BITMASK_READ_ONLY); expected a writable one"
            )

    @property
    def offsets(self) -> Any:
        return None if self.off is None else self.off.tensor

    @property
    def weights(self) -> Any:
        return None if self.w is None else self.w.tensor

    def finish(self) -> Any:
        """The result: ``out`` as given, or the allocated output in the keys' framework. Lets the
        capsules go (the producers stay alive through the result and the caller)."""
        result, keys_obj, given = self.result, self.keys_obj, self.out_given
        del self.k, self.off, self.w, self.o
        return given if given is not None else _as_framework_of(keys_obj, result)


def _pooled_shape(k: Borrowed, off: Optional[Borrowed], dim: int) -> Tuple[int, int]:
    """[B, dim] for a pooled output: B = len(offsets) - 1 with offsets, keys.shape[0] for 2-D keys
    without. Any other combination is refused by strata before it looks at ``out``, so a [0, dim]
    placeholder stands in for it and strata's message names the argument at fault."""
    if off is not None:
        oshape = off.shape
        return (max(0, oshape[0] - 1) if len(oshape) == 1 else 0, dim)
    kshape = k.shape
    return (kshape[0] if len(kshape) == 2 else 0, dim)


def _options_for(stream: Optional[int], num_threads: Optional[int]) -> _ffi.strata_lookup_options:
    return _ffi.strata_lookup_options(stream, 0 if num_threads is None else int(num_threads))


def _stream_arg(stream: Any) -> Optional[int]:
    s = _stream_value(stream)
    return None if s == 0 else s  # 0 is ambiguous in the array API; NULL is CUDA's legacy default stream


def lookup_pooled(
    table: Table,
    keys: Any,
    offsets: Any = None,
    weights: Any = None,
    pooling: Pooling = "sum",
    out: Any = None,
    stream: Any = None,
    num_threads: Optional[int] = None,
    *,
    dtype: str = "float32",
) -> Any:
    """Looks bags of ``keys`` up in ``table`` and pools each bag's rows into one row: TensorFlow's
    ``embedding_lookup_sparse``, HPS's ``SparseLookupLayer``, PyTorch's ``embedding_bag``.

    Bags: ``keys`` 1-D ``[nnz]`` with ``offsets``, ``B + 1`` int32/int64 entries (``offsets[0]``
    = 0, non-decreasing, ``offsets[B]`` = nnz: PyTorch's ``include_last_offset=True`` form), bag
    ``b`` being ``keys[offsets[b]:offsets[b + 1]]``; or ``keys`` 2-D ``[B, L]`` with
    ``offsets=None`` (fixed hotness: each row is a bag). Keys are int32, int64, uint32 or uint64,
    any strides. ``weights``: None (all 1) or float32 of the keys' shape (a list is converted to
    float32; a DLPack tensor of another dtype is refused).

    ``pooling``: "sum" (Σ wⱼ·row(kⱼ)), "mean" (the sum / Σ wⱼ) or "sqrtn" (the sum / √Σ wⱼ²), or a
    ``strata_pooling`` int. An empty bag, or a zero weight total for "mean" and "sqrtn", gives
    zeros. A missing key contributes the table's default row (and counts as a miss), or raises
    :class:`KeyNotFound` in a ``missing="error"`` table. Accumulation is float32 in key order.

    ``out``: None, or a writable ``[B, dim]`` float32, float16 or bfloat16 tensor (any
    non-overlapping strides), filled in place and returned; nothing outside it is written. With
    ``out=None`` a ``[B, dim]`` array of ``dtype`` is allocated as :func:`lookup` does (NumPy for
    NumPy keys, the keys' framework otherwise). ``stream`` and ``num_threads`` as in
    :func:`lookup`. Bad input raises the :class:`StrataError` subclass of strata's status, whose
    message names the argument (``offsets: offsets[0] = 1; expected 0``)."""
    return _lookup_pooled(table, keys, offsets, weights, pooling, out, stream, num_threads, dtype, None)


def _lookup_pooled(
    table: Table,
    keys: Any,
    offsets: Any,
    weights: Any,
    pooling: Pooling,
    out: Any,
    stream: Any,
    num_threads: Optional[int],
    dtype: str,
    stats: Optional[_ffi.strata_lookup_stats],
) -> Any:
    fn = _require(_ffi.strata_lookup_pooled, "lookup_pooled")
    p_value = _pooling_value(pooling, "pooling", allow_none=False)
    if out is not None and stream is None and stats is None and type(table) is Table:
        # Small host calls: see _fast (no capsules for PyTorch, one per NumPy array).
        h = table._h
        if h and (table._owner is None or table._owner._h):
            status = _fast.lookup_pooled(h, keys, offsets, weights, p_value, out, num_threads)
            if status is not None:
                if status != _ffi.STRATA_OK:
                    raise error_for(status, _ffi.last_error())
                return out
    s = _stream_arg(stream)
    p = _Prepared(table, keys, out, offsets, weights, True, dtype, s, "")
    opts = _options_for(s, num_threads)
    st = None if stats is None else byref(stats)
    _check(fn(p.handle, p.k.tensor, p.offsets, p.weights, p_value, p.o.tensor, byref(opts), st))
    return p.finish()


@dataclass
class Request:
    """One lookup of :func:`lookup_batch`: ``table``, ``keys``, ``out`` (None: allocated), and for
    a pooled lookup ``offsets``, ``weights`` and ``pooling`` ("sum", "mean", "sqrtn"; the default
    "none" is a plain :func:`lookup`, where offsets and weights must be None). The tensors are any
    DLPack producers, as in :func:`lookup` and :func:`lookup_pooled`."""

    table: Table
    keys: Any
    out: Any = None
    offsets: Any = None
    weights: Any = None
    pooling: Pooling = "none"


RequestLike = Union[Request, Sequence[Any], Mapping[str, Any]]


def _request(r: RequestLike, i: int) -> Request:
    if isinstance(r, Request):
        return r
    try:
        if isinstance(r, Mapping):
            return Request(**r)
        if isinstance(r, (tuple, list)):
            return Request(*r)
    except TypeError as e:
        raise InvalidArgument(f"requests[{i}]: {e}; expected the fields of strata.Request") from None
    raise InvalidArgument(
        f"requests[{i}]: a {type(r).__name__}; expected a strata.Request, a tuple "
        "(table, keys, out, offsets, weights, pooling) or a dict of those fields"
    )


def lookup_batch(
    requests: Sequence[RequestLike],
    stream: Any = None,
    num_threads: Optional[int] = None,
    *,
    dtype: str = "float32",
) -> List[Any]:
    """Runs many lookups, plain or pooled, on tables of any dims and dtypes as one call
    (``strata_lookup_batch``): a DLRM's 26 tables in one dispatch instead of 26. Returns the
    outputs in order; each equals what :func:`lookup` (pooling "none") or :func:`lookup_pooled`
    would give for that request.

    ``requests``: :class:`Request` objects, tuples ``(table, keys, out, offsets, weights,
    pooling)`` (trailing fields optional) or dicts of those fields. Outputs that are None are
    allocated as the single calls do, with ``dtype``. ``stream`` and ``num_threads`` apply to
    every request. strata checks every request before writing any output; an error names the
    request (``requests[1].offsets: ...``)."""
    return _lookup_batch(requests, stream, num_threads, dtype, False)[0]


def lookup_batch_with_stats(
    requests: Sequence[RequestLike],
    stream: Any = None,
    num_threads: Optional[int] = None,
    *,
    dtype: str = "float32",
) -> Tuple[List[Any], List[LookupStats]]:
    """:func:`lookup_batch` that also returns each request's hits and misses."""
    return _lookup_batch(requests, stream, num_threads, dtype, True)


def _lookup_batch(
    requests: Sequence[RequestLike],
    stream: Any,
    num_threads: Optional[int],
    dtype: str,
    want_stats: bool,
) -> Tuple[List[Any], List[LookupStats]]:
    fn = _require(_ffi.strata_lookup_batch, "lookup_batch")
    if stream is None and not want_stats and requests:
        # Small host calls: see _fast (Request objects with every out given).
        status = _fast.lookup_batch(requests, Table, Request, num_threads)
        if status is not None:
            if status != _ffi.STRATA_OK:
                raise error_for(status, _ffi.last_error())
            return [cast(Request, r).out for r in requests], []
    s = _stream_arg(stream)
    reqs = [_request(r, i) for i, r in enumerate(requests)]
    if not reqs:
        return [], []
    prepared: List[_Prepared] = []
    stats = [_ffi.strata_lookup_stats() for _ in reqs] if want_stats else []
    arr = (_ffi.strata_lookup_request * len(reqs))()
    for i, r in enumerate(reqs):
        prefix = f"requests[{i}]."
        p_value = _pooling_value(r.pooling, prefix + "pooling", allow_none=True)
        p = _Prepared(r.table, r.keys, r.out, r.offsets, r.weights, p_value != 0, dtype, s, prefix)
        prepared.append(p)
        arr[i] = _ffi.strata_lookup_request(
            p.handle,
            p.k.tensor,
            p.offsets,
            p.weights,
            p_value,
            p.o.tensor,
            ctypes.pointer(stats[i]) if want_stats else None,
        )
    opts = _options_for(s, num_threads)
    _check(fn(arr, len(reqs), byref(opts)))
    return [p.finish() for p in prepared], [_stats_of(st) for st in stats]


# ---- servers ---------------------------------------------------------------------------------


class Server(_Closeable):
    """An HPS-style parameter server opened from a ``ps.json``: every model's tables, tiered as
    the configuration says. Tables from :meth:`table` belong to the server: they stay usable
    while it is open, and :meth:`close` ends them all."""

    def __init__(self, handle: Any) -> None:
        if not handle:
            raise NullArgument("server: strata returned a NULL server")
        self._h: Any = handle
        self._tables: Dict[Tuple[str, int], Table] = {}

    @classmethod
    def open(cls, ps_json: PathLike) -> "Server":
        """Opens the configuration file ``ps_json`` (relative paths in it are relative to its
        folder). Configuration errors raise :class:`ConfigError` naming the JSON path."""
        out = _ffi.SERVER_P()
        _check(_ffi.strata_server_open(os.fsencode(ps_json), byref(out)))
        return cls(out)

    @classmethod
    def from_json(cls, text: str, base_dir: Optional[PathLike] = None) -> "Server":
        """A server from JSON text; relative paths are relative to ``base_dir`` (None: the
        current directory)."""
        out = _ffi.SERVER_P()
        base = None if base_dir is None else os.fsencode(base_dir)
        _check(_ffi.strata_server_open_json(text.encode(), base, byref(out)))
        return cls(out)

    @property
    def closed(self) -> bool:
        return not self._h

    def _handle(self) -> Any:
        if not self._h:
            raise NullArgument("server: the server is closed")
        return self._h

    def close(self) -> None:
        """Frees the server and all its tables. No lookup may be running. Twice is fine."""
        if self._h:
            for t in self._tables.values():
                t._run_close_hooks()
            h, self._h = self._h, None
            self._tables.clear()
            _ffi.strata_server_free(h)

    def table(self, model: str, table_id: int = 0) -> Table:
        """Table ``table_id`` (its index in the model's ``sparse_files``) of ``model``."""
        key = (model, int(table_id))
        t = self._tables.get(key)
        if t is None:
            out = _ffi.TABLE_P()
            _check(_ffi.strata_server_table(self._handle(), model.encode(), int(table_id), byref(out)))
            t = Table(out, owner=self)
            self._tables[key] = t
        return t

    def models(self) -> Dict[str, int]:
        """Model name -> number of tables, in configuration order."""
        h = self._handle()
        n = c_int32()
        _check(_ffi.strata_server_num_models(h, byref(n)))
        out: Dict[str, int] = {}
        for i in range(n.value):
            name, count = c_char_p(), c_int32()
            _check(_ffi.strata_server_model(h, i, byref(name), byref(count)))
            out[(name.value or b"").decode()] = int(count.value)
        return out

    def table_name(self, model: str, table_id: int) -> str:
        """The table's ``embedding_table_names`` entry (else HPS's ``sparse_embeddingN``)."""
        name = c_char_p()
        _check(_ffi.strata_server_table_name(self._handle(), model.encode(), int(table_id), byref(name)))
        return (name.value or b"").decode()

    def tables(self) -> Iterator[Tuple[str, int, str]]:
        """(model, table id, table name) of every table."""
        for model, count in self.models().items():
            for i in range(count):
                yield model, i, self.table_name(model, i)

    @property
    def warnings(self) -> List[str]:
        """Configuration fields strata ignored or did not know."""
        h = self._handle()
        n = c_int32()
        _check(_ffi.strata_server_num_warnings(h, byref(n)))
        out = []
        for i in range(n.value):
            text = c_char_p()
            _check(_ffi.strata_server_warning(h, i, byref(text)))
            out.append((text.value or b"").decode())
        return out


# ---- the library -----------------------------------------------------------------------------


def version() -> str:
    """The library's version, ``"MAJOR.MINOR.PATCH"``."""
    return (_ffi.strata_version() or b"").decode()


def library_path() -> str:
    """The path of the libstrata this package loaded (the one inside the package, unless
    ``$STRATA_LIBRARY`` chose another): give it to ``cffi.FFI().dlopen`` or ``ctypes.CDLL`` to
    call the C API directly on the same library."""
    return str(_ffi.lib._name)


def cdef() -> str:
    """strata's C declarations for cffi: ``ffi.cdef(strata.cdef())``. The text is
    ``include/strata_cffi.h``, which build.rs derives from ``strata.h`` (no preprocessor lines,
    no system headers, integer constants as enums), shipped inside the package::

        ffi = cffi.FFI()
        ffi.cdef(strata.cdef())
        lib = ffi.dlopen(strata.library_path())  # ABI mode: no compiler"""
    return _ffi.header_text()


def cuda_available() -> bool:
    """Whether this build has CUDA support and a CUDA device is present."""
    return bool(_ffi.strata_cuda_available())


def build_features() -> Dict[str, bool]:
    """What the loaded library was built with: {"cuda": ..., "mpi": ...}."""
    f = _ffi.strata_build_features
    bits = int(f()) if f is not None else 0
    return {"cuda": bool(bits & _ffi.STRATA_FEATURE_CUDA), "mpi": bool(bits & _ffi.STRATA_FEATURE_MPI)}


def default_num_threads() -> int:
    """Threads a host lookup with ``num_threads=None`` may use."""
    return int(_ffi.strata_default_num_threads())

