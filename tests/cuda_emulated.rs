//! The CUDA kernels and the GPU lookup algorithms, run on the CPU.
//!
//! `gather.cu` is compiled as C++ with `tests/cuda_emu/` (each warp's 32 lanes run as fibers
//! that meet at warp collectives) into a shared library, and `strata::exec::cuda::emulate`
//! drives it with the same parameter structs, gather/cache code and shard split as the GPU
//! path. Every case is compared with the CPU path's lookup of the same keys on random data,
//! bit for bit, with poisoned outputs. This runs everywhere (CI has no GPU); what it cannot show
//! is anything about real devices: memory copies, streams, peer access and timing
//! (tests/cuda.rs and scripts/gpu-check.sh cover those on a GPU).
#![cfg(feature = "cuda")]

mod common;
use common::*;
use dlpark::ffi::DLDataType;
use std::path::PathBuf;
use std::sync::OnceLock;
use strata::exec::cuda::emulate::{Emulated, Emulator, Placement};
use strata::exec::cuda::params::{CacheParams, GatherParams};
use strata::{LookupOptions, MissingKey, Table, TableOptions};

/// Builds the emulator library once per test process.
fn emulator() -> &'static Emulator {
    static EMU: OnceLock<Emulator> = OnceLock::new();
    EMU.get_or_init(|| {
        // STRATA_SOURCE_DIR: the source tree when this binary runs away from where it was built.
        let root = std::env::var_os("STRATA_SOURCE_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
        let out = std::env::temp_dir().join(format!("strata_emu_{}.so", std::process::id()));
        let st = std::process::Command::new("g++")
            .args(["-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-DSTRATA_EMULATE", "-Wall", "-Wextra", "-Werror"])
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
    let opts = TableOptions { default_value: default, ..TableOptions::default() };
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
    // SAFETY: keys describes readable host memory (the promise of every caller, above) and w
    // describes want, whose span * size bytes cover every element out_shape and out_strides reach.
    let cpu = unsafe { t.table.lookup(&keys.t, &w.t, &LookupOptions::default()) }.unwrap();
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
    // SAFETY: k and w describe keys (50 i64) and want (50x8 floats), alive past the call.
    unsafe { t.table.lookup(&k.t, &w.t, &LookupOptions::default()) }.unwrap();
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
            // SAFETY: k describes the 12 i32 of keys (as [3, 4] or its [4, 3] transpose, both
            // inside them) and oa describes a, whose 48 floats are shape[0] * shape[1] * 4; all
            // alive past the call.
            let cpu = unsafe { table.lookup(&k.t, &oa.t, &LookupOptions::default()) }.unwrap_err().to_string();
            // SAFETY: k describes the 12 i32 of keys (as [3, 4] or its [4, 3] transpose, both
            // inside them) and ob describes b, whose 48 floats are shape[0] * shape[1] * 4; all
            // alive past the call.
            let gpu = unsafe { placed.lookup(emu, table.source().unwrap(), &k.t, &ob.t) }.unwrap_err().to_string();
            assert_eq!(gpu, cpu, "{placement:?} keys {shape:?}");
            assert!(cpu.contains("is not in the table"), "{cpu}");
        }
    }
}
