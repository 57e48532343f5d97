//! The lookup benchmark: strata keyed lookup, strata dense gather, a multi-threaded memcpy of
//! the same output bytes (the bandwidth limit) and the hand-written HPS-like baseline
//! (../shared/anchors/hps_like.cc, built with g++ and libabsl-dev), on the same sizes, in one
//! run, with ratios. Also the per-call overhead of a one-key lookup through the C ABI.
//!
//! `cargo bench --bench lookup -- [rows dim batch threads]` (defaults 1000000 128 200000, and
//! the library's default thread count). Not a test: it asserts nothing about speed.

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use std::ffi::{CStr, c_char, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use strata::{LookupOptions, LookupStats, Status, Table, TableOptions};

unsafe extern "C" {
    fn strata_table_from_dlpack(
        vectors: *const DLTensor,
        keys: *const DLTensor,
        opts: *const TableOptions,
        out: *mut *mut Table,
    ) -> Status;
    fn strata_lookup(
        t: *mut Table,
        keys: *const DLTensor,
        out: *mut DLTensor,
        opts: *const LookupOptions,
        stats: *mut LookupStats,
    ) -> Status;
    fn strata_table_free(t: *mut Table);
    fn strata_last_error() -> *const c_char;
    fn strata_default_num_threads() -> i32;
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A DLTensor over a Vec, with its shape and strides kept alive beside it.
struct Desc {
    t: DLTensor,
    _shape: Box<[i64]>,
    _strides: Box<[i64]>,
}

fn desc<T>(data: *const T, shape: &[i64], code: DLDataTypeCode, bits: u8) -> Desc {
    let mut strides = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let mut shape: Box<[i64]> = shape.into();
    let mut strides: Box<[i64]> = strides.into();
    let t = DLTensor {
        data: data as *mut c_void,
        device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: DLDataType { code, bits, lanes: 1 },
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    };
    Desc { t, _shape: shape, _strides: strides }
}

fn check(s: Status) {
    if s != Status::STRATA_OK {
        let msg = unsafe { CStr::from_ptr(strata_last_error()) };
        panic!("{s:?}: {}", msg.to_string_lossy());
    }
}

/// Median seconds of 11 timed runs after one warm-up (the anchor's method).
fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..11)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    ts[ts.len() / 2]
}

/// Copies `src` into `dst` on `threads` scoped threads, split evenly (the limit's method).
fn parallel_memcpy(src: &[f32], dst: &mut [f32], threads: usize) {
    let n = src.len();
    std::thread::scope(|s| {
        let mut rest = dst;
        for k in 0..threads {
            let (lo, hi) = (n * k / threads, n * (k + 1) / threads);
            let (mine, tail) = rest.split_at_mut(hi - lo);
            rest = tail;
            let src = &src[lo..hi];
            s.spawn(move || mine.copy_from_slice(src));
        }
    });
}

/// Builds and runs the anchor; returns (hps_like seconds, its memcpy seconds) or why not.
fn run_anchor(rows: usize, dim: usize, batch: usize, threads: usize) -> Result<(f64, f64), String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = std::env::var_os("STRATA_ANCHOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../shared/anchors/hps_like.cc"));
    if !src.exists() {
        return Err(format!("{} not found", src.display()));
    }
    let bin = manifest.join("target/hps_like");
    let built = Command::new("g++")
        .args(["-O3", "-march=native", "-std=c++17"])
        .arg(&src)
        .args(["-o"])
        .arg(&bin)
        .args(["-labsl_hash", "-labsl_city", "-labsl_low_level_hash", "-labsl_raw_hash_set", "-pthread"])
        .output()
        .map_err(|e| format!("g++: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "building the anchor failed (install libabsl-dev): {}",
            String::from_utf8_lossy(&built.stderr).lines().next().unwrap_or("")
        ));
    }
    let out = Command::new(&bin)
        .args([rows.to_string(), dim.to_string(), batch.to_string(), threads.to_string()])
        .output()
        .map_err(|e| format!("running the anchor: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    print!("{}", text.lines().map(|l| format!("  anchor> {l}\n")).collect::<String>());
    let ms = |prefix: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(prefix))?;
        let after = line.split(':').nth(1)?.trim();
        after.split_whitespace().next()?.parse::<f64>().ok().map(|v| v / 1e3)
    };
    Ok((ms("hps_like").ok_or("no hps_like line")?, ms("memcpy").ok_or("no memcpy line")?))
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = args.first().copied().unwrap_or(1_000_000);
    let dim = args.get(1).copied().unwrap_or(128);
    let batch = args.get(2).copied().unwrap_or(200_000);
    let threads = args.get(3).copied().unwrap_or_else(|| unsafe { strata_default_num_threads() } as usize);

    // The anchor's data: random 63-bit keys, vectors (i % 997) * 0.5, ~10% misses.
    let mut rng = Rng(7);
    let keys: Vec<i64> = (0..rows).map(|_| (rng.next() >> 1) as i64).collect();
    let vectors: Vec<f32> = (0..rows * dim).map(|i| (i % 997) as f32 * 0.5).collect();
    let mut query: Vec<i64> = Vec::with_capacity(batch);
    let mut dense_query: Vec<i64> = Vec::with_capacity(batch);
    for _ in 0..batch {
        let miss = rng.next() % 10 == 0;
        let r = (rng.next() % rows as u64) as usize;
        query.push(if miss { (rng.next() >> 1) as i64 } else { keys[r] });
        dense_query.push(if miss { rows as i64 + r as i64 } else { r as i64 });
    }
    let mut out = vec![0f32; batch * dim];

    let vdesc = desc(vectors.as_ptr(), &[rows as i64, dim as i64], DLDataTypeCode::FLOAT, 32);
    let kdesc = desc(keys.as_ptr(), &[rows as i64], DLDataTypeCode::INT, 64);
    let (mut keyed, mut dense) = (std::ptr::null_mut(), std::ptr::null_mut());
    let t0 = Instant::now();
    check(unsafe { strata_table_from_dlpack(&vdesc.t, &kdesc.t, std::ptr::null(), &mut keyed) });
    let build_s = t0.elapsed().as_secs_f64();
    check(unsafe { strata_table_from_dlpack(&vdesc.t, std::ptr::null(), std::ptr::null(), &mut dense) });
    let info = unsafe { &*keyed }.info();
    drop(vectors);
    drop(keys);

    let qdesc = desc(query.as_ptr(), &[batch as i64], DLDataTypeCode::INT, 64);
    let ddesc = desc(dense_query.as_ptr(), &[batch as i64], DLDataTypeCode::INT, 64);
    let mut odesc = desc(out.as_mut_ptr(), &[batch as i64, dim as i64], DLDataTypeCode::FLOAT, 32);
    let opts = LookupOptions { num_threads: threads as i32, ..LookupOptions::default() };
    let mut stats = LookupStats::default();

    let t_keyed = median(|| check(unsafe { strata_lookup(keyed, &qdesc.t, &mut odesc.t, &opts, &mut stats) }));
    let keyed_stats = stats;
    let t_dense = median(|| check(unsafe { strata_lookup(dense, &ddesc.t, &mut odesc.t, &opts, &mut stats) }));
    let src = vec![1f32; batch * dim];
    let t_memcpy = median(|| parallel_memcpy(&src, &mut out, threads));
    drop(src);

    // Per-call overhead: one key, inline, through the C ABI.
    let one = [query[0]];
    let mut one_out = vec![0f32; dim];
    let one_k = desc(one.as_ptr(), &[1], DLDataTypeCode::INT, 64);
    let mut one_o = desc(one_out.as_mut_ptr(), &[1, dim as i64], DLDataTypeCode::FLOAT, 32);
    let inline = LookupOptions { num_threads: 1, ..LookupOptions::default() };
    let calls = 200_000;
    let t_one = median(|| {
        for _ in 0..calls {
            check(unsafe { strata_lookup(keyed, &one_k.t, &mut one_o.t, &inline, std::ptr::null_mut()) });
        }
    }) / calls as f64;
    let t_one_default = median(|| {
        for _ in 0..calls {
            check(unsafe { strata_lookup(keyed, &one_k.t, &mut one_o.t, std::ptr::null(), std::ptr::null_mut()) });
        }
    }) / calls as f64;

    let anchor = run_anchor(rows, dim, batch, threads);

    let bytes = 2.0 * (batch * dim * 4) as f64;
    let gbs = |t: f64| bytes / t / 1e9;
    println!();
    println!(
        "strata lookup benchmark: table {rows} x {dim} float32, batch {batch} keys (~10% misses), {threads} threads"
    );
    println!(
        "keyed index: {} bytes = {:.2} bytes/key (vectors {} bytes); built in {:.1} ms",
        info.index_bytes,
        info.index_bytes as f64 / rows as f64,
        info.vector_bytes,
        build_s * 1e3
    );
    println!("keyed stats: {} hits, {} misses", keyed_stats.hits, keyed_stats.misses);
    println!();
    println!("{:<28} {:>10} {:>12} {:>14} {:>14}", "case", "ms", "GB/s (r+w)", "x memcpy", "x hps_like");
    let anchor_t = anchor.as_ref().ok().map(|a| a.0);
    let row = |name: &str, t: f64| {
        let vs_anchor = anchor_t.map_or("n/a".to_string(), |a| format!("{:.2}", a / t));
        println!("{name:<28} {:>10.3} {:>12.2} {:>14.2} {:>14}", t * 1e3, gbs(t), t_memcpy / t, vs_anchor);
    };
    row("memcpy (limit)", t_memcpy);
    row("strata keyed lookup", t_keyed);
    row("strata dense gather", t_dense);
    match &anchor {
        Ok((t, t_mc)) => {
            row("hps_like (anchor)", *t);
            println!("{:<28} {:>10.3} {:>12.2} {:>14.2}", "anchor's own memcpy", t_mc * 1e3, gbs(*t_mc), t_memcpy / t_mc);
        }
        Err(e) => println!("hps_like (anchor): not run: {e}"),
    }
    println!();
    println!("single-key lookup, num_threads=1: {:.0} ns/call; num_threads=0: {:.0} ns/call", t_one * 1e9, t_one_default * 1e9);
    println!(
        "targets: keyed >= 0.60 x memcpy ({:.2}), dense >= 0.75 x memcpy ({:.2}), single key < 2000 ns ({:.0})",
        t_memcpy / t_keyed,
        t_memcpy / t_dense,
        t_one * 1e9
    );
    unsafe {
        strata_table_free(keyed);
        strata_table_free(dense);
    }
}
