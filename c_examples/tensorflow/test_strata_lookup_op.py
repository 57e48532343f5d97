"""The StrataLookup TensorFlow op (strata_lookup_op.so), on tensorflow-cpu, against NumPy indexing.

scripts/tf-tests.sh builds the op and runs this file with $STRATA_TF_OP set to it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

ops = tf.load_op_library(os.environ["STRATA_TF_OP"])


@pytest.fixture
def rng():
    return np.random.default_rng(6)


def write_hugectr(d, keys, vec):
    d.mkdir(parents=True, exist_ok=True)
    np.asarray(keys, "<i8").tofile(d / "key")
    np.asarray(vec, "<f4").tofile(d / "emb_vector")


def expected(table_keys, vec, keys, default):
    index = {int(k): i for i, k in enumerate(table_keys)}
    flat = np.asarray(keys).reshape(-1)
    out = np.array([vec[index[int(k)]] if int(k) in index else np.full(vec.shape[1], default, np.float32)
                    for k in flat], np.float32)
    return out.reshape(*np.shape(keys), vec.shape[1])


@pytest.fixture
def folder(tmp_path, rng):
    keys = rng.choice(10**9, size=500, replace=False).astype(np.int64)
    vec = rng.standard_normal((500, 16)).astype(np.float32)
    write_hugectr(tmp_path / "t", keys, vec)
    return str(tmp_path / "t"), keys, vec


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_lookup_from_a_hugectr_folder(folder, rng, key_dtype):
    path, keys, vec = folder
    small = keys % (2**31 - 1) if key_dtype == tf.int32 else keys
    if key_dtype == tf.int32:  # int32 keys: a table whose keys fit
        write_hugectr(__import__("pathlib").Path(path + "32"), small, vec)
        path = path + "32"
    q = np.concatenate([small[rng.integers(0, 500, size=60)], [12345]]).reshape(61, 1)
    got = ops.strata_lookup(tf.constant(q, dtype=key_dtype), dim=16, table_dir=path, default_value=-0.5)
    assert got.dtype == tf.float32 and got.shape == (61, 1, 16)
    np.testing.assert_array_equal(got.numpy(), expected(small, vec, q, -0.5))


@pytest.mark.parametrize("out_type", [tf.float16, tf.bfloat16])
def test_half_outputs(folder, rng, out_type):
    path, keys, vec = folder
    q = keys[rng.integers(0, 500, size=40)]
    got = ops.strata_lookup(tf.constant(q), dim=16, table_dir=path, out_type=out_type)
    assert got.dtype == out_type
    want = tf.cast(tf.constant(expected(keys, vec, q, 0.0)), out_type)  # TF rounds to nearest even too
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy())


def test_graph_mode_with_unknown_batch_and_threads(folder, rng):
    path, keys, vec = folder

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def f(k):
        rows = ops.strata_lookup(k, dim=16, table_dir=path, num_threads=1)
        assert rows.shape.as_list() == [None, 3, 16]  # the shape function
        return rows

    for n in (1, 7, 100):
        q = keys[rng.integers(0, 500, size=(n, 3))]
        np.testing.assert_array_equal(f(tf.constant(q)).numpy(), expected(keys, vec, q, 0.0))


def test_server_table_from_ps_json(tmp_path, rng):
    tables = {}
    for name, dim in (("a0", 8), ("a1", 4)):
        k = rng.choice(10**6, size=50, replace=False)
        v = rng.standard_normal((50, dim)).astype(np.float32)
        write_hugectr(tmp_path / name, k, v)
        tables[name] = (k, v)
    ps = {"supportlonglong": True, "models": [{
        "model": "m", "sparse_files": ["a0", "a1"], "embedding_vecsize_per_table": [8, 4],
        "default_value_for_each_table": [0.0, 2.0], "maxnum_catfeature_query_per_table_per_sample": [1, 1],
        "deployed_device_list": [0], "max_batch_size": 64}]}
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    k, v = tables["a1"]
    q = np.concatenate([k[:20], [-7]])
    got = ops.strata_lookup(tf.constant(q), dim=4, ps_config=str(tmp_path / "ps.json"), model="m", table_id=1)
    np.testing.assert_array_equal(got.numpy(), expected(k, v, q, 2.0))


def test_errors_carry_strata_messages(folder, tmp_path):
    path, keys, vec = folder
    with pytest.raises(tf.errors.NotFoundError, match="STRATA_KEY_NOT_FOUND.*key 5"):
        ops.strata_lookup(tf.constant([int(keys[0]), 5]), dim=16, table_dir=path, missing="error")
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim"):
        ops.strata_lookup(tf.constant([1]), dim=5, table_dir=path)  # 500 x 16 floats are not rows of 5
    with pytest.raises(tf.errors.NotFoundError, match="STRATA_IO_ERROR"):
        ops.strata_lookup(tf.constant([1]), dim=16, table_dir=str(tmp_path / "absent"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly one"):
        ops.strata_lookup(tf.constant([1]), dim=16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="STRATA_CONFIG_ERROR|STRATA_IO_ERROR"):
        (tmp_path / "bad.json").write_text("{}")
        ops.strata_lookup(tf.constant([1]), dim=16, ps_config=str(tmp_path / "bad.json"), model="m")
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
        ops.strata_lookup(tf.constant([1.0]), dim=16, table_dir=path)  # float keys: refused by the op's attr
