"""The loaded library and its declarations, taken from the generated header.

Everything here is private: the public API lives in :mod:`strata`. Nothing is declared by hand:
every struct, constant and function prototype comes from ``strata_cffi.h`` (the header build.rs
derives from ``strata.h``, shipped in the package) through :mod:`strata._cdecl`; the package
tests compare the layouts with the C compiler's offsets. Every function is bound with the
header's argtypes and restype before first use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
from ctypes import CFUNCTYPE, POINTER, c_char_p, c_int, c_int32, c_void_p
from typing import Any, Optional

from . import _cdecl

# ---- the header's declarations ----------------------------------------------------------------


def header_text() -> str:
    """``strata_cffi.h``: inside the package (``pip install`` puts it there), else the source
    tree's ``include/`` (running from ``python/src``)."""
    here = pathlib.Path(__file__).resolve().parent
    for path in (here / "strata_cffi.h", here.parents[2] / "include" / "strata_cffi.h"):
        if path.exists():
            return path.read_text(encoding="utf-8")
    raise ImportError("strata: strata_cffi.h is missing from the package (reinstall it with `pip install ./python`)")


#: Every declaration of the generated header (structs, constants, function prototypes).
header = _cdecl.parse(header_text())
_s, _c = header.structs, header.constants

DLDevice: Any = _s["DLDevice"]
DLDataType: Any = _s["DLDataType"]
DLTensor: Any = _s["DLTensor"]
DLManagedTensor: Any = _s["DLManagedTensor"]
DLManagedTensorVersioned: Any = _s["DLManagedTensorVersioned"]
DLPackVersion: Any = _s["DLPackVersion"]
DLPackExchangeAPIHeader: Any = _s["DLPackExchangeAPIHeader"]
#: DLPack 1.3's ``__dlpack_c_exchange_api__`` table (a capsule "dlpack_exchange_api" on the
#: producer's type); its functions take ``PyObject *`` as ``void *``.
DLPackExchangeAPI: Any = _s["DLPackExchangeAPI"]
DLManagedTensorDeleter: Any = dict(DLManagedTensor._fields_)["deleter"]
DLManagedTensorVersionedDeleter: Any = dict(DLManagedTensorVersioned._fields_)["deleter"]

kDLCPU: int = _c["kDLCPU"]
kDLCUDA: int = _c["kDLCUDA"]
kDLCUDAHost: int = _c["kDLCUDAHost"]
kDLROCM: int = _c["kDLROCM"]
kDLROCMHost: int = _c["kDLROCMHost"]
kDLCUDAManaged: int = _c["kDLCUDAManaged"]
kDLInt: int = _c["kDLInt"]
kDLUInt: int = _c["kDLUInt"]
kDLFloat: int = _c["kDLFloat"]
kDLBfloat: int = _c["kDLBfloat"]
DLPACK_FLAG_BITMASK_READ_ONLY: int = _c["DLPACK_FLAG_BITMASK_READ_ONLY"]
#: The highest DLPack version this package asks producers for (``__dlpack__(max_version=...)``).
DLPACK_MAX_VERSION = (1, 0)

STRATA_OK: int = _c["STRATA_OK"]
STRATA_NULL_ARGUMENT: int = _c["STRATA_NULL_ARGUMENT"]
STRATA_INVALID_ARGUMENT: int = _c["STRATA_INVALID_ARGUMENT"]
STRATA_UNSUPPORTED_DTYPE: int = _c["STRATA_UNSUPPORTED_DTYPE"]
STRATA_UNSUPPORTED_DEVICE: int = _c["STRATA_UNSUPPORTED_DEVICE"]
STRATA_INVALID_LAYOUT: int = _c["STRATA_INVALID_LAYOUT"]
STRATA_READ_ONLY: int = _c["STRATA_READ_ONLY"]
STRATA_KEY_NOT_FOUND: int = _c["STRATA_KEY_NOT_FOUND"]
STRATA_DUPLICATE_KEY: int = _c["STRATA_DUPLICATE_KEY"]
STRATA_IO_ERROR: int = _c["STRATA_IO_ERROR"]
STRATA_INVALID_FILE: int = _c["STRATA_INVALID_FILE"]
STRATA_OUT_OF_MEMORY: int = _c["STRATA_OUT_OF_MEMORY"]
STRATA_INTERNAL: int = _c["STRATA_INTERNAL"]
STRATA_CONFIG_ERROR: int = _c["STRATA_CONFIG_ERROR"]
STRATA_STORE_ERROR: int = _c["STRATA_STORE_ERROR"]
STRATA_CUDA_ERROR: int = _c["STRATA_CUDA_ERROR"]
STRATA_MISSING_FILL: int = _c["STRATA_MISSING_FILL"]
STRATA_MISSING_ERROR: int = _c["STRATA_MISSING_ERROR"]
STRATA_GPU_STATIC: int = _c["STRATA_GPU_STATIC"]
STRATA_GPU_UVM: int = _c["STRATA_GPU_UVM"]
STRATA_GPU_CACHE: int = _c["STRATA_GPU_CACHE"]
STRATA_GPU_REPLICATE: int = _c["STRATA_GPU_REPLICATE"]
STRATA_GPU_SHARD: int = _c["STRATA_GPU_SHARD"]
STRATA_FEATURE_CUDA: int = _c["STRATA_FEATURE_CUDA"]
STRATA_FEATURE_MPI: int = _c["STRATA_FEATURE_MPI"]
STRATA_POOL_NONE: int = _c["STRATA_POOL_NONE"]
STRATA_POOL_SUM: int = _c["STRATA_POOL_SUM"]
STRATA_POOL_MEAN: int = _c["STRATA_POOL_MEAN"]
STRATA_POOL_SQRTN: int = _c["STRATA_POOL_SQRTN"]

# Every struct that starts with ``size_t struct_size`` is a ``_cdecl.Sized``: constructing one
# sets ``struct_size`` to this layout's sizeof, so strata reads and writes only the fields this
# package knows; positional arguments start at the second field.
strata_table_options: Any = _s["strata_table_options"]
strata_lookup_options: Any = _s["strata_lookup_options"]
strata_lookup_stats: Any = _s["strata_lookup_stats"]
strata_lookup_request: Any = _s["strata_lookup_request"]
strata_table_info: Any = _s["strata_table_info"]
strata_table_stats: Any = _s["strata_table_stats"]
strata_partition_location: Any = _s["strata_partition_location"]
strata_partition: Any = _s["strata_partition"]
strata_partitioned: Any = _s["strata_partitioned"]
strata_partition_get_fn: Any = header.types["strata_partition_get_fn"]
strata_table: Any = _s["strata_table"]  # opaque
strata_server: Any = _s["strata_server"]  # opaque


def partition_location(rank: int = -1, device_id: int = -1, pid: int = 0, host: Optional[bytes] = None) -> Any:
    """A ``strata_partition_location`` as ``strata_partition_location_default()`` makes it
    (``struct_size`` = this package's sizeof, rank -1, host memory), with the fields given."""
    return strata_partition_location(rank, device_id, pid, host)


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
    return strata_partitioned()


def sized_element(array: Any, i: int) -> Any:
    """Element ``i`` of an array of extensible structs that the library made (``partitions``,
    ``locations``): the elements are ``struct_size`` bytes apart, which is this package's sizeof
    only when the library is of the same version. Valid while the array's owner lives."""
    base = ctypes.addressof(array.contents)
    stride = ctypes.c_size_t.from_address(base).value
    return array._type_.from_address(base + i * stride)


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


def _bind(name: str) -> Any:
    """The library's function ``name``, with the header's restype and argtypes."""
    restype, argtypes = header.functions[name]
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def _bind_if_present(name: str) -> Optional[Any]:
    """:func:`_bind`, or None when the loaded library predates the function."""
    return _bind(name) if hasattr(lib, name) else None


strata_version = _bind("strata_version")
strata_last_error = _bind("strata_last_error")
strata_status_name = _bind("strata_status_name")
strata_cuda_available = _bind("strata_cuda_available")
strata_default_num_threads = _bind("strata_default_num_threads")
strata_lookup = _bind("strata_lookup")
strata_lookup_managed_versioned = _bind("strata_lookup_managed_versioned")
strata_table_from_dlpack = _bind("strata_table_from_dlpack")
strata_table_adopt_dlpack = _bind("strata_table_adopt_dlpack")
strata_table_adopt_dlpack_versioned = _bind("strata_table_adopt_dlpack_versioned")
strata_table_open = _bind("strata_table_open")
strata_table_free = _bind("strata_table_free")
strata_table_dim = _bind("strata_table_dim")
strata_table_len = _bind("strata_table_len")
strata_table_get_info = _bind("strata_table_get_info")
strata_table_get_stats = _bind("strata_table_get_stats")
strata_table_upsert = _bind("strata_table_upsert")
strata_table_erase = _bind("strata_table_erase")
strata_server_open = _bind("strata_server_open")
strata_server_open_json = _bind("strata_server_open_json")
strata_server_free = _bind("strata_server_free")
strata_server_table = _bind("strata_server_table")
strata_server_num_models = _bind("strata_server_num_models")
strata_server_model = _bind("strata_server_model")
strata_server_table_name = _bind("strata_server_table_name")
strata_server_num_warnings = _bind("strata_server_num_warnings")
strata_server_warning = _bind("strata_server_warning")
strata_partitioned_validate = _bind("strata_partitioned_validate")
strata_table_from_partitioned = _bind("strata_table_from_partitioned")
strata_table_partitioned = _bind("strata_table_partitioned")
strata_partitioned_free = _bind("strata_partitioned_free")
# Newer than the first published library (0.3): None when the loaded library predates them.
strata_build_features: Optional[Any] = _bind_if_present("strata_build_features")
strata_lookup_pooled: Optional[Any] = _bind_if_present("strata_lookup_pooled")
strata_lookup_batch: Optional[Any] = _bind_if_present("strata_lookup_batch")

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
