#!/usr/bin/env bash
# The MPI tests (cargo feature `mpi`), from any folder. On a fresh Debian machine, run as root,
# it first installs what they need (libopenmpi-dev openmpi-bin libclang-dev); otherwise it says
# what to install.
#   1. cargo test --features mpi for tests/mpi_ranks (which runs itself under mpirun with 1, 2 and
#      4 ranks, oversubscribed, each under `timeout`) and tests/mpi_build;
#   2. c_examples/partitioned_mpi.c built with mpicc against include/ and the debug libstrata.so
#      (with MPI), under ASan+UBSan, run with mpirun -n 2 and -n 3. LeakSanitizer is off: Open MPI
#      leaks at MPI_Finalize from plugins it has unloaded, so leaks cannot be suppressed by name.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
need_mpi

# Open MPI refuses root without these, and more ranks than cores without oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo "== cargo test --features mpi (mpirun -n 1, 2 and 4)"
cargo test --features mpi --test mpi_ranks --test mpi_build

echo "== c_examples/partitioned_mpi.c under ASan+UBSan"
cargo build --lib --features mpi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mpicc -std=c11 -Wall -Wextra -Werror -pedantic -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -I"$ROOT/include" c_examples/partitioned_mpi.c -L"$ROOT/target/debug" -lstrata -Wl,-rpath,"$ROOT/target/debug" \
    -o "$WORK/partitioned_mpi"
export ASAN_OPTIONS=detect_leaks=0
timeout -k 5 120 mpirun -n 2 "$WORK/partitioned_mpi"
timeout -k 5 120 mpirun -n 3 "$WORK/partitioned_mpi" 1001 8 1000
echo "MPI tests passed"
