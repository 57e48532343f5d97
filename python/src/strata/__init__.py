"""strata: HPS-style embedding lookups from DLPack tensors, on CPU cores or a CUDA device.

Pure-Python bindings of ``libstrata.so`` (ctypes; no compiler at install time). The library is
found through ``$STRATA_LIBRARY``, a ``libstrata.so`` next to this package, or the system's
search path.

>>> import numpy as np, strata
>>> with strata.Table.from_array(np.arange(12, dtype=np.float32).reshape(4, 3)) as t:
...     strata.lookup(t, np.array([2, 0])).tolist()
[[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]

Ownership in one line each: :meth:`Table.from_array` copies (``copy=False`` adopts the
producer's memory); :meth:`Table.open` memory-maps; :func:`from_partitioned` borrows a single
partition (keeping its producer alive) and copies several; :func:`lookup` borrows its tensors
for the call; ``Table.__partitioned__`` hands out read-only views that keep the table alive.
"""

from ._core import (
    LookupStats,
    Server,
    Table,
    TableInfo,
    build_features,
    cuda_available,
    default_num_threads,
    from_partitioned,
    lookup,
    version,
)
from .errors import (
    ConfigError,
    DuplicateKey,
    InternalError,
    InvalidArgument,
    InvalidFile,
    InvalidLayout,
    IoError,
    KeyNotFound,
    NullArgument,
    OutOfMemory,
    ReadOnly,
    StoreError,
    StrataError,
    UnsupportedDevice,
    UnsupportedDtype,
)

__version__ = "0.3.0"

__all__ = [
    "ConfigError",
    "DuplicateKey",
    "InternalError",
    "InvalidArgument",
    "InvalidFile",
    "InvalidLayout",
    "IoError",
    "KeyNotFound",
    "LookupStats",
    "NullArgument",
    "OutOfMemory",
    "ReadOnly",
    "Server",
    "StoreError",
    "StrataError",
    "Table",
    "TableInfo",
    "UnsupportedDevice",
    "UnsupportedDtype",
    "build_features",
    "cuda_available",
    "default_num_threads",
    "from_partitioned",
    "lookup",
    "version",
]
