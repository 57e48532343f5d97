//! The tiered benchmark: a parameter-server table (volatile tier holding 20% of the rows in
//! front of the LMDB persistent tier) against the core keyed lookup of the same rows, on
//! Zipf-distributed keys (alpha 1.1), through the C ABI.
//!
//! `cargo bench --bench tiered -- [rows dim batch batches]` (defaults 10000000 32 100000 20).
//! It writes a HugeCTR folder of that size to a temporary directory (1.3 GB at the default
//! size) and bulk-loads it into LMDB first; these setup times are printed too. Not a test: it
//! asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::ffi::CString;
use std::io::Write;
use std::time::Instant;

/// Samples ranks 0..n with P(r) proportional to 1 / (r + 1)^alpha, by inverting the CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, alpha: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for r in 0..n {
            acc += 1.0 / ((r + 1) as f64).powf(alpha);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = args.first().copied().unwrap_or(10_000_000);
    let dim = args.get(1).copied().unwrap_or(32);
    let batch = args.get(2).copied().unwrap_or(100_000);
    let batches = args.get(3).copied().unwrap_or(20).max(1);
    let partitions = 4;

    let dir = tempfile::tempdir().expect("temp dir");
    let sparse = dir.path().join("sparse");
    std::fs::create_dir(&sparse).unwrap();
    let t0 = Instant::now();
    let mut rng = Rng(11);
    let keys: Vec<i64> = (0..rows).map(|_| (rng.next() >> 1) as i64).collect();
    {
        let mut kf = std::io::BufWriter::new(std::fs::File::create(sparse.join("key")).unwrap());
        for k in &keys {
            kf.write_all(&k.to_le_bytes()).unwrap();
        }
        let mut vf = std::io::BufWriter::new(std::fs::File::create(sparse.join("emb_vector")).unwrap());
        let mut row = vec![0u8; dim * 4];
        for r in 0..rows {
            for c in 0..dim {
                row[c * 4..c * 4 + 4].copy_from_slice(&((r % 1009) as f32 + c as f32).to_le_bytes());
            }
            vf.write_all(&row).unwrap();
        }
    }
    let write_s = t0.elapsed().as_secs_f64();

    // 20% of the rows fit in the volatile tier; hot rows found in the persistent tier are
    // promoted and the least used evicted.
    let capacity = rows / 5;
    let json = format!(
        r#"{{ "volatile_db": {{ "type": "parallel_hash_map", "num_partitions": {partitions},
               "overflow_margin": {}, "overflow_policy": "evict_least_used",
               "overflow_resolution_target": 0.9, "initial_cache_rate": 0.2, "cache_missed_embeddings": true }},
             "persistent_db": {{ "type": "rocks_db", "path": "db" }},
             "models": [ {{ "model": "bench", "sparse_files": ["sparse"], "embedding_vecsize_per_table": [{dim}],
                           "maxnum_catfeature_query_per_table_per_sample": [1] }} ] }}"#,
        capacity / partitions
    );
    let (j, base) = (CString::new(json).unwrap(), CString::new(dir.path().to_str().unwrap()).unwrap());
    let mut server = std::ptr::null_mut();
    let t0 = Instant::now();
    // SAFETY: j and base are NUL-terminated strings alive past the call; server is a reference.
    ok(unsafe { strata_server_open_json(j.as_ptr(), base.as_ptr(), &mut server) });
    let open_s = t0.elapsed().as_secs_f64();
    let model = CString::new("bench").unwrap();
    let mut tiered = std::ptr::null_mut();
    // SAFETY: server is the live server just opened (freed at the end of main); model is a
    // NUL-terminated string alive past the call; tiered is a reference.
    ok(unsafe { strata_server_table(server, model.as_ptr(), 0, &mut tiered) });

    let path = CString::new(sparse.to_str().unwrap()).unwrap();
    let mut keyed = std::ptr::null_mut();
    let t0 = Instant::now();
    // SAFETY: path is a NUL-terminated string alive past the call; keyed is a reference.
    ok(unsafe { strata_table_open(path.as_ptr(), dim as i64, std::ptr::null(), &mut keyed) });
    let keyed_open_s = t0.elapsed().as_secs_f64();
    let keyed = Owned(keyed);

    let zipf = Zipf::new(rows, 1.1);
    let queries: Vec<Vec<i64>> =
        (0..batches + 1).map(|_| (0..batch).map(|_| keys[zipf.sample(&mut rng)]).collect()).collect();
    let mut out = vec![0f32; batch * dim];
    let op = out.as_mut_ptr();
    let run = |t: *mut Table, q: &[i64]| -> (f64, LookupStats) {
        let k = Desc::compact(q.as_ptr().cast(), I64, &[q.len() as i64]);
        let mut o = Desc::compact(op.cast(), F32, &[q.len() as i64, dim as i64]);
        let mut st = LookupStats::default();
        let t0 = Instant::now();
        // SAFETY: t is `tiered` (borrowed from the server, which stays open until the end of main)
        // or keyed.0 (a live Owned), the only tables `run` is given; k describes q and o describes
        // out (q.len() = batch rows of dim floats), both alive past the call; st is a reference.
        ok(unsafe { strata_lookup(t, &k.t, &mut o.t, std::ptr::null(), &mut st) });
        (t0.elapsed().as_secs_f64(), st)
    };
    // warm-up batch (promotes the hottest rows), then timed batches, interleaved with the core
    // keyed lookup of the same keys
    run(tiered, &queries[0]);
    run(keyed.0, &queries[0]);
    let before = {
        let mut s = TableStats::default();
        // SAFETY: tiered is borrowed from the server, still open; s is a reference.
        ok(unsafe { strata_table_get_stats(tiered, &mut s) });
        s
    };
    let (mut tt, mut tk) = (Vec::new(), Vec::new());
    let (mut vh, mut ph, mut miss) = (0u64, 0u64, 0u64);
    for q in &queries[1..] {
        let (t, st) = run(tiered, q);
        tt.push(t);
        vh += st.volatile_hits;
        ph += st.persistent_hits;
        miss += st.misses;
        tk.push(run(keyed.0, q).0);
    }
    let mut after = TableStats::default();
    // SAFETY: tiered is borrowed from the server, still open; after is a reference.
    ok(unsafe { strata_table_get_stats(tiered, &mut after) });
    let total = (batch * batches) as f64;
    let (t_tiered, t_keyed) = (median(tt), median(tk));

    println!("strata tiered benchmark: {rows} rows x {dim} float32, batches of {batch} Zipf(1.1) keys, {batches} timed batches");
    println!(
        "setup: wrote the HugeCTR folder in {write_s:.1} s; server open (LMDB bulk load + warming 20%) {open_s:.1} s; \
         core keyed table open {keyed_open_s:.2} s"
    );
    println!(
        "volatile tier: {} rows ({:.1} MiB, {:.3} x their raw vectors), capacity {capacity}; persistent tier: {} rows",
        after.volatile_rows,
        after.volatile_bytes as f64 / (1 << 20) as f64,
        after.volatile_bytes as f64 / (after.volatile_rows.max(1) as f64 * dim as f64 * 4.0),
        after.persistent_rows
    );
    println!();
    println!("{:<26} {:>12} {:>14} {:>10}", "case", "ms/batch", "Mlookups/s", "x keyed");
    println!("{:<26} {:>12.2} {:>14.2} {:>10.2}", "strata keyed (core)", t_keyed * 1e3, batch as f64 / t_keyed / 1e6, 1.0);
    println!(
        "{:<26} {:>12.2} {:>14.2} {:>10.2}",
        "strata tiered (server)",
        t_tiered * 1e3,
        batch as f64 / t_tiered / 1e6,
        t_keyed / t_tiered
    );
    println!();
    println!(
        "tiered hit rates over the timed batches: volatile {:.1}%, persistent {:.1}%, default {:.1}%; \
         evictions {}, promotions by cache_missed_embeddings included",
        100.0 * vh as f64 / total,
        100.0 * ph as f64 / total,
        100.0 * miss as f64 / total,
        after.evictions - before.evictions
    );
    // SAFETY: server is the server opened above, freed once here; its table `tiered` is not used
    // after.
    unsafe { strata_server_free(server) };
}
