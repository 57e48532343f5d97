//! Pooled lookups on the CPU: one row per bag, accumulated in float32 in key order.
//!
//! Participants (the calling thread and pool workers) take groups of whole bags from a shared
//! counter, so each output row is written by one participant. Within a group, keys are handled
//! in chunks of [`CHUNK`]: a fill step turns the chunk's keys into row addresses (for a static
//! table through its index, prefetching buckets ahead; for other sources from rows staged on the
//! host), then the accumulation prefetches rows [`AHEAD`] keys ahead while it adds `w · row`
//! into the bag's float32 accumulator. A bag's row is written (pooled, converted to `out`'s
//! dtype) once its last key is added, so rows stream through the accumulator and are never
//! gathered into a buffer.

use super::cpu::{BYTES_PER_THREAD, Dense, Found, NO_ROW, Resolve, row_fn};
use super::pool;
use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::model::{LookupStats, PooledPlan, Pooling, RowSource, Rows, StaticTable, TierScratch, TieredTable};
use std::sync::atomic::AtomicU64;
use crate::util::prefetch;
use half::{bf16, f16};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys per chunk.
const CHUNK: usize = 256;
/// How many keys ahead rows are prefetched.
const AHEAD: usize = 8;
/// How many keys ahead a fill prefetches index buckets: one line each, so more of them fit in
/// the memory system's outstanding misses than rows do.
const BUCKET_AHEAD: usize = 32;
/// Keys a participant takes at a time (rounded to whole bags).
const TASK_KEYS: usize = 4096;

/// Turns the keys of flat indices `start ..` into the addresses of their rows (NULL = missing).
type Fill<'a> = dyn Fn(usize, &[u64], &mut [*const u8], &mut Scratch) -> Result<()> + Sync + 'a;

/// Per-participant buffers.
pub(crate) struct Scratch {
    keys: Vec<u64>,
    offs: Vec<isize>,
    weights: Vec<f32>,
    ptrs: Vec<*const u8>,
    acc: Vec<f32>,
    /// Rows staged on the host by fills that resolve through a [`RowSource`].
    staged: Vec<f32>,
    found: Vec<bool>,
    /// The tiers' own buffers, kept across chunks.
    tiers: TierScratch,
}

impl Scratch {
    fn new(dim: usize) -> Self {
        Scratch {
            keys: vec![0; CHUNK],
            offs: vec![0; CHUNK],
            weights: vec![1.0; CHUNK],
            ptrs: vec![std::ptr::null(); CHUNK],
            acc: vec![0.0; dim],
            staged: Vec::new(),
            found: Vec::new(),
            tiers: TierScratch::default(),
        }
    }
}

/// Adds `w · row` to `acc`, reading `row` (dim values of `dtype`) at `src`.
///
/// # Safety
/// `src` must hold `acc.len()` aligned values of `dtype`.
#[inline(always)]
unsafe fn accumulate(dtype: FloatDtype, src: *const u8, w: f32, acc: &mut [f32]) {
    let dim = acc.len();
    match dtype {
        FloatDtype::F32 => {
            // SAFETY: the caller guarantees dim aligned values of dtype at src.
            let row = unsafe { std::slice::from_raw_parts(src as *const f32, dim) };
            #[cfg(target_arch = "x86_64")]
            if avx() {
                // SAFETY: the CPU has AVX (checked once, at run time).
                unsafe { add_scaled_avx(acc, row, w) };
                return;
            }
            add_scaled(acc, row, w);
        }
        FloatDtype::F16 => {
            // SAFETY: as above.
            let row = unsafe { std::slice::from_raw_parts(src as *const f16, dim) };
            for (a, x) in acc.iter_mut().zip(row) {
                *a += w * x.to_f32();
            }
        }
        FloatDtype::BF16 => {
            // SAFETY: as above.
            let row = unsafe { std::slice::from_raw_parts(src as *const bf16, dim) };
            for (a, x) in acc.iter_mut().zip(row) {
                *a += w * x.to_f32();
            }
        }
    }
}

/// `acc += w · row`, element by element (a multiply, then an add: no fused multiply-add, so
/// every build and CPU rounds alike).
#[inline(always)]
fn add_scaled(acc: &mut [f32], row: &[f32], w: f32) {
    for (a, x) in acc.iter_mut().zip(row) {
        *a += w * *x;
    }
}

/// [`add_scaled`] compiled for AVX: twice the lanes of the baseline x86-64 build, the same
/// arithmetic (AVX alone brings no fused multiply-add).
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn add_scaled_avx(acc: &mut [f32], row: &[f32], w: f32) {
    add_scaled(acc, row, w)
}

/// Whether this CPU has AVX (detected once).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn avx() -> bool {
    static AVX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX.get_or_init(|| std::arch::is_x86_feature_detected!("avx"))
}

/// Hints the CPU to fetch a row of `bytes` at `p` (NULL: nothing).
#[inline(always)]
fn prefetch_row(p: *const u8, bytes: usize) {
    if p.is_null() {
        return;
    }
    let mut off = 0;
    while off < bytes.min(1024) {
        prefetch(p.wrapping_add(off));
        off += 64;
    }
}

/// What a pooled lookup reads rows from.
struct Rowset<'a> {
    dtype: FloatDtype,
    dim: usize,
    default: &'a [f32],
    missing_error: bool,
    fill: &'a Fill<'a>,
}

/// Runs `p` over `rows` on up to `p.threads` participants.
fn run(p: &PooledPlan, rows: &Rowset) -> Result<Found> {
    if p.b == 0 {
        return Ok(Found::default());
    }
    let bytes = p.nnz.saturating_mul(rows.dim * rows.dtype.size()).max(p.b * rows.dim * 4);
    let by_size = (bytes / BYTES_PER_THREAD).max(1);
    let group = (TASK_KEYS * p.b / p.nnz.max(1)).clamp(1, p.b);
    let threads = p.threads.min(by_size).min(p.b.div_ceil(group)).max(1);
    let kernel = row_fn(FloatDtype::F32, p.out.dtype, p.out.col_stride == 1, false);
    let next = AtomicUsize::new(0);
    let parts = pool::run(threads, || -> Result<Found> {
        let mut s = Scratch::new(rows.dim);
        let mut found = Found::default();
        loop {
            let b0 = next.fetch_add(group, Ordering::Relaxed);
            if b0 >= p.b {
                break;
            }
            bags(p, rows, b0, (b0 + group).min(p.b), kernel, &mut s, &mut found)?;
        }
        Ok(found)
    });
    let mut total = Found::default();
    for part in parts {
        let f = part?;
        total.hits += f.hits;
        total.misses += f.misses;
        total.first_miss = match (total.first_miss, f.first_miss) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        };
    }
    Ok(total)
}

/// Pools bags `b0 .. b1`.
fn bags(
    p: &PooledPlan,
    rows: &Rowset,
    b0: usize,
    b1: usize,
    kernel: super::cpu::RowFn,
    s: &mut Scratch,
    found: &mut Found,
) -> Result<()> {
    let (dim, row_bytes) = (rows.dim, rows.dim * rows.dtype.size());
    let out_size = p.out.dtype.size() as isize;
    let (klo, khi) = (p.bag_start(b0), p.bag_start(b1));
    let mut b = b0;
    let mut bag_end = p.bag_start(b + 1);
    let (mut wsum, mut w2sum) = (0f32, 0f32);
    s.acc.fill(0.0);
    let mut out_off = [0isize; 1];
    // Writes bag b's pooled row and starts the next bag.
    let mut flush = |b: usize, acc: &mut [f32], wsum: &mut f32, w2sum: &mut f32| {
        let scale_by = match p.pooling {
            Pooling::Sum => None,
            Pooling::Mean => Some(*wsum),
            Pooling::Sqrtn => Some(w2sum.sqrt()),
        };
        match scale_by {
            None => {}
            Some(0.0) => acc.fill(0.0),
            Some(d) => acc.iter_mut().for_each(|a| *a /= d),
        }
        p.out.walk.fill(b, &mut out_off);
        // SAFETY: the plan validated out as [B, dim] with non-overlapping rows; b < B, and acc
        // holds dim float32 values.
        unsafe { kernel(acc.as_ptr() as *const u8, p.out.ptr.wrapping_offset(out_off[0] * out_size), dim, p.out.col_stride) };
        acc.fill(0.0);
        *wsum = 0.0;
        *w2sum = 0.0;
    };
    let mut start = klo;
    while start < khi {
        let n = CHUNK.min(khi - start);
        p.keys.read(start, &mut s.keys[..n], &mut s.offs[..n]);
        match &p.weights {
            Some(w) => w.read(start, &mut s.weights[..n], &mut s.offs[..n]),
            None => s.weights[..n].fill(1.0),
        }
        let (mut ptrs, keys) = (std::mem::take(&mut s.ptrs), std::mem::take(&mut s.keys));
        let filled = (rows.fill)(start, &keys[..n], &mut ptrs[..n], s);
        s.keys = keys;
        filled?;
        for &q in &ptrs[..n.min(AHEAD)] {
            prefetch_row(q, row_bytes);
        }
        for i in 0..n {
            let j = start + i;
            while j >= bag_end {
                flush(b, &mut s.acc, &mut wsum, &mut w2sum);
                b += 1;
                bag_end = p.bag_start(b + 1);
            }
            if i + AHEAD < n {
                prefetch_row(ptrs[i + AHEAD], row_bytes);
            }
            let w = s.weights[i];
            if ptrs[i].is_null() {
                found.misses += 1;
                if rows.missing_error && found.first_miss.is_none_or(|(m, _)| j < m) {
                    found.first_miss = Some((j, s.keys[i]));
                }
                // SAFETY: the default row holds dim float32 values.
                unsafe { accumulate(FloatDtype::F32, rows.default.as_ptr() as *const u8, w, &mut s.acc) };
            } else {
                found.hits += 1;
                // SAFETY: the fill gave the address of a whole row of dim values of rows.dtype.
                unsafe { accumulate(rows.dtype, ptrs[i], w, &mut s.acc) };
            }
            wsum += w;
            w2sum += w * w;
        }
        s.ptrs = ptrs;
        start += n;
    }
    while b < b1 {
        flush(b, &mut s.acc, &mut wsum, &mut w2sum);
        b += 1;
    }
    Ok(())
}

/// Fills row addresses of a static table's store, resolving keys through `r` with the bucket
/// of the key [`BUCKET_AHEAD`] further prefetched.
fn static_fill<'a, R: Resolve + Sync>(t: &'a StaticTable, r: &'a R) -> impl Fn(usize, &[u64], &mut [*const u8], &mut Scratch) -> Result<()> + Sync + 'a {
    move |_, keys, ptrs, _| {
        for &k in &keys[..keys.len().min(BUCKET_AHEAD)] {
            r.prefetch(k);
        }
        for i in 0..keys.len() {
            if i + BUCKET_AHEAD < keys.len() {
                r.prefetch(keys[i + BUCKET_AHEAD]);
            }
            let row = r.row(keys[i]);
            ptrs[i] = if row == NO_ROW { std::ptr::null() } else { t.store().row_ptr(row) };
        }
        Ok(())
    }
}

/// The error for a missing key when the table's missing keys are errors.
fn missing(p: &PooledPlan, found: Found) -> Result<Found> {
    match found.first_miss {
        Some((index, key)) => Err(Error::KeyNotFound { key: p.key_dtype.value(key), index }),
        None => Ok(found),
    }
}

/// A pooled lookup on a static table.
pub(crate) fn pool_static(t: &StaticTable, p: &PooledPlan) -> Result<Found> {
    let missing_error = RowSource::missing_is_error(t);
    let found = match &t.rows {
        Rows::Dense => {
            let r = Dense(t.len() as u64);
            let fill = static_fill(t, &r);
            run(p, &Rowset { dtype: t.dtype(), dim: t.dim(), default: t.default_row(), missing_error, fill: &fill })?
        }
        Rows::Keyed(ix) => {
            let fill = static_fill(t, ix);
            run(p, &Rowset { dtype: t.dtype(), dim: t.dim(), default: t.default_row(), missing_error, fill: &fill })?
        }
    };
    missing(p, found)
}

/// A pooled lookup on a parameter server's table, counted in its cumulative stats like any
/// lookup: each chunk's keys go through the tiers (volatile, then persistent, promoting as the
/// configuration says), then are pooled.
pub(crate) fn pool_tiered(t: &TieredTable, p: &PooledPlan) -> Result<LookupStats> {
    let dim = t.dim();
    let (vh, ph) = (AtomicU64::new(0), AtomicU64::new(0));
    let fill = |_: usize, keys: &[u64], ptrs: &mut [*const u8], s: &mut Scratch| -> Result<()> {
        let n = keys.len();
        s.staged.resize(n * dim, 0.0);
        s.found.resize(n, false);
        let (v, q) = t.fetch(keys, &mut s.staged[..n * dim], &mut s.found[..n], &mut s.tiers)?;
        vh.fetch_add(v, Ordering::Relaxed);
        ph.fetch_add(q, Ordering::Relaxed);
        for (i, q) in ptrs[..n].iter_mut().enumerate() {
            *q = if s.found[i] { s.staged[i * dim..].as_ptr() as *const u8 } else { std::ptr::null() };
        }
        Ok(())
    };
    let found = missing(p, run(p, &Rowset { dtype: FloatDtype::F32, dim, default: t.default_row(), missing_error: t.missing_is_error(), fill: &fill })?)?;
    let (vh, ph) = (vh.into_inner(), ph.into_inner());
    t.record_lookup(p.nnz as u64, vh, ph, found.misses);
    Ok(LookupStats { hits: found.hits, misses: found.misses, volatile_hits: vh, persistent_hits: ph })
}

/// Pools rows already gathered for every key (`rows`: nnz x dim float32, misses holding the
/// default row), as a distributed table's pooled lookup does after its collective gather.
pub(crate) fn pool_gathered(rows: &[f32], dim: usize, p: &PooledPlan) -> Result<()> {
    let fill = move |start: usize, keys: &[u64], ptrs: &mut [*const u8], _: &mut Scratch| -> Result<()> {
        for (i, q) in ptrs[..keys.len()].iter_mut().enumerate() {
            *q = rows[(start + i) * dim..].as_ptr() as *const u8;
        }
        Ok(())
    };
    run(p, &Rowset { dtype: FloatDtype::F32, dim, default: &[], missing_error: false, fill: &fill })?;
    Ok(())
}
