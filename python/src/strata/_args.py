"""Argument and status helpers the package's modules share: the status check, choices by name,
dtype names, and what may be handed to strata as a tensor. Private; imports only the FFI layer
and the errors."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from . import _ffi
from .errors import InvalidArgument, error_for

#: ``missing=`` names of the table options.
MISSING = {"fill": _ffi.STRATA_MISSING_FILL, "error": _ffi.STRATA_MISSING_ERROR}


def check(status: int) -> None:
    """Raises the error of a failed call (with the library's message), else nothing."""
    if status != _ffi.STRATA_OK:
        raise error_for(status, _ffi.last_error())


def choice(table: Mapping[str, int], value: str, what: str) -> int:
    """``table[value]``, or InvalidArgument naming ``what`` and the choices."""
    try:
        return table[value]
    except (KeyError, TypeError):
        raise InvalidArgument(f"{what}: {value!r}; expected one of {', '.join(map(repr, table))}") from None


def dtype_name(code: int, bits: int) -> str:
    """The name of a table's dtype as DLPack codes it (float dtypes; uint8 for quantized rows)."""
    names = {(_ffi.kDLFloat, 32): "float32", (_ffi.kDLFloat, 16): "float16", (_ffi.kDLBfloat, 16): "bfloat16", (_ffi.kDLUInt, 8): "uint8"}
    return names.get(
        (code, bits), f"dtype({code},{bits})"
    )


def as_dlpack(x: Any) -> Any:
    """``x`` itself when it speaks DLPack, else ``np.asarray(x)`` (lists, tuples, scalars)."""
    return x if hasattr(x, "__dlpack__") else np.asarray(x)
