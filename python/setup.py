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
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension, Strip

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CARGO_TOML = ROOT / "Cargo.toml"
CFFI_HEADER = ROOT / "include" / "strata_cffi.h"
# What strata.jax.build_library compiles against the user's jaxlib (package folder strata/native).
NATIVE_SOURCES = (ROOT / "include" / "strata.h", ROOT / "c_examples" / "jax" / "strata_jax.cc")


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
    args: list[str] = []
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
    cmdclass={"build_py": build_py_with_cdef},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    zip_safe=False,
)
