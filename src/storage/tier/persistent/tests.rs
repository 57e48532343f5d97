use super::*;
use crate::dlpack::FloatDtype;
use crate::error::ErrorKind;
use crate::kernels::{format::value, quantize_row};
use heed::types::Bytes;
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<PersistentStore>();
    assert_send_sync::<PersistentTable>();
}

/// Value `j` of key `k`'s row in generated folders (exact in float32).
fn val(k: u64, j: usize) -> f32 {
    ((k % 100_003) as f32) * 0.5 + j as f32
}

/// Writes a HugeCTR sparse folder with `keys` and rows of `dim` values `val(k, j)`.
fn write_sparse(dir: &Path, keys: &[i64], dim: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let mut kf = Vec::with_capacity(keys.len() * 8);
    let mut vf = Vec::with_capacity(keys.len() * dim * 4);
    for &k in keys {
        kf.extend_from_slice(&k.to_le_bytes());
        for j in 0..dim {
            vf.extend_from_slice(&val(k as u64, j).to_le_bytes());
        }
    }
    std::fs::write(dir.join("key"), kf).unwrap();
    std::fs::write(dir.join("emb_vector"), vf).unwrap();
}

/// Scrambled, distinct keys, some negative as int64.
fn gen_keys(n: usize) -> Vec<i64> {
    (0..n as u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i << 7)) as i64).collect()
}

fn read_all(t: &PersistentTable, keys: &[u64]) -> (Vec<f32>, Vec<bool>) {
    let mut out = vec![f32::NAN; keys.len() * t.dim()];
    let mut found = vec![false; keys.len()];
    t.get_many(keys, &mut out, &mut found).unwrap();
    (out, found)
}

fn check_rows(t: &PersistentTable, keys: &[i64]) {
    let dim = t.dim();
    let ks: Vec<u64> = keys.iter().map(|&k| k as u64).collect();
    let (out, found) = read_all(t, &ks);
    for (i, &k) in ks.iter().enumerate() {
        assert!(found[i], "key {k} missing");
        for j in 0..dim {
            assert_eq!(out[i * dim + j].to_bits(), val(k, j).to_bits(), "key {k} element {j}");
        }
    }
}

fn store_msg(e: &Error) -> String {
    assert_eq!(e.kind(), ErrorKind::Store, "{e}");
    e.to_string()
}

#[test]
fn open_creates_the_folder_and_shares_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/b/ps");
    let s = PersistentStore::open(&dir, false).unwrap();
    assert!(dir.join("data.mdb").is_file());
    assert!(!s.is_read_only());
    let s2 = PersistentStore::open(&dir, false).unwrap();
    assert!(Arc::ptr_eq(&s.inner, &s2.inner));
    let t = s.table("m/t", 4, None).unwrap();
    t.upsert(&[1], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    // Same table through the other handle: one set of counters.
    let t2 = s2.table("m/t", 4, None).unwrap();
    assert!(Arc::ptr_eq(&t.inner, &t2.inner));
    // A read-only view of an environment open read-write refuses writes.
    let ro = PersistentStore::open(&dir, true).unwrap();
    let e = ro.table("m/t", 4, None).unwrap().upsert(&[2], &[0.0; 4]).unwrap_err();
    assert!(store_msg(&e).contains("read-only"), "{e}");
    drop((s, s2, t, t2, ro));
    // Closed: opens afresh, data still there.
    let s = PersistentStore::open(&dir, false).unwrap();
    let t = s.table("m/t", 4, None).unwrap();
    assert_eq!(read_all(&t, &[1]).0, vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn bulk_load_reads_back_every_row_in_key_order() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = gen_keys(5000);
    write_sparse(&tmp.path().join("sparse"), &keys, 8);
    let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
    let t = s.table("wdl/table0", 8, Some(&tmp.path().join("sparse"))).unwrap();
    assert_eq!(t.dim(), 8);
    assert_eq!(t.name(), "wdl/table0");
    assert_eq!(t.len().unwrap(), 5000);
    check_rows(&t, &keys);
    let mut sorted: Vec<u64> = keys.iter().map(|&k| k as u64).collect();
    sorted.sort_unstable();
    let mut seen = Vec::new();
    t.scan(usize::MAX, |k, row| {
        assert_eq!(row.len(), 8);
        for (j, v) in row.iter().enumerate() {
            assert_eq!(*v, val(k, j));
        }
        seen.push(k);
    })
    .unwrap();
    assert_eq!(seen, sorted, "scan must visit every key in numeric u64 order");
    let mut first = Vec::new();
    t.scan(10, |k, _| first.push(k)).unwrap();
    assert_eq!(first, sorted[..10]);
    let st = t.stats();
    assert_eq!((st.hits, st.misses, st.rows, st.upserts, st.erases), (5000, 0, 5000, 0, 0));
}

#[test]
fn load_in_many_transactions_and_runs() {
    // Small runs and transactions: later runs insert (not append) and commits interleave.
    let tmp = tempfile::tempdir().unwrap();
    let keys = gen_keys(3001);
    write_sparse(&tmp.path().join("sparse"), &keys, 3);
    let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
    let params = LoadParams { txn_bytes: 1000, run_keys: 700, crash_after_commits: None, ..LoadParams::default() };
    let t = s.table_with("t", 3, Some(&tmp.path().join("sparse")), params).unwrap();
    assert_eq!(t.len().unwrap(), 3001);
    check_rows(&t, &keys);
}

#[test]
fn empty_sparse_folder_gives_an_empty_table() {
    let tmp = tempfile::tempdir().unwrap();
    write_sparse(&tmp.path().join("sparse"), &[], 4);
    let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
    let t = s.table("t", 4, Some(&tmp.path().join("sparse"))).unwrap();
    assert_eq!(t.len().unwrap(), 0);
    assert!(t.is_empty().unwrap());
}

#[test]
fn reopen_reuses_the_table_without_the_sparse_files() {
    let tmp = tempfile::tempdir().unwrap();
    let sparse = tmp.path().join("sparse");
    let keys = gen_keys(777);
    write_sparse(&sparse, &keys, 16);
    let ps = tmp.path().join("ps");
    {
        let s = PersistentStore::open(&ps, false).unwrap();
        let t = s.table("m/t0", 16, Some(&sparse)).unwrap();
        t.upsert(&[12345], &[7.0; 16]).unwrap();
    }
    std::fs::remove_dir_all(&sparse).unwrap();
    let s = PersistentStore::open(&ps, false).unwrap();
    // The folder is gone: reopening must not read it, and must not reload over the upsert.
    let t = s.table("m/t0", 16, Some(&sparse)).unwrap();
    assert_eq!(t.len().unwrap(), 778);
    check_rows(&t, &keys);
    assert_eq!(read_all(&t, &[12345]).0, vec![7.0; 16]);
    drop((s, t));
    let ro = PersistentStore::open(&ps, true).unwrap();
    let t = ro.table("m/t0", 16, None).unwrap();
    check_rows(&t, &keys);
}

#[test]
fn dim_mismatch_names_the_table_and_both_dims() {
    let tmp = tempfile::tempdir().unwrap();
    let ps = tmp.path().join("ps");
    let s = PersistentStore::open(&ps, false).unwrap();
    let t = s.table("m/emb", 8, None).unwrap();
    let m = store_msg(&s.table("m/emb", 16, None).unwrap_err());
    assert!(m.contains("m/emb") && m.contains("dim 8") && m.contains("dim 16"), "{m}");
    drop((s, t));
    // From the metadata, after a reopen, read-write and read-only.
    let s = PersistentStore::open(&ps, false).unwrap();
    let m = store_msg(&s.table("m/emb", 16, None).unwrap_err());
    assert!(m.contains("m/emb") && m.contains("dim 8") && m.contains("dim 16"), "{m}");
    drop(s);
    let s = PersistentStore::open(&ps, true).unwrap();
    let m = store_msg(&s.table("m/emb", 4, None).unwrap_err());
    assert!(m.contains("m/emb") && m.contains("dim 8") && m.contains("dim 4"), "{m}");
}

#[test]
fn read_only_refuses_writes_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let ps = tmp.path().join("ps");
    let missing = PersistentStore::open(&tmp.path().join("nothing"), true).err().unwrap();
    assert!(store_msg(&missing).contains("read-only store must exist"), "{missing}");
    {
        let s = PersistentStore::open(&ps, false).unwrap();
        s.table("m/t", 2, None).unwrap().upsert(&[5, 6], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    }
    let s = PersistentStore::open(&ps, true).unwrap();
    assert!(s.is_read_only());
    let t = s.table("m/t", 2, None).unwrap();
    assert!(t.is_read_only());
    let (out, found) = read_all(&t, &[5, 6, 7]);
    assert_eq!(found, vec![true, true, false]);
    assert_eq!(&out[..4], &[1.0, 2.0, 3.0, 4.0]);
    for e in [t.upsert(&[5], &[0.0, 0.0]).unwrap_err(), t.erase(&[5]).unwrap_err(), t.upsert(&[], &[]).unwrap_err()] {
        let m = store_msg(&e);
        assert!(m.starts_with("m/t: is read-only") && m.contains("read_only = true"), "{m}");
    }
    assert_eq!(t.len().unwrap(), 2);
    // Tables cannot be created or loaded read-only.
    let e = s.table("m/other", 2, None).unwrap_err();
    assert!(store_msg(&e).contains("open read-only"), "{e}");
    write_sparse(&tmp.path().join("sparse"), &[1, 2], 2);
    let e = s.table("m/other", 2, Some(&tmp.path().join("sparse"))).unwrap_err();
    assert!(store_msg(&e).contains("m/other"), "{e}");
    // Read-write while open read-only in this process is refused.
    let e = PersistentStore::open(&ps, false).err().unwrap();
    assert!(store_msg(&e).contains("already open read-only"), "{e}");
}

#[test]
fn upsert_erase_len_and_stats_are_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let s = PersistentStore::open(tmp.path(), false).unwrap();
    let t = s.table("t", 3, None).unwrap();
    assert_eq!(t.len().unwrap(), 0);
    let rows: Vec<f32> = (0..12).map(|v| v as f32).collect();
    t.upsert(&[10, 20, 30, 40], &rows).unwrap();
    assert_eq!(t.len().unwrap(), 4);
    // Overwrite one key and add one; a key given twice keeps its last row.
    t.upsert(&[20, 50, 50], &[-1.0, -2.0, -3.0, 9.0, 9.0, 9.0, 5.0, 5.0, 5.0]).unwrap();
    assert_eq!(t.len().unwrap(), 5);
    let (out, found) = read_all(&t, &[20, 50, 10]);
    assert_eq!(found, vec![true; 3]);
    assert_eq!(out, vec![-1.0, -2.0, -3.0, 5.0, 5.0, 5.0, 0.0, 1.0, 2.0]);
    assert_eq!(t.erase(&[10, 10, 99]).unwrap(), 1);
    assert_eq!(t.erase(&[]).unwrap(), 0);
    assert_eq!(t.len().unwrap(), 4);
    let (_, found) = read_all(&t, &[10, 99]);
    assert_eq!(found, vec![false, false]);
    assert_eq!(t.stats(), PersistentStats { hits: 3, misses: 2, rows: 4, upserts: 7, erases: 1 });
    // Wrong lengths are argument errors and change nothing.
    let e = t.upsert(&[1, 2], &[0.0; 5]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().starts_with("rows: 5 values; expected 2 keys x dim 3 = 6"), "{e}");
    let e = t.get_many(&[1], &mut [0.0; 2], &mut [false]).unwrap_err();
    assert!(e.to_string().starts_with("out: "), "{e}");
    let e = t.get_many(&[1], &mut [0.0; 3], &mut []).unwrap_err();
    assert!(e.to_string().starts_with("found: "), "{e}");
    assert_eq!(t.len().unwrap(), 4);
    assert_eq!(t.stats().upserts, 7);
}

#[test]
fn get_many_reports_misses_and_leaves_their_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let s = PersistentStore::open(tmp.path(), false).unwrap();
    let t = s.table("t", 2, None).unwrap();
    t.upsert(&[1, u64::MAX, 1 << 63], &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5]).unwrap();
    let keys = [0, 1, 2, u64::MAX, 1 << 63, 7];
    let mut out = vec![-9.0f32; 12];
    let mut found = vec![true; 6];
    assert_eq!(t.get_many(&keys, &mut out, &mut found).unwrap(), (3, 3));
    assert_eq!(found, vec![false, true, false, true, true, false]);
    assert_eq!(out, vec![-9.0, -9.0, 1.0, 1.5, -9.0, -9.0, 2.0, 2.5, 3.0, 3.5, -9.0, -9.0]);
    assert_eq!(t.get_many(&[], &mut [], &mut []).unwrap(), (0, 0));
    let st = t.stats();
    assert_eq!((st.hits, st.misses), (3, 3));
    // Big-endian keys: the order is numeric even across the sign bit of int64.
    let mut order = Vec::new();
    t.scan(usize::MAX, |k, _| order.push(k)).unwrap();
    assert_eq!(order, vec![1, 1 << 63, u64::MAX]);
}

#[test]
fn concurrent_readers_see_whole_rows() {
    const DIM: usize = 32;
    const KEYS: u64 = 64;
    const VERSIONS: u64 = 60;
    // Element j of key k at version v: exact in float32, and says which (k, v) it belongs to.
    fn enc(k: u64, v: u64, j: usize) -> f32 {
        (k * 100_000 + v * 100 + j as u64) as f32
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = PersistentStore::open(tmp.path(), false).unwrap();
    let t = s.table("t", DIM, None).unwrap();
    let keys: Vec<u64> = (0..KEYS).collect();
    let write = |v: u64| {
        let rows: Vec<f32> = keys.iter().flat_map(|&k| (0..DIM).map(move |j| enc(k, v, j))).collect();
        t.upsert(&keys, &rows).unwrap();
    };
    write(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        for _ in 0..3 {
            sc.spawn(|| {
                let mut last = vec![0u64; KEYS as usize];
                let mut reads = 0;
                while !done.load(Relaxed) || reads < 5 {
                    let (out, found) = read_all(&t, &keys);
                    assert!(found.iter().all(|&f| f));
                    let mut batch_v = None;
                    for (i, &k) in keys.iter().enumerate() {
                        let row = &out[i * DIM..(i + 1) * DIM];
                        let v = (row[0] as u64 - k * 100_000) / 100;
                        for (j, x) in row.iter().enumerate() {
                            assert_eq!(*x, enc(k, v, j), "torn row: key {k} element {j}");
                        }
                        // Versions never go back, and one batch sees one snapshot.
                        assert!(v >= last[i]);
                        last[i] = v;
                        assert_eq!(*batch_v.get_or_insert(v), v, "a batch mixed two versions");
                    }
                    reads += 1;
                }
            });
        }
        for v in 1..VERSIONS {
            write(v);
        }
        done.store(true, Relaxed);
    });
    let (out, _) = read_all(&t, &keys);
    assert_eq!(out[DIM], enc(1, VERSIONS - 1, 0));
}

/// What opening `dir` as a static table (`strata_table_open`) answers when the folder is bad:
/// the folder's own checks, then the key index's (duplicate keys), as the model's
/// `StaticTable::open` makes them. (That the server and `strata_table_open` give the same errors
/// for the same folders is checked in the server's tests.)
fn open_error(dir: &Path, dim: usize) -> crate::error::Error {
    let folder = match crate::storage::hugectr::SparseFolder::open(dir, dim) {
        Ok(f) => f,
        Err(e) => return e,
    };
    crate::storage::index::KeyIndex::build((0..folder.rows).map(|r| folder.key(r)), |k| k as i64 as i128, "dir/key")
        .err()
        .expect("a folder with an error")
}

#[test]
fn duplicate_found_after_commits_leaves_no_table() {
    let tmp = tempfile::tempdir().unwrap();
    let sparse = tmp.path().join("sparse");
    let mut keys = gen_keys(2000);
    keys[1500] = keys[3]; // in a later run than its first occurrence
    write_sparse(&sparse, &keys, 4);
    let want = open_error(&sparse, 4).to_string();
    assert!(want.contains("rows 3 and 1500"), "{want}");
    let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
    let params = LoadParams { txn_bytes: 2000, run_keys: 500, crash_after_commits: None, ..LoadParams::default() };
    let e = s.table_with("t", 4, Some(&sparse), params).err().unwrap();
    assert_eq!(e.to_string(), want);
    assert_eq!(s.table("t", 4, None).unwrap().len().unwrap(), 0);
}

#[test]
fn an_interrupted_load_is_detected_and_redone() {
    let tmp = tempfile::tempdir().unwrap();
    let sparse = tmp.path().join("sparse");
    let keys = gen_keys(2500);
    write_sparse(&sparse, &keys, 4);
    let ps = tmp.path().join("ps");
    {
        let s = PersistentStore::open(&ps, false).unwrap();
        let params = LoadParams { txn_bytes: 4000, run_keys: 1 << 20, crash_after_commits: Some(2), ..LoadParams::default() };
        let e = s.table_with("m/t", 4, Some(&sparse), params).err().unwrap();
        assert!(e.to_string().contains("simulated crash"), "{e}");
    }
    // The partial load is visible in LMDB, but the table is recorded as loading.
    let s = PersistentStore::open(&ps, false).unwrap();
    let e = s.table("m/t", 4, None).unwrap_err();
    let m = store_msg(&e);
    assert!(m.starts_with("m/t: ") && m.contains("interrupted") && m.contains("sparse folder"), "{m}");
    drop(s);
    let ro = PersistentStore::open(&ps, true).unwrap();
    assert!(store_msg(&ro.table("m/t", 4, None).unwrap_err()).contains("interrupted"));
    drop(ro);
    let s = PersistentStore::open(&ps, false).unwrap();
    let t = s.table("m/t", 4, Some(&sparse)).unwrap();
    assert_eq!(t.len().unwrap(), 2500);
    check_rows(&t, &keys);
}

#[test]
fn bad_names_and_corrupt_rows_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let s = PersistentStore::open(tmp.path(), false).unwrap();
    for (name, want) in [("", "name: is empty"), ("a\0b", "NUL"), (&"x".repeat(401)[..], "at most 400")] {
        let e = s.table(name, 4, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains(want), "{e}");
    }
    let e = s.table("t", 0, None).unwrap_err();
    assert_eq!(e.to_string(), format!("dim: 0; expected 1 <= dim <= {}", crate::limits::MAX_DIM));
    let t = s.table("t", 4, None).unwrap();
    // Write a row of the wrong length behind the table's back.
    let env = &s.inner.env;
    let raw = t.inner.db.remap_types::<Bytes, Bytes>();
    let mut w = env.write_txn().unwrap();
    raw.put(&mut w, &9u64.to_be_bytes(), &[0u8; 12]).unwrap();
    w.commit().unwrap();
    let e = t.get_many(&[9], &mut [0.0; 4], &mut [false]).unwrap_err();
    assert_eq!(store_msg(&e), "t: corrupt row for key 9: 12 bytes; expected 16 (4 float32)");
    let e = t.scan(usize::MAX, |_, _| ()).unwrap_err();
    assert!(store_msg(&e).contains("corrupt row"));
    let mut w = env.write_txn().unwrap();
    raw.put(&mut w, b"abc", &[0u8; 16]).unwrap();
    w.commit().unwrap();
    let mut w = env.write_txn().unwrap();
    raw.delete(&mut w, &9u64.to_be_bytes()).unwrap();
    w.commit().unwrap();
    let e = t.scan(usize::MAX, |_, _| ()).unwrap_err();
    assert_eq!(store_msg(&e), "t: corrupt key: 3 bytes; expected 8");
}

/// `cargo test --release --lib tier::persistent::tests::bulk_load_timing -- --ignored --nocapture`
#[test]
#[ignore]
fn bulk_load_timing() {
    let rows: usize = std::env::var("STRATA_LOAD_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let dim = 128;
    let tmp = tempfile::tempdir().unwrap();
    let sparse = tmp.path().join("sparse");
    std::fs::create_dir_all(&sparse).unwrap();
    let keys = gen_keys(rows);
    let mut kf = std::io::BufWriter::new(std::fs::File::create(sparse.join("key")).unwrap());
    let mut vf = std::io::BufWriter::new(std::fs::File::create(sparse.join("emb_vector")).unwrap());
    for &k in &keys {
        kf.write_all(&k.to_le_bytes()).unwrap();
        for j in 0..dim {
            vf.write_all(&val(k as u64, j).to_le_bytes()).unwrap();
        }
    }
    drop((kf, vf));
    let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
    let t0 = std::time::Instant::now();
    let t = s.table("t", dim, Some(&sparse)).unwrap();
    let load = t0.elapsed();
    let size = std::fs::metadata(tmp.path().join("ps/data.mdb")).unwrap().len();
    let probe: Vec<u64> = keys.iter().step_by(7).map(|&k| k as u64).collect();
    let mut out = vec![0f32; probe.len() * dim];
    let mut found = vec![false; probe.len()];
    let mut get = Vec::new();
    for _ in 0..2 {
        let t0 = std::time::Instant::now();
        t.get_many(&probe, &mut out, &mut found).unwrap();
        get.push(t0.elapsed());
    }
    let t0 = std::time::Instant::now();
    let batch: Vec<u64> = keys[..1000].iter().map(|&k| k as u64).collect();
    t.upsert(&batch, &vec![1.0; 1000 * dim]).unwrap();
    let up = t0.elapsed();
    println!(
        "bulk load {rows} x {dim}: {load:?} ({:.0} MB/s of rows), data.mdb {:.0} MiB; \
         get_many of {} random keys: first pass {:?}, second {:?}; durable upsert of 1000 rows {up:?}",
        (rows * dim * 4) as f64 / load.as_secs_f64() / 1e6,
        size as f64 / (1 << 20) as f64,
        probe.len(),
        get[0],
        get[1]
    );
    assert_eq!(t.len().unwrap(), rows as u64);
    assert!(found.iter().all(|&f| f));
}

/// The codecs write exactly the bytes of the first layout (`strata-persistent-1`), which the
/// code before them wrote by hand: keys as `u64::to_be_bytes`, rows as float32 `to_le_bytes`
/// one after another, records as three little-endian words.
#[test]
fn codecs_encode_the_first_layout_byte_for_byte() {
    use format::{BeKey, LeRow, RecordCodec, RowCodec};
    use heed::{BytesDecode, BytesEncode};
    assert_eq!(&*BeKey::bytes_encode(&0x0102_0304_0506_0708).unwrap(), &[1, 2, 3, 4, 5, 6, 7, 8]);
    for k in [0u64, 1, 9, 255, 256, 1 << 63, (1 << 63) - 1, u64::MAX - 1, u64::MAX] {
        assert_eq!(&*BeKey::bytes_encode(&k).unwrap(), &k.to_be_bytes(), "key {k}");
        assert_eq!(BeKey::bytes_decode(&k.to_be_bytes()).unwrap(), k);
    }
    for bad in [&[0u8; 7][..], &[0u8; 9], &[]] {
        let e = BeKey::bytes_decode(bad).unwrap_err();
        assert_eq!(e.to_string(), format!("corrupt key: {} bytes; expected 8", bad.len()));
    }

    let values = [1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE, -3.25e-7, f32::from_bits(0x7fc0_0001)];
    let mut old = vec![0u8; values.len() * 4];
    for (b, v) in old.chunks_exact_mut(4).zip(&values) {
        b.copy_from_slice(&v.to_le_bytes());
    }
    assert_eq!(&old[..4], &[0x00, 0x00, 0xc0, 0x3f]);
    let mut buf = Vec::new();
    let f32_rows = RowFormat::Float(FloatDtype::F32);
    let row = LeRow::encode(f32_rows, &values, &mut buf).unwrap();
    assert_eq!(&*RowCodec::bytes_encode(&row).unwrap(), &old[..]);
    let mut back = [0f32; 6];
    RowCodec::bytes_decode(&old).unwrap().decode_into(7, f32_rows, &mut back).unwrap();
    assert_eq!(back.map(f32::to_bits), values.map(f32::to_bits));
    let e = RowCodec::bytes_decode(&old[..20]).unwrap().decode_into(7, f32_rows, &mut back).unwrap_err();
    assert_eq!(e.to_string(), "corrupt row for key 7: 20 bytes; expected 24 (6 float32)");

    let complete = TableRecord { complete: true, dim: 0x0102_0304_0506_0708, format: f32_rows };
    let loading = TableRecord { complete: false, dim: 32, format: f32_rows };
    assert_eq!(&*RecordCodec::bytes_encode(&complete).unwrap(), &[1, 0, 0, 0, 1, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(&*RecordCodec::bytes_encode(&loading).unwrap(), &[1, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0, 0, 0, 0, 0]);
    for r in [complete, loading] {
        assert_eq!(RecordCodec::bytes_decode(&RecordCodec::bytes_encode(&r).unwrap()).unwrap(), r);
    }
    for (bytes, why) in [
        (&[1u8, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0][..], "12 bytes; expected 16"),
        (&[2, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0], "16 bytes; expected 24"),
        (&[3, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0], "layout 3; this strata reads layouts 1 and 2"),
        (&[1, 0, 0, 0, 7, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0], "state 7; expected 0 (loading) or 1 (complete)"),
    ] {
        let e = RecordCodec::bytes_decode(bytes).unwrap_err();
        assert_eq!(e.to_string(), format!("corrupt metadata record: {why}"));
    }
    assert_eq!(format::FORMAT, b"strata-persistent-1");
    assert_eq!((format::META_DB, format::FORMAT_KEY, format::TABLE_PREFIX), ("strata.meta", "\0format", "t/"));
}

/// Writes, with raw LMDB calls, a store in folder `dir` (existing, empty) in the first layout
/// (float32 rows, 16-byte records), as the code before the typed codecs and before row formats
/// wrote it: table `name` of `dim` values holding `row(k)` for each of `keys`.
fn write_first_layout(dir: &Path, name: &str, dim: usize, keys: &[u64], row: impl Fn(u64) -> Vec<f32>) {
    let mut opts = heed::EnvOpenOptions::new();
    opts.max_dbs(4);
    // SAFETY: a fresh folder of the calling test's own, opened once, by this process only.
    let env = unsafe { opts.open(dir) }.unwrap();
    let mut w = env.write_txn().unwrap();
    let meta: heed::Database<Bytes, Bytes> = env.create_database(&mut w, Some("strata.meta")).unwrap();
    meta.put(&mut w, b"\0format", b"strata-persistent-1").unwrap();
    let mut record = Vec::new();
    record.extend_from_slice(&1u32.to_le_bytes());
    record.extend_from_slice(&1u32.to_le_bytes());
    record.extend_from_slice(&(dim as u64).to_le_bytes());
    meta.put(&mut w, name.as_bytes(), &record).unwrap();
    let rows: heed::Database<Bytes, Bytes> = env.create_database(&mut w, Some(&format!("t/{name}"))).unwrap();
    for &k in keys {
        let bytes: Vec<u8> = row(k).iter().flat_map(|v| v.to_le_bytes()).collect();
        rows.put(&mut w, &k.to_be_bytes(), &bytes).unwrap();
    }
    w.commit().unwrap();
    env.prepare_for_closing().wait();
}

/// A store written with raw LMDB calls in the first layout, as the code before the typed codecs
/// wrote it, opens and reads the same rows; rows written now land in the same bytes.
#[test]
fn a_store_in_the_first_layout_opens_and_reads_the_same_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ps");
    std::fs::create_dir_all(&dir).unwrap();
    let dim = 3;
    let keys: Vec<u64> = vec![5, 1 << 63, u64::MAX, 0, 77];
    let row = |k: u64| -> Vec<f32> { (0..dim).map(|j| k as f32 * 0.25 - j as f32).collect() };
    write_first_layout(&dir, "m/t", dim, &keys, row);

    let s = PersistentStore::open(&dir, false).unwrap();
    let t = s.table("m/t", dim, None).unwrap();
    assert_eq!(t.len().unwrap(), keys.len() as u64);
    let (out, found) = read_all(&t, &keys);
    assert!(found.iter().all(|&f| f));
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(&out[i * dim..(i + 1) * dim], &row(k)[..], "key {k}");
    }
    let mut order = Vec::new();
    t.scan(usize::MAX, |k, r| {
        assert_eq!(r, &row(k)[..]);
        order.push(k);
    })
    .unwrap();
    assert_eq!(order, vec![0, 5, 77, 1 << 63, u64::MAX]);
    let m = store_msg(&s.table("m/t", 4, None).unwrap_err());
    assert!(m.contains("dim 3") && m.contains("dim 4"), "{m}");

    // Written now: the same key and row bytes, and the same record for a new table.
    t.upsert(&[42, 5], &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0]).unwrap();
    let t2 = s.table("m/new", 2, None).unwrap();
    let env = &s.inner.env;
    let r = env.read_txn().unwrap();
    let raw = t.inner.db.remap_types::<Bytes, Bytes>();
    let le = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    assert_eq!(raw.get(&r, &42u64.to_be_bytes()).unwrap().unwrap(), &le(&[1.0, 2.0, 3.0])[..]);
    assert_eq!(raw.get(&r, &5u64.to_be_bytes()).unwrap().unwrap(), &le(&[-1.0, -2.0, -3.0])[..]);
    let meta: heed::Database<Bytes, Bytes> = env.open_database(&r, Some("strata.meta")).unwrap().unwrap();
    assert_eq!(meta.get(&r, b"\0format").unwrap().unwrap(), b"strata-persistent-1");
    assert_eq!(meta.get(&r, b"m/new").unwrap().unwrap(), &[1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let new_rows: heed::Database<Bytes, Bytes> = env.open_database(&r, Some("t/m/new")).unwrap().unwrap();
    assert_eq!(new_rows.len(&r).unwrap(), 0);
    drop((r, t2));
}

/// A store of the first layout (float32, 16-byte records: every store written before row
/// formats) opened for a quantized table keeps its float32 rows: the table reports float32,
/// reads the rows written, and new rows land as float32 bytes.
#[test]
fn a_first_layout_store_stays_float32_when_a_quantized_table_opens_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ps");
    std::fs::create_dir_all(&dir).unwrap();
    let (dim, keys) = (4usize, vec![3u64, 9, 1 << 40]);
    let row = |k: u64| -> Vec<f32> { (0..dim).map(|j| k as f32 * 1e-3 + j as f32 * 7.5 - 11.0).collect() };
    write_first_layout(&dir, "m/t", dim, &keys, row);
    let s = PersistentStore::open(&dir, false).unwrap();
    let t = s.table_stored_as("m/t", dim, RowFormat::Int8, None).unwrap();
    assert_eq!(t.format(), RowFormat::Float(FloatDtype::F32));
    let (out, found) = read_all(&t, &keys);
    assert!(found.iter().all(|&f| f));
    let want: Vec<f32> = keys.iter().flat_map(|&k| row(k)).collect();
    assert_eq!(out, want);
    t.upsert(&[5], &[0.5, f32::NAN, 2.0, 3.0]).unwrap(); // float32 keeps any value, as before
    let r = s.inner.env.read_txn().unwrap();
    assert_eq!(t.inner.db.remap_types::<Bytes, Bytes>().get(&r, &5u64.to_be_bytes()).unwrap().unwrap().len(), dim * 4);
}

/// Tables created with a format store its bytes (rows loaded from a sparse folder quantized at
/// load, upserts quantized on write), record it in a 24-byte record, read back the scalar
/// reference of those bytes, and keep it when reopened by a caller asking for float32.
#[test]
fn tables_stored_as_a_format_keep_its_bytes_and_record_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dim = 6;
    let keys: Vec<i64> = (0..50).map(|k| k * 3 - 20).collect();
    // Rows `val` gives; upserts add a constant row (scale 0) and a row of extreme values.
    write_sparse(&tmp.path().join("sparse"), &keys, dim);
    let formats = [(RowFormat::Int8, 4u32), (RowFormat::Int4, 5), (RowFormat::Fp8, 6), (RowFormat::Float(FloatDtype::F16), 2)];
    for (format, code) in formats {
        let dir = tmp.path().join(format!("ps-{}", format.name()));
        let extreme = match format {
            RowFormat::Int4 => 6.0e4,  // float16 scale and bias
            RowFormat::Int8 => 1.0e38, // a finite range
            _ => 3.0e38,
        };
        let reference = |values: &[f32]| -> (Vec<u8>, Vec<f32>) {
            let mut q = vec![0u8; format.row_bytes(dim)];
            quantize_row(format, values, &mut q).unwrap();
            // SAFETY: q holds one row of dim values of `format`; c < dim.
            let v = (0..dim).map(|c| unsafe { value(format, q.as_ptr(), dim, c) }).collect();
            (q, v)
        };
        {
            let s = PersistentStore::open(&dir, false).unwrap();
            let t = s.table_stored_as("m/t", dim, format, Some(&tmp.path().join("sparse"))).unwrap();
            assert_eq!(t.format(), format);
            let new_rows = [vec![2.5f32; dim], (0..dim).map(|j| if j % 2 == 0 { extreme } else { -extreme }).collect::<Vec<_>>()];
            t.upsert(&[1000, 1001], &new_rows.concat()).unwrap();
            let r = t.upsert(&[2000, 2001], &[[1.0f32; 6], [1.0, 2.0, f32::INFINITY, 0.0, 0.0, 0.0]].concat());
            if format.is_quantized() {
                let m = r.unwrap_err().to_string();
                assert!(m.contains("rows") && m.contains("row 1") && m.contains("column 2"), "{m}");
                assert!(t.get_many(&[2000], &mut [0.0; 6], &mut [true]).unwrap() == (0, 1), "nothing of a refused batch is written");
            }
            let r = s.inner.env.read_txn().unwrap();
            let raw = t.inner.db.remap_types::<Bytes, Bytes>();
            for (k, values) in [1000u64, 1001].iter().zip(&new_rows) {
                assert_eq!(raw.get(&r, &k.to_be_bytes()).unwrap().unwrap(), &reference(values).0[..], "{format:?} key {k}");
            }
            let k0 = keys[0] as u64;
            let loaded: Vec<f32> = (0..dim).map(|j| val(k0, j)).collect();
            assert_eq!(raw.get(&r, &k0.to_be_bytes()).unwrap().unwrap(), &reference(&loaded).0[..]);
            let meta: heed::Database<Bytes, Bytes> = s.inner.env.open_database(&r, Some("strata.meta")).unwrap().unwrap();
            let mut record = vec![2, 0, 0, 0, 1, 0, 0, 0, dim as u8, 0, 0, 0, 0, 0, 0, 0];
            record.extend_from_slice(&code.to_le_bytes());
            record.extend_from_slice(&[0; 4]);
            assert_eq!(meta.get(&r, b"m/t").unwrap().unwrap(), &record[..]);
        }
        // Reopened (every handle gone) by a caller asking for float32: the recorded format.
        let s = PersistentStore::open(&dir, true).unwrap();
        let t = s.table("m/t", dim, None).unwrap();
        assert_eq!(t.format(), format);
        let all: Vec<u64> = keys.iter().map(|&k| k as u64).chain([1000, 1001]).collect();
        let (out, found) = read_all(&t, &all);
        assert!(found.iter().all(|&f| f));
        let mut stored = vec![0u8; all.len() * format.row_bytes(dim)];
        let mut again = vec![0f32; all.len() * dim];
        t.get_many_stored(&all, &mut again, Some(&mut stored), &mut vec![false; all.len()]).unwrap();
        for (i, &k) in all.iter().enumerate() {
            let values: Vec<f32> = match k {
                1000 => vec![2.5; dim],
                1001 => (0..dim).map(|j| if j % 2 == 0 { extreme } else { -extreme }).collect(),
                _ => (0..dim).map(|j| val(k, j)).collect(),
            };
            let (q, v) = reference(&values);
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out[i * dim..(i + 1) * dim]), bits(&v), "{format:?} key {k}");
            assert_eq!(&stored[i * q.len()..(i + 1) * q.len()], &q[..]);
        }
    }
    // A sparse folder with a value int8 cannot hold fails the load, naming the file and row.
    let bad = tmp.path().join("bad");
    write_sparse(&bad, &[1, 2, 3], 2);
    let mut vecs = std::fs::read(bad.join("emb_vector")).unwrap();
    vecs[12..16].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(bad.join("emb_vector"), vecs).unwrap();
    let s = PersistentStore::open(&tmp.path().join("ps-bad"), false).unwrap();
    let m = s.table_stored_as("m/t", 2, RowFormat::Int8, Some(&bad)).unwrap_err().to_string();
    assert!(m.contains("dir/emb_vector") && m.contains("row 1") && m.contains("int8"), "{m}");
    assert!(s.table_stored_as("m/odd", 3, RowFormat::Int4, None).unwrap_err().to_string().contains("even dim"));
}
