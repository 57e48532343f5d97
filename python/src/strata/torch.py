"""PyTorch custom ops: ``torch.ops.strata.lookup``, ``lookup_pooled`` and ``lookup_batch``
(``pip install 'strata[torch]'``).

The ops are ``torch.library.custom_op`` operators with fake (meta) implementations, so they pass
``torch.library.opcheck`` and run inside ``torch.compile(fullgraph=True)`` without a graph break,
on CPU tensors and on CUDA tensors (on PyTorch's current stream of the keys' device; written, and
untested where there is no GPU).

Tables travel as **int handles with a registry** (:func:`handle`: the table's serial number,
looked up in a weak registry): an int is a type every schema, ``torch.compile``, ``opcheck`` and
TorchScript carry as it is, where a ``torch.classes`` script object needs a C++ class, and a fake
class before ``torch.compile`` can trace it, which a pure-Python op cannot give. Handles are never
reused and the registry keeps no table alive, so a graph that outlives its table raises
:class:`strata.NullArgument` (a ``ValueError``) naming the handle instead of touching freed
memory.

>>> import torch, strata, strata.torch
>>> t = strata.Table.from_array(torch.arange(12, dtype=torch.float32).reshape(4, 3))
>>> h = strata.torch.handle(t)
>>> torch.ops.strata.lookup(h, torch.tensor([2, 0])).tolist()
[[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]

Bad input raises strata's exceptions, which derive from Python's usual types (``TypeError`` for a
wrong dtype, ``ValueError`` for a wrong shape or device, ``LookupError`` for a missing key in a
``missing="error"`` table), with strata's message. The outputs are new tensors (float32 unless
``dtype`` says float16 or bfloat16); gradients do not flow into tables.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("strata.torch needs PyTorch: pip install 'strata[torch]'") from e

from . import _core
from ._core import Request, Table
from .errors import InvalidArgument, NullArgument, UnsupportedDtype

if hasattr(torch.ops.strata, "lookup"):
    raise ImportError(
        "strata.torch: torch.ops.strata is already defined in this process (libstrata_torch.so was loaded); "
        "use its tables (torch.ops.strata.table_from_tensors, table_open) or import strata.torch without it"
    )

__all__ = ["handle", "table_of", "lookup", "lookup_pooled", "lookup_batch"]

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def handle(table: Union[Table, int]) -> int:
    """The int handle of ``table`` for the ``torch.ops.strata`` ops: its serial number, given at
    construction and never reused (an int is returned as it is). Only an attribute read, so it
    traces inside ``torch.compile``. Nothing keeps the table alive: closing or dropping it makes
    its handle raise."""
    if isinstance(table, int):
        return table
    if not isinstance(table, Table):
        raise NullArgument(f"table: a {type(table).__name__}; expected a strata.Table or an int handle")
    return table.serial


def table_of(h: int) -> Table:
    """The open table behind handle ``h``; :class:`strata.NullArgument` when it was closed,
    collected, or never existed."""
    t = _core.live_tables.get(int(h))
    if t is None:
        raise NullArgument(f"table: handle {int(h)} names no table (it was freed, or never existed)")
    if t.closed:
        raise NullArgument(f"table: handle {int(h)}: the table is closed")
    return t


def _out_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
    d = torch.float32 if dtype is None else dtype
    if d not in _OUT_DTYPES:
        raise UnsupportedDtype(f"dtype: {d}; expected torch.float32, torch.float16 or torch.bfloat16")
    return d


def _stream(t: torch.Tensor) -> Optional[int]:
    """PyTorch's current stream on ``t``'s CUDA device (None for host tensors)."""
    if t.device.type != "cuda":
        return None
    return int(torch.cuda.current_stream(t.device).cuda_stream)


def _pooled_rows(keys: torch.Tensor, offsets: Optional[torch.Tensor]) -> Any:
    """B of a pooled lookup: len(offsets) - 1, or keys.shape[0] for 2-D keys (0 for shapes strata
    refuses, so that strata's message names the argument at fault)."""
    if offsets is not None:
        return max(offsets.shape[0] - 1, 0) if offsets.dim() == 1 else 0
    return keys.shape[0] if keys.dim() == 2 else 0


def _dim(h: int) -> int:
    return table_of(h).dim


# ---- the ops -------------------------------------------------------------------------------------


def _lookup_impl(table: int, keys: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    t = table_of(table)
    out = torch.empty((*keys.shape, t.dim), dtype=_out_dtype(dtype), device=keys.device)
    _core.lookup(t, keys, out, _stream(keys))
    return out


_lookup_op = torch.library.custom_op(
    "strata::lookup", mutates_args=(), schema="(int table, Tensor keys, ScalarType? dtype=None) -> Tensor"
)(_lookup_impl)


@_lookup_op.register_fake
def _(table: int, keys: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return keys.new_empty((*keys.shape, _dim(table)), dtype=_out_dtype(dtype))


def _lookup_pooled_impl(
    table: int,
    keys: torch.Tensor,
    offsets: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    pooling: str = "sum",
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    t = table_of(table)
    out = torch.empty((_pooled_rows(keys, offsets), t.dim), dtype=_out_dtype(dtype), device=keys.device)
    _core.lookup_pooled(t, keys, offsets, weights, pooling, out, _stream(keys))
    return out


_lookup_pooled_op = torch.library.custom_op(
    "strata::lookup_pooled",
    mutates_args=(),
    schema="(int table, Tensor keys, Tensor? offsets=None, Tensor? weights=None, str pooling=\"sum\", "
    "ScalarType? dtype=None) -> Tensor",
)(_lookup_pooled_impl)


@_lookup_pooled_op.register_fake
def _(
    table: int,
    keys: torch.Tensor,
    offsets: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    pooling: str = "sum",
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    return keys.new_empty((_pooled_rows(keys, offsets), _dim(table)), dtype=_out_dtype(dtype))


def _lookup_batch_impl(
    tables: Sequence[int],
    keys: Sequence[torch.Tensor],
    offsets: Sequence[Optional[torch.Tensor]],
    weights: Sequence[Optional[torch.Tensor]],
    poolings: Sequence[str],
    dtype: Optional[torch.dtype] = None,
) -> List[torch.Tensor]:
    _check_batch(tables, keys, offsets, weights, poolings)
    d = _out_dtype(dtype)
    reqs = []
    for h, k, off, w, p in zip(tables, keys, offsets, weights, poolings):
        t = table_of(h)
        shape = (*k.shape, t.dim) if p == "none" else (_pooled_rows(k, off), t.dim)
        reqs.append(Request(t, k, torch.empty(shape, dtype=d, device=k.device), off, w, p))
    stream = _stream(keys[0]) if keys else None
    return list(_core.lookup_batch(reqs, stream))


_lookup_batch_op = torch.library.custom_op(
    "strata::lookup_batch",
    mutates_args=(),
    schema="(int[] tables, Tensor[] keys, Tensor?[] offsets, Tensor?[] weights, str[] poolings, "
    "ScalarType? dtype=None) -> Tensor[]",
)(_lookup_batch_impl)


@_lookup_batch_op.register_fake
def _(
    tables: Sequence[int],
    keys: Sequence[torch.Tensor],
    offsets: Sequence[Optional[torch.Tensor]],
    weights: Sequence[Optional[torch.Tensor]],
    poolings: Sequence[str],
    dtype: Optional[torch.dtype] = None,
) -> List[torch.Tensor]:
    _check_batch(tables, keys, offsets, weights, poolings)
    d = _out_dtype(dtype)
    out = []
    for h, k, off, p in zip(tables, keys, offsets, poolings):
        dim = _dim(h)
        shape = (*k.shape, dim) if p == "none" else (_pooled_rows(k, off), dim)
        out.append(k.new_empty(shape, dtype=d))
    return out


def _check_batch(tables: Sequence[int], keys: Sequence[Any], offsets: Sequence[Any], weights: Sequence[Any],
                 poolings: Sequence[str]) -> None:
    n = len(tables)
    for name, seq in (("keys", keys), ("offsets", offsets), ("weights", weights), ("poolings", poolings)):
        if len(seq) != n:
            raise InvalidArgument(f"{name}: {len(seq)} entries; expected one per table ({n})")


# ---- direct kernels ------------------------------------------------------------------------------
# custom_op's own CompositeExplicitAutograd and Autograd kernels are Python wrappers of several
# microseconds a call (python/bench/small_calls.py). The same bodies registered at the CPU and
# CUDA keys take precedence over the first; `lookup` also skips the Autograd key (its only tensor
# is integer keys: nothing can require grad). custom_op keeps the schemas, the fake kernels and
# the autograd kernels of lookup_pooled and lookup_batch, whose weights could require grad.
_direct: Any = getattr(torch.library, "Library")("strata", "IMPL")  # (untyped in torch: mypy --strict)
for _key in ("CPU", "CUDA"):
    _direct.impl("lookup", _lookup_impl, _key)
    _direct.impl("lookup_pooled", _lookup_pooled_impl, _key)
    _direct.impl("lookup_batch", _lookup_batch_impl, _key)
    _direct.impl("lookup", torch.library.fallthrough_kernel, "Autograd" + _key)


# ---- Python wrappers (tables or handles) ----------------------------------------------------------


def lookup(table: Union[Table, int], keys: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.ops.strata.lookup``: ``[*keys.shape, dim]`` rows of ``table`` (a Table or handle)."""
    return torch.ops.strata.lookup(handle(table), keys, dtype)  # type: ignore[no-any-return]


def lookup_pooled(
    table: Union[Table, int],
    keys: torch.Tensor,
    offsets: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    pooling: str = "sum",
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """``torch.ops.strata.lookup_pooled``: one pooled row per bag, as :func:`strata.lookup_pooled`."""
    return torch.ops.strata.lookup_pooled(handle(table), keys, offsets, weights, pooling, dtype)  # type: ignore[no-any-return]


def lookup_batch(
    tables: Sequence[Union[Table, int]],
    keys: Sequence[torch.Tensor],
    offsets: Optional[Sequence[Optional[torch.Tensor]]] = None,
    weights: Optional[Sequence[Optional[torch.Tensor]]] = None,
    poolings: Optional[Sequence[str]] = None,
    dtype: Optional[torch.dtype] = None,
) -> List[torch.Tensor]:
    """``torch.ops.strata.lookup_batch``: many lookups in one call (``poolings[i]`` "none" for a
    plain lookup, the default; "sum", "mean" or "sqrtn" for a pooled one)."""
    n = len(tables)
    return torch.ops.strata.lookup_batch(  # type: ignore[no-any-return]
        [handle(t) for t in tables],
        list(keys),
        list(offsets) if offsets is not None else [None] * n,
        list(weights) if weights is not None else [None] * n,
        list(poolings) if poolings is not None else ["none"] * n,
        dtype,
    )
