"""The fast paths of :func:`strata.lookup`, :func:`strata.lookup_pooled` and
:func:`strata.lookup_batch` for small host calls.

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

``lookup_pooled`` and ``lookup_batch`` take the same road for every tensor of the call (keys,
offsets, weights, out): DLTensors this thread keeps, filled by the exchange API or from a NumPy
capsule, and, for a batch, an array of ``strata_lookup_request`` this thread keeps too, whose
tensor pointers are set once. A batch whose tensors all come from one producer with an exchange
API is described by one ``strata_dlpack_fill_host`` call, made holding the GIL, instead of one
ctypes call per tensor. A NumPy ``out`` that is not writeable goes the general way (which
raises :class:`ReadOnly`), since a bare DLTensor carries no read-only flag.

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
from typing import Any, Callable, Dict, List, Optional, Tuple

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


def _raw_typed(name: str, argtypes: List[Any]) -> Any:
    """``name`` from the loaded library with ``argtypes``, or None where the library predates it."""
    try:
        f = _ffi.lib[name]
    except AttributeError:
        return None
    f.restype = c_int32
    f.argtypes = argtypes
    return f


_lookup_pooled = _raw_typed("strata_lookup_pooled", [c_void_p] * 4 + [c_int32] + [c_void_p] * 3)
_lookup_batch = _raw_typed("strata_lookup_batch", [c_void_p, ctypes.c_size_t, c_void_p])


def _address(name: str) -> Optional[int]:
    """The address of ``name`` in the loaded library, or None where the library predates it."""
    try:
        return ctypes.cast(_ffi.lib[name], c_void_p).value
    except AttributeError:
        return None


_fill_host_addr = _address("strata_dlpack_fill_host")
#: strata_dlpack_fill_host(fill, objects, n, tensors), called holding the GIL (PYFUNCTYPE): it
#: calls the producer's exchange function, which needs it. None where the library predates it.
_fill_host = (PYFUNCTYPE(c_int32, c_void_p, c_void_p, ctypes.c_size_t, c_void_p)(_fill_host_addr)
              if _fill_host_addr else None)
_REQUEST_SIZE = ctypes.sizeof(_ffi.strata_lookup_request)
_REQ_TABLE = _ffi.strata_lookup_request.table.offset
_REQ_KEYS = _ffi.strata_lookup_request.keys.offset
_REQ_OFFSETS = _ffi.strata_lookup_request.offsets.offset
_REQ_WEIGHTS = _ffi.strata_lookup_request.weights.offset
_REQ_POOLING = _ffi.strata_lookup_request.pooling.offset
_REQ_OUT = _ffi.strata_lookup_request.out.offset
#: Pooling names and their strata_pooling values (ints pass as they are, for strata to check).
POOLING = {"none": 0, "sum": 1, "mean": 2, "sqrtn": 3}

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
#: Producer type -> that function's address (types with an exchange API only).
_fill_addrs: Dict[type, int] = {}


def _filler(kind: type) -> Optional[Callable[[Any, int], int]]:
    if kind in _fillers:
        return _fillers[kind]
    fill: Optional[Callable[[Any, int], int]] = None
    cap = getattr(kind, "__dlpack_c_exchange_api__", None)
    if cap is not None:
        try:
            api = _ffi.DLPackExchangeAPI.from_address(_get_pointer(cap, _EXCHANGE))
            # (The header types the field as a function pointer: its address is what is called.)
            addr = ctypes.cast(api.dltensor_from_py_object_no_sync, c_void_p).value
            if api.header.version.major == 1 and addr:
                fill = _Fill(addr)
                _fill_addrs[kind] = addr
        except (ValueError, TypeError):  # not the capsule DLPack 1.3 describes
            fill = None
    _fillers[kind] = fill
    return fill


class _Scratch:
    """DLTensors for one call on one thread, their device types read in place, and the capsules
    of NumPy arrays described in them (kept until the call returns)."""

    __slots__ = ("tensors", "addrs", "devices", "keys", "out", "keys_device", "out_device", "busy", "capsules")

    def __init__(self, n: int = 2) -> None:
        self.tensors = (_ffi.DLTensor * n)()
        base = ctypes.addressof(self.tensors)
        self.addrs = [base + i * _DL_TENSOR_SIZE for i in range(n)]
        self.devices = [c_int32.from_address(a + _DEVICE_TYPE_OFFSET) for a in self.addrs]
        self.keys, self.out = self.addrs[0], self.addrs[1]
        self.keys_device, self.out_device = self.devices[0], self.devices[1]
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

    def describe_out(self, obj: Any, addr: int) -> bool:
        """As :meth:`describe`, for a tensor strata writes: False for one the general path must
        refuse (a read-only NumPy array, a PyTorch tensor that requires grad)."""
        kind = type(obj)
        if kind is _ND:
            if not obj.flags.writeable:
                return False
        elif getattr(obj, "requires_grad", False):
            return False
        return self.describe(obj, kind, addr)


class _Batch(_Scratch):
    """A thread's array of ``strata_lookup_request`` and four DLTensors per request (keys,
    offsets, weights, out), whose tensor pointers are set once."""

    __slots__ = ("requests", "base", "capacity", "table_at", "offsets_at", "weights_at", "pooling_at", "objects",
                 "objects_addr")

    def __init__(self, capacity: int) -> None:
        super().__init__(4 * capacity)
        self.capacity = capacity
        self.requests = (_ffi.strata_lookup_request * capacity)()
        self.base = ctypes.addressof(self.requests)
        self.table_at, self.offsets_at, self.weights_at, self.pooling_at = [], [], [], []
        # The Python objects (their id(), the address CPython gives) strata_dlpack_fill_host reads.
        self.objects = (c_void_p * (4 * capacity))()
        self.objects_addr = ctypes.addressof(self.objects)
        for i in range(capacity):
            r = self.base + i * _REQUEST_SIZE
            ctypes.c_size_t.from_address(r).value = _REQUEST_SIZE
            c_void_p.from_address(r + _REQ_KEYS).value = self.addrs[4 * i]
            c_void_p.from_address(r + _REQ_OUT).value = self.addrs[4 * i + 3]
            self.table_at.append(c_void_p.from_address(r + _REQ_TABLE))
            self.offsets_at.append(c_void_p.from_address(r + _REQ_OFFSETS))
            self.weights_at.append(c_void_p.from_address(r + _REQ_WEIGHTS))
            self.pooling_at.append(c_int32.from_address(r + _REQ_POOLING))


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


def _take(attr: str, size: int) -> Any:
    """This thread's scratch under ``attr`` (a fresh one when it is in use: re-entered)."""
    s = getattr(_local, attr, None)
    if s is None or s.busy or (attr == "batch" and s.capacity < size):
        fresh = _Batch(max(size, 32)) if attr == "batch" else _Scratch(4)
        if s is None or not s.busy:
            setattr(_local, attr, fresh)
        s = fresh
    s.busy = True
    return s


def _host(s: _Scratch, n: int) -> bool:
    """Whether the first ``n`` DLTensors of ``s`` are host memory."""
    return all(d.value == _CPU for d in s.devices[:n])


def lookup_pooled(handle: Any, keys: Any, offsets: Any, weights: Any, pooling: int, out: Any,
                  num_threads: Optional[int]) -> Optional[int]:
    """strata's status for ``strata_lookup_pooled`` on host tensors, or None when the call is not
    one the fast path takes (nothing was called then)."""
    if _lookup_pooled is None:
        return None
    n = 0 if num_threads is None else int(num_threads)
    opts = _options.get(n) or _options_for(n)
    s = _take("pooled", 4)
    try:
        a = s.addrs
        if not (s.describe(keys, type(keys), a[0]) and s.describe_out(out, a[3])):
            return None
        if offsets is not None and not s.describe(offsets, type(offsets), a[1]):
            return None
        if weights is not None and not (hasattr(weights, "__dlpack__") and s.describe(weights, type(weights), a[2])):
            return None
        d = s.devices
        if d[0].value != _CPU or d[3].value != _CPU or (offsets is not None and d[1].value != _CPU) or (
                weights is not None and d[2].value != _CPU):
            return None
        return int(_lookup_pooled(handle, a[0], a[1] if offsets is not None else None,
                                  a[2] if weights is not None else None, pooling, a[3], opts, None))
    finally:
        s.busy = False
        s.capsules.clear()


def lookup_batch(requests: Any, table_type: Any, request_type: Any, num_threads: Optional[int]) -> Optional[int]:
    """strata's status for ``strata_lookup_batch`` of ``requests`` (``request_type`` objects
    whose tables are open ``table_type`` objects and whose tensors are all given and on the host),
    or None when the call is not one the fast path takes (nothing was called then).

    When every tensor of the batch comes from one producer with an exchange API (PyTorch), one
    ``strata_dlpack_fill_host`` call describes them all (:func:`_one_producer`); otherwise each
    tensor is described on its own (:func:`_each_tensor`: about 0.5 us a tensor through ctypes)."""
    if _lookup_batch is None:
        return None
    count = len(requests)
    n = 0 if num_threads is None else int(num_threads)
    opts = _options.get(n) or _options_for(n)
    s = _take("batch", count)
    try:
        if _fill_host is not None:
            kind = type(getattr(requests[0], "keys", None))
            fill = _fill_addrs.get(kind)
            if fill is None and kind not in _fillers:
                _filler(kind)
                fill = _fill_addrs.get(kind)
            if fill is not None:
                status = _one_producer(s, requests, count, kind, fill, table_type, request_type)
                if status is not _MIXED:
                    return None if status is None else int(_lookup_batch(s.base, count, opts))
        return None if not _each_tensor(s, requests, count, table_type, request_type) else int(
            _lookup_batch(s.base, count, opts))
    except Exception:  # a producer refused: the general path gives its message
        return None
    finally:
        s.busy = False
        s.capsules.clear()


#: :func:`_one_producer`'s answer for a batch whose tensors are not all of one type.
_MIXED = object()


def _request_fields(r: Any, table_type: Any, request_type: Any) -> Optional[Tuple[int, int]]:
    """A request's table handle and pooling value, or None for one the fast path does not take."""
    if type(r) is not request_type:
        return None
    t = r.table
    if type(t) is not table_type or not t._h or (t._owner is not None and not t._owner._h):
        return None
    pooling = r.pooling
    if type(pooling) is str:
        pooling = POOLING.get(pooling)
    if type(pooling) is not int:
        return None
    return t._addr, pooling


def _one_producer(s: _Batch, requests: Any, count: int, kind: type, fill: int, table_type: Any,
                  request_type: Any) -> Any:
    """Sets the requests of ``s`` and describes every tensor with one ``strata_dlpack_fill_host``
    call (the objects' addresses, ``id()``, in ``s.objects``). Returns True when the batch is
    ready, None when the fast path must not take it, :data:`_MIXED` when a tensor is not of
    ``kind`` (nothing was filled then). A 26-request batch: 78 tensors, about 20 us less than
    filling them one ctypes call at a time."""
    objects = s.objects
    table_at, offsets_at, weights_at, pooling_at, a = s.table_at, s.offsets_at, s.weights_at, s.pooling_at, s.addrs
    j = 0
    for i in range(count):
        r = requests[i]
        fields = _request_fields(r, table_type, request_type)
        if fields is None:
            return None
        keys, out, offsets, weights = r.keys, r.out, r.offsets, r.weights
        if type(keys) is not kind or type(out) is not kind:
            return _MIXED
        if getattr(out, "requires_grad", False):
            return None  # PyTorch refuses to export it; the general path says so
        objects[j] = id(keys)
        objects[j + 3] = id(out)
        if offsets is None:
            objects[j + 1] = None
            offsets_at[i].value = None
        elif type(offsets) is kind:
            objects[j + 1] = id(offsets)
            offsets_at[i].value = a[j + 1]
        else:
            return _MIXED
        if weights is None:
            objects[j + 2] = None
            weights_at[i].value = None
        elif type(weights) is kind:
            objects[j + 2] = id(weights)
            weights_at[i].value = a[j + 2]
        else:
            return _MIXED
        table_at[i].value, pooling_at[i].value = fields
        j += 4
    # The requests hold every object for the call; a tensor off the host fails (general path).
    fill_host = _fill_host
    return True if fill_host is not None and fill_host(fill, s.objects_addr, j, s.addrs[0]) == 0 else None


def _each_tensor(s: _Batch, requests: Any, count: int, table_type: Any, request_type: Any) -> bool:
    """Sets the requests of ``s``, describing each tensor on its own: through its producer's
    exchange function where it has one (called here rather than through
    :meth:`_Scratch.describe`: 26 requests, 78 -> 71 us), else :meth:`_Scratch.describe`.
    False when the fast path must not take the batch."""
    fillers = _fillers
    a, d = s.addrs, s.devices
    table_at, offsets_at, weights_at, pooling_at = s.table_at, s.offsets_at, s.weights_at, s.pooling_at
    j = 0
    for i in range(count):
        r = requests[i]
        fields = _request_fields(r, table_type, request_type)
        if fields is None:
            return False
        keys, out, offsets, weights = r.keys, r.out, r.offsets, r.weights
        if out is None or getattr(out, "requires_grad", False):
            return False
        kt, ot = type(keys), type(out)
        fill = fillers.get(kt)
        if not (fill(keys, a[j]) == 0 if fill is not None else s.describe(keys, kt, a[j])):
            return False
        fill = fillers.get(ot)
        if not (fill(out, a[j + 3]) == 0 if fill is not None else s.describe_out(out, a[j + 3])):
            return False
        if d[j].value != _CPU or d[j + 3].value != _CPU:
            return False
        if offsets is None:
            offsets_at[i].value = None
        else:
            fill = fillers.get(type(offsets))
            at = a[j + 1]
            if not (fill(offsets, at) == 0 if fill is not None else s.describe(offsets, type(offsets), at)):
                return False
            if d[j + 1].value != _CPU:
                return False
            offsets_at[i].value = at
        if weights is None:
            weights_at[i].value = None
        else:
            at = a[j + 2]
            if not (hasattr(weights, "__dlpack__") and s.describe(weights, type(weights), at) and d[j + 2].value == _CPU):
                return False
            weights_at[i].value = at
        table_at[i].value, pooling_at[i].value = fields
        j += 4
    return True
