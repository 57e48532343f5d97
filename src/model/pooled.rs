//! Pooled lookups, checked: bags of keys (1-D keys with `offsets`, or 2-D keys of fixed
//! hotness), optional float32 weights, and one pooled row per bag written into `out`. The
//! semantics are TensorFlow's `embedding_lookup_sparse` and HPS's `SparseLookupLayer`: per bag,
//! sum = Σ wⱼ·row(kⱼ), mean = sum / Σ wⱼ, sqrtn = sum / √(Σ wⱼ²), with wⱼ = 1 without weights;
//! an empty bag or a zero weight total (mean, sqrtn) gives zeros; a missing key contributes the
//! table's default row. Accumulation is float32, in key order within a bag.

use super::plan::{KeySource, LookupOptions, OutTarget, overlaps};
use crate::dlpack::{FloatDtype, KeyDtype, TensorView, Walk, dtype_name, require_host};
use crate::error::{Error, Result};
use crate::util::threads::resolve_threads;
use dlpark::ffi::{DLDataTypeCode, DLTensor};

/// How a bag's rows become one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Σ wⱼ·row(kⱼ).
    Sum,
    /// The sum divided by Σ wⱼ.
    Mean,
    /// The sum divided by √(Σ wⱼ²).
    Sqrtn,
}

/// Where each bag's keys are, as flat key indices.
pub(crate) enum Bags {
    /// Bag `b` is keys `b * L .. (b + 1) * L` (2-D keys `[B, L]`).
    Fixed(usize),
    /// Bag `b` is keys `offsets[b] .. offsets[b + 1]` (`B + 1` entries, validated).
    Offsets(Vec<usize>),
}

/// Where the weights are: float32, one per key, at the element offsets of a walk over the keys'
/// shape.
pub(crate) struct WeightSource {
    ptr: *const u8,
    walk: Walk,
}

impl WeightSource {
    /// Reads the weights of flat key indices `start .. start + w.len()` (`offs` is scratch).
    #[inline(always)]
    pub(crate) fn read(&self, start: usize, w: &mut [f32], offs: &mut [isize]) {
        self.walk.fill(start, &mut offs[..w.len()]);
        for (x, &o) in w.iter_mut().zip(offs.iter()) {
            // SAFETY: the planner validated the weights tensor (float32, the keys' shape) for
            // every flat index below nnz, and start + w.len() <= nnz.
            *x = unsafe { *(self.ptr.wrapping_offset(o * 4) as *const f32) };
        }
    }
}

/// A validated pooled lookup. Built by [`plan_pooled`].
pub(crate) struct PooledPlan {
    pub keys: KeySource,
    pub weights: Option<WeightSource>,
    pub bags: Bags,
    /// Number of bags (rows of `out`).
    pub b: usize,
    /// Number of keys.
    pub nnz: usize,
    /// One row per bag.
    pub out: OutTarget,
    pub pooling: Pooling,
    pub threads: usize,
    pub key_dtype: KeyDtype,
}

// SAFETY: the raw pointers are only dereferenced within the call that made the plan; each bag's
// output row is written by one participant only (validated non-overlapping by the planner).
unsafe impl Sync for PooledPlan {}

impl PooledPlan {
    /// The first flat key index of bag `b` (`b <= self.b`).
    #[inline(always)]
    pub(crate) fn bag_start(&self, b: usize) -> usize {
        match &self.bags {
            Bags::Fixed(l) => b * l,
            Bags::Offsets(o) => o[b],
        }
    }
}

/// Reads and checks `offsets` (1-D int32 or int64, `B + 1` entries: first 0, non-decreasing,
/// last `nnz`).
///
/// # Safety
/// `offsets` must describe readable host memory as DLPack requires.
unsafe fn read_offsets(offsets: &DLTensor, nnz: usize) -> Result<(Vec<usize>, (usize, usize))> {
    // SAFETY: forwarded from the caller.
    let v = unsafe { TensorView::new(offsets, "offsets") }?;
    require_host(v.device, "offsets")?;
    let wide = match (v.dtype.code, v.dtype.bits, v.dtype.lanes) {
        (DLDataTypeCode::INT, 32, 1) => false,
        (DLDataTypeCode::INT, 64, 1) => true,
        _ => return Err(Error::Dtype { arg: "offsets", got: dtype_name(v.dtype), expected: "int32 or int64" }),
    };
    if v.shape.len() != 1 || v.shape[0] == 0 {
        return Err(Error::invalid(
            "offsets",
            format!("shape {:?}; expected a 1-D tensor of B + 1 >= 1 offsets (PyTorch's include_last_offset form)", v.shape),
        ));
    }
    let n = v.shape[0];
    let mut out = Vec::with_capacity(n);
    let mut prev = 0i64;
    for i in 0..n {
        let p = v.at(i as isize * v.strides[0]);
        // SAFETY: the view validated element i (i < shape[0]) as readable and aligned.
        let x = unsafe { if wide { *(p as *const i64) } else { *(p as *const i32) as i64 } };
        if i == 0 && x != 0 {
            return Err(Error::invalid("offsets", format!("offsets[0] = {x}; expected 0")));
        }
        if x < prev {
            return Err(Error::invalid(
                "offsets",
                format!("offsets[{i}] = {x} is less than offsets[{}] = {prev}; expected non-decreasing offsets", i - 1),
            ));
        }
        prev = x;
        out.push(x as usize);
    }
    if prev as u64 != nnz as u64 {
        return Err(Error::invalid(
            "offsets",
            format!("offsets[{}] = {prev}; expected nnz = {nnz}, the number of keys (the last offset ends the last bag)", n - 1),
        ));
    }
    Ok((out, v.byte_range()))
}

/// Validates a pooled lookup of host tensors for a table of `dim` whose own memory is
/// `table_range`.
///
/// # Safety
/// The tensors must describe memory valid as DLPack requires: `keys`, `offsets` and `weights`
/// readable, `out` writable.
#[allow(clippy::too_many_arguments)] // one argument per tensor of the C call
pub(crate) unsafe fn plan_pooled(
    dim: usize,
    table_range: (usize, usize),
    keys: &DLTensor,
    offsets: Option<&DLTensor>,
    weights: Option<&DLTensor>,
    pooling: Pooling,
    out: &DLTensor,
    opts: &LookupOptions,
) -> Result<PooledPlan> {
    let threads = resolve_threads(opts.num_threads)?;
    // SAFETY: forwarded from the caller.
    let k = unsafe { TensorView::new(keys, "keys") }?;
    require_host(k.device, "keys")?;
    let key_dtype = KeyDtype::of(k.dtype, "keys")?;
    let nnz = k.numel;
    let (bags, b, offsets_range) = match (k.shape.len(), offsets) {
        (1, Some(o)) => {
            // SAFETY: forwarded from the caller.
            let (o, range) = unsafe { read_offsets(o, nnz) }?;
            let b = o.len() - 1;
            (Bags::Offsets(o), b, range)
        }
        (1, None) => {
            return Err(Error::invalid(
                "offsets",
                "is NULL but keys are 1-D [nnz]; expected a 1-D int32 or int64 tensor of B + 1 offsets, \
                 or 2-D keys [B, L] of fixed hotness",
            ));
        }
        (2, None) => (Bags::Fixed(k.shape[1]), k.shape[0], (0, 0)),
        (2, Some(_)) => {
            return Err(Error::invalid(
                "offsets",
                format!("given with 2-D keys {:?}; expected NULL (each row of 2-D keys is one bag)", k.shape),
            ));
        }
        (nd, _) => {
            return Err(Error::invalid(
                "keys",
                format!("ndim = {nd}; expected 1-D keys [nnz] with offsets, or 2-D keys [B, L]"),
            ));
        }
    };
    let weight_view = match weights {
        None => None,
        Some(w) => {
            // SAFETY: forwarded from the caller.
            let w = unsafe { TensorView::new(w, "weights") }?;
            require_host(w.device, "weights")?;
            if (w.dtype.code, w.dtype.bits, w.dtype.lanes) != (DLDataTypeCode::FLOAT, 32, 1) {
                return Err(Error::Dtype { arg: "weights", got: dtype_name(w.dtype), expected: "float32" });
            }
            if w.shape != k.shape {
                return Err(Error::invalid("weights", format!("shape {:?}; expected the keys' shape {:?}", w.shape, k.shape)));
            }
            Some(w)
        }
    };
    // SAFETY: forwarded from the caller.
    let o = unsafe { TensorView::new(out, "out") }?;
    require_host(o.device, "out")?;
    let od = FloatDtype::of(o.dtype, "out")?;
    if o.shape != [b, dim] {
        return Err(Error::invalid("out", format!("shape {:?}; expected [B, dim] = [{b}, {dim}] (one row per bag)", o.shape)));
    }
    o.require_non_negative_strides()?;
    if b > 0 && !o.is_non_overlapping() {
        return Err(Error::layout(
            "out",
            format!("strides {:?} make elements of shape {:?} overlap; expected non-overlapping rows", o.strides, o.shape),
        ));
    }
    let or = o.byte_range();
    for (range, what) in [
        (k.byte_range(), "keys"),
        (offsets_range, "offsets"),
        (weight_view.as_ref().map_or((0, 0), |w| w.byte_range()), "weights"),
        (table_range, "the table's vectors"),
    ] {
        if overlaps(or, range) {
            return Err(Error::layout("out", format!("overlaps the memory of {what}; expected a separate buffer")));
        }
    }
    let keys = KeySource { ptr: k.ptr, dtype: key_dtype, walk: Walk::new(&k.shape, &k.strides), elem: k.elem };
    let weights = weight_view.map(|w| WeightSource { ptr: w.ptr, walk: Walk::new(&w.shape, &w.strides) });
    let out = OutTarget { ptr: o.ptr, dtype: od, walk: Walk::new(&[b], &[o.strides[0]]), col_stride: o.strides[1] as usize };
    Ok(PooledPlan { keys, weights, bags, b, nnz, out, pooling, threads, key_dtype })
}
