"""The StrataSparseLookup TensorFlow op (strata_lookup_op.so) against tf.nn.embedding_lookup_sparse
on the same table, on tensorflow-cpu; misses against a NumPy loop.

scripts/tf-tests.sh builds the op and runs this file with $STRATA_TF_OP set to it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

ops = tf.load_op_library(os.environ["STRATA_TF_OP"])
COMBINERS = ("sum", "mean", "sqrtn")


def sparse_lookup(sp_ids, sp_weights=None, **attrs):
    """StrataSparseLookup on SparseTensors, the way embedding_lookup_sparse takes them."""
    weights = [] if sp_weights is None else [sp_weights.values]
    return ops.strata_sparse_lookup(sp_ids.indices, sp_ids.values, sp_ids.dense_shape, weights, **attrs)


@pytest.fixture
def rng():
    return np.random.default_rng(12)


def write_hugectr(d, keys, vec):
    d.mkdir(parents=True, exist_ok=True)
    np.asarray(keys, "<i8").tofile(d / "key")
    np.asarray(vec, "<f4").tofile(d / "emb_vector")


@pytest.fixture
def table(tmp_path, rng):
    """A HugeCTR folder whose keys 0..399 are stored shuffled, and the same table as TF's params
    (params[k] = the row of key k)."""
    rows, dim = 400, 16
    params = rng.standard_normal((rows, dim)).astype(np.float32)
    perm = rng.permutation(rows)
    write_hugectr(tmp_path / "t", perm, params[perm])
    return str(tmp_path / "t"), params


def random_sparse(rng, rows, max_per_row, num_ids, dtype=np.int64, empty=(0, 3, 4)):
    """A [rows, max_per_row] SparseTensor of ids in canonical (row-major) order, with the rows in
    `empty` (and the last row) holding no ids; plus weights of the same indices."""
    idx = []
    for r in range(rows):
        if r in empty or r == rows - 1:
            continue
        cols = np.sort(rng.choice(max_per_row, size=int(rng.integers(1, max_per_row + 1)), replace=False))
        idx += [(r, c) for c in cols]
    idx = np.array(idx, np.int64).reshape(-1, 2)
    ids = rng.integers(0, num_ids, size=len(idx)).astype(dtype)
    w = rng.uniform(0.1, 2.0, size=len(idx)).astype(np.float32)
    shape = [rows, max_per_row]
    return tf.SparseTensor(idx, ids, shape), tf.SparseTensor(idx, w, shape)


def padded(x, rows):
    """embedding_lookup_sparse stops at the last row with ids: trailing empty rows are zeros."""
    x = x.numpy()
    return np.concatenate([x, np.zeros((rows - len(x), x.shape[1]), x.dtype)])


def ref_pooled(params, ids, rows_of, rows, weights, combiner, default):
    """The contract as a loop (float32, in id order); ids outside params contribute `default`."""
    dim = params.shape[1]
    out = np.zeros((rows, dim), np.float32)
    for r in range(rows):
        acc, ws, w2 = np.zeros(dim, np.float32), np.float32(0), np.float32(0)
        for j in np.flatnonzero(rows_of == r):
            w = np.float32(1) if weights is None else np.float32(weights[j])
            k = int(ids[j])
            acc = acc + w * (params[k] if 0 <= k < len(params) else np.full(dim, default, np.float32))
            ws, w2 = np.float32(ws + w), np.float32(w2 + w * w)
        d = ws if combiner == "mean" else np.sqrt(w2) if combiner == "sqrtn" else np.float32(1)
        out[r] = 0 if d == 0 else acc / d
    return out


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_equals_embedding_lookup_sparse(table, rng, combiner, weighted, id_dtype):
    path, params = table
    sp_ids, sp_w = random_sparse(rng, 40, 6, len(params), id_dtype)
    w = sp_w if weighted else None
    got = sparse_lookup(sp_ids, w, combiner=combiner, dim=16, table_dir=path)
    assert got.dtype == tf.float32 and got.shape == (40, 16)
    want = tf.nn.embedding_lookup_sparse(tf.constant(params), sp_ids, w, combiner=combiner)
    np.testing.assert_allclose(got.numpy(), padded(want, 40), rtol=1e-5, atol=1e-6)
    assert not got.numpy()[[0, 3, 4, 39]].any(), "rows without ids are zeros"
    # and bit for bit against the contract's loop
    ref = ref_pooled(params, sp_ids.values.numpy(), sp_ids.indices.numpy()[:, 0], 40,
                     None if w is None else sp_w.values.numpy(), combiner, 0.0)
    np.testing.assert_array_equal(got.numpy(), ref)


def test_default_combiner_is_mean_like_tf(table, rng):
    path, params = table
    sp_ids, _ = random_sparse(rng, 10, 4, len(params))
    got = sparse_lookup(sp_ids, dim=16, table_dir=path)
    want = tf.nn.embedding_lookup_sparse(tf.constant(params), sp_ids, None)  # combiner=None: mean
    np.testing.assert_allclose(got.numpy(), padded(want, 10), rtol=1e-5, atol=1e-6)


def test_three_dimensional_sparse_ids(table, rng):
    """Rank-3 sp_ids: the bag of an id is indices[:, 0], as in embedding_lookup_sparse."""
    path, params = table
    idx = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0], [2, 0, 1], [2, 1, 1]], np.int64)
    ids = np.array([5, 6, 7, 8, 9], np.int64)
    sp = tf.SparseTensor(idx, ids, [3, 2, 2])
    got = sparse_lookup(sp, combiner="sum", dim=16, table_dir=path).numpy()
    np.testing.assert_allclose(got, np.stack([params[5] + params[6] + params[7], np.zeros(16), params[8] + params[9]]),
                               rtol=1e-6)


@pytest.mark.parametrize("out_type", [tf.float16, tf.bfloat16])
def test_half_outputs(table, rng, out_type):
    path, params = table
    sp_ids, sp_w = random_sparse(rng, 20, 5, len(params))
    got = sparse_lookup(sp_ids, sp_w, combiner="sqrtn", dim=16, table_dir=path, out_type=out_type)
    assert got.dtype == out_type
    ref = ref_pooled(params, sp_ids.values.numpy(), sp_ids.indices.numpy()[:, 0], 20, sp_w.values.numpy(), "sqrtn", 0.0)
    want = tf.cast(tf.constant(ref), out_type)  # float32 accumulation, then one rounding to nearest even
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy())


def test_missing_ids_use_the_default_row(table, rng):
    path, params = table
    sp_ids, sp_w = random_sparse(rng, 12, 4, len(params) + 100)  # ids >= 400: not in the table
    ids = sp_ids.values.numpy()
    assert (ids >= 400).any()
    for combiner in COMBINERS:
        got = sparse_lookup(sp_ids, sp_w, combiner=combiner, dim=16, table_dir=path, default_value=0.75)
        ref = ref_pooled(params, ids, sp_ids.indices.numpy()[:, 0], 12, sp_w.values.numpy(), combiner, 0.75)
        np.testing.assert_array_equal(got.numpy(), ref)
    with pytest.raises(tf.errors.NotFoundError, match="STRATA_KEY_NOT_FOUND"):
        sparse_lookup(sp_ids, combiner="sum", dim=16, table_dir=path, missing="error")


def test_zero_weight_totals_give_zeros(table):
    path, params = table
    idx = np.array([[0, 0], [0, 1], [1, 0], [2, 0]], np.int64)
    sp = tf.SparseTensor(idx, np.array([1, 2, 3, 4], np.int64), [3, 2])
    sw = tf.SparseTensor(idx, np.array([1.0, -1.0, 0.0, 2.0], np.float32), [3, 2])
    for combiner in COMBINERS:
        got = sparse_lookup(sp, sw, combiner=combiner, dim=16, table_dir=path).numpy()
        want = tf.nn.embedding_lookup_sparse(tf.constant(params), sp, sw, combiner=combiner).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not sparse_lookup(sp, sw, combiner="mean", dim=16, table_dir=path).numpy()[:2].any()


def test_graph_mode_with_unknown_sizes(table, rng):
    path, params = table

    @tf.function(input_signature=[tf.SparseTensorSpec([None, None], tf.int64), tf.SparseTensorSpec([None, None], tf.float32)])
    def f(sp_ids, sp_w):
        emb = sparse_lookup(sp_ids, sp_w, combiner="mean", dim=16, table_dir=path, num_threads=1)
        assert emb.shape.as_list() == [None, 16]  # the shape function
        return emb

    for rows in (1, 9, 64):
        sp_ids, sp_w = random_sparse(rng, rows, 3, len(params), empty=())
        want = tf.nn.embedding_lookup_sparse(tf.constant(params), sp_ids, sp_w, combiner="mean")
        np.testing.assert_allclose(f(sp_ids, sp_w).numpy(), padded(want, rows), rtol=1e-5, atol=1e-6)
    const = ops.strata_sparse_lookup(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), tf.constant([5, 2], tf.int64),
                                     [], dim=16, table_dir=path)
    assert const.shape == (5, 16) and not const.numpy().any()


def test_server_table_from_ps_json(tmp_path, rng):
    k = rng.permutation(60)
    v = rng.standard_normal((60, 8)).astype(np.float32)
    write_hugectr(tmp_path / "a0", k, v)
    ps = {"supportlonglong": True, "models": [{
        "model": "m", "sparse_files": ["a0"], "embedding_vecsize_per_table": [8],
        "default_value_for_each_table": [0.0], "maxnum_catfeature_query_per_table_per_sample": [4],
        "deployed_device_list": [0], "max_batch_size": 64}]}
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    params = np.empty_like(v)
    params[k] = v
    sp_ids, sp_w = random_sparse(rng, 15, 4, 60)
    got = sparse_lookup(sp_ids, sp_w, combiner="sum", dim=8, ps_config=str(tmp_path / "ps.json"), model="m")
    want = tf.nn.embedding_lookup_sparse(tf.constant(params), sp_ids, sp_w, combiner="sum")
    np.testing.assert_allclose(got.numpy(), padded(want, 15), rtol=1e-5, atol=1e-6)
    # the plain op on the same configuration: one server per configuration in the process
    np.testing.assert_array_equal(
        ops.strata_lookup(tf.constant(k[:5]), dim=8, ps_config=str(tmp_path / "ps.json"), model="m").numpy(), v[:5])


def int8_served(x):
    """What an int8 table serves for float32 rows `x`: FBGEMM's row-wise quantization (in float32),
    then fma(q, scale, bias) rounded once to float32."""
    mn, mx = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    q = np.rint((x - mn) * (np.float32(255) / (mx - mn + np.float32(1e-8)))).astype(np.longdouble)
    scale = ((mx - mn) / np.float32(255)).astype(np.longdouble)
    return (q * scale + mn.astype(np.longdouble)).astype(np.float32)


def test_int8_server_table_from_ps_json(tmp_path, rng):
    """A ps.json table stored as int8 (`strata_storage_per_table`) is served by both ops unchanged:
    rows are the dequantized reference's, bags its contract loop, bit for bit (misses too)."""
    k = rng.permutation(80)
    v = (rng.standard_normal((80, 8)) * 3).astype(np.float32)
    write_hugectr(tmp_path / "a0", k, v)
    ps = {"supportlonglong": True, "models": [{
        "model": "q", "sparse_files": ["a0"], "embedding_vecsize_per_table": [8], "strata_storage_per_table": ["int8"],
        "default_value_for_each_table": [0.5], "maxnum_catfeature_query_per_table_per_sample": [4],
        "deployed_device_list": [0], "max_batch_size": 64}]}
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    params = np.empty_like(v)
    params[k] = int8_served(v)
    assert not np.array_equal(params[k], v)  # int8 rows differ from the float32 ones
    attrs = {"dim": 8, "ps_config": str(tmp_path / "ps.json"), "model": "q"}
    q = np.array([3, 79, 100, 0, 41, -2], np.int64)  # 100 and -2 are missing
    want = np.array([params[i] if 0 <= i < 80 else np.full(8, 0.5, np.float32) for i in q])
    np.testing.assert_array_equal(ops.strata_lookup(tf.constant(q), **attrs).numpy(), want)
    sp_ids, sp_w = random_sparse(rng, 15, 4, 90)  # ids >= 80: not in the table
    ids, rows_of = sp_ids.values.numpy(), sp_ids.indices.numpy()[:, 0]
    for combiner in COMBINERS:
        got = sparse_lookup(sp_ids, sp_w, combiner=combiner, **attrs)
        np.testing.assert_array_equal(got.numpy(), ref_pooled(params, ids, rows_of, 15, sp_w.values.numpy(), combiner, 0.5))


def test_errors(table):
    path, _ = table
    idx = tf.constant([[0, 0], [1, 0], [1, 1]], tf.int64)
    ids = tf.constant([1, 2, 3], tf.int64)
    shape = tf.constant([2, 2], tf.int64)
    kw = dict(dim=16, table_dir=path)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[2, 0\] = 0 after 1; expected the rows of sp_ids in order"):
        ops.strata_sparse_lookup(tf.constant([[0, 0], [1, 0], [0, 1]], tf.int64), ids, shape, [], **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[2, 0\] = 2; expected < dense_shape\[0\] = 2"):
        ops.strata_sparse_lookup(tf.constant([[0, 0], [1, 0], [2, 0]], tf.int64), ids, shape, [], **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"STRATA_INVALID_ARGUMENT: weights: shape \[2\]; expected the keys' shape \[3\]"):
        ops.strata_sparse_lookup(idx, ids, shape, [tf.constant([1.0, 2.0])], **kw)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=r"weights: 2 tensors; expected none or one"):
        ops.strata_sparse_lookup(idx, ids, shape, [tf.ones([3]), tf.ones([3])], **kw)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=r"ids: shape \[2\]; expected \[3\]|Shape must be"):
        ops.strata_sparse_lookup(idx, ids[:2], shape, [], **kw)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=r"dense_shape: shape \[3\]; expected \[2\]"):
        ops.strata_sparse_lookup(idx, ids, tf.constant([2, 2, 2], tf.int64), [], **kw)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="combiner"):
        ops.strata_sparse_lookup(idx, ids, shape, [], combiner="max", **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly one"):
        ops.strata_sparse_lookup(idx, ids, shape, [], dim=16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim"):
        ops.strata_sparse_lookup(idx, ids, shape, [], dim=5, table_dir=path)
