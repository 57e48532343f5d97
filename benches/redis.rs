//! The Redis benchmark: keys/s of lookups of 1K, 10K and 100K uniformly random keys from one
//! table served three ways, through the C ABI, on this machine:
//! - `redis`: `volatile_db.type = "redis_cluster"` on a local 3-node cluster (started here, on
//!   free ports, with a password), every row in Redis, LMDB behind it;
//! - `local`: the in-process volatile tier (`parallel_hash_map`) holding every row, LMDB behind;
//! - `lmdb`: no volatile tier, every key read from the LMDB persistent tier.
//!
//! `cargo bench --bench redis -- [rows dim reps]` (defaults 200000 32 and a repetition count per
//! size). `STRATA_REDIS_BENCH_BATCH` sets `max_get_batch_size` (default 65536, HPS's
//! `max_batch_size` default). Prints the median keys/s of each case with the min and max over
//! its repetitions, and the tier that served the keys. Skips, saying why, without
//! `redis-server`. Not a test: it asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/redis_nodes.rs"]
mod redis_nodes;

use common::*;
use redis_nodes::{PASSWORD, RedisCluster, redis_server};
use std::ffi::CString;
use std::path::Path;
use std::ptr::{null, null_mut};
use std::time::Instant;

fn config(volatile: &str, store: &str, dim: usize) -> String {
    format!(
        r#"{{"supportlonglong": true, "volatile_db": {volatile},
            "persistent_db": {{"type": "rocks_db", "path": "{store}"}},
            "models": [{{"model": "bench", "sparse_files": ["sparse"], "embedding_table_names": ["t"],
                         "embedding_vecsize_per_table": [{dim}], "maxnum_catfeature_query_per_table_per_sample": [1],
                         "deployed_device_list": [0]}}]}}"#
    )
}

fn open(json: &str, dir: &Path) -> *mut Table {
    let j = CString::new(json).unwrap();
    let b = CString::new(dir.to_str().unwrap()).unwrap();
    let mut s = null_mut();
    // SAFETY: j and b are NUL-terminated and outlive the call; s is a reference.
    ok(unsafe { strata_server_open_json(j.as_ptr(), b.as_ptr(), &mut s) });
    let model = CString::new("bench").unwrap();
    let mut t = null_mut();
    // SAFETY: s is a live server, never freed; model is NUL-terminated; t is a reference.
    ok(unsafe { strata_server_table(s, model.as_ptr(), 0, &mut t) });
    t
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = args.first().copied().unwrap_or(200_000);
    let dim = args.get(1).copied().unwrap_or(32);
    let reps = args.get(2).copied();
    if let Err(why) = redis_server() {
        println!("redis benchmark skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let t0 = Instant::now();
    let cluster = RedisCluster::start(dir);
    println!("3-node cluster up in {:.1} s (ports {})", t0.elapsed().as_secs_f64(), cluster.seeds());
    let d = dir.join("sparse");
    std::fs::create_dir_all(&d).unwrap();
    let mut rng = Rng(0xBE7C);
    let keys: Vec<i64> = (0..rows as i64).map(|i| i * 7 + 3).collect();
    std::fs::write(d.join("key"), keys.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    std::fs::write(d.join("emb_vector"), (0..rows * dim).flat_map(|_| rng.f32().to_le_bytes()).collect::<Vec<u8>>()).unwrap();

    let batch = std::env::var("STRATA_REDIS_BENCH_BATCH").ok().and_then(|b| b.parse().ok()).unwrap_or(65536usize);
    let redis = format!(
        r#"{{"type": "redis_cluster", "address": "{}", "password": "{PASSWORD}", "num_partitions": 16,
             "max_get_batch_size": {batch}, "max_set_batch_size": 16384, "initial_cache_rate": 1.0}}"#,
        cluster.seeds()
    );
    let cases = [
        ("redis", config(&redis, "db-redis", dim)),
        ("local", config(r#"{"type": "parallel_hash_map", "initial_cache_rate": 1.0}"#, "db-local", dim)),
        ("lmdb", config(r#"{"type": "disabled"}"#, "db-lmdb", dim)),
    ];
    println!("table: {rows} rows x {dim} float32, uniform random keys; max_get_batch_size {batch}");
    println!("{:<6} {:>7} {:>14} {:>14} {:>14} {:>6}  served by", "tier", "keys", "median keys/s", "min", "max", "reps");
    for (name, json) in &cases {
        let t0 = Instant::now();
        let t = open(json, dir);
        let opened = t0.elapsed();
        for n in [1_000usize, 10_000, 100_000] {
            let r = reps.unwrap_or(match n {
                1_000 => 200,
                10_000 => 40,
                _ => 10,
            });
            let mut out = vec![0f32; n * dim];
            let mut rates = Vec::with_capacity(r);
            let mut served = LookupStats::default();
            for i in 0..r + 1 {
                let ks: Vec<i64> = (0..n).map(|_| keys[rng.below(rows as u64) as usize]).collect();
                let k = Desc::compact(ks.as_ptr().cast(), I64, &[n as i64]);
                let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[n as i64, dim as i64]);
                let mut st = LookupStats::default();
                let t0 = Instant::now();
                // SAFETY: t is a live table; k and o describe buffers alive past the call.
                ok(unsafe { strata_lookup(t, &k.t, &mut o.t, null(), &mut st) });
                let dt = t0.elapsed().as_secs_f64();
                if i > 0 {
                    // The first call warms connections and pages; not counted.
                    rates.push(n as f64 / dt);
                    served.volatile_hits += st.volatile_hits;
                    served.persistent_hits += st.persistent_hits;
                    served.misses += st.misses;
                }
            }
            rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let tier = if served.volatile_hits > 0 && served.persistent_hits == 0 {
                "volatile".to_string()
            } else if served.volatile_hits == 0 && served.persistent_hits > 0 {
                "persistent".to_string()
            } else {
                format!("{} volatile, {} persistent, {} misses", served.volatile_hits, served.persistent_hits, served.misses)
            };
            println!(
                "{name:<6} {n:>7} {:>14.0} {:>14.0} {:>14.0} {r:>6}  {tier}",
                rates[rates.len() / 2],
                rates[0],
                rates[rates.len() - 1]
            );
        }
        println!("       (opened and warmed in {:.1} s)", opened.as_secs_f64());
    }
}
