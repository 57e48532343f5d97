# Shared by the test scripts (sourced, never run): Debian packages and Python virtual
# environments, installed only when missing.

# need_debs PKG...: installs the Debian packages named (as root, with apt-get), or says how to
# install them and fails. Nothing to do without arguments.
need_debs() {
    [ "$#" -gt 0 ] || return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "missing: $* (install with: apt-get install -y $*)" >&2
        exit 1
    fi
    echo "== installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# need_mpi: Open MPI (mpirun, mpicc) and libclang (rsmpi's bindgen) for the `mpi` feature.
need_mpi() {
    local pkgs=()
    command -v mpirun >/dev/null 2>&1 || pkgs+=(openmpi-bin)
    command -v mpicc >/dev/null 2>&1 || pkgs+=(libopenmpi-dev)
    compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || pkgs+=(libclang-dev)
    need_debs "${pkgs[@]}"
}

# make_venv DIR: a Python virtual environment at DIR, kept if one is there; where `python3 -m
# venv` fails (Debian without python3-venv), python3-venv is installed first.
make_venv() {
    [ -x "$1/bin/python" ] && return 0
    if ! python3 -m venv "$1" 2>/dev/null; then
        rm -rf "$1"
        need_debs python3-venv
        python3 -m venv "$1"
    fi
}

# triton_setup: builds libtriton_strata.so with CMake (STRATA_TRITON=ON), installs it into
# build/triton/prefix (<prefix>/backends/strata/libtriton_strata.so next to <prefix>/lib/libstrata.so)
# and makes build/triton-venv with nvidia-pytriton==0.7.0 (tritonserver 2.51.0), tritonclient,
# pytest and ml_dtypes. Sets TRITON_PREFIX, TRITON_BUILD and TRITON_PY. Returns 1 (after saying
# why) when the venv cannot be built; a failed build exits.
triton_setup() {
    command -v cmake >/dev/null 2>&1 || need_debs cmake
    TRITON_BUILD="$ROOT/build/triton"
    TRITON_PREFIX="$TRITON_BUILD/prefix"
    echo "== building and installing the Triton backend (CMake, STRATA_TRITON=ON)"
    cmake -S "$ROOT" -B "$TRITON_BUILD/cmake" -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_TRITON=ON \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$TRITON_PREFIX" >"$TRITON_BUILD.cmake.log" 2>&1 ||
        { cat "$TRITON_BUILD.cmake.log"; exit 1; }
    # (explicit exits: a caller's `triton_setup || ...` turns errexit off in here)
    cmake --build "$TRITON_BUILD/cmake" --target triton_strata triton_api_version triton_backend_host || exit 1
    cmake --install "$TRITON_BUILD/cmake" >/dev/null || exit 1
    test -f "$TRITON_PREFIX/backends/strata/libtriton_strata.so" ||
        { echo "missing backends/strata/libtriton_strata.so after cmake --install" >&2; exit 1; }
    local venv="$ROOT/build/triton-venv"
    make_venv "$venv" || exit 1
    TRITON_PY="$venv/bin/python"
    if ! "$TRITON_PY" -c 'import pytriton, tritonclient.http, tritonclient.grpc, pytest, ml_dtypes' 2>/dev/null; then
        echo "== installing nvidia-pytriton==0.7.0 (tritonserver 2.51.0), tritonclient[http,grpc] and pytest into build/triton-venv"
        if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$TRITON_PY" -m pip install -q \
                nvidia-pytriton==0.7.0 'tritonclient[http,grpc]' pytest ml_dtypes; then
            echo "build/triton-venv could not be built: pip install nvidia-pytriton==0.7.0 failed"
            return 1
        fi
    fi
}
