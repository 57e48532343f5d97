"""The ``strata`` Python package (python/src/strata), as pip installs it.

scripts/py-tests.sh builds its wheel (``pip wheel ./python``: the crate compiled into the package),
installs it into a fresh venv and runs this file there against the library the wheel ships, with
no ``$STRATA_LIBRARY`` (without a shipped library it falls back to ``target/release``). Every lookup writes into a poisoned
output and is compared with NumPy indexing; every error path checks the exception class, its
``status`` and strata's message. GPU cases skip with "skipped: no CUDA device" when
``strata_cuda_available()`` says there is none.
"""

from __future__ import annotations

import gc
import importlib.resources
import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from test_ctypes import LIB_PATH, package_library

REPO = pathlib.Path(__file__).resolve().parents[2]
if package_library() is None:  # a package without its library (used from the source tree)
    os.environ.setdefault("STRATA_LIBRARY", LIB_PATH)

import strata  # noqa: E402
from strata import _dlpack, _ffi  # noqa: E402

NEEDS_CUDA = pytest.mark.skipif(not strata.cuda_available(), reason="skipped: no CUDA device")


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


def poisoned(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype=dtype)


def expected(vectors, keys, default=0.0, table_keys=None):
    """NumPy reference: rows of ``vectors`` for ``keys`` (row numbers, or positions in
    ``table_keys``), ``default`` for missing ones."""
    keys = np.asarray(keys).astype(np.int64)
    flat = keys.reshape(-1)
    if table_keys is None:
        found = (flat >= 0) & (flat < len(vectors))
        rows = np.where(found, flat, 0)
    else:
        index = {int(k): i for i, k in enumerate(np.asarray(table_keys).astype(np.int64))}
        rows = np.array([index.get(int(k), -1) for k in flat], dtype=np.int64)
        found = rows >= 0
        rows = np.where(found, rows, 0)
    out = vectors.astype(np.float32)[rows]
    out[~found] = default
    return out.reshape(*keys.shape, vectors.shape[1])


# ---- the package itself ------------------------------------------------------------------------


def test_installed_package_is_typed_and_versioned():
    assert (importlib.resources.files("strata") / "py.typed").is_file()
    cargo = (REPO / "Cargo.toml").read_text()
    assert strata.version() == re.search(r'^version\s*=\s*"([^"]+)"', cargo, re.M).group(1)
    assert strata.__version__ == strata.version()
    assert strata.default_num_threads() >= 1


def test_build_features_agree_with_the_library():
    f = strata.build_features()
    assert set(f) == {"cuda", "mpi"}
    bits = _ffi.strata_build_features()
    assert f["cuda"] == bool(bits & 1) and f["mpi"] == bool(bits & 2)
    if strata.cuda_available():
        assert f["cuda"], "a device is only usable by a CUDA build"


def test_library_not_found_is_a_clear_import_error(tmp_path):
    env = dict(os.environ, STRATA_LIBRARY=str(tmp_path / "nope" / "libstrata.so"))
    r = subprocess.run([sys.executable, "-c", "import strata"], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "ImportError: strata: cannot load libstrata.so" in r.stderr
    assert "STRATA_LIBRARY is set but cannot be loaded" in r.stderr and "nope" in r.stderr


def _copy_package(tmp_path):
    """A copy of the package at tmp_path/strata, with the generated header it reads its
    declarations from (an installed package has it; the source tree's is in include/)."""
    import shutil

    pkg = tmp_path / "strata"
    shutil.copytree(pathlib.Path(strata.__file__).parent, pkg)
    if not (pkg / "strata_cffi.h").exists():
        shutil.copy(pathlib.Path(__file__).resolve().parents[2] / "include" / "strata_cffi.h", pkg)
    return pkg


def _run_copy(tmp_path, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("STRATA_LIBRARY", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(tmp_path)
    env.update(env_extra or {})
    code = "import strata; print(strata.library_path()); print(strata.version())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_library_found_inside_the_package_without_the_variable(tmp_path):
    """Without $STRATA_LIBRARY a copy of the package loads the library inside it: the one the
    wheel ships (libstrata.abi3.so), else a libstrata.so put there by hand."""
    import shutil

    pkg = _copy_package(tmp_path)
    shipped = pkg / "libstrata.abi3.so"
    if not shipped.exists():
        shutil.copy(strata.library_path(), shipped)
    assert _run_copy(tmp_path)[0] == str(shipped)
    shipped.rename(pkg / "libstrata.so")
    assert _run_copy(tmp_path)[0] == str(pkg / "libstrata.so")


def test_strata_library_overrides_the_shipped_library(tmp_path):
    import shutil

    other = tmp_path / "elsewhere" / "libstrata.so"
    other.parent.mkdir()
    shutil.copy(strata.library_path(), other)
    _copy_package(tmp_path)
    assert _run_copy(tmp_path, {"STRATA_LIBRARY": str(other)}) == [str(other), strata.version()]


@pytest.mark.skipif("STRATA_LIBRARY" in os.environ, reason="skipped: $STRATA_LIBRARY chooses the library")
def test_the_installed_wheel_ships_the_library_and_the_cffi_declarations():
    """What scripts/py-tests.sh tests: a platform wheel (never py3-none-any) whose package holds
    libstrata and strata_cffi.h, loaded with no environment variable."""
    import importlib.metadata

    here = pathlib.Path(strata.__file__).parent
    assert strata.library_path() == str(here / "libstrata.abi3.so")
    assert (here / "strata_cffi.h").is_file()
    wheel = importlib.metadata.distribution("strata").read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    assert tags and all(not t.endswith("-any") and "-abi3-" in t for t in tags), wheel
    assert "Root-Is-Purelib: false" in wheel
    assert importlib.metadata.version("strata") == strata.__version__ == strata.version()


def test_struct_mirrors_match_the_header(tmp_path):
    """Every ctypes struct of the package against the C compiler's sizes and offsets (the helper
    of test_ctypes.py). strata_table_options may be ahead of the header (the CUDA fields)."""
    from test_ctypes import HEADER_TABLE_OPTION_FIELDS, assert_layouts_match_the_header

    structs = {
        "DLDevice": _ffi.DLDevice,
        "DLDataType": _ffi.DLDataType,
        "DLTensor": _ffi.DLTensor,
        "DLManagedTensor": _ffi.DLManagedTensor,
        "DLPackVersion": _ffi.DLPackVersion,
        "DLManagedTensorVersioned": _ffi.DLManagedTensorVersioned,
        "DLPackExchangeAPIHeader": _ffi.DLPackExchangeAPIHeader,
        "DLPackExchangeAPI": _ffi.DLPackExchangeAPI,
        "struct strata_table_options": _ffi.strata_table_options,
        "struct strata_lookup_options": _ffi.strata_lookup_options,
        "struct strata_lookup_stats": _ffi.strata_lookup_stats,
        "struct strata_table_info": _ffi.strata_table_info,
        "struct strata_table_stats": _ffi.strata_table_stats,
        "struct strata_partition_location": _ffi.strata_partition_location,
        "struct strata_partition": _ffi.strata_partition,
        "struct strata_partitioned": _ffi.strata_partitioned,
    }
    assert_layouts_match_the_header(tmp_path, structs, {"struct strata_table_options": HEADER_TABLE_OPTION_FIELDS})
    assert _ffi.STATUS_T is __import__("ctypes").c_int32


def test_every_status_has_an_exception_class():
    expected_bases = {
        1: ValueError, 2: ValueError, 3: TypeError, 4: ValueError, 5: ValueError, 6: ValueError,
        7: LookupError, 8: ValueError, 9: OSError, 10: ValueError, 11: MemoryError, 12: Exception,
        13: ValueError, 14: Exception,
    }
    for status, base in expected_bases.items():
        e = strata.errors.error_for(status, "msg")
        assert isinstance(e, strata.StrataError) and isinstance(e, base)
        assert e.status == status and e.message == "msg"
        assert e.status_name == _ffi.strata_status_name(status).decode()
        assert str(e) == f"msg [{e.status_name}]"
    e = strata.errors.error_for(99, "odd")
    assert type(e) is strata.StrataError and e.status == 99


# ---- tables and lookups ------------------------------------------------------------------------


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64, np.uint32, np.uint64])
def test_dense_lookup_matches_numpy(rng, key_dtype):
    vec = rng.standard_normal((300, 24)).astype(np.float32)
    keys = rng.integers(0, 320, size=(7, 11)).astype(key_dtype)  # some past the end: missing
    with strata.Table.from_array(vec, default_value=-2.5) as t:
        assert (t.dim, len(t)) == (24, 300)
        got = strata.lookup(t, keys)
        assert isinstance(got, np.ndarray) and got.shape == (7, 11, 24) and got.dtype == np.float32
        np.testing.assert_array_equal(got, expected(vec, keys, -2.5))
        # out given: both accepted shapes, filled in place and returned
        for shape in ((7, 11, 24), (77, 24)):
            out = poisoned(shape)
            assert strata.lookup(t, keys, out=out) is out
            np.testing.assert_array_equal(out.reshape(7, 11, 24), expected(vec, keys, -2.5))


def test_keyed_table_strided_keys_and_lists(rng):
    tkeys = rng.choice(10**12, size=500, replace=False).astype(np.int64)
    vec = rng.standard_normal((500, 8)).astype(np.float32)
    with strata.Table.from_array(vec, keys=tkeys) as t:
        assert t.info.keyed and not t.info.adopted and t.info.rows == 500
        q = np.concatenate([tkeys[::3], [-1, 7]])[::-1]  # negative stride, two misses
        np.testing.assert_array_equal(strata.lookup(t, q), expected(vec, q, 0.0, tkeys))
        np.testing.assert_array_equal(t.lookup([int(tkeys[4]), 5]), expected(vec, [tkeys[4], 5], 0.0, tkeys))
        cols = np.stack([q, q], axis=1)[:, 1]  # a column: stride 2
        np.testing.assert_array_equal(strata.lookup(t, cols), expected(vec, cols, 0.0, tkeys))


def test_lookup_with_stats_and_threads(rng):
    vec = rng.standard_normal((1000, 16)).astype(np.float32)
    keys = rng.integers(-100, 1100, size=5000)
    want = expected(vec, keys)
    with strata.Table.from_array(vec) as t:
        got, st = t.lookup_with_stats(keys)
        np.testing.assert_array_equal(got, want)
        misses = int(((keys < 0) | (keys >= 1000)).sum())
        assert (st.hits, st.misses) == (5000 - misses, misses)
        for n in (1, 2, 4):
            np.testing.assert_array_equal(strata.lookup(t, keys, num_threads=n), want)
        results = [None] * 6

        def work(i):
            results[i] = strata.lookup(t, keys[i::6])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for i in range(6):
            np.testing.assert_array_equal(results[i], want[i::6])


def test_float16_outputs_and_float16_tables(rng):
    vec = rng.standard_normal((64, 8)).astype(np.float32)
    keys = rng.integers(0, 64, size=50)
    with strata.Table.from_array(vec) as t:
        got = strata.lookup(t, keys, dtype="float16")
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, vec[keys].astype(np.float16))
        out = poisoned((50, 8), np.float16)
        strata.lookup(t, keys, out=out)
        np.testing.assert_array_equal(out, vec[keys].astype(np.float16))
    with strata.Table.from_array(vec.astype(np.float16)) as t:
        assert t.info.dtype == "float16"
        np.testing.assert_array_equal(strata.lookup(t, keys), vec.astype(np.float16)[keys].astype(np.float32))


def bf16_rne(x):
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


class HostProducer:
    """A DLPack producer over a NumPy buffer claiming any dtype (bfloat16 over uint16, which
    NumPy cannot export), built on strata's own producer (strata._dlpack.View)."""

    def __init__(self, arr, code, bits, read_only=False):
        import ctypes

        self.buf = arr
        elem = bits // 8
        self.shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        self.strides = (ctypes.c_int64 * arr.ndim)(*[st // elem for st in arr.strides])
        t = _ffi.DLTensor()
        t.data = arr.ctypes.data
        t.device = _ffi.DLDevice(_ffi.kDLCPU, 0)
        t.ndim = arr.ndim
        t.dtype = _ffi.DLDataType(code, bits, 1)
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        self.view = _dlpack.View(t, self)
        self.view.read_only = read_only

    def __dlpack__(self, **kw):
        return self.view.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.view.__dlpack_device__()


class LegacyOnly:
    """A producer that predates max_version (raises TypeError for it)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__()

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def test_bfloat16_output_through_a_dlpack_producer(rng):
    vec = rng.standard_normal((40, 8)).astype(np.float32)
    keys = rng.integers(0, 40, size=30)
    buf = np.full((30, 8), 0xFFFF, np.uint16)
    with strata.Table.from_array(vec) as t:
        strata.lookup(t, keys, out=HostProducer(buf, _ffi.kDLBfloat, 16))
    np.testing.assert_array_equal(buf, bf16_rne(vec[keys]))
    gc.collect()
    assert _dlpack.live_exports() == 0


def test_copy_false_adopts_the_array_and_releases_it_on_close(rng):
    vec = rng.standard_normal((20, 4)).astype(np.float32)
    base = sys.getrefcount(vec)
    t = strata.Table.from_array(vec, copy=False)
    assert t.info.adopted
    assert sys.getrefcount(vec) > base, "the table holds the producer's memory"
    np.testing.assert_array_equal(t.lookup([3, 19]), vec[[3, 19]])
    t.close()
    gc.collect()
    assert sys.getrefcount(vec) == base, "the deleter ran once the table was closed"
    row = vec[3].copy()
    with strata.Table.from_array(vec, copy=True) as c:
        assert not c.info.adopted
        vec[3] = 42.0  # a copy does not see later changes
        np.testing.assert_array_equal(c.lookup([3])[0], row)


def test_lookup_1m_x_128_round_trip(rng):
    rows, dim = 1_000_000, 128
    vec = rng.standard_normal((rows, dim), dtype=np.float32)
    keys = rng.permutation(rows).astype(np.int64)
    with strata.Table.from_array(vec) as t:
        out = np.empty((rows, dim), np.float32)
        out.fill(np.nan)
        got, st = t.lookup_with_stats(keys, out=out)
        assert got is out and (st.hits, st.misses) == (rows, 0)
        np.testing.assert_array_equal(out, vec[keys])
        del out, got
        sub = keys[:200_000].astype(np.int32).reshape(400, 500)
        np.testing.assert_array_equal(strata.lookup(t, sub), vec[sub])


# ---- bad inputs ---------------------------------------------------------------------------------


@pytest.fixture
def small(rng):
    vec = rng.standard_normal((10, 4)).astype(np.float32)
    with strata.Table.from_array(vec, missing="error") as t:
        yield t, vec


def test_missing_key_error_table(small):
    t, vec = small
    np.testing.assert_array_equal(t.lookup([0, 9]), vec[[0, 9]])
    with pytest.raises(strata.KeyNotFound) as e:
        t.lookup([1, 10])
    assert e.value.status == _ffi.STRATA_KEY_NOT_FOUND and "key 10" in e.value.message
    with pytest.raises(LookupError):
        t.lookup(np.array([-1]))


def test_wrong_dtypes(small):
    t, vec = small
    with pytest.raises(strata.UnsupportedDtype, match=r"keys: dtype float64; expected int32, int64"):
        t.lookup(np.array([1.0, 2.0]))
    out = np.zeros((2, 4), np.float64)
    with pytest.raises(strata.UnsupportedDtype, match="out"):
        t.lookup([1, 2], out=out)
    assert (out == 0).all()
    with pytest.raises(strata.UnsupportedDtype, match="vectors"):
        strata.Table.from_array(np.zeros((3, 2), np.int32))
    with pytest.raises(strata.UnsupportedDtype, match="dtype"):
        t.lookup([1], dtype="float64")
    with pytest.raises(TypeError):  # UnsupportedDtype is a TypeError too
        t.lookup([1], dtype="int8")


def test_wrong_shapes(small):
    t, vec = small
    out = poisoned((3, 5))
    with pytest.raises(strata.InvalidArgument, match="out") as e:
        t.lookup([1, 2, 3], out=out)
    assert e.value.status == _ffi.STRATA_INVALID_ARGUMENT
    assert np.isnan(out).all(), "a refused out is not written"
    with pytest.raises(strata.InvalidArgument):
        t.lookup([1, 2, 3], out=poisoned((2, 4)))
    with pytest.raises(strata.InvalidArgument, match="vectors"):
        strata.Table.from_array(np.zeros(8, np.float32))
    with pytest.raises(strata.InvalidArgument, match="keys"):
        strata.Table.from_array(np.zeros((3, 2), np.float32), keys=np.arange(4))
    with pytest.raises(strata.DuplicateKey):
        strata.Table.from_array(np.zeros((3, 2), np.float32), keys=np.array([1, 2, 1]))


def test_read_only_out_is_refused(small):
    t, vec = small
    out = poisoned((2, 4))
    out.flags.writeable = False
    with pytest.raises(strata.ReadOnly, match="out") as e:
        t.lookup([1, 2], out=out)
    assert e.value.status == _ffi.STRATA_READ_ONLY
    assert np.isnan(out).all()


def test_not_dlpack_and_bad_option_values(small):
    t, vec = small
    with pytest.raises(strata.InvalidArgument, match="no __dlpack__"):
        t.lookup([1], out=[[0.0] * 4])
    with pytest.raises(strata.InvalidArgument, match="missing: 'ignore'"):
        strata.Table.from_array(vec, missing="ignore")
    with pytest.raises(strata.InvalidArgument, match="gpu_placement"):
        strata.Table.from_array(vec, gpu_placement="disk")
    with pytest.raises(strata.InvalidArgument, match="table"):
        strata.lookup("not a table", [1])
    with pytest.raises(strata.InvalidArgument, match="stream"):
        t.lookup([1], stream="fast")


def test_closed_tables_and_lifetimes(rng):
    vec = rng.standard_normal((5, 2)).astype(np.float32)
    t = strata.Table.from_array(vec)
    assert "rows=5 dim=2" in repr(t)
    t.close()
    t.close()  # twice is fine
    assert t.closed and "closed" in repr(t)
    for call in (lambda: t.lookup([1]), lambda: t.dim, lambda: len(t), lambda: t.info, lambda: t.__partitioned__):
        with pytest.raises(strata.NullArgument, match="closed"):
            call()
    for _ in range(200):  # __del__ frees; nothing grows or crashes
        strata.Table.from_array(vec)
    gc.collect()


def test_stream_values():
    from strata._core import _stream_value

    class Torchish:
        cuda_stream = 1234

    class Cupyish:
        ptr = 99

    class Proto:
        def __cuda_stream__(self):
            return (0, 77)

    assert _stream_value(None) is None and _stream_value(5) == 5
    assert (_stream_value(Torchish()), _stream_value(Cupyish()), _stream_value(Proto())) == (1234, 99, 77)


def test_host_lookup_with_a_stream_argument_is_fine(small):
    """A stream only matters for GPU tensors; NumPy producers are never handed one."""
    t, vec = small
    np.testing.assert_array_equal(t.lookup([2], stream=12345), vec[[2]])


# ---- HugeCTR folders and servers ----------------------------------------------------------------


def write_hugectr(d, keys, vec):
    d.mkdir(parents=True, exist_ok=True)
    np.asarray(keys, "<i8").tofile(d / "key")
    np.asarray(vec, "<f4").tofile(d / "emb_vector")


def test_table_open(tmp_path, rng):
    keys = rng.choice(10**9, size=300, replace=False)
    vec = rng.standard_normal((300, 16)).astype(np.float32)
    write_hugectr(tmp_path / "t", keys, vec)
    with strata.Table.open(tmp_path / "t", 16, default_value=1.5) as t:
        assert t.info.mapped and t.info.keyed and len(t) == 300
        q = np.concatenate([keys[:50], [12345678901]])
        np.testing.assert_array_equal(t.lookup(q), expected(vec, q, 1.5, keys))
    with strata.Table.open(str(tmp_path / "t"), 16, missing="error") as t:
        with pytest.raises(strata.KeyNotFound):
            t.lookup([-3])
    with pytest.raises(strata.IoError) as e:
        strata.Table.open(tmp_path / "absent", 16)
    assert isinstance(e.value, OSError) and e.value.message
    with pytest.raises(strata.InvalidFile):
        strata.Table.open(tmp_path / "t", 7)  # 16 * 300 floats are not rows of 7


def write_ps_json(tmp_path, rng):
    tables = {}
    for name, rows, dim in (("wdl0", 40, 16), ("wdl1", 30, 4), ("dcn0", 20, 8)):
        keys = rng.choice(10**6, size=rows, replace=False)
        vec = rng.standard_normal((rows, dim)).astype(np.float32)
        write_hugectr(tmp_path / name, keys, vec)
        tables[name] = (keys, vec)
    ps = {
        "supportlonglong": True,
        "models": [
            {"model": "wdl", "sparse_files": ["wdl0", "wdl1"], "embedding_table_names": ["wide", "deep"],
             "embedding_vecsize_per_table": [16, 4], "default_value_for_each_table": [0.0, -1.0],
             "maxnum_catfeature_query_per_table_per_sample": [2, 26], "deployed_device_list": [0],
             "max_batch_size": 1024, "hit_rate_threshold": 0.9},
            {"model": "dcn", "sparse_files": ["dcn0"], "embedding_vecsize_per_table": [8],
             "default_value_for_each_table": [0.5], "maxnum_catfeature_query_per_table_per_sample": [1],
             "deployed_device_list": [0], "max_batch_size": 1024, "no_such_field": 1},
        ],
    }
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    return tables


def test_server(tmp_path, rng):
    tables = write_ps_json(tmp_path, rng)
    with strata.Server.open(tmp_path / "ps.json") as s:
        assert s.models() == {"wdl": 2, "dcn": 1}
        assert list(s.tables()) == [("wdl", 0, "wide"), ("wdl", 1, "deep"), ("dcn", 0, "sparse_embedding0")]
        assert any("no_such_field" in w for w in s.warnings)
        for model, tid, name, default in (("wdl", 0, "wdl0", 0.0), ("wdl", 1, "wdl1", -1.0), ("dcn", 0, "dcn0", 0.5)):
            keys, vec = tables[name]
            t = s.table(model, tid)
            assert s.table(model, tid) is t
            q = np.concatenate([keys[::2], [10**7]])
            np.testing.assert_array_equal(t.lookup(q), expected(vec, q, default, keys))
        with pytest.raises(strata.InvalidArgument, match="model"):
            s.table("nope", 0)
        with pytest.raises(strata.StrataError):
            s.table("wdl", 5)
    assert t.closed, "server tables close with their server"
    with pytest.raises(strata.NullArgument):
        t.lookup([1])
    with pytest.raises(strata.NullArgument):
        s.models()


def test_server_from_json_and_config_errors(tmp_path, rng):
    write_ps_json(tmp_path, rng)
    text = (tmp_path / "ps.json").read_text()
    with strata.Server.from_json(text, tmp_path) as s:
        assert s.models()["dcn"] == 1
    bad = json.loads(text)
    bad["models"][1]["sparse_files"] = ["missing_table"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(strata.StrataError) as e:
        strata.Server.open(tmp_path / "bad.json")
    assert "models[1]" in e.value.message or "missing_table" in e.value.message
    with pytest.raises(strata.ConfigError):
        strata.Server.from_json("{not json")


# ---- __partitioned__ ----------------------------------------------------------------------------


def heat_split0(g, nranks):
    """Heat's DNDarray.__partitioned__ for split=0 over nranks ranks, one process holding all."""
    base, extra = divmod(g.shape[0], nranks)
    counts = [base + (r < extra) for r in range(nranks)]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    return {
        "shape": g.shape,
        "partition_tiling": (nranks, 1),
        "partitions": {
            (r, 0): {"start": (starts[r], 0), "shape": (counts[r], g.shape[1]),
                     "data": g[starts[r]:starts[r] + counts[r]].copy(), "location": [r],
                     "dtype": str(g.dtype), "device": "cpu"}
            for r in range(nranks)
        },
        "locals": [(r, 0) for r in range(nranks)],
        "get": lambda x: x,
    }


class HeatLike:
    def __init__(self, parts):
        self.__partitioned__ = parts


def test_from_partitioned_heat_split0_copies(rng):
    g = rng.standard_normal((27, 8)).astype(np.float32)
    parts = heat_split0(g, 4)
    assert [p["shape"][0] for p in parts["partitions"].values()] == [7, 7, 7, 6]
    with strata.from_partitioned(HeatLike(parts), default_value=-1.0) as t:
        assert len(t) == 27 and t.dim == 8 and not t.info.keyed
        keys = rng.integers(-3, 30, size=200)
        np.testing.assert_array_equal(t.lookup(keys), expected(g, keys, -1.0))
        for p in parts["partitions"].values():
            p["data"][:] = 0  # copied: later changes are not seen
        np.testing.assert_array_equal(t.lookup(keys), expected(g, keys, -1.0))


def test_from_partitioned_single_partition_is_borrowed_and_kept_alive(rng):
    g = rng.standard_normal((12, 4)).astype(np.float32)
    parts = {"shape": g.shape, "partition_tiling": (1, 1),
             "partitions": {(0, 0): {"start": (0, 0), "shape": g.shape, "data": g, "location": [0, 1]}},
             "locals": [(0, 0)], "get": lambda x: x}
    t = strata.from_partitioned(parts, missing="error")
    del parts
    g[5] = 7.0  # borrowed: the table reads the array in place
    np.testing.assert_array_equal(t.lookup([5]), np.full((1, 4), 7.0, np.float32))
    del g
    gc.collect()
    assert t.lookup([5])[0, 0] == 7.0, "the producer stays alive with the table"
    with pytest.raises(strata.KeyNotFound):
        t.lookup([12])
    t.close()


def test_from_partitioned_handles_resolved_by_get(rng):
    g = rng.standard_normal((10, 3)).astype(np.float32)
    parts = heat_split0(g, 3)
    store = {}
    for pos, e in parts["partitions"].items():
        store[pos] = e["data"]
        e["data"] = ("ref", pos)
    parts["get"] = lambda ref: store[ref[1]]
    with strata.from_partitioned(parts) as t:
        np.testing.assert_array_equal(t.lookup(np.arange(10)), g)


def test_from_partitioned_errors(rng):
    g = rng.standard_normal((10, 3)).astype(np.float32)
    parts = heat_split0(g, 2)
    gap = dict(parts, partitions=dict(parts["partitions"]))
    gap["partitions"][(1, 0)] = dict(gap["partitions"][(1, 0)], start=(6, 0), shape=(4, 3),
                                     data=g[6:].copy())
    with pytest.raises(strata.InvalidArgument, match=r"partition \(\d,0\)"):
        strata.from_partitioned(gap)
    missing = dict(parts, partitions={(0, 0): parts["partitions"][(0, 0)]})
    with pytest.raises(strata.InvalidArgument, match=r"partition \(1, 0\): no entry"):
        strata.from_partitioned(missing)
    with pytest.raises(strata.InvalidArgument, match="__partitioned__"):
        strata.from_partitioned(42)
    with pytest.raises(strata.InvalidArgument, match="'partitions'"):
        strata.from_partitioned({"shape": (1, 1), "partition_tiling": (1, 1)})
    ints = heat_split0(np.arange(12, dtype=np.int32).reshape(6, 2), 2)
    with pytest.raises(strata.StrataError) as e:
        strata.from_partitioned(ints)
    assert e.value.status in (_ffi.STRATA_UNSUPPORTED_DTYPE, _ffi.STRATA_INVALID_ARGUMENT)
    with pytest.raises(strata.StrataError) as e:
        strata.from_partitioned(parts, comm=0)  # no MPI in this build (issue 5): refused, not crashed
    assert e.value.status in (_ffi.STRATA_UNSUPPORTED_DEVICE, _ffi.STRATA_INVALID_ARGUMENT), e.value


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_partitioned_round_trip(rng, dtype):
    g = rng.standard_normal((50, 16)).astype(dtype)
    t = strata.Table.from_array(g, default_value=-1.0)
    p = t.__partitioned__
    assert p["shape"] == (50, 16) and p["partition_tiling"] == (1, 1) and p["locals"] == [(0, 0)]
    e = p["partitions"][(0, 0)]
    assert e["start"] == (0, 0) and e["shape"] == (50, 16) and e["location"] == [0]
    assert e["dtype"] == np.dtype(dtype).name and e["device"] == "cpu"
    view = e["data"]
    assert isinstance(view, np.ndarray) and not view.flags.writeable
    np.testing.assert_array_equal(view, g)
    assert p["get"](view) is view
    with pytest.raises(BufferError):
        t.close()  # a view is alive
    with strata.from_partitioned(p, default_value=-1.0) as t2:
        keys = rng.integers(-5, 56, size=400)
        np.testing.assert_array_equal(t2.lookup(keys), t.lookup(keys))
        np.testing.assert_array_equal(t2.lookup(keys), expected(g, keys, -1.0))
        assert t2.__partitioned__["partitions"][(0, 0)]["data"].ctypes.data == view.ctypes.data, "no copy"
    del p, e, view
    gc.collect()
    t.close()
    gc.collect()
    assert _dlpack.live_exports() == 0


def test_partitioned_refuses_keyed_tables(rng):
    g = rng.standard_normal((6, 2)).astype(np.float32)
    with strata.Table.from_array(g, keys=np.arange(100, 106)) as keyed:
        with pytest.raises(strata.InvalidArgument, match="keyed"):
            keyed.__partitioned__


def test_views_export_versioned_and_legacy_and_release_unconsumed_capsules(rng):
    g = rng.standard_normal((6, 2)).astype(np.float32)
    prod = HostProducer(g, _ffi.kDLFloat, 32, read_only=True)
    v = np.from_dlpack(prod)  # NumPy asks for a versioned capsule: read-only is signalled
    assert not v.flags.writeable
    np.testing.assert_array_equal(v, g)
    legacy = np.from_dlpack(LegacyOnly(prod))  # legacy capsules cannot say read-only
    np.testing.assert_array_equal(legacy, g)
    assert _dlpack.live_exports() == 2
    cap = prod.__dlpack__(max_version=(1, 0))
    assert _dlpack.live_exports() == 3
    del cap  # never consumed: the capsule's destructor calls the deleter
    assert _dlpack.live_exports() == 2
    del v, legacy
    gc.collect()
    assert _dlpack.live_exports() == 0


def test_lookup_accepts_legacy_only_producers(small):
    t, vec = small
    keys = np.array([3, 1])
    out = poisoned((2, 4))
    t.lookup(LegacyOnly(HostProducer(keys, _ffi.kDLInt, 64)), out=LegacyOnly(HostProducer(out, _ffi.kDLFloat, 32)))
    np.testing.assert_array_equal(out, vec[keys])
    ro = poisoned((2, 4))
    with pytest.raises(strata.ReadOnly, match="out"):  # versioned out, legacy keys: checked in Python
        t.lookup(LegacyOnly(HostProducer(keys, _ffi.kDLInt, 64)), out=HostProducer(ro, _ffi.kDLFloat, 32, True))
    assert np.isnan(ro).all()


# ---- other frameworks --------------------------------------------------------------------------


def test_jax_cpu_keys_give_jax_results(rng):
    jax = pytest.importorskip("jax", reason="skipped: jax not installed (pip install 'jax[cpu]')")
    import jax.numpy as jnp

    vec = rng.standard_normal((100, 8)).astype(np.float32)
    keys = rng.integers(0, 110, size=(5, 6)).astype(np.int32)
    with strata.Table.from_array(jnp.asarray(vec)) as t:
        got = strata.lookup(t, jnp.asarray(keys))
        assert isinstance(got, jax.Array) and got.shape == (5, 6, 8)
        np.testing.assert_array_equal(np.asarray(got), expected(vec, keys))
        out = poisoned((30, 8))
        strata.lookup(t, jnp.asarray(keys), out=out)  # JAX keys, NumPy out
        np.testing.assert_array_equal(out, expected(vec, keys).reshape(30, 8))


def _gpu_framework():
    try:
        import cupy  # type: ignore

        return "cupy", cupy
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return "torch", torch
    except ImportError:
        pass
    pytest.skip("skipped: a CUDA device but neither CuPy nor PyTorch with CUDA is installed")


@NEEDS_CUDA
def test_gpu_lookup_on_a_stream(rng):
    name, fw = _gpu_framework()
    vec = rng.standard_normal((1000, 32)).astype(np.float32)
    keys = rng.integers(-10, 1010, size=4096)
    want = expected(vec, keys, 0.25)
    with strata.Table.from_array(vec, default_value=0.25) as t:
        if name == "cupy":
            k = fw.asarray(keys)
            s = fw.cuda.Stream(non_blocking=True)
            got = strata.lookup(t, k, stream=s)
            s.synchronize()
            host = fw.asnumpy(got)
            assert isinstance(got, fw.ndarray)
        else:
            k = fw.as_tensor(keys, device="cuda")
            s = fw.cuda.Stream()
            got = strata.lookup(t, k, stream=s)
            s.synchronize()
            host = got.cpu().numpy()
            assert got.is_cuda
        np.testing.assert_array_equal(host, want)


@NEEDS_CUDA
def test_gpu_lookup_stats_and_float16(rng):
    name, fw = _gpu_framework()
    vec = rng.standard_normal((100, 8)).astype(np.float32)
    keys = rng.integers(0, 120, size=500)
    with strata.Table.from_array(vec) as t:
        k = fw.asarray(keys) if name == "cupy" else fw.as_tensor(keys, device="cuda")
        got, st = t.lookup_with_stats(k, dtype="float16")
        host = fw.asnumpy(got) if name == "cupy" else got.cpu().numpy()
        np.testing.assert_array_equal(host, expected(vec, keys).astype(np.float16))
        assert st.hits + st.misses == 500 and st.misses == int((keys >= 100).sum())
