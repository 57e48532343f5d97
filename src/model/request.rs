//! One lookup's tensors, as the C calls give them: the set that `strata_lookup`,
//! `strata_lookup_pooled` and each `strata_lookup_request` of a batch pass down to the planner
//! (host tensors) or to the CUDA path (device tensors), held in one struct instead of one
//! argument per tensor.

use super::plan::{LookupOptions, Plan, plan_into};
use super::pooled::{Pooling, PooledPlan, plan_pooled};
use crate::error::Result;
use dlpark::ffi::DLTensor;

/// The tensors of one lookup: plain (one row per key) when `pooling` is `None`, else pooled
/// (one row per bag of keys).
///
/// Ownership: borrows the caller's tensor descriptions for one call and owns nothing; the memory
/// they describe is the caller's, read (`keys`, `offsets`, `weights`) and written (`out`) during
/// the call only, or, for CUDA tensors, until the call's stream has run the lookup. `Copy`:
/// passing it copies the references, not the tensors.
#[derive(Clone, Copy)]
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
}

impl<'a> Request<'a> {
    /// A plain lookup of `keys` into `out`.
    pub fn plain(keys: &'a DLTensor, out: &'a DLTensor, want_stats: bool) -> Self {
        Request { keys, offsets: None, weights: None, pooling: None, out, want_stats }
    }

    /// The tensors given, each with the argument name messages use: keys, offsets, weights, out.
    pub fn tensors(&self) -> impl Iterator<Item = (&'a DLTensor, &'static str)> {
        [(Some(self.keys), "keys"), (self.offsets, "offsets"), (self.weights, "weights"), (Some(self.out), "out")]
            .into_iter()
            .filter_map(|(t, arg)| t.map(|t| (t, arg)))
    }

    /// Validates this request's host tensors for a table of `dim` whose own memory is
    /// `table_range` (a tiered table's rows are not caller memory: `(0, 0)`), writing the plan
    /// into `slot`, its final place: a plan is a few hundred bytes, and is run where it lies.
    /// Nothing of the caller's is written; on error `slot` is left as it was.
    ///
    /// # Safety
    /// The tensors must describe memory valid as DLPack requires: `keys`, `offsets` and
    /// `weights` readable, `out` writable, for every element their shape and strides reach.
    #[inline]
    pub(crate) unsafe fn plan_into(&self, dim: usize, table_range: (usize, usize), opts: &LookupOptions, slot: &mut Planned) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self.pooling {
                None => plan_into(dim, table_range, self.keys, self.out, opts, slot),
                Some(pooling) => {
                    *slot = Planned::Pooled(plan_pooled(dim, table_range, self, pooling, opts)?);
                    Ok(())
                }
            }
        }
    }
}

/// A host request, validated by [`Request::plan_into`]: what the executors run.
pub(crate) enum Planned {
    /// Nothing to do: a plain lookup of no keys (or a slot not planned yet).
    Empty,
    Plain(Plan),
    Pooled(PooledPlan),
}

impl Planned {
    /// Keys whose rows this plan reads.
    pub(crate) fn keys(&self) -> usize {
        match self {
            Planned::Empty => 0,
            Planned::Plain(p) => p.n,
            Planned::Pooled(p) => p.nnz,
        }
    }

    /// Lowers the threads the plan may use to at most `threads`.
    pub(crate) fn cap_threads(&mut self, threads: usize) {
        match self {
            Planned::Empty => {}
            Planned::Plain(p) => p.threads = p.threads.min(threads),
            Planned::Pooled(p) => p.threads = p.threads.min(threads),
        }
    }
}
