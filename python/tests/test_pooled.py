"""Pooled and batched lookups: ``strata.lookup_pooled`` and ``strata.lookup_batch`` (the installed
package), and ``strata_lookup_pooled`` / ``strata_lookup_batch`` through raw ctypes mirrors.

Every result is written into a poisoned output and compared bit for bit with a NumPy loop that
does what the contract says (float32 accumulation in key order, then / Σw or / √Σw², zeros for an
empty bag or a zero total), and with ``torch.nn.functional.embedding_bag`` where PyTorch is
installed. Every refusal checks the exception class, the status, that strata's message names the
argument, and that the output was left as it was.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pathlib
from ctypes import POINTER, byref, c_int32, c_size_t

import numpy as np
import pytest
from test_ctypes import LIB_PATH, package_library

REPO = pathlib.Path(__file__).resolve().parents[2]
if package_library() is None:  # a package without its library (used from the source tree)
    os.environ.setdefault("STRATA_LIBRARY", LIB_PATH)

import strata  # noqa: E402
from strata import _dlpack, _ffi  # noqa: E402

try:
    import ml_dtypes
except ImportError:  # bfloat16 then goes through hand-built DLTensors only
    ml_dtypes = None

POOLINGS = ("sum", "mean", "sqrtn")
KEY_DTYPES = (np.int32, np.int64, np.uint32, np.uint64)
OFFSET_DTYPES = (np.int32, np.int64)


@pytest.fixture
def rng():
    return np.random.default_rng(20261207)


# ---- references --------------------------------------------------------------------------------


def ref_pooled(vec, keys, offsets, weights, pooling, default=0.0, table_keys=None):
    """The contract as a plain loop: per bag, acc += w * row in float32, in key order; mean
    divides by Σw, sqrtn by √Σw² (both summed in float32); an empty bag or a zero total gives
    zeros. A missing key contributes a row of ``default``. Returns float32 [B, dim]."""
    vec = np.asarray(vec, np.float32)
    dim = vec.shape[1]
    flat = np.asarray(keys).reshape(-1).astype(np.int64)
    if table_keys is None:
        rows = np.where((flat >= 0) & (flat < len(vec)), flat, -1)
    else:
        index = {int(k): i for i, k in enumerate(np.asarray(table_keys).astype(np.int64))}
        rows = np.array([index.get(int(k), -1) for k in flat], np.int64)
    w_flat = None if weights is None else np.asarray(weights, np.float32).reshape(-1)
    offsets = np.asarray(offsets).astype(np.int64)
    miss_row = np.full(dim, default, np.float32)
    out = np.zeros((len(offsets) - 1, dim), np.float32)
    for b in range(len(offsets) - 1):
        acc = np.zeros(dim, np.float32)
        ws, w2 = np.float32(0), np.float32(0)
        for j in range(offsets[b], offsets[b + 1]):
            w = np.float32(1) if w_flat is None else w_flat[j]
            acc = acc + w * (vec[rows[j]] if rows[j] >= 0 else miss_row)
            ws = np.float32(ws + w)
            w2 = np.float32(w2 + w * w)
        if pooling == "mean":
            acc = np.zeros(dim, np.float32) if ws == 0 else acc / ws
        elif pooling == "sqrtn":
            d = np.sqrt(w2)
            acc = np.zeros(dim, np.float32) if d == 0 else acc / d
        out[b] = acc
    return out


def ragged_offsets(rng, b, max_len, dtype=np.int64):
    """B + 1 offsets of bags of 0..max_len keys, with empty bags first, last and in a row."""
    lens = rng.integers(0, max_len + 1, size=b)
    lens[0] = 0
    lens[-1] = 0
    if b > 4:
        lens[2] = lens[3] = 0
    return np.concatenate([[0], np.cumsum(lens)]).astype(dtype)


def poisoned(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype=dtype)


def bf16_rne(x):
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(u16):
    return (np.asarray(u16, np.uint16).astype(np.uint32) << 16).view(np.float32)


class HandBf16:
    """A hand-built bfloat16 DLTensor over a uint16 buffer (NumPy cannot export bfloat16), through
    strata's own producer. Writable."""

    def __init__(self, u16):
        assert u16.dtype == np.uint16
        self.buf = u16
        self.inner = _dlpack.HostArray(u16, _ffi.kDLBfloat, 16)

    def __dlpack__(self, **kw):
        return self.inner.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


# ---- every pooling, weighted or not, ragged and fixed hotness ---------------------------------


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("offset_dtype", OFFSET_DTYPES, ids=lambda d: "off_" + np.dtype(d).name)
def test_ragged_bags_match_numpy(rng, pooling, weighted, key_dtype, offset_dtype):
    vec = rng.standard_normal((200, 12)).astype(np.float32)
    offsets = ragged_offsets(rng, 40, 9, offset_dtype)
    nnz = int(offsets[-1])
    keys = rng.integers(0, 230, size=nnz).astype(key_dtype)  # 200..229: missing
    weights = rng.uniform(-0.5, 2.0, size=nnz).astype(np.float32) if weighted else None
    want = ref_pooled(vec, keys, offsets, weights, pooling, default=0.25)
    with strata.Table.from_array(vec, default_value=0.25) as t:
        out = poisoned((40, 12))
        got, st = t.lookup_pooled_with_stats(keys, offsets, weights, pooling, out=out)
        assert got is out
        np.testing.assert_array_equal(out, want)
        misses = int((keys.astype(np.int64) >= 200).sum())
        assert (st.hits, st.misses) == (nnz - misses, misses), "stats count keys"
        assert not out[0].any() and not out[-1].any(), "empty bags give zeros"
        # allocated output, and the free function
        alloc = strata.lookup_pooled(t, keys, offsets, weights, pooling)
        assert isinstance(alloc, np.ndarray) and alloc.shape == (40, 12) and alloc.dtype == np.float32
        np.testing.assert_array_equal(alloc, want)


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_fixed_hotness_matches_numpy(rng, pooling, weighted, key_dtype):
    vec = rng.standard_normal((100, 8)).astype(np.float32)
    b, hot = 30, 5
    keys = rng.integers(0, 110, size=(b, hot)).astype(key_dtype)
    weights = rng.uniform(0.0, 1.5, size=(b, hot)).astype(np.float32) if weighted else None
    offsets = np.arange(0, b * hot + 1, hot)
    want = ref_pooled(vec, keys, offsets, weights, pooling, default=-1.0)
    with strata.Table.from_array(vec, default_value=-1.0) as t:
        out = poisoned((b, 8))
        assert strata.lookup_pooled(t, keys, None, weights, pooling, out=out) is out
        np.testing.assert_array_equal(out, want)
        # strided keys and weights: every other column, rows in reverse
        big = rng.integers(0, 110, size=(b, 2 * hot)).astype(key_dtype)
        sk = big[::-1, ::2]
        sw = None if weights is None else np.repeat(weights, 2, axis=1)[::-1, ::2]
        np.testing.assert_array_equal(
            strata.lookup_pooled(t, sk, weights=sw, pooling=pooling),
            ref_pooled(vec, sk, offsets, sw, pooling, default=-1.0),
        )


def test_zero_hotness_and_zero_bags(rng):
    vec = rng.standard_normal((10, 4)).astype(np.float32)
    with strata.Table.from_array(vec) as t:
        for pooling in POOLINGS:
            out = poisoned((6, 4))
            t.lookup_pooled(np.zeros((6, 0), np.int64), pooling=pooling, out=out)
            assert (out == 0).all(), "[B, 0] keys: every bag empty, zeros"
            got = t.lookup_pooled(np.zeros(0, np.int64), np.zeros(1, np.int64), pooling=pooling)
            assert got.shape == (0, 4), "offsets [0]: B = 0"
            got = t.lookup_pooled(np.zeros(0, np.int64), np.zeros(4, np.int32), pooling=pooling)
            assert got.shape == (3, 4) and (got == 0).all()


def test_zero_and_negative_weight_totals(rng):
    vec = rng.standard_normal((10, 4)).astype(np.float32) + 3.0
    keys = np.array([1, 2, 3, 4, 5, 6, 7], np.int64)
    offsets = np.array([0, 2, 4, 7])
    weights = np.array([1.0, -1.0, 0.0, 0.0, 2.0, -0.5, 0.25], np.float32)  # totals 0, 0, 1.75
    with strata.Table.from_array(vec) as t:
        for pooling in POOLINGS:
            got = t.lookup_pooled(keys, offsets, weights, pooling)
            np.testing.assert_array_equal(got, ref_pooled(vec, keys, offsets, weights, pooling))
        mean = t.lookup_pooled(keys, offsets, weights, "mean")
        assert (mean[0] == 0).all(), "mean: Σw = 0 gives zeros"
        assert mean[0].tobytes() == np.zeros(4, np.float32).tobytes(), "+0.0, not -0.0 or NaN"
        sq = t.lookup_pooled(keys, offsets, weights, "sqrtn")
        assert (sq[1] == 0).all() and (sq[0] != 0).all(), "sqrtn: Σw² = 0 gives zeros; Σw = 0 alone does not"
        s = t.lookup_pooled(keys, offsets, weights, "sum")
        np.testing.assert_array_equal(s[1], np.zeros(4, np.float32))


def test_many_bags_on_many_threads(rng):
    vec = rng.standard_normal((5000, 32)).astype(np.float32)
    offsets = ragged_offsets(rng, 3000, 20)
    keys = rng.integers(-50, 5050, size=int(offsets[-1]))
    weights = rng.uniform(0, 1, size=keys.shape).astype(np.float32)
    want = ref_pooled(vec, keys, offsets, weights, "sqrtn")
    with strata.Table.from_array(vec) as t:
        for n in (None, 1, 2, 4):
            np.testing.assert_array_equal(t.lookup_pooled(keys, offsets, weights, "sqrtn", num_threads=n), want)


def test_keyed_table(rng):
    tkeys = rng.choice(10**12, size=300, replace=False).astype(np.int64)
    vec = rng.standard_normal((300, 6)).astype(np.float32)
    offsets = ragged_offsets(rng, 25, 6)
    q = tkeys[rng.integers(0, 300, size=int(offsets[-1]))]
    q[::7] = -12345  # misses
    with strata.Table.from_array(vec, keys=tkeys, default_value=0.5) as t:
        for pooling in POOLINGS:
            got, st = t.lookup_pooled_with_stats(q, offsets, pooling=pooling)
            np.testing.assert_array_equal(got, ref_pooled(vec, q, offsets, None, pooling, 0.5, tkeys))
            assert st.misses == len(q[::7]) and st.hits == len(q) - st.misses


def test_float16_and_bfloat16_tables(rng):
    """Rows of any table dtype are accumulated in float32."""
    vec = rng.standard_normal((50, 8)).astype(np.float32)
    offsets = ragged_offsets(rng, 12, 7)
    keys = rng.integers(0, 55, size=int(offsets[-1]))
    weights = rng.uniform(0, 2, size=keys.shape).astype(np.float32)
    half = vec.astype(np.float16)
    with strata.Table.from_array(half) as t:
        got = t.lookup_pooled(keys, offsets, weights, "mean")
        np.testing.assert_array_equal(got, ref_pooled(half.astype(np.float32), keys, offsets, weights, "mean"))
    bf = bf16_rne(vec)
    with strata.Table.from_array(HandBf16(bf)) as t:
        assert t.info.dtype == "bfloat16"
        got = t.lookup_pooled(keys, offsets, weights, "sum")
        np.testing.assert_array_equal(got, ref_pooled(bf16_to_f32(bf), keys, offsets, weights, "sum"))


# ---- outputs: dtypes and strides ----------------------------------------------------------------


@pytest.mark.parametrize("pooling", POOLINGS)
def test_float16_and_bfloat16_outputs(rng, pooling):
    vec = rng.standard_normal((60, 8)).astype(np.float32)
    offsets = ragged_offsets(rng, 20, 6)
    keys = rng.integers(0, 60, size=int(offsets[-1]))
    want = ref_pooled(vec, keys, offsets, None, pooling)
    with strata.Table.from_array(vec) as t:
        h = poisoned((20, 8), np.float16)
        t.lookup_pooled(keys, offsets, pooling=pooling, out=h)
        np.testing.assert_array_equal(h, want.astype(np.float16))
        got = t.lookup_pooled(keys, offsets, pooling=pooling, dtype="float16")
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, want.astype(np.float16))
        # bfloat16 through a hand-built DLTensor over uint16 (always) ...
        bf = np.full((20, 8), 0xFFFF, np.uint16)
        t.lookup_pooled(keys, offsets, pooling=pooling, out=HandBf16(bf))
        np.testing.assert_array_equal(bf, bf16_rne(want))
        # ... and through ml_dtypes' bfloat16 arrays, given or allocated, where ml_dtypes is
        if ml_dtypes is not None:
            mb = np.full((20, 8), np.nan, ml_dtypes.bfloat16)
            assert t.lookup_pooled(keys, offsets, pooling=pooling, out=mb) is mb
            np.testing.assert_array_equal(mb.view(np.uint16), bf16_rne(want))
            got = t.lookup_pooled(keys, offsets, pooling=pooling, dtype="bfloat16")
            assert got.dtype == ml_dtypes.bfloat16
            np.testing.assert_array_equal(got.view(np.uint16), bf16_rne(want))
    gc.collect()
    assert _dlpack.live_exports() == 0


def test_bfloat16_output_with_ml_dtypes():
    if ml_dtypes is None:
        pytest.skip("skipped: ml_dtypes not installed (bfloat16 is tested through hand-built DLTensors)")
    vec = np.arange(12, dtype=np.float32).reshape(4, 3)
    with strata.Table.from_array(vec) as t:
        got = strata.lookup(t, [[0, 1], [3, 3]], dtype="bfloat16")  # the plain lookup too
        assert got.dtype == ml_dtypes.bfloat16 and got.shape == (2, 2, 3)
        np.testing.assert_array_equal(got.astype(np.float32), vec[[[0, 1], [3, 3]]])
        ro = np.zeros((2, 3), ml_dtypes.bfloat16)
        ro.flags.writeable = False
        with pytest.raises(strata.ReadOnly, match=r"^out: "):
            t.lookup_pooled([[0, 1], [2, 3]], out=ro)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_strided_out_writes_nothing_outside(rng, pooling):
    vec = rng.standard_normal((40, 6)).astype(np.float32)
    offsets = ragged_offsets(rng, 15, 5)
    keys = rng.integers(0, 45, size=int(offsets[-1]))
    weights = rng.uniform(0, 1, size=keys.shape).astype(np.float32)
    want = ref_pooled(vec, keys, offsets, weights, pooling)
    with strata.Table.from_array(vec) as t:
        big = poisoned((31, 13))
        view = big[::2, 1::2]  # [16, 6] rows 2 apart, columns 2 apart
        out = view[:15]
        t.lookup_pooled(keys, offsets, weights, pooling, out=out)
        np.testing.assert_array_equal(out, want)
        mask = np.ones(big.shape, bool)
        mask[0:30:2, 1:13:2] = False
        assert np.isnan(big[mask]).all(), "nothing outside out is written"
        col = poisoned((6, 15)).T  # column-major [15, 6]
        t.lookup_pooled(keys, offsets, weights, pooling, out=col)
        np.testing.assert_array_equal(col, want)
        half = np.full((15, 12), np.nan, np.float16)[:, ::-2][:, ::-1]  # odd strides in float16
        t.lookup_pooled(keys, offsets, weights, pooling, out=half)
        np.testing.assert_array_equal(half, want.astype(np.float16))


# ---- other producers ---------------------------------------------------------------------------


def test_matches_torch_embedding_bag(rng):
    torch = pytest.importorskip("torch", reason="skipped: PyTorch is not installed (pip install torch)")
    F = torch.nn.functional
    vec = rng.standard_normal((80, 16)).astype(np.float32)
    offsets = ragged_offsets(rng, 25, 8)
    keys = rng.integers(0, 80, size=int(offsets[-1]))
    weights = rng.uniform(0.1, 2.0, size=keys.shape).astype(np.float32)
    tk, to, tw, tv = (torch.from_numpy(x) for x in (keys, offsets, weights, vec))
    with strata.Table.from_array(tv) as t:
        for mode, w in (("sum", None), ("mean", None), ("sum", weights)):
            want = F.embedding_bag(tk, tv, to, mode=mode, include_last_offset=True,
                                   per_sample_weights=None if w is None else tw).numpy()
            got = strata.lookup_pooled(t, tk, to, None if w is None else tw, mode)
            assert isinstance(got, torch.Tensor), "torch keys give a torch output"
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        # sqrtn: embedding_bag's weighted sum with w / sqrt(Σw²) per bag
        scale = np.zeros_like(weights)
        for b in range(len(offsets) - 1):
            seg = slice(offsets[b], offsets[b + 1])
            n = np.sqrt((weights[seg] ** 2).sum())
            scale[seg] = weights[seg] / n if n else 0
        want = F.embedding_bag(tk, tv, to, mode="sum", include_last_offset=True,
                               per_sample_weights=torch.from_numpy(scale)).numpy()
        got = strata.lookup_pooled(t, tk, to, tw, "sqrtn")
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        # fixed hotness: embedding_bag's 2-D input
        k2 = torch.from_numpy(rng.integers(0, 80, size=(12, 5)))
        want = F.embedding_bag(k2, tv, mode="mean").numpy()
        np.testing.assert_allclose(strata.lookup_pooled(t, k2, pooling="mean").numpy(), want, rtol=1e-5, atol=1e-6)
        out = torch.full((12, 16), float("nan"), dtype=torch.bfloat16)
        assert strata.lookup_pooled(t, k2, pooling="sum", out=out) is out
        np.testing.assert_allclose(out.float().numpy(), F.embedding_bag(k2, tv, mode="sum").numpy(), rtol=1e-2, atol=1e-2)


def test_jax_inputs(rng):
    if os.environ.get("STRATA_SKIP_JAX"):
        pytest.skip("skipped: STRATA_SKIP_JAX is set")
    jnp = pytest.importorskip("jax.numpy", reason="skipped: JAX is not installed (pip install 'jax[cpu]')")
    vec = rng.standard_normal((30, 4)).astype(np.float32)
    offsets = ragged_offsets(rng, 8, 5).astype(np.int32)
    keys = rng.integers(0, 30, size=int(offsets[-1])).astype(np.int32)
    weights = rng.uniform(0, 1, size=keys.shape).astype(np.float32)
    with strata.Table.from_array(vec) as t:
        got = strata.lookup_pooled(t, jnp.asarray(keys), jnp.asarray(offsets), jnp.asarray(weights), "mean")
        assert type(got).__module__.split(".")[0] in ("jax", "jaxlib"), "JAX keys give a JAX output"
        np.testing.assert_array_equal(np.asarray(got), ref_pooled(vec, keys, offsets, weights, "mean"))


def test_lists_and_ints(rng):
    vec = rng.standard_normal((10, 3)).astype(np.float32)
    with strata.Table.from_array(vec) as t:
        got = t.lookup_pooled([1, 2, 3], [0, 1, 3], [0.5, 1, 2], pooling=_ffi.STRATA_POOL_MEAN)
        np.testing.assert_array_equal(got, ref_pooled(vec, [1, 2, 3], [0, 1, 3], [0.5, 1, 2], "mean"))
        got = t.lookup_pooled([[1, 2], [3, 4]])  # fixed hotness, sum
        np.testing.assert_array_equal(got, ref_pooled(vec, [1, 2, 3, 4], [0, 2, 4], None, "sum"))


# ---- refusals ----------------------------------------------------------------------------------


@pytest.fixture
def t10(rng):
    vec = rng.standard_normal((10, 4)).astype(np.float32)
    with strata.Table.from_array(vec) as t:
        yield t


KEYS6 = np.array([1, 2, 3, 4, 5, 6], np.int64)


def refused(t, exc, status, pattern, keys=KEYS6, offsets=None, weights=None, pooling="sum", out=None):
    """Calls lookup_pooled with a poisoned [3, 4] out (unless given); checks the exception, its
    status and message (which must start with the argument's name), and that out is untouched."""
    out = poisoned((3, 4)) if out is None else out
    before = np.array(out, copy=True)
    with pytest.raises(exc) as e:
        t.lookup_pooled(keys, offsets, weights, pooling, out=out)
    assert e.value.status == status
    assert e.value.message.startswith(pattern.split(":")[0] + ":"), e.value.message
    assert __import__("re").search(pattern, e.value.message), e.value.message
    np.testing.assert_array_equal(np.asarray(out), before)
    return e.value.message


def test_bad_offsets(t10):
    INV = _ffi.STRATA_INVALID_ARGUMENT
    refused(t10, strata.InvalidArgument, INV, r"offsets: offsets\[0\] = 1; expected 0", offsets=[1, 2, 4, 6])
    refused(t10, strata.InvalidArgument, INV, r"offsets: offsets\[2\] = 1 is less than offsets\[1\] = 3",
            offsets=[0, 3, 1, 6])
    refused(t10, strata.InvalidArgument, INV, r"offsets: offsets\[3\] = 5; expected nnz = 6", offsets=[0, 2, 4, 5])
    refused(t10, strata.InvalidArgument, INV, r"offsets: offsets\[3\] = 7; expected nnz = 6", offsets=[0, 2, 4, 7])
    refused(t10, strata.UnsupportedDtype, _ffi.STRATA_UNSUPPORTED_DTYPE,
            r"offsets: dtype float64; expected int32 or int64", offsets=[0.0, 2.0, 4.0, 6.0])
    refused(t10, strata.UnsupportedDtype, _ffi.STRATA_UNSUPPORTED_DTYPE, r"offsets: dtype float32",
            offsets=np.array([0, 2, 4, 6], np.float32))
    refused(t10, strata.UnsupportedDtype, _ffi.STRATA_UNSUPPORTED_DTYPE, r"offsets: dtype uint8",
            offsets=np.array([0, 2, 4, 6], np.uint8))
    refused(t10, strata.InvalidArgument, INV, r"offsets: shape \[2, 2\]; expected a 1-D tensor",
            offsets=np.array([[0, 2], [4, 6]]))
    refused(t10, strata.InvalidArgument, INV, r"offsets: is NULL but keys are 1-D", offsets=None)
    refused(t10, strata.InvalidArgument, INV, r"offsets: given with 2-D keys", keys=KEYS6.reshape(3, 2),
            offsets=[0, 2, 4, 6])


def test_bad_weights_keys_pooling_and_out(t10):
    INV = _ffi.STRATA_INVALID_ARGUMENT
    off = [0, 2, 4, 6]
    refused(t10, strata.InvalidArgument, INV, r"weights: shape \[5\]; expected the keys' shape \[6\]",
            offsets=off, weights=np.ones(5, np.float32))
    refused(t10, strata.InvalidArgument, INV, r"weights: shape \[6\]; expected the keys' shape \[3, 2\]",
            keys=KEYS6.reshape(3, 2), weights=np.ones(6, np.float32))
    refused(t10, strata.UnsupportedDtype, _ffi.STRATA_UNSUPPORTED_DTYPE, r"weights: dtype float64; expected float32",
            offsets=off, weights=np.ones(6))
    refused(t10, strata.UnsupportedDtype, _ffi.STRATA_UNSUPPORTED_DTYPE, r"keys: dtype float32",
            keys=KEYS6.astype(np.float32), offsets=off)
    refused(t10, strata.InvalidArgument, INV, r"keys: ndim = 3", keys=KEYS6.reshape(3, 1, 2))
    # pooling: a name this package does not know, and values strata refuses itself
    refused(t10, strata.InvalidArgument, INV, r"pooling: 'max'; expected one of 'sum', 'mean', 'sqrtn'",
            offsets=off, pooling="max")
    refused(t10, strata.InvalidArgument, INV, r"pooling: 'none'", offsets=off, pooling="none")
    refused(t10, strata.InvalidArgument, INV, r"pooling: 7; expected STRATA_POOL_SUM", offsets=off, pooling=7)
    refused(t10, strata.InvalidArgument, INV, r"pooling: 0 \(STRATA_POOL_NONE\)", offsets=off, pooling=0)
    refused(t10, strata.InvalidArgument, INV, r"pooling: 1.0", offsets=off, pooling=1.0)
    # out: rows != B, dim, dtype, read-only, overlapping
    refused(t10, strata.InvalidArgument, INV, r"out: shape \[4, 4\]; expected \[B, dim\] = \[3, 4\]", offsets=off,
            out=poisoned((4, 4)))
    refused(t10, strata.InvalidArgument, INV, r"out: shape \[3, 4\]; expected \[B, dim\] = \[2, 4\]",
            keys=KEYS6.reshape(2, 3))
    refused(t10, strata.InvalidArgument, INV, r"out: shape \[3, 5\]", offsets=off, out=poisoned((3, 5)))
    refused(t10, strata.InvalidArgument, INV, r"out: shape \[3, 1, 4\]", offsets=off, out=poisoned((3, 1, 4)))
    refused(t10, strata.UnsupportedDtype, _ffi.STRATA_UNSUPPORTED_DTYPE, r"out: dtype float64", offsets=off,
            out=np.full((3, 4), np.nan))
    ro = poisoned((3, 4))
    ro.flags.writeable = False
    refused(t10, strata.ReadOnly, _ffi.STRATA_READ_ONLY, r"out: the tensor is flagged read-only", offsets=off, out=ro)
    overlap = np.lib.stride_tricks.as_strided(poisoned(4), shape=(3, 4), strides=(0, 4))
    refused(t10, strata.InvalidLayout, _ffi.STRATA_INVALID_LAYOUT, r"out: strides \[0, 1\]", offsets=off, out=overlap)


def test_out_rows_must_match_b_for_fixed_hotness(t10):
    out = poisoned((2, 4))
    with pytest.raises(strata.InvalidArgument, match=r"out: shape \[2, 4\]; expected \[B, dim\] = \[3, 4\]"):
        t10.lookup_pooled(KEYS6.reshape(3, 2), out=out)
    assert np.isnan(out).all()


def test_missing_key_error_table(rng):
    vec = rng.standard_normal((10, 4)).astype(np.float32)
    with strata.Table.from_array(vec, missing="error") as t:
        np.testing.assert_array_equal(t.lookup_pooled([[1, 2]]), ref_pooled(vec, [1, 2], [0, 2], None, "sum"))
        with pytest.raises(strata.KeyNotFound) as e:
            t.lookup_pooled([1, 12, 3], [0, 1, 3], pooling="mean")
        assert e.value.status == _ffi.STRATA_KEY_NOT_FOUND and "12" in e.value.message


def test_closed_table_and_not_a_table(rng):
    t = strata.Table.from_array(np.zeros((3, 2), np.float32))
    t.close()
    with pytest.raises(strata.NullArgument, match="table: the table is closed"):
        strata.lookup_pooled(t, [[0]])
    with pytest.raises(strata.InvalidArgument, match="table: a str; expected a strata.Table"):
        strata.lookup_pooled("t", [[0]])


# ---- lookup_batch (the package) ---------------------------------------------------------------


@pytest.fixture
def three_tables(rng):
    """Tables of different dims and dtypes: float32 [100, 8], float16 [50, 4] keyed, float32 [30, 16]."""
    a = rng.standard_normal((100, 8)).astype(np.float32)
    bkeys = rng.choice(10**9, size=50, replace=False).astype(np.int64)
    b = rng.standard_normal((50, 4)).astype(np.float16)
    c = rng.standard_normal((30, 16)).astype(np.float32)
    with strata.Table.from_array(a) as ta, strata.Table.from_array(b, keys=bkeys, default_value=1.5) as tb, \
            strata.Table.from_array(c, missing="error") as tc:
        yield (ta, a, None), (tb, b, bkeys), (tc, c, None)


def test_batch_equals_separate_calls(rng, three_tables):
    (ta, a, _), (tb, b, bkeys), (tc, c, _) = three_tables
    k_plain = rng.integers(0, 110, size=(4, 3))
    off = ragged_offsets(rng, 10, 6, np.int32)
    k_rag = bkeys[rng.integers(0, 50, size=int(off[-1]))]
    k_rag[::5] = 77  # misses
    w_rag = rng.uniform(0, 2, size=k_rag.shape).astype(np.float32)
    k_fix = rng.integers(0, 30, size=(6, 4)).astype(np.uint32)
    k_one = np.array([[5]], np.int64)  # one-hot, batch 1
    out_b = np.full((10, 4), np.nan, np.float16)
    requests = [
        strata.Request(ta, k_plain),  # plain, allocated
        strata.Request(tb, k_rag, out_b, off, w_rag, "mean"),  # pooled ragged weighted, given float16 out
        (tc, k_fix, None, None, None, "sqrtn"),  # a tuple
        {"table": ta, "keys": k_one, "pooling": "sum"},  # a dict
        {"table": tc, "keys": k_fix[:, :1].copy(), "out": poisoned((6, 1, 16))},  # plain, given out
    ]
    outs, stats = strata.lookup_batch_with_stats(requests, num_threads=2)
    assert len(outs) == 5 and outs[1] is out_b and outs[4] is requests[4]["out"]
    want0, st0 = ta.lookup_with_stats(k_plain)
    np.testing.assert_array_equal(outs[0], want0)
    want1, st1 = tb.lookup_pooled_with_stats(k_rag, off, w_rag, "mean", dtype="float16")
    np.testing.assert_array_equal(out_b, want1)
    np.testing.assert_array_equal(
        out_b, ref_pooled(b.astype(np.float32), k_rag, off, w_rag, "mean", 1.5, bkeys).astype(np.float16))
    want2, st2 = tc.lookup_pooled_with_stats(k_fix, pooling="sqrtn")
    np.testing.assert_array_equal(outs[2], want2)
    want3, st3 = ta.lookup_pooled_with_stats(k_one)
    np.testing.assert_array_equal(outs[3], want3)
    np.testing.assert_array_equal(outs[3], a[[5]])
    want4, st4 = tc.lookup_with_stats(k_fix[:, :1])
    np.testing.assert_array_equal(outs[4], want4)
    assert stats == [st0, st1, st2, st3, st4]
    assert stats[1].misses == len(k_rag[::5])
    assert strata.lookup_batch(requests) is not None  # stats are optional
    assert strata.lookup_batch([]) == []


def test_batch_of_26_one_hot_tables(rng):
    """A DLRM's 26 categorical features at batch 1: one call, 26 pooled rows."""
    vecs = [rng.standard_normal((int(rng.integers(5, 50)), 8)).astype(np.float32) for _ in range(26)]
    tables = [strata.Table.from_array(v) for v in vecs]
    try:
        keys = [np.array([[int(rng.integers(0, len(v)))]]) for v in vecs]
        outs = strata.lookup_batch([strata.Request(t, k, pooling="sum") for t, k in zip(tables, keys)])
        for v, k, o in zip(vecs, keys, outs):
            np.testing.assert_array_equal(o, v[k[0]])
    finally:
        for t in tables:
            t.close()


def test_batch_errors_name_the_request(rng, three_tables):
    (ta, a, _), (tb, b, bkeys), (tc, c, _) = three_tables
    out0 = poisoned((3, 8))
    good = strata.Request(ta, np.array([1, 2, 3]), out0)

    def refused_batch(bad, exc, pattern):
        with pytest.raises(exc, match=pattern) as e:
            strata.lookup_batch([good, bad])
        assert e.value.message.startswith("requests[1]"), e.value.message
        assert np.isnan(out0).all(), "no output is written before every request is checked"
        return e.value

    e = refused_batch(strata.Request(ta, np.arange(6), poisoned((3, 8)), [0, 2, 1, 6], None, "sum"),
                      strata.InvalidArgument, r"^requests\[1\]\.offsets: offsets\[2\] = 1 is less than")
    assert e.status == _ffi.STRATA_INVALID_ARGUMENT
    refused_batch(strata.Request(ta, np.arange(6), poisoned((2, 8)), [0, 2, 4, 6], None, "sum"),
                  strata.InvalidArgument, r"^requests\[1\]\.out: shape \[2, 8\]; expected \[B, dim\] = \[3, 8\]")
    refused_batch(strata.Request(ta, np.arange(6), poisoned((3, 8)), [0, 2, 4, 6], np.ones(5, np.float32), "sum"),
                  strata.InvalidArgument, r"^requests\[1\]\.weights: shape")
    refused_batch(strata.Request(ta, np.arange(6), poisoned((3, 8)), [0, 2, 4, 6]),
                  strata.InvalidArgument, r"^requests\[1\]\.offsets: given with pooling = STRATA_POOL_NONE")
    refused_batch(strata.Request(ta, np.arange(6), poisoned((3, 8)), [0, 2, 4, 6], pooling="avg"),
                  strata.InvalidArgument, r"^requests\[1\]\.pooling: 'avg'; expected one of 'none', 'sum'")
    refused_batch(strata.Request(ta, np.arange(6), poisoned((3, 8)), [0, 2, 4, 6], pooling=9),
                  strata.InvalidArgument, r"^requests\[1\]\.pooling: 9; expected STRATA_POOL_SUM")
    refused_batch(strata.Request(ta, np.arange(6), pooling="sum"),
                  strata.InvalidArgument, r"^requests\[1\]\.offsets: is NULL")
    refused_batch(strata.Request("t", np.arange(3)), strata.InvalidArgument, r"^requests\[1\]\.table: a str")
    refused_batch({"table": ta, "keys": [1], "combiner": "sum"}, strata.InvalidArgument,
                  r"^requests\[1\]: .*combiner.*; expected the fields of strata.Request")
    refused_batch(42, strata.InvalidArgument, r"^requests\[1\]: a int; expected a strata.Request")
    ro = poisoned((3, 8))
    ro.flags.writeable = False
    refused_batch(strata.Request(ta, np.arange(3), ro), strata.ReadOnly, r"^requests\[1\]\.out: ")
    # A missing key in a missing="error" table is found while looking up, not while checking: the
    # call fails naming the request, and the outputs are then unspecified.
    with pytest.raises(strata.KeyNotFound, match=r"^requests\[1\]\..*99") as e:
        strata.lookup_batch([good, strata.Request(tc, np.array([[1, 99]]), pooling="mean")])
    assert e.value.status == _ffi.STRATA_KEY_NOT_FOUND


def _no_general_path(monkeypatch):
    """Makes the general (capsule) path of lookup_pooled and lookup_batch fail if it is taken."""
    def refuse(*a, **k):
        raise AssertionError("the general path was taken")
    monkeypatch.setattr(strata._core, "_Prepared", refuse)


def test_fast_paths_match_the_general_path(rng, three_tables, monkeypatch):
    """lookup_pooled and lookup_batch with every out given, NumPy host tensors: the fast path
    (no capsule for PyTorch, a thread's own request array) gives what the general path gives."""
    (ta, a, _), (tb, b, bkeys), (tc, c, _) = three_tables
    off = ragged_offsets(rng, 12, 7, np.int64)
    k_rag = bkeys[rng.integers(0, 50, size=int(off[-1]))]
    k_rag[::4] = 5  # misses: the default row 1.5
    w_rag = rng.uniform(-1, 2, size=k_rag.shape).astype(np.float32)
    k_fix = rng.integers(0, 30, size=(7, 3)).astype(np.int32)
    k_plain = rng.integers(0, 100, size=9)
    want = [
        tb.lookup_pooled(k_rag, off, w_rag, "mean", dtype="float16"),
        tc.lookup_pooled(k_fix, pooling="sqrtn"),
        ta.lookup(k_plain),
        ta.lookup_pooled(k_plain[:6].reshape(2, 3), pooling="sum"),
    ]
    _no_general_path(monkeypatch)
    for rounds in range(3):  # the thread's request array is reused across calls
        outs = [poisoned((12, 4), np.float16), poisoned((7, 16)), poisoned((9, 8)), poisoned((2, 8))]
        got = strata.lookup_batch([
            strata.Request(tb, k_rag, outs[0], off, w_rag, "mean"),
            strata.Request(tc, k_fix, outs[1], None, None, "sqrtn"),
            strata.Request(ta, k_plain, outs[2]),
            strata.Request(ta, k_plain[:6].reshape(2, 3), outs[3], pooling=1),
        ])
        assert all(g is o for g, o in zip(got, outs))
        for g, w in zip(outs, want):
            np.testing.assert_array_equal(g, w)
    out = poisoned((12, 4), np.float16)
    assert strata.lookup_pooled(tb, k_rag, off, w_rag, "mean", out=out) is out
    np.testing.assert_array_equal(out, want[0])
    # A batch longer than the thread's first request array.
    many = [strata.Request(ta, k_plain, poisoned((9, 8))) for _ in range(70)]
    for r in strata.lookup_batch(many):
        np.testing.assert_array_equal(r, want[2])


def test_fast_paths_keep_the_general_paths_refusals(rng, three_tables):
    """What the fast path cannot take goes the general way, with its message: a read-only NumPy
    out, a closed table, weights that are a list, an out of None; and strata's own refusals
    still name the request."""
    (ta, a, _), (tb, b, bkeys), (tc, c, _) = three_tables
    ro = poisoned((2, 8))
    ro.flags.writeable = False
    with pytest.raises(strata.ReadOnly, match=r"^out: "):
        strata.lookup_pooled(ta, np.arange(4), [0, 2, 4], out=ro)
    with pytest.raises(strata.ReadOnly, match=r"^requests\[0\]\.out: "):
        strata.lookup_batch([strata.Request(ta, np.arange(4), ro, np.array([0, 2, 4]), None, "sum")])
    out = poisoned((2, 8))
    got = strata.lookup_batch([strata.Request(ta, np.arange(4), out, np.array([0, 2, 4]), [1, 2, 3, 4], "sum"),
                               strata.Request(ta, np.arange(3))])  # a list of weights; an out to allocate
    np.testing.assert_array_equal(got[0], ref_pooled(a, np.arange(4), np.array([0, 2, 4]), np.array([1, 2, 3, 4], np.float32), "sum"))
    np.testing.assert_array_equal(got[1], a[:3])
    with pytest.raises(strata.InvalidArgument, match=r"^requests\[1\]\.out: shape \[3, 8\]; expected \[B, dim\] = \[2, 8\]"):
        strata.lookup_batch([strata.Request(ta, np.arange(4), poisoned((2, 8)), np.array([0, 2, 4]), None, "sum"),
                             strata.Request(ta, np.arange(4), poisoned((3, 8)), np.array([0, 2, 4]), None, "sum")])
    with pytest.raises(strata.InvalidArgument, match=r"^requests\[0\]\.pooling: 7; expected"):
        strata.lookup_batch([strata.Request(ta, np.arange(4), poisoned((2, 8)), np.array([0, 2, 4]), None, 7)])
    with pytest.raises(strata.KeyNotFound, match=r"^requests\[0\]\..*99"):
        strata.lookup_batch([strata.Request(tc, np.array([[1, 99]]), poisoned((1, 16)), None, None, "mean")])
    t = strata.Table.from_array(a)
    t.close()
    with pytest.raises(strata.NullArgument, match="closed"):
        strata.lookup_batch([strata.Request(t, np.arange(3), poisoned((3, 8)))])
    with pytest.raises(strata.NullArgument, match="closed"):
        strata.lookup_pooled(t, np.arange(4), np.array([0, 2, 4]), out=poisoned((2, 8)))


def test_fast_batch_with_torch_tensors(rng, three_tables):
    """The batch's fast path calls PyTorch's exchange function itself: torch and NumPy tensors
    mixed in one request and across requests give the reference rows in torch outs that were
    poisoned first; an out that requires grad goes the general way, which names it."""
    torch = pytest.importorskip("torch", reason="skipped: PyTorch is not installed (pip install torch)")
    (ta, a, _), (tb, b, bkeys), _ = three_tables
    k = rng.integers(0, len(a), size=9)
    off = np.array([0, 4, 4, 9])
    w = rng.uniform(-1, 2, size=9).astype(np.float32)
    outs = [torch.full((3, 8), float("nan")) for _ in range(3)]
    plain = torch.full((9, 8), float("nan"))
    got = strata.lookup_batch([strata.Request(ta, torch.from_numpy(k), outs[0], off, None, "sum"),
                               strata.Request(ta, k, outs[1], torch.from_numpy(off), torch.from_numpy(w), "mean"),
                               strata.Request(ta, torch.from_numpy(k), plain),
                               strata.Request(ta, torch.from_numpy(k), outs[2], torch.from_numpy(off), w, "sqrtn")])
    assert got[0] is outs[0] and got[2] is plain
    np.testing.assert_array_equal(outs[0].numpy(), ref_pooled(a, k, off, None, "sum"))
    np.testing.assert_array_equal(outs[1].numpy(), ref_pooled(a, k, off, w, "mean"))
    np.testing.assert_array_equal(plain.numpy(), a[k])
    np.testing.assert_array_equal(outs[2].numpy(), ref_pooled(a, k, off, w, "sqrtn"))
    grad = torch.zeros((3, 8), requires_grad=True)
    with pytest.raises(strata.InvalidArgument, match=r"^requests\[1\]\.out: .*require"):
        strata.lookup_batch([strata.Request(ta, k, torch.zeros(3, 8), off, None, "sum"), strata.Request(ta, k, grad, off, None, "sum")])


def test_fast_batch_of_one_producer_fills_every_tensor_in_one_call(rng, three_tables, monkeypatch):
    """A batch whose tensors all come from PyTorch is described by one strata_dlpack_fill_host
    call (the general path is not taken): plain and pooled requests, ragged int32/int64 offsets,
    fixed hotness, weights, a strided out, each equal to the reference in outs poisoned first,
    over rounds that reuse the thread's arrays with requests of other shapes. strata's own
    refusals still name the request, and an out that requires grad goes the general way."""
    torch = pytest.importorskip("torch", reason="skipped: PyTorch is not installed (pip install torch)")
    from strata import _fast
    if _fast._fill_host is None:
        pytest.fail("the library lacks strata_dlpack_fill_host")
    (ta, a, _), (tb, b, bkeys), (tc, c, _) = three_tables
    calls = []
    real = _fast._fill_host
    monkeypatch.setattr(_fast, "_fill_host", lambda *args: calls.append(args[2]) or real(*args))
    _no_general_path(monkeypatch)
    T = torch.from_numpy
    for rnd in range(3):
        bsz = int(rng.integers(1, 9))
        off = ragged_offsets(rng, bsz, 6, np.int32 if rnd % 2 else np.int64)
        k_rag = bkeys[rng.integers(0, 50, size=int(off[-1]))]
        w = rng.uniform(-1, 2, size=k_rag.shape).astype(np.float32)
        k_fix = rng.integers(0, 30, size=(bsz, 3))
        k_plain = rng.integers(0, len(a), size=bsz + 3)
        wide = torch.full((bsz, 32), float("nan"))
        outs = [torch.full((bsz, 4), float("nan")), torch.full((bsz, 16), float("nan")),
                torch.full((bsz + 3, 8), float("nan")), wide[:, ::4]]
        got = strata.lookup_batch([
            strata.Request(tb, T(k_rag), outs[0], T(off), T(w), "mean"),
            strata.Request(tc, T(k_fix), outs[1], None, None, "sqrtn"),
            strata.Request(ta, T(k_plain), outs[2]),
            strata.Request(ta, T(k_rag % len(a)), outs[3], T(off), None, "sum"),
        ])
        assert all(g is o for g, o in zip(got, outs))
        assert calls[-1] == 16, "one fill for the batch's 16 tensor slots"
        np.testing.assert_allclose(outs[0].numpy(), ref_pooled(b, k_rag, off, w, "mean", table_keys=bkeys), rtol=1e-6)
        np.testing.assert_array_equal(outs[1].numpy(), ref_pooled(c, k_fix.reshape(-1), np.arange(0, 3 * bsz + 1, 3), None, "sqrtn"))
        np.testing.assert_array_equal(outs[2].numpy(), a[k_plain])
        np.testing.assert_array_equal(outs[3].numpy(), ref_pooled(a, k_rag % len(a), off, None, "sum"))
        assert torch.isnan(wide[:, 1::4]).all(), "nothing written between a strided out's columns"
    assert len(calls) == 3
    with pytest.raises(strata.InvalidArgument, match=r"^requests\[1\]\.out: shape \[3, 8\]; expected \[B, dim\] = \[2, 8\]"):
        strata.lookup_batch([strata.Request(ta, T(np.arange(4)), torch.zeros(2, 8), T(np.array([0, 2, 4])), None, "sum"),
                             strata.Request(ta, T(np.arange(4)), torch.zeros(3, 8), T(np.array([0, 2, 4])), None, "sum")])
    assert len(calls) == 4


def test_fast_batch_of_one_producer_leaves_out_what_it_cannot_take(rng, three_tables):
    """All-PyTorch batches the one-call path must not take go the general way with its
    message: an out that requires grad, a closed table, a pooling it does not know."""
    torch = pytest.importorskip("torch", reason="skipped: PyTorch is not installed (pip install torch)")
    (ta, a, _), _, _ = three_tables
    k, off = torch.arange(4), torch.tensor([0, 2, 4])
    with pytest.raises(strata.InvalidArgument, match=r"^requests\[1\]\.out: .*require"):
        strata.lookup_batch([strata.Request(ta, k, torch.zeros(2, 8), off, None, "sum"),
                             strata.Request(ta, k, torch.zeros((2, 8), requires_grad=True), off, None, "sum")])
    with pytest.raises((strata.InvalidArgument, ValueError), match="pooling"):
        strata.lookup_batch([strata.Request(ta, k, torch.zeros(2, 8), off, None, "max")])
    t = strata.Table.from_array(a)
    t.close()
    with pytest.raises(strata.NullArgument, match="closed"):
        strata.lookup_batch([strata.Request(t, k, torch.zeros(2, 8), off, None, "sum")])


def test_large_batch_runs_as_one_piece_of_work(rng):
    """A batch big enough for several threads (its static requests share the participants,
    exec/batch.rs): plain and pooled requests of tables of different dims and dtypes, ragged
    and fixed bags, weights, misses, every pooling, equal to separate calls; a missing key in a
    missing="error" table names its request."""
    specs = [(int(rng.integers(200, 5000)), int(rng.choice([8, 16, 64, 100])), rng.choice([np.float32, np.float16])) for _ in range(12)]
    vecs = [rng.standard_normal((r, d)).astype(dt) for r, d, dt in specs]
    tables = [strata.Table.from_array(v, default_value=0.25) for v in vecs]
    strict = strata.Table.from_array(vecs[0], missing="error")
    try:
        reqs, want = [], []
        for i, (t, v) in enumerate(zip(tables, vecs)):
            b = int(rng.integers(300, 900))
            if i % 3 == 2:  # plain
                k = rng.integers(0, len(v) + 20, size=b)
                reqs.append(strata.Request(t, k, poisoned((b, v.shape[1]))))
                want.append(t.lookup(k))
                continue
            pooling = ["sum", "mean", "sqrtn"][i % 3 if i % 3 < 2 else 0] if i % 2 else "mean"
            off = ragged_offsets(rng, b, 30)
            k = rng.integers(0, len(v) + 20, size=int(off[-1]))  # some misses
            w = rng.uniform(-1, 2, size=k.shape).astype(np.float32) if i % 4 == 0 else None
            reqs.append(strata.Request(t, k, poisoned((b, v.shape[1])), off, w, pooling))
            want.append(t.lookup_pooled(k, off, w, pooling))
        outs = strata.lookup_batch(reqs, num_threads=2)
        for o, w in zip(outs, want):
            np.testing.assert_array_equal(o, w)
        bad = strata.Request(strict, np.array([[1, len(vecs[0]) + 5]] * 2000), poisoned((2000, vecs[0].shape[1])), None, None, "sum")
        with pytest.raises(strata.KeyNotFound, match=r"^requests\[3\]\."):
            strata.lookup_batch(reqs[:3] + [bad] + reqs[3:], num_threads=2)
    finally:
        for t in tables + [strict]:
            t.close()


def test_fast_batch_from_many_threads(rng, three_tables):
    """Each thread has its own request array: concurrent batches do not see each other's."""
    import threading
    (ta, a, _), _, (tc, c, _) = three_tables
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(50):
                k1 = r.integers(0, 100, size=(5, 3))
                k2 = r.integers(0, 30, size=7)
                o1, o2 = poisoned((5, 8)), poisoned((7, 16))
                strata.lookup_batch([strata.Request(ta, k1, o1, None, None, "sum"), strata.Request(tc, k2, o2)])
                np.testing.assert_array_equal(o1, ref_pooled(a, k1, np.arange(0, 16, 3), None, "sum"))
                np.testing.assert_array_equal(o2, c[k2])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_fast_paths_with_torch(rng, monkeypatch):
    """PyTorch tensors take the exchange-API road (no capsules); a tensor that requires grad goes
    the general way, which refuses it as the single lookup does."""
    torch = pytest.importorskip("torch")
    vec = rng.standard_normal((40, 8)).astype(np.float32)
    with strata.Table.from_array(vec) as t:
        k = torch.from_numpy(rng.integers(0, 40, size=30))
        off = torch.tensor([0, 3, 3, 10, 30])
        w = torch.rand(30)
        want = ref_pooled(vec, k.numpy(), off.numpy(), w.numpy(), "sum")
        out = torch.full((4, 8), float("nan"))
        monkeypatch.setattr(strata._core, "_Prepared", None)  # the general path would fail
        assert strata.lookup_pooled(t, k, off, w, "sum", out=out) is out
        np.testing.assert_array_equal(out.numpy(), want)
        out.fill_(float("nan"))
        strata.lookup_batch([strata.Request(t, k, out, off, w, "sum")])
        np.testing.assert_array_equal(out.numpy(), want)
        monkeypatch.undo()
        grad = torch.zeros((4, 8), requires_grad=True)
        with pytest.raises((strata.StrataError, BufferError, RuntimeError)):
            strata.lookup_pooled(t, k, off, w, "sum", out=grad)


# ---- the C ABI through raw ctypes (strata_lookup_pooled, strata_lookup_batch) -------------------

import test_ctypes as C  # noqa: E402


strata_lookup_request = C.HEADER.structs["strata_lookup_request"]
STATS_P = POINTER(C.strata_lookup_stats)
OPTS_P = POINTER(C.strata_lookup_options)
TENSOR_P = POINTER(C.DLTensor)
c_lookup_pooled = C._fn("strata_lookup_pooled")
c_lookup_batch = C._fn("strata_lookup_batch")
c_request_default = C._fn("strata_lookup_request_default")


def test_request_struct_matches_the_header(tmp_path):
    C.assert_layouts_match_the_header(tmp_path, {
        "struct strata_lookup_request": strata_lookup_request,
    })
    # the package's own mirror too
    C.assert_layouts_match_the_header(tmp_path, {"struct strata_lookup_request": _ffi.strata_lookup_request})
    d = c_request_default()
    assert d.struct_size == ctypes.sizeof(strata_lookup_request)
    assert not d.table and not d.keys and not d.offsets and not d.weights and not d.out and not d.stats
    assert d.pooling == 0


def c_table(vec, default=0.0, missing=C.STRATA_MISSING_FILL):
    return C.from_dlpack(vec, None, C.table_options(default, missing))


def test_c_lookup_pooled(rng):
    vec = rng.standard_normal((50, 8)).astype(np.float32)
    off = ragged_offsets(rng, 12, 6, np.int32)
    keys = rng.integers(0, 60, size=int(off[-1])).astype(np.uint64)
    w = rng.uniform(0, 2, size=keys.shape).astype(np.float32)
    with c_table(vec, 0.5) as t:
        for p, name in ((1, "sum"), (2, "mean"), (3, "sqrtn")):
            out = poisoned((12, 8))
            kt, ot, wt, oft = C.Tensor(keys), C.Tensor(out), C.Tensor(w), C.Tensor(off)
            st = C.strata_lookup_stats(0xDEAD, 0xBEEF)
            C.expect(c_lookup_pooled(t.h, kt.ptr, oft.ptr, wt.ptr, p, ot.ptr, None, byref(st)), C.STRATA_OK, name)
            np.testing.assert_array_equal(out, ref_pooled(vec, keys, off, w, name, 0.5))
            misses = int((keys >= 50).sum())
            assert (st.hits, st.misses) == (len(keys) - misses, misses)
        # bfloat16 out, fixed hotness, through a hand-built DLTensor
        k2 = keys[:12].reshape(4, 3)
        bf = np.full((4, 8), 0xFFFF, np.uint16)
        ht, k2t = C.bf16_tensor(bf), C.Tensor(k2)  # (kept alive: a capsule's DLTensor dies with it)
        C.expect(c_lookup_pooled(t.h, k2t.ptr, None, None, 2, ht.ptr, None, None), C.STRATA_OK, "bf16")
        np.testing.assert_array_equal(bf, bf16_rne(ref_pooled(vec, k2, [0, 3, 6, 9, 12], None, "mean", 0.5)))
        # refusals name the argument
        out = poisoned((12, 8))
        kt, oft, ot = C.Tensor(keys), C.Tensor(off), C.Tensor(out)
        for p, pat in ((0, "pooling: 0"), (4, "pooling: 4"), (-1, "pooling: -1")):
            C.expect(c_lookup_pooled(t.h, kt.ptr, oft.ptr, None, p, ot.ptr, None, None), C.STRATA_INVALID_ARGUMENT, pat)
            assert C.last_error().startswith(pat), C.last_error()
        C.expect(c_lookup_pooled(t.h, None, oft.ptr, None, 1, ot.ptr, None, None), C.STRATA_NULL_ARGUMENT, "keys NULL")
        assert C.last_error().startswith("keys"), C.last_error()
        C.expect(c_lookup_pooled(t.h, kt.ptr, oft.ptr, None, 1, None, None, None), C.STRATA_NULL_ARGUMENT, "out NULL")
        assert C.last_error().startswith("out"), C.last_error()
        C.expect(c_lookup_pooled(None, kt.ptr, oft.ptr, None, 1, ot.ptr, None, None), C.STRATA_NULL_ARGUMENT, "table")
        assert C.last_error().startswith("table"), C.last_error()
        w5 = C.Tensor(w[:5].copy())
        C.expect(c_lookup_pooled(t.h, kt.ptr, oft.ptr, w5.ptr, 1, ot.ptr, None, None), C.STRATA_INVALID_ARGUMENT, "w")
        assert C.last_error().startswith("weights: shape [5]"), C.last_error()
        assert np.isnan(out).all()


def batch_array(reqs, stride=None):
    """n requests laid out ``stride`` bytes apart (default: sizeof), each with struct_size = stride;
    the bytes past a request's mirror are zero (a newer caller's unknown tail)."""
    size = ctypes.sizeof(strata_lookup_request)
    stride = stride or size
    buf = (ctypes.c_uint8 * (stride * max(1, len(reqs))))()
    for i, r in enumerate(reqs):
        r.struct_size = stride
        ctypes.memmove(ctypes.addressof(buf) + i * stride, ctypes.addressof(r), size)
    # (The pointer keeps the buffer alive.)
    return ctypes.cast(buf, POINTER(strata_lookup_request))


def test_c_lookup_batch(rng):
    a = rng.standard_normal((40, 8)).astype(np.float32)
    b = rng.standard_normal((20, 4)).astype(np.float32)
    with c_table(a) as ta, c_table(b, -1.0) as tb:
        k0 = rng.integers(0, 45, size=7).astype(np.int32)
        off1 = ragged_offsets(rng, 6, 5)
        k1 = rng.integers(0, 25, size=int(off1[-1])).astype(np.int64)
        w1 = rng.uniform(0, 1, size=k1.shape).astype(np.float32)
        k2 = rng.integers(0, 40, size=(5, 3)).astype(np.uint32)
        alive = []

        def t(x):
            tt = C.Tensor(x)
            alive.append(tt)
            return tt.ptr

        def requests():
            outs = [poisoned((7, 8)), poisoned((6, 4)), poisoned((5, 8))]
            stats = [C.strata_lookup_stats() for _ in outs]
            reqs = []
            for table, keys, off, w, p, o, st in ((ta, k0, None, None, 0, outs[0], stats[0]),
                                                  (tb, k1, off1, w1, 2, outs[1], stats[1]),
                                                  (ta, k2, None, None, 3, outs[2], stats[2])):
                r = c_request_default()
                r.table, r.keys, r.pooling, r.out, r.stats = table.h, t(keys), p, t(o), ctypes.pointer(st)
                r.offsets = None if off is None else t(off)
                r.weights = None if w is None else t(w)
                reqs.append(r)
            return reqs, outs, stats

        def check(outs, stats):
            want0 = np.where((k0 < 40)[:, None], a[np.minimum(k0, 39)], 0.0)
            np.testing.assert_array_equal(outs[0], want0)
            np.testing.assert_array_equal(outs[1], ref_pooled(b, k1, off1, w1, "mean", -1.0))
            np.testing.assert_array_equal(outs[2], ref_pooled(a, k2, np.arange(0, 16, 3), None, "sqrtn"))
            m0, m1 = int((k0 >= 40).sum()), int((k1 >= 20).sum())
            assert [(s.hits, s.misses) for s in stats] == [(7 - m0, m0), (len(k1) - m1, m1), (15, 0)]

        reqs, outs, stats = requests()
        arr = batch_array(reqs)
        C.expect(c_lookup_batch(arr, 3, None), C.STRATA_OK, "batch")
        check(outs, stats)
        # a newer caller's larger stride, with a zero tail
        reqs, outs, stats = requests()
        arr = batch_array(reqs, ctypes.sizeof(strata_lookup_request) + 16)
        opts = C.strata_lookup_options_default()
        opts.num_threads = 1
        C.expect(c_lookup_batch(arr, 3, byref(opts)), C.STRATA_OK, "batch, larger stride")
        check(outs, stats)
        # n = 0 with NULL requests: nothing to do
        C.expect(c_lookup_batch(None, 0, None), C.STRATA_OK, "n = 0")

        # errors name the request, and nothing is written before every request is checked
        def refused(mutate, status, prefix, stride=None):
            reqs, outs, _ = requests()
            mutate(reqs)
            C.expect(c_lookup_batch(batch_array(reqs, stride), 3, None), status, prefix)
            assert C.last_error().startswith(prefix), C.last_error()
            for o in outs:
                assert np.isnan(o).all(), "an output was written by a refused batch"

        bad_off = np.array([0, 3, 2, len(k1)], np.int64)

        def set_bad_offsets(r):
            r[1].offsets = t(bad_off)
            r[1].weights = None

        refused(set_bad_offsets, C.STRATA_INVALID_ARGUMENT, "requests[1].offsets: offsets[2] = 2 is less than")
        refused(lambda r: setattr(r[1], "keys", None), C.STRATA_NULL_ARGUMENT, "requests[1].keys")
        refused(lambda r: setattr(r[1], "pooling", 5), C.STRATA_INVALID_ARGUMENT, "requests[1].pooling: 5")
        refused(lambda r: setattr(r[1], "table", None), C.STRATA_NULL_ARGUMENT, "requests[1].table")
        refused(lambda r: setattr(r[1], "out", t(poisoned((5, 4)))), C.STRATA_INVALID_ARGUMENT,
                "requests[1].out: shape [5, 4]; expected [B, dim] = [6, 4]")
        refused(lambda r: setattr(r[1], "weights", t(w1.astype(np.float64))), C.STRATA_UNSUPPORTED_DTYPE,
                "requests[1].weights: dtype float64")
        refused(lambda r: setattr(r[1], "pooling", 0), C.STRATA_INVALID_ARGUMENT,
                "requests[1].offsets: given with pooling = STRATA_POOL_NONE")
        refused(lambda r: setattr(r[2], "offsets", t(np.array([0, 15]))), C.STRATA_INVALID_ARGUMENT,
                "requests[2].offsets: given with 2-D keys")
        # struct_size: 0 and a non-zero unknown tail are refused
        C.expect(c_lookup_batch(_zero_size(requests()[0]), 3, None), C.STRATA_INVALID_ARGUMENT, "struct_size 0")
        assert "requests" in C.last_error() and "struct_size" in C.last_error(), C.last_error()
        reqs = requests()[0]
        big = ctypes.sizeof(strata_lookup_request) + 8
        arr = batch_array(reqs, big)
        ctypes.c_uint8.from_address(ctypes.addressof(arr.contents) + big + big - 1).value = 1  # requests[1]'s tail
        C.expect(c_lookup_batch(arr, 3, None), C.STRATA_INVALID_ARGUMENT, "non-zero tail")
        assert C.last_error().startswith("requests: requests[1].struct_size = 72, and byte 71 is not zero"), C.last_error()
        # NULL requests with n > 0 (strata 0.4 says STRATA_INVALID_ARGUMENT, "requests:  is NULL; ...")
        s = c_lookup_batch(None, 2, None)
        assert s in (C.STRATA_NULL_ARGUMENT, C.STRATA_INVALID_ARGUMENT), s
        assert C.last_error().startswith("requests") and "NULL" in C.last_error(), C.last_error()
        del alive


def _zero_size(reqs):
    arr = batch_array(reqs)
    for i in range(len(reqs)):
        c_size_t.from_address(ctypes.addressof(arr.contents) + i * ctypes.sizeof(strata_lookup_request)).value = 0
    return arr
