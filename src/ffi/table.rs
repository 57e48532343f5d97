//! Tables in C: `strata_table_options` (with its enums `strata_missing_key`,
//! `strata_gpu_placement`, `strata_gpu_sharding`, `strata_storage`) and `strata_table_info`,
//! their initialisers and conversions; the `strata_table` handle's constructors, accessors and
//! `strata_table_free`. Field order is frozen as first published in 0.3
//! (`tests/abi/strata_0_3.h`); new fields are only ever appended.

use super::boundary::{arg_ref, boundary, c_path, opt_ref, out_handle};
pub use super::handle::strata_table;
pub(crate) use super::handle::table_arg;
use super::handle::{boxed, free_table};
use super::sized::{Extensible, out_struct_required, read_in};
use super::status::Status;
use super::tensor::check_managed;
use crate::error::{Error, Result};
use crate::model::{FloatDtype, GpuOptions, GpuPlacement, GpuSharding, MissingKey, RowFormat, TableInfo, TableOptions};
use crate::table::Table;
use dlpark::ManagedTensorBase;
use dlpark::ffi::{DLDataType, DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use std::ffi::c_char;

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
    /// dequantize), and `__partitioned__` and distributed tables store them too. (Since 0.3.1.)
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

/// Reads optional table options (NULL: the defaults) and converts them.
///
/// # Safety
/// `p` must be NULL or point to `struct_size` readable bytes.
pub(crate) unsafe fn table_options(p: *const strata_table_options) -> Result<TableOptions> {
    // SAFETY: forwarded.
    TableOptions::try_from(&unsafe { read_in(p, "opts") }?)
}

/// Default table options (`struct_size = sizeof(strata_table_options)`): missing keys are
/// filled with 0; GPU lookups use a static copy per device; rows are stored as given. The
/// header's `strata_table_options_default` is a macro for this name, so hosts built against
/// this header (calling it or taking its address) get every field.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_options_default_0_3_1() -> strata_table_options {
    strata_table_options::default()
}

/// `strata_table_options` as 0.3.0 laid it out (up to `gpu_sharding`, 32 bytes): what
/// `strata_table_options_default` returns.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct strata_table_options_v0_3 {
    /// 32: the 0.3.0 fields.
    pub struct_size: usize,
    pub default_value: f32,
    pub missing_key: i32,
    pub gpu_placement: i32,
    pub gpu_cache_fraction: f32,
    pub hit_rate_threshold: f32,
    pub gpu_sharding: i32,
}

const _: () = assert!(size_of::<strata_table_options_v0_3>() == 32, "0.3.0's strata_table_options is 32 bytes");

/// The 0.3.0 initialiser, for hosts built against 0.3.0's header: the defaults of the 0.3.0
/// fields (`struct_size = 32`), in the room those hosts have for them. This header's
/// `strata_table_options_default` is a macro for `strata_table_options_default_0_3_1`.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_options_default() -> strata_table_options_v0_3 {
    let d = strata_table_options::default();
    strata_table_options_v0_3 {
        struct_size: size_of::<strata_table_options_v0_3>(),
        default_value: d.default_value,
        missing_key: d.missing_key,
        gpu_placement: d.gpu_placement,
        gpu_cache_fraction: d.gpu_cache_fraction,
        hit_rate_threshold: d.hit_rate_threshold,
        gpu_sharding: d.gpu_sharding,
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
    /// (0.3.1) A `strata_storage`: how the rows are stored (`STRATA_STORAGE_FLOAT32` ...
    /// `STRATA_STORAGE_FP8`; never `STRATA_STORAGE_AS_GIVEN`). For a parameter-server table, the
    /// format of its volatile tier's rows.
    pub storage: i32,
    /// (0.3.1) Bytes of one stored row: `dim` elements of the float dtype, or a quantized row's
    /// values, scale and bias (int8 at dim 64: 72).
    pub row_bytes: u64,
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
            storage: 0,
            row_bytes: 0,
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
            storage: storage_value(i.format),
            row_bytes: i.format.row_bytes(i.dim as usize) as u64,
        }
    }
}

/// `format`'s `strata_storage` value (the inverse of `opts->storage`'s reading).
pub(crate) fn storage_value(format: RowFormat) -> i32 {
    match format {
        RowFormat::Float(FloatDtype::F32) => 1,
        RowFormat::Float(FloatDtype::F16) => 2,
        RowFormat::Float(FloatDtype::BF16) => 3,
        RowFormat::Int8 => 4,
        RowFormat::Int4 => 5,
        RowFormat::Fp8 => 6,
    }
}

/// A `strata_table_info` with `struct_size = sizeof(strata_table_info)` and zero fields, to
/// pass to `strata_table_get_info`. The header's `strata_table_info_default` is a macro for
/// this name.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_info_default_0_3_1() -> strata_table_info {
    strata_table_info::default()
}

/// `strata_table_info` as 0.3.0 laid it out (up to `vector_bytes`, 48 bytes): what
/// `strata_table_info_default` returns.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct strata_table_info_v0_3 {
    /// 48: the 0.3.0 fields.
    pub struct_size: usize,
    pub rows: i64,
    pub dim: i64,
    pub dtype: DLDataType,
    pub keyed: bool,
    pub mapped: bool,
    pub adopted: bool,
    pub index_bytes: u64,
    pub vector_bytes: u64,
}

const _: () = assert!(size_of::<strata_table_info_v0_3>() == 48, "0.3.0's strata_table_info is 48 bytes");

/// The 0.3.0 initialiser, for hosts built against 0.3.0's header: `struct_size = 48` and zero
/// fields, in the room those hosts have. This header's `strata_table_info_default` is a macro
/// for `strata_table_info_default_0_3_1`.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_info_default() -> strata_table_info_v0_3 {
    let d = strata_table_info::default();
    strata_table_info_v0_3 {
        struct_size: size_of::<strata_table_info_v0_3>(),
        rows: d.rows,
        dim: d.dim,
        dtype: d.dtype,
        keyed: d.keyed,
        mapped: d.mapped,
        adopted: d.adopted,
        index_bytes: d.index_bytes,
        vector_bytes: d.vector_bytes,
    }
}

/// Builds a table from a copy of `vectors` ([rows, dim], float32, float16 or bfloat16, host
/// memory, any non-negative strides). `keys` NULL makes a dense table (key = row number);
/// otherwise it is a 1-D tensor of `rows` unique keys of any integer dtype (int32, int64,
/// uint32, uint64). `opts` may be NULL for the defaults.
///
/// Ownership: copies. The caller's tensors are only read during the call and may be freed
/// afterwards. On success `*out` receives a table the caller frees with `strata_table_free`;
/// on failure `*out` is set to NULL.
///
/// # Safety
/// `vectors` is NULL or a DLPack tensor whose memory is valid as its shape, strides and device
/// describe; `keys` is NULL or a DLPack tensor whose memory is valid as its shape, strides and
/// device describe; `opts` is NULL or points to `struct_size` readable bytes; `out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_from_dlpack(
    vectors: *const DLTensor,
    keys: *const DLTensor,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `vectors` is NULL or valid as this export's # Safety section requires.
        let vectors = unsafe { arg_ref(vectors, "vectors") }?;
        // SAFETY: `opts` is NULL or valid as this export's # Safety section requires.
        let options = unsafe { table_options(opts) }?;
        // SAFETY: `vectors` is NULL or valid as this export's # Safety section requires.
        let table = unsafe { Table::from_dlpack(vectors, opt_ref(keys), options) }?;
        *out = boxed(table);
        Ok(())
    })
}

/// # Safety
/// As for `strata_table_adopt_dlpack`.
unsafe fn adopt<M: ManagedTensorBase>(
    vectors: *mut M,
    keys: *const DLTensor,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `vectors` is NULL or valid as this export's # Safety section requires.
        let managed = unsafe { arg_ref(vectors, "vectors") }?;
        check_managed(managed, "vectors", false)?;
        // SAFETY: `opts` is NULL or valid as this export's # Safety section requires.
        let options = unsafe { table_options(opts) }?;
        // SAFETY: forwarded: the caller upholds this export's # Safety section.
        let table = unsafe { Table::adopt(vectors, opt_ref(keys), options) }?;
        *out = boxed(table);
        Ok(())
    })
}

/// Builds a table over the memory of `vectors` without copying it. Rows must have unit
/// element stride (any row stride >= dim). `keys` and `opts` as in `strata_table_from_dlpack`;
/// `keys` is only read during the call.
///
/// Ownership: adopts. On success the table owns `vectors` and calls its deleter exactly once,
/// from `strata_table_free` (on whichever thread frees the table); the memory must stay valid
/// and unchanged until then. On failure the caller keeps ownership: the deleter is not called.
///
/// # Safety
/// `vectors` is NULL or a DLPack tensor whose memory is valid as its shape, strides and device
/// describe; `keys` is NULL or a DLPack tensor whose memory is valid as its shape, strides and
/// device describe; `opts` is NULL or points to `struct_size` readable bytes; `out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_adopt_dlpack(
    vectors: *mut DLManagedTensor,
    keys: *const DLTensor,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    // SAFETY: forwarded.
    unsafe { adopt(vectors, keys, opts, out) }
}

/// `strata_table_adopt_dlpack` for a versioned managed tensor (DLPack >= 1.0). A tensor of
/// another major version, or of version >= 1.2 with NULL strides, is refused (and not deleted).
///
/// # Safety
/// `vectors` is NULL or a DLPack tensor whose memory is valid as its shape, strides and device
/// describe; `keys` is NULL or a DLPack tensor whose memory is valid as its shape, strides and
/// device describe; `opts` is NULL or points to `struct_size` readable bytes; `out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_adopt_dlpack_versioned(
    vectors: *mut DLManagedTensorVersioned,
    keys: *const DLTensor,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    // SAFETY: forwarded.
    unsafe { adopt(vectors, keys, opts, out) }
}

/// Opens a table in HugeCTR's sparse format: the folder `dir` holds `key` (little-endian
/// int64, one per row) and `emb_vector` (float32, row-major, rows x `dim`, same order), with
/// no headers. The vectors are memory-mapped, not copied; the keys are indexed (at most 16
/// bytes per key). Files that are truncated, disagree in row count, or whose size `dim` does
/// not divide give `STRATA_INVALID_FILE`; missing files `STRATA_IO_ERROR`.
///
/// Ownership: the table keeps the mapping until `strata_table_free`; the files must not be
/// truncated meanwhile. `dir` is only read during the call.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated string; `opts` is NULL or points to `struct_size` readable
/// bytes; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_open(
    dir: *const c_char,
    dim: i64,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `dir` is NULL or valid as this export's # Safety section requires.
        let path = unsafe { c_path(dir, "dir") }?;
        // SAFETY: `opts` is NULL or valid as this export's # Safety section requires.
        let table = Table::open(path, dim, unsafe { table_options(opts) }?)?;
        *out = boxed(table);
        Ok(())
    })
}

/// Frees a table: its copy or mapping, or (for adopted tables) calls the DLPack deleter once.
/// NULL is a no-op, and so is a table borrowed from a server (`strata_server_table`), which
/// the server frees. No lookup on the table may be running or start afterwards. A table used
/// by lookups on CUDA tensors first waits for the work on those devices (queued lookups still
/// read its device copy) and for strata's own queued host work, then frees its device memory.
///
/// # Safety
/// `table` is NULL or a live table handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_free(table: *mut strata_table) {
    boundary(|| {
        // SAFETY: `table` is NULL or a handle from strata, not used after this call.
        unsafe { free_table(table) };
        Ok(())
    })
}

/// Elements per row, or -1 (with `strata_last_error` set) when `table` is NULL.
///
/// # Safety
/// `table` is NULL or a live table handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_dim(table: *const strata_table) -> i64 {
    // SAFETY: `table` is NULL or a live handle.
    boundary(|| Ok(unsafe { table_arg(table, "table") }?.dim() as i64))
}

/// Number of rows (keys), or -1 (with `strata_last_error` set) when `table` is NULL.
///
/// # Safety
/// `table` is NULL or a live table handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_len(table: *const strata_table) -> i64 {
    // SAFETY: `table` is NULL or a live handle.
    boundary(|| Ok(unsafe { table_arg(table, "table") }?.len() as i64))
}

/// Fills `*info` with a summary of `table` (rows, dim, dtype, index and vector bytes). `info`
/// is an out-struct: set its `struct_size` first (`strata_table_info_default()`); strata
/// writes only the fields that size covers.
///
/// # Safety
/// `table` is NULL or a live table handle; `info` is NULL or points to `struct_size` writable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_get_info(table: *const strata_table, info: *mut strata_table_info) -> Status {
    boundary(|| {
        // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
        let t = unsafe { table_arg(table, "table") }?;
        // SAFETY: `info` is NULL or valid as this export's # Safety section requires.
        let info = unsafe { out_struct_required(info, "info") }?;
        info.write(&t.info().into());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::sized::Extensible;
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
        // The sizes of 0.3 are the first published sizes; later versions only grow.
        assert!(size_of::<strata_table_options>() >= strata_table_options::FIRST_SIZE);
        assert_eq!(strata_table_options::FIRST_SIZE, 32);
        assert_eq!(strata_table_info::FIRST_SIZE, 48);
        // 0.3.1 appended how rows are stored.
        assert_eq!([offset_of!(strata_table_info, storage), offset_of!(strata_table_info, row_bytes)], [48, 56]);
        assert_eq!(size_of::<strata_table_info>(), 64);
        assert_eq!(strata_table_info_default().struct_size, 48);
        assert_eq!(strata_table_info_default_0_3_1().struct_size, 64);
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
