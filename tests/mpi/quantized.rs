//! Distributed tables that store their rows quantized (`opts->storage`), run by every rank under
//! mpirun. Quantization is per row, so a row is the same wherever it lives: every plain, pooled
//! and batched lookup must equal, bit for bit, a single-process table built with the same
//! storage from the same float rows (outputs poisoned first, stats compared too). The rows travel
//! quantized: the bytes a rank sends shrink by the row's size in the format.

use crate::cases::{
    Ctx, all_fail, dist, look, open_both, open_dist, plain_as_reference, random_values, reference, same_as_reference, shared_dir,
    split_owners, write_folder,
};
use crate::common::*;
use crate::desc::Split;
use crate::pooled::{Bags, Out, batch, plain_req, pooled, pooled_req};
use mpi::traits::CommunicatorCollectives;
use std::ptr::null_mut;

/// The quantized storages, each with the dtype its source rows come in and a seed.
const STORAGES: [(strata_storage, &str, dlpark::ffi::DLDataType, u64); 3] = [
    (strata_storage::STRATA_STORAGE_INT8, "int8", F32, 61),
    (strata_storage::STRATA_STORAGE_INT4, "int4", F16, 62),
    (strata_storage::STRATA_STORAGE_FP8, "fp8", BF16, 63),
];

fn stored(storage: strata_storage, default_value: f32) -> TableOptions {
    TableOptions { storage: storage as i32, default_value, ..TableOptions::default() }
}

/// Pooled lookups of random bags (every pooling, weighted or not, ragged and fixed, every out
/// dtype, compact and strided outs, misses) on `t` and on the reference `r`: the same bytes and
/// stats.
fn pooled_as_reference(t: &Owned, r: &Owned, rows: usize, dim: usize, rng: &mut Rng, what: &str) {
    let mut call = 0;
    for pooling in [1, 2, 3] {
        for weighted in [false, true] {
            for kdt in [I64, U32] {
                call += 1;
                let (odt, strided) = ([F32, F16, BF16][call % 3], call % 2 == 0);
                let b = rng.below(12) as usize;
                let hot = rng.below(5) as usize;
                let bags = if call % 3 == 1 { Bags::fixed(rng, b, hot, rows) } else { Bags::ragged(rng, b, 8, rows) };
                let x = bags.tensors(kdt, I64);
                let (mut o1, mut o2) = (Out::new(bags.b, dim, odt, strided), Out::new(bags.b, dim, odt, strided));
                let (mut s1, mut s2) = (LookupStats::default(), LookupStats::default());
                ok(pooled(t, &x, weighted, pooling, &mut o1, &mut s1));
                ok(pooled(r, &x, weighted, pooling, &mut o2, &mut s2));
                let what = format!("{what}: pooling {pooling}, weighted {weighted}, keys {kdt:?}, out {odt:?} strided {strided}");
                assert_eq!(o1.bytes(), o2.bytes(), "{what}");
                assert_eq!((s1.hits, s1.misses), (s2.hits, s2.misses), "{what}: stats");
                assert_eq!(s1.hits + s1.misses, bags.keys.len() as u64, "{what}: stats count keys");
            }
        }
    }
}

/// Dense tables split 7/7/7/6 over the ranks (several partitions on one rank where there are
/// fewer ranks than partitions), stored as int8, int4 and fp8 from float32, float16 and bfloat16
/// rows: plain lookups (every key and out dtype, misses, a large call) and pooled lookups equal
/// the single-process table's, bit for bit; the table reports its format and this rank's bytes.
pub fn dense_quantized(cx: &Ctx) {
    let (rows, dim) = (27usize, 6usize);
    for (storage, name, sdt, seed) in STORAGES {
        let opts = stored(storage, 0.75);
        let global = random_values(sdt, rows * dim, seed);
        let mut d = Split::new(&global, sdt, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
        let t = dist(d.c(), cx, &opts);
        let r = reference(&global, sdt, rows, dim, &opts);
        let (mut info, mut rinfo) = (strata_table_info_default_0_3_1(), strata_table_info_default_0_3_1());
        // SAFETY: t.0 and r.0 are the tables built above (Owned); info and rinfo are references.
        ok(unsafe { strata_table_get_info(t.0, &mut info) });
        // SAFETY: as above.
        ok(unsafe { strata_table_get_info(r.0, &mut rinfo) });
        let mine: u64 = [7u64, 7, 7, 6].iter().enumerate().filter(|(p, _)| *p as i32 % cx.size == cx.rank).map(|(_, n)| n).sum();
        assert_eq!((info.dtype.code, info.dtype.bits), (rinfo.dtype.code, rinfo.dtype.bits), "{name}: stored as uint8 rows");
        assert_eq!(info.vector_bytes, mine * rinfo.vector_bytes / rows as u64, "{name}: this rank's share");
        let mut rng = Rng(700 + 13 * cx.rank as u64 + seed);
        plain_as_reference(cx, &t, &r, dim, &mut rng);
        pooled_as_reference(&t, &r, rows, dim, &mut rng, name);
        // many keys: the rows are served, and pooled, on several threads
        let bags = Bags::ragged(&mut rng, 3000, 14, rows);
        let x = bags.tensors(I64, I64);
        let (mut o1, mut o2) = (Out::new(bags.b, dim, F32, false), Out::new(bags.b, dim, F32, false));
        let (mut s1, mut s2) = (LookupStats::default(), LookupStats::default());
        ok(pooled(&t, &x, true, 2, &mut o1, &mut s1));
        ok(pooled(&r, &x, true, 2, &mut o2, &mut s2));
        assert_eq!(o1.bytes(), o2.bytes(), "{name}: {} keys", bags.keys.len());
        assert_eq!((s1.hits, s1.misses), (s2.hits, s2.misses));
        // a quantized distributed table has no array view
        let mut p = null_mut();
        // SAFETY: t.0 is the table built above (Owned); p is a reference.
        let s = unsafe { strata_table_partitioned(t.0, &mut p) };
        fails(s, Status::STRATA_INVALID_ARGUMENT, &[&format!("table: stores {name} rows, which has no __partitioned__ view")]);
    }
}

/// A batch of plain and pooled requests on quantized distributed tables (and a float one)
/// equals the same requests on the single-process tables, bit for bit, with the same stats.
pub fn batch_quantized(cx: &Ctx) {
    let (rows, dim) = (40usize, 8usize);
    let counts: Vec<i64> =
        (0..cx.size as i64).map(|p| rows as i64 / cx.size as i64 + i64::from(p < rows as i64 % cx.size as i64)).collect();
    let g8 = random_values(F32, rows * dim, 71);
    let g4 = random_values(F32, rows * dim, 72);
    let int8 = stored(strata_storage::STRATA_STORAGE_INT8, -1.0);
    let int4 = stored(strata_storage::STRATA_STORAGE_INT4, 0.5);
    let mut s8 = Split::new(&g8, F32, dim, &counts, &split_owners(cx.size as usize, cx.size), cx.rank);
    let mut s4 = Split::new(&g4, F32, dim, &[10, 30], &split_owners(2, cx.size), cx.rank);
    let (d8, d4, d32) = (dist(s8.c(), cx, &int8), dist(s4.c(), cx, &int4), dist(s8.c(), cx, &TableOptions::default()));
    let (r8, r4, r32) = (
        reference(&g8, F32, rows, dim, &int8),
        reference(&g4, F32, rows, dim, &int4),
        reference(&g8, F32, rows, dim, &TableOptions::default()),
    );
    let mut rng = Rng(7000 + cx.rank as u64);
    for round in 0..3 {
        let copy = |b: &Bags| Bags { keys: b.keys.clone(), offsets: b.offsets.clone(), b: b.b, weights: b.weights.clone() };
        let m = rng.below(50) as i64;
        let k1: Vec<i64> = (0..m).map(|_| rng.below(rows as u64 + 4) as i64).collect();
        let n = rng.below(9) as usize;
        let b2 = Bags::ragged(&mut rng, n, 6, rows);
        let n3 = rng.below(6) as usize;
        let b3 = Bags::fixed(&mut rng, n3, 3, rows);
        let m4 = 1 + rng.below(20) as i64;
        let k4: Vec<i64> = (0..2 * m4).map(|_| rng.below(rows as u64 + 4) as i64).collect();
        let b5 = Bags::ragged(&mut rng, 5, 4, rows);
        let mut both = [[&d8, &d4, &d32], [&r8, &r4, &r32]].map(|[t8, t4, t32]| {
            vec![
                plain_req(t8, dim, k1.clone(), I64, &[m], F32, false, true),
                pooled_req(t8, dim, 1, true, copy(&b2), I64, I32, F16, false),
                pooled_req(t4, dim, 2, false, copy(&b3), U32, I64, F32, true),
                plain_req(t4, dim, k4.clone(), I32, &[2, m4], BF16, true, true),
                pooled_req(t32, dim, 3, true, copy(&b5), I64, I64, F32, false),
            ]
        });
        let [dreqs, rreqs] = &mut both;
        let (s, outs, stats) = batch(dreqs);
        ok(s);
        for (i, ((o, st), rr)) in outs.iter().zip(&stats).zip(rreqs.iter()).enumerate() {
            let mut want = rr.out();
            let mut wst = LookupStats::default();
            ok(rr.alone(&mut want, &mut wst));
            assert_eq!(o.bytes(), want.bytes(), "round {round}: requests[{i}] differs from the single-process table");
            assert_eq!((st.hits, st.misses), (wst.hits, wst.misses), "round {round}: requests[{i}] stats");
        }
    }
}

/// The same keys on a float32 and an int8 table of the same rows: each rank sends the same keys
/// and serves the same rows, but an int8 row travels as `dim + 8` bytes instead of `4 * dim`
/// (the distributed timing's `bytes_sent`); the int8 rows are the reference's.
pub fn fewer_bytes_on_the_wire(cx: &Ctx) {
    let dim = 64usize;
    let rows = 50 * cx.size as usize;
    let global = random_values(F32, rows * dim, 81);
    let counts = vec![50i64; cx.size as usize];
    let mut d = Split::new(&global, F32, dim, &counts, &split_owners(cx.size as usize, cx.size), cx.rank);
    let int8 = stored(strata_storage::STRATA_STORAGE_INT8, 0.0);
    let (t32, t8) = (dist(d.c(), cx, &TableOptions::default()), dist(d.c(), cx, &int8));
    let r8 = reference(&global, F32, rows, dim, &int8);
    // SAFETY: the handles are the live tables built above (Owned), borrowed only for this call.
    let timing = |t: &Owned| unsafe { &*t.0 }.table().dist_timing().expect("a distributed table");
    let mut rng = Rng(800 + cx.rank as u64);
    let keys: Vec<i64> = (0..1000).map(|_| rng.below(rows as u64) as i64).collect();
    let mut sent = Vec::new();
    for t in [&t32, &t8] {
        let before = timing(t);
        let (s, _, _) = look(t, &keys, I64, &[1000], F32, dim);
        ok(s);
        let after = timing(t);
        sent.push((after.keys_sent - before.keys_sent, after.keys_served - before.keys_served, after.bytes_sent - before.bytes_sent));
    }
    let [(k32, v32, b32), (k8, v8, b8)] = [sent[0], sent[1]];
    assert_eq!((k32, v32), (k8, v8), "the same keys travel");
    assert_eq!(b32, k32 * 8 + v32 * 4 * dim as u64, "float32 rows: 4 * dim bytes each");
    assert_eq!(b8, k8 * 8 + v8 * (dim as u64 + 8), "int8 rows: dim + 8 bytes each");
    if cx.size > 1 {
        assert!(v8 > 0 && b8 * 10 < b32 * 4, "int8 sends {b8} bytes, float32 {b32}: under 0.4 of them");
    }
    same_as_reference(&t8, &r8, &keys, I64, &[1000], F32, dim);
}

/// A HugeCTR folder opened over the ranks (keys hashed to owners) as int8: plain and pooled
/// lookups with absent keys (found flags travel) equal `strata_table_open` with the same storage.
pub fn hugectr_quantized(cx: &Ctx) {
    let (rows, dim) = (600, 8);
    let dir = shared_dir(cx, "quantized");
    let mut rng = Rng(91);
    let (keys, vectors) = random_table(&mut rng, rows, dim);
    if cx.rank == 0 {
        write_folder(&dir, &keys, &vectors);
    }
    cx.world.barrier();
    for (storage, _, _, _) in STORAGES {
        let (t, r) = open_both(cx, &dir, dim as i64, &stored(storage, -2.0));
        let mut rng = Rng(900 + cx.rank as u64);
        let q: Vec<i64> =
            (0..400).map(|_| if rng.below(5) == 0 { rng.next() as i64 } else { keys[rng.below(rows as u64) as usize] }).collect();
        same_as_reference(&t, &r, &q, I64, &[20, 20], F32, dim);
        same_as_reference(&t, &r, &q, U64, &[400], BF16, dim);
        let mut offsets = vec![0i64];
        while *offsets.last().unwrap() < q.len() as i64 {
            offsets.push((offsets.last().unwrap() + rng.below(7) as i64).min(q.len() as i64));
        }
        let bags =
            Bags { keys: q.clone(), b: offsets.len() - 1, weights: (0..q.len()).map(|_| rng.f32()).collect(), offsets: Some(offsets) };
        let x = bags.tensors(I64, I64);
        for pooling in [1, 2, 3] {
            let (mut o1, mut o2) = (Out::new(bags.b, dim, F32, false), Out::new(bags.b, dim, F32, false));
            let (mut s1, mut s2) = (LookupStats::default(), LookupStats::default());
            ok(pooled(&t, &x, true, pooling, &mut o1, &mut s1));
            ok(pooled(&r, &x, true, pooling, &mut o2, &mut s2));
            assert_eq!(o1.bytes(), o2.bytes(), "pooling {pooling}");
            assert_eq!((s1.hits, s1.misses), (s2.hits, s2.misses));
        }
    }
    if cx.size > 1 {
        let l = cx.last();
        let mine = stored(if cx.rank == l { strata_storage::STRATA_STORAGE_FP8 } else { strata_storage::STRATA_STORAGE_INT8 }, -2.0);
        let (s, t) = open_dist(cx, &dir, dim as i64, &mine);
        let want = format!("dir: storage int8 on rank 0 but fp8 on rank {l}; expected the same folder, dim and options on every rank");
        all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, None, &[&want]);
        assert!(t.is_null());
    }
    cx.world.barrier();
    if cx.rank == 0 {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Under `STRATA_MISSING_ERROR` a missing key in one rank's bags of a quantized table fails every
/// rank with nothing written; a storage that differs between ranks, or that a rank cannot hold,
/// fails the build on every rank.
pub fn quantized_errors(cx: &Ctx) {
    let (rows, dim) = (27usize, 4usize);
    let l = cx.last();
    let global = random_values(F32, rows * dim, 95);
    let strict = TableOptions { missing_key: 1, ..stored(strata_storage::STRATA_STORAGE_INT8, 0.0) };
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let t = dist(d.c(), cx, &strict);
    let mut keys: Vec<i64> = (0..8).map(|i| (i * 3 + cx.rank as i64) % rows as i64).collect();
    if cx.rank == l {
        keys[5] = 99;
    }
    let bags = Bags { keys, offsets: Some(vec![0, 3, 8]), b: 2, weights: vec![1.0; 8] };
    let x = bags.tensors(I64, I64);
    let mut o = Out::new(2, dim, F32, false);
    let mut st = LookupStats::default();
    let s = pooled(&t, &x, true, 1, &mut o, &mut st);
    all_fail(cx, s, Status::STRATA_KEY_NOT_FOUND, Some(l), &["keys: key 99 (element 5) is not in the table"]);
    o.untouched("a missing key under STRATA_MISSING_ERROR");
    let (s, _, _) = look(&t, &bags.keys, I64, &[8], F32, dim);
    all_fail(cx, s, Status::STRATA_KEY_NOT_FOUND, Some(l), &["keys: key 99 (element 5) is not in the table"]);
    drop(t);
    if cx.size > 1 {
        let mine =
            if cx.rank == l { stored(strata_storage::STRATA_STORAGE_INT4, 0.0) } else { stored(strata_storage::STRATA_STORAGE_INT8, 0.0) };
        let mut t = null_mut();
        // SAFETY: d.c() points at a description of arrays d and global own, alive past the call;
        // cx.fint is the world's Fortran handle; mine and t are references.
        let s = unsafe { strata_table_from_partitioned(d.c(), &cx.fint, &mine, &mut t) };
        all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, None, &[&format!("opts: storage int8 on rank 0 but int4 on rank {l}")]);
        assert!(t.is_null());
    }
    // int4 needs an even dim: a rank that cannot build its share fails every rank
    let odd = random_values(F32, 20 * 5, 96);
    let mut d = Split::new(&odd, F32, 5, &[10, 10], &split_owners(2, cx.size), cx.rank);
    let mut t = null_mut();
    let int4 = stored(strata_storage::STRATA_STORAGE_INT4, 0.0);
    // SAFETY: as above.
    let s = unsafe { strata_table_from_partitioned(d.c(), &cx.fint, &int4, &mut t) };
    let msg = fails(s, Status::STRATA_INVALID_ARGUMENT, &["dim = 5; int4 rows hold two values a byte"]);
    if cx.rank >= 2 {
        assert!(msg.starts_with("rank 0 failed the collective call: "), "rank {}: {msg}", cx.rank);
    }
    assert!(t.is_null());
}
