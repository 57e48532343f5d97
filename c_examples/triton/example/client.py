"""Queries the example's two models over HTTP and gRPC and checks every row against the sparse
files with NumPy.

    python client.py <folder> <http host:port> <grpc host:port>
"""

import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def table(root: Path, name: str, dim: int) -> dict:
    keys = np.fromfile(root / "tables" / name / "key", dtype="<i8")
    rows = np.fromfile(root / "tables" / name / "emb_vector", dtype="<f4").reshape(-1, dim)
    return {int(k): rows[i] for i, k in enumerate(keys)}


def rows_of(t: dict, keys: np.ndarray, dim: int) -> np.ndarray:
    return np.stack([t.get(int(k), np.zeros(dim, np.float32)) for k in keys.reshape(-1)])


def main() -> None:
    root, http_url, grpc_url = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    wdl0, wdl1 = table(root, "wdl0", 1), table(root, "wdl1", 16)
    users, items = table(root, "users", 32), table(root, "items", 32)
    batch = 10
    rng = np.random.default_rng(0)
    for mod, url in [(httpclient, http_url), (grpcclient, grpc_url)]:
        with mod.InferenceServerClient(url) as client:
            # hps_wdl, as hps_backend's sample client sends it: 2 keys of table 1 and 26 of table 2
            # per sample, all of table 1 first.
            k1 = rng.integers(0, 1000, batch * 2) * 7       # keys of wdl0 (7i)
            k2 = rng.integers(0, 5000, batch * 26) * 7 + 1  # keys of wdl1 (7i + 1)
            keys = np.concatenate([k1, k2]).astype(np.int64).reshape(1, -1)
            numkeys = np.array([[batch * 2, batch * 26]], dtype=np.int32)
            inputs = [mod.InferInput("KEYS", list(keys.shape), "INT64"),
                      mod.InferInput("NUMKEYS", list(numkeys.shape), "INT32")]
            inputs[0].set_data_from_numpy(keys)
            inputs[1].set_data_from_numpy(numkeys)
            out = client.infer("hps_wdl", inputs).as_numpy("OUTPUT0")
            want = np.concatenate([rows_of(wdl0, k1, 1).reshape(-1), rows_of(wdl1, k2, 16).reshape(-1)])
            assert out.shape == (batch * 2 * 1 + batch * 26 * 16,) and np.array_equal(out, want)
            print(f"{mod.__name__}: hps_wdl OUTPUT0 {out.shape}, matches the files")

            # pooled: a user row and a weighted mean of 5 item rows per sample.
            user = (rng.integers(0, 2000, (batch, 1)) * 7 + 2).astype(np.int64)
            item = (rng.integers(0, 10000, (batch, 5)) * 7 + 3).astype(np.int64)
            w = rng.random((batch, 5), dtype=np.float32)
            inputs = [mod.InferInput("user_id", [batch, 1], "INT64"), mod.InferInput("item_ids", [batch, 5], "INT64"),
                      mod.InferInput("item_weights", [batch, 5], "FP32")]
            for i, a in zip(inputs, [user, item, w]):
                i.set_data_from_numpy(a)
            r = client.infer("pooled", inputs)
            u, it = r.as_numpy("USER"), r.as_numpy("ITEMS")
            assert np.array_equal(u.reshape(batch, 32), rows_of(users, user, 32).astype(np.float16))
            ref = (rows_of(items, item, 32).reshape(batch, 5, 32) * w[..., None]).sum(1) / w.sum(1, keepdims=True)
            assert np.allclose(it, ref, rtol=1e-5, atol=1e-5)
            print(f"{mod.__name__}: pooled USER {u.shape} {u.dtype}, ITEMS {it.shape}, match the files")


if __name__ == "__main__":
    main()
