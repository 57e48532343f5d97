//! The `strata_table` handle, its constructors and accessors, and `strata_table_free`.

use super::boundary::{arg_ref, boundary, c_path, opt_ref, out_handle};
pub use super::handle::strata_table;
pub(crate) use super::handle::table_arg;
use super::sized::{out_struct_required, read_in};
use super::status::Status;
use super::tensor::check_managed;
use super::types::{strata_table_info, strata_table_options};
use crate::error::Result;
use crate::model::TableOptions;
use crate::table::Table;
use dlpark::ManagedTensorBase;
use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use std::ffi::c_char;

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

/// A `strata_table_info` with `struct_size = sizeof(strata_table_info)` and zero fields, to
/// pass to `strata_table_get_info`.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_info_default() -> strata_table_info {
    strata_table_info::default()
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
        *out = strata_table::into_owned_raw(table);
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
        *out = strata_table::into_owned_raw(table);
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
        *out = strata_table::into_owned_raw(table);
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
        unsafe { strata_table::free(table) };
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
