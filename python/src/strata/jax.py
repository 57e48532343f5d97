"""JAX: strata lookups as XLA FFI custom calls (``pip install 'strata[jax]'``), usable inside
``jax.jit`` and under ``jax.vmap``.

The handlers live in ``libstrata_jax.so``, a small C++ library built against the installed
jaxlib's FFI headers (``jax.ffi.include_dir()``; ``c_examples/jax/strata_jax.cc``, shipped in the
package). :func:`load_library` loads it (the path given, ``$STRATA_JAX_LIBRARY``, or one
:func:`build_library` compiles once with the C++ compiler) and registers ``strata_lookup`` and ``strata_lookup_pooled`` for the CPU platform
and for CUDA (on XLA's stream), handing it the entry points of the libstrata this package
loaded. :func:`lookup` and :func:`lookup_pooled` load it on first use.

>>> import jax, jax.numpy as jnp, numpy as np, strata, strata.jax
>>> t = strata.Table.from_array(np.arange(12, dtype=np.float32).reshape(4, 3))
>>> jax.jit(lambda k: strata.jax.lookup(t, k))(jnp.array([2, 0])).tolist()
[[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]

A table is referred to by its serial number (as in strata.torch): a compiled function that
outlives its table raises instead of reading freed memory; closing a table waits for the lookups
running on it. Keys of a wrong dtype raise ``TypeError`` when traced; strata's own checks
(offsets, weights, missing keys in a ``missing="error"`` table, freed tables) fail the custom
call with strata's message, which JAX raises as ``jax.errors.JaxRuntimeError`` (a
``RuntimeError``; jit's C++ dispatch raises XLA's INVALID_ARGUMENT as ``ValueError``). int64 keys need
``jax.config.update("jax_enable_x64", True)``; int32 and uint32 keys work without.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading
from typing import Any, Optional, Set, Union

try:
    import jax
    import jax.numpy as jnp
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("strata.jax needs JAX: pip install 'strata[jax]'") from e

import numpy as np

from . import _core, _ffi
from ._core import Table
from .errors import InvalidArgument, NullArgument

_jffi: Any = jax.ffi  # (untyped in jax's stubs: mypy --strict)
_Shape: Any = jax.ShapeDtypeStruct

__all__ = ["build_library", "load_library", "lookup", "lookup_pooled", "cuda_registered"]

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_registered: Set[int] = set()
#: Whether the CUDA handlers were registered with XLA (False where this jaxlib refuses the platform).
cuda_registered = False
_POOLING = {"sum": 1, "mean": 2, "sqrtn": 3}
_KEY_DTYPES = (jnp.int8, jnp.int16, jnp.int32, jnp.int64, jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64)


def _address(name: str) -> Optional[int]:
    return ctypes.cast(_ffi.lib[name], ctypes.c_void_p).value


def _sources() -> Optional[pathlib.Path]:
    """The folder holding strata_jax.cc and strata.h: the package's ``native/`` (a wheel), else
    the source checkout's (python/src/strata used from the tree)."""
    here = pathlib.Path(__file__).resolve().parent
    for folder in (here / "native", here.parents[2] / "c_examples" / "jax"):
        if (folder / "strata_jax.cc").exists():
            return folder
    return None


def build_library(out_dir: Optional[Union[str, "os.PathLike[str]"]] = None) -> pathlib.Path:
    """Compiles ``libstrata_jax.so`` from the sources the package ships, against this jaxlib's
    ``jax.ffi.include_dir()``, with ``$CXX`` (default ``c++``), into ``out_dir`` (default
    ``$STRATA_JAX_BUILD_DIR``, else ``~/.cache/strata/jax-<jaxlib version>-<sources hash>``), as
    ``torch.utils.cpp_extension.load`` does for PyTorch; an up-to-date library is reused."""
    import hashlib
    import subprocess

    src = _sources()
    if src is None:
        raise ImportError("strata.jax: the handler sources (strata_jax.cc) are not in this installation")
    header = src / "strata.h"
    if not header.exists():
        header = src.parents[1] / "include" / "strata.h"
    digest = hashlib.sha256((src / "strata_jax.cc").read_bytes() + header.read_bytes()).hexdigest()[:12]
    from importlib.metadata import version as dist_version

    folder = pathlib.Path(out_dir or os.environ.get("STRATA_JAX_BUILD_DIR") or
                          pathlib.Path.home() / ".cache" / "strata" / f"jax-{dist_version('jaxlib')}-{digest}")
    target = folder / "libstrata_jax.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"libstrata_jax.so.{os.getpid()}.tmp"
    cmd = [os.environ.get("CXX", "c++"), "-std=c++17", "-shared", "-fPIC", "-O2", str(src / "strata_jax.cc"),
           "-o", str(tmp), "-isystem", _jffi.include_dir(), "-I", str(header.parent)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise ImportError(f"strata.jax: no C++ compiler to build the handlers ({e}); set CXX") from e
    if r.returncode != 0:
        raise ImportError(f"strata.jax: building the handlers failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    os.replace(tmp, target)
    return target


def load_library(path: Optional[Union[str, "os.PathLike[str]"]] = None) -> ctypes.CDLL:
    """Loads ``libstrata_jax.so`` (``path``, else ``$STRATA_JAX_LIBRARY``, else one
    :func:`build_library` compiles on first use) and registers its handlers with XLA, once per
    process."""
    global _lib, cuda_registered
    with _lock:
        if _lib is not None:
            return _lib
        where = path or os.environ.get("STRATA_JAX_LIBRARY") or build_library()
        if not os.path.exists(where):
            raise ImportError(f"strata.jax: no handler library at {where}")
        lib = ctypes.CDLL(os.fspath(where))
        lib.strata_jax_init.argtypes = [ctypes.c_void_p] * 3
        lib.strata_jax_init(_address("strata_lookup"), _address("strata_lookup_pooled"), _address("strata_last_error"))
        lib.strata_jax_register.argtypes = [ctypes.c_int64, ctypes.c_void_p]
        lib.strata_jax_forget.argtypes = [ctypes.c_int64]
        for name in ("lookup", "lookup_pooled"):
            _jffi.register_ffi_target(f"strata_{name}", _jffi.pycapsule(getattr(lib, f"strata_jax_{name}_cpu")),
                                        platform="cpu")
        try:
            for name in ("lookup", "lookup_pooled"):
                _jffi.register_ffi_target(f"strata_{name}",
                                            _jffi.pycapsule(getattr(lib, f"strata_jax_{name}_cuda")), platform="CUDA")
            cuda_registered = True
        except Exception:  # a jaxlib without the CUDA platform
            cuda_registered = False
        _lib = lib
        return lib


def _table(table: Union[Table, int]) -> Table:
    if isinstance(table, Table):
        t: Optional[Table] = table
    elif isinstance(table, int):
        t = _core.live_tables.get(table)
    else:
        raise NullArgument(f"table: a {type(table).__name__}; expected a strata.Table or its serial number")
    if t is None or t.closed:
        raise NullArgument(f"table: {table!r} is closed or freed")
    return t


def _handle(t: Table) -> int:
    """``t``'s serial number, registered with the handler library until ``t`` closes."""
    lib = load_library()
    with _lock:
        if t.serial not in _registered:
            serial = t.serial
            lib.strata_jax_register(serial, t._addr)
            _registered.add(serial)

            def forget() -> None:
                lib.strata_jax_forget(serial)
                _registered.discard(serial)

            t.on_close.append(forget)
    return t.serial


def _keys(keys: Any, what: str = "keys") -> Any:
    k = jnp.asarray(keys)
    if k.dtype not in _KEY_DTYPES:
        raise TypeError(f"{what}: dtype {k.dtype}; expected int32, int64, uint32 or uint64")
    return k


def lookup(table: Union[Table, int], keys: Any, dtype: Any = jnp.float32) -> Any:
    """``[*keys.shape, dim]`` rows of ``table`` for integer ``keys`` (any shape), as an XLA custom
    call: jit, vmap (over any axis of the keys) and the CPU and CUDA platforms."""
    t = _table(table)
    h = _handle(t)
    k = _keys(keys)
    out = _Shape((*k.shape, t.dim), dtype)
    return _jffi.ffi_call("strata_lookup", out, vmap_method="broadcast_all")(k, table=np.int64(h))


def lookup_pooled(
    table: Union[Table, int],
    keys: Any,
    offsets: Any = None,
    weights: Any = None,
    pooling: str = "sum",
    dtype: Any = jnp.float32,
) -> Any:
    """One pooled row per bag, as :func:`strata.lookup_pooled`: ``keys`` 1-D with ``offsets``
    (``B + 1`` int32/int64 entries) or 2-D ``[B, L]`` without; float32 ``weights`` of the keys'
    shape or None; ``pooling`` "sum", "mean" or "sqrtn". Under vmap the bags of each batch
    element are looked up one call after another."""
    t = _table(table)
    h = _handle(t)
    if pooling not in _POOLING:
        raise InvalidArgument(f"pooling: {pooling!r}; expected 'sum', 'mean' or 'sqrtn'")
    k = _keys(keys)
    off = jnp.zeros((0,), jnp.int32) if offsets is None else jnp.asarray(offsets)
    w = jnp.zeros((0,), jnp.float32) if weights is None else jnp.asarray(weights)
    if offsets is not None:
        rows = max(off.shape[0] - 1, 0) if off.ndim == 1 else 0
    else:
        rows = k.shape[0] if k.ndim == 2 else 0  # strata names the argument at fault
    out = _Shape((rows, t.dim), dtype)
    call = _jffi.ffi_call("strata_lookup_pooled", out, vmap_method="sequential")
    return call(k, off, w, table=np.int64(h), pooling=np.int32(_POOLING[pooling]),
                has_offsets=offsets is not None, has_weights=weights is not None)
