//! One lookup's tensors, as the C calls give them: the set that `strata_lookup`,
//! `strata_lookup_pooled` and each `strata_lookup_request` of a batch pass down to the planner
//! (host tensors) or to the CUDA path (device tensors), held in one struct instead of one
//! argument per tensor.

use crate::error::{Error, Result};
use dlpark::ffi::DLTensor;

/// The tensors of one lookup: plain (one row per key) when `pooling` is `None`, else pooled
/// (one row per bag of keys).
///
/// Ownership: borrows the caller's tensor descriptions for one call and owns nothing; the memory
/// they describe is the caller's, read (`keys`, `offsets`, `weights`) and written (`out`) during
/// the call only, or, for CUDA tensors, until the call's stream has run the lookup. `Copy`:
/// passing it copies the references, not the tensors.
///
/// The one unsafe step of a lookup: a `Request` is only made by [`Request::new`] or
/// [`Request::plain`], whose caller vouches that every tensor describes memory valid as DLPack
/// requires (`keys`, `offsets` and `weights` readable, `out` writable, for every element their
/// shape and strides reach) for as long as the request lives, and for CUDA tensors until the
/// call's stream has run the lookup. Everything that takes a `Request` relies on that and is
/// safe to call.
#[derive(Clone, Copy)]
#[allow(clippy::manual_non_exhaustive)] // the private field seals construction inside this crate too, which #[non_exhaustive] does not
pub struct Request<'a> {
    /// Any integer dtype, shape and strides: plain, any shape; pooled, 1-D `[nnz]` with
    /// `offsets` or 2-D `[B, L]` without.
    pub keys: &'a DLTensor,
    /// Pooled only: the `B + 1` offsets of 1-D keys' bags (ignored by a plain lookup).
    pub offsets: Option<&'a DLTensor>,
    /// Pooled only: float32 weights of the keys' shape (ignored by a plain lookup).
    pub weights: Option<&'a DLTensor>,
    /// `None`: a plain lookup.
    pub pooling: Option<Pooling>,
    /// The rows written: `[*keys.shape, dim]` or `[numel(keys), dim]` plain, `[B, dim]` pooled.
    pub out: &'a DLTensor,
    /// Whether the caller wants this lookup's stats (on CUDA tensors, makes the call wait).
    pub want_stats: bool,
    /// Private: a request is only made by the unsafe constructors.
    _vouched: (),
}

impl<'a> Request<'a> {
    /// A lookup of these tensors (see the fields).
    ///
    /// # Safety
    /// Every tensor must describe memory valid as DLPack requires, as the type's docs say, for
    /// `'a` (CUDA tensors: until the call's stream has run the lookup).
    pub unsafe fn new(
        keys: &'a DLTensor,
        offsets: Option<&'a DLTensor>,
        weights: Option<&'a DLTensor>,
        pooling: Option<Pooling>,
        out: &'a DLTensor,
        want_stats: bool,
    ) -> Self {
        Request { keys, offsets, weights, pooling, out, want_stats, _vouched: () }
    }

    /// A plain lookup of `keys` into `out`.
    ///
    /// # Safety
    /// As for [`Request::new`].
    pub unsafe fn plain(keys: &'a DLTensor, out: &'a DLTensor, want_stats: bool) -> Self {
        Request { keys, offsets: None, weights: None, pooling: None, out, want_stats, _vouched: () }
    }

    /// Whether the fields fit together: `offsets` and `weights` only with a pooling.
    pub fn fields_agree(&self) -> Result<()> {
        if self.pooling.is_none() && (self.offsets.is_some() || self.weights.is_some()) {
            let arg = if self.offsets.is_some() { "offsets" } else { "weights" };
            return Err(Error::invalid(arg, "given with pooling = STRATA_POOL_NONE; expected NULL for a plain lookup (or a pooling)"));
        }
        Ok(())
    }

    /// The tensors given, each with the argument name messages use: keys, offsets, weights, out.
    pub fn tensors(&self) -> impl Iterator<Item = (&'a DLTensor, &'static str)> {
        [(Some(self.keys), "keys"), (self.offsets, "offsets"), (self.weights, "weights"), (Some(self.out), "out")]
            .into_iter()
            .filter_map(|(t, arg)| t.map(|t| (t, arg)))
    }
}

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

impl Pooling {
    /// The pooling of a pooled lookup (`strata_lookup_pooled`), which must name one: `None`
    /// (`STRATA_POOL_NONE`, a plain lookup) is refused, naming `arg`.
    pub fn required(p: Option<Pooling>, arg: &'static str) -> Result<Pooling> {
        p.ok_or_else(|| {
            Error::invalid(
                arg,
                "0 (STRATA_POOL_NONE); expected STRATA_POOL_SUM (1), STRATA_POOL_MEAN (2) or STRATA_POOL_SQRTN (3) (use strata_lookup for unpooled rows)",
            )
        })
    }
}
