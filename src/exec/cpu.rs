//! The CPU gather: keys -> rows -> output, in chunks, on the calling thread and pool workers.
//!
//! Each participant takes runs of [`TASK`] keys from a shared counter and processes them in
//! chunks of [`CHUNK`]: it reads the keys in canonical form, resolves them all to rows in one
//! pass (index buckets prefetched ahead), then copies (or converts) the rows into `out` in a
//! second pass that prefetches rows ahead of the copy. Large outputs are written with
//! non-temporal stores. Rows of one call go to distinct places in `out` (checked by the
//! caller), so participants never write the same bytes.

use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::exec::pool;
use crate::kernels::{RowFn, prefetch_row as prefetch_lines, row_fn, store_fence};
use crate::model::{KeySource, LookupOptions, LookupStats, MissingKey, OutTarget, Plan, Rows, StaticTable, plan};
use crate::storage::index::KeyIndex;
use dlpark::ffi::DLTensor;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys per chunk (stack buffers hold one chunk).
const CHUNK: usize = 256;
/// The chunk of lookups of at most this many keys.
const SMALL: usize = 16;
/// Keys a participant takes from the shared counter at a time.
const TASK: usize = 2048;
/// Output bytes below which one more participant is not worth waking.
pub(crate) const BYTES_PER_THREAD: usize = 256 * 1024;
/// Output bytes from which rows are written with non-temporal (streaming) stores: an output
/// this large will not stay in cache, and streaming skips the read-for-ownership of each line.
const STREAM_BYTES: usize = 4 << 20;
/// Cache lines of rows a thread keeps in flight ahead of its copies (see [`rows_ahead`]).
const LINES_IN_FLIGHT: usize = 80;
pub(crate) const NO_ROW: usize = usize::MAX;

impl OutTarget {
    /// Writes float32 rows into the output rows of flat key indices `start ..`: row `i` from
    /// `rows[i * dim ..]` where `present[i]`, else `default`. `offs` is scratch (at least
    /// `present.len()` long). Used by tables that assemble rows in a staging buffer.
    ///
    /// # Safety
    /// The target must come from a validated plan, and `start + present.len()` must not exceed
    /// its key count.
    pub(crate) unsafe fn write_f32_rows(
        &self,
        start: usize,
        dim: usize,
        rows: &[f32],
        present: &[bool],
        default: &[f32],
        offs: &mut [isize],
    ) {
        let n = present.len();
        let kernel = row_fn(FloatDtype::F32, self.dtype, self.col_stride == 1, false);
        self.walk.fill(start, &mut offs[..n]);
        let size = self.dtype.size() as isize;
        for i in 0..n {
            let src = if present[i] { rows[i * dim..(i + 1) * dim].as_ptr() } else { default.as_ptr() };
            // SAFETY: src holds dim f32 values; dst is key i's validated output row.
            unsafe { kernel(src as *const u8, self.ptr.wrapping_offset(offs[i] * size), dim, self.col_stride) };
        }
    }
}

/// One lookup, validated by the caller (who keeps the key source and output target).
pub struct Gather<'a> {
    pub table: &'a StaticTable,
    pub keys: &'a KeySource,
    pub out: &'a OutTarget,
    pub n: usize,
    pub threads: usize,
}

// SAFETY: the raw pointers are only dereferenced inside `run`, within the caller's call, on
// disjoint output rows (validated by `lookup`).
unsafe impl Sync for Gather<'_> {}

/// What a gather found.
#[derive(Debug, Default, Clone, Copy)]
pub struct Found {
    pub hits: u64,
    pub misses: u64,
    /// The lowest flat index of a missing key and that key, when missing keys are errors.
    pub first_miss: Option<(usize, u64)>,
}

impl Found {
    /// What two participants found together.
    pub(crate) fn merge(self, b: Found) -> Found {
        Found {
            hits: self.hits + b.hits,
            misses: self.misses + b.misses,
            first_miss: match (self.first_miss, b.first_miss) {
                (Some(x), Some(y)) => Some(if x.0 <= y.0 { x } else { y }),
                (x, y) => x.or(y),
            },
        }
    }
}

/// The kernels of one lookup: for table rows, and for the (float32) default row.
#[derive(Clone, Copy)]
pub(super) struct Kernels {
    row: RowFn,
    default: RowFn,
}

/// A gather cut into tasks of [`TASK`] keys, for participants that share them out (its own
/// [`Gather::run`], or a batch's).
pub(super) struct GatherTasks<'a> {
    gather: &'a Gather<'a>,
    k: Kernels,
    track_first: bool,
    /// Number of tasks.
    pub(super) tasks: usize,
    /// Bytes of rows it writes.
    pub(super) bytes: usize,
}

impl GatherTasks<'_> {
    /// Gathers task `i`'s keys. The participant issues [`store_fence`] before it hands back.
    pub(super) fn run(&self, i: usize, found: &mut Found) {
        let lo = i * TASK;
        self.gather.range(lo, (lo + TASK).min(self.gather.n), &self.k, self.track_first, found)
    }
}

impl<'a> Gather<'a> {
    /// This gather's tasks.
    pub(super) fn tasks(&'a self) -> GatherTasks<'a> {
        let row_bytes = self.table.dim() * self.out.dtype.size();
        let bytes = self.n.saturating_mul(row_bytes);
        let stream = bytes >= STREAM_BYTES;
        let contiguous = self.out.col_stride == 1;
        let k = Kernels {
            row: row_fn(self.table.format(), self.out.dtype, contiguous, stream),
            default: row_fn(FloatDtype::F32, self.out.dtype, contiguous, stream),
        };
        GatherTasks { gather: self, k, track_first: self.table.missing == MissingKey::Error, tasks: self.n.div_ceil(TASK), bytes }
    }

    /// Runs the gather on up to `threads` participants and sums what they found.
    pub fn run(&self) -> Found {
        let t = self.tasks();
        let by_size = (t.bytes / BYTES_PER_THREAD).max(1);
        let threads = self.threads.min(by_size).min(t.tasks.max(1)).max(1);
        if threads == 1 {
            let mut f = Found::default();
            self.range(0, self.n, &t.k, t.track_first, &mut f);
            store_fence();
            return f;
        }
        let next = AtomicUsize::new(0);
        let parts = pool::run(threads, || {
            let mut f = Found::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= t.tasks {
                    break;
                }
                t.run(i, &mut f);
            }
            store_fence();
            f
        });
        parts.into_iter().fold(Found::default(), Found::merge)
    }

    /// Gathers flat key indices `lo..hi`.
    fn range(&self, lo: usize, hi: usize, rowf: &Kernels, track_first: bool, found: &mut Found) {
        match &self.table.rows {
            // A few keys (online inference, batches of many small requests) use small buffers:
            // zeroing the full chunk's stack buffers would cost more than the lookup.
            Rows::Dense if hi - lo <= SMALL => {
                self.range_with::<_, SMALL>(&Dense(self.table.store.rows() as u64), lo, hi, rowf, track_first, found)
            }
            Rows::Keyed(ix) if hi - lo <= SMALL => self.range_with::<_, SMALL>(ix, lo, hi, rowf, track_first, found),
            Rows::Dense => self.range_with::<_, CHUNK>(&Dense(self.table.store.rows() as u64), lo, hi, rowf, track_first, found),
            Rows::Keyed(ix) => self.range_with::<_, CHUNK>(ix, lo, hi, rowf, track_first, found),
        }
    }

    /// The gather loop, two passes per chunk: the first resolves every key of the chunk to its
    /// row (a keyed index hashes each key once and prefetches its bucket 16 keys ahead, so many
    /// bucket misses are in flight at once; [`KeyIndex::get_batch`]), the second copies the
    /// rows, prefetching each row a few keys ahead. Kept apart, each pass
    /// keeps many misses of one kind in flight; interleaved in one loop (bucket of key i + 12,
    /// row of key i + 6, copy of row i), a bucket that had not arrived stalled the copies behind
    /// it (README, "Performance").
    #[inline(always)]
    fn range_with<R: Resolve, const N: usize>(&self, r: &R, lo: usize, hi: usize, k: &Kernels, track_first: bool, found: &mut Found) {
        let store = &self.table.store;
        let dim = self.table.dim();
        let row_bytes = store.format().row_bytes(dim);
        let ahead = rows_ahead(row_bytes);
        let out_size = self.out.dtype.size();
        let default = self.table.default_row_ptr();
        let mut offs = [0isize; N];
        let mut keys = [0u64; N];
        let mut rows = [0usize; N];
        let mut start = lo;
        while start < hi {
            let n = N.min(hi - start);
            self.keys.read(start, &mut keys[..n], &mut offs[..n]);
            r.resolve_all(&keys[..n], &mut rows[..n]);
            self.out.walk.fill(start, &mut offs[..n]);
            for &row in &rows[..n.min(ahead)] {
                prefetch_row(store, row, row_bytes);
            }
            for i in 0..n {
                if i + ahead < n {
                    prefetch_row(store, rows[i + ahead], row_bytes);
                }
                let dst = self.out.ptr.wrapping_offset(offs[i] * out_size as isize);
                if rows[i] == NO_ROW {
                    found.misses += 1;
                    if track_first && found.first_miss.is_none_or(|(j, _)| start + i < j) {
                        found.first_miss = Some((start + i, keys[i]));
                    }
                    // SAFETY: `default` is the table's default row, dim float32 values (the
                    // source dtype of k.default); dst is this key's output row, which the plan
                    // validated to lie inside `out`, not to overlap other rows, and not to
                    // overlap the keys or the table.
                    unsafe { (k.default)(default, dst, dim, self.out.col_stride) };
                } else {
                    found.hits += 1;
                    // SAFETY: rows[i] came from the resolver, so it is below the store's row
                    // count (Dense checks key < rows; an index maps keys only to rows of this
                    // store), and row_ptr gives its dim elements of the table dtype; dst is
                    // this key's output row, validated as above.
                    unsafe { (k.row)(store.row_ptr(rows[i]), dst, dim, self.out.col_stride) };
                }
            }
            start += n;
        }
    }
}

/// How many keys ahead of the copy a row is prefetched: about [`LINES_IN_FLIGHT`] cache lines
/// of rows in flight per thread, between 4 and 16 rows.
#[inline(always)]
fn rows_ahead(row_bytes: usize) -> usize {
    (LINES_IN_FLIGHT / row_bytes.div_ceil(64).clamp(1, 16)).clamp(4, 16)
}

/// Maps canonical keys to row numbers ([`NO_ROW`] when absent).
pub(crate) trait Resolve {
    /// Hints the CPU to fetch what resolving `key` will read.
    fn prefetch(&self, key: u64);
    /// The row of `key`, or [`NO_ROW`].
    fn row(&self, key: u64) -> usize;
    /// The rows of `keys` into `rows` (as long as `keys`), with what each key reads
    /// prefetched ahead of resolving it.
    fn resolve_all(&self, keys: &[u64], rows: &mut [usize]);
}

/// Dense tables: key `k` is row `k` below the row count.
pub(crate) struct Dense(pub(crate) u64);

impl Resolve for Dense {
    #[inline(always)]
    fn prefetch(&self, _: u64) {}
    #[inline(always)]
    fn row(&self, key: u64) -> usize {
        if key < self.0 { key as usize } else { NO_ROW }
    }
    #[inline(always)]
    fn resolve_all(&self, keys: &[u64], rows: &mut [usize]) {
        for (row, &key) in rows.iter_mut().zip(keys) {
            *row = self.row(key);
        }
    }
}

impl Resolve for KeyIndex {
    #[inline(always)]
    fn prefetch(&self, key: u64) {
        KeyIndex::prefetch(self, key)
    }
    #[inline(always)]
    fn row(&self, key: u64) -> usize {
        self.get(key).unwrap_or(NO_ROW)
    }
    #[inline(always)]
    fn resolve_all(&self, keys: &[u64], rows: &mut [usize]) {
        self.get_batch(keys, rows, NO_ROW)
    }
}

#[inline(always)]
fn prefetch_row(store: &crate::storage::store::Store, row: usize, row_bytes: usize) {
    if row != NO_ROW {
        prefetch_lines(store.row_ptr(row), row_bytes);
    }
}

impl StaticTable {
    /// Looks up `keys` into `out` on the CPU (see `strata_lookup`): plans the call, then gathers.
    ///
    /// # Safety
    /// As for `Table::lookup`: the tensors must describe memory valid as DLPack requires.
    pub unsafe fn lookup(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<LookupStats> {
        // SAFETY: this function's caller vouches for keys and out, as Request::plain requires.
        let r = unsafe { crate::model::Request::plain(keys, out, true) };
        match plan(self.dim(), self.store().byte_range(), &r, opts)? {
            Some(p) => self.run_plan(&p),
            None => Ok(LookupStats::default()),
        }
    }

    /// Runs a validated plan of this table.
    pub(crate) fn run_plan(&self, p: &Plan) -> Result<LookupStats> {
        let gather = Gather { table: self, keys: &p.keys, out: &p.out, n: p.n, threads: p.threads };
        let found = gather.run();
        if let Some((index, key)) = found.first_miss {
            return Err(Error::KeyNotFound { key: p.key_dtype.value(key), index });
        }
        Ok(LookupStats { hits: found.hits, misses: found.misses, ..LookupStats::default() })
    }
}
