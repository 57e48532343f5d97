//! What a process that is not under mpirun sees of distributed tables: without the `mpi`
//! feature every distributed entry point answers `STRATA_UNSUPPORTED_DEVICE` saying the build
//! lacks MPI; with it, a call before `MPI_Init` is refused with a message saying so (this
//! process never initialises MPI).

mod common;
use common::*;
use std::ptr::{null, null_mut};

/// A valid one-partition description of `data` ([2, 2] float32) owned by rank 0.
fn one_partition(data: &[f32], f: impl FnOnce(*const Partitioned)) {
    let t = Desc::compact(data.as_ptr().cast(), F32, &[2, 2]);
    let (shape, tiling, start) = ([2i64, 2], [1i64, 1], [0i64, 0]);
    let location = PartitionLocation { rank: 0, ..strata_partition_location_default() };
    let part = Partition {
        start: start.as_ptr(),
        shape: shape.as_ptr(),
        data: &t.t,
        locations: &location,
        num_locations: 1,
        ..strata_partition_default()
    };
    let d = Partitioned {
        ndim: 2,
        shape: shape.as_ptr(),
        partition_tiling: tiling.as_ptr(),
        partitions: &part,
        ..strata_partitioned_default()
    };
    f(&d);
}

#[test]
fn distributed_entry_points_without_mpi() {
    let data = [1.0f32, 2.0, 3.0, 4.0];
    let comm = 0i32; // MPI_COMM_WORLD's usual Fortran handle; never looked at without MPI
    let (want, needles): (Status, &[&str]) = if cfg!(feature = "mpi") {
        (Status::STRATA_INVALID_ARGUMENT, &["comm: MPI is not initialised; call MPI_Init"])
    } else {
        (
            Status::STRATA_UNSUPPORTED_DEVICE,
            &["comm: distributed tables need a build with MPI support (cargo feature `mpi`), which this one lacks"],
        )
    };
    assert_eq!(strata_mpi_available(), cfg!(feature = "mpi") as i32);
    one_partition(&data, |d| {
        let mut t = null_mut();
        // SAFETY: d is the description one_partition built from locals that outlive this closure;
        // comm is an i32 alive past the call; t is a reference.
        fails(unsafe { strata_table_from_partitioned(d, &comm, null(), &mut t) }, want, needles);
        assert!(t.is_null());
        // NULL comm still builds a single-process table
        // SAFETY: d is the description one_partition built from locals that outlive this closure; t
        // is a reference.
        ok(unsafe { strata_table_from_partitioned(d, null(), null(), &mut t) });
        // SAFETY: t is the table just built (status OK), freed once here and not used after.
        unsafe { strata_table_free(t) };
    });
    let mut t = null_mut();
    // SAFETY: the path is a static NUL-terminated string; comm is an i32 alive past the call; t is
    // a reference.
    fails(unsafe { strata_table_open_distributed(c"/nonexistent".as_ptr(), 4, &comm, null(), &mut t) }, want, needles);
    assert!(t.is_null());
    fails(
        // SAFETY: strata refuses the NULL dir; comm is an i32 alive past the call; t is a
        // reference.
        unsafe { strata_table_open_distributed(null(), 4, &comm, null(), &mut t) },
        Status::STRATA_NULL_ARGUMENT,
        &["dir: is NULL"],
    );
}
