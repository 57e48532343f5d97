//! The model: what a lookup reads rows from, and the checked plan of one lookup.
//!
//! - [`StaticTable`] (immutable vectors plus dense or keyed rows) and [`TieredTable`] (a
//!   parameter server's volatile and persistent tiers) are both a [`RowSource`]: the small
//!   interface the executors use when they need rows on the host (the GPU cache's misses, the
//!   first missing key of a failed lookup);
//! - [`TableOptions`] and its parts: the options of a table, as plain Rust values;
//! - [`plan`]: `keys` and `out` validated against a table's `dim` ([`Plan`], [`Checked`]), the
//!   per-call [`LookupOptions`] and the [`LookupStats`] a lookup returns; [`Pooling`] and the
//!   checked plan of a pooled lookup (bags of keys, optional weights, one row per bag);
//! - [`Request`]: the tensors of one lookup, plain or pooled, as the C calls give them; what
//!   the table, the planner and the CUDA path pass around instead of one argument per tensor.
//!
//! This layer uses only storage and the leaf utilities: it runs no lookups itself.

mod options;
mod plan;
mod planned;
mod pooled;
mod request;
mod static_table;
mod tiered;

pub use crate::dlpack::FloatDtype;
pub use crate::kernels::RowFormat;
pub use options::{GpuOptions, GpuPlacement, GpuSharding, MissingKey, TableOptions};
#[cfg(feature = "cuda")]
pub(crate) use plan::{Checked, check};
pub use plan::{KeySource, LookupOptions, LookupStats, OutTarget};
pub(crate) use plan::{Plan, plan};
pub(crate) use planned::Planned;
#[cfg(feature = "mpi")]
pub(crate) use pooled::plan_pooled;
pub(crate) use pooled::{Bags, PooledPlan};
#[cfg(feature = "cuda")]
pub(crate) use pooled::{CheckedBags, Devices, PooledChecked, check_offset_values, check_pooled};
pub use request::{Pooling, Request};
pub(crate) use static_table::{Rows, quantized_store_named, read_keys, read_rows};
pub use static_table::{StaticTable, TableInfo};
pub(crate) use tiered::Volatile;
#[cfg(test)]
pub(crate) use tiered::race;
pub(crate) use tiered::{Promote, TierScratch};
pub use tiered::{TableStats, TieredTable};

use crate::error::Result;

/// Rows by key, on the host: what the executors need of a table beyond their own fast paths.
/// `Send + Sync`: any thread may resolve at once.
pub trait RowSource: Send + Sync {
    /// Elements per row.
    fn dim(&self) -> usize;
    /// Rows the source holds.
    fn len(&self) -> usize;
    /// Whether it holds no rows.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Resolves canonical `keys`: float32 rows into `rows` (`keys.len() * dim`) and whether
    /// each was found into `found`. Missing keys' rows are left as they are.
    fn resolve(&self, keys: &[u64], rows: &mut [f32], found: &mut [bool]) -> Result<()>;
    /// The row a missing key gets (float32, `dim` values).
    fn default_row(&self) -> &[f32];
    /// Whether a missing key fails the lookup.
    fn missing_is_error(&self) -> bool;
    /// A number that changes whenever rows are written or erased (0 for immutable sources):
    /// copies of rows elsewhere (a GPU cache) compare it to drop stale rows.
    fn generation(&self) -> u64;
    /// The static table behind this source, for placements that copy or map its memory.
    fn as_static(&self) -> Option<&StaticTable>;
}

impl RowSource for StaticTable {
    fn dim(&self) -> usize {
        StaticTable::dim(self)
    }
    fn len(&self) -> usize {
        StaticTable::len(self)
    }
    fn resolve(&self, keys: &[u64], rows: &mut [f32], found: &mut [bool]) -> Result<()> {
        StaticTable::resolve(self, keys, rows, found);
        Ok(())
    }
    fn default_row(&self) -> &[f32] {
        StaticTable::default_row(self)
    }
    fn missing_is_error(&self) -> bool {
        self.missing == MissingKey::Error
    }
    fn generation(&self) -> u64 {
        0
    }
    fn as_static(&self) -> Option<&StaticTable> {
        Some(self)
    }
}

impl RowSource for TieredTable {
    fn dim(&self) -> usize {
        TieredTable::dim(self)
    }
    fn len(&self) -> usize {
        TieredTable::len(self)
    }
    fn resolve(&self, keys: &[u64], rows: &mut [f32], found: &mut [bool]) -> Result<()> {
        self.fetch(keys, rows, found, &mut TierScratch::default()).map(|_| ())
    }
    fn default_row(&self) -> &[f32] {
        TieredTable::default_row(self)
    }
    fn missing_is_error(&self) -> bool {
        TieredTable::missing_is_error(self)
    }
    fn generation(&self) -> u64 {
        TieredTable::generation(self)
    }
    fn as_static(&self) -> Option<&StaticTable> {
        None
    }
}
