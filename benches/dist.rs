//! The distributed lookup benchmark (feature `mpi`): a dense [rows, dim] float32 table split
//! evenly over N ranks on this machine (each rank's block borrowed, not copied), every rank
//! looking up `batch` random keys per collective call.
//!
//! What is compared: the same work on the same machine. "One process" looks up all N * batch
//! keys (every rank's keys) in one call on a single-process table of the same rows, with every
//! core; "distributed" is one collective call in which each of the N ranks looks up its own
//! `batch` keys, timed by the slowest rank. Both sides produce the same N * batch output rows
//! from the same cores, so the ratio is what splitting the table over processes costs. The two
//! are measured inside the same MPI job, interleaved round by round (rank 0 makes the
//! single-process call while the other ranks sleep), so drift in this shared machine's speed
//! hits both alike.
//!
//! Printed per N: the medians and their ratio with the spread of the per-round ratios; the
//! threads each rank used (the library default: the cores of its affinity mask shared out among
//! the ranks on this node); where the distributed time goes (bucketing keys by owner, the key
//! exchange, the gather of served rows, the row exchange, the reorder into `out`), per call and
//! per key; the bytes sent; and, from the 2-rank run's per-key costs, an estimate of the lookup
//! rate at 8 and 64 nodes over a 100 Gb/s network (see the README).
//!
//! `cargo bench --features mpi --bench dist -- [rows dim batch]` (defaults 1000000 64 100000):
//! run plainly it starts itself under `mpirun -n 2` and `-n 4` with `--bind-to none`, so rank 0
//! may use every core for the single-process side. Not a test: it asserts nothing about speed.
//! scripts/bench-mpi.sh runs it with the right environment.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/mpi/desc.rs"]
mod desc;

use common::*;
use mpi::collective::SystemOperation;
use mpi::traits::{Communicator, CommunicatorCollectives};
use std::process::Command;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};
use strata::dist::DistTiming;

/// Timed rounds (`STRATA_BENCH_ROUNDS` to change, e.g. for profiling).
fn rounds() -> usize {
    std::env::var("STRATA_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).filter(|&n| n > 0).unwrap_or(11)
}
/// 100 Gb/s, in bytes per second and direction.
const NET_BYTES_PER_S: f64 = 100e9 / 8.0;
/// Assumed cost of one message in an all-to-all over the network (latency and software).
const NET_MESSAGE_S: f64 = 2e-6;

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

/// Looks up `keys` in `t` into `out` on at most `threads` threads (0: the library default). `t`
/// must be a live table (every caller passes an Owned's, which it holds).
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
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!("distributed lookup: {rows} rows x {dim} float32, {batch} random keys per rank per call, {} rounds, {cores} cores", rounds());
    println!("one process = all ranks' keys in one call on a single-process table, every core; dist = one collective call, slowest rank");
    let mut summary = Vec::new();
    for n in [2usize, 4] {
        let exe = std::env::current_exe().unwrap();
        let run = Command::new("mpirun")
            .args(["-n", &n.to_string(), "--oversubscribe", "--bind-to", "none"])
            .arg(exe)
            .args([rows.to_string(), dim.to_string(), batch.to_string()])
            .output()
            .expect("mpirun");
        let text = String::from_utf8_lossy(&run.stdout);
        let Some(line) = text.lines().find(|l| l.starts_with("RESULT ")) else {
            panic!("mpirun -n {n} failed: {text}{}", String::from_utf8_lossy(&run.stderr));
        };
        for l in text.lines().filter(|l| !l.starts_with("RESULT ")) {
            println!("{l}");
        }
        summary.push(line.trim_start_matches("RESULT ").to_string());
    }
    println!(
        "\n{:>5} {:>10} {:>12} {:>12} {:>8} {:>15} {:>8}",
        "ranks", "keys/call", "one (ms)", "dist (ms)", "ratio", "round ratios", "limit"
    );
    for s in summary {
        println!("{s}");
    }
}

/// Per-call means over the timed rounds: `after - before`, divided by the rounds.
fn per_call(before: &DistTiming, after: &DistTiming) -> [f64; 10] {
    let c = (after.lookups - before.lookups).max(1) as f64;
    [
        (after.total_s - before.total_s) / c,
        (after.bucket_s - before.bucket_s) / c,
        (after.key_exchange_s - before.key_exchange_s) / c,
        (after.gather_s - before.gather_s) / c,
        (after.row_exchange_s - before.row_exchange_s) / c,
        (after.reorder_s - before.reorder_s) / c,
        (after.keys - before.keys) as f64 / c,
        (after.keys_sent - before.keys_sent) as f64 / c,
        (after.keys_served - before.keys_served) as f64 / c,
        (after.bytes_sent - before.bytes_sent) as f64 / c,
    ]
}

/// Waits for every rank at a barrier without spinning a core: rank 0 may be timing a
/// single-process lookup on every core meanwhile.
fn sleepy_barrier(world: &impl CommunicatorCollectives) {
    let mut req = world.immediate_barrier();
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// `len` float32 values `f(i)` in memory advised for transparent huge pages, as strata's own
/// tables are: the single-process table (a copy made by strata) and the ranks' borrowed blocks
/// then read rows from the same kind of pages. (On 4 KiB pages random row reads miss the TLB
/// far more often, on both sides.)
fn huge_block(len: usize, f: impl Fn(usize) -> f32) -> memmap2::MmapMut {
    let mut map = memmap2::MmapMut::map_anon(len.max(1) * 4).expect("mmap");
    if std::env::var_os("STRATA_NO_HUGE_PAGES").is_none() {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    for (i, v) in map.chunks_exact_mut(4).enumerate() {
        v.copy_from_slice(&f(i).to_ne_bytes());
    }
    map
}

/// One rank under mpirun: builds the distributed table over its block (rank 0 also a
/// single-process table of every row), times interleaved rounds, checks rows, and (rank 0)
/// prints the report and a `RESULT` line.
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
    let block = huge_block(counts[rank] as usize * dim, |i| value(start + i / dim, i % dim));
    let owners: Vec<Vec<i32>> = (0..size as i32).map(|p| vec![p]).collect();
    let mut d = desc::Split::with_data(F32, dim, &counts, &owners, rank as i32, |_| block.as_ptr().cast());
    let mut t = null_mut();
    // SAFETY: d.c() points at a description whose pointers point into arrays d owns and, for this
    // rank's partition, at block; both outlive the table, which is dropped first (below). fint is
    // the world communicator's Fortran handle and t is a reference.
    ok(unsafe { strata_table_from_partitioned(d.c(), &fint, null(), &mut t) });
    let table = Owned(t);
    let keys = keys_of(rank, rows, batch);
    let mut out = vec![f32::NAN; batch * dim];
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());

    // Rank 0's single-process side: every rank's keys, one table of every row.
    let single = (rank == 0).then(|| {
        let global: Vec<f32> = (0..rows * dim).map(|i| value(i / dim, i % dim)).collect();
        let all: Vec<i64> = (0..size).flat_map(|r| keys_of(r, rows, batch)).collect();
        let t = Owned::build(&global, rows, dim, None, &TableOptions::default());
        let out = vec![0f32; all.len() * dim];
        (t, all, out)
    });
    let mut single = single;

    // Warm both sides, and check every row the distributed call wrote.
    lookup(table.0, &keys, &mut out, dim, 0);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(&out[i * dim..(i + 1) * dim], &(0..dim).map(|c| value(k as usize, c)).collect::<Vec<_>>()[..], "rank {rank}, key {i}");
    }
    if let Some((t, all, o)) = single.as_mut() {
        lookup(t.0, all, o, dim, cores as i32);
    }
    // SAFETY: table.0 is the live table built above (dropped below), borrowed only for this call.
    let before = unsafe { &*table.0 }.table().dist_timing().unwrap();
    let (mut ones, mut dists) = (Vec::new(), Vec::new());
    for _ in 0..rounds() {
        sleepy_barrier(&world);
        if let Some((t, all, o)) = single.as_mut() {
            let t0 = Instant::now();
            lookup(t.0, all, o, dim, cores as i32);
            ones.push(t0.elapsed().as_secs_f64());
        }
        sleepy_barrier(&world);
        // Every rank awake and leaving together: the distributed time is not to include how
        // long a sleeping rank took to be scheduled again.
        world.barrier();
        let t0 = Instant::now();
        lookup(table.0, &keys, &mut out, dim, 0);
        let mine = t0.elapsed().as_secs_f64();
        let mut slowest = 0.0;
        world.all_reduce_into(&mine, &mut slowest, SystemOperation::max());
        dists.push(slowest);
    }
    // SAFETY: table.0 is the live table built above (dropped below), borrowed only for this call.
    let after = unsafe { &*table.0 }.table().dist_timing().unwrap();
    let mine = per_call(&before, &after);
    let mut sums = [0f64; 10];
    let mut maxes = [0f64; 10];
    world.all_reduce_into(&mine[..], &mut sums[..], SystemOperation::sum());
    world.all_reduce_into(&mine[..], &mut maxes[..], SystemOperation::max());
    let threads = after.threads as f64;
    let mut max_threads = 0f64;
    world.all_reduce_into(&threads, &mut max_threads, SystemOperation::max());
    drop(table);
    if rank != 0 {
        return;
    }
    let mean: Vec<f64> = sums.iter().map(|s| s / size as f64).collect();
    let (one, dist) = (median(ones.clone()), median(dists.clone()));
    let mut ratios: Vec<f64> = dists.iter().zip(&ones).map(|(d, o)| d / o).collect();
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let limit = if size <= 2 { 3.0 } else { 4.0 };
    let ms = |s: f64| s * 1e3;
    println!(
        "\n== {size} ranks on one machine (mpirun -n {size} --bind-to none): {} lookup thread(s) per rank (library default), {cores} for one process",
        max_threads
    );
    println!(
        "one process {:.2} ms, distributed {:.2} ms (medians): {:.2}x (rounds {:.2}x-{:.2}x; target <= {limit}x)",
        ms(one),
        ms(dist),
        dist / one,
        ratios[0],
        ratios[ratios.len() - 1]
    );
    let names = ["bucket keys by owner", "key exchange", "gather served rows", "row exchange", "reorder into out"];
    println!("where a rank's time goes, per call, mean over ranks [slowest rank]:");
    for (i, name) in names.iter().enumerate() {
        println!(
            "  {name:<22} {:>8.2} ms [{:>6.2}]  {:>5.1}%  {:>7.1} ns/key",
            ms(mean[i + 1]),
            ms(maxes[i + 1]),
            100.0 * mean[i + 1] / mean[0],
            mean[i + 1] / mean[6] * 1e9
        );
    }
    let phases: f64 = mean[1..6].iter().sum();
    println!("  {:<22} {:>8.2} ms            {:>5.1}%", "other", ms(mean[0] - phases), 100.0 * (mean[0] - phases) / mean[0]);
    println!("  {:<22} {:>8.2} ms [{:>6.2}]", "total in the library", ms(mean[0]), ms(maxes[0]));
    println!(
        "per rank and call: {:.0} keys, {:.0} sent to other ranks, {:.0} served for them; {:.1} MB sent",
        mean[6],
        mean[7],
        mean[8],
        mean[9] / 1e6
    );
    println!(
        "one process: {:.1} ns per key on {cores} cores ({:.1} ns per key and core)",
        one / (size * batch) as f64 * 1e9,
        one / (size * batch) as f64 * 1e9 * cores as f64
    );
    if size == 2 {
        estimate(&mean, dim, batch);
    }
    println!(
        "RESULT {size:>5} {:>10} {:>12.2} {:>12.2} {:>7.2}x {:>6.2}-{:<6.2}x {:>7.1}x",
        size * batch,
        ms(one),
        ms(dist),
        dist / one,
        ratios[0],
        ratios[ratios.len() - 1],
        limit
    );
}

/// The lookup rate at 8 and 64 nodes over a 100 Gb/s network, from this run's per-key costs:
/// one rank per node, each with a rank's measured costs here; keys uniform over the nodes.
fn estimate(mean: &[f64], dim: usize, batch: usize) {
    let keys = mean[6];
    // Requester side (bucketing, writing rows into out) per key; owner side per served key.
    let req = (mean[1] + mean[5]) / keys;
    let serve = mean[3] / mean[8].max(1.0);
    let key_bytes = 8.0;
    let row_bytes = (dim * 4) as f64;
    println!(
        "estimate, one rank per node with these per-key costs ({:.0} ns/key to bucket and write out, {:.0} ns per served row), 100 Gb/s, {:.0} us per message, {batch} keys per node:",
        req * 1e9,
        serve * 1e9,
        NET_MESSAGE_S * 1e6
    );
    for nodes in [8usize, 64] {
        let p = nodes as f64;
        let remote = keys * (p - 1.0) / p;
        let compute = keys * req + remote * serve;
        // Each node sends its remote keys and the rows it serves, and receives as much (full duplex).
        let bytes = remote * (key_bytes + row_bytes);
        let wire = bytes / NET_BYTES_PER_S;
        let latency = 3.0 * (p - 1.0) * NET_MESSAGE_S;
        let call = compute + wire + latency;
        println!(
            "  {nodes:>2} nodes: {:.2} ms compute + {:.2} ms on the wire ({:.1} MB each way per node) + {:.2} ms messages = {:.2} ms per call; {:.0} M lookups/s in all ({:.1} M per node)",
            compute * 1e3,
            wire * 1e3,
            bytes / 1e6,
            latency * 1e3,
            call * 1e3,
            p * keys / call / 1e6,
            keys / call / 1e6
        );
    }
}
