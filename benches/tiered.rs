//! The tiered benchmark: a parameter-server table (volatile tier holding 20% of the rows in
//! front of the LMDB persistent tier) against the core keyed lookup of the same rows, on
//! Zipf-distributed keys (alpha 1.1), through the C ABI.
//!
//! `cargo bench --bench tiered -- [rows dim batch batches]` (defaults 10000000 32 100000 20).
//! It writes a HugeCTR folder of that size to a temporary directory (1.3 GB at the default
//! size) and bulk-loads it into LMDB first (1.5 GB); these setup times are printed too.
//! `STRATA_TIERED_BENCH_DIR=folder` keeps both there for reruns at the same size.
//!
//! It prints, from one run on the same keys: wall and process CPU time per batch of both
//! tables and their ratio, the hit rates per tier, page faults per batch, where the tiered
//! time goes (ns per volatile hit, per LMDB read with and without promotion, a model of the
//! batch from those at the measured hit rates, and the ratio the LMDB reads alone would allow),
//! and the volatile tier's memory against its raw vectors at this width and at the other
//! common one (32 <-> 128 floats). Not a test: it asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::ffi::CString;
use std::io::Write;
use std::time::Instant;
use strata::storage::tier::persistent::PersistentStore;
use strata::storage::tier::volatile::{OverflowPolicy, VolatileTier};

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

    // STRATA_TIERED_BENCH_DIR keeps the HugeCTR folder and the LMDB store there, for reruns at
    // the same size (it skips the writing and the bulk load; delete the folder when done).
    let kept = std::env::var_os("STRATA_TIERED_BENCH_DIR").map(|d| std::path::PathBuf::from(d).join(format!("{rows}x{dim}")));
    let temp = match kept {
        Some(_) => None,
        None => Some(tempfile::tempdir().expect("temp dir")),
    };
    let root = kept.clone().unwrap_or_else(|| temp.as_ref().unwrap().path().to_path_buf());
    let sparse = root.join("sparse");
    let reuse = kept.is_some() && sparse.join("emb_vector").exists() && root.join("db").exists();
    std::fs::create_dir_all(&sparse).unwrap();
    let t0 = Instant::now();
    let mut rng = Rng(11);
    let keys: Vec<i64> = (0..rows).map(|_| (rng.next() >> 1) as i64).collect();
    if !reuse {
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
    let t0 = Instant::now();
    let server = open_server(&root, dim, partitions, capacity, true);
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
    let queries: Vec<Vec<i64>> = (0..batches + 1).map(|_| (0..batch).map(|_| keys[zipf.sample(&mut rng)]).collect()).collect();
    let mut out = vec![0f32; batch * dim];
    let op = out.as_mut_ptr();
    // Wall time and process CPU time (all threads) of one lookup: on a shared machine the CPU
    // time is the steadier of the two.
    let faults = std::cell::Cell::new([[0u64; 2]; 2]);
    let run = |t: *mut Table, q: &[i64]| -> (f64, f64, LookupStats) {
        let k = Desc::compact(q.as_ptr().cast(), I64, &[q.len() as i64]);
        let mut o = Desc::compact(op.cast(), F32, &[q.len() as i64, dim as i64]);
        let mut st = LookupStats::default();
        let (c0, f0, t0) = (cpu_s(), page_faults(), Instant::now());
        // SAFETY: t is a tiered table borrowed from a server that stays open while `run` is used
        // on it, or keyed.0 (a live Owned); k describes q and o describes out (q.len() <= batch
        // rows of dim floats), both alive past the call; st is a reference.
        ok(unsafe { strata_lookup(t, &k.t, &mut o.t, std::ptr::null(), &mut st) });
        let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_s() - c0);
        let i = usize::from(t != keyed.0);
        let (mut f, f1) = (faults.get(), page_faults());
        f[i][0] += f1[0] - f0[0];
        f[i][1] += f1[1] - f0[1];
        faults.set(f);
        (wall, cpu, st)
    };
    let stats = |t: *mut Table| {
        let mut s = TableStats::default();
        // SAFETY: t is borrowed from a server that is still open; s is a reference.
        ok(unsafe { strata_table_get_stats(t, &mut s) });
        s
    };
    // warm-up batch (promotes the hottest rows), then timed batches, interleaved with the core
    // keyed lookup of the same keys
    run(tiered, &queries[0]);
    run(keyed.0, &queries[0]);
    let before = stats(tiered);
    faults.set([[0; 2]; 2]);
    let (mut tt, mut tk, mut ct, mut ck) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut vh, mut ph, mut miss) = (0u64, 0u64, 0u64);
    for q in &queries[1..] {
        let (t, c, st) = run(tiered, q);
        tt.push(t);
        ct.push(c);
        vh += st.volatile_hits;
        ph += st.persistent_hits;
        miss += st.misses;
        let (t, c, _) = run(keyed.0, q);
        tk.push(t);
        ck.push(c);
    }
    let after = stats(tiered);
    let [keyed_faults, tiered_faults] = faults.get();
    let total = (batch * batches) as f64;
    let (volatile_share, persistent_share) = (vh as f64 / total, ph as f64 / total);
    let spread = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (v[v.len() / 4] * 1e3, v[v.len() * 3 / 4] * 1e3)
    };
    let (t_tiered, t_keyed, c_tiered, c_keyed) = (median(tt.clone()), median(tk.clone()), median(ct), median(ck));

    println!("strata tiered benchmark: {rows} rows x {dim} float32, batches of {batch} Zipf(1.1) keys, {batches} timed batches");
    println!(
        "setup: wrote the HugeCTR folder in {write_s:.1} s{}; server open (LMDB bulk load + warming 20%) {open_s:.1} s; \
         core keyed table open {keyed_open_s:.2} s",
        if reuse { " (reused)" } else { "" }
    );
    let raw = |rows: u64, dim: usize| rows as f64 * dim as f64 * 4.0;
    println!(
        "volatile tier: {} rows ({:.1} MiB, {:.3} x their raw vectors; {:.3} x at capacity), capacity {capacity}; persistent tier: {} rows",
        after.volatile_rows,
        after.volatile_bytes as f64 / (1 << 20) as f64,
        after.volatile_bytes as f64 / raw(after.volatile_rows.max(1), dim),
        after.volatile_bytes as f64 / raw(capacity as u64, dim),
        after.persistent_rows
    );
    println!();
    println!(
        "{:<26} {:>10} {:>15} {:>12} {:>9} {:>12} {:>9}",
        "case", "ms/batch", "(quartiles)", "Mlookups/s", "x keyed", "CPU ms/batch", "x keyed"
    );
    let (q1, q3) = spread(&tk);
    println!(
        "{:<26} {:>10.2} {:>15} {:>12.2} {:>9.2} {:>12.2} {:>9.2}",
        "strata keyed (core)",
        t_keyed * 1e3,
        format!("{q1:.1}-{q3:.1}"),
        batch as f64 / t_keyed / 1e6,
        1.0,
        c_keyed * 1e3,
        1.0
    );
    let (q1, q3) = spread(&tt);
    println!(
        "{:<26} {:>10.2} {:>15} {:>12.2} {:>9.2} {:>12.2} {:>9.2}",
        "strata tiered (server)",
        t_tiered * 1e3,
        format!("{q1:.1}-{q3:.1}"),
        batch as f64 / t_tiered / 1e6,
        t_keyed / t_tiered,
        c_tiered * 1e3,
        c_keyed / c_tiered
    );
    println!();
    println!(
        "tiered hit rates over the timed batches: volatile {:.1}%, persistent {:.1}%, default {:.1}%; \
         evictions {}, promotions by cache_missed_embeddings included",
        100.0 * volatile_share,
        100.0 * persistent_share,
        100.0 * miss as f64 / total,
        after.evictions - before.evictions
    );
    println!(
        "page faults per batch (first touches of mapped pages; major = read from disk): keyed {:.0} minor {:.0} major, \
         tiered {:.0} minor {:.0} major",
        keyed_faults[0] as f64 / batches as f64,
        keyed_faults[1] as f64 / batches as f64,
        tiered_faults[0] as f64 / batches as f64,
        tiered_faults[1] as f64 / batches as f64
    );

    // Where the time goes, per key, through the same call on the same threads:
    // (1) volatile hits: a timed batch looked up again right after itself (its misses were
    //     just promoted), so nearly every key is a volatile hit;
    // (2) persistent hits with promotion: keys of ranks no batch drew (cold), so nearly every
    //     key misses the volatile tier, is read from LMDB and promoted (twice a batch of them,
    //     enough to fill the tier and evict);
    // (3) persistent hits alone: the same kind of cold keys through a second server over the
    //     same store whose volatile tier neither warms nor promotes.
    let cold: Vec<i64> = {
        let mut r = Rng(99);
        (0..2 * batch).map(|_| keys[rows / 2 + (r.next() % (rows / 2) as u64) as usize]).collect()
    };
    let per_key = |t: *mut Table, q: &[i64], rounds: usize| -> (f64, f64, f64, f64) {
        let (mut w, mut c, mut v, mut p) = (Vec::new(), Vec::new(), 0u64, 0u64);
        for r in 0..rounds {
            let part = &q[r * q.len() / rounds..(r + 1) * q.len() / rounds];
            let (tw, tc, st) = run(t, part);
            w.push(tw / part.len() as f64);
            c.push(tc / part.len() as f64);
            v += st.volatile_hits;
            p += st.persistent_hits;
        }
        let n = q.len() as f64;
        (median(w) * 1e9, median(c) * 1e9, v as f64 / n, p as f64 / n)
    };
    // The cold keys' LMDB pages are read once first (through a handle on the same store), so
    // (2) and (3) both find them in the page cache and mapped.
    // The handle also keeps the store's environment (and its mapping) open across the change of
    // server below.
    let store = PersistentStore::open(&root.join("db"), true).unwrap();
    {
        let t = store.table("bench/sparse_embedding0", dim, None).unwrap();
        let ks: Vec<u64> = cold.iter().map(|&k| k as u64).collect();
        let (mut rows, mut found) = (vec![0f32; ks.len() * dim], vec![false; ks.len()]);
        t.get_many(&ks, &mut rows, &mut found).unwrap();
    }
    // (1): batches 1..=5 again, after all five ran once, so their rows are held but not in the
    // CPU caches any more.
    // (1): batches 1..=5 again, after all five ran once, so their rows are held but not in the
    // CPU caches any more.
    if std::env::var_os("EXPERIMENT").is_some() {
        let t = store.table("bench/sparse_embedding0", dim, None).unwrap();
        let mut r = Rng(1234);
        for round in 0..6 {
            let n = 13_000;
            let ks: Vec<u64> = (0..n).map(|_| keys[(r.next() % rows as u64) as usize] as u64).collect();
            let (mut rows_b, mut found) = (vec![0f32; n * dim], vec![false; n]);
            t.get_many(&ks, &mut rows_b, &mut found).unwrap();
            for k in ks.chunks(67) {
                let _ = k;
            }
            let per = if round % 2 == 0 { 67 } else { n };
            // evict CPU caches with unrelated traffic
            let junk: Vec<u8> = vec![1u8; 64 << 20];
            std::hint::black_box(&junk);
            let (c0, t0) = (cpu_s(), Instant::now());
            for (kc, (rc, fc)) in ks.chunks(per).zip(rows_b.chunks_mut(per * dim).zip(found.chunks_mut(per))) {
                t.get_many(kc, rc, fc).unwrap();
            }
            println!(
                "EXPERIMENT lmdb {n} keys in calls of {per}: {:.0} ns wall {:.0} ns CPU per key",
                t0.elapsed().as_secs_f64() / n as f64 * 1e9,
                (cpu_s() - c0) / n as f64 * 1e9
            );
        }
    }
    let hot_batches = batches.min(5);
    for q in &queries[1..=hot_batches] {
        run(tiered, q);
    }
    let (mut hw, mut hc, mut hv) = (Vec::new(), Vec::new(), 0.0);
    for q in &queries[1..=hot_batches] {
        let (w, c, v, _) = per_key(tiered, q, 1);
        hw.push(w);
        hc.push(c);
        hv += v / hot_batches as f64;
    }
    let (vw, vc) = (median(hw), median(hc));
    let (lpw, lpc, _, lpp) = per_key(tiered, &cold, 10);
    let promoted_evictions = stats(tiered).evictions - after.evictions;
    // SAFETY: server is the server opened above, freed once here; its table `tiered` is not used
    // after.
    unsafe { strata_server_free(server) };
    let server = open_server(&root, dim, partitions, capacity, false);
    let mut plain = std::ptr::null_mut();
    // SAFETY: server is the live server just opened (freed below); model is a NUL-terminated
    // string alive past the call; plain is a reference.
    ok(unsafe { strata_server_table(server, model.as_ptr(), 0, &mut plain) });
    let (lw, lc, _, lp) = per_key(plain, &cold, 10);
    // SAFETY: server is the server opened just above, freed once here; plain is not used after.
    unsafe { strata_server_free(server) };
    drop(store);
    println!();
    println!("where the time goes (ns per key, wall and CPU of the whole process, {} threads by default):", threads());
    println!("  volatile hit                         {vw:>8.0} wall {vc:>8.0} CPU   ({:.1}% volatile hits)", 100.0 * hv);
    println!(
        "  LMDB read + promotion                {lpw:>8.0} wall {lpc:>8.0} CPU   ({:.1}% persistent hits, {promoted_evictions} evictions)",
        100.0 * lpp
    );
    println!("  LMDB read alone (no volatile tier)   {lw:>8.0} wall {lc:>8.0} CPU   ({:.1}% persistent hits)", 100.0 * lp);
    println!("  promotion (difference)               {:>8.0} wall {:>8.0} CPU", lpw - lw, lpc - lc);
    let model_w = volatile_share * vw + persistent_share * lpw;
    let model_c = volatile_share * vc + persistent_share * lpc;
    let (keyed_w, keyed_c) = (t_keyed / batch as f64 * 1e9, c_keyed / batch as f64 * 1e9);
    println!(
        "  model at the measured hit rates: {:.2} ms wall, {:.2} ms CPU per batch (measured {:.2}, {:.2}); \
         the keyed table: {keyed_w:.0} ns wall, {keyed_c:.0} ns CPU per key",
        model_w * batch as f64 * 1e-6,
        model_c * batch as f64 * 1e-6,
        t_tiered * 1e3,
        c_tiered * 1e3,
    );
    println!(
        "  ceiling: with free volatile hits and promotions, the LMDB reads alone ({:.1}% of keys) would give \
         {:.2} x keyed (wall), {:.2} x (CPU)",
        100.0 * persistent_share,
        keyed_w / (persistent_share * lw),
        keyed_c / (persistent_share * lc)
    );

    // The volatile tier's memory at the other common width (32 <-> 128 floats), same shape.
    let other = if dim == 128 { 32 } else { 128 };
    let fill = after.volatile_rows.max(1) as usize;
    let v = VolatileTier::new(other, partitions, capacity / partitions, OverflowPolicy::EvictLeastUsed, 0.9).unwrap();
    let mut r = Rng(5);
    let block = 4096;
    let rows_buf = vec![1f32; block * other];
    let mut filled = 0;
    while filled < fill {
        let n = block.min(fill - filled);
        let ks: Vec<u64> = (0..n).map(|_| r.next()).collect();
        v.insert_many(&ks, &rows_buf[..n * other]);
        filled += n;
    }
    println!();
    println!(
        "volatile tier at {other} dims, same shape, {} rows: {:.1} MiB, {:.3} x their raw vectors; {:.3} x at capacity",
        v.len(),
        v.bytes() as f64 / (1 << 20) as f64,
        v.bytes() as f64 / raw(v.len() as u64, other),
        v.bytes() as f64 / raw(capacity as u64, other)
    );
}

/// The server configuration of the benchmark: a volatile tier of `capacity` rows over `partitions`
/// shards (warming 20% and promoting misses when `volatile`, else empty and never promoting) in
/// front of the LMDB store `db` under `root`.
fn open_server(root: &std::path::Path, dim: usize, partitions: usize, capacity: usize, volatile: bool) -> *mut Server {
    let (rate, promote) = if volatile { (0.2, true) } else { (0.0, false) };
    let json = format!(
        r#"{{ "volatile_db": {{ "type": "parallel_hash_map", "num_partitions": {partitions},
               "overflow_margin": {}, "overflow_policy": "evict_least_used",
               "overflow_resolution_target": 0.9, "initial_cache_rate": {rate}, "cache_missed_embeddings": {promote} }},
             "persistent_db": {{ "type": "rocks_db", "path": "db" }},
             "models": [ {{ "model": "bench", "sparse_files": ["sparse"], "embedding_vecsize_per_table": [{dim}],
                           "maxnum_catfeature_query_per_table_per_sample": [1] }} ] }}"#,
        capacity / partitions
    );
    let (j, base) = (CString::new(json).unwrap(), CString::new(root.to_str().unwrap()).unwrap());
    let mut server = std::ptr::null_mut();
    // SAFETY: j and base are NUL-terminated strings alive past the call; server is a reference.
    ok(unsafe { strata_server_open_json(j.as_ptr(), base.as_ptr(), &mut server) });
    server
}

/// CPU seconds used by this process so far (all threads).
fn cpu_s() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: t is a valid timespec to write; CLOCK_PROCESS_CPUTIME_ID is always supported.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Page faults of this process so far: [minor, major (read from disk)].
fn page_faults() -> [u64; 2] {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid rusage to write; RUSAGE_SELF is always supported.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    [u.ru_minflt as u64, u.ru_majflt as u64]
}

/// The library's default thread count (STRATA_NUM_THREADS, else the affinity mask).
fn threads() -> usize {
    strata::util::threads::default_threads()
}
