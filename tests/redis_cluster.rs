//! The Redis Cluster volatile tier against a real cluster: three `redis-server` nodes on
//! 127.0.0.1 (free ports, a temporary folder, a password), made a cluster with
//! `redis-cli --cluster create`. Skipped, with the reason, where `redis-server` is missing and
//! cannot be installed (apt-get, as root).
//!
//! One test, in phases, so the cluster is made once:
//! 1. open errors: a wrong password, unreachable seeds and a non-cluster Redis are
//!    `STRATA_CONFIG_ERROR` naming the field;
//! 2. HPS's layout: rows written the way HPS writes them are read, and strata's rows are where
//!    HPS would look (partition hash, hash keys, raw little-endian fields and values);
//! 3. two writer processes (this binary re-run) upsert, erase and look up all the time, each
//!    checking its own keys against its reference and never seeing another key's row go back
//!    to an older version; the parent checks a child's acknowledged write is seen at once;
//! 4. mid-run, one node is killed with SIGKILL: lookups still answer every key right (from the
//!    persistent tier), upserts of its keys fail with STRATA_STORE_ERROR naming it, others
//!    succeed; one node stopped with SIGSTOP: calls return within the timeout;
//! 5. the node is restarted: its keys are served from Redis again and writes to it succeed;
//! 6. after the writers stop, every row equals the union of their references and the
//!    parent's; the cluster is shut down, every process reaped.

mod common;
use common::*;
use std::ffi::CString;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "STRATA_REDIS_CHILD";
const DIM: usize = 8;
const KEYS: i64 = 3000;
/// Keys `[w * OWN, (w + 1) * OWN)` belong to writer w (0, 1); the rest to the parent.
const OWN: i64 = 1000;
const DEFAULT: f32 = -1.0;
const TIMEOUT_MS: u64 = 300;
const PARTITIONS: usize = 12;
const TEST: &str = "redis_cluster_serves_shares_and_survives_a_node";

/// The row of `key` at `version`.
fn row(key: i64, version: u32) -> [f32; DIM] {
    let mut r = [0f32; DIM];
    r[0] = key as f32;
    r[1] = version as f32;
    for (j, x) in r.iter_mut().enumerate().skip(2) {
        *x = key as f32 * 0.5 + version as f32 + j as f32;
    }
    r
}

#[path = "common/redis_nodes.rs"]
mod redis_nodes;
use redis_nodes::{PASSWORD, RedisCluster, free_port, redis_server};

// ---------------------------------------------------------------------------------------------
// HPS's layout, written here independently of the library.

fn mix(mut x: u64) -> u64 {
    x ^= x.rotate_right(25) ^ x.rotate_right(50);
    x = x.wrapping_mul(0xA24BAED4963EE407);
    x ^= x.rotate_right(24) ^ x.rotate_right(49);
    x = x.wrapping_mul(0x9FB21C651E98DF25);
    x ^ (x >> 28)
}

fn hkey(part: usize) -> String {
    format!("hps_et{{hps_et.m.t/p{part}}}v")
}

fn part_of(key: i64) -> usize {
    (mix(key as u64) % PARTITIONS as u64) as usize
}

/// The port of the node serving Redis key `h` (CLUSTER KEYSLOT and CLUSTER SLOTS, asked of a
/// live node: a killed node still owns its slots).
fn port_of_key(c: &RedisCluster, h: &str) -> u16 {
    let live = c.nodes.iter().find(|n| n.child.is_some()).unwrap().port;
    let mut conn = connection(live);
    let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(h).query(&mut conn).unwrap();
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).unwrap();
    let int = |v: &redis::Value| if let redis::Value::Int(i) = v { *i } else { panic!("{v:?}") };
    for r in ranges {
        let redis::Value::Array(a) = r else { panic!() };
        let redis::Value::Array(p) = &a[2] else { panic!() };
        if (int(&a[0])..=int(&a[1])).contains(&slot) {
            return int(&p[1]) as u16;
        }
    }
    panic!("no node serves slot {slot}");
}

fn port_of_part(c: &RedisCluster, part: usize) -> u16 {
    port_of_key(c, &hkey(part))
}

fn connection(port: u16) -> redis::Connection {
    let info = redis::IntoConnectionInfo::into_connection_info(format!("redis://:{PASSWORD}@127.0.0.1:{port}")).unwrap();
    redis::Client::open(info).unwrap().get_connection().unwrap()
}

// ---------------------------------------------------------------------------------------------
// strata through its C ABI.

fn sparse(dir: &Path) {
    let d = dir.join("sparse");
    std::fs::create_dir_all(&d).unwrap();
    let keys: Vec<u8> = (0..KEYS).flat_map(|k| k.to_le_bytes()).collect();
    let rows: Vec<u8> = (0..KEYS).flat_map(|k| row(k, 0)).flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(d.join("key"), keys).unwrap();
    std::fs::write(d.join("emb_vector"), rows).unwrap();
}

/// The configuration all processes share: Redis in front of one LMDB store, persistent hits
/// promoted, other processes' LMDB commits never polled (an hour), so what a process sees of
/// another's writes comes through Redis.
fn config(seeds: &str) -> String {
    format!(
        r#"{{"supportlonglong": true,
            "volatile_db": {{"type": "redis_cluster", "address": "{seeds}", "user_name": "default", "password": "{PASSWORD}",
                             "num_partitions": {PARTITIONS}, "max_get_batch_size": 700, "max_set_batch_size": 300,
                             "initial_cache_rate": 0.5, "cache_missed_embeddings": true, "refresh_interval_ms": 3600000,
                             "strata_redis_timeout_ms": {TIMEOUT_MS}}},
            "persistent_db": {{"type": "rocks_db", "path": "db"}},
            "models": [{{"model": "m", "sparse_files": ["sparse"], "embedding_table_names": ["t"],
                         "embedding_vecsize_per_table": [{DIM}], "default_value_for_each_table": [{DEFAULT}],
                         "maxnum_catfeature_query_per_table_per_sample": [1], "deployed_device_list": [0]}}]}}"#
    )
}

/// Opens `json` with relative paths under `dir`; the status and the server.
fn open_json(json: &str, dir: &Path) -> (Status, *mut Server) {
    let j = CString::new(json).unwrap();
    let b = CString::new(dir.to_str().unwrap()).unwrap();
    let mut s = null_mut();
    // SAFETY: j and b are NUL-terminated and outlive the call; s is a reference.
    let st = unsafe { strata_server_open_json(j.as_ptr(), b.as_ptr(), &mut s) };
    (st, s)
}

/// The table of a server opened with [`config`]; the server lives until the process exits.
fn open(dir: &Path, seeds: &str) -> *mut Table {
    let (st, s) = open_json(&config(seeds), dir);
    ok(st);
    let model = CString::new("m").unwrap();
    let mut t = null_mut();
    // SAFETY: s is a live server, never freed; model is NUL-terminated; t is a reference.
    ok(unsafe { strata_server_table(s, model.as_ptr(), 0, &mut t) });
    t
}

fn lookup(t: *mut Table, keys: &[i64]) -> (Vec<f32>, LookupStats) {
    let mut out = vec![f32::NAN; keys.len() * DIM];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[keys.len() as i64, DIM as i64]);
    let mut st = LookupStats::default();
    // SAFETY: t is a live table; k and o describe buffers alive past the call; st is a reference.
    ok(unsafe { strata_lookup(t, &k.t, &mut o.t, null(), &mut st) });
    (out, st)
}

fn upsert(t: *mut Table, keys: &[i64], rows: &[f32]) -> Status {
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let v = Desc::compact(rows.as_ptr().cast(), F32, &[keys.len() as i64, DIM as i64]);
    // SAFETY: t is a live table; k and v describe buffers alive past the call.
    unsafe { strata_table_upsert(t, &k.t, &v.t) }
}

fn erase(t: *mut Table, keys: &[i64]) -> Status {
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let mut n = 0;
    // SAFETY: t is a live table; k describes keys; n is a reference.
    unsafe { strata_table_erase(t, &k.t, &mut n) }
}

/// The version a looked-up row holds (`None` for the default row); panics on a torn or foreign row.
fn version_of(key: i64, r: &[f32]) -> Option<u32> {
    if r.iter().all(|&x| x == DEFAULT) {
        return None;
    }
    let v = r[1] as u32;
    assert_eq!(r, row(key, v), "key {key}: a row that was never written");
    Some(v)
}

// ---------------------------------------------------------------------------------------------
// A writer process.

/// Writer `w`: until `dir/stop` exists (or 60 s), upserts or erases a few of its keys, then
/// looks up every key: its own must equal its reference, no other key's version may go down.
/// Store errors must name a node and leave the reference as it was. Writes its reference and
/// counts to `dir/writer<w>`.
fn writer(dir: &Path, w: i64, seeds: &str) {
    let t = open(dir, seeds);
    let all: Vec<i64> = (0..KEYS).collect();
    // Own keys: Some(version) or None (erased). Version 0 is the sparse file's.
    let mut want: Vec<Option<u32>> = vec![Some(0); OWN as usize];
    let mut seen: Vec<u32> = vec![0; KEYS as usize];
    let mut rng = Rng(0x5EED + w as u64);
    let (mut store_errors, mut ops, mut persistent_hits) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut version = 1u32;
    while !dir.join("stop").exists() && start.elapsed() < Duration::from_secs(60) {
        let keys: Vec<i64> =
            (0..8).map(|_| w * OWN + rng.below(OWN as u64) as i64).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        version += 1;
        let st = if rng.below(10) < 7 {
            let rows: Vec<f32> = keys.iter().flat_map(|&k| row(k, version)).collect();
            let st = upsert(t, &keys, &rows);
            if st == Status::STRATA_OK {
                for &k in &keys {
                    want[(k - w * OWN) as usize] = Some(version);
                }
            }
            st
        } else {
            let st = erase(t, &keys);
            if st == Status::STRATA_OK {
                for &k in &keys {
                    want[(k - w * OWN) as usize] = None;
                }
            }
            st
        };
        if st != Status::STRATA_OK {
            let msg = last_error();
            assert_eq!(st, Status::STRATA_STORE_ERROR, "{msg}");
            assert!(msg.contains("Redis node 127.0.0.1:"), "a store error names the node: {msg}");
            store_errors += 1;
        }
        ops += 1;
        let (out, stats) = lookup(t, &all);
        persistent_hits += stats.persistent_hits;
        for k in 0..KEYS {
            let got = version_of(k, &out[k as usize * DIM..(k as usize + 1) * DIM]);
            if (w * OWN..(w + 1) * OWN).contains(&k) {
                assert_eq!(got, want[(k - w * OWN) as usize], "writer {w}: own key {k} after {ops} writes");
            } else if let Some(v) = got {
                assert!(v >= seen[k as usize], "writer {w}: key {k} went back from version {} to {v}", seen[k as usize]);
                seen[k as usize] = v;
            }
        }
    }
    let mut f = std::fs::File::create(dir.join(format!("writer{w}.tmp"))).unwrap();
    writeln!(f, "{ops} {store_errors} {persistent_hits}").unwrap();
    for (i, v) in want.iter().enumerate() {
        writeln!(f, "{} {}", w * OWN + i as i64, v.map_or(-1, |v| v as i64)).unwrap();
    }
    drop(f);
    std::fs::rename(dir.join(format!("writer{w}.tmp")), dir.join(format!("writer{w}"))).unwrap();
}

/// Writes the version of every key as the persistent tier alone serves it to `dir/lmdb`.
fn lmdb_rows(dir: &Path, seeds: &str) {
    let json = config(seeds).replace(r#""type": "redis_cluster""#, r#""type": "disabled""#);
    let (st, s) = open_json(&json, dir);
    ok(st);
    let model = CString::new("m").unwrap();
    let mut t = null_mut();
    // SAFETY: s is a live server (never freed); model is NUL-terminated; t is a reference.
    ok(unsafe { strata_server_table(s, model.as_ptr(), 0, &mut t) });
    let all: Vec<i64> = (0..KEYS).collect();
    let (out, _) = lookup(t, &all);
    let text: String =
        (0..KEYS as usize).map(|k| format!("{}\n", version_of(k as i64, &out[k * DIM..(k + 1) * DIM]).map_or(-1, i64::from))).collect();
    std::fs::write(dir.join("lmdb"), text).unwrap();
}

// ---------------------------------------------------------------------------------------------

#[test]
fn redis_cluster_serves_shares_and_survives_a_node() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let mut it = spec.splitn(3, '|');
        let (dir, w, seeds) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        if w == "lmdb" {
            lmdb_rows(Path::new(dir), seeds);
        } else if let Some(round) = w.strip_prefix("crash") {
            crash_writer(Path::new(dir), round.parse().unwrap(), seeds);
        } else {
            writer(Path::new(dir), w.parse().unwrap(), seeds);
        }
        return;
    }
    if let Err(why) = redis_server() {
        println!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut c = RedisCluster::start(dir);
    let seeds = c.seeds();
    sparse(dir);

    // 1. Open errors name the field.
    let volatile_only = |addr: &str, pw: &str| {
        config(addr)
            .replace(&format!("\"password\": \"{PASSWORD}\""), &format!("\"password\": \"{pw}\""))
            .replace(r#""persistent_db": {"type": "rocks_db", "path": "db"},"#, "")
    };
    let (st, _) = open_json(&volatile_only(&seeds, "wrong"), dir);
    fails(st, Status::STRATA_CONFIG_ERROR, &["volatile_db.password", "default"]);
    let dead = free_port(&[]);
    let t0 = Instant::now();
    let (st, _) = open_json(&volatile_only(&format!("127.0.0.1:{dead}"), PASSWORD), dir);
    fails(st, Status::STRATA_CONFIG_ERROR, &["volatile_db.address", &format!("127.0.0.1:{dead}")]);
    assert!(t0.elapsed() < Duration::from_secs(10), "an unreachable seed list hung the open");
    let plain = c.plain();
    let (st, _) = open_json(&volatile_only(&format!("127.0.0.1:{plain}"), PASSWORD), dir);
    fails(st, Status::STRATA_CONFIG_ERROR, &["volatile_db.address", "without cluster mode"]);

    // 2. HPS's layout. Rows HPS wrote (raw LE key field, raw LE float32 value) are read, in a
    // table served by Redis alone; strata's own rows land where HPS puts them.
    {
        let mut json = volatile_only(&seeds, PASSWORD).replace("\"model\": \"m\"", "\"model\": \"hps\"");
        json = json.replace("\"initial_cache_rate\": 0.5", "\"initial_cache_rate\": 0.0");
        let key = 987_654_321i64;
        let part = (mix(key as u64) % PARTITIONS as u64) as usize;
        let value: Vec<u8> = row(key, 7).iter().flat_map(|x| x.to_le_bytes()).collect();
        let h = format!("hps_et{{hps_et.hps.t/p{part}}}v");
        let _: i64 =
            redis::cmd("HSET").arg(&h).arg(&key.to_le_bytes()[..]).arg(&value[..]).query(&mut connection(port_of_key(&c, &h))).unwrap();
        let (st, s) = open_json(&json, dir);
        ok(st);
        let model = CString::new("hps").unwrap();
        let mut t = null_mut();
        // SAFETY: s is a live server (never freed); model is NUL-terminated; t is a reference.
        ok(unsafe { strata_server_table(s, model.as_ptr(), 0, &mut t) });
        let (out, st) = lookup(t, &[key, 5]);
        assert_eq!(&out[..DIM], row(key, 7), "a row HPS wrote is read");
        assert_eq!(&out[DIM..], [DEFAULT; DIM], "a key in no tier gets the default row");
        assert_eq!((st.volatile_hits, st.misses), (1, 1));
        // strata writes where HPS reads.
        ok(upsert(t, &[42], &row(42, 3)));
        let h = format!("hps_et{{hps_et.hps.t/p{}}}v", part_of(42));
        let port = port_of_key(&c, &h);
        let got: Vec<u8> = redis::cmd("HGET").arg(&h).arg(&42i64.to_le_bytes()[..]).query(&mut connection(port)).unwrap();
        assert_eq!(got, row(42, 3).iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    }

    // 3. The shared table: warmed at open, then two writers.
    let t = open(dir, &seeds);
    let all: Vec<i64> = (0..KEYS).collect();
    let (out, st) = lookup(t, &all);
    for k in 0..KEYS {
        assert_eq!(version_of(k, &out[k as usize * DIM..(k as usize + 1) * DIM]), Some(0));
    }
    assert_eq!(st.hits, KEYS as u64);
    assert!(st.volatile_hits >= KEYS as u64 / 2, "initial_cache_rate 0.5 warmed half: {st:?}");
    // One HMGET per partition per batch, never one per key: 3000 keys in batches of 700 are
    // at most 5 batches x 12 partitions, counted by the nodes themselves.
    for n in c.nodes.iter() {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut connection(n.port)).unwrap();
    }
    let (_, st) = lookup(t, &all);
    assert_eq!(st.volatile_hits, KEYS as u64, "persistent hits were promoted: {st:?}");
    let hmgets: u64 = c
        .nodes
        .iter()
        .map(|n| {
            let info: String = redis::cmd("INFO").arg("commandstats").query(&mut connection(n.port)).unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix("cmdstat_hmget:calls="))
                .map_or(0, |rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
        })
        .sum();
    assert!((1..=5 * PARTITIONS as u64).contains(&hmgets), "{hmgets} HMGET calls for one lookup of {KEYS} keys");

    let spawn = |w: i64| {
        Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, format!("{}|{w}|{seeds}", dir.display()))
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut writers = [spawn(0), spawn(1)];
    // The parent's keys: version 1 now; a writer process sees it at once (checked below by
    // the writers' monotonic reads, and here by the parent's own).
    let mine: Vec<i64> = (2 * OWN..KEYS).collect();
    let mut parent_version: Vec<Option<u32>> = vec![Some(0); (KEYS - 2 * OWN) as usize];
    ok(upsert(t, &mine, &mine.iter().flat_map(|&k| row(k, 1)).collect::<Vec<_>>()));
    parent_version.fill(Some(1));
    std::thread::sleep(Duration::from_millis(1500));
    // A writer's acknowledged rows are seen here without polling LMDB (refresh is an hour):
    // every writer key is at a version this process has no other way to know than Redis.
    let (out, _) = lookup(t, &all);
    let moved = (0..2 * OWN).filter(|&k| version_of(k, &out[k as usize * DIM..(k as usize + 1) * DIM]) != Some(0)).count();
    assert!(moved > 100, "the writers' updates are visible to another process at once ({moved} keys moved)");

    // 4. Kill the node that serves partition 0 with SIGKILL, mid-run.
    let victim_port = port_of_part(&c, 0);
    let victim = c.nodes.iter().position(|n| n.port == victim_port).unwrap();
    c.signal(victim, libc::SIGKILL);
    let dead_parts: Vec<usize> = (0..PARTITIONS).filter(|&p| port_of_part(&c, p) == victim_port).collect();
    let on_dead: Vec<i64> = mine.iter().copied().filter(|&k| dead_parts.contains(&part_of(k))).collect();
    let on_live: Vec<i64> = mine.iter().copied().filter(|&k| !dead_parts.contains(&part_of(k))).collect();
    assert!(!on_dead.is_empty() && !on_live.is_empty());
    let t0 = Instant::now();
    let (out, st) = lookup(t, &mine);
    assert!(t0.elapsed() < Duration::from_secs(10), "a lookup hung while a node was down");
    for (i, &k) in mine.iter().enumerate() {
        assert_eq!(version_of(k, &out[i * DIM..(i + 1) * DIM]), Some(1), "key {k} with a node down");
    }
    assert!(st.persistent_hits >= on_dead.len() as u64, "the dead node's keys come from the persistent tier: {st:?}");
    let st = upsert(t, &on_dead[..3], &on_dead[..3].iter().flat_map(|&k| row(k, 2)).collect::<Vec<_>>());
    fails(st, Status::STRATA_STORE_ERROR, &[&format!("Redis node 127.0.0.1:{victim_port}")]);
    ok(upsert(t, &on_live[..3], &on_live[..3].iter().flat_map(|&k| row(k, 2)).collect::<Vec<_>>()));
    for &k in &on_live[..3] {
        parent_version[(k - 2 * OWN) as usize] = Some(2);
    }
    let st = erase(t, &on_dead[3..4]);
    fails(st, Status::STRATA_STORE_ERROR, &[&format!("127.0.0.1:{victim_port}")]);

    // A stopped (hung) node: calls give up after strata_redis_timeout_ms, they do not hang.
    let hung = (0..3).find(|&i| i != victim).unwrap();
    c.signal(hung, libc::SIGSTOP);
    let t0 = Instant::now();
    let (out, _) = lookup(t, &mine);
    let took = t0.elapsed();
    for (i, &k) in mine.iter().enumerate() {
        assert_eq!(version_of(k, &out[i * DIM..(i + 1) * DIM]), parent_version[(k - 2 * OWN) as usize], "key {k}, a node hung");
    }
    assert!(took < Duration::from_secs(5), "a lookup with a hung node took {took:?} (timeout {TIMEOUT_MS} ms)");
    c.signal(hung, libc::SIGCONT);

    // 5. Restart the killed node: it rejoins empty; its keys come back into Redis.
    c.run_node(victim);
    c.wait_ok();
    std::thread::sleep(Duration::from_millis(600)); // past the client's retry pause
    let (out, _) = lookup(t, &mine);
    for (i, &k) in mine.iter().enumerate() {
        assert_eq!(version_of(k, &out[i * DIM..(i + 1) * DIM]), parent_version[(k - 2 * OWN) as usize]);
    }
    let (_, st) = lookup(t, &on_dead);
    assert_eq!(st.volatile_hits, on_dead.len() as u64, "after the restart the node's keys are promoted again: {st:?}");
    ok(upsert(t, &on_dead[..3], &on_dead[..3].iter().flat_map(|&k| row(k, 3)).collect::<Vec<_>>()));
    for &k in &on_dead[..3] {
        parent_version[(k - 2 * OWN) as usize] = Some(3);
    }
    ok(erase(t, &on_dead[3..4]));
    parent_version[(on_dead[3] - 2 * OWN) as usize] = None;
    std::thread::sleep(Duration::from_millis(1000));

    // 6. Stop the writers and check every row.
    std::fs::write(dir.join("stop"), b"").unwrap();
    for (w, p) in writers.iter_mut().enumerate() {
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = p.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > end {
                let _ = p.kill();
                let _ = p.wait();
                panic!("writer {w} did not stop");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "writer {w} failed: {status}");
    }
    let mut want: Vec<Option<u32>> = vec![None; KEYS as usize];
    let mut store_errors = 0;
    for w in 0..2 {
        let text = std::fs::read_to_string(dir.join(format!("writer{w}"))).unwrap();
        let mut lines = text.lines();
        let counts: Vec<u64> = lines.next().unwrap().split(' ').map(|x| x.parse().unwrap()).collect();
        println!("writer {w}: {} writes, {} store errors (node down), {} persistent hits", counts[0], counts[1], counts[2]);
        assert!(counts[0] > 10, "writer {w} made only {} writes", counts[0]);
        store_errors += counts[1];
        for l in lines {
            let (k, v) = l.split_once(' ').unwrap();
            let v: i64 = v.parse().unwrap();
            want[k.parse::<usize>().unwrap()] = (v >= 0).then_some(v as u32);
        }
    }
    assert!(store_errors > 0, "the writers never met the dead node");
    for (i, v) in parent_version.iter().enumerate() {
        want[2 * OWN as usize + i] = *v;
    }
    let (out, _) = lookup(t, &all);
    for k in 0..KEYS as usize {
        assert_eq!(version_of(k as i64, &out[k * DIM..(k + 1) * DIM]), want[k], "key {k} at the end");
    }
    // The same through LMDB alone (another process: this one has the store open with the Redis
    // configuration): what Redis serves is what is committed.
    let status = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, format!("{}|lmdb|{seeds}", dir.display()))
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(dir.join("lmdb")).unwrap();
    for (k, l) in text.lines().enumerate() {
        let v: i64 = l.parse().unwrap();
        assert_eq!((v >= 0).then_some(v as u32), want[k], "key {k} in LMDB at the end");
    }
    // 7. The write order, step by step (the library's own tier and store, a store of its own):
    // a promotion that read the persistent tier before a write cannot put the older row back,
    // and a writer that dies between its persistent commit and its Redis write leaves the keys
    // absent from Redis, so lookups read the committed rows.
    write_order(&seeds, &dir.join("db-order"));

    // 8. A writer killed with SIGKILL at random moments: what Redis serves afterwards is what
    // LMDB holds, the last acknowledged batch or the one after it, whole.
    let hot: Vec<i64> = (2 * OWN..2 * OWN + 50).collect();
    let mut rng = Rng(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    for round in 0..3u32 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, format!("{}|crash{round}|{seeds}", dir.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(v) = l.strip_prefix("ACK ") {
                    let _ = tx.send(v.parse::<u32>().unwrap());
                }
            }
        });
        // Wait for the first acknowledgement, then kill at a random moment.
        let first = rx.recv_timeout(Duration::from_secs(30)).expect("the crash writer acknowledged nothing");
        std::thread::sleep(Duration::from_millis(50 + rng.below(400)));
        c_kill(&mut child);
        let acked = rx.try_iter().last().unwrap_or(first);
        let (out, _) = lookup(t, &hot);
        let v = version_of(hot[0], &out[..DIM]);
        for (i, &k) in hot.iter().enumerate() {
            assert_eq!(version_of(k, &out[i * DIM..(i + 1) * DIM]), v, "round {round}: a batch is whole (key {k})");
        }
        let v = v.unwrap();
        assert!(v == acked || v == acked + 1, "round {round}: served version {v}, last acknowledged {acked}");
        let status = Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, format!("{}|lmdb|{seeds}", dir.display()))
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(dir.join("lmdb")).unwrap();
        let lmdb: Vec<i64> = text.lines().map(|l| l.parse().unwrap()).collect();
        let fresh = lmdb[hot[0] as usize];
        for &k in &hot {
            assert_eq!(lmdb[k as usize], fresh, "round {round}: LMDB holds a whole batch (key {k})");
        }
        // Redis serves what LMDB holds, with one exception that is LMDB's: a writer killed
        // inside its commit (after the meta page went to the page cache, before the lock file
        // published it) leaves that commit invisible to readers already running, this process
        // included, and visible to a process that opens the store afterwards. Then this process
        // serves the acknowledged batch and a new process the unacknowledged one after it.
        if fresh != i64::from(v) {
            assert!(
                v == acked && fresh == i64::from(acked) + 1,
                "round {round}: Redis served {v}, LMDB (a new process) holds {fresh}, last acknowledged {acked}"
            );
            println!("crash round {round}: killed inside LMDB's commit of {fresh}: this process serves {v}, a new one {fresh}");
        }
        println!("crash round {round}: acknowledged {acked}, served {v}, LMDB {fresh}");
    }

    let t0 = Instant::now();
    c.shutdown();
    assert!(t0.elapsed() < Duration::from_secs(10));
}

fn c_kill(child: &mut Child) {
    // SAFETY: kill with the pid of our own unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

/// The crash writer of round `round`: upserts the hot keys at versions 1000 * (round + 1) + i,
/// printing `ACK <version>` after each returns, until killed.
fn crash_writer(dir: &Path, round: u32, seeds: &str) {
    let t = open(dir, seeds);
    let hot: Vec<i64> = (2 * OWN..2 * OWN + 50).collect();
    let mut out = std::io::stdout();
    for i in 0.. {
        let v = 1000 * (round + 1) + i;
        ok(upsert(t, &hot, &hot.iter().flat_map(|&k| row(k, v)).collect::<Vec<_>>()));
        writeln!(out, "ACK {v}").unwrap();
        out.flush().unwrap();
    }
}

/// Phase 7: the write protocol of `storage::tier::redis`, step by step.
fn write_order(seeds: &str, store_dir: &Path) {
    use strata::storage::tier::persistent::PersistentStore;
    use strata::storage::tier::redis::{Cluster, ClusterOptions, Eviction, RedisTableOptions, RedisTier};
    let cluster = Cluster::open(ClusterOptions {
        seeds: seeds.split(',').map(String::from).collect(),
        user_name: "default".into(),
        password: PASSWORD.into(),
        connections_per_node: 2,
        timeout: Duration::from_millis(TIMEOUT_MS),
    })
    .unwrap();
    let opts = RedisTableOptions {
        num_partitions: PARTITIONS,
        max_get_batch_size: 100,
        max_set_batch_size: 100,
        overflow_margin: usize::MAX,
        eviction: Eviction::Random,
        resolution_target: 0.8,
        refresh_after_fetch: false,
        key_width: 8,
    };
    let r = RedisTier::new(std::sync::Arc::new(cluster), "order", "t", DIM, opts.clone());
    let store = PersistentStore::open(store_dir, false).unwrap();
    let p = store.table("order/t", DIM, None).unwrap();
    let keys: Vec<u64> = (0..40).collect();
    let rows = |v: u32| keys.iter().flat_map(|&k| row(k as i64, v)).collect::<Vec<f32>>();
    let get = |r: &RedisTier| {
        let mut out = vec![0f32; keys.len() * DIM];
        let mut found = vec![false; keys.len()];
        let (hits, unavailable) = r.get_many(&keys, &mut out, &mut found);
        assert_eq!(unavailable, 0);
        (hits, out)
    };
    // Version 1 committed and in Redis.
    p.upsert(&keys, &rows(1)).unwrap();
    r.write(&keys, &rows(1)).unwrap();
    assert_eq!(get(&r), (keys.len() as u64, rows(1)));
    // A promoter reads the counters and then the committed row (version 1) ...
    let gens = r.generations(&keys);
    let mut old = vec![0f32; keys.len() * DIM];
    let mut found = vec![false; keys.len()];
    p.get_many(&keys, &mut old, &mut found).unwrap();
    // ... a writer deletes the Redis rows (step 1), commits version 2, and dies before step 3.
    assert_eq!(r.invalidate(&keys).unwrap(), keys.len() as u64);
    p.upsert(&keys, &rows(2)).unwrap();
    // The late promotion writes nothing: the counters moved.
    assert_eq!(r.promote(&keys, &old, &gens), 0, "a promotion older than a write was refused");
    // The dead writer left the keys absent from Redis: lookups read version 2 from the store.
    assert_eq!(get(&r).0, 0);
    let mut now = vec![0f32; keys.len() * DIM];
    p.get_many(&keys, &mut now, &mut found).unwrap();
    assert_eq!(now, rows(2));
    // A promotion that read the counters after the write goes in.
    let gens = r.generations(&keys);
    assert_eq!(r.promote(&keys, &now, &gens), keys.len() as u64);
    assert_eq!(get(&r), (keys.len() as u64, rows(2)));
    // And one that finds the rows present leaves them (HSETNX).
    assert_eq!(r.promote(&keys, &rows(9), &r.generations(&keys)), 0);
    assert_eq!(get(&r).1, rows(2));

    // Overflow: partitions over overflow_margin shrink to overflow_resolution_target of it.
    let small = |table: &str, eviction, parts| {
        let o = RedisTableOptions {
            num_partitions: parts,
            overflow_margin: 10,
            eviction,
            resolution_target: 0.5,
            refresh_after_fetch: true,
            ..opts.clone()
        };
        RedisTier::new(r.cluster().clone(), "order", table, DIM, o)
    };
    let random = small("random", Eviction::Random, 2);
    let many: Vec<u64> = (0..100).collect();
    random.write(&many, &many.iter().flat_map(|&k| row(k as i64, 1)).collect::<Vec<_>>()).unwrap();
    let held = random.len().unwrap();
    assert_eq!(held, 2 * 5, "evict_random shrinks each partition of 50 rows over a margin of 10 to 5");
    assert_eq!(random.stats().evictions, 100 - held);
    // evict_least_used: the rows read most survive (HPS's use counts in ...}t).
    let lfu = small("lfu", Eviction::LeastUsed, 1);
    let ten: Vec<u64> = (0..10).collect();
    lfu.write(&ten, &ten.iter().flat_map(|&k| row(k as i64, 1)).collect::<Vec<_>>()).unwrap();
    let hot: Vec<u64> = (0..5).collect();
    for _ in 0..3 {
        let mut out = vec![0f32; 5 * DIM];
        let mut found = vec![false; 5];
        assert_eq!(lfu.get_many(&hot, &mut out, &mut found).0, 5);
    }
    lfu.write(&[10, 11], &[row(10, 1), row(11, 1)].concat()).unwrap();
    assert_eq!(lfu.len().unwrap(), 5, "12 rows over a margin of 10 shrink to 5");
    let mut out = vec![0f32; 12 * DIM];
    let mut found = vec![false; 12];
    let all12: Vec<u64> = (0..12).collect();
    lfu.get_many(&all12, &mut out, &mut found);
    assert_eq!(found, [[true; 5].as_slice(), &[false; 7]].concat(), "the least used rows were evicted");
}
