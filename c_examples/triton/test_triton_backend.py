"""The strata Triton backend (libtriton_strata.so) in a real tritonserver 2.51 on CPU.

One server for the module (explicit model control, 127.0.0.1, free ports) over a repository this
file writes: HugeCTR sparse folders, an HPS ps.json given with --backend-config=strata,ps=...,
hps_backend-style models (KEYS, NUMKEYS, OUTPUT0) and native models (plain, pooled with weights,
ragged with offsets; FP32, FP16 and BF16 outputs). Every output is compared with strata.lookup /
strata.lookup_pooled on the same files and with a NumPy reference. scripts/triton-tests.sh runs it
with $STRATA_TRITON_BACKEND_DIR set to the folder holding strata/libtriton_strata.so.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import ml_dtypes
import numpy as np
import pytest
import strata
import tritonclient.grpc as grpc
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

import harness as h

BACKEND_DIR = Path(os.environ["STRATA_TRITON_BACKEND_DIR"])
DIMS = {"t0": 16, "t1": 8, "t2": 32, "r1": 4}
ROWS = {"t0": 1000, "t1": 500, "t2": 2000, "r1": 300}


class Data:
    """The tables (keys, rows) and the repository of the module's server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for i, name in enumerate(["t0", "t1", "t2"]):
            keys, vecs = h.random_table(ROWS[name], DIMS[name], seed=i, key_base=i * 100000)
            h.write_sparse(root / "data" / name, keys, vecs)
            self.tables[name] = (keys, vecs)
        # Three versions of the reloaded model's table: same keys, other values.
        rkeys, _ = h.random_table(ROWS["r1"], DIMS["r1"], seed=7)
        for v in "abc":
            vecs = np.random.default_rng(ord(v)).standard_normal((ROWS["r1"], DIMS["r1"]), dtype=np.float32)
            h.write_sparse(root / "data" / f"r1{v}", rkeys, vecs)
            self.tables[f"r1{v}"] = (rkeys, vecs)
        d = root / "data"
        self.ps = h.write_ps(d / "ps.json", [
            {"model": "wdl", "sparse_files": [str(d / "t0"), str(d / "t1")],
             "embedding_table_names": ["wide", "deep"], "embedding_vecsize_per_table": [16, 8]},
        ])
        # The native models' configuration, with a volatile tier (hits per tier in the metrics).
        self.ps_native = h.write_ps(d / "ps_native.json", [
            {"model": "native", "sparse_files": [str(d / "t0"), str(d / "t2")],
             "embedding_table_names": ["users", "items"], "embedding_vecsize_per_table": [16, 32]},
        ], volatile={"type": "hash_map", "initial_cache_rate": 1.0})
        repo = self.repo = root / "repo"
        h.write_model(repo, "wdl", h.hps_config("wdl", 0, keys_dims="[ -1, -1 ]", numkeys_dims="[ -1, -1 ]"))
        h.write_model(repo, "wdlb", h.hps_config(
            "wdlb", 1024, count=2, dynamic_batching=True,
            extra='parameters [ { key: "ps_model" value: { string_value: "wdl" } } ]\n'))
        native = {"ps": str(self.ps_native), "ps_model": "native"}
        h.write_model(repo, "pooled", h.native_config(
            "pooled", 256, count=2, batching_delay_us=2000,
            inputs=['name: "user_ids" data_type: TYPE_INT64 dims: [ 3 ]',
                    'name: "item_ids" data_type: TYPE_INT32 dims: [ -1 ]',
                    'name: "item_w" data_type: TYPE_FP32 dims: [ -1 ]'],
            outputs=['name: "USER_EMB" data_type: TYPE_FP16 dims: [ 3, 16 ]',
                     'name: "ITEM_EMB" data_type: TYPE_FP32 dims: [ 32 ]'],
            params={**native, "num_threads": "1", "lookup.user_ids": "table=users output=USER_EMB",
                    "lookup.item_ids": "table=items output=ITEM_EMB pooling=mean weights=item_w"}))
        h.write_model(repo, "ragged", h.native_config(
            "ragged", 0,
            inputs=['name: "ids" data_type: TYPE_INT64 dims: [ -1 ]', 'name: "offsets" data_type: TYPE_INT32 dims: [ -1 ]'],
            outputs=['name: "EMB" data_type: TYPE_BF16 dims: [ -1, 32 ]'],
            params={**native, "lookup.ids": "table=1 output=EMB pooling=sqrtn offsets=offsets"}))
        # Ragged bags through the dynamic batcher: each request one batch row, [1, nnz] ids and
        # [1, B + 1] offsets -> [1, B, 32].
        h.write_model(repo, "ragged_batched", h.native_config(
            "ragged_batched", 16, batching_delay_us=20000,
            inputs=['name: "ids" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true',
                    'name: "offsets" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true'],
            outputs=['name: "EMB" data_type: TYPE_FP32 dims: [ -1, 32 ]'],
            params={**native, "lookup.ids": "table=items output=EMB pooling=sum offsets=offsets"}))
        # Reloaded while others serve: its ps.json sits in the version folder.
        self.reload_dir = h.write_model(repo, "reload", h.hps_config("reload", 0, keys_dims="[ -1, -1 ]", numkeys_dims="[ -1, -1 ]"), versions=(1,))
        self.write_reload_ps(1, "a")
        # Four instances over a 100K x 64 table held in a volatile tier (25.6 MB of rows).
        mkeys, mvecs = h.random_table(100_000, 64, seed=9)
        h.write_sparse(root / "data" / "m1", mkeys, mvecs)
        self.tables["m1"] = (mkeys, mvecs)
        self.mem_bytes = mvecs.nbytes
        mem = h.write_model(repo, "mem4", h.hps_config("mem4", 0, count=4, keys_dims="[ -1, -1 ]",
                                                       numkeys_dims="[ -1, -1 ]"))
        h.write_ps(mem / "1" / "ps.json", [{"model": "mem4", "sparse_files": [str(root / "data" / "m1")],
                                           "embedding_vecsize_per_table": [64]}],
                   volatile={"type": "hash_map", "initial_cache_rate": 1.0})
        # The wdl tables stored as int8 (strata_storage_per_table), loaded by its test.
        q8 = h.write_model(repo, "wdl8", h.hps_config("wdl8", 0, keys_dims="[ -1, -1 ]", numkeys_dims="[ -1, -1 ]"))
        self.ps_int8 = h.write_ps(q8 / "1" / "ps.json", [
            {"model": "wdl8", "sparse_files": [str(d / "t0"), str(d / "t1")], "embedding_vecsize_per_table": [16, 8],
             "strata_storage_per_table": ["int8", "int8"]},
        ])
        # A ps.json error: the load must fail with strata's message and JSON path.
        bad = h.write_model(repo, "bad_ps", h.hps_config("bad_ps", 0))
        h.write_ps(bad / "1" / "ps.json", [{"model": "bad_ps", "sparse_files": ["/nonexistent/strata/table"],
                                            "embedding_vecsize_per_table": [4]}])

    def write_reload_ps(self, version: int, which: str) -> None:
        folder = self.reload_dir / str(version)
        folder.mkdir(exist_ok=True)
        h.write_ps(folder / "ps.json", [{"model": "reload", "sparse_files": [str(self.root / "data" / f"r1{which}")],
                                         "embedding_vecsize_per_table": [4]}])

    def rows(self, table: str, keys: np.ndarray, default: float = 0.0) -> np.ndarray:
        """The NumPy reference: each key's row, or the default row."""
        tkeys, vecs = self.tables[table]
        index = {int(k): i for i, k in enumerate(tkeys)}
        out = np.full((keys.size, vecs.shape[1]), default, dtype=np.float32)
        for j, k in enumerate(keys.reshape(-1)):
            i = index.get(int(k))
            if i is not None:
                out[j] = vecs[i]
        return out.reshape(*keys.shape, vecs.shape[1])

    def sample(self, table: str, n: int, rng: np.random.Generator, miss: float = 0.1) -> np.ndarray:
        tkeys, _ = self.tables[table]
        keys = rng.choice(tkeys, n)
        missing = rng.random(n) < miss
        keys[missing] = 10**12 + rng.integers(0, 10**6, int(missing.sum()))
        return keys.astype(np.int64)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    return Data(tmp_path_factory.mktemp("triton"))


@pytest.fixture(scope="module")
def server(data: Data, tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.TritonServer]:
    log = tmp_path_factory.mktemp("log") / "tritonserver.log"
    s = h.TritonServer(data.repo, BACKEND_DIR, log, ps=data.ps, explicit=True,
                       load=["wdl", "wdlb", "pooled", "ragged", "ragged_batched", "reload"])
    try:
        s.wait_ready()
        yield s
    finally:
        took = s.stop(timeout=30)
        print(f"tritonserver stopped in {took:.1f} s")
        assert took < 20, f"stopping took {took:.1f} s:\n{s.log_text()[-3000:]}"
        assert "successfully unloaded 'wdl'" in s.log_text()


@pytest.fixture(scope="module")
def ps_server(data: Data) -> Iterator[strata.Server]:
    with strata.Server.open(data.ps) as srv:
        yield srv


def hps_inputs(mod: Any, keys: np.ndarray, numkeys: np.ndarray) -> list[Any]:
    ins = [mod.InferInput("KEYS", list(keys.shape), "INT64"), mod.InferInput("NUMKEYS", list(numkeys.shape), "INT32")]
    ins[0].set_data_from_numpy(keys)
    ins[1].set_data_from_numpy(numkeys)
    return ins


def hps_expected(data: Data, k0: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return np.concatenate([data.rows("t0", k0).reshape(-1), data.rows("t1", k1).reshape(-1)])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_hps_interface(server: h.TritonServer, data: Data, ps_server: strata.Server, protocol: str) -> None:
    """KEYS = the keys of both tables one after another, split by NUMKEYS; OUTPUT0 = their rows."""
    mod = http if protocol == "http" else grpc
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    rng = np.random.default_rng(11)
    wide, deep = ps_server.table("wdl", 0), ps_server.table("wdl", 1)
    try:
        for n0, n1 in [(1, 1), (5, 26), (0, 7), (64, 64), (300, 1)]:
            k0, k1 = data.sample("t0", n0, rng), data.sample("t1", n1, rng)
            keys = np.concatenate([k0, k1]).reshape(1, -1)
            r = client.infer("wdl", hps_inputs(mod, keys, np.array([[n0, n1]], dtype=np.int32)))
            out = r.as_numpy("OUTPUT0")
            assert out.shape == (n0 * 16 + n1 * 8,)  # hps_backend's 1-D output
            np.testing.assert_array_equal(out, hps_expected(data, k0, k1))
            direct = np.concatenate([strata.lookup(wide, k0).reshape(-1), strata.lookup(deep, k1).reshape(-1)])
            np.testing.assert_array_equal(out, direct)
        # max_batch_size 1024: each batch row is one HPS request; OUTPUT0 is [rows, width].
        k0 = np.stack([data.sample("t0", 2, rng) for _ in range(3)])
        k1 = np.stack([data.sample("t1", 3, rng) for _ in range(3)])
        keys = np.concatenate([k0, k1], axis=1)
        r = client.infer("wdlb", hps_inputs(mod, keys, np.full((3, 2), [2, 3], dtype=np.int32)))
        out = r.as_numpy("OUTPUT0")
        assert out.shape == (3, 2 * 16 + 3 * 8)
        for row in range(3):
            np.testing.assert_array_equal(out[row], hps_expected(data, k0[row], k1[row]))
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_native_pooled_and_plain(server: h.TritonServer, data: Data, protocol: str) -> None:
    """One request: plain user rows as FP16 and weighted mean-pooled item bags as FP32."""
    mod = http if protocol == "http" else grpc
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    rng = np.random.default_rng(12)
    with strata.Server.open(data.ps_native) as srv:
        users_t, items_t = srv.table("native", 0), srv.table("native", 1)
        try:
            for batch, hot in [(1, 1), (4, 5), (64, 20)]:
                users = data.sample("t0", batch * 3, rng).reshape(batch, 3)
                items = data.sample("t2", batch * hot, rng).astype(np.int32).reshape(batch, hot)
                w = rng.random((batch, hot), dtype=np.float32)
                ins = [mod.InferInput("user_ids", [batch, 3], "INT64"), mod.InferInput("item_ids", [batch, hot], "INT32"),
                       mod.InferInput("item_w", [batch, hot], "FP32")]
                for i, a in zip(ins, [users, items, w]):
                    i.set_data_from_numpy(a)
                r = client.infer("pooled", ins)
                ue, ie = r.as_numpy("USER_EMB"), r.as_numpy("ITEM_EMB")
                assert ue.dtype == np.float16 and ue.shape == (batch, 3, 16)
                np.testing.assert_array_equal(ue, data.rows("t0", users).astype(np.float16))
                np.testing.assert_array_equal(ue, strata.lookup(users_t, users, dtype="float16"))
                assert ie.shape == (batch, 32)
                np.testing.assert_array_equal(ie, strata.lookup_pooled(items_t, items, weights=w, pooling="mean"))
                rows = data.rows("t2", items)
                ref = (rows * w[..., None]).sum(axis=1) / w.sum(axis=1, keepdims=True)
                np.testing.assert_allclose(ie, ref, rtol=1e-5, atol=1e-5)
                # Only the outputs a request names are looked up and sent.
                only = client.infer("pooled", ins, outputs=[mod.InferRequestedOutput("ITEM_EMB")])
                assert only.as_numpy("USER_EMB") is None
                np.testing.assert_array_equal(only.as_numpy("ITEM_EMB"), ie)
            # Ragged bags with offsets, sqrtn, BF16.
            ids = data.sample("t2", 10, rng)
            offs = np.array([0, 3, 3, 10], dtype=np.int32)
            ins = [mod.InferInput("ids", [10], "INT64"), mod.InferInput("offsets", [4], "INT32")]
            ins[0].set_data_from_numpy(ids)
            ins[1].set_data_from_numpy(offs)
            emb = client.infer("ragged", ins).as_numpy("EMB")
            assert emb.shape == (3, 32)
            want = strata.lookup_pooled(items_t, ids, offs, pooling="sqrtn",
                                        out=np.zeros((3, 32), dtype=ml_dtypes.bfloat16))
            np.testing.assert_array_equal(np.asarray(emb, dtype=np.float32), want.astype(np.float32))
            rows = data.rows("t2", ids)
            ref = np.stack([rows[a:b].sum(axis=0) / np.sqrt(max(b - a, 1)) for a, b in zip(offs[:-1], offs[1:])])
            np.testing.assert_allclose(np.asarray(emb, dtype=np.float32), ref, rtol=1e-2, atol=1e-2)
            assert not np.asarray(emb, dtype=np.float32)[1].any()  # the empty bag
        finally:
            client.close()


def expect_error(fn: Any, *words: str) -> str:
    with pytest.raises(InferenceServerException) as e:
        fn()
    msg = str(e.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def test_bad_requests(server: h.TritonServer, data: Data) -> None:
    """Errors name the input; nothing brings the server down."""
    client = http.InferenceServerClient(server.http_url)
    try:
        keys = np.array([[data.tables["t0"][0][0], data.tables["t1"][0][0]]], dtype=np.int64)
        # Wrong dtype and shape: refused by Triton against the configuration, naming the input.
        bad = [http.InferInput("KEYS", [1, 2], "INT32"), http.InferInput("NUMKEYS", [1, 2], "INT32")]
        bad[0].set_data_from_numpy(keys.astype(np.int32))
        bad[1].set_data_from_numpy(np.array([[1, 1]], dtype=np.int32))
        expect_error(lambda: client.infer("wdl", bad), "KEYS")
        expect_error(lambda: client.infer("wdl", hps_inputs(http, keys.reshape(1, 1, 2), np.array([[1, 1]], np.int32))),
                     "KEYS")
        # NUMKEYS that do not add up, a wrong number of counts, a negative count: the backend.
        expect_error(lambda: client.infer("wdl", hps_inputs(http, keys, np.array([[1, 2]], np.int32))), "NUMKEYS", "add up")
        expect_error(lambda: client.infer("wdl", hps_inputs(http, keys, np.array([[2]], np.int32))), "NUMKEYS", "one per table")
        expect_error(lambda: client.infer("wdl", hps_inputs(http, keys, np.array([[3, -1]], np.int32))), "NUMKEYS", ">= 0")
        # Native: weights of another shape than the keys; offsets strata refuses.
        ins = [http.InferInput("user_ids", [1, 3], "INT64"), http.InferInput("item_ids", [1, 2], "INT32"),
               http.InferInput("item_w", [1, 3], "FP32")]
        ins[0].set_data_from_numpy(np.zeros((1, 3), np.int64))
        ins[1].set_data_from_numpy(np.zeros((1, 2), np.int32))
        ins[2].set_data_from_numpy(np.ones((1, 3), np.float32))
        expect_error(lambda: client.infer("pooled", ins), "item_w")
        rag = [http.InferInput("ids", [4], "INT64"), http.InferInput("offsets", [3], "INT32")]
        rag[0].set_data_from_numpy(np.zeros(4, np.int64))
        rag[1].set_data_from_numpy(np.array([0, 3, 2], np.int32))
        expect_error(lambda: client.infer("ragged", rag), "offsets")
        rag[1].set_data_from_numpy(np.array([0, 1, 9], np.int32))
        expect_error(lambda: client.infer("ragged", rag), "offsets")
        expect_error(lambda: client.infer("wdl", hps_inputs(http, keys, np.array([[2**31 - 1, 2**31 - 1]], np.int32))),
                     "NUMKEYS", "add up")
        # Edge cases that are valid: no keys at all, no bags.
        empty = client.infer("wdl", hps_inputs(http, np.zeros((1, 0), np.int64), np.array([[0, 0]], np.int32)))
        assert empty.as_numpy("OUTPUT0").shape == (0,)
        rag = [http.InferInput("ids", [0], "INT64"), http.InferInput("offsets", [1], "INT32")]
        rag[0].set_data_from_numpy(np.zeros(0, np.int64))
        rag[1].set_data_from_numpy(np.zeros(1, np.int32))
        assert client.infer("ragged", rag).as_numpy("EMB").shape == (0, 32)
        assert client.is_server_live() and client.is_model_ready("wdl") and client.is_model_ready("ragged")
    finally:
        client.close()


def burst(server: h.TritonServer, model: str, requests: list[list[Any]]) -> tuple[list[Any], int]:
    """Sends `requests` (gRPC inputs) at once, for the dynamic batcher to put in few executions;
    returns each result (or its InferenceServerException) and how many executions they took."""
    client = grpc.InferenceServerClient(server.grpc_url)
    try:
        before = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        results: list[Any] = [None] * len(requests)
        done = threading.Event()
        count = [0]
        lock = threading.Lock()

        def callback(i: int) -> Any:
            def cb(result: Any, error: Any) -> None:
                results[i] = error if error is not None else result
                with lock:
                    count[0] += 1
                    if count[0] == len(results):
                        done.set()
            return cb

        for i, inputs in enumerate(requests):
            client.async_infer(model, inputs, callback(i))
        assert done.wait(60), "responses missing"
        after = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        return results, int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    finally:
        client.close()


def test_bad_request_in_a_batch(server: h.TritonServer, data: Data) -> None:
    """Requests the dynamic batcher puts in one execution: the bad ones fail, the others succeed;
    refused by the backend's own checks (NUMKEYS)."""
    rng = np.random.default_rng(13)
    requests, expected = [], []
    for i in range(12):
        k0, k1 = data.sample("t0", 4, rng), data.sample("t1", 2, rng)
        keys = np.concatenate([k0, k1]).reshape(1, -1)
        nk = np.array([[4, 2]] if i % 4 else [[4, 1]], dtype=np.int32)  # every 4th is bad
        expected.append(hps_expected(data, k0, k1))
        requests.append(hps_inputs(grpc, keys, nk))
    results, executions = burst(server, "wdlb", requests)
    for i, r in enumerate(results):
        if i % 4:
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0")[0], expected[i])
        else:
            assert isinstance(r, InferenceServerException) and "NUMKEYS" in str(r), r
    assert 0 < executions < 12, f"{executions} executions for 12 requests: the batcher did not batch"


def test_strata_refusal_in_a_batch(server: h.TritonServer, data: Data) -> None:
    """The same when strata itself refuses a request of the batch (offsets that are not
    non-decreasing): strata_lookup_batch fails, the execution is rerun per request, and only the
    bad requests get strata's message, naming the offsets input."""
    rng = np.random.default_rng(16)
    with strata.Server.open(data.ps_native) as srv:
        items_t = srv.table("native", 1)
        requests, expected = [], []
        for i in range(12):
            ids = data.sample("t2", 6, rng)
            offs = np.array([0, 4, 2, 6] if i % 4 == 1 else [0, 2, 2, 6], dtype=np.int32)
            ins = [grpc.InferInput("ids", [1, 6], "INT64"), grpc.InferInput("offsets", [1, 4], "INT32")]
            ins[0].set_data_from_numpy(ids.reshape(1, -1))
            ins[1].set_data_from_numpy(offs.reshape(1, -1))
            requests.append(ins)
            expected.append(None if i % 4 == 1 else strata.lookup_pooled(items_t, ids, offs, pooling="sum"))
        results, executions = burst(server, "ragged_batched", requests)
    for i, r in enumerate(results):
        if expected[i] is None:
            assert isinstance(r, InferenceServerException), r
            assert "input 'ids', offsets 'offsets'" in str(r) and "STRATA_INVALID_ARGUMENT" in str(r), r
        else:
            out = r.as_numpy("EMB")
            assert out.shape == (1, 3, 32)
            np.testing.assert_array_equal(out[0], expected[i])
    assert 0 < executions < 12, f"{executions} executions for 12 requests: the batcher did not batch"


def test_eight_threads_two_instances(server: h.TritonServer, data: Data) -> None:
    """8 client threads x 200 requests (4 HTTP, 4 gRPC) against wdlb's two instances."""
    errors: list[str] = []

    def worker(t: int) -> None:
        mod = http if t % 2 else grpc
        client = mod.InferenceServerClient(server.http_url if t % 2 else server.grpc_url)
        rng = np.random.default_rng(100 + t)
        try:
            for _ in range(200):
                n0, n1 = int(rng.integers(1, 20)), int(rng.integers(1, 20))
                k0, k1 = data.sample("t0", n0, rng), data.sample("t1", n1, rng)
                keys = np.concatenate([k0, k1]).reshape(1, -1)
                out = client.infer("wdlb", hps_inputs(mod, keys, np.array([[n0, n1]], np.int32))).as_numpy("OUTPUT0")
                if not np.array_equal(out[0], hps_expected(data, k0, k1)):
                    errors.append(f"thread {t}: wrong rows")
                    return
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"thread {t}: {e}")
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "client threads hung"
    assert not errors, errors
    stats = http.InferenceServerClient(server.http_url)
    try:
        s = stats.get_inference_statistics("wdlb")["model_stats"][0]
        assert int(s["inference_count"]) >= 1600
    finally:
        stats.close()


def mapped(pid: int, needle: str) -> int:
    """How many mappings of files whose path contains `needle` the process has."""
    with open(f"/proc/{pid}/maps") as f:
        return sum(1 for line in f if needle in line)


def gauge(server: h.TritonServer, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", server.metrics(), re.M)
    assert m, f"no {name} in /metrics"
    return float(m.group(1))


def reload_rows(client: Any, keys: np.ndarray) -> np.ndarray:
    return client.infer("reload", hps_inputs(http, keys.reshape(1, -1), np.array([[keys.size]], np.int32))).as_numpy("OUTPUT0")


def test_load_unload_reload(server: h.TritonServer, data: Data) -> None:
    """Explicit model control while wdl is queried from another thread: a new version folder and a
    changed ps.json are picked up; 20 unload/load cycles leave no strata handle or mapping behind."""
    client = http.InferenceServerClient(server.http_url)
    rkeys = data.tables["r1a"][0][:5]
    stop = threading.Event()
    served, failures = [0], []

    def query_wdl() -> None:
        c = grpc.InferenceServerClient(server.grpc_url)
        rng = np.random.default_rng(14)
        try:
            for _ in range(100000):  # bounded; stopped by the event long before
                if stop.is_set():
                    break
                k0, k1 = data.sample("t0", 3, rng), data.sample("t1", 3, rng)
                keys = np.concatenate([k0, k1]).reshape(1, -1)
                out = c.infer("wdl", hps_inputs(grpc, keys, np.array([[3, 3]], np.int32))).as_numpy("OUTPUT0")
                if not np.array_equal(out, hps_expected(data, k0, k1)):
                    failures.append("wrong rows")
                served[0] += 1
        except Exception as e:  # noqa: BLE001
            failures.append(str(e))
        finally:
            c.close()

    other = threading.Thread(target=query_wdl)
    other.start()
    try:
        pid = server.proc.pid
        np.testing.assert_array_equal(reload_rows(client, rkeys), data.rows("r1a", rkeys).reshape(-1))
        base_handles = gauge(server, "strata_server_handles")
        # A new version folder (2) with its own ps.json: the reload serves it.
        data.write_reload_ps(2, "b")
        client.load_model("reload")
        np.testing.assert_array_equal(reload_rows(client, rkeys), data.rows("r1b", rkeys).reshape(-1))
        # The same version's ps.json changed: a load of the loaded model reloads it and reads the
        # new file (the old version keeps serving until the new one is ready).
        data.write_reload_ps(2, "c")
        client.load_model("reload")
        wait_for(lambda: mapped(pid, "/data/r1b") == 0)
        np.testing.assert_array_equal(reload_rows(client, rkeys), data.rows("r1c", rkeys).reshape(-1))
        # 20 cycles: each unload frees the model's server (the last handle of that ps.json).
        for cycle in range(20):
            client.unload_model("reload")
            wait_for(lambda: gauge(server, "strata_server_handles") == base_handles - 1)
            wait_for(lambda: mapped(pid, "/data/r1") == 0)
            client.load_model("reload")
            assert client.is_model_ready("reload")
            assert gauge(server, "strata_server_handles") == base_handles, f"cycle {cycle}"
            assert mapped(pid, "/data/r1c") >= 1 and mapped(pid, "/data/r1a") == 0 and mapped(pid, "/data/r1b") == 0
        np.testing.assert_array_equal(reload_rows(client, rkeys), data.rows("r1c", rkeys).reshape(-1))
        # Triton really unloaded and loaded it each time, and the backend closed its server.
        log = server.log_text()
        assert log.count("successfully unloaded 'reload'") >= 22, log.count("successfully unloaded 'reload'")
        assert log.count("strata: model 'reload' version 2 table") >= 21
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        for _ in range(3):
            client.unload_model("reload")
            wait_for(lambda: mapped(pid, "/data/r1") == 0)
            client.load_model("reload")
        assert len(os.listdir(f"/proc/{pid}/fd")) <= fds + 2, "file descriptors grow with reloads"
    finally:
        stop.set()
        other.join(60)
        client.close()
    assert not failures, failures[:3]
    assert served[0] > 10, f"wdl answered only {served[0]} requests during the reloads"


def wait_for(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def test_int8_server_tables(server: h.TritonServer, data: Data) -> None:
    """An HPS model whose ps.json stores its tables as int8 is served unchanged: OUTPUT0 holds
    strata's own dequantized int8 rows (a lookup of the same configuration in this process), which
    are the float rows to within int8's step."""
    client = http.InferenceServerClient(server.http_url)
    rng = np.random.default_rng(16)
    try:
        client.load_model("wdl8")
        with strata.Server.open(data.ps_int8) as srv:
            wide, deep = srv.table("wdl8", 0), srv.table("wdl8", 1)
            for n0, n1 in [(1, 1), (40, 30), (0, 9)]:
                k0, k1 = data.sample("t0", n0, rng), data.sample("t1", n1, rng)
                keys = np.concatenate([k0, k1]).reshape(1, -1)
                out = client.infer("wdl8", hps_inputs(http, keys, np.array([[n0, n1]], np.int32))).as_numpy("OUTPUT0")
                direct = np.concatenate([strata.lookup(wide, k0).reshape(-1), strata.lookup(deep, k1).reshape(-1)])
                np.testing.assert_array_equal(out, direct)
                floats = hps_expected(data, k0, k1)
                np.testing.assert_allclose(out, floats, atol=0.05)  # half a step: max range / 510
                assert n0 + n1 < 10 or not np.array_equal(out, floats)
        client.unload_model("wdl8")
    finally:
        client.close()


def test_ps_json_error_fails_the_load(server: h.TritonServer) -> None:
    client = http.InferenceServerClient(server.http_url)
    try:
        msg = expect_error(lambda: client.load_model("bad_ps"), "STRATA_", "models[0].sparse_files[0]")
        print(msg)
        assert not client.is_model_ready("bad_ps") and client.is_server_live()
    finally:
        client.close()


def test_metrics_and_shared_servers(server: h.TritonServer, data: Data) -> None:
    """Hits and misses per model, table and tier; one strata handle per model, not per instance."""
    client = http.InferenceServerClient(server.http_url)
    try:
        def counter(name: str, **labels: str) -> float:
            total = 0.0
            for line in server.metrics().splitlines():
                if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                    total += float(line.rsplit(" ", 1)[1])
            return total

        m0 = counter("strata_lookup_misses_total", model="wdl", table="deep")
        h0 = counter("strata_lookup_hits_total", model="wdl", table="deep", tier="static")
        k1 = np.array([data.tables["t1"][0][1], 10**13, 10**13 + 1], dtype=np.int64)
        keys = np.concatenate([data.tables["t0"][0][:1], k1]).reshape(1, -1)
        client.infer("wdl", hps_inputs(http, keys, np.array([[1, 3]], np.int32)))
        assert counter("strata_lookup_misses_total", model="wdl", table="deep") == m0 + 2
        assert counter("strata_lookup_hits_total", model="wdl", table="deep", tier="static") == h0 + 1
        # The native models' table has a volatile tier (initial_cache_rate 1): hits counted there.
        assert counter("strata_lookup_hits_total", model="pooled", table="items", tier="volatile") > 0
        # wdl, wdlb (2 instances), pooled (2 instances), ragged, ragged_batched, reload: six
        # models, six handles.
        index = [m for m in client.get_model_repository_index() if m.get("state") == "READY"]
        assert gauge(server, "strata_server_handles") == len(index)
    finally:
        client.close()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_instances_share_one_server(server: h.TritonServer, data: Data) -> None:
    """Four KIND_CPU instances of a model hold one strata server: the table is in memory once."""
    client = http.InferenceServerClient(server.http_url)
    try:
        pid = server.proc.pid
        before = rss(pid)
        handles = gauge(server, "strata_server_handles")
        client.load_model("mem4")
        grown = rss(pid) - before
        print(f"4 instances over a {data.mem_bytes / 1e6:.1f} MB table: RSS grew {grown / 1e6:.1f} MB")
        assert gauge(server, "strata_server_handles") == handles + 1
        assert grown > 0.5 * data.mem_bytes, "the volatile tier was not loaded?"
        assert grown < 2 * data.mem_bytes, "memory grows with the instances"
        k = data.sample("m1", 50, np.random.default_rng(15)).reshape(1, -1)
        out = client.infer("mem4", hps_inputs(http, k, np.array([[50]], np.int32))).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, data.rows("m1", k).reshape(-1))
        client.unload_model("mem4")
        wait_for(lambda: gauge(server, "strata_server_handles") == handles)
    finally:
        client.close()
