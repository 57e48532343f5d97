"""A PyG feature store over strata tables (``pip install 'strata[pyg]'``).

:class:`FeatureStore` keeps each ``(group_name, attr_name)`` of float features (float32, float16,
bfloat16) in a strata table whose keys are the node indices, and serves PyG's loaders from it:
``NeighborLoader((store, graph_store), ...)`` gathers every batch's features with one
:func:`strata.lookup_batch` (:meth:`~FeatureStore.multi_get_tensor`). Other dtypes (labels,
masks) stay in a tensor inside the store, indexed by PyTorch.

>>> import torch, strata.pyg
>>> store = strata.pyg.FeatureStore()
>>> store.put_tensor(torch.arange(6.0).reshape(3, 2), group_name=None, attr_name="x", index=None)
True
>>> store.get_tensor(group_name=None, attr_name="x", index=torch.tensor([2, 0])).tolist()
[[4.0, 5.0], [0.0, 1.0]]

Puts are upserts by index: rows at new indices are added, rows at known ones replaced
(``update_tensor`` is the same). A table the store made itself is a static strata table, rebuilt
on each put (puts are for loading; lookups are what is fast); a table given in ``tables`` (an HPS
server table, :meth:`strata.Server.table`) is updated in place with :meth:`strata.Table.upsert`,
durably when it has a persistent tier, and seen at once by every other handle of that server.
Gets take a tensor of indices, a slice of indices, or None (every row, in index order); an index
the store does not hold raises ``KeyError``. A table given in ``tables`` is keyed by node index
and holds nodes ``0..len(table)-1`` (its size); the store does not own it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

try:
    import torch
    from torch_geometric.data import FeatureStore as _PygFeatureStore
    from torch_geometric.data import TensorAttr
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("strata.pyg needs PyTorch Geometric: pip install 'strata[pyg]'") from e

import numpy as np

from . import _core
from ._core import Request, Table
from .errors import KeyNotFound

__all__ = ["FeatureStore"]

Key = Tuple[Optional[str], str]
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class _Entry:
    """One attribute: a strata table (float features) or a tensor (anything else), and the
    indices it holds, sorted."""

    def __init__(self, table: Optional[Table], tensor: Optional[torch.Tensor], index: torch.Tensor,
                 dtype: torch.dtype, owned: bool) -> None:
        self.table, self.tensor, self.index, self.dtype, self.owned = table, tensor, index, dtype, owned

    def close(self) -> None:
        if self.owned and self.table is not None:
            self.table.close()


def _index_tensor(index: Any, n: int) -> torch.Tensor:
    """A put's index as an int64 tensor (None: 0..n-1)."""
    if index is None:
        return torch.arange(n, dtype=torch.int64)
    if isinstance(index, slice):
        return torch.arange(n if index.stop is None else index.stop, dtype=torch.int64)[index]
    return torch.as_tensor(index).to(torch.int64).reshape(-1)


class FeatureStore(_PygFeatureStore):  # type: ignore[misc,unused-ignore]
    """``torch_geometric.data.FeatureStore`` over strata tables.

    ``tables``: ``{(group_name, attr_name): strata.Table}`` of tables to serve and update in place
    (server tables, which accept upserts); attributes put under other names get tables of their
    own. ``num_threads``: for the lookups, as in :func:`strata.lookup`."""

    def __init__(self, tables: Optional[Mapping[Key, Table]] = None, num_threads: Optional[int] = None) -> None:
        super().__init__()
        self._entries: Dict[Key, _Entry] = {}
        self._num_threads = num_threads
        for key, table in (tables or {}).items():
            self._entries[key] = _Entry(table, None, torch.empty(0, dtype=torch.int64), torch.float32, False)

    @staticmethod
    def _key(attr: TensorAttr) -> Key:
        return (attr.group_name, attr.attr_name)

    def close(self) -> None:
        """Frees the tables the store made (the ones given to it stay open)."""
        for e in self._entries.values():
            e.close()
        self._entries.clear()

    # ---- put / update ------------------------------------------------------------------------------

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        tensor = torch.as_tensor(tensor)
        index = _index_tensor(attr.index, tensor.shape[0])
        if index.numel() != tensor.shape[0]:
            raise ValueError(f"index: {index.numel()} indices for {tensor.shape[0]} rows; expected one per row")
        if torch.unique(index).numel() != index.numel():
            raise ValueError("index: repeated indices; expected each row once")
        key = self._key(attr)
        e = self._entries.get(key)
        if tensor.dtype in _FLOATS and tensor.dim() == 2:
            if e is not None and e.table is not None and not e.owned:
                e.table.upsert(index, tensor.contiguous())  # a server table: in place
                e.index = torch.unique(torch.cat([e.index, index]))
                return True
            self._rebuild(key, e, index, tensor)
            return True
        if e is not None and e.table is not None:
            raise TypeError(f"{key}: {tensor.dtype} rows for an attribute of float features")
        if e is None or e.tensor is None:
            order = torch.argsort(index)
            self._entries[key] = _Entry(None, tensor[order].clone(), index[order], tensor.dtype, False)
            return True
        merged = torch.unique(torch.cat([e.index, index]))
        out = tensor.new_empty((merged.numel(), *tensor.shape[1:]))
        out[torch.searchsorted(merged, e.index)] = e.tensor
        out[torch.searchsorted(merged, index)] = tensor
        e.tensor, e.index = out, merged
        return True

    def update_tensor(self, tensor: Any, *args: Any, **kwargs: Any) -> bool:
        """The same upsert as :meth:`put_tensor` (PyG's default would remove the attribute first)."""
        attr = self._tensor_attr_cls.cast(*args, **kwargs)
        if not attr.is_fully_specified():
            raise ValueError(f"The input TensorAttr '{attr}' is not fully specified")
        return self._put_tensor(tensor, attr)

    def _rebuild(self, key: Key, e: Optional[_Entry], index: torch.Tensor, tensor: torch.Tensor) -> None:
        """A new static table of the old rows not overwritten and the new ones (an upsert)."""
        keys, rows = index, tensor
        if e is not None and e.table is not None and e.index.numel():
            if tensor.shape[1] != e.table.dim:
                raise ValueError(f"{key}: rows of {tensor.shape[1]} features; the attribute has {e.table.dim}")
            kept = e.index[~torch.isin(e.index, index)]
            old = _core.lookup(e.table, kept, torch.empty((kept.numel(), e.table.dim), dtype=tensor.dtype))
            keys, rows = torch.cat([kept, index]), torch.cat([old, tensor])
        table = Table.from_array(rows.contiguous(), keys, missing="error")
        if e is not None:
            e.close()
        self._entries[key] = _Entry(table, None, torch.sort(keys).values, tensor.dtype, True)

    # ---- get -----------------------------------------------------------------------------------

    def _entry(self, attr: TensorAttr) -> _Entry:
        e = self._entries.get(self._key(attr))
        if e is None:
            raise KeyError(f"{self._key(attr)}: no such attribute in the store")
        return e

    @staticmethod
    def _rows(e: _Entry, index: Any) -> torch.Tensor:
        """The indices a get asks for, as an int64 tensor."""
        given = e.table is not None and not e.owned  # node i is key i: 0..len(table)-1
        if index is None:
            return torch.arange(len(e.table), dtype=torch.int64) if given and e.table is not None else e.index
        if isinstance(index, slice):
            stop = index.stop
            if stop is None:
                if given and e.table is not None:
                    stop = len(e.table)
                else:
                    stop = int(e.index[-1]) + 1 if e.index.numel() else 0
            return torch.arange(stop, dtype=torch.int64)[index]
        return torch.as_tensor(index)

    def _get_tensor(self, attr: TensorAttr) -> Optional[torch.Tensor]:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: List[TensorAttr]) -> List[Optional[torch.Tensor]]:
        """One :func:`strata.lookup_batch` for every float attribute asked for."""
        out: List[Optional[torch.Tensor]] = [None] * len(attrs)
        requests: List[Request] = []
        where: List[int] = []
        for i, attr in enumerate(attrs):
            e = self._entry(attr)
            idx = self._rows(e, attr.index)
            if e.table is None:
                assert e.tensor is not None
                pos = torch.searchsorted(e.index, idx.to(torch.int64))
                ok = (pos < e.index.numel()) & (e.index[pos.clamp_max(max(e.index.numel() - 1, 0))] == idx)
                if not bool(ok.all()):
                    raise KeyError(f"{self._key(attr)}: index {int(idx[~ok][0])} is not in the store")
                out[i] = e.tensor[pos]
                continue
            rows = torch.empty((*idx.shape, e.table.dim), dtype=e.dtype)
            requests.append(Request(e.table, idx, rows))
            where.append(i)
            out[i] = rows
        if requests:
            try:
                _core.lookup_batch(requests, num_threads=self._num_threads)
            except KeyNotFound as err:
                raise KeyError(str(err)) from err
        return out

    # ---- remove / size / attrs -------------------------------------------------------------------

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        """Removes the attribute: frees a table the store made; of a table given to it, erases the
        rows put through the store (:meth:`strata.Table.erase`) and forgets it."""
        e = self._entries.pop(self._key(attr), None)
        if e is None:
            return False
        if e.table is not None and not e.owned and e.index.numel():
            e.table.erase(e.index)
        e.close()
        return True

    def _get_tensor_size(self, attr: TensorAttr) -> Optional[Tuple[int, ...]]:
        e = self._entries.get(self._key(attr))
        if e is None:
            return None
        if e.table is None:
            assert e.tensor is not None
            return tuple(e.tensor.shape)
        return (e.index.numel() if e.owned else len(e.table), e.table.dim)

    def get_all_tensor_attrs(self) -> List[TensorAttr]:
        return [TensorAttr(group, name) for group, name in self._entries]

    def __repr__(self) -> str:
        return f"strata.pyg.FeatureStore({sorted(map(str, self._entries))})"
