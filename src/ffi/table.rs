//! Table constructors, accessors and `strata_table_free`.

use super::{arg_ref, boundary, c_path, opt_or_default, opt_ref, out_arg};
use crate::error::{Error, Status};
use crate::table::{Table, TableInfo, TableOptions};
use dlpark::ManagedTensorBase;
use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use std::ffi::c_char;

/// Default table options: missing keys are filled with 0.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_options_default() -> TableOptions {
    TableOptions::default()
}

/// Builds a table from a copy of `vectors` ([rows, dim], float32, float16 or bfloat16, host
/// memory, any non-negative strides). `keys` NULL makes a dense table (key = row number);
/// otherwise it is a 1-D tensor of `rows` unique keys of any integer dtype (int32, int64,
/// uint32, uint64). `opts` may be NULL for the defaults.
///
/// Ownership: copies. The caller's tensors are only read during the call and may be freed
/// afterwards. On success `*out` receives a table the caller frees with `strata_table_free`;
/// on failure `*out` is set to NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_from_dlpack(
    vectors: *const DLTensor,
    keys: *const DLTensor,
    opts: *const TableOptions,
    out: *mut *mut Table,
) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        let vectors = unsafe { arg_ref(vectors, "vectors") }?;
        let table = unsafe { Table::from_dlpack(vectors, opt_ref(keys), opt_or_default(opts)) }?;
        *out = Box::into_raw(Box::new(table));
        Ok(())
    })
}

unsafe fn adopt<M: ManagedTensorBase>(
    vectors: *mut M,
    keys: *const DLTensor,
    opts: *const TableOptions,
    out: *mut *mut Table,
) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        if vectors.is_null() {
            return Err(Error::Null { arg: "vectors" });
        }
        let table = unsafe { Table::adopt(vectors, opt_ref(keys), opt_or_default(opts)) }?;
        *out = Box::into_raw(Box::new(table));
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
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_adopt_dlpack(
    vectors: *mut DLManagedTensor,
    keys: *const DLTensor,
    opts: *const TableOptions,
    out: *mut *mut Table,
) -> Status {
    unsafe { adopt(vectors, keys, opts, out) }
}

/// `strata_table_adopt_dlpack` for a versioned managed tensor (DLPack >= 1.0). A tensor of
/// another major version is refused (and not deleted).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_adopt_dlpack_versioned(
    vectors: *mut DLManagedTensorVersioned,
    keys: *const DLTensor,
    opts: *const TableOptions,
    out: *mut *mut Table,
) -> Status {
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
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_open(
    dir: *const c_char,
    dim: i64,
    opts: *const TableOptions,
    out: *mut *mut Table,
) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        let path = unsafe { c_path(dir, "dir") }?;
        let table = Table::open(path, dim, unsafe { opt_or_default(opts) })?;
        *out = Box::into_raw(Box::new(table));
        Ok(())
    })
}

/// Frees a table: its copy or mapping, or (for adopted tables) calls the DLPack deleter once.
/// NULL is a no-op, and so is a table borrowed from a server (`strata_server_table`), which
/// the server frees. No lookup on the table may be running or start afterwards. A table used
/// by lookups on CUDA tensors first waits for the work on those devices (queued lookups still
/// read its device copy) and for strata's own queued host work, then frees its device memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_free(table: *mut Table) {
    if !table.is_null() && !unsafe { &*table }.is_borrowed() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(unsafe { Box::from_raw(table) })));
    }
}

/// Elements per row, or -1 (with `strata_last_error` set) when `table` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_dim(table: *const Table) -> i64 {
    let mut v = -1;
    boundary(|| {
        v = unsafe { arg_ref(table, "table") }?.dim() as i64;
        Ok(())
    });
    v
}

/// Number of rows (keys), or -1 (with `strata_last_error` set) when `table` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_len(table: *const Table) -> i64 {
    let mut v = -1;
    boundary(|| {
        v = unsafe { arg_ref(table, "table") }?.len() as i64;
        Ok(())
    });
    v
}

/// Fills `*info` with a summary of `table` (rows, dim, dtype, index and vector bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_get_info(table: *const Table, info: *mut TableInfo) -> Status {
    boundary(|| {
        let t = unsafe { arg_ref(table, "table") }?;
        let info = unsafe { info.as_mut() }.ok_or(Error::Null { arg: "info" })?;
        *info = t.info();
        Ok(())
    })
}
