"""ctypes mirrors of ``include/strata.h`` and the loaded library.

Everything here is private: the public API lives in :mod:`strata`. Every struct mirrors the C
layout field by field (the package tests compare them with the C compiler's offsets), and every
function is bound with argtypes and restype before first use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any, Optional

# ---- DLPack -----------------------------------------------------------------------------------

kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM, kDLROCMHost, kDLCUDAManaged = 1, 2, 3, 10, 11, 13
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4
DLPACK_FLAG_BITMASK_READ_ONLY = 1
#: The highest DLPack version this package asks producers for (``__dlpack__(max_version=...)``).
DLPACK_MAX_VERSION = (1, 0)


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensor(Structure):
    pass


DLManagedTensorDeleter = CFUNCTYPE(None, POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", c_void_p),
    ("deleter", DLManagedTensorDeleter),
]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    pass


DLManagedTensorVersionedDeleter = CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", c_void_p),
    ("deleter", DLManagedTensorVersionedDeleter),
    ("flags", c_uint64),
    ("dl_tensor", DLTensor),
]


class DLPackExchangeAPIHeader(Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", c_void_p)]


class DLPackExchangeAPI(Structure):
    """DLPack 1.3's ``__dlpack_c_exchange_api__`` table (a capsule "dlpack_exchange_api" on the
    producer's type); the functions take ``PyObject *`` as ``void *``."""

    _fields_ = [
        ("header", DLPackExchangeAPIHeader),
        ("managed_tensor_allocator", c_void_p),
        ("managed_tensor_from_py_object_no_sync", c_void_p),
        ("managed_tensor_to_py_object_no_sync", c_void_p),
        ("dltensor_from_py_object_no_sync", c_void_p),
        ("current_work_stream", c_void_p),
    ]


# ---- strata -----------------------------------------------------------------------------------

STRATA_OK = 0
STRATA_NULL_ARGUMENT = 1
STRATA_INVALID_ARGUMENT = 2
STRATA_UNSUPPORTED_DTYPE = 3
STRATA_UNSUPPORTED_DEVICE = 4
STRATA_INVALID_LAYOUT = 5
STRATA_READ_ONLY = 6
STRATA_KEY_NOT_FOUND = 7
STRATA_DUPLICATE_KEY = 8
STRATA_IO_ERROR = 9
STRATA_INVALID_FILE = 10
STRATA_OUT_OF_MEMORY = 11
STRATA_INTERNAL = 12
STRATA_CONFIG_ERROR = 13
STRATA_STORE_ERROR = 14
STRATA_CUDA_ERROR = 15

STRATA_MISSING_FILL, STRATA_MISSING_ERROR = 0, 1
STRATA_GPU_STATIC, STRATA_GPU_UVM, STRATA_GPU_CACHE = 0, 1, 2
STRATA_GPU_REPLICATE, STRATA_GPU_SHARD = 0, 1
STRATA_FEATURE_CUDA, STRATA_FEATURE_MPI = 1, 2
STRATA_POOL_NONE, STRATA_POOL_SUM, STRATA_POOL_MEAN, STRATA_POOL_SQRTN = 0, 1, 2, 3


class _Sized(Structure):
    """A struct that starts with ``size_t struct_size`` (every struct strata's C ABI passes).
    Constructing one sets ``struct_size`` to this layout's ``sizeof``, so strata reads and
    writes only the fields this package knows; positional arguments start at the second field."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(ctypes.sizeof(type(self)), *args, **kwargs)


class strata_table_options(_Sized):
    """``strata_table_options``. Built here with the documented defaults rather than through
    ``strata_table_options_default()``, which returns the library's own layout by value."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("default_value", c_float),
        ("missing_key", c_int32),
        ("gpu_placement", c_int32),
        ("gpu_cache_fraction", c_float),
        ("hit_rate_threshold", c_float),
        ("gpu_sharding", c_int32),
    ]


class strata_lookup_options(_Sized):
    _fields_ = [("struct_size", c_size_t), ("stream", c_void_p), ("num_threads", c_int32)]


class strata_lookup_stats(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("volatile_hits", c_uint64),
        ("persistent_hits", c_uint64),
    ]


class strata_table(Structure):  # opaque
    pass


class strata_lookup_request(_Sized):
    """``strata_lookup_request``: one lookup of a ``strata_lookup_batch``. An array of them strides
    by ``struct_size``: every element is built with this constructor (this package's sizeof)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("table", POINTER(strata_table)),
        ("keys", POINTER(DLTensor)),
        ("offsets", POINTER(DLTensor)),
        ("weights", POINTER(DLTensor)),
        ("pooling", c_int32),
        ("out", POINTER(DLTensor)),
        ("stats", POINTER(strata_lookup_stats)),
    ]


class strata_table_info(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("rows", c_int64),
        ("dim", c_int64),
        ("dtype", DLDataType),
        ("keyed", c_bool),
        ("mapped", c_bool),
        ("adopted", c_bool),
        ("index_bytes", c_uint64),
        ("vector_bytes", c_uint64),
    ]


class strata_table_stats(_Sized):
    _fields_ = [("struct_size", c_size_t)] + [
        (name, c_uint64)
        for name in (
            "lookups",
            "keys",
            "volatile_hits",
            "persistent_hits",
            "misses",
            "evictions",
            "volatile_rows",
            "volatile_bytes",
            "persistent_rows",
            "upserts",
            "erases",
        )
    ]


# The __partitioned__ structs start with size_t struct_size, like every strata struct: the
# package sets it to its own sizeof (through the constructors below), and reads the arrays the
# library hands out with the elements' own struct_size as the stride (``sized_element``).


class strata_partition_location(Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("rank", c_int32),
        ("device_id", c_int32),
        ("pid", c_int64),
        ("host", c_char_p),
    ]


class strata_partition(Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("start", POINTER(c_int64)),
        ("shape", POINTER(c_int64)),
        ("data", POINTER(DLTensor)),
        ("handle", c_void_p),
        ("locations", POINTER(strata_partition_location)),
        ("num_locations", c_int32),
    ]


# const DLTensor *(*)(void *user, void *handle); ctypes callbacks return simple types only.
strata_partition_get_fn = CFUNCTYPE(c_void_p, c_void_p, c_void_p)


class strata_partitioned(Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("ndim", c_int32),
        ("shape", POINTER(c_int64)),
        ("partition_tiling", POINTER(c_int64)),
        ("partitions", POINTER(strata_partition)),
        ("locals", POINTER(c_int64)),
        ("num_locals", c_int32),
        ("get", strata_partition_get_fn),
        ("get_user", c_void_p),
    ]


def partition_location(rank: int = -1, device_id: int = -1, pid: int = 0, host: Optional[bytes] = None) -> Any:
    """A ``strata_partition_location`` as ``strata_partition_location_default()`` makes it
    (``struct_size`` = this package's sizeof, rank -1, host memory), with the fields given."""
    return strata_partition_location(ctypes.sizeof(strata_partition_location), rank, device_id, pid, host)


def partition_array(n: int) -> Any:
    """``n`` ``strata_partition`` entries (at least one), each with its ``struct_size`` set and
    every other field 0 or NULL (``strata_partition_default()``)."""
    arr = (strata_partition * max(1, n))()
    for e in arr:
        e.struct_size = ctypes.sizeof(strata_partition)
    return arr


def partitioned() -> Any:
    """A ``strata_partitioned`` with its ``struct_size`` set and every other field 0 or NULL
    (``strata_partitioned_default()``)."""
    d = strata_partitioned()
    d.struct_size = ctypes.sizeof(strata_partitioned)
    return d


def sized_element(array: Any, i: int) -> Any:
    """Element ``i`` of an array of extensible structs that the library made (``partitions``,
    ``locations``): the elements are ``struct_size`` bytes apart, which is this package's sizeof
    only when the library is of the same version. Valid while the array's owner lives."""
    base = ctypes.addressof(array.contents)
    stride = ctypes.c_size_t.from_address(base).value
    return array._type_.from_address(base + i * stride)


class strata_server(Structure):  # opaque
    pass


TABLE_P = POINTER(strata_table)
SERVER_P = POINTER(strata_server)
PARTITIONED_P = POINTER(strata_partitioned)
STATUS_T = c_int32

# ---- loading ----------------------------------------------------------------------------------

_LIB_NAME = "libstrata.so"
#: The library as the wheel ships it (setup.py: setuptools-rust names it like an abi3 module).
_WHEEL_LIB_NAME = "libstrata.abi3.so"


def library_candidates() -> list[str]:
    """Where the library is looked for, in order: ``$STRATA_LIBRARY``, the library inside this
    package (``libstrata.abi3.so``, which ``pip install`` builds and ships, or a ``libstrata.so``
    put there or in its ``lib/`` folder), then the system's search
    (``ctypes.util.find_library("strata")``, then ``libstrata.so`` through the dynamic loader,
    which honours ``LD_LIBRARY_PATH``)."""
    env = os.environ.get("STRATA_LIBRARY")
    if env:
        return [env]
    here = pathlib.Path(__file__).resolve().parent
    inside = (here / _WHEEL_LIB_NAME, here / _LIB_NAME, here / "lib" / _LIB_NAME)
    out = [str(p) for p in inside if p.exists()]
    found = ctypes.util.find_library("strata")
    if found:
        out.append(found)
    out.append(_LIB_NAME)
    return out


def _load() -> ctypes.CDLL:
    errors = []
    env = os.environ.get("STRATA_LIBRARY")
    for path in library_candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    hint = (
        "STRATA_LIBRARY is set but cannot be loaded"
        if env
        else "this strata package ships no library (install it with `pip install ./python`, which "
        "builds it), or set STRATA_LIBRARY to the path of a libstrata.so (cargo build --release writes "
        "target/release/libstrata.so), or put one on LD_LIBRARY_PATH"
    )
    raise ImportError(f"strata: cannot load libstrata.so ({hint}); tried: " + "; ".join(errors))


lib: Any = _load()


def _bind(name: str, restype: Any, *argtypes: Any) -> Any:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


strata_version = _bind("strata_version", c_char_p)
strata_last_error = _bind("strata_last_error", c_char_p)
strata_status_name = _bind("strata_status_name", c_char_p, c_int32)
strata_cuda_available = _bind("strata_cuda_available", c_int32)
strata_default_num_threads = _bind("strata_default_num_threads", c_int32)
strata_build_features: Optional[Any] = (
    _bind("strata_build_features", c_uint32) if hasattr(lib, "strata_build_features") else None
)

_LOOKUP_ARGS = (POINTER(strata_lookup_options), POINTER(strata_lookup_stats))
strata_lookup = _bind("strata_lookup", STATUS_T, TABLE_P, POINTER(DLTensor), POINTER(DLTensor), *_LOOKUP_ARGS)
strata_lookup_managed_versioned = _bind(
    "strata_lookup_managed_versioned",
    STATUS_T,
    TABLE_P,
    POINTER(DLManagedTensorVersioned),
    POINTER(DLManagedTensorVersioned),
    *_LOOKUP_ARGS,
)
# Pooled and batched lookups (0.4): None when the loaded library predates them.
strata_lookup_pooled: Optional[Any] = (
    _bind(
        "strata_lookup_pooled",
        STATUS_T,
        TABLE_P,
        POINTER(DLTensor),
        POINTER(DLTensor),
        POINTER(DLTensor),
        c_int32,
        POINTER(DLTensor),
        *_LOOKUP_ARGS,
    )
    if hasattr(lib, "strata_lookup_pooled")
    else None
)
strata_lookup_batch: Optional[Any] = (
    _bind(
        "strata_lookup_batch", STATUS_T, POINTER(strata_lookup_request), c_size_t, POINTER(strata_lookup_options)
    )
    if hasattr(lib, "strata_lookup_batch")
    else None
)
_OPTS_OUT = (POINTER(strata_table_options), POINTER(TABLE_P))
strata_table_from_dlpack = _bind("strata_table_from_dlpack", STATUS_T, POINTER(DLTensor), POINTER(DLTensor), *_OPTS_OUT)
strata_table_adopt_dlpack = _bind(
    "strata_table_adopt_dlpack", STATUS_T, POINTER(DLManagedTensor), POINTER(DLTensor), *_OPTS_OUT
)
strata_table_adopt_dlpack_versioned = _bind(
    "strata_table_adopt_dlpack_versioned", STATUS_T, POINTER(DLManagedTensorVersioned), POINTER(DLTensor), *_OPTS_OUT
)
strata_table_open = _bind("strata_table_open", STATUS_T, c_char_p, c_int64, *_OPTS_OUT)
strata_table_free = _bind("strata_table_free", None, TABLE_P)
strata_table_dim = _bind("strata_table_dim", c_int64, TABLE_P)
strata_table_len = _bind("strata_table_len", c_int64, TABLE_P)
strata_table_get_info = _bind("strata_table_get_info", STATUS_T, TABLE_P, POINTER(strata_table_info))
strata_table_get_stats = _bind("strata_table_get_stats", STATUS_T, TABLE_P, POINTER(strata_table_stats))
strata_table_upsert = _bind("strata_table_upsert", STATUS_T, TABLE_P, POINTER(DLTensor), POINTER(DLTensor))
strata_table_erase = _bind("strata_table_erase", STATUS_T, TABLE_P, POINTER(DLTensor), POINTER(c_uint64))

strata_server_open = _bind("strata_server_open", STATUS_T, c_char_p, POINTER(SERVER_P))
strata_server_open_json = _bind("strata_server_open_json", STATUS_T, c_char_p, c_char_p, POINTER(SERVER_P))
strata_server_free = _bind("strata_server_free", None, SERVER_P)
strata_server_table = _bind("strata_server_table", STATUS_T, SERVER_P, c_char_p, c_int32, POINTER(TABLE_P))
strata_server_num_models = _bind("strata_server_num_models", STATUS_T, SERVER_P, POINTER(c_int32))
strata_server_model = _bind(
    "strata_server_model", STATUS_T, SERVER_P, c_int32, POINTER(c_char_p), POINTER(c_int32)
)
strata_server_table_name = _bind(
    "strata_server_table_name", STATUS_T, SERVER_P, c_char_p, c_int32, POINTER(c_char_p)
)
strata_server_num_warnings = _bind("strata_server_num_warnings", STATUS_T, SERVER_P, POINTER(c_int32))
strata_server_warning = _bind("strata_server_warning", STATUS_T, SERVER_P, c_int32, POINTER(c_char_p))

strata_partitioned_validate = _bind("strata_partitioned_validate", STATUS_T, PARTITIONED_P)
strata_table_from_partitioned = _bind(
    "strata_table_from_partitioned", STATUS_T, PARTITIONED_P, POINTER(c_int32), *_OPTS_OUT
)
strata_table_partitioned = _bind("strata_table_partitioned", STATUS_T, TABLE_P, POINTER(PARTITIONED_P))
strata_partitioned_free = _bind("strata_partitioned_free", None, PARTITIONED_P)

# ---- PyCapsule --------------------------------------------------------------------------------

_api = ctypes.pythonapi
PyCapsule_IsValid = _api.PyCapsule_IsValid
PyCapsule_IsValid.restype = c_int
PyCapsule_IsValid.argtypes = [ctypes.py_object, c_char_p]
PyCapsule_GetPointer = _api.PyCapsule_GetPointer
PyCapsule_GetPointer.restype = c_void_p
PyCapsule_GetPointer.argtypes = [ctypes.py_object, c_char_p]
PyCapsule_SetName = _api.PyCapsule_SetName
PyCapsule_SetName.restype = c_int
PyCapsule_SetName.argtypes = [ctypes.py_object, c_char_p]
PyCapsule_Destructor = CFUNCTYPE(None, c_void_p)
PyCapsule_New = _api.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [c_void_p, c_char_p, PyCapsule_Destructor]
# The same functions on a raw PyObject* (for capsule destructors, which run while the capsule is
# being deallocated and so must not take a reference to it).
PyCapsule_IsValid_raw = ctypes.PYFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", _api))
PyCapsule_GetPointer_raw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", _api))


def last_error() -> str:
    msg = strata_last_error()
    return msg.decode("utf-8", "replace") if msg else ""
