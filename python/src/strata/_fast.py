"""The fast path of :func:`strata.lookup` for small host calls.

Measured before it existed (64 keys, ``num_threads=1``, PyTorch 2.10 and NumPy 2.4, see
``python/bench/small_calls.py``): 6-17x ``torch.index_select(out=)`` and 2-5x
``numpy.take(out=)``, per call 70-120 us against 5-11 us on a loaded 2-core VM. Nearly all of it was Python around the C call, not the call: PyTorch's
``__dlpack__`` and ``__dlpack_device__`` are Python functions of several microseconds each (called
for keys and for out), and every tensor then cost a capsule, two ``PyCapsule_*`` ctypes calls,
a ``ctypes.cast``, a ``ctypes.pointer``, a ``Borrowed`` object and its shape tuple.

The fast path takes a call only when it is a plain one: ``out`` given, no stream, no stats, both
tensors on the host, and each tensor either

* of a type with DLPack 1.3's ``__dlpack_c_exchange_api__`` (PyTorch 2.10): its
  ``dltensor_from_py_object_no_sync`` fills a ``DLTensor`` that this thread keeps for the purpose,
  with no capsule and no allocation; or
* an exact ``numpy.ndarray``: one versioned capsule, whose ``DLManagedTensorVersioned *`` goes to
  ``strata_lookup_managed_versioned`` (which refuses a read-only ``out`` itself).

Mixed pairs (a NumPy key array with a PyTorch ``out``) take the first form for the PyTorch side
and ``&managed->dl_tensor`` of the capsule for the NumPy side. Everything else (GPU tensors,
streams, other producers, ``out=None``, a ``requires_grad`` out, a producer that refuses) returns
``None`` and goes the general way, whose messages it keeps. strata checks the tensors either way:
nothing the fast path skips is a check the C side would not make.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import PYFUNCTYPE, c_char_p, c_int, c_int32, c_void_p, py_object
from typing import Any, Callable, Dict, Optional

import numpy as np

from . import _ffi

_VERSIONED = b"dltensor_versioned"
_EXCHANGE = b"dlpack_exchange_api"
_ND = np.ndarray
_MAX_VERSION = _ffi.DLPACK_MAX_VERSION
_DL_TENSOR_OFFSET = _ffi.DLManagedTensorVersioned.dl_tensor.offset
_DEVICE_TYPE_OFFSET = _ffi.DLTensor.device.offset  # device.device_type is the struct's first field
_DL_TENSOR_SIZE = ctypes.sizeof(_ffi.DLTensor)
_CPU = _ffi.kDLCPU

# Python C API calls through ctypes.pythonapi hold the GIL (PYFUNCTYPE); the strata calls release it.
_get_pointer = PYFUNCTYPE(c_void_p, py_object, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
_Fill = PYFUNCTYPE(c_int, py_object, c_void_p)


def _raw(name: str) -> Any:
    """``name`` from the loaded library as a separate function object taking addresses as ints."""
    f = _ffi.lib[name]
    f.restype = c_int32
    f.argtypes = [c_void_p] * 5
    return f


_lookup = _raw("strata_lookup")
_lookup_managed_versioned = _raw("strata_lookup_managed_versioned")

#: strata_lookup_options per num_threads, built once: strata only reads them.
_options: Dict[int, int] = {}
_options_keep: list[Any] = []
_uncached = threading.local()


def _options_for(num_threads: int) -> int:
    addr = _options.get(num_threads)
    if addr is None:
        opts = _ffi.strata_lookup_options(None, num_threads)
        addr = ctypes.addressof(opts)
        if len(_options) < 256:  # a few thread counts in practice; never an unbounded cache
            _options_keep.append(opts)
            _options[num_threads] = addr
        else:  # alive until this thread asks for another uncached count (after its call)
            _uncached.opts = opts
    return addr


#: Producer type -> its exchange API's ``dltensor_from_py_object_no_sync`` (None: it has none).
_fillers: Dict[type, Optional[Callable[[Any, int], int]]] = {}


def _filler(kind: type) -> Optional[Callable[[Any, int], int]]:
    if kind in _fillers:
        return _fillers[kind]
    fill: Optional[Callable[[Any, int], int]] = None
    cap = getattr(kind, "__dlpack_c_exchange_api__", None)
    if cap is not None:
        try:
            api = _ffi.DLPackExchangeAPI.from_address(_get_pointer(cap, _EXCHANGE))
            if api.header.version.major == 1 and api.dltensor_from_py_object_no_sync:
                fill = _Fill(api.dltensor_from_py_object_no_sync)
        except (ValueError, TypeError):  # not the capsule DLPack 1.3 describes
            fill = None
    _fillers[kind] = fill
    return fill


class _Scratch:
    """Two DLTensors for one lookup on one thread, their device types read in place, and the
    capsules of NumPy arrays described in them (kept until the call returns)."""

    __slots__ = ("tensors", "keys", "out", "keys_device", "out_device", "busy", "capsules")

    def __init__(self) -> None:
        self.tensors = (_ffi.DLTensor(), _ffi.DLTensor())
        self.keys = ctypes.addressof(self.tensors[0])
        self.out = ctypes.addressof(self.tensors[1])
        self.keys_device = c_int32.from_address(self.keys + _DEVICE_TYPE_OFFSET)
        self.out_device = c_int32.from_address(self.out + _DEVICE_TYPE_OFFSET)
        self.busy = False
        self.capsules: list[Any] = []

    def describe(self, obj: Any, kind: type, addr: int) -> bool:
        """Describes ``obj`` in the DLTensor at ``addr``; False if the fast path cannot."""
        fill = _fillers[kind] if kind in _fillers else _filler(kind)
        if fill is not None:
            try:
                return fill(obj, addr) == 0
            except Exception:  # the producer refused; the general path gives its message
                return False
        if kind is not _ND:
            return False
        try:
            cap = obj.__dlpack__(max_version=_MAX_VERSION)
        except (BufferError, TypeError, ValueError):
            return False
        self.capsules.append(cap)
        ctypes.memmove(addr, _get_pointer(cap, _VERSIONED) + _DL_TENSOR_OFFSET, _DL_TENSOR_SIZE)
        return True


_local = threading.local()


def lookup(handle: Any, keys: Any, out: Any, num_threads: Optional[int]) -> Optional[int]:
    """strata's status for ``strata_lookup(handle, keys, out)`` on host tensors, or None when the
    call is not one the fast path takes (nothing was called then)."""
    n = 0 if num_threads is None else int(num_threads)
    opts = _options.get(n) or _options_for(n)
    kt, ot = type(keys), type(out)
    if kt is _ND and ot is _ND:
        try:
            kc = keys.__dlpack__(max_version=_MAX_VERSION)
            oc = out.__dlpack__(max_version=_MAX_VERSION)
        except (BufferError, TypeError, ValueError):
            return None
        # NumPy exports host memory only; the capsules live until this function returns.
        return int(_lookup_managed_versioned(handle, _get_pointer(kc, _VERSIONED), _get_pointer(oc, _VERSIONED), opts, None))
    if getattr(out, "requires_grad", False):
        return None  # PyTorch refuses to export it; the general path says so
    s: Optional[_Scratch] = getattr(_local, "scratch", None)
    if s is None:
        s = _local.scratch = _Scratch()
    elif s.busy:  # re-entered on this thread (a signal handler): a fresh pair
        s = _Scratch()
    s.busy = True
    try:
        if not (s.describe(keys, kt, s.keys) and s.describe(out, ot, s.out)):
            return None
        if s.keys_device.value != _CPU or s.out_device.value != _CPU:
            return None  # GPU tensors need the stream handshake of the general path
        return int(_lookup(handle, s.keys, s.out, opts, None))
    finally:
        s.busy = False
        s.capsules.clear()
