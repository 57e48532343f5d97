#!/usr/bin/env bash
# The Heat round trips (python/tests/test_heat.py) with the real heat package from PyPI (which
# brings PyTorch) and mpi4py, under mpirun -n 1, -n 2 and -n 4 (oversubscribed, each under
# `timeout`): Heat array -> strata table -> lookups equal to NumPy indexing ->
# heat.from_partitioned(table) equal to the original, zero copy, for split=0 (Heat's chunks and
# uneven ones) and split=None.
#   - heat, mpi4py and pytest go into a virtual environment, build/heat-venv (about 5 GB with
#     PyTorch's CUDA wheels; a few minutes to install, once), so the main environment is left
#     alone. mpi4py's wheel runs on Debian's Open MPI 4.1; where it does not, it is built from
#     source against the system MPI (mpicc).
#   - the strata package is installed from ./python with STRATA_MPI=1, so setuptools-rust builds
#     libstrata with the `mpi` feature into it (the switch users take), and the script checks
#     that the installed library reports the feature.
# scripts/test.sh runs it; STRATA_SKIP_HEAT=1 there leaves it out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
need_mpi

VENV="$ROOT/build/heat-venv"
make_venv "$VENV"
PY="$VENV/bin/python"
if ! "$PY" -c 'import heat, mpi4py, pytest' 2>/dev/null; then
    echo "== installing heat, mpi4py and pytest into build/heat-venv"
    "$PY" -m pip install -q 'heat>=1.8' mpi4py pytest
fi

# Open MPI refuses root without these, and more ranks than cores without oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if ! timeout -k 5 120 mpirun -n 1 "$PY" -c 'from mpi4py import MPI; MPI.COMM_WORLD.Barrier()' >/dev/null 2>&1; then
    echo "== mpi4py's wheel does not run on this MPI: building it from source (mpicc)"
    "$PY" -m pip install -q --force-reinstall --no-deps --no-binary mpi4py mpi4py
fi

echo "== the strata package built with the mpi feature (STRATA_MPI=1 pip install ./python)"
unset STRATA_LIBRARY STRATA_LIB
STRATA_MPI=1 "$PY" -m pip install -q --force-reinstall --no-deps ./python
"$PY" -c 'import strata, sys; f = strata.build_features(); sys.exit(0 if f.get("mpi") else "the installed strata was built without mpi: " + repr(f))'
# One thread per rank for PyTorch and strata: up to 4 ranks share the cores.
export OMP_NUM_THREADS=1 STRATA_NUM_THREADS=1
LIMIT="${STRATA_MPI_TIMEOUT:-300}"
# Run from outside the source tree so that `import strata` is the installed package. `-p test_heat`
# loads its hook that turns a failure on one rank into MPI_Abort (no rank left waiting).
cd python/tests
for n in 1 2 4; do
    echo "== mpirun -n $n pytest test_heat.py"
    timeout -k 10 "$LIMIT" mpirun -n "$n" "$PY" -m pytest -q -p no:cacheprovider -p test_heat -rsx test_heat.py "$@"
done
echo "Heat tests passed"
