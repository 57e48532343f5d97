//! Every bad input through the C ABI: the status, a message naming the argument and what was
//! expected, and an output buffer left untouched.

mod common;
use common::*;
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDeviceType};
use std::ptr::{null, null_mut};

struct Case {
    table: Owned,
    keys: Vec<i64>,
    out: Vec<f32>,
}

impl Case {
    fn new() -> Case {
        let vectors: Vec<f32> = (0..40).map(|i| i as f32).collect();
        let table = Owned::build(&vectors, 10, 4, None, &TableOptions::default());
        Case { table, keys: vec![1, 2, 3, 4, 5, 6], out: vec![-9.0; 64] }
    }

    fn keys(&self) -> Desc {
        Desc::compact(self.keys.as_ptr().cast(), I64, &[6])
    }

    fn out(&mut self) -> Desc {
        Desc::compact(self.out.as_mut_ptr().cast(), F32, &[6, 4])
    }

    /// Runs a lookup and checks it failed as expected without writing into `out`.
    #[track_caller]
    fn expect(&mut self, k: &Desc, o: &mut Desc, want: Status, needles: &[&str]) -> String {
        self.out.iter_mut().for_each(|x| *x = -9.0);
        // SAFETY: self.table is live. k and o describe self.keys and self.out (alive past the call)
        // or are copies of such descriptions made malformed on purpose (dtype, shape, strides,
        // offset, device), which strata refuses before it reads or writes an element: that is the
        // contract under test.
        let s = unsafe { strata_lookup(self.table.0, &k.t, &mut o.t, null(), null_mut()) };
        let msg = fails(s, want, needles);
        assert!(self.out.iter().all(|&x| x == -9.0), "a failed lookup wrote into out: {msg}");
        msg
    }
}

#[test]
fn null_pointers() {
    let mut c = Case::new();
    let k = c.keys();
    let mut o = c.out();
    // SAFETY: strata refuses the NULL table before reading anything; k and o describe c.keys and
    // c.out, alive past the call.
    let s = unsafe { strata_lookup(null_mut(), &k.t, &mut o.t, null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["table: is NULL"]);
    // SAFETY: strata refuses the NULL keys; c.table is live and o describes c.out.
    let s = unsafe { strata_lookup(c.table.0, null(), &mut o.t, null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["keys: is NULL"]);
    // SAFETY: strata refuses the NULL out; c.table is live and k describes c.keys.
    let s = unsafe { strata_lookup(c.table.0, &k.t, null_mut(), null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["out: is NULL"]);
    // SAFETY: strata refuses the NULL keys before anything else is read; c.table is live.
    let s = unsafe { strata_lookup_managed(c.table.0, null(), null_mut(), null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["keys"]);
    // SAFETY: strata refuses the NULL keys before anything else is read; c.table is live.
    let s = unsafe { strata_lookup_managed_versioned(c.table.0, null(), null_mut(), null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["keys"]);

    let v = Desc::compact(c.out.as_ptr().cast(), F32, &[4, 4]);
    let mut t = std::ptr::dangling_mut::<Table>();
    // SAFETY: strata refuses the NULL vectors; t is a reference, which strata clears.
    let s = unsafe { strata_table_from_dlpack(null(), null(), null(), &mut t) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["vectors: is NULL"]);
    assert!(t.is_null(), "a failed constructor must clear *out");
    // SAFETY: strata refuses the NULL out before reading v, which describes 16 floats of c.out.
    let s = unsafe { strata_table_from_dlpack(&v.t, null(), null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["out: is NULL"]);
    // SAFETY: strata refuses the NULL vectors before adopting anything; t is a reference.
    let s = unsafe { strata_table_adopt_dlpack(null_mut(), null(), null(), &mut t) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["vectors: is NULL"]);
    // SAFETY: strata refuses the NULL vectors before adopting anything; t is a reference.
    let s = unsafe { strata_table_adopt_dlpack_versioned(null_mut(), null(), null(), &mut t) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["vectors: is NULL"]);
    // SAFETY: strata refuses the NULL dir; t is a reference.
    let s = unsafe { strata_table_open(null(), 4, null(), &mut t) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["dir: is NULL"]);
    // SAFETY: strata refuses the NULL table before it looks at info.
    let s = unsafe { strata_table_get_info(null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["table: is NULL"]);
    // SAFETY: c.table is live; strata refuses the NULL info.
    let s = unsafe { strata_table_get_info(c.table.0, null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["info: is NULL"]);
    // SAFETY: strata refuses the NULL table (the result is -1).
    assert_eq!(unsafe { strata_table_dim(null()) }, -1);
    // SAFETY: strata refuses the NULL table (the result is -1).
    assert_eq!(unsafe { strata_table_len(null()) }, -1);
    // SAFETY: freeing NULL is a documented no-op.
    unsafe { strata_table_free(null_mut()) };

    // NULL shape with ndim > 0, NULL data for a non-empty tensor
    let mut k = c.keys();
    k.t.shape = null_mut();
    let mut o = c.out();
    c.expect(&k, &mut o, Status::STRATA_NULL_ARGUMENT, &["keys->shape"]);
    let mut k = c.keys();
    k.t.data = null_mut();
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["keys: data is NULL but the tensor has 6 elements"]);
}

#[test]
fn wrong_dtypes() {
    let mut c = Case::new();
    let mut o = c.out();
    let mut k = c.keys();
    k.t.dtype = F32;
    c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DTYPE, &["keys: dtype float32; expected int32, int64, uint32 or uint64"]);
    k.t.dtype = DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 2 };
    c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DTYPE, &["keys: dtype int64x2"]);
    k.t.dtype = DLDataType { code: DLDataTypeCode::INT, bits: 0, lanes: 1 };
    c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DTYPE, &["keys"]);
    let k = c.keys();
    let mut o = c.out();
    o.t.dtype = I32;
    c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DTYPE, &["out: dtype int32; expected float32, float16 or bfloat16"]);
    o.t.dtype = DLDataType { code: DLDataTypeCode::FLOAT, bits: 64, lanes: 1 };
    c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DTYPE, &["out: dtype float64"]);

    // table vectors and keys
    let v = Desc::compact(c.keys.as_ptr().cast(), I64, &[3, 2]);
    let mut t = null_mut();
    // SAFETY: v describes 6 of c.keys' i64 as [3, 2], alive past the call (strata refuses the dtype
    // before reading); t is a reference.
    let s = unsafe { strata_table_from_dlpack(&v.t, null(), null(), &mut t) };
    fails(s, Status::STRATA_UNSUPPORTED_DTYPE, &["vectors: dtype int64; expected float32, float16 or bfloat16"]);
    let v = Desc::compact(c.out.as_ptr().cast(), F32, &[6, 2]);
    let kf = Desc::compact(c.out.as_ptr().cast(), F32, &[6]);
    // SAFETY: v and kf describe 12 and 6 of c.out's 64 floats, alive past the call; t is a
    // reference.
    let s = unsafe { strata_table_from_dlpack(&v.t, &kf.t, null(), &mut t) };
    fails(s, Status::STRATA_UNSUPPORTED_DTYPE, &["keys: dtype float32"]);
}

#[test]
fn shape_mismatches() {
    let mut c = Case::new();
    let k = c.keys();
    for (shape, strides) in [(vec![6i64, 3], vec![3i64, 1]), (vec![5, 4], vec![4, 1]), (vec![24], vec![1]), (vec![6, 4, 1], vec![4, 1, 1])]
    {
        let mut o = Desc::new(c.out.as_mut_ptr().cast(), F32, &shape, &strides, 0);
        c.expect(
            &k,
            &mut o,
            Status::STRATA_INVALID_ARGUMENT,
            &["out: shape", "expected [*keys.shape, dim] = [6, 4] or [numel(keys), dim] = [6, 4]"],
        );
    }
    let k2 = Desc::compact(c.keys.as_ptr().cast(), I64, &[2, 3]);
    let mut o = Desc::compact(c.out.as_mut_ptr().cast(), F32, &[3, 2, 4]);
    c.expect(&k2, &mut o, Status::STRATA_INVALID_ARGUMENT, &["expected [*keys.shape, dim] = [2, 3, 4]"]);
    let mut k = c.keys();
    k.t.ndim = -1;
    let mut o = c.out();
    c.expect(&k, &mut o, Status::STRATA_INVALID_ARGUMENT, &["keys: ndim = -1"]);
    let mut k = c.keys();
    k.shape[0] = -6;
    c.expect(&k, &mut o, Status::STRATA_INVALID_ARGUMENT, &["keys: shape[0] = -6; expected non-negative sizes"]);

    // table constructors
    let mut t = null_mut();
    let v1 = Desc::compact(c.out.as_ptr().cast(), F32, &[8]);
    // SAFETY: v1 describes 8 of c.out's 64 floats, alive past the call; t is a reference.
    let s = unsafe { strata_table_from_dlpack(&v1.t, null(), null(), &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["vectors: ndim = 1; expected 2 ([rows, dim])"]);
    let v0 = Desc::compact(c.out.as_ptr().cast(), F32, &[8, 0]);
    // SAFETY: v0 describes no element of c.out (its dim is 0); t is a reference.
    let s = unsafe { strata_table_from_dlpack(&v0.t, null(), null(), &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["vectors: shape[1] = 0; expected 1 <= dim <= 16777216"]);
    let vhuge = Desc::compact(c.out.as_ptr().cast(), F32, &[0, 1 << 62]);
    // SAFETY: vhuge has 0 rows, so no element of c.out is read (and its dim is refused); t is a
    // reference.
    let s = unsafe { strata_table_from_dlpack(&vhuge.t, null(), null(), &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["vectors: shape[1] = 4611686018427387904; expected 1 <= dim"]);
    let v = Desc::compact(c.out.as_ptr().cast(), F32, &[6, 2]);
    let kshort = Desc::compact(c.keys.as_ptr().cast(), I64, &[5]);
    // SAFETY: v and kshort describe 12 floats of c.out and 5 keys of c.keys, alive past the call; t
    // is a reference.
    let s = unsafe { strata_table_from_dlpack(&v.t, &kshort.t, null(), &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["keys: shape [5]; expected [6]"]);
    let dup = [1i64, 2, 3, 2, 5, 6];
    let kdup = Desc::compact(dup.as_ptr().cast(), I64, &[6]);
    // SAFETY: v and kdup describe 12 floats of c.out and the 6 keys of dup, alive past the call; t
    // is a reference.
    let s = unsafe { strata_table_from_dlpack(&v.t, &kdup.t, null(), &mut t) };
    fails(s, Status::STRATA_DUPLICATE_KEY, &["keys: key 2 appears at rows 1 and 3"]);
    let bad = TableOptions { missing_key: 7, ..TableOptions::default() };
    // SAFETY: v describes 12 floats of c.out, alive past the call; bad and t are references.
    let s = unsafe { strata_table_from_dlpack(&v.t, null(), &bad, &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["opts->missing_key: 7"]);
    assert!(t.is_null());
    let gpu_cases: [(TableOptions, &str); 6] = [
        (TableOptions { gpu_placement: 3, ..TableOptions::default() }, "opts->gpu_placement: 3; expected STRATA_GPU_STATIC (0)"),
        (TableOptions { gpu_sharding: -1, ..TableOptions::default() }, "opts->gpu_sharding: -1; expected STRATA_GPU_REPLICATE (0)"),
        (
            TableOptions { gpu_cache_fraction: 1.5, ..TableOptions::default() },
            "opts->gpu_cache_fraction: 1.5; expected a fraction in [0, 1]",
        ),
        (TableOptions { gpu_cache_fraction: f32::NAN, ..TableOptions::default() }, "opts->gpu_cache_fraction: NaN"),
        (TableOptions { hit_rate_threshold: -0.5, ..TableOptions::default() }, "opts->hit_rate_threshold: -0.5; expected a number >= 0"),
        (
            TableOptions { gpu_sharding: 1, gpu_placement: 2, ..TableOptions::default() },
            "opts->gpu_sharding: STRATA_GPU_SHARD; sharding over GPUs needs gpu_placement = STRATA_GPU_STATIC",
        ),
    ];
    for (bad, msg) in gpu_cases {
        // SAFETY: v describes 12 floats of c.out, alive past the call; bad and t are references.
        let s = unsafe { strata_table_from_dlpack(&v.t, null(), &bad, &mut t) };
        fails(s, Status::STRATA_INVALID_ARGUMENT, &[msg]);
        assert!(t.is_null());
    }
}

#[test]
fn bad_strides_offsets_and_alignment() {
    let mut c = Case::new();
    let mut o = c.out();
    let mut k = c.keys();
    k.strides[0] = i64::MAX / 2;
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["keys: shape [6] with strides", "address space"]);
    let mut k = c.keys();
    k.t.byte_offset = u64::MAX - 4;
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["keys"]);
    let mut k = c.keys();
    k.t.byte_offset = 3;
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["keys: data + byte_offset", "not aligned to 8 bytes"]);

    let k = c.keys();
    let mut o = c.out();
    o.strides[1] = -1;
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["out: strides[1] = -1 is negative"]);
    let mut o = c.out();
    o.t.byte_offset = 2;
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["out: data + byte_offset", "not aligned to 4 bytes"]);
    let mut o = c.out();
    o.strides[0] = 0;
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["out: strides [0, 1]", "overlap"]);
    let mut o = c.out();
    o.strides[0] = 2;
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["overlap"]);
    let mut o = c.out();
    o.strides = vec![1i64 << 62, 1].into();
    o.t.strides = o.strides.as_mut_ptr();
    c.expect(&k, &mut o, Status::STRATA_INVALID_LAYOUT, &["out", "address space"]);

    // out aliasing keys or the table's own vectors
    let mut shared = vec![0i64; 40];
    shared[..6].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
    let k = Desc::compact(shared.as_ptr().cast(), I64, &[6]);
    let mut o = Desc::compact(shared.as_mut_ptr().cast(), F32, &[6, 4]);
    // SAFETY: c.table is live; k and o describe shared (320 bytes, enough for 6 keys and 6x4
    // floats), alive past the call; strata refuses the overlap before it writes.
    let s = unsafe { strata_lookup(c.table.0, &k.t, &mut o.t, null(), null_mut()) };
    fails(s, Status::STRATA_INVALID_LAYOUT, &["out: overlaps the memory of keys"]);
    assert_eq!(&shared[..6], &[1, 2, 3, 4, 5, 6]);
}

#[test]
fn devices_other_than_host_memory() {
    let mut c = Case::new();
    for dev in [DLDeviceType::ROCM, DLDeviceType::VULKAN, DLDeviceType::OPENCL] {
        let k = c.keys().device(dev);
        let mut o = c.out();
        c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DEVICE, &["keys: device", "host memory only"]);
        let k = c.keys();
        let mut o = c.out().device(dev);
        c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DEVICE, &["out: device", "host memory only"]);
    }
    // CUDA tensors without a driver (or in a build without the `cuda` feature); with a device
    // these pointers would be launched on, so tests/cuda.rs covers that case with real memory.
    if strata_cuda_available() == 0 {
        for dev in [DLDeviceType::CUDA, DLDeviceType::CUDAMANAGED] {
            let k = c.keys().device(dev);
            let mut o = c.out();
            let msg = c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DEVICE, &["keys: device kDLCUDA"]);
            assert!(msg.contains("without CUDA support") || msg.contains("no CUDA driver"), "{msg}");
            let k = c.keys();
            let mut o = c.out().device(dev);
            c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DEVICE, &["out: device kDLCUDA"]);
        }
    }
    let v = Desc::compact(c.out.as_ptr().cast(), F32, &[6, 2]).device(DLDeviceType::CUDA);
    let mut t = null_mut();
    // SAFETY: v describes 12 floats of c.out (host memory, flagged CUDA), alive past the call;
    // tables copy from host memory only, so strata refuses the device before reading. t is a
    // reference.
    let s = unsafe { strata_table_from_dlpack(&v.t, null(), null(), &mut t) };
    fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &["vectors: device kDLCUDA:0"]);
}

#[test]
fn bad_options() {
    let mut c = Case::new();
    let k = c.keys();
    let mut o = c.out();
    let opts = LookupOptions { num_threads: -2, ..LookupOptions::default() };
    // SAFETY: c.table is live; k and o describe c.keys and c.out, alive past the call; opts is a
    // reference (refused before the lookup starts).
    let s = unsafe { strata_lookup(c.table.0, &k.t, &mut o.t, &opts, null_mut()) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["opts->num_threads: -2; expected 0 (library default)"]);
    assert!(c.out.iter().all(|&x| x == -9.0));
}

#[test]
fn defaults_and_names() {
    let t = strata_table_options_default_0_3_1();
    assert_eq!((t.default_value, t.missing_key), (0.0, 0));
    assert_eq!((t.gpu_placement, t.gpu_cache_fraction, t.hit_rate_threshold, t.gpu_sharding), (0, 0.5, 0.9, 0));
    let l = strata_lookup_options_default();
    assert!(l.stream.is_null());
    assert_eq!(l.num_threads, 0);
    assert!(strata_default_num_threads() >= 1);
    // SAFETY: strata_status_name returns a static NUL-terminated string for any value.
    let name = |s: i32| unsafe { std::ffi::CStr::from_ptr(strata_status_name(s)) }.to_str().unwrap().to_string();
    assert_eq!(name(Status::STRATA_UNSUPPORTED_DEVICE as i32), "STRATA_UNSUPPORTED_DEVICE");
    assert_eq!(name(99), "STRATA_UNKNOWN_STATUS");
    // SAFETY: strata_version returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(strata_version()) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
}

#[test]
fn last_error_is_per_thread() {
    let mut c = Case::new();
    let mut k = c.keys();
    k.t.dtype = F32;
    let mut o = c.out();
    c.expect(&k, &mut o, Status::STRATA_UNSUPPORTED_DTYPE, &["keys"]);
    let other = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(other, "");
    assert!(last_error().contains("keys: dtype float32"));
}

/// A tensor on a device strata does not serve is refused even when it has no elements, also
/// beside a CUDA tensor (which takes the CUDA path): found by the property test.
#[test]
fn empty_tensors_on_unserved_devices_are_refused() {
    let vectors = [1f32; 4];
    let table = Owned::build(&vectors, 4, 1, None, &strata_table_options_default_0_3_1());
    let (keys, out) = ([0i32; 1], [0f32; 1]);
    for (kdev, odev, arg) in [
        (DLDeviceType::CUDA, DLDeviceType::OPENCL, "out"),
        (DLDeviceType::OPENCL, DLDeviceType::CUDA, "keys"),
        (DLDeviceType::CPU, DLDeviceType::VULKAN, "out"),
    ] {
        let k = Desc::compact(keys.as_ptr().cast(), I32, &[0]).device(kdev);
        let mut o = Desc::compact(out.as_ptr().cast(), F32, &[0, 1]).device(odev);
        // SAFETY: the descriptions cover this test's buffers (no element is read or written).
        let s = unsafe { strata_lookup(table.0, &k.t, &mut o.t, std::ptr::null(), std::ptr::null_mut()) };
        fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &[&format!("{arg}: device")]);
        let offsets = [0i64];
        let od = Desc::compact(offsets.as_ptr().cast(), I64, &[1]);
        // SAFETY: as above.
        let s =
            unsafe { strata_lookup_pooled(table.0, &k.t, &od.t, std::ptr::null(), 1, &mut o.t, std::ptr::null(), std::ptr::null_mut()) };
        fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &[&format!("{arg}: device")]);
    }
}
