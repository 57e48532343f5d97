//! Checks of managed DLPack tensors that only the C layer can make (the producer's DLPack
//! version and the tensor's flags), and `strata_dlpack_fill_host`, which describes a Python
//! producer's tensors through its DLPack exchange API.

use super::boundary::boundary;
use super::status::Status;
use crate::error::{Error, Result};
use dlpark::ffi::{DLDeviceType, DLTensor};
use dlpark::{DlpackFlags, ManagedTensorBase};
use std::ffi::{c_int, c_void};

/// Checks a managed tensor's version (major 1; explicit strides from 1.2 on, as DLPack 1.2
/// requires of producers, while older producers may pass NULL strides for row-major) and,
/// when `writable`, that it is not flagged read-only. `arg` names it in messages.
pub(crate) fn check_managed<M: ManagedTensorBase>(m: &M, arg: &'static str, writable: bool) -> Result<()> {
    if let Some(v) = m.version() {
        if v.major != dlpark::ffi::DLPACK_MAJOR_VERSION {
            return Err(Error::invalid(arg, format!("DLPack version {}.{}; expected major version 1", v.major, v.minor)));
        }
        if v.minor >= 2 && m.tensor().ndim != 0 && m.tensor().strides.is_null() {
            return Err(Error::layout(
                arg,
                format!("strides is NULL in a DLPack {}.{} tensor; expected explicit strides", v.major, v.minor),
            ));
        }
    }
    if writable && m.flags().contains(DlpackFlags::READ_ONLY) {
        return Err(Error::ReadOnly { arg });
    }
    Ok(())
}

/// A producer's `dltensor_from_py_object_no_sync`, from its DLPack 1.2/1.3 exchange API
/// (`DLPackExchangeAPI`, declared with DLPack's names in the header's DLPack section): fills a
/// caller-owned `DLTensor` from a Python object, with no capsule and no allocation.
pub type DLPackDLTensorFromPyObjectNoSync = Option<unsafe extern "C" fn(*mut c_void, *mut DLTensor) -> c_int>;

/// Describes `n` host tensors of one producer for a lookup, in one call: for each `i < n` whose
/// `objects[i]` is not NULL, `fill(objects[i], &tensors[i])`, then a check that `tensors[i]` is
/// host memory (`kDLCPU`); `tensors[i]` of a NULL object is left as it is. It stops at the first
/// failure: `fill` returning nonzero gives `STRATA_INVALID_ARGUMENT` (a Python producer has then
/// set the interpreter's error), a tensor on another device `STRATA_UNSUPPORTED_DEVICE`; the
/// message names `objects[i]`, and `tensors[i..]` are then unspecified. Nothing else about the
/// tensors is checked here: the lookup that takes them checks them as it checks any DLTensor.
///
/// This is how a Python host calls strata without crossing its FFI once per tensor: a batch of
/// 26 pooled requests is 78 tensors, and one ctypes call costs about as much as a small lookup.
///
/// Threading: `fill` runs on the calling thread, which must be allowed to call it (a Python
/// host holds the GIL for this call, as the exchange API requires: ctypes' `PYFUNCTYPE`, not
/// `CDLL`'s prototypes, and releases it for the lookup). Ownership: borrows `objects` for the
/// call; each filled `DLTensor` points into its object's memory, valid while the object lives
/// and its storage is not replaced.
///
/// # Safety
/// `fill` is NULL or a function of that signature; `objects` is NULL (only with `n = 0`) or
/// points to `n` readable pointers, each NULL or an object `fill` accepts; `tensors` is NULL
/// (only with `n = 0`) or points to `n` writable `DLTensor`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_dlpack_fill_host(
    fill: DLPackDLTensorFromPyObjectNoSync,
    objects: *const *mut c_void,
    n: usize,
    tensors: *mut DLTensor,
) -> Status {
    boundary(|| {
        let fill = fill.ok_or(Error::Null { arg: "fill" })?;
        if n == 0 {
            return Ok(());
        }
        if objects.is_null() {
            return Err(Error::Null { arg: "objects" });
        }
        if tensors.is_null() {
            return Err(Error::Null { arg: "tensors" });
        }
        // SAFETY: `objects` (not NULL) points to n readable pointers and `tensors` (not NULL) to
        // n writable DLTensors, as the caller guarantees; they are distinct arrays.
        let (objects, tensors) = unsafe { (std::slice::from_raw_parts(objects, n), std::slice::from_raw_parts_mut(tensors, n)) };
        for (i, (&obj, t)) in objects.iter().zip(tensors.iter_mut()).enumerate() {
            if obj.is_null() {
                continue;
            }
            // SAFETY: `obj` is an object `fill` accepts and `t` a writable DLTensor, as the
            // caller guarantees.
            let rc = unsafe { fill(obj, t) };
            if rc != 0 {
                return Err(Error::invalid("fill", format!("returned {rc}; expected 0 (the producer refused the object)"))
                    .within(format!("objects[{i}]: ")));
            }
            if t.device.device_type != DLDeviceType::CPU {
                let msg = format!("{}; expected host memory (kDLCPU)", crate::dlpack::device_name(t.device));
                return Err(Error::Device { arg: "device", msg }.within(format!("objects[{i}].")));
            }
        }
        Ok(())
    })
}
