//! The CPU gather: keys -> rows -> output, in chunks, on the calling thread and pool workers.
//!
//! Each participant takes runs of [`TASK`] keys from a shared counter and processes them in
//! chunks of [`CHUNK`]: read the keys, resolve rows (prefetching index buckets first), then
//! copy or convert each row into `out`, prefetching rows a few keys ahead. Rows of one call go
//! to distinct places in `out` (checked by the caller), so participants never write the same
//! bytes.

use crate::dlpack::{FloatDtype, KeyDtype, Walk};
use crate::exec::{pool, prefetch};
use crate::table::{MissingKey, Rows, Table};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys per chunk (stack buffers hold one chunk).
const CHUNK: usize = 128;
/// Keys a participant takes from the shared counter at a time.
const TASK: usize = 2048;
/// Output bytes below which one more participant is not worth waking.
const BYTES_PER_THREAD: usize = 256 * 1024;
/// How many keys ahead rows are prefetched.
const AHEAD: usize = 6;
const NO_ROW: usize = usize::MAX;

/// Where keys are read from.
pub struct KeySource {
    pub ptr: *const u8,
    pub dtype: KeyDtype,
    /// Element offsets of flat key indices.
    pub walk: Walk,
    pub elem: usize,
}

/// Where rows are written.
pub struct OutTarget {
    pub ptr: *mut u8,
    pub dtype: FloatDtype,
    /// Element offsets of each key's output row start.
    pub walk: Walk,
    /// Element stride between consecutive values of a row.
    pub col_stride: usize,
}

/// One lookup, validated by the caller.
pub struct Gather<'a> {
    pub table: &'a Table,
    pub keys: KeySource,
    pub out: OutTarget,
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
type RowFn = unsafe fn(src: *const u8, dst: *mut u8, dim: usize, col_stride: usize);

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
    unsafe { std::ptr::copy_nonoverlapping(src, dst, dim * SIZE) };
}

unsafe fn copy_strided<T: Copy>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
    let (s, d) = (src as *const T, dst as *mut T);
    for i in 0..dim {
        unsafe { *d.add(i * cs) = *s.add(i) };
    }
}

unsafe fn convert<S: Elem, D: Elem>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
    let (s, d) = (src as *const S, dst as *mut D);
    for i in 0..dim {
        unsafe { *d.add(i * cs) = D::from_f32((*s.add(i)).to_f32()) };
    }
}

unsafe fn f32_to_f16(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const f32, dim), std::slice::from_raw_parts_mut(dst as *mut f16, dim))
    };
    d.convert_from_f32_slice(s);
}

unsafe fn f32_to_bf16(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const f32, dim), std::slice::from_raw_parts_mut(dst as *mut bf16, dim))
    };
    d.convert_from_f32_slice(s);
}

unsafe fn f16_to_f32(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const f16, dim), std::slice::from_raw_parts_mut(dst as *mut f32, dim))
    };
    s.convert_to_f32_slice(d);
}

unsafe fn bf16_to_f32(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    let (s, d) = unsafe {
        (std::slice::from_raw_parts(src as *const bf16, dim), std::slice::from_raw_parts_mut(dst as *mut f32, dim))
    };
    s.convert_to_f32_slice(d);
}

/// The row kernel for a (table dtype, out dtype, contiguous row?) combination.
fn row_fn(src: FloatDtype, dst: FloatDtype, contiguous: bool) -> RowFn {
    use FloatDtype::*;
    match (src, dst, contiguous) {
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

/// Writes `v` as one element of `dtype` at `p`.
///
/// # Safety
/// `p` must be valid for writing one element of `dtype` and aligned for it.
pub unsafe fn store_f32(dtype: FloatDtype, p: *mut u8, v: f32) {
    unsafe {
        match dtype {
            FloatDtype::F32 => *(p as *mut f32) = v,
            FloatDtype::F16 => *(p as *mut f16) = f16::from_f32(v),
            FloatDtype::BF16 => *(p as *mut bf16) = bf16::from_f32(v),
        }
    }
}

impl Gather<'_> {
    /// Runs the gather on up to `threads` participants and sums what they found.
    pub fn run(&self) -> Found {
        let row_bytes = self.table.dim() * self.out.dtype.size();
        let by_size = (self.n.saturating_mul(row_bytes) / BYTES_PER_THREAD).max(1);
        let by_tasks = self.n.div_ceil(TASK).max(1);
        let threads = self.threads.min(by_size).min(by_tasks).max(1);
        let rowf = row_fn(self.table.dtype(), self.out.dtype, self.out.col_stride == 1);
        let track_first = self.table.missing == MissingKey::STRATA_MISSING_ERROR;
        if threads == 1 {
            let mut f = Found::default();
            self.range(0, self.n, rowf, track_first, &mut f);
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
                self.range(lo, (lo + TASK).min(self.n), rowf, track_first, &mut f);
            }
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
    fn range(&self, lo: usize, hi: usize, rowf: RowFn, track_first: bool, found: &mut Found) {
        let table = self.table;
        let store = &table.store;
        let dim = table.dim();
        let out_size = self.out.dtype.size();
        let default = table.default_row_ptr();
        let mut offs = [0usize; CHUNK];
        let mut keys = [0u64; CHUNK];
        let mut rows = [0usize; CHUNK];
        let mut start = lo;
        while start < hi {
            let n = CHUNK.min(hi - start);
            // 1. Keys, in canonical 64-bit form.
            let k = &self.keys;
            match k.walk.linear_stride() {
                Some(s) => {
                    let step = s * k.elem;
                    let base = k.ptr.wrapping_add(start * step);
                    for (i, key) in keys[..n].iter_mut().enumerate() {
                        // SAFETY: validated: every key index below self.n is addressable.
                        *key = unsafe { k.dtype.read(base.wrapping_add(i * step)) };
                    }
                }
                None => {
                    k.walk.fill(start, &mut offs[..n]);
                    for i in 0..n {
                        keys[i] = unsafe { k.dtype.read(k.ptr.wrapping_add(offs[i] * k.elem)) };
                    }
                }
            }
            // 2. Rows.
            match &table.rows {
                Rows::Dense => {
                    let len = store.rows() as u64;
                    for i in 0..n {
                        rows[i] = if keys[i] < len { keys[i] as usize } else { NO_ROW };
                    }
                }
                Rows::Keyed(ix) => {
                    for &key in &keys[..n] {
                        ix.prefetch(key);
                    }
                    for i in 0..n {
                        rows[i] = ix.get(keys[i]).unwrap_or(NO_ROW);
                    }
                }
            }
            // 3. Copy.
            self.out.walk.fill(start, &mut offs[..n]);
            let row_bytes = dim * store.dtype().size();
            for i in 0..n.min(AHEAD) {
                prefetch_row(store, rows[i], row_bytes);
            }
            for i in 0..n {
                if i + AHEAD < n {
                    prefetch_row(store, rows[i + AHEAD], row_bytes);
                }
                let src = if rows[i] == NO_ROW {
                    found.misses += 1;
                    if track_first && found.first_miss.is_none_or(|(j, _)| start + i < j) {
                        found.first_miss = Some((start + i, keys[i]));
                    }
                    default
                } else {
                    found.hits += 1;
                    store.row_ptr(rows[i])
                };
                // SAFETY: src is a whole row of the table (or the default row); dst is this key's
                // output row, validated to lie inside `out` and not to overlap other rows.
                unsafe { rowf(src, self.out.ptr.wrapping_add(offs[i] * out_size), dim, self.out.col_stride) };
            }
            start += n;
        }
    }
}

#[inline(always)]
fn prefetch_row(store: &crate::store::Store, row: usize, row_bytes: usize) {
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
