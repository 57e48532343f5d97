//! Table options as plain Rust values (the C layer converts `strata_table_options` into these).

use crate::error::{Error, Result};
use crate::kernels::RowFormat;

/// What a lookup does with a key the table does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Write the table's default row into the key's output row and count a miss.
    #[default]
    Fill,
    /// Fail the lookup with [`Error::KeyNotFound`]; `out` is then unspecified.
    Error,
}

/// Where a table's rows live for lookups on CUDA tensors (HPS `use_static_table` /
/// `embedding_cache_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuPlacement {
    /// The whole table is copied to each device that looks it up (on its first lookup there).
    #[default]
    Static,
    /// The table stays in host memory, page-locked and mapped: the GPU gathers rows over the
    /// bus without a copy (for tables larger than the GPU).
    Uvm,
    /// A fixed-capacity GPU cache of hot rows (`cache_fraction` of the table) in front of the
    /// host table or tiers; misses are resolved on the host in stream order.
    Cache,
}

/// How a table is spread over several GPUs of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuSharding {
    /// Each device that looks the table up holds its own copy (HPS's behaviour).
    #[default]
    Replicate,
    /// The rows are split over every visible device (static placement only).
    Shard,
}

/// Options for building a table. Plain Rust values; the C layer checks the C struct's enum
/// values and converts it into this.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableOptions {
    /// Value written to every element of a missing key's row (HPS
    /// `default_value_for_each_table`). Default 0.
    pub default_value: f32,
    /// Whether a missing key is filled with `default_value` or is an error. Default fill.
    pub missing: MissingKey,
    /// Where lookups on CUDA tensors find rows.
    pub gpu: GpuOptions,
    /// How the table stores its rows: `None` as given (the vectors' dtype), else a float dtype
    /// or a quantized layout the rows are converted to at build. Default `None`.
    pub storage: Option<RowFormat>,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions { default_value: 0.0, missing: MissingKey::Fill, gpu: GpuOptions::default(), storage: None }
    }
}

/// A table's GPU options. [`GpuOptions::check`] holds the rules they obey.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuOptions {
    /// Where the rows live for lookups on CUDA tensors. Default static.
    pub placement: GpuPlacement,
    /// With [`GpuPlacement::Cache`]: the fraction of the table's rows the GPU cache holds, in
    /// [0, 1] (HPS `gpucacheper`). Default 0.5.
    pub cache_fraction: f32,
    /// With [`GpuPlacement::Cache`]: when the last completed lookup's hit rate is at least
    /// this, misses get the default row at once and are inserted in the background; below it,
    /// misses are resolved before the lookup's rows are final (HPS `hit_rate_threshold`).
    /// Default 0.9; above 1 means always resolve.
    pub hit_rate_threshold: f32,
    /// Replicated or sharded over the process's GPUs. Default replicated.
    pub sharding: GpuSharding,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions { placement: GpuPlacement::Static, cache_fraction: 0.5, hit_rate_threshold: 0.9, sharding: GpuSharding::Replicate }
    }
}

impl GpuOptions {
    /// Checks the values against each other and their ranges; errors name the C field
    /// (`opts->gpu_cache_fraction`).
    pub fn check(&self) -> Result<()> {
        let f = self.cache_fraction;
        if !(0.0..=1.0).contains(&f) {
            return Err(Error::invalid("opts->gpu_cache_fraction", format!("{f}; expected a fraction in [0, 1]")));
        }
        let t = self.hit_rate_threshold;
        if t.is_nan() || t < 0.0 {
            return Err(Error::invalid("opts->hit_rate_threshold", format!("{t}; expected a number >= 0")));
        }
        if self.sharding == GpuSharding::Shard && self.placement != GpuPlacement::Static {
            return Err(Error::invalid(
                "opts->gpu_sharding",
                "STRATA_GPU_SHARD; sharding over GPUs needs gpu_placement = STRATA_GPU_STATIC",
            ));
        }
        Ok(())
    }
}
