//! Lookups: validates keys and out against a table, then runs the executor for its kind.

use crate::dlpack::{FloatDtype, KeyDtype, TensorView, Walk, require_host};
use crate::error::{Error, Result};
use crate::exec::cpu::{Gather, KeySource, OutTarget};
use crate::exec::pool;
use crate::table::{StaticTable, Table, TableKind};
use dlpark::ffi::DLTensor;
use std::ffi::c_void;

/// Per-call lookup options (the core's copy of `strata_lookup_options`).
#[derive(Debug, Clone, Copy)]
pub struct LookupOptions {
    /// A `cudaStream_t` / `CUstream` for CUDA tensors. Ignored for host tensors, which are
    /// read and written before the call returns. Default NULL.
    pub stream: *mut c_void,
    /// CPU threads for this call: 0 = the library default (the process affinity mask, or
    /// `STRATA_NUM_THREADS`), 1 = only the calling thread, n = at most n threads. Default 0.
    pub num_threads: i32,
}

impl Default for LookupOptions {
    fn default() -> Self {
        LookupOptions { stream: std::ptr::null_mut(), num_threads: 0 }
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

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// A validated lookup: where keys are read and rows written. Built by [`plan`].
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

/// `keys` and `out` checked against a table's `dim`, wherever they live. Built by [`check`].
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
pub(crate) fn check(dim: usize, k: TensorView, o: TensorView) -> Result<Option<Checked>> {
    let kd = KeyDtype::of(k.dtype, "keys")?;
    let od = FloatDtype::of(o.dtype, "out")?;
    let n = k.numel;

    let nd = k.shape.len();
    let (lead_shape, lead_strides): (Vec<usize>, Vec<isize>) =
        if o.shape.len() == nd + 1 && o.shape[..nd] == k.shape[..] && o.shape[nd] == dim {
            (k.shape.clone(), o.strides[..nd].to_vec())
        } else if o.shape.len() == 2 && o.shape[0] == n && o.shape[1] == dim {
            (vec![n], vec![o.strides[0]])
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
    Ok(Some(Checked { k, o, kd, od, n, lead: Walk::new(&lead_shape, &lead_strides), col_stride }))
}

/// Validates host `keys` and `out` for a table of `dim` whose own memory is `table_range`;
/// `None` when there are no keys (a valid no-op).
///
/// # Safety
/// As for [`Table::lookup`].
pub(crate) unsafe fn plan(
    dim: usize,
    table_range: (usize, usize),
    keys: &DLTensor,
    out: &DLTensor,
    opts: &LookupOptions,
) -> Result<Option<Plan>> {
    let threads = pool::resolve_threads(opts.num_threads)?;
    let k = unsafe { TensorView::new(keys, "keys") }?;
    let o = unsafe { TensorView::new(out, "out") }?;
    require_host(k.device, "keys")?;
    require_host(o.device, "out")?;
    let Some(c) = check(dim, k, o)? else {
        return Ok(None);
    };
    if overlaps(c.o.byte_range(), c.k.byte_range()) {
        return Err(Error::layout("out", "overlaps the memory of keys; expected separate buffers"));
    }
    if overlaps(c.o.byte_range(), table_range) {
        return Err(Error::layout("out", "overlaps the table's vectors; expected a separate buffer"));
    }
    Ok(Some(Plan {
        keys: c.key_source(),
        out: OutTarget { ptr: c.o.ptr, dtype: c.od, walk: c.lead, col_stride: c.col_stride },
        n: c.n,
        threads,
        key_dtype: c.kd,
    }))
}

impl Table {
    /// Looks up `keys` (int32/int64/uint32/uint64, any shape and strides) into `out`
    /// (float32/float16/bfloat16, shape `[*keys.shape, dim]` or `[numel(keys), dim]`,
    /// non-negative, non-overlapping strides). Both are borrowed for the call only. Missing keys
    /// get the default row, or fail the call with `STRATA_KEY_NOT_FOUND` when the table's
    /// options say so (then `out` is unspecified). Safe to call from many threads at once.
    ///
    /// # Safety
    /// The tensors must describe memory that is valid as DLPack requires: `keys` readable,
    /// `out` writable, for every element their shape and strides reach.
    pub unsafe fn lookup(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<LookupStats> {
        unsafe { self.lookup_with(keys, out, opts, true) }
    }

    /// [`Table::lookup`], saying whether the caller wants the stats: on CUDA tensors, only
    /// stats (or a table whose missing keys are errors) make the call wait for the stream.
    ///
    /// # Safety
    /// As for [`Table::lookup`].
    pub unsafe fn lookup_with(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions, want_stats: bool) -> Result<LookupStats> {
        // Distributed tables validate devices collectively (so every rank fails together).
        #[cfg(feature = "cuda")]
        if !matches!(self.kind, TableKind::Dist(_))
            && (crate::exec::cuda::run::is_cuda(keys) || crate::exec::cuda::run::is_cuda(out))
        {
            return unsafe { crate::exec::cuda::run::lookup(self, keys, out, opts, want_stats) };
        }
        let _ = want_stats;
        match &self.kind {
            TableKind::Static(t) => unsafe { t.lookup(keys, out, opts) },
            TableKind::Tiered(t) => match unsafe { plan(t.dim(), (0, 0), keys, out, opts) }? {
                Some(p) => t.lookup(&p),
                None => Ok(LookupStats::default()),
            },
            TableKind::Dist(t) => unsafe { t.lookup(keys, out, opts) },
        }
    }
}

impl StaticTable {
    /// [`Table::lookup`] on a static table.
    ///
    /// # Safety
    /// As for [`Table::lookup`].
    pub unsafe fn lookup(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<LookupStats> {
        let Some(p) = (unsafe { plan(self.dim(), self.store().byte_range(), keys, out, opts) })? else {
            return Ok(LookupStats::default());
        };
        let gather = Gather { table: self, keys: p.keys, out: p.out, n: p.n, threads: p.threads };
        let found = gather.run();
        if let Some((index, key)) = found.first_miss {
            return Err(Error::KeyNotFound { key: p.key_dtype.value(key), index });
        }
        Ok(LookupStats { hits: found.hits, misses: found.misses, ..LookupStats::default() })
    }
}
