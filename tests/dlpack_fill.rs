//! `strata_dlpack_fill_host`: a producer's exchange function called once per object, NULL
//! objects skipped, host tensors accepted, and each refusal (a NULL argument, the producer's
//! nonzero return, a tensor off the host) with its status and a message naming the object.
//! The producer here is a C-ABI function over Rust-owned arrays; python/tests/test_pooled.py
//! runs the real one (PyTorch's) through `strata.lookup_batch`.

mod common;
use common::*;
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};

/// What the fake producer's objects are: a 1-D int64 array on a device, or one it refuses.
struct Obj {
    data: Vec<i64>,
    shape: [i64; 1],
    device: DLDeviceType,
    refuse: bool,
}

/// A producer's `dltensor_from_py_object_no_sync` over [`Obj`]s.
unsafe extern "C" fn fill(obj: *mut c_void, out: *mut DLTensor) -> c_int {
    // SAFETY: the tests pass pointers to live `Obj`s and strata a writable DLTensor.
    let (o, out) = unsafe { (&mut *(obj as *mut Obj), &mut *out) };
    if o.refuse {
        return -1;
    }
    *out = DLTensor {
        data: o.data.as_mut_ptr() as *mut c_void,
        device: DLDevice { device_type: o.device, device_id: 0 },
        ndim: 1,
        dtype: DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 1 },
        shape: o.shape.as_mut_ptr(),
        strides: null_mut(),
        byte_offset: 0,
    };
    0
}

fn obj(n: usize, device: DLDeviceType) -> Box<Obj> {
    Box::new(Obj { data: (0..n as i64).map(|x| x * 7 + 1).collect(), shape: [n as i64], device, refuse: false })
}

/// A DLTensor no one filled: every field a value `fill` never writes.
fn poisoned() -> DLTensor {
    DLTensor {
        data: 0xdead as *mut c_void,
        device: DLDevice { device_type: DLDeviceType::VULKAN, device_id: 99 },
        ndim: 77,
        dtype: DLDataType { code: DLDataTypeCode::BFLOAT, bits: 3, lanes: 3 },
        shape: null_mut(),
        strides: null_mut(),
        byte_offset: 12345,
    }
}

#[test]
fn fills_every_object_and_skips_null_ones() {
    let mut objs = [obj(3, DLDeviceType::CPU), obj(5, DLDeviceType::CPU), obj(1, DLDeviceType::CPU)];
    let ptrs: Vec<*mut c_void> =
        vec![&mut *objs[0] as *mut Obj as _, null_mut(), &mut *objs[1] as *mut Obj as _, &mut *objs[2] as *mut Obj as _];
    let mut tensors = [poisoned(), poisoned(), poisoned(), poisoned()];
    // SAFETY: four live objects (or NULL) and four writable tensors.
    ok(unsafe { strata_dlpack_fill_host(Some(fill), ptrs.as_ptr(), 4, tensors.as_mut_ptr()) });
    for (t, o) in [(&tensors[0], &objs[0]), (&tensors[2], &objs[1]), (&tensors[3], &objs[2])] {
        assert_eq!(t.data as *const i64, o.data.as_ptr());
        assert_eq!((t.ndim, t.byte_offset, t.device.device_type), (1, 0, DLDeviceType::CPU));
        // SAFETY: the shape points into the live object.
        assert_eq!(unsafe { *t.shape }, o.data.len() as i64);
    }
    assert_eq!(
        (tensors[1].data as usize, tensors[1].ndim, tensors[1].byte_offset),
        (0xdead, 77, 12345),
        "a NULL object's tensor is left as it was"
    );
    // n = 0 reads nothing, NULL arrays included.
    // SAFETY: n = 0.
    ok(unsafe { strata_dlpack_fill_host(Some(fill), null(), 0, null_mut()) });
}

#[test]
fn refusals_name_the_argument_or_the_object() {
    let mut t = [poisoned(), poisoned(), poisoned()];
    let mut a = obj(2, DLDeviceType::CPU);
    let ptrs: Vec<*mut c_void> = vec![&mut *a as *mut Obj as _; 3];
    // SAFETY: every pointer is NULL or valid for the counts given.
    unsafe {
        fails(strata_dlpack_fill_host(None, ptrs.as_ptr(), 3, t.as_mut_ptr()), Status::STRATA_NULL_ARGUMENT, &["fill: is NULL"]);
        fails(strata_dlpack_fill_host(None, null(), 0, null_mut()), Status::STRATA_NULL_ARGUMENT, &["fill: is NULL"]);
        fails(strata_dlpack_fill_host(Some(fill), null(), 3, t.as_mut_ptr()), Status::STRATA_NULL_ARGUMENT, &["objects: is NULL"]);
        fails(strata_dlpack_fill_host(Some(fill), ptrs.as_ptr(), 3, null_mut()), Status::STRATA_NULL_ARGUMENT, &["tensors: is NULL"]);
    }
    let mut refused = obj(2, DLDeviceType::CPU);
    refused.refuse = true;
    let mut gpu = obj(4, DLDeviceType::CUDA);
    let mut pinned = obj(4, DLDeviceType::CUDAHOST);
    let cases: [(&mut Obj, Status, &str); 3] = [
        (&mut refused, Status::STRATA_INVALID_ARGUMENT, "objects[1]: fill: returned -1; expected 0"),
        (&mut gpu, Status::STRATA_UNSUPPORTED_DEVICE, "objects[1].device: kDLCUDA:0; expected host memory (kDLCPU)"),
        (&mut pinned, Status::STRATA_UNSUPPORTED_DEVICE, "objects[1].device: kDLCUDAHost:0; expected host memory"),
    ];
    for (bad, status, msg) in cases {
        let ptrs: Vec<*mut c_void> = vec![&mut *a as *mut Obj as _, bad as *mut Obj as _, &mut *a as *mut Obj as _];
        let mut t = [poisoned(), poisoned(), poisoned()];
        // SAFETY: three live objects, three writable tensors.
        let got = fails(unsafe { strata_dlpack_fill_host(Some(fill), ptrs.as_ptr(), 3, t.as_mut_ptr()) }, status, &[msg]);
        assert!(got.starts_with("objects[1]"), "{got}");
        assert_eq!(t[2].data as usize, 0xdead, "it stops at the first failure");
    }
}
