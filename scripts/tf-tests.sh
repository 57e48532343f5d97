#!/usr/bin/env bash
# The TensorFlow custom op (c_examples/tensorflow): installs tensorflow-cpu and pytest from PyPI
# into a virtual environment (build/tf-venv, so the main environment's NumPy is left alone),
# builds strata_lookup_op.so (StrataLookup and StrataSparseLookup) with g++ against
# tf.sysconfig's flags and libstrata.so (-Wall -Wextra -Werror on our code; TF's headers are
# -isystem), and runs the pytest files there.
# Measured on the 2-core dev machine: venv + install about 55 s (once), op build about 25 s,
# tests about 10 s. scripts/test.sh runs it; STRATA_SKIP_TF=1 there leaves it out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
VENV="$ROOT/build/tf-venv"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
make_venv "$VENV"
if ! "$VENV/bin/python" -c 'import tensorflow, pytest' 2>/dev/null; then
    echo "== installing tensorflow-cpu and pytest into build/tf-venv"
    "$VENV/bin/python" -m pip install -q tensorflow-cpu pytest
fi
cargo build --release
PY="$VENV/bin/python"
# -I of TF's headers becomes -isystem: their own warnings are not ours to fix.
mapfile -t TF_CFLAGS < <(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf
for f in tf.sysconfig.get_compile_flags(): print("-isystem" + f[2:] if f.startswith("-I") else f)')
mapfile -t TF_LFLAGS < <(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf
for f in tf.sysconfig.get_link_flags(): print(f)')
OUT="$ROOT/build/tf"
mkdir -p "$OUT"
echo "== building c_examples/tensorflow/strata_lookup_op.so"
g++ -shared -fPIC -O2 -Wall -Wextra -Werror c_examples/tensorflow/strata_lookup_op.cc -o "$OUT/strata_lookup_op.so" \
    "${TF_CFLAGS[@]}" -I"$ROOT/include" "${TF_LFLAGS[@]}" -L"$ROOT/target/release" -lstrata \
    -Wl,-rpath,"$ROOT/target/release"
echo "== pytest c_examples/tensorflow"
STRATA_TF_OP="$OUT/strata_lookup_op.so" TF_CPP_MIN_LOG_LEVEL=2 \
    "$PY" -m pytest -q -p no:cacheprovider c_examples/tensorflow "$@"
