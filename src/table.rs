//! The table behind a `strata_table*` handle: a static table, a tiered table of a parameter
//! server, or a table spread over MPI ranks, with its CUDA residency. Lookups are dispatched
//! here to the executor for the table's kind and the tensors' device.
//!
//! A [`Table`] is immutable or internally synchronised, and `Send + Sync`: any number of
//! threads may look it up at once.

use crate::error::{Error, Result};
use crate::model::{Plan, PooledPlan, TieredTable, Pooling, plan_pooled, RowSource, GpuOptions, LookupOptions, LookupStats, StaticTable, TableInfo, TableOptions, plan, read_keys, read_rows};
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
        // SAFETY: lookup_with has this function's contract, which the caller upholds.
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
        if let Some(source) = self.source()
            && (crate::exec::cuda::run::is_cuda(keys) || crate::exec::cuda::run::is_cuda(out))
        {
            // SAFETY: run::lookup needs Table::lookup's contract, which the caller upholds: valid
            // tensors (CUDA ones until the stream has run the lookup) and a live opts.stream.
            return unsafe { crate::exec::cuda::run::lookup(source, &self.gpu, &self.resident, keys, out, opts, want_stats) };
        }
        let r = BatchRequest { table: self, keys, offsets: None, weights: None, pooling: None, out, want_stats };
        // SAFETY: planning and running a request need Table::lookup's contract, which the caller
        // upholds.
        unsafe { r.plan(opts)?.run(usize::MAX, opts) }
    }

    /// Looks up bags of keys and writes one pooled row per bag into `out` (see
    /// `strata_lookup_pooled`): 1-D `keys` with `offsets`, or 2-D `keys` [B, L]; `weights` NULL
    /// or float32 of the keys' shape; `out` [B, dim]. Stats count keys.
    ///
    /// # Safety
    /// The tensors must describe memory valid as DLPack requires: `keys`, `offsets` and
    /// `weights` readable, `out` writable, for every element their shape and strides reach.
    #[allow(clippy::too_many_arguments)] // one argument per tensor of the C call
    pub unsafe fn lookup_pooled(
        &self,
        keys: &DLTensor,
        offsets: Option<&DLTensor>,
        weights: Option<&DLTensor>,
        pooling: Pooling,
        out: &DLTensor,
        opts: &LookupOptions,
        want_stats: bool,
    ) -> Result<LookupStats> {
        let r = BatchRequest { table: self, keys, offsets, weights, pooling: Some(pooling), out, want_stats };
        #[cfg(feature = "cuda")]
        if let Some(source) = self.source()
            && r.on_cuda()
        {
            // SAFETY: forwarded: the caller vouches for the tensors (and, for CUDA tensors, for
            // their validity until the stream has run the lookup).
            return unsafe {
                crate::exec::cuda::pooled::lookup(source, &self.gpu, &self.resident, keys, offsets, weights, pooling, out, opts, want_stats)
            };
        }
        // SAFETY: planning and running a request need this function's contract, which the caller
        // upholds.
        unsafe { r.plan(opts)?.run(usize::MAX, opts) }
    }
}

/// A pooled lookup on a distributed table: validated on every rank together, then one
/// collective gather of every key's row, pooled locally.
///
/// # Safety
/// As for [`Table::lookup_pooled`].
unsafe fn pool_dist(t: &crate::dist::DistTable, r: &BatchRequest, pooling: Pooling, opts: &LookupOptions) -> Result<LookupStats> {
    // SAFETY: forwarded from the caller.
    let p = t.agree(unsafe { plan_pooled(t.dim(), (0, 0), r.keys, r.offsets, r.weights, pooling, r.out, opts) })?;
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

/// One lookup, as the C calls take it: plain when `pooling` is `None`, else pooled. A
/// `strata_lookup`, a `strata_lookup_pooled` and each request of a batch ([`lookup_batch`]) are
/// planned by the same step ([`BatchRequest::plan`]) and run by the same code ([`Work::run`]).
pub struct BatchRequest<'a> {
    pub table: &'a Table,
    pub keys: &'a DLTensor,
    pub offsets: Option<&'a DLTensor>,
    pub weights: Option<&'a DLTensor>,
    pub pooling: Option<Pooling>,
    pub out: &'a DLTensor,
    /// Whether the caller wants this request's stats (on CUDA tensors, makes it wait).
    pub want_stats: bool,
}

/// A planned request, ready to run. Planning a host request of ordinary rank allocates nothing
/// (besides the copy of more than a few offsets).
enum Work<'a> {
    Static(&'a StaticTable, Option<Plan>),
    Tiered(&'a TieredTable, Option<Plan>),
    PooledStatic(&'a StaticTable, PooledPlan),
    PooledTiered(&'a TieredTable, PooledPlan),
    /// CUDA tensors, validated for their device: every such request of the batch runs together
    /// on the stream (`exec::cuda::pooled::run`).
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::exec::cuda::pooled::Valid<'a>>),
    /// A distributed table: validated and run collectively by its own lookup.
    Dist(&'a crate::dist::DistTable, &'a BatchRequest<'a>),
}

impl<'a> BatchRequest<'a> {
    /// Whether a tensor of this request is CUDA memory.
    #[cfg(feature = "cuda")]
    fn on_cuda(&self) -> bool {
        [Some(self.keys), self.offsets, self.weights, Some(self.out)].into_iter().flatten().any(crate::exec::cuda::run::is_cuda)
    }

    /// Plans this request for the host: every tensor validated against the table (nothing is
    /// written). A distributed table's request is left to its collective lookup.
    ///
    /// # Safety
    /// As for [`Table::lookup`] (with `offsets` and `weights` readable as for
    /// [`Table::lookup_pooled`]).
    unsafe fn plan(&'a self, opts: &LookupOptions) -> Result<Work<'a>> {
        let (keys, out) = (self.keys, self.out);
        // SAFETY: the caller vouches for the tensors each arm plans.
        let work = unsafe {
            match (&self.table.kind, self.pooling) {
                (TableKind::Static(t), None) => Work::Static(t, plan(t.dim(), t.store().byte_range(), keys, out, opts)?),
                // A tiered table's rows live in its tiers, not in caller memory, so there is no
                // range to keep out clear of.
                (TableKind::Tiered(t), None) => Work::Tiered(t, plan(t.dim(), (0, 0), keys, out, opts)?),
                (TableKind::Static(t), Some(p)) => Work::PooledStatic(
                    t,
                    plan_pooled(t.dim(), t.store().byte_range(), keys, self.offsets, self.weights, p, out, opts)?,
                ),
                (TableKind::Tiered(t), Some(p)) => {
                    Work::PooledTiered(t, plan_pooled(t.dim(), (0, 0), keys, self.offsets, self.weights, p, out, opts)?)
                }
                (TableKind::Dist(t), _) => Work::Dist(t, self),
            }
        };
        Ok(work)
    }

    /// Validates this request of a batch into its work: CUDA tensors for their device, host
    /// tensors by [`BatchRequest::plan`], and a distributed table's tensors by the same local
    /// checks its collective lookup makes (the batch agrees on the outcome before any lookup).
    ///
    /// # Safety
    /// As for [`lookup_batch`].
    unsafe fn validate(&'a self, opts: &LookupOptions) -> Result<Work<'a>> {
        #[cfg(feature = "cuda")]
        if self.on_cuda()
            && let Some(source) = self.table.source()
        {
            let (t, r) = (self.table, self);
            let cuda = crate::exec::cuda::pooled::Request {
                source,
                gpu: &t.gpu,
                resident: &t.resident,
                keys: r.keys,
                offsets: r.offsets,
                weights: r.weights,
                pooling: r.pooling,
                out: r.out,
                want_stats: r.want_stats,
            };
            // SAFETY: the caller vouches for the tensors.
            return Ok(Work::Cuda(Box::new(unsafe { crate::exec::cuda::pooled::validate(&cuda, opts) }?)));
        }
        if let TableKind::Dist(t) = &self.table.kind {
            // SAFETY: the caller vouches for the tensors; this only checks them.
            unsafe {
                match self.pooling {
                    None => plan(t.dim(), (0, 0), self.keys, self.out, opts).map(drop),
                    Some(p) => plan_pooled(t.dim(), (0, 0), self.keys, self.offsets, self.weights, p, self.out, opts).map(drop),
                }
            }?;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.plan(opts) }
    }
}

impl Work<'_> {
    /// Bytes of rows this work reads (to size the batch's parallelism).
    fn bytes(&self) -> usize {
        match self {
            Work::Static(t, p) => p.as_ref().map_or(0, |p| p.n) * t.dim() * 4,
            Work::Tiered(t, p) => p.as_ref().map_or(0, |p| p.n) * t.dim() * 4,
            Work::PooledStatic(t, p) => p.nnz * t.dim() * 4,
            Work::PooledTiered(t, p) => p.nnz * t.dim() * 4,
            #[cfg(feature = "cuda")]
            Work::Cuda(_) => 0,
            Work::Dist(..) => 0,
        }
    }

    /// Runs on at most `threads` threads.
    ///
    /// # Safety
    /// As for the call that planned it ([`Table::lookup`], [`Table::lookup_pooled`],
    /// [`lookup_batch`]).
    unsafe fn run(self, threads: usize, opts: &LookupOptions) -> Result<LookupStats> {
        let pooled_stats = |f: crate::exec::cpu::Found| LookupStats { hits: f.hits, misses: f.misses, ..LookupStats::default() };
        match self {
            Work::Static(t, Some(p)) => t.run_plan(Plan { threads: p.threads.min(threads), ..p }),
            Work::Tiered(t, Some(p)) => t.lookup(&Plan { threads: p.threads.min(threads), ..p }),
            Work::Static(_, None) | Work::Tiered(_, None) => Ok(LookupStats::default()),
            Work::PooledStatic(t, p) => {
                crate::exec::pooled::pool_static(t, &PooledPlan { threads: p.threads.min(threads), ..p }).map(pooled_stats)
            }
            Work::PooledTiered(t, p) => crate::exec::pooled::pool_tiered(t, &PooledPlan { threads: p.threads.min(threads), ..p }),
            // SAFETY: the planning call's caller vouches for the tensors.
            #[cfg(feature = "cuda")]
            Work::Cuda(v) => unsafe { crate::exec::cuda::pooled::run(vec![*v], opts) }.map(|mut s| s.remove(0)).map_err(|(_, e)| e),
            // SAFETY: the planning call's caller vouches for the request's tensors.
            Work::Dist(t, r) => unsafe {
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
    let mut work = Vec::with_capacity(requests.len());
    let mut invalid = Ok(());
    for (i, r) in requests.iter().enumerate() {
        // SAFETY: forwarded from the caller.
        match unsafe { r.validate(opts) } {
            Ok(w) => work.push(w),
            Err(e) => {
                invalid = Err(e.within(format!("requests[{i}].")));
                break;
            }
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
    let mut rest = Vec::with_capacity(work.len());
    #[cfg(feature = "cuda")]
    let (mut at, mut cuda) = (Vec::new(), Vec::new());
    for (i, w) in work.into_iter().enumerate() {
        match w {
            #[cfg(feature = "cuda")]
            Work::Cuda(v) => {
                at.push(i);
                cuda.push(*v);
            }
            w => rest.push((i, w)),
        }
    }
    // A request can still fail while running (a missing key under STRATA_MISSING_ERROR). In a
    // collective batch every rank must still reach the same collective steps: after a failure
    // the local requests are skipped, the distributed ones still run, and the ranks agree on
    // the outcome at the end.
    let mut failed = Ok(());
    // The CUDA requests first, all together: queued on the stream, they run while the host
    // requests do (unless one of them makes the call wait).
    #[cfg(feature = "cuda")]
    if !cuda.is_empty() {
        // SAFETY: forwarded from the caller.
        match unsafe { crate::exec::cuda::pooled::run(cuda, opts) } {
            Ok(found) => at.into_iter().zip(found).for_each(|(i, s)| stats[i] = s),
            Err((j, e)) => failed = Err(e.within(format!("requests[{}].", at[j]))),
        }
    }
    for (i, w) in rest {
        if failed.is_err() && (dist.is_none() || !matches!(w, Work::Dist(..))) {
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
