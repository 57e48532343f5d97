//! The lookup benchmark: strata keyed lookup, strata dense gather, a multi-threaded memcpy of
//! the same output bytes (the bandwidth limit) and the hand-written HPS-like baseline
//! (../shared/anchors/hps_like.cc, built with g++ and libabsl-dev), on the same sizes, in one
//! run, with ratios. Also the per-call overhead of a one-key lookup through the C ABI.
//!
//! `cargo bench --bench lookup -- [rows dim batch threads]` (defaults 1000000 128 200000, and
//! the library's default thread count). Not a test: it asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use common::*;
use std::time::Instant;

/// Copies `src` into `dst` on `threads` scoped threads, split evenly (the limit's method).
fn parallel_memcpy(src: &[f32], dst: &mut [f32], threads: usize) {
    let n = src.len();
    std::thread::scope(|s| {
        let mut rest = dst;
        for k in 0..threads {
            let (lo, hi) = (n * k / threads, n * (k + 1) / threads);
            let (mine, tail) = rest.split_at_mut(hi - lo);
            rest = tail;
            let src = &src[lo..hi];
            s.spawn(move || mine.copy_from_slice(src));
        }
    });
}

/// Builds and runs the anchor; returns (hps_like seconds, its memcpy seconds) or why not.
fn run_anchor(rows: usize, dim: usize, batch: usize, threads: usize) -> Result<(f64, f64), String> {
    let libs = ["-labsl_hash", "-labsl_city", "-labsl_low_level_hash", "-labsl_raw_hash_set"];
    let text = support::run_anchor("hps_like", "STRATA_ANCHOR", &libs, &[rows, dim, batch, threads])
        .map_err(|e| format!("{e} (install libabsl-dev)"))?;
    let s = |p| support::anchor_seconds(&text, p);
    Ok((s("hps_like").ok_or("no hps_like line")?, s("memcpy").ok_or("no memcpy line")?))
}

/// Writes `keys` and `vectors` as a HugeCTR sparse folder (`key`, `emb_vector`) into `dir`.
fn write_folder(dir: &std::path::Path, keys: &[i64], vectors: &[f32]) {
    use std::io::Write;
    let mut k = std::io::BufWriter::new(std::fs::File::create(dir.join("key")).expect("key file"));
    keys.iter().for_each(|v| k.write_all(&v.to_le_bytes()).expect("writing key"));
    k.flush().expect("writing key");
    let mut e = std::io::BufWriter::new(std::fs::File::create(dir.join("emb_vector")).expect("emb_vector file"));
    vectors.iter().for_each(|v| e.write_all(&v.to_le_bytes()).expect("writing emb_vector"));
    e.flush().expect("writing emb_vector");
}

/// Opens the HugeCTR folder `dir` with `dim` columns and default options.
fn open_folder(dir: &std::path::Path, dim: usize) -> Owned {
    let c = std::ffi::CString::new(dir.to_str().expect("a UTF-8 path")).expect("no NUL in the path");
    let mut t = std::ptr::null_mut();
    // SAFETY: c is a NUL-terminated path, alive past the call, which only reads it; t is a
    // reference.
    ok(unsafe { strata_table_open(c.as_ptr(), dim as i64, std::ptr::null(), &mut t) });
    Owned(t)
}

fn main() {
    let pages = support::same_pages_as_the_anchor();
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = args.first().copied().unwrap_or(1_000_000);
    let dim = args.get(1).copied().unwrap_or(128);
    let batch = args.get(2).copied().unwrap_or(200_000);
    let threads = args.get(3).copied().unwrap_or_else(|| strata_default_num_threads() as usize);

    // The anchor's data: random 63-bit keys, vectors (i % 997) * 0.5, ~10% misses.
    let mut rng = Rng(7);
    let keys: Vec<i64> = (0..rows).map(|_| (rng.next() >> 1) as i64).collect();
    let vectors: Vec<f32> = (0..rows * dim).map(|i| (i % 997) as f32 * 0.5).collect();
    let mut query: Vec<i64> = Vec::with_capacity(batch);
    let mut dense_query: Vec<i64> = Vec::with_capacity(batch);
    for _ in 0..batch {
        let miss = rng.next().is_multiple_of(10);
        let r = (rng.next() % rows as u64) as usize;
        query.push(if miss { (rng.next() >> 1) as i64 } else { keys[r] });
        dense_query.push(if miss { rows as i64 + r as i64 } else { r as i64 });
    }
    let mut out = vec![0f32; batch * dim];

    let vdesc = Desc::compact(vectors.as_ptr().cast(), F32, &[rows as i64, dim as i64]);
    let kdesc = Desc::compact(keys.as_ptr().cast(), I64, &[rows as i64]);
    let (mut keyed, mut dense) = (std::ptr::null_mut(), std::ptr::null_mut());
    let t0 = Instant::now();
    // SAFETY: vdesc and kdesc describe vectors and keys ([rows, dim] floats and rows keys), alive
    // past the call, which copies them; keyed is a reference.
    ok(unsafe { strata_table_from_dlpack(&vdesc.t, &kdesc.t, std::ptr::null(), &mut keyed) });
    let build_s = t0.elapsed().as_secs_f64();
    // SAFETY: vdesc describes vectors ([rows, dim] floats), alive past the call, which copies them;
    // dense is a reference.
    ok(unsafe { strata_table_from_dlpack(&vdesc.t, std::ptr::null(), std::ptr::null(), &mut dense) });
    let (keyed, dense) = (Owned(keyed), Owned(dense));
    let mut info = strata_table_info_default_0_3_1();
    // SAFETY: keyed.0 is the live table just built; info is a reference, its struct_size set by its
    // initialiser.
    ok(unsafe { strata_table_get_info(keyed.0, &mut info) });
    // The same table as a HugeCTR sparse folder, for the memory-mapped case below.
    let folder = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).expect("a temporary folder");
    write_folder(folder.path(), &keys, &vectors);
    drop(vectors);
    drop(keys);

    let qdesc = Desc::compact(query.as_ptr().cast(), I64, &[batch as i64]);
    let ddesc = Desc::compact(dense_query.as_ptr().cast(), I64, &[batch as i64]);
    let out_ptr = out.as_mut_ptr();
    let mut odesc = Desc::compact(out_ptr.cast(), F32, &[batch as i64, dim as i64]);
    let opts = LookupOptions { num_threads: threads as i32, ..LookupOptions::default() };
    let mut keyed_stats = LookupStats::default();
    let src = vec![1f32; batch * dim];
    let (kt, dt) = (keyed.0, dense.0);
    let op: *mut dlpark::ffi::DLTensor = &mut odesc.t;
    let times = support::medians(
        11,
        &mut [
            // SAFETY: out_ptr is out's buffer of batch * dim floats, alive to the end of main; nothing
            // else reads or writes it while this case runs (medians runs one case at a time).
            &mut || parallel_memcpy(&src, unsafe { std::slice::from_raw_parts_mut(out_ptr, batch * dim) }, threads),
            // SAFETY: kt is the live keyed table (dropped at the end of main); qdesc describes query
            // (batch keys) and op points at odesc.t, which describes out (batch x dim floats), all
            // alive to the end of main; opts and keyed_stats are locals.
            &mut || ok(unsafe { strata_lookup(kt, &qdesc.t, op, &opts, &mut keyed_stats) }),
            // SAFETY: dt is the live dense table (dropped at the end of main); ddesc describes
            // dense_query (batch keys) and op points at odesc.t, which describes out (batch x dim
            // floats), all alive to the end of main; opts is a local.
            &mut || ok(unsafe { strata_lookup(dt, &ddesc.t, op, &opts, std::ptr::null_mut()) }),
        ],
    );
    let (t_memcpy, t_keyed, t_dense) = (times[0], times[1], times[2]);
    drop(src);

    // Per-call overhead: one key, inline, through the C ABI.
    let one = [query[0]];
    let mut one_out = vec![0f32; dim];
    let one_k = Desc::compact(one.as_ptr().cast(), I64, &[1]);
    let mut one_o = Desc::compact(one_out.as_mut_ptr().cast(), F32, &[1, dim as i64]);
    let inline = LookupOptions { num_threads: 1, ..LookupOptions::default() };
    let one_op: *mut dlpark::ffi::DLTensor = &mut one_o.t;
    let calls = 100_000;
    let one_key = support::medians(
        11,
        &mut [
            &mut || {
                for _ in 0..calls {
                    // SAFETY: kt is the live keyed table; one_k describes one (1 key) and one_op points
                    // at one_o.t, which describes one_out (dim floats), all alive to the end of main;
                    // inline is a local.
                    ok(unsafe { strata_lookup(kt, &one_k.t, one_op, &inline, std::ptr::null_mut()) });
                }
            },
            &mut || {
                for _ in 0..calls {
                    // SAFETY: kt is the live keyed table; one_k describes one (1 key) and one_op points
                    // at one_o.t, which describes one_out (dim floats), all alive to the end of main.
                    ok(unsafe { strata_lookup(kt, &one_k.t, one_op, std::ptr::null(), std::ptr::null_mut()) });
                }
            },
        ],
    );
    let (t_one, t_one_default) = (one_key[0] / calls as f64, one_key[1] / calls as f64);

    // A memory-mapped table (strata_table_open): opening builds the index and prepares the
    // mapping; the first lookup after it shows what page faults are left.
    let mapped = open_folder(folder.path(), dim);
    let t0 = Instant::now();
    // SAFETY: mapped.0 is the live table just opened; qdesc describes query (batch keys) and op
    // points at odesc.t, which describes out (batch x dim floats), all alive to the end of main.
    ok(unsafe { strata_lookup(mapped.0, &qdesc.t, op, &opts, std::ptr::null_mut()) });
    let first_mapped = t0.elapsed().as_secs_f64();
    let later_mapped = support::medians(
        5,
        &mut [
            // SAFETY: as for the first lookup above.
            &mut || ok(unsafe { strata_lookup(mapped.0, &qdesc.t, op, &opts, std::ptr::null_mut()) }),
        ],
    )[0];
    drop(mapped);
    drop(folder);

    let anchor = run_anchor(rows, dim, batch, threads);
    let latency = support::random_line_latency(rows * dim * 4, 2_000_000);

    let bytes = 2.0 * (batch * dim * 4) as f64;
    let gbs = |t: f64| bytes / t / 1e9;
    println!();
    println!("strata lookup benchmark: table {rows} x {dim} float32, batch {batch} keys (~10% misses), {threads} threads");
    println!(
        "keyed index: {} bytes = {:.2} bytes/key (vectors {} bytes); built in {:.1} ms",
        info.index_bytes,
        info.index_bytes as f64 / rows as f64,
        info.vector_bytes,
        build_s * 1e3
    );
    println!("keyed stats: {} hits, {} misses", keyed_stats.hits, keyed_stats.misses);
    println!("{}; {pages}", support::huge_pages());
    println!();
    println!("{:<28} {:>10} {:>12} {:>14} {:>14}", "case", "ms", "GB/s (r+w)", "x memcpy", "x hps_like");
    let anchor_t = anchor.as_ref().ok().map(|a| a.0);
    let row = |name: &str, t: f64| {
        let vs_anchor = anchor_t.map_or("n/a".to_string(), |a| format!("{:.2}", a / t));
        println!("{name:<28} {:>10.3} {:>12.2} {:>14.2} {:>14}", t * 1e3, gbs(t), t_memcpy / t, vs_anchor);
    };
    row("memcpy (limit)", t_memcpy);
    row("strata keyed lookup", t_keyed);
    row("strata dense gather", t_dense);
    let mut vs_anchor = "n/a (anchor not run)".to_string();
    match &anchor {
        Ok((t, t_mc)) => {
            row("hps_like (anchor)", *t);
            println!("{:<28} {:>10.3} {:>12.2} {:>14.2}", "anchor's own memcpy", t_mc * 1e3, gbs(*t_mc), t_memcpy / t_mc);
            // The anchor runs in its own process after strata's rounds; on a machine whose speed
            // drifts, each side against the memcpy measured beside it is the steadier comparison.
            let own = (t_memcpy / t_keyed) / (t_mc / t);
            println!(
                "keyed vs anchor: {:.2}x by time, {:.2}x with each against its own memcpy ({:.2} vs {:.2})",
                t / t_keyed,
                own,
                t_memcpy / t_keyed,
                t_mc / t
            );
            vs_anchor = format!("{:.2} by time, {own:.2} each against its own memcpy", t / t_keyed);
        }
        Err(e) => println!("hps_like (anchor): not run: {e}"),
    }
    // Little's law: what the dense gather reads per thread, times the latency of one line.
    let in_flight = |t: f64| (batch * dim * 4) as f64 / 64.0 / t / threads as f64 * latency;
    println!(
        "random line latency (pointer chase over the table's {} MiB, huge pages): {:.0} ns; at that latency the dense gather \
         keeps {:.1} lines in flight per thread, the keyed lookup {:.1} (+1 bucket line a key: {:.1})",
        (rows * dim * 4) >> 20,
        latency * 1e9,
        in_flight(t_dense),
        in_flight(t_keyed),
        in_flight(t_keyed) * (1.0 + 64.0 / (dim * 4) as f64),
    );
    println!(
        "HugeCTR folder (strata_table_open, memory-mapped): first lookup after open {:.3} ms, later lookups {:.3} ms ({:.2} x memcpy)",
        first_mapped * 1e3,
        later_mapped * 1e3,
        t_memcpy / later_mapped
    );
    println!();
    println!("single-key lookup, num_threads=1: {:.0} ns/call; num_threads=0: {:.0} ns/call", t_one * 1e9, t_one_default * 1e9);
    println!(
        "targets: keyed >= 0.60 x memcpy ({:.2}), keyed >= 1.2 x hps_like ({vs_anchor}), dense >= 0.80 x memcpy ({:.2}), single key < 500 ns ({:.0})",
        t_memcpy / t_keyed,
        t_memcpy / t_dense,
        t_one * 1e9
    );
}
