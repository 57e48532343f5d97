"""Exceptions: one class per ``strata_status``, all derived from :class:`StrataError`.

Each also derives from the built-in exception a Python caller would expect (``ValueError`` for
bad arguments, ``TypeError`` for dtypes, ``KeyError``-like ``LookupError`` for missing keys,
``OSError`` for files, ``MemoryError``), so ``except ValueError`` works as well as
``except strata.InvalidArgument``.
"""

from __future__ import annotations

from typing import Dict, Type


class StrataError(Exception):
    """A failed strata call. ``status`` is the ``strata_status`` value, ``status_name`` its name
    (``"STRATA_KEY_NOT_FOUND"``), and ``message`` strata's explanation (``strata_last_error()``),
    naming the argument at fault and what was expected."""

    status: int = 12
    status_name: str = "STRATA_INTERNAL"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return f"{self.message} [{self.status_name}]"




class NullArgument(StrataError, ValueError):
    """A required argument was missing (in Python: the table or server is closed)."""

    status, status_name = 1, "STRATA_NULL_ARGUMENT"


class InvalidArgument(StrataError, ValueError):
    """An argument has the wrong shape, value or kind."""

    status, status_name = 2, "STRATA_INVALID_ARGUMENT"


class UnsupportedDtype(StrataError, TypeError):
    """A tensor's dtype is not one strata accepts there."""

    status, status_name = 3, "STRATA_UNSUPPORTED_DTYPE"


class UnsupportedDevice(StrataError, ValueError):
    """A tensor lives on a device this build does not serve (or keys and out disagree)."""

    status, status_name = 4, "STRATA_UNSUPPORTED_DEVICE"


class InvalidLayout(StrataError, ValueError):
    """Strides, alignment or overlap that strata cannot read or write safely."""

    status, status_name = 5, "STRATA_INVALID_LAYOUT"


class ReadOnly(StrataError, ValueError):
    """An output flagged read-only, or a table that cannot change."""

    status, status_name = 6, "STRATA_READ_ONLY"


class KeyNotFound(StrataError, LookupError):
    """A key is missing from a table built with ``missing="error"``."""

    status, status_name = 7, "STRATA_KEY_NOT_FOUND"


class DuplicateKey(StrataError, ValueError):
    """The same key appears twice among a table's keys."""

    status, status_name = 8, "STRATA_DUPLICATE_KEY"


class IoError(StrataError, OSError):
    """A file could not be read or written."""

    status, status_name = 9, "STRATA_IO_ERROR"


class InvalidFile(StrataError, ValueError):
    """A file's contents are not what the format says."""

    status, status_name = 10, "STRATA_INVALID_FILE"


class OutOfMemory(StrataError, MemoryError):
    """An allocation failed."""

    status, status_name = 11, "STRATA_OUT_OF_MEMORY"


class InternalError(StrataError):
    """A bug in strata (a caught panic); the message says where."""

    status, status_name = 12, "STRATA_INTERNAL"


class ConfigError(StrataError, ValueError):
    """An HPS configuration (ps.json) that strata cannot use; the message names the JSON path."""

    status, status_name = 13, "STRATA_CONFIG_ERROR"


class StoreError(StrataError):
    """A tier's store (volatile or persistent database) failed."""

    status, status_name = 14, "STRATA_STORE_ERROR"


_BY_STATUS: Dict[int, Type[StrataError]] = {
    c.status: c
    for c in (
        NullArgument,
        InvalidArgument,
        UnsupportedDtype,
        UnsupportedDevice,
        InvalidLayout,
        ReadOnly,
        KeyNotFound,
        DuplicateKey,
        IoError,
        InvalidFile,
        OutOfMemory,
        InternalError,
        ConfigError,
        StoreError,
    )
}


def error_for(status: int, message: str) -> StrataError:
    """The exception for a non-zero ``strata_status`` (an unknown value gives a plain
    :class:`StrataError` carrying it)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        err = StrataError(message, status)
        err.status_name = f"strata status {status}"
        return err
    return cls(message)
