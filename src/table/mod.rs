//! The table behind a `strata_table*` handle, and the one interface every kind of table
//! implements.
//!
//! - [`TableImpl`]: what a kind of table does: its info and stats, updates, and lookups as a
//!   plan (the request checked against the table, nothing written) and a run of that plan. The
//!   static and tiered tables implement it in [`host`], the distributed table in `dist/`.
//! - [`Table`]: the handle: one implementation plus its CUDA residency. Device routing happens
//!   here, in [`Table::lookup_request`] and the batch: a request with CUDA tensors goes to the
//!   CUDA executor over the implementation's host rows ([`TableImpl::rows`]); every other request
//!   goes to the implementation.
//! - [`Collective`]: what a table whose calls are collective (spread over MPI ranks) answers for
//!   its calls' agreement and refusal steps; only `dist/` knows the steps themselves.
//! - [`lookup_batch`]: plan every request, agree across ranks where a table is distributed, run
//!   every plan.
//!
//! A [`Table`] is immutable or internally synchronised, and `Send + Sync`: any number of
//! threads may look it up at once.

mod batch;
mod host;

pub use batch::{BatchRequest, lookup_batch};

use crate::dlpack::Vouched;
use crate::error::{Error, Result};
use crate::exec::batch::Job;
use crate::model::{
    GpuOptions, LookupOptions, LookupStats, Planned, Request, RowSource, StaticTable, TableInfo, TableOptions, TableStats, read_keys,
    read_rows,
};
use crate::partition;
use dlpark::ManagedTensorBase;
use dlpark::ffi::DLTensor;
use std::path::Path;

/// One kind of table: static (caller or strata memory), tiered (a parameter server's), or
/// distributed over MPI ranks. `Send + Sync`: many threads may call it at once.
///
/// A lookup is [`TableImpl::plan`] (every tensor checked against the table, nothing written)
/// then [`TableImpl::run`]. A new lookup variant is a new shape of [`Request`]: planned and run
/// by each implementation, and nothing else. (`Any` only lets tests reach an implementation's
/// internals; the library never downcasts.)
pub(crate) trait TableImpl: Send + Sync + std::any::Any {
    /// Elements per row.
    fn dim(&self) -> usize;
    /// Rows (keys) the table holds.
    fn len(&self) -> usize;
    /// A summary of the table.
    fn info(&self) -> TableInfo;
    /// Cumulative counters of the table's tiers (zero for tables that keep none).
    fn stats(&self) -> TableStats {
        TableStats::default()
    }
    /// The table as a `__partitioned__` description (dense static and distributed tables).
    fn describe(&self) -> Result<partition::TableDescription> {
        Err(Error::invalid("table", "has no __partitioned__ view; expected a dense static or distributed table"))
    }
    /// Whether the table can change ([`TableImpl::upsert`], [`TableImpl::erase`]).
    fn is_mutable(&self) -> bool {
        false
    }
    /// Inserts or overwrites rows (canonical keys, `keys.len() * dim` float32 values).
    fn upsert(&self, _keys: &[u64], _rows: &[f32]) -> Result<()> {
        Err(immutable("upsert"))
    }
    /// Removes keys from every tier; returns how many the table held.
    fn erase(&self, _keys: &[u64]) -> Result<u64> {
        Err(immutable("erase"))
    }
    /// The table's rows on the host, for the CUDA executor (`None`: CUDA tensors are refused by
    /// the implementation's own checks, as a distributed table's are).
    fn rows(&self) -> Option<&dyn RowSource> {
        None
    }
    /// How the table's calls agree across ranks, where they are collective.
    fn collective(&self) -> Option<&dyn Collective> {
        None
    }
    /// The lookup timing of a distributed table.
    fn timing(&self) -> Option<DistTiming> {
        None
    }

    /// Checks `r` against the table and plans it into `plan`: every tensor validated, nothing
    /// written. On a collective table these are the checks each rank makes alone (the call's
    /// own collective steps check the rest).
    fn plan(&self, r: &Request, opts: &LookupOptions, plan: &mut Planned) -> Result<()>;

    /// Runs `r` as [`TableImpl::plan`] planned it (`plan`), on at most `threads` threads.
    fn run(&self, r: &Request, plan: &mut Planned, threads: usize, opts: &LookupOptions) -> Result<LookupStats>;

    /// One lookup on its own: plan, then run. Collective tables check inside their collective
    /// call instead.
    fn lookup(&self, r: &Request, opts: &LookupOptions) -> Result<LookupStats> {
        let mut plan = Planned::Empty;
        self.plan(r, opts, &mut plan)?;
        self.run(r, &mut plan, usize::MAX, opts)
    }

    /// The planned request as a job of a batch's shared work (`exec::batch`), where the kind
    /// has one; `None`: the batch runs it with [`TableImpl::run`].
    fn job<'a>(&'a self, _plan: &'a Planned) -> Option<Job<'a>> {
        None
    }

    /// Bytes of rows a plan reads (to size a batch's parallelism).
    fn bytes(&self, plan: &Planned) -> usize {
        plan.keys() * self.dim() * 4
    }
}

/// The collective calls of a table spread over ranks, and what each step is answered with.
/// Implemented by `dist/`, the only code that knows a call's steps.
pub(crate) trait Collective {
    /// The verdict of every rank on a step of `call` each ran locally: `Ok` on every rank when
    /// every rank succeeded, else every rank fails (see `dist`'s agreement).
    fn agree(&self, call: Call, local: Result<()>) -> Result<()>;
    /// The error of `call` refused on this rank before it started (a bad argument): takes part
    /// in the call's first collective step with the error, so the other ranks fail with it
    /// instead of waiting forever.
    fn refuse(&self, call: Call, e: Error) -> Error;
}

/// A collective call, as [`Collective`] answers for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `strata_lookup` (and its managed variants).
    Lookup,
    /// `strata_lookup_pooled`.
    Pooled,
    /// `strata_lookup_batch`.
    Batch,
}

/// Time spent in a distributed table's lookups, cumulative since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DistTiming {
    /// Collective lookups made.
    pub lookups: u64,
    /// Seconds inside the lookups, in total.
    pub total_s: f64,
    /// Of those, seconds inside MPI exchanges (waiting for other ranks included).
    pub exchange_s: f64,
    /// The phases of `total_s`, in the order they run: validating and bucketing keys by owner;
    /// the key exchange (counts and keys, waiting for other ranks included); the gather of the
    /// rows this rank serves; the row exchange (and found flags); writing rows into `out`.
    pub bucket_s: f64,
    pub key_exchange_s: f64,
    pub gather_s: f64,
    pub row_exchange_s: f64,
    pub reorder_s: f64,
    /// Keys this rank looked up, of those the keys sent to other ranks, and the keys this rank
    /// served for other ranks.
    pub keys: u64,
    pub keys_sent: u64,
    pub keys_served: u64,
    /// Bytes this rank sent to other ranks (keys, rows and found flags; not counting what it
    /// keeps for itself).
    pub bytes_sent: u64,
    /// Threads the last lookup on this rank used.
    pub threads: u64,
}

/// The error of an update on a table that cannot change.
fn immutable(op: &str) -> Error {
    Error::Immutable {
        what: "table".into(),
        why: format!(
            "{op} needs a parameter-server table (strata_server_table); tables from \
             strata_table_from_dlpack, strata_table_adopt_dlpack or strata_table_open are immutable"
        ),
    }
}

/// The table behind a `strata_table*` handle: one [`TableImpl`] and its CUDA residency.
/// Immutable or internally synchronised: `Send + Sync`, many threads may look it up at once.
pub struct Table {
    /// The table's copies, registrations and caches on CUDA devices, made on first use.
    /// Declared first so that it is dropped first: its drop waits for queued GPU work that
    /// still reads the rows below.
    #[cfg(feature = "cuda")]
    pub(crate) resident: crate::exec::cuda::Residency,
    imp: Box<dyn TableImpl>,
    /// Where lookups on CUDA tensors find rows.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    gpu: GpuOptions,
}

impl From<StaticTable> for Table {
    fn from(t: StaticTable) -> Self {
        let gpu = t.gpu;
        Table::new(t, gpu)
    }
}

impl Table {
    /// A table of `imp`, owned by its handle; `gpu` says where lookups on CUDA tensors find
    /// rows.
    pub(crate) fn new(imp: impl TableImpl + 'static, gpu: GpuOptions) -> Self {
        Table {
            imp: Box::new(imp),
            gpu,
            #[cfg(feature = "cuda")]
            resident: Default::default(),
        }
    }

    /// The implementation behind the handle.
    pub(crate) fn imp(&self) -> &dyn TableImpl {
        &*self.imp
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

    /// Describes a dense static or distributed table with the `__partitioned__` protocol: see
    /// `strata_table_partitioned`. Keyed and server tables have no such view.
    pub fn describe(&self) -> Result<partition::TableDescription> {
        self.imp.describe()
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.imp.dim()
    }

    /// Number of rows (keys) the table holds.
    pub fn len(&self) -> usize {
        self.imp.len()
    }

    /// Whether the table holds no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A summary of the table.
    pub fn info(&self) -> TableInfo {
        self.imp.info()
    }

    /// Cumulative counters of a server table's tiers (all zero for static tables, which keep
    /// no counters).
    pub fn stats(&self) -> TableStats {
        self.imp.stats()
    }

    /// The lookup timing of a distributed table; `None` for other tables.
    pub fn dist_timing(&self) -> Option<DistTiming> {
        self.imp.timing()
    }

    /// Inserts or overwrites rows: `keys` a 1-D integer tensor of n keys, `vectors` [n, dim]
    /// float32/float16/bfloat16 (both host memory, read during the call only). Only server
    /// tables can change; on a tiered table the write is durable in the persistent tier when
    /// this returns.
    ///
    pub fn upsert(&self, keys: Vouched, vectors: Vouched) -> Result<()> {
        // (An immutable table says so before its arguments are read.)
        if !self.imp.is_mutable() {
            return Err(immutable("upsert"));
        }
        let k = read_keys(keys)?;
        let rows = read_rows(vectors, k.len(), self.dim())?;
        self.imp.upsert(&k, &rows)
    }

    /// Removes `keys` (a 1-D integer tensor) from every tier; returns how many the table held.
    pub fn erase(&self, keys: Vouched) -> Result<u64> {
        if !self.imp.is_mutable() {
            return Err(immutable("erase"));
        }
        self.imp.erase(&read_keys(keys)?)
    }

    /// The error of `call` refused on this rank before it starts (a bad argument). On a
    /// distributed table the call is collective: the other ranks, waiting in its first step,
    /// fail with this error too instead of waiting forever. Other tables just return it.
    pub fn refuse(&self, call: Call, e: Error) -> Error {
        match self.imp.collective() {
            Some(c) => c.refuse(call, e),
            None => e,
        }
    }

    /// Whether lookups on this table are collective (a distributed table).
    pub fn is_distributed(&self) -> bool {
        self.imp.collective().is_some()
    }

    /// The table as a source of rows on the host: static and tiered tables; `None` for a
    /// distributed table, whose rows are spread over ranks.
    pub fn source(&self) -> Option<&dyn RowSource> {
        self.imp.rows()
    }

    /// The host rows a request with CUDA tensors runs over, when it has any: the one place
    /// that routes a request to the CUDA executor. `None`: the implementation runs it (a
    /// distributed table's own checks refuse CUDA tensors, on every rank together).
    #[cfg(feature = "cuda")]
    fn on_cuda(&self, r: &Request) -> Option<&dyn RowSource> {
        self.imp.rows().filter(|_| r.tensors().any(|(t, _)| crate::exec::cuda::run::is_cuda(t)))
    }

    /// Looks up `keys` (int32/int64/uint32/uint64, any shape and strides) into `out`
    /// (float32/float16/bfloat16, shape `[*keys.shape, dim]` or `[numel(keys), dim]`,
    /// non-negative, non-overlapping strides). Both are borrowed for the call only. Missing keys
    /// get the default row, or fail the call with `STRATA_KEY_NOT_FOUND` when the table's
    /// options say so (then `out` is unspecified). Safe to call from many threads at once.
    pub fn lookup(&self, keys: Vouched, out: Vouched, opts: &LookupOptions) -> Result<LookupStats> {
        // SAFETY: Vouched tensors are what Request::plain requires.
        self.lookup_request(&unsafe { Request::plain(keys.get(), out.get(), true) }, opts)
    }

    /// Runs one lookup, plain or pooled (see [`Request`]): what `strata_lookup` and
    /// `strata_lookup_pooled` do. A pooled lookup takes 1-D `keys` with `offsets`, or 2-D `keys`
    /// [B, L]; `weights` NULL or float32 of the keys' shape; `out` [B, dim]; its stats count
    /// keys. On CUDA tensors, only `r.want_stats` (or a table whose missing keys are errors)
    /// makes the call wait for the stream. The tensors are borrowed for the call only.
    pub fn lookup_request(&self, r: &Request, opts: &LookupOptions) -> Result<LookupStats> {
        #[cfg(feature = "cuda")]
        if let Some(source) = self.on_cuda(r) {
            // SAFETY: the CUDA lookups need valid tensors (CUDA ones until the stream has run
            // the lookup: a Request's contract) and a NULL or live opts.stream (LookupOptions').
            return unsafe {
                match r.pooling {
                    None => crate::exec::cuda::run::lookup(source, &self.gpu, &self.resident, r.keys, r.out, opts, r.want_stats),
                    Some(_) => crate::exec::cuda::pooled::lookup(source, &self.gpu, &self.resident, r, opts),
                }
            };
        }
        self.imp.lookup(r, opts)
    }
}
