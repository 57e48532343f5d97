//! The `__partitioned__` protocol: validation, tables from descriptions, descriptions of tables.

use super::{arg_ref, boundary, opt_ref, out_arg};
use crate::error::{Error, Status};
use crate::partition::{OwnedPartitioned, Partitioned, describe, table_from, validate};
use crate::table::{Table, TableKind, TableOptions};

/// Checks a `__partitioned__` description against every rule of the protocol: tiling counts
/// >= 1 per dimension, one partition per grid position, starts and shapes inside the global
/// shape, partitions that tile it exactly (no gap, no overlap; replication is one partition with
/// several locations), at least one location each, the same kind of `data` in every entry (a
/// `get` callback when they are handles), `locals` inside the grid and holding data, and local
/// data agreeing with its partition's shape and with the other partitions' dtype. A violation is
/// `STRATA_INVALID_ARGUMENT` naming the grid position and the rule, e.g.
/// "partition (2,0): start[0]+shape[0] = 31 exceeds shape[0] = 27". Borrows `desc` for the call;
/// calls `get` on local handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_partitioned_validate(desc: *const Partitioned) -> Status {
    boundary(|| {
        let d = unsafe { arg_ref(desc, "desc") }?;
        unsafe { validate(d) }?;
        Ok(())
    })
}

/// Builds a dense table (key = global row number) from a [rows, dim] description split along
/// rows (tiling (P, 1); (1, 1) and replicated partitions too).
///
/// `comm` is a pointer to an MPI communicator handle (`MPI_Fint`, mpi4py's `comm.py2f()`), or
/// NULL for a single process holding every partition. This build has no MPI support: a non-NULL
/// `comm` is `STRATA_UNSUPPORTED_DEVICE`.
///
/// Ownership: a single partition (tiling (1, 1), or one replicated partition) with unit element
/// stride is borrowed without a copy: its memory must stay valid and unchanged until
/// `strata_table_free`. Several partitions are copied into one table (and may be freed after
/// the call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_from_partitioned(
    desc: *const Partitioned,
    comm: *const i32,
    opts: *const TableOptions,
    out: *mut *mut Table,
) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        let d = unsafe { arg_ref(desc, "desc") }?;
        if !comm.is_null() {
            return Err(Error::Device {
                arg: "comm",
                msg: "distributed tables need a build with MPI support (cargo feature `mpi`), which this one lacks; \
                      pass NULL for a single process holding every partition"
                    .into(),
            });
        }
        let options = unsafe { opt_ref(opts) }.copied().unwrap_or_default();
        options.missing()?;
        let layout = unsafe { validate(d) }?;
        let table = unsafe { table_from(layout, options) }?;
        *out = Box::into_raw(Box::new(table.into()));
        Ok(())
    })
}

/// Describes a dense table with the protocol: shape [rows, dim], tiling (1, 1), one partition
/// owned by rank 0 whose `data` is a DLPack view of the table's vectors and whose `handle`
/// resolves to the same through `get` (which returns NULL for nothing else). Ownership: `*out`
/// is owned by strata, valid while the table lives, and freed with `strata_partitioned_free`.
/// Keyed and server tables have no such view (`STRATA_INVALID_ARGUMENT`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_partitioned(table: *const Table, out: *mut *mut Partitioned) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        let t = unsafe { arg_ref(table, "table") }?;
        let TableKind::Static(st) = &t.kind else {
            return Err(Error::invalid("table", "is a parameter-server table; expected a dense static table"));
        };
        *out = Box::into_raw(describe(st)?) as *mut Partitioned;
        Ok(())
    })
}

/// Frees a description from `strata_table_partitioned`. NULL is a no-op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_partitioned_free(desc: *mut Partitioned) {
    if !desc.is_null() {
        // SAFETY: made by strata_table_partitioned from a Box<OwnedPartitioned>, whose first
        // field (repr(C)) is the description handed out.
        drop(unsafe { Box::from_raw(desc as *mut OwnedPartitioned) });
    }
}
