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
