//! Lookups through the C ABI against a reference gather: every key dtype, out dtype, shape and
//! stride case, dense and keyed tables, misses, stats and threads. Outputs are poisoned before
//! each call and every byte outside `out`'s elements is checked untouched afterwards.

mod common;
use common::*;
use dlpark::ffi::{DLDataType, DLDeviceType};
use std::collections::HashMap;

const POISON: u8 = 0xA5;

/// Element offsets of each flat (row-major) index of `shape` under `strides`.
fn offsets(shape: &[i64], strides: &[i64]) -> Vec<i64> {
    let n: i64 = shape.iter().product();
    (0..n)
        .map(|mut i| {
            let mut off = 0;
            for d in (0..shape.len()).rev() {
                off += (i % shape[d]) * strides[d];
                i /= shape[d];
            }
            off
        })
        .collect()
}

/// Byte positions of each element: `byte_offset + offset * size`, all non-negative.
fn positions(offs: &[i64], byte_offset: u64, size: usize) -> Vec<usize> {
    offs.iter().map(|&o| usize::try_from(byte_offset as i64 + o * size as i64).expect("layout reaches before its buffer")).collect()
}

/// How the keys and the output of one lookup are laid out.
struct Layout {
    key_dtype: DLDataType,
    key_shape: Vec<i64>,
    key_strides: Vec<i64>,
    key_offset: u64,
    out_dtype: DLDataType,
    out_shape: Vec<i64>,
    out_strides: Vec<i64>,
    out_offset: u64,
}

impl Layout {
    fn compact(key_dtype: DLDataType, key_shape: &[i64], out_dtype: DLDataType, dim: i64) -> Layout {
        let mut out_shape = key_shape.to_vec();
        out_shape.push(dim);
        Layout {
            key_dtype,
            key_shape: key_shape.to_vec(),
            key_strides: compact_strides(key_shape),
            key_offset: 0,
            out_dtype,
            out_strides: compact_strides(&out_shape),
            out_shape,
            out_offset: 0,
        }
    }
}

/// A table plus what it should return, for the reference.
struct Fixture {
    table: Owned,
    vectors: Vec<f32>,
    dim: usize,
    rows_of: Option<HashMap<i64, usize>>,
    rows: usize,
    default: f32,
}

impl Fixture {
    fn dense(rng: &mut Rng, rows: usize, dim: usize, default: f32) -> Fixture {
        let vectors: Vec<f32> = (0..rows * dim).map(|_| rng.f32()).collect();
        let opts = TableOptions { default_value: default, ..TableOptions::default() };
        let table = Owned::build(&vectors, rows, dim, None, &opts);
        Fixture { table, vectors, dim, rows_of: None, rows, default }
    }

    fn keyed(rng: &mut Rng, rows: usize, dim: usize, default: f32) -> (Fixture, Vec<i64>) {
        let (keys, vectors) = random_table(rng, rows, dim);
        let opts = TableOptions { default_value: default, ..TableOptions::default() };
        let table = Owned::build(&vectors, rows, dim, Some(&keys), &opts);
        let rows_of = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        (Fixture { table, vectors, dim, rows_of: Some(rows_of), rows, default }, keys)
    }

    /// The row a key value (as the caller's dtype reads it) maps to.
    fn row(&self, key: i128) -> Option<usize> {
        match &self.rows_of {
            None => (key >= 0 && key < self.rows as i128).then_some(key as usize),
            // the canonical 64-bit pattern of the caller's value
            Some(m) => m.get(&(key as i64)).copied(),
        }
    }

    /// Runs a lookup of `keys` (flat order) laid out as `l` and checks every byte of `out`.
    fn check(&self, keys: &[i64], l: &Layout, threads: i32) -> LookupStats {
        let ksize = elem_size(l.key_dtype);
        let kpos = positions(&offsets(&l.key_shape, &l.key_strides), l.key_offset, ksize);
        assert_eq!(kpos.len(), keys.len());
        let kbytes = kpos.iter().max().map_or(0, |m| m + ksize);
        let mut kbuf = vec![0u64; kbytes.div_ceil(8) + 1];
        // SAFETY: the bytes of kbuf's words (same address, 8 * len bytes), borrowed mutably as long
        // as kbuf is; u8 has no alignment or validity requirement.
        let kb = unsafe { std::slice::from_raw_parts_mut(kbuf.as_mut_ptr().cast::<u8>(), kbuf.len() * 8) };
        for (&k, &at) in keys.iter().zip(&kpos) {
            write_key(l.key_dtype, &mut kb[at..], k);
        }
        let kp = kb.as_mut_ptr();
        let osize = elem_size(l.out_dtype);
        let opos = positions(&offsets(&l.out_shape, &l.out_strides), l.out_offset, osize);
        let obytes = opos.iter().max().map_or(0, |m| m + osize);
        let guard = 64;
        let mut obuf = vec![POISON; obytes + 2 * guard + 8];
        let base = {
            let p = obuf.as_mut_ptr() as usize + guard;
            p.div_ceil(8) * 8 - obuf.as_ptr() as usize
        };
        let op = obuf[base..].as_mut_ptr();
        let kd = Desc::new(kp, l.key_dtype, &l.key_shape, &l.key_strides, l.key_offset);
        let mut od = Desc::new(op, l.out_dtype, &l.out_shape, &l.out_strides, l.out_offset);
        let opts = LookupOptions { num_threads: threads, ..LookupOptions::default() };
        let mut stats = LookupStats { hits: 99, misses: 99, volatile_hits: 99, persistent_hits: 99, ..LookupStats::default() };
        // SAFETY: self.table is a live table; kd and od describe kbuf and obuf, which this function
        // owns past the call and whose sizes cover every key and out position computed above; opts
        // and stats are references.
        ok(unsafe { strata_lookup(self.table.0, &kd.t, &mut od.t, &opts, &mut stats) });

        let mut expect_bytes = vec![POISON; obuf.len()];
        let signed = l.key_dtype.code == dlpark::ffi::DLDataTypeCode::INT;
        let (mut hits, mut misses) = (0, 0);
        for (i, &k) in keys.iter().enumerate() {
            let kv: i128 = match (signed, l.key_dtype.bits) {
                (true, 32) => k as i32 as i128,
                (true, _) => k as i128,
                (false, 32) => k as u32 as i128,
                (false, _) => k as u64 as i128,
            };
            let row = self.row(kv);
            if row.is_some() {
                hits += 1
            } else {
                misses += 1
            }
            for c in 0..self.dim {
                let v = row.map_or(self.default, |r| self.vectors[r * self.dim + c]);
                let flat = i * self.dim + c;
                let at = base + opos[flat];
                write_float(l.out_dtype, &mut expect_bytes[at..], round_to(l.out_dtype, v));
            }
        }
        if obuf != expect_bytes {
            let first = obuf.iter().zip(&expect_bytes).position(|(a, b)| a != b).unwrap();
            panic!(
                "output differs from the reference at byte {} (out starts at {}): got {:02x}, want {:02x}",
                first, base, obuf[first], expect_bytes[first]
            );
        }
        assert_eq!((stats.hits, stats.misses), (hits, misses));
        stats
    }
}

const KEY_DTYPES: [DLDataType; 4] = [I32, I64, U32, U64];
const OUT_DTYPES: [DLDataType; 3] = [F32, F16, BF16];

#[test]
fn every_key_and_out_dtype_dense() {
    let mut rng = Rng(1);
    let f = Fixture::dense(&mut rng, 300, 7, -2.5);
    let keys: Vec<i64> = (0..257).map(|_| rng.below(400) as i64 - 50).collect();
    for kd in KEY_DTYPES {
        for od in OUT_DTYPES {
            let s = f.check(&keys, &Layout::compact(kd, &[keys.len() as i64], od, 7), 0);
            assert!(s.misses > 0 && s.hits > 0);
        }
    }
}

#[test]
fn every_key_and_out_dtype_keyed() {
    let mut rng = Rng(2);
    let (f, tkeys) = Fixture::keyed(&mut rng, 500, 33, 0.75);
    let keys: Vec<i64> = (0..1000).map(|_| if rng.below(4) == 0 { rng.next() as i64 } else { tkeys[rng.below(500) as usize] }).collect();
    for kd in KEY_DTYPES {
        for od in OUT_DTYPES {
            f.check(&keys, &Layout::compact(kd, &[keys.len() as i64], od, 33), 0);
        }
    }
}

#[test]
fn key_shapes_and_out_forms() {
    let mut rng = Rng(3);
    let (f, tkeys) = Fixture::keyed(&mut rng, 100, 5, 9.0);
    for shape in [vec![], vec![1], vec![6], vec![2, 3], vec![2, 3, 4], vec![3, 0, 2]] {
        let n: i64 = shape.iter().product();
        let keys: Vec<i64> = (0..n).map(|i| if i % 3 == 0 { -1 } else { tkeys[rng.below(100) as usize] }).collect();
        // [*keys.shape, dim]
        f.check(&keys, &Layout::compact(I64, &shape, F32, 5), 0);
        // [numel, dim]
        let mut l = Layout::compact(I64, &shape, F32, 5);
        l.out_shape = vec![n, 5];
        l.out_strides = vec![5, 1];
        f.check(&keys, &l, 0);
    }
}

#[test]
fn strided_keys_and_outputs() {
    let mut rng = Rng(4);
    let f = Fixture::dense(&mut rng, 64, 6, 0.0);
    let keys: Vec<i64> = (0..24).map(|_| rng.below(80) as i64).collect();
    for od in OUT_DTYPES {
        // every third key, with a byte offset
        let mut l = Layout::compact(I32, &[24], od, 6);
        l.key_strides = vec![3];
        l.key_offset = 8;
        f.check(&keys, &l, 0);
        // reversed keys (negative stride, byte_offset at the last one)
        let mut l = Layout::compact(I64, &[24], od, 6);
        l.key_strides = vec![-2];
        l.key_offset = 8 * 46;
        f.check(&keys, &l, 0);
        // transposed 2-D keys, stride-0 broadcast keys
        let mut l = Layout::compact(U64, &[4, 6], od, 6);
        l.key_strides = vec![1, 4];
        f.check(&keys, &l, 0);
        let bcast: Vec<i64> = vec![keys[0]; 24];
        let mut l = Layout::compact(I64, &[4, 6], od, 6);
        l.key_strides = vec![0, 0];
        f.check(&bcast, &l, 0);
        // padded output rows, column-strided output, transposed output, out byte_offset
        let mut l = Layout::compact(I64, &[24], od, 6);
        l.out_strides = vec![10, 1];
        l.out_offset = 4 * elem_size(od) as u64;
        f.check(&keys, &l, 0);
        let mut l = Layout::compact(I64, &[24], od, 6);
        l.out_strides = vec![13, 2];
        f.check(&keys, &l, 0);
        let mut l = Layout::compact(I64, &[24], od, 6);
        l.out_strides = vec![1, 24];
        f.check(&keys, &l, 0);
        // 2-D keys into a 3-D output with permuted strides
        let mut l = Layout::compact(I64, &[4, 6], od, 6);
        l.out_strides = vec![6, 4 * 6 + 5, 1];
        l.out_shape = vec![4, 6, 6];
        f.check(&keys, &l, 0);
    }
}

#[test]
fn threads_do_not_change_results_and_large_batches_stream() {
    let mut rng = Rng(5);
    let (f, tkeys) = Fixture::keyed(&mut rng, 20_000, 64, -1.0);
    // 40K keys x 64 x 4 bytes = 10 MB: above the streaming-store threshold and many tasks.
    let keys: Vec<i64> =
        (0..40_000).map(|_| if rng.below(10) == 0 { rng.next() as i64 } else { tkeys[rng.below(20_000) as usize] }).collect();
    let mut seen = None;
    for threads in [1, 2, 3, 0, 64] {
        let s = f.check(&keys, &Layout::compact(I64, &[40_000], F32, 64), threads);
        assert_eq!(*seen.get_or_insert(s), s);
    }
    f.check(&keys, &Layout::compact(I64, &[40_000], F16, 64), 0);
    let mut l = Layout::compact(I64, &[40_000], F32, 64);
    l.out_strides = vec![65, 1];
    f.check(&keys, &l, 2);
}

#[test]
fn many_host_threads_share_one_table() {
    let mut rng = Rng(6);
    let (f, tkeys) = Fixture::keyed(&mut rng, 5000, 16, 3.0);
    let batches: Vec<Vec<i64>> =
        (0..8).map(|_| (0..3000).map(|_| if rng.below(5) == 0 { -7 } else { tkeys[rng.below(5000) as usize] }).collect()).collect();
    std::thread::scope(|s| {
        for (t, keys) in batches.iter().enumerate() {
            let f = &f;
            s.spawn(move || {
                for round in 0..20 {
                    f.check(keys, &Layout::compact(I64, &[3000], F32, 16), (t % 3) as i32 + round % 2);
                }
            });
        }
    });
}

#[test]
fn half_precision_tables() {
    let mut rng = Rng(7);
    for vd in [F16, BF16] {
        let (rows, dim) = (40usize, 9usize);
        let vals: Vec<f32> = (0..rows * dim).map(|_| rng.f32()).collect();
        let mut buf = vec![0u16; rows * dim];
        for (i, &v) in vals.iter().enumerate() {
            let mut bits = [0u8; 2];
            write_float(vd, &mut bits, v);
            buf[i] = u16::from_ne_bytes(bits);
        }
        let v = Desc::compact(buf.as_ptr().cast(), vd, &[rows as i64, dim as i64]);
        let mut t = std::ptr::null_mut();
        let opts = TableOptions { default_value: 0.5, ..TableOptions::default() };
        // SAFETY: v describes buf, [rows, dim] elements of vd, alive past the call (strata copies
        // it); opts and t are references.
        ok(unsafe { strata_table_from_dlpack(&v.t, std::ptr::null(), &opts, &mut t) });
        let rounded: Vec<f32> = vals.iter().map(|&x| round_to(vd, x)).collect();
        let f = Fixture { table: Owned(t), vectors: rounded, dim, rows_of: None, rows, default: round_to(vd, 0.5) };
        let keys: Vec<i64> = (0..50).map(|_| rng.below(45) as i64).collect();
        for od in OUT_DTYPES {
            f.check(&keys, &Layout::compact(I64, &[50], od, dim as i64), 0);
            let mut l = Layout::compact(I64, &[50], od, dim as i64);
            l.out_strides = vec![20, 2];
            f.check(&keys, &l, 0);
        }
    }
}

#[test]
fn copied_tables_from_strided_vectors_and_int32_keys() {
    let mut rng = Rng(8);
    let (rows, dim) = (30usize, 4usize);
    // vectors are every other column of a [rows, 2*dim+1] array
    let big: Vec<f32> = (0..rows * (2 * dim + 1)).map(|_| rng.f32()).collect();
    let v = Desc::new(big.as_ptr().cast(), F32, &[rows as i64, dim as i64], &[2 * dim as i64 + 1, 2], 4);
    let keys: Vec<i32> = (0..rows as i32).map(|i| i * 1000 - 7).collect();
    let k = Desc::new(keys.as_ptr().cast(), I32, &[rows as i64], &[1], 0);
    let mut t = std::ptr::null_mut();
    // SAFETY: v and k describe big and keys, alive past the call (strata copies the rows it reads);
    // t is a reference.
    ok(unsafe { strata_table_from_dlpack(&v.t, &k.t, std::ptr::null(), &mut t) });
    let vectors: Vec<f32> =
        (0..rows).flat_map(|r| (0..dim).map(move |c| (r, c))).map(|(r, c)| big[1 + r * (2 * dim + 1) + 2 * c]).collect();
    drop(big);
    let rows_of = keys.iter().enumerate().map(|(i, &k)| (k as i64, i)).collect();
    let f = Fixture { table: Owned(t), vectors, dim, rows_of: Some(rows_of), rows, default: 0.0 };
    let q: Vec<i64> = (0..64).map(|i| if i % 5 == 0 { 3 } else { keys[rng.below(30) as usize] as i64 }).collect();
    for kd in KEY_DTYPES {
        f.check(&q, &Layout::compact(kd, &[64], F32, dim as i64), 1);
    }
    let mut info = strata_table_info_default_0_3_1();
    // SAFETY: f.table is a live table (Owned); info is a reference.
    ok(unsafe { strata_table_get_info(f.table.0, &mut info) });
    assert_eq!((info.rows, info.dim, info.keyed, info.mapped, info.adopted), (30, 4, true, false, false));
    assert!(info.index_bytes > 0 && info.index_bytes <= 16 * 30 + 64 * 2);
    // SAFETY: f.table is a live table (Owned).
    assert_eq!(unsafe { strata_table_len(f.table.0) }, 30);
    // SAFETY: f.table is a live table (Owned).
    assert_eq!(unsafe { strata_table_dim(f.table.0) }, 4);
}

#[test]
fn cuda_host_memory_is_served() {
    let mut rng = Rng(9);
    let f = Fixture::dense(&mut rng, 10, 3, 0.0);
    let keys = [1i64, 5, 12];
    let mut out = [0f32; 9];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[3]).device(DLDeviceType::CUDAHOST);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[3, 3]).device(DLDeviceType::CUDAHOST);
    let mut s = LookupStats::default();
    // SAFETY: f.table is a live table; k and o describe keys and out (3 keys, 3x3 floats), host
    // memory flagged as pinned, alive past the call; s is a reference.
    ok(unsafe { strata_lookup(f.table.0, &k.t, &mut o.t, std::ptr::null(), &mut s) });
    assert_eq!(&out[..3], &f.vectors[3..6]);
    assert_eq!(&out[3..6], &f.vectors[15..18]);
    assert_eq!(&out[6..], &[0.0; 3]);
    assert_eq!((s.hits, s.misses), (2, 1));
}

#[test]
fn missing_key_error_policy_names_the_first_missing_key() {
    let mut rng = Rng(10);
    let (keys, vectors) = random_table(&mut rng, 50, 4);
    let opts = TableOptions { missing_key: strata_missing_key::STRATA_MISSING_ERROR as i32, ..TableOptions::default() };
    let t = Owned::build(&vectors, 50, 4, Some(&keys), &opts);
    let mut q: Vec<i64> = (0..5000).map(|i| keys[i % 50]).collect();
    q[3001] = 123_456_789_012;
    q[4000] = 5;
    let mut out = vec![0f32; 5000 * 4];
    let k = Desc::compact(q.as_ptr().cast(), I64, &[5000]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[5000, 4]);
    for threads in [1, 2] {
        let opts = LookupOptions { num_threads: threads, ..LookupOptions::default() };
        // SAFETY: t is a live table; k and o describe q and out (5000 keys, 5000x4 floats), alive
        // past the call; opts is a reference.
        let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, &opts, std::ptr::null_mut()) };
        fails(s, Status::STRATA_KEY_NOT_FOUND, &["keys: key 123456789012 (element 3001)"]);
    }
    // all present: OK
    q[3001] = keys[0];
    q[4000] = keys[1];
    // SAFETY: t is a live table; k and o describe q and out (5000 keys, 5000x4 floats), alive past
    // the call.
    ok(unsafe { strata_lookup(t.0, &k.t, &mut o.t, std::ptr::null(), std::ptr::null_mut()) });
}

#[test]
fn zero_keys_is_a_no_op() {
    let mut rng = Rng(11);
    let f = Fixture::dense(&mut rng, 10, 3, 0.0);
    let mut out = [7.0f32; 3];
    let k = Desc::compact(std::ptr::null(), I64, &[0]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[0, 3]);
    let mut s = LookupStats { hits: 5, misses: 5, volatile_hits: 5, persistent_hits: 5, ..LookupStats::default() };
    // SAFETY: f.table is a live table; k has no elements (its NULL data is never read) and o
    // describes out; s is a reference.
    ok(unsafe { strata_lookup(f.table.0, &k.t, &mut o.t, std::ptr::null(), &mut s) });
    assert_eq!(out, [7.0; 3]);
    assert_eq!(s, LookupStats::default());
}

#[test]
fn empty_tables_miss_everything() {
    let v = Desc::compact(std::ptr::null(), F32, &[0, 4]);
    let k = Desc::compact(std::ptr::null(), I64, &[0]);
    for keyed in [false, true] {
        let mut t = std::ptr::null_mut();
        let opts = TableOptions { default_value: 1.5, ..TableOptions::default() };
        // SAFETY: v and k describe zero elements, so their NULL data is never read; opts and t are
        // references.
        ok(unsafe { strata_table_from_dlpack(&v.t, if keyed { &k.t } else { std::ptr::null() }, &opts, &mut t) });
        let t = Owned(t);
        let q = [0i64, 1, -1];
        let mut out = [0f32; 12];
        let kd = Desc::compact(q.as_ptr().cast(), I64, &[3]);
        let mut od = Desc::compact(out.as_mut_ptr().cast(), F32, &[3, 4]);
        let mut s = LookupStats::default();
        // SAFETY: t is a live table; kd and od describe q and out (3 keys, 3x4 floats), alive past
        // the call; s is a reference.
        ok(unsafe { strata_lookup(t.0, &kd.t, &mut od.t, std::ptr::null(), &mut s) });
        assert_eq!(out, [1.5; 12]);
        assert_eq!((s.hits, s.misses), (0, 3));
    }
}

/// A plain DLTensor carries no DLPack version, and producers before DLPack 1.2 may pass NULL
/// strides for compact row-major data: keys, out (and the vectors a table is copied from) with
/// NULL strides are read and written row-major, at any rank and with a byte_offset. NULL options
/// and stats, so the test does not depend on their layout.
#[test]
fn null_strides_mean_row_major() {
    use std::ptr::{null, null_mut};
    let vectors: Vec<f32> = (0..12).map(|i| i as f32 + 0.5).collect();
    let table_keys = [10i64, 20, 30, 40];
    let mut v = Desc::compact(vectors.as_ptr().cast(), F32, &[4, 3]);
    v.t.strides = null_mut();
    let mut tk = Desc::compact(table_keys.as_ptr().cast(), I64, &[4]);
    tk.t.strides = null_mut();
    let mut t = null_mut();
    // SAFETY: v and tk describe vectors and table_keys, compact, so NULL strides read them
    // row-major; t is a reference.
    ok(unsafe { strata_table_from_dlpack(&v.t, &tk.t, null(), &mut t) });
    let row = |key: i32| match table_keys.iter().position(|&k| k == key as i64) {
        Some(r) => vectors[r * 3..r * 3 + 3].to_vec(),
        None => vec![0.0; 3],
    };
    // keys [2, 3] into out [2, 3, 3]
    let keys = [40i32, 10, 99, 20, 30, 40];
    let want: Vec<f32> = keys.iter().flat_map(|&k| row(k)).collect();
    let mut out = vec![f32::NAN; 18];
    let mut k = Desc::compact(keys.as_ptr().cast(), I32, &[2, 3]);
    k.t.strides = null_mut();
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[2, 3, 3]);
    o.t.strides = null_mut();
    // SAFETY: t is the live table built above; k and o describe keys and out ([2, 3] and [2, 3, 3],
    // compact, read and written row-major), alive past the call.
    ok(unsafe { strata_lookup(t, &k.t, &mut o.t, null(), null_mut()) });
    assert_eq!(out, want);
    // the same keys into a flat out [6, 3] that starts one element in (byte_offset)
    let mut out2 = vec![f32::NAN; 19];
    let mut o2 = Desc::compact(out2.as_mut_ptr().cast(), F32, &[6, 3]);
    o2.t.strides = null_mut();
    o2.t.byte_offset = 4;
    // SAFETY: t is live; o2 describes 18 floats of out2 from byte_offset 4, which its 19 elements
    // hold.
    ok(unsafe { strata_lookup(t, &k.t, &mut o2.t, null(), null_mut()) });
    assert!(out2[0].is_nan());
    assert_eq!(out2[1..], want[..]);
    // SAFETY: t was built above by strata_table_from_dlpack and is not used after this free.
    unsafe { strata_table_free(t) };
}

#[test]
fn row_sizes_and_chunk_edges_match_the_reference() {
    // The gather resolves a chunk of keys, then copies it with rows prefetched a number of keys
    // ahead that depends on the row size: row sizes from 4 bytes to over 1 KiB, batches around
    // the chunk size, on one thread and several, with misses and repeated keys.
    let mut rng = Rng(31);
    for dim in [1usize, 3, 16, 100, 300] {
        let (f, tkeys) = Fixture::keyed(&mut rng, 3_000, dim, 0.5);
        let d = Fixture::dense(&mut rng, 3_000, dim, -2.0);
        for n in [1usize, 15, 17, 255, 256, 257, 2047, 2049, 5_000] {
            let keys: Vec<i64> = (0..n)
                .map(|i| match rng.below(10) {
                    0 => rng.next() as i64,
                    1 => tkeys[i % 7],
                    _ => tkeys[rng.below(3_000) as usize],
                })
                .collect();
            let dense_keys: Vec<i64> = (0..n).map(|_| rng.below(3_300) as i64 - 100).collect();
            for threads in [1, 3] {
                f.check(&keys, &Layout::compact(I64, &[n as i64], F32, dim as i64), threads);
                d.check(&dense_keys, &Layout::compact(I64, &[n as i64], F32, dim as i64), threads);
            }
        }
    }
}
