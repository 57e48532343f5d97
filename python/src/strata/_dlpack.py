"""DLPack both ways: borrowing tensors from ``__dlpack__`` producers for the length of a call,
and producing DLPack views (``__dlpack__``/``__dlpack_device__``) of memory strata owns."""

from __future__ import annotations

import ctypes
import itertools
import threading
from ctypes import POINTER, c_int64
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _ffi
from .errors import InvalidArgument

_VERSIONED = b"dltensor_versioned"
_LEGACY = b"dltensor"
_USED_VERSIONED = ctypes.create_string_buffer(b"used_dltensor_versioned")
_USED_LEGACY = ctypes.create_string_buffer(b"used_dltensor")

_GPU_DEVICES = (_ffi.kDLCUDA, _ffi.kDLCUDAManaged, _ffi.kDLROCM)


def device_of(obj: Any) -> Tuple[int, int]:
    """``obj.__dlpack_device__()`` as (DLDeviceType, id); (kDLCPU, 0) for producers without it."""
    get = getattr(obj, "__dlpack_device__", None)
    if get is None:
        return (_ffi.kDLCPU, 0)
    dev_type, dev_id = get()
    return int(dev_type), int(dev_id)


class Borrowed:
    """A tensor exported by ``obj.__dlpack__`` and borrowed for the length of one call.

    Follows the array API's rules: the versioned protocol first (``max_version=(1, 0)``,
    capsule "dltensor_versioned"), the legacy one (capsule "dltensor") when the producer raises
    ``TypeError`` for ``max_version``. ``stream`` is passed only for GPU tensors: it is the stream
    strata will use, so the producer orders its pending work before it. The capsule is never
    renamed: when this object goes, the capsule's destructor calls the producer's deleter.
    Keeps ``obj`` and the capsule alive as long as this object lives."""

    def __init__(self, obj: Any, what: str, stream: Optional[int] = None) -> None:
        if not hasattr(obj, "__dlpack__"):
            raise InvalidArgument(
                f"{what}: a {type(obj).__module__}.{type(obj).__qualname__} has no __dlpack__; "
                "expected a DLPack tensor (NumPy, PyTorch, CuPy, JAX, ...)"
            )
        self.obj = obj
        self.device = device_of(obj)
        kwargs: Dict[str, Any] = {}
        if self.device[0] in _GPU_DEVICES and stream is not None:
            kwargs["stream"] = stream
        try:
            cap = obj.__dlpack__(max_version=_ffi.DLPACK_MAX_VERSION, **kwargs)
        except TypeError:
            cap = obj.__dlpack__(**kwargs)
        except BufferError as e:
            raise InvalidArgument(f"{what}: the producer refused to export it: {e}") from e
        self.capsule = cap
        if _ffi.PyCapsule_IsValid(cap, _VERSIONED):
            self.versioned = True
            addr = _ffi.PyCapsule_GetPointer(cap, _VERSIONED)
            self.managed_v: Any = ctypes.cast(addr, POINTER(_ffi.DLManagedTensorVersioned))
            self.tensor = ctypes.pointer(self.managed_v.contents.dl_tensor)
            self.flags = int(self.managed_v.contents.flags)
        elif _ffi.PyCapsule_IsValid(cap, _LEGACY):
            self.versioned = False
            addr = _ffi.PyCapsule_GetPointer(cap, _LEGACY)
            self.managed: Any = ctypes.cast(addr, POINTER(_ffi.DLManagedTensor))
            self.tensor = ctypes.pointer(self.managed.contents.dl_tensor)
            self.flags = 0
        else:
            raise InvalidArgument(f"{what}: __dlpack__ returned {cap!r}, not a DLPack capsule")

    @property
    def read_only(self) -> bool:
        return bool(self.flags & _ffi.DLPACK_FLAG_BITMASK_READ_ONLY)

    @property
    def shape(self) -> Tuple[int, ...]:
        t = self.tensor.contents
        return tuple(int(t.shape[i]) for i in range(t.ndim))

    def consume(self) -> None:
        """Marks the capsule used: the deleter is now someone else's to call (an adopting table)."""
        _ffi.PyCapsule_SetName(self.capsule, _USED_VERSIONED if self.versioned else _USED_LEGACY)


# ---- producing DLPack views --------------------------------------------------------------------

_contexts: Dict[int, "_Export"] = {}
_contexts_lock = threading.Lock()
_next_id = itertools.count(1)


class _Export:
    """One exported tensor: the managed struct, its shape and strides, and the view it keeps alive."""

    def __init__(self, view: "View", versioned: bool) -> None:
        self.view = view
        t = view._tensor
        n = max(1, t.ndim)
        self.shape = (c_int64 * n)(*[t.shape[i] for i in range(t.ndim)] or [0])
        self.strides = (c_int64 * n)(*[t.strides[i] for i in range(t.ndim)] or [0]) if t.strides else None
        self.id = next(_next_id)
        if versioned:
            m: Any = _ffi.DLManagedTensorVersioned()
            m.version = _ffi.DLPackVersion(1, 0)
            m.deleter = _delete_versioned
            m.flags = _ffi.DLPACK_FLAG_BITMASK_READ_ONLY if view.read_only else 0
        else:
            m = _ffi.DLManagedTensor()
            m.deleter = _delete_legacy
        m.manager_ctx = self.id
        dl = m.dl_tensor
        dl.data, dl.device, dl.ndim, dl.dtype, dl.byte_offset = t.data, t.device, t.ndim, t.dtype, t.byte_offset
        dl.shape = ctypes.cast(self.shape, POINTER(c_int64))
        dl.strides = ctypes.cast(self.strides, POINTER(c_int64)) if self.strides is not None else None
        self.managed = m


def _release(ctx: Optional[int]) -> None:
    with _contexts_lock:
        _contexts.pop(ctx or 0, None)


@_ffi.DLManagedTensorDeleter  # type: ignore[untyped-decorator]
def _delete_legacy(m: Any) -> None:
    _release(m.contents.manager_ctx)


@_ffi.DLManagedTensorVersionedDeleter  # type: ignore[untyped-decorator]
def _delete_versioned(m: Any) -> None:
    _release(m.contents.manager_ctx)


@_ffi.PyCapsule_Destructor  # type: ignore[untyped-decorator]
def _capsule_destructor(cap: int) -> None:
    # An unconsumed capsule owns its tensor: call the deleter (a consumer renames it "used_...").
    for name, kind in ((_VERSIONED, _ffi.DLManagedTensorVersioned), (_LEGACY, _ffi.DLManagedTensor)):
        if _ffi.PyCapsule_IsValid_raw(cap, name):
            p = ctypes.cast(_ffi.PyCapsule_GetPointer_raw(cap, name), POINTER(kind))
            p.contents.deleter(p)
            return


class View:
    """A DLPack producer over memory strata owns (a table's vectors), keeping ``owner`` alive
    for as long as any consumer holds the memory. Consumers use ``np.from_dlpack(view)``,
    ``torch.from_dlpack(view)`` and so on; the view is read-only (versioned consumers see
    ``DLPACK_FLAG_BITMASK_READ_ONLY``; legacy ones cannot be told, and must not write)."""

    read_only = True

    def __init__(self, tensor: "_ffi.DLTensor", owner: Any) -> None:
        self._tensor = tensor
        self._owner = owner

    def __dlpack_device__(self) -> Tuple[int, int]:
        d = self._tensor.device
        return (int(d.device_type), int(d.device_id))

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        if copy:
            raise BufferError("strata views cannot be copied by the producer; copy after import")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"strata views live on device {self.__dlpack_device__()}, not {tuple(dl_device)}")
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        e = _Export(self, versioned)
        with _contexts_lock:
            _contexts[e.id] = e
        return _ffi.PyCapsule_New(ctypes.addressof(e.managed), _VERSIONED if versioned else _LEGACY, _capsule_destructor)

    @property
    def shape(self) -> Tuple[int, ...]:
        t = self._tensor
        return tuple(int(t.shape[i]) for i in range(t.ndim))


class HostArray:
    """A DLPack producer over a host NumPy array whose dtype NumPy cannot export itself
    (ml_dtypes' ``bfloat16``): the same memory, shape and strides, described as ``code``/``bits``.
    Writable when the array is. Keeps the array alive while a consumer holds the memory."""

    def __init__(self, arr: Any, code: int, bits: int) -> None:
        self.arr = arr
        elem = bits // 8
        n = max(1, arr.ndim)
        self._shape = (c_int64 * n)(*(list(arr.shape) or [0]))
        self._strides = (c_int64 * n)(*([st // elem for st in arr.strides] or [0]))
        t = _ffi.DLTensor()
        t.data = arr.ctypes.data
        t.device = _ffi.DLDevice(_ffi.kDLCPU, 0)
        t.ndim = arr.ndim
        t.dtype = _ffi.DLDataType(code, bits, 1)
        t.shape = ctypes.cast(self._shape, POINTER(c_int64))
        t.strides = ctypes.cast(self._strides, POINTER(c_int64))
        self._tensor = t

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_ffi.kDLCPU, 0)

    def __dlpack__(self, **kwargs: Any) -> Any:
        view = View(self._tensor, self)
        view.read_only = not self.arr.flags.writeable
        return view.__dlpack__(**kwargs)


def exportable(obj: Any) -> Any:
    """``obj``, or a :class:`HostArray` over it when it is a NumPy array of ml_dtypes' bfloat16
    (which ``ndarray.__dlpack__`` refuses)."""
    dt = getattr(obj, "dtype", None)
    if isinstance(dt, np.dtype) and dt.name == "bfloat16" and dt.itemsize == 2 and hasattr(obj, "ctypes"):
        return HostArray(obj, _ffi.kDLBfloat, 16)
    return obj


def live_exports() -> int:
    """How many tensors exported by :class:`View` are still held by a consumer (for tests)."""
    with _contexts_lock:
        return len(_contexts)

