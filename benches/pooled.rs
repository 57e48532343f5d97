//! The pooled-lookup benchmark (issue 12), in one run on the same data:
//! - strata_lookup_pooled (sum) on a dense and a keyed table;
//! - strata's own gather-then-reduce (strata_lookup of every key into [nnz, dim], then a plain
//!   per-bag sum over those rows on the same threads);
//! - the read limit: a scan of the same number of bytes (nnz x dim float32), read and summed on
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

/// Builds and runs the anchor; returns (pooled_like seconds, its read-limit seconds).
fn run_anchor(rows: usize, dim: usize, bags: usize, hot: usize, threads: usize) -> Result<(f64, f64), String> {
    let text = support::run_anchor("pooled_like", "STRATA_POOLED_ANCHOR", &[], &[rows, dim, bags, hot, threads])?;
    let s = |p| support::anchor_seconds(&text, p);
    Ok((s("pooled_like").ok_or("no pooled_like line")?, s("read limit").ok_or("no read limit line")?))
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
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
    let dense = Owned::build(&vectors, rows, dim, None, &strata_table_options_default());
    let keyed = Owned::build(&vectors, rows, dim, Some(&table_keys), &strata_table_options_default());

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
    let vec_ptr = vectors.as_ptr() as usize;

    let times = support::medians(11, &mut [
        // The read limit: nnz rows' worth of bytes, scanned in order and summed.
        &mut || {
            split(threads, threads, |t, _| {
                // SAFETY: each thread owns sink t; the scan reads inside `vectors`.
                let sink = unsafe { std::slice::from_raw_parts_mut((sink_ptr as *mut f32).add(t * dim), dim) };
                let (lo, hi) = (nnz * t / threads, nnz * (t + 1) / threads);
                for i in lo..hi {
                    // SAFETY: (i % rows) < rows, a whole row of `vectors`.
                    let r = unsafe { std::slice::from_raw_parts((vec_ptr as *const f32).add((i % rows) * dim), dim) };
                    for (s, x) in sink.iter_mut().zip(r) {
                        *s += *x;
                    }
                }
            })
        },
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
    ]);
    let (t_limit, t_dense, t_keyed, t_gr) = (times[0], times[1], times[2], times[3]);
    assert_eq!(out, reduced, "the pooled and the gather-then-reduce sums differ");

    // The batch: 26 tables, one key each, batch 1; against one single-key lookup.
    let small: Vec<Owned> = (0..26)
        .map(|i| {
            let d = 16 + 8 * (i % 8);
            let v: Vec<f32> = (0..10_000 * d).map(|x| x as f32).collect();
            Owned::build(&v, 10_000, d, None, &strata_table_options_default())
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
    let calls = 20_000;
    let first_out: *mut dlpark::ffi::DLTensor = &mut odescs[0].t;
    let per_call = support::medians(7, &mut [
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
    ]);
    let (t_one, t_batch, t_26) = (per_call[0] / calls as f64, per_call[1] / calls as f64, per_call[2] / calls as f64);

    let anchor = run_anchor(rows, dim, bags, hot, threads);

    let bytes = (nnz * dim * 4) as f64;
    println!();
    println!("strata pooled benchmark: table {rows} x {dim} float32, {bags} bags x {hot} keys, sum, {threads} threads");
    println!("{:<34} {:>10} {:>14} {:>12} {:>14}", "case", "ms", "GB/s of rows", "x limit", "x pooled_like");
    let anchor_t = anchor.as_ref().ok().map(|a| a.0);
    let line = |name: &str, t: f64| {
        let vs = anchor_t.map_or("n/a".to_string(), |a| format!("{:.2}", a / t));
        println!("{name:<34} {:>10.3} {:>14.2} {:>12.2} {:>14}", t * 1e3, bytes / t / 1e9, t_limit / t, vs);
    };
    line("read limit (scan of the same bytes)", t_limit);
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
        "batch of 26 one-key lookups (26 tables): {:.0} ns per strata_lookup_batch; one single-key strata_lookup: {:.0} ns; 26 separate calls: {:.0} ns",
        t_batch * 1e9,
        t_one * 1e9,
        t_26 * 1e9
    );
    println!(
        "targets: pooled >= 0.8 x the read limit (dense {:.2}, keyed {:.2}); pooled >= 2x gather-then-reduce ({:.2}x); batch of 26 <= 3x one call ({:.2}x)",
        t_limit / t_dense,
        t_limit / t_keyed,
        t_gr / t_keyed,
        t_batch / t_one
    );
}
