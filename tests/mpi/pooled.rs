//! Pooled (`strata_lookup_pooled`) and batched (`strata_lookup_batch`) lookups on distributed
//! tables, run by every rank under mpirun. Every rank knows the whole logical table (the same
//! seeded values everywhere) and checks its own results against a plain loop over it, bit for
//! bit (float32 accumulation in key order, a multiply then an add, as the contract says), and
//! against a single-process table of the same data. Each rank draws its own keys, bags and
//! weights. Outputs sit inside a guard region of NaN bytes (0xFF): after a successful call only
//! the output's elements may have changed; after a failed one nothing may have.

use crate::cases::{Ctx, all_fail, dist, random_values, reference, split_owners};
use crate::common::*;
use crate::desc::Split;
use dlpark::ffi::DLDataType;
use std::ptr::{null, null_mut};

const POOLINGS: [i32; 3] = [1, 2, 3];
/// Every byte of a fresh output buffer: NaN in float32, float16 and bfloat16 alike.
const POISON: u8 = 0xFF;

/// The logical [rows, dim] table as float32 (exact for every table dtype), as every rank knows it.
pub struct Logical {
    rows: usize,
    dim: usize,
    values: Vec<f32>,
    default: f32,
}

impl Logical {
    pub fn of(global: &[u8], dtype: DLDataType, rows: usize, dim: usize, default: f32) -> Logical {
        let e = elem_size(dtype);
        Logical { rows, dim, values: (0..rows * dim).map(|i| read_float(dtype, &global[i * e..])).collect(), default }
    }

    /// The row of a dense key (the global row number), if the table has it.
    fn row(&self, key: i64) -> Option<&[f32]> {
        (0..self.rows as i64).contains(&key).then(|| &self.values[key as usize * self.dim..(key as usize + 1) * self.dim])
    }

    /// The plain-loop reference ([`pool_reference`]) and the misses.
    pub fn pooled(&self, keys: &[i64], bags: &[(usize, usize)], weights: Option<&[f32]>, pooling: i32) -> (Vec<f32>, u64) {
        pool_reference(|k| self.row(k), self.default, self.dim, keys, bags, weights, pooling)
    }

    /// Plain rows of `keys` (the default row for a missing key), and the misses.
    fn plain(&self, keys: &[i64]) -> (Vec<f32>, u64) {
        let bags: Vec<(usize, usize)> = (0..keys.len()).map(|i| (i, i + 1)).collect();
        self.pooled(keys, &bags, None, 1)
    }
}

/// An output [b, dim] of `dtype` inside a buffer of poison: compact, or (strided) rows
/// `2 * dim + 3` elements apart with a column stride of 2, after 5 elements of guard (reached
/// through byte_offset); 7 elements of guard follow in both cases.
pub struct Out {
    buf: Vec<u8>,
    pub d: Desc,
    dtype: DLDataType,
    rows: usize,
    dim: usize,
    lead: usize,
    rs: usize,
    cs: usize,
}

impl Out {
    pub fn new(rows: usize, dim: usize, dtype: DLDataType, strided: bool) -> Out {
        Out::shaped(&[rows as i64, dim as i64], dtype, strided)
    }

    /// As [`Out::new`] with `shape` = [.., dim] (the leading dims are the rows, row-major).
    pub fn shaped(shape: &[i64], dtype: DLDataType, strided: bool) -> Out {
        let dim = *shape.last().unwrap() as usize;
        let rows: usize = shape[..shape.len() - 1].iter().map(|&s| s as usize).product();
        let e = elem_size(dtype);
        let (rs, cs, lead) = if strided { (2 * dim + 3, 2, 5) } else { (dim, 1, 0) };
        let extent = if rows == 0 { 0 } else { (rows - 1) * rs + (dim - 1) * cs + 1 };
        let buf = vec![POISON; (lead + extent + 7) * e];
        let mut strides = vec![cs as i64];
        for d in (0..shape.len() - 1).rev() {
            let inner = if d == shape.len() - 2 { rs as i64 } else { strides[0] * shape[d + 1] };
            strides.insert(0, inner);
        }
        let d = Desc::new(buf.as_ptr(), dtype, shape, &strides, (lead * e) as u64);
        Out { buf, d, dtype, rows, dim, lead, rs, cs }
    }

    fn at(&self, r: usize, c: usize) -> usize {
        (self.lead + r * self.rs + c * self.cs) * elem_size(self.dtype)
    }

    /// Asserts out holds `want` (rounded to its dtype, bit for bit) and no other byte changed.
    #[track_caller]
    pub fn holds(&self, want: &[f32], what: &str) {
        let e = elem_size(self.dtype);
        assert_eq!(want.len(), self.rows * self.dim, "{what}");
        let mut inside = vec![false; self.buf.len()];
        let mut bytes = [0u8; 4];
        for r in 0..self.rows {
            for c in 0..self.dim {
                let at = self.at(r, c);
                write_float(self.dtype, &mut bytes, want[r * self.dim + c]);
                assert_eq!(
                    &self.buf[at..at + e],
                    &bytes[..e],
                    "{what}: row {r} col {c}: got {}, want {}",
                    read_float(self.dtype, &self.buf[at..]),
                    round_to(self.dtype, want[r * self.dim + c])
                );
                inside[at..at + e].iter_mut().for_each(|b| *b = true);
            }
        }
        for (i, (&b, &inside)) in self.buf.iter().zip(&inside).enumerate() {
            assert!(inside || b == POISON, "{what}: byte {i}, outside out's elements, was written");
        }
    }

    /// Asserts no byte changed (a failed call writes nothing).
    #[track_caller]
    pub fn untouched(&self, what: &str) {
        assert!(self.buf.iter().all(|&b| b == POISON), "{what}: a failed call wrote into out");
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// One rank's bags: ragged (1-D keys and B + 1 offsets) or fixed hotness (keys [B, L], which
/// are read every other element of a [B, 2L] buffer), with float32 weights.
pub struct Bags {
    pub keys: Vec<i64>,
    pub offsets: Option<Vec<i64>>,
    pub b: usize,
    pub weights: Vec<f32>,
}

impl Bags {
    /// `b` ragged bags (about one in five empty, one in six of zero total weight) of up to
    /// `max` keys drawn from -3 .. rows + 3 (so some are missing).
    pub fn ragged(rng: &mut Rng, b: usize, max: u64, rows: usize) -> Bags {
        let mut offsets = vec![0i64];
        let mut weights = Vec::new();
        for _ in 0..b {
            let len = if rng.below(5) == 0 { 0 } else { 1 + rng.below(max) as usize };
            let zero = rng.below(6) == 0;
            weights.extend((0..len).map(|_| if zero { 0.0 } else { rng.f32() + 0.5 }));
            offsets.push(offsets.last().unwrap() + len as i64);
        }
        let keys = (0..weights.len()).map(|_| rng.below(rows as u64 + 6) as i64 - 3).collect();
        Bags { keys, offsets: Some(offsets), b, weights }
    }

    /// `b` bags of `l` keys each.
    pub fn fixed(rng: &mut Rng, b: usize, l: usize, rows: usize) -> Bags {
        let keys = (0..b * l).map(|_| rng.below(rows as u64 + 6) as i64 - 3).collect();
        let weights = (0..b * l).map(|_| rng.f32() + 0.5).collect();
        Bags { keys, offsets: None, b, weights }
    }

    fn hot(&self) -> usize {
        self.keys.len().checked_div(self.b).unwrap_or(0)
    }

    pub fn pairs(&self) -> Vec<(usize, usize)> {
        match &self.offsets {
            Some(o) => o.windows(2).map(|w| (w[0] as usize, w[1] as usize)).collect(),
            None => (0..self.b).map(|i| (i * self.hot(), (i + 1) * self.hot())).collect(),
        }
    }

    /// The tensors of these bags: keys as `kdt`, offsets as `odt`.
    pub fn tensors(&self, kdt: DLDataType, odt: DLDataType) -> Tensors {
        let ke = elem_size(kdt);
        let n = self.keys.len();
        let (spread, kshape, kstrides) = match &self.offsets {
            Some(_) => (1, vec![n as i64], vec![1]),
            None => (2, vec![self.b as i64, self.hot() as i64], vec![2 * self.hot() as i64, 2]),
        };
        let mut kb = vec![0xEEu8; (n * spread).max(1) * ke];
        for (i, &k) in self.keys.iter().enumerate() {
            write_key(kdt, &mut kb[i * spread * ke..], k);
        }
        let oe = elem_size(odt);
        let offsets = self.offsets.clone().unwrap_or_default();
        let mut ob = vec![0u8; offsets.len().max(1) * oe];
        for (i, &o) in offsets.iter().enumerate() {
            write_key(odt, &mut ob[i * oe..], o);
        }
        let k = Desc::new(kb.as_ptr(), kdt, &kshape, &kstrides, 0);
        let o = self.offsets.as_ref().map(|o| Desc::compact(ob.as_ptr(), odt, &[o.len() as i64]));
        let wb = self.weights.clone();
        let w = Desc::new(wb.as_ptr().cast(), F32, &kshape, &compact_strides(&kshape), 0);
        Tensors { _kb: kb, _ob: ob, _wb: wb, k, o, w }
    }

    /// Keys for a plain lookup (no bags): compact, shaped `shape`.
    pub fn plain(keys: Vec<i64>) -> Bags {
        Bags { weights: vec![1.0; keys.len()], keys, offsets: None, b: 0 }
    }

    /// The tensors of a plain lookup of these keys as `kdt`, shaped `shape`.
    pub fn plain_tensors(&self, kdt: DLDataType, shape: &[i64]) -> Tensors {
        let ke = elem_size(kdt);
        let mut kb = vec![0u8; self.keys.len().max(1) * ke];
        for (i, &k) in self.keys.iter().enumerate() {
            write_key(kdt, &mut kb[i * ke..], k);
        }
        let k = Desc::compact(kb.as_ptr(), kdt, shape);
        let w = Desc::compact(kb.as_ptr(), F32, &[0]);
        Tensors { _kb: kb, _ob: vec![], _wb: vec![], k, o: None, w }
    }
}

/// The DLPack views of one rank's bags, owning the keys, offsets and weights they describe.
pub struct Tensors {
    _kb: Vec<u8>,
    _ob: Vec<u8>,
    _wb: Vec<f32>,
    pub k: Desc,
    pub o: Option<Desc>,
    pub w: Desc,
}

/// `strata_lookup_pooled` with these tensors; stats are set to a sentinel first.
pub fn pooled(t: &Owned, x: &Tensors, weighted: bool, pooling: i32, out: &mut Out, stats: &mut LookupStats) -> Status {
    *stats = LookupStats { hits: 77, misses: 77, ..LookupStats::default() };
    // SAFETY: t.0 is a live table (Owned); x's descriptions cover buffers x owns, out.d covers out's buffer, all alive past the call; stats is a reference.
    unsafe {
        strata_lookup_pooled(
            t.0,
            &x.k.t,
            x.o.as_ref().map_or(null(), |o| &o.t),
            if weighted { &x.w.t } else { null() },
            pooling,
            &mut out.d.t,
            null(),
            stats,
        )
    }
}

/// Every pooling, weighted or not, ragged (int32 and int64 offsets, empty bags, zero weight
/// totals) and fixed hotness (strided 2-D keys), every key dtype, every out dtype, compact and
/// strided outs, tables of every dtype, misses: equal to the loop, bit for bit, with stats
/// counting keys, and to a single-process table; only out's elements written.
pub fn pooled_matches_a_loop(cx: &Ctx) {
    let (rows, dim) = (27usize, 5usize);
    let opts = TableOptions { default_value: 0.75, ..TableOptions::default() };
    for (tdt, seed) in [(F32, 41u64), (F16, 42), (BF16, 43)] {
        let global = random_values(tdt, rows * dim, seed);
        let mut d = Split::new(&global, tdt, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
        let t = dist(d.c(), cx, &opts);
        let r = reference(&global, tdt, rows, dim, &opts);
        let lg = Logical::of(&global, tdt, rows, dim, opts.default_value);
        let mut rng = Rng(1000 + 31 * cx.rank as u64 + seed);
        let mut call = 0;
        for pooling in POOLINGS {
            for weighted in [false, true] {
                for (i, kdt) in [I64, I32, U64, U32].into_iter().enumerate() {
                    call += 1;
                    let odt = [F32, F16, BF16][call % 3];
                    let strided = call % 2 == 0;
                    // rank 1 sometimes has no bags at all: it still serves the others' keys
                    let b = if cx.rank == 1 && call % 5 == 0 { 0 } else { rng.below(12) as usize };
                    let bags = if i % 2 == 0 {
                        Bags::ragged(&mut rng, b, 8, rows)
                    } else {
                        let l = rng.below(5) as usize; // 0 .. 4 keys a bag: L = 0 makes empty bags
                        Bags::fixed(&mut rng, b, l, rows)
                    };
                    let x = bags.tensors(kdt, if call % 3 == 0 { I32 } else { I64 });
                    let what = format!(
                        "{tdt:?} table, pooling {pooling}, weighted {weighted}, keys {kdt:?} {}, out {odt:?} strided {strided}",
                        if bags.offsets.is_some() { "ragged" } else { "fixed" }
                    );
                    let (want, misses) = lg.pooled(&bags.keys, &bags.pairs(), weighted.then_some(&bags.weights[..]), pooling);
                    let (mut o1, mut o2) = (Out::new(bags.b, dim, odt, strided), Out::new(bags.b, dim, odt, strided));
                    let (mut s1, mut s2) = (LookupStats::default(), LookupStats::default());
                    ok(pooled(&t, &x, weighted, pooling, &mut o1, &mut s1));
                    o1.holds(&want, &what);
                    assert_eq!((s1.hits, s1.misses), (bags.keys.len() as u64 - misses, misses), "{what}: stats count keys");
                    ok(pooled(&r, &x, weighted, pooling, &mut o2, &mut s2));
                    assert_eq!(o1.bytes(), o2.bytes(), "{what}: the single-process table");
                    assert_eq!((s1.hits, s1.misses), (s2.hits, s2.misses), "{what}");
                }
            }
        }
    }
    // Many keys (the staged rows and the pooling run on several threads), and every rank's keys
    // spread over every rank's rows.
    let global = random_values(F32, rows * dim, 44);
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let t = dist(d.c(), cx, &opts);
    let lg = Logical::of(&global, F32, rows, dim, opts.default_value);
    let mut rng = Rng(2000 + cx.rank as u64);
    for pooling in POOLINGS {
        let bags = Bags::ragged(&mut rng, 3000, 14, rows);
        let x = bags.tensors(I64, I64);
        let (want, misses) = lg.pooled(&bags.keys, &bags.pairs(), Some(&bags.weights), pooling);
        let mut o = Out::new(bags.b, dim, F32, pooling == 2);
        let mut s = LookupStats::default();
        ok(pooled(&t, &x, true, pooling, &mut o, &mut s));
        o.holds(&want, &format!("{} keys, pooling {pooling}", bags.keys.len()));
        assert_eq!((s.hits, s.misses), (bags.keys.len() as u64 - misses, misses));
    }
}

/// Under `STRATA_MISSING_ERROR` a missing key in one rank's bags fails the call on every rank,
/// naming the key and its element, with nothing written (the rows are staged and pooled only
/// after the collective gather agreed); the table serves the next call.
pub fn pooled_missing_error(cx: &Ctx) {
    let (rows, dim) = (27usize, 4usize);
    let opts = TableOptions { missing_key: 1, default_value: 9.0, ..TableOptions::default() };
    let global = random_values(F32, rows * dim, 45);
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let t = dist(d.c(), cx, &opts);
    let lg = Logical::of(&global, F32, rows, dim, opts.default_value);
    let mut rng = Rng(3000 + cx.rank as u64);
    let l = cx.last();
    // ragged keys, missing on the last rank; then fixed hotness, missing on rank 0
    for (culprit, mut bags, at, kdt) in
        [(l, Bags::ragged(&mut rng, 6, 4, rows - 4), 3usize, I32), (0, Bags::fixed(&mut rng, 3, 4, rows - 4), 6, U64)]
    {
        bags.keys.iter_mut().for_each(|k| *k = k.rem_euclid(rows as i64));
        bags.keys.resize(bags.keys.len().max(at + 1), 0);
        bags.weights.resize(bags.keys.len(), 1.0);
        if let Some(o) = &mut bags.offsets {
            *o.last_mut().unwrap() = bags.keys.len() as i64;
        }
        let good = bags.tensors(kdt, I64);
        let fine = bags.keys.clone();
        if cx.rank == culprit {
            bags.keys[at] = 99;
        }
        let x = bags.tensors(kdt, I64);
        for pooling in POOLINGS {
            let mut o = Out::new(bags.b, dim, F32, true);
            let mut s = LookupStats::default();
            let st = pooled(&t, &x, true, pooling, &mut o, &mut s);
            let want = format!("keys: key 99 (element {at}) is not in the table");
            all_fail(cx, st, Status::STRATA_KEY_NOT_FOUND, Some(culprit), &[&want]);
            o.untouched("a missing key under STRATA_MISSING_ERROR");
            assert_eq!((s.hits, s.misses), (77, 77), "stats are not written on failure");
            // the same bags without the missing key: every rank succeeds
            let (wanted, misses) = lg.pooled(&fine, &bags.pairs(), Some(&bags.weights), pooling);
            let mut o = Out::new(bags.b, dim, F32, false);
            ok(pooled(&t, &good, true, pooling, &mut o, &mut s));
            o.holds(&wanted, "after a failed call");
            assert_eq!((s.hits, s.misses), (fine.len() as u64, misses));
            assert_eq!(misses, 0);
        }
    }
}

/// Bad pooled input on one rank (or on every rank) fails every rank with the same status and a
/// message naming the argument; nothing is written anywhere; no rank waits forever (the launcher
/// runs each mpirun under `timeout`); the table serves the next call.
pub fn pooled_bad_input(cx: &Ctx) {
    let (rows, dim) = (27usize, 3usize);
    let opts = TableOptions::default();
    let global = random_values(F32, rows * dim, 46);
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let t = dist(d.c(), cx, &opts);
    let lg = Logical::of(&global, F32, rows, dim, opts.default_value);
    let l = cx.last();
    let keys: Vec<i64> = (0..6).map(|i| (i * 4 + cx.rank as i64) % rows as i64).collect();
    let weights = vec![0.5f32; 6];
    let short = [0.5f32; 5];
    let kd = Desc::compact(keys.as_ptr().cast(), I64, &[6]);
    let k2 = Desc::compact(keys.as_ptr().cast(), I64, &[2, 3]);
    let wd = Desc::compact(weights.as_ptr().cast(), F32, &[6]);
    let wshort = Desc::compact(short.as_ptr().cast(), F32, &[5]);
    let good: Vec<i64> = vec![0, 2, 2, 6];
    let offs = |v: &[i64]| v.to_vec();
    let ffl = [0f32, 2.0, 2.0, 6.0];
    let fdesc = Desc::compact(ffl.as_ptr().cast(), F32, &[4]);
    type Variant<'a> = (&'a str, Option<Vec<i64>>, Option<&'a Desc>, i32, bool, Option<i32>, Status, String);
    let mine = |r: i32| cx.rank == r;
    let variants: Vec<Variant> = vec![
        (
            "offsets[0] != 0 on the last rank",
            Some(if mine(l) { offs(&[1, 2, 2, 6]) } else { good.clone() }),
            Some(&wd),
            1,
            false,
            Some(l),
            Status::STRATA_INVALID_ARGUMENT,
            "offsets: offsets[0] = 1; expected 0".into(),
        ),
        (
            "decreasing offsets on rank 0",
            Some(if mine(0) { offs(&[0, 3, 2, 6]) } else { good.clone() }),
            Some(&wd),
            2,
            false,
            Some(0),
            Status::STRATA_INVALID_ARGUMENT,
            "offsets: offsets[2] = 2 is less than offsets[1] = 3".into(),
        ),
        (
            "offsets not ending at nnz on every rank",
            Some(offs(&[0, 2, 2, 5])),
            None,
            3,
            false,
            None,
            Status::STRATA_INVALID_ARGUMENT,
            "offsets: offsets[3] = 5; expected nnz = 6".into(),
        ),
        (
            "weights of another shape on the last rank",
            Some(good.clone()),
            Some(if mine(l) { &wshort } else { &wd }),
            1,
            false,
            Some(l),
            Status::STRATA_INVALID_ARGUMENT,
            "weights: shape [5]; expected the keys' shape [6]".into(),
        ),
        (
            "float offsets on rank 0",
            Some(good.clone()),
            None,
            1,
            mine(0),
            Some(0),
            Status::STRATA_UNSUPPORTED_DTYPE,
            "offsets: dtype float32".into(),
        ),
        (
            "1-D keys without offsets on the last rank",
            if mine(l) { None } else { Some(good.clone()) },
            None,
            1,
            false,
            Some(l),
            Status::STRATA_INVALID_ARGUMENT,
            "offsets: is NULL but keys are 1-D".into(),
        ),
        (
            "an unknown pooling on every rank",
            Some(good.clone()),
            None,
            7,
            false,
            None,
            Status::STRATA_INVALID_ARGUMENT,
            "pooling: 7; expected STRATA_POOL_SUM (1)".into(),
        ),
        (
            "an unknown pooling on the last rank",
            Some(good.clone()),
            None,
            if mine(l) { 9 } else { 1 },
            false,
            Some(l),
            Status::STRATA_INVALID_ARGUMENT,
            "pooling: 9; expected STRATA_POOL_SUM (1)".into(),
        ),
        (
            "STRATA_POOL_NONE on rank 0",
            Some(good.clone()),
            None,
            if mine(0) { 0 } else { 2 },
            false,
            Some(0),
            Status::STRATA_INVALID_ARGUMENT,
            "pooling: 0 (STRATA_POOL_NONE)".into(),
        ),
    ];
    for (what, offsets, weights, pooling, float_offsets, culprit, want, needle) in variants {
        let ob = offsets.clone().unwrap_or_default();
        let od = Desc::compact(ob.as_ptr().cast(), I64, &[ob.len() as i64]);
        let od = if float_offsets { &fdesc } else { &od };
        let mut o = Out::new(3, dim, F32, true);
        let mut st = LookupStats { hits: 77, ..LookupStats::default() };
        // SAFETY: t.0 is a live table; every description covers a buffer of this function, alive
        // past the call; stats is a reference.
        let s = unsafe {
            strata_lookup_pooled(
                t.0,
                &kd.t,
                if offsets.is_some() { &od.t } else { null() },
                weights.map_or(null(), |w| &w.t),
                pooling,
                &mut o.d.t,
                null(),
                &mut st,
            )
        };
        all_fail(cx, s, want, culprit, &[&needle]);
        o.untouched(what);
        assert_eq!(st.hits, 77, "{what}: stats are not written on failure");
    }
    // out with the wrong number of rows on rank 0; 2-D keys with offsets on the last rank
    let mut o = Out::new(if mine(0) { 2 } else { 3 }, dim, F32, false);
    let od = Desc::compact(good.as_ptr().cast(), I64, &[4]);
    // SAFETY: as above.
    let s = unsafe { strata_lookup_pooled(t.0, &kd.t, &od.t, null(), 1, &mut o.d.t, null(), null_mut()) };
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(0), &["out: shape [2, 3]; expected [B, dim] = [3, 3]"]);
    o.untouched("out rows != B");
    let o2 = offs(&[0, 3]);
    let od2 = Desc::compact(o2.as_ptr().cast(), I64, &[2]);
    let mut o = Out::new(2, dim, F32, false);
    // SAFETY: as above.
    let s = unsafe { strata_lookup_pooled(t.0, &k2.t, if mine(l) { &od2.t } else { null() }, null(), 1, &mut o.d.t, null(), null_mut()) };
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(l), &["offsets: given with 2-D keys [2, 3]"]);
    o.untouched("2-D keys with offsets");
    // the table still serves the next collective call
    let bags = Bags { keys: keys.clone(), offsets: Some(good.clone()), b: 3, weights: weights.clone() };
    let x = bags.tensors(I64, I64);
    let (want, _) = lg.pooled(&keys, &bags.pairs(), Some(&weights), 2);
    let mut o = Out::new(3, dim, F32, false);
    let mut s = LookupStats::default();
    ok(pooled(&t, &x, true, 2, &mut o, &mut s));
    o.holds(&want, "after the failures");
}

/// The tables of the batch cases, the same on every rank: two distributed (different dims,
/// dtypes and splits), two local (keyed float32 with misses; dense bfloat16), one local keyed
/// table whose missing keys are errors, and one distributed such table.
struct Tables {
    d1: Owned,
    d2: Owned,
    l1: Owned,
    l2: Owned,
    strict: Owned,
    dstrict: Owned,
    l1_keys: Vec<i64>,
    /// Keep the distributed tables' source memory alive.
    _keep: Vec<Vec<u8>>,
}

impl Tables {
    fn new(cx: &Ctx) -> Tables {
        let g1 = random_values(F32, 27 * 5, 51);
        let mut s1 = Split::new(&g1, F32, 5, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
        let d1 = dist(s1.c(), cx, &TableOptions { default_value: 0.5, ..TableOptions::default() });
        let g2 = random_values(F16, 40 * 3, 52);
        let counts: Vec<i64> = (0..cx.size as i64).map(|p| 40 / cx.size as i64 + i64::from(p < 40 % cx.size as i64)).collect();
        let mut s2 = Split::new(&g2, F16, 3, &counts, &split_owners(cx.size as usize, cx.size), cx.rank);
        let d2 = dist(s2.c(), cx, &TableOptions { default_value: -1.0, ..TableOptions::default() });
        let mut rng = Rng(53);
        let (l1_keys, v1) = random_table(&mut rng, 100, 4);
        let l1 = Owned::build(&v1, 100, 4, Some(&l1_keys), &TableOptions { default_value: 0.25, ..TableOptions::default() });
        let g4 = random_values(BF16, 30 * 6, 54);
        let l2 = Owned::build_bytes(&g4, BF16, 30, 6, None, &TableOptions::default());
        let strict = Owned::build(&v1, 100, 4, Some(&l1_keys), &TableOptions { missing_key: 1, ..TableOptions::default() });
        let g5 = random_values(F32, 20 * 2, 55);
        let mut s5 = Split::new(&g5, F32, 2, &[10, 10], &split_owners(2, cx.size), cx.rank);
        let dstrict = dist(s5.c(), cx, &TableOptions { missing_key: 1, ..TableOptions::default() });
        Tables { d1, d2, l1, l2, strict, dstrict, l1_keys, _keep: vec![g1, g2, g5] }
    }
}

/// One request of a batch: its table, keys (and bags when pooled), output and stats.
pub(crate) struct Req<'a> {
    table: &'a Owned,
    dim: usize,
    pooling: i32,
    weighted: bool,
    bags: Bags,
    x: Tensors,
    /// Plain requests: the keys' shape.
    shape: Vec<i64>,
    odt: DLDataType,
    strided: bool,
    with_stats: bool,
}

impl Req<'_> {
    pub(crate) fn out(&self) -> Out {
        if self.pooling == 0 {
            let mut s = self.shape.clone();
            s.push(self.dim as i64);
            Out::shaped(&s, self.odt, self.strided)
        } else {
            Out::new(self.bags.b, self.dim, self.odt, self.strided)
        }
    }

    fn c(&self, out: &mut Out, stats: &mut LookupStats) -> strata_lookup_request {
        let pooled = self.pooling != 0;
        strata_lookup_request {
            table: self.table.0,
            keys: &self.x.k.t,
            offsets: if pooled { self.x.o.as_ref().map_or(null(), |o| &o.t) } else { null() },
            weights: if pooled && self.weighted { &self.x.w.t } else { null() },
            pooling: self.pooling,
            out: &mut out.d.t,
            stats: if self.with_stats { stats } else { null_mut() },
            ..strata_lookup_request_default()
        }
    }

    /// The same lookup as a separate call (`strata_lookup` or `strata_lookup_pooled`).
    pub(crate) fn alone(&self, out: &mut Out, stats: &mut LookupStats) -> Status {
        if self.pooling != 0 {
            return pooled(self.table, &self.x, self.weighted, self.pooling, out, stats);
        }
        // SAFETY: the table is live (Owned); the keys and out describe buffers alive past the
        // call; stats is a reference.
        unsafe { strata_lookup(self.table.0, &self.x.k.t, &mut out.d.t, null(), stats) }
    }
}

/// `n` keys drawn by `draw`.
fn draw(rng: &mut Rng, n: i64, f: impl Fn(&mut Rng) -> i64) -> Vec<i64> {
    (0..n).map(|_| f(rng)).collect()
}

/// A plain request of `table` (rows of `dim`) for `keys` as `kdt`, shaped `shape`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plain_req<'a>(
    table: &'a Owned,
    dim: usize,
    keys: Vec<i64>,
    kdt: DLDataType,
    shape: &[i64],
    odt: DLDataType,
    strided: bool,
    with_stats: bool,
) -> Req<'a> {
    let bags = Bags::plain(keys);
    let x = bags.plain_tensors(kdt, shape);
    Req { table, dim, pooling: 0, weighted: false, bags, x, shape: shape.to_vec(), odt, strided, with_stats }
}

/// A pooled request of `table` (rows of `dim`) for `bags`, keys as `kdt`, offsets as `offdt`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pooled_req<'a>(
    table: &'a Owned,
    dim: usize,
    pooling: i32,
    weighted: bool,
    bags: Bags,
    kdt: DLDataType,
    offdt: DLDataType,
    odt: DLDataType,
    strided: bool,
) -> Req<'a> {
    let x = bags.tensors(kdt, offdt);
    Req { table, dim, pooling, weighted, bags, x, shape: vec![], odt, strided, with_stats: true }
}

/// The batch of the batch cases, with this rank's own keys.
fn requests<'a>(tb: &'a Tables, rng: &mut Rng) -> Vec<Req<'a>> {
    let l1 = &tb.l1_keys;
    let mut v = Vec::new();
    let m = rng.below(40) as i64;
    v.push(plain_req(&tb.d1, 5, draw(rng, m, |r| r.below(30) as i64), I64, &[m], F32, false, true));
    let n = 1 + rng.below(9) as usize;
    let mut b = Bags::ragged(rng, n, 6, 100);
    b.keys.iter_mut().for_each(|k| {
        if *k % 4 != 0 {
            *k = l1[k.rem_euclid(100) as usize]
        }
    });
    v.push(pooled_req(&tb.l1, 4, 1, true, b, I64, I32, F16, false));
    let n = rng.below(7) as usize;
    let b = Bags::ragged(rng, n, 5, 40);
    v.push(pooled_req(&tb.d2, 3, 2, false, b, U32, I64, F32, true));
    let m = 1 + rng.below(20) as i64;
    v.push(plain_req(&tb.l2, 6, draw(rng, 2 * m, |r| r.below(33) as i64), I32, &[2, m], F32, true, true));
    let n = rng.below(6) as usize;
    let b = Bags::fixed(rng, n, 3, 27);
    v.push(pooled_req(&tb.d1, 5, 3, true, b, I64, I64, BF16, false));
    let m = rng.below(25) as i64;
    v.push(plain_req(&tb.d2, 3, draw(rng, m, |r| r.below(44) as i64), U64, &[m], F16, false, false));
    let m = 1 + rng.below(10) as i64;
    let keys = draw(rng, m, |r| if r.below(3) == 0 { r.below(1000) as i64 } else { l1[r.below(100) as usize] });
    v.push(plain_req(&tb.l1, 4, keys, I64, &[m], F32, false, true));
    v
}

/// Runs `reqs` as one `strata_lookup_batch` into fresh poisoned outputs; returns the status,
/// outputs and stats.
pub(crate) fn batch(reqs: &[Req]) -> (Status, Vec<Out>, Vec<LookupStats>) {
    batch_with(reqs, null())
}

/// [`batch`] with the batch's options.
fn batch_with(reqs: &[Req], opts: *const LookupOptions) -> (Status, Vec<Out>, Vec<LookupStats>) {
    batch_edited(reqs, opts, |_| {})
}

/// [`batch_with`], with the C requests edited by `edit` before the call.
fn batch_edited(
    reqs: &[Req],
    opts: *const LookupOptions,
    edit: impl FnOnce(&mut [strata_lookup_request]),
) -> (Status, Vec<Out>, Vec<LookupStats>) {
    let mut outs: Vec<Out> = reqs.iter().map(Req::out).collect();
    let mut stats = vec![LookupStats { hits: 77, misses: 77, ..LookupStats::default() }; reqs.len()];
    let mut c: Vec<strata_lookup_request> = reqs.iter().zip(&mut outs).zip(&mut stats).map(|((r, o), s)| r.c(o, s)).collect();
    edit(&mut c);
    // SAFETY: c holds reqs.len() requests, each pointing at live tables (Owned), at descriptions
    // of buffers owned by reqs and outs, and at stats, all alive past the call.
    let s = unsafe { strata_lookup_batch(c.as_ptr(), c.len(), opts) };
    (s, outs, stats)
}

/// Runs `reqs` as a batch and as separate calls: the outputs are equal, byte for byte.
fn same_as_separate_calls(reqs: &[Req]) {
    let (s, outs, _) = batch(reqs);
    ok(s);
    for (i, (r, o)) in reqs.iter().zip(&outs).enumerate() {
        let mut alone = r.out();
        ok(r.alone(&mut alone, &mut LookupStats::default()));
        assert_eq!(o.bytes(), alone.bytes(), "requests[{i}] differs from the separate call");
    }
}

/// A batch of plain and pooled requests over distributed and local tables of different dims and
/// dtypes equals the separate calls, bit for bit, with the same stats per request (a request
/// without stats gets none); every rank brings its own keys (a rank may have none).
pub fn batch_mixed(cx: &Ctx) {
    let tb = Tables::new(cx);
    let mut rng = Rng(4000 + cx.rank as u64);
    for round in 0..4 {
        let reqs = requests(&tb, &mut rng);
        let (s, outs, stats) = batch(&reqs);
        ok(s);
        for (i, ((r, o), st)) in reqs.iter().zip(&outs).zip(&stats).enumerate() {
            let mut alone = r.out();
            let mut st2 = LookupStats::default();
            ok(r.alone(&mut alone, &mut st2));
            assert_eq!(o.bytes(), alone.bytes(), "round {round}: requests[{i}] differs from the separate call");
            if r.with_stats {
                assert_eq!((st.hits, st.misses), (st2.hits, st2.misses), "round {round}: requests[{i}] stats");
                assert_eq!(st.hits + st.misses, r.bags.keys.len() as u64, "round {round}: requests[{i}] stats count keys");
            } else {
                assert_eq!((st.hits, st.misses), (77, 77), "round {round}: requests[{i}] had no stats to write");
            }
        }
        // the distributed requests against the loop, too
        let lg1 = Logical::of(&random_values(F32, 27 * 5, 51), F32, 27, 5, 0.5);
        let (want, _) = lg1.plain(&reqs[0].bags.keys);
        outs[0].holds(&want, "requests[0]");
        let (want, _) = lg1.pooled(&reqs[4].bags.keys, &reqs[4].bags.pairs(), Some(&reqs[4].bags.weights), 3);
        outs[4].holds(&want, "requests[4]");
        let lg2 = Logical::of(&random_values(F16, 40 * 3, 52), F16, 40, 3, -1.0);
        let (want, _) = lg2.pooled(&reqs[2].bags.keys, &reqs[2].bags.pairs(), None, 2);
        outs[2].holds(&want, "requests[2]");
    }
    // a batch of distributed requests only, and an empty batch (a no-op, not collective)
    let reqs: Vec<Req> =
        requests(&tb, &mut rng).into_iter().enumerate().filter(|(i, _)| [0, 2, 4, 5].contains(i)).map(|(_, r)| r).collect();
    same_as_separate_calls(&reqs);
    // SAFETY: n = 0 with a NULL array is the documented no-op.
    ok(unsafe { strata_lookup_batch(null(), 0, null()) });
}

/// An invalid request on one rank (or on every rank) fails the batch on every rank, naming the
/// request, before any output of any request is written; a missing key under
/// `STRATA_MISSING_ERROR` (found while running, in a local or a distributed table) fails every
/// rank too. The batch works again afterwards.
pub fn batch_errors(cx: &Ctx) {
    let tb = Tables::new(cx);
    let mut rng = Rng(5000 + cx.rank as u64);
    let l = cx.last();
    let untouched = |outs: &[Out], what: &str| outs.iter().enumerate().for_each(|(i, o)| o.untouched(&format!("{what}: requests[{i}]")));

    // an out dtype of int32 in request 4 (distributed, pooled), on the last rank
    let mut reqs = requests(&tb, &mut rng);
    if cx.rank == l {
        reqs[4].odt = I32;
    }
    let (s, outs, stats) = batch(&reqs);
    all_fail(cx, s, Status::STRATA_UNSUPPORTED_DTYPE, Some(l), &["requests[4].out: dtype int32"]);
    untouched(&outs, "a bad out on the last rank");
    assert!(stats.iter().all(|s| (s.hits, s.misses) == (77, 77)), "stats are not written on failure");

    // offsets not starting at 0 in request 2 (distributed), on every rank
    let mut reqs = requests(&tb, &mut rng);
    reqs[2] = pooled_req(&tb.d2, 3, 2, false, Bags { offsets: Some(vec![1, 1]), b: 1, ..Bags::plain(vec![3]) }, U32, I64, F32, true);
    let (s, outs, _) = batch(&reqs);
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, None, &["requests[2].offsets: offsets[0] = 1; expected 0"]);
    untouched(&outs, "bad offsets on every rank");

    // weights of another shape in request 1 (a local table), on rank 0
    let mut reqs = requests(&tb, &mut rng);
    let short = vec![1f32; reqs[1].bags.keys.len() + 1];
    if cx.rank == 0 {
        reqs[1].x.w = Desc::compact(short.as_ptr().cast(), F32, &[short.len() as i64]);
    }
    let (s, outs, _) = batch(&reqs);
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(0), &["requests[1].weights: shape [", "]; expected the keys' shape ["]);
    untouched(&outs, "bad weights on rank 0");

    // an unknown pooling in request 3 (a local table), on the last rank: refused before the
    // batch is planned, and still every rank fails
    let mut reqs = requests(&tb, &mut rng);
    if cx.rank == l {
        reqs[3].pooling = 9;
    }
    let (s, outs, _) = batch(&reqs);
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(l), &["requests[3].pooling: 9; expected"]);
    untouched(&outs, "an unknown pooling on the last rank");

    // a missing key in a local table whose missing keys are errors, before the distributed
    // requests, on rank 0 only: found while running, it still fails every rank
    let mut reqs = requests(&tb, &mut rng);
    let m = 3 + rng.below(5) as i64;
    let mut keys = draw(&mut rng, m, |r| tb.l1_keys[r.below(100) as usize]);
    if cx.rank == 0 {
        keys[1] = 123_456_789_012;
    }
    reqs.insert(1, plain_req(&tb.strict, 4, keys, I64, &[m], F32, false, true));
    let (s, _, _) = batch(&reqs);
    all_fail(cx, s, Status::STRATA_KEY_NOT_FOUND, Some(0), &["requests[1].keys: key 123456789012 (element 1) is not in the table"]);

    // a missing key in a distributed table whose missing keys are errors, on the last rank
    let mut reqs = requests(&tb, &mut rng);
    let kd: Vec<i64> = if cx.rank == l { vec![3, 25, 7] } else { vec![1, 2, 19] };
    let b = Bags { offsets: Some(vec![0, 1, 3]), b: 2, ..Bags::plain(kd) };
    reqs.push(pooled_req(&tb.dstrict, 2, 1, false, b, I64, I64, F32, true));
    let (s, _, _) = batch(&reqs);
    all_fail(
        cx,
        s,
        Status::STRATA_KEY_NOT_FOUND,
        Some(l),
        &[&format!("requests[{}].keys: key 25 (element 1) is not in the table", reqs.len() - 1)],
    );

    // unreadable options (struct_size 0) on rank 0: refused before any request is planned
    let reqs = requests(&tb, &mut rng);
    let bad = LookupOptions { struct_size: 0, ..strata_lookup_options_default() };
    let (s, outs, _) = batch_with(&reqs, if cx.rank == 0 { &bad } else { null() });
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(0), &["opts"]);
    untouched(&outs, "bad opts on rank 0");

    // and the batch works again
    let reqs = requests(&tb, &mut rng);
    same_as_separate_calls(&reqs);
}

/// A rank that cannot name the batch's distributed table (its request array is unreadable, or
/// the one distributed request has a NULL table there) still fails every rank, naming itself;
/// nothing is written anywhere, and the batch works again after.
pub fn batch_unreadable(cx: &Ctx) {
    let tb = Tables::new(cx);
    let mut rng = Rng(6000 + cx.rank as u64);
    let l = cx.last();
    let untouched = |outs: &[Out], what: &str| outs.iter().enumerate().for_each(|(i, o)| o.untouched(&format!("{what}: requests[{i}]")));

    // requests[0].struct_size = 0 (never initialised) on the last rank: no request is readable
    let reqs = requests(&tb, &mut rng);
    let (s, outs, _) = batch_edited(&reqs, null(), |c| {
        if cx.rank == l {
            c[0].struct_size = 0;
        }
    });
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(l), &["requests"]);
    untouched(&outs, "an unreadable request array on the last rank");

    // a batch whose only request is distributed, with a NULL table on rank 0
    let b = Bags::ragged(&mut rng, 3, 4, 40);
    let reqs = vec![pooled_req(&tb.d2, 3, 1, true, b, I64, I64, F32, false)];
    let (s, outs, _) = batch_edited(&reqs, null(), |c| {
        if cx.rank == 0 {
            c[0].table = null_mut();
        }
    });
    all_fail(cx, s, Status::STRATA_NULL_ARGUMENT, Some(0), &["requests[0].table"]);
    untouched(&outs, "a NULL distributed table on rank 0");

    // the same with the distributed request after a local one
    let m = 4;
    let keys = draw(&mut rng, m, |r| tb.l1_keys[r.below(100) as usize]);
    let b = Bags::ragged(&mut rng, 2, 4, 40);
    let reqs = vec![plain_req(&tb.l1, 4, keys, I64, &[m], F32, false, true), pooled_req(&tb.d2, 3, 2, false, b, U32, I32, F16, true)];
    let (s, outs, _) = batch_edited(&reqs, null(), |c| {
        if cx.rank == l {
            c[1].table = null_mut();
        }
    });
    all_fail(cx, s, Status::STRATA_NULL_ARGUMENT, Some(l), &["requests[1].table"]);
    untouched(&outs, "a NULL distributed table after a local request on the last rank");

    let reqs = requests(&tb, &mut rng);
    same_as_separate_calls(&reqs);
}

/// What a rank's call ended with, after every rank's: the same status everywhere (not OK), the
/// culprit's own message, and on every other rank a message naming the culprit.
#[track_caller]
fn every_rank_names(cx: &Ctx, s: Status, culprit: i32, what: &str) {
    let msg = last_error();
    let all = cx.gather(s as i32);
    assert!(all.iter().all(|&x| x == all[0] && x != Status::STRATA_OK as i32), "rank {}: {what}: statuses {all:?} ({msg})", cx.rank);
    if cx.rank == culprit {
        assert!(!msg.contains("failed the collective call"), "rank {}: {what}: {msg}", cx.rank);
    } else {
        assert!(msg.starts_with(&format!("rank {culprit} failed the collective call: ")), "rank {}: {what}: {msg}", cx.rank);
    }
}

/// One field of one rank's arguments, corrupted at random (the same draw on every rank: which
/// call, which rank, which field), for plain, pooled and batch calls on distributed tables:
/// every rank returns the same failing status, the other ranks' messages name the culprit, no
/// output is written, and no rank waits forever (the launcher's timeout bounds each run). The
/// calls work again after each failure.
pub fn one_rank_one_field(cx: &Ctx) {
    let tb = Tables::new(cx);
    let mut shared = Rng(7000);
    let mut mine = Rng(7100 + cx.rank as u64);
    let bad_opts = LookupOptions { struct_size: 0, ..strata_lookup_options_default() };
    let bad_stats_size = LookupStats { struct_size: 0, ..LookupStats::default() };
    for round in 0..36 {
        let culprit = shared.below(cx.size as u64) as i32;
        let field = shared.below(6);
        let me = cx.rank == culprit;
        match shared.below(3) {
            // strata_lookup on d1 (dim 5, 30 rows)
            0 => {
                let n = 1 + mine.below(20) as i64;
                let keys = draw(&mut mine, n, |r| r.below(30) as i64);
                let kb: Vec<i64> = keys.clone();
                let fk: Vec<f32> = keys.iter().map(|&k| k as f32).collect();
                let k = Desc::compact(kb.as_ptr().cast(), I64, &[n]);
                let kf = Desc::compact(fk.as_ptr().cast(), F32, &[n]);
                let mut out = Out::new(n as usize, 5, F32, false);
                let mut wrong = Out::new(n as usize, 4, F32, false);
                let mut stats = if me && field == 5 { bad_stats_size } else { LookupStats::default() };
                let what = format!("round {round}: strata_lookup, field {field} on rank {culprit}");
                // SAFETY: d1 is live; every description covers a buffer alive past the call; opts
                // and stats are references or NULL.
                let s = unsafe {
                    strata_lookup(
                        tb.d1.0,
                        if me && field == 0 {
                            null()
                        } else if me && field == 1 {
                            &kf.t
                        } else {
                            &k.t
                        },
                        if me && field == 2 {
                            null_mut()
                        } else if me && field == 3 {
                            &mut wrong.d.t
                        } else {
                            &mut out.d.t
                        },
                        if me && field == 4 { &bad_opts } else { null() },
                        &mut stats,
                    )
                };
                every_rank_names(cx, s, culprit, &what);
                out.untouched(&what);
            }
            // strata_lookup_pooled on d2 (dim 3, 40 rows)
            1 => {
                let nb = 1 + mine.below(5) as usize;
                let mut b = Bags::ragged(&mut mine, nb, 4, 40);
                if me && field == 3 {
                    b.offsets.as_mut().unwrap()[0] = 1;
                }
                let x = b.tensors(I64, I64);
                let short = vec![1f32; b.keys.len() + 1];
                let ws = Desc::compact(short.as_ptr().cast(), F32, &[short.len() as i64]);
                let mut out = Out::new(b.b, 3, F32, true);
                let mut stats = LookupStats::default();
                let what = format!("round {round}: strata_lookup_pooled, field {field} on rank {culprit}");
                // SAFETY: d2 is live; every description covers a buffer alive past the call; opts
                // and stats are references or NULL.
                let s = unsafe {
                    strata_lookup_pooled(
                        tb.d2.0,
                        if me && field == 0 { null() } else { &x.k.t },
                        x.o.as_ref().map_or(null(), |o| &o.t),
                        if me && field == 4 { &ws.t } else { &x.w.t },
                        if me && field == 2 { 9 } else { 1 },
                        if me && field == 1 { null_mut() } else { &mut out.d.t },
                        if me && field == 5 { &bad_opts } else { null() },
                        &mut stats,
                    )
                };
                every_rank_names(cx, s, culprit, &what);
                out.untouched(&what);
            }
            // strata_lookup_batch over the mixed requests
            _ => {
                let reqs = requests(&tb, &mut mine);
                let at = shared.below(reqs.len() as u64) as usize;
                let what = format!("round {round}: strata_lookup_batch, field {field} of requests[{at}] on rank {culprit}");
                let opts: *const LookupOptions = if me && field == 5 { &bad_opts } else { null() };
                let (s, outs, _) = batch_edited(&reqs, opts, |c| {
                    if !me {
                        return;
                    }
                    match field {
                        0 => c[0].struct_size = 0,
                        1 => c[at].table = null_mut(),
                        2 => c[at].keys = null(),
                        3 => c[at].pooling = 9,
                        4 => c[at].out = null_mut(),
                        _ => {}
                    }
                });
                every_rank_names(cx, s, culprit, &what);
                outs.iter().for_each(|o| o.untouched(&what));
            }
        }
    }
    let reqs = requests(&tb, &mut mine);
    same_as_separate_calls(&reqs);
}
