"""Model repositories and a tritonserver process for the strata backend's tests, benchmark and
example: HugeCTR sparse folders, an HPS-style ps.json, config.pbtxt files, and a server on
127.0.0.1 on free ports that is stopped (and checked gone) within a bounded time.

The tritonserver binary and libtritonserver come from the `nvidia-pytriton` wheel
(pytriton/tritonserver/bin, nvidia_pytriton.libs); $STRATA_TRITON_BACKEND_DIR is the folder
holding strata/libtriton_strata.so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np


def write_sparse(folder: Path, keys: np.ndarray, vectors: np.ndarray) -> Path:
    """A HugeCTR sparse folder: `key` (int64) and `emb_vector` (float32 rows), no headers."""
    folder.mkdir(parents=True, exist_ok=True)
    np.ascontiguousarray(keys, dtype="<i8").tofile(folder / "key")
    np.ascontiguousarray(vectors, dtype="<f4").tofile(folder / "emb_vector")
    return folder


def random_table(rows: int, dim: int, seed: int, key_base: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = key_base + rng.permutation(rows * 3)[:rows].astype(np.int64)
    vectors = rng.standard_normal((rows, dim), dtype=np.float32)
    return keys, vectors


def write_ps(path: Path, models: Sequence[dict[str, Any]], volatile: Optional[dict[str, Any]] = None) -> Path:
    """An HPS ps.json; `models` entries need `model`, `sparse_files` and `embedding_vecsize_per_table`."""
    doc: dict[str, Any] = {
        "supportlonglong": True,
        "volatile_db": volatile if volatile is not None else {"type": "disabled"},
        "persistent_db": {"type": "disabled"},
        "models": [],
    }
    for m in models:
        n = len(m["sparse_files"])
        entry = {
            "deployed_device_list": [0],
            "max_batch_size": 1024,
            "default_value_for_each_table": [0.0] * n,
            "maxnum_catfeature_query_per_table_per_sample": [1] * n,
        }
        entry.update(m)
        doc["models"].append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def hps_config(name: str, max_batch_size: int = 0, count: int = 1, dynamic_batching: bool = False,
               keys_dims: str = "[ -1 ]", numkeys_dims: str = "[ -1 ]", extra: str = "") -> str:
    """The config.pbtxt of an hps_backend model, with backend "strata"."""
    batching = "dynamic_batching { max_queue_delay_microseconds: 20000 }\n" if dynamic_batching else ""
    return f"""name: "{name}"
backend: "strata"
max_batch_size: {max_batch_size}
input [
  {{ name: "KEYS" data_type: TYPE_INT64 dims: {keys_dims} }},
  {{ name: "NUMKEYS" data_type: TYPE_INT32 dims: {numkeys_dims} }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}
]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{batching}{extra}"""


def native_config(name: str, max_batch_size: int, inputs: Sequence[str], outputs: Sequence[str],
                  params: dict[str, str], count: int = 1, batching_delay_us: Optional[int] = None) -> str:
    """A config.pbtxt for the strata backend's native interface. `inputs` and `outputs` are the
    bodies of their entries ('name: "ids" data_type: TYPE_INT64 dims: [ -1 ]'), `params` the
    string parameters (`lookup.<input>`, `ps`, `ps_model`, `num_threads`)."""
    batching = ("" if batching_delay_us is None
                else f"dynamic_batching {{ max_queue_delay_microseconds: {batching_delay_us} }}\n")
    tensors = lambda items: ",\n".join(f"  {{ {t} }}" for t in items)  # noqa: E731
    parameters = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return (f'name: "{name}"\nbackend: "strata"\nmax_batch_size: {max_batch_size}\n{batching}'
            f"input [\n{tensors(inputs)}\n]\noutput [\n{tensors(outputs)}\n]\n"
            f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\nparameters [\n{parameters}\n]\n")


def write_model(repo: Path, name: str, config: str, versions: Sequence[int] = (1,)) -> Path:
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config)
    for v in versions:
        (folder / str(v)).mkdir(exist_ok=True)
    return folder


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tritonserver_paths() -> tuple[Path, Path]:
    """(tritonserver binary, folder of libtritonserver) from the nvidia-pytriton wheel."""
    import pytriton  # noqa: PLC0415 (only where the wheel is installed)

    pkg = Path(pytriton.__file__).resolve().parent
    binary = pkg / "tritonserver" / "bin" / "tritonserver"
    libs = pkg.parent / "nvidia_pytriton.libs"
    return binary, libs


class TritonServer:
    """tritonserver on 127.0.0.1 (HTTP, gRPC and metrics on free ports), in its own process group."""

    def __init__(self, repo: Path, backend_dir: Path, log: Path, ps: Optional[Path] = None,
                 explicit: bool = False, load: Sequence[str] = (), extra: Sequence[str] = ()):
        binary, libs = tritonserver_paths()
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        args = [
            str(binary),
            f"--model-repository={repo}",
            f"--backend-directory={backend_dir}",
            "--http-address=127.0.0.1", f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false", "--allow-cpu-metrics=false",
            "--exit-timeout-secs=10", "--log-verbose=0",
        ]
        if ps is not None:
            args.append(f"--backend-config=strata,ps={ps}")
        if explicit:
            args.append("--model-control-mode=explicit")
            args += [f"--load-model={m}" for m in load]
        args += list(extra)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = f"{libs}:{env.get('LD_LIBRARY_PATH', '')}"
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.pgid = self.proc.pid

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90.0, models_ready: bool = True) -> None:
        """Waits until the server answers (and, unless told otherwise, its models are ready)."""
        url = f"http://{self.http_url}/v2/health/{'ready' if models_ready else 'live'}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"tritonserver not ready after {timeout} s:\n{self.log_text()[-4000:]}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self, timeout: float = 30.0) -> float:
        """SIGTERM, then SIGKILL after `timeout`; returns the seconds it took. Afterwards no process
        of its group is left (raises if one is)."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.pgid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        took = time.monotonic() - start
        # Anything left in the group (tritonserver starts no helpers for C++ backends)?
        deadline = time.monotonic() + 5
        while True:
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                break
            if time.monotonic() > deadline:
                os.killpg(self.pgid, signal.SIGKILL)
                raise RuntimeError(f"processes of tritonserver's group {self.pgid} were left behind")
            time.sleep(0.1)
        self._log.close()
        return took
