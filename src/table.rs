//! The table behind a `strata_table*` handle: a static table, a tiered table of a parameter
//! server, or a table spread over MPI ranks, with its CUDA residency. Lookups are dispatched
//! here to the executor for the table's kind and the tensors' device.
//!
//! A [`Table`] is immutable or internally synchronised, and `Send + Sync`: any number of
//! threads may look it up at once.

use crate::error::{Error, Result};
use crate::model::{RowSource, GpuOptions, LookupOptions, LookupStats, StaticTable, TableInfo, TableOptions, plan, read_keys, read_rows};
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
        let _ = want_stats;
        match &self.kind {
            // SAFETY: StaticTable::lookup needs Table::lookup's contract, which the caller upholds.
            TableKind::Static(t) => unsafe { t.lookup(keys, out, opts) },
            // SAFETY: plan needs Table::lookup's contract, which the caller upholds. A tiered
            // table's rows live in its tiers, not in caller memory, so there is no range to keep
            // out clear of.
            TableKind::Tiered(t) => match unsafe { plan(t.dim(), (0, 0), keys, out, opts) }? {
                Some(p) => t.lookup(&p),
                None => Ok(LookupStats::default()),
            },
            // SAFETY: DistTable::lookup needs Table::lookup's contract, which the caller upholds.
            TableKind::Dist(t) => unsafe { t.lookup(keys, out, opts) },
        }
    }
}
