//! The CUDA kernels and the GPU lookup algorithms, run on the CPU.
//!
//! `gather.cu` is compiled as C++ with `tests/cuda_emu/` (each warp's 32 lanes run as fibers
//! that meet at warp collectives) into a shared library, and `strata::exec::cuda::emulate`
//! drives it with the same parameter structs, gather/cache code and shard split as the GPU
//! path. Every case is compared with the CPU path's lookup of the same keys on random data,
//! bit for bit, with poisoned outputs: plain lookups, pooled lookups (`Table::lookup_request`:
//! every pooling, weighted and not, ragged offsets with empty bags and fixed hotness, misses,
//! every table and out dtype, tensors in place and staged) and batches of both; tables quantized
//! at build (int8, int4, fp8: random, constant and extreme rows) the same way in every placement,
//! and their float32 rows against the scalar reference `RowFormat::value`. This runs everywhere (CI has no GPU); what it cannot show
//! is anything about real devices: memory copies, streams, peer access and timing
//! (tests/cuda.rs and scripts/gpu-check.sh cover those on a GPU).
#![cfg(feature = "cuda")]

mod common;
use common::*;
use dlpark::ffi::{DLDataType, DLTensor};
use std::path::PathBuf;
use std::sync::OnceLock;
use strata::exec::cuda::emulate::{self as emulate, Emulated, Emulator, Placement, Staged};
use strata::exec::cuda::params::{BatchParams, CacheParams, GatherParams, PooledParams};
use strata::kernels::{RowFormat, quantize_row};
use strata::model::{Pooling, Request};
use strata::{LookupOptions, MissingKey, Table, TableOptions};

/// A pooled request of these tensors, with stats.
/// # Safety
/// The tensors must describe live buffers of their shapes, as `Request::new` requires.
unsafe fn pooled<'a>(
    keys: &'a DLTensor,
    offsets: Option<&'a DLTensor>,
    weights: Option<&'a DLTensor>,
    pooling: Pooling,
    out: &'a DLTensor,
) -> Request<'a> {
    // SAFETY: forwarded from the caller.
    unsafe { Request::new(keys, offsets, weights, Some(pooling), out, true) }
}

/// Vouches for a test tensor, which describes memory the test owns for the whole lookup.
fn vouch(t: &DLTensor) -> strata::dlpack::Vouched<'_> {
    // SAFETY: the tests' tensors describe buffers they keep alive across each lookup.
    unsafe { strata::dlpack::Vouched::new(t) }
}

/// Builds the emulator library once per test process.
fn emulator() -> &'static Emulator {
    static EMU: OnceLock<Emulator> = OnceLock::new();
    EMU.get_or_init(|| {
        // STRATA_SOURCE_DIR: the source tree when this binary runs away from where it was built.
        let root = std::env::var_os("STRATA_SOURCE_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
        let out = std::env::temp_dir().join(format!("strata_emu_{}.so", std::process::id()));
        let st = std::process::Command::new("g++")
            .args(["-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-DSTRATA_EMULATE", "-Wall", "-Wextra", "-Werror"])
            // float32 arithmetic as the kernels' .rn instructions: nothing fused into an FMA
            .arg("-ffp-contract=off")
            .arg("-Wno-unknown-pragmas")
            .arg("-I")
            .arg(root.join("tests/cuda_emu"))
            .arg(root.join("tests/cuda_emu/launch.cc"))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("g++ runs (the kernel emulator is C++)");
        assert!(st.success(), "compiling gather.cu for the emulator failed");
        Emulator::load(&out).unwrap()
    })
}

const KEY_TYPES: [DLDataType; 4] = [I32, I64, U32, U64];
const FLOATS: [DLDataType; 3] = [F32, F16, BF16];

/// A random table: `rows` x `dim` of `dtype`, dense or keyed (keys spread over signed values).
struct TestTable {
    table: Table,
    keys: Vec<i64>,
}

fn make_table(rng: &mut Rng, rows: usize, dim: usize, dtype: DLDataType, keyed: bool, default: f32) -> TestTable {
    let size = elem_size(dtype);
    let mut data = vec![0u8; rows * dim * size];
    for i in 0..rows * dim {
        write_float(dtype, &mut data[i * size..], rng.f32() * 100.0);
    }
    table_of(rng, &data, rows, dim, dtype, keyed, TableOptions { default_value: default, ..TableOptions::default() })
}

/// A table of `rows` x `dim` float32 values quantized as `format` at build: rows of random
/// values, constant rows (scale 0 or, for int4, the float16 bias alone), rows of extreme
/// magnitudes (within what the format can hold) and of tiny ones (fp8: subnormal codes and
/// products).
/// Returns the table and the float32 values it was built from.
fn make_quantized(rng: &mut Rng, rows: usize, dim: usize, format: RowFormat, keyed: bool, default: f32) -> (TestTable, Vec<f32>) {
    let big = if format == RowFormat::Int4 { 3.0e4 } else { 1.0e37 };
    let mut values = vec![0f32; rows * dim];
    for (r, row) in values.chunks_exact_mut(dim).enumerate() {
        let constant = rng.f32() * 50.0;
        for x in row.iter_mut() {
            *x = match r % 5 {
                0 => constant,
                1 => rng.f32() * big,
                2 => rng.f32() * 1e-36,
                _ => rng.f32() * 100.0,
            };
        }
    }
    let data: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let opts = TableOptions { default_value: default, storage: Some(format), ..TableOptions::default() };
    (table_of(rng, &data, rows, dim, F32, keyed, opts), values)
}

/// A table of `data` (`rows` x `dim` of `dtype`) with `opts`, dense or keyed (random keys
/// spread over signed values).
fn table_of(rng: &mut Rng, data: &[u8], rows: usize, dim: usize, dtype: DLDataType, keyed: bool, opts: TableOptions) -> TestTable {
    let v = Desc::compact(data.as_ptr(), dtype, &[rows as i64, dim as i64]);
    let mut keys: Vec<i64> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while keys.len() < rows {
        let k = (rng.next() % 2_000_000) as i64 - 200_000;
        if seen.insert(k) {
            keys.push(k);
        }
    }
    let kd = Desc::compact(keys.as_ptr().cast(), I64, &[rows as i64]);
    // SAFETY: v describes data ([rows, dim] of dtype, compact) and kd describes keys (rows i64),
    // both alive past the call; the table copies what it reads.
    let table = unsafe { Table::from_dlpack(&v.t, keyed.then_some(&kd.t), opts) }.unwrap();
    if !keyed {
        keys = (0..rows as i64).collect();
    }
    TestTable { table, keys }
}

/// `n` keys of dtype `kd`: mostly table keys, some missing ones (including negatives).
fn make_keys(rng: &mut Rng, t: &TestTable, n: usize, kd: DLDataType) -> Vec<u8> {
    let size = elem_size(kd);
    let mut out = vec![0u8; n * size];
    for i in 0..n {
        let k: i64 = if rng.below(5) == 0 { rng.next() as i64 % 3_000_000 } else { t.keys[rng.below(t.keys.len() as u64) as usize] };
        let b = k.to_le_bytes();
        out[i * size..(i + 1) * size].copy_from_slice(&b[..size]);
    }
    out
}

/// Runs the CPU path and the emulated path on the same keys into poisoned outputs of the same
/// layout and checks they agree bit for bit, stats included. `keys` must describe readable
/// host memory (every caller's describes keys inside its `make_keys` buffer).
fn compare(emu: &Emulator, placed: &Emulated, t: &TestTable, keys: &Desc, out_dtype: DLDataType, out_shape: &[i64], out_strides: &[i64]) {
    let size = elem_size(out_dtype);
    let span = out_shape.iter().zip(out_strides).map(|(&n, &s)| (n - 1).max(0) * s).sum::<i64>() as usize + 1;
    let mut want = vec![0xA5u8; span * size + 16];
    let mut got = want.clone();
    let w = Desc::new(want.as_mut_ptr(), out_dtype, out_shape, out_strides, 0);
    let g = Desc::new(got.as_mut_ptr(), out_dtype, out_shape, out_strides, 0);
    // Vouched: keys describes readable host memory (the promise of every caller, above) and w
    // describes want, whose span * size bytes cover every element out_shape and out_strides reach.
    let cpu = t.table.lookup(vouch(&keys.t), vouch(&w.t), &LookupOptions::default()).unwrap();
    // SAFETY: keys describes readable host memory (the promise of every caller, above) and g
    // describes got, whose span * size bytes cover every element out_shape and out_strides reach.
    let gpu = unsafe { placed.lookup(emu, t.table.source().unwrap(), &keys.t, &g.t) }.unwrap();
    assert_eq!((gpu.hits, gpu.misses), (cpu.hits, cpu.misses), "stats");
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!("emulated lookup differs from the CPU path at byte {i} of {} (out {out_shape:?} {out_strides:?})", got.len());
    }
}

#[test]
fn parameter_structs_match_the_kernels() {
    let s = emulator().sizes();
    assert_eq!(s[0] as usize, std::mem::size_of::<GatherParams>());
    assert_eq!(s[1] as usize, std::mem::size_of::<CacheParams>());
    assert_eq!(s[2], 64, "an index bucket is 64 bytes on both sides");
    assert_eq!(s[3] as usize, std::mem::size_of::<PooledParams>());
    assert_eq!(s[4] as usize, std::mem::size_of::<BatchParams>());
}

#[test]
fn gather_matches_the_cpu_path_for_every_dtype() {
    let emu = emulator();
    let mut rng = Rng(11);
    for keyed in [false, true] {
        for td in FLOATS {
            let t = make_table(&mut rng, 300, 12, td, keyed, -2.5);
            let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
            for kd in KEY_TYPES {
                for od in FLOATS {
                    for n in [1usize, 37, 300] {
                        let kb = make_keys(&mut rng, &t, n, kd);
                        let k = Desc::compact(kb.as_ptr(), kd, &[n as i64]);
                        compare(emu, &placed, &t, &k, od, &[n as i64, 12], &[12, 1]);
                    }
                }
            }
        }
    }
}

#[test]
fn gather_layouts_wide_rows_and_strides() {
    let emu = emulator();
    let mut rng = Rng(12);
    // dim a multiple of 4 with aligned rows: the 16-byte path; 70: the element path.
    for dim in [64usize, 70] {
        let t = make_table(&mut rng, 500, dim, F32, true, 0.25);
        let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
        let d = dim as i64;
        let kb = make_keys(&mut rng, &t, 120, I64);
        // 2-D keys [8, 15] -> out [8, 15, dim]
        let k2 = Desc::compact(kb.as_ptr(), I64, &[8, 15]);
        compare(emu, &placed, &t, &k2, F32, &[8, 15, d], &[15 * d, d, 1]);
        // reversed keys (negative stride): kernels read them in place
        let rev = Desc::new(kb.as_ptr(), I64, &[120], &[-1], 119 * 8);
        compare(emu, &placed, &t, &rev, F32, &[120, d], &[d, 1]);
        // every other key, out with a column stride of 2 and padded rows
        let every = Desc::new(kb.as_ptr(), I64, &[60], &[2], 0);
        compare(emu, &placed, &t, &every, BF16, &[60, d], &[2 * d + 3, 2]);
        // keys [8, 15] transposed (not one stride): read and canonicalised first
        let tr = Desc::new(kb.as_ptr(), I64, &[15, 8], &[1, 15], 0);
        compare(emu, &placed, &t, &tr, F16, &[15, 8, d], &[8 * d, d, 1]);
        // out's leading dims not one stride: staged, then written
        compare(emu, &placed, &t, &k2, F32, &[8, 15, d], &[15 * (d + 1), d + 1, 1]);
    }
}

#[test]
fn shards_serve_the_keys_they_own() {
    let emu = emulator();
    let mut rng = Rng(13);
    for keyed in [false, true] {
        for count in [1usize, 2, 3, 4] {
            let t = make_table(&mut rng, 257, 9, F16, keyed, 7.0);
            let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Shards { count }).unwrap();
            for kd in [I32, U64] {
                let kb = make_keys(&mut rng, &t, 400, kd);
                let k = Desc::compact(kb.as_ptr(), kd, &[400]);
                compare(emu, &placed, &t, &k, F32, &[400, 9], &[9, 1]);
            }
        }
    }
}

#[test]
fn cache_resolves_misses_on_the_host_and_keeps_hot_rows() {
    let emu = emulator();
    let mut rng = Rng(14);
    for td in FLOATS {
        for fraction in [0.0f32, 0.05, 0.5, 1.0] {
            let t = make_table(&mut rng, 400, 10, td, true, 1.5);
            // threshold above 1: every miss is resolved before the lookup's rows are final.
            let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Cache { fraction, threshold: 2.0 }).unwrap();
            for round in 0..4 {
                let kd = KEY_TYPES[round % 4];
                let kb = make_keys(&mut rng, &t, 150, kd);
                let k = Desc::compact(kb.as_ptr(), kd, &[150]);
                for od in FLOATS {
                    compare(emu, &placed, &t, &k, od, &[150, 10], &[10, 1]);
                }
            }
            let hot = placed.last_hit_rate().unwrap();
            if fraction == 0.0 {
                assert_eq!(hot, 0.0, "a cache of no rows never hits");
            }
            if fraction == 1.0 {
                assert!(hot > 0.5, "repeated keys hit a cache of every row (hit rate {hot})");
            }
        }
    }
}

#[test]
fn cache_above_the_threshold_fills_defaults_and_inserts_in_the_background() {
    let emu = emulator();
    let mut rng = Rng(15);
    let t = make_table(&mut rng, 200, 8, F32, true, -4.0);
    // threshold 0: every lookup counts as "hit rate high enough": misses get defaults now.
    let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Cache { fraction: 1.0, threshold: 0.0 }).unwrap();
    let keys: Vec<i64> = t.keys[..50].to_vec();
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[50]);
    let mut out = vec![f32::NAN; 50 * 8];
    let o = Desc::compact(out.as_mut_ptr().cast(), F32, &[50, 8]);
    // SAFETY: k and o describe keys (50 i64) and out (50x8 floats), alive past the call.
    let first = unsafe { placed.lookup(emu, t.table.source().unwrap(), &k.t, &o.t) }.unwrap();
    assert_eq!((first.hits, first.misses), (0, 50), "cold cache: all 50 got the default row");
    assert!(out.iter().all(|&x| x == -4.0));
    // The background insert has run (the emulator runs it at once): the rows are now cached.
    let mut want = vec![0f32; 50 * 8];
    let w = Desc::compact(want.as_mut_ptr().cast(), F32, &[50, 8]);
    // Vouched: k and w describe keys (50 i64) and want (50x8 floats), alive past the call.
    t.table.lookup(vouch(&k.t), vouch(&w.t), &LookupOptions::default()).unwrap();
    out.fill(f32::NAN);
    // SAFETY: k and o describe keys (50 i64) and out (50x8 floats), alive past the call.
    let second = unsafe { placed.lookup(emu, t.table.source().unwrap(), &k.t, &o.t) }.unwrap();
    assert_eq!((second.hits, second.misses), (50, 0));
    assert_eq!(out, want);
    assert_eq!(placed.last_hit_rate(), Some(1.0));
}

#[test]
fn cache_in_front_of_server_tiers() {
    let emu = emulator();
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<i64> = (0..300).map(|i| i * 5 + 3).collect();
    let dim = 6;
    let d = dir.path().join("t0");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("key"), keys.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let rows: Vec<u8> =
        keys.iter().flat_map(|&k| (0..dim).map(move |c| k as f32 * 0.25 + c as f32)).flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(d.join("emb_vector"), rows).unwrap();
    let json = format!(
        r#"{{ "volatile_db": {{ "type": "parallel_hash_map", "initial_cache_rate": 1.0 }},
             "models": [ {{ "model": "m", "sparse_files": ["{}"], "embedding_vecsize_per_table": [{dim}],
                            "maxnum_catfeature_query_per_table_per_sample": [1], "default_value_for_each_table": [9.0],
                            "deployed_device_list": [0], "max_batch_size": 8, "gpucacheper": 0.25 }} ] }}"#,
        d.display()
    );
    let ps = dir.path().join("ps.json");
    std::fs::write(&ps, json).unwrap();
    let server = strata::server::Server::open(&ps).unwrap();
    let table = server.table("m", 0).unwrap();
    let placed = Emulated::place(emu, table.source().unwrap(), Placement::Cache { fraction: 0.25, threshold: 2.0 }).unwrap();
    let mut rng = Rng(16);
    for _ in 0..3 {
        let ks: Vec<i64> = (0..90).map(|_| if rng.below(4) == 0 { -7 } else { keys[rng.below(300) as usize] }).collect();
        let k = Desc::compact(ks.as_ptr().cast(), I64, &[90]);
        let mut got = vec![f32::NAN; 90 * dim];
        let g = Desc::compact(got.as_mut_ptr().cast(), F32, &[90, dim as i64]);
        // SAFETY: k and g describe ks (90 i64) and got (90 x dim floats), alive past the call.
        let st = unsafe { placed.lookup(emu, table.source().unwrap(), &k.t, &g.t) }.unwrap();
        for (i, &key) in ks.iter().enumerate() {
            let row = &got[i * dim..(i + 1) * dim];
            if key == -7 {
                assert!(row.iter().all(|&x| x == 9.0), "missing key {key}: {row:?}");
            } else {
                let want: Vec<f32> = (0..dim).map(|c| key as f32 * 0.25 + c as f32).collect();
                assert_eq!(row, &want[..], "key {key}");
            }
        }
        let missing = ks.iter().filter(|&&k| k == -7).count() as u64;
        assert_eq!((st.hits, st.misses), (90 - missing, missing));
    }
}

#[test]
fn missing_keys_as_errors_name_the_first_one_like_the_cpu_path() {
    let emu = emulator();
    let mut rng = Rng(17);
    let size = 4;
    let mut data = vec![0u8; 100 * 4 * size];
    for i in 0..400 {
        write_float(F32, &mut data[i * size..], rng.f32());
    }
    let v = Desc::compact(data.as_ptr(), F32, &[100, 4]);
    let strict = TableOptions { missing: MissingKey::Error, ..TableOptions::default() };
    // SAFETY: v describes data (100x4 floats, compact), alive past the call; the table copies it.
    let table = unsafe { Table::from_dlpack(&v.t, None, strict) }.unwrap();
    for placement in [Placement::Gather, Placement::Cache { fraction: 0.5, threshold: 0.0 }, Placement::Shards { count: 3 }] {
        let placed = Emulated::place(emu, table.source().unwrap(), placement).unwrap();
        // keys [3, 4] with 123 and -1 missing; in place, and transposed (staged from the host)
        let keys: [i32; 12] = [5, 9, 0, 99, 17, 123, 2, 3, -1, 8, 1, 4];
        for (shape, strides) in [([3i64, 4], [4i64, 1]), ([4, 3], [1, 4])] {
            let k = Desc::new(keys.as_ptr().cast(), I32, &shape, &strides, 0);
            let mut a = vec![0f32; 48];
            let mut b = vec![0f32; 48];
            let oa = Desc::compact(a.as_mut_ptr().cast(), F32, &[shape[0], shape[1], 4]);
            let ob = Desc::compact(b.as_mut_ptr().cast(), F32, &[shape[0], shape[1], 4]);
            // Vouched: k describes the 12 i32 of keys (as [3, 4] or its [4, 3] transpose, both
            // inside them) and oa describes a, whose 48 floats are shape[0] * shape[1] * 4; all
            // alive past the call.
            let cpu = table.lookup(vouch(&k.t), vouch(&oa.t), &LookupOptions::default()).unwrap_err().to_string();
            // SAFETY: k describes the 12 i32 of keys (as [3, 4] or its [4, 3] transpose, both
            // inside them) and ob describes b, whose 48 floats are shape[0] * shape[1] * 4; all
            // alive past the call.
            let gpu = unsafe { placed.lookup(emu, table.source().unwrap(), &k.t, &ob.t) }.unwrap_err().to_string();
            assert_eq!(gpu, cpu, "{placement:?} keys {shape:?}");
            assert!(cpu.contains("is not in the table"), "{cpu}");
        }
    }
}

// ---- pooled lookups and batches ----

const POOLINGS: [Pooling; 3] = [Pooling::Sum, Pooling::Mean, Pooling::Sqrtn];

/// Bags of keys for a pooled lookup, in host memory.
struct BagCase {
    kd: DLDataType,
    keys: Vec<u8>,
    nnz: usize,
    b: usize,
    /// Ragged: `B + 1` offsets (int32 or int64 bytes); fixed hotness: `None` and keys [B, L].
    offsets: Option<(Vec<u8>, DLDataType)>,
    hotness: usize,
    weights: Option<Vec<f32>>,
}

impl BagCase {
    /// Random bags over `t`'s keys (about 1 in 5 missing): ragged with empty bags (int32 or
    /// int64 offsets), or fixed hotness; weights in [-2, 2) with some zeros and some all-zero
    /// bags when `weighted`.
    fn random(rng: &mut Rng, t: &TestTable, kd: DLDataType, ragged: bool, weighted: bool) -> BagCase {
        let b = 1 + rng.below(24) as usize;
        let (nnz, offsets, hotness) = if ragged {
            let mut off = vec![0i64];
            for _ in 0..b {
                let len = if rng.below(4) == 0 { 0 } else { 1 + rng.below(40) as i64 };
                off.push(off.last().unwrap() + len);
            }
            let od = if rng.below(2) == 0 { I32 } else { I64 };
            let bytes: Vec<u8> = off.iter().flat_map(|&o| o.to_le_bytes()[..elem_size(od)].to_vec()).collect();
            (*off.last().unwrap() as usize, Some((bytes, od)), 0)
        } else {
            let l = [1usize, 3, 7, 33][rng.below(4) as usize];
            (b * l, None, l)
        };
        let keys = make_keys(rng, t, nnz, kd);
        let weights = weighted.then(|| {
            let mut w: Vec<f32> = (0..nnz).map(|_| if rng.below(8) == 0 { 0.0 } else { rng.f32() * 2.0 }).collect();
            // Some bags with a zero weight total (mean) and zero square total (sqrtn).
            let bounds = |i: usize| match &offsets {
                Some((bytes, od)) => read_int(bytes, *od, i),
                None => i * hotness,
            };
            for bag in 0..b {
                if rng.below(5) == 0 {
                    w[bounds(bag)..bounds(bag + 1)].fill(0.0);
                }
            }
            w
        });
        BagCase { kd, keys, nnz, b, offsets, hotness, weights }
    }

    fn keys_desc(&self) -> Desc {
        match self.offsets {
            Some(_) => Desc::compact(self.keys.as_ptr(), self.kd, &[self.nnz as i64]),
            None => Desc::compact(self.keys.as_ptr(), self.kd, &[self.b as i64, self.hotness as i64]),
        }
    }

    fn offsets_desc(&self) -> Option<Desc> {
        self.offsets.as_ref().map(|(bytes, od)| Desc::compact(bytes.as_ptr(), *od, &[self.b as i64 + 1]))
    }

    fn weights_desc(&self) -> Option<Desc> {
        let shape: Vec<i64> = match self.offsets {
            Some(_) => vec![self.nnz as i64],
            None => vec![self.b as i64, self.hotness as i64],
        };
        self.weights.as_ref().map(|w| Desc::compact(w.as_ptr().cast(), F32, &shape))
    }
}

fn read_int(bytes: &[u8], dt: DLDataType, i: usize) -> usize {
    let size = elem_size(dt);
    let mut b = [0u8; 8];
    b[..size].copy_from_slice(&bytes[i * size..(i + 1) * size]);
    i64::from_le_bytes(b) as usize
}

/// An output buffer poisoned with `fill`, and its description `[rows, dim]` with `strides`.
fn poisoned(dtype: DLDataType, shape: &[i64], strides: &[i64], fill: u8) -> Vec<u8> {
    let span = shape.iter().zip(strides).map(|(&n, &s)| (n - 1).max(0) * s).sum::<i64>() as usize + 1;
    vec![fill; span * elem_size(dtype) + 16]
}

/// Runs the CPU path's pooled lookup and the emulated one on `case` into poisoned outputs of the
/// same layout; checks they agree bit for bit, stats included.
#[allow(clippy::too_many_arguments)]
fn compare_pooled(
    emu: &Emulator,
    placed: &Emulated,
    t: &TestTable,
    case: &BagCase,
    pooling: Pooling,
    od: DLDataType,
    out_strides: &[i64],
    staged: Staged,
) {
    let dim = t.table.dim() as i64;
    let shape = [case.b as i64, dim];
    let mut want = poisoned(od, &shape, out_strides, 0xA5);
    let mut got = want.clone();
    let w = Desc::new(want.as_mut_ptr(), od, &shape, out_strides, 0);
    let g = Desc::new(got.as_mut_ptr(), od, &shape, out_strides, 0);
    let (k, o, wt) = (case.keys_desc(), case.offsets_desc(), case.weights_desc());
    let (o, wt) = (o.as_ref().map(|d| &d.t), wt.as_ref().map(|d| &d.t));
    // SAFETY: the tensors describe live host buffers of the shapes they give.
    let cpu = unsafe { t.table.lookup_request(&pooled(&k.t, o, wt, pooling, &w.t), &LookupOptions::default()) }.unwrap();
    // SAFETY: the tensors describe live host buffers of the shapes they give.
    let gpu = unsafe { placed.lookup_request(emu, t.table.source().unwrap(), &pooled(&k.t, o, wt, pooling, &g.t), staged) }.unwrap();
    let what = format!(
        "{pooling:?} keys {:?} B={} nnz={} ragged={} weighted={} out {od:?} {out_strides:?} {staged:?}",
        case.kd,
        case.b,
        case.nnz,
        case.offsets.is_some(),
        case.weights.is_some()
    );
    assert_eq!((gpu.hits, gpu.misses), (cpu.hits, cpu.misses), "stats: {what}");
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!("emulated pooled lookup differs from the CPU path at byte {i} of {}: {what}", got.len());
    }
}

#[test]
fn pooled_matches_the_cpu_path_for_every_pooling_and_dtype() {
    let emu = emulator();
    let mut rng = Rng(31);
    let mut case_no = 0;
    for keyed in [false, true] {
        for td in FLOATS {
            let t = make_table(&mut rng, 300, 20, td, keyed, -1.25);
            let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
            for pooling in POOLINGS {
                for ragged in [true, false] {
                    for weighted in [false, true] {
                        let kd = KEY_TYPES[case_no % 4];
                        case_no += 1;
                        let case = BagCase::random(&mut rng, &t, kd, ragged, weighted);
                        for od in FLOATS {
                            compare_pooled(emu, &placed, &t, &case, pooling, od, &[20, 1], Staged::default());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn pooled_wide_rows_strided_out_and_staged_tensors() {
    let emu = emulator();
    let mut rng = Rng(32);
    // 300 columns: two passes of 256 over each bag's keys; 64: the whole row in one.
    for dim in [300usize, 64] {
        let t = make_table(&mut rng, 400, dim, F16, true, 0.5);
        let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
        let d = dim as i64;
        let staged_all = Staged { keys: true, offsets: true, weights: true, out: true };
        for (i, pooling) in POOLINGS.into_iter().enumerate() {
            let case = BagCase::random(&mut rng, &t, I64, i != 1, true);
            compare_pooled(emu, &placed, &t, &case, pooling, F32, &[d, 1], staged_all);
            compare_pooled(emu, &placed, &t, &case, pooling, BF16, &[2 * d + 5, 2], Staged::default());
            compare_pooled(emu, &placed, &t, &case, pooling, F16, &[2 * d + 5, 2], staged_all);
            let offsets_only = Staged { offsets: true, ..Staged::default() };
            compare_pooled(emu, &placed, &t, &case, pooling, F32, &[d + 1, 1], offsets_only);
        }
    }
    // Keys and weights read in place with a stride (every other element of a wider buffer),
    // and reversed.
    let t = make_table(&mut rng, 200, 10, F32, true, 3.0);
    let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
    let kb = make_keys(&mut rng, &t, 60, I32);
    let wb: Vec<f32> = (0..60).map(|_| rng.f32()).collect();
    let offs: [i64; 4] = [0, 11, 11, 30];
    let o = Desc::compact(offs.as_ptr().cast(), I64, &[4]);
    for (strides, offset) in [([2i64], 0u64), ([-2], 59)] {
        let k = Desc::new(kb.as_ptr(), I32, &[30], &strides, offset * 4);
        let w = Desc::new(wb.as_ptr().cast(), F32, &[30], &strides, offset * 4);
        for staged in [Staged::default(), Staged { keys: true, weights: true, ..Staged::default() }] {
            let mut want = vec![0x5Au8; 3 * 10 * 4];
            let mut got = want.clone();
            let wd = Desc::compact(want.as_mut_ptr(), F32, &[3, 10]);
            let gd = Desc::compact(got.as_mut_ptr(), F32, &[3, 10]);
            // SAFETY: the tensors describe live host buffers of the shapes they give. (strided views stay
            // within `kb` and `wb`).
            let cpu =
                unsafe { t.table.lookup_request(&pooled(&k.t, Some(&o.t), Some(&w.t), Pooling::Mean, &wd.t), &LookupOptions::default()) }
                    .unwrap();
            // SAFETY: the tensors describe live host buffers of the shapes they give.
            let gpu = unsafe {
                placed.lookup_request(emu, t.table.source().unwrap(), &pooled(&k.t, Some(&o.t), Some(&w.t), Pooling::Mean, &gd.t), staged)
            }
            .unwrap();
            assert_eq!((gpu.hits, gpu.misses), (cpu.hits, cpu.misses));
            assert!(got == want, "strides {strides:?} {staged:?}");
        }
    }
}

#[test]
fn pooled_through_caches_and_shards_gathers_then_pools() {
    let emu = emulator();
    let mut rng = Rng(33);
    for td in FLOATS {
        let t = make_table(&mut rng, 250, 17, td, true, 2.0);
        let placements = [
            Placement::Cache { fraction: 0.3, threshold: 2.0 },
            Placement::Cache { fraction: 0.0, threshold: 2.0 },
            Placement::Shards { count: 3 },
        ];
        for placement in placements {
            let placed = Emulated::place(emu, t.table.source().unwrap(), placement).unwrap();
            for pooling in POOLINGS {
                let (ragged, weighted) = (rng.below(2) == 0, rng.below(2) == 0);
                let case = BagCase::random(&mut rng, &t, U64, ragged, weighted);
                let od = FLOATS[rng.below(3) as usize];
                compare_pooled(emu, &placed, &t, &case, pooling, od, &[17, 1], Staged::default());
            }
        }
    }
}

#[test]
fn pooled_empty_bags_and_no_keys_give_zeros() {
    let emu = emulator();
    let mut rng = Rng(34);
    let t = make_table(&mut rng, 50, 8, F32, false, 9.0);
    for placement in [Placement::Gather, Placement::Cache { fraction: 0.5, threshold: 2.0 }] {
        let placed = Emulated::place(emu, t.table.source().unwrap(), placement).unwrap();
        // nnz = 0 with B = 3 empty bags; and empty bags between full ones.
        let keys: Vec<i64> = vec![1, 2, 3, 999];
        for offs in [vec![0i32, 0, 0, 0], vec![0, 0, 2, 2, 4, 4]] {
            let nnz = *offs.last().unwrap() as usize;
            let case = BagCase {
                kd: I64,
                keys: keys[..nnz].iter().flat_map(|k| k.to_le_bytes()).collect(),
                nnz,
                b: offs.len() - 1,
                offsets: Some((offs.iter().flat_map(|o| o.to_le_bytes()).collect(), I32)),
                hotness: 0,
                weights: None,
            };
            for pooling in POOLINGS {
                compare_pooled(emu, &placed, &t, &case, pooling, F32, &[8, 1], Staged::default());
            }
        }
    }
}

#[test]
fn pooled_bad_offsets_in_place_fail_with_the_cpu_message() {
    let emu = emulator();
    let mut rng = Rng(35);
    let t = make_table(&mut rng, 40, 4, F32, false, 0.0);
    let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
    let keys: [i64; 5] = [1, 2, 3, 4, 5];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[5]);
    for offs in [[1i64, 2, 3, 5], [0, 3, 2, 5], [0, 1, 2, 4], [0, 1, 2, 7]] {
        let o = Desc::compact(offs.as_ptr().cast(), I64, &[4]);
        let mut a = vec![0f32; 12];
        let mut b = vec![0f32; 12];
        let oa = Desc::compact(a.as_mut_ptr().cast(), F32, &[3, 4]);
        let ob = Desc::compact(b.as_mut_ptr().cast(), F32, &[3, 4]);
        // SAFETY: the tensors describe live host buffers of the shapes they give.
        let cpu = unsafe { t.table.lookup_request(&pooled(&k.t, Some(&o.t), None, Pooling::Sum, &oa.t), &LookupOptions::default()) }
            .unwrap_err()
            .to_string();
        for staged in [Staged::default(), Staged { offsets: true, ..Staged::default() }] {
            let src = t.table.source().unwrap();
            // SAFETY: the tensors describe live host buffers of the shapes they give.
            let gpu = unsafe { placed.lookup_request(emu, src, &pooled(&k.t, Some(&o.t), None, Pooling::Sum, &ob.t), staged) }
                .unwrap_err()
                .to_string();
            assert_eq!(gpu, cpu, "offsets {offs:?} {staged:?}");
        }
    }
    // Shape errors: the same checks and messages as the CPU path.
    let w = [1f32; 4];
    let wd = Desc::compact(w.as_ptr().cast(), F32, &[4]);
    let offs = [0i64, 5];
    let o = Desc::compact(offs.as_ptr().cast(), I64, &[2]);
    let mut out = vec![0f32; 8];
    let one = Desc::compact(out.as_mut_ptr().cast(), F32, &[1, 4]);
    let two = Desc::compact(out.as_mut_ptr().cast(), F32, &[2, 4]);
    for (weights, offsets, out) in [(Some(&wd.t), Some(&o.t), &one.t), (None, None, &one.t), (None, Some(&o.t), &two.t)] {
        // SAFETY: the tensors describe live host buffers of the shapes they give.
        let cpu = unsafe { t.table.lookup_request(&pooled(&k.t, offsets, weights, Pooling::Mean, out), &LookupOptions::default()) }
            .unwrap_err()
            .to_string();
        // SAFETY: the tensors describe live host buffers of the shapes they give.
        let gpu = unsafe {
            placed.lookup_request(emu, t.table.source().unwrap(), &pooled(&k.t, offsets, weights, Pooling::Mean, out), Staged::default())
        }
        .unwrap_err()
        .to_string();
        assert_eq!(gpu, cpu);
    }
}

#[test]
fn pooled_missing_keys_as_errors_name_the_first_one_like_the_cpu_path() {
    let emu = emulator();
    let vectors: Vec<f32> = (0..400).map(|i| i as f32).collect();
    let v = Desc::compact(vectors.as_ptr().cast(), F32, &[100, 4]);
    let strict = TableOptions { missing: MissingKey::Error, ..TableOptions::default() };
    // SAFETY: `v` describes a live host buffer of the shape it gives.
    let table = unsafe { Table::from_dlpack(&v.t, None, strict) }.unwrap();
    let keys: [i32; 8] = [5, 9, 0, 99, 17, 123, 2, -1];
    let offs: [i32; 4] = [0, 3, 3, 8];
    let k = Desc::compact(keys.as_ptr().cast(), I32, &[8]);
    let o = Desc::compact(offs.as_ptr().cast(), I32, &[4]);
    for placement in [Placement::Gather, Placement::Cache { fraction: 0.5, threshold: 0.0 }, Placement::Shards { count: 2 }] {
        let placed = Emulated::place(emu, table.source().unwrap(), placement).unwrap();
        for staged in [Staged::default(), Staged { keys: true, offsets: true, ..Staged::default() }] {
            let mut a = vec![0f32; 12];
            let mut b = vec![0f32; 12];
            let oa = Desc::compact(a.as_mut_ptr().cast(), F32, &[3, 4]);
            let ob = Desc::compact(b.as_mut_ptr().cast(), F32, &[3, 4]);
            // SAFETY: the tensors describe live host buffers of the shapes they give.
            let cpu = unsafe { table.lookup_request(&pooled(&k.t, Some(&o.t), None, Pooling::Sum, &oa.t), &LookupOptions::default()) }
                .unwrap_err()
                .to_string();
            // SAFETY: the tensors describe live host buffers of the shapes they give.
            let gpu = unsafe {
                placed.lookup_request(emu, table.source().unwrap(), &pooled(&k.t, Some(&o.t), None, Pooling::Sum, &ob.t), staged)
            }
            .unwrap_err()
            .to_string();
            assert_eq!(gpu, cpu, "{placement:?} {staged:?}");
            assert!(cpu.contains("key 123 (element 5)"), "{cpu}");
        }
    }
}

/// One request of a batch test: its table, placement, tensors and the CPU path's answer.
struct BatchCase {
    table: usize,
    pooling: Option<Pooling>,
    bags: BagCase,
    od: DLDataType,
}

#[test]
fn batch_matches_separate_cpu_calls() {
    let emu = emulator();
    let mut rng = Rng(36);
    // Tables of different dims and dtypes; the last one behind a cache, the others gathered.
    let tables = [
        make_table(&mut rng, 120, 12, F32, false, -1.0),
        make_table(&mut rng, 300, 33, F16, true, 0.75),
        make_table(&mut rng, 90, 300, BF16, true, 2.0),
        make_table(&mut rng, 200, 6, F32, true, 5.0),
    ];
    let placements = [Placement::Gather, Placement::Gather, Placement::Gather, Placement::Cache { fraction: 0.4, threshold: 2.0 }];
    let placed: Vec<Emulated> =
        tables.iter().zip(placements).map(|(t, p)| Emulated::place(emu, t.table.source().unwrap(), p).unwrap()).collect();
    for round in 0..6 {
        let staged = if round % 2 == 0 { Staged::default() } else { Staged { keys: true, offsets: true, weights: true, out: true } };
        let n = 2 + rng.below(9) as usize;
        let cases: Vec<BatchCase> = (0..n)
            .map(|_| {
                let table = rng.below(tables.len() as u64) as usize;
                let pooling = match rng.below(4) {
                    0 => None,
                    p => Some(POOLINGS[p as usize - 1]),
                };
                let kd = KEY_TYPES[rng.below(4) as usize];
                let (ragged, weighted) = (rng.below(2) == 0, pooling.is_some() && rng.below(2) == 0);
                let bags = BagCase::random(&mut rng, &tables[table], kd, ragged || pooling.is_none(), weighted);
                BatchCase { table, pooling, bags, od: FLOATS[rng.below(3) as usize] }
            })
            .collect();
        run_batch_case(emu, &tables, &placed, &cases, staged, round);
    }
}

/// Runs `cases` as one emulated batch and as separate CPU calls into poisoned outputs; checks
/// rows and stats agree bit for bit.
fn run_batch_case(emu: &Emulator, tables: &[TestTable], placed: &[Emulated], cases: &[BatchCase], staged: Staged, round: usize) {
    let rows = |c: &BatchCase| if c.pooling.is_some() { c.bags.b } else { c.bags.nnz };
    let mut want: Vec<Vec<u8>> = cases.iter().map(|c| vec![0xA5u8; rows(c) * tables[c.table].table.dim() * elem_size(c.od)]).collect();
    let mut got = want.clone();
    let descs: Vec<_> = cases.iter().map(|c| (c.bags.keys_desc(), c.bags.offsets_desc(), c.bags.weights_desc())).collect();
    let outs = |bufs: &mut Vec<Vec<u8>>| -> Vec<Desc> {
        cases
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| Desc::compact(b.as_mut_ptr(), c.od, &[rows(c) as i64, tables[c.table].table.dim() as i64]))
            .collect()
    };
    let (want_d, got_d) = (outs(&mut want), outs(&mut got));
    let mut cpu = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let t = &tables[c.table].table;
        let (k, o, w) = &descs[i];
        cpu.push(match c.pooling {
            // Vouched: the tensors describe live host buffers of the shapes they give.
            None => t.lookup(vouch(&k.t), vouch(&want_d[i].t), &LookupOptions::default()).unwrap(),
            // SAFETY: the tensors describe live host buffers of the shapes they give.
            Some(p) => unsafe {
                t.lookup_request(
                    &pooled(&k.t, o.as_ref().map(|d| &d.t), w.as_ref().map(|d| &d.t), p, &want_d[i].t),
                    &LookupOptions::default(),
                )
            }
            .unwrap(),
        });
    }
    let requests: Vec<emulate::Request> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (k, o, w) = &descs[i];
            let pooled = c.pooling.is_some();
            emulate::Request {
                placed: &placed[c.table],
                table: tables[c.table].table.source().unwrap(),
                // SAFETY: the descriptions cover live host buffers of their shapes.
                request: unsafe {
                    Request::new(&k.t, o.as_ref().filter(|_| pooled).map(|d| &d.t), w.as_ref().map(|d| &d.t), c.pooling, &got_d[i].t, true)
                },
            }
        })
        .collect();
    // SAFETY: every request's tensors describe live host buffers of the shapes they give.
    let gpu = unsafe { emulate::lookup_batch(emu, &requests, staged) }.unwrap();
    for (i, c) in cases.iter().enumerate() {
        let what = format!("round {round} request {i}: table {} {:?} out {:?}", c.table, c.pooling, c.od);
        assert_eq!((gpu[i].hits, gpu[i].misses), (cpu[i].hits, cpu[i].misses), "stats of {what}");
        assert!(got[i] == want[i], "rows of {what} differ from a separate CPU call");
    }
}

#[test]
fn batch_is_validated_before_anything_runs() {
    let emu = emulator();
    let mut rng = Rng(37);
    let t = make_table(&mut rng, 100, 8, F32, true, 1.0);
    let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
    let kb = make_keys(&mut rng, &t, 10, I64);
    let k = Desc::compact(kb.as_ptr(), I64, &[10]);
    let k2 = Desc::compact(kb.as_ptr(), I64, &[2, 5]);
    let bad_w = [1f32; 4];
    let w = Desc::compact(bad_w.as_ptr().cast(), F32, &[4]);
    let mut outs = [vec![f32::NAN; 80], vec![f32::NAN; 16], vec![f32::NAN; 16]];
    let o0 = Desc::compact(outs[0].as_mut_ptr().cast(), F32, &[10, 8]);
    let o1 = Desc::compact(outs[1].as_mut_ptr().cast(), F32, &[2, 8]);
    let o2 = Desc::compact(outs[2].as_mut_ptr().cast(), F32, &[2, 8]);
    let src = t.table.source().unwrap();
    let req = |keys, weights, pooling, out| emulate::Request {
        placed: &placed,
        table: src,
        // SAFETY: the descriptions cover live host buffers of their shapes.
        request: unsafe { Request::new(keys, None, weights, pooling, out, true) },
    };
    let requests =
        [req(&k.t, None, None, &o0.t), req(&k2.t, None, Some(Pooling::Sum), &o1.t), req(&k2.t, Some(&w.t), Some(Pooling::Mean), &o2.t)];
    // SAFETY: every request's tensors describe live host buffers of the shapes they give.
    let e = unsafe { emulate::lookup_batch(emu, &requests, Staged::default()) }.unwrap_err().to_string();
    assert!(e.starts_with("requests[2].weights: shape [4]"), "{e}");
    assert!(outs.iter().flatten().all(|x| x.is_nan()), "a request ran before the batch was validated");
}

// ---- quantized rows (int8, int4, fp8): the kernels dequantize as the scalar reference does ----

const QUANTIZED: [RowFormat; 3] = [RowFormat::Int8, RowFormat::Int4, RowFormat::Fp8];

/// The float32 rows the scalar reference (`RowFormat::value` of `quantize_row`'s bytes) gives
/// for `keys` (i64) in a table built from `values`, the default row for missing keys.
fn reference_rows(t: &TestTable, values: &[f32], format: RowFormat, keys: &[i64], default: f32) -> Vec<f32> {
    let dim = t.table.dim();
    let mut q = vec![0u8; format.row_bytes(dim)];
    let mut out = Vec::with_capacity(keys.len() * dim);
    for k in keys {
        match t.keys.iter().position(|x| x == k) {
            Some(r) => {
                quantize_row(format, &values[r * dim..(r + 1) * dim], &mut q).unwrap();
                // SAFETY: q holds one row of dim values of `format`, and c < dim.
                out.extend((0..dim).map(|c| unsafe { strata::kernels::format::value(format, q.as_ptr(), dim, c) }));
            }
            None => out.extend(std::iter::repeat_n(default, dim)),
        }
    }
    out
}

#[test]
fn quantized_gather_matches_the_scalar_reference_and_the_cpu_path() {
    let emu = emulator();
    let mut rng = Rng(41);
    for format in QUANTIZED {
        // Odd dims put the scale and bias at unaligned addresses (int4 needs an even dim).
        let dims: &[usize] = if format == RowFormat::Int4 { &[2, 14, 64, 70] } else { &[1, 13, 64, 70] };
        for &dim in dims {
            for keyed in [false, true] {
                let (t, values) = make_quantized(&mut rng, 260, dim, format, keyed, -3.5);
                let placed = Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap();
                let d = dim as i64;
                for (i, kd) in KEY_TYPES.into_iter().enumerate() {
                    let kb = make_keys(&mut rng, &t, 90, kd);
                    let k = Desc::compact(kb.as_ptr(), kd, &[90]);
                    for od in FLOATS {
                        compare(emu, &placed, &t, &k, od, &[90, d], &[d, 1]);
                    }
                    // Strided out (column stride 2, padded rows).
                    compare(emu, &placed, &t, &k, FLOATS[i % 3], &[90, d], &[2 * d + 3, 2]);
                }
                // float32 out against the scalar reference itself, bit for bit, out poisoned.
                let kb = make_keys(&mut rng, &t, 200, I64);
                let keys: Vec<i64> = kb.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
                let k = Desc::compact(kb.as_ptr(), I64, &[200]);
                let mut got = vec![f32::NAN; 200 * dim];
                let g = Desc::compact(got.as_mut_ptr().cast(), F32, &[200, d]);
                // SAFETY: k and g describe kb (200 i64) and got (200 x dim floats), alive past the call.
                unsafe { placed.lookup(emu, t.table.source().unwrap(), &k.t, &g.t) }.unwrap();
                let want = reference_rows(&t, &values, format, &keys, -3.5);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                assert_eq!(bits(&got), bits(&want), "{format:?} dim {dim} keyed {keyed}");
            }
        }
    }
}

#[test]
fn quantized_rows_through_shards_and_caches() {
    let emu = emulator();
    let mut rng = Rng(42);
    for format in QUANTIZED {
        for keyed in [false, true] {
            let (t, _) = make_quantized(&mut rng, 300, 18, format, keyed, 6.0);
            let placements = [
                Placement::Shards { count: 3 },
                Placement::Cache { fraction: 0.3, threshold: 2.0 },
                Placement::Cache { fraction: 1.0, threshold: 2.0 },
            ];
            for placement in placements {
                let placed = Emulated::place(emu, t.table.source().unwrap(), placement).unwrap();
                for kd in [I32, I64, U64] {
                    let kb = make_keys(&mut rng, &t, 120, kd);
                    let k = Desc::compact(kb.as_ptr(), kd, &[120]);
                    for od in FLOATS {
                        compare(emu, &placed, &t, &k, od, &[120, 18], &[18, 1]);
                    }
                }
            }
        }
    }
}

#[test]
fn quantized_pooled_matches_the_cpu_path() {
    let emu = emulator();
    let mut rng = Rng(43);
    let mut case_no = 0;
    for format in QUANTIZED {
        // 20: one pass over each bag's keys; 300: two passes of 256 columns.
        for (dim, keyed) in [(20usize, false), (20, true), (300, true)] {
            let (t, _) = make_quantized(&mut rng, 250, dim, format, keyed, -1.5);
            let d = dim as i64;
            for placement in [Placement::Gather, Placement::Shards { count: 2 }, Placement::Cache { fraction: 0.4, threshold: 2.0 }] {
                let placed = Emulated::place(emu, t.table.source().unwrap(), placement).unwrap();
                for pooling in POOLINGS {
                    for (ragged, weighted) in [(true, false), (true, true), (false, true), (false, false)] {
                        let kd = KEY_TYPES[case_no % 4];
                        let od = FLOATS[case_no % 3];
                        case_no += 1;
                        let case = BagCase::random(&mut rng, &t, kd, ragged, weighted);
                        compare_pooled(emu, &placed, &t, &case, pooling, od, &[d, 1], Staged::default());
                        if matches!(placement, Placement::Gather) && case_no % 3 == 0 {
                            let staged_all = Staged { keys: true, offsets: true, weights: true, out: true };
                            compare_pooled(emu, &placed, &t, &case, pooling, F32, &[2 * d + 5, 2], staged_all);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn quantized_and_float_tables_in_one_batch() {
    let emu = emulator();
    let mut rng = Rng(44);
    let tables = [
        make_quantized(&mut rng, 200, 24, RowFormat::Int8, false, 1.0).0,
        make_quantized(&mut rng, 150, 300, RowFormat::Int4, true, -2.0).0,
        make_quantized(&mut rng, 180, 9, RowFormat::Fp8, true, 0.5).0,
        make_table(&mut rng, 120, 16, F16, true, 3.0),
    ];
    let placed: Vec<Emulated> =
        tables.iter().map(|t| Emulated::place(emu, t.table.source().unwrap(), Placement::Gather).unwrap()).collect();
    for round in 0..6 {
        let staged = if round % 2 == 0 { Staged::default() } else { Staged { keys: true, offsets: true, weights: true, out: true } };
        let cases: Vec<BatchCase> = (0..tables.len() + round)
            .map(|i| {
                let table = i % tables.len();
                let pooling = match rng.below(4) {
                    0 => None,
                    p => Some(POOLINGS[p as usize - 1]),
                };
                let kd = KEY_TYPES[rng.below(4) as usize];
                let weighted = pooling.is_some() && rng.below(2) == 0;
                let bags = BagCase::random(&mut rng, &tables[table], kd, true, weighted);
                BatchCase { table, pooling, bags, od: FLOATS[rng.below(3) as usize] }
            })
            .collect();
        run_batch_case(emu, &tables, &placed, &cases, staged, round);
    }
}
