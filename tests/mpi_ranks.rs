//! Distributed tables under `mpirun`, through the C ABI (feature `mpi`).
//!
//! Run by cargo (`cargo test --features mpi --test mpi_ranks`), this binary is the launcher: it
//! starts itself under `mpirun -n 1`, `-n 2` and `-n 4` (oversubscribed), each under `timeout`
//! so a hang fails the test. Under mpirun every rank runs every case: lookups compared element by
//! element with a single-process table of the same data (outputs poisoned first), stats, misses,
//! zero copy, HugeCTR shares, pooled and batched lookups (tests/mpi/pooled.rs), quantized tables
//! (tests/mpi/quantized.rs), and each error path
//! failing on every rank.

#[path = "mpi/cases.rs"]
mod cases;
mod common;
#[path = "mpi/desc.rs"]
mod desc;
#[path = "mpi/pooled.rs"]
mod pooled;
#[path = "mpi/quantized.rs"]
mod quantized;

use std::process::Command;
use std::time::{Duration, Instant};

fn main() {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() || std::env::var_os("PMI_SIZE").is_some() {
        cases::run();
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let limit = std::env::var("STRATA_MPI_TIMEOUT").unwrap_or_else(|_| "240".into());
    let mut failed = Vec::new();
    for n in [1, 2, 4] {
        let started = Instant::now();
        let status = Command::new("timeout")
            .args(["-k", "10", &limit, "mpirun", "-n", &n.to_string(), "--oversubscribe"])
            .arg(&exe)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            .env("STRATA_NUM_THREADS", "2")
            .status()
            .expect("mpirun (apt-get install openmpi-bin) and timeout must be on PATH");
        let took = started.elapsed();
        match status.code() {
            Some(0) => println!("mpirun -n {n}: every case passed on every rank ({:.1} s)", took.as_secs_f64()),
            Some(124) | Some(137) => failed.push(format!("mpirun -n {n}: timed out after {limit} s (a rank hung)")),
            c => failed.push(format!("mpirun -n {n}: exit status {c:?}")),
        }
        if took > Duration::from_secs(200) {
            eprintln!("warning: mpirun -n {n} took {:.0} s", took.as_secs_f64());
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
