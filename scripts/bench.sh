#!/usr/bin/env bash
# The lookup benchmark: strata keyed lookup and dense gather beside a multi-threaded memcpy of
# the same bytes and the hand-written baseline ../shared/anchors/hps_like.cc, in one run.
# Arguments: [rows dim batch threads] (default 1000000 128 200000 and all CPUs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -e /usr/include/absl/container/flat_hash_map.h ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq --no-install-recommends libabsl-dev g++ >/dev/null
    else
        echo "note: install libabsl-dev to run the baseline beside strata" >&2
    fi
fi
cargo bench --bench lookup -- "$@"
cargo bench --bench tiered
