"""strata: HPS-style embedding lookups from DLPack tensors, on CPU cores or a CUDA device.

Python bindings of ``libstrata.so`` through ctypes. ``pip install`` builds the library from the
crate and ships it inside the package, where it is loaded from; ``$STRATA_LIBRARY`` chooses
another. :func:`cdef` and :func:`library_path` serve cffi users of the C API.

>>> import numpy as np, strata
>>> with strata.Table.from_array(np.arange(12, dtype=np.float32).reshape(4, 3)) as t:
...     strata.lookup(t, np.array([2, 0])).tolist()
[[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]

Ownership in one line each: :meth:`Table.from_array` copies (``copy=False`` adopts the
producer's memory); :meth:`Table.open` memory-maps; :func:`from_partitioned` borrows a single
partition (keeping its producer alive) and copies several; :func:`lookup`,
:func:`lookup_pooled` and :func:`lookup_batch` borrow their tensors for the call;
``Table.__partitioned__`` hands out read-only views that keep the table alive.

Framework integrations, each an optional extra imported on its own: :mod:`strata.torch`
(``torch.ops.strata`` custom ops), :mod:`strata.pyg` (a PyG ``FeatureStore``), :mod:`strata.jax`
(XLA FFI custom calls) and :mod:`strata.legate` (a Legate lookup task).

Pooled lookups (TensorFlow's ``embedding_lookup_sparse``, PyTorch's ``embedding_bag``) and many
tables in one call (a DLRM's categorical features):

>>> with strata.Table.from_array(np.arange(12, dtype=np.float32).reshape(4, 3)) as t:
...     strata.lookup_pooled(t, np.array([0, 1, 3]), offsets=np.array([0, 2, 3]), pooling="mean").tolist()
[[1.5, 2.5, 3.5], [9.0, 10.0, 11.0]]
"""

from ._core import (
    LookupStats,
    Request,
    Server,
    Table,
    TableInfo,
    build_features,
    cdef,
    cuda_available,
    default_num_threads,
    from_partitioned,
    library_path,
    lookup,
    lookup_batch,
    lookup_batch_with_stats,
    lookup_pooled,
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

def _package_version() -> str:
    """The installed distribution's version (the crate's, which setup.py reads from Cargo.toml);
    the loaded library's for a package used without installing it."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("strata")
    except PackageNotFoundError:
        return version()


__version__ = _package_version()

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
    "Request",
    "Server",
    "StoreError",
    "StrataError",
    "Table",
    "TableInfo",
    "UnsupportedDevice",
    "UnsupportedDtype",
    "build_features",
    "cdef",
    "cuda_available",
    "default_num_threads",
    "from_partitioned",
    "library_path",
    "lookup",
    "lookup_batch",
    "lookup_batch_with_stats",
    "lookup_pooled",
    "version",
]
