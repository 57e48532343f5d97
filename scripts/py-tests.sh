#!/usr/bin/env bash
# Builds libstrata.so (release), installs the `strata` Python package from ./python into this
# python3 (pip install, no compiler needed) and runs the pytest suites in python/tests:
#   test_ctypes.py, test_partitioned.py   the C ABI through raw ctypes mirrors;
#   test_package.py                       the installed package, against $STRATA_LIBRARY;
#   test_pooled.py                        lookup_pooled / lookup_batch (package and raw ctypes);
#                                         its PyTorch cases skip unless torch is installed;
#   test_readme.py                        the README's ctypes and cffi snippets, as written.
# Needs python3 with pip; installs numpy>=2.1 (for __dlpack__(max_version=...)), pytest, cffi
# (ABI mode, for the README snippet), mypy (the package is checked with --strict) and jax[cpu]
# (the JAX cases; STRATA_SKIP_JAX=1 leaves it out, and those cases then skip saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q 'numpy>=2.1' pytest cffi 'mypy==2.4.*'
if [ -z "${STRATA_SKIP_JAX:-}" ] && ! python3 -c 'import jax' 2>/dev/null; then
    python3 -m pip install -q 'jax[cpu]'
fi
cargo build --release
python3 -m pip install -q --force-reinstall --no-deps ./python
echo "== mypy --strict python/src/strata"
python3 -m mypy --strict --ignore-missing-imports --no-incremental python/src/strata
export STRATA_LIBRARY="$PWD/target/release/libstrata.so"
# Run from outside the source tree so that `import strata` is the installed package.
cd python/tests
python3 -m pytest -q -rsx . "$@"
