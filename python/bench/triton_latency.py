"""What Triton adds to a strata lookup: p50/p99 latency and throughput of the strata backend over
HTTP and gRPC at batch 1, 64 and 1024, against the same lookup called directly (strata.lookup on
the same ps.json table, in this process, output preallocated).

The table: 100K x 128 float32 rows in a HugeCTR sparse folder, served by a ps.json with both tiers
disabled (the memory-mapped files). The model: the native interface, one plain lookup (keys [B]
int64 -> rows [B, 128] float32), max_batch_size 0, one KIND_CPU instance, num_threads from the
instance thread's CPUs. Latency: one client, sequential requests (`--requests` of them after
warm-up), time from the call to the decoded NumPy output. Throughput: `--clients` threads each
sending requests for `--seconds`, keys per second. The host lines load-average before and after.

Run with scripts/bench-triton.sh (it builds the backend and the venv, then this file).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "c_examples" / "triton"))
import harness as h  # noqa: E402
import strata  # noqa: E402
import tritonclient.grpc as grpc  # noqa: E402
import tritonclient.http as http  # noqa: E402

ROWS, DIM = 100_000, 128


def percentiles(times: list[float]) -> tuple[float, float]:
    a = np.sort(np.asarray(times)) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def latency(call: Callable[[], Any], n: int) -> tuple[float, float]:
    for _ in range(max(n // 10, 5)):
        call()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return percentiles(times)


def throughput(make_call: Callable[[], Callable[[], Any]], clients: int, seconds: float, batch: int) -> float:
    counts = [0] * clients
    stop = time.perf_counter() + seconds

    def run(i: int) -> None:
        call = make_call()
        while time.perf_counter() < stop:
            call()
            counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return sum(counts) * batch / seconds


def server_stats(server: h.TritonServer) -> dict[str, tuple[int, int]]:
    """Triton's cumulative (count, ns) per phase for the model."""
    with http.InferenceServerClient(server.http_url) as c:
        st = c.get_inference_statistics("bench")["model_stats"][0]["inference_stats"]
    return {k: (int(v.get("count", 0)), int(v.get("ns", 0))) for k, v in st.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batches", default="1,64,1024")
    args = ap.parse_args()
    backend_dir = Path(os.environ["STRATA_TRITON_BACKEND_DIR"])
    root = Path(tempfile.mkdtemp(prefix="strata-triton-bench-"))
    keys, vecs = h.random_table(ROWS, DIM, seed=1)
    h.write_sparse(root / "t", keys, vecs)
    ps = h.write_ps(root / "ps.json", [{"model": "bench", "sparse_files": [str(root / "t")],
                                         "embedding_vecsize_per_table": [DIM]}])
    h.write_model(root / "repo", "bench", h.native_config(
        "bench", 0, inputs=['name: "keys" data_type: TYPE_INT64 dims: [ -1 ]'],
        outputs=[f'name: "rows" data_type: TYPE_FP32 dims: [ -1, {DIM} ]'],
        params={"lookup.keys": "table=0 output=rows"}))
    load0 = os.getloadavg()
    server = h.TritonServer(root / "repo", backend_dir, root / "tritonserver.log", ps=ps)
    rng = np.random.default_rng(2)
    results = []
    try:
        server.wait_ready()
        with strata.Server.open(ps) as srv:
            table = srv.table("bench", 0)
            for batch in [int(b) for b in args.batches.split(",")]:
                k = rng.choice(keys, batch).astype(np.int64)
                out = np.empty((batch, DIM), dtype=np.float32)
                n = args.requests if batch < 1024 else max(args.requests // 2, 50)

                def direct() -> Any:
                    return strata.lookup(table, k, out=out)

                row = {"batch": batch, "direct": latency(direct, n)}
                row["direct_tput"] = throughput(lambda: direct, 1, args.seconds, batch)
                for proto, mod, url in [("http", http, server.http_url), ("grpc", grpc, server.grpc_url)]:
                    def make_call(mod: Any = mod, url: str = url) -> Callable[[], Any]:
                        client = mod.InferenceServerClient(url)
                        inp = mod.InferInput("keys", [batch], "INT64")
                        inp.set_data_from_numpy(k)
                        outs = [mod.InferRequestedOutput("rows")]
                        return lambda: client.infer("bench", [inp], outputs=outs).as_numpy("rows")

                    call = make_call()
                    got = call()
                    np.testing.assert_array_equal(got, strata.lookup(table, k))
                    before = server_stats(server)
                    row[proto] = latency(call, n)
                    after = server_stats(server)
                    count = after["success"][0] - before["success"][0]
                    # Per request, inside tritonserver: the whole request, and the backend's part.
                    row[proto + "_server"] = tuple((after[w][1] - before[w][1]) / max(count, 1) / 1e3
                                                   for w in ("success", "compute_infer"))
                    row[proto + "_tput"] = throughput(make_call, args.clients, args.seconds, batch)
                results.append(row)
                print(f"batch {batch}: done", flush=True)
    finally:
        server.stop()
    load1 = os.getloadavg()
    print()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} CPUs)")
    print(f"| batch | direct p50 / p99 (us) | HTTP p50 / p99 (us) | gRPC p50 / p99 (us) "
          f"| in server, HTTP / gRPC: request, backend (us) | direct keys/s (1 thread) "
          f"| HTTP keys/s ({args.clients} clients) | gRPC keys/s ({args.clients} clients) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        hs, gs = r["http_server"], r["grpc_server"]
        print(f"| {r['batch']} | {r['direct'][0]:.1f} / {r['direct'][1]:.1f} | {r['http'][0]:.0f} / {r['http'][1]:.0f} "
              f"| {r['grpc'][0]:.0f} / {r['grpc'][1]:.0f} | {hs[0]:.0f}, {hs[1]:.0f} / {gs[0]:.0f}, {gs[1]:.0f} "
              f"| {r['direct_tput']:.3g} | {r['http_tput']:.3g} | {r['grpc_tput']:.3g} |")


if __name__ == "__main__":
    main()
