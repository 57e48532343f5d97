//! The `__partitioned__` protocol: validation, tables from descriptions, descriptions of tables;
//! tables spread over MPI ranks.

use super::boundary::{arg_ref, boundary, c_path, opt_ref, out_handle};
use super::partition_types::{OwnedPartitioned, description, strata_partition, strata_partition_location, strata_partitioned};
use super::status::Status;
use super::table::{strata_table, table_arg, table_options};
use super::types::strata_table_options;
use crate::partition::validate;
use std::ffi::c_char;

/// A `strata_partitioned` with `struct_size = sizeof(strata_partitioned)` and every other field
/// 0 or NULL: fill in `ndim`, `shape`, `partition_tiling` and `partitions` (and `locals`, `get`
/// as needed).
#[unsafe(no_mangle)]
pub extern "C" fn strata_partitioned_default() -> strata_partitioned {
    strata_partitioned::default()
}

/// A `strata_partition` with `struct_size = sizeof(strata_partition)` and every other field 0
/// or NULL. Every element of one `partitions` array must carry the same `struct_size` (the
/// array's stride): initialise each with this function.
#[unsafe(no_mangle)]
pub extern "C" fn strata_partition_default() -> strata_partition {
    strata_partition::default()
}

/// A `strata_partition_location` with `struct_size = sizeof(strata_partition_location)`, `rank`
/// -1 (not given), `device_id` -1 (host memory), `pid` 0 and `host` NULL. Every element of one
/// `locations` array must carry the same `struct_size`: initialise each with this function.
#[unsafe(no_mangle)]
pub extern "C" fn strata_partition_location_default() -> strata_partition_location {
    strata_partition_location::default()
}

/// Checks a `__partitioned__` description against every rule of the protocol: at least one
/// partition per dimension, one partition per grid position, starts and shapes inside the global
/// shape, partitions that tile it exactly (no gap, no overlap; replication is one partition with
/// several locations), at least one location each, the same kind of `data` in every entry (a
/// `get` callback when they are handles), `locals` inside the grid and holding data, and local
/// data agreeing with its partition's shape and with the other partitions' dtype. A violation is
/// `STRATA_INVALID_ARGUMENT` naming the grid position and the rule, e.g.
/// "partition (2,0): start[0]+shape[0] = 31 exceeds shape[0] = 27". Every struct's `struct_size`
/// is checked too (an older size reads defaults for the fields it lacks); the elements of
/// `partitions`, and those of each `locations`, are `struct_size` bytes apart and must all carry
/// the same one. Borrows `desc` for the call; calls `get` on local handles.
///
/// # Safety
/// `desc` is NULL or points to `struct_size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_partitioned_validate(desc: *const strata_partitioned) -> Status {
    boundary(|| {
        // whose tensors (and get's) are valid DLPack tensors for the call.
        // SAFETY: `desc` is NULL or valid as this export's # Safety section requires.
        let d = unsafe { description(desc) }?;
        // SAFETY: the description and the data it points to are valid for the call, as this export's # Safety section requires.
        unsafe { validate(d) }?;
        Ok(())
    })
}

/// Builds a dense table (key = global row number) from a [rows, dim] description split along
/// rows (tiling (P, 1); (1, 1) and replicated partitions too).
///
/// `comm` NULL: a single process holding every partition. Ownership: a single partition
/// (tiling (1, 1), or one replicated partition) whose rows have unit element stride and are at
/// least `dim` elements apart is borrowed without a copy: its memory must stay valid and unchanged
/// until `strata_table_free`. Otherwise the partitions are copied into one table (and may be
/// freed after the call).
///
/// `comm` non-NULL: points to an MPI communicator as an `MPI_Fint` (`MPI_Comm_c2f(comm)`,
/// mpi4py's `comm.py2f()`); the table is spread over its ranks. Collective: every rank of
/// `comm` must call it, each passing the same shape, tiling, starts and shapes, with data for
/// the partitions it holds: those whose locations list that rank, or that its `locals` list (and
/// only those). The owners of a partition are the union of what the ranks say: every rank its
/// locations name on any rank, and every rank holding it (so Heat's replicated arrays, described
/// on every rank with a single location and `locals` [(0, 0)], are replicated on every rank);
/// each owner must hold the data. strata duplicates `comm` (the caller keeps its own) and frees
/// the duplicate in `strata_table_free`, which is then collective too (call it before
/// `MPI_Finalize`); it never initialises or finalises MPI, which must be initialised. Each local
/// partition is borrowed under the same rule as above, else copied. A description that is
/// invalid on one rank fails the call on every rank: that rank reports its own error, the others
/// `rank R failed the collective call: ...` with its status and message. Descriptions that
/// differ between ranks (shape, tiling, starts, shapes, dtype, options) fail on every rank with
/// one message naming the rank that differs from most and quoting its values beside theirs:
/// "partition (2,0): start[0] = 14, shape[0] = 7 on rank 0 but start[0] = 14, shape[0] = 6 on
/// rank 3". `strata_lookup` on the table is collective. A build without the `mpi` feature
/// answers `STRATA_UNSUPPORTED_DEVICE` (see `strata_mpi_available`).
///
/// # Safety
/// `desc` is NULL or points to `struct_size` readable bytes; `comm` is NULL or readable; `opts` is
/// NULL or points to `struct_size` readable bytes; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_from_partitioned(
    desc: *const strata_partitioned,
    comm: *const i32,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // borrowed partitions alive and unchanged until strata_table_free.
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `comm` is NULL or valid as this export's # Safety section requires.
        let comm = unsafe { opt_ref(comm) }.copied();
        // Errors reading the description or the options are the core's to report: with a
        // communicator every rank learns of them in the collective call.
        // SAFETY: `desc` is NULL or valid as this export's # Safety section requires.
        let desc = unsafe { description(desc) };
        // SAFETY: `opts` is NULL or valid as this export's # Safety section requires.
        let options = unsafe { table_options(opts) };
        // SAFETY: the description and the data it points to are valid for the call, as this export's # Safety section requires.
        let table = unsafe { crate::dist::table_from_description(desc, comm, options) }?;
        *out = strata_table::into_owned_raw(table);
        Ok(())
    })
}

/// Opens a HugeCTR sparse folder (as `strata_table_open`) as one table spread over the ranks of
/// `comm` (a pointer to an `MPI_Fint`, as in `strata_table_from_partitioned`): each rank keeps
/// the rows whose keys hash to it, copied out of the mapped files (only those rows' pages of
/// `emb_vector` are read; every rank reads `key`). Collective: every rank must call it, with the
/// same folder contents, `dim` and options; an error on one rank (a missing file, a duplicate
/// key) fails the call on every rank. The table is keyed; `strata_lookup` on it is collective.
/// Ownership: nothing is borrowed after the call; the communicator is duplicated as in
/// `strata_table_from_partitioned`. A build without the `mpi` feature answers
/// `STRATA_UNSUPPORTED_DEVICE`.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated string; `comm` is NULL or readable; `opts` is NULL or points
/// to `struct_size` readable bytes; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_open_distributed(
    dir: *const c_char,
    dim: i64,
    comm: *const i32,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `dir` is NULL or valid as this export's # Safety section requires.
        let dir = unsafe { c_path(dir, "dir") }?;
        // SAFETY: `comm` is NULL or valid as this export's # Safety section requires.
        let fint = *unsafe { arg_ref(comm, "comm") }?;
        // An error reading the options fails the collective call on every rank.
        // SAFETY: `opts` is NULL or valid as this export's # Safety section requires.
        let options = unsafe { table_options(opts) };
        *out = strata_table::into_owned_raw(crate::dist::open(dir, dim, fint, options)?);
        Ok(())
    })
}

/// Describes a dense table with the protocol: shape [rows, dim], tiling (1, 1), one partition
/// owned by rank 0 whose `data` is a DLPack view of the table's vectors and whose `handle`
/// resolves to the same through `get` (which returns NULL for nothing else). A dense
/// distributed table is described as it is spread: tiling (P, 1), each partition's locations
/// the ranks that hold it, `data` and `handle` only for this rank's partitions (NULL for the
/// others, for which `get` returns NULL); it is not collective. Ownership: `*out`
/// is owned by strata, valid while the table lives, and freed with `strata_partitioned_free`.
/// Keyed and server tables have no such view (`STRATA_INVALID_ARGUMENT`).
///
/// # Safety
/// `table` is NULL or a live table handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_partitioned(table: *const strata_table, out: *mut *mut strata_partitioned) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
        let t = unsafe { table_arg(table, "table") }?;
        *out = OwnedPartitioned::new(t.describe()?).into_raw();
        Ok(())
    })
}

/// Frees a description from `strata_table_partitioned`. NULL is a no-op.
///
/// # Safety
/// `desc` is NULL or points to `struct_size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_partitioned_free(desc: *mut strata_partitioned) {
    boundary(|| {
        if !desc.is_null() {
            // SAFETY: the caller passes a description from strata_table_partitioned, once.
            unsafe { OwnedPartitioned::free(desc) };
        }
        Ok(())
    })
}
