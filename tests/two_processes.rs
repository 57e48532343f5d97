//! Updates from another process: two processes serve the same `ps.json` over one persistent
//! store, and the one that changed nothing sees the other's committed upsert and erase within
//! `volatile_db.refresh_interval_ms` (plus one lookup), though it held the old rows in its
//! volatile tier.
//!
//! The test re-executes its own binary as the writer (`STRATA_XPROC_CHILD=<folder>` selects the
//! child mode of the same `#[test]` function), through the public C ABI in both processes.

mod common;
use common::*;
use std::ffi::CString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "STRATA_XPROC_CHILD";
const DIM: usize = 4;
const INTERVAL_MS: u64 = 50;
/// Key 1 gets a new row from the child; key 2 is erased by it; key 3 is left alone.
const NEW_ROW: [f32; DIM] = [100.0, 101.0, 102.0, 103.0];
const DEFAULT: f32 = -1.0;

/// Keys 1..=10, row of key k = [k; DIM], in `dir/sparse`.
fn write_sparse(dir: &Path) {
    let d = dir.join("sparse");
    std::fs::create_dir_all(&d).unwrap();
    let keys: Vec<u8> = (1..=10i64).flat_map(|k| k.to_le_bytes()).collect();
    let rows: Vec<u8> = (1..=10).flat_map(|k| [k as f32; DIM]).flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(d.join("key"), keys).unwrap();
    std::fs::write(d.join("emb_vector"), rows).unwrap();
}

/// Every row is warmed into the volatile tier at open; the counter is checked at most every
/// INTERVAL_MS.
fn config() -> String {
    format!(
        r#"{{"supportlonglong": true,
            "volatile_db": {{"type": "parallel_hash_map", "num_partitions": 2, "initial_cache_rate": 1.0,
                             "cache_missed_embeddings": true, "refresh_interval_ms": {INTERVAL_MS}}},
            "persistent_db": {{"type": "rocks_db", "path": "db"}},
            "models": [{{"model": "m", "sparse_files": ["sparse"], "embedding_vecsize_per_table": [{DIM}],
                         "default_value_for_each_table": [{DEFAULT}],
                         "maxnum_catfeature_query_per_table_per_sample": [1], "deployed_device_list": [0],
                         "max_batch_size": 64}}]}}"#
    )
}

/// A server over `dir` (its ps.json text is [`config`]) and its only table. The server is never
/// freed: each process keeps it until it exits, so the table stays valid.
fn open(dir: &Path) -> *mut Table {
    let json = CString::new(config()).unwrap();
    let base = CString::new(dir.to_str().unwrap()).unwrap();
    let mut server = null_mut();
    // SAFETY: json and base are NUL-terminated strings alive past the call; server is a reference.
    ok(unsafe { strata_server_open_json(json.as_ptr(), base.as_ptr(), &mut server) });
    let model = CString::new("m").unwrap();
    let mut table = null_mut();
    // SAFETY: server was just opened and is never freed; model is a NUL-terminated string alive
    // past the call; table is a reference.
    ok(unsafe { strata_server_table(server, model.as_ptr(), 0, &mut table) });
    table
}

/// Looks `keys` up in `t` (a table from [`open`], valid for the whole process).
fn lookup(t: *mut Table, keys: &[i64]) -> (Vec<f32>, LookupStats) {
    let mut out = vec![f32::NAN; keys.len() * DIM];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[keys.len() as i64, DIM as i64]);
    let mut st = LookupStats::default();
    // SAFETY: t is a live table (see `open`); k and o describe keys and out, which outlive the
    // call; st is a reference.
    ok(unsafe { strata_lookup(t, &k.t, &mut o.t, null(), &mut st) });
    (out, st)
}

/// The writer: opens the same configuration and store, upserts key 1, erases key 2, exits.
fn child(dir: &Path) {
    let t = open(dir);
    let keys = [1i64];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[1]);
    let v = Desc::compact(NEW_ROW.as_ptr().cast(), F32, &[1, DIM as i64]);
    // SAFETY: t is a live table (see `open`); k and v describe keys and NEW_ROW, which strata
    // reads during the call only.
    ok(unsafe { strata_table_upsert(t, &k.t, &v.t) });
    let erase = [2i64];
    let k = Desc::compact(erase.as_ptr().cast(), I64, &[1]);
    let mut erased = 0;
    // SAFETY: t is a live table (see `open`); k describes erase, alive past the call; erased is
    // a reference.
    ok(unsafe { strata_table_erase(t, &k.t, &mut erased) });
    assert_eq!(erased, 1, "child: key 2 was in the store");
}

#[test]
fn a_process_sees_another_process_upsert_and_erase_within_the_refresh_interval() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_sparse(dir.path());
    let t = open(dir.path());
    let keys = [1i64, 2, 3];
    let old: Vec<f32> = [1.0f32, 2.0, 3.0].iter().flat_map(|&k| [k; DIM]).collect();
    let (out, st) = lookup(t, &keys);
    assert_eq!(out, old);
    assert_eq!(st.volatile_hits, 3, "the rows are in this process's volatile tier");

    let status = Command::new(std::env::current_exe().unwrap())
        .args(["a_process_sees_another_process_upsert_and_erase_within_the_refresh_interval", "--exact", "--nocapture"])
        .env(CHILD_ENV, dir.path())
        .stdin(Stdio::null())
        .status()
        .expect("spawn the writer");
    // The child's commits returned before it exited.
    let committed = Instant::now();
    assert!(status.success(), "the writer failed: {status}");

    let want: Vec<f32> = NEW_ROW.iter().copied().chain([DEFAULT; DIM]).chain([3.0; DIM]).collect();
    let bound = Duration::from_millis(INTERVAL_MS);
    let deadline = committed + Duration::from_secs(5);
    loop {
        let started = Instant::now();
        let (out, st) = lookup(t, &keys);
        if out == want {
            assert_eq!((st.hits, st.misses), (2, 1));
            break;
        }
        // Only a lookup that started within the interval after the commits may be stale.
        assert!(
            started < committed + bound,
            "a lookup {:?} after the other process's commits (interval {bound:?}) returned {out:?}; want {want:?}",
            started - committed
        );
        assert_eq!(out, old, "a stale lookup returns the old rows whole");
        assert!(Instant::now() < deadline, "the other process's writes were not seen within 5 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Seen from now on, and key 3 (untouched) still answers.
    let (out, _) = lookup(t, &keys);
    assert_eq!(out, want);
    let mut s = TableStats::default();
    // SAFETY: t is a live table (see `open`); s is a reference.
    ok(unsafe { strata_table_get_stats(t, &mut s) });
    assert_eq!((s.upserts, s.erases), (0, 0), "this process wrote nothing");
}
