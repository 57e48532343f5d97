//! The GPU benchmark: gather GB/s of strata on CUDA tensors for the static, uvm and (warm) cache
//! placements at 200K and 1M keys x 64..1024 dims, beside a device-to-device memcpy of the same
//! output bytes on the same stream (the limit) and beside strata's CPU path on the same keys.
//! Prints a table last; the target is static >= 0.8 of the memcpy figure at 1M x 256.
//! Then issue 12's batch on the device: 26 one-key lookups in one `strata_lookup_batch` against
//! one single-key call and 26 separate calls on the same stream (target: at most 3x one call).
//!
//! `cargo bench --bench gpu` (scripts/gpu-check.sh runs it). Without a CUDA device it prints
//! "skipped: no CUDA device". Not a test: it asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use cudarc::driver::{CudaContext, result, sys};
use dlpark::ffi::DLDeviceType;
use std::time::Instant;
use strata::exec::cuda;

/// Milliseconds per call of `f` on stream `s`, by CUDA events around `iters` calls after one
/// warm-up call. `s` must be a live stream of the context bound to this thread.
fn gpu_ms(s: sys::CUstream, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let start = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).unwrap();
    let end = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).unwrap();
    // SAFETY: start was created just above, and s is a live stream of the context main bound to
    // this thread (the promise of the caller, above).
    unsafe { result::event::record(start, s) }.unwrap();
    for _ in 0..iters {
        f();
    }
    // SAFETY: end was created above, and s is a live stream of the bound context.
    unsafe { result::event::record(end, s) }.unwrap();
    // SAFETY: end was created above and has been recorded on s.
    unsafe { result::event::synchronize(end) }.unwrap();
    // SAFETY: start and end were both recorded on s, and end has completed (synchronised above), so
    // start has too.
    let ms = unsafe { result::event::elapsed(start, end) }.unwrap() as f64 / iters as f64;
    // SAFETY: start and end were created above; each is destroyed once here and not used after.
    unsafe {
        result::event::destroy(start).unwrap();
        result::event::destroy(end).unwrap();
    }
    ms
}

/// Median milliseconds of 3 host-timed calls after a warm-up.
fn cpu_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..3)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[1]
}

fn main() {
    if cuda::device_count() == 0 {
        println!("skipped: no CUDA device");
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let s = result::stream::create(result::stream::StreamKind::NonBlocking).unwrap();
    let name = result::device::get_name(result::device::get(0).unwrap()).unwrap();
    let mut rng = Rng(7);
    let mut lines = Vec::new();
    for dim in [64usize, 128, 256, 512, 1024] {
        // Tables of at most 1 GiB (1M rows up to dim 256).
        let rows = (1usize << 20).min((1usize << 28) / dim);
        let mut data = vec![0f32; rows * dim];
        for v in data.iter_mut() {
            *v = rng.f32();
        }
        let keys: Vec<i64> = (0..rows as i64).map(|r| r * 2654435761 % (1 << 40)).collect();
        let tables: Vec<(&str, Owned)> = [
            ("static", TableOptions::default()),
            ("uvm", TableOptions { gpu_placement: 1, ..TableOptions::default() }),
            ("cache", TableOptions { gpu_placement: 2, gpu_cache_fraction: 0.5, hit_rate_threshold: 2.0, ..TableOptions::default() }),
        ]
        .into_iter()
        .map(|(n, o)| (n, Owned::build(&data, rows, dim, Some(&keys), &o)))
        .collect();
        drop(data);
        for n in [200_000usize, 1 << 20] {
            let bytes = n * dim * 4;
            // Keys from the first 40% of rows, so the warm cache (half the rows) holds them all.
            let hot = rows * 2 / 5;
            let kb: Vec<i64> = (0..n).map(|_| keys[rng.below(hot as u64) as usize]).collect();
            // SAFETY: main bound ctx to this thread; dkeys is freed once, at the end of this
            // iteration.
            let dkeys = unsafe { result::malloc_sync(n * 8) }.unwrap();
            // SAFETY: dkeys is the fresh allocation of n * 8 bytes just made, and kb holds as many
            // (n i64); the copy is synchronous.
            unsafe { result::memcpy_htod_sync(dkeys, &kb) }.unwrap();
            // SAFETY: main bound ctx to this thread; dout is freed once, at the end of this
            // iteration.
            let dout = unsafe { result::malloc_sync(bytes) }.unwrap();
            // SAFETY: main bound ctx to this thread; dsrc is freed once, at the end of this
            // iteration.
            let dsrc = unsafe { result::malloc_sync(bytes) }.unwrap();
            let k = Desc::compact(dkeys as *const u8, I64, &[n as i64]).device(DLDeviceType::CUDA);
            let mut o = Desc::compact(dout as *const u8, F32, &[n as i64, dim as i64]).device(DLDeviceType::CUDA);
            let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 0, ..LookupOptions::default() };
            let iters = (20usize << 30) / bytes.max(1) / 8 + 3;
            // SAFETY: dout and dsrc are distinct live allocations of `bytes` bytes each and s is a
            // live stream of the bound context; gpu_ms waits for the copies before returning, and
            // the buffers are freed only after that.
            let memcpy = gpu_ms(s, iters, || unsafe { result::memcpy_dtod_async(dout, dsrc, bytes, s) }.unwrap());
            let gbs = |ms: f64| bytes as f64 / ms / 1e6;
            let mut row = format!("{:>7} x {:>4}  memcpy {:>7.1} GB/s", n, dim, gbs(memcpy));
            let mut static_ratio = None;
            for (pname, t) in &tables {
                let ms = gpu_ms(s, iters, || {
                    // SAFETY: t.0 is a live table of `tables`; k and o describe dkeys and dout (n
                    // keys and n x dim floats of device memory, freed only after gpu_ms has waited
                    // for the stream); opts names s, a live stream of ctx.
                    let st = unsafe { strata_lookup(t.0, &k.t, &mut o.t, &opts, std::ptr::null_mut()) };
                    assert_eq!(st, Status::STRATA_OK, "{pname}: {}", last_error());
                });
                row += &format!(" | {pname} {:>7.1} GB/s {:>4.2}x", gbs(ms), memcpy / ms);
                if *pname == "static" {
                    static_ratio = Some(memcpy / ms);
                }
            }
            let hk = Desc::compact(kb.as_ptr().cast(), I64, &[n as i64]);
            let mut host_out = vec![0f32; n * dim];
            let mut ho = Desc::compact(host_out.as_mut_ptr().cast(), F32, &[n as i64, dim as i64]);
            // SAFETY: tables[0].1.0 is a live table; hk and ho describe kb and host_out (n keys and
            // n x dim floats), host memory alive past the call.
            let cpu = cpu_ms(|| ok(unsafe { strata_lookup(tables[0].1.0, &hk.t, &mut ho.t, std::ptr::null(), std::ptr::null_mut()) }));
            row += &format!(" | cpu path {:>6.1} GB/s", gbs(cpu));
            if n == 1 << 20 && dim == 256 {
                row += &format!("   <- target: static >= 0.80x memcpy: {}", if static_ratio.unwrap() >= 0.8 { "met" } else { "NOT met" });
            }
            println!("{row}");
            lines.push(row);
            // SAFETY: dkeys, dout and dsrc came from malloc_sync in this iteration and are freed
            // once here; gpu_ms has waited for all the work queued on them.
            unsafe {
                result::free_sync(dkeys).unwrap();
                result::free_sync(dout).unwrap();
                result::free_sync(dsrc).unwrap();
            }
        }
    }
    let batch = batch_line(s);
    println!("\n== GPU gather, {name}, float32 rows, keyed tables of up to 1M rows (x = fraction of device memcpy)");
    for l in lines {
        println!("{l}");
    }
    println!("\n== GPU batch, {name} (issue 12: a batch of 26 one-key lookups costs at most 3x one single-key call)");
    println!("{batch}");
}

/// Issue 12's batch on the device: 26 static tables (10,000 rows, dims 16-72), one key each in
/// device memory, one row each into device memory, as one `strata_lookup_batch` on stream `s`,
/// against one single-key `strata_lookup` and 26 separate calls on the same stream (CUDA-event
/// time per call, which includes the host's enqueueing when the stream waits for it). `s` must
/// be a live stream of the context bound to this thread.
fn batch_line(s: sys::CUstream) -> String {
    let mut rng = Rng(26);
    let tables: Vec<(Owned, usize, i64)> = (0..26)
        .map(|i| {
            let (rows, dim) = (10_000usize, 16 + 8 * (i % 8));
            let data: Vec<f32> = (0..rows * dim).map(|_| rng.f32()).collect();
            let keys: Vec<i64> = (0..rows as i64).map(|r| r * 7 + i as i64).collect();
            let key = keys[rng.below(rows as u64) as usize];
            (Owned::build(&data, rows, dim, Some(&keys), &TableOptions::default()), dim, key)
        })
        .collect();
    // SAFETY: main bound the context to this thread; dkeys is freed once, at the end of this
    // function, after every call has been waited for.
    let dkeys = unsafe { result::malloc_sync(26 * 8) }.unwrap();
    // SAFETY: as for dkeys (room for 26 rows of up to 72 floats).
    let dout = unsafe { result::malloc_sync(26 * 72 * 4) }.unwrap();
    let keys: Vec<i64> = tables.iter().map(|t| t.2).collect();
    // SAFETY: dkeys holds 26 * 8 bytes and keys 26 i64; the copy is synchronous.
    unsafe { result::memcpy_htod_sync(dkeys, &keys) }.unwrap();
    let kd: Vec<Desc> =
        (0..26).map(|i| Desc::compact((dkeys as usize + i * 8) as *const u8, I64, &[1]).device(DLDeviceType::CUDA)).collect();
    let mut od: Vec<Desc> = tables
        .iter()
        .enumerate()
        .map(|(i, t)| Desc::compact((dout as usize + i * 72 * 4) as *const u8, F32, &[1, t.1 as i64]).device(DLDeviceType::CUDA))
        .collect();
    let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 1, ..LookupOptions::default() };
    let iters = 2000;
    let one = gpu_ms(s, iters, || {
        // SAFETY: tables[0] is live; kd[0] and od[0] describe device memory alive until the end of
        // this function (gpu_ms waits for the stream); opts names s, a live stream.
        ok(unsafe { strata_lookup(tables[0].0.0, &kd[0].t, &mut od[0].t, &opts, std::ptr::null_mut()) })
    });
    let separate = gpu_ms(s, iters / 26, || {
        for (i, t) in tables.iter().enumerate() {
            // SAFETY: as above, for table i and its key and out.
            ok(unsafe { strata_lookup(t.0.0, &kd[i].t, &mut od[i].t, &opts, std::ptr::null_mut()) });
        }
    });
    let reqs: Vec<strata_lookup_request> = tables
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut r = strata_lookup_request_default();
            r.table = t.0.0;
            r.keys = &kd[i].t;
            r.out = &mut od[i].t;
            r
        })
        .collect();
    // SAFETY: every request names a live table and device tensors alive until the end of this
    // function; opts names s.
    let batch = gpu_ms(s, iters, || ok(unsafe { strata_lookup_batch(reqs.as_ptr(), reqs.len(), &opts) }));
    // SAFETY: the allocations above, freed once; gpu_ms waited for everything queued on them.
    unsafe {
        result::free_sync(dkeys).unwrap();
        result::free_sync(dout).unwrap();
    }
    format!(
        "batch of 26: {:.1} us per strata_lookup_batch; one single-key strata_lookup: {:.1} us; 26 separate calls: {:.1} us; \
         batch / one call = {:.2}x <- target <= 3x: {}",
        batch * 1e3,
        one * 1e3,
        separate * 1e3,
        batch / one,
        if batch / one <= 3.0 { "met" } else { "NOT met" }
    )
}
