//! Property tests of `strata_lookup_pooled` and `strata_lookup_batch` through the C ABI, as a C
//! host calls them, on the machinery of `tests/fuzz.rs` (`tests/common/dlfuzz.rs`): random
//! tables (dense or keyed, float32/float16/bfloat16, dim 1..=130, default-fill or
//! `STRATA_MISSING_ERROR`), random DLTensor descriptions for keys, offsets, weights and out over
//! buffers exactly as large as what they reach plus poisoned guards, and a model of the contract
//! (issue 12, include/strata.h) that classifies each case:
//!
//! - *must fail* (a bad dtype, device, rank or shape of any tensor; offsets that do not start at
//!   0, decrease, do not end at nnz, or are given with 2-D keys / missing with 1-D keys; weights
//!   not of the keys' shape; an unknown pooling; `out` not `[B, dim]`, with a negative stride or
//!   overlapping rows; strides or offsets beyond the address space; NULL data with elements; a
//!   negative `num_threads`): a listed status, a message that starts with the argument it names,
//!   and no byte of `out` changed;
//! - *may fail* (negative strides of inputs, misaligned elements, kDLCUDA in a host-only build,
//!   oddities of empty tensors, distinct-but-interleaved `out` strides): as above, or success;
//! - otherwise it must succeed, every element of `out` equal to a reference computed here
//!   exactly as the contract states: float32 accumulation in key order within a bag, a multiply
//!   then an add per key (no fused multiply-add), sum = Σ w·row, mean = sum / Σw, sqrtn = sum /
//!   √Σw² (f32 square root), an empty bag or a zero divisor giving zeros, a missing key giving
//!   the table's default row (the float32 `default_value` itself, not rounded through the
//!   table's dtype) and a miss; then rounded to out's dtype to nearest even. A NaN result may be
//!   any NaN. Stats are exact (keys counted), every other byte is still poison. With a
//!   `STRATA_MISSING_ERROR` table and a missing key: `STRATA_KEY_NOT_FOUND` naming the first
//!   missing key and its element, only `out`'s elements possibly written.
//!
//! The batch property builds 1..=30 requests (plain and pooled) over a few tables, with
//! `struct_size` exact, larger with a zero tail (a newer host), or (rarely) wrong, and sometimes
//! one or two invalid requests: the call then fails naming `requests[i]` of a bad one (the only
//! one, when there is one) and no output of any request changes; otherwise every request equals
//! its reference, stats per request.
//!
//! `PROPTEST_CASES` scales the number of cases (default 256: the pooled property runs 16 times as
//! many, the batch property 4 times, the large-pooled property a quarter; small cases are cheap).

mod common;
#[path = "common/dlfuzz.rs"]
mod dlfuzz;
use dlfuzz::{Rng, *};

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDeviceType, DLTensor};
use proptest::prelude::*;
use std::ptr::{null, null_mut};
use strata::ffi::{
    strata_lookup, strata_lookup_batch, strata_lookup_options, strata_lookup_options_default, strata_lookup_pooled, strata_lookup_request,
    strata_lookup_request_default, strata_lookup_stats,
};
type LookupOptions = strata_lookup_options;
type LookupStats = strata_lookup_stats;
type Request = strata_lookup_request;

const SUM: i32 = 1;
const MEAN: i32 = 2;
const SQRTN: i32 = 3;

// ---------------------------------------------------------------------------------------------
// One pooled (or plain) request: its description, buffers, verdict and reference
// ---------------------------------------------------------------------------------------------

/// How the keys are shaped.
#[derive(Debug, Clone)]
enum Form {
    /// 1-D keys `[nnz]`, bags of these sizes (offsets are the running sums).
    Ragged(Vec<u8>),
    /// 2-D keys `[B, L]`.
    Fixed(i64, i64),
    /// Keys of another rank (0-D or 3-D; a must-fail for pooled lookups), or of any shape for
    /// plain requests.
    Shape(Vec<i64>),
}

/// The offsets tensor of a pooled request.
#[derive(Debug, Clone)]
struct OffsetsSpec {
    dtype: (u8, u8, u16),
    layout: Layout,
    device: u32,
    /// Edits of the valid values (position, kind): see [`edit_offsets`].
    edits: Vec<(u8, u8)>,
    /// 0: 1-D; 1: [1, B + 1]; 2: [B + 1, 1]; 3: 0-D; 4: [0].
    rank: u8,
}

/// The weights tensor of a pooled request.
#[derive(Debug, Clone)]
struct WeightsSpec {
    /// float32, or (rarely) another dtype.
    dtype: (u8, u8, u16),
    layout: Layout,
    device: u32,
    /// A perturbation of the keys' shape (None: the keys' shape).
    shape: Option<u8>,
    seed: u64,
}

#[derive(Debug, Clone)]
struct ReqSpec {
    form: Form,
    /// None: NULL offsets.
    offsets: Option<OffsetsSpec>,
    /// None: NULL weights.
    weights: Option<WeightsSpec>,
    pooling: i32,
    key_dtype: (u8, u8, u16),
    key_layout: Layout,
    key_device: u32,
    key_seed: u64,
    /// A perturbation of out's shape (None: `[B, dim]` pooled, `[*keys.shape, dim]` plain; for
    /// plain requests `Some(255)` is `[numel, dim]`).
    out_shape: Option<u8>,
    out_layout: Layout,
    out_dtype: (u8, u8, u16),
    out_device: u32,
    want_stats: bool,
}

impl ReqSpec {
    fn key_shape(&self) -> Vec<i64> {
        match &self.form {
            Form::Ragged(sizes) => vec![sizes.iter().map(|&s| s as i64).sum()],
            Form::Fixed(b, l) => vec![*b, *l],
            Form::Shape(s) => s.clone(),
        }
    }
}

/// Applies one edit to valid offsets `v` (nnz = the last value).
fn edit_offsets(v: &mut Vec<i64>, (pos, kind): (u8, u8), nnz: i64) {
    let i = pos as usize % v.len().max(1);
    match kind % 8 {
        0 if !v.is_empty() => v[i] = v[i].wrapping_add(1),
        1 if !v.is_empty() => v[i] = v[i].wrapping_sub(1),
        2 if !v.is_empty() => v[0] = [1, -1, nnz + 1, i64::MIN][pos as usize % 4],
        3 => v.push(nnz),
        4 => {
            v.pop();
        }
        5 if !v.is_empty() => v[i] = [i64::MAX, 1 << 40, -(1 << 40), u32::MAX as i64][pos as usize % 4],
        6 if v.len() > 1 => {
            let j = (i + 1) % v.len();
            v.swap(i, j)
        }
        _ => v.insert(i, v.get(i).copied().unwrap_or(nnz)),
    }
}

/// A request's buffers, what the model says of it, and (when it may succeed) its reference.
struct Prepared {
    kb: Buffer,
    kdt: DLDataType,
    kdev: u32,
    off: Option<(Buffer, DLDataType, u32)>,
    w: Option<(Buffer, DLDataType, u32)>,
    ob: Buffer,
    odt: DLDataType,
    odev: u32,
    pooling: i32,
    want_stats: bool,
    verdict: Verdict,
    /// The reference and out's dtype, when no condition must fail.
    expected: Option<(Expected, Fl)>,
    /// The bytes of every input buffer, to check none is written.
    inputs: Vec<Vec<u8>>,
}

/// The tensors of a [`Prepared`], pointing into its buffers (valid while it lives, unmoved
/// buffers: the shape and strides live on the heap).
struct Tensors {
    keys: DLTensor,
    offsets: Option<DLTensor>,
    weights: Option<DLTensor>,
    out: DLTensor,
}

impl Prepared {
    fn tensors(&mut self) -> Tensors {
        Tensors {
            keys: self.kb.tensor(self.kdt, device(self.kdev)),
            offsets: self.off.as_mut().map(|(b, d, dev)| b.tensor(*d, device(*dev))),
            weights: self.w.as_mut().map(|(b, d, dev)| b.tensor(*d, device(*dev))),
            out: self.ob.tensor(self.odt, device(self.odev)),
        }
    }

    fn input_bytes(&self) -> Vec<Vec<u8>> {
        let mut v = vec![self.kb.bytes().to_vec()];
        v.extend(self.off.as_ref().map(|o| o.0.bytes().to_vec()));
        v.extend(self.w.as_ref().map(|w| w.0.bytes().to_vec()));
        v
    }

    fn describe(&self) -> String {
        let d = |name: &str, b: &Buffer, dt: DLDataType, dev: u32| {
            format!(
                "{name}: dtype ({}, {}, {}) dev {dev} data {:?} + {} shape {:?} strides {:?} (null {})\n",
                dt.code.0, dt.bits, dt.lanes, b.data, b.byte_offset, b.shape, b.strides, b.null_strides
            )
        };
        let mut s = format!("pooling {} stats {}\nverdict: {:?}\n", self.pooling, self.want_stats, self.verdict.reasons);
        s += &d("keys", &self.kb, self.kdt, self.kdev);
        if let Some((b, dt, dev)) = &self.off {
            s += &d("offsets", b, *dt, *dev);
        }
        if let Some((b, dt, dev)) = &self.w {
            s += &d("weights", b, *dt, *dev);
        }
        s += &d("out", &self.ob, self.odt, self.odev);
        s
    }
}

/// Reads the element at byte `off` of a buffer as int64 (`wide`) or int32 (offsets).
fn read_int(b: &Buffer, off: usize, wide: bool) -> i64 {
    let x = b.bytes();
    if wide {
        i64::from_ne_bytes(x[off..off + 8].try_into().unwrap())
    } else {
        i32::from_ne_bytes(x[off..off + 4].try_into().unwrap()) as i64
    }
}

/// Writes the low `size` bytes of `v` at byte `off` of a buffer (an int32 element gets `v`
/// truncated; an element of another dtype still gets something).
fn write_int(b: &mut Buffer, off: usize, size: usize, v: i64) {
    let bytes = v.to_ne_bytes();
    b.bytes_mut()[off..off + size].copy_from_slice(&bytes[..size]);
}

/// A weight: mostly ones and small values, zeros and sign changes (zero totals), sometimes
/// wide values and infinities.
fn weight(r: &mut Rng) -> f32 {
    match r.below(14) {
        0..=3 => 1.0,
        4 => 0.0,
        5 => -1.0,
        6 => r.below(7) as f32 - 3.0,
        7..=10 => (r.below(2001) as f32 - 1000.0) / 256.0,
        11 => r.value(),
        12 => [0.5, 0.25, 2.0, -0.5][r.below(4) as usize],
        _ => [f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e-30, 1e-41][r.below(5) as usize],
    }
}

/// Lays out the buffers of `s` for `table`, fills them, and models the call (pooled when
/// `s.pooling != 0` or `pooled_call`: `strata_lookup_pooled` refuses `STRATA_POOL_NONE`).
/// Err(reject) when a buffer would be too large.
fn prepare(table: &Table, s: &ReqSpec, pooled_call: bool) -> Result<Prepared, TestCaseError> {
    let dim = table.dim;
    let pooled = pooled_call || s.pooling != 0;
    let kdt = dt(s.key_dtype);
    let kd = Kd::of(kdt);
    let odt = dt(s.out_dtype);
    let od = Fl::of(odt);
    let kshape = s.key_shape();
    let too_big = |_| TestCaseError::reject("buffer too large");
    let mut kb = Buffer::new(&kshape, &s.key_layout, elem_of(kdt)).map_err(too_big)?;
    let mut v = Verdict::default();
    judge_tensor(&mut v, "keys", &kb, kd.is_some(), s.key_device, false);
    let nnz = kb.numel;

    if let Some(kd) = kd {
        fill_keys(table, kd, &mut kb, s.key_seed);
    }

    // Offsets: the running sums of the bag sizes (or of L-sized bags), then edits.
    let mut off = None;
    let mut bag_bounds: Option<Vec<i64>> = None; // B + 1 values, when known and valid
    let mut offsets_len: Option<i64> = None; // B + 1, when the offsets' shape is valid
    // A request with a CUDA tensor takes the CUDA path, which reads offsets on the host only
    // from kDLCPU memory; elsewhere the kernels check their values, so a request with no bag
    // to run (B = 0) is served without reading them (and, in a build without a driver, without
    // a device: `judge_tensor` allows kDLCUDA to succeed).
    let cuda_path = [Some(s.key_device), s.offsets.as_ref().map(|o| o.device), s.weights.as_ref().map(|w| w.device), Some(s.out_device)]
        .into_iter()
        .flatten()
        .any(|d| d == DLDeviceType::CUDA.0);
    if let Some(os) = &s.offsets {
        let mut vals = vec![0i64];
        match &s.form {
            Form::Ragged(sizes) => sizes.iter().for_each(|&z| vals.push(vals.last().unwrap() + z as i64)),
            Form::Fixed(b, l) => (0..*b.max(&0)).for_each(|_| vals.push(vals.last().unwrap() + (*l).max(0))),
            Form::Shape(_) => vals.push(nnz as i64),
        }
        for &e in &os.edits {
            edit_offsets(&mut vals, e, nnz as i64);
        }
        let shape: Vec<i64> = match os.rank % 5 {
            0 => vec![vals.len() as i64],
            1 => vec![1, vals.len() as i64],
            2 => vec![vals.len() as i64, 1],
            3 => vec![],
            _ => vec![0],
        };
        let odt_ = dt(os.dtype);
        let esize = elem_of(odt_);
        let mut b = Buffer::new(&shape, &os.layout, esize).map_err(too_big)?;
        let wide = match (odt_.code, odt_.bits, odt_.lanes) {
            (DLDataTypeCode::INT, 32, 1) => Some(false),
            (DLDataTypeCode::INT, 64, 1) => Some(true),
            _ => None,
        };
        judge_tensor(&mut v, "offsets", &b, wide.is_some(), os.device, false);
        if let Some(offs) = b.offsets.clone() {
            for (i, &o) in offs.iter().enumerate() {
                write_int(&mut b, o, esize.min(8), vals.get(i).copied().unwrap_or(0));
            }
        }
        if pooled {
            let ok_shape = shape.len() == 1 && shape[0] >= 1;
            if !ok_shape {
                v.must(INVALID_ARGUMENT, format!("offsets: shape {shape:?}; expected [B + 1]"));
            } else if kshape.len() == 1 {
                offsets_len = Some(shape[0]);
            }
            // Values strata can read (else `judge_tensor` said why not).
            if let (1, true, Some(wide), Some(offs)) = (kshape.len(), ok_shape, wide, &b.offsets) {
                // What strata reads (a zero stride repeats one value).
                let read: Vec<i64> = offs.iter().map(|&o| read_int(&b, o, wide)).collect();
                let valid = read[0] == 0 && read.windows(2).all(|w| w[0] <= w[1]) && *read.last().unwrap() == nnz as i64;
                if valid {
                    bag_bounds = Some(read);
                } else if cuda_path && os.device != DLDeviceType::CPU.0 {
                    let why = format!("offsets: values {read:?} for nnz = {nnz}, left to the kernels");
                    if read.len() == 1 && nnz > 0 {
                        v.must(INVALID_ARGUMENT, why); // no bag can hold the keys
                    } else {
                        v.may(INVALID_ARGUMENT, why);
                    }
                } else {
                    v.must(INVALID_ARGUMENT, format!("offsets: values {read:?} for nnz = {nnz}"));
                }
            }
        } else {
            v.must(INVALID_ARGUMENT, "offsets: given with STRATA_POOL_NONE");
        }
        off = Some((b, odt_, os.device));
    }

    // The bags: how many, and their flat key ranges.
    let nb: Option<i64> = if pooled {
        match (kshape.len(), &s.offsets) {
            (1, None) => {
                v.must(INVALID_ARGUMENT, "offsets: NULL with 1-D keys");
                None
            }
            (2, Some(_)) => {
                v.must(INVALID_ARGUMENT, "offsets: given with 2-D keys");
                None
            }
            (2, None) => {
                let (b, l) = (kshape[0].max(0), kshape[1].max(0));
                bag_bounds = Some((0..=b).map(|i| i * l).collect());
                Some(kshape[0])
            }
            (1, Some(_)) => offsets_len.map(|l| l - 1),
            (nd, _) => {
                v.must(INVALID_ARGUMENT, format!("keys: ndim {nd}"));
                None
            }
        }
    } else {
        None
    };

    // Weights: float32 of the keys' shape, or not.
    let mut w = None;
    if let Some(ws) = &s.weights {
        let mut shape = kshape.clone();
        if let Some(p) = ws.shape {
            match p % 4 {
                0 => shape.push(1),
                1 => {
                    shape.pop();
                }
                2 if !shape.is_empty() => shape[0] += 1,
                _ => shape.insert(0, 2),
            }
        }
        let wdt = dt(ws.dtype);
        let mut b = Buffer::new(&shape, &ws.layout, elem_of(wdt)).map_err(too_big)?;
        let f32_ok = (wdt.code, wdt.bits, wdt.lanes) == (DLDataTypeCode::FLOAT, 32, 1);
        judge_tensor(&mut v, "weights", &b, f32_ok, ws.device, false);
        if let Some(offs) = b.offsets.clone() {
            let mut r = Rng(ws.seed);
            let esize = elem_of(wdt);
            for o in offs {
                let x = weight(&mut r).to_bits() as i64;
                write_int(&mut b, o, esize.min(4), x);
            }
        }
        if !pooled {
            v.must(INVALID_ARGUMENT, "weights: given with STRATA_POOL_NONE");
        } else if shape != kshape {
            v.must(INVALID_ARGUMENT, format!("weights: shape {shape:?} for keys {kshape:?}"));
        }
        w = Some((b, wdt, ws.device));
    }

    // Pooling.
    if pooled && !(SUM..=SQRTN).contains(&s.pooling) {
        v.must(INVALID_ARGUMENT, format!("pooling: {}", s.pooling));
    }

    // Out: [B, dim] (pooled) or [*keys.shape, dim] / [numel, dim] (plain), perturbed.
    let numel: i64 = kshape.iter().map(|&x| x.max(0)).product();
    let mut oshape = if pooled {
        vec![
            nb.unwrap_or(match &s.form {
                Form::Ragged(sizes) => sizes.len() as i64,
                Form::Fixed(b, _) => *b,
                Form::Shape(sh) => sh.first().copied().unwrap_or(1),
            }),
            dim as i64,
        ]
    } else if s.out_shape == Some(255) {
        vec![numel, dim as i64]
    } else {
        let mut f = kshape.clone();
        f.push(dim as i64);
        f
    };
    if let Some(p) = s.out_shape.filter(|&p| p != 255) {
        match p % 6 {
            0 => oshape[0] += 1,
            1 => oshape[0] -= 1,
            2 => *oshape.last_mut().unwrap() += 1,
            3 => *oshape.last_mut().unwrap() -= 1,
            4 => oshape.push(1),
            _ => {
                oshape.remove(0);
            }
        }
    }
    let ob = Buffer::new(&oshape, &s.out_layout, elem_of(odt)).map_err(too_big)?;
    judge_tensor(&mut v, "out", &ob, od.is_some(), s.out_device, false);
    if !ob.negative_shape && !kb.negative_shape {
        let ok = if pooled {
            nb.is_none_or(|b| oshape == [b, dim as i64])
        } else {
            let mut full = kshape.clone();
            full.push(dim as i64);
            oshape == full || oshape == [numel, dim as i64]
        };
        if !ok {
            v.must(INVALID_ARGUMENT, format!("out: shape {oshape:?}"));
        }
    }
    if pooled && ob.negative_stride {
        v.must(INVALID_LAYOUT, "out: negative stride");
    }
    if let Some(offs) = &ob.offsets {
        let mut sorted = offs.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            v.must(INVALID_LAYOUT, "out: elements overlap");
        } else if ob.fails_sorted_rule {
            v.may(INVALID_LAYOUT, "out: strides interleave (distinct, but beyond the conservative check)");
        }
    }

    let mut p = Prepared {
        kb,
        kdt,
        kdev: s.key_device,
        off,
        w,
        ob,
        odt,
        odev: s.out_device,
        pooling: s.pooling,
        want_stats: s.want_stats,
        verdict: v,
        expected: None,
        inputs: Vec::new(),
    };
    p.inputs = p.input_bytes();
    if p.verdict.must.is_empty() {
        let (kd, od) = (kd.expect("valid keys dtype"), od.expect("valid out dtype"));
        let e = if pooled {
            // Offsets whose values only the kernels check (see cuda_path): B empty bags.
            let bounds = bag_bounds.unwrap_or_else(|| vec![0; nb.map_or(1, |b| b.max(0) as usize + 1)]);
            pooled_expected(table, kd, &p, od, &bounds)
        } else {
            plain_expected(table, kd, &p.kb, od, &p.ob)
        };
        p.expected = Some((e, od));
    }
    Ok(p)
}

/// The reference of a pooled lookup, as the contract states it (see the module docs); `bounds`
/// are the B + 1 bag boundaries as flat key indices.
fn pooled_expected(table: &Table, kd: Kd, p: &Prepared, od: Fl, bounds: &[i64]) -> Expected {
    let dim = table.dim;
    let koffs = p.kb.offsets.clone().unwrap_or_default();
    let ooffs = p.ob.offsets.clone().unwrap_or_default();
    let b = bounds.len() - 1;
    assert_eq!(ooffs.len(), b * dim, "out reaches its elements");
    let weights: Option<Vec<f32>> = p.w.as_ref().map(|(wb, _, _)| {
        let x = wb.bytes();
        wb.offsets.clone().unwrap_or_default().iter().map(|&o| f32::from_ne_bytes(x[o..o + 4].try_into().unwrap())).collect()
    });
    let mut e = Expected { elems: Vec::with_capacity(b * dim), ..Expected::default() };
    let mut acc = vec![0f32; dim];
    for bag in 0..b {
        acc.fill(0.0);
        let (mut wsum, mut w2sum) = (0f32, 0f32);
        for j in bounds[bag] as usize..bounds[bag + 1] as usize {
            let c = kd.canonical(&p.kb.bytes()[koffs[j]..koffs[j] + kd.size()]);
            let row = table.row_of(c);
            e.count(j, row.is_some(), || kd.value(c));
            let w = weights.as_ref().map_or(1.0, |w| w[j]);
            for (col, a) in acc.iter_mut().enumerate() {
                let x = match row {
                    Some(r) => table.value_f32(r, col),
                    None => table.default_value,
                };
                *a += w * x;
            }
            wsum += w;
            w2sum += w * w;
        }
        let divisor = match p.pooling {
            MEAN => Some(wsum),
            SQRTN => Some(w2sum.sqrt()),
            _ => None,
        };
        match divisor {
            Some(0.0) => acc.fill(0.0), // -0.0 too: float patterns compare with ==
            Some(d) => acc.iter_mut().for_each(|a| *a /= d),
            None => {}
        }
        for (col, &a) in acc.iter().enumerate() {
            let bits = od.round(a);
            e.elems.push((ooffs[bag * dim + col], [bits, bits]));
        }
    }
    e
}

/// Checks one prepared request after a call that returned `status` with message `msg` (`at`:
/// what the message names before the argument, `requests[0].` for a batch of this request
/// alone): the model's verdict, out's bytes and the stats.
fn check(
    p: &Prepared,
    table: &Table,
    status: i32,
    at: &str,
    msg: &str,
    stats: &LookupStats,
    ctx: &dyn Fn() -> String,
) -> Result<(), TestCaseError> {
    let v = &p.verdict;
    prop_assert_eq!(p.input_bytes(), p.inputs.clone(), "an input was written\n{}", ctx());
    if !v.must.is_empty() {
        prop_assert!(status != OK, "must fail\n{}", ctx());
        prop_assert!(v.must.contains(&status) || v.may.contains(&status), "unexpected status\n{}", ctx());
        prop_assert!(v.names(status, at, msg), "the message does not name the argument\n{}", ctx());
        prop_assert!(untouched(&p.ob), "out written by a failing call\n{}", ctx());
        return Ok(());
    }
    let (e, od) = p.expected.as_ref().expect("computed when nothing must fail");
    let key_error = table.missing_error && e.misses > 0;
    if status == OK || (status == KEY_NOT_FOUND && key_error) {
        if let Err(what) = check_out(&p.ob, *od, e, status == OK) {
            prop_assert!(false, "{what}\n{}", ctx());
        }
        if status == OK {
            prop_assert!(!key_error, "missing key with STRATA_MISSING_ERROR but OK\n{}", ctx());
            if p.want_stats {
                prop_assert_eq!(*stats, LookupStats { hits: e.hits, misses: e.misses, ..LookupStats::default() }, "stats\n{}", ctx());
            }
        } else {
            let (j, key) = e.first_miss.clone().unwrap();
            let want = format!("{at}keys: key {key} (element {j})");
            prop_assert!(msg.starts_with(&want), "KEY_NOT_FOUND must start {:?}\n{}", want, ctx());
        }
        return Ok(());
    }
    prop_assert!(v.may.contains(&status), "must succeed (or fail with STRATA_KEY_NOT_FOUND)\n{}", ctx());
    prop_assert!(v.names(status, at, msg), "the message does not name the argument\n{}", ctx());
    prop_assert!(untouched(&p.ob), "out written by a failing call\n{}", ctx());
    Ok(())
}

fn options(num_threads: Option<i32>) -> Option<LookupOptions> {
    num_threads.map(|t| {
        let mut o = strata_lookup_options_default();
        o.num_threads = t;
        o
    })
}

fn poisoned_stats() -> LookupStats {
    LookupStats { hits: 0xdead, misses: 0xbeef, volatile_hits: 0xdead, persistent_hits: 0xbeef, ..LookupStats::default() }
}

// ---------------------------------------------------------------------------------------------
// Property 1: strata_lookup_pooled
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct PooledCase {
    table: TableSpec,
    req: ReqSpec,
    num_threads: Option<i32>,
    /// Made as the one request of a `strata_lookup_batch` (where `STRATA_POOL_NONE` is a plain
    /// lookup) instead of a `strata_lookup_pooled` call.
    via_batch: bool,
}

fn run_pooled(case: &PooledCase) -> Result<(), TestCaseError> {
    let table = Table::build(&case.table);
    let mut p = prepare(&table, &case.req, !case.via_batch)?;
    if matches!(case.num_threads, Some(t) if t < 0) {
        p.verdict.must(INVALID_ARGUMENT, "opts->num_threads: negative");
    }
    let opts = options(case.num_threads);
    let opts_p = opts.as_ref().map_or(null(), |o| o as *const LookupOptions);
    let mut stats = poisoned_stats();
    let stats_p = if p.want_stats { &mut stats as *mut LookupStats } else { null_mut() };
    let mut t = p.tensors();
    // SAFETY: table.ptr is a live table (Table). The tensors describe p's buffers through their
    // own shape and strides arrays, all alive past the call. A description that reaches memory
    // outside its buffer is one strata must refuse before it touches an element (unaddressable,
    // NULL data, a wrapping byte_offset, a bad dtype or device: `judge_tensor` lists them);
    // every other reaches only elements that Buffer::new placed inside its buffer. Host memory
    // is labelled kDLCUDA only where no CUDA driver is present. opts_p and stats_p are NULL or
    // point at locals.
    let offsets_p = t.offsets.as_ref().map_or(null(), |o| o as *const DLTensor);
    let weights_p = t.weights.as_ref().map_or(null(), |w| w as *const DLTensor);
    let status = if case.via_batch {
        let r = Request {
            table: table.ptr,
            keys: &t.keys,
            offsets: offsets_p,
            weights: weights_p,
            pooling: p.pooling,
            out: &mut t.out,
            stats: stats_p,
            ..strata_lookup_request_default()
        };
        // SAFETY: as for strata_lookup_pooled below: r holds the same pointers, and is one
        // request of the size it says.
        unsafe { strata_lookup_batch(&r, 1, opts_p) }
    } else {
        // SAFETY: see above.
        unsafe { strata_lookup_pooled(table.ptr, &t.keys, offsets_p, weights_p, p.pooling, &mut t.out, opts_p, stats_p) }
    } as i32;
    let msg = last_error();
    let at = if case.via_batch { "requests[0]." } else { "" };
    let ctx = || format!("status {} ({status}), message {msg:?}, via batch {}\n{}", status_name(status), case.via_batch, p.describe());
    check(&p, &table, status, at, &msg, &stats, &ctx)
}

fn pooling(odd: f64) -> BoxedStrategy<i32> {
    let w = (100.0 * 0.04 * odd) as u32;
    prop_oneof![
        100 => prop::sample::select(vec![SUM, MEAN, SQRTN]),
        w => prop::sample::select(vec![0, 4, -1, i32::MIN, 1 << 16]),
    ]
    .boxed()
}

fn offsets_spec(odd: f64) -> impl Strategy<Value = OffsetsSpec> {
    let w = |p: f64| (1000.0 * p * odd) as u32;
    let dtype = prop_oneof![
        1000 - w(0.06) => prop::sample::select(vec![(0u8, 32u8, 1u16), (0, 64, 1)]),
        w(0.06) => prop::sample::select(vec![(2u8, 32u8, 1u16), (1, 64, 1), (1, 32, 1), (0, 16, 1), (2, 64, 1)]),
    ];
    let edits = prop::collection::vec((any::<u8>(), any::<u8>()), 0..3);
    let edits = prop_oneof![1000 - w(0.15) => Just(vec![]), w(0.15) => edits];
    let rank = prop_oneof![1000 - w(0.03) => Just(0u8), w(0.03) => 1u8..5];
    (dtype, layout(odd * 0.5), device_code(odd), edits, rank).prop_map(|(dtype, layout, device, edits, rank)| OffsetsSpec {
        dtype,
        layout,
        device,
        edits,
        rank,
    })
}

fn weights_spec(odd: f64) -> impl Strategy<Value = WeightsSpec> {
    let w = |p: f64| (1000.0 * p * odd) as u32;
    let dtype = prop_oneof![
        1000 - w(0.04) => Just((2u8, 32u8, 1u16)),
        w(0.04) => prop::sample::select(vec![(2u8, 16u8, 1u16), (2, 64, 1), (0, 32, 1), (4, 16, 1)]),
    ];
    let shape = prop_oneof![1000 - w(0.04) => Just(None), w(0.04) => any::<u8>().prop_map(Some)];
    (dtype, layout(odd * 0.5), device_code(odd), shape, any::<u64>()).prop_map(|(dtype, layout, device, shape, seed)| WeightsSpec {
        dtype,
        layout,
        device,
        shape,
        seed,
    })
}

/// Keys, offsets and weights of a pooled request; `odd` scales the odds of every oddity.
fn pooled_req(odd: f64, max_bags: usize, max_hot: u8) -> impl Strategy<Value = ReqSpec> {
    let w = |p: f64| (1000.0 * p * odd) as u32;
    let ragged = (
        prop::collection::vec(prop_oneof![1 => Just(0u8), 4 => 1..=max_hot], 0..=max_bags),
        offsets_spec(odd),
        prop_oneof![1000 - w(0.02) => Just(true), w(0.02) => Just(false)],
    )
        .prop_map(|(sizes, o, given)| (Form::Ragged(sizes), given.then_some(o)));
    let fixed = (
        0..=max_bags as i64,
        prop_oneof![1 => Just(0i64), 6 => 1..=max_hot as i64],
        offsets_spec(odd),
        prop_oneof![1000 - w(0.02) => Just(false), w(0.02) => Just(true)],
    )
        .prop_map(|(b, l, o, given)| (Form::Fixed(b, l), given.then_some(o)));
    let odd_rank = (
        prop::collection::vec(0i64..3, 0..=3).prop_filter("not 1-D or 2-D", |s| s.len() != 1 && s.len() != 2),
        offsets_spec(odd),
        any::<bool>(),
    )
        .prop_map(|(s, o, given)| (Form::Shape(s), given.then_some(o)));
    let form = prop_oneof![1000 => ragged, 700 => fixed, w(0.02) => odd_rank];
    let out_shape = prop_oneof![1000 - w(0.04) => Just(None), w(0.04) => (0u8..6).prop_map(Some)];
    (
        (form, prop::option::weighted(0.5, weights_spec(odd)), pooling(odd)),
        (key_dtype(odd), layout(odd), device_code(odd), any::<u64>()),
        (out_shape, layout(odd), out_dtype(odd), device_code(odd), any::<bool>()),
    )
        .prop_map(|((form, weights, pooling), k, o)| ReqSpec {
            form: form.0,
            offsets: form.1,
            weights,
            pooling,
            key_dtype: k.0,
            key_layout: k.1,
            key_device: k.2,
            key_seed: k.3,
            out_shape: o.0,
            out_layout: o.1,
            out_dtype: o.2,
            out_device: o.3,
            want_stats: o.4,
        })
}

fn num_threads(odd: f64) -> impl Strategy<Value = Option<i32>> {
    prop_oneof![
        300 => Just(None),
        600 => prop::sample::select(vec![0, 1, 2, 3, 8]).prop_map(Some),
        (20.0 * odd) as u32 => Just(Some(-1)),
    ]
}

fn pooled_case() -> impl Strategy<Value = PooledCase> {
    (table_spec(0..=40, 1..=130), pooled_req(1.0, 10, 7), num_threads(1.0), prop::bool::weighted(0.25))
        .prop_map(|(table, req, num_threads, via_batch)| PooledCase { table, req, num_threads, via_batch })
}

/// Pooled lookups big enough to be split over threads (more than 4096 keys, more than 256 KiB
/// of rows), on valid layouts of every kind.
fn large_pooled_case() -> impl Strategy<Value = PooledCase> {
    (
        table_spec(200..=3000, 8..=96).prop_map(|t| TableSpec { missing_error: false, ..t }),
        prop_oneof![(2usize..40, 150u8..=255), (200usize..900, 8u8..=40)],
        any::<u64>(),
        prop_oneof![Just(None), prop::sample::select(vec![0, 2, 3, 4]).prop_map(Some)],
        any::<bool>(),
    )
        .prop_flat_map(|(table, (bags, hot), seed, num_threads, via_batch)| {
            (Just(table), pooled_req(0.0, bags, hot), Just(seed), Just(num_threads), Just(via_batch))
        })
        .prop_map(|(table, mut req, seed, num_threads, via_batch)| {
            // Mostly full bags, so the keys number in the thousands.
            if let Form::Ragged(sizes) = &mut req.form {
                let mut r = Rng(seed);
                let max = sizes.iter().copied().max().unwrap_or(1).max(1);
                sizes.iter_mut().for_each(|s| *s = if r.below(8) == 0 { 0 } else { max - r.below(max as u64 / 4 + 1) as u8 });
            }
            if let Form::Fixed(b, l) = &mut req.form {
                *b = (*b).max(2);
                *l = (*l).max(20);
            }
            PooledCase { table, req, num_threads, via_batch }
        })
}

proptest! {
    #![proptest_config(config(cases_from_env().saturating_mul(16)))]

    #[test]
    fn pooled_lookup_matches_reference_or_fails_cleanly(case in pooled_case()) {
        run_pooled(&case)?;
    }
}

proptest! {
    #![proptest_config(config((cases_from_env() / 4).max(8)))]

    #[test]
    fn large_pooled_lookups_match_reference_on_any_thread_count(case in large_pooled_case()) {
        run_pooled(&case)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Property 2: strata_lookup_batch
// ---------------------------------------------------------------------------------------------

/// A defect of the request array or of one request's fields (beyond its tensors).
#[derive(Debug, Clone, Copy)]
enum Defect {
    NullTable,
    NullKeys,
    NullOut,
    /// `stats.struct_size` not a size of any version.
    StatsSize(usize),
    /// This element's `struct_size` differs from element 0's (element 0: set to 0).
    StructSize,
    /// A non-zero byte in the unknown tail of this element (the array's size is larger).
    Tail,
    /// Offsets or weights with `STRATA_POOL_NONE` (plain requests; pooled ones get an
    /// invalid pooling instead).
    ExtraTensor,
}

#[derive(Debug, Clone)]
struct BatchCase {
    tables: Vec<TableSpec>,
    /// (table index, modulo the number of tables; request).
    requests: Vec<(u8, ReqSpec)>,
    /// Bytes appended to every element (a newer host's struct): 0, 8, 16 or 64 zero bytes.
    extra: usize,
    /// A smaller, invalid `struct_size` for every element (an uninitialised or pre-0.3 struct).
    smaller: Option<usize>,
    /// (request index, defect) of the FFI-level defects.
    defects: Vec<(u8, Defect)>,
    num_threads: Option<i32>,
    /// Stats with a larger `struct_size` (the tail strata must zero).
    big_stats: bool,
}

const STATS_WORDS: usize = 8;

fn run_batch(case: &BatchCase) -> Result<(), TestCaseError> {
    let tables: Vec<Table> = case.tables.iter().map(Table::build).collect();
    let n = case.requests.len();
    let mut preps = Vec::with_capacity(n);
    for (ti, r) in &case.requests {
        let t = &tables[*ti as usize % tables.len()];
        preps.push(prepare(t, r, false)?);
    }
    // FFI-level defects, by request.
    let mut ffi: Vec<Vec<Defect>> = vec![Vec::new(); n];
    for &(i, d) in &case.defects {
        ffi[i as usize % n].push(d);
    }
    let stride = case.smaller.unwrap_or(size_of::<Request>() + case.extra);
    let alloc = stride.max(size_of::<Request>() + 64);
    let mut words = vec![0u64; n * alloc / 8 + 8];
    let mut tensors: Vec<Tensors> = preps.iter_mut().map(Prepared::tensors).collect();
    let mut stats: Vec<[u64; STATS_WORDS]> = vec![[0xdead_beef; STATS_WORDS]; n];
    let stats_size = if case.big_stats { STATS_WORDS * 8 } else { size_of::<LookupStats>() };
    // A separate, valid offsets tensor to hand a plain request (ExtraTensor).
    let mut spare_offsets = [0i64, 0];
    let mut spare_shape = [2i64];
    let spare = DLTensor {
        data: spare_offsets.as_mut_ptr().cast(),
        device: device(DLDeviceType::CPU.0),
        ndim: 1,
        dtype: DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 1 },
        shape: spare_shape.as_mut_ptr(),
        strides: null_mut(),
        byte_offset: 0,
    };
    for i in 0..n {
        let (ti, _) = case.requests[i];
        let p = &mut preps[i];
        let t = &mut tensors[i];
        stats[i][0] = stats_size as u64;
        let mut r: Request = strata_lookup_request_default();
        assert_eq!(r.struct_size, size_of::<Request>());
        assert_eq!((r.pooling, r.table.is_null(), r.keys.is_null(), r.out.is_null(), r.stats.is_null()), (0, true, true, true, true));
        r.struct_size = stride;
        r.table = tables[ti as usize % tables.len()].ptr;
        r.keys = &t.keys;
        r.offsets = t.offsets.as_ref().map_or(null(), |o| o as *const DLTensor);
        r.weights = t.weights.as_ref().map_or(null(), |w| w as *const DLTensor);
        r.pooling = p.pooling;
        r.out = &mut t.out;
        r.stats = if p.want_stats { stats[i].as_mut_ptr().cast() } else { null_mut() };
        let mut tail = false;
        for &d in &ffi[i] {
            let v = &mut p.verdict;
            match d {
                Defect::NullTable => {
                    r.table = null_mut();
                    v.must(NULL_ARGUMENT, "table: NULL");
                }
                Defect::NullKeys => {
                    r.keys = null();
                    v.must(NULL_ARGUMENT, "keys: NULL");
                }
                Defect::NullOut => {
                    r.out = null_mut();
                    v.must(NULL_ARGUMENT, "out: NULL");
                }
                Defect::StatsSize(s) => {
                    stats[i][0] = s as u64;
                    r.stats = stats[i].as_mut_ptr().cast();
                    v.must(INVALID_ARGUMENT, format!("stats: struct_size {s}"));
                }
                Defect::StructSize => {
                    r.struct_size = if i == 0 { 0 } else { stride + 8 };
                    v.must(INVALID_ARGUMENT, "struct_size: differs");
                }
                Defect::Tail => tail = true,
                Defect::ExtraTensor => {
                    if r.pooling == 0 {
                        r.offsets = &spare;
                        v.must(INVALID_ARGUMENT, "offsets: given with STRATA_POOL_NONE");
                    } else {
                        r.pooling = 7;
                        v.must(INVALID_ARGUMENT, "pooling: 7");
                    }
                }
            }
        }
        if case.smaller.is_some() {
            p.verdict.must(INVALID_ARGUMENT, "struct_size: below the first published size");
        }
        let at = i * stride;
        // SAFETY: words holds n * alloc bytes, and at + sizeof(Request) <= (n - 1) * stride +
        // sizeof(Request) <= n * alloc (stride <= alloc, sizeof(Request) <= alloc): the request
        // fits (written unaligned: an invalid stride need not be a multiple of 8).
        unsafe { (words.as_mut_ptr().cast::<u8>().add(at) as *mut Request).write_unaligned(r) };
        if tail && stride > size_of::<Request>() {
            let bytes = words.len() * 8;
            let b = at + size_of::<Request>() + (stride - size_of::<Request>()) / 2;
            assert!(b < bytes);
            // SAFETY: b < the bytes of words (asserted).
            unsafe { *words.as_mut_ptr().cast::<u8>().add(b) = 1 };
            p.verdict.must(INVALID_ARGUMENT, "struct_size: non-zero tail");
        }
    }
    if matches!(case.num_threads, Some(t) if t < 0) && n > 0 {
        // Checked per request: the first request is named.
        preps[0].verdict.must(INVALID_ARGUMENT, "opts->num_threads: negative");
    }
    let opts = options(case.num_threads);
    let opts_p = opts.as_ref().map_or(null(), |o| o as *const LookupOptions);
    // SAFETY: words holds n requests of `stride` bytes each (as their struct_size says; a
    // smaller or differing size is refused before anything past it is read), whose pointers are
    // NULL or point at the tables (alive), the tensors in `tensors` (describing the buffers of
    // `preps` as `run_pooled` describes its own: strata refuses every description that reaches
    // outside its buffer), `spare` and the stats arrays of `stats_size` bytes, all alive past
    // the call. opts_p is NULL or points at a local.
    let status = unsafe { strata_lookup_batch(words.as_ptr().cast(), n, opts_p) } as i32;
    let msg = last_error();
    let ctx = |i: usize| {
        let mut s = format!("status {} ({status}), message {msg:?}\n{n} requests, stride {stride}\n", status_name(status));
        for (j, p) in preps.iter().enumerate() {
            if j == i || (!p.verdict.reasons.is_empty() && s.len() < 20_000) {
                s += &format!("requests[{j}] (table {}): {}", case.requests[j].0 as usize % tables.len(), p.describe());
            }
        }
        s
    };
    let bad: Vec<usize> = (0..n).filter(|&i| !preps[i].verdict.must.is_empty()).collect();
    let may: Vec<usize> = (0..n).filter(|&i| !preps[i].verdict.may.is_empty()).collect();
    let inputs_unchanged = |p: &Prepared| p.input_bytes() == p.inputs;
    let named = |i: usize| {
        let at = format!("requests[{i}].");
        preps[i].verdict.names(status, &at, &msg)
            || (msg.starts_with(&format!("requests: {at}struct_size"))
                && preps[i].verdict.causes.iter().any(|(_, why)| why.starts_with("struct_size")))
    };
    for p in &preps {
        prop_assert!(inputs_unchanged(p), "an input was written\n{}", ctx(n));
    }
    if !bad.is_empty() || (status != OK && status != KEY_NOT_FOUND) {
        // Validation failed: no output of any request changes.
        prop_assert!(status != OK, "must fail (requests {:?})\n{}", bad, ctx(n));
        let culprits: Vec<usize> = bad.iter().chain(&may).copied().filter(|&i| named(i)).collect();
        prop_assert!(!culprits.is_empty(), "the message names no bad request (bad {:?}, may {:?})\n{}", bad, may, ctx(n));
        if bad.len() == 1 && may.is_empty() {
            prop_assert_eq!(culprits, vec![bad[0]], "must name the bad request\n{}", ctx(n));
        }
        for (i, p) in preps.iter().enumerate() {
            prop_assert!(untouched(&p.ob), "requests[{}].out written by a failing batch\n{}", i, ctx(i));
            prop_assert!(stats[i][1..].iter().all(|&x| x == 0xdead_beef), "requests[{}].stats written by a failing batch\n{}", i, ctx(i));
        }
        return Ok(());
    }
    if status == KEY_NOT_FOUND {
        // A missing key under STRATA_MISSING_ERROR stops the batch at the request that has it
        // (requests run in order); no byte outside any out's elements is written.
        let missing = |i: usize| {
            let t = &tables[case.requests[i].0 as usize % tables.len()];
            t.missing_error && preps[i].expected.as_ref().is_some_and(|(e, _)| e.misses > 0)
        };
        let first = (0..n).find(|&i| missing(i));
        prop_assert!(first.is_some(), "KEY_NOT_FOUND with no missing key\n{}", ctx(n));
        let i = first.unwrap();
        let (j, key) = preps[i].expected.as_ref().unwrap().0.first_miss.clone().unwrap();
        let want = format!("requests[{i}].keys: key {key} (element {j})");
        prop_assert!(msg.starts_with(&want), "KEY_NOT_FOUND must start {:?}\n{}", want, ctx(i));
        for (i, p) in preps.iter().enumerate() {
            let (e, od) = p.expected.as_ref().unwrap();
            if let Err(what) = check_out(&p.ob, *od, e, false) {
                prop_assert!(false, "requests[{i}]: {what}\n{}", ctx(i));
            }
        }
        return Ok(());
    }
    // Success: every request equals its reference, with its own stats.
    for (i, p) in preps.iter().enumerate() {
        let (e, od) = p.expected.as_ref().unwrap();
        let t = &tables[case.requests[i].0 as usize % tables.len()];
        prop_assert!(!(t.missing_error && e.misses > 0), "requests[{}]: a missing key with STRATA_MISSING_ERROR but OK\n{}", i, ctx(i));
        if let Err(what) = check_out(&p.ob, *od, e, true) {
            prop_assert!(false, "requests[{i}]: {what}\n{}", ctx(i));
        }
        if p.want_stats {
            let s = &stats[i];
            let want = [stats_size as u64, e.hits, e.misses, 0, 0];
            prop_assert_eq!(&s[..5], &want[..], "requests[{}].stats\n{}", i, ctx(i));
            let tail = if case.big_stats { 0 } else { 0xdead_beef };
            prop_assert!(s[5..].iter().all(|&x| x == tail), "requests[{}].stats beyond its struct_size\n{}", i, ctx(i));
        } else {
            prop_assert!(stats[i][1..].iter().all(|&x| x == 0xdead_beef), "requests[{}].stats written", i);
        }
    }
    Ok(())
}

/// A plain request: keys of any shape up to 3-D, out `[*keys.shape, dim]` or `[numel, dim]`.
fn plain_req(odd: f64) -> impl Strategy<Value = ReqSpec> {
    let w = |p: f64| (1000.0 * p * odd) as u32;
    let shape = prop::collection::vec(prop_oneof![1 => Just(0i64), 9 => 1i64..=5], 0..=3);
    let out_shape = prop_oneof![
        1000 => Just(None),
        500 => Just(Some(255u8)),
        w(0.04) => (0u8..6).prop_map(Some),
    ];
    ((shape, key_dtype(odd), layout(odd), any::<u64>()), (out_shape, layout(odd), out_dtype(odd), any::<bool>())).prop_map(|(k, o)| {
        ReqSpec {
            form: Form::Shape(k.0),
            offsets: None,
            weights: None,
            pooling: 0,
            key_dtype: k.1,
            key_layout: k.2,
            key_device: DLDeviceType::CPU.0,
            key_seed: k.3,
            out_shape: o.0,
            out_layout: o.1,
            out_dtype: o.2,
            out_device: DLDeviceType::CPU.0,
            want_stats: o.3,
        }
    })
}

/// A request of a batch: valid (calm layouts) or, at `bad`, a request with oddities.
fn batch_req(bad: bool) -> BoxedStrategy<(u8, ReqSpec)> {
    let odd = if bad { 1.0 } else { 0.0 };
    let calm_devices = |mut r: ReqSpec| {
        r.key_device = DLDeviceType::CPU.0;
        r.out_device = DLDeviceType::CPU.0;
        r.offsets.iter_mut().for_each(|o| o.device = DLDeviceType::CPU.0);
        r.weights.iter_mut().for_each(|w| w.device = DLDeviceType::CPU.0);
        r
    };
    (any::<u8>(), prop_oneof![1 => plain_req(odd), 1 => pooled_req(odd, 6, 5).prop_map(calm_devices)]).boxed()
}

fn defect() -> impl Strategy<Value = Defect> {
    prop_oneof![
        Just(Defect::NullTable),
        Just(Defect::NullKeys),
        Just(Defect::NullOut),
        prop::sample::select(vec![0usize, 8, 32, 44, 2048]).prop_map(Defect::StatsSize),
        Just(Defect::StructSize),
        Just(Defect::Tail),
        Just(Defect::ExtraTensor),
    ]
}

fn batch_case() -> impl Strategy<Value = BatchCase> {
    (
        prop::collection::vec(
            table_spec(0..=30, 1..=70).prop_map(|t| TableSpec { missing_error: t.missing_error && t.seed % 4 == 0, ..t }),
            1..=4,
        ),
        prop::collection::vec(batch_req(false), 1..=30),
        // A request with oddities at a random position (it may still be valid: the model says).
        prop::option::weighted(0.3, (any::<u8>(), batch_req(true))),
        prop_oneof![6 => Just(0usize), 1 => Just(8), 1 => Just(16), 1 => Just(64)],
        prop_oneof![60 => Just(None), 1 => prop::sample::select(vec![0usize, 8, 56, 60]).prop_map(Some)],
        prop_oneof![5 => Just(vec![]), 1 => prop::collection::vec((any::<u8>(), defect()), 1..=2)],
        prop_oneof![30 => Just(None), 10 => prop::sample::select(vec![0, 1, 2, 4]).prop_map(Some), 1 => Just(Some(-1))],
        any::<bool>(),
    )
        .prop_map(|(tables, mut requests, odd, extra, smaller, defects, num_threads, big_stats)| {
            if let Some((at, r)) = odd {
                let i = at as usize % (requests.len() + 1);
                requests.insert(i, r);
                requests.truncate(30);
            }
            BatchCase { tables, requests, extra, smaller, defects, num_threads, big_stats }
        })
}

proptest! {
    #![proptest_config(config(cases_from_env().saturating_mul(4)))]

    #[test]
    fn batch_equals_separate_calls_or_fails_naming_a_request(case in batch_case()) {
        run_batch(&case)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed cases
// ---------------------------------------------------------------------------------------------

#[test]
fn an_empty_batch_is_a_no_op() {
    // SAFETY: n = 0 with NULL requests is the documented no-op; opts NULL.
    let s = unsafe { strata_lookup_batch(null(), 0, null()) } as i32;
    assert_eq!(s, OK, "{}", last_error());
}

/// Found by the pooled property: a pooled request with a CUDA tensor and no bag (offsets of one
/// entry, no keys) was served, in a build without a CUDA driver, where the contract says CUDA
/// tensors get `STRATA_UNSUPPORTED_DEVICE` (the driver was checked only after an empty request
/// had returned). Without a driver it is now refused like any CUDA request. (With a driver,
/// device offsets of an empty request are still not read, so `offsets[0] = 1` there goes
/// unchecked.) The offsets are host memory labelled kDLCUDA, so the test runs only where no
/// driver could read them.
#[test]
fn empty_cuda_requests_without_a_driver_are_refused() {
    if cuda_present() {
        return; // the offsets below are host memory: only sound where no driver could read them
    }
    let t = Table::build(&TableSpec {
        dtype: Fl::F32,
        dim: 4,
        rows: 3,
        keyed: None,
        seed: 1,
        default_value: 0.0,
        missing_error: false,
        vpad: 0,
        storage: None,
    });
    let mut keys = [0i64; 1];
    let mut offsets = [1i64];
    let mut out = [0f32; 1];
    let (mut ks, mut os, mut outs) = ([0i64], [1i64], [0i64, 4]);
    let tensor = |data: *mut f32, shape: &mut [i64], dtype: DLDataType, dev: DLDeviceType| DLTensor {
        data: data.cast(),
        device: device(dev.0),
        ndim: shape.len() as i32,
        dtype,
        shape: shape.as_mut_ptr(),
        strides: null_mut(),
        byte_offset: 0,
    };
    let i64_ = DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 1 };
    let k = tensor(keys.as_mut_ptr().cast(), &mut ks, i64_, DLDeviceType::CPU);
    let o = tensor(offsets.as_mut_ptr().cast(), &mut os, i64_, DLDeviceType::CUDA);
    let mut d = tensor(out.as_mut_ptr(), &mut outs, Fl::F32.dl(), DLDeviceType::CPU);
    // SAFETY: every tensor describes a live local array of its shape (keys and out have no
    // elements); the offsets are host memory labelled kDLCUDA on a machine without a CUDA
    // driver, so nothing could read them as device memory.
    let s = unsafe { strata_lookup_pooled(t.ptr, &k, &o, null(), SUM, &mut d, null(), null_mut()) } as i32;
    assert_eq!(s, UNSUPPORTED_DEVICE, "status {} ({})", status_name(s), last_error());
    assert!(last_error().starts_with("offsets: device kDLCUDA:0"), "{}", last_error());
    // The plain lookup of no keys labelled kDLCUDA, likewise.
    let mut ks0 = [0i64];
    let kc = tensor(keys.as_mut_ptr().cast(), &mut ks0, i64_, DLDeviceType::CUDA);
    let mut outs0 = [0i64, 4];
    let mut d0 = tensor(out.as_mut_ptr(), &mut outs0, Fl::F32.dl(), DLDeviceType::CPU);
    // SAFETY: keys and out have no elements; nothing could read the keys as device memory.
    let s = unsafe { strata_lookup(t.ptr, &kc, &mut d0, null(), null_mut()) } as i32;
    assert_eq!(s, UNSUPPORTED_DEVICE, "status {} ({})", status_name(s), last_error());
    assert!(last_error().starts_with("keys: device kDLCUDA:0"), "{}", last_error());
}
