#!/usr/bin/env bash
# strata.legate (python/legate_tests): installs legate, nvidia-cupynumeric and nvidia-cuda-runtime
# 26.6 from PyPI (about 3 GB) with NumPy and pytest into build/legate-venv, and runs the lookup task
# on 1 and 2 Legate CPU processors against NumPy. Legate's libraries link libcuda.so.1: without
# an NVIDIA driver the tests build a stand-in (python/legate_tests/fake_libcuda.c) whose cuInit
# says "no device". strata is the library this checkout builds, loaded through STRATA_LIBRARY.
# Where the venv cannot be built this says why and skips (exit 0). Arguments go to pytest.
# Measured on the 2-core dev machine: the install about 1.5 min (once), the tests about 10 s.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
VENV="$ROOT/build/legate-venv"
PY="$VENV/bin/python"
skip() {
    echo "== Legate tests: SKIPPED ($1)"
    exit 0
}
make_venv "$VENV" || skip "no Python venv at $VENV"
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ("legate", "cupynumeric", "pytest")) else 1)'; then
    echo "== installing legate, nvidia-cupynumeric, nvidia-cuda-runtime (about 3 GB) and pytest into build/legate-venv"
    "$PY" -m pip install -q legate nvidia-cupynumeric nvidia-cuda-runtime 'numpy>=2.1' pytest ||
        skip "legate and nvidia-cupynumeric could not be installed from PyPI"
fi
cargo build --release --lib
export STRATA_LIBRARY="$ROOT/target/release/libstrata.so" PYTHONPATH="$ROOT/python/src"
echo "== pytest python/legate_tests"
cd python/legate_tests
exec "$PY" -m pytest -q -rsxX -p no:cacheprovider . "$@"
