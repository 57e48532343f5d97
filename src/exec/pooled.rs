//! Pooled lookups on the CPU: one row per bag, accumulated in float32 in key order.
//!
//! Participants (the calling thread and pool workers) take groups of whole bags from a shared
//! counter, so each output row is written by one participant. Within a group, keys are handled
//! in chunks of [`CHUNK`]: a fill step turns the chunk's keys into row addresses (for a static
//! table through its index, prefetching buckets ahead; for other sources from rows staged on the
//! host), then the pooling kernel ([`crate::kernels::Pooler`]) adds each bag's run of rows,
//! `w · row`, into the bag's float32 accumulator, held in vector registers, prefetching rows
//! ahead. A bag's row is written (pooled, converted to `out`'s dtype) once its last key is
//! added, so rows stream through the accumulator and are never gathered into a buffer.

use super::cpu::{BYTES_PER_THREAD, Dense, Found, NO_ROW, Resolve};
use super::pool;
use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::kernels::{Divide, Pooler, RowFn, RowFormat, RowsOf, row_fn};
use crate::model::{Bags, LookupStats, PooledPlan, Pooling, RowSource, Rows, StaticTable, TierScratch, TieredTable};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Keys per chunk.
const CHUNK: usize = 256;
/// How many keys ahead a fill prefetches index buckets: one line each, so more of them fit in
/// the memory system's outstanding misses than rows do.
const BUCKET_AHEAD: usize = 32;
/// Keys a participant takes at a time (rounded to whole bags).
const TASK_KEYS: usize = 4096;
/// Keys of a group of bags up to which the group is pooled whole ([`group`]): more (a group
/// holding one huge bag) goes chunk by chunk ([`bags`]).
const GROUP_KEYS: usize = 4 * TASK_KEYS;

/// Turns the keys of flat indices `start ..` into the addresses of their rows (NULL = missing).
type Fill<'a> = dyn Fn(usize, &[u64], &mut [*const u8], &mut Scratch) -> Result<()> + Sync + 'a;

/// Per-participant buffers.
pub(super) struct Scratch {
    keys: Vec<u64>,
    offs: Vec<isize>,
    weights: Vec<f32>,
    ptrs: Vec<*const u8>,
    acc: Vec<f32>,
    /// The output of an empty bag.
    zeros: Vec<f32>,
    /// A group's bag starts for fixed hotness, as key indices into the call's keys.
    starts: Vec<usize>,
    /// A group's pooled rows, where they cannot be written into `out` directly.
    pooled: Vec<f32>,
    /// Rows staged on the host by fills that resolve through a [`RowSource`].
    staged: Vec<f32>,
    found: Vec<bool>,
    /// The tiers' own buffers, kept across chunks.
    tiers: TierScratch,
}

impl Scratch {
    /// Sizes the row buffers for rows of `dim` values (a batch's participant moves between
    /// tables of different dims).
    fn fit(&mut self, dim: usize) {
        if self.acc.len() != dim {
            self.acc.resize(dim, 0.0);
            self.zeros.resize(dim, 0.0);
        }
    }

    /// Frees the buffers a call grew past [`KEEP_BYTES`] (the fixed chunk buffers stay).
    fn trim(&mut self) {
        fn cap<T>(v: &mut Vec<T>) {
            if v.capacity() * std::mem::size_of::<T>() > KEEP_BYTES {
                *v = Vec::new();
            }
        }
        cap(&mut self.starts);
        cap(&mut self.pooled);
        cap(&mut self.staged);
        cap(&mut self.found);
        if self.acc.len() * 4 > KEEP_BYTES {
            (self.acc, self.zeros) = (Vec::new(), Vec::new());
        }
    }

    fn new(dim: usize) -> Self {
        Scratch {
            keys: vec![0; CHUNK],
            offs: vec![0; CHUNK],
            weights: vec![1.0; CHUNK],
            ptrs: vec![std::ptr::null(); CHUNK],
            acc: vec![0.0; dim],
            zeros: vec![0.0; dim],
            starts: Vec::new(),
            pooled: Vec::new(),
            staged: Vec::new(),
            found: Vec::new(),
            tiers: TierScratch::default(),
        }
    }
}

/// Bytes of a thread's [`Scratch`] kept for its next call: buffers grown past this by one call
/// (a group of many bags pooled into `pooled`, say) are freed when it ends.
const KEEP_BYTES: usize = 1 << 20;

thread_local! {
    /// This thread's pooled-lookup buffers, between calls: a small lookup, or a batch of many
    /// small ones, pays no allocation and no zeroing (four zeroed buffers a request cost a
    /// B = 1 batch of 26 tables more than its lookups did). Taken out while in use.
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's [`Scratch`] (a fresh one where it is already in use), then keeps
/// it for the thread's next call, its largest buffers freed. Tasks size its row buffers
/// ([`PooledTasks::run`]).
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut s = SCRATCH.with(Cell::take).unwrap_or_else(|| Box::new(Scratch::new(0)));
    let r = f(&mut s);
    s.trim();
    SCRATCH.with(|c| c.set(Some(s)));
    r
}

/// What a pooled lookup reads rows from.
pub(super) struct Rowset<'a> {
    format: RowFormat,
    dim: usize,
    default: &'a [f32],
    missing_error: bool,
    fill: &'a Fill<'a>,
    /// A dense store's rows (its first row's address, bytes between rows, row count): the
    /// kernel addresses them from the keys, and `fill` is not used.
    dense: Option<(*const u8, usize, usize)>,
    /// Whether whole groups of bags may be resolved at once ([`group`]); a tiered table's fill
    /// stages every row it resolves, so it goes chunk by chunk.
    groups: bool,
}

// SAFETY: `dense` only names the rows of a store the table owns (or adopted), which are read,
// never written, for as long as the lookup borrows the table.
unsafe impl Sync for Rowset<'_> {}

impl<'a> Rowset<'a> {
    /// A static table's rows, resolved by `fill` (from [`static_fill`] of the same table), or
    /// for a dense table by the kernel.
    pub(super) fn of_static(t: &'a StaticTable, fill: &'a Fill<'a>) -> Self {
        let st = t.store();
        let dense = match t.rows {
            Rows::Dense => Some((st.row_ptr_or_base(), st.stride_bytes(), st.rows())),
            Rows::Keyed(_) => None,
        };
        Rowset {
            format: t.format(),
            dim: t.dim(),
            default: t.default_row(),
            missing_error: RowSource::missing_is_error(t),
            fill,
            dense,
            groups: true,
        }
    }
}

/// The kernels of one pooled lookup: the pooling of its rows and the write of a pooled row.
#[derive(Clone, Copy)]
struct Kernels {
    pool: Pooler,
    write: RowFn,
}

/// A pooled lookup cut into tasks of whole bags (about [`TASK_KEYS`] keys each), for
/// participants that share them out (its own [`run`], or a batch's).
pub(super) struct PooledTasks<'a> {
    p: &'a PooledPlan,
    rows: &'a Rowset<'a>,
    k: Kernels,
    group: usize,
    /// Number of tasks.
    pub(super) tasks: usize,
    /// Bytes it reads or writes, whichever is more.
    pub(super) bytes: usize,
}

impl<'a> PooledTasks<'a> {
    pub(super) fn new(p: &'a PooledPlan, rows: &'a Rowset<'a>) -> Self {
        let bytes = p.nnz.saturating_mul(rows.format.row_bytes(rows.dim)).max(p.b * rows.dim * 4);
        let group = (TASK_KEYS * p.b / p.nnz.max(1)).clamp(1, p.b.max(1));
        let k =
            Kernels { pool: Pooler::new(rows.format, rows.dim), write: row_fn(FloatDtype::F32, p.out.dtype, p.out.col_stride == 1, false) };
        PooledTasks { p, rows, k, group, tasks: p.b.div_ceil(group), bytes }
    }

    /// Pools task `i`'s bags.
    pub(super) fn run(&self, i: usize, s: &mut Scratch, found: &mut Found) -> Result<()> {
        let (b0, b1) = (i * self.group, ((i + 1) * self.group).min(self.p.b));
        s.fit(self.rows.dim);
        if self.rows.groups && self.p.bag_start(b1) - self.p.bag_start(b0) <= GROUP_KEYS {
            group(self.p, self.rows, b0, b1, self.k, s, found)
        } else {
            bags(self.p, self.rows, b0, b1, self.k, s, found)
        }
    }
}

/// Runs `p` over `rows` on up to `p.threads` participants.
fn run(p: &PooledPlan, rows: &Rowset) -> Result<Found> {
    if p.b == 0 {
        return Ok(Found::default());
    }
    let t = PooledTasks::new(p, rows);
    let by_size = (t.bytes / BYTES_PER_THREAD).max(1);
    let threads = p.threads.min(by_size).min(t.tasks).max(1);
    let next = AtomicUsize::new(0);
    let parts = pool::run(threads, || -> Result<Found> {
        with_scratch(|s| {
            let mut found = Found::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= t.tasks {
                    break;
                }
                t.run(i, s, &mut found)?;
            }
            Ok(found)
        })
    });
    let mut total = Found::default();
    for part in parts {
        total = total.merge(part?);
    }
    Ok(total)
}

/// Writes bag `b`'s pooled row: `acc` (the bag's sum, or nothing for an empty bag) divided as
/// the pooling says by `wsum` (Σ w) or `w2sum` (Σ w²), converted to out's dtype.
fn finish(p: &PooledPlan, k: Kernels, b: usize, acc: Option<&mut [f32]>, zeros: &[f32], wsum: f32, w2sum: f32) {
    let row: &[f32] = match acc {
        None => zeros,
        Some(acc) => {
            let scale_by = match p.pooling {
                Pooling::Sum => None,
                Pooling::Mean => Some(wsum),
                Pooling::Sqrtn => Some(w2sum.sqrt()),
            };
            match scale_by {
                None => {}
                Some(0.0) => acc.fill(0.0),
                Some(d) => acc.iter_mut().for_each(|a| *a /= d),
            }
            acc
        }
    };
    let mut off = [0isize; 1];
    p.out.walk.fill(b, &mut off);
    // SAFETY: the plan validated out as [B, dim] with non-overlapping rows; b < B, and row holds
    // dim float32 values.
    unsafe {
        (k.write)(row.as_ptr() as *const u8, p.out.ptr.wrapping_offset(off[0] * p.out.dtype.size() as isize), zeros.len(), p.out.col_stride)
    };
}

/// Pools bags `b0 .. b1` (at most [`GROUP_KEYS`] keys) whole: their keys become rows (a dense
/// store's are addressed by the kernel, others through the fill), then one kernel call pools
/// every bag and writes its row, into `out` itself when `out` is float32 with contiguous rows.
fn group(p: &PooledPlan, rows: &Rowset, b0: usize, b1: usize, k: Kernels, s: &mut Scratch, found: &mut Found) -> Result<()> {
    let (klo, khi) = (p.bag_start(b0), p.bag_start(b1));
    let n = khi - klo;
    if s.keys.len() < n {
        s.keys.resize(n, 0);
        s.offs.resize(n, 0);
        s.weights.resize(n, 1.0);
        s.ptrs.resize(n, std::ptr::null());
    }
    // Contiguous 64-bit keys and contiguous weights (the common case) are read where the caller
    // put them; others are copied into the scratch buffers first.
    let (mut ptrs, mut own_keys, mut own_weights) =
        (std::mem::take(&mut s.ptrs), std::mem::take(&mut s.keys), std::mem::take(&mut s.weights));
    let keys: &[u64] = match p.keys.contiguous(klo, n) {
        Some(k) => k,
        None => {
            p.keys.read(klo, &mut own_keys[..n], &mut s.offs[..n]);
            &own_keys[..n]
        }
    };
    let weights: Option<&[f32]> = match &p.weights {
        None => None,
        Some(w) => match w.contiguous(klo, n) {
            Some(w) => Some(w),
            None => {
                w.read(klo, &mut own_weights[..n], &mut s.offs[..n]);
                Some(&own_weights[..n])
            }
        },
    };
    // A dense store's misses are counted after the pooling, while the group's keys are still in
    // cache (a count first read them cold, about a tenth of an in-cache call), unless this
    // participant has met misses already in this call: then first, so the group pools once.
    let first_miss_at = |keys: &[u64], found: &mut Found, at: Option<usize>| {
        if let Some(i) = at
            && found.first_miss.is_none_or(|(m, _)| klo + i < m)
        {
            found.first_miss = Some((klo + i, keys[i]));
        }
    };
    let (mut misses, counted) = match rows.dense {
        Some(_) if found.misses == 0 => (0, false),
        Some((_, _, count)) => {
            let count = count as u64;
            let misses = crate::kernels::keys::count_at_least(&keys[..n], count) as u64;
            if misses != 0 && rows.missing_error {
                first_miss_at(keys, found, keys[..n].iter().position(|&k| k >= count));
            }
            (misses, true)
        }
        None => {
            if let Err(e) = (rows.fill)(klo, keys, &mut ptrs[..n], s) {
                (s.ptrs, s.keys, s.weights) = (ptrs, own_keys, own_weights);
                return Err(e);
            }
            let misses = ptrs[..n].iter().filter(|q| q.is_null()).count() as u64;
            if misses != 0 && rows.missing_error {
                first_miss_at(keys, found, ptrs[..n].iter().position(|q| q.is_null()));
            }
            (misses, true)
        }
    };
    // The plan's offsets serve as the bag starts; fixed hotness makes them here.
    let mut own_starts = std::mem::take(&mut s.starts);
    let (starts, first): (&[usize], usize) = match &p.bags {
        Bags::Offsets(o) => (&o[b0..=b1], klo),
        Bags::Fixed(_) => {
            own_starts.clear();
            own_starts.extend((b0..=b1).map(|b| p.bag_start(b)));
            (&own_starts, klo)
        }
    };
    let divide = match p.pooling {
        Pooling::Sum => Divide::Nothing,
        Pooling::Mean => Divide::WeightSum,
        Pooling::Sqrtn => Divide::RootSquareSum,
    };
    let dim = rows.dim;
    let direct = match p.out.walk.linear_stride() {
        Some(stride) if p.out.col_stride == 1 && stride >= 0 => Some(stride as usize),
        _ => None,
    };
    // One kernel call over the group; `missing` false only where no key is missing, or (a
    // dense store, not yet counted) where the kernel's stand-in rows are pooled again below.
    let pool = |missing: bool, s: &mut Scratch| {
        let source = match rows.dense {
            Some((base, stride, count)) => RowsOf::Dense { base, stride, rows: count, keys },
            None => RowsOf::Ptrs(&ptrs[..n]),
        };
        match direct {
            // SAFETY: the rows are whole rows of the store or the fill's (as in `bags`); out was
            // validated as [B, dim] with non-overlapping rows, row b at b * stride elements, so
            // rows b0 .. b1 are writable and overlap neither the table nor the keys. A dense
            // store's key past it, with `missing` false, reads a row of the store
            // (`Pooler::pool_bags`).
            Some(stride) => unsafe {
                let out = p.out.ptr.wrapping_add(b0 * stride * p.out.dtype.size());
                k.pool.pool_bags(source, missing, starts, first, weights, rows.default, divide, out, p.out.dtype, stride)
            },
            None => {
                // Strided columns: pooled into s.pooled (nb x dim float32), then written row by row.
                let nb = b1 - b0;
                s.pooled.resize(nb * dim, 0.0);
                // SAFETY: as above, with the pooled rows written into s.pooled.
                unsafe {
                    k.pool.pool_bags(
                        source,
                        missing,
                        starts,
                        first,
                        weights,
                        rows.default,
                        divide,
                        s.pooled.as_mut_ptr() as *mut u8,
                        FloatDtype::F32,
                        dim,
                    )
                };
                let size = p.out.dtype.size() as isize;
                let mut off = [0isize; 1];
                for j in 0..nb {
                    p.out.walk.fill(b0 + j, &mut off);
                    // SAFETY: the plan validated out as [B, dim] with non-overlapping rows; row
                    // b0 + j < B; the source holds dim float32 values.
                    unsafe {
                        (k.write)(
                            s.pooled[j * dim..].as_ptr() as *const u8,
                            p.out.ptr.wrapping_offset(off[0] * size),
                            dim,
                            p.out.col_stride,
                        )
                    };
                }
            }
        }
    };
    pool(misses != 0, s);
    if !counted && let Some((_, _, count)) = rows.dense {
        let count = count as u64;
        misses = crate::kernels::keys::count_at_least(&keys[..n], count) as u64;
        if misses != 0 {
            if rows.missing_error {
                first_miss_at(keys, found, keys[..n].iter().position(|&k| k >= count));
            }
            pool(true, s);
        }
    }
    found.misses += misses;
    found.hits += n as u64 - misses;
    (s.ptrs, s.keys, s.weights, s.starts) = (ptrs, own_keys, own_weights, own_starts);
    Ok(())
}

/// Pools bags `b0 .. b1`: chunk by chunk, the keys become row addresses (the fill), then each
/// bag's run of rows in the chunk goes through the pooling kernel in one call; a bag whose last
/// key is in the chunk is written.
fn bags(p: &PooledPlan, rows: &Rowset, b0: usize, b1: usize, k: Kernels, s: &mut Scratch, found: &mut Found) -> Result<()> {
    let (klo, khi) = (p.bag_start(b0), p.bag_start(b1));
    let needs_totals = p.pooling != Pooling::Sum;
    let mut b = b0;
    // Whether `s.acc` holds the partial sum of bag b (its keys so far).
    let mut started = false;
    let (mut wsum, mut w2sum) = (0f32, 0f32);
    let mut start = klo;
    while start < khi {
        let n = CHUNK.min(khi - start);
        let end = start + n;
        p.keys.read(start, &mut s.keys[..n], &mut s.offs[..n]);
        if let Some(w) = &p.weights {
            w.read(start, &mut s.weights[..n], &mut s.offs[..n]);
        }
        let (mut ptrs, keys) = (std::mem::take(&mut s.ptrs), std::mem::take(&mut s.keys));
        if let Err(e) = (rows.fill)(start, &keys[..n], &mut ptrs[..n], s) {
            (s.ptrs, s.keys) = (ptrs, keys);
            return Err(e);
        }
        let mut misses = 0;
        for (i, q) in ptrs[..n].iter().enumerate() {
            if q.is_null() {
                misses += 1;
                if rows.missing_error && found.first_miss.is_none_or(|(m, _)| start + i < m) {
                    found.first_miss = Some((start + i, keys[i]));
                }
            }
        }
        s.keys = keys;
        found.misses += misses;
        found.hits += n as u64 - misses;
        let weights = p.weights.as_ref().map(|_| &s.weights[..n]);
        // Every bag with keys in this chunk, in order.
        loop {
            let (bag_lo, bag_hi) = (p.bag_start(b), p.bag_start(b + 1));
            let (lo, hi) = (bag_lo.max(start) - start, bag_hi.min(end) - start);
            if lo < hi {
                // SAFETY: the fill gave, for each key of the chunk, the address of a whole row of
                // one row of rows.format, or NULL for a missing key.
                unsafe { k.pool.add(&mut s.acc, !started, &ptrs[..n], lo, hi, weights, rows.default) };
                started = true;
                if needs_totals {
                    match weights {
                        Some(w) => w[lo..hi].iter().for_each(|&x| {
                            wsum += x;
                            w2sum += x * x;
                        }),
                        None => (lo..hi).for_each(|_| {
                            wsum += 1.0;
                            w2sum += 1.0;
                        }),
                    }
                }
            }
            if bag_hi > end {
                break; // bag b goes on in the next chunk
            }
            finish(p, k, b, started.then_some(&mut s.acc[..]), &s.zeros, wsum, w2sum);
            (started, wsum, w2sum) = (false, 0.0, 0.0);
            b += 1;
            if b == b1 {
                break;
            }
        }
        s.ptrs = ptrs;
        start = end;
    }
    // Bags with no keys after the last key (or in a group without keys).
    while b < b1 {
        finish(p, k, b, None, &s.zeros, 0.0, 0.0);
        b += 1;
    }
    Ok(())
}

/// Fills row addresses of a static table's store: its keys resolved through its index (with
/// the bucket of the key [`BUCKET_AHEAD`] further prefetched) or, for a dense table, by range.
pub(super) fn static_fill(t: &StaticTable) -> impl Fn(usize, &[u64], &mut [*const u8], &mut Scratch) -> Result<()> + Sync + '_ {
    move |_, keys, ptrs, _| {
        match &t.rows {
            Rows::Dense => resolve_rows(t, &Dense(t.len() as u64), keys, ptrs),
            Rows::Keyed(ix) => resolve_rows(t, ix, keys, ptrs),
        }
        Ok(())
    }
}

#[inline(always)]
fn resolve_rows<R: Resolve>(t: &StaticTable, r: &R, keys: &[u64], ptrs: &mut [*const u8]) {
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
    let fill = static_fill(t);
    missing(p, run(p, &Rowset::of_static(t, &fill))?)
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
    let found = missing(
        p,
        run(
            p,
            &Rowset {
                format: FloatDtype::F32.into(),
                dim,
                default: t.default_row(),
                missing_error: t.missing_is_error(),
                fill: &fill,
                dense: None,
                groups: false,
            },
        )?,
    )?;
    let (vh, ph) = (vh.into_inner(), ph.into_inner());
    t.record_lookup(p.nnz as u64, vh, ph, found.misses);
    Ok(LookupStats { hits: found.hits, misses: found.misses, volatile_hits: vh, persistent_hits: ph })
}

/// Pools rows already at hand for every key, as a distributed table's pooled lookup does after
/// its collective gather: `row(i)` is the address of key `i`'s row (a whole row of `dim` values
/// stored as `format`), or NULL for a missing key, which contributes `default` (`dim` float32)
/// and counts as a miss.
#[cfg(feature = "mpi")]
pub(crate) fn pool_gathered(
    row: &(dyn Fn(usize) -> *const u8 + Sync),
    format: RowFormat,
    dim: usize,
    default: &[f32],
    p: &PooledPlan,
) -> Result<Found> {
    let fill = move |start: usize, keys: &[u64], ptrs: &mut [*const u8], _: &mut Scratch| -> Result<()> {
        for (i, q) in ptrs[..keys.len()].iter_mut().enumerate() {
            *q = row(start + i);
        }
        Ok(())
    };
    run(p, &Rowset { format, dim, default, missing_error: false, fill: &fill, dense: None, groups: true })
}
