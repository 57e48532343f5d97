#!/usr/bin/env bash
# The distributed lookup benchmark (benches/dist.rs, feature `mpi`): one process against 2 and 4
# MPI ranks on this machine, same keys, with the exchange's share of the distributed time.
#   bash scripts/bench-mpi.sh [rows dim batch]        defaults: 1000000 64 100000
# Needs libopenmpi-dev openmpi-bin libclang-dev (scripts/mpi-tests.sh installs them).
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cargo bench --features mpi --bench dist -- "$@"
