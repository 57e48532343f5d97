//! A lookup, checked: the options and stats of one call, `keys` and `out` validated against a
//! table's `dim`, and the [`Plan`] the executors run (where keys are read and rows written).

use super::request::Request;
use crate::dlpack::{FloatDtype, KeyDtype, TensorView, Walk, require_host};
use crate::error::{Error, Result};
use crate::util::threads::resolve_threads;
use std::ffi::c_void;

/// Per-call lookup options (the core's copy of `strata_lookup_options`).
#[derive(Debug, Clone, Copy)]
pub struct LookupOptions {
    /// A `cudaStream_t` / `CUstream` for CUDA tensors. Ignored for host tensors, which are
    /// read and written before the call returns. Default NULL. Private: only
    /// [`LookupOptions::on_stream`] (unsafe) sets it, so a lookup given these options may rely
    /// on it being NULL or a live stream.
    stream: *mut c_void,
    /// CPU threads for this call: 0 = the library default (the process affinity mask, or
    /// `STRATA_NUM_THREADS`), 1 = only the calling thread, n = at most n threads. Default 0.
    pub num_threads: i32,
}

impl Default for LookupOptions {
    fn default() -> Self {
        LookupOptions { stream: std::ptr::null_mut(), num_threads: 0 }
    }
}

impl LookupOptions {
    /// Options of a call on `stream` with `num_threads` (see the fields).
    ///
    /// # Safety
    /// `stream` must be NULL (the legacy default stream) or a live stream of the primary
    /// context of the device of the CUDA tensors it is used with, until the lookups given these
    /// options have run on it.
    pub unsafe fn on_stream(stream: *mut c_void, num_threads: i32) -> Self {
        LookupOptions { stream, num_threads }
    }

    /// The stream (NULL or live, as [`LookupOptions::on_stream`] requires).
    pub fn stream(&self) -> *mut c_void {
        self.stream
    }
}

/// What one lookup found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupStats {
    /// Keys found in the table (in any tier).
    pub hits: u64,
    /// Keys not in the table (filled with the default value).
    pub misses: u64,
    /// Of the hits, keys found in a server table's volatile tier (0 for other tables).
    pub volatile_hits: u64,
    /// Of the hits, keys found in a server table's persistent tier (0 for other tables).
    pub persistent_hits: u64,
}

pub(crate) fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// A validated lookup: where keys are read and rows written. Built by [`plan_into`].
pub(crate) struct Plan {
    pub keys: KeySource,
    pub out: OutTarget,
    pub n: usize,
    pub threads: usize,
    pub key_dtype: KeyDtype,
}

// SAFETY: the raw pointers are only dereferenced within the lookup call that made the plan, on
// disjoint output rows (validated by `plan`).
unsafe impl Sync for Plan {}

/// `keys` and `out` checked against a table's `dim`, wherever they live. Built by [`check`] (for
/// the CUDA path; the host path plans from [`check_views`] without keeping the views).
#[cfg(feature = "cuda")]
pub(crate) struct Checked {
    pub k: TensorView,
    pub o: TensorView,
    pub kd: KeyDtype,
    pub od: FloatDtype,
    pub n: usize,
    /// Element offsets of each key's output row start.
    pub lead: Walk,
    /// Element stride between consecutive values of a row.
    pub col_stride: usize,
}

#[cfg(feature = "cuda")]
impl Checked {
    /// Where the keys are read from.
    pub(crate) fn key_source(&self) -> KeySource {
        KeySource { ptr: self.k.ptr, dtype: self.kd, walk: Walk::new(&self.k.shape, &self.k.strides), elem: self.k.elem }
    }

    /// The keys in canonical form (host keys only).
    pub(crate) fn host_keys(&self) -> Vec<u64> {
        let mut keys = vec![0u64; self.n];
        let mut offs = vec![0isize; self.n];
        self.key_source().read(0, &mut keys, &mut offs);
        keys
    }

    /// Writes compact rows (`n x dim` values of out's dtype, as bytes) into `out` (host `out`
    /// only).
    ///
    /// # Safety
    /// `out` must be writable host memory as validated.
    pub(crate) unsafe fn write_host_rows(&self, rows: &[u8]) {
        let size = self.od.size();
        let dim = rows.len() / size / self.n.max(1);
        let mut offs = vec![0isize; self.n];
        self.lead.fill(0, &mut offs);
        for (i, &off) in offs.iter().enumerate() {
            let row = &rows[i * dim * size..(i + 1) * dim * size];
            let dst = self.o.ptr.wrapping_offset(off * size as isize);
            if self.col_stride == 1 {
                // SAFETY: the caller's out holds row i's dim contiguous elements at dst.
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), dst, row.len()) };
                continue;
            }
            for (c, src) in row.chunks_exact(size).enumerate() {
                // SAFETY: the caller's out holds element (i, c) at dst + c * col_stride.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.wrapping_add(c * self.col_stride * size), size) };
            }
        }
    }
}

/// Checks dtypes, shapes and strides of the views of `keys` and `out` for a table of `dim`,
/// on any device; `None` when there are no keys (a valid no-op).
#[cfg(feature = "cuda")]
pub(crate) fn check(dim: usize, k: TensorView, o: TensorView) -> Result<Option<Checked>> {
    let Some(Layout { kd, od, n, lead, col_stride }) = check_views(dim, &k, &o)? else {
        return Ok(None);
    };
    Ok(Some(Checked { k, o, kd, od, n, lead, col_stride }))
}

/// What [`check_views`] finds: the dtypes, the key count and where each key's row goes.
struct Layout {
    kd: KeyDtype,
    od: FloatDtype,
    n: usize,
    lead: Walk,
    col_stride: usize,
}

/// [`check`] on borrowed views: the checks every lookup of `keys` into `out` makes, wherever
/// the tensors live.
#[inline]
fn check_views(dim: usize, k: &TensorView, o: &TensorView) -> Result<Option<Layout>> {
    let kd = KeyDtype::of(k.dtype, "keys")?;
    let od = FloatDtype::of(o.dtype, "out")?;
    let n = k.numel;

    let nd = k.shape.len();
    let lead = if o.shape.len() == nd + 1 && o.shape[..nd] == k.shape[..] && o.shape[nd] == dim {
        Walk::new(&k.shape, &o.strides[..nd])
    } else if o.shape.len() == 2 && o.shape[0] == n && o.shape[1] == dim {
        Walk::new(&[n], &o.strides[..1])
    } else {
        let mut want = k.shape.clone();
        want.push(dim);
        return Err(Error::invalid(
            "out",
            format!("shape {:?}; expected [*keys.shape, dim] = {want:?} or [numel(keys), dim] = [{n}, {dim}]", o.shape),
        ));
    };
    o.require_non_negative_strides()?;
    let col_stride = *o.strides.last().expect("out has at least one dimension") as usize;
    if n == 0 {
        return Ok(None);
    }
    if !o.is_non_overlapping() {
        return Err(Error::layout(
            "out",
            format!(
                "strides {:?} make elements of shape {:?} overlap; expected each stride, in increasing order, \
                 to step past the extent of the smaller ones",
                o.strides, o.shape
            ),
        ));
    }
    Ok(Some(Layout { kd, od, n, lead, col_stride }))
}

/// Validates a plain request's host `keys` and `out` for a table of `dim` whose own memory is
/// `table_range`: the plan, or `None` when there are no keys (a valid no-op).
pub(crate) fn plan(dim: usize, table_range: (usize, usize), r: &Request, opts: &LookupOptions) -> Result<Option<Plan>> {
    let threads = resolve_threads(opts.num_threads)?;
    // SAFETY: a Request's tensors describe valid DLPack memory (its constructor's contract), so
    // the shape and strides are readable for ndim elements.
    let k = unsafe { TensorView::new(r.keys, "keys") }?;
    // SAFETY: as for keys.
    let o = unsafe { TensorView::new(r.out, "out") }?;
    require_host(k.device, "keys")?;
    require_host(o.device, "out")?;
    let Some(c) = check_views(dim, &k, &o)? else {
        return Ok(None);
    };
    if overlaps(o.byte_range(), k.byte_range()) {
        return Err(Error::layout("out", "overlaps the memory of keys; expected separate buffers"));
    }
    if overlaps(o.byte_range(), table_range) {
        return Err(Error::layout("out", "overlaps the table's vectors; expected a separate buffer"));
    }
    Ok(Some(Plan {
        keys: KeySource { ptr: k.ptr, dtype: c.kd, walk: Walk::new(&k.shape, &k.strides), elem: k.elem },
        out: OutTarget { ptr: o.ptr, dtype: c.od, walk: c.lead, col_stride: c.col_stride },
        n: c.n,
        threads,
        key_dtype: c.kd,
    }))
}

/// Where keys are read from.
pub struct KeySource {
    pub ptr: *const u8,
    pub dtype: KeyDtype,
    /// Element offsets of flat key indices.
    pub walk: Walk,
    pub elem: usize,
}

impl KeySource {
    #[inline(always)]
    fn at(&self, off: isize) -> *const u8 {
        self.ptr.wrapping_offset(off * self.elem as isize)
    }

    /// Keys `start .. start + len` in the caller's own memory, when they are contiguous int64
    /// or uint64 (already the canonical form): no copy. `None` for other layouts and dtypes
    /// (then [`KeySource::read`]) and for no keys.
    #[inline]
    pub(crate) fn contiguous(&self, start: usize, len: usize) -> Option<&[u64]> {
        if len == 0 || self.walk.linear_stride() != Some(1) || !matches!(self.dtype, KeyDtype::I64 | KeyDtype::U64) {
            return None;
        }
        // SAFETY: validated by the planner: keys start .. start + len are addressable,
        // contiguous, aligned 8-byte elements, which nothing writes during the call the plan
        // (and so this borrow) belongs to (out may not overlap them).
        Some(unsafe { std::slice::from_raw_parts(self.at(start as isize) as *const u64, len) })
    }

    /// Reads keys `start .. start + keys.len()` in canonical form (`offs` is scratch).
    #[inline(always)]
    pub(crate) fn read(&self, start: usize, keys: &mut [u64], offs: &mut [isize]) {
        if keys.is_empty() {
            return; // the tensor of no keys may have no data pointer at all
        }
        match self.walk.linear_stride() {
            // Contiguous keys (the common case), one dtype for the whole run: a widening copy
            // the compiler vectorises.
            Some(1) => {
                let p = self.at(start as isize);
                // SAFETY: validated by the planner: keys start .. start + keys.len() are
                // addressable, contiguous, aligned elements of self.dtype.
                unsafe {
                    match self.dtype {
                        KeyDtype::I64 | KeyDtype::U64 => std::ptr::copy_nonoverlapping(p as *const u64, keys.as_mut_ptr(), keys.len()),
                        KeyDtype::I32 => {
                            let src = std::slice::from_raw_parts(p as *const i32, keys.len());
                            keys.iter_mut().zip(src).for_each(|(k, &x)| *k = x as i64 as u64);
                        }
                        KeyDtype::U32 => {
                            let src = std::slice::from_raw_parts(p as *const u32, keys.len());
                            keys.iter_mut().zip(src).for_each(|(k, &x)| *k = x as u64);
                        }
                    }
                }
            }
            Some(s) => {
                for (i, key) in keys.iter_mut().enumerate() {
                    // SAFETY: validated by the planner: every key index below n is addressable.
                    *key = unsafe { self.dtype.read(self.at((start + i) as isize * s)) };
                }
            }
            None => {
                self.walk.fill(start, offs);
                for (key, &o) in keys.iter_mut().zip(offs.iter()) {
                    // SAFETY: as above: the walk yields the offsets of key indices below n, each
                    // an aligned element of the keys the planner validated.
                    *key = unsafe { self.dtype.read(self.at(o)) };
                }
            }
        }
    }
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
