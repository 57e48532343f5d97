"""The fast path of ``strata.lookup`` (python/src/strata/_fast.py): plain host calls with ``out``
given, from NumPy arrays (one versioned capsule each) and PyTorch tensors (DLPack 1.3's
``__dlpack_c_exchange_api__``, no capsule).

Each case checks that the call really went the fast way (the general path is made to fail), that
the rows equal NumPy indexing in a poisoned output, and that refusals raise what the general path
raises, naming the argument, with ``out`` untouched. PyTorch cases skip when torch is missing.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from test_ctypes import LIB_PATH, package_library

if package_library() is None:
    os.environ.setdefault("STRATA_LIBRARY", LIB_PATH)

import strata  # noqa: E402
from strata import _core, _fast  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

NEEDS_TORCH = pytest.mark.skipif(torch is None, reason="skipped: PyTorch is not installed (pip install torch)")
HAS_EXCHANGE_API = torch is not None and hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


@pytest.fixture
def rng():
    return np.random.default_rng(20261201)


@pytest.fixture
def fast_only(monkeypatch):
    """Makes the general path fail, so a call that succeeds went the fast way."""

    def general(*a, **k):
        raise AssertionError("the general path was taken")

    monkeypatch.setattr(_core, "_lookup", general)


@pytest.fixture
def table(rng):
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    keys = rng.choice(5000, 300, replace=False).astype(np.int64)
    with strata.Table.from_array(vectors, keys, default_value=-1.25) as t:
        yield t, vectors, keys


def reference(vectors, table_keys, keys, default=-1.25):
    row = {int(k): i for i, k in enumerate(table_keys)}
    flat = [int(k) for k in np.asarray(keys).reshape(-1)]
    out = np.stack([vectors[row[k]] if k in row else np.full(vectors.shape[1], default, np.float32) for k in flat])
    return out.reshape(*np.asarray(keys).shape, vectors.shape[1])


def some_keys(rng, table_keys, n, dtype=np.int64):
    k = np.concatenate([rng.choice(table_keys, n - n // 4), rng.integers(5000, 9000, n // 4)]).astype(dtype)
    rng.shuffle(k)
    return k


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64, np.uint32, np.uint64])
@pytest.mark.parametrize("num_threads", [None, 1, 2])
def test_numpy_calls_go_the_fast_way(fast_only, table, rng, key_dtype, num_threads):
    t, vectors, table_keys = table
    keys = some_keys(rng, table_keys, 64, key_dtype)
    out = np.full((64, 16), np.nan, np.float32)
    assert strata.lookup(t, keys, out=out, num_threads=num_threads) is out
    assert np.array_equal(out, reference(vectors, table_keys, keys))
    # Strided keys, 2-D keys with a [*keys.shape, dim] out, through the Table method.
    k2 = some_keys(rng, table_keys, 48)[::2].reshape(4, 6)
    out2 = np.full((4, 6, 16), np.nan, np.float32)
    assert t.lookup(k2, out=out2, num_threads=num_threads) is out2
    assert np.array_equal(out2, reference(vectors, table_keys, k2))


@NEEDS_TORCH
@pytest.mark.skipif(not HAS_EXCHANGE_API, reason="skipped: this PyTorch has no __dlpack_c_exchange_api__")
@pytest.mark.parametrize("mix", ["torch/torch", "numpy/torch", "torch/numpy"])
def test_torch_calls_go_the_fast_way(fast_only, table, rng, mix):
    t, vectors, table_keys = table
    keys_np = some_keys(rng, table_keys, 64)
    keys = torch.from_numpy(keys_np.copy()) if mix.startswith("torch") else keys_np
    out = torch.full((64, 16), float("nan")) if mix.endswith("torch") else np.full((64, 16), np.nan, np.float32)
    assert strata.lookup(t, keys, out=out, num_threads=1) is out
    got = out.numpy() if mix.endswith("torch") else out
    assert np.array_equal(got, reference(vectors, table_keys, keys_np))
    # A transposed (non-contiguous) key tensor and a strided out view.
    k2 = torch.from_numpy(some_keys(rng, table_keys, 24).reshape(4, 6)).t()
    big = torch.full((6, 4, 32), float("nan"))
    view = big[:, :, ::2]
    strata.lookup(t, k2, out=view, num_threads=1)
    assert np.array_equal(view.numpy(), reference(vectors, table_keys, k2.numpy()))
    assert torch.isnan(big[:, :, 1::2]).all(), "nothing outside out is written"


@NEEDS_TORCH
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_outputs(fast_only, table, rng, dtype):
    if not HAS_EXCHANGE_API:
        pytest.skip("skipped: this PyTorch has no __dlpack_c_exchange_api__")
    t, vectors, table_keys = table
    keys = torch.from_numpy(some_keys(rng, table_keys, 64))
    out = torch.full((64, 16), float("nan"), dtype=getattr(torch, dtype))
    strata.lookup(t, keys, out=out)
    want = torch.from_numpy(reference(vectors, table_keys, keys.numpy())).to(getattr(torch, dtype))
    assert torch.equal(out, want)


def test_refusals_on_the_fast_path_match_the_general_path(table, rng):
    t, vectors, table_keys = table
    keys = some_keys(rng, table_keys, 8)
    cases = [
        (keys.astype(np.float32), np.full((8, 16), np.nan, np.float32), strata.UnsupportedDtype, "keys"),
        (keys, np.full((8, 15), np.nan, np.float32), strata.InvalidArgument, "out"),
        (keys, np.full((8, 16), np.nan, np.float64), strata.UnsupportedDtype, "out"),
    ]
    ro = np.full((8, 16), np.nan, np.float32)
    ro.flags.writeable = False
    cases.append((keys, ro, strata.ReadOnly, "out"))
    for k, out, exc, arg in cases:
        before = out.copy()
        with pytest.raises(exc) as e:
            strata.lookup(t, k, out=out, num_threads=1)
        assert e.value.message.startswith(arg), e.value.message
        assert np.array_equal(out, before, equal_nan=True), "a refused call leaves out as it was"
    with strata.Table.from_array(vectors, table_keys, missing="error") as strict:
        out = np.full((2, 16), np.nan, np.float32)
        with pytest.raises(strata.KeyNotFound):
            strict.lookup(np.array([table_keys[0], 9999]), out=out, num_threads=1)
    closed = strata.Table.from_array(vectors)
    closed.close()
    with pytest.raises(strata.NullArgument, match="closed"):
        strata.lookup(closed, keys, out=np.zeros((8, 16), np.float32))


@NEEDS_TORCH
def test_torch_refusals_keep_their_messages(table, rng):
    t, _, table_keys = table
    keys = torch.from_numpy(some_keys(rng, table_keys, 8))
    out = torch.zeros((8, 16), requires_grad=True)
    with pytest.raises(strata.InvalidArgument, match="gradient") as e:  # PyTorch's refusal, via the general path
        strata.lookup(t, keys, out=out)
    assert e.value.message.startswith("out")
    with pytest.raises(strata.UnsupportedDtype, match="^keys"):
        strata.lookup(t, keys.float(), out=torch.zeros(8, 16))


def test_threads_share_a_table(table, rng):
    t, vectors, table_keys = table
    makers = [lambda k: k, lambda k: k.astype(np.int32)]
    if torch is not None:
        makers.append(lambda k: torch.from_numpy(k.copy()))
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for i in range(200):
                k = some_keys(r, table_keys, 32)
                keys = makers[i % len(makers)](k)
                out = np.full((32, 16), np.nan, np.float32) if i % 2 else (
                    torch.full((32, 16), float("nan")) if torch is not None else np.full((32, 16), np.nan, np.float32))
                strata.lookup(t, keys, out=out, num_threads=1)
                got = out if isinstance(out, np.ndarray) else out.numpy()
                assert np.array_equal(got, reference(vectors, table_keys, k))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]


def test_a_busy_scratch_is_not_reused(table, rng):
    """A lookup re-entered on one thread (a signal handler between describing the tensors and the
    call) gets its own DLTensors instead of overwriting the outer call's."""
    t, vectors, table_keys = table
    if torch is None or not HAS_EXCHANGE_API:
        pytest.skip("skipped: needs PyTorch with __dlpack_c_exchange_api__")
    k = some_keys(rng, table_keys, 16)
    strata.lookup(t, torch.from_numpy(k.copy()), out=torch.zeros(16, 16))
    scratch = _fast._local.scratch
    scratch.busy = True
    try:
        out = torch.full((16, 16), float("nan"))
        strata.lookup(t, torch.from_numpy(k.copy()), out=out)
        assert np.array_equal(out.numpy(), reference(vectors, table_keys, k))
        assert _fast._local.scratch is scratch and scratch.busy
    finally:
        scratch.busy = False
