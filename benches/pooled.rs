//! The pooled-lookup benchmark (issue 12), in one run on the same data:
//! - strata_lookup_pooled (sum) on a dense and a keyed table;
//! - strata's own gather-then-reduce (strata_lookup of every key into [nnz, dim], then a plain
//!   per-bag sum over those rows on the same threads);
//! - the read limit: a scan of the same number of bytes (nnz x dim float32, of a huge-page copy
//!   of the table, the memory the plain random-row loop reads), read and summed on
//!   the same threads;
//! - the hand-written baseline ../shared/anchors/pooled_like.cc (built with g++), which also
//!   prints its own read limit;
//! - a batch of 26 one-key lookups on 26 tables in one strata_lookup_batch, against one
//!   single-key strata_lookup.
//!
//! `cargo bench --bench pooled -- [rows dim bags hotness threads]` (defaults 1000000 128 10000
//! 20, the library's default threads). Not a test: it asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use common::*;
use std::ptr::{null, null_mut};

/// Splits `0..n` over `threads` scoped threads.
fn split(n: usize, threads: usize, f: impl Fn(usize, usize) + Sync) {
    std::thread::scope(|s| {
        for k in 0..threads {
            let f = &f;
            s.spawn(move || f(n * k / threads, n * (k + 1) / threads));
        }
    });
}

/// Sums rows `rows[i]` of `vectors` (`dim` float32 each, at address `vec_ptr`) into one sink row
/// per thread (`sink_ptr`, `threads` rows), `threads` threads each taking a contiguous share of
/// `rows`, prefetching every line of the row `ahead` keys further (0: none).
fn random_rows(rows: &[i64], vec_ptr: usize, dim: usize, threads: usize, sink_ptr: usize, ahead: usize) {
    split(threads, threads, |t, _| {
        // SAFETY: each thread owns sink t.
        let sink = unsafe { std::slice::from_raw_parts_mut((sink_ptr as *mut f32).add(t * dim), dim) };
        let (lo, hi) = (rows.len() * t / threads, rows.len() * (t + 1) / threads);
        let row = |i: usize| (vec_ptr as *const f32).wrapping_add(rows[i] as usize * dim);
        for i in lo..hi {
            if ahead > 0 && i + ahead < hi {
                let p = row(i + ahead) as *const u8;
                for off in (0..dim * 4).step_by(64) {
                    prefetch(p.wrapping_add(off));
                }
            }
            // SAFETY: rows[i] < the table's rows, so this is a whole row of `vectors`.
            let r = unsafe { std::slice::from_raw_parts(row(i), dim) };
            for (s, x) in sink.iter_mut().zip(r) {
                *s += *x;
            }
        }
    })
}

/// A hint to fetch the line at `p` into the cache.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Builds and runs the anchor; returns (pooled_like seconds, its read-limit seconds).
fn run_anchor(rows: usize, dim: usize, bags: usize, hot: usize, threads: usize) -> Result<(f64, f64), String> {
    let text = support::run_anchor("pooled_like", "STRATA_POOLED_ANCHOR", &[], &[rows, dim, bags, hot, threads])?;
    let s = |p| support::anchor_seconds(&text, p);
    Ok((s("pooled_like").ok_or("no pooled_like line")?, s("read limit").ok_or("no read limit line")?))
}

fn main() {
    let pages = support::same_pages_as_the_anchor();
    let words: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    // `batch`: only the small-call part (for perf / callgrind); `pooled`: only the pooled part.
    let only = |w: &str| words.iter().any(|a| a == w);
    if !only("batch") {
        pooled(&args, &pages);
    }
    if !only("pooled") {
        let calls = std::env::var("STRATA_BENCH_CALLS").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000);
        batch(calls);
    }
}

/// The pooled lookups on the large table, against the read limit, the gather-then-reduce and
/// the anchor.
fn pooled(args: &[usize], pages: &str) {
    let rows = args.first().copied().unwrap_or(1_000_000);
    let dim = args.get(1).copied().unwrap_or(128);
    let bags = args.get(2).copied().unwrap_or(10_000);
    let hot = args.get(3).copied().unwrap_or(20);
    let threads = args.get(4).copied().unwrap_or_else(|| strata_default_num_threads() as usize);
    let nnz = bags * hot;

    // The anchor's data: vectors (i % 997) * 0.25, keys uniform over the rows.
    let mut rng = Rng(11);
    let vectors: Vec<f32> = (0..rows * dim).map(|i| (i % 997) as f32 * 0.25).collect();
    let table_keys: Vec<i64> = (0..rows as i64).map(|r| r * 7 + 3).collect();
    let rowq: Vec<i64> = (0..nnz).map(|_| rng.below(rows as u64) as i64).collect();
    let keyq: Vec<i64> = rowq.iter().map(|r| r * 7 + 3).collect();
    let offsets: Vec<i64> = (0..=bags as i64).map(|b| b * hot as i64).collect();
    let opts = LookupOptions { num_threads: threads as i32, ..strata_lookup_options_default() };
    let dense = Owned::build(&vectors, rows, dim, None, &strata_table_options_default_0_3_1());
    let keyed = Owned::build(&vectors, rows, dim, Some(&table_keys), &strata_table_options_default_0_3_1());

    let rq = Desc::compact(rowq.as_ptr().cast(), I64, &[nnz as i64]);
    let kq = Desc::compact(keyq.as_ptr().cast(), I64, &[nnz as i64]);
    let od = Desc::compact(offsets.as_ptr().cast(), I64, &[bags as i64 + 1]);
    let mut out = vec![0f32; bags * dim];
    let mut odesc = Desc::compact(out.as_mut_ptr().cast(), F32, &[bags as i64, dim as i64]);
    let mut gathered = vec![0f32; nnz * dim];
    let mut gdesc = Desc::compact(gathered.as_mut_ptr().cast(), F32, &[nnz as i64, dim as i64]);
    let mut reduced = vec![0f32; bags * dim];
    let mut sinks = vec![0f32; threads * dim];
    let (op, gp) = (&mut odesc.t as *mut dlpark::ffi::DLTensor, &mut gdesc.t as *mut dlpark::ffi::DLTensor);
    let (red_ptr, sink_ptr, g_ptr) = (reduced.as_mut_ptr() as usize, sinks.as_mut_ptr() as usize, gathered.as_ptr() as usize);
    // A copy of the vectors laid out as strata's store lays out a table: 2 MiB aligned and advised
    // for transparent huge pages, so random rows rarely miss the TLB (the plain random-row loop reads
    // this copy, as the pooled lookups read the table's).
    let bytes = vectors.len() * 4;
    let mut huge = memmap2::MmapMut::map_anon(bytes + (2 << 20)).expect("map the huge-page copy");
    let start = (huge.as_ptr() as usize).next_multiple_of(2 << 20) - huge.as_ptr() as usize;
    let _ = huge.advise_range(memmap2::Advice::HugePage, start, bytes - bytes % (2 << 20));
    // SAFETY: `vectors` is bytes long; the copy's range starts at `start` and has bytes + the
    // alignment slack.
    unsafe { std::ptr::copy_nonoverlapping(vectors.as_ptr() as *const u8, huge.as_mut_ptr().add(start), bytes) };
    let huge_ptr = huge.as_ptr() as usize + start;

    let times = support::medians(
        11,
        &mut [
            // The read limit: nnz rows' worth of bytes of the huge-page copy (the memory the
            // plain random-row loop reads), scanned in order and summed.
            &mut || {
                split(threads, threads, |t, _| {
                    // SAFETY: each thread owns sink t; the scan reads inside the huge-page copy.
                    let sink = unsafe { std::slice::from_raw_parts_mut((sink_ptr as *mut f32).add(t * dim), dim) };
                    let (lo, hi) = (nnz * t / threads, nnz * (t + 1) / threads);
                    for i in lo..hi {
                        // SAFETY: (i % rows) < rows, a whole row of the copy of `vectors`.
                        let r = unsafe { std::slice::from_raw_parts((huge_ptr as *const f32).add((i % rows) * dim), dim) };
                        for (s, x) in sink.iter_mut().zip(r) {
                            *s += *x;
                        }
                    }
                })
            },
            // A plain loop over the same random rows the pooled lookups read (rowq), summed into one
            // row per thread, with every line of the row `ahead` keys further prefetched (0: no
            // prefetch): pooling without the bags, keys or output, what a simple loop gets from
            // random 512-byte reads on this machine. Not a bound: a lookup that keeps more lines in
            // flight can beat it.
            &mut || random_rows(&rowq, huge_ptr, dim, threads, sink_ptr, 0),
            &mut || random_rows(&rowq, huge_ptr, dim, threads, sink_ptr, 4),
            &mut || random_rows(&rowq, huge_ptr, dim, threads, sink_ptr, 8),
            &mut || random_rows(&rowq, huge_ptr, dim, threads, sink_ptr, 16),
            &mut || {
                // SAFETY: a live table and descriptions of this benchmark's buffers.
                ok(unsafe { strata_lookup_pooled(dense.0, &rq.t, &od.t, null(), 1, op, &opts, null_mut()) })
            },
            &mut || {
                // SAFETY: as above.
                ok(unsafe { strata_lookup_pooled(keyed.0, &kq.t, &od.t, null(), 1, op, &opts, null_mut()) })
            },
            // strata's own gather-then-reduce: every row gathered, then summed per bag.
            &mut || {
                // SAFETY: live table and descriptions.
                ok(unsafe { strata_lookup(keyed.0, &kq.t, gp, &opts, null_mut()) });
                split(bags, threads, |lo, hi| {
                    for b in lo..hi {
                        // SAFETY: bag b's row of `reduced` belongs to this thread alone.
                        let acc = unsafe { std::slice::from_raw_parts_mut((red_ptr as *mut f32).add(b * dim), dim) };
                        acc.fill(0.0);
                        for j in b * hot..(b + 1) * hot {
                            // SAFETY: row j of the gathered [nnz, dim] buffer.
                            let r = unsafe { std::slice::from_raw_parts((g_ptr as *const f32).add(j * dim), dim) };
                            for (a, x) in acc.iter_mut().zip(r) {
                                *a += *x;
                            }
                        }
                    }
                })
            },
        ],
    );
    let (t_limit, t_rand, t_dense, t_keyed, t_gr) = (times[0], times[1], times[5], times[6], times[7]);
    // The plain loop at its best prefetch distance, in this run.
    let (t_rand_pf, best_ahead) =
        [(times[2], 4), (times[3], 8), (times[4], 16)].into_iter().min_by(|a, b| a.0.total_cmp(&b.0)).expect("three distances");
    assert_eq!(out, reduced, "the pooled and the gather-then-reduce sums differ");

    let anchor = run_anchor(rows, dim, bags, hot, threads);
    let latency = support::random_line_latency(rows * dim * 4, 2_000_000);

    let bytes = (nnz * dim * 4) as f64;
    println!();
    println!("strata pooled benchmark: table {rows} x {dim} float32, {bags} bags x {hot} keys, sum, {threads} threads");
    println!("{}; {pages}", support::huge_pages());
    println!("{:<34} {:>10} {:>14} {:>12} {:>14}", "case", "ms", "GB/s of rows", "x limit", "x pooled_like");
    let anchor_t = anchor.as_ref().ok().map(|a| a.0);
    let line = |name: &str, t: f64| {
        let vs = anchor_t.map_or("n/a".to_string(), |a| format!("{:.2}", a / t));
        println!("{name:<34} {:>10.3} {:>14.2} {:>12.2} {:>14}", t * 1e3, bytes / t / 1e9, t_limit / t, vs);
    };
    line("read limit (scan of the same bytes)", t_limit);
    line("random rows, summed (no prefetch)", t_rand);
    for (i, ahead) in [4, 8, 16].into_iter().enumerate() {
        line(&format!("random rows, summed (prefetch {ahead})"), times[2 + i]);
    }
    line("strata pooled, dense table", t_dense);
    line("strata pooled, keyed table", t_keyed);
    line("strata gather-then-reduce (keyed)", t_gr);
    match &anchor {
        Ok((t, lim)) => {
            line("pooled_like (anchor)", *t);
            println!("{:<34} {:>10.3} {:>14.2} {:>12.2}", "anchor's own read limit", lim * 1e3, bytes / lim / 1e9, t_limit / lim);
        }
        Err(e) => println!("pooled_like (anchor): not run: {e}"),
    }
    println!();
    println!(
        "targets: pooled >= 0.8 x the read limit (dense {:.2}, keyed {:.2}); pooled >= 2x gather-then-reduce ({:.2}x)",
        t_limit / t_dense,
        t_limit / t_keyed,
        t_gr / t_keyed,
    );
    println!(
        "plain loop: summing the same random rows reaches {:.2} (no prefetch) / {:.2} (prefetch {best_ahead} ahead, the best \
         of 4/8/16) of the read limit; pooled dense is {:.2}x, keyed {:.2}x that loop's speed",
        t_limit / t_rand,
        t_limit / t_rand_pf,
        t_rand.min(t_rand_pf) / t_dense,
        t_rand.min(t_rand_pf) / t_keyed,
    );
    // Little's law: rows' lines read per second per thread, times the latency of one line.
    let in_flight = |t: f64| bytes / 64.0 / t / threads as f64 * latency;
    println!(
        "random line latency (pointer chase over the table's {} MiB, huge pages): {:.0} ns; lines in flight per thread at \
         that latency: read limit {:.1}, plain loop {:.1}, pooled dense {:.1}, pooled keyed {:.1} (+1 bucket line a key: {:.1})",
        (rows * dim * 4) >> 20,
        latency * 1e9,
        in_flight(t_limit),
        in_flight(t_rand_pf),
        in_flight(t_dense),
        in_flight(t_keyed),
        in_flight(t_keyed) * (1.0 + 64.0 / (dim * 4) as f64),
    );
}

/// The batch: 26 tables, one key each, batch 1, in one strata_lookup_batch; against one
/// single-key strata_lookup (inline, on the calling thread) and 26 separate calls. `calls`
/// calls per timed round.
fn batch(calls: usize) {
    let small: Vec<Owned> = (0..26)
        .map(|i| {
            let d = 16 + 8 * (i % 8);
            let v: Vec<f32> = (0..10_000 * d).map(|x| x as f32).collect();
            Owned::build(&v, 10_000, d, None, &strata_table_options_default_0_3_1())
        })
        .collect();
    let one = [42i64];
    let one_k = Desc::compact(one.as_ptr().cast(), I64, &[1]);
    let mut outs: Vec<Vec<f32>> = (0..26).map(|i| vec![0f32; 16 + 8 * (i % 8)]).collect();
    let mut odescs: Vec<Desc> = outs.iter_mut().map(|o| Desc::compact(o.as_mut_ptr().cast(), F32, &[1, o.len() as i64])).collect();
    let requests: Vec<strata_lookup_request> = small
        .iter()
        .zip(odescs.iter_mut())
        .map(|(t, o)| strata_lookup_request { table: t.0, keys: &one_k.t, out: &mut o.t, ..strata_lookup_request_default() })
        .collect();
    let inline = LookupOptions { num_threads: 1, ..strata_lookup_options_default() };
    let first_out: *mut dlpark::ffi::DLTensor = &mut odescs[0].t;
    let per_call = support::medians(
        7,
        &mut [
            &mut || {
                for _ in 0..calls {
                    // SAFETY: a live table and descriptions.
                    ok(unsafe { strata_lookup(small[0].0, &one_k.t, first_out, &inline, null_mut()) });
                }
            },
            &mut || {
                for _ in 0..calls {
                    // SAFETY: 26 requests over live tables and descriptions.
                    ok(unsafe { strata_lookup_batch(requests.as_ptr(), requests.len(), &inline) });
                }
            },
            &mut || {
                for _ in 0..calls {
                    for r in &requests {
                        // SAFETY: as above.
                        ok(unsafe { strata_lookup(r.table, r.keys, r.out, &inline, null_mut()) });
                    }
                }
            },
        ],
    );
    let (t_one, t_batch, t_26) = (per_call[0] / calls as f64, per_call[1] / calls as f64, per_call[2] / calls as f64);

    println!(
        "batch of 26 one-key lookups (26 tables): {:.0} ns per strata_lookup_batch; one single-key strata_lookup: {:.0} ns; 26 separate calls: {:.0} ns",
        t_batch * 1e9,
        t_one * 1e9,
        t_26 * 1e9
    );
    println!("targets: batch of 26 <= 3x one call ({:.2}x); one single-key call < 0.5 us ({:.3} us)", t_batch / t_one, t_one * 1e6);
}
