"""26 StrataLookup kernels over one ps.json share one strata server (one volatile tier).

Each StrataLookup kernel opens its table with strata_server_open at construction; strata keeps
one server per configuration per process, so a graph with a lookup per categorical feature (26
in DLRM) holds one server, not 26. The test opens the same ps.json itself through libstrata
(ctypes, the very library the op loaded) and reads strata_table_get_stats through its own handle:
the counters that every kernel's lookups add to are the ones it sees.

scripts/tf-tests.sh builds the op and runs this file with $STRATA_TF_OP set to it.
"""

from __future__ import annotations

import ctypes
import json
import os

import numpy as np
import pytest
import tensorflow as tf

ops = tf.load_op_library(os.environ["STRATA_TF_OP"])

LAYERS = 26
DIM = 8
ROWS = 1000


class TableStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_uint64)
        for name in ("lookups", "keys", "volatile_hits", "persistent_hits", "misses", "evictions", "volatile_rows",
                     "volatile_bytes", "persistent_rows", "upserts", "erases")
    ]


def libstrata():
    """The libstrata the op library loaded (RTLD_NOLOAD: the same copy, never a second one)."""
    for name in [line.split()[-1] for line in open("/proc/self/maps") if "libstrata.so" in line]:
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
            break
        except OSError:
            continue
    else:
        pytest.fail("libstrata.so is not loaded by the op library")
    lib.strata_server_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.strata_server_table.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                        ctypes.POINTER(ctypes.c_void_p)]
    lib.strata_server_free.argtypes = [ctypes.c_void_p]
    lib.strata_server_free.restype = None
    lib.strata_table_get_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(TableStats)]
    lib.strata_last_error.restype = ctypes.c_char_p
    return lib


def stats(lib, table):
    s = TableStats(struct_size=ctypes.sizeof(TableStats))
    assert lib.strata_table_get_stats(table, ctypes.byref(s)) == 0, lib.strata_last_error()
    return s


@pytest.fixture
def ps_json(tmp_path):
    d = tmp_path / "t0"
    d.mkdir()
    keys = np.arange(ROWS, dtype="<i8")
    vec = (keys[:, None] * 0.5 + np.arange(DIM)[None, :]).astype("<f4")
    keys.tofile(d / "key")
    vec.tofile(d / "emb_vector")
    ps = {
        "supportlonglong": True,
        "volatile_db": {"type": "parallel_hash_map", "num_partitions": 2, "initial_cache_rate": 0.0,
                        "cache_missed_embeddings": True},
        "persistent_db": {"type": "rocks_db", "path": "db"},
        "models": [{"model": "dlrm", "sparse_files": ["t0"], "embedding_vecsize_per_table": [DIM],
                    "default_value_for_each_table": [-1.0], "maxnum_catfeature_query_per_table_per_sample": [LAYERS],
                    "deployed_device_list": [0], "max_batch_size": 64}],
    }
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(ps))
    return str(path), vec


def test_26_kernels_share_one_server(ps_json):
    path, vec = ps_json
    lib = libstrata()
    server = ctypes.c_void_p()
    assert lib.strata_server_open(path.encode(), ctypes.byref(server)) == 0, lib.strata_last_error()
    try:
        table = ctypes.c_void_p()
        assert lib.strata_server_table(server, b"dlrm", 0, ctypes.byref(table)) == 0, lib.strata_last_error()
        before = stats(lib, table)

        # 26 StrataLookup nodes, one per feature, as a DLRM graph has: 26 kernels, each opening
        # the ps.json (half of them spelled dir/./ps.json). Control dependencies order them, so
        # the counters below are exact.
        spelled = [path, os.path.join(os.path.dirname(path), ".", "ps.json")]

        @tf.function(input_signature=[tf.TensorSpec([None, LAYERS], tf.int64)])
        def dlrm_embeddings(keys):
            outs = []
            for i in range(LAYERS):
                with tf.control_dependencies(outs[-1:]):
                    outs.append(ops.strata_lookup(keys[:, i], dim=DIM, ps_config=spelled[i % 2], model="dlrm",
                                                  table_id=0))
            return tf.stack(outs, axis=1)

        batch = 4
        keys = np.tile(np.arange(batch, dtype=np.int64)[:, None] * 10 + 100, (1, LAYERS))  # the same 4 keys per layer
        got = dlrm_embeddings(tf.constant(keys)).numpy()
        np.testing.assert_array_equal(got, vec[keys])

        after = stats(lib, table)
        n = LAYERS * batch
        # Every kernel's lookup went to the server this test holds a handle of...
        assert after.lookups - before.lookups == LAYERS
        assert after.keys - before.keys == n
        # ...and to one volatile tier: the first kernel read the 4 rows from the persistent tier
        # and promoted them; the 25 others found them in the same volatile tier. 26 servers would
        # have read them from the persistent tier 26 times, and this handle would count nothing.
        assert after.persistent_hits - before.persistent_hits == batch
        assert after.volatile_hits - before.volatile_hits == n - batch
        assert after.volatile_rows == batch

        # Again: every kernel is served from that one tier.
        dlrm_embeddings(tf.constant(keys))
        again = stats(lib, table)
        assert again.lookups - after.lookups == LAYERS
        assert again.volatile_hits - after.volatile_hits == n and again.persistent_hits == after.persistent_hits
    finally:
        lib.strata_server_free(server)
