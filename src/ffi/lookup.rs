//! `strata_lookup` and its managed-tensor variants.

use super::{arg_ref, boundary, opt_or_default};
use crate::error::{Error, Result, Status};
use crate::lookup::{LookupOptions, LookupStats};
use crate::table::Table;
use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use dlpark::{DlpackFlags, ManagedTensorBase};

/// Default lookup options: no stream, the library's default thread count.
#[unsafe(no_mangle)]
pub extern "C" fn strata_lookup_options_default() -> LookupOptions {
    LookupOptions::default()
}

/// # Safety
/// `table` must be NULL or a live table; `stats` NULL or writable.
unsafe fn run(
    table: *const Table,
    keys: &DLTensor,
    out: &DLTensor,
    opts: *const LookupOptions,
    stats: *mut LookupStats,
) -> Result<()> {
    let table = unsafe { arg_ref(table, "table") }?;
    let opts = unsafe { opt_or_default(opts) };
    let found = unsafe { table.lookup_with(keys, out, &opts, !stats.is_null()) }?;
    if let Some(s) = unsafe { stats.as_mut() } {
        *s = found;
    }
    Ok(())
}

/// Looks up `keys` in `table` and writes one row per key into `out`.
///
/// - `keys`: int32, int64, uint32 or uint64; any shape, strides (negative too) and
///   byte_offset. Keys compare as 64-bit patterns: signed dtypes sign-extended, unsigned
///   zero-extended.
/// - `out`: float32, float16 or bfloat16; shape `[*keys.shape, dim]` or `[numel(keys), dim]`;
///   non-negative, non-overlapping strides (sorted by size, each steps past the extent of the
///   smaller ones); must not overlap `keys` or the table's vectors.
/// - Host tensors (kDLCPU, kDLCUDAHost) run on CPU threads and are read and written before the
///   call returns. When `keys` or `out` is a CUDA tensor (kDLCUDA, kDLCUDAManaged; both on
///   the same `device_id`), the lookup is queued on `opts->stream` (a `cudaStream_t` of that
///   device's primary context; NULL = the legacy default stream) and the call returns without
///   waiting, unless `stats` is not NULL, `out` is pageable host memory (kDLCPU), or the
///   table's missing keys are errors. Host keys with device out and device keys with host out
///   are served too. Device tensors must stay valid until the stream has run the lookup, and
///   the table must not be freed before then either (`strata_table_free` waits for strata's
///   own queued host work, not for the caller's kernels). Where the table's rows are on the
///   device is `strata_table_options.gpu_placement`. Without a CUDA driver or device, CUDA
///   tensors get `STRATA_UNSUPPORTED_DEVICE`; a failing CUDA call gets `STRATA_CUDA_ERROR`.
/// - `opts` may be NULL (defaults). `stats` may be NULL; else it receives hits and misses.
/// - Missing keys get the table's default value, or `STRATA_KEY_NOT_FOUND` when the table was
///   built with `STRATA_MISSING_ERROR` (then `out` is unspecified).
/// - Zero keys is a valid no-op.
///
/// Ownership: borrows `keys` and `out` for the call only. Threading: many threads may look up
/// one table at once; each call uses at most `opts->num_threads` threads (the caller's included).
///
/// On a distributed table (built with a communicator) the call is collective: every rank of its
/// communicator must call it, for the same tables in the same order, each with its own keys;
/// make one such call per table at a time on each rank. A failure on any rank (a bad tensor, or
/// a missing key under `STRATA_MISSING_ERROR`) fails it on every rank.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_lookup(
    table: *mut Table,
    keys: *const DLTensor,
    out: *mut DLTensor,
    opts: *const LookupOptions,
    stats: *mut LookupStats,
) -> Status {
    boundary(|| {
        let keys = unsafe { arg_ref(keys, "keys") }?;
        let out = unsafe { arg_ref(out, "out") }?;
        unsafe { run(table, keys, out, opts, stats) }
    })
}

/// Checks a managed tensor's version (major 1, explicit strides from 1.2 on) and flags.
fn check_managed<M: ManagedTensorBase>(m: &M, arg: &'static str, writable: bool) -> Result<()> {
    if let Some(v) = m.version() {
        if v.major != dlpark::ffi::DLPACK_MAJOR_VERSION {
            return Err(Error::invalid(arg, format!("DLPack version {}.{}; expected major version 1", v.major, v.minor)));
        }
        if v.minor >= 2 && m.tensor().ndim != 0 && m.tensor().strides.is_null() {
            return Err(Error::layout(
                arg,
                format!("strides is NULL in a DLPack {}.{} tensor; expected explicit strides", v.major, v.minor),
            ));
        }
    }
    if writable && m.flags().contains(DlpackFlags::READ_ONLY) {
        return Err(Error::ReadOnly { arg });
    }
    Ok(())
}

/// # Safety
/// Pointers as for `strata_lookup_managed`: NULL or valid managed tensors and table.
unsafe fn run_managed<M: ManagedTensorBase>(
    table: *mut Table,
    keys: *const M,
    out: *mut M,
    opts: *const LookupOptions,
    stats: *mut LookupStats,
) -> Status {
    boundary(|| {
        let keys = unsafe { arg_ref(keys, "keys") }?;
        let out = unsafe { arg_ref(out, "out") }?;
        check_managed(keys, "keys", false)?;
        check_managed(out, "out", true)?;
        unsafe { run(table, keys.tensor(), out.tensor(), opts, stats) }
    })
}

/// `strata_lookup` on legacy managed tensors. Ownership: borrows; never calls a deleter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_lookup_managed(
    table: *mut Table,
    keys: *const DLManagedTensor,
    out: *mut DLManagedTensor,
    opts: *const LookupOptions,
    stats: *mut LookupStats,
) -> Status {
    unsafe { run_managed(table, keys, out, opts, stats) }
}

/// `strata_lookup` on versioned managed tensors (DLPack 1.x). An `out` flagged
/// `DLPACK_FLAG_BITMASK_READ_ONLY` is refused with `STRATA_READ_ONLY`. Ownership: borrows;
/// never calls a deleter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_lookup_managed_versioned(
    table: *mut Table,
    keys: *const DLManagedTensorVersioned,
    out: *mut DLManagedTensorVersioned,
    opts: *const LookupOptions,
    stats: *mut LookupStats,
) -> Status {
    unsafe { run_managed(table, keys, out, opts, stats) }
}
