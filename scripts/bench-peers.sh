#!/usr/bin/env bash
# The peer benchmark (python/bench/peers.py): strata's pooled and many-table lookups against the
# peers a PyTorch user already has, in one process, interleaved, on the same memory and keys:
# torch.nn.functional.embedding_bag (FBGEMM's EmbeddingSpMDM kernels), a loop of 26
# embedding_bag calls, TorchRec's EmbeddingBagCollection and FBGEMM's table-batched embedding
# (TBE) on CPU. Every contender's output is checked against embedding_bag before anything is
# timed; the load average is printed before and after.
#   - build/peer-venv holds torch 2.14 with fbgemm-gpu-cpu 1.9.0 (the pair FBGEMM's
#     compatibility table names), torchrec 1.9.2 installed with --no-deps (its requirement names
#     the CUDA fbgemm-gpu) plus its other requirements, and NumPy: about 5.5 GB, a few minutes
#     from pip's cache, once.
#   - python/bench/plain_pool.c (a plain C pooling loop, and a loop that only reads every line
#     of every row: the memory's limit) is built with cc into build/libplain_pool.so and timed on
#     the same tensors in the float32 sum workloads;
#   - strata is the library this checkout builds (cargo build --release), loaded by the package
#     in python/src through STRATA_LIBRARY.
# Arguments go to peers.py (--rounds, --budget, --scale, --only pooled,dlrm,small).
# STRATA_PEERS_SMOKE=1 runs every workload on tiny sizes, once (scripts/test.sh does: the
# numbers mean nothing then); where the venv cannot be built, the smoke run says why and skips.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
VENV="${STRATA_PEER_VENV:-$ROOT/build/peer-venv}"
PY="$VENV/bin/python"
skip() {
    if [ -n "${STRATA_PEERS_SMOKE:-}" ]; then
        echo "== peer benchmark: SKIPPED ($1)"
        exit 0
    fi
    echo "bench-peers: $1" >&2
    exit 1
}
make_venv "$VENV"
if ! "$PY" -c 'import torch, fbgemm_gpu, torchrec, numpy' 2>/dev/null; then
    echo "== installing torch 2.14, fbgemm-gpu-cpu 1.9.0 and torchrec 1.9.2 into $(basename "$VENV")"
    constraint="$(mktemp)"
    echo 'torch==2.14.*' >"$constraint"
    "$PY" -m pip install -q 'torch==2.14.*' 'fbgemm-gpu-cpu==1.9.0' 'numpy>=2.1' ||
        skip "torch 2.14 and fbgemm-gpu-cpu 1.9.0 could not be installed from PyPI"
    "$PY" -m pip install -q --no-deps 'torchrec==1.9.2' ||
        skip "torchrec 1.9.2 could not be installed from PyPI"
    "$PY" -m pip install -q -c "$constraint" tensordict 'torchmetrics==1.0.3' tqdm pyre-extensions ||
        skip "torchrec's requirements could not be installed from PyPI"
    rm -f "$constraint"
fi
cargo build --release --lib
export STRATA_LIBRARY="$ROOT/target/release/libstrata.so" PYTHONPATH="$ROOT/python/src"
# The references of the float32 sum workloads: a plain C loop and the memory's limit (see above).
mkdir -p "$ROOT/build"
if cc -O3 -march=native -shared -fPIC -pthread -o "$ROOT/build/libplain_pool.so" python/bench/plain_pool.c; then
    export STRATA_PLAIN_POOL="$ROOT/build/libplain_pool.so"
else
    echo "note: python/bench/plain_pool.c did not build; the pooled workloads are printed without the plain loop and the limit"
fi
if [ -n "${STRATA_PEERS_SMOKE:-}" ]; then
    echo "== peer benchmark smoke run (tiny sizes, one round; the numbers mean nothing here)"
    exec "$PY" python/bench/peers.py --scale 0.002 --rounds 1 --budget 0.01 "$@"
fi
exec "$PY" python/bench/peers.py "$@"
