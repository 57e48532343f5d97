#!/usr/bin/env bash
# The Triton backend (c_examples/triton): builds libtriton_strata.so with CMake (STRATA_TRITON=ON),
# installs it into build/triton/prefix (as <prefix>/backends/strata/libtriton_strata.so, next to
# <prefix>/lib/libstrata.so), runs the backend API version check, and then runs
# c_examples/triton/test_triton_backend.py against a real tritonserver 2.51 on CPU from the
# nvidia-pytriton wheel, installed with tritonclient into build/triton-venv.
# Measured on the 2-core dev machine: venv + install about 60 s (once), build about 30 s after
# `cargo build --release`, tests about 1-2 minutes. scripts/test.sh runs it; STRATA_SKIP_TRITON=1
# there leaves it out. Where the venv cannot be built (no network for pip), the tritonserver part
# is skipped with the reason printed; the build and the version check still run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
command -v cmake >/dev/null 2>&1 || need_debs cmake

BUILD="$ROOT/build/triton"
PREFIX="$BUILD/prefix"
echo "== building and installing the Triton backend (CMake, STRATA_TRITON=ON)"
cmake -S "$ROOT" -B "$BUILD/cmake" -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_TRITON=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" >"$BUILD.cmake.log" 2>&1 ||
    { cat "$BUILD.cmake.log"; exit 1; }
cmake --build "$BUILD/cmake" --target triton_strata triton_api_version
cmake --install "$BUILD/cmake" >/dev/null
BACKEND="$PREFIX/backends/strata/libtriton_strata.so"
test -f "$BACKEND" || { echo "missing $BACKEND after cmake --install" >&2; exit 1; }
echo "== the backend API version check"
"$BUILD/cmake/triton_api_version" "$BACKEND"

VENV="$ROOT/build/triton-venv"
make_venv "$VENV"
PY="$VENV/bin/python"
if ! "$PY" -c 'import pytriton, tritonclient.http, tritonclient.grpc, pytest, ml_dtypes' 2>/dev/null; then
    echo "== installing nvidia-pytriton==0.7.0 (tritonserver 2.51.0), tritonclient[http,grpc] and pytest into build/triton-venv"
    if ! "$PY" -m pip install -q nvidia-pytriton==0.7.0 'tritonclient[http,grpc]' pytest ml_dtypes; then
        echo "== Triton backend tests: SKIPPED (build/triton-venv could not be built: pip install nvidia-pytriton==0.7.0 failed)"
        exit 0
    fi
fi
echo "== pytest c_examples/triton (tritonserver on 127.0.0.1)"
STRATA_TRITON_BACKEND_DIR="$PREFIX/backends" STRATA_LIBRARY="$PREFIX/lib/libstrata.so" \
    PYTHONPATH="$ROOT/python/src:$ROOT/c_examples/triton" \
    timeout 600 "$PY" -m pytest -q -p no:cacheprovider c_examples/triton/test_triton_backend.py "$@"
