//! The kernels' parameter structs, laid out exactly as `GatherParams`, `CacheParams`,
//! `PooledParams` and `BatchParams` in `gather.cu` (every kernel takes one of them by value). Addresses are device-visible
//! (`CUdeviceptr`, or a host address under the CPU emulator the tests use).

/// Parameters of `strata_gather_<keys>_<table>_<out>`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GatherParams {
    /// Keys: `n` keys at `keys + i * key_stride` elements.
    pub keys: u64,
    pub key_stride: i64,
    pub n: u64,
    /// The table (this shard's rows): row `r` at `table + r * row_stride` elements (bytes for
    /// quantized rows).
    pub table: u64,
    /// Rows of the whole table (dense keys at or above it are misses).
    pub rows: u64,
    pub row_stride: u64,
    /// The keyed index's buckets, or 0 for a dense table.
    pub buckets: u64,
    pub num_buckets: u64,
    /// `dim` float32 values for missing keys.
    pub default_row: u64,
    /// Output row `i` at `out + i * out_row_stride`, element `c` at `+ c * out_col_stride`.
    pub out: u64,
    pub out_row_stride: i64,
    pub out_col_stride: i64,
    /// `[hits, misses]` (u64, device memory) added to, or 0.
    pub counts: u64,
    /// Dense shards: the rows `[owned_lo, owned_hi)` this shard holds.
    pub owned_lo: u64,
    pub owned_hi: u64,
    /// Keyed shards: this shard and the number of shards.
    pub shard: u32,
    pub num_shards: u32,
    pub dim: u32,
    pub pad: u32,
}

/// Parameters of `strata_cache_probe_*`, `strata_cache_fill_*` and `strata_cache_insert_*`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheParams {
    pub keys: u64,
    pub key_stride: i64,
    pub n: u64,
    pub out: u64,
    pub out_row_stride: i64,
    pub out_col_stride: i64,
    /// `sets * WAYS` keys, last-use ticks (0 = empty), `sets` seqlock versions.
    pub slot_keys: u64,
    pub slot_used: u64,
    pub set_version: u64,
    /// `sets * WAYS` rows of `dim` elements of the table's dtype.
    pub vectors: u64,
    /// Number of sets; 0 = a cache of no rows (every key is resolved on the host).
    pub sets: u64,
    pub default_row: u64,
    /// `[hits, misses]` in device memory.
    pub counters: u64,
    /// Mapped host memory: canonical keys and positions of the misses.
    pub miss_keys: u64,
    pub miss_index: u64,
    /// Mapped host memory: the misses' float32 rows, found flags (u32) and the fill mode.
    pub rows: u64,
    pub found: u64,
    pub control: u64,
    pub dim: u32,
    pub tick: u32,
}

/// One lookup request of the pooled kernels (`strata_pooled_<table>`, `strata_pool_rows`) and of the batch kernel (`strata_batch`, an array of them): bags
/// of keys pooled into one row each, or (`pooling` 0, batch only) one row per key copied as
/// the gather kernel does.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PooledParams {
    /// The table, as the gather kernel sees it (a single source: no shards). Only its table
    /// fields are read: `table`, `rows`, `row_stride`, `buckets`, `num_buckets`, `default_row`.
    pub src: GatherParams,
    /// Key `j` (flat index) at `keys + j * key_stride` elements.
    pub keys: u64,
    pub key_stride: i64,
    pub nnz: u64,
    /// `bags + 1` offsets (int64 when `offsets_wide`, else int32) at `offsets + i *
    /// offsets_stride`; 0: bag `b` is keys `b * hotness .. (b + 1) * hotness`.
    pub offsets: u64,
    pub offsets_stride: i64,
    pub hotness: u64,
    /// float32 weight of key `j` at `weights + j * weight_stride`; 0: every weight is 1.
    pub weights: u64,
    pub weight_stride: i64,
    /// `strata_pool_rows_*`: key `j`'s float32 row, already gathered, at `rows + j * dim`.
    pub rows: u64,
    /// Bags (rows of out), or keys of a plain request.
    pub bags: u64,
    /// Out row `b` at `out + b * out_row_stride`, element `c` at `+ c * out_col_stride`.
    pub out: u64,
    pub out_row_stride: i64,
    pub out_col_stride: i64,
    /// `[hits, misses]` (u64) added to, or 0.
    pub counts: u64,
    /// A u32 set to 1 when the offsets are invalid (the kernel then clamps each bag into the
    /// keys), or 0.
    pub status: u64,
    /// `strata_batch`: the request's first work item (bag or key) in the batch.
    pub first: u64,
    /// 0: plain (batch only), 1: sum, 2: mean, 3: sqrtn.
    pub pooling: u32,
    pub offsets_wide: u32,
    /// Dtype codes: keys 0 i32, 1 i64, 2 u32, 3 u64; out 0 f32, 1 f16, 2 bf16; table
    /// (`strata_batch` only) those of out, then 3 int8, 4 int4, 5 fp8.
    pub key_dtype: u32,
    pub table_dtype: u32,
    pub out_dtype: u32,
    pub dim: u32,
}

/// Parameters of `strata_batch`: `count` requests in device memory, `total` work items.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchParams {
    pub items: u64,
    pub count: u64,
    pub total: u64,
}

/// Ways per cache set (`STRATA_WAYS` in gather.cu).
pub(crate) const WAYS: usize = 8;
/// `control[0]` values: write the resolved rows, or write defaults (rows come in the background).
pub(crate) const FILL_ROWS: u32 = 0;
pub(crate) const FILL_DEFAULTS: u32 = 1;
