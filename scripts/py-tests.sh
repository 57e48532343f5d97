#!/usr/bin/env bash
# The Python package as a user gets it: builds its wheel (`pip wheel ./python`: setuptools-rust
# compiles the crate and ships libstrata inside the package), checks that it is a platform wheel,
# installs it into a virtual environment created fresh in this run (build/py-venv) and runs the
# pytest suites in python/tests there, against the installed package and the library it ships
# (STRATA_LIBRARY and STRATA_LIB are unset):
#   test_ctypes.py, test_partitioned.py   the C ABI through raw ctypes mirrors;
#   test_package.py                       the installed package (and the wheel's contents);
#   test_small_calls.py                   the fast path of strata.lookup (NumPy, PyTorch);
#   test_pooled.py                        lookup_pooled / lookup_batch (package and raw ctypes),
#                                         and against torch.nn.functional.embedding_bag;
#   test_cffi.py                          cffi in ABI mode from strata.cdef();
#   test_readme.py                        the README's ctypes and cffi snippets, as written;
#   test_integrations.py                  strata.torch's ops on torch 2.10, strata.jax building its
#                                         handlers from the wheel's strata/native (full suites:
#                                         scripts/framework-tests.sh).
# Installs from PyPI into the venv: numpy>=2.1, pytest, cffi, mypy (the package is checked with
# --strict), torch 2.10 (STRATA_SKIP_TORCH=1 leaves it out; its cases then skip saying so) and
# jax[cpu] (STRATA_SKIP_JAX=1 likewise). The wheel build itself fetches setuptools and
# setuptools-rust into pip's isolated build environment.
# Measured on the 2-core dev machine: venv + installs about 1-2 min from pip's cache (torch is
# most of it), the wheel about 1-2 min (cargo rebuilds only the strata crate), tests about 1 min.
# STRATA_PY_SETUP_ONLY=1 stops after the install (scripts/py-bench.sh uses that venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
unset STRATA_LIBRARY STRATA_LIB
VENV="$ROOT/build/py-venv"
WHEELS="$ROOT/build/py-wheels"
rm -rf "$VENV" "$WHEELS"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
make_venv "$VENV"
PY="$VENV/bin/python"
deps=('numpy>=2.1' pytest cffi 'mypy==2.4.*')
[ -n "${STRATA_SKIP_TORCH:-}" ] || deps+=('torch==2.10.*')
[ -n "${STRATA_SKIP_JAX:-}" ] || deps+=('jax[cpu]')
echo "== installing ${deps[*]} into build/py-venv"
"$PY" -m pip install -q "${deps[@]}"

echo "== pip wheel ./python"
"$PY" -m pip wheel -q --no-deps ./python -w "$WHEELS"
wheel="$(ls "$WHEELS"/strata-*.whl)"
echo "   $(basename "$wheel")"
case "$(basename "$wheel")" in
    *-none-any.whl) echo "py-tests: $wheel is not a platform wheel" >&2; exit 1 ;;
esac
contents="$("$PY" -m zipfile -l "$wheel")"
for f in strata/libstrata.abi3.so strata/strata_cffi.h strata/py.typed; do
    grep -q "^$f " <<<"$contents" || { echo "py-tests: the wheel has no $f" >&2; exit 1; }
done
"$PY" -m pip install -q "$wheel"
# The package imports with no environment variable, from outside the source tree.
(cd "$VENV" && "$PY" -c 'import strata; print("   strata", strata.__version__, "loads", strata.library_path())')
[ -z "${STRATA_PY_SETUP_ONLY:-}" ] || exit 0

echo "== mypy --strict python/src/strata"
"$PY" -m mypy --strict --ignore-missing-imports --no-incremental python/src/strata
# From python/tests, so that `import strata` is the installed package (python/src is not on the path).
cd python/tests
"$PY" -m pytest -q -rsx -p no:cacheprovider . "$@"
