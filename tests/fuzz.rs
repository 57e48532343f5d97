//! Property tests of the C ABI: random DLTensor descriptions for `keys` and `out`, fed to
//! `strata_lookup` / `strata_lookup_managed` / `strata_lookup_managed_versioned` exactly as a
//! C host would (through the library's `extern "C"` functions and `#[repr(C)]` types, the
//! definitions include/strata.h is generated from).
//!
//! Every description gets a buffer exactly as large as what it reaches (in both directions,
//! for negative strides), plus poisoned guard bytes before and after, so a description that
//! strata may legally serve is always in bounds. A model of the contract classifies each case:
//!
//! - *must fail* (bad dtype or device, wrong `out` shape, negative shape, strides or offset
//!   that overflow the address space, NULL data with elements, overlapping `out` elements,
//!   read-only or wrong-version managed tensors, negative `num_threads`): the call returns a
//!   listed non-OK status with a non-empty `strata_last_error`, and no byte of `out` changes;
//! - *may fail* (negative strides, misaligned elements, kDLCUDA in a host-only build, layout
//!   oddities of empty tensors, distinct-but-interleaved `out` strides that strata may refuse
//!   conservatively): either as above, or success with correct results;
//! - otherwise it must succeed: every element of `out` equals a reference gather (table value
//!   or default, converted to the out dtype with round-to-nearest-even), stats are exact, and
//!   every other byte of the buffer (guards, stride gaps) is still poison. With a
//!   `STRATA_MISSING_ERROR` table and a missing key, `STRATA_KEY_NOT_FOUND` naming the first
//!   missing key, with only `out`'s elements possibly written.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256; the large-lookup property runs an
//! eighth as many).

use dlpark::DlpackFlags;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion,
    DLTensor,
};
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};
use std::ffi::{CStr, c_void};

// ---------------------------------------------------------------------------------------------
// The C ABI, as a C caller sees it
// ---------------------------------------------------------------------------------------------

use strata::ffi::{
    strata_cuda_available, strata_last_error, strata_lookup, strata_lookup_managed, strata_lookup_managed_versioned,
    strata_lookup_options, strata_lookup_options_default, strata_lookup_stats, strata_status_name, strata_table,
    strata_table_dim, strata_table_free, strata_table_from_dlpack, strata_table_len, strata_table_options_default,
};
type StrataTable = strata_table;
type LookupOptions = strata_lookup_options;
type LookupStats = strata_lookup_stats;

// Status values, taken from the crate so that the test and the library agree by construction
// (this also makes the test link the strata rlib that defines the C symbols).
const OK: i32 = strata::Status::STRATA_OK as i32;
const INVALID_ARGUMENT: i32 = strata::Status::STRATA_INVALID_ARGUMENT as i32;
const UNSUPPORTED_DTYPE: i32 = strata::Status::STRATA_UNSUPPORTED_DTYPE as i32;
const UNSUPPORTED_DEVICE: i32 = strata::Status::STRATA_UNSUPPORTED_DEVICE as i32;
const INVALID_LAYOUT: i32 = strata::Status::STRATA_INVALID_LAYOUT as i32;
const READ_ONLY: i32 = strata::Status::STRATA_READ_ONLY as i32;
const KEY_NOT_FOUND: i32 = strata::Status::STRATA_KEY_NOT_FOUND as i32;

fn last_error() -> String {
    // SAFETY: strata_last_error returns a NUL-terminated string that strata owns and keeps until
    // the next failing call on this thread; it is copied here before any other call.
    unsafe { CStr::from_ptr(strata_last_error()) }.to_string_lossy().into_owned()
}

fn status_name(s: i32) -> String {
    // SAFETY: strata_status_name returns a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(strata_status_name(s)) }.to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------------------------
// Reference conversions (independent of the `half` crate strata uses)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fl {
    F32,
    F16,
    Bf16,
}

impl Fl {
    fn size(self) -> usize {
        if self == Fl::F32 { 4 } else { 2 }
    }
    fn dl(self) -> DLDataType {
        match self {
            Fl::F32 => DLDataType { code: DLDataTypeCode::FLOAT, bits: 32, lanes: 1 },
            Fl::F16 => DLDataType { code: DLDataTypeCode::FLOAT, bits: 16, lanes: 1 },
            Fl::Bf16 => DLDataType { code: DLDataTypeCode::BFLOAT, bits: 16, lanes: 1 },
        }
    }
    fn of(dt: DLDataType) -> Option<Fl> {
        match (dt.code, dt.bits, dt.lanes) {
            (DLDataTypeCode::FLOAT, 32, 1) => Some(Fl::F32),
            (DLDataTypeCode::FLOAT, 16, 1) => Some(Fl::F16),
            (DLDataTypeCode::BFLOAT, 16, 1) => Some(Fl::Bf16),
            _ => None,
        }
    }
    /// The exact value of an element's bits.
    fn to_f32(self, bits: u32) -> f32 {
        match self {
            Fl::F32 => f32::from_bits(bits),
            Fl::F16 => f16_to_f32(bits as u16),
            Fl::Bf16 => f32::from_bits(bits << 16),
        }
    }
    /// `x` rounded to nearest even in this dtype, as bits.
    fn round(self, x: f32) -> u32 {
        match self {
            Fl::F32 => x.to_bits(),
            Fl::F16 => f32_to_f16(x) as u32,
            Fl::Bf16 => f32_to_bf16(x) as u32,
        }
    }
    fn is_nan_bits(self, bits: u32) -> bool {
        self.to_f32(bits).is_nan()
    }
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as u32;
    match exp {
        0 => sign * man as f32 * 2f32.powi(-24),
        31 if man == 0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => f32::from_bits(((h as u32 & 0x8000) << 16) | (((exp + 112) as u32) << 23) | (man << 13)),
    }
}

fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127;
    if e > 15 {
        return sign | 0x7c00;
    }
    if e >= -14 {
        let mut h = (((e + 15) as u32) << 10) | (man >> 13);
        let rem = man & 0x1fff;
        if rem > 0x1000 || (rem == 0x1000 && h & 1 == 1) {
            h += 1; // may carry into the exponent, up to infinity: both correct
        }
        return sign | h as u16;
    }
    if exp == 0 || e < -25 {
        return sign; // f32 subnormals and anything below 2^-25 round to zero
    }
    let full = man | 0x80_0000;
    let shift = (-(e + 1)) as u32; // 14..=24: value = full * 2^(e-23) = (full >> shift) * 2^-24
    let q = full >> shift;
    let rem = full & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let h = if rem > half || (rem == half && q & 1 == 1) { q + 1 } else { q };
    sign | h as u16
}

fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits() as u64;
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

// ---------------------------------------------------------------------------------------------
// A tiny deterministic generator for bulk data (values, keys); proptest drives the structure
// ---------------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    /// f32 values that exercise conversions: plain values, any finite/infinite bit pattern,
    /// float16 overflow edges, exact float16/bfloat16 ties, float16 subnormals.
    fn value(&mut self) -> f32 {
        let sign = if self.next() & 1 == 0 { 1.0 } else { -1.0 };
        match self.below(8) {
            0..=3 => (self.below(20001) as f32 - 10000.0) / 64.0,
            4 => loop {
                let v = f32::from_bits(self.next() as u32);
                if !v.is_nan() {
                    break v;
                }
            },
            5 => sign * (65504.0 + self.below(40) as f32),
            6 => sign * (1.0 + self.below(4096) as f32 * 2f32.powi(-12)),
            _ => sign * self.below(4096) as f32 * 2f32.powi(-26),
        }
    }
    /// Random non-NaN bits of a 16-bit dtype.
    fn bits16(&mut self, dt: Fl) -> u32 {
        loop {
            let b = (self.next() & 0xffff) as u32;
            if !dt.is_nan_bits(b) {
                return b;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kd {
    I32,
    I64,
    U32,
    U64,
}

impl Kd {
    const ALL: [Kd; 4] = [Kd::I32, Kd::I64, Kd::U32, Kd::U64];
    fn of(dt: DLDataType) -> Option<Kd> {
        match (dt.code, dt.bits, dt.lanes) {
            (DLDataTypeCode::INT, 32, 1) => Some(Kd::I32),
            (DLDataTypeCode::INT, 64, 1) => Some(Kd::I64),
            (DLDataTypeCode::UINT, 32, 1) => Some(Kd::U32),
            (DLDataTypeCode::UINT, 64, 1) => Some(Kd::U64),
            _ => None,
        }
    }
    fn dl(self) -> DLDataType {
        match self {
            Kd::I32 => DLDataType { code: DLDataTypeCode::INT, bits: 32, lanes: 1 },
            Kd::I64 => DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 1 },
            Kd::U32 => DLDataType { code: DLDataTypeCode::UINT, bits: 32, lanes: 1 },
            Kd::U64 => DLDataType { code: DLDataTypeCode::UINT, bits: 64, lanes: 1 },
        }
    }
    fn size(self) -> usize {
        match self {
            Kd::I32 | Kd::U32 => 4,
            Kd::I64 | Kd::U64 => 8,
        }
    }
    /// Native-endian bytes of `v` stored in this dtype (truncating).
    fn bytes(self, v: i64) -> Vec<u8> {
        match self {
            Kd::I32 => (v as i32).to_ne_bytes().to_vec(),
            Kd::I64 => v.to_ne_bytes().to_vec(),
            Kd::U32 => (v as u32).to_ne_bytes().to_vec(),
            Kd::U64 => (v as u64).to_ne_bytes().to_vec(),
        }
    }
    /// The canonical 64-bit key strata indexes by: sign-extended for signed dtypes.
    fn canonical(self, b: &[u8]) -> u64 {
        match self {
            Kd::I32 => i32::from_ne_bytes(b[..4].try_into().unwrap()) as i64 as u64,
            Kd::I64 => i64::from_ne_bytes(b[..8].try_into().unwrap()) as u64,
            Kd::U32 => u32::from_ne_bytes(b[..4].try_into().unwrap()) as u64,
            Kd::U64 => u64::from_ne_bytes(b[..8].try_into().unwrap()),
        }
    }
    /// The value a canonical key stands for, as a caller would print it.
    fn value(self, c: u64) -> String {
        match self {
            Kd::I32 | Kd::I64 => (c as i64).to_string(),
            Kd::U32 | Kd::U64 => c.to_string(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct TableSpec {
    dtype: Fl,
    dim: usize,
    rows: usize,
    /// Keyed table: the dtype of the keys tensor it is built from; None = dense.
    keyed: Option<Kd>,
    seed: u64,
    default_value: f32,
    missing_error: bool,
    /// Extra elements between rows of the source vectors (exercises the copy).
    vpad: usize,
}

struct Table {
    ptr: *mut StrataTable,
    dtype: Fl,
    dim: usize,
    rows: usize,
    /// Row-major `rows x dim` element bits in the table dtype.
    values: Vec<u32>,
    /// canonical key -> row (keyed tables); dense tables map key k < rows to row k.
    index: Option<HashMap<u64, usize>>,
    /// Raw key values of the rows (for picking hits).
    raw_keys: Vec<i64>,
    default_value: f32,
    missing_error: bool,
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: self.ptr is the table Table::build made, owned by this Table alone and freed only
        // here.
        unsafe { strata_table_free(self.ptr) };
    }
}

impl Table {
    fn build(spec: &TableSpec) -> Table {
        let mut rng = Rng(spec.seed);
        // Keys first: they decide the row count of keyed tables.
        let (rows, raw_keys, index) = match spec.keyed {
            None => (spec.rows, (0..spec.rows as i64).collect::<Vec<_>>(), None),
            Some(kd) => {
                let mut seen = BTreeSet::new();
                let mut raw = Vec::new();
                let mut index = HashMap::new();
                for _ in 0..spec.rows {
                    let v: i64 = match rng.below(4) {
                        0 => rng.below(41) as i64 - 20,
                        1 => [i64::MIN, i64::MAX, -1, 0, u32::MAX as i64, i32::MIN as i64][rng.below(6) as usize],
                        _ => rng.next() as i64 >> rng.below(40),
                    };
                    let c = kd.canonical(&kd.bytes(v));
                    if seen.insert(c) {
                        index.insert(c, raw.len());
                        raw.push(v);
                    }
                }
                (raw.len(), raw, Some(index))
            }
        };
        let dim = spec.dim;
        let dt = spec.dtype;
        let values: Vec<u32> = (0..rows * dim)
            .map(|_| if dt == Fl::F32 { rng.value().to_bits() } else { rng.bits16(dt) })
            .collect();
        // Source vectors [rows, dim] with row stride dim + vpad, in u64 words (aligned).
        let rs = dim + spec.vpad;
        let nbytes = (rows * rs).max(1) * dt.size();
        let mut words = vec![0u64; nbytes.div_ceil(8)];
        let base = words.as_mut_ptr() as *mut u8;
        for r in 0..rows {
            for c in 0..dim {
                let v = values[r * dim + c];
                // SAFETY: (r * rs + c) * size < rows * rs * size <= nbytes <= 8 * words.len(), so p
                // stays inside words.
                let p = unsafe { base.add((r * rs + c) * dt.size()) };
                // SAFETY: p is inside words with room for one element (above), and aligned for it:
                // words is u64-aligned and the offset is a multiple of the element size.
                unsafe {
                    if dt == Fl::F32 {
                        (p as *mut u32).write(v)
                    } else {
                        (p as *mut u16).write(v as u16)
                    }
                };
            }
        }
        let mut vshape = [rows as i64, dim as i64];
        let mut vstrides = [rs as i64, 1];
        let vectors = DLTensor {
            data: base as *mut c_void,
            device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
            ndim: 2,
            dtype: dt.dl(),
            shape: vshape.as_mut_ptr(),
            strides: if spec.vpad == 0 && spec.seed & 1 == 0 { std::ptr::null_mut() } else { vstrides.as_mut_ptr() },
            byte_offset: 0,
        };
        let kd = spec.keyed.unwrap_or(Kd::I64);
        let mut kbytes: Vec<u64> = vec![0; (rows * kd.size()).div_ceil(8).max(1)];
        let kb = kbytes.as_mut_ptr() as *mut u8;
        for (i, &v) in raw_keys.iter().enumerate() {
            let b = kd.bytes(v);
            // SAFETY: i < rows, so the kd.size() bytes at i * kd.size() lie inside kbytes' 8 * len
            // bytes; b holds kd.size() bytes in its own allocation, so the two do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), kb.add(i * kd.size()), b.len()) };
        }
        let mut kshape = [rows as i64];
        let mut kstrides = [1i64];
        let keys = DLTensor {
            data: kb as *mut c_void,
            device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
            ndim: 1,
            dtype: kd.dl(),
            shape: kshape.as_mut_ptr(),
            strides: kstrides.as_mut_ptr(),
            byte_offset: 0,
        };
        let mut opts = strata_table_options_default();
        assert_eq!(
            (opts.gpu_placement, opts.gpu_cache_fraction, opts.hit_rate_threshold, opts.gpu_sharding),
            (0, 0.5, 0.9, 0),
            "strata_table_options_default's GPU fields"
        );
        opts.default_value = spec.default_value;
        opts.missing_key = spec.missing_error as i32;
        let mut ptr = std::ptr::null_mut();
        let keys_p = if spec.keyed.is_some() { &keys as *const DLTensor } else { std::ptr::null() };
        // SAFETY: vectors and keys describe words and kbytes ([rows, dim] at row stride rs, and
        // rows keys) through vshape, vstrides, kshape and kstrides, all alive past the call; NULL
        // strides only for compact vectors. keys_p is NULL or &keys; opts and ptr are references.
        let s = unsafe { strata_table_from_dlpack(&vectors, keys_p, &opts, &mut ptr) } as i32;
        assert_eq!(s, OK, "strata_table_from_dlpack: {} {}", status_name(s), last_error());
        assert!(!ptr.is_null());
        // The copy must not depend on the source: scribble over it before any lookup.
        words.iter_mut().for_each(|w| *w = 0x5a5a_5a5a_5a5a_5a5a);
        kbytes.iter_mut().for_each(|w| *w = 0x5a5a_5a5a_5a5a_5a5a);
        // SAFETY: ptr is the table just built (status OK, not NULL), freed only by Table's drop.
        assert_eq!(unsafe { strata_table_dim(ptr) }, dim as i64);
        // SAFETY: ptr is the table just built (status OK, not NULL), freed only by Table's drop.
        assert_eq!(unsafe { strata_table_len(ptr) }, rows as i64);
        Table {
            ptr,
            dtype: dt,
            dim,
            rows,
            values,
            index,
            raw_keys,
            default_value: spec.default_value,
            missing_error: spec.missing_error,
        }
    }

    fn row_of(&self, canonical: u64) -> Option<usize> {
        match &self.index {
            None => (canonical < self.rows as u64).then_some(canonical as usize),
            Some(ix) => ix.get(&canonical).copied(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor descriptions and their buffers
// ---------------------------------------------------------------------------------------------

/// How a tensor's strides, offsets and pointers are laid out.
#[derive(Debug, Clone)]
struct Layout {
    /// strides = NULL (compact row-major, pre-DLPack-1.2 style).
    null_strides: bool,
    /// Permute the memory order of the dimensions (e.g. a transposed view).
    permute: Option<u64>,
    /// Extra elements added at each level: [innermost stride - 1, gap after dim 1, ...].
    pads: Vec<u8>,
    zero_stride: Option<u8>,
    negative_stride: Option<u8>,
    huge_stride: Option<(u8, u8)>,
    /// Elements of slack before element [0, ..., 0].
    offset_elems: u8,
    /// Bytes added to the address of element [0, ..., 0] (0 = aligned).
    misalign: u8,
    /// How the address is split between `data` and `byte_offset`.
    split: u8,
    huge_byte_offset: bool,
    null_data: bool,
}

const HUGE: [i64; 4] = [i64::MAX, 1 << 62, -(1 << 62), i64::MIN];
const GUARD: usize = 64;
const POISON: u8 = 0xff;
/// Largest buffer a description may need; larger (but addressable) ones are discarded.
const LIMIT: i128 = 64 << 20;

struct Buffer {
    words: Vec<u64>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    null_strides: bool,
    data: *mut c_void,
    byte_offset: u64,
    /// Byte offsets (from the buffer start) of each logical element, row-major; None when the
    /// description reaches no memory or memory that cannot exist.
    offsets: Option<Vec<usize>>,
    numel: usize,
    negative_shape: bool,
    negative_stride: bool,
    unaddressable: bool,
    misaligned: bool,
    null_data: bool,
    huge_offset: bool,
    /// The effective non-negative (stride, size) pairs fail strata's documented conservative
    /// non-overlap rule (sorted strides each stepping past what the smaller ones reach).
    fails_sorted_rule: bool,
}

impl Buffer {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the bytes of self.words (same address, 8 * len bytes), borrowed as long as self
        // is; u8 has no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.words.len() * 8) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the bytes of self.words (same address, 8 * len bytes), borrowed mutably as long
        // as self is; u8 has no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.words.len() * 8) }
    }

    /// Lays out a buffer for `shape` under `layout` with `elem`-byte elements, filled with
    /// POISON. Err(()) = the description is addressable but too big to back: discard.
    fn new(shape: &[i64], layout: &Layout, elem: usize) -> Result<Buffer, ()> {
        let nd = shape.len();
        let negative_shape = shape.iter().any(|&s| s < 0);
        let numel: usize = if negative_shape { 0 } else { shape.iter().map(|&s| s as usize).product() };
        // Explicit strides: a memory order, padded at each level.
        let mut order: Vec<usize> = (0..nd).rev().collect(); // innermost first
        if let Some(seed) = layout.permute {
            let mut r = Rng(seed);
            for i in (1..nd).rev() {
                order.swap(i, r.below(i as u64 + 1) as usize);
            }
        }
        let pad = |i: usize| layout.pads.get(i).copied().unwrap_or(0) as i64;
        let mut strides = vec![0i64; nd];
        let mut cur = 1 + pad(0);
        for (k, &d) in order.iter().enumerate() {
            strides[d] = cur;
            cur = cur.saturating_mul(shape[d].max(1)).saturating_add(pad(k + 1));
        }
        if nd > 0 && !layout.null_strides {
            if let Some(i) = layout.zero_stride {
                strides[i as usize % nd] = 0;
            }
            if let Some(i) = layout.negative_stride {
                let d = i as usize % nd;
                strides[d] = if strides[d] == 0 { -1 } else { -strides[d] };
            }
            if let Some((i, h)) = layout.huge_stride {
                strides[i as usize % nd] = HUGE[h as usize % HUGE.len()];
            }
        }
        let eff: Vec<i64> = if layout.null_strides {
            let mut s = vec![0i64; nd];
            let mut acc = 1i64;
            for d in (0..nd).rev() {
                s[d] = acc;
                acc = acc.saturating_mul(shape[d].max(1));
            }
            s
        } else {
            strides.clone()
        };
        let negative_stride = !layout.null_strides && strides.iter().any(|&s| s < 0);
        // Reach, in bytes relative to element [0, ..., 0].
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&n, &s) in shape.iter().zip(&eff) {
            if n > 1 {
                let step = (n as i128 - 1) * s as i128;
                if step < 0 {
                    lo += step;
                } else {
                    hi += step;
                }
            }
        }
        let (lo_b, hi_b) = (lo * elem as i128, (hi + 1) * elem as i128);
        let span = hi_b - lo_b;
        let unaddressable = numel > 0 && span > isize::MAX as i128;
        if numel > 0 && !unaddressable && span > LIMIT {
            return Err(());
        }
        let reaches = numel > 0 && !unaddressable;
        // Bytes the elements reach below and above element [0, ..., 0].
        let (below, above) = if reaches { ((-lo_b) as usize, hi_b as usize) } else { (0, 0) };
        let pre = layout.offset_elems as usize * elem + layout.misalign as usize;
        let a_rel = GUARD + below + pre;
        let total = a_rel + above + GUARD;
        let mut words = vec![u64::from_ne_bytes([POISON; 8]); total.div_ceil(8)];
        let base = words.as_mut_ptr() as usize;
        let a = base + a_rel;
        let (mut data, mut byte_offset) = match layout.split % 3 {
            0 => (a, 0u64),
            1 => (base, a_rel as u64),
            _ => (base + GUARD, (a_rel - GUARD) as u64),
        };
        let huge_offset = layout.huge_byte_offset;
        if huge_offset {
            data = a;
            byte_offset = u64::MAX - 7; // data + byte_offset wraps around the address space
        }
        let null_data = layout.null_data;
        if null_data {
            data = 0;
        }
        let align = if elem.is_power_of_two() { elem.min(8) } else { 1 };
        let misaligned = !a.is_multiple_of(align);
        let offsets = (reaches && !null_data && !huge_offset).then(|| {
            (0..numel)
                .map(|mut i| {
                    let mut off = a_rel as i128;
                    for d in (0..nd).rev() {
                        let n = shape[d] as usize;
                        off += (i % n) as i128 * eff[d] as i128 * elem as i128;
                        i /= n;
                    }
                    off as usize
                })
                .collect()
        });
        let fails_sorted_rule = {
            let mut dims: Vec<(i128, i128)> = shape
                .iter()
                .zip(&eff)
                .filter(|(n, _)| **n > 1)
                .map(|(&n, &s)| (n as i128, (s as i128).abs()))
                .collect();
            dims.sort_by_key(|&(_, s)| s);
            let mut reach = 0i128;
            let mut fails = false;
            for (n, s) in dims {
                if s <= reach {
                    fails = true;
                }
                reach += (n - 1) * s;
            }
            fails
        };
        Ok(Buffer {
            words,
            shape: shape.to_vec(),
            strides,
            null_strides: layout.null_strides,
            data: data as *mut c_void,
            byte_offset,
            offsets,
            numel,
            negative_shape,
            negative_stride,
            unaddressable,
            misaligned,
            null_data,
            huge_offset,
            fails_sorted_rule,
        })
    }

    fn tensor(&mut self, dtype: DLDataType, device: DLDevice) -> DLTensor {
        let nd = self.shape.len();
        DLTensor {
            data: self.data,
            device,
            ndim: nd as i32,
            dtype,
            shape: if nd == 0 { std::ptr::null_mut() } else { self.shape.as_mut_ptr() },
            strides: if self.null_strides || nd == 0 { std::ptr::null_mut() } else { self.strides.as_mut_ptr() },
            byte_offset: self.byte_offset,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum OutShape {
    /// [*keys.shape, dim]
    Full,
    /// [numel(keys), dim]
    Flat,
    /// A perturbation of Full (may still happen to be valid; the model decides).
    Wrong(u8),
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Plain,
    Managed,
    Versioned { keys_major: u32, out_major: u32, minor: u32, out_read_only: bool, keys_read_only: bool },
}

#[derive(Debug, Clone)]
struct Case {
    table: TableSpec,
    key_shape: Vec<i64>,
    key_layout: Layout,
    key_dtype: (u8, u8, u16),
    key_device: u32,
    key_seed: u64,
    out_shape: OutShape,
    out_layout: Layout,
    out_dtype: (u8, u8, u16),
    out_device: u32,
    call: Call,
    num_threads: Option<i32>,
    want_stats: bool,
}

fn dt(t: (u8, u8, u16)) -> DLDataType {
    DLDataType { code: DLDataTypeCode(t.0), bits: t.1, lanes: t.2 }
}

fn elem_of(t: DLDataType) -> usize {
    ((t.bits as usize * t.lanes as usize) / 8).max(1)
}

fn out_shape_for(kshape: &[i64], dim: usize, how: OutShape) -> Vec<i64> {
    let dim = dim as i64;
    let numel: i64 = kshape.iter().map(|&s| s.max(0)).product();
    let mut full = kshape.to_vec();
    full.push(dim);
    match how {
        OutShape::Full => full,
        OutShape::Flat => vec![numel, dim],
        OutShape::Wrong(v) => match v % 8 {
            0 => {
                *full.last_mut().unwrap() += 1;
                full
            }
            1 => {
                *full.last_mut().unwrap() -= 1;
                full
            }
            2 => {
                full.pop();
                full
            }
            3 => {
                full.push(1);
                full
            }
            4 => vec![numel + 1, dim],
            5 => vec![dim, numel],
            6 => {
                full.insert(0, 1);
                full
            }
            _ => {
                if full.len() > 1 {
                    full[0] += 1;
                } else {
                    full.insert(0, 2);
                }
                full
            }
        },
    }
}

fn device(code: u32) -> DLDevice {
    DLDevice { device_type: DLDeviceType(code), device_id: 0 }
}

/// What the contract says about one case.
#[derive(Default, Debug)]
struct Verdict {
    /// Statuses of conditions that must make the call fail.
    must: BTreeSet<i32>,
    /// Statuses of conditions that may make it fail (else it must succeed correctly).
    may: BTreeSet<i32>,
    reasons: Vec<String>,
}

impl Verdict {
    fn must(&mut self, s: i32, why: impl Into<String>) {
        self.must.insert(s);
        self.reasons.push(format!("must {}: {}", status_name(s), why.into()));
    }
    fn may(&mut self, s: i32, why: impl Into<String>) {
        self.may.insert(s);
        self.reasons.push(format!("may {}: {}", status_name(s), why.into()));
    }
}

/// The checks every tensor argument gets.
fn judge_tensor(v: &mut Verdict, name: &str, b: &Buffer, dtype_ok: bool, dev: u32, minor12_null: bool) {
    if b.negative_shape {
        v.must(INVALID_ARGUMENT, format!("{name}: negative shape"));
    }
    if !dtype_ok {
        v.must(UNSUPPORTED_DTYPE, format!("{name}: dtype"));
    }
    match DLDeviceType(dev) {
        DLDeviceType::CPU | DLDeviceType::CUDAHOST => {}
        DLDeviceType::CUDA => v.may(UNSUPPORTED_DEVICE, format!("{name}: kDLCUDA")),
        _ => v.must(UNSUPPORTED_DEVICE, format!("{name}: device {dev}")),
    }
    if minor12_null {
        v.must(INVALID_LAYOUT, format!("{name}: NULL strides in a DLPack >= 1.2 tensor"));
    }
    if b.negative_stride {
        v.may(INVALID_LAYOUT, format!("{name}: negative stride"));
    }
    let has = b.numel > 0;
    let mut layout = |bad: bool, what: &str| {
        if bad {
            if has {
                v.must(INVALID_LAYOUT, format!("{name}: {what}"));
            } else {
                v.may(INVALID_LAYOUT, format!("{name}: {what} (no elements)"));
            }
        }
    };
    layout(b.unaddressable, "strides overflow the address space");
    layout(b.null_data, "NULL data");
    layout(b.huge_offset, "byte_offset wraps the address space");
    if b.unaddressable {
        v.may(INVALID_ARGUMENT, format!("{name}: overflow reported as an invalid argument"));
    }
    if b.misaligned {
        v.may(INVALID_LAYOUT, format!("{name}: misaligned"));
    }
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let table = Table::build(&case.table);
    let dim = table.dim;
    let kdt = dt(case.key_dtype);
    let odt = dt(case.out_dtype);
    let kd = Kd::of(kdt);
    let od = Fl::of(odt);

    // Buffers.
    let mut kb = match Buffer::new(&case.key_shape, &case.key_layout, elem_of(kdt)) {
        Ok(b) => b,
        Err(()) => return Err(TestCaseError::reject("keys buffer too large")),
    };
    let oshape = out_shape_for(&case.key_shape, dim, case.out_shape);
    let mut ob = match Buffer::new(&oshape, &case.out_layout, elem_of(odt)) {
        Ok(b) => b,
        Err(()) => return Err(TestCaseError::reject("out buffer too large")),
    };

    // Key values: table keys (hits), small numbers and arbitrary 64-bit values, written in
    // logical order (a zero stride makes later writes win: the reference reads memory back).
    if let (Some(kd), Some(offs)) = (kd, kb.offsets.clone()) {
        let mut rng = Rng(case.key_seed);
        for off in offs {
            let v: i64 = match rng.below(10) {
                0..=5 if table.rows > 0 => table.raw_keys[rng.below(table.rows as u64) as usize],
                6 | 7 => rng.below(table.rows as u64 + 8) as i64 - 4,
                8 => [i64::MIN, i64::MAX, -1, u32::MAX as i64, 1 << 32][rng.below(5) as usize],
                _ => rng.next() as i64,
            };
            let bytes = kd.bytes(v);
            kb.bytes_mut()[off..off + bytes.len()].copy_from_slice(&bytes);
        }
    }
    let keys_before = kb.bytes().to_vec();

    // The model.
    let mut v = Verdict::default();
    let (kminor12, ominor12) = match case.call {
        Call::Versioned { minor, .. } if minor >= 2 => {
            (kb.null_strides && !kb.shape.is_empty(), ob.null_strides && !ob.shape.is_empty())
        }
        _ => (false, false),
    };
    judge_tensor(&mut v, "keys", &kb, kd.is_some(), case.key_device, kminor12);
    judge_tensor(&mut v, "out", &ob, od.is_some(), case.out_device, ominor12);
    let n = kb.numel;
    if !kb.negative_shape && !ob.negative_shape {
        let mut full = case.key_shape.clone();
        full.push(dim as i64);
        if oshape != full && oshape != vec![n as i64, dim as i64] {
            v.must(INVALID_ARGUMENT, format!("out shape {oshape:?} for keys {:?}, dim {dim}", case.key_shape));
        }
    }
    if let Some(offs) = &ob.offsets {
        let mut sorted = offs.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            if n > 0 {
                v.must(INVALID_LAYOUT, "out elements overlap");
            }
        } else if ob.fails_sorted_rule {
            v.may(INVALID_LAYOUT, "out strides interleave (distinct, but beyond the conservative check)");
        }
    }
    if let Call::Versioned { keys_major, out_major, out_read_only, .. } = case.call {
        if keys_major != 1 {
            v.must(INVALID_ARGUMENT, "keys: DLPack major version");
        }
        if out_major != 1 {
            v.must(INVALID_ARGUMENT, "out: DLPack major version");
        }
        if out_read_only {
            v.must(READ_ONLY, "out flagged read-only");
        }
    }
    if matches!(case.num_threads, Some(t) if t < 0) {
        v.must(INVALID_ARGUMENT, "num_threads < 0");
    }

    // The reference gather, when the call may succeed.
    struct Expected {
        elems: Vec<(usize, [u32; 2])>, // (byte offset in out buffer, acceptable bits)
        hits: u64,
        misses: u64,
        first_miss: Option<String>,
    }
    let expected = if v.must.is_empty() {
        let (kd, od) = (kd.expect("valid keys dtype"), od.expect("valid out dtype"));
        let koffs = kb.offsets.clone().unwrap_or_default();
        let ooffs = ob.offsets.clone().unwrap_or_default();
        prop_assert_eq!(koffs.len(), n);
        prop_assert_eq!(ooffs.len(), n * dim, "out reaches its elements");
        let d1 = od.round(table.default_value);
        let d2 = od.round(table.dtype.to_f32(table.dtype.round(table.default_value)));
        let mut e = Expected { elems: Vec::with_capacity(n * dim), hits: 0, misses: 0, first_miss: None };
        for (i, &ko) in koffs.iter().enumerate() {
            let c = kd.canonical(&kb.bytes()[ko..ko + kd.size()]);
            let row = table.row_of(c);
            if row.is_some() {
                e.hits += 1;
            } else {
                e.misses += 1;
                if e.first_miss.is_none() {
                    e.first_miss = Some(kd.value(c));
                }
            }
            for col in 0..dim {
                let want = match row {
                    Some(r) => {
                        let b = od.round(table.dtype.to_f32(table.values[r * dim + col]));
                        [b, b]
                    }
                    None => [d1, d2],
                };
                e.elems.push((ooffs[i * dim + col], want));
            }
        }
        Some((e, od))
    } else {
        None
    };

    // The call.
    let kt = kb.tensor(kdt, device(case.key_device));
    let mut ot = ob.tensor(odt, device(case.out_device));
    let opts = case.num_threads.map(|t| {
        let mut o = strata_lookup_options_default();
        o.num_threads = t;
        o
    });
    let opts_p = opts.as_ref().map_or(std::ptr::null(), |o| o as *const LookupOptions);
    let mut stats = LookupStats { hits: 0xdead, misses: 0xbeef, volatile_hits: 0xdead, persistent_hits: 0xbeef, ..LookupStats::default() };
    let stats_p = if case.want_stats { &mut stats as *mut LookupStats } else { std::ptr::null_mut() };
    // SAFETY: table.ptr is a live table (Table). kt and ot describe kb's and ob's words through
    // their own shape and strides arrays, and the managed wrappers are locals; all outlive the
    // call. A description that reaches memory outside its buffer is one strata must refuse before
    // it touches an element (unaddressable, NULL data, a wrapping byte_offset, a bad dtype, shape
    // or device: `judge_tensor` lists them); every other reaches only elements that Buffer::new
    // placed inside its buffer. Host memory is labelled kDLCUDA only where no CUDA driver is
    // present. opts_p and stats_p are NULL or point at locals.
    let status = unsafe {
        match case.call {
            Call::Plain => strata_lookup(table.ptr, &kt, &mut ot, opts_p, stats_p) as i32,
            Call::Managed => {
                let km = DLManagedTensor { dl_tensor: kt, manager_ctx: std::ptr::null_mut(), deleter: None };
                let mut om = DLManagedTensor { dl_tensor: ot, manager_ctx: std::ptr::null_mut(), deleter: None };
                strata_lookup_managed(table.ptr, &km, &mut om, opts_p, stats_p) as i32
            }
            Call::Versioned { keys_major, out_major, minor, out_read_only, keys_read_only } => {
                let flags = |ro: bool| if ro { DlpackFlags::READ_ONLY } else { DlpackFlags::empty() };
                let km = DLManagedTensorVersioned {
                    version: DLPackVersion { major: keys_major, minor },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: None,
                    flags: flags(keys_read_only),
                    dl_tensor: kt,
                };
                let mut om = DLManagedTensorVersioned {
                    version: DLPackVersion { major: out_major, minor },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: None,
                    flags: flags(out_read_only),
                    dl_tensor: ot,
                };
                strata_lookup_managed_versioned(table.ptr, &km, &mut om, opts_p, stats_p) as i32
            }
        }
    };
    let msg = last_error();
    let ctx = || {
        format!(
            "status {} ({status}), message {msg:?}\nverdict: {:?}\nkeys: data {:?} + {} shape {:?} strides {:?} (null {})\n\
             out: data {:?} + {} shape {:?} strides {:?} (null {})",
            status_name(status),
            v.reasons,
            kb.data,
            kb.byte_offset,
            kb.shape,
            kb.strides,
            kb.null_strides,
            ob.data,
            ob.byte_offset,
            ob.shape,
            ob.strides,
            ob.null_strides
        )
    };

    prop_assert_eq!(kb.bytes(), &keys_before[..], "keys were written\n{}", ctx());
    let untouched = |ob: &Buffer| ob.bytes().iter().all(|&b| b == POISON);

    if !v.must.is_empty() {
        prop_assert!(status != OK, "must fail\n{}", ctx());
        prop_assert!(v.must.contains(&status) || v.may.contains(&status), "unexpected status\n{}", ctx());
        prop_assert!(!msg.is_empty(), "no message\n{}", ctx());
        prop_assert!(untouched(&ob), "out written by a failing call\n{}", ctx());
        return Ok(());
    }
    let (e, od) = expected.expect("computed above");
    let key_error = table.missing_error && e.misses > 0;
    if status == OK || (status == KEY_NOT_FOUND && key_error) {
        // Elements in place (for OK), everything else poison (always).
        let size = od.size();
        let mut is_elem = vec![false; ob.bytes().len()];
        for &(off, _) in &e.elems {
            is_elem[off..off + size].iter_mut().for_each(|x| *x = true);
        }
        let bytes = ob.bytes();
        if let Some(i) = (0..bytes.len()).find(|&i| !is_elem[i] && bytes[i] != POISON) {
            prop_assert!(false, "byte {i} outside out's elements was written\n{}", ctx());
        }
        if status == OK {
            prop_assert!(!key_error, "missing key with STRATA_MISSING_ERROR but OK\n{}", ctx());
            for (j, &(off, want)) in e.elems.iter().enumerate() {
                let got = if size == 4 {
                    u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap())
                } else {
                    u16::from_ne_bytes(bytes[off..off + 2].try_into().unwrap()) as u32
                };
                prop_assert!(
                    got == want[0] || got == want[1],
                    "element {} (key {}, col {}): got {:#x}, want {:#x} or {:#x}\n{}",
                    j,
                    j / dim,
                    j % dim,
                    got,
                    want[0],
                    want[1],
                    ctx()
                );
            }
            if case.want_stats {
                prop_assert_eq!(stats, LookupStats { hits: e.hits, misses: e.misses, ..LookupStats::default() }, "stats\n{}", ctx());
            }
        } else {
            let first = e.first_miss.clone().unwrap();
            let named = msg.split(|c: char| !(c.is_ascii_digit() || c == '-')).any(|w| w == first);
            prop_assert!(named, "KEY_NOT_FOUND must name key {}\n{}", first, ctx());
        }
        return Ok(());
    }
    prop_assert!(v.may.contains(&status), "must succeed (or fail with STRATA_KEY_NOT_FOUND)\n{}", ctx());
    prop_assert!(!msg.is_empty(), "no message\n{}", ctx());
    prop_assert!(untouched(&ob), "out written by a failing call\n{}", ctx());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn cases_from_env() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(256)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_global_rejects: cases.saturating_mul(4).max(1024),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn float_dtype() -> impl Strategy<Value = Fl> {
    prop_oneof![Just(Fl::F32), Just(Fl::F16), Just(Fl::Bf16)]
}

fn default_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => Just(0.0f32),
        1 => Just(-1.5f32),
        1 => Just(0.1f32),
        1 => Just(65520.0f32),
        1 => Just(1e-8f32),
        1 => Just(-0.0f32),
        2 => any::<u32>().prop_map(f32::from_bits).prop_filter("not NaN", |v| !v.is_nan()),
    ]
}

fn table_spec(rows: std::ops::RangeInclusive<usize>, dims: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = TableSpec> {
    (
        float_dtype(),
        dims,
        rows,
        prop_oneof![2 => Just(None), 3 => prop::sample::select(Kd::ALL.to_vec()).prop_map(Some)],
        any::<u64>(),
        default_value(),
        prop::bool::weighted(0.2),
        0usize..3,
    )
        .prop_map(|(dtype, dim, rows, keyed, seed, default_value, missing_error, vpad)| TableSpec {
            dtype,
            dim,
            rows,
            keyed,
            seed,
            default_value,
            missing_error,
            vpad,
        })
}

/// true with probability p (p may be 0).
fn chance(p: f64) -> BoxedStrategy<bool> {
    if p <= 0.0 { Just(false).boxed() } else { prop::bool::weighted(p).boxed() }
}

/// Some(value) with probability p (p may be 0).
fn maybe<S: Strategy + 'static>(p: f64, s: S) -> BoxedStrategy<Option<S::Value>>
where
    S::Value: std::fmt::Debug + Clone,
{
    if p <= 0.0 { Just(None).boxed() } else { prop::option::weighted(p, s).boxed() }
}

fn layout(odd: f64) -> impl Strategy<Value = Layout> {
    let rare = move |p: f64| chance(p * odd);
    (
        prop::bool::weighted(0.25),
        prop::option::weighted(0.3, any::<u64>()),
        prop::collection::vec(prop_oneof![4 => Just(0u8), 1 => 1u8..4], 0..7),
        maybe(0.06 * odd, any::<u8>()),
        maybe(0.05 * odd, any::<u8>()),
        maybe(0.05 * odd, (any::<u8>(), any::<u8>())),
        prop_oneof![3 => Just(0u8), 1 => 0u8..6],
        prop_oneof![20 => Just(0u8), 1 => 1u8..8].prop_map(move |m| if odd > 0.0 { m } else { 0 }),
        0u8..3,
        rare(0.03),
        rare(0.03),
    )
        .prop_map(
            |(null_strides, permute, pads, zero_stride, negative_stride, huge_stride, offset_elems, misalign, split, huge_byte_offset, null_data)| Layout {
                null_strides,
                permute,
                pads,
                zero_stride,
                negative_stride,
                huge_stride,
                offset_elems,
                misalign,
                split,
                huge_byte_offset,
                null_data,
            },
        )
}

fn key_dtype(odd: f64) -> impl Strategy<Value = (u8, u8, u16)> {
    let valid = prop::sample::select(Kd::ALL.to_vec()).prop_map(|k| {
        let d = k.dl();
        (d.code.0, d.bits, d.lanes)
    });
    let invalid = prop::sample::select(vec![
        (2u8, 32u8, 1u16), // float32
        (0, 8, 1),         // int8
        (0, 16, 1),        // int16
        (0, 32, 2),        // int32 x2 lanes
        (1, 64, 2),        // uint64 x2
        (0, 4, 1),         // int4 (sub-byte)
        (0, 0, 1),         // zero bits
        (6, 8, 1),         // bool
    ]);
    let w = (1000.0 * 0.07 * odd) as u32;
    prop_oneof![1000 - w => valid, w => invalid]
}

fn out_dtype(odd: f64) -> impl Strategy<Value = (u8, u8, u16)> {
    let valid = float_dtype().prop_map(|f| {
        let d = f.dl();
        (d.code.0, d.bits, d.lanes)
    });
    let invalid = prop::sample::select(vec![
        (2u8, 64u8, 1u16), // float64
        (0, 32, 1),        // int32
        (2, 16, 2),        // float16 x2 lanes
        (4, 32, 1),        // bfloat32
        (2, 8, 1),         // float8
        (2, 32, 0),        // zero lanes
    ]);
    let w = (1000.0 * 0.07 * odd) as u32;
    prop_oneof![1000 - w => valid, w => invalid]
}

fn cuda_present() -> bool {
    strata_cuda_available() != 0
}

fn device_code(odd: f64) -> impl Strategy<Value = u32> {
    let w = |p: f64| ((1000.0 * p * odd) as u32).max(if odd > 0.0 { 1 } else { 0 });
    prop_oneof![
        1000 => Just(DLDeviceType::CPU.0),
        w(0.1) => Just(DLDeviceType::CUDAHOST.0),
        // Host memory labelled kDLCUDA: only where no driver could launch on it.
        (if cuda_present() { 0 } else { w(0.02) }) => Just(DLDeviceType::CUDA.0),
        w(0.02) => Just(DLDeviceType::OPENCL.0),
    ]
}

fn call(odd: f64) -> impl Strategy<Value = Call> {
    let ro = move |p: f64| chance(p * odd);
    let major = move || prop_oneof![50 => Just(1u32), (if odd > 0.0 { 1 } else { 0 }) => Just(2u32)];
    prop_oneof![
        3 => Just(Call::Plain),
        1 => Just(Call::Managed),
        2 => (major(), major(), 0u32..4, ro(0.05), prop::bool::weighted(0.3)).prop_map(
            |(keys_major, out_major, minor, out_read_only, keys_read_only)| Call::Versioned {
                keys_major,
                out_major,
                minor,
                out_read_only,
                keys_read_only,
            }
        ),
    ]
}

fn num_threads(odd: f64) -> impl Strategy<Value = Option<i32>> {
    prop_oneof![
        3 => Just(None),
        6 => prop::sample::select(vec![0, 1, 2, 3, 8]).prop_map(Some),
        (if odd > 0.0 { 1 } else { 0 }) => Just(Some(-1)),
    ]
}

/// Small cases with every kind of oddity.
fn small_case() -> impl Strategy<Value = Case> {
    let key_shape = (
        prop::collection::vec(prop_oneof![1 => Just(0i64), 9 => 1i64..=5], 0..=4),
        prop::option::weighted(0.02, any::<u8>()),
    )
        .prop_map(|(mut s, neg)| {
            if let (Some(i), false) = (neg, s.is_empty()) {
                let n = s.len();
                s[i as usize % n] = -1;
            }
            s
        });
    let out_shape = prop_oneof![
        12 => Just(OutShape::Full),
        6 => Just(OutShape::Flat),
        1 => any::<u8>().prop_map(OutShape::Wrong),
    ];
    (
        (table_spec(0..=50, 1..=40), key_shape, layout(0.6), key_dtype(0.6), device_code(1.0), any::<u64>()),
        (out_shape, layout(0.6), out_dtype(0.6), device_code(1.0)),
        (call(1.0), num_threads(1.0), any::<bool>()),
    )
        .prop_map(|(k, o, c)| Case {
            table: k.0,
            key_shape: k.1,
            key_layout: k.2,
            key_dtype: k.3,
            key_device: k.4,
            key_seed: k.5,
            out_shape: o.0,
            out_layout: o.1,
            out_dtype: o.2,
            out_device: o.3,
            call: c.0,
            num_threads: c.1,
            want_stats: c.2,
        })
}

/// Lookups big enough to be split over threads (> 2048 keys, > 256 KiB of output) and often to
/// take the streaming-store path (>= 4 MiB of output), on valid but varied layouts.
fn large_case() -> impl Strategy<Value = Case> {
    let key_shape = prop_oneof![
        (2049i64..30000).prop_map(|n| vec![n]),
        (40i64..170, 52i64..170).prop_map(|(a, b)| vec![a, b]),
    ];
    let calm = |l: Layout| Layout { null_data: false, huge_byte_offset: false, ..l };
    (
        (table_spec(200..=3000, 16..=96), key_shape, layout(0.0).prop_map(calm), key_dtype(0.0), any::<u64>()),
        (prop_oneof![Just(OutShape::Full), Just(OutShape::Flat)], layout(0.0).prop_map(calm), out_dtype(0.0)),
        (prop_oneof![Just(None), prop::sample::select(vec![0, 2, 3, 4]).prop_map(Some)], any::<bool>()),
    )
        .prop_map(|(k, o, c)| Case {
            table: TableSpec { missing_error: false, ..k.0 },
            key_shape: k.1,
            key_layout: Layout { zero_stride: None, negative_stride: None, huge_stride: None, ..k.2 },
            key_dtype: k.3,
            key_device: DLDeviceType::CPU.0,
            key_seed: k.4,
            out_shape: o.0,
            out_layout: Layout { zero_stride: None, negative_stride: None, huge_stride: None, ..o.1 },
            out_dtype: o.2,
            out_device: DLDeviceType::CPU.0,
            call: Call::Plain,
            num_threads: c.0,
            want_stats: c.1,
        })
}

proptest! {
    #![proptest_config(config(cases_from_env()))]

    #[test]
    fn lookup_matches_reference_or_fails_cleanly(case in small_case()) {
        run_case(&case)?;
    }
}

proptest! {
    #![proptest_config(config((cases_from_env() / 8).max(8)))]

    #[test]
    fn large_lookups_match_reference_on_any_thread_count(case in large_case()) {
        run_case(&case)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Checks of the test's own reference
// ---------------------------------------------------------------------------------------------

#[test]
fn reference_conversions_agree_with_ieee() {
    // Exhaustive over float16: f16 -> f32 -> f16 is the identity for non-NaN values.
    for h in 0..=u16::MAX {
        if !Fl::F16.is_nan_bits(h as u32) {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
        }
    }
    // Against the half crate on a sweep of f32 bit patterns (a second opinion on rounding).
    let mut r = Rng(7);
    for _ in 0..2_000_000 {
        let x = f32::from_bits(r.next() as u32);
        if x.is_nan() {
            continue;
        }
        assert_eq!(f32_to_f16(x), half::f16::from_f32(x).to_bits(), "{x:e}");
        assert_eq!(f32_to_bf16(x), half::bf16::from_f32(x).to_bits(), "{x:e}");
    }
    for x in [65519.0f32, 65520.0, 2f32.powi(-25), 1.5 * 2f32.powi(-25), 2f32.powi(-24) * 0.75, 1.0 + 2f32.powi(-11)] {
        assert_eq!(f32_to_f16(x), half::f16::from_f32(x).to_bits(), "{x:e}");
    }
    assert_eq!(f32_to_f16(65520.0), 0x7c00);
    assert_eq!(f32_to_f16(65519.0), 0x7bff);
    assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
    assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
    assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
}

#[test]
fn buffers_reach_exactly_their_elements() {
    // A padded, permuted 3-D layout: offsets are distinct, in bounds, and the guards are clear.
    let l = Layout {
        null_strides: false,
        permute: Some(3),
        pads: vec![1, 2, 0, 3],
        zero_stride: None,
        negative_stride: None,
        huge_stride: None,
        offset_elems: 2,
        misalign: 0,
        split: 2,
        huge_byte_offset: false,
        null_data: false,
    };
    let b = Buffer::new(&[2, 3, 4], &l, 4).unwrap();
    let offs = b.offsets.clone().unwrap();
    let mut s = offs.clone();
    s.sort_unstable();
    s.dedup();
    assert_eq!(s.len(), 24);
    assert!(offs.iter().all(|&o| o >= GUARD && o + 4 + GUARD <= b.bytes().len()));
    assert_eq!(b.data as usize + b.byte_offset as usize, b.words.as_ptr() as usize + GUARD + 8);
    // Negative strides reach below element 0 and stay inside the buffer.
    let b = Buffer::new(&[3, 5], &Layout { negative_stride: Some(1), ..l.clone() }, 8).unwrap();
    assert!(b.negative_stride);
    let offs = b.offsets.unwrap();
    assert!(offs.iter().all(|&o| o >= GUARD && o + 8 + GUARD <= b.words.len() * 8));
    // Huge strides overflow; on a size-1 dimension they are harmless.
    let b = Buffer::new(&[3, 5], &Layout { huge_stride: Some((0, 0)), ..l.clone() }, 4).unwrap();
    assert!(b.unaddressable && b.offsets.is_none());
    let b = Buffer::new(&[1, 5], &Layout { huge_stride: Some((0, 0)), ..l }, 4).unwrap();
    assert!(!b.unaddressable && b.offsets.is_some());
}
