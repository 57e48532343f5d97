//! Parameter servers from HPS configurations, through the C ABI: two models, tier fall-through
//! with exact per-tier counts, warming, promotion, eviction, live updates (durable across
//! reopening, never torn under concurrent lookups), read-only tables, and server-level errors.

mod common;
use common::*;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::{null, null_mut};

/// Writes a HugeCTR folder whose row values encode (key, column): `key * 0.001 + column`.
fn sparse(dir: &Path, name: &str, keys: &[i64], dim: usize) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("key"), keys.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let rows: Vec<u8> = keys.iter().flat_map(|&k| (0..dim).map(move |c| value(k, c))).flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(d.join("emb_vector"), rows).unwrap();
    d
}

fn value(key: i64, col: usize) -> f32 {
    (key % 1000) as f32 * 0.5 + col as f32
}

/// A server from `open_json`, freed on drop.
struct Srv(*mut Server);
impl Drop for Srv {
    fn drop(&mut self) {
        // SAFETY: self.0 is the server strata_server_open_json returned to `open_json`, owned by
        // this Srv alone and freed only here; the tables borrowed from it are not used after (see
        // `table`).
        unsafe { strata_server_free(self.0) };
    }
}

fn open_json(json: &str, base: &Path) -> Result<Srv, (Status, String)> {
    let j = CString::new(json).unwrap();
    let b = CString::new(base.to_str().unwrap()).unwrap();
    let mut s = null_mut();
    // SAFETY: j and b are NUL-terminated strings alive past the call (strata only reads them during
    // it); s is a reference.
    match unsafe { strata_server_open_json(j.as_ptr(), b.as_ptr(), &mut s) } {
        Status::STRATA_OK => Ok(Srv(s)),
        st => Err((st, last_error())),
    }
}

/// Table `id` of `model`, borrowed from `s`: valid while `s` lives, which every test respects.
fn table(s: &Srv, model: &str, id: i32) -> *mut Table {
    let m = CString::new(model).unwrap();
    let mut t = null_mut();
    // SAFETY: s.0 is a live server (Srv); m is a NUL-terminated string alive past the call; t is a
    // reference.
    ok(unsafe { strata_server_table(s.0, m.as_ptr(), id, &mut t) });
    t
}

/// Looks up `keys` in `t`, which must be a live table (every caller passes one borrowed from a
/// server that is still open), into a fresh [keys, dim] output.
fn lookup(t: *mut Table, keys: &[i64], dim: usize) -> (Vec<f32>, LookupStats) {
    let mut out = vec![f32::NAN; keys.len() * dim];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[keys.len() as i64, dim as i64]);
    let mut st = LookupStats::default();
    // SAFETY: t is a live table (the promise of every caller, above); k and o describe keys and
    // out, which outlive the call; st is a reference.
    ok(unsafe { strata_lookup(t, &k.t, &mut o.t, null(), &mut st) });
    (out, st)
}

/// Upserts `rows` ([keys, dim]) under `keys` into `t`, which must be a live table (as for
/// `lookup`).
fn upsert(t: *mut Table, keys: &[i64], rows: &[f32], dim: usize) -> Status {
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let v = Desc::compact(rows.as_ptr().cast(), F32, &[keys.len() as i64, dim as i64]);
    // SAFETY: t is a live table (the promise of every caller, above); k and v describe keys and
    // rows, which strata reads during the call only.
    unsafe { strata_table_upsert(t, &k.t, &v.t) }
}

/// The counters of `t`, which must be a live table (as for `lookup`).
fn stats(t: *mut Table) -> TableStats {
    let mut s = TableStats::default();
    // SAFETY: t is a live table (the promise of every caller, above); s is a reference.
    ok(unsafe { strata_table_get_stats(t, &mut s) });
    s
}

fn expect_rows(out: &[f32], keys: &[i64], dim: usize, present: &HashMap<i64, Vec<f32>>, default: f32) {
    for (i, k) in keys.iter().enumerate() {
        let got = &out[i * dim..(i + 1) * dim];
        match present.get(k) {
            Some(row) => assert_eq!(got, &row[..], "key {k}"),
            None => assert!(got.iter().all(|&x| x == default), "key {k}: {got:?}"),
        }
    }
}

fn config(dir: &Path, volatile: &str, persistent: &str) -> String {
    let a0 = sparse(dir, "wdl0", &(0..1000).map(|i| i * 7).collect::<Vec<_>>(), 8);
    let a1 = sparse(dir, "wdl1", &(0..300).map(|i| i * 3 + 1).collect::<Vec<_>>(), 4);
    let b0 = sparse(dir, "dcn0", &(0..500).map(|i| 100_000 + i).collect::<Vec<_>>(), 16);
    format!(
        r#"{{
  "supportlonglong": true,
  "volatile_db": {volatile},
  "persistent_db": {persistent},
  "models": [
    {{ "model": "wdl", "sparse_files": ["{}", "{}"], "embedding_table_names": ["wide", "deep"],
       "embedding_vecsize_per_table": [8, 4], "default_value_for_each_table": [0.5, -1.0],
       "maxnum_catfeature_query_per_table_per_sample": [2, 26], "deployed_device_list": [0],
       "max_batch_size": 64, "dense_file": "wdl_dense.model" }},
    {{ "model": "dcn", "sparse_files": ["{}"], "embedding_vecsize_per_table": [16], "maxnum_catfeature_query_per_table_per_sample": [1],
       "default_value_for_each_table": [0.0], "deployed_device_list": [0], "max_batch_size": 64 }}
  ]
}}"#,
        a0.display(),
        a1.display(),
        b0.display()
    )
}

fn rows_of(keys: &[i64], dim: usize) -> HashMap<i64, Vec<f32>> {
    keys.iter().map(|&k| (k, (0..dim).map(|c| value(k, c)).collect())).collect()
}

#[test]
fn two_models_fall_through_the_tiers_with_exact_counts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let volatile = r#"{ "type": "parallel_hash_map", "num_partitions": 4, "overflow_margin": 100000,
        "initial_cache_rate": 0.5, "cache_missed_embeddings": true }"#;
    let persistent = format!(r#"{{ "type": "rocks_db", "path": "{}" }}"#, db.display());
    let s = open_json(&config(dir.path(), volatile, &persistent), dir.path()).unwrap();

    let mut n = 0;
    // SAFETY: s.0 is a live server (Srv); n is a reference.
    ok(unsafe { strata_server_num_models(s.0, &mut n) });
    assert_eq!(n, 2);
    let (mut name, mut tables) = (null(), 0);
    // SAFETY: s.0 is a live server (Srv); name and tables are references.
    ok(unsafe { strata_server_model(s.0, 0, &mut name, &mut tables) });
    // SAFETY: strata_server_model succeeded, so name points at a NUL-terminated string the server
    // owns until it is freed, which s outlives here.
    assert_eq!((unsafe { CStr::from_ptr(name) }.to_str().unwrap(), tables), ("wdl", 2));
    let m = CString::new("wdl").unwrap();
    // SAFETY: s.0 is a live server (Srv); m is a NUL-terminated string alive past the call; name is
    // a reference.
    ok(unsafe { strata_server_table_name(s.0, m.as_ptr(), 1, &mut name) });
    // SAFETY: strata_server_table_name succeeded, so name points at a NUL-terminated string the
    // server owns until it is freed, which s outlives here.
    assert_eq!(unsafe { CStr::from_ptr(name) }.to_str().unwrap(), "deep");
    let mut w = 0;
    // SAFETY: s.0 is a live server (Srv); w is a reference.
    ok(unsafe { strata_server_num_warnings(s.0, &mut w) });
    assert!(w >= 1, "dense_file must be reported");
    let mut text = null();
    let found = (0..w).any(|i| {
        // SAFETY: s.0 is a live server (Srv) and i < w, its number of warnings; text is a
        // reference.
        ok(unsafe { strata_server_warning(s.0, i, &mut text) });
        // SAFETY: strata_server_warning succeeded, so text points at a NUL-terminated string the
        // server owns until it is freed, which s outlives here.
        unsafe { CStr::from_ptr(text) }.to_str().unwrap().contains("models[0].dense_file")
    });
    assert!(found);

    let t = table(&s, "wdl", 0);
    // SAFETY: t is borrowed from the server s, which is still open.
    assert_eq!(unsafe { strata_table_len(t) }, 1000);
    // SAFETY: t is borrowed from the server s, which is still open.
    assert_eq!(unsafe { strata_table_dim(t) }, 8);
    let present = rows_of(&(0..1000).map(|i| i * 7).collect::<Vec<_>>(), 8);
    let keys: Vec<i64> = (0..1000).map(|i| i * 7).chain([1, 2, 3]).collect();
    let (out, st) = lookup(t, &keys, 8);
    expect_rows(&out, &keys, 8, &present, 0.5);
    // half the rows were warmed into the volatile tier; the rest come from the persistent tier
    assert_eq!((st.hits, st.misses), (1000, 3));
    assert_eq!(st.volatile_hits, 500);
    assert_eq!(st.persistent_hits, 500);
    // cache_missed_embeddings promoted them: now everything is a volatile hit
    let (out, st) = lookup(t, &keys, 8);
    expect_rows(&out, &keys, 8, &present, 0.5);
    assert_eq!((st.volatile_hits, st.persistent_hits, st.misses), (1000, 0, 3));
    let c = stats(t);
    assert_eq!((c.lookups, c.keys, c.volatile_hits, c.persistent_hits, c.misses), (2, 2006, 1500, 500, 6));
    assert_eq!((c.volatile_rows, c.persistent_rows), (1000, 1000));

    // the other model
    let t2 = table(&s, "dcn", 0);
    let keys2: Vec<i64> = vec![100_000, 100_499, 99_999];
    let (out, st) = lookup(t2, &keys2, 16);
    expect_rows(&out, &keys2, 16, &rows_of(&keys2[..2], 16), 0.0);
    assert_eq!((st.hits, st.misses), (2, 1));
    let t1 = table(&s, "wdl", 1);
    let (out, _) = lookup(t1, &[4, 5], 4);
    expect_rows(&out, &[4, 5], 4, &rows_of(&[4], 4), -1.0);
}

#[test]
fn updates_are_durable_and_visible_and_erase_falls_back_to_default() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let volatile = r#"{ "num_partitions": 2, "initial_cache_rate": 1.0 }"#;
    let persistent = format!(r#"{{ "type": "rocks_db", "path": "{}" }}"#, db.display());
    let cfg = config(dir.path(), volatile, &persistent);
    {
        let s = open_json(&cfg, dir.path()).unwrap();
        let t = table(&s, "wdl", 0);
        let new_keys = [7i64, 123_456];
        let rows: Vec<f32> = (0..16).map(|i| 1000.0 + i as f32).collect();
        ok(upsert(t, &new_keys, &rows, 8));
        let (out, st) = lookup(t, &new_keys, 8);
        assert_eq!(out, rows);
        assert_eq!(st.hits, 2);
        let erase_keys = [14i64, 999_999];
        let k = Desc::compact(erase_keys.as_ptr().cast(), I64, &[2]);
        let mut erased = 0;
        // SAFETY: t is borrowed from the server s, still open; k describes erase_keys, alive past
        // the call; erased is a reference.
        ok(unsafe { strata_table_erase(t, &k.t, &mut erased) });
        assert_eq!(erased, 1);
        let (out, st) = lookup(t, &[14], 8);
        assert_eq!(out, vec![0.5; 8]);
        assert_eq!(st.misses, 1);
        let c = stats(t);
        assert_eq!((c.upserts, c.erases), (2, 1));
        // a row of the wrong width is refused
        let s2 = upsert(t, &new_keys, &rows[..8], 4);
        fails(s2, Status::STRATA_INVALID_ARGUMENT, &["vectors: shape [2, 4]; expected [2, 8]"]);
    }
    // reopened: the persistent tier kept the updates and the erase, without reloading the files
    std::fs::remove_file(dir.path().join("wdl0/emb_vector")).unwrap();
    std::fs::write(dir.path().join("wdl0/emb_vector"), vec![0u8; 1000 * 8 * 4]).unwrap();
    let s = open_json(&cfg, dir.path()).unwrap();
    let t = table(&s, "wdl", 0);
    let (out, _) = lookup(t, &[7, 123_456, 14, 21], 8);
    assert_eq!(&out[..16], &(0..16).map(|i| 1000.0 + i as f32).collect::<Vec<_>>()[..]);
    assert_eq!(&out[16..24], &[0.5; 8]);
    assert_eq!(&out[24..], &(0..8).map(|c| value(21, c)).collect::<Vec<_>>()[..]);
}

#[test]
fn read_only_and_static_tables_refuse_updates() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let persistent = format!(r#"{{ "type": "rocks_db", "path": "{}" }}"#, db.display());
    let cfg = config(dir.path(), r#"{ "type": "disabled" }"#, &persistent);
    drop(open_json(&cfg, dir.path()).unwrap()); // creates the store
    let ro = format!(r#"{{ "type": "rocks_db", "path": "{}", "read_only": true }}"#, db.display());
    let s = open_json(&config(dir.path(), r#"{ "type": "disabled" }"#, &ro), dir.path()).unwrap();
    let t = table(&s, "wdl", 0);
    let (out, st) = lookup(t, &[7], 8);
    assert_eq!(out, (0..8).map(|c| value(7, c)).collect::<Vec<_>>());
    assert_eq!((st.persistent_hits, st.volatile_hits), (1, 0));
    fails(upsert(t, &[7], &[0.0; 8], 8), Status::STRATA_READ_ONLY, &["table wdl/wide is read-only"]);

    // both tiers disabled: served straight from the files, immutable
    let s = open_json(&config(dir.path(), r#"{ "type": "disabled" }"#, r#"{ "type": "disabled" }"#), dir.path()).unwrap();
    let t = table(&s, "dcn", 0);
    let (out, _) = lookup(t, &[100_001], 16);
    assert_eq!(out, (0..16).map(|c| value(100_001, c)).collect::<Vec<_>>());
    fails(upsert(t, &[1], &[0.0; 16], 16), Status::STRATA_READ_ONLY, &["parameter-server table"]);
    // strata_table_free on a borrowed table is a no-op; the server still serves it
    // SAFETY: t is borrowed from the server s, still open, and freeing a borrowed table is a
    // documented no-op, so it stays valid for the lookup below.
    unsafe { strata_table_free(t) };
    let (out2, _) = lookup(t, &[100_001], 16);
    assert_eq!(out2, out);
}

#[test]
fn volatile_only_tables_evict_and_count() {
    let dir = tempfile::tempdir().unwrap();
    // 1000 rows into 2 partitions of at most 100 rows: loading already evicts
    let volatile = r#"{ "type": "hash_map", "num_partitions": 2, "overflow_margin": 100,
        "overflow_policy": "evict_oldest", "overflow_resolution_target": 0.5 }"#;
    let s = open_json(&config(dir.path(), volatile, r#"{ "type": "disabled" }"#), dir.path()).unwrap();
    let t = table(&s, "wdl", 0);
    let c = stats(t);
    assert!(c.evictions > 0 && c.volatile_rows <= 200, "{c:?}");
    let keys: Vec<i64> = (0..1000).map(|i| i * 7).collect();
    let (out, st) = lookup(t, &keys, 8);
    assert_eq!(st.hits, c.volatile_rows);
    assert_eq!(st.persistent_hits, 0);
    let present = rows_of(&keys, 8);
    for (i, k) in keys.iter().enumerate() {
        let got = &out[i * 8..(i + 1) * 8];
        assert!(got == &present[k][..] || got.iter().all(|&x| x == 0.5), "key {k}: {got:?}");
    }
    // upserts land in memory and are served
    ok(upsert(t, &[5], &[9.0; 8], 8));
    assert_eq!(lookup(t, &[5], 8).0, vec![9.0; 8]);
}

#[test]
fn lookups_never_see_torn_rows_during_upserts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let volatile = r#"{ "num_partitions": 4, "initial_cache_rate": 1.0 }"#;
    let persistent = format!(r#"{{ "type": "rocks_db", "path": "{}" }}"#, db.display());
    let s = open_json(&config(dir.path(), volatile, &persistent), dir.path()).unwrap();
    let t = table(&s, "dcn", 0) as usize;
    let keys: Vec<i64> = (0..64).map(|i| 100_000 + i).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let (keys, stop) = (&keys, &stop);
        sc.spawn(move || {
            for version in 1..=30 {
                let rows: Vec<f32> =
                    keys.iter().flat_map(|&k| std::iter::repeat_n(((k - 100_000) * 100 + version + 10_000) as f32, 16)).collect();
                ok(upsert(t as *mut Table, keys, &rows, 16));
            }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        for _ in 0..2 {
            sc.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let (out, st) = lookup(t as *mut Table, keys, 16);
                    assert_eq!(st.hits, 64);
                    for (row, &k) in out.chunks(16).zip(keys) {
                        let original: Vec<f32> = (0..16).map(|c| value(k, c)).collect();
                        let updated = row.iter().all(|&x| x == row[0]) && (row[0] as i64 - 10_000) / 100 == k - 100_000;
                        assert!(row == &original[..] || updated, "torn row for key {k}: {row:?}");
                    }
                }
            });
        }
    });
}

#[test]
fn server_level_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_json(&config(dir.path(), r#"{ "type": "disabled" }"#, r#"{ "type": "disabled" }"#), dir.path()).unwrap();
    let m = CString::new("nope").unwrap();
    let mut t = null_mut();
    // SAFETY: s.0 is a live server (Srv); m is a NUL-terminated string alive past the call; t is a
    // reference.
    fails(
        unsafe { strata_server_table(s.0, m.as_ptr(), 0, &mut t) },
        Status::STRATA_INVALID_ARGUMENT,
        &["model: \"nope\" is not in the configuration", "wdl"],
    );
    let m = CString::new("wdl").unwrap();
    // SAFETY: s.0 is a live server (Srv); m is a NUL-terminated string alive past the call; t is a
    // reference.
    fails(unsafe { strata_server_table(s.0, m.as_ptr(), 2, &mut t) }, Status::STRATA_INVALID_ARGUMENT, &["table_id: 2"]);
    // SAFETY: strata refuses the NULL server before reading anything else; m is a NUL-terminated
    // string and t a reference.
    fails(unsafe { strata_server_table(null_mut(), m.as_ptr(), 0, &mut t) }, Status::STRATA_NULL_ARGUMENT, &["server"]);
    let (st, msg) = open_json(r#"{ "models": [ { "model": 3 } ] }"#, dir.path()).err().unwrap();
    assert_eq!(st, Status::STRATA_CONFIG_ERROR, "{msg}");
    assert!(msg.contains("models[0].model"), "{msg}");
    let p = CString::new(dir.path().join("missing.json").to_str().unwrap()).unwrap();
    let mut sv = null_mut();
    // SAFETY: p is a NUL-terminated path alive past the call; sv is a reference.
    fails(unsafe { strata_server_open(p.as_ptr(), &mut sv) }, Status::STRATA_IO_ERROR, &["missing.json"]);
    // SAFETY: freeing NULL is a documented no-op.
    unsafe { strata_server_free(null_mut()) };
}

/// A lookup larger than one round of the tiered path (2^18 keys), with many duplicates, keys in
/// either tier and keys in neither, in a random order: every row is the reference row or the
/// default, and the per-tier counts add up exactly. Then again, after the promotions.
#[test]
fn large_lookups_with_duplicates_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let volatile = r#"{ "type": "hash_map", "num_partitions": 3, "overflow_margin": 40,
        "overflow_policy": "evict_least_used", "overflow_resolution_target": 0.5,
        "initial_cache_rate": 0.1, "cache_missed_embeddings": true }"#;
    let persistent = format!(r#"{{ "type": "rocks_db", "path": "{}" }}"#, db.display());
    let s = open_json(&config(dir.path(), volatile, &persistent), dir.path()).unwrap();
    let t = table(&s, "wdl", 0);
    let mut rng = Rng(41);
    // wdl0 holds keys 7 * i for i < 1000; draw from 0..10,000 (about 1 in 7 present, each
    // drawn about 60 times).
    let keys: Vec<i64> = (0..600_000).map(|_| (rng.next() % 10_000) as i64).collect();
    let present = rows_of(&(0..1000).map(|i| i * 7).collect::<Vec<_>>(), 8);
    let held = keys.iter().filter(|k| present.contains_key(k)).count() as u64;
    for pass in 0..2 {
        let before = stats(t);
        let (out, st) = lookup(t, &keys, 8);
        expect_rows(&out, &keys, 8, &present, 0.5);
        assert_eq!(st.hits, held, "pass {pass}");
        assert_eq!(st.misses, keys.len() as u64 - held, "pass {pass}");
        assert_eq!(st.volatile_hits + st.persistent_hits, st.hits, "pass {pass}");
        assert!(st.persistent_hits > 0, "pass {pass}: a volatile tier of 120 rows cannot hold 1000");
        let after = stats(t);
        assert_eq!(after.volatile_hits - before.volatile_hits, st.volatile_hits);
        assert_eq!(after.persistent_hits - before.persistent_hits, st.persistent_hits);
        assert_eq!(after.misses - before.misses, st.misses);
        assert!(after.volatile_rows <= 120);
    }
}

/// Many threads open one ps.json under three spellings and free it again, so a server's last
/// handle often goes while another thread opens the same file: every open must get that
/// configuration's server (or a fresh one), never `STRATA_CONFIG_ERROR` for "another
/// configuration on the store". A stress test: the exact interleaving of the race the registry
/// had (found by tests/c/shared_server.c under valgrind) is forced, deterministically, in
/// `src/server/tests.rs`.
#[test]
fn concurrent_opens_and_frees_of_one_file_under_different_spellings() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let volatile = r#"{ "type": "parallel_hash_map", "num_partitions": 2, "initial_cache_rate": 0.5 }"#;
    let persistent = format!(r#"{{ "type": "rocks_db", "path": "{}" }}"#, db.display());
    std::fs::write(dir.path().join("ps.json"), config(dir.path(), volatile, &persistent)).unwrap();
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    let spellings: Vec<CString> =
        ["ps.json", "./ps.json", "sub/../ps.json"].iter().map(|s| CString::new(dir.path().join(s).to_str().unwrap()).unwrap()).collect();
    std::thread::scope(|scope| {
        for id in 0..8usize {
            let spellings = &spellings;
            scope.spawn(move || {
                for it in 0..60 {
                    let mut s = null_mut();
                    // SAFETY: the path is a NUL-terminated string alive past the call; s is a
                    // reference.
                    let st = unsafe { strata_server_open(spellings[(id + it) % 3].as_ptr(), &mut s) };
                    assert_eq!(st, Status::STRATA_OK, "thread {id}, open {it}: {}", last_error());
                    let s = Srv(s);
                    let t = table(&s, "dcn", 0);
                    let (out, _) = lookup(t, &[100_000 + (id * 7 + it) as i64 % 500], 16);
                    assert_eq!(out[1], value(100_000 + (id * 7 + it) as i64 % 500, 1));
                    drop(s);
                }
            });
        }
    });
}
