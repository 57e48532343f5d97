#!/usr/bin/env bash
# The distributed lookup benchmark (benches/dist.rs, feature `mpi`): 2 and 4 MPI ranks on this
# machine (batch keys each) against one process looking up all their keys on every core, the two
# interleaved round by round in one MPI job; prints the ratio with its spread, where each rank's
# time goes (bucketing, key exchange, gather, row exchange, reorder into out), the bytes sent and
# an estimate of the rate at 8 and 64 nodes over 100 Gb/s.
#   bash scripts/bench-mpi.sh [rows dim batch]        defaults: 1000000 64 100000
#   STRATA_BENCH_ROUNDS=N (default 11) for more rounds, e.g. under perf.
# Needs libopenmpi-dev openmpi-bin libclang-dev (scripts/mpi-tests.sh installs them).
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Root needs the first two; 4 ranks on 2 cores need oversubscription (Open MPI then also makes
# waiting ranks yield the CPU on its own). Ranks are not bound (--bind-to none, in the benchmark)
# so rank 0 can run the single-process side on every core; each rank's lookups still use only its
# share of the cores (the library default).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cargo bench --features mpi --bench dist -- "$@"
