"""strata.jax: the XLA FFI handlers of libstrata_jax.so (c_examples/jax/strata_jax.cc) under
jax.jit and jax.vmap on the CPU platform, against NumPy on random tables; errors; a freed table
used from a compiled function. ``STRATA_JAX_LIBRARY`` names the library
(scripts/framework-tests.sh builds it)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'strata[jax]')")
if not os.environ.get("STRATA_JAX_LIBRARY"):
    pytest.skip("STRATA_JAX_LIBRARY is not set (scripts/framework-tests.sh builds it)", allow_module_level=True)
import jax.numpy as jnp  # noqa: E402

import strata  # noqa: E402
import strata.jax as sj  # noqa: E402

jax.config.update("jax_enable_x64", True)
#: What a failed custom call raises: JaxRuntimeError (a RuntimeError); jit's C++ dispatch path
#: turns XLA's INVALID_ARGUMENT into ValueError.
RUNTIME = (jax.errors.JaxRuntimeError, ValueError)


def ref_pooled(vec, keys, offsets, weights, pooling):
    """The contract as a loop: float32 accumulation in key order, then / sum w or / sqrt(sum w^2)."""
    out = np.zeros((len(offsets) - 1, vec.shape[1]), np.float32)
    for b in range(len(offsets) - 1):
        seg = slice(offsets[b], offsets[b + 1])
        w = np.ones(seg.stop - seg.start, np.float32) if weights is None else weights[seg]
        acc = np.zeros(vec.shape[1], np.float32)
        for kk, ww in zip(keys[seg], w):
            acc += np.float32(ww) * vec[kk]
        total = w.sum(dtype=np.float32) if pooling == "mean" else np.sqrt((w * w).sum(dtype=np.float32))
        if pooling != "sum":
            acc = acc / total if total != 0 else np.zeros_like(acc)
        out[b] = acc
    return out


def test_lookup_jit_and_vmap(rng):
    keys = rng.choice(10**12, size=500, replace=False).astype(np.int64)
    vec = rng.standard_normal((500, 12)).astype(np.float32)
    t = strata.Table.from_array(vec, keys, default_value=0.25)
    index = {int(k): i for i, k in enumerate(keys)}

    def ref(q):
        flat = [vec[index[int(k)]] if int(k) in index else np.full(12, 0.25, np.float32) for k in q.reshape(-1)]
        return np.stack(flat).reshape(*q.shape, 12)

    f = jax.jit(lambda k: sj.lookup(t, k))
    for shape in ((33,), (4, 9), (2, 3, 5)):
        q = rng.choice(keys, size=shape)
        q.reshape(-1)[0] = 10**12 + 1  # a miss
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(q))), ref(q))
    q = rng.choice(keys, size=(6, 7))
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda k: sj.lookup(t, k))(jnp.asarray(q))), ref(q))
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(lambda k: sj.lookup(t, k), in_axes=1))(q)),
                                  ref(q.T))
    # int32 keys into a dense table, reduced output dtypes
    dense = strata.Table.from_array(vec)
    k32 = rng.integers(0, 500, size=40).astype(np.int32)
    for dt in (jnp.float16, jnp.bfloat16):
        got = jax.jit(lambda k: sj.lookup(dense, k, dtype=dt))(k32)
        assert got.dtype == dt
        np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(jnp.asarray(vec[k32]).astype(dt).astype(jnp.float32)))
    # the result feeds ordinary JAX code in the same compiled function
    g = jax.jit(lambda k: jnp.tanh(sj.lookup(dense, k)).sum(-1))
    np.testing.assert_allclose(np.asarray(g(k32)), np.tanh(vec[k32]).sum(-1), rtol=1e-5)


def test_lookup_pooled_jit_and_vmap(rng):
    vec = rng.standard_normal((90, 8)).astype(np.float32)
    t = strata.Table.from_array(vec)
    lens = rng.integers(0, 6, size=20)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    keys = rng.integers(0, 90, size=int(offsets[-1]))
    w = rng.uniform(0.1, 2.0, size=keys.shape).astype(np.float32)
    for pooling in ("sum", "mean", "sqrtn"):
        for weights in (None, w):
            f = jax.jit(lambda k, o, ww, p=pooling: sj.lookup_pooled(t, k, o, ww, p))
            got = np.asarray(f(keys, offsets, weights))
            np.testing.assert_allclose(got, ref_pooled(vec, keys, offsets, weights, pooling), rtol=1e-6, atol=1e-6)
    # fixed hotness, batched by vmap
    k3 = rng.integers(0, 90, size=(3, 5, 4))
    got = np.asarray(jax.vmap(lambda k: sj.lookup_pooled(t, k, pooling="mean"))(k3))
    want = np.stack([ref_pooled(vec, k.reshape(-1), np.arange(0, 21, 4), None, "mean") for k in k3])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_errors(rng):
    t = strata.Table.from_array(np.ones((5, 2), np.float32))
    with pytest.raises(TypeError, match="keys: dtype float32"):
        sj.lookup(t, jnp.ones(3, jnp.float32))
    with pytest.raises(ValueError, match="pooling"):
        sj.lookup_pooled(t, jnp.array([[1]]), pooling="max")
    with pytest.raises(RUNTIME, match="offsets: offsets.0. = 1; expected 0"):
        jax.block_until_ready(sj.lookup_pooled(t, jnp.array([1, 2]), jnp.array([1, 2])))
    with pytest.raises(RUNTIME, match="weights"):
        jax.block_until_ready(sj.lookup_pooled(t, jnp.array([[1, 2]]), weights=jnp.ones(2, jnp.float32)))
    strict = strata.Table.from_array(np.ones((3, 2), np.float32), np.array([5, 6, 7]), missing="error")
    with pytest.raises(RUNTIME, match="key 8") as e:
        jax.block_until_ready(jax.jit(lambda k: sj.lookup(strict, k))(jnp.array([5, 8])))
    assert "key" in str(e.value).lower()


def test_freed_table_raises_from_compiled_function(rng):
    vec = rng.standard_normal((10, 4)).astype(np.float32)
    t = strata.Table.from_array(vec)
    f = jax.jit(lambda k: sj.lookup(t, k) + 1)
    k = jnp.array([3, 1])
    np.testing.assert_array_equal(np.asarray(f(k)), vec[[3, 1]] + 1)
    serial = t.serial
    t.close()
    with pytest.raises(RUNTIME, match=f"handle {serial} names no table"):
        jax.block_until_ready(f(k))
    with pytest.raises(ValueError, match="closed"):
        sj.lookup(t, k)  # tracing again refuses at once


def test_server_table_closes_with_its_server(tmp_path, rng):
    import json

    (tmp_path / "t").mkdir()
    np.arange(6, dtype=np.int64).tofile(tmp_path / "t" / "key")
    vec = rng.standard_normal((6, 4)).astype(np.float32)
    vec.tofile(tmp_path / "t" / "emb_vector")
    ps = {"supportlonglong": True, "models": [{"model": "m", "sparse_files": ["t"], "embedding_vecsize_per_table": [4],
          "default_value_for_each_table": [0.0], "maxnum_catfeature_query_per_table_per_sample": [1],
          "deployed_device_list": [0], "max_batch_size": 64}]}
    server = strata.Server.from_json(json.dumps(ps), tmp_path)
    f = jax.jit(lambda k: sj.lookup(server.table("m", 0), k))
    np.testing.assert_array_equal(np.asarray(f(jnp.array([5, 0]))), vec[[5, 0]])
    server.close()
    with pytest.raises(RUNTIME, match="names no table"):
        jax.block_until_ready(f(jnp.array([5, 0])))


def test_cuda_handlers_registered():
    sj.load_library()
    assert sj.cuda_registered, "jax.ffi.register_ffi_target(..., platform='CUDA') refused the handlers"


def test_import_error_names_the_extra():
    code = "import sys; sys.modules['jax'] = None\ntry:\n import strata.jax\nexcept ImportError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'strata[jax]'" in out


def test_handlers_built_on_first_use(tmp_path):
    """Without STRATA_JAX_LIBRARY, strata.jax compiles the shipped handler source against this
    jaxlib's headers into STRATA_JAX_BUILD_DIR once, and reuses it."""
    code = ("import numpy as np, jax.numpy as jnp, strata, strata.jax as sj\n"
            "t = strata.Table.from_array(np.arange(6, dtype=np.float32).reshape(3, 2))\n"
            "print(sj.lookup(t, jnp.array([2, 0])).tolist())")
    env = {k: v for k, v in os.environ.items() if k != "STRATA_JAX_LIBRARY"}
    env["STRATA_JAX_BUILD_DIR"] = str(tmp_path / "build")
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "[[4.0, 5.0], [0.0, 1.0]]"
    assert (tmp_path / "build" / "libstrata_jax.so").exists()
