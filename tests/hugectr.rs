//! Tables opened from HugeCTR sparse folders (`key` + `emb_vector`): memory-mapped lookups
//! against the written values, and every malformed folder with its status and message.

mod common;
use common::*;
use std::ffi::CString;
use std::path::Path;
use std::ptr::null;

fn write_table(dir: &Path, keys: &[i64], vectors: &[f32]) {
    let kb: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
    let vb: Vec<u8> = vectors.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("key"), kb).unwrap();
    std::fs::write(dir.join("emb_vector"), vb).unwrap();
}

fn open(dir: &Path, dim: i64, opts: &TableOptions) -> (Status, *mut Table) {
    let c = CString::new(dir.to_str().unwrap()).unwrap();
    let mut t = std::ptr::dangling_mut::<Table>();
    // SAFETY: c is a NUL-terminated path, alive past the call (strata only reads it during it);
    // opts and t are references.
    let s = unsafe { strata_table_open(c.as_ptr(), dim, opts, &mut t) };
    (s, t)
}

#[test]
fn opens_and_looks_up_like_the_files_say() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(21);
    let (rows, dim) = (3000usize, 24usize);
    let (keys, vectors) = random_table(&mut rng, rows, dim);
    write_table(dir.path(), &keys, &vectors);
    let opts = TableOptions { default_value: -3.0, ..TableOptions::default() };
    let (s, t) = open(dir.path(), dim as i64, &opts);
    ok(s);
    let t = Owned(t);
    let mut info = strata_table_info_default_0_3_1();
    // SAFETY: t is the table opened above (Owned); info is a reference.
    ok(unsafe { strata_table_get_info(t.0, &mut info) });
    assert_eq!((info.rows, info.dim, info.keyed, info.mapped), (rows as i64, dim as i64, true, true));
    assert!((info.index_bytes as f64) / (rows as f64) <= 16.0, "{} bytes per key", info.index_bytes as f64 / rows as f64);

    let q: Vec<i64> = (0..5000).map(|i| if i % 7 == 0 { i as i64 * 13 + 1 } else { keys[rng.below(rows as u64) as usize] }).collect();
    let mut out = vec![f32::NAN; q.len() * dim];
    let k = Desc::compact(q.as_ptr().cast(), I64, &[q.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[q.len() as i64, dim as i64]);
    let mut st = LookupStats::default();
    // SAFETY: t is live; k and o describe q and out (5000 keys, 5000 x dim floats), alive past the
    // call; st is a reference.
    ok(unsafe { strata_lookup(t.0, &k.t, &mut o.t, null(), &mut st) });
    let index: std::collections::HashMap<i64, usize> = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    let mut misses = 0;
    for (i, key) in q.iter().enumerate() {
        let want: Vec<f32> = match index.get(key) {
            Some(&r) => vectors[r * dim..(r + 1) * dim].to_vec(),
            None => {
                misses += 1;
                vec![-3.0; dim]
            }
        };
        assert_eq!(&out[i * dim..(i + 1) * dim], &want[..], "key {key}");
    }
    assert_eq!((st.hits, st.misses), (q.len() as u64 - misses, misses));
}

#[test]
fn empty_files_make_an_empty_table() {
    let dir = tempfile::tempdir().unwrap();
    write_table(dir.path(), &[], &[]);
    let (s, t) = open(dir.path(), 8, &TableOptions::default());
    ok(s);
    // SAFETY: t is the table just opened (the status was checked), not freed yet.
    assert_eq!(unsafe { strata_table_len(t) }, 0);
    // SAFETY: t is the table just opened (the status was checked), not freed yet.
    assert_eq!(unsafe { strata_table_dim(t) }, 8);
    // SAFETY: t is the table opened above, freed once here and not used after.
    unsafe { strata_table_free(t) };
}

#[test]
fn malformed_folders() {
    let d = TableOptions::default();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();

    let (s, t) = open(&p.join("nope"), 4, &d);
    fails(s, Status::STRATA_IO_ERROR, &["dir: ", "nope/key", "No such file"]);
    assert!(t.is_null());

    write_table(p, &[1, 2, 3], &[0.0; 12]);
    std::fs::remove_file(p.join("emb_vector")).unwrap();
    let (s, _) = open(p, 4, &d);
    fails(s, Status::STRATA_IO_ERROR, &["emb_vector"]);

    // truncated key file
    write_table(p, &[1, 2, 3], &[0.0; 12]);
    let kb = std::fs::read(p.join("key")).unwrap();
    std::fs::write(p.join("key"), &kb[..kb.len() - 3]).unwrap();
    let (s, _) = open(p, 4, &d);
    fails(s, Status::STRATA_INVALID_FILE, &["21 bytes is not a whole number of int64 keys"]);

    // dim does not divide emb_vector
    write_table(p, &[1, 2, 3], &[0.0; 12]);
    let (s, _) = open(p, 5, &d);
    fails(s, Status::STRATA_INVALID_FILE, &["dim: 5 does not divide", "48 bytes"]);

    // truncated emb_vector (one row short) and row-count mismatch
    write_table(p, &[1, 2, 3], &[0.0; 8]);
    let (s, _) = open(p, 4, &d);
    fails(s, Status::STRATA_INVALID_FILE, &["holds 3 keys but", "holds 2 rows of dim 4"]);
    write_table(p, &[1, 2, 3], &[0.0; 12]);
    let (s, _) = open(p, 2, &d);
    fails(s, Status::STRATA_INVALID_FILE, &["holds 3 keys but", "holds 6 rows of dim 2"]);

    // bad dim, duplicate keys, bad options
    for dim in [0, -4] {
        let (s, _) = open(p, dim, &d);
        fails(s, Status::STRATA_INVALID_ARGUMENT, &["dim: ", "expected 1 <= dim <= 16777216"]);
    }
    write_table(p, &[1, -2, 1], &[0.0; 12]);
    let (s, _) = open(p, 4, &d);
    fails(s, Status::STRATA_DUPLICATE_KEY, &["dir/key: key 1 appears at rows 0 and 2"]);
    let bad = TableOptions { missing_key: -1, ..TableOptions::default() };
    let (s, _) = open(p, 4, &bad);
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["opts->missing_key: -1"]);

    // a folder path that is a file
    let (s, _) = open(&p.join("key"), 4, &d);
    fails(s, Status::STRATA_IO_ERROR, &["key/key"]);
}
