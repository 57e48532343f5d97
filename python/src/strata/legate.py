"""Legate tasks: one strata lookup call that runs wherever Legate places it
(``pip install 'strata[legate]'``).

:func:`lookup` launches a Legate task over the keys (a cuPyNumeric array or a Legate store,
1-D) and a ``[N, dim]`` float32 output. Legate splits both along the rows (``align`` on the keys
promoted to the output's shape, the feature axis broadcast), and each point task looks its rows
up with strata, on the processor Legate gave it:

- CPU variant: inline on the task's core (``num_threads=1``: the task owns one core);
- OMP variant: with the OpenMP processor's thread count (``Config.num_omp_threads``);
- GPU variant: on the task's CUDA stream (``TaskContext.task_stream``).

The task reads the stores in place through their DLPack views (no copy): the keys' view is the
promoted ``[n, dim]`` store with a zero stride along ``dim``, whose first column strata reads as
the task's 1-D keys. Tables are found by their serial number (as in strata.torch); Legate runs
the tasks in this process, so any :class:`strata.Table` can be used. The launch declares strata's
errors (``throws_exception``), so a bad key in a ``missing="error"`` table or a closed table
raises its :class:`strata.StrataError` in the caller; Legate then waits for the launch's tasks
before returning, which also means no task outlives the call (nor the table).

Tested on 1 and 2 CPU processors (PyPI's wheels have no OpenMP processors, and the machine no
GPU): the OMP and GPU variants are registered and written as described but not run here.
"""

from __future__ import annotations

import ctypes
from ctypes import byref
from typing import Any, Optional, Union

try:
    import legate.core as _lc
    from legate.core import TaskContext, VariantCode, align, broadcast, get_legate_runtime
    from legate.core.task import InputStore, OutputStore, task
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("strata.legate needs Legate and cuPyNumeric: pip install 'strata[legate]'") from e

from . import _core, _ffi
from ._core import Table
from ._dlpack import Borrowed
from .errors import InvalidArgument, NullArgument, StrataError, error_for

__all__ = ["lookup", "lookup_into"]


def _table(table: Union[Table, int]) -> Table:
    t = table if isinstance(table, Table) else _core.live_tables.get(int(table))
    if t is None or t.closed:
        raise NullArgument(f"table: {table!r} is closed or freed")
    return t


def _first_column(b: Borrowed) -> Any:
    """A 1-D DLTensor over column 0 of the promoted ``[n, dim]`` keys ``b`` describes (its shape
    and strides arrays start with the row axis: ndim 1 reads exactly that)."""
    dl = _ffi.DLTensor()
    ctypes.memmove(ctypes.addressof(dl), ctypes.addressof(b.tensor.contents), ctypes.sizeof(_ffi.DLTensor))
    dl.ndim = 1
    return dl


def _run(ctx: Any, keys: Any, out: Any, table: int) -> None:
    t = _table(table)
    kind = ctx.get_variant_kind()
    stream: Optional[int] = None
    if kind == VariantCode.GPU:
        stream = ctx.task_stream
        threads = 0
    elif kind == VariantCode.OMP:
        threads = int(get_legate_runtime().config().num_omp_threads)
    else:
        threads = 1
    k = Borrowed(keys, "keys", stream)
    o = Borrowed(out, "out", stream)
    kd = _first_column(k)
    opts = _ffi.strata_lookup_options(stream, threads)
    status = _ffi.strata_lookup(t._handle(), byref(kd), o.tensor, byref(opts), None)
    if status != _ffi.STRATA_OK:
        raise error_for(status, _ffi.last_error())


@task(  # type: ignore[untyped-decorator,misc,unused-ignore]
    variants=(VariantCode.CPU, VariantCode.OMP, VariantCode.GPU),
    constraints=(align("keys", "out"), broadcast("out", (1,))),
)
def _lookup_task(ctx: TaskContext, keys: InputStore, out: OutputStore, table: int) -> None:
    _run(ctx, keys, out, table)


def _store(x: Any, what: str) -> Any:
    """A Legate store from a cuPyNumeric array or a Legate store or array."""
    if isinstance(x, _lc.LogicalStore):
        return x
    if isinstance(x, _lc.LogicalArray):
        return x.data
    try:
        return _lc.as_logical_array(x).data
    except Exception as e:
        raise InvalidArgument(f"{what}: a {type(x).__name__}; expected a cuPyNumeric array or a Legate store") from e


def lookup_into(table: Union[Table, int], keys: Any, out: Any) -> Any:
    """Looks ``keys`` (1-D integer, cuPyNumeric or Legate) up into ``out`` (``[len(keys), dim]``
    float32/float16/bfloat16, cuPyNumeric or Legate) with one task launch; returns ``out``. The
    launch is asynchronous, as Legate's are: reading ``out`` waits for it."""
    t = _table(table)
    ks, os_ = _store(keys, "keys"), _store(out, "out")
    if ks.ndim != 1:
        raise InvalidArgument(f"keys: {ks.ndim} dimensions; expected 1 (a task's rows are keys)")
    if tuple(os_.shape) != (ks.shape[0], t.dim):
        raise InvalidArgument(f"out: shape {tuple(os_.shape)}; expected ({ks.shape[0]}, {t.dim})")
    launch = _lookup_task.prepare_call(ks.promote(1, t.dim), os_, t.serial)
    launch.throws_exception(StrataError)  # strata's errors reach the caller (the launch then blocks)
    launch.execute()
    return out


def lookup(table: Union[Table, int], keys: Any) -> Any:
    """``[len(keys), dim]`` float32 rows of ``table`` for the 1-D ``keys`` (a cuPyNumeric array
    or a Legate store), as a new cuPyNumeric array filled by one task launch."""
    import cupynumeric

    t = _table(table)
    n = int(_store(keys, "keys").shape[0])
    out = cupynumeric.empty((n, t.dim), dtype=cupynumeric.float32)
    return lookup_into(t, keys, out)
