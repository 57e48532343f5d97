//! The CPU gather: keys -> rows -> output, in chunks, on the calling thread and pool workers.
//!
//! Each participant takes runs of [`TASK`] keys from a shared counter and processes them in
//! chunks of [`CHUNK`]: it reads the keys in canonical form, resolves them all to rows in one
//! pass (index buckets prefetched ahead), then copies (or converts) the rows into `out` in a
//! second pass that prefetches rows ahead of the copy. Large outputs are written with
//! non-temporal stores. Rows of one call go to distinct places in `out` (checked by the
//! caller), so participants never write the same bytes.

use crate::dlpack::FloatDtype;
use crate::exec::pool;
use crate::util::prefetch;
use crate::storage::index::KeyIndex;
use crate::error::{Error, Result};
use crate::model::{KeySource, LookupOptions, LookupStats, MissingKey, OutTarget, Plan, Rows, StaticTable, plan};
use dlpark::ffi::DLTensor;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
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

/// Copies one row of `dim` values from `src` (table dtype) to `dst` (out dtype, `col_stride`
/// elements apart).
///
/// Safety: `src` must be readable for `dim` contiguous, aligned elements of the source dtype,
/// and `dst` writable for `dim` aligned elements of the out dtype `col_stride` elements apart,
/// not overlapping `src`. [`row_fn`] picks the contiguous kernels only for `col_stride == 1`.
pub(crate) type RowFn = unsafe fn(src: *const u8, dst: *mut u8, dim: usize, col_stride: usize);

trait Elem: Copy {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}
impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl Elem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

unsafe fn copy_contiguous<const SIZE: usize>(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src and dst each hold dim contiguous SIZE-byte elements (this
    // kernel serves only col_stride 1 and equal dtypes) and do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, dim * SIZE) };
}

/// Copies `dim * SIZE` bytes with non-temporal stores (x86-64), ordinary ones elsewhere. The
/// caller issues [`store_fence`] before the output is handed back.
unsafe fn copy_streaming<const SIZE: usize>(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    let bytes = dim * SIZE;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the RowFn contract: src and dst each hold `bytes` contiguous bytes and do not
    // overlap. `head` bytes are copied plainly up to dst's next 16-byte boundary, then every
    // 64- and 16-byte step stays below `left`, so all reads and writes are inside the row;
    // the streaming stores need 16-byte aligned dst, which `head` provides, and the loads are
    // unaligned ones. SSE2 is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = ((16 - (dst as usize & 15)) & 15).min(bytes);
        if head != 0 {
            std::ptr::copy_nonoverlapping(src, dst, head);
        }
        let (mut s, mut d, mut left) = (src.add(head), dst.add(head), bytes - head);
        while left >= 64 {
            let a = _mm_loadu_si128(s as *const __m128i);
            let b = _mm_loadu_si128(s.add(16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(48) as *const __m128i);
            _mm_stream_si128(d as *mut __m128i, a);
            _mm_stream_si128(d.add(16) as *mut __m128i, b);
            _mm_stream_si128(d.add(32) as *mut __m128i, c);
            _mm_stream_si128(d.add(48) as *mut __m128i, e);
            s = s.add(64);
            d = d.add(64);
            left -= 64;
        }
        while left >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            s = s.add(16);
            d = d.add(16);
            left -= 16;
        }
        if left != 0 {
            std::ptr::copy_nonoverlapping(s, d, left);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the RowFn contract: src and dst each hold `bytes` contiguous bytes and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, bytes)
    };
}

/// [`copy_streaming`] with 32-byte loads and non-temporal stores, for CPUs with AVX (half the
/// instructions per row; [`row_fn`] picks it only where AVX is detected at run time). A row
/// that starts 16 bytes past a 32-byte boundary (as rows of a `malloc`ed output do) begins and
/// ends with one 16-byte streaming store, so no cache line is written both ways.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_streaming_avx<const SIZE: usize>(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    use std::arch::x86_64::{__m128i, __m256i, _mm_loadu_si128, _mm_stream_si128, _mm256_loadu_si256, _mm256_stream_si256};
    let bytes = dim * SIZE;
    // SAFETY: the RowFn contract: src and dst each hold `bytes` contiguous bytes and do not
    // overlap. `head` bytes are copied plainly up to dst's next 16-byte boundary; the 16-byte
    // step to a 32-byte boundary, every 64- and 32-byte step and the last 16-byte step each
    // stay below `left`, so all reads and writes are inside the row. The streaming stores get
    // the alignment they need (16 bytes for the 128-bit ones, 32 for the 256-bit ones) from
    // the steps before them; the loads are unaligned ones. AVX is enabled on this function and
    // row_fn only picks it when the CPU has it.
    unsafe {
        let head = ((16 - (dst as usize & 15)) & 15).min(bytes);
        if head != 0 {
            std::ptr::copy_nonoverlapping(src, dst, head);
        }
        let (mut s, mut d, mut left) = (src.add(head), dst.add(head), bytes - head);
        if d as usize & 31 != 0 && left >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            s = s.add(16);
            d = d.add(16);
            left -= 16;
        }
        while left >= 64 {
            let a = _mm256_loadu_si256(s as *const __m256i);
            let b = _mm256_loadu_si256(s.add(32) as *const __m256i);
            _mm256_stream_si256(d as *mut __m256i, a);
            _mm256_stream_si256(d.add(32) as *mut __m256i, b);
            s = s.add(64);
            d = d.add(64);
            left -= 64;
        }
        if left >= 32 {
            _mm256_stream_si256(d as *mut __m256i, _mm256_loadu_si256(s as *const __m256i));
            s = s.add(32);
            d = d.add(32);
            left -= 32;
        }
        if left >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            s = s.add(16);
            d = d.add(16);
            left -= 16;
        }
        if left != 0 {
            std::ptr::copy_nonoverlapping(s, d, left);
        }
    }
}

/// The streaming copy for `SIZE`-byte elements: the AVX one where the CPU has AVX.
fn streaming<const SIZE: usize>() -> RowFn {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        return copy_streaming_avx::<SIZE>;
    }
    copy_streaming::<SIZE>
}

/// Orders earlier non-temporal stores before anything that follows.
#[inline]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

unsafe fn copy_strided<T: Copy>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
    let (s, d) = (src as *const T, dst as *mut T);
    for i in 0..dim {
        // SAFETY: the RowFn contract: src holds dim contiguous T and dst element i * cs is
        // inside the output row for i < dim; T matches both dtypes (row_fn pairs them).
        unsafe { *d.add(i * cs) = *s.add(i) };
    }
}

unsafe fn convert<S: Elem, D: Elem>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
    let (s, d) = (src as *const S, dst as *mut D);
    for i in 0..dim {
        // SAFETY: the RowFn contract: src holds dim contiguous S and dst element i * cs (a D) is
        // inside the output row for i < dim; row_fn pairs S and D with the two dtypes.
        unsafe { *d.add(i * cs) = D::from_f32((*s.add(i)).to_f32()) };
    }
}

unsafe fn f32_to_f16(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned f32 and dst dim aligned, contiguous f16
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const f32, dim), std::slice::from_raw_parts_mut(dst as *mut f16, dim))
    };
    d.convert_from_f32_slice(s);
}

unsafe fn f32_to_bf16(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned f32 and dst dim aligned, contiguous bf16
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const f32, dim), std::slice::from_raw_parts_mut(dst as *mut bf16, dim))
    };
    d.convert_from_f32_slice(s);
}

unsafe fn f16_to_f32(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned f16 and dst dim aligned, contiguous f32
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const f16, dim), std::slice::from_raw_parts_mut(dst as *mut f32, dim))
    };
    s.convert_to_f32_slice(d);
}

unsafe fn bf16_to_f32(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned bf16 and dst dim aligned, contiguous f32
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const bf16, dim), std::slice::from_raw_parts_mut(dst as *mut f32, dim))
    };
    s.convert_to_f32_slice(d);
}


/// The kernels of one lookup: for table rows, and for the (float32) default row.
struct Kernels {
    row: RowFn,
    default: RowFn,
}

/// The row kernel for a (table dtype, out dtype, contiguous row?, streaming?) combination.
pub(crate) fn row_fn(src: FloatDtype, dst: FloatDtype, contiguous: bool, stream: bool) -> RowFn {
    use FloatDtype::*;
    match (src, dst, contiguous) {
        (F32, F32, true) if stream => streaming::<4>(),
        (F16, F16, true) | (BF16, BF16, true) if stream => streaming::<2>(),
        (F32, F32, true) => copy_contiguous::<4>,
        (F16, F16, true) | (BF16, BF16, true) => copy_contiguous::<2>,
        (F32, F32, false) => copy_strided::<u32>,
        (F16, F16, false) | (BF16, BF16, false) => copy_strided::<u16>,
        (F32, F16, true) => f32_to_f16,
        (F32, BF16, true) => f32_to_bf16,
        (F16, F32, true) => f16_to_f32,
        (BF16, F32, true) => bf16_to_f32,
        (F32, F16, false) => convert::<f32, f16>,
        (F32, BF16, false) => convert::<f32, bf16>,
        (F16, F32, false) => convert::<f16, f32>,
        (BF16, F32, false) => convert::<bf16, f32>,
        (F16, BF16, _) => convert::<f16, bf16>,
        (BF16, F16, _) => convert::<bf16, f16>,
    }
}

impl Gather<'_> {
    /// Runs the gather on up to `threads` participants and sums what they found.
    pub fn run(&self) -> Found {
        let row_bytes = self.table.dim() * self.out.dtype.size();
        let by_size = (self.n.saturating_mul(row_bytes) / BYTES_PER_THREAD).max(1);
        let by_tasks = self.n.div_ceil(TASK).max(1);
        let threads = self.threads.min(by_size).min(by_tasks).max(1);
        let stream = self.n.saturating_mul(row_bytes) >= STREAM_BYTES;
        let contiguous = self.out.col_stride == 1;
        let rowf = Kernels {
            row: row_fn(self.table.dtype(), self.out.dtype, contiguous, stream),
            default: row_fn(FloatDtype::F32, self.out.dtype, contiguous, stream),
        };
        let track_first = self.table.missing == MissingKey::Error;
        if threads == 1 {
            let mut f = Found::default();
            self.range(0, self.n, &rowf, track_first, &mut f);
            store_fence();
            return f;
        }
        let next = AtomicUsize::new(0);
        let parts = pool::run(threads, || {
            let mut f = Found::default();
            loop {
                let lo = next.fetch_add(TASK, Ordering::Relaxed);
                if lo >= self.n {
                    break;
                }
                self.range(lo, (lo + TASK).min(self.n), &rowf, track_first, &mut f);
            }
            store_fence();
            f
        });
        parts.into_iter().fold(Found::default(), |a, b| Found {
            hits: a.hits + b.hits,
            misses: a.misses + b.misses,
            first_miss: match (a.first_miss, b.first_miss) {
                (Some(x), Some(y)) => Some(if x.0 <= y.0 { x } else { y }),
                (x, y) => x.or(y),
            },
        })
    }

    /// Gathers flat key indices `lo..hi`.
    fn range(&self, lo: usize, hi: usize, rowf: &Kernels, track_first: bool, found: &mut Found) {
        match &self.table.rows {
            // A few keys (online inference, batches of many small requests) use small buffers:
            // zeroing the full chunk's stack buffers would cost more than the lookup.
            Rows::Dense if hi - lo <= SMALL => self.range_with::<_, SMALL>(&Dense(self.table.store.rows() as u64), lo, hi, rowf, track_first, found),
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
        let row_bytes = dim * store.dtype().size();
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
    if row == NO_ROW {
        return;
    }
    let p = store.row_ptr(row);
    let mut off = 0;
    while off < row_bytes.min(1024) {
        prefetch(p.wrapping_add(off));
        off += 64;
    }
}

impl StaticTable {
    /// Looks up `keys` into `out` on the CPU (see `strata_lookup`): plans the call, then gathers.
    ///
    /// # Safety
    /// As for `Table::lookup`: the tensors must describe memory valid as DLPack requires.
    pub unsafe fn lookup(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<LookupStats> {
        // SAFETY: this function's caller guarantees what plan needs: keys and out describe
        // memory valid as DLPack requires.
        match unsafe { plan(self.dim(), self.store().byte_range(), keys, out, opts) }? {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Both streaming copies, every destination alignment and row length up to a few lines:
    /// exactly the row's bytes change, to the source's values.
    #[test]
    fn streaming_copies_write_exactly_the_row() {
        let src: Vec<u8> = (0..700u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut kernels: Vec<RowFn> = vec![copy_streaming::<1>];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            kernels.push(copy_streaming_avx::<1>);
        }
        for kernel in kernels {
            for align in 0..64 {
                for len in (0..300).chain([511, 512, 513, 640]) {
                    let mut dst = vec![0xEEu8; 800];
                    let at = (64 - dst.as_ptr() as usize % 64) % 64 + align;
                    // SAFETY: src holds 700 >= len + 5 bytes, dst[at..] holds at least len bytes
                    // (at < 128, len <= 640, 800 bytes), and the two vectors do not overlap.
                    unsafe { kernel(src[5..].as_ptr(), dst[at..].as_mut_ptr(), len, 1) };
                    store_fence();
                    assert!(dst[..at].iter().all(|&b| b == 0xEE), "before the row: align {align} len {len}");
                    assert_eq!(&dst[at..at + len], &src[5..5 + len], "align {align} len {len}");
                    assert!(dst[at + len..].iter().all(|&b| b == 0xEE), "after the row: align {align} len {len}");
                }
            }
        }
    }
}
