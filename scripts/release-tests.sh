#!/usr/bin/env bash
# What a distribution checks before it ships a release (scripts/test.sh runs this; the wheel's
# auditwheel check is in scripts/py-tests.sh, the symbol versions in tests/abi_surface.rs):
#   1. the ABI against the last release: abidw describes this checkout's libstrata (a dev build
#      at opt-level 0, full debug info) and abidiff compares it with
#      tests/abi/libstrata-0.3.0.abi, with the suppressions of tests/abi/libstrata.abignore,
#      after tests/abi/follow_moves.py has moved the baseline's structs to the Rust modules that
#      now hold them. Only added functions (and fields appended to structs passed by pointer)
#      may differ. The same check runs on three scratch copies of the crate, each with one
#      deliberate change (tests/abi/scratch_change.py): a field inserted mid-struct and a field
#      appended to a struct returned by value must fail it, an appended field with its
#      initialiser kept at the old version node plus a new function must pass;
#   2. the source distribution: `python -m build --sdist python` (the crate inside, from `cargo
#      package`), installed into a fresh venv with `pip install --no-binary strata`, which builds
#      the library from that crate, then imported and used from outside the source tree.
# Installs abigail-tools with apt-get when root (else says to). The checkout and the scratch
# copies share one target folder (the checkout's build compiles the dependencies), and the
# sdist's library is built with thin LTO and 16 codegen units (it checks that the sdist builds
# and works, not its speed; the wheel of scripts/py-tests.sh has the release profile).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
unset STRATA_LIBRARY STRATA_LIB
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
command -v abidiff >/dev/null 2>&1 || need_debs abigail-tools
WORK="$ROOT/build/release"
BASELINE="$ROOT/tests/abi/libstrata-0.3.0.abi"
SUPPRESSIONS="$ROOT/tests/abi/libstrata.abignore"
rm -rf "$WORK/scratch" "$WORK/sdist" "$WORK/venv" "$WORK/sdist-venv"
mkdir -p "$WORK"

# abi_check NAME LIB INCLUDE_DIR: 0 when abidiff finds LIB compatible with the baseline (nothing
# removed or changed; additions allowed), else 1; the report is in $WORK/NAME.abidiff.
abi_check() {
    local name="$1" lib="$2" include="$3" rc=0
    abidw --headers-dir "$include" --out-file "$WORK/$name.abi" "$lib"
    # The baseline with structs that moved between Rust modules of ffi/ followed to their new
    # module: abidiff names types by Rust path; a C host sees only the struct's name and layout.
    python3 tests/abi/follow_moves.py "$BASELINE" "$WORK/$name.abi" "$WORK/$name.baseline.abi" >"$WORK/$name.moves"
    abidiff --suppressions "$SUPPRESSIONS" "$WORK/$name.baseline.abi" "$WORK/$name.abi" >"$WORK/$name.abidiff" || rc=$?
    # abidiff's exit status is a bit set: 1 error, 2 usage error, 4 an ABI change (added functions
    # set it too), 8 an incompatible change (a removed symbol).
    if (( rc & 3 )); then
        cat "$WORK/$name.abidiff" >&2
        echo "release-tests: abidiff failed on $lib (exit $rc)" >&2
        exit 1
    fi
    if (( rc & 8 )) || grep -Eq '[1-9][0-9]* (Removed|Changed)' "$WORK/$name.abidiff"; then
        return 1
    fi
    grep -q 'Functions changes summary' "$WORK/$name.abidiff" || (( rc == 0 )) || return 1
    return 0
}

# Every library this script describes is a dev build at opt-level 0 in one target folder of its
# own: abidw reads the exported symbols and the DWARF types, which the optimisation level does
# not change (the verdicts and reports below were the same at opt-level 1), and the checkout's
# build compiles the dependencies once for it and the scratch copies. It also leaves
# target/debug, which the other suites build with their own features, alone.
SCRATCH_TARGET="$WORK/scratch/target"
mkdir -p "$WORK/scratch"
dev_build() { CARGO_TARGET_DIR="$SCRATCH_TARGET" CARGO_PROFILE_DEV_OPT_LEVEL=0 cargo build --lib -q; }

echo "== abidiff: this checkout against 0.3.0 ($(abidiff --version))"
dev_build
cp "$SCRATCH_TARGET/debug/libstrata.so" "$WORK/current.so"
if ! abi_check current "$WORK/current.so" "$ROOT/include"; then
    cat "$WORK/current.abidiff"
    echo "release-tests: the ABI changed incompatibly since 0.3.0 (abidiff's report above); see docs/releasing.md" >&2
    exit 1
fi
cat "$WORK/current.moves"
sed -n 's/^/   /; /summary/p; /\[A\]/p' "$WORK/current.abidiff"

echo "== abidiff on scratch copies of the crate, each with one deliberate change"
cargo package --no-verify --allow-dirty -q --target-dir "$WORK/scratch/package" >"$WORK/package.log" 2>&1 ||
    { cat "$WORK/package.log"; echo "release-tests: cargo package failed" >&2; exit 1; }
crate="$(ls "$WORK"/scratch/package/package/strata-*.crate)"
for change in incompatible appended-unversioned compatible; do
    dir="$WORK/scratch/$change"
    mkdir -p "$dir"
    tar xzf "$crate" -C "$dir" --strip-components=1
    python3 tests/abi/scratch_change.py "$dir" "$change"
    (cd "$dir" && dev_build)
    cp "$SCRATCH_TARGET/debug/libstrata.so" "$WORK/scratch/$change.so"
    if abi_check "scratch-$change" "$WORK/scratch/$change.so" "$dir/include"; then verdict=compatible; else verdict=incompatible; fi
    want=incompatible
    [ "$change" = compatible ] && want=compatible
    if [ "$verdict" != "$want" ]; then
        cat "$WORK/scratch-$change.abidiff"
        echo "release-tests: abidiff found the '$change' scratch change $verdict; it is $want" >&2
        exit 1
    fi
    echo "   $change: $verdict, as it must be ($(grep -m1 'Functions changes summary' "$WORK/scratch-$change.abidiff"))"
done
# The compatible copy really carries both initialisers, at their nodes.
readelf --dyn-syms --wide "$WORK/scratch/compatible.so" | grep -q ' strata_lookup_stats_default@STRATA_0\.3$' &&
    readelf --dyn-syms --wide "$WORK/scratch/compatible.so" | grep -q ' strata_lookup_stats_default@@STRATA_0\.3\.2$' ||
    { echo "release-tests: the compatible scratch copy lacks its versioned initialisers" >&2; exit 1; }

echo "== sdist: python -m build --sdist python"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q build
"$WORK/venv/bin/python" -m build --sdist python -o "$WORK/sdist" >"$WORK/sdist.log" 2>&1 ||
    { cat "$WORK/sdist.log"; echo "release-tests: python -m build --sdist failed" >&2; exit 1; }
sdist="$(ls "$WORK"/sdist/strata-*.tar.gz)"
echo "   $(basename "$sdist")"
top="$(basename "$sdist" .tar.gz)"
listing="$(tar tzf "$sdist")"
for f in setup.py pyproject.toml src/strata/__init__.py native/strata_jax.cc rust/Cargo.toml rust/Cargo.lock \
    rust/build.rs rust/cbindgen.toml rust/libstrata.map rust/include/strata.h rust/include/strata_cffi.h rust/src/lib.rs \
    rust/LICENSE; do
    grep -qx "$top/$f" <<<"$listing" || { echo "release-tests: the sdist has no $f" >&2; exit 1; }
done
if grep -q "^$top/rust/tests/\|^$top/rust/benches/\|^$top/rust/target/" <<<"$listing"; then
    echo "release-tests: the sdist carries tests, benches or build output" >&2
    exit 1
fi

echo "== sdist: pip install --no-binary strata into a fresh venv (builds the crate inside it)"
python3 -m venv "$WORK/sdist-venv"
SPY="$WORK/sdist-venv/bin/python"
"$SPY" -m pip install -q 'numpy>=2.1'
CARGO_PROFILE_RELEASE_LTO=thin CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_TARGET_DIR="$WORK/sdist-target" \
    "$SPY" -m pip install -q --no-binary strata "$sdist"
# From a folder with no strata sources: the installed package, its own library.
(cd "$WORK" && "$SPY" - <<'EOF'
import numpy as np
import strata

lib = strata.library_path()
assert "sdist-venv" in str(lib), lib
rng = np.random.default_rng(7)
rows = rng.standard_normal((1000, 16), dtype=np.float32)
table = strata.Table.from_array(rows)
keys = rng.integers(0, 1000, 257)
out = table.lookup(keys)
assert np.array_equal(out, rows[keys]), "lookup differs from NumPy"
print(f"   strata {strata.__version__} from the sdist: {lib}; a lookup of 257 keys equals rows[keys]")
EOF
)
