//! The distributed lookup benchmark (feature `mpi`): a dense [rows, dim] float32 table split
//! evenly over N ranks (each rank's block borrowed, not copied), every rank looking up `batch`
//! random keys per collective call, against one process looking up the same N * batch keys in
//! a single-process table of the same data. Reports both medians, their ratio, and the share of
//! the distributed call spent in MPI exchanges (waiting for other ranks included).
//!
//! `cargo bench --features mpi --bench dist -- [rows dim batch]` (defaults 1000000 64 100000):
//! run plainly it measures the single-process side, then starts itself under `mpirun -n 2` and
//! `-n 4`. The whole machine's cores are shared by the ranks: each rank uses
//! `max(1, cores / N)` lookup threads; the single process uses every core. Not a test: it
//! asserts nothing about speed. scripts/bench-mpi.sh runs it with the right environment.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/mpi/desc.rs"]
mod desc;

use common::*;
use mpi::collective::SystemOperation;
use mpi::traits::{Communicator, CommunicatorCollectives};
use std::process::Command;
use std::ptr::{null, null_mut};
use std::time::Instant;

const ROUNDS: usize = 11;

fn value(row: usize, col: usize) -> f32 {
    ((row * 31 + col) % 1009) as f32
}

fn args() -> (usize, usize, usize) {
    let a: Vec<usize> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    (a.first().copied().unwrap_or(1_000_000), a.get(1).copied().unwrap_or(64), a.get(2).copied().unwrap_or(100_000))
}

/// The keys rank `rank` looks up (the same in both modes).
fn keys_of(rank: usize, rows: usize, batch: usize) -> Vec<i64> {
    let mut rng = Rng(1000 + rank as u64);
    (0..batch).map(|_| rng.below(rows as u64) as i64).collect()
}

/// Looks up `keys` in `t` into `out` on at most `threads` threads. `t` must be a live table
/// (every caller passes an Owned's, which it holds).
fn lookup(t: *mut Table, keys: &[i64], out: &mut [f32], dim: usize, threads: i32) {
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[keys.len() as i64, dim as i64]);
    let opts = LookupOptions { num_threads: threads, ..LookupOptions::default() };
    // SAFETY: t is a live table (the promise of every caller, above); k and o describe keys and out
    // (keys.len() keys and as many rows of dim floats), which outlive the call; opts is a local.
    ok(unsafe { strata_lookup(t, &k.t, &mut o.t, &opts, null_mut()) });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        return ranks();
    }
    let (rows, dim, batch) = args();
    let global: Vec<f32> = (0..rows * dim).map(|i| value(i / dim, i % dim)).collect();
    let single = Owned::build(&global, rows, dim, None, &TableOptions::default());
    drop(global);
    println!("distributed lookup: {rows} rows x {dim} float32, {batch} keys per rank per call, median of {ROUNDS}");
    println!("{:>5} {:>10} {:>14} {:>14} {:>8} {:>15}", "ranks", "keys/call", "single (ms)", "dist (ms)", "ratio", "exchange share");
    for n in [2usize, 4] {
        let keys: Vec<i64> = (0..n).flat_map(|r| keys_of(r, rows, batch)).collect();
        let mut out = vec![0f32; keys.len() * dim];
        lookup(single.0, &keys, &mut out, dim, 0);
        let one = median((0..ROUNDS).map(|_| {
            let t = Instant::now();
            lookup(single.0, &keys, &mut out, dim, 0);
            t.elapsed().as_secs_f64()
        }).collect());
        let exe = std::env::current_exe().unwrap();
        let run = Command::new("mpirun")
            .args(["-n", &n.to_string(), "--oversubscribe"])
            .arg(exe)
            .args([rows.to_string(), dim.to_string(), batch.to_string()])
            .output()
            .expect("mpirun");
        let text = String::from_utf8_lossy(&run.stdout);
        let Some(line) = text.lines().find(|l| l.starts_with("DIST ")) else {
            panic!("mpirun -n {n} failed: {text}{}", String::from_utf8_lossy(&run.stderr));
        };
        let v: Vec<f64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        let (dist, share) = (v[0], v[1]);
        println!(
            "{n:>5} {:>10} {:>14.2} {:>14.2} {:>7.2}x {:>14.0}%",
            n * batch,
            one * 1e3,
            dist * 1e3,
            dist / one,
            share * 100.0
        );
    }
}

/// One rank under mpirun: builds the distributed table over its block, times collective
/// lookups, checks a row, and (rank 0) prints `DIST median_seconds exchange_share`.
fn ranks() {
    let (rows, dim, batch) = args();
    let universe = mpi::initialize().expect("MPI_Init");
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    // SAFETY: MPI is initialised (universe above) and RSMPI_COMM_WORLD is the handle of the world
    // communicator; the call only converts it to its Fortran integer.
    let fint = unsafe { mpi::ffi::MPI_Comm_c2f(mpi::ffi::RSMPI_COMM_WORLD) };
    let counts: Vec<i64> = (0..size).map(|p| (rows / size + usize::from(p < rows % size)) as i64).collect();
    let start: usize = counts[..rank].iter().sum::<i64>() as usize;
    let block: Vec<f32> = (0..counts[rank] as usize * dim).map(|i| value(start + i / dim, i % dim)).collect();
    let owners: Vec<Vec<i32>> = (0..size as i32).map(|p| vec![p]).collect();
    let mut d = desc::Split::with_data(F32, dim, &counts, &owners, rank as i32, |_| block.as_ptr().cast());
    let mut t = null_mut();
    // SAFETY: d.c() points at a description whose pointers point into arrays d owns and, for this
    // rank's partition, at block; both outlive the table, which is dropped first (below). fint is
    // the world communicator's Fortran handle and t is a reference.
    ok(unsafe { strata_table_from_partitioned(d.c(), &fint, null(), &mut t) });
    let table = Owned(t);
    let keys = keys_of(rank, rows, batch);
    let mut out = vec![0f32; batch * dim];
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let threads = (cores / size).max(1) as i32;
    lookup(table.0, &keys, &mut out, dim, threads);
    assert_eq!(out[dim + 3], value(keys[1] as usize, 3));
    // SAFETY: table.0 is the live table built above (dropped below), borrowed only for this call.
    let before = unsafe { &*table.0 }.table().dist_timing().unwrap();
    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        world.barrier();
        let t0 = Instant::now();
        lookup(table.0, &keys, &mut out, dim, threads);
        let mine = t0.elapsed().as_secs_f64();
        let mut slowest = 0.0;
        world.all_reduce_into(&mine, &mut slowest, SystemOperation::max());
        times.push(slowest);
    }
    // SAFETY: table.0 is the live table built above (dropped below), borrowed only for this call.
    let after = unsafe { &*table.0 }.table().dist_timing().unwrap();
    let share = (after.exchange_s - before.exchange_s) / (after.total_s - before.total_s);
    let mut sum = 0.0;
    world.all_reduce_into(&share, &mut sum, SystemOperation::sum());
    drop(table);
    if rank == 0 {
        println!("DIST {} {}", median(times), sum / size as f64);
    }
}
