//! Shared helpers for the integration tests: the C functions under test, DLTensor
//! descriptions that own their shape and strides, a seeded RNG and reference conversions.
#![allow(dead_code)]

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use std::ffi::{CStr, c_void};
// The C functions and types under test, as the library defines them: the same definitions
// cbindgen writes into include/strata.h (whose freshness a test checks), so a changed signature
// fails to compile here instead of being redeclared by hand.
pub use strata::ffi::*;
pub type Table = strata_table;
pub type Server = strata_server;
pub type TableOptions = strata_table_options;
pub type TableInfo = strata_table_info;
pub type TableStats = strata_table_stats;
pub type LookupOptions = strata_lookup_options;
pub type LookupStats = strata_lookup_stats;
pub type Partitioned = strata_partitioned;
pub type Partition = strata_partition;
pub type PartitionLocation = strata_partition_location;

/// The message of the last failure on this thread.
pub fn last_error() -> String {
    // SAFETY: strata_last_error returns a NUL-terminated string that strata owns and keeps
    // until the next failing call on this thread; it is copied here before any other call.
    unsafe { CStr::from_ptr(strata_last_error()) }.to_string_lossy().into_owned()
}

/// Asserts a call succeeded, showing strata's message if not.
#[track_caller]
pub fn ok(s: Status) {
    assert_eq!(s, Status::STRATA_OK, "{}", last_error());
}

/// Asserts a call failed with `want` and a message containing every piece of `needles`.
#[track_caller]
pub fn fails(s: Status, want: Status, needles: &[&str]) -> String {
    let msg = last_error();
    assert_eq!(s, want, "message: {msg}");
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} lacks {n:?}");
    }
    msg
}

pub const F32: DLDataType = DLDataType { code: DLDataTypeCode::FLOAT, bits: 32, lanes: 1 };
pub const F16: DLDataType = DLDataType { code: DLDataTypeCode::FLOAT, bits: 16, lanes: 1 };
pub const BF16: DLDataType = DLDataType { code: DLDataTypeCode::BFLOAT, bits: 16, lanes: 1 };
pub const I32: DLDataType = DLDataType { code: DLDataTypeCode::INT, bits: 32, lanes: 1 };
pub const I64: DLDataType = DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 1 };
pub const U32: DLDataType = DLDataType { code: DLDataTypeCode::UINT, bits: 32, lanes: 1 };
pub const U64: DLDataType = DLDataType { code: DLDataTypeCode::UINT, bits: 64, lanes: 1 };
pub const CPU: DLDevice = DLDevice { device_type: DLDeviceType::CPU, device_id: 0 };

/// A DLTensor description that owns its shape and strides (the data stays the caller's). The
/// tests describe only buffers that outlive the description, so `&d.t` is valid to pass to
/// strata while `d` lives (as long as the shape and strides fit the buffer).
pub struct Desc {
    pub t: DLTensor,
    pub shape: Box<[i64]>,
    pub strides: Box<[i64]>,
}

impl Desc {
    /// A description of `data` with explicit `strides` (elements) and `byte_offset`.
    pub fn new(data: *const u8, dtype: DLDataType, shape: &[i64], strides: &[i64], byte_offset: u64) -> Self {
        let mut shape: Box<[i64]> = shape.into();
        let mut strides: Box<[i64]> = strides.into();
        let t = DLTensor {
            data: data as *mut c_void,
            device: CPU,
            ndim: shape.len() as i32,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: strides.as_mut_ptr(),
            byte_offset,
        };
        Desc { t, shape, strides }
    }

    /// A compact row-major description of `data`.
    pub fn compact(data: *const u8, dtype: DLDataType, shape: &[i64]) -> Self {
        Desc::new(data, dtype, shape, &compact_strides(shape), 0)
    }

    pub fn device(mut self, device_type: DLDeviceType) -> Self {
        self.t.device = DLDevice { device_type, device_id: 0 };
        self
    }
}

pub fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1].max(1);
    }
    s
}

/// A small seeded RNG (splitmix64), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Bytes of one element of `dt`.
pub fn elem_size(dt: DLDataType) -> usize {
    (dt.bits as usize * dt.lanes as usize).div_ceil(8)
}

/// Writes `v` as one element of the float dtype `dt` at the start of `dst` (native byte order,
/// any alignment; panics if `dst` is shorter than the element).
pub fn write_float(dt: DLDataType, dst: &mut [u8], v: f32) {
    match (dt.code, dt.bits) {
        (DLDataTypeCode::FLOAT, 32) => dst[..4].copy_from_slice(&v.to_ne_bytes()),
        (DLDataTypeCode::FLOAT, 16) => dst[..2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_ne_bytes()),
        (DLDataTypeCode::BFLOAT, 16) => dst[..2].copy_from_slice(&half::bf16::from_f32(v).to_bits().to_ne_bytes()),
        _ => panic!("not a float dtype"),
    }
}

/// Reads one element of the float dtype `dt` at the start of `src` as f32.
pub fn read_float(dt: DLDataType, src: &[u8]) -> f32 {
    match (dt.code, dt.bits) {
        (DLDataTypeCode::FLOAT, 32) => f32::from_ne_bytes(src[..4].try_into().unwrap()),
        (DLDataTypeCode::FLOAT, 16) => half::f16::from_bits(u16::from_ne_bytes(src[..2].try_into().unwrap())).to_f32(),
        (DLDataTypeCode::BFLOAT, 16) => half::bf16::from_bits(u16::from_ne_bytes(src[..2].try_into().unwrap())).to_f32(),
        _ => panic!("not a float dtype"),
    }
}

/// Rounds `v` through the float dtype `dt` (what a table or output of that dtype holds).
pub fn round_to(dt: DLDataType, v: f32) -> f32 {
    let mut b = [0u8; 4];
    write_float(dt, &mut b, v);
    read_float(dt, &b)
}

/// Writes integer `v` as one element of the key dtype `dt` at the start of `dst`.
pub fn write_key(dt: DLDataType, dst: &mut [u8], v: i64) {
    match (dt.code, dt.bits) {
        (DLDataTypeCode::INT, 32) => dst[..4].copy_from_slice(&(v as i32).to_ne_bytes()),
        (DLDataTypeCode::INT, 64) => dst[..8].copy_from_slice(&v.to_ne_bytes()),
        (DLDataTypeCode::UINT, 32) => dst[..4].copy_from_slice(&(v as u32).to_ne_bytes()),
        (DLDataTypeCode::UINT, 64) => dst[..8].copy_from_slice(&(v as u64).to_ne_bytes()),
        _ => panic!("not a key dtype"),
    }
}

/// A table this test owns and frees on drop: built by copy from f32 `vectors` [rows, dim], dense
/// or keyed by i64 `keys`, or wrapped as `Owned(t)` around a table that a strata constructor
/// returned and nothing else frees. So `.0` is a live table handle (or NULL) while this lives.
pub struct Owned(pub *mut Table);

// SAFETY: a strata table is not tied to the thread that built it: strata_table_free may run on
// any thread (tests/adopt.rs frees one from another thread).
unsafe impl Send for Owned {}
// SAFETY: strata tables may be looked up from many threads at once (the threading contract of
// strata_lookup, which the tests that share an Owned check).
unsafe impl Sync for Owned {}

impl Owned {
    pub fn build(vectors: &[f32], rows: usize, dim: usize, keys: Option<&[i64]>, opts: &TableOptions) -> Owned {
        Owned::build_bytes(
            // SAFETY: the bytes of `vectors` (same address, size_of_val bytes), borrowed as long as
            // it is; u8 has no alignment or validity requirement.
            unsafe { std::slice::from_raw_parts(vectors.as_ptr().cast(), std::mem::size_of_val(vectors)) },
            F32,
            rows,
            dim,
            keys,
            opts,
        )
    }

    /// A table copied from compact `[rows, dim]` values of `dtype`, given as bytes.
    pub fn build_bytes(vectors: &[u8], dtype: DLDataType, rows: usize, dim: usize, keys: Option<&[i64]>, opts: &TableOptions) -> Owned {
        let v = Desc::compact(vectors.as_ptr(), dtype, &[rows as i64, dim as i64]);
        let k = keys.map(|k| Desc::compact(k.as_ptr().cast(), I64, &[k.len() as i64]));
        let mut t = std::ptr::null_mut();
        // SAFETY: v and k describe `vectors` and `keys`, borrowed for this whole function, with
        // the shapes of those slices; opts and t are references. strata only reads them during
        // the call (it copies the rows).
        ok(unsafe { strata_table_from_dlpack(&v.t, k.as_ref().map_or(std::ptr::null(), |k| &k.t), opts, &mut t) });
        Owned(t)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: self.0 is NULL or a table this Owned holds and nothing else frees (see Owned).
        unsafe { strata_table_free(self.0) };
    }
}

/// Random distinct keys (some negative) and random vectors.
pub fn random_table(rng: &mut Rng, rows: usize, dim: usize) -> (Vec<i64>, Vec<f32>) {
    let mut seen = std::collections::HashSet::new();
    let mut keys = Vec::with_capacity(rows);
    while keys.len() < rows {
        let k = (rng.next() as i64) >> rng.below(40);
        if seen.insert(k) {
            keys.push(k);
        }
    }
    let vectors = (0..rows * dim).map(|_| rng.f32()).collect();
    (keys, vectors)
}

/// The pooled-lookup reference of the contract, a plain loop: per bag `(lo, hi)` of `keys`,
/// Σ w·row in float32 in key order (`row(key)`, or `default` for a key the table lacks), then
/// / Σ w (pooling 2, mean) or / √Σ w² (3, sqrtn), zeros for a zero total (1 is sum). Returns
/// the `dim`-wide pooled rows and the misses.
pub fn pool_reference<'a>(
    row: impl Fn(i64) -> Option<&'a [f32]>,
    default: f32,
    dim: usize,
    keys: &[i64],
    bags: &[(usize, usize)],
    weights: Option<&[f32]>,
    pooling: i32,
) -> (Vec<f32>, u64) {
    let default = vec![default; dim];
    let mut out = vec![0f32; bags.len() * dim];
    let mut misses = 0;
    for (b, &(lo, hi)) in bags.iter().enumerate() {
        let acc = &mut out[b * dim..(b + 1) * dim];
        let (mut ws, mut w2) = (0f32, 0f32);
        for j in lo..hi {
            let w = weights.map_or(1.0, |w| w[j]);
            let r = row(keys[j]);
            misses += r.is_none() as u64;
            for (a, x) in acc.iter_mut().zip(r.unwrap_or(&default)) {
                *a += w * x;
            }
            ws += w;
            w2 += w * w;
        }
        let by = match pooling {
            2 => Some(ws),
            3 => Some(w2.sqrt()),
            _ => None,
        };
        match by {
            Some(0.0) => acc.fill(0.0),
            Some(d) => acc.iter_mut().for_each(|a| *a /= d),
            None => {}
        }
    }
    (out, misses)
}
