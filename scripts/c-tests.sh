#!/usr/bin/env bash
# strata's C-side test suite, runnable from any folder:
#   - builds libstrata (cargo build --release);
#   - configures and builds the CMake project in build/c-asan with STRATA_SANITIZE=ON and runs
#     each ctest test (the C examples) under AddressSanitizer, LeakSanitizer and UBSan;
#   - compiles the header tests in tests/c/ as C11 and C++17 (and C17 / C++11 / C++20) with
#     -Wall -Wextra -Werror -pedantic, and links and runs the ones with a main();
#   - checks the version macros against strata_version() and Cargo.toml;
#   - runs the examples under valgrind when valgrind is installed;
#   - starts a throwaway 3-node Redis Cluster (scripts/redis-cluster.sh) for
#     c_examples/redis_cluster.c when redis-server is installed, and stops it on exit.
# Ends with `c-tests: N passed, M failed` and a non-zero exit status if anything failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ASAN_BUILD="$ROOT/build/c-asan"
WORK="$ROOT/build/c-tests"
LIBDIR="$ROOT/target/release"
WARN=(-Wall -Wextra -Werror -pedantic)
LINK=(-L"$LIBDIR" -lstrata -Wl,-rpath,"$LIBDIR")
JOBS="$(nproc 2>/dev/null || echo 2)"

passed=0
failed=0
last_ok=0
failures=()

# check NAME COMMAND...: runs one check and counts it.
check() {
    local name=$1
    shift
    echo "--- $name"
    if "$@"; then
        passed=$((passed + 1))
        last_ok=1
        echo "ok   $name"
    else
        last_ok=0
        failed=$((failed + 1))
        failures+=("$name")
        echo "FAIL $name"
    fi
}

finish() {
    echo
    local f
    for f in ${failures[@]+"${failures[@]}"}; do
        echo "failed: $f"
    done
    echo "c-tests: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

# require NAME COMMAND...: a check everything else depends on; stops the suite if it fails.
require() {
    check "$@"
    if [ "$last_ok" -ne 1 ]; then
        finish || exit 1
    fi
}

if ! command -v cmake >/dev/null 2>&1; then
    echo "c-tests: cmake is not installed; install it with: apt-get install -y cmake" >&2
    failed=$((failed + 1))
    failures+=("cmake installed")
    finish || exit 1
fi

mkdir -p "$WORK"

# ---- the library and the CMake project under sanitizers --------------------------------

require "cargo build --release" cargo build --release

# The SONAME (build.rs): libstrata.so.0.<minor> while the version is 0.x, else libstrata.so.<major>;
# programs linked with -L target/release -lstrata find it through the symlink build.rs makes there.
SONAME="$(sed -n 's/^version = "\([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p' Cargo.toml | head -n 1 |
    awk '{ print ($1 == 0) ? "libstrata.so.0." $2 : "libstrata.so." $1 }')"
# needed FILE: the NEEDED entries of an ELF file, one a line.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
soname_of_the_library() {
    readelf -d "$LIBDIR/libstrata.so" | grep SONAME &&
        [ "$(readelf -d "$LIBDIR/libstrata.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')" = "$SONAME" ] &&
        [ "$(readlink "$LIBDIR/$SONAME")" = libstrata.so ]
}
check "readelf -d: libstrata.so has SONAME $SONAME (and target/release/$SONAME -> libstrata.so)" soname_of_the_library
check "cmake configure (build/c-asan, STRATA_SANITIZE=ON)" \
    cmake -S "$ROOT" -B "$ASAN_BUILD" -DCMAKE_BUILD_TYPE=Debug -DSTRATA_BUILD_EXAMPLES=ON -DSTRATA_SANITIZE=ON
cmake_ok=$last_ok
if [ "$cmake_ok" -eq 1 ]; then
    check "cmake build (build/c-asan)" cmake --build "$ASAN_BUILD" --parallel "$JOBS"
    cmake_ok=$last_ok
fi

# LeakSanitizer stops the world with ptrace; some sandboxes forbid that. Probe with a
# program that leaks on purpose: if LSan cannot report it, run without leak detection.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
printf '#include <stdlib.h>\nvoid *volatile p;\nint main(void) { p = malloc(64); p = 0; return 0; }\n' >"$WORK/lsan_probe.c"
if gcc -fsanitize=address -g "$WORK/lsan_probe.c" -o "$WORK/lsan_probe" 2>"$WORK/lsan_probe.log"; then
    if ASAN_OPTIONS="detect_leaks=1" "$WORK/lsan_probe" >>"$WORK/lsan_probe.log" 2>&1 ||
        ! grep -q "ERROR: LeakSanitizer: detected memory leaks" "$WORK/lsan_probe.log"; then
        echo "note: LeakSanitizer cannot run here (no ptrace permission?); running ASan with detect_leaks=0:"
        sed -n '1,3p' "$WORK/lsan_probe.log" | sed 's/^/    /'
        export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
    fi
else
    echo "note: cannot build the LeakSanitizer probe; running ASan with detect_leaks=0"
    export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
fi
echo "ASAN_OPTIONS=$ASAN_OPTIONS"

# (cd instead of ctest --test-dir, which needs CMake 3.20)
run_ctest() { (cd "$ASAN_BUILD" && ctest "$@"); }
ctests=()
if [ "$cmake_ok" -eq 1 ]; then
    mapfile -t ctests < <(run_ctest -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: *//p')
    if [ "${#ctests[@]}" -eq 0 ]; then
        check "ctest finds the example tests" false
    fi
else
    echo "note: the CMake build failed; skipping the ctest runs"
fi
# A throwaway Redis Cluster for c_examples/redis_cluster.c (ctest and valgrind), stopped on exit.
REDIS_DIR="$WORK/redis-cluster"
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    trap 'bash "$ROOT/scripts/redis-cluster.sh" stop "$REDIS_DIR"' EXIT
    rm -rf "$REDIS_DIR"
    if redis_env="$(bash "$ROOT/scripts/redis-cluster.sh" start "$REDIS_DIR")"; then
        eval "$redis_env"
    else
        check "a local Redis Cluster for the redis_cluster example starts" false
    fi
else
    echo "note: redis-server is not installed; the redis_cluster example is skipped (apt-get install -y redis-server)"
fi
for t in ${ctests[@]+"${ctests[@]}"}; do
    check "ctest $t (ASan+UBSan)" run_ctest --output-on-failure -R "^${t}\$"
done

# ---- header tests --------------------------------------------------------------------------

# compile_only STD COMPILER SOURCE
compile_only() {
    "$2" "-std=$1" "${WARN[@]}" -I"$ROOT/include" -c "$3" -o "$WORK/$(basename "$3").$1.o"
}
# build_and_run STD COMPILER SOURCE [ARGS...]
build_and_run() {
    local std=$1 cc=$2 src=$3
    shift 3
    local exe="$WORK/$(basename "$src").$std"
    "$cc" "-std=$std" "${WARN[@]}" -I"$ROOT/include" -I"$ROOT/tests/c" "$src" "${LINK[@]}" -o "$exe" && "$exe" "$@"
}

check "strata.h alone as C11" compile_only c11 gcc tests/c/header_c.c
check "strata.h alone as C17" compile_only c17 gcc tests/c/header_c.c
check "strata.h alone as C++17" compile_only c++17 g++ tests/c/header_cxx.cpp
check "strata.h alone as C++11" compile_only c++11 g++ tests/c/header_cxx.cpp
check "strata.h alone as C++20" compile_only c++20 g++ tests/c/header_cxx.cpp
check "strata.h after a host dlpack.h, C11 (build and run)" build_and_run c11 gcc tests/c/header_after_host.c
check "strata.h after a host dlpack.h, C++17 (build and run)" build_and_run c++17 g++ tests/c/header_after_host.cpp

CARGO_VERSION="$(sed -n 's/^version = "\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)"
check "version macros agree with strata_version() and Cargo.toml ($CARGO_VERSION)" \
    build_and_run c11 gcc tests/c/version.c "$CARGO_VERSION"

# ---- CMake options -> cargo features -> STRATA_HAS_* macros --------------------------------

# STRATA_CUDA=OFF: a library without the cuda feature (dev profile, the build test.sh already
# makes with `cargo build --lib --no-default-features`), whose macros and runtime both say so.
NOCUDA_BUILD="$ROOT/build/c-nocuda"
features_without_cuda() {
    cmake -S "$ROOT" -B "$NOCUDA_BUILD" -DSTRATA_CUDA=OFF -DSTRATA_MPI=OFF -DSTRATA_CARGO_PROFILE=dev >/dev/null &&
        grep -qx "build --profile dev --lib --no-default-features" "$NOCUDA_BUILD/strata_cargo_args.txt" &&
        grep -q "define STRATA_HAS_CUDA 0" "$NOCUDA_BUILD/include/strata_features.h" &&
        cmake --build "$NOCUDA_BUILD" --target features >/dev/null &&
        "$NOCUDA_BUILD/features" 0
}
check "STRATA_CUDA=OFF: no cargo features, STRATA_HAS_CUDA 0 == strata_build_features()" features_without_cuda
# STRATA_MPI=ON maps to the cargo feature `mpi` (configure only: scripts/mpi-tests.sh builds and
# runs the MPI library).
mpi_option_maps_to_the_feature() {
    local log="$WORK/mpi-configure.log"
    cmake -S "$ROOT" -B "$ROOT/build/c-mpi" -DSTRATA_MPI=ON -DSTRATA_CUDA=ON >"$log" 2>&1 &&
        grep -qx "build --profile release --lib --no-default-features --features cuda,default,mpi" \
            "$ROOT/build/c-mpi/strata_cargo_args.txt" &&
        grep -q "define STRATA_HAS_MPI 1" "$ROOT/build/c-mpi/include/strata_features.h"
}
check "STRATA_MPI=ON maps to cargo feature mpi" mpi_option_maps_to_the_feature
# STRATA_TENSORRT: AUTO builds the plugin only where TensorRT is; ON without it is refused clearly.
tensorrt_option() {
    local log="$WORK/trt-configure.log"
    if cmake -S "$ROOT" -B "$ROOT/build/c-trt" -DSTRATA_TENSORRT=ON >"$log" 2>&1; then
        grep -q "strata: building the TensorRT plugin" "$log" &&
            cmake --build "$ROOT/build/c-trt" --target strata_trt_plugin >/dev/null
    else
        echo "(no TensorRT here: the option must be refused clearly)"
        grep -q "STRATA_TENSORRT=ON, but TensorRT" "$log"
    fi
}
check "STRATA_TENSORRT=ON builds the plugin, or is refused without TensorRT" tensorrt_option

# ---- installed packages: find_package(strata) and pkg-config ------------------------------

PREFIX="$WORK/prefix"
rm -rf "$PREFIX" "$WORK/consumer"
install_strata() {
    cmake -S "$ROOT" -B "$ROOT/build/pkg" -DSTRATA_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX="$PREFIX" >/dev/null &&
        cmake --build "$ROOT/build/pkg" >/dev/null && cmake --install "$ROOT/build/pkg" >/dev/null &&
        [ -f "$PREFIX/include/strata_features.h" ]
}
check "cmake --install to a prefix" install_strata
# libstrata.so -> libstrata.so.0.<minor> -> libstrata.so.<version> (the file), as ldconfig would.
installed_symlink_chain() {
    local lib version
    lib="$(dirname "$(find "$PREFIX" -name libstrata.a | head -n 1)")"
    version="$(sed -n 's/^version = "\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)"
    ls -l "$lib" | grep libstrata &&
        [ "$(readlink "$lib/libstrata.so")" = "$SONAME" ] &&
        [ "$(readlink "$lib/$SONAME")" = "libstrata.so.$version" ] &&
        [ -f "$lib/libstrata.so.$version" ] && [ ! -L "$lib/libstrata.so.$version" ]
}
check "installed libstrata.so -> $SONAME -> libstrata.so.<version>" installed_symlink_chain
# The installed library carries the version nodes of libstrata.map, as cargo's does (the same
# build.rs links both): every exported function at its node, strata_version at STRATA_0.3.
installed_symbol_versions() {
    local lib
    lib="$(dirname "$(find "$PREFIX" -name libstrata.a | head -n 1)")/$SONAME"
    readelf --dyn-syms --wide "$lib" | grep -q ' strata_version@@STRATA_0\.3$' &&
        ! readelf --dyn-syms --wide "$lib" | awk '$4 == "FUNC" && $7 != "UND" && $8 !~ /@@STRATA_/' | grep -q .
}
check "installed $SONAME: every exported function has its version node (readelf --dyn-syms)" installed_symbol_versions
consumer_cmake() {
    cmake -S "$ROOT/tests/consumer" -B "$WORK/consumer" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null &&
        cmake --build "$WORK/consumer" >/dev/null &&
        # it records the SONAME and loads the installed, versioned library
        needed "$WORK/consumer/consumer" | grep -qx "$SONAME" &&
        ldd "$WORK/consumer/consumer" | grep -F "$SONAME => $PREFIX/" &&
        LD_LIBRARY_PATH="$(dirname "$(find "$PREFIX" -name libstrata.so | head -n 1)")" "$WORK/consumer/consumer" &&
        "$WORK/consumer/consumer_static"
}
check "C++ consumer with find_package(strata) (shared, NEEDED $SONAME, and static)" consumer_cmake
consumer_pkg_config() {
    local pc libdir
    pc="$(dirname "$(find "$PREFIX" -name strata.pc | head -n 1)")"
    libdir="$(PKG_CONFIG_PATH="$pc" pkg-config --variable=libdir strata)"
    # shellcheck disable=SC2046
    gcc -std=c11 "${WARN[@]}" "$ROOT/tests/consumer/consumer.c" $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs strata) \
        -Wl,-rpath,"$libdir" -o "$WORK/consumer_pc" && needed "$WORK/consumer_pc" | grep -qx "$SONAME" &&
        "$WORK/consumer_pc"
}
check "C consumer with pkg-config --cflags --libs strata (NEEDED $SONAME)" consumer_pkg_config

# ---- the CUDA example -----------------------------------------------------------------------

# c_examples/cuda_lookup.c against the CUDA runtime's headers and libcudart from PyPI
# (nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12 for crt/; scripts/test.sh installs them):
# compiled with every warning, then run; without a device it says "skipped: no CUDA device".
cuda_example() {
    local dirs
    dirs="$(python3 -c 'import nvidia.cuda_runtime as r, nvidia.cuda_nvcc as c, os
print(os.path.join(list(r.__path__)[0], "include"), os.path.join(list(c.__path__)[0], "include"), os.path.join(list(r.__path__)[0], "lib"))' 2>/dev/null)" || {
        echo "the CUDA runtime headers are not installed (pip install nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12)"
        [ -z "${STRATA_REQUIRE_CUDA_HEADERS:-}" ]
        return
    }
    set -- $dirs
    gcc -std=c11 "${WARN[@]}" -I"$ROOT/include" -I"$1" -I"$2" c_examples/cuda_lookup.c "${LINK[@]}" \
        -L"$3" -l:libcudart.so.12 -Wl,-rpath,"$3" -o "$WORK/cuda_lookup" &&
        "$WORK/cuda_lookup" static 20000 64 5000 | tee "$WORK/cuda_lookup.log" &&
        grep -Eq "skipped: no CUDA device|GB/s of rows" "$WORK/cuda_lookup.log"
}
check "c_examples/cuda_lookup.c (CUDA runtime API; skips without a device)" cuda_example

# ---- valgrind ------------------------------------------------------------------------------

# valgrind_example NAME [ARGS...]: builds c_examples/NAME.c without sanitizers and runs it under
# memcheck; memory errors and definite leaks fail it.
valgrind_example() {
    local name=$1
    shift
    valgrind_program "c_examples/$name.c" "$ROOT/include" "$@"
}

# valgrind_program SOURCE INCLUDE_DIR [ARGS...]: the same for any C program (tests/abi/ too).
valgrind_program() {
    local src=$1 inc=$2 name
    shift 2
    name=$(basename "$src" .c)
    gcc -std=c11 "${WARN[@]}" -O1 -g -I"$inc" "$src" "${LINK[@]}" -lm -o "$WORK/$name.vg" &&
        valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
            "$WORK/$name.vg" "$@"
}

if command -v valgrind >/dev/null 2>&1; then
    check "valgrind demo 4000 32 1000" valgrind_example demo 4000 32 1000
    check "valgrind errors" valgrind_example errors
    check "valgrind adopt" valgrind_example adopt
    check "valgrind server" valgrind_example server
    check "valgrind pooled 300 12" valgrind_example pooled 300 12
    check "valgrind quantized 2000 64 int8" valgrind_example quantized 2000 64 int8
    check "valgrind quantized 500 32 int4" valgrind_example quantized 500 32 int4
    if [ -n "${STRATA_REDIS_ADDRESS:-}" ]; then
        check "valgrind redis_cluster" valgrind_example redis_cluster
    fi
    check "valgrind tests/abi/struct_size.c" valgrind_program tests/abi/struct_size.c "$ROOT/include"
    check "valgrind tests/abi/old_host.c (built against the frozen 0.3 header)" \
        valgrind_program tests/abi/old_host.c "$ROOT/tests/abi"
    check "valgrind tests/c/shared_server.c (8 threads x 20 opens and frees)" \
        valgrind_program tests/c/shared_server.c "$ROOT/include" 20
    check "valgrind tests/c/server_missing.c (keys no tier holds; STRATA_MISSING_ERROR)" \
        valgrind_program tests/c/server_missing.c "$ROOT/include"
else
    echo "note: valgrind is not installed; skipping the valgrind runs (apt-get install -y valgrind)"
fi

finish
