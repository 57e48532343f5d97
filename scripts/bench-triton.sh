#!/usr/bin/env bash
# What Triton adds to a strata lookup (python/bench/triton_latency.py): p50/p99 latency and
# throughput through HTTP and gRPC at batch 1, 64 and 1024 against strata.lookup called directly
# on the same table. Builds the backend and build/triton-venv first (scripts/lib.sh, triton_setup).
# Arguments go to the benchmark (--requests N --clients N --seconds S --batches 1,64,1024).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
triton_setup
uptime
STRATA_TRITON_BACKEND_DIR="$TRITON_PREFIX/backends" STRATA_LIBRARY="$TRITON_PREFIX/lib/libstrata.so" \
    PYTHONPATH="$ROOT/python/src" "$TRITON_PY" python/bench/triton_latency.py "$@"
uptime
