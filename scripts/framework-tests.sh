#!/usr/bin/env bash
# The framework integrations (python/framework_tests), in ONE venv shared with the peer benchmark
# (build/peer-venv: torch 2.14 CPU build from PyPI, fbgemm-gpu-cpu 1.9.0, torchrec; see
# scripts/bench-peers.sh), to which this adds torch-geometric 2.8, jax[cpu] 0.10.2 and pytest:
#   test_torch_ops.py    strata.torch: torch.library custom ops, opcheck, torch.compile;
#   test_torch_cpp.py    libstrata_torch.so (c_examples/torch/strata_torch.cc, TORCH_LIBRARY) built
#                        here with g++ against the venv's torch headers, in fresh processes, from a
#                        TorchScript model and an AOTInductor package;
#   test_pyg.py          strata.pyg.FeatureStore under NeighborLoader (static and server tables);
#   test_jax.py          strata.jax: XLA FFI handlers (c_examples/jax/strata_jax.cc, built here
#                        against jax.ffi.include_dir()) under jit and vmap;
#   test_readme.py       the README's torch, pyg and jax snippets, as written.
# strata is the library this checkout builds (cargo build --release), loaded by the package in
# python/src through STRATA_LIBRARY. Where the venv cannot be built, this says why and skips
# (exit 0), as the TensorFlow tests do. Arguments go to pytest.
# Measured on the 2-core dev machine (loaded): installing into an existing peer-venv about 1 min
# (once); both op libraries build in about 30 s; the tests about 80 s (40 s of it AOTInductor).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
VENV="${STRATA_PEER_VENV:-$ROOT/build/peer-venv}"
PY="$VENV/bin/python"
skip() {
    echo "== framework tests: SKIPPED ($1)"
    exit 0
}
make_venv "$VENV" || skip "no Python venv at $VENV"
constraint="$(mktemp)"
trap 'rm -f "$constraint"' EXIT
echo 'torch==2.14.*' >"$constraint"
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    echo "== installing torch 2.14 and numpy into $(basename "$VENV")"
    "$PY" -m pip install -q 'torch==2.14.*' 'numpy>=2.1' ||
        skip "torch 2.14 could not be installed from PyPI"
fi
if ! "$PY" -c 'import torch_geometric, jax, pytest' 2>/dev/null; then
    echo "== installing torch-geometric 2.8, jax[cpu] 0.10.2 and pytest into $(basename "$VENV")"
    "$PY" -m pip install -q -c "$constraint" 'torch-geometric==2.8.*' 'jax[cpu]==0.10.2' pytest ||
        skip "torch-geometric 2.8 and jax 0.10.2 could not be installed from PyPI"
fi
cargo build --release --lib
OUT="$ROOT/build/frameworks"
mkdir -p "$OUT"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
TORCH_INC="$SITE/torch/include"
# The CUDA runtime headers c10/cuda/CUDAStream.h needs: the ones the triton wheel (a torch
# requirement) ships with crt/; without them the library has CPU and Meta kernels only.
cuda_flags=()
if [ -e "$SITE/triton/backends/nvidia/include/crt/host_defines.h" ] && [ -e "$SITE/torch/lib/libc10_cuda.so" ]; then
    cuda_flags=(-DSTRATA_TORCH_CUDA -isystem "$SITE/triton/backends/nvidia/include" -lc10_cuda)
fi
echo "== building libstrata_torch.so (c_examples/torch/strata_torch.cc${cuda_flags:+, with the CUDA kernel})"
g++ -std=c++20 -shared -fPIC -O2 -Wall -Wextra -Werror c_examples/torch/strata_torch.cc -o "$OUT/libstrata_torch.so" \
    -isystem "$TORCH_INC" -isystem "$TORCH_INC/torch/csrc/api/include" -I"$ROOT/include" "${cuda_flags[@]}" \
    -L"$SITE/torch/lib" -ltorch -ltorch_cpu -lc10 -L"$ROOT/target/release" -lstrata \
    -Wl,-rpath,"$ROOT/target/release"
JAX_INC="$("$PY" -c 'import jax; print(jax.ffi.include_dir())')"
echo "== building libstrata_jax.so (c_examples/jax/strata_jax.cc, against $JAX_INC)"
# (no -lstrata: strata.jax hands the handlers the entry points of the libstrata it loaded)
g++ -std=c++17 -shared -fPIC -O2 -Wall -Wextra -Werror c_examples/jax/strata_jax.cc -o "$OUT/libstrata_jax.so" \
    -isystem "$JAX_INC" -I"$ROOT/include"
export STRATA_LIBRARY="$ROOT/target/release/libstrata.so" PYTHONPATH="$ROOT/python/src"
export STRATA_TORCH_OP="$OUT/libstrata_torch.so" STRATA_JAX_LIBRARY="$OUT/libstrata_jax.so"
echo "== pytest python/framework_tests"
cd python/framework_tests
exec "$PY" -m pytest -q -rsx -p no:cacheprovider . "$@"
