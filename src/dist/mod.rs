//! Distributed tables: one table spread over the ranks of an MPI communicator (cargo feature
//! `mpi`).
//!
//! A [`DistTable`] is built collectively, from a `__partitioned__` description (row ranges owned
//! by ranks) or from a HugeCTR folder (each rank keeps the keys that hash to it). A lookup on it
//! is collective too: every rank passes its own keys, keys travel to their owners, owners gather
//! rows with the CPU executor, and rows travel back with all-to-all exchanges. Every step that can
//! fail on one rank is agreed on by all ranks first, so a failure on one rank fails the call on
//! every rank and none is left waiting.
//!
//! The communicator comes from C as an `MPI_Fint` and is duplicated: strata never initialises
//! or finalises MPI and frees only its duplicate. Without the `mpi` feature the same functions
//! exist and fail with `STRATA_UNSUPPORTED_DEVICE`, and [`DistTable`] has no values.

#[cfg(feature = "mpi")]
mod buf;
#[cfg(feature = "mpi")]
mod calls;
#[cfg(feature = "mpi")]
mod channel;
#[cfg(feature = "mpi")]
mod comm;
#[cfg(feature = "mpi")]
mod lookup;
#[cfg(feature = "mpi")]
mod scratch;
#[cfg(feature = "mpi")]
mod table;

use crate::error::{Error, Result};
use crate::model::TableOptions;
use crate::partition::Description;
use crate::table::Table;
#[cfg(not(feature = "mpi"))]
use std::path::Path;

#[cfg(feature = "mpi")]
pub use table::DistTable;

pub use crate::table::DistTiming;

/// Whether this build can make distributed tables (the `mpi` feature).
pub fn available() -> bool {
    cfg!(feature = "mpi")
}

/// A dense table (key = global row number) from a `__partitioned__` description of a
/// [rows, dim] array split along rows: see `strata_table_from_partitioned`. `comm` is an
/// `MPI_Fint` to spread the table over that communicator's ranks (collective), or `None` for
/// one process holding every partition. `desc` and `options` may be the errors of reading
/// them: with a communicator, every rank then learns of the failure in the collective call
/// instead of waiting for the rank that failed.
///
/// # Safety
/// As for [`crate::partition::validate`]; a borrowed partition's memory must stay valid and
/// unchanged until the table is dropped.
pub unsafe fn table_from_description(desc: Result<Description<'_>>, comm: Option<i32>, options: Result<TableOptions>) -> Result<Table> {
    match comm {
        // SAFETY: the caller upholds what DistTable::from_partitioned needs: desc is valid as
        // partition::validate requires, and borrowed partitions outlive the table.
        Some(fint) => Ok(Table::from(unsafe { DistTable::from_partitioned(desc, fint, options) }?)),
        None => {
            let options = options?;
            // SAFETY: the caller guarantees desc is valid as partition::validate requires and
            // that borrowed partitions outlive the table, which is what table_from needs.
            Ok(unsafe { crate::partition::table_from(crate::partition::validate(desc?)?, options) }?.into())
        }
    }
}

/// A HugeCTR folder opened as one table spread over the ranks of `comm`: see
/// `strata_table_open_distributed`. Collective.
pub fn open(dir: &std::path::Path, dim: i64, comm: i32, options: Result<TableOptions>) -> Result<Table> {
    Ok(Table::from(DistTable::open(dir, dim, comm, options)?))
}

impl From<DistTable> for Table {
    fn from(t: DistTable) -> Self {
        // Distributed lookups take host tensors only, so the GPU options stay the defaults.
        Table::new(t, crate::model::GpuOptions::default())
    }
}

/// The error of a `strata_lookup_batch` this rank refuses at the C boundary: on the first
/// distributed table of the batch among those this rank could read (`tables`), or, when there
/// is none, on the process's one group of ranks where it has one (see the channel module's
/// rules). The other ranks of a collective batch then fail with the error instead of waiting.
pub fn refuse_batch<'a>(tables: impl IntoIterator<Item = &'a Table>, e: Error) -> Error {
    match tables.into_iter().find(|t| t.is_distributed()) {
        Some(t) => t.refuse(crate::table::Call::Batch, e),
        #[cfg(feature = "mpi")]
        None => channel::refuse_batch(e),
        #[cfg(not(feature = "mpi"))]
        None => e,
    }
}

#[cfg(not(feature = "mpi"))]
fn lacks_mpi() -> Error {
    Error::Device {
        arg: "comm",
        msg: "distributed tables need a build with MPI support (cargo feature `mpi`), which this one lacks; \
              pass NULL for a single process holding every partition"
            .into(),
    }
}

/// A table spread over MPI ranks. This build lacks the `mpi` feature: no such table exists.
#[cfg(not(feature = "mpi"))]
pub enum DistTable {}

#[cfg(not(feature = "mpi"))]
impl DistTable {
    /// Collective: see `strata_table_from_partitioned`. Fails: this build lacks MPI.
    ///
    /// # Safety
    /// As for [`crate::partition::validate`].
    pub(crate) unsafe fn from_partitioned(_d: Result<Description<'_>>, _comm: i32, _options: Result<TableOptions>) -> Result<Self> {
        Err(lacks_mpi())
    }

    /// Collective: see `strata_table_open_distributed`. Fails: this build lacks MPI.
    pub(crate) fn open(_dir: &Path, _dim: i64, _comm: i32, _options: Result<TableOptions>) -> Result<Self> {
        Err(lacks_mpi())
    }

    pub fn dim(&self) -> usize {
        match *self {}
    }

    pub fn len(&self) -> usize {
        match *self {}
    }

    pub fn is_empty(&self) -> bool {
        match *self {}
    }

    pub fn info(&self) -> crate::model::TableInfo {
        match *self {}
    }

    pub fn timing(&self) -> DistTiming {
        match *self {}
    }
}

#[cfg(not(feature = "mpi"))]
impl crate::table::TableImpl for DistTable {
    fn dim(&self) -> usize {
        match *self {}
    }
    fn len(&self) -> usize {
        match *self {}
    }
    fn info(&self) -> crate::model::TableInfo {
        match *self {}
    }
    fn plan(&self, _r: &crate::model::Request, _opts: &crate::model::LookupOptions, _plan: &mut crate::model::Planned) -> Result<()> {
        match *self {}
    }
    fn run(
        &self,
        _r: &crate::model::Request,
        _plan: &mut crate::model::Planned,
        _threads: usize,
        _opts: &crate::model::LookupOptions,
    ) -> Result<crate::model::LookupStats> {
        match *self {}
    }
}
