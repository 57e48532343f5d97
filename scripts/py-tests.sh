#!/usr/bin/env bash
# Builds libstrata.so (release) and runs the ctypes/NumPy test suite in python/tests.
# Needs python3 with pip; installs numpy>=2.1 (for __dlpack__(max_version=...)) and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install -q 'numpy>=2.1' pytest
cargo build --release
python3 -m pytest -q -rx python/tests "$@"
