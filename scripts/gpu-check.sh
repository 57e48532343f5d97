#!/usr/bin/env bash
# Builds, tests and benchmarks strata's CUDA path on a machine with an NVIDIA GPU, in one call,
# and prints the GPU benchmark's table last.
#
#   bash scripts/gpu-check.sh          build here (needs cargo) and run
#   bash scripts/gpu-check.sh build    only build the test and bench binaries into target/gpu-check/
#   bash scripts/gpu-check.sh run      only run binaries from target/gpu-check/ (for a GPU machine
#                                      without Rust: build elsewhere, then carry target/gpu-check)
#
# What runs: c_examples/cuda_lookup.c (static, uvm, cache), tests/cuda.rs (every placement, dtype and host/device mix against the CPU path,
# 1M keys, a lookup queued behind a spinning kernel, two streams, errors, several devices when
# present; pooled lookups (strata_lookup_pooled: every placement, pooling, dtype, ragged and fixed
# hotness, weights, host/device mixes, 20,000 bags, queued behind a spinning kernel, bad device
# offsets) and a 26-table strata_lookup_batch against separate CPU calls), tests/cuda_emulated.rs (the kernels on the CPU emulator, as in CI), and
# benches/gpu.rs (GB/s of static/uvm/cache gathers beside a device memcpy and the CPU path, and a
# 26-table one-key strata_lookup_batch against one single-key call on the same stream).
# NVRTC is found in a CUDA toolkit or the nvidia-cuda-nvrtc wheel; a CUDA 13 libnvrtc.so.13 is
# offered to cudarc under the name libnvrtc.so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode="${1:-all}"
dest=target/gpu-check

# executable NAME: the path of target NAME's executable in cargo's JSON messages on stdin.
executable() {
    python3 -c "
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get('reason') == 'compiler-artifact' and m['target']['name'] == '$1' and m.get('executable'):
        print(m['executable'])"
}

build() {
    echo "== building the GPU test and bench binaries"
    rm -rf "$dest" && mkdir -p "$dest"
    local tests bench
    tests="$(cargo test --no-run --message-format=json --test cuda --test cuda_emulated 2>/dev/null)"
    bench="$(cargo bench --no-run --message-format=json --bench gpu 2>/dev/null)"
    for t in cuda cuda_emulated; do
        cp "$(printf '%s\n' "$tests" | executable "$t")" "$dest/$t"
    done
    cp "$(printf '%s\n' "$bench" | executable gpu)" "$dest/gpu-bench"
    cargo build --release --lib 2>/dev/null
    cp target/release/libstrata.so "$dest/libstrata.so"
    strip "$dest"/*
    ls -la "$dest"
}

find_nvrtc() {
    local shim
    shim="$(mktemp -d)"
    local found=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        for f in $(ls "$d"/libnvrtc.so* "$d"/nvidia/*/lib/libnvrtc.so* "$d"/nvidia/cu*/lib/libnvrtc.so* 2>/dev/null); do
            case "$f" in *builtins*|*alt*) continue ;; esac
            found="$f"
            break 2
        done
    done
    if [ -z "$found" ]; then
        echo "NVRTC not found (no CUDA toolkit, no nvidia-cuda-nvrtc wheel): the GPU path cannot compile its kernels" >&2
        exit 1
    fi
    ln -sf "$found" "$shim/libnvrtc.so"
    echo "== NVRTC: $found" >&2
    echo "$shim:$(dirname "$found")"
}

run() {
    [ -x "$dest/cuda" ] || { echo "missing $dest/cuda: run 'bash scripts/gpu-check.sh build' first" >&2; exit 1; }
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>/dev/null || true
    export LD_LIBRARY_PATH="$(find_nvrtc)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export STRATA_REQUIRE_NVRTC=1
    export STRATA_SOURCE_DIR="$PWD"
    echo "== tests/cuda.rs"
    "$dest/cuda" --test-threads=1 2>&1 | tee "${OUT:-/tmp}/gpu-tests.log" | grep -E "^test |skipped|panicked|test result|left|right" || true
    grep -q "test result: ok" "${OUT:-/tmp}/gpu-tests.log" || { echo "GPU tests FAILED (log: ${OUT:-/tmp}/gpu-tests.log)"; tail -40 "${OUT:-/tmp}/gpu-tests.log"; }
    echo "== tests/cuda_emulated.rs"
    "$dest/cuda_emulated" 2>&1 | grep -E "^test |panicked|test result" || true
    echo "== c_examples/cuda_lookup.c (built here against the CUDA toolkit and the carried libstrata.so)"
    local cuda_home="${CUDA_HOME:-/usr/local/cuda}"
    if [ -e "$cuda_home/include/cuda_runtime_api.h" ]; then
        # The example's NEEDED entry is libstrata's SONAME: link that name to the carried library.
        local soname
        soname="$(readelf -d "$dest/libstrata.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
        [ -z "$soname" ] || ln -sf libstrata.so "$dest/$soname"
        gcc -std=c11 -O2 -Wall -Wextra -Werror -Iinclude -I"$cuda_home/include" c_examples/cuda_lookup.c \
            -L"$dest" -lstrata -Wl,-rpath,"$PWD/$dest" -L"$cuda_home/lib64" -lcudart -o "$dest/cuda_lookup" &&
            for p in static uvm cache; do "$dest/cuda_lookup" "$p" || echo "cuda_lookup $p FAILED"; done
    else
        echo "no CUDA toolkit headers at $cuda_home/include: example not built"
    fi
    echo "== benches/gpu.rs"
    "$dest/gpu-bench" 2>&1 | tee "${OUT:-/tmp}/gpu-bench.log"
}

case "$mode" in
    build) build ;;
    run) run ;;
    all) build && run ;;
    *) echo "usage: $0 [build|run|all]" >&2; exit 2 ;;
esac
