//! The tiered tables a server builds: the promotion race, forced through the model's hook
//! between a promotion's persistent read and its volatile insert (no sleeps), a stress test of
//! readers against a writer, and how the volatile tier notices other processes' commits.

use super::Server;
use crate::model::{TierScratch, TieredTable, race};
use crate::{Table, TableOptions};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A server of one table (`dim` 4) with a tiny volatile tier that promotes misses, over a
/// persistent store holding keys 0..rows with rows `[k, k, k, k]`, nothing warmed.
fn server(dir: &std::path::Path, rows: u64, capacity: usize) -> Server {
    server_refreshing(dir, rows, capacity, 1000)
}

/// [`server`] checking for other processes' commits every `refresh_ms`.
fn server_refreshing(dir: &std::path::Path, rows: u64, capacity: usize, refresh_ms: u64) -> Server {
    Server::from_json(&config(dir, rows, capacity, refresh_ms), dir).unwrap()
}

/// The configuration of [`server_refreshing`], its model written into `dir`.
fn config(dir: &std::path::Path, rows: u64, capacity: usize, refresh_ms: u64) -> String {
    let sparse = dir.join("sparse");
    std::fs::create_dir_all(&sparse).unwrap();
    let keys: Vec<u8> = (0..rows as i64).flat_map(|k| k.to_le_bytes()).collect();
    let vecs: Vec<u8> = (0..rows).flat_map(|k| [k as f32; 4]).flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(sparse.join("key"), keys).unwrap();
    std::fs::write(sparse.join("emb_vector"), vecs).unwrap();
    let json = format!(
        r#"{{"supportlonglong": true,
            "volatile_db": {{"type": "parallel_hash_map", "num_partitions": 2, "overflow_margin": {capacity},
                             "initial_cache_rate": 0.0, "cache_missed_embeddings": true,
                             "refresh_interval_ms": {refresh_ms}}},
            "persistent_db": {{"type": "rocks_db", "path": "db"}},
            "models": [{{"model": "m", "sparse_files": ["sparse"], "embedding_vecsize_per_table": [4],
                         "default_value_for_each_table": [-1.0],
                         "maxnum_catfeature_query_per_table_per_sample": [1], "deployed_device_list": [0],
                         "max_batch_size": 64}}]}}"#
    );
    json
}

/// A server whose last handle goes while another thread opens the same file under another
/// spelling (forced through the registry's hook, no sleeps): the open gets a fresh server, not
/// `STRATA_CONFIG_ERROR` for "another configuration" on the closing server's store. (The race
/// was found by tests/c/shared_server.c under valgrind.)
#[test]
fn an_open_while_the_same_files_last_handle_goes_gets_a_fresh_server() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ps.json"), config(dir.path(), 10, 100, 1000)).unwrap();
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    let first = super::shared::open(&dir.path().join("sub/../ps.json")).unwrap();
    let weak = Arc::downgrade(&first);
    *crate::util::lock::lock(&super::shared::AFTER_RETAIN) = Some(Box::new(move || drop(first)));
    let second = super::shared::open(&dir.path().join("ps.json"));
    assert!(weak.upgrade().is_none(), "the hook ran and the first server closed");
    let second = second.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read(tiered(&second), 3), Some(3.0));
}

fn tiered(s: &Server) -> &TieredTable {
    let imp: &dyn std::any::Any = s.table("m", 0).unwrap().imp();
    imp.downcast_ref::<TieredTable>().expect("a tiered table")
}

fn read(t: &TieredTable, key: u64) -> Option<f32> {
    let (mut rows, mut found) = (vec![0f32; 4], vec![false]);
    t.fetch(&[key], &mut rows, &mut found, &mut TierScratch::default()).unwrap();
    found[0].then_some(rows[0])
}

#[test]
fn a_promotion_never_resurrects_an_upsert_or_an_erase_committed_after_its_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 100, 64);
    let t = tiered(&s);
    // Key 7 is only in the persistent tier; the lookup reads [7; 4] and, before it
    // promotes that row, an upsert of [70; 4] commits.
    race::after_next_persistent_read(|t| t.upsert(&[7], &[70.0; 4]).unwrap());
    assert_eq!(read(t, 7), Some(7.0), "the lookup that raced the write returns what it read");
    assert_eq!(read(t, 7), Some(70.0), "the promotion put back the row the upsert replaced");
    // Key 9: an erase commits between the read and the promotion.
    race::after_next_persistent_read(|t| assert_eq!(t.erase(&[9]).unwrap(), 1));
    assert_eq!(read(t, 9), Some(9.0));
    assert_eq!(read(t, 9), None, "the promotion resurrected an erased row");
    // Without a racing write, a promotion does happen (the next read is a volatile hit).
    assert_eq!(read(t, 11), Some(11.0));
    let (mut rows, mut found) = (vec![0f32; 4], vec![false]);
    let (vh, ph) = t.fetch(&[11], &mut rows, &mut found, &mut TierScratch::default()).unwrap();
    assert_eq!((vh, ph), (1, 0), "key 11 was promoted");
}

#[test]
fn readers_and_a_writer_over_a_tiny_volatile_tier_end_coherent() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(server(dir.path(), 64, 8));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let t = tiered(&s);
                let mut k = r as u64;
                while !stop.load(Ordering::Relaxed) {
                    read(t, k % 64);
                    k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) >> 3;
                }
            })
        })
        .collect();
    // The writer: 2,000 writes over 64 keys (upserts of increasing values, some erases),
    // remembering each key's last committed state.
    let t = tiered(&s);
    let mut last: Vec<Option<f32>> = (0..64).map(|k| Some(k as f32)).collect();
    let mut x = 12345u64;
    for i in 0..2000u32 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let k = (x >> 40) % 64;
        if i % 7 == 0 {
            t.erase(&[k]).unwrap();
            last[k as usize] = None;
        } else {
            let v = 1000.0 + i as f32;
            t.upsert(&[k], &[v; 4]).unwrap();
            last[k as usize] = Some(v);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    for (k, want) in last.iter().enumerate() {
        assert_eq!(read(t, k as u64), *want, "key {k} reads a row older than its last write");
        assert_eq!(read(t, k as u64), *want, "key {k}, read again (through the volatile tier)");
    }
}

/// A handle on the table's persistent rows that bypasses the tiered table, as another
/// process's writes would (same LMDB store, same commit counter).
fn foreign(dir: &std::path::Path) -> crate::storage::tier::persistent::PersistentTable {
    let store = crate::storage::tier::persistent::PersistentStore::open(&dir.join("db"), false).unwrap();
    store.table("m/sparse_embedding0", 4, None).unwrap()
}

fn volatile_hits(t: &TieredTable, key: u64) -> u64 {
    let (mut rows, mut found) = (vec![0f32; 4], vec![false]);
    t.fetch(&[key], &mut rows, &mut found, &mut TierScratch::default()).unwrap().0
}

#[test]
fn own_writes_do_not_empty_the_volatile_tier() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_refreshing(dir.path(), 100, 64, 0);
    let t = tiered(&s);
    assert_eq!(read(t, 5), Some(5.0));
    assert_eq!(volatile_hits(t, 5), 1, "key 5 was promoted");
    t.upsert(&[6], &[60.0; 4]).unwrap();
    assert_eq!(t.erase(&[7]).unwrap(), 1);
    assert_eq!(t.erase(&[1000]).unwrap(), 0);
    t.upsert(&[5], &[50.0; 4]).unwrap();
    // Every lookup checks the counter (interval 0): it moved, but only by this process.
    assert_eq!(volatile_hits(t, 5), 1, "an own write emptied the volatile tier");
    assert_eq!(volatile_hits(t, 6), 1);
    assert_eq!(read(t, 5), Some(50.0));
    assert_eq!(read(t, 7), None);
    assert_eq!(t.invalidations(), 0);
}

#[test]
fn a_foreign_commit_empties_the_volatile_tier_at_the_next_check() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_refreshing(dir.path(), 100, 64, 0);
    let t = tiered(&s);
    assert_eq!(read(t, 5), Some(5.0));
    assert_eq!(read(t, 9), Some(9.0));
    let generation = t.generation();
    let other = foreign(dir.path());
    other.upsert(&[5], &[50.0; 4]).unwrap();
    assert_eq!(other.erase(&[9]).unwrap(), 1);
    assert_eq!(read(t, 5), Some(50.0), "a foreign upsert was not seen");
    assert_eq!(read(t, 9), None, "a foreign erase was not seen");
    assert_eq!(t.invalidations(), 1);
    assert_ne!(t.generation(), generation, "GPU caches must drop their rows too");
    assert_eq!(volatile_hits(t, 5), 1, "after the check, promotions resume");
}

#[test]
fn within_the_interval_a_foreign_commit_is_noticed_by_the_next_own_write() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_refreshing(dir.path(), 100, 64, 3_600_000);
    let t = tiered(&s);
    assert_eq!(read(t, 5), Some(5.0)); // the first lookup checks; the next check is in 1 h
    foreign(dir.path()).upsert(&[5], &[50.0; 4]).unwrap();
    assert_eq!(read(t, 5), Some(5.0), "within the interval the volatile tier answers");
    // This process's write finds a counter it did not leave: another process wrote.
    t.upsert(&[6], &[60.0; 4]).unwrap();
    assert_eq!(t.invalidations(), 1);
    assert_eq!(read(t, 5), Some(50.0));
    assert_eq!(read(t, 6), Some(60.0), "the own write after the invalidation is kept");
}

#[test]
/// A persistent table initialised from a bad HugeCTR folder fails as `strata_table_open` of the
/// same folder does (same message, same status), and leaves nothing behind.
fn malformed_sparse_folders_fail_like_table_open() {
    let tmp = tempfile::tempdir().unwrap();
    let s = crate::storage::tier::persistent::PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
    let case = |name: &str, setup: &dyn Fn(&Path), dim: usize| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        setup(&dir);
        let want = Table::open(&dir, dim as i64, TableOptions::default()).err().unwrap();
        let got = s.table(name, dim, Some(&dir)).err().unwrap();
        assert_eq!(got.to_string(), want.to_string(), "case {name}");
        assert_eq!(got.kind(), want.kind(), "case {name}");
        // Nothing is left behind: the name opens as a new, empty table.
        let t = s.table(name, dim, None).unwrap();
        assert_eq!(t.len().unwrap(), 0, "case {name}");
    };
    case("no_key", &|d| std::fs::write(d.join("emb_vector"), [0u8; 8]).unwrap(), 2);
    case("no_vectors", &|d| std::fs::write(d.join("key"), [0u8; 8]).unwrap(), 2);
    case(
        "truncated_key",
        &|d| {
            std::fs::write(d.join("key"), [0u8; 12]).unwrap();
            std::fs::write(d.join("emb_vector"), [0u8; 8]).unwrap();
        },
        2,
    );
    case(
        "dim_does_not_divide",
        &|d| {
            std::fs::write(d.join("key"), [0u8; 8]).unwrap();
            std::fs::write(d.join("emb_vector"), [0u8; 12]).unwrap();
        },
        2,
    );
    case(
        "count_mismatch",
        &|d| {
            std::fs::write(d.join("key"), [0u8; 16]).unwrap();
            std::fs::write(d.join("emb_vector"), [0u8; 24]).unwrap();
        },
        2,
    );
    case(
        "duplicates",
        &|d| {
            let keys: [i64; 6] = [5, -1, 7, -1, 5, 9];
            std::fs::write(d.join("key"), keys.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
            std::fs::write(d.join("emb_vector"), vec![0u8; keys.len() * 2 * 4]).unwrap();
        },
        2,
    );
    let e = s.table("bad_dim", 0, Some(tmp.path())).unwrap_err();
    assert_eq!(e.to_string(), Table::open(tmp.path(), 0, TableOptions::default()).err().unwrap().to_string());
}

/// A `ps.json` table stored as int8 (`strata_storage_per_table`): a key's row is the same read
/// from the persistent tier and, once promoted, from the volatile tier (quantized), and it is
/// the int8 reference of the row written; upserts of rows int8 cannot hold are refused before
/// anything is written. Twice: over a new store, whose table is created int8 (LMDB holds the
/// int8 rows, promoted as stored), and over a store first written float32 (the layout of every
/// store before row formats), which stays float32 and whose rows are passed through the format.
#[test]
fn an_int8_table_serves_the_same_row_from_every_tier() {
    use crate::kernels::{RowFormat, format::value, quantize_row};
    let dir = tempfile::tempdir().unwrap();
    let (rows, dim) = (40u64, 8usize);
    let sparse = dir.path().join("sparse");
    std::fs::create_dir_all(&sparse).unwrap();
    let original = |k: u64, c: usize| (k as f32 * 0.37 + c as f32 * 1.9 - 3.0) * if c.is_multiple_of(3) { -1.0 } else { 1.0 };
    let keys: Vec<u8> = (0..rows as i64).flat_map(|k| k.to_le_bytes()).collect();
    let vecs: Vec<u8> = (0..rows).flat_map(|k| (0..dim).map(move |c| original(k, c))).flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(sparse.join("key"), keys).unwrap();
    std::fs::write(sparse.join("emb_vector"), vecs).unwrap();
    let json_in = |db: &str, volatile: &str, storage: &str| {
        format!(
            r#"{{"supportlonglong": true,
                "volatile_db": {volatile},
                "persistent_db": {{"type": "rocks_db", "path": "{db}"}},
                "models": [{{"model": "m", "sparse_files": ["sparse"], "embedding_vecsize_per_table": [{dim}],
                             "strata_storage_per_table": [{storage}],
                             "maxnum_catfeature_query_per_table_per_sample": [1], "max_batch_size": 64}}]}}"#
        )
    };
    let json = |volatile: &str, storage: &str| json_in("db", volatile, storage);
    let local = r#"{"type": "parallel_hash_map", "num_partitions": 2, "overflow_margin": 100,
                    "initial_cache_rate": 0.0, "cache_missed_embeddings": true}"#;
    for legacy in [false, true] {
        let db = if legacy { "db-float32" } else { "db" };
        if legacy {
            drop(Server::from_json(&json_in(db, local, "\"float32\""), dir.path()).unwrap());
        }
        let s = Server::from_json(&json_in(db, local, "\"int8\""), dir.path()).unwrap();
        let t = tiered(&s);
        assert_eq!(t.format(), RowFormat::Int8);
        let reference = |row: &[f32]| {
            let mut q = vec![0u8; dim + 8];
            quantize_row(RowFormat::Int8, row, &mut q).unwrap();
            // SAFETY: q holds one int8 row of dim values.
            (0..dim).map(|c| unsafe { value(RowFormat::Int8, q.as_ptr(), dim, c) }).collect::<Vec<f32>>()
        };
        let fetch = |key: u64| {
            let (mut out, mut found) = (vec![f32::NAN; dim], vec![false]);
            let (vh, ph) = t.fetch(&[key], &mut out, &mut found, &mut TierScratch::default()).unwrap();
            assert!(found[0]);
            (out, vh, ph)
        };
        for key in 0..rows {
            let want = reference(&(0..dim).map(|c| original(key, c)).collect::<Vec<_>>());
            let (first, vh, ph) = fetch(key);
            assert_eq!((vh, ph), (0, 1), "key {key}: first from the persistent tier");
            let (again, vh, ph) = fetch(key);
            assert_eq!((vh, ph), (1, 0), "key {key}: then from the volatile tier");
            assert_eq!(
                first.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "key {key}"
            );
            assert_eq!(
                again.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "key {key}"
            );
        }
        assert_eq!(t.stats().volatile_rows, rows);
        // Upserts: a NaN row is refused with its row, and nothing changes; a good row is served
        // as int8 holds it.
        let mut bad = vec![1.0f32; dim];
        bad[5] = f32::NAN;
        let e = t.upsert(&[3], &bad).unwrap_err().to_string();
        assert!(e.contains("vectors") && e.contains("row 0") && e.contains("int8"), "{e}");
        assert_eq!(fetch(3).0, reference(&(0..dim).map(|c| original(3, c)).collect::<Vec<_>>()));
        let new: Vec<f32> = (0..dim).map(|c| c as f32 * 10.5 - 4.0).collect();
        t.upsert(&[3], &new).unwrap();
        assert_eq!(fetch(3).0, reference(&new));
        drop(s);
        // Warmed at open (initial_cache_rate 1): the volatile tier's rows are the same.
        let warm = local.replace("\"initial_cache_rate\": 0.0", "\"initial_cache_rate\": 1.0");
        let s = Server::from_json(&json_in(db, &warm, "\"int8\""), dir.path()).unwrap();
        let t = tiered(&s);
        assert_eq!(t.stats().volatile_rows, rows);
        for key in [0u64, 3, 17] {
            let (mut out, mut found) = (vec![f32::NAN; dim], vec![false]);
            let hits = t.fetch(&[key], &mut out, &mut found, &mut TierScratch::default()).unwrap();
            let values: Vec<f32> = if key == 3 { new.clone() } else { (0..dim).map(|c| original(key, c)).collect() };
            assert_eq!((hits, found[0]), ((1, 0), true), "key {key} from the warmed volatile tier");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&reference(&values)), "key {key}");
        }
        drop(s);
        let store = crate::storage::tier::persistent::PersistentStore::open(&dir.path().join(db), true).unwrap();
        let stored = store.table("m/sparse_embedding0", dim, None).unwrap().format();
        assert_eq!(stored, if legacy { RowFormat::Float(crate::dlpack::FloatDtype::F32) } else { RowFormat::Int8 });
    }

    // What the configuration refuses, naming the field.
    let redis = r#"{"type": "redis_cluster", "address": "127.0.0.1:7000"}"#;
    for (volatile, storage, want) in [
        (local, "\"int2\"", "models[0].strata_storage_per_table[0]"),
        (local, "\"int8\", \"int8\"", "models[0].strata_storage_per_table"),
        (redis, "\"int8\"", "redis_cluster"),
    ] {
        let e = Server::from_json(&json(volatile, storage), dir.path()).err().expect("refused").to_string();
        assert!(e.contains(want), "{storage}: {e}");
    }
}
