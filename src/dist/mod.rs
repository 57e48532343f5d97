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
mod comm;
#[cfg(feature = "mpi")]
mod lookup;
#[cfg(feature = "mpi")]
mod table;

#[cfg(not(feature = "mpi"))]
use crate::{
    error::{Error, Result},
    partition::{Description, TableDescription},
    model::TableOptions,
};
#[cfg(not(feature = "mpi"))]
use std::path::Path;

#[cfg(feature = "mpi")]
pub use table::DistTable;

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

/// Whether this build can make distributed tables (the `mpi` feature).
pub fn available() -> bool {
    cfg!(feature = "mpi")
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

    /// # Safety
    /// As for `Table::lookup`.
    pub unsafe fn lookup(
        &self,
        _keys: &dlpark::ffi::DLTensor,
        _out: &dlpark::ffi::DLTensor,
        _opts: &crate::model::LookupOptions,
    ) -> Result<crate::model::LookupStats> {
        match *self {}
    }

    pub(crate) fn agree<T>(&self, _local: Result<T>) -> Result<T> {
        match *self {}
    }

    pub(crate) fn refuse_lookup(&self, _e: Error) -> Error {
        match *self {}
    }

    pub(crate) fn describe(&self) -> Result<TableDescription> {
        match *self {}
    }
}
