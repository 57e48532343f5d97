//! The C types of `strata.h`: the status and option enums and every struct that crosses the
//! boundary, each starting with `size_t struct_size` (see [`super::sized`]), with its
//! conversion from or into the core's own Rust types. Field order is frozen as first published
//! in 0.3 (`tests/abi/strata_0_3.h`); new fields are only ever appended.

use super::sized::Extensible;
use crate::error::{Error, Result};
use crate::model::TableStats;
use crate::model::{FloatDtype, GpuOptions, GpuPlacement, GpuSharding, MissingKey, RowFormat, TableInfo, TableOptions};
use crate::model::{LookupOptions, LookupStats, Pooling};
use dlpark::ffi::{DLDataType, DLTensor};
use std::ffi::c_void;
use std::mem::size_of;

/// What a lookup does with a key the table does not hold (`strata_table_options.missing_key`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum strata_missing_key {
    /// Write the table's default value into the key's output row and count a miss.
    STRATA_MISSING_FILL = 0,
    /// Fail the lookup with `STRATA_KEY_NOT_FOUND`; `out` is then unspecified.
    STRATA_MISSING_ERROR = 1,
}

/// Where a table's rows live for lookups on CUDA tensors (`strata_table_options.gpu_placement`,
/// HPS `use_static_table` / `embedding_cache_type`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum strata_gpu_placement {
    /// The whole table is copied to each device that looks it up (on its first lookup there).
    STRATA_GPU_STATIC = 0,
    /// The table stays in host memory, page-locked and mapped: the GPU gathers rows over the
    /// bus without a copy (for tables larger than the GPU).
    STRATA_GPU_UVM = 1,
    /// A fixed-capacity GPU cache of hot rows (`gpu_cache_fraction` of the table) in front of
    /// the host table or tiers; misses are resolved on the host in stream order.
    STRATA_GPU_CACHE = 2,
}

/// How a table is spread over several GPUs of one process (`strata_table_options.gpu_sharding`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum strata_gpu_sharding {
    /// Each device that looks the table up holds its own copy (HPS's behaviour).
    STRATA_GPU_REPLICATE = 0,
    /// The rows are split over every visible device; each key is served by the device that
    /// owns it, reading keys and writing rows through peer access (static placement only).
    STRATA_GPU_SHARD = 1,
}

/// How a table stores its rows (`strata_table_options.storage`): as given, converted to another
/// float dtype, or quantized at build. The quantized layouts are FBGEMM's fused row-wise ones,
/// byte for byte; a uint8 `[rows, row_bytes]` tensor in that layout is taken as it is.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum strata_storage {
    /// The vectors' own dtype (float32, float16 or bfloat16).
    STRATA_STORAGE_AS_GIVEN = 0,
    /// float32.
    STRATA_STORAGE_FLOAT32 = 1,
    /// float16, rounded to nearest even.
    STRATA_STORAGE_FLOAT16 = 2,
    /// bfloat16, rounded to nearest even.
    STRATA_STORAGE_BFLOAT16 = 3,
    /// int8 row-wise: `dim` uint8 values, then a float32 scale and a float32 bias (`dim + 8`
    /// bytes a row; FBGEMM's `FloatToFused8BitRowwiseQuantized`). A value is
    /// `q * scale + bias`, one fused multiply-add in float32.
    STRATA_STORAGE_INT8 = 4,
    /// int4 row-wise (`dim` even): `dim / 2` bytes, element `2i` in the low nibble of byte
    /// `i`, then a float16 scale and a float16 bias (`dim / 2 + 4` bytes a row; FBGEMM's
    /// `FloatToFusedNBitRowwiseQuantizedSBHalf` with 4 bits).
    STRATA_STORAGE_INT4 = 5,
    /// fp8 with a row-wise scale: `dim` float8 e4m3fn values (OCP FP8, `torch.float8_e4m3fn`),
    /// then a float32 scale (`dim + 4` bytes a row). The scale is the row's largest magnitude
    /// over 448; a value is `float(e) * scale` in float32. (A strata layout: FBGEMM has no
    /// fused fp8 rows to match.)
    STRATA_STORAGE_FP8 = 6,
}

/// How a pooled lookup reduces a bag's rows to one row (`strata_lookup_pooled`,
/// `strata_lookup_request.pooling`). TensorFlow's `embedding_lookup_sparse` combiners.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum strata_pooling {
    /// No pooling: a plain lookup, one row per key (in `strata_lookup_request` only).
    STRATA_POOL_NONE = 0,
    /// Σ wⱼ·row(kⱼ) per bag.
    STRATA_POOL_SUM = 1,
    /// The sum divided by Σ wⱼ (zeros when that is 0).
    STRATA_POOL_MEAN = 2,
    /// The sum divided by √(Σ wⱼ²) (zeros when that is 0).
    STRATA_POOL_SQRTN = 3,
}

/// The pooling a C caller asked for: `None` for `STRATA_POOL_NONE`.
pub(crate) fn pooling_of(v: i32, arg: &'static str) -> Result<Option<Pooling>> {
    match v {
        0 => Ok(None),
        1 => Ok(Some(Pooling::Sum)),
        2 => Ok(Some(Pooling::Mean)),
        3 => Ok(Some(Pooling::Sqrtn)),
        p => Err(Error::invalid(
            arg,
            format!(
                "{p}; expected STRATA_POOL_SUM (1), STRATA_POOL_MEAN (2) or STRATA_POOL_SQRTN (3), or STRATA_POOL_NONE (0) for a plain lookup"
            ),
        )),
    }
}

/// Options for building a table (an in-struct). Initialise with
/// `strata_table_options_default()`; a NULL pointer means the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct strata_table_options {
    /// `sizeof(strata_table_options)`, set by `strata_table_options_default()`: the fields
    /// this caller knows.
    pub struct_size: usize,
    /// Value written to every element of a missing key's row (HPS
    /// `default_value_for_each_table`). Default 0.
    pub default_value: f32,
    /// A `strata_missing_key`: whether a missing key is filled with `default_value`
    /// (`STRATA_MISSING_FILL`, the default) or is an error (`STRATA_MISSING_ERROR`).
    pub missing_key: i32,
    /// A `strata_gpu_placement` for lookups on CUDA tensors. Default `STRATA_GPU_STATIC`.
    pub gpu_placement: i32,
    /// With `STRATA_GPU_CACHE`: the fraction of the table's rows the GPU cache holds, in
    /// [0, 1] (HPS `gpucacheper`). Default 0.5.
    pub gpu_cache_fraction: f32,
    /// With `STRATA_GPU_CACHE`: when the last completed lookup's hit rate is at least this,
    /// misses get the default row at once and are inserted in the background; below it, misses
    /// are resolved on the host before the lookup's rows are final (HPS `hit_rate_threshold`).
    /// Default 0.9; above 1 means always resolve.
    pub hit_rate_threshold: f32,
    /// A `strata_gpu_sharding`. Default `STRATA_GPU_REPLICATE`.
    pub gpu_sharding: i32,
    /// A `strata_storage`: how the table stores its rows. Default `STRATA_STORAGE_AS_GIVEN`.
    /// Quantized tables are served by CPU and CUDA lookups (plain, pooled, batch; the kernels
    /// dequantize); `__partitioned__` and distributed tables quantize each row where it lies, and
    /// their ranks exchange the quantized rows. (Since 0.3.1.)
    pub storage: i32,
}

impl Default for strata_table_options {
    fn default() -> Self {
        let d = TableOptions::default();
        strata_table_options {
            struct_size: size_of::<Self>(),
            default_value: d.default_value,
            missing_key: strata_missing_key::STRATA_MISSING_FILL as i32,
            gpu_placement: strata_gpu_placement::STRATA_GPU_STATIC as i32,
            gpu_cache_fraction: d.gpu.cache_fraction,
            hit_rate_threshold: d.gpu.hit_rate_threshold,
            gpu_sharding: strata_gpu_sharding::STRATA_GPU_REPLICATE as i32,
            storage: strata_storage::STRATA_STORAGE_AS_GIVEN as i32,
        }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_table_options {
    const NAME: &'static str = "strata_table_options";
    const FIRST_SIZE: usize = 32;
}

impl TryFrom<&strata_table_options> for TableOptions {
    type Error = Error;

    /// Checks the enum values a C caller may have set out of range, then the GPU rules.
    fn try_from(o: &strata_table_options) -> Result<Self> {
        let missing = match o.missing_key {
            0 => MissingKey::Fill,
            1 => MissingKey::Error,
            m => {
                return Err(Error::invalid(
                    "opts->missing_key",
                    format!("{m}; expected STRATA_MISSING_FILL (0) or STRATA_MISSING_ERROR (1)"),
                ));
            }
        };
        let placement = match o.gpu_placement {
            0 => GpuPlacement::Static,
            1 => GpuPlacement::Uvm,
            2 => GpuPlacement::Cache,
            p => {
                return Err(Error::invalid(
                    "opts->gpu_placement",
                    format!("{p}; expected STRATA_GPU_STATIC (0), STRATA_GPU_UVM (1) or STRATA_GPU_CACHE (2)"),
                ));
            }
        };
        let sharding = match o.gpu_sharding {
            0 => GpuSharding::Replicate,
            1 => GpuSharding::Shard,
            s => {
                return Err(Error::invalid(
                    "opts->gpu_sharding",
                    format!("{s}; expected STRATA_GPU_REPLICATE (0) or STRATA_GPU_SHARD (1)"),
                ));
            }
        };
        let gpu = GpuOptions { placement, cache_fraction: o.gpu_cache_fraction, hit_rate_threshold: o.hit_rate_threshold, sharding };
        gpu.check()?;
        let storage = match o.storage {
            0 => None,
            1 => Some(RowFormat::Float(FloatDtype::F32)),
            2 => Some(RowFormat::Float(FloatDtype::F16)),
            3 => Some(RowFormat::Float(FloatDtype::BF16)),
            4 => Some(RowFormat::Int8),
            5 => Some(RowFormat::Int4),
            6 => Some(RowFormat::Fp8),
            s => {
                return Err(Error::invalid(
                    "opts->storage",
                    format!(
                        "{s}; expected STRATA_STORAGE_AS_GIVEN (0), STRATA_STORAGE_FLOAT32 (1), STRATA_STORAGE_FLOAT16 (2), STRATA_STORAGE_BFLOAT16 (3), STRATA_STORAGE_INT8 (4), STRATA_STORAGE_INT4 (5) or STRATA_STORAGE_FP8 (6)"
                    ),
                ));
            }
        };
        Ok(TableOptions { default_value: o.default_value, missing, gpu, storage })
    }
}

/// Per-call lookup options (an in-struct). Initialise with `strata_lookup_options_default()`;
/// a NULL pointer means the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct strata_lookup_options {
    /// `sizeof(strata_lookup_options)`, set by `strata_lookup_options_default()`.
    pub struct_size: usize,
    /// A `cudaStream_t` / `CUstream` for CUDA tensors. Ignored for host tensors, which are
    /// read and written before the call returns. Default NULL.
    pub stream: *mut c_void,
    /// CPU threads for this call: 0 = the library default (the process affinity mask, or
    /// `STRATA_NUM_THREADS`), 1 = only the calling thread, n = at most n threads. Default 0.
    pub num_threads: i32,
}

impl Default for strata_lookup_options {
    fn default() -> Self {
        let d = LookupOptions::default();
        strata_lookup_options { struct_size: size_of::<Self>(), stream: d.stream(), num_threads: d.num_threads }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_lookup_options {
    const NAME: &'static str = "strata_lookup_options";
    const FIRST_SIZE: usize = 24;
}

impl strata_lookup_options {
    /// The core's options for these.
    ///
    /// # Safety
    /// `self.stream` must be as [`LookupOptions::on_stream`] requires (the lookup exports'
    /// contract with their caller).
    pub(crate) unsafe fn core(&self) -> LookupOptions {
        // SAFETY: forwarded from the caller.
        unsafe { LookupOptions::on_stream(self.stream, self.num_threads) }
    }
}

/// One lookup of a `strata_lookup_batch` (an in-struct; an array's stride is its elements'
/// `struct_size`). Initialise each with `strata_lookup_request_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct strata_lookup_request {
    /// `sizeof(strata_lookup_request)`, set by `strata_lookup_request_default()`; the same in
    /// every element of one array.
    pub struct_size: usize,
    /// The table to look up (any kind; a distributed table makes the batch collective).
    pub table: *mut super::handle::strata_table,
    /// As `strata_lookup`'s keys (plain), or `strata_lookup_pooled`'s keys (pooled).
    pub keys: *const DLTensor,
    /// Pooled requests with 1-D keys: `B + 1` offsets; NULL otherwise.
    pub offsets: *const DLTensor,
    /// Pooled requests: NULL or float32 weights of the keys' shape; NULL for plain requests.
    pub weights: *const DLTensor,
    /// A `strata_pooling`: `STRATA_POOL_NONE` (the default) for a plain lookup.
    pub pooling: i32,
    /// The rows: `[*keys.shape, dim]` or `[numel(keys), dim]` (plain), `[B, dim]` (pooled).
    pub out: *mut DLTensor,
    /// NULL, or this request's stats (an out-struct with its `struct_size` set).
    pub stats: *mut strata_lookup_stats,
}

impl Default for strata_lookup_request {
    fn default() -> Self {
        strata_lookup_request {
            struct_size: size_of::<Self>(),
            table: std::ptr::null_mut(),
            keys: std::ptr::null(),
            offsets: std::ptr::null(),
            weights: std::ptr::null(),
            pooling: strata_pooling::STRATA_POOL_NONE as i32,
            out: std::ptr::null_mut(),
            stats: std::ptr::null_mut(),
        }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_lookup_request {
    const NAME: &'static str = "strata_lookup_request";
    const FIRST_SIZE: usize = 64;
}

/// What one lookup found (an out-struct). Initialise `struct_size` with
/// `strata_lookup_stats_default()`; strata writes only the fields it covers.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct strata_lookup_stats {
    /// `sizeof(strata_lookup_stats)`, set by `strata_lookup_stats_default()`.
    pub struct_size: usize,
    /// Keys found in the table (in any tier).
    pub hits: u64,
    /// Keys not in the table (filled with the default value).
    pub misses: u64,
    /// Of the hits, keys found in a server table's volatile tier (0 for other tables).
    pub volatile_hits: u64,
    /// Of the hits, keys found in a server table's persistent tier (0 for other tables).
    pub persistent_hits: u64,
}

impl Default for strata_lookup_stats {
    fn default() -> Self {
        LookupStats::default().into()
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_lookup_stats {
    const NAME: &'static str = "strata_lookup_stats";
    const FIRST_SIZE: usize = 40;
}

impl From<LookupStats> for strata_lookup_stats {
    fn from(s: LookupStats) -> Self {
        strata_lookup_stats {
            struct_size: size_of::<Self>(),
            hits: s.hits,
            misses: s.misses,
            volatile_hits: s.volatile_hits,
            persistent_hits: s.persistent_hits,
        }
    }
}

/// Cumulative counters of one table, all tiers (an out-struct, `strata_table_get_stats`).
/// Initialise `struct_size` with `strata_table_stats_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct strata_table_stats {
    /// `sizeof(strata_table_stats)`, set by `strata_table_stats_default()`.
    pub struct_size: usize,
    /// Lookup calls that succeeded.
    pub lookups: u64,
    /// Keys looked up.
    pub keys: u64,
    /// Keys found in the volatile tier.
    pub volatile_hits: u64,
    /// Keys found in the persistent tier (after missing the volatile tier).
    pub persistent_hits: u64,
    /// Keys found in no tier (given the default value).
    pub misses: u64,
    /// Rows the volatile tier evicted to stay within its capacity.
    pub evictions: u64,
    /// Rows the volatile tier holds now.
    pub volatile_rows: u64,
    /// Bytes the volatile tier holds now.
    pub volatile_bytes: u64,
    /// Rows the persistent tier holds now.
    pub persistent_rows: u64,
    /// Keys written by `strata_table_upsert`.
    pub upserts: u64,
    /// Keys removed by `strata_table_erase`.
    pub erases: u64,
}

impl Default for strata_table_stats {
    fn default() -> Self {
        TableStats::default().into()
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_table_stats {
    const NAME: &'static str = "strata_table_stats";
    const FIRST_SIZE: usize = 96;
}

impl From<TableStats> for strata_table_stats {
    fn from(s: TableStats) -> Self {
        strata_table_stats {
            struct_size: size_of::<Self>(),
            lookups: s.lookups,
            keys: s.keys,
            volatile_hits: s.volatile_hits,
            persistent_hits: s.persistent_hits,
            misses: s.misses,
            evictions: s.evictions,
            volatile_rows: s.volatile_rows,
            volatile_bytes: s.volatile_bytes,
            persistent_rows: s.persistent_rows,
            upserts: s.upserts,
            erases: s.erases,
        }
    }
}

/// A summary of a table, for hosts and reports (an out-struct, `strata_table_get_info`).
/// Initialise `struct_size` with `strata_table_info_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct strata_table_info {
    /// `sizeof(strata_table_info)`, set by `strata_table_info_default()`.
    pub struct_size: usize,
    /// Number of rows.
    pub rows: i64,
    /// Elements per row.
    pub dim: i64,
    /// Dtype of the stored vectors; uint8 for quantized rows (`STRATA_STORAGE_INT8`,
    /// `STRATA_STORAGE_INT4`, `STRATA_STORAGE_FP8`), whose row bytes are `vector_bytes / rows`.
    pub dtype: DLDataType,
    /// Whether keys are arbitrary 64-bit values (hash index) rather than row numbers.
    pub keyed: bool,
    /// Whether the vectors are a memory-mapped file (`strata_table_open`).
    pub mapped: bool,
    /// Whether the vectors are an adopted caller tensor.
    pub adopted: bool,
    /// Bytes of the keyed index (0 for dense tables and server tables, whose volatile tier
    /// is counted by `strata_table_get_stats`).
    pub index_bytes: u64,
    /// Bytes of the vectors (rows times a row's bytes: `dim` elements, or a quantized row's
    /// values, scale and bias).
    pub vector_bytes: u64,
}

impl Default for strata_table_info {
    fn default() -> Self {
        strata_table_info {
            struct_size: size_of::<Self>(),
            rows: 0,
            dim: 0,
            dtype: DLDataType { code: dlpark::ffi::DLDataTypeCode::FLOAT, bits: 32, lanes: 1 },
            keyed: false,
            mapped: false,
            adopted: false,
            index_bytes: 0,
            vector_bytes: 0,
        }
    }
}

// SAFETY: repr(C), starts with struct_size; an out-struct (its bools are never read back).
unsafe impl Extensible for strata_table_info {
    const NAME: &'static str = "strata_table_info";
    const FIRST_SIZE: usize = 48;
}

impl From<TableInfo> for strata_table_info {
    fn from(i: TableInfo) -> Self {
        strata_table_info {
            struct_size: size_of::<Self>(),
            rows: i.rows,
            dim: i.dim,
            dtype: match i.format {
                RowFormat::Float(d) => d.dl(),
                _ => DLDataType { code: dlpark::ffi::DLDataTypeCode::UINT, bits: 8, lanes: 1 },
            },
            keyed: i.keyed,
            mapped: i.mapped,
            adopted: i.adopted,
            index_bytes: i.index_bytes,
            vector_bytes: i.vector_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The first published layouts (strata 0.3), frozen: fields are only ever appended, so
    /// these offsets never change. `tests/abi/strata_0_3.h` holds the same layouts for C.
    #[test]
    fn first_published_layouts_are_frozen() {
        assert_eq!(
            [
                offset_of!(strata_table_options, struct_size),
                offset_of!(strata_table_options, default_value),
                offset_of!(strata_table_options, missing_key),
                offset_of!(strata_table_options, gpu_placement),
                offset_of!(strata_table_options, gpu_cache_fraction),
                offset_of!(strata_table_options, hit_rate_threshold),
                offset_of!(strata_table_options, gpu_sharding),
            ],
            [0, 8, 12, 16, 20, 24, 28]
        );
        assert_eq!([offset_of!(strata_lookup_options, stream), offset_of!(strata_lookup_options, num_threads)], [8, 16]);
        assert_eq!(
            [
                offset_of!(strata_lookup_stats, hits),
                offset_of!(strata_lookup_stats, misses),
                offset_of!(strata_lookup_stats, volatile_hits),
                offset_of!(strata_lookup_stats, persistent_hits),
            ],
            [8, 16, 24, 32]
        );
        assert_eq!([offset_of!(strata_table_stats, lookups), offset_of!(strata_table_stats, erases)], [8, 88]);
        assert_eq!(
            [
                offset_of!(strata_table_info, rows),
                offset_of!(strata_table_info, dim),
                offset_of!(strata_table_info, dtype),
                offset_of!(strata_table_info, keyed),
                offset_of!(strata_table_info, mapped),
                offset_of!(strata_table_info, adopted),
                offset_of!(strata_table_info, index_bytes),
                offset_of!(strata_table_info, vector_bytes),
            ],
            [8, 16, 24, 28, 29, 30, 32, 40]
        );
        fn first<T: Extensible>() -> usize {
            T::FIRST_SIZE
        }
        // The sizes of 0.3 are the first published sizes; later versions only grow.
        assert!(size_of::<strata_table_options>() >= first::<strata_table_options>());
        assert_eq!(first::<strata_table_options>(), 32);
        assert_eq!(first::<strata_lookup_options>(), 24);
        assert_eq!(first::<strata_lookup_stats>(), 40);
        assert_eq!(first::<strata_table_stats>(), 96);
        assert_eq!(first::<strata_table_info>(), 48);
        assert_eq!(size_of::<strata_lookup_options>(), 24);
        assert_eq!(size_of::<strata_lookup_stats>(), 40);
        assert_eq!(size_of::<strata_table_stats>(), 96);
        assert_eq!(size_of::<strata_table_info>(), 48);
    }

    #[test]
    fn out_of_range_options_name_their_field() {
        let bad = |f: fn(&mut strata_table_options)| {
            let mut o = strata_table_options::default();
            f(&mut o);
            TableOptions::try_from(&o).unwrap_err().to_string()
        };
        assert!(bad(|o| o.missing_key = 5).starts_with("opts->missing_key: 5; expected"));
        assert!(bad(|o| o.gpu_placement = -1).starts_with("opts->gpu_placement: -1; expected"));
        assert!(bad(|o| o.gpu_sharding = 2).starts_with("opts->gpu_sharding: 2; expected"));
        assert!(bad(|o| o.gpu_cache_fraction = 1.5).starts_with("opts->gpu_cache_fraction: 1.5"));
        assert_eq!(TableOptions::try_from(&strata_table_options::default()).unwrap(), TableOptions::default());
    }
}
