//! Pooled lookups, checked: bags of keys (1-D keys with `offsets`, or 2-D keys of fixed
//! hotness), optional float32 weights, and one pooled row per bag written into `out`. The
//! semantics are TensorFlow's `embedding_lookup_sparse` and HPS's `SparseLookupLayer`: per bag,
//! sum = Σ wⱼ·row(kⱼ), mean = sum / Σ wⱼ, sqrtn = sum / √(Σ wⱼ²), with wⱼ = 1 without weights;
//! an empty bag or a zero weight total (mean, sqrtn) gives zeros; a missing key contributes the
//! table's default row. Accumulation is float32, in key order within a bag.

use super::plan::{KeySource, LookupOptions, OutTarget, overlaps};
use super::request::{Pooling, Request};
use crate::dlpack::{Dims, FloatDtype, KeyDtype, TensorView, Walk, dtype_name, require_host};
use crate::error::{Error, Result};
use crate::util::threads::resolve_threads;
use dlpark::ffi::{DLDataTypeCode, DLTensor};

/// Where each bag's keys are, as flat key indices.
pub(crate) enum Bags {
    /// Bag `b` is keys `b * L .. (b + 1) * L` (2-D keys `[B, L]`).
    Fixed(usize),
    /// Bag `b` is keys `offsets[b] .. offsets[b + 1]` (`B + 1` entries, validated).
    Offsets(Dims<usize>),
}

/// Where the weights are: float32, one per key, at the element offsets of a walk over the keys'
/// shape.
pub(crate) struct WeightSource {
    ptr: *const u8,
    walk: Walk,
}

impl WeightSource {
    /// The weights of flat key indices `start .. start + len` in the caller's own memory, when
    /// they are contiguous: no copy. `None` for other layouts and for no keys.
    #[inline]
    pub(crate) fn contiguous(&self, start: usize, len: usize) -> Option<&[f32]> {
        if len == 0 || self.walk.linear_stride() != Some(1) {
            return None;
        }
        // SAFETY: the planner validated the weights tensor (float32, aligned, the keys' shape)
        // for every flat index below nnz, start + len <= nnz (the caller's), and nothing writes
        // it during the call the plan belongs to (out may not overlap it).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.wrapping_add(start * 4) as *const f32, len) })
    }

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

/// Whether a pooled lookup's tensors must be host memory, and where its offsets are read.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // only the CUDA path leaves offsets in place
pub(crate) enum Devices {
    /// Every tensor in host memory (the CPU path); the offsets are read and validated.
    Host,
    /// Any device (the caller checks devices); the offsets are read and validated on the host
    /// when `read_offsets` says so for their view, else left where they are for the kernels,
    /// which validate them.
    Any { read_offsets: fn(&TensorView) -> bool },
}

/// Where each bag's keys are, as checked by [`check_pooled`].
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum CheckedBags {
    /// Bag `b` is keys `b * L .. (b + 1) * L` (2-D keys `[B, L]`).
    Fixed(usize),
    /// Offsets read on the host and validated (`B + 1` entries), and their view.
    Read(Dims<usize>, TensorView),
    /// Offsets left where they are (values not checked); `wide`: int64, else int32.
    InPlace { view: TensorView, wide: bool },
}

/// A pooled lookup's tensors checked against a table's `dim`, on any device: dtypes, shapes,
/// strides and overlaps (and the offsets' values when they were read). Built by
/// [`check_pooled`].
pub(crate) struct PooledChecked {
    pub k: TensorView,
    pub kd: KeyDtype,
    pub bags: CheckedBags,
    pub w: Option<TensorView>,
    pub o: TensorView,
    pub od: FloatDtype,
    /// Number of bags (rows of `out`).
    pub b: usize,
    /// Number of keys.
    pub nnz: usize,
}

/// Checks offset values (`values.len()` = B + 1 entries): the first 0, non-decreasing, the last
/// `nnz`. The messages are the CPU path's, wherever the offsets were read.
pub(crate) fn check_offset_values(values: impl IntoIterator<Item = i64>, nnz: usize) -> Result<Dims<usize>> {
    // Read first, check after: the copy is then a plain loop (no branch a value), and the checks
    // are one pass over a slice. A small batch's requests each pay this.
    let out: Dims<usize> = values.into_iter().map(|x| x as usize).collect();
    let signed = |i: usize| out[i] as i64;
    let n = out.len();
    if n > 0 && signed(0) != 0 {
        return Err(Error::invalid("offsets", format!("offsets[0] = {}; expected 0", signed(0))));
    }
    if let Some(i) = out.windows(2).position(|w| (w[1] as i64) < (w[0] as i64)) {
        return Err(Error::invalid(
            "offsets",
            format!("offsets[{}] = {} is less than offsets[{i}] = {}; expected non-decreasing offsets", i + 1, signed(i + 1), signed(i)),
        ));
    }
    let last = if n == 0 { 0 } else { signed(n - 1) };
    if last as u64 != nnz as u64 {
        return Err(Error::invalid(
            "offsets",
            format!(
                "offsets[{}] = {last}; expected nnz = {nnz}, the number of keys (the last offset ends the last bag)",
                n.saturating_sub(1)
            ),
        ));
    }
    Ok(out)
}

/// Checks `offsets`' dtype (1-D int32 or int64, `B + 1 >= 1` entries) and, unless `devices`
/// leaves them in place, reads and checks their values.
///
/// # Safety
/// `offsets` must describe memory valid as DLPack requires (readable host memory when read).
unsafe fn check_offsets(offsets: &DLTensor, nnz: usize, devices: Devices) -> Result<CheckedBags> {
    // SAFETY: forwarded from the caller.
    let v = unsafe { TensorView::new(offsets, "offsets") }?;
    if let Devices::Host = devices {
        require_host(v.device, "offsets")?;
    }
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
    let read = match devices {
        Devices::Host => true,
        Devices::Any { read_offsets } => read_offsets(&v),
    };
    if !read {
        if v.shape[0] == 1 && nnz != 0 {
            // No bag to hold the keys, whatever the one offset says.
            return Err(Error::invalid(
                "offsets",
                format!("shape [1] (B = 0 bags) with nnz = {nnz} keys; expected offsets[B] = nnz, the last offset ending the last bag"),
            ));
        }
        return Ok(CheckedBags::InPlace { view: v, wide });
    }
    let n = v.shape[0];
    let o = if v.strides[0] == 1 && wide {
        // SAFETY: n >= 1 (checked above), so `ptr` is the real base; the view validated elements
        // 0..n, contiguous here, as readable and aligned.
        check_offset_values(unsafe { std::slice::from_raw_parts(v.ptr as *const i64, n) }.iter().copied(), nnz)
    } else if v.strides[0] == 1 {
        // SAFETY: as above, for int32 offsets.
        check_offset_values(unsafe { std::slice::from_raw_parts(v.ptr as *const i32, n) }.iter().map(|&x| x as i64), nnz)
    } else {
        let values = (0..n).map(|i| {
            let p = v.at(i as isize * v.strides[0]);
            // SAFETY: the view validated element i (i < shape[0]) as readable and aligned.
            unsafe { if wide { *(p as *const i64) } else { *(p as *const i32) as i64 } }
        });
        check_offset_values(values, nnz)
    }?;
    Ok(CheckedBags::Read(o, v))
}

/// Checks a pooled lookup's tensors for a table of `dim` (see [`PooledChecked`]); `devices`
/// says whether they must be host memory and where the offsets are read. The CPU path and the
/// CUDA path share these checks and their messages.
pub(crate) fn check_pooled(dim: usize, r: &Request, devices: Devices) -> Result<PooledChecked> {
    let Request { keys, offsets, weights, out, .. } = *r;
    let host = matches!(devices, Devices::Host);
    // SAFETY: a Request's tensors describe valid DLPack memory (its constructor's contract).
    let k = unsafe { TensorView::new(keys, "keys") }?;
    if host {
        require_host(k.device, "keys")?;
    }
    let kd = KeyDtype::of(k.dtype, "keys")?;
    let nnz = k.numel;
    let bags = match (k.shape.len(), offsets) {
        // SAFETY: a Request's tensors describe valid DLPack memory (its constructor's contract).
        (1, Some(o)) => unsafe { check_offsets(o, nnz, devices) }?,
        (1, None) => {
            return Err(Error::invalid(
                "offsets",
                "is NULL but keys are 1-D [nnz]; expected a 1-D int32 or int64 tensor of B + 1 offsets, \
                 or 2-D keys [B, L] of fixed hotness",
            ));
        }
        (2, None) => CheckedBags::Fixed(k.shape[1]),
        (2, Some(_)) => {
            return Err(Error::invalid(
                "offsets",
                format!("given with 2-D keys {:?}; expected NULL (each row of 2-D keys is one bag)", k.shape),
            ));
        }
        (nd, _) => {
            return Err(Error::invalid("keys", format!("ndim = {nd}; expected 1-D keys [nnz] with offsets, or 2-D keys [B, L]")));
        }
    };
    let b = match &bags {
        CheckedBags::Fixed(_) => k.shape[0],
        CheckedBags::Read(o, _) => o.len() - 1,
        CheckedBags::InPlace { view, .. } => view.shape[0] - 1,
    };
    let w = match weights {
        None => None,
        Some(w) => {
            // SAFETY: a Request's tensors describe valid DLPack memory (its constructor's contract).
            let w = unsafe { TensorView::new(w, "weights") }?;
            if host {
                require_host(w.device, "weights")?;
            }
            if (w.dtype.code, w.dtype.bits, w.dtype.lanes) != (DLDataTypeCode::FLOAT, 32, 1) {
                return Err(Error::Dtype { arg: "weights", got: dtype_name(w.dtype), expected: "float32" });
            }
            if w.shape != k.shape {
                return Err(Error::invalid("weights", format!("shape {:?}; expected the keys' shape {:?}", w.shape, k.shape)));
            }
            Some(w)
        }
    };
    // SAFETY: a Request's tensors describe valid DLPack memory (its constructor's contract).
    let o = unsafe { TensorView::new(out, "out") }?;
    if host {
        require_host(o.device, "out")?;
    }
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
    let offsets_range = match &bags {
        CheckedBags::Fixed(_) => (0, 0),
        CheckedBags::Read(_, v) | CheckedBags::InPlace { view: v, .. } => v.byte_range(),
    };
    let or = o.byte_range();
    for (range, what) in [(k.byte_range(), "keys"), (offsets_range, "offsets"), (w.as_ref().map_or((0, 0), |w| w.byte_range()), "weights")]
    {
        if overlaps(or, range) {
            return Err(Error::layout("out", format!("overlaps the memory of {what}; expected a separate buffer")));
        }
    }
    Ok(PooledChecked { k, kd, bags, w, o, od, b, nnz })
}

/// Validates the host tensors of `r`, pooled by `pooling` (whatever `r.pooling` says), for a
/// table of `dim` whose own memory is `table_range`.
pub(crate) fn plan_pooled(
    dim: usize,
    table_range: (usize, usize),
    r: &Request,
    pooling: Pooling,
    opts: &LookupOptions,
) -> Result<PooledPlan> {
    let threads = resolve_threads(opts.num_threads)?;
    let c = check_pooled(dim, r, Devices::Host)?;
    if overlaps(c.o.byte_range(), table_range) {
        return Err(Error::layout("out", "overlaps the memory of the table's vectors; expected a separate buffer"));
    }
    let PooledChecked { k, kd: key_dtype, bags, w, o, od, b, nnz } = c;
    let bags = match bags {
        CheckedBags::Fixed(l) => Bags::Fixed(l),
        CheckedBags::Read(o, _) => Bags::Offsets(o),
        CheckedBags::InPlace { .. } => return Err(Error::Internal("host offsets left unread".into())),
    };
    let keys = KeySource { ptr: k.ptr, dtype: key_dtype, walk: Walk::new(&k.shape, &k.strides), elem: k.elem };
    let weights = w.map(|w| WeightSource { ptr: w.ptr, walk: Walk::new(&w.shape, &w.strides) });
    let out = OutTarget { ptr: o.ptr, dtype: od, walk: Walk::new(&[b], &[o.strides[0]]), col_stride: o.strides[1] as usize };
    Ok(PooledPlan { keys, weights, bags, b, nnz, out, pooling, threads, key_dtype })
}
