#!/usr/bin/env bash
# Runs every strata test, from any folder. On a fresh Debian machine with Rust it first installs
# what the tests need (cmake, valgrind, libabsl-dev for the baseline benchmark smoke run, and
# NumPy/pytest from PyPI) when run as root, and says what to install otherwise.
#   1. cargo test: unit tests, integration tests through the C ABI (tests/redis_cluster.rs against
#      a local 3-node Redis Cluster it starts and stops), the header freshness check,
#      the header's names and the exported symbols (tests/abi_surface.rs), the module layers and
#      the cycles inside folders (tests/layers.rs), the thread affinity (tests/affinity.rs), and
#      the bounded property tests (tests/fuzz.rs, tests/fuzz_pooled.rs; PROPTEST_CASES, default
#      1000 here); then the build without CUDA, rustfmt (cargo fmt --check), and clippy,
#      warnings denied;
#   2. the benchmark builds and their smoke runs on small sizes;
#   3. the suites that load the plain release library: the C side (scripts/c-tests.sh: examples
#      under ASan/UBSan and valgrind, header compiles), the TensorFlow op (scripts/tf-tests.sh,
#      tensorflow-cpu in build/tf-venv), the Triton backend (scripts/triton-tests.sh,
#      tritonserver from nvidia-pytriton in build/triton-venv), the peer benchmark against
#      PyTorch, TorchRec and FBGEMM (scripts/bench-peers.sh, smoke sizes; proves it builds,
#      runs and agrees with embedding_bag; times are not checked), in its venv the framework
#      integrations (scripts/framework-tests.sh: torch.ops.strata, libstrata_torch.so,
#      strata.pyg, strata.jax), and strata.legate in its own venv (scripts/legate-tests.sh);
#   4. the Python package (scripts/py-tests.sh: the manylinux wheel from auditwheel, ctypes, the
#      installed package, README snippets), the release checks (scripts/release-tests.sh:
#      abidiff against the 0.3.0 baseline and on deliberate scratch changes, the sdist built and
#      installed), the MPI tests, and the Heat round trips (scripts/heat-tests.sh, heat and
#      mpi4py in build/heat-venv).
# Each heading shows the minutes since the start.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v abidiff >/dev/null 2>&1 || missing+=(abigail-tools)
[ -e /usr/include/absl/container/flat_hash_map.h ] || missing+=(libabsl-dev)
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev openmpi-bin libclang-dev)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
need_debs "${missing[@]}"
# tests/redis_cluster.rs, benches/redis.rs and c_examples/redis_cluster.c start a local Redis
# Cluster; without redis-server they say so and skip (the Rust test also tries apt-get itself).
if ! { command -v redis-server && command -v redis-cli; } >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing redis-server redis-tools"
        { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null; } ||
            echo "note: redis-server could not be installed; the Redis cluster tests will be skipped"
    else
        echo "note: redis-server is not installed; the Redis cluster tests will be skipped (apt-get install -y redis-server redis-tools)"
    fi
fi
if ! python3 -c 'import numpy, pytest, sys; sys.exit(0 if tuple(map(int, numpy.__version__.split(".")[:2])) >= (2, 1) else 1)' 2>/dev/null; then
    echo "== installing numpy>=2.1 and pytest"
    python3 -m pip install -q --disable-pip-version-check 'numpy>=2.1' pytest
fi

# NVRTC from PyPI, so the CUDA kernels are compiled (for sm_80 and sm_90) and checked here too.
if ! python3 -c 'import nvidia.cuda_nvrtc' 2>/dev/null; then
    echo "== installing nvidia-cuda-nvrtc-cu12 (NVRTC for the CUDA kernel compile test)"
    python3 -m pip install -q --disable-pip-version-check 'nvidia-cuda-nvrtc-cu12>=12.8,<13'
fi
# The CUDA runtime's headers and libcudart (crt/ comes with the nvcc wheel), to build the CUDA C
# example without a toolkit.
if ! python3 -c 'import nvidia.cuda_runtime, nvidia.cuda_nvcc' 2>/dev/null; then
    echo "== installing nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12 (headers for c_examples/cuda_lookup.c)"
    python3 -m pip install -q --disable-pip-version-check 'nvidia-cuda-runtime-cu12>=12.8,<13' 'nvidia-cuda-nvcc-cu12>=12.8,<13'
fi
export STRATA_REQUIRE_CUDA_HEADERS=1
NVRTC_LIB="$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))')"
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_REQUIRE_NVRTC=1
# ptxas from the same nvcc wheel: tests/cuda.rs assembles every kernel for sm_90, prints registers
# and occupancy, and fails on local-memory spills.
export STRATA_PTXAS="$(python3 -c 'import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "ptxas"))')"

# STRATA_CI_TIDY=1 (.ci/run sets it): each suite's virtual environment is removed once no later
# suite uses it, so the run's disk peak is its largest venv (build/py-venv: torch's PyPI wheel
# brings its CUDA libraries, about 8 GB) beside target/, not every venv at once (about 30 GB).
tidy() {
    [ -n "${STRATA_CI_TIDY:-}" ] || return 0
    echo "== removing ${*#"$ROOT"/} (STRATA_CI_TIDY: no later suite uses it)"
    rm -rf "$@"
}
# step TITLE: a suite's heading, with the minutes since the run started (where CI's time goes).
step() { echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }
step "disk: $(df -h --output=avail "$ROOT" | tail -1 | tr -d ' ') free where the build goes"

# The order keeps cargo's builds from undoing each other: `target/release` holds one libstrata
# at a time, and a build with other features or crate types (the benchmarks with their
# dev-dependencies, setuptools-rust's `cargo rustc --crate-type cdylib`, the mpi feature)
# replaces it, so the next plain `cargo build --release` compiles the crate again (3-4 min
# here, fat LTO). So the benchmark smoke runs follow their build, and every suite that loads
# the plain release library (C, TensorFlow, Triton, the peers, the frameworks, Legate) runs
# before the Python package, the sdist and the mpi builds.
export PROPTEST_CASES="${PROPTEST_CASES:-1000}"
step "cargo test"
cargo test
step "the build without CUDA (cargo feature cuda off), warnings denied"
nocuda_log="$(mktemp)"
cargo build --lib --no-default-features 2>&1 | tee "$nocuda_log"
if grep -q '^warning' "$nocuda_log"; then
    echo "the build without CUDA has warnings" >&2
    exit 1
fi
rm -f "$nocuda_log"
step "rustfmt (cargo fmt --check, with rustfmt.toml)"
cargo fmt --check
step "clippy (all targets, features cuda and mpi; undocumented unsafe blocks and missing # Safety docs are errors)"
cargo clippy --all-targets --features mpi -- -D warnings
step "benchmark builds"
cargo bench --no-run
step "benchmark smoke run (small sizes; the numbers mean nothing here)"
cargo bench --bench lookup -- 20000 64 5000 2
cargo bench --bench tiered -- 20000 16 2000 3
cargo bench --bench pooled -- 20000 32 500 8
cargo bench --bench redis -- 20000 16 3
step "C tests"
bash scripts/c-tests.sh
# tensorflow-cpu goes into build/tf-venv (about 1 minute to install, once; 40 s to build and test).
if [ -n "${STRATA_SKIP_TF:-}" ]; then
    step "TensorFlow op tests: SKIPPED (STRATA_SKIP_TF is set)"
else
    step "TensorFlow op tests"
    bash scripts/tf-tests.sh
    tidy "$ROOT/build/tf-venv"
fi
# nvidia-pytriton (tritonserver 2.51) and tritonclient go into build/triton-venv (about 1 minute to
# install, once; under a minute to build and test).
if [ -n "${STRATA_SKIP_TRITON:-}" ]; then
    step "Triton backend tests: SKIPPED (STRATA_SKIP_TRITON is set)"
else
    step "Triton backend tests"; bash scripts/triton-tests.sh
    tidy "$ROOT/build/triton-venv"
fi
# The peer benchmark against embedding_bag, TorchRec and FBGEMM's TBE (build/peer-venv, about
# 5.5 GB, once); it checks every contender's output against embedding_bag before timing.
if [ -n "${STRATA_SKIP_PEERS:-}" ]; then
    step "peer benchmark smoke run: SKIPPED (STRATA_SKIP_PEERS is set)"
else
    step "peer benchmark smoke run"
    STRATA_PEERS_SMOKE=1 bash scripts/bench-peers.sh
fi
# PyTorch custom ops and libstrata_torch.so, the PyG feature store and the JAX FFI call, in the same
# build/peer-venv (torch-geometric and jax added: about 1 minute once; build and tests about 2 min).
if [ -n "${STRATA_SKIP_FRAMEWORKS:-}" ]; then
    step "framework tests: SKIPPED (STRATA_SKIP_FRAMEWORKS is set)"
else
    step "framework tests (PyTorch ops, TorchScript, PyG, JAX)"
    bash scripts/framework-tests.sh
fi
tidy "$ROOT/build/peer-venv"
# legate and cuPyNumeric 26.6 go into build/legate-venv (about 3 GB, 1.5 min once; tests about 10 s).
if [ -n "${STRATA_SKIP_LEGATE:-}" ]; then
    step "Legate tests: SKIPPED (STRATA_SKIP_LEGATE is set)"
else
    step "Legate tests (strata.legate on 1 and 2 CPU processors)"
    bash scripts/legate-tests.sh
    tidy "$ROOT/build/legate-venv"
fi
step "Python tests"
bash scripts/py-tests.sh
tidy "$ROOT/build/py-venv" "$ROOT/build/py-wheels"
step "release checks (abidiff against 0.3.0, the sdist)"
bash scripts/release-tests.sh
step "MPI tests (feature mpi)"; bash scripts/mpi-tests.sh
# heat (with PyTorch) and mpi4py go into build/heat-venv (about 5 GB, a few minutes, once).
if [ -n "${STRATA_SKIP_HEAT:-}" ]; then
    step "Heat round trips under MPI: SKIPPED (STRATA_SKIP_HEAT is set)"
else
    step "Heat round trips under MPI"
    bash scripts/heat-tests.sh
    tidy "$ROOT/build/heat-venv"
fi
step "done"
echo "all test suites passed"
