//! Pooled and batched lookups through the C ABI (`strata_lookup_pooled`, `strata_lookup_batch`),
//! checked against a plain reference loop: random tables, keys, offsets and weights, outputs
//! poisoned first, every pooling, weighted and unweighted, ragged (with empty bags) and fixed
//! hotness, every key, offset and out dtype, strided outputs, misses, and every bad input.

mod common;
use common::*;
use dlpark::ffi::DLDataType;
use std::ptr::{null, null_mut};

const POISON: u8 = 0xA7;
const POOLINGS: [(i32, &str); 3] = [(1, "sum"), (2, "mean"), (3, "sqrtn")];

/// A keyed f32 table of `rows` x `dim` with default value `default`.
struct Fixture {
    keys: Vec<i64>,
    vectors: Vec<f32>,
    dim: usize,
    default: f32,
    table: Owned,
}

impl Fixture {
    fn new(rng: &mut Rng, rows: usize, dim: usize, default: f32, missing_error: bool) -> Fixture {
        let (keys, vectors) = random_table(rng, rows, dim);
        let mut o = strata_table_options_default_0_3_1();
        o.default_value = default;
        o.missing_key = missing_error as i32;
        let table = Owned::build(&vectors, rows, dim, Some(&keys), &o);
        Fixture { keys, vectors, dim, default, table }
    }

    fn row(&self, key: i64) -> Option<&[f32]> {
        self.keys.iter().position(|&k| k == key).map(|r| &self.vectors[r * self.dim..(r + 1) * self.dim])
    }

    /// The reference: float32 accumulation in key order, as the contract says.
    fn expected(&self, keys: &[i64], bags: &[(usize, usize)], weights: Option<&[f32]>, pooling: i32) -> (Vec<f32>, u64) {
        pool_reference(|k| self.row(k), self.default, self.dim, keys, bags, weights, pooling)
    }

    /// Random keys: mostly the table's, some missing.
    fn draw_keys(&self, rng: &mut Rng, n: usize) -> Vec<i64> {
        (0..n)
            .map(|_| {
                if rng.below(10) == 0 {
                    1_000_000_007 + rng.below(1000) as i64
                } else {
                    self.keys[rng.below(self.keys.len() as u64) as usize]
                }
            })
            .collect()
    }
}

/// Ragged bags (some empty) over `nnz` keys: offsets and (lo, hi) pairs.
fn ragged(rng: &mut Rng, bags: usize, max: u64) -> (Vec<i64>, Vec<(usize, usize)>) {
    let mut offsets = vec![0i64];
    let mut pairs = Vec::new();
    for _ in 0..bags {
        let lo = *offsets.last().unwrap() as usize;
        let len = if rng.below(5) == 0 { 0 } else { rng.below(max) as usize + 1 };
        offsets.push((lo + len) as i64);
        pairs.push((lo, lo + len));
    }
    (offsets, pairs)
}

/// Keys of `dtype` (compact, as bytes).
fn key_bytes(keys: &[i64], dtype: DLDataType) -> Vec<u8> {
    let size = elem_size(dtype);
    let mut b = vec![0u8; keys.len() * size];
    for (i, &k) in keys.iter().enumerate() {
        write_key(dtype, &mut b[i * size..], k);
    }
    b
}

/// Offsets as int32 or int64 bytes.
fn offset_bytes(offsets: &[i64], dtype: DLDataType) -> Vec<u8> {
    key_bytes(offsets, dtype)
}

/// An out buffer [B, dim] of `dtype` with row stride `row_stride` (elements) and column stride
/// `col`, poisoned; returns the buffer and its description.
fn out_buffer(b: usize, dim: usize, dtype: DLDataType, row_stride: usize, col: usize) -> (Vec<u8>, Desc) {
    let size = elem_size(dtype);
    let len = (b.max(1) * row_stride + dim * col) * size;
    let buf = vec![POISON; len];
    let d = Desc::new(buf.as_ptr(), dtype, &[b as i64, dim as i64], &[row_stride as i64, col as i64], 0);
    (buf, d)
}

/// Checks `out` against `want` (rounded to out's dtype), and that no other byte changed.
#[track_caller]
fn check_out(buf: &[u8], d: &Desc, dtype: DLDataType, want: &[f32], dim: usize, what: &str) {
    let size = elem_size(dtype);
    let (b, rs, cs) = (d.shape[0] as usize, d.strides[0] as usize, d.strides[1] as usize);
    let mut touched = vec![false; buf.len()];
    for r in 0..b {
        for c in 0..dim {
            let at = (r * rs + c * cs) * size;
            let got = read_float(dtype, &buf[at..]);
            let exp = round_to(dtype, want[r * dim + c]);
            assert!(got == exp || (got - exp).abs() <= 1e-6 * exp.abs().max(1.0), "{what}: bag {r} col {c}: got {got}, want {exp}");
            touched[at..at + size].iter_mut().for_each(|t| *t = true);
        }
    }
    for (i, (&byte, &t)) in buf.iter().zip(&touched).enumerate() {
        assert!(t || byte == POISON, "{what}: byte {i} outside out's elements was written");
    }
}

fn pooled(
    t: &Owned,
    keys: &Desc,
    offsets: Option<&Desc>,
    weights: Option<&Desc>,
    pooling: i32,
    out: &mut Desc,
    stats: Option<&mut LookupStats>,
) -> Status {
    // SAFETY: every description covers a live buffer of this test; the table is live.
    unsafe {
        strata_lookup_pooled(
            t.0,
            &keys.t,
            offsets.map_or(null(), |o| &o.t),
            weights.map_or(null(), |w| &w.t),
            pooling,
            &mut out.t,
            null(),
            stats.map_or(null_mut(), |s| s),
        )
    }
}

#[test]
fn ragged_bags_every_pooling_weighted_or_not_every_dtype() {
    let mut rng = Rng(17);
    let fx = Fixture::new(&mut rng, 500, 12, 0.25, false);
    for (kd, od, offd) in [(I64, F32, I64), (I32, F16, I32), (U64, BF16, I64), (U32, F32, I32)] {
        for (pooling, name) in POOLINGS {
            for weighted in [false, true] {
                let (offsets, bags) = ragged(&mut rng, 40, 9);
                let nnz = *offsets.last().unwrap() as usize;
                let keys: Vec<i64> =
                    fx.draw_keys(&mut rng, nnz).into_iter().map(|k| if kd == U32 || kd == I32 { k & 0x3fff_ffff } else { k }).collect();
                let weights: Vec<f32> = (0..nnz).map(|_| rng.f32() * 2.0 - 0.5).collect();
                let kb = key_bytes(&keys, kd);
                let ob = offset_bytes(&offsets, offd);
                let kdesc = Desc::compact(kb.as_ptr(), kd, &[nnz as i64]);
                let odesc = Desc::compact(ob.as_ptr(), offd, &[offsets.len() as i64]);
                let wdesc = Desc::compact(weights.as_ptr().cast(), F32, &[nnz as i64]);
                let (buf, mut out) = out_buffer(bags.len(), fx.dim, od, fx.dim, 1);
                let mut stats = LookupStats { hits: 77, ..strata_lookup_stats_default() };
                ok(pooled(&fx.table, &kdesc, Some(&odesc), weighted.then_some(&wdesc), pooling, &mut out, Some(&mut stats)));
                let (want, misses) = fx.expected(&keys, &bags, weighted.then_some(&weights[..]), pooling);
                check_out(&buf, &out, od, &want, fx.dim, &format!("{name} weighted={weighted} keys {kd:?} out {od:?}"));
                assert_eq!((stats.hits, stats.misses), (nnz as u64 - misses, misses), "stats count keys");
            }
        }
    }
}

#[test]
fn fixed_hotness_strided_keys_and_out() {
    let mut rng = Rng(5);
    let fx = Fixture::new(&mut rng, 300, 7, -1.0, false);
    let (b, l) = (25usize, 6usize);
    // Keys [B, L] taken from every other column of a [B, 2L] buffer; out with padded rows and a
    // column stride of 2.
    let all = fx.draw_keys(&mut rng, b * 2 * l);
    let keys: Vec<i64> = (0..b * l).map(|i| all[(i / l) * 2 * l + (i % l) * 2]).collect();
    let kdesc = Desc::new(all.as_ptr().cast(), I64, &[b as i64, l as i64], &[2 * l as i64, 2], 0);
    let weights: Vec<f32> = (0..b * l).map(|_| rng.f32()).collect();
    let wdesc = Desc::compact(weights.as_ptr().cast(), F32, &[b as i64, l as i64]);
    let bags: Vec<(usize, usize)> = (0..b).map(|i| (i * l, (i + 1) * l)).collect();
    for (pooling, name) in POOLINGS {
        let (buf, mut out) = out_buffer(b, fx.dim, F32, 2 * fx.dim + 3, 2);
        ok(pooled(&fx.table, &kdesc, None, Some(&wdesc), pooling, &mut out, None));
        let (want, _) = fx.expected(&keys, &bags, Some(&weights), pooling);
        check_out(&buf, &out, F32, &want, fx.dim, name);
    }
}

#[test]
fn empty_bags_and_zero_weight_totals_give_zeros() {
    let mut rng = Rng(9);
    let fx = Fixture::new(&mut rng, 50, 4, 3.0, false);
    let keys = [fx.keys[0], fx.keys[1], fx.keys[2]];
    let offsets = [0i64, 0, 2, 2, 3];
    let weights = [1.0f32, -1.0, 0.0];
    let kdesc = Desc::compact(keys.as_ptr().cast(), I64, &[3]);
    let odesc = Desc::compact(offsets.as_ptr().cast(), I64, &[5]);
    let wdesc = Desc::compact(weights.as_ptr().cast(), F32, &[3]);
    let (buf, mut out) = out_buffer(4, 4, F32, 4, 1);
    ok(pooled(&fx.table, &kdesc, Some(&odesc), Some(&wdesc), 2, &mut out, None));
    let got: Vec<f32> = (0..16).map(|i| read_float(F32, &buf[i * 4..])).collect();
    assert!(got[..4].iter().all(|&x| x == 0.0), "an empty bag's mean is zeros: {got:?}");
    assert!(got[4..8].iter().all(|&x| x == 0.0), "a zero weight total's mean is zeros: {got:?}");
    assert!(got[8..12].iter().all(|&x| x == 0.0), "an empty bag: {got:?}");
    assert!(got[12..].iter().all(|&x| x == 0.0), "weight 0 only: the mean divides by 0, so zeros: {got:?}");
    // Zero bags: a valid no-op.
    let empty = [0i64];
    let edesc = Desc::compact(empty.as_ptr().cast(), I64, &[1]);
    let nkeys = Desc::compact(keys.as_ptr().cast(), I64, &[0]);
    let (_buf, mut out0) = out_buffer(0, 4, F32, 4, 1);
    ok(pooled(&fx.table, &nkeys, Some(&edesc), None, 1, &mut out0, None));
}

#[test]
fn a_missing_key_under_missing_error_fails_the_call() {
    let mut rng = Rng(3);
    let fx = Fixture::new(&mut rng, 40, 3, 0.0, true);
    let keys = [fx.keys[0], 424242, fx.keys[1]];
    let offsets = [0i64, 2, 3];
    let kdesc = Desc::compact(keys.as_ptr().cast(), I64, &[3]);
    let odesc = Desc::compact(offsets.as_ptr().cast(), I64, &[3]);
    let (_buf, mut out) = out_buffer(2, 3, F32, 3, 1);
    fails(pooled(&fx.table, &kdesc, Some(&odesc), None, 1, &mut out, None), Status::STRATA_KEY_NOT_FOUND, &["key 424242", "element 1"]);
}

#[test]
fn every_bad_input_is_named() {
    let mut rng = Rng(1);
    let fx = Fixture::new(&mut rng, 40, 3, 0.0, false);
    let keys: Vec<i64> = fx.keys[..6].to_vec();
    let kdesc = Desc::compact(keys.as_ptr().cast(), I64, &[6]);
    let k2 = Desc::compact(keys.as_ptr().cast(), I64, &[2, 3]);
    let (_buf, mut out) = out_buffer(2, 3, F32, 3, 1);
    let off = |v: &[i64]| (v.to_vec(), Desc::compact(std::ptr::null(), I64, &[v.len() as i64]));
    let case = |offsets: &[i64], want: Status, needles: &[&str]| {
        let (v, mut d) = off(offsets);
        d.t.data = v.as_ptr() as *mut _;
        let (_buf, mut out) = out_buffer(offsets.len().saturating_sub(1), 3, F32, 3, 1);
        fails(pooled(&fx.table, &kdesc, Some(&d), None, 1, &mut out, None), want, needles);
    };
    case(&[1, 3, 6], Status::STRATA_INVALID_ARGUMENT, &["offsets: offsets[0] = 1; expected 0"]);
    case(&[0, 4, 3, 6], Status::STRATA_INVALID_ARGUMENT, &["offsets: offsets[2] = 3 is less than offsets[1] = 4"]);
    case(&[0, 3, 5], Status::STRATA_INVALID_ARGUMENT, &["offsets: offsets[2] = 5; expected nnz = 6"]);
    case(&[], Status::STRATA_INVALID_ARGUMENT, &["offsets: shape [0]"]);
    let fo = [0f32, 3.0, 6.0];
    let fdesc = Desc::compact(fo.as_ptr().cast(), F32, &[3]);
    fails(
        pooled(&fx.table, &kdesc, Some(&fdesc), None, 1, &mut out, None),
        Status::STRATA_UNSUPPORTED_DTYPE,
        &["offsets: dtype float32; expected int32 or int64"],
    );
    let good = [0i64, 3, 6];
    let gdesc = Desc::compact(good.as_ptr().cast(), I64, &[3]);
    let w5 = [1f32; 5];
    let wdesc = Desc::compact(w5.as_ptr().cast(), F32, &[5]);
    fails(
        pooled(&fx.table, &kdesc, Some(&gdesc), Some(&wdesc), 1, &mut out, None),
        Status::STRATA_INVALID_ARGUMENT,
        &["weights: shape [5]; expected the keys' shape [6]"],
    );
    let wi = [1i32; 6];
    let widesc = Desc::compact(wi.as_ptr().cast(), I32, &[6]);
    fails(
        pooled(&fx.table, &kdesc, Some(&gdesc), Some(&widesc), 1, &mut out, None),
        Status::STRATA_UNSUPPORTED_DTYPE,
        &["weights: dtype int32; expected float32"],
    );
    for p in [0, 4, -1] {
        fails(pooled(&fx.table, &kdesc, Some(&gdesc), None, p, &mut out, None), Status::STRATA_INVALID_ARGUMENT, &["pooling: "]);
    }
    fails(
        pooled(&fx.table, &kdesc, None, None, 1, &mut out, None),
        Status::STRATA_INVALID_ARGUMENT,
        &["offsets: is NULL but keys are 1-D"],
    );
    fails(
        pooled(&fx.table, &k2, Some(&gdesc), None, 1, &mut out, None),
        Status::STRATA_INVALID_ARGUMENT,
        &["offsets: given with 2-D keys"],
    );
    let (_buf, mut out3) = out_buffer(3, 3, F32, 3, 1);
    fails(
        pooled(&fx.table, &kdesc, Some(&gdesc), None, 1, &mut out3, None),
        Status::STRATA_INVALID_ARGUMENT,
        &["out: shape [3, 3]; expected [B, dim] = [2, 3]"],
    );
    let (_buf, mut outd) = out_buffer(2, 4, F32, 4, 1);
    fails(
        pooled(&fx.table, &k2, None, None, 1, &mut outd, None),
        Status::STRATA_INVALID_ARGUMENT,
        &["out: shape [2, 4]; expected [B, dim] = [2, 3]"],
    );
    let k3 = Desc::compact(keys.as_ptr().cast(), I64, &[1, 2, 3]);
    fails(pooled(&fx.table, &k3, None, None, 1, &mut out, None), Status::STRATA_INVALID_ARGUMENT, &["keys: ndim = 3"]);
    // NULL table, keys, out.
    // SAFETY: the NULL arguments are refused before anything is read.
    let s = unsafe { strata_lookup_pooled(null_mut(), &kdesc.t, &gdesc.t, null(), 1, &mut out.t, null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["table: is NULL"]);
    // SAFETY: as above.
    let s = unsafe { strata_lookup_pooled(fx.table.0, null(), &gdesc.t, null(), 1, &mut out.t, null(), null_mut()) };
    fails(s, Status::STRATA_NULL_ARGUMENT, &["keys: is NULL"]);
    // An out that overlaps the keys.
    let mut shared = vec![0i64; 32];
    shared[..6].copy_from_slice(&keys);
    let sk = Desc::compact(shared.as_ptr().cast(), I64, &[6]);
    let mut so = Desc::compact(shared.as_ptr().cast(), F32, &[2, 3]);
    fails(
        pooled(&fx.table, &sk, Some(&gdesc), None, 1, &mut so, None),
        Status::STRATA_INVALID_LAYOUT,
        &["out: overlaps the memory of keys"],
    );
}

/// A batch of many tables (different dims and dtypes), plain and pooled requests mixed, equals
/// the separate calls.
#[test]
fn a_batch_equals_separate_calls() {
    let mut rng = Rng(26);
    let tables: Vec<Fixture> = (0..26).map(|i| Fixture::new(&mut rng, 64 + i * 7, 1 + (i % 5) * 3, i as f32 * 0.5, false)).collect();
    struct Req {
        keys: Vec<i64>,
        /// Kept alive: `od` describes it.
        _offsets: Vec<i64>,
        weights: Vec<f32>,
        pooling: i32,
        kd: Desc,
        od: Desc,
        wd: Desc,
        out: (Vec<u8>, Desc),
        alone: (Vec<u8>, Desc),
        bags: Vec<(usize, usize)>,
    }
    let mut reqs: Vec<Req> = tables
        .iter()
        .enumerate()
        .map(|(i, fx)| {
            let pooling = (i % 4) as i32; // 0 = plain
            let (offsets, bags) = ragged(&mut rng, 1 + i % 3, 4);
            let nnz = if pooling == 0 { 1 + i % 3 } else { *offsets.last().unwrap() as usize };
            let keys = fx.draw_keys(&mut rng, nnz);
            let weights: Vec<f32> = (0..nnz).map(|_| rng.f32()).collect();
            let rows = if pooling == 0 { nnz } else { bags.len() };
            let kd = Desc::compact(keys.as_ptr().cast(), I64, &[nnz as i64]);
            let od = Desc::compact(offsets.as_ptr().cast(), I64, &[offsets.len() as i64]);
            let wd = Desc::compact(weights.as_ptr().cast(), F32, &[nnz as i64]);
            let dt = if i % 2 == 0 { F32 } else { F16 };
            Req {
                out: out_buffer(rows, fx.dim, dt, fx.dim, 1),
                alone: out_buffer(rows, fx.dim, dt, fx.dim, 1),
                keys,
                _offsets: offsets,
                weights,
                pooling,
                kd,
                od,
                wd,
                bags,
            }
        })
        .collect();
    let mut stats: Vec<LookupStats> = (0..reqs.len()).map(|_| strata_lookup_stats_default()).collect();
    let requests: Vec<strata_lookup_request> = reqs
        .iter_mut()
        .zip(tables.iter())
        .zip(stats.iter_mut())
        .map(|((r, fx), s)| strata_lookup_request {
            table: fx.table.0,
            keys: &r.kd.t,
            offsets: if r.pooling == 0 { null() } else { &r.od.t },
            weights: if r.pooling == 0 { null() } else { &r.wd.t },
            pooling: r.pooling,
            out: &mut r.out.1.t,
            stats: s,
            ..strata_lookup_request_default()
        })
        .collect();
    // SAFETY: every request points to live descriptions of this test's buffers.
    ok(unsafe { strata_lookup_batch(requests.as_ptr(), requests.len(), null()) });
    for (i, (r, fx)) in reqs.iter_mut().zip(&tables).enumerate() {
        let mut alone = strata_lookup_stats_default();
        if r.pooling == 0 {
            // SAFETY: live descriptions and table.
            ok(unsafe { strata_lookup(fx.table.0, &r.kd.t, &mut r.alone.1.t, null(), &mut alone) });
        } else {
            ok(pooled(&fx.table, &r.kd, Some(&r.od), Some(&r.wd), r.pooling, &mut r.alone.1, Some(&mut alone)));
            let (want, _) = fx.expected(&r.keys, &r.bags, Some(&r.weights), r.pooling);
            check_out(&r.out.0, &r.out.1, r.out.1.t.dtype, &want, fx.dim, &format!("request {i}"));
        }
        assert_eq!(r.out.0, r.alone.0, "request {i}: the batch and the separate call wrote the same bytes");
        assert_eq!((stats[i].hits, stats[i].misses), (alone.hits, alone.misses), "request {i}: stats");
    }
    // n = 0 is a no-op, with NULL requests too.
    // SAFETY: nothing is read.
    ok(unsafe { strata_lookup_batch(null(), 0, null()) });
}

/// Every request is validated before any output is written; errors name the request.
#[test]
fn a_batch_validates_every_request_first() {
    let mut rng = Rng(8);
    let fx = Fixture::new(&mut rng, 64, 4, 0.0, false);
    let keys = fx.draw_keys(&mut rng, 5);
    let kd = Desc::compact(keys.as_ptr().cast(), I64, &[5]);
    let (buf0, mut out0) = out_buffer(5, 4, F32, 4, 1);
    let (_buf, mut bad) = out_buffer(5, 3, F32, 3, 1);
    let mk =
        |out: *mut dlpark::ffi::DLTensor| strata_lookup_request { table: fx.table.0, keys: &kd.t, out, ..strata_lookup_request_default() };
    let requests = [mk(&mut out0.t), mk(&mut bad.t)];
    // SAFETY: live descriptions.
    let s = unsafe { strata_lookup_batch(requests.as_ptr(), 2, null()) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["requests[1].out: shape [5, 3]"]);
    assert!(buf0.iter().all(|&b| b == POISON), "request 0's out was written although request 1 is invalid");
    // A request with a NULL table, an unknown pooling, offsets on a plain request.
    let mut r = [mk(&mut out0.t)];
    r[0].table = null_mut();
    // SAFETY: live descriptions; the NULL table is refused.
    fails(unsafe { strata_lookup_batch(r.as_ptr(), 1, null()) }, Status::STRATA_NULL_ARGUMENT, &["requests[0].table: is NULL"]);
    let mut r = [mk(&mut out0.t)];
    r[0].pooling = 9;
    // SAFETY: live descriptions.
    fails(unsafe { strata_lookup_batch(r.as_ptr(), 1, null()) }, Status::STRATA_INVALID_ARGUMENT, &["requests[0].pooling: 9"]);
    let offs = [0i64, 5];
    let od = Desc::compact(offs.as_ptr().cast(), I64, &[2]);
    let mut r = [mk(&mut out0.t)];
    r[0].offsets = &od.t;
    // SAFETY: live descriptions.
    fails(
        unsafe { strata_lookup_batch(r.as_ptr(), 1, null()) },
        Status::STRATA_INVALID_ARGUMENT,
        &["requests[0].offsets: given with pooling = STRATA_POOL_NONE"],
    );
    // struct_size rules: 0, and elements that disagree.
    let mut r = [mk(&mut out0.t), mk(&mut out0.t)];
    r[0].struct_size = 0;
    // SAFETY: live descriptions.
    fails(
        unsafe { strata_lookup_batch(r.as_ptr(), 2, null()) },
        Status::STRATA_INVALID_ARGUMENT,
        &["struct_size is 0", "strata_lookup_request_default()"],
    );
    assert!(buf0.iter().all(|&b| b == POISON));
}

/// A parameter server's table serves pooled lookups through its tiers, counted in its stats.
#[test]
fn server_tables_pool_through_their_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = dir.path().join("sparse");
    std::fs::create_dir(&sparse).unwrap();
    let (rows, dim) = (40usize, 4usize);
    let keys: Vec<i64> = (0..rows as i64).map(|k| k * 3).collect();
    let vectors: Vec<f32> = (0..rows * dim).map(|i| i as f32 * 0.5).collect();
    std::fs::write(sparse.join("key"), keys.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    std::fs::write(sparse.join("emb_vector"), vectors.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let json = format!(
        r#"{{"supportlonglong": true, "volatile_db": {{"type": "parallel_hash_map", "initial_cache_rate": 0.5}},
            "persistent_db": {{"type": "rocks_db", "path": "{}"}},
            "models": [{{"model": "m", "sparse_files": ["{}"], "embedding_vecsize_per_table": [{dim}],
                         "default_value_for_each_table": [2.0],
                         "maxnum_catfeature_query_per_table_per_sample": [4], "deployed_device_list": [0], "max_batch_size": 8}}]}}"#,
        dir.path().join("db").display(),
        sparse.display()
    );
    let json = std::ffi::CString::new(json).unwrap();
    let mut server = null_mut();
    // SAFETY: a NUL-terminated JSON text; NULL base dir.
    ok(unsafe { strata_server_open_json(json.as_ptr(), null(), &mut server) });
    let mut t = null_mut();
    // SAFETY: a live server.
    ok(unsafe { strata_server_table(server, c"m".as_ptr(), 0, &mut t) });
    let q = [0i64, 3, 999, 117, 6, 6];
    let offsets = [0i64, 3, 3, 6];
    let kd = Desc::compact(q.as_ptr().cast(), I64, &[6]);
    let od = Desc::compact(offsets.as_ptr().cast(), I64, &[4]);
    let (buf, mut out) = out_buffer(3, dim, F32, dim, 1);
    let mut stats = strata_lookup_stats_default();
    // SAFETY: a live server table and this test's buffers.
    ok(unsafe { strata_lookup_pooled(t, &kd.t, &od.t, null(), 1, &mut out.t, null(), &mut stats) });
    let row = |k: i64| -> Vec<f32> {
        match keys.iter().position(|&x| x == k) {
            Some(r) => vectors[r * dim..(r + 1) * dim].to_vec(),
            None => vec![2.0; dim],
        }
    };
    let mut want = vec![0f32; 3 * dim];
    for (b, (lo, hi)) in [(0usize, 3usize), (3, 3), (3, 6)].into_iter().enumerate() {
        for &k in &q[lo..hi] {
            for (c, x) in row(k).into_iter().enumerate() {
                want[b * dim + c] += x;
            }
        }
    }
    check_out(&buf, &out, F32, &want, dim, "server table");
    assert_eq!((stats.hits, stats.misses), (5, 1));
    assert_eq!(stats.volatile_hits + stats.persistent_hits, 5);
    let mut ts = strata_table_stats_default_0_3_1();
    // SAFETY: a live table.
    ok(unsafe { strata_table_get_stats(t, &mut ts) });
    assert_eq!((ts.lookups, ts.keys, ts.misses), (1, 6, 1), "the pooled lookup is counted");
    // SAFETY: the server owns t, which is not used afterwards.
    unsafe { strata_server_free(server) };
}

/// Threads do not change results (bags are split over participants).
#[test]
fn threads_do_not_change_pooled_results() {
    let mut rng = Rng(77);
    let fx = Fixture::new(&mut rng, 2000, 32, 0.0, false);
    let (offsets, _) = ragged(&mut rng, 3000, 30);
    let nnz = *offsets.last().unwrap() as usize;
    let keys = fx.draw_keys(&mut rng, nnz);
    let kd = Desc::compact(keys.as_ptr().cast(), I64, &[nnz as i64]);
    let od = Desc::compact(offsets.as_ptr().cast(), I64, &[offsets.len() as i64]);
    let mut outs = Vec::new();
    for threads in [1, 2, 4, 0] {
        let (buf, mut out) = out_buffer(3000, 32, F32, 32, 1);
        let mut o = strata_lookup_options_default();
        o.num_threads = threads;
        // SAFETY: live descriptions and table.
        ok(unsafe { strata_lookup_pooled(fx.table.0, &kd.t, &od.t, null(), 3, &mut out.t, &o, null_mut()) });
        outs.push(buf);
    }
    assert!(outs.windows(2).all(|w| w[0] == w[1]), "results differ with the thread count");
}

/// Keys of rank 5 and an out of rank 6 (beyond the dimensions a tensor view holds inline), with
/// strides that do not merge, give the reference rows alone and in a batch; the out's padding
/// stays poisoned.
#[test]
fn high_rank_strided_requests_give_the_reference_rows() {
    let mut rng = Rng(51);
    let fx = Fixture::new(&mut rng, 300, 5, -1.5, false);
    let shape = [2i64, 1, 3, 2, 2];
    let kstrides = [40i64, 40, 10, 4, 1]; // no two neighbouring dimensions merge
    let n = 24;
    let flat = fx.draw_keys(&mut rng, n);
    let mut backing = vec![-7i64; 66];
    let mut oshape = shape.to_vec();
    oshape.push(fx.dim as i64);
    let ostrides = [84i64, 84, 28, 14, 7, 1]; // rows of 5 values 7 apart
    let mut at = Vec::with_capacity(n); // (key offset, out offset) of each flat index
    for a in 0..2 {
        for c in 0..3 {
            for d in 0..2 {
                for e in 0..2 {
                    at.push(((a * 40 + c * 10 + d * 4 + e) as usize, (a * 84 + c * 28 + d * 14 + e * 7) as usize));
                }
            }
        }
    }
    for (i, &(k, _)) in at.iter().enumerate() {
        backing[k] = flat[i];
    }
    let bags: Vec<(usize, usize)> = (0..n).map(|i| (i, i + 1)).collect();
    let (want, misses) = fx.expected(&flat, &bags, None, 1);
    let kd = Desc::new(backing.as_ptr().cast(), I64, &shape, &kstrides, 0);
    let poison = f32::from_bits(u32::from_ne_bytes([POISON; 4]));
    let check = |out: &[f32], what: &str| {
        let mut written = vec![false; out.len()];
        for (i, &(_, o)) in at.iter().enumerate() {
            for c in 0..fx.dim {
                assert_eq!(out[o + c].to_bits(), want[i * fx.dim + c].to_bits(), "{what}: key {i}, column {c}");
                written[o + c] = true;
            }
        }
        for (j, x) in out.iter().enumerate() {
            assert!(written[j] || x.to_bits() == poison.to_bits(), "{what}: element {j} outside the rows was written");
        }
    };
    let mut alone = vec![poison; 168];
    let mut ad = Desc::new(alone.as_mut_ptr().cast(), F32, &oshape, &ostrides, 0);
    let mut stats = strata_lookup_stats_default();
    // SAFETY: live table and descriptions of this test's buffers.
    ok(unsafe { strata_lookup(fx.table.0, &kd.t, &mut ad.t, null(), &mut stats) });
    assert_eq!((stats.hits, stats.misses), (n as u64 - misses, misses));
    check(&alone, "alone");
    let mut batched = vec![poison; 168];
    let mut bd = Desc::new(batched.as_mut_ptr().cast(), F32, &oshape, &ostrides, 0);
    let r = [strata_lookup_request { table: fx.table.0, keys: &kd.t, out: &mut bd.t, ..strata_lookup_request_default() }];
    // SAFETY: one request over live descriptions.
    ok(unsafe { strata_lookup_batch(r.as_ptr(), 1, null()) });
    check(&batched, "batched");
}

#[test]
fn a_threads_reused_buffers_carry_nothing_between_calls() {
    // One thread keeps its pooling buffers between calls (exec/pooled.rs): calls that grow them
    // past what is kept (a large dim, strided out, many bags), that fill them with weights, and
    // small calls with empty bags, in turn, each give the reference rows.
    let mut rng = Rng(23);
    let big = Fixture::new(&mut rng, 400, 1024, 0.5, false);
    let small = Fixture::new(&mut rng, 60, 5, -2.0, false);
    for round in 0..3 {
        for (fx, bags_n, weighted, col) in [(&big, 300, true, 2), (&small, 30, false, 1), (&big, 20, false, 1), (&small, 30, true, 3)] {
            let (mut offsets, mut bags) = ragged(&mut rng, bags_n, 4);
            // An empty bag first: its row is the zeros the buffers hold.
            offsets.insert(0, 0);
            bags.insert(0, (0, 0));
            let nnz = *offsets.last().unwrap() as usize;
            let keys = fx.draw_keys(&mut rng, nnz);
            let weights: Vec<f32> = (0..nnz).map(|_| rng.f32() * 3.0 - 1.0).collect();
            let kb = key_bytes(&keys, I64);
            let ob = offset_bytes(&offsets, I64);
            let kdesc = Desc::compact(kb.as_ptr(), I64, &[nnz as i64]);
            let odesc = Desc::compact(ob.as_ptr(), I64, &[offsets.len() as i64]);
            let wdesc = Desc::compact(weights.as_ptr().cast(), F32, &[nnz as i64]);
            let (buf, mut out) = out_buffer(bags.len(), fx.dim, F32, fx.dim * col + 1, col);
            ok(pooled(&fx.table, &kdesc, Some(&odesc), weighted.then_some(&wdesc), 1, &mut out, None));
            let (want, _) = fx.expected(&keys, &bags, weighted.then_some(&weights[..]), 1);
            check_out(&buf, &out, F32, &want, fx.dim, &format!("round {round}, dim {}, weighted={weighted}", fx.dim));
        }
    }
}

/// A keyless (dense) table pools a group of bags before it counts the group's misses, and a
/// participant that has met a miss counts first for the rest of the call: keys in many groups
/// (60K keys, several tasks a participant), misses in some groups and not in others, give the
/// reference rows bit for bit (float32 out, sum) and the reference stats, with 1, 2 and the
/// default number of threads.
#[test]
fn a_dense_tables_misses_in_some_groups_of_many() {
    let mut rng = Rng(91);
    for dim in [64usize, 20] {
        let rows = 300usize;
        let vectors: Vec<f32> = (0..rows * dim).map(|_| rng.f32() * 4.0 - 2.0).collect();
        let mut o = strata_table_options_default_0_3_1();
        o.default_value = 0.75;
        let table = Owned::build(&vectors, rows, dim, None, &o);
        let row = |k: i64| (0..rows as i64).contains(&k).then(|| &vectors[k as usize * dim..(k as usize + 1) * dim]);
        let (offsets, bags) = ragged(&mut rng, 3000, 40);
        let nnz = *offsets.last().unwrap() as usize;
        assert!(nnz > 40_000, "keys enough for many groups");
        // Misses: none in the first 8K keys, 5% in 8K..12K, none in 12K..30K, one at 31,000,
        // none after but the last key; past the store by a little and by a lot.
        let keys: Vec<i64> = (0..nnz)
            .map(|i| {
                let miss = match i {
                    8000..12000 => rng.below(20) == 0,
                    31_000 => true,
                    _ => i == nnz - 1,
                };
                match (miss, rng.below(3)) {
                    (false, _) => rng.below(rows as u64) as i64,
                    (true, 0) => i64::MAX - rng.below(5) as i64,
                    (true, _) => rows as i64 + rng.below(1000) as i64,
                }
            })
            .collect();
        let weights: Vec<f32> = (0..nnz).map(|_| rng.f32() * 2.0 - 0.5).collect();
        let kd = Desc::compact(keys.as_ptr().cast(), I64, &[nnz as i64]);
        let od = Desc::compact(offsets.as_ptr().cast(), I64, &[offsets.len() as i64]);
        let wd = Desc::compact(weights.as_ptr().cast(), F32, &[nnz as i64]);
        for (pooling, name) in POOLINGS {
            for weighted in [false, true] {
                let w = weighted.then_some(&weights[..]);
                let (want, misses) = pool_reference(row, o.default_value, dim, &keys, &bags, w, pooling);
                assert!(misses > 100, "the keys miss");
                for threads in [1, 2, 0] {
                    let (buf, mut out) = out_buffer(bags.len(), dim, F32, dim, 1);
                    let mut opts = strata_lookup_options_default();
                    opts.num_threads = threads;
                    let mut stats = strata_lookup_stats_default();
                    // SAFETY: live descriptions and table.
                    ok(unsafe {
                        strata_lookup_pooled(
                            table.0,
                            &kd.t,
                            &od.t,
                            if weighted { &wd.t } else { null() },
                            pooling,
                            &mut out.t,
                            &opts,
                            &mut stats,
                        )
                    });
                    let what = format!("dim {dim} {name} weighted={weighted} threads {threads}");
                    check_out(&buf, &out, F32, &want, dim, &what);
                    if pooling == 1 {
                        for (i, (got, want)) in buf.chunks_exact(4).zip(&want).enumerate() {
                            let got = f32::from_ne_bytes(got.try_into().unwrap());
                            assert_eq!(got.to_bits(), want.to_bits(), "{what}: element {i}: got {got}, want {want}");
                        }
                    }
                    assert_eq!((stats.hits, stats.misses), (nnz as u64 - misses, misses), "{what}: stats");
                }
            }
        }
    }
}
