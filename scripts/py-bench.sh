#!/usr/bin/env bash
# The Python benchmark (python/bench/small_calls.py): strata.lookup against torch.index_select(out=)
# and numpy.take(out=), for 64 keys (num_threads=1) and a large batch, side by side in one run,
# with the ratios and their spread over the rounds. Runs in build/py-venv with the wheel installed
# (made by scripts/py-tests.sh with STRATA_PY_SETUP_ONLY=1 when it is not there yet).
# Arguments go to the benchmark (--rows --dim --small --large --rounds --budget).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/build/py-venv/bin/python"
if ! [ -x "$PY" ] || ! "$PY" -c 'import strata, torch' 2>/dev/null; then
    STRATA_PY_SETUP_ONLY=1 STRATA_SKIP_JAX=1 bash scripts/py-tests.sh
fi
cd "$ROOT/build"
"$PY" "$ROOT/python/bench/small_calls.py" "$@"
