//! strata: HPS-style embedding lookups straight from DLPack tensors, behind a C ABI.
//!
//! The crate is a safe core plus a thin C layer:
//! - [`dlpack`]: validated views of borrowed DLPack tensors;
//! - [`table`]: the `strata_table` handle: static tables (vectors + dense or keyed rows), built
//!   by copy, by adoption or from a HugeCTR sparse folder, or tiered server tables;
//! - [`store`]: where vectors live; [`index`]: the keyed hash index;
//! - [`lookup`]: validation and dispatch of lookups; [`exec`]: the CPU pool and gather kernels,
//!   and lookups on CUDA tensors (feature `cuda`: kernels, placements, the GPU cache);
//! - [`config`], [`tier`], [`tiered`], [`server`]: the HPS-compatible parameter server;
//! - [`partition`]: the `__partitioned__` protocol; [`dist`]: tables spread over MPI ranks
//!   (feature `mpi`);
//! - [`error`]: the one error type and its status mapping;
//! - [`ffi`]: the `extern "C"` functions of `include/strata.h`, and nothing else.

pub mod config;
pub mod dist;
pub mod dlpack;
pub mod error;
pub mod exec;
pub mod ffi;
mod limits;
pub mod model;
pub mod partition;
pub mod server;
pub mod storage;
pub mod table;
pub mod util;

pub use error::{Error, ErrorKind, Result};
pub use ffi::Status;
pub use model::{LookupOptions, LookupStats, MissingKey, TableInfo, TableOptions};
pub use table::Table;

#[cfg(test)]
mod header_tests {
    /// The committed header must equal the one build.rs generates from the current sources.
    /// `STRATA_UPDATE_HEADER=1 cargo test header` rewrites it.
    #[test]
    fn header_is_fresh() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/strata.h"));
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/strata.h");
        if std::env::var_os("STRATA_UPDATE_HEADER").is_some() {
            std::fs::write(path, generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "include/strata.h is stale: run `STRATA_UPDATE_HEADER=1 cargo test header` and commit it"
        );
    }
}
