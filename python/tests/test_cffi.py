"""strata through cffi in ABI mode, declared by ``strata.cdef()`` (``include/strata_cffi.h``, which
build.rs derives from ``strata.h``; the Rust test ``header_cffi_is_fresh`` keeps it fresh).

The declarations are parsed by ``cffi.FFI().cdef`` as they are shipped, the library is opened with
``ffi.dlopen(strata.library_path())``, every declared function resolves, the constants and struct
layouts agree with the package's ctypes mirrors (themselves checked against the C compiler), and
lookups through cffi-built DLTensors are compared with NumPy indexing on poisoned outputs.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from test_ctypes import LIB_PATH, REPO, package_library

if package_library() is None:
    os.environ.setdefault("STRATA_LIBRARY", LIB_PATH)

cffi = pytest.importorskip("cffi", reason="skipped: cffi not installed (pip install cffi)")

import strata  # noqa: E402
from strata import _ffi  # noqa: E402


@pytest.fixture(scope="module")
def c():
    ffi = cffi.FFI()
    ffi.cdef(strata.cdef())
    return ffi, ffi.dlopen(strata.library_path())


def test_the_declarations_have_no_preprocessor_lines_and_match_the_committed_file():
    text = strata.cdef()
    assert not [line for line in text.splitlines() if line.lstrip().startswith("#")]
    committed = REPO / "include" / "strata_cffi.h"
    if committed.exists():  # the source tree is at hand (it is in scripts/py-tests.sh)
        assert text == committed.read_text(), "the package ships a stale strata_cffi.h"


def test_every_declared_function_resolves_and_the_constants_agree(c):
    ffi, lib = c
    names = set(re.findall(r"^[\w\s\*]*?\b(strata_\w+)\(", strata.cdef(), re.M))
    assert {"strata_lookup", "strata_table_from_dlpack", "strata_last_error", "strata_version"} <= names
    for name in sorted(names):
        assert callable(getattr(lib, name)), name
    for name in ("STRATA_OK", "STRATA_NULL_ARGUMENT", "STRATA_INVALID_ARGUMENT", "STRATA_UNSUPPORTED_DTYPE",
                 "STRATA_READ_ONLY", "STRATA_KEY_NOT_FOUND", "STRATA_CUDA_ERROR", "STRATA_FEATURE_CUDA",
                 "STRATA_FEATURE_MPI", "STRATA_POOL_SQRTN", "STRATA_MISSING_ERROR", "DLPACK_FLAG_BITMASK_READ_ONLY"):
        assert getattr(lib, name) == getattr(_ffi, name), name
    assert lib.STRATA_MAX_DIM == 1 << 24
    major, minor, patch = (int(x) for x in strata.version().split("."))
    assert (lib.STRATA_VERSION_MAJOR, lib.STRATA_VERSION_MINOR, lib.STRATA_VERSION_PATCH) == (major, minor, patch)
    assert lib.STRATA_VERSION_NUMBER == major * 10000 + minor * 100 + patch
    assert ffi.string(lib.strata_version()).decode() == strata.version()
    assert lib.strata_build_features() == sum(
        bit for bit, on in ((lib.STRATA_FEATURE_CUDA, strata.build_features()["cuda"]),
                            (lib.STRATA_FEATURE_MPI, strata.build_features()["mpi"])) if on)


def test_struct_layouts_agree_with_the_ctypes_mirrors(c):
    ffi, _ = c
    mirrors = {
        "DLTensor": _ffi.DLTensor,
        "DLManagedTensorVersioned": _ffi.DLManagedTensorVersioned,
        "DLPackExchangeAPI": _ffi.DLPackExchangeAPI,
        "strata_lookup_options": _ffi.strata_lookup_options,
        "strata_lookup_stats": _ffi.strata_lookup_stats,
        "strata_lookup_request": _ffi.strata_lookup_request,
        "strata_table_info": _ffi.strata_table_info,
        "strata_table_stats": _ffi.strata_table_stats,
        "strata_partition": _ffi.strata_partition,
        "strata_partitioned": _ffi.strata_partitioned,
    }
    import ctypes

    for name, mirror in mirrors.items():
        assert ffi.sizeof(name) == ctypes.sizeof(mirror), name
        for field, _ in mirror._fields_:
            assert ffi.offsetof(name, field) == getattr(mirror, field).offset, f"{name}.{field}"
    assert ffi.sizeof("strata_status") == 4


def _dl(ffi, a, keep):
    """A NumPy array as a host DLTensor built with cffi; ``keep`` holds what it points to."""
    code = {"i": 0, "u": 1, "f": 2}[a.dtype.kind]
    shape = ffi.new("int64_t[]", list(a.shape))
    strides = ffi.new("int64_t[]", [s // a.itemsize for s in a.strides])
    t = ffi.new("DLTensor *")
    t.data = ffi.cast("void *", a.ctypes.data)
    t.device.device_type = ffi.cast("DLDeviceType", 1)  # kDLCPU
    t.ndim = a.ndim
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, 8 * a.itemsize, 1
    t.shape, t.strides = shape, strides
    keep += [a, shape, strides, t]
    return t


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64, np.uint32, np.uint64])
def test_lookup_through_cffi_equals_numpy(c, key_dtype):
    ffi, lib = c
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((500, 24)).astype(np.float32)
    table_keys = rng.choice(10_000, size=500, replace=False).astype(np.int64)
    keep = []
    opts = lib.strata_table_options_default_0_3_1()
    opts.default_value = -3.5
    table = ffi.new("strata_table **")
    assert lib.strata_table_from_dlpack(_dl(ffi, vectors, keep), _dl(ffi, table_keys, keep), ffi.addressof(opts), table) == lib.STRATA_OK
    try:
        keys = np.concatenate([rng.choice(table_keys, 300), rng.integers(10_000, 20_000, 40)]).astype(key_dtype)
        rng.shuffle(keys)
        strided = keys[::2]  # non-contiguous keys: strides honoured
        out = np.full((len(strided), 24), np.nan, np.float32)
        lopts = lib.strata_lookup_options_default()
        lopts.num_threads = 1
        stats = lib.strata_lookup_stats_default()
        status = lib.strata_lookup(table[0], _dl(ffi, strided, keep), _dl(ffi, out, keep), ffi.addressof(lopts), ffi.addressof(stats))
        assert status == lib.STRATA_OK, ffi.string(lib.strata_last_error())
        row = {int(k): i for i, k in enumerate(table_keys)}
        want = np.stack([vectors[row[int(k)]] if int(k) in row else np.full(24, -3.5, np.float32) for k in strided])
        assert np.array_equal(out, want)
        assert stats.hits + stats.misses == len(strided) and stats.misses == sum(int(k) not in row for k in strided)
        # A refusal through cffi: float keys, with strata's message naming the argument.
        bad = np.zeros(3, np.float32)
        before = out.copy()
        status = lib.strata_lookup(table[0], _dl(ffi, bad, keep), _dl(ffi, out[:3], keep), ffi.NULL, ffi.NULL)
        assert status == lib.STRATA_UNSUPPORTED_DTYPE
        assert ffi.string(lib.strata_last_error()).decode().startswith("keys")
        assert np.array_equal(out, before)
    finally:
        lib.strata_table_free(table[0])
