//! A host request checked and planned ([`Planned`]): what [`Request::plan_into`] makes and the
//! executors run.

use super::plan::{LookupOptions, Plan, plan};
use super::pooled::{PooledPlan, plan_pooled};
use super::request::Request;
use crate::error::Result;

impl Request<'_> {
    /// Validates this request's host tensors for a table of `dim` whose own memory is
    /// `table_range` (a tiered table's rows are not caller memory: `(0, 0)`), writing the plan
    /// into `slot`, where it is run (a plan is a few hundred bytes: it is not copied again).
    /// Nothing of the caller's is written; on error `slot` is left as it was.
    ///
    #[inline]
    pub(crate) fn plan_into(&self, dim: usize, table_range: (usize, usize), opts: &LookupOptions, slot: &mut Planned) -> Result<()> {
        match self.pooling {
            None => {
                *slot = match plan(dim, table_range, self, opts)? {
                    Some(p) => Planned::Plain(p),
                    None => Planned::Empty,
                };
            }
            Some(pooling) => *slot = Planned::Pooled(plan_pooled(dim, table_range, self, pooling, opts)?),
        }
        Ok(())
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
