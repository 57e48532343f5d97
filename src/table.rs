//! The table behind a `strata_table*` handle: a static table, a tiered table of a parameter
//! server, or a table spread over MPI ranks, with its CUDA residency. Lookups are dispatched
//! here to the executor for the table's kind and the tensors' device.
//!
//! A [`Table`] is immutable or internally synchronised, and `Send + Sync`: any number of
//! threads may look it up at once.

use crate::error::{Error, Result};
use crate::model::{
    GpuOptions, LookupOptions, LookupStats, Planned, Pooling, Request, RowSource, StaticTable, TableInfo, TableOptions, TieredTable,
    plan_pooled, read_keys, read_rows,
};
use crate::dlpack::FloatDtype;
use crate::partition;
use dlpark::ManagedTensorBase;
use dlpark::ffi::DLTensor;
use std::path::Path;

/// The table behind a `strata_table*` handle: a static table or (from a parameter server) a
/// tiered one. Immutable or internally synchronised: `Send + Sync`, many threads may look it
/// up at once.
pub struct Table {
    /// The table's copies, registrations and caches on CUDA devices, made on first use.
    /// Declared first so that it is dropped first: its drop waits for queued GPU work that
    /// still reads the rows below.
    #[cfg(feature = "cuda")]
    pub(crate) resident: crate::exec::cuda::Residency,
    pub(crate) kind: TableKind,
    /// Where lookups on CUDA tensors find rows.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu: GpuOptions,
}

/// What a [`Table`] is.
pub(crate) enum TableKind {
    Static(StaticTable),
    Tiered(crate::model::TieredTable),
    /// Spread over MPI ranks (feature `mpi`; without it this variant has no values).
    Dist(Box<crate::dist::DistTable>),
}

impl From<StaticTable> for Table {
    fn from(t: StaticTable) -> Self {
        let gpu = t.gpu;
        Table::new(TableKind::Static(t), gpu)
    }
}

impl From<crate::dist::DistTable> for Table {
    fn from(t: crate::dist::DistTable) -> Self {
        // Distributed lookups take host tensors only, so the GPU options stay the defaults.
        Table::new(TableKind::Dist(Box::new(t)), GpuOptions::default())
    }
}

impl Table {
    /// The lookup timing of a distributed table; `None` for other tables.
    pub fn dist_timing(&self) -> Option<crate::dist::DistTiming> {
        match &self.kind {
            TableKind::Dist(d) => Some(d.timing()),
            _ => None,
        }
    }

    /// A table of `kind`, owned by its handle.
    pub(crate) fn new(kind: TableKind, gpu: GpuOptions) -> Self {
        Table {
            kind,
            gpu,
            #[cfg(feature = "cuda")]
            resident: Default::default(),
        }
    }

    /// See [`StaticTable::from_dlpack`].
    ///
    /// # Safety
    /// As for [`StaticTable::from_dlpack`].
    pub unsafe fn from_dlpack(vectors: &DLTensor, keys: Option<&DLTensor>, options: TableOptions) -> Result<Self> {
        // SAFETY: the caller upholds StaticTable::from_dlpack's contract, which is this one's.
        Ok(unsafe { StaticTable::from_dlpack(vectors, keys, options) }?.into())
    }

    /// See [`StaticTable::adopt`].
    ///
    /// # Safety
    /// As for [`StaticTable::adopt`].
    pub unsafe fn adopt<M: ManagedTensorBase>(managed: *mut M, keys: Option<&DLTensor>, options: TableOptions) -> Result<Self> {
        // SAFETY: the caller upholds StaticTable::adopt's contract, which is this one's.
        Ok(unsafe { StaticTable::adopt(managed, keys, options) }?.into())
    }

    /// See [`StaticTable::open`].
    pub fn open(dir: &Path, dim: i64, options: TableOptions) -> Result<Self> {
        Ok(StaticTable::open(dir, dim, options)?.into())
    }

    /// A dense table (key = global row number) from a `__partitioned__` description of a
    /// [rows, dim] array split along rows: see `strata_table_from_partitioned`. `comm` is an
    /// `MPI_Fint` to spread the table over that communicator's ranks (collective), or `None` for
    /// one process holding every partition. `desc` and `options` may be the errors of reading
    /// them: with a communicator, every rank then learns of the failure in the collective call
    /// instead of waiting for the rank that failed.
    ///
    /// # Safety
    /// As for [`partition::validate`]; a borrowed partition's memory must stay valid and
    /// unchanged until the table is dropped.
    pub unsafe fn from_description(
        desc: Result<partition::Description<'_>>,
        comm: Option<i32>,
        options: Result<TableOptions>,
    ) -> Result<Self> {
        match comm {
            // SAFETY: the caller upholds what DistTable::from_partitioned needs: desc is valid as
            // partition::validate requires, and borrowed partitions outlive the table.
            Some(fint) => Ok(unsafe { crate::dist::DistTable::from_partitioned(desc, fint, options) }?.into()),
            None => {
                let options = options?;
                // SAFETY: the caller guarantees desc is valid as partition::validate requires and
                // that borrowed partitions outlive the table, which is what table_from needs.
                Ok(unsafe { partition::table_from(partition::validate(desc?)?, options) }?.into())
            }
        }
    }

    /// Describes a dense static or distributed table with the `__partitioned__` protocol: see
    /// `strata_table_partitioned`. Keyed and server tables have no such view.
    pub fn describe(&self) -> Result<partition::TableDescription> {
        match &self.kind {
            TableKind::Static(t) => partition::describe(t),
            TableKind::Dist(t) => t.describe(),
            TableKind::Tiered(_) => {
                Err(Error::invalid("table", "is a parameter-server table; expected a dense static or distributed table"))
            }
        }
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        match &self.kind {
            TableKind::Static(t) => t.dim(),
            TableKind::Tiered(t) => t.dim(),
            TableKind::Dist(t) => t.dim(),
        }
    }

    /// Number of rows (keys) the table holds.
    pub fn len(&self) -> usize {
        match &self.kind {
            TableKind::Static(t) => t.len(),
            TableKind::Tiered(t) => t.len(),
            TableKind::Dist(t) => t.len(),
        }
    }

    /// Whether the table holds no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A summary of the table.
    pub fn info(&self) -> TableInfo {
        match &self.kind {
            TableKind::Static(t) => t.info(),
            TableKind::Tiered(t) => TableInfo {
                rows: t.len() as i64,
                dim: t.dim() as i64,
                dtype: FloatDtype::F32,
                keyed: true,
                mapped: false,
                adopted: false,
                index_bytes: 0,
                vector_bytes: (t.len() * t.dim() * 4) as u64,
            },
            TableKind::Dist(t) => t.info(),
        }
    }

    /// Cumulative counters of a server table's tiers (all zero for static tables, which keep
    /// no counters).
    pub fn stats(&self) -> crate::model::TableStats {
        match &self.kind {
            TableKind::Static(_) | TableKind::Dist(_) => crate::model::TableStats::default(),
            TableKind::Tiered(t) => t.stats(),
        }
    }

    /// Inserts or overwrites rows: `keys` a 1-D integer tensor of n keys, `vectors` [n, dim]
    /// float32/float16/bfloat16 (both host memory, read during the call only). Only server
    /// tables can change; on a tiered table the write is durable in the persistent tier when
    /// this returns.
    ///
    /// # Safety
    /// The tensors must describe readable host memory as DLPack requires.
    pub unsafe fn upsert(&self, keys: &DLTensor, vectors: &DLTensor) -> Result<()> {
        let t = self.tiered("upsert")?;
        // SAFETY: the caller guarantees keys describes readable host memory as DLPack requires.
        let k = unsafe { read_keys(keys) }?;
        // SAFETY: the caller guarantees the same of vectors.
        let rows = unsafe { read_rows(vectors, k.len(), t.dim()) }?;
        t.upsert(&k, &rows)
    }

    /// Removes `keys` (a 1-D integer tensor) from every tier; returns how many the table held.
    ///
    /// # Safety
    /// `keys` must describe readable host memory as DLPack requires.
    pub unsafe fn erase(&self, keys: &DLTensor) -> Result<u64> {
        let t = self.tiered("erase")?;
        // SAFETY: the caller guarantees keys describes readable host memory as DLPack requires.
        let k = unsafe { read_keys(keys) }?;
        t.erase(&k)
    }

    fn tiered(&self, op: &str) -> Result<&crate::model::TieredTable> {
        match &self.kind {
            TableKind::Tiered(t) => Ok(t),
            TableKind::Static(_) | TableKind::Dist(_) => Err(Error::Immutable {
                what: "table".into(),
                why: format!(
                    "{op} needs a parameter-server table (strata_server_table); tables from \
                     strata_table_from_dlpack, strata_table_adopt_dlpack or strata_table_open are immutable"
                ),
            }),
        }
    }

    /// The error of a call this rank refuses before it starts (a bad argument). On a distributed
    /// table the call is collective: the other ranks, waiting in its first agreement, fail with
    /// this error too, instead of waiting forever. Other tables just return it.
    pub fn refuse(&self, e: Error) -> Error {
        match &self.kind {
            TableKind::Dist(d) => d.agree::<()>(Err(e)).err().unwrap_or_else(|| Error::Internal("agree dropped an error".into())),
            _ => e,
        }
    }

    /// [`Table::refuse`] for a plain lookup ([`Table::lookup`]), whose first collective step on
    /// a distributed table is the count exchange rather than an agreement.
    pub fn refuse_lookup(&self, e: Error) -> Error {
        match &self.kind {
            TableKind::Dist(d) => d.refuse_lookup(e),
            _ => e,
        }
    }

    /// Whether lookups on this table are collective (a distributed table).
    pub fn is_distributed(&self) -> bool {
        matches!(self.kind, TableKind::Dist(_))
    }

    /// The table as a source of rows on the host: static and tiered tables; `None` for a
    /// distributed table, whose rows are spread over ranks.
    pub fn source(&self) -> Option<&dyn RowSource> {
        match &self.kind {
            TableKind::Static(t) => Some(t),
            TableKind::Tiered(t) => Some(t),
            TableKind::Dist(_) => None,
        }
    }
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
    /// `out` writable, for every element their shape and strides reach. CUDA tensors must stay
    /// so until `opts.stream` has run the lookup, and `opts.stream` must be NULL or a live
    /// stream of their device's primary context.
    pub unsafe fn lookup(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<LookupStats> {
        // SAFETY: lookup_request has this function's contract, which the caller upholds.
        unsafe { self.lookup_request(&Request::plain(keys, out, true), opts) }
    }

    /// Runs one lookup, plain or pooled (see [`Request`]): what `strata_lookup` and
    /// `strata_lookup_pooled` do. A pooled lookup takes 1-D `keys` with `offsets`, or 2-D `keys`
    /// [B, L]; `weights` NULL or float32 of the keys' shape; `out` [B, dim]; its stats count
    /// keys. On CUDA tensors, only `r.want_stats` (or a table whose missing keys are errors)
    /// makes the call wait for the stream. The tensors are borrowed for the call only.
    ///
    /// # Safety
    /// As for [`Table::lookup`], with `offsets` and `weights` readable as `keys` is.
    pub unsafe fn lookup_request(&self, r: &Request, opts: &LookupOptions) -> Result<LookupStats> {
        // Distributed tables validate devices collectively (so every rank fails together).
        #[cfg(feature = "cuda")]
        if let Some(source) = self.source()
            && r.tensors().any(|(t, _)| crate::exec::cuda::run::is_cuda(t))
        {
            // SAFETY: the CUDA lookups need this function's contract, which the caller upholds:
            // valid tensors (CUDA ones until the stream has run the lookup) and a live
            // opts.stream.
            return unsafe {
                match r.pooling {
                    None => crate::exec::cuda::run::lookup(source, &self.gpu, &self.resident, r.keys, r.out, opts, r.want_stats),
                    Some(_) => crate::exec::cuda::pooled::lookup(source, &self.gpu, &self.resident, r, opts),
                }
            };
        }
        let r = BatchRequest { table: self, request: *r };
        let mut w = Work::NOTHING;
        // SAFETY: planning and running a request need this function's contract, which the caller
        // upholds.
        unsafe {
            r.plan_into(opts, &mut w)?;
            w.run(usize::MAX, opts)
        }
    }
}

/// A pooled lookup on a distributed table: validated on every rank together, then one
/// collective gather of every key's row, pooled locally.
///
/// # Safety
/// As for [`Table::lookup_request`].
unsafe fn pool_dist(t: &crate::dist::DistTable, r: &Request, pooling: Pooling, opts: &LookupOptions) -> Result<LookupStats> {
    // SAFETY: forwarded from the caller.
    let p = t.agree(unsafe { plan_pooled(t.dim(), (0, 0), r, pooling, opts) })?;
    let dim = t.dim();
    let mut rows = vec![0f32; p.nnz * dim];
    let mut shape = [p.nnz as i64, dim as i64];
    let staged = DLTensor {
        data: rows.as_mut_ptr().cast(),
        device: dlpark::ffi::DLDevice { device_type: dlpark::ffi::DLDeviceType::CPU, device_id: 0 },
        ndim: 2,
        dtype: FloatDtype::F32.dl(),
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: keys as the caller vouched; `staged` describes `rows`, nnz x dim.
    let found = unsafe { t.lookup(r.keys, &staged, opts) }?;
    crate::exec::pooled::pool_gathered(&rows, dim, &p)?;
    Ok(found)
}

/// One request of a batch ([`lookup_batch`]): a table and the tensors to look up in it. A
/// `strata_lookup`, a `strata_lookup_pooled` and each request of a batch are planned by the same
/// step ([`BatchRequest::plan_into`]) and run by the same code ([`Work::run`]). Borrows the table
/// and the tensors for the call only.
pub struct BatchRequest<'a> {
    pub table: &'a Table,
    pub request: Request<'a>,
}

/// A request planned where it lies, ready to run (by reference: [`Work::run`]): the table it
/// runs on and, for a host request, its plan. Planning a host request of ordinary rank
/// allocates nothing (besides the copy of more than a few offsets).
struct Work<'a> {
    on: On<'a>,
    /// The host plan of a static or tiered table's request ([`Planned::Empty`] otherwise).
    plan: Planned,
}

/// What a [`Work`] runs on.
enum On<'a> {
    /// Not planned yet.
    Nothing,
    Static(&'a StaticTable),
    Tiered(&'a TieredTable),
    /// CUDA tensors, validated for their device: every such request of the batch runs together
    /// on the stream (`exec::cuda::pooled::run`).
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::exec::cuda::pooled::Valid<'a>>),
    /// A distributed table: validated and run collectively by its own lookup.
    Dist(&'a crate::dist::DistTable, &'a Request<'a>),
}

impl<'a> BatchRequest<'a> {
    /// Plans this request for the host into `w`: every tensor validated against the table
    /// (nothing is written). A distributed table's request is left to its collective lookup.
    ///
    /// # Safety
    /// As for [`Table::lookup_request`].
    unsafe fn plan_into(&'a self, opts: &LookupOptions, w: &mut Work<'a>) -> Result<()> {
        let r = &self.request;
        // SAFETY: the caller vouches for the tensors each arm plans.
        unsafe {
            match &self.table.kind {
                TableKind::Static(t) => {
                    w.on = On::Static(t);
                    r.plan_into(t.dim(), t.store().byte_range(), opts, &mut w.plan)
                }
                // A tiered table's rows live in its tiers, not in caller memory, so there is no
                // range to keep out clear of.
                TableKind::Tiered(t) => {
                    w.on = On::Tiered(t);
                    r.plan_into(t.dim(), (0, 0), opts, &mut w.plan)
                }
                TableKind::Dist(t) => {
                    w.on = On::Dist(t, r);
                    Ok(())
                }
            }
        }
    }

    /// Validates this request of a batch into `w`: CUDA tensors for their device, host tensors
    /// by [`BatchRequest::plan_into`], and a distributed table's tensors by the same local
    /// checks its collective lookup makes (the batch agrees on the outcome before any lookup).
    ///
    /// # Safety
    /// As for [`lookup_batch`].
    unsafe fn validate_into(&'a self, opts: &LookupOptions, w: &mut Work<'a>) -> Result<()> {
        let (t, r) = (self.table, &self.request);
        #[cfg(feature = "cuda")]
        if let Some(source) = t.source()
            && r.tensors().any(|(t, _)| crate::exec::cuda::run::is_cuda(t))
        {
            // SAFETY: the caller vouches for the tensors.
            let v = unsafe { crate::exec::cuda::pooled::validate(source, &t.gpu, &t.resident, r, opts) }?;
            w.on = On::Cuda(Box::new(v));
            return Ok(());
        }
        if let TableKind::Dist(d) = &t.kind {
            // SAFETY: the caller vouches for the tensors; this only checks them.
            unsafe { r.plan_into(d.dim(), (0, 0), opts, &mut w.plan) }?;
            w.plan = Planned::Empty;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.plan_into(opts, w) }
    }
}

impl Work<'_> {
    /// Nothing planned yet.
    const NOTHING: Self = Work { on: On::Nothing, plan: Planned::Empty };

    /// Bytes of rows this work reads (to size the batch's parallelism).
    fn bytes(&self) -> usize {
        match self.on {
            On::Static(t) => self.plan.keys() * t.dim() * 4,
            On::Tiered(t) => self.plan.keys() * t.dim() * 4,
            _ => 0,
        }
    }

    /// Runs on at most `threads` threads (the plan's own count lowered in place: nothing is
    /// copied).
    ///
    /// # Safety
    /// As for the call that planned it ([`Table::lookup_request`], [`lookup_batch`]).
    unsafe fn run(&mut self, threads: usize, opts: &LookupOptions) -> Result<LookupStats> {
        self.plan.cap_threads(threads);
        let pooled_stats = |f: crate::exec::cpu::Found| LookupStats { hits: f.hits, misses: f.misses, ..LookupStats::default() };
        match (&self.on, &self.plan) {
            (On::Nothing, _) => Err(Error::Internal("a batch request run before it was planned".into())),
            (On::Static(_) | On::Tiered(_), Planned::Empty) => Ok(LookupStats::default()),
            (On::Static(t), Planned::Plain(p)) => t.run_plan(p),
            (On::Tiered(t), Planned::Plain(p)) => t.lookup(p),
            (On::Static(t), Planned::Pooled(p)) => crate::exec::pooled::pool_static(t, p).map(pooled_stats),
            (On::Tiered(t), Planned::Pooled(p)) => crate::exec::pooled::pool_tiered(t, p),
            // SAFETY: the planning call's caller vouches for the tensors.
            #[cfg(feature = "cuda")]
            (On::Cuda(v), _) => unsafe { crate::exec::cuda::pooled::run(&[&**v], opts) }.map(|mut s| s.remove(0)).map_err(|(_, e)| e),
            // SAFETY: the planning call's caller vouches for the request's tensors.
            (On::Dist(t, r), _) => unsafe {
                match r.pooling {
                    None => t.lookup(r.keys, r.out, opts),
                    Some(pooling) => pool_dist(t, r, pooling, opts),
                }
            },
        }
    }
}

/// Output bytes of a batch below which it runs on the calling thread alone: a batch of many
/// small requests is then one dispatch, not one per request.
const INLINE_BYTES: usize = 256 * 1024;

/// Runs `requests` as one piece of work (see `strata_lookup_batch`): every request is validated
/// first (an error names it: `requests[7].keys: ...`), then they run in order, a small batch
/// wholly on the calling thread. Returns each request's stats.
///
/// # Safety
/// Every request's tensors must describe memory valid as DLPack requires.
pub unsafe fn lookup_batch(requests: &[BatchRequest], opts: &LookupOptions) -> Result<Vec<LookupStats>> {
    // Each request is planned in its slot and run there.
    let mut work: Vec<Work> = requests.iter().map(|_| Work::NOTHING).collect();
    let mut invalid = Ok(());
    for (i, (r, w)) in requests.iter().zip(work.iter_mut()).enumerate() {
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { r.validate_into(opts, w) } {
            invalid = Err(e.within(format!("requests[{i}].")));
            break;
        }
    }
    // With a distributed table in the batch every rank must take the same path: they agree on
    // the validation before any collective lookup starts.
    let dist = requests.iter().find_map(|r| match &r.table.kind {
        TableKind::Dist(d) => Some(d),
        _ => None,
    });
    match dist {
        Some(d) => d.agree(invalid)?,
        None => invalid?,
    }
    let bytes: usize = work.iter().map(Work::bytes).sum();
    let threads = if bytes < INLINE_BYTES { 1 } else { usize::MAX };
    let mut stats = vec![LookupStats::default(); work.len()];
    // A request can still fail while running (a missing key under STRATA_MISSING_ERROR). In a
    // collective batch every rank must still reach the same collective steps: after a failure
    // the local requests are skipped, the distributed ones still run, and the ranks agree on
    // the outcome at the end.
    let mut failed = Ok(());
    // The CUDA requests first, all together: queued on the stream, they run while the host
    // requests do (unless one of them makes the call wait).
    #[cfg(feature = "cuda")]
    {
        let (at, cuda): (Vec<usize>, Vec<&crate::exec::cuda::pooled::Valid>) = work
            .iter()
            .enumerate()
            .filter_map(|(i, w)| match &w.on {
                On::Cuda(v) => Some((i, &**v)),
                _ => None,
            })
            .unzip();
        if !cuda.is_empty() {
            // SAFETY: forwarded from the caller.
            match unsafe { crate::exec::cuda::pooled::run(&cuda, opts) } {
                Ok(found) => at.into_iter().zip(found).for_each(|(i, s)| stats[i] = s),
                Err((j, e)) => failed = Err(e.within(format!("requests[{}].", at[j]))),
            }
        }
    }
    // A batch large enough for several threads runs its host requests on static tables all
    // together, as one piece of work (exec::batch), their outcomes taken in order below; a small
    // one runs every request inline, in order (no tasks to share, nothing to set up).
    let mut outcomes: Vec<Option<Result<LookupStats>>> = Vec::new();
    if failed.is_ok() && threads > 1 {
        outcomes = (0..work.len()).map(|_| None).collect();
        let (at, jobs): (Vec<usize>, Vec<crate::exec::batch::Job>) = work
            .iter()
            .enumerate()
            .filter_map(|(i, w)| match (&w.on, &w.plan) {
                (On::Static(t), Planned::Plain(p)) => Some((i, crate::exec::batch::Job::Plain(t, p))),
                (On::Static(t), Planned::Pooled(p)) => Some((i, crate::exec::batch::Job::Pooled(t, p))),
                _ => None,
            })
            .unzip();
        if !jobs.is_empty() {
            for (i, r) in at.into_iter().zip(crate::exec::batch::run(&jobs, threads)) {
                outcomes[i] = Some(r);
            }
        }
    }
    // The other host requests, in order, each run where it was planned.
    for (i, w) in work.iter_mut().enumerate() {
        #[cfg(feature = "cuda")]
        if let On::Cuda(_) = w.on {
            continue;
        }
        if let Some(r) = outcomes.get_mut(i).and_then(Option::take) {
            match r {
                Ok(s) => stats[i] = s,
                Err(e) if failed.is_ok() => failed = Err(e.within(format!("requests[{i}]."))),
                Err(_) => {}
            }
            continue;
        }
        if failed.is_err() && (dist.is_none() || !matches!(w.on, On::Dist(..))) {
            continue;
        }
        // SAFETY: forwarded from the caller.
        match unsafe { w.run(threads, opts) } {
            Ok(s) => stats[i] = s,
            Err(e) if failed.is_ok() => failed = Err(e.within(format!("requests[{i}]."))),
            Err(_) => {}
        }
    }
    match dist {
        Some(d) => d.agree(failed)?,
        None => failed?,
    }
    Ok(stats)
}
