//! `strata_lookup_batch`: plan every request, agree across ranks where a table is
//! distributed, run every plan.

use super::{Call, Collective, Table};
use crate::error::Result;
use crate::model::{LookupOptions, LookupStats, Planned, Request};

/// One request of a batch ([`lookup_batch`]): a table and the tensors to look up in it.
/// Borrows the table and the tensors for the call only.
pub struct BatchRequest<'a> {
    pub table: &'a Table,
    pub request: Request<'a>,
}

/// A request checked and planned where it lies, ready to run.
struct Work<'a> {
    route: Route<'a>,
    /// The plan of a host request (its table's [`super::TableImpl::plan`]).
    plan: Planned,
}

/// Where a request of the batch runs.
enum Route<'a> {
    /// On the host, by its table's implementation.
    Host,
    /// CUDA tensors, validated for their device: every such request of the batch runs together
    /// on the stream (`exec::cuda::pooled::run`).
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::exec::cuda::pooled::Valid<'a>>),
    #[cfg(not(feature = "cuda"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'a ()>),
}

impl<'a> BatchRequest<'a> {
    /// Checks this request into `w`: CUDA tensors for their device, host tensors by the
    /// table's plan (on a distributed table, the checks each rank makes alone; the batch agrees
    /// on the outcome before any lookup). Nothing is written.
    fn check_into(&'a self, opts: &LookupOptions, w: &mut Work<'a>) -> Result<()> {
        let (t, r) = (self.table, &self.request);
        #[cfg(feature = "cuda")]
        if let Some(source) = t.on_cuda(r) {
            // SAFETY: a Request's tensors are valid (its constructor's contract).
            let v = unsafe { crate::exec::cuda::pooled::validate(source, &t.gpu, &t.resident, r, opts) }?;
            w.route = Route::Cuda(Box::new(v));
            return Ok(());
        }
        t.imp().plan(r, opts, &mut w.plan)
    }
}

/// The verdict of a batch's step: every rank's, where the batch holds a distributed table.
fn settle(c: Option<&dyn Collective>, local: Result<()>) -> Result<()> {
    match c {
        Some(c) => c.agree(Call::Batch, local),
        None => local,
    }
}

/// Output bytes of a batch below which it runs on the calling thread alone: a batch of many
/// small requests is then one dispatch, not one per request.
const INLINE_BYTES: usize = 256 * 1024;

/// Runs `requests` as one piece of work (see `strata_lookup_batch`): every request is checked
/// first (an error names it: `requests[7].keys: ...`), then they run in order, a small batch
/// wholly on the calling thread. Returns each request's stats.
pub fn lookup_batch(requests: &[BatchRequest], opts: &LookupOptions) -> Result<Vec<LookupStats>> {
    // Each request is planned in its slot and run there.
    let mut work: Vec<Work> = requests.iter().map(|_| Work { route: Route::Host, plan: Planned::Empty }).collect();
    let mut invalid = Ok(());
    for (i, (r, w)) in requests.iter().zip(work.iter_mut()).enumerate() {
        if let Err(e) = r.check_into(opts, w) {
            invalid = Err(e.within(format!("requests[{i}].")));
            break;
        }
    }
    // With a distributed table in the batch every rank must take the same path: they agree on
    // the checks before any collective lookup starts.
    let collective = requests.iter().find_map(|r| r.table.imp().collective());
    settle(collective, invalid)?;
    let bytes: usize = requests.iter().zip(&work).map(|(r, w)| r.table.imp().bytes(&w.plan)).sum();
    let threads = if bytes < INLINE_BYTES { 1 } else { usize::MAX };
    let mut stats = vec![LookupStats::default(); work.len()];
    // A request can still fail while running (a missing key under STRATA_MISSING_ERROR). In a
    // collective batch every rank must still reach the same collective steps: after a failure
    // the local requests are skipped, the collective ones still run, and the ranks agree on the
    // outcome at the end.
    let mut failed = Ok(());
    // The CUDA requests first, all together: queued on the stream, they run while the host
    // requests do (unless one of them makes the call wait).
    #[cfg(feature = "cuda")]
    {
        let (at, cuda): (Vec<usize>, Vec<&crate::exec::cuda::pooled::Valid>) = work
            .iter()
            .enumerate()
            .filter_map(|(i, w)| match &w.route {
                Route::Cuda(v) => Some((i, &**v)),
                Route::Host => None,
            })
            .unzip();
        if !cuda.is_empty() {
            // SAFETY: the requests' tensors are valid (a Request's contract) and opts.stream is
            // NULL or live (LookupOptions').
            match unsafe { crate::exec::cuda::pooled::run(&cuda, opts) } {
                Ok(found) => at.into_iter().zip(found).for_each(|(i, s)| stats[i] = s),
                Err((j, e)) => failed = Err(e.within(format!("requests[{}].", at[j]))),
            }
        }
    }
    // A batch large enough for several threads runs the host requests that have a shared job
    // (static tables) all together, as one piece of work (exec::batch), their outcomes taken in
    // order below; a small one runs every request inline, in order.
    let mut outcomes: Vec<Option<Result<LookupStats>>> = Vec::new();
    if failed.is_ok() && threads > 1 {
        outcomes = (0..work.len()).map(|_| None).collect();
        let (at, jobs): (Vec<usize>, Vec<crate::exec::batch::Job>) = requests
            .iter()
            .zip(&work)
            .enumerate()
            .filter(|(_, (_, w))| matches!(w.route, Route::Host))
            .filter_map(|(i, (r, w))| r.table.imp().job(&w.plan).map(|j| (i, j)))
            .unzip();
        if !jobs.is_empty() {
            for (i, r) in at.into_iter().zip(crate::exec::batch::run(&jobs, threads)) {
                outcomes[i] = Some(r);
            }
        }
    }
    // The other host requests, in order, each run where it was planned.
    for (i, (r, w)) in requests.iter().zip(work.iter_mut()).enumerate() {
        if !matches!(w.route, Route::Host) {
            continue;
        }
        if let Some(outcome) = outcomes.get_mut(i).and_then(Option::take) {
            match outcome {
                Ok(s) => stats[i] = s,
                Err(e) if failed.is_ok() => failed = Err(e.within(format!("requests[{i}]."))),
                Err(_) => {}
            }
            continue;
        }
        let imp = r.table.imp();
        if failed.is_err() && imp.collective().is_none() {
            continue;
        }
        match imp.run(&r.request, &mut w.plan, threads, opts) {
            Ok(s) => stats[i] = s,
            Err(e) if failed.is_ok() => failed = Err(e.within(format!("requests[{i}]."))),
            Err(_) => {}
        }
    }
    settle(collective, failed)?;
    Ok(stats)
}
