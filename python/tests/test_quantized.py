"""Quantized tables (``storage="int8"``/``"int4"``): FBGEMM's fused row-wise layouts.

A NumPy reference quantizer (FBGEMM's formulas, in float32) gives the bytes every row must hold;
lookups must return ``q * scale + bias`` rounded once (FBGEMM dequantizes with a fused
multiply-add; the reference computes it in extended precision and rounds once to float32), and
pooled lookups the contract's float32 sum of those values in key order. Outputs are poisoned
first. Rows quantized by the reference are also handed over as uint8 tensors, copied and
adopted. Where PyTorch with fbgemm_gpu is installed, FBGEMM's own quantizers and dequantizers
are the reference too.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_ctypes import LIB_PATH, package_library

if package_library() is None:
    os.environ.setdefault("STRATA_LIBRARY", LIB_PATH)

import strata  # noqa: E402


def quantize_int8(x: np.ndarray) -> np.ndarray:
    """FBGEMM's FloatToFused8BitRowwiseQuantized: [rows, dim + 8] uint8."""
    x = x.astype(np.float32)
    mn = x.min(axis=1, keepdims=True)
    mx = x.max(axis=1, keepdims=True)
    rng = (mx - mn).astype(np.float32)
    scale = (rng / np.float32(255.0)).astype(np.float32)
    inv = (np.float32(255.0) / (rng + np.float32(1e-8))).astype(np.float32)
    q = (np.rint(((x - mn) * inv).astype(np.float32)).astype(np.int64) & 255).astype(np.uint8)
    tail = np.concatenate([scale, mn], axis=1).astype("<f4").view(np.uint8)
    return np.ascontiguousarray(np.concatenate([q, tail], axis=1))


def quantize_int4(x: np.ndarray) -> np.ndarray:
    """FBGEMM's FloatToFusedNBitRowwiseQuantizedSBHalf with 4 bits: [rows, dim / 2 + 4] uint8."""
    x = x.astype(np.float32)
    out = []
    for row in x:
        bias16 = np.float16(row.min())
        mn = np.float32(bias16)
        rng = np.float32(row.max() - mn)
        scale = np.float32(np.float16(np.float32(1.0) if rng == 0 else np.float32(rng / np.float32(15.0))))
        if scale == 0:
            scale = np.float32(1.0)
        with np.errstate(divide="ignore", over="ignore"):
            inv = np.float32(np.float32(1.0) / scale)
        if np.isinf(inv):
            scale, inv = np.float32(1.0), np.float32(1.0)
        q = np.clip(np.rint(((row - mn) * inv).astype(np.float32)), 0, 15).astype(np.uint8)
        packed = q[0::2] | (q[1::2] << 4)
        tail = np.array([np.float16(scale), bias16], dtype="<f2").view(np.uint8)
        out.append(np.concatenate([packed, tail]))
    return np.stack(out)


def dequantize(q: np.ndarray, storage: str, dim: int) -> np.ndarray:
    """fma(q, scale, bias) per value, rounded once to float32."""
    if storage == "fp8":
        e = q[:, :dim]
        mag = e4m3_values()[np.minimum(e & 0x7F, 0x7E)]
        vals = np.where(e & 0x80, -mag, mag).astype(np.float32)
        scale = np.ascontiguousarray(q[:, dim : dim + 4]).view("<f4")
        return (vals * scale).astype(np.float32)
    if storage == "int8":
        vals = q[:, :dim].astype(np.longdouble)
        sb = np.ascontiguousarray(q[:, dim : dim + 8]).view("<f4").astype(np.longdouble)
    else:
        b = q[:, : dim // 2]
        vals = np.empty((q.shape[0], dim), dtype=np.longdouble)
        vals[:, 0::2] = b & 15
        vals[:, 1::2] = b >> 4
        sb = np.ascontiguousarray(q[:, dim // 2 : dim // 2 + 4]).view("<f2").astype(np.longdouble)
    return (vals * sb[:, :1] + sb[:, 1:2]).astype(np.float32)


def e4m3_values() -> np.ndarray:
    """The 127 non-negative finite float8 e4m3fn values, by code 0..0x7E."""
    codes = np.arange(0x7F)
    e, m = codes >> 3, (codes & 7).astype(np.float64)
    return np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e - 7))


def quantize_fp8(x: np.ndarray) -> np.ndarray:
    """strata's fp8 rows: e4m3fn(x / scale), scale = max |x| / 448, nearest code (ties to the
    even code), then the float32 scale: [rows, dim + 4] uint8."""
    x = x.astype(np.float32)
    amax = np.abs(x).max(axis=1, keepdims=True)
    scale = np.where(amax == 0, np.float32(1), (amax / np.float32(448)).astype(np.float32)).astype(np.float32)
    a = np.abs((x / scale).astype(np.float32)).astype(np.float64)
    vals = e4m3_values()
    hi = np.clip(np.searchsorted(vals, a), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - vals[lo], vals[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= vals[0x7E], 0x7E, code).astype(np.uint8) | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.ascontiguousarray(np.concatenate([code, scale.astype("<f4").view(np.uint8)], axis=1))


QUANTIZE = {"int8": quantize_int8, "int4": quantize_int4, "fp8": quantize_fp8}


def random_rows(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((rows, dim)).astype(np.float32) * rng.uniform(0.01, 30.0, size=(rows, 1)).astype(np.float32)
    x[3] = 1.25  # a constant row: range 0
    x[5, :] = np.linspace(-60000.0, 60000.0, dim, dtype=np.float32)  # wide, within float16
    return x


def pooled_reference(vals: np.ndarray, keys: np.ndarray, offsets: np.ndarray, weights, pooling: str) -> np.ndarray:
    out = np.zeros((len(offsets) - 1, vals.shape[1]), dtype=np.float32)
    for b in range(len(offsets) - 1):
        acc = np.zeros(vals.shape[1], dtype=np.float32)
        ws = np.float32(0)
        for i in range(offsets[b], offsets[b + 1]):
            w = np.float32(1) if weights is None else weights[i]
            acc = (acc + (w * vals[keys[i]]).astype(np.float32)).astype(np.float32)
            ws = np.float32(ws + w)
        if pooling == "mean":
            acc = np.zeros_like(acc) if ws == 0 else (acc / ws).astype(np.float32)
        out[b] = acc
    return out


@pytest.mark.parametrize("storage", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("dim", [8, 32, 64, 100, 128, 256])
def test_quantized_at_build_matches_the_reference(storage, dim):
    rng = np.random.default_rng(dim * 7 + len(storage))
    x = random_rows(rng, 257, dim)
    q = QUANTIZE[storage](x)
    want = dequantize(q, storage, dim)
    t = strata.Table.from_array(x, storage=storage)
    info = t.info
    assert (info.storage, info.dtype, info.rows, info.dim) == (storage, "uint8", 257, dim)
    assert info.vector_bytes == 257 * q.shape[1]
    keys = rng.integers(0, 257, size=3000).astype(np.int64)
    out = np.full((3000, dim), np.nan, dtype=np.float32)
    t.lookup(keys, out)
    np.testing.assert_array_equal(out, want[keys])
    # Narrower outputs: the dequantized float32 value, rounded once.
    np.testing.assert_array_equal(t.lookup(keys, dtype="float16"), want[keys].astype(np.float16))
    # Pooled, with and without weights, sum and mean, ragged bags with empty ones.
    lengths = rng.integers(0, 30, size=200)
    lengths[::17] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    bag_keys = rng.integers(0, 257, size=int(offsets[-1])).astype(np.int64)
    w = rng.uniform(-2, 2, size=bag_keys.size).astype(np.float32)
    for weights in (None, w):
        for pooling in ("sum", "mean"):
            got = np.full((200, dim), np.nan, dtype=np.float32)
            t.lookup_pooled(bag_keys, offsets, weights, pooling, out=got)
            np.testing.assert_array_equal(got, pooled_reference(want, bag_keys, offsets, weights, pooling))
    t.close()


@pytest.mark.parametrize("storage", ["int8", "int4", "fp8"])
def test_quantized_rows_are_taken_as_given_copied_and_adopted(storage):
    rng = np.random.default_rng(5)
    dim = 64
    x = random_rows(rng, 100, dim)
    q = QUANTIZE[storage](x)
    want = dequantize(q, storage, dim)
    keys = rng.integers(0, 100, size=500).astype(np.int64)
    for copy in (True, False):
        t = strata.Table.from_array(q.copy(), storage=storage, copy=copy)
        assert t.info.adopted == (not copy) and t.dim == dim and t.info.storage == storage
        np.testing.assert_array_equal(t.lookup(keys), want[keys])
        t.close()
    # Keyed tables, and missing keys get the default row.
    ids = rng.permutation(10_000)[:100].astype(np.int64)
    t = strata.Table.from_array(q, ids, default_value=-3.0, storage=storage)
    ask = np.concatenate([ids[keys[:50]], [10_001, 20_002]])
    got = t.lookup(ask)
    np.testing.assert_array_equal(got[:50], want[keys[:50]])
    assert (got[50:] == -3.0).all()
    pooled = t.lookup_pooled(ask, np.array([0, 25, 52], dtype=np.int64))
    np.testing.assert_array_equal(pooled[1], pooled_reference(np.vstack([want, np.full((1, dim), -3.0, np.float32)]),
                                                              np.concatenate([keys[25:50], [100, 100]]),
                                                              np.array([0, 27]), None, "sum")[0])


def test_bad_quantized_input_is_refused_with_its_argument():
    x = np.ones((4, 6), dtype=np.float32)
    x[2, 3] = np.nan
    with pytest.raises(strata.InvalidArgument, match=r"vectors.*row 2.*column 3"):
        strata.Table.from_array(x, storage="int8")
    with pytest.raises(strata.InvalidArgument, match=r"vectors.*even dim"):
        strata.Table.from_array(np.ones((4, 5), dtype=np.float32), storage="int4")
    with pytest.raises(strata.InvalidArgument, match=r"vectors.*65504"):
        strata.Table.from_array(np.array([[0.0, 1e6]], dtype=np.float32), storage="int4")
    with pytest.raises(strata.InvalidArgument, match=r"vectors.*shape\[1\] = 8"):
        strata.Table.from_array(np.zeros((4, 8), dtype=np.uint8), storage="int8")
    with pytest.raises(strata.StrataError, match=r"vectors.*uint8"):
        strata.Table.from_array(np.zeros((4, 8), dtype=np.uint8))
    with pytest.raises(strata.InvalidArgument, match=r"storage"):
        strata.Table.from_array(np.ones((4, 8), dtype=np.float32), storage="int2")
    with pytest.raises(strata.InvalidArgument, match=r"opts->storage.*adopting"):
        strata.Table.from_array(np.ones((4, 8), dtype=np.float32), storage="int8", copy=False)
    t = strata.Table.from_array(np.ones((4, 8), dtype=np.float32), storage="int8")
    with pytest.raises(strata.StrataError, match="immutable|upsert"):
        t.upsert(np.array([1], dtype=np.int64), np.ones((1, 8), dtype=np.float32))
    t.close()


def test_float_conversion_at_build():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((50, 16)).astype(np.float32)
    t = strata.Table.from_array(x, storage="float16")
    assert t.info.dtype == "float16" and t.info.vector_bytes == 50 * 16 * 2
    np.testing.assert_array_equal(t.lookup(np.arange(50)), x.astype(np.float16).astype(np.float32))


def test_fp8_rows_are_pytorchs_float8_e4m3fn():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    rng = np.random.default_rng(31)
    x = random_rows(rng, 200, 64)
    q = quantize_fp8(x)
    scale = torch.from_numpy(np.ascontiguousarray(q[:, 64:]).view("<f4").copy())
    e = (torch.from_numpy(x) / scale).to(torch.float8_e4m3fn)
    np.testing.assert_array_equal(e.view(torch.uint8).numpy(), q[:, :64])
    t = strata.Table.from_array(x, storage="fp8")
    np.testing.assert_array_equal(t.lookup(np.arange(200)), (e.float() * scale).numpy())


def test_fbgemm_quantizers_and_dequantizers_agree():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    pytest.importorskip("fbgemm_gpu", reason="fbgemm_gpu is not installed here")
    rng = np.random.default_rng(21)
    for dim in (8, 64, 128, 200):
        x = random_rows(rng, 300, dim)
        xt = torch.from_numpy(x)
        q8 = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(xt).numpy()
        np.testing.assert_array_equal(q8, quantize_int8(x))
        q4 = torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(xt, 4).numpy()
        np.testing.assert_array_equal(q4, quantize_int4(x))
        keys = np.arange(300)
        t8 = strata.Table.from_array(x, storage="int8")
        np.testing.assert_array_equal(t8.lookup(keys), torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(torch.from_numpy(q8)).numpy())
        t4 = strata.Table.from_array(torch.from_numpy(q4), storage="int4", copy=False)
        want4 = torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(torch.from_numpy(q4), 4).numpy()
        np.testing.assert_array_equal(t4.lookup(keys), want4)
