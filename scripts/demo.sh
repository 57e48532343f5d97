#!/usr/bin/env bash
# Builds strata (cargo, release) and its C examples (CMake, -O2, no sanitizers) into
# build/release, then runs the demo. Arguments go to the demo:
#
#   scripts/demo.sh [rows [dim [batch [threads]]]]     (defaults 1000000 128 200000 0)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if ! command -v cmake >/dev/null 2>&1; then
    echo "demo.sh: cmake is not installed; install it with: apt-get install -y cmake" >&2
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "demo.sh: running as root, so installing it now" >&2
        apt-get install -y cmake || { apt-get update && apt-get install -y cmake; }
    else
        exit 1
    fi
fi

cargo build --release
cmake -S "$ROOT" -B "$ROOT/build/release" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG" \
    -DSTRATA_CARGO_PROFILE=release \
    -DSTRATA_BUILD_EXAMPLES=ON \
    -DSTRATA_SANITIZE=OFF
cmake --build "$ROOT/build/release" --parallel "$(nproc 2>/dev/null || echo 2)"
exec "$ROOT/build/release/demo" "$@"
