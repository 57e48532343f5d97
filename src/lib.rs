//! strata: HPS-style embedding lookups straight from DLPack tensors, behind a C ABI.
//!
//! The crate is a safe core plus a thin C layer, in layers; each uses only the layers below
//! it, and `tests/layers.rs` fails on a cycle or an upward `crate::` path:
//!
//! ```text
//!   ffi                     the C ABI: extern "C" functions, the C types, struct_size, the
//!    |                      panic boundary, statuses
//!   table  partition  dist  config  server
//!    |                      the strata_table handle and its dispatch; __partitioned__; tables
//!    |                      over MPI ranks; ps.json; the parameter server
//!   exec                    executors: cpu (gather), tiered, pool, cuda (kernels, placements,
//!    |                      the GPU cache), working against the model's RowSource and Plan
//!   model                   StaticTable and TieredTable behind RowSource; table options; the
//!    |                      checked lookup plan and its stats
//!   storage                 store (vectors), index (keyed hash index), hugectr (sparse folders),
//!    |                      tier::{volatile, persistent}
//!   kernels                 row kernels: copy/convert a row, pool a run of rows (SIMD picked
//!    |                      at run time); every CPU executor uses them
//!   error  limits  util  dlpack
//!                           the one error type, shared limits, small utilities (hash,
//!                           prefetch, memory, locks, threads, CUDA presence), tensor views
//! ```
//!
//! Modules of one layer may use each other without cycles: `server` uses `config` and
//! `table`; `table` uses `partition` and `dist`.

pub mod config;
pub mod dist;
pub mod dlpack;
pub mod error;
pub mod exec;
pub mod ffi;
pub mod kernels;
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
    /// `generated` (from build.rs) must equal the committed `include/<name>`;
    /// `STRATA_UPDATE_HEADER=1 cargo test header` rewrites it.
    fn assert_fresh(generated: &str, name: &str) {
        let path = format!("{}/include/{name}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("STRATA_UPDATE_HEADER").is_some() {
            std::fs::write(&path, generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(committed == generated, "include/{name} is stale: run `STRATA_UPDATE_HEADER=1 cargo test header` and commit it");
    }

    /// The committed header must equal the one build.rs generates from the current sources.
    #[test]
    fn header_is_fresh() {
        assert_fresh(include_str!(concat!(env!("OUT_DIR"), "/strata.h")), "strata.h");
    }

    /// The same for `include/strata_cffi.h`, the header's declarations as cffi's `ffi.cdef()`
    /// takes them (build.rs derives it from the generated strata.h).
    #[test]
    fn header_cffi_is_fresh() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/strata_cffi.h"));
        assert_fresh(generated, "strata_cffi.h");
        assert!(!generated.lines().any(|l| l.trim_start().starts_with('#')), "no preprocessor lines");
    }
}
