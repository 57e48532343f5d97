//! The machinery of the C-ABI property tests (`tests/fuzz.rs` for `strata_lookup`,
//! `tests/fuzz_pooled.rs` for `strata_lookup_pooled` and `strata_lookup_batch`), included by
//! each with `mod common; #[path = "common/dlfuzz.rs"] mod dlfuzz;` (it takes `Rng` from
//! `common`): reference float conversions
//! (independent of the `half` crate strata uses), key dtypes, random tables built through
//! `strata_table_from_dlpack`, DLTensor descriptions over buffers exactly as large as what they
//! reach plus poisoned guards, the model of the checks every tensor argument gets, the
//! reference gather, the check of an output buffer, and the strategies the properties share.
#![allow(dead_code)] // each property test uses its own part

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};
use std::ffi::{CStr, c_void};
use strata::kernels::{RowFormat, format::value, quantize_row};

// ---------------------------------------------------------------------------------------------
// The C ABI, as a C caller sees it
// ---------------------------------------------------------------------------------------------

use strata::ffi::{
    strata_cuda_available, strata_last_error, strata_status_name, strata_table, strata_table_dim, strata_table_free,
    strata_table_from_dlpack, strata_table_len, strata_table_options_default_0_3_1,
};
pub type StrataTable = strata_table;

// Status values, taken from the crate so that the test and the library agree by construction
// (this also makes the test link the strata rlib that defines the C symbols).
pub const OK: i32 = strata::Status::STRATA_OK as i32;
pub const NULL_ARGUMENT: i32 = strata::Status::STRATA_NULL_ARGUMENT as i32;
pub const INVALID_ARGUMENT: i32 = strata::Status::STRATA_INVALID_ARGUMENT as i32;
pub const UNSUPPORTED_DTYPE: i32 = strata::Status::STRATA_UNSUPPORTED_DTYPE as i32;
pub const UNSUPPORTED_DEVICE: i32 = strata::Status::STRATA_UNSUPPORTED_DEVICE as i32;
pub const INVALID_LAYOUT: i32 = strata::Status::STRATA_INVALID_LAYOUT as i32;
pub const READ_ONLY: i32 = strata::Status::STRATA_READ_ONLY as i32;
pub const KEY_NOT_FOUND: i32 = strata::Status::STRATA_KEY_NOT_FOUND as i32;

pub fn last_error() -> String {
    // SAFETY: strata_last_error returns a NUL-terminated string that strata owns and keeps until
    // the next failing call on this thread; it is copied here before any other call.
    unsafe { CStr::from_ptr(strata_last_error()) }.to_string_lossy().into_owned()
}

pub fn status_name(s: i32) -> String {
    // SAFETY: strata_status_name returns a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(strata_status_name(s)) }.to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------------------------
// Reference conversions (independent of the `half` crate strata uses)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fl {
    F32,
    F16,
    Bf16,
}

impl Fl {
    pub fn size(self) -> usize {
        if self == Fl::F32 { 4 } else { 2 }
    }
    pub fn dl(self) -> DLDataType {
        match self {
            Fl::F32 => DLDataType { code: DLDataTypeCode::FLOAT, bits: 32, lanes: 1 },
            Fl::F16 => DLDataType { code: DLDataTypeCode::FLOAT, bits: 16, lanes: 1 },
            Fl::Bf16 => DLDataType { code: DLDataTypeCode::BFLOAT, bits: 16, lanes: 1 },
        }
    }
    pub fn of(dt: DLDataType) -> Option<Fl> {
        match (dt.code, dt.bits, dt.lanes) {
            (DLDataTypeCode::FLOAT, 32, 1) => Some(Fl::F32),
            (DLDataTypeCode::FLOAT, 16, 1) => Some(Fl::F16),
            (DLDataTypeCode::BFLOAT, 16, 1) => Some(Fl::Bf16),
            _ => None,
        }
    }
    /// The exact value of an element's bits.
    pub fn to_f32(self, bits: u32) -> f32 {
        match self {
            Fl::F32 => f32::from_bits(bits),
            Fl::F16 => f16_to_f32(bits as u16),
            Fl::Bf16 => f32::from_bits(bits << 16),
        }
    }
    /// `x` rounded to nearest even in this dtype, as bits.
    pub fn round(self, x: f32) -> u32 {
        match self {
            Fl::F32 => x.to_bits(),
            Fl::F16 => f32_to_f16(x) as u32,
            Fl::Bf16 => f32_to_bf16(x) as u32,
        }
    }
    pub fn is_nan_bits(self, bits: u32) -> bool {
        self.to_f32(bits).is_nan()
    }
}

pub fn f16_to_f32(h: u16) -> f32 {
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

pub fn f32_to_f16(x: f32) -> u16 {
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

pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits() as u64;
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

// ---------------------------------------------------------------------------------------------
// A tiny deterministic generator for bulk data (values, keys); proptest drives the structure
// ---------------------------------------------------------------------------------------------

pub use crate::common::Rng;

/// The values these tests draw beyond `Rng`'s own.
pub trait Draws {
    fn value(&mut self) -> f32;
    fn bits16(&mut self, dt: Fl) -> u32;
}

impl Draws for Rng {
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
pub enum Kd {
    I32,
    I64,
    U32,
    U64,
}

impl Kd {
    pub const ALL: [Kd; 4] = [Kd::I32, Kd::I64, Kd::U32, Kd::U64];
    pub fn of(dt: DLDataType) -> Option<Kd> {
        match (dt.code, dt.bits, dt.lanes) {
            (DLDataTypeCode::INT, 32, 1) => Some(Kd::I32),
            (DLDataTypeCode::INT, 64, 1) => Some(Kd::I64),
            (DLDataTypeCode::UINT, 32, 1) => Some(Kd::U32),
            (DLDataTypeCode::UINT, 64, 1) => Some(Kd::U64),
            _ => None,
        }
    }
    pub fn dl(self) -> DLDataType {
        match self {
            Kd::I32 => DLDataType { code: DLDataTypeCode::INT, bits: 32, lanes: 1 },
            Kd::I64 => DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 1 },
            Kd::U32 => DLDataType { code: DLDataTypeCode::UINT, bits: 32, lanes: 1 },
            Kd::U64 => DLDataType { code: DLDataTypeCode::UINT, bits: 64, lanes: 1 },
        }
    }
    pub fn size(self) -> usize {
        match self {
            Kd::I32 | Kd::U32 => 4,
            Kd::I64 | Kd::U64 => 8,
        }
    }
    /// Native-endian bytes of `v` stored in this dtype (truncating).
    pub fn bytes(self, v: i64) -> Vec<u8> {
        match self {
            Kd::I32 => (v as i32).to_ne_bytes().to_vec(),
            Kd::I64 => v.to_ne_bytes().to_vec(),
            Kd::U32 => (v as u32).to_ne_bytes().to_vec(),
            Kd::U64 => (v as u64).to_ne_bytes().to_vec(),
        }
    }
    /// The canonical 64-bit key strata indexes by: sign-extended for signed dtypes.
    pub fn canonical(self, b: &[u8]) -> u64 {
        match self {
            Kd::I32 => i32::from_ne_bytes(b[..4].try_into().unwrap()) as i64 as u64,
            Kd::I64 => i64::from_ne_bytes(b[..8].try_into().unwrap()) as u64,
            Kd::U32 => u32::from_ne_bytes(b[..4].try_into().unwrap()) as u64,
            Kd::U64 => u64::from_ne_bytes(b[..8].try_into().unwrap()),
        }
    }
    /// The value a canonical key stands for, as a caller would print it.
    pub fn value(self, c: u64) -> String {
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
pub struct TableSpec {
    pub dtype: Fl,
    pub dim: usize,
    pub rows: usize,
    /// Keyed table: the dtype of the keys tensor it is built from; None = dense.
    pub keyed: Option<Kd>,
    pub seed: u64,
    pub default_value: f32,
    pub missing_error: bool,
    /// Extra elements between rows of the source vectors (exercises the copy).
    pub vpad: usize,
    /// Rows quantized at build (`opts->storage`): int8 or int4 (float32 sources, moderate
    /// values); `None` stores the dtype given.
    pub storage: Option<RowFormat>,
}

pub struct Table {
    pub ptr: *mut StrataTable,
    pub dtype: Fl,
    pub dim: usize,
    pub rows: usize,
    /// Row-major `rows x dim` element bits in the table dtype.
    pub values: Vec<u32>,
    /// For quantized tables: the float32 value of every element as the table holds it (the
    /// scalar reference, `strata::kernels::format::value`, of the quantized row).
    pub served: Option<Vec<f32>>,
    /// canonical key -> row (keyed tables); dense tables map key k < rows to row k.
    pub index: Option<HashMap<u64, usize>>,
    /// Raw key values of the rows (for picking hits).
    pub raw_keys: Vec<i64>,
    pub default_value: f32,
    pub missing_error: bool,
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: self.ptr is the table Table::build made, owned by this Table alone and freed only
        // here.
        unsafe { strata_table_free(self.ptr) };
    }
}

impl Table {
    pub fn build(spec: &TableSpec) -> Table {
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
        let dt = if spec.storage.is_some() { Fl::F32 } else { spec.dtype };
        let values: Vec<u32> = (0..rows * dim)
            .map(|_| match (spec.storage, dt) {
                (Some(_), _) => ((rng.below(20001) as f32 - 10000.0) / 64.0).to_bits(),
                (None, Fl::F32) => rng.value().to_bits(),
                (None, _) => rng.bits16(dt),
            })
            .collect();
        let served = spec.storage.map(|format| {
            let mut q = vec![0u8; format.row_bytes(dim)];
            let mut out = Vec::with_capacity(rows * dim);
            for r in 0..rows {
                let row: Vec<f32> = values[r * dim..(r + 1) * dim].iter().map(|&b| f32::from_bits(b)).collect();
                quantize_row(format, &row, &mut q).expect("moderate values quantize");
                // SAFETY: q holds one row of `format` of dim values; c < dim.
                out.extend((0..dim).map(|c| unsafe { value(format, q.as_ptr(), dim, c) }));
            }
            out
        });
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
                unsafe { if dt == Fl::F32 { (p as *mut u32).write(v) } else { (p as *mut u16).write(v as u16) } };
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
        let mut opts = strata_table_options_default_0_3_1();
        assert_eq!(
            (opts.gpu_placement, opts.gpu_cache_fraction, opts.hit_rate_threshold, opts.gpu_sharding),
            (0, 0.5, 0.9, 0),
            "strata_table_options_default_0_3_1's GPU fields"
        );
        opts.default_value = spec.default_value;
        opts.missing_key = spec.missing_error as i32;
        opts.storage = match spec.storage {
            None => 0,
            Some(RowFormat::Int8) => 4,
            Some(RowFormat::Int4) => 5,
            Some(RowFormat::Fp8) => 6,
            Some(f) => panic!("the fuzz tables quantize to int8 or int4, not {f:?}"),
        };
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
            served,
            index,
            raw_keys,
            default_value: spec.default_value,
            missing_error: spec.missing_error,
        }
    }

    /// Element `col` of row `r` as a lookup reads it, in float32.
    pub fn value_f32(&self, r: usize, col: usize) -> f32 {
        match &self.served {
            Some(s) => s[r * self.dim + col],
            None => self.dtype.to_f32(self.values[r * self.dim + col]),
        }
    }

    pub fn row_of(&self, canonical: u64) -> Option<usize> {
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
pub struct Layout {
    /// strides = NULL (compact row-major, pre-DLPack-1.2 style).
    pub null_strides: bool,
    /// Permute the memory order of the dimensions (e.g. a transposed view).
    pub permute: Option<u64>,
    /// Extra elements added at each level: [innermost stride - 1, gap after dim 1, ...].
    pub pads: Vec<u8>,
    pub zero_stride: Option<u8>,
    pub negative_stride: Option<u8>,
    pub huge_stride: Option<(u8, u8)>,
    /// Elements of slack before element [0, ..., 0].
    pub offset_elems: u8,
    /// Bytes added to the address of element [0, ..., 0] (0 = aligned).
    pub misalign: u8,
    /// How the address is split between `data` and `byte_offset`.
    pub split: u8,
    pub huge_byte_offset: bool,
    pub null_data: bool,
}

pub const HUGE: [i64; 4] = [i64::MAX, 1 << 62, -(1 << 62), i64::MIN];
pub const GUARD: usize = 64;
pub const POISON: u8 = 0xff;
/// Largest buffer a description may need; larger (but addressable) ones are discarded.
pub const LIMIT: i128 = 64 << 20;

pub struct Buffer {
    pub words: Vec<u64>,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub null_strides: bool,
    pub data: *mut c_void,
    pub byte_offset: u64,
    /// Byte offsets (from the buffer start) of each logical element, row-major; None when the
    /// description reaches no memory or memory that cannot exist.
    pub offsets: Option<Vec<usize>>,
    pub numel: usize,
    pub negative_shape: bool,
    pub negative_stride: bool,
    pub unaddressable: bool,
    pub misaligned: bool,
    pub null_data: bool,
    pub huge_offset: bool,
    /// The effective non-negative (stride, size) pairs fail strata's documented conservative
    /// non-overlap rule (sorted strides each stepping past what the smaller ones reach).
    pub fails_sorted_rule: bool,
}

impl Buffer {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the bytes of self.words (same address, 8 * len bytes), borrowed as long as self
        // is; u8 has no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.words.len() * 8) }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the bytes of self.words (same address, 8 * len bytes), borrowed mutably as long
        // as self is; u8 has no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.words.len() * 8) }
    }

    /// Lays out a buffer for `shape` under `layout` with `elem`-byte elements, filled with
    /// POISON. Err(()) = the description is addressable but too big to back: discard.
    pub fn new(shape: &[i64], layout: &Layout, elem: usize) -> Result<Buffer, ()> {
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
            let mut dims: Vec<(i128, i128)> =
                shape.iter().zip(&eff).filter(|(n, _)| **n > 1).map(|(&n, &s)| (n as i128, (s as i128).abs())).collect();
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

    pub fn tensor(&mut self, dtype: DLDataType, device: DLDevice) -> DLTensor {
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

pub fn dt(t: (u8, u8, u16)) -> DLDataType {
    DLDataType { code: DLDataTypeCode(t.0), bits: t.1, lanes: t.2 }
}

pub fn elem_of(t: DLDataType) -> usize {
    ((t.bits as usize * t.lanes as usize) / 8).max(1)
}

pub fn device(code: u32) -> DLDevice {
    DLDevice { device_type: DLDeviceType(code), device_id: 0 }
}

/// What the contract says about one case.
#[derive(Default, Debug)]
pub struct Verdict {
    /// Statuses of conditions that must make the call fail.
    pub must: BTreeSet<i32>,
    /// Statuses of conditions that may make it fail (else it must succeed correctly).
    pub may: BTreeSet<i32>,
    pub reasons: Vec<String>,
    /// (status, reason) of every condition, the reason starting with the argument it names.
    pub causes: Vec<(i32, String)>,
}

impl Verdict {
    pub fn must(&mut self, s: i32, why: impl Into<String>) {
        let why = why.into();
        self.must.insert(s);
        self.reasons.push(format!("must {}: {why}", status_name(s)));
        self.causes.push((s, why));
    }
    pub fn may(&mut self, s: i32, why: impl Into<String>) {
        let why = why.into();
        self.may.insert(s);
        self.reasons.push(format!("may {}: {why}", status_name(s)));
        self.causes.push((s, why));
    }
    /// Whether `msg` starts with `prefix` and the argument of a condition of status `s` (the
    /// reasons start with `arg:`, as strata's messages do).
    pub fn names(&self, s: i32, prefix: &str, msg: &str) -> bool {
        self.causes.iter().filter(|(c, _)| *c == s).any(|(_, why)| {
            let arg = why.split(':').next().unwrap_or("");
            msg.strip_prefix(prefix).is_some_and(|m| m.starts_with(&format!("{arg}:")))
        })
    }
}

/// The checks every tensor argument gets.
pub fn judge_tensor(v: &mut Verdict, name: &str, b: &Buffer, dtype_ok: bool, dev: u32, minor12_null: bool) {
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

// ---------------------------------------------------------------------------------------------
// Strategies shared by the properties
// ---------------------------------------------------------------------------------------------

pub fn cases_from_env() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(256)
}

pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_global_rejects: cases.saturating_mul(4).max(1024), failure_persistence: None, ..ProptestConfig::default() }
}

pub fn float_dtype() -> impl Strategy<Value = Fl> {
    prop_oneof![Just(Fl::F32), Just(Fl::F16), Just(Fl::Bf16)]
}

pub fn default_value() -> impl Strategy<Value = f32> {
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

pub fn table_spec(rows: std::ops::RangeInclusive<usize>, dims: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = TableSpec> {
    (
        float_dtype(),
        dims,
        rows,
        prop_oneof![2 => Just(None), 3 => prop::sample::select(Kd::ALL.to_vec()).prop_map(Some)],
        any::<u64>(),
        default_value(),
        prop::bool::weighted(0.2),
        0usize..3,
        prop_oneof![
            9 => Just(None),
            1 => Just(Some(RowFormat::Int8)),
            1 => Just(Some(RowFormat::Int4)),
            1 => Just(Some(RowFormat::Fp8))
        ],
    )
        .prop_map(|(dtype, dim, rows, keyed, seed, default_value, missing_error, vpad, storage)| TableSpec {
            dtype,
            dim,
            rows,
            keyed,
            seed,
            default_value,
            missing_error,
            vpad,
            // int4 rows need an even dim.
            storage: storage.map(|f| if f == RowFormat::Int4 && dim % 2 == 1 { RowFormat::Int8 } else { f }),
        })
}

/// true with probability p (p may be 0).
pub fn chance(p: f64) -> BoxedStrategy<bool> {
    if p <= 0.0 { Just(false).boxed() } else { prop::bool::weighted(p).boxed() }
}

/// Some(value) with probability p (p may be 0).
pub fn maybe<S: Strategy + 'static>(p: f64, s: S) -> BoxedStrategy<Option<S::Value>>
where
    S::Value: std::fmt::Debug + Clone,
{
    if p <= 0.0 { Just(None).boxed() } else { prop::option::weighted(p, s).boxed() }
}

pub fn layout(odd: f64) -> impl Strategy<Value = Layout> {
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
            |(
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
            )| Layout {
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

pub fn key_dtype(odd: f64) -> impl Strategy<Value = (u8, u8, u16)> {
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

pub fn out_dtype(odd: f64) -> impl Strategy<Value = (u8, u8, u16)> {
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

pub fn cuda_present() -> bool {
    strata_cuda_available() != 0
}

pub fn device_code(odd: f64) -> impl Strategy<Value = u32> {
    let w = |p: f64| ((1000.0 * p * odd) as u32).max(if odd > 0.0 { 1 } else { 0 });
    prop_oneof![
        1000 => Just(DLDeviceType::CPU.0),
        w(0.1) => Just(DLDeviceType::CUDAHOST.0),
        // Host memory labelled kDLCUDA: only where no driver could launch on it.
        (if cuda_present() { 0 } else { w(0.02) }) => Just(DLDeviceType::CUDA.0),
        w(0.02) => Just(DLDeviceType::OPENCL.0),
    ]
}

// ---------------------------------------------------------------------------------------------
// The reference gather and the check of an output buffer
// ---------------------------------------------------------------------------------------------

/// What a successful call must leave in an output buffer.
#[derive(Default)]
pub struct Expected {
    /// (byte offset in the buffer, acceptable bits) of every element of `out`, in logical
    /// order: the bits of the reference, or either of two where the reference may be rounded
    /// through the table's dtype or not (a default value), or any NaN where the reference is NaN.
    pub elems: Vec<(usize, [u32; 2])>,
    pub hits: u64,
    pub misses: u64,
    /// The flat index and the value (as a caller prints it) of the first missing key.
    pub first_miss: Option<(usize, String)>,
}

impl Expected {
    /// Counts a key of flat index `j` (`value` is called for a miss only).
    pub fn count(&mut self, j: usize, found: bool, value: impl FnOnce() -> String) {
        if found {
            self.hits += 1;
        } else {
            self.misses += 1;
            if self.first_miss.is_none() {
                self.first_miss = Some((j, value()));
            }
        }
    }
}

/// The reference of a plain lookup: one row per key of `kb` (its dtype `kd`), in logical order,
/// at the element offsets of `ob` (dtype `od`, `[n, dim]` in logical order).
pub fn plain_expected(table: &Table, kd: Kd, kb: &Buffer, od: Fl, ob: &Buffer) -> Expected {
    let dim = table.dim;
    let koffs = kb.offsets.clone().unwrap_or_default();
    let ooffs = ob.offsets.clone().unwrap_or_default();
    assert_eq!(ooffs.len(), koffs.len() * dim, "out reaches its elements");
    let d1 = od.round(table.default_value);
    let d2 = od.round(table.dtype.to_f32(table.dtype.round(table.default_value)));
    let mut e = Expected { elems: Vec::with_capacity(koffs.len() * dim), ..Expected::default() };
    for (i, &ko) in koffs.iter().enumerate() {
        let c = kd.canonical(&kb.bytes()[ko..ko + kd.size()]);
        let row = table.row_of(c);
        e.count(i, row.is_some(), || kd.value(c));
        for col in 0..dim {
            let want = match row {
                Some(r) => {
                    let b = od.round(table.value_f32(r, col));
                    [b, b]
                }
                None => [d1, d2],
            };
            e.elems.push((ooffs[i * dim + col], want));
        }
    }
    e
}

/// Checks an output buffer of dtype `od` after a call: every byte outside `e`'s elements is
/// still poison, and (when `values`) every element holds acceptable bits. Err says what differs.
pub fn check_out(ob: &Buffer, od: Fl, e: &Expected, values: bool) -> Result<(), String> {
    let size = od.size();
    let bytes = ob.bytes();
    let mut is_elem = vec![false; bytes.len()];
    for &(off, _) in &e.elems {
        is_elem[off..off + size].iter_mut().for_each(|x| *x = true);
    }
    if let Some(i) = (0..bytes.len()).find(|&i| !is_elem[i] && bytes[i] != POISON) {
        return Err(format!("byte {i} outside out's elements was written"));
    }
    if values {
        for (j, &(off, want)) in e.elems.iter().enumerate() {
            let got = if size == 4 {
                u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap())
            } else {
                u16::from_ne_bytes(bytes[off..off + 2].try_into().unwrap()) as u32
            };
            let nan = od.is_nan_bits(want[0]) && od.is_nan_bits(got);
            if !(got == want[0] || got == want[1] || nan) {
                return Err(format!("element {j}: got {got:#x}, want {:#x} or {:#x}", want[0], want[1]));
            }
        }
    }
    Ok(())
}

/// Writes key values into every element of `kb` (dtype `kd`) in logical order: table keys
/// (hits), small numbers and arbitrary 64-bit values (a zero stride makes later writes win: the
/// references read memory back).
pub fn fill_keys(table: &Table, kd: Kd, kb: &mut Buffer, seed: u64) {
    let Some(offs) = kb.offsets.clone() else { return };
    let mut rng = Rng(seed);
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

/// Whether no byte of `b` changed from poison.
pub fn untouched(b: &Buffer) -> bool {
    b.bytes().iter().all(|&x| x == POISON)
}
