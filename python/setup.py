"""Builds libstrata with cargo and ships it inside the ``strata`` package.

setuptools-rust runs ``cargo rustc --lib --crate-type cdylib --release`` on the crate one folder
up (``../Cargo.toml``) and copies the library into the package as ``strata/libstrata.abi3.so``
(``Binding.NoBinding``: the crate is a C-ABI library that the package loads with ctypes, not a
Python extension module, so it does not depend on the Python ABI and one wheel per platform,
tagged ``cp39-abi3-<platform>``, serves every CPython from 3.9). Debug info is stripped from the
copy.

Switches, as environment variables (the names of the CMake options):
  STRATA_MPI=1    build with the ``mpi`` feature (needs libopenmpi-dev, openmpi-bin, libclang-dev)
  STRATA_CUDA=0   build without the default ``cuda`` feature

The version is the crate's (``[package] version`` in Cargo.toml), the one place it is written.
The package also carries ``strata_cffi.h`` (``include/strata_cffi.h``, for ``strata.cdef()``).

The source distribution (``python -m build --sdist python``) carries the crate in ``rust/``: what
``cargo package`` puts into it (the sources, Cargo.lock, build.rs, cbindgen.toml, libstrata.map
and include/, with tests and benches left out of its manifest), and the JAX handlers' source in
``native/``. Built from an sdist, the library comes from that copy of the crate, with
``cargo --locked``: the dependencies are the versions Cargo.lock names.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustExtension, Strip

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = pathlib.Path(__file__).resolve().parent
# The crate: one folder up in the repository, in rust/ inside a source distribution.
IN_SDIST = (HERE / "rust" / "Cargo.toml").is_file()
ROOT = HERE / "rust" if IN_SDIST else HERE.parent
CARGO_TOML = ROOT / "Cargo.toml"
CFFI_HEADER = ROOT / "include" / "strata_cffi.h"
# What strata.jax.build_library compiles against the user's jaxlib (package folder strata/native).
JAX_SOURCE = (HERE / "native" if IN_SDIST else HERE.parent / "c_examples" / "jax") / "strata_jax.cc"
NATIVE_SOURCES = (ROOT / "include" / "strata.h", JAX_SOURCE)


def _switch(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise SystemExit(f"{name}={os.environ[name]!r}: expected 1/ON or 0/OFF")


def _crate_version() -> str:
    with open(CARGO_TOML, "rb") as f:
        return str(tomllib.load(f)["package"]["version"])


def _cargo_features() -> tuple[list[str], list[str]]:
    """(features, extra cargo args) from STRATA_MPI and STRATA_CUDA."""
    features = ["mpi"] if _switch("STRATA_MPI", False) else []
    # Built from an sdist, exactly the dependencies its Cargo.lock names.
    args: list[str] = ["--locked"] if IN_SDIST else []
    if not _switch("STRATA_CUDA", True):
        args.append("--no-default-features")
    return features, args


class build_py_with_cdef(build_py):
    """Also puts ``include/strata_cffi.h`` into the package (``strata.cdef()`` reads it), and
    ``strata.h`` with the JAX handlers' source into ``strata/native`` (``strata.jax.build_library``)."""

    def run(self) -> None:
        super().run()
        dest = pathlib.Path(self.build_lib) / "strata"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CFFI_HEADER, dest / CFFI_HEADER.name)
        (dest / "native").mkdir(exist_ok=True)
        for src in NATIVE_SOURCES:
            shutil.copyfile(src, dest / "native" / src.name)


class sdist_with_crate(sdist):
    """Puts the crate into the source distribution's ``rust/`` (from ``cargo package``, which
    knows what the crate is made of and drops the test and bench targets it leaves out from the
    manifest) and the JAX handlers' source into ``native/``."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        import subprocess
        import tarfile
        import tempfile

        base = pathlib.Path(base_dir)
        if IN_SDIST:  # an sdist made from an sdist: the crate is already here
            shutil.copytree(ROOT, base / "rust", dirs_exist_ok=True)
        else:
            with tempfile.TemporaryDirectory() as target:
                cargo = os.environ.get("CARGO", "cargo")
                subprocess.run(
                    [cargo, "package", "--no-verify", "--allow-dirty", "--manifest-path", str(CARGO_TOML), "--target-dir", target],
                    check=True,
                )
                crate = pathlib.Path(target) / "package" / f"strata-{_crate_version()}.crate"
                with tarfile.open(crate) as tar:
                    top = f"strata-{_crate_version()}/"
                    members = [m for m in tar.getmembers() if m.name.startswith(top) and m.isfile()]
                    for m in members:
                        m.name = "rust/" + m.name[len(top) :]
                    if hasattr(tarfile, "data_filter"):  # Python 3.12, and 3.9-3.11 from 2023's fixes
                        tar.extractall(base, members=members, filter="data")
                    else:  # pragma: no cover
                        tar.extractall(base, members=members)
        (base / "native").mkdir(exist_ok=True)
        shutil.copyfile(JAX_SOURCE, base / "native" / JAX_SOURCE.name)


features, args = _cargo_features()
setup(
    version=_crate_version(),
    rust_extensions=[
        RustExtension(
            "strata.libstrata",
            path=os.path.relpath(CARGO_TOML, HERE),
            binding=Binding.NoBinding,
            features=features,
            args=args,
            py_limited_api=True,
            strip=Strip.Debug,
        )
    ],
    cmdclass={"build_py": build_py_with_cdef, "sdist": sdist_with_crate},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    zip_safe=False,
)
