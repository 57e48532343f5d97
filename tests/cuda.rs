//! The CUDA side without a GPU, and with one when present.
//!
//! - Every gather kernel compiles with NVRTC for sm_80 and sm_90 (PTX for compute_80 and
//!   compute_90). NVRTC comes from the `nvidia-cuda-nvrtc-cu12` wheel (scripts/test.sh installs
//!   it and puts its lib folder on LD_LIBRARY_PATH); when `STRATA_REQUIRE_NVRTC=1` a missing NVRTC
//!   fails the test instead of skipping it.
//! - Without a CUDA driver, `strata_cuda_available()` is 0 and a CUDA tensor gets
//!   `STRATA_UNSUPPORTED_DEVICE` with a message saying so (never a panic or abort).
//! - On a machine with a CUDA device, every placement (static, uvm, cache), key and out dtype,
//!   and mix of host and device tensors is compared with the CPU path on random data with
//!   poisoned outputs (1 key, sizes that are not a multiple of 32, 1M keys); a lookup queued
//!   behind a spinning kernel returns before the stream finishes; two streams look up at once;
//!   several devices are used when present (replicas, shards). Without a device each of these
//!   prints "skipped: no CUDA device".
#![cfg(feature = "cuda")]

mod common;
use common::*;
use std::io::Write;

/// Says why a test did nothing, on the real stderr (past libtest's output capture), so a
/// skipped GPU test never passes silently.
fn skipped(why: &str) {
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}
use dlpark::ffi::DLDeviceType;
use strata::exec::cuda;

#[test]
fn every_kernel_compiles_with_nvrtc_for_sm80_and_sm90() {
    if !cuda::nvrtc_available() {
        assert!(
            std::env::var_os("STRATA_REQUIRE_NVRTC").is_none(),
            "STRATA_REQUIRE_NVRTC is set but libnvrtc.so.12 cannot be loaded (LD_LIBRARY_PATH={:?})",
            std::env::var_os("LD_LIBRARY_PATH")
        );
        skipped("NVRTC (libnvrtc.so.12) is not installed; scripts/test.sh installs it");
        return;
    }
    for arch in ["compute_80", "compute_90"] {
        let ptx = cuda::compile_gather(arch).unwrap_or_else(|e| panic!("{e}"));
        let target = arch.replace("compute_", "sm_");
        assert!(ptx.contains(&format!(".target {target}")), "PTX for {arch} targets another architecture");
        for name in cuda::kernel_names() {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} is missing from the PTX for {arch}");
        }
        assert_eq!(cuda::kernel_names().len(), 84);
    }
}

#[test]
fn cuda_tensors_without_a_driver_get_a_clear_status() {
    let available = strata_cuda_available();
    assert_eq!(available, (cuda::device_count() > 0) as i32);
    let vectors: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let table = Owned::build(&vectors, 4, 2, None, &TableOptions::default());
    let keys = [1i64, 2];
    let mut out = [0f32; 4];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[2]).device(DLDeviceType::CUDA);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[2, 2]).device(DLDeviceType::CUDA);
    if available == 0 {
        // SAFETY: table.0 is live; k and o describe keys and out (host memory labelled kDLCUDA,
        // alive past the call), which strata refuses without a driver before it reads them.
        let s = unsafe { strata_lookup(table.0, &k.t, &mut o.t, std::ptr::null(), std::ptr::null_mut()) };
        fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &["keys: device kDLCUDA:0", "no CUDA driver or device is present"]);
    } else {
        // (the pointers are host memory, so nothing may be launched on them)
        // The pointers are host memory: nothing may be launched on them, so only check that an
        // out of the wrong shape is refused before anything is queued.
        let mut bad = Desc::compact(out.as_mut_ptr().cast(), F32, &[3, 2]).device(DLDeviceType::CUDA);
        // SAFETY: table.0 is live; k describes keys and bad describes out (both host memory
        // labelled kDLCUDA, alive past the call); strata refuses bad's shape before anything is
        // queued, so nothing is launched on them.
        let s = unsafe { strata_lookup(table.0, &k.t, &mut bad.t, std::ptr::null(), std::ptr::null_mut()) };
        fails(s, Status::STRATA_INVALID_ARGUMENT, &["out: shape [3, 2]"]);
    }
    assert_eq!(out, [0.0; 4]);
}

/// The GPU tests' device helpers: raw driver calls through cudarc on device 0's primary context.
mod gpu {
    use cudarc::driver::{CudaContext, result, sys};
    use std::sync::Arc;

    pub fn ctx(ordinal: usize) -> Arc<CudaContext> {
        let c = CudaContext::new(ordinal).unwrap();
        c.bind_to_thread().unwrap();
        c
    }

    /// Device memory holding `data` (freed on drop).
    pub struct Buf {
        pub ptr: u64,
        pub bytes: usize,
        _ctx: Arc<CudaContext>,
    }

    impl Buf {
        pub fn new(ctx: &Arc<CudaContext>, data: &[u8]) -> Buf {
            ctx.bind_to_thread().unwrap();
            // SAFETY: ctx is bound to this thread (above); the allocation is freed once, in Drop.
            let ptr = unsafe { result::malloc_sync(data.len().max(1)) }.unwrap();
            // SAFETY: ptr is the fresh allocation of data.len().max(1) bytes just made in the bound
            // context; data is host memory of data.len() bytes, which the synchronous copy reads.
            unsafe { result::memcpy_htod_sync(ptr, data) }.unwrap();
            Buf { ptr, bytes: data.len(), _ctx: ctx.clone() }
        }
        pub fn read(&self) -> Vec<u8> {
            self._ctx.bind_to_thread().unwrap();
            let mut v = vec![0u8; self.bytes];
            // SAFETY: self.ptr is the live allocation made in `new` (freed only in Drop),
            // self.bytes long like v; the context is bound above.
            unsafe { result::memcpy_dtoh_sync(&mut v, self.ptr) }.unwrap();
            v
        }
    }

    impl Drop for Buf {
        fn drop(&mut self) {
            self._ctx.bind_to_thread().unwrap();
            // SAFETY: self.ptr came from malloc_sync in `new` and is freed only here; every test
            // waits for the work queued on a buffer (gpu::sync, or a lookup that waits) before
            // dropping it.
            unsafe { result::free_sync(self.ptr) }.unwrap();
        }
    }

    /// A new non-blocking stream on `ctx`, never destroyed (the tests make a few).
    pub fn stream(ctx: &Arc<CudaContext>) -> sys::CUstream {
        ctx.bind_to_thread().unwrap();
        result::stream::create(result::stream::StreamKind::NonBlocking).unwrap()
    }

    /// Waits for the work queued on `s`, which must come from `stream`.
    pub fn sync(s: sys::CUstream) {
        // SAFETY: s comes from `stream` (the only source of the streams these tests use), which
        // never destroys one.
        unsafe { result::stream::synchronize(s) }.unwrap();
    }

    /// Queues a kernel that spins for about `cycles` GPU clock cycles on `s`, which must come
    /// from `stream` on `ctx`.
    pub fn spin(ctx: &Arc<CudaContext>, s: sys::CUstream, cycles: i64) {
        let ptx = cudarc::nvrtc::compile_ptx(
            "extern \"C\" __global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }",
        )
        .unwrap();
        let m = ctx.load_module(ptx).unwrap();
        let f = m.load_function("spin").unwrap();
        // SAFETY: s comes from `stream` on ctx (each caller passes the stream it made on the same
        // context) and is never destroyed; the wrapper is dropped at the end of this function, and
        // work queued through it is ordered on s with strata's.
        let stream = unsafe { ctx.wrap_borrowed_stream(s) };
        let cfg = cudarc::driver::LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        use cudarc::driver::PushKernelArg;
        // SAFETY: spin takes one long long, passed as the i64 `cycles`; the kernel touches no
        // memory.
        unsafe { stream.launch_builder(&f).arg(&cycles).launch(cfg) }.unwrap();
    }

    /// Whether the work queued on `s` (from `stream`) is done.
    pub fn query(s: sys::CUstream) -> sys::CUresult {
        // SAFETY: s comes from `stream`, which never destroys one.
        unsafe { sys::cuStreamQuery(s) }
    }
}

/// A random table through the C API with the given options.
fn random_table(rng: &mut Rng, rows: usize, dim: usize, dtype: dlpark::ffi::DLDataType, keyed: bool, opts: &TableOptions) -> (Owned, Vec<i64>) {
    let size = elem_size(dtype);
    let mut data = vec![0u8; rows * dim * size];
    for i in 0..rows * dim {
        write_float(dtype, &mut data[i * size..], rng.f32() * 10.0);
    }
    let keys: Vec<i64> = if keyed { (0..rows as i64).map(|r| r * 7919 - 50_000).collect() } else { (0..rows as i64).collect() };
    let t = Owned::build_bytes(&data, dtype, rows, dim, keyed.then_some(&keys[..]), opts);
    (t, keys)
}

/// `n` keys (int64 bytes converted to `kd`): table keys and about 1 in 6 missing.
fn random_keys(rng: &mut Rng, keys: &[i64], n: usize, kd: dlpark::ffi::DLDataType) -> Vec<u8> {
    let size = elem_size(kd);
    let mut out = vec![0u8; n * size];
    for i in 0..n {
        let k = if rng.below(6) == 0 { -(rng.below(1 << 40) as i64) - 1 } else { keys[rng.below(keys.len() as u64) as usize] };
        out[i * size..(i + 1) * size].copy_from_slice(&k.to_le_bytes()[..size]);
    }
    out
}

/// Where a lookup's keys and out live.
#[derive(Debug, Clone, Copy)]
enum Mix {
    DeviceDevice,
    HostKeysDeviceOut,
    DeviceKeysHostOut,
}

/// Looks `kb` up on the CPU and through the GPU (tensors placed as `mix`, on stream `s`) into
/// poisoned outputs; returns both outputs as bytes and both stats.
#[allow(clippy::too_many_arguments)]
fn cpu_and_gpu(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    s: cudarc::driver::sys::CUstream,
    t: &Owned,
    kb: &[u8],
    kd: dlpark::ffi::DLDataType,
    od: dlpark::ffi::DLDataType,
    dim: usize,
    mix: Mix,
) -> ((Vec<u8>, LookupStats), (Vec<u8>, LookupStats)) {
    let n = kb.len() / elem_size(kd);
    let bytes = n * dim * elem_size(od);
    let mut want = vec![0x5Au8; bytes];
    let k = Desc::compact(kb.as_ptr(), kd, &[n as i64]);
    let mut w = Desc::compact(want.as_mut_ptr(), od, &[n as i64, dim as i64]);
    let mut cs = LookupStats::default();
    // SAFETY: t.0 is a live table (Owned); k and w describe kb and want (n keys, n x dim elements
    // of od), host memory alive past the call; cs is a reference.
    ok(unsafe { strata_lookup(t.0, &k.t, &mut w.t, std::ptr::null(), &mut cs) });

    let dkeys = gpu::Buf::new(ctx, kb);
    let dout = gpu::Buf::new(ctx, &vec![0xA5u8; bytes]);
    let mut host_out = vec![0xA5u8; bytes];
    let kdesc = match mix {
        Mix::HostKeysDeviceOut => Desc::compact(kb.as_ptr(), kd, &[n as i64]),
        _ => Desc::compact(dkeys.ptr as *const u8, kd, &[n as i64]).device(DLDeviceType::CUDA),
    };
    let mut odesc = match mix {
        Mix::DeviceKeysHostOut => Desc::compact(host_out.as_mut_ptr(), od, &[n as i64, dim as i64]),
        _ => Desc::compact(dout.ptr as *const u8, od, &[n as i64, dim as i64]).device(DLDeviceType::CUDA),
    };
    let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 0, ..LookupOptions::default() };
    let mut gs = LookupStats::default();
    // SAFETY: t.0 is live; kdesc and odesc describe n keys and n x dim elements of od, in kb and
    // host_out (host memory) or in dkeys and dout (device memory of ctx, kb.len() and `bytes`
    // long), all alive until after gpu::sync(s) below has waited for the queued lookup, and so is
    // t. opts names s, a stream of ctx; gs is a reference.
    let st = unsafe { strata_lookup(t.0, &kdesc.t, &mut odesc.t, &opts, &mut gs) };
    assert_eq!(st, Status::STRATA_OK, "{mix:?}: {}", last_error());
    gpu::sync(s);
    let got = match mix {
        Mix::DeviceKeysHostOut => host_out,
        _ => dout.read(),
    };
    ((want, cs), (got, gs))
}

fn placements() -> [(&'static str, TableOptions); 5] {
    let d = TableOptions { default_value: -3.0, ..TableOptions::default() };
    [
        ("static", d),
        ("uvm", TableOptions { gpu_placement: 1, ..d }),
        ("cache 0.3", TableOptions { gpu_placement: 2, gpu_cache_fraction: 0.3, hit_rate_threshold: 2.0, ..d }),
        ("cache 0", TableOptions { gpu_placement: 2, gpu_cache_fraction: 0.0, hit_rate_threshold: 2.0, ..d }),
        ("cache 1.0", TableOptions { gpu_placement: 2, gpu_cache_fraction: 1.0, hit_rate_threshold: 2.0, ..d }),
    ]
}

#[test]
fn gpu_placements_dtypes_and_mixes_match_the_cpu_path() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    let mut rng = Rng(21);
    for (name, opts) in placements() {
        for keyed in [false, true] {
            for td in [F32, F16, BF16] {
                let dim = 36;
                let (t, keys) = random_table(&mut rng, 2000, dim, td, keyed, &opts);
                for kd in [I32, I64, U32, U64] {
                    for od in [F32, F16, BF16] {
                        for n in [1usize, 31, 1000] {
                            for mix in [Mix::DeviceDevice, Mix::HostKeysDeviceOut, Mix::DeviceKeysHostOut] {
                                let kb = random_keys(&mut rng, &keys, n, kd);
                                let ((want, cs), (got, gs)) = cpu_and_gpu(&ctx, s, &t, &kb, kd, od, dim, mix);
                                let what = format!("{name} keyed={keyed} table {td:?} keys {kd:?} out {od:?} n={n} {mix:?}");
                                assert_eq!((gs.hits, gs.misses), (cs.hits, cs.misses), "{what}: stats");
                                assert!(got == want, "{what}: rows differ from the CPU path");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_one_million_keys_wide_rows() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    let mut rng = Rng(22);
    for (name, opts) in placements().into_iter().take(3) {
        let (t, keys) = random_table(&mut rng, 200_000, 256, F32, true, &opts);
        let kb = random_keys(&mut rng, &keys, 1 << 20, I64);
        let ((want, cs), (got, gs)) = cpu_and_gpu(&ctx, s, &t, &kb, I64, F32, 256, Mix::DeviceDevice);
        assert_eq!((gs.hits, gs.misses), (cs.hits, cs.misses), "{name}");
        assert!(got == want, "{name}: 1M x 256 rows differ from the CPU path");
    }
}

#[test]
fn gpu_lookup_returns_before_the_stream_finishes() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    let mut rng = Rng(23);
    let (t, keys) = random_table(&mut rng, 1000, 16, F32, true, &TableOptions::default());
    let kb = random_keys(&mut rng, &keys, 500, I64);
    let warm = cpu_and_gpu(&ctx, s, &t, &kb, I64, F32, 16, Mix::DeviceDevice);
    assert!(warm.0.0 == warm.1.0);
    let dkeys = gpu::Buf::new(&ctx, &kb);
    let dout = gpu::Buf::new(&ctx, &vec![0u8; 500 * 16 * 4]);
    let k = Desc::compact(dkeys.ptr as *const u8, I64, &[500]).device(DLDeviceType::CUDA);
    let mut o = Desc::compact(dout.ptr as *const u8, F32, &[500, 16]).device(DLDeviceType::CUDA);
    // About two seconds of GPU clocks queued first (no GPU clocks below 1 GHz).
    gpu::spin(&ctx, s, 2_000_000_000);
    let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 0, ..LookupOptions::default() };
    // SAFETY: t.0 is live; k and o describe dkeys and dout (500 i64 and 500x16 floats of ctx's
    // device memory), which, like t, outlive gpu::sync(s) below; opts names s, a stream of ctx.
    ok(unsafe { strata_lookup(t.0, &k.t, &mut o.t, &opts, std::ptr::null_mut()) });
    assert_eq!(
        gpu::query(s),
        cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY,
        "strata_lookup without stats waited for the stream"
    );
    gpu::sync(s);
    assert!(dout.read() == warm.0.0, "rows after the queued lookup ran");
}

#[test]
fn gpu_two_streams_at_once() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let mut rng = Rng(24);
    for (name, opts) in placements() {
        let (t, keys) = random_table(&mut rng, 5000, 64, F32, true, &opts);
        let t = std::sync::Arc::new(t);
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let t = t.clone();
                let keys = keys.clone();
                std::thread::spawn(move || {
                    let ctx = gpu::ctx(0);
                    let s = gpu::stream(&ctx);
                    let mut rng = Rng(100 + i);
                    for _ in 0..20 {
                        let kb = random_keys(&mut rng, &keys, 4097, I64);
                        let ((want, _), (got, _)) = cpu_and_gpu(&ctx, s, &t, &kb, I64, F32, 64, Mix::DeviceDevice);
                        assert!(got == want, "{name}: stream {i}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}

#[test]
fn gpu_errors_are_statuses() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let mut rng = Rng(25);
    let (t, keys) = random_table(&mut rng, 100, 8, F32, true, &TableOptions::default());
    let kb = random_keys(&mut rng, &keys, 20, I64);
    let dkeys = gpu::Buf::new(&ctx, &kb);
    let dout = gpu::Buf::new(&ctx, &vec![0u8; 40 * 8 * 4]);
    // Device keys [4, 5] viewed transposed: no single stride, cannot be read in place.
    let k = Desc::new(dkeys.ptr as *const u8, I64, &[5, 4], &[1, 5], 0).device(DLDeviceType::CUDA);
    let mut o = Desc::compact(dout.ptr as *const u8, F32, &[5, 4, 8]).device(DLDeviceType::CUDA);
    // SAFETY: t.0 is live; k and o describe device memory in dkeys (20 i64) and dout (40x8 floats);
    // strata refuses the transposed device keys before it queues anything.
    let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, std::ptr::null(), std::ptr::null_mut()) };
    fails(s, Status::STRATA_INVALID_LAYOUT, &["keys: strides [1, 5] of a device tensor"]);
    let k = Desc::compact(dkeys.ptr as *const u8, I64, &[20]).device(DLDeviceType::CUDA);
    let mut o = Desc::compact(dout.ptr as *const u8, F32, &[20, 8]).device(DLDeviceType::CUDA);
    o.t.device.device_id = 99;
    // SAFETY: t.0 is live; k and o describe device memory in dkeys (20 i64) and dout (40x8 floats);
    // strata refuses the device mismatch before it queues anything.
    let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, std::ptr::null(), std::ptr::null_mut()) };
    fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &["out: device kDLCUDA:99 but keys are on kDLCUDA:0"]);
    let bad = LookupOptions { stream: std::ptr::null_mut(), num_threads: -4, ..LookupOptions::default() };
    // SAFETY: t.0 is live; k and o describe device memory in dkeys and dout; strata refuses
    // num_threads before it queues anything.
    let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, &bad, std::ptr::null_mut()) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["opts->num_threads: -4"]);
    // A table whose missing keys are errors reports the first one, after waiting.
    let strict = TableOptions { missing_key: 1, ..TableOptions::default() };
    let (t2, _) = random_table(&mut rng, 100, 8, F32, true, &strict);
    let miss = [-5i64, -6];
    let dm = gpu::Buf::new(&ctx, &miss.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>());
    let k = Desc::compact(dm.ptr as *const u8, I64, &[2]).device(DLDeviceType::CUDA);
    let mut o = Desc::compact(dout.ptr as *const u8, F32, &[2, 8]).device(DLDeviceType::CUDA);
    // SAFETY: t2.0 is live; k describes dm (2 i64 of device memory) and o 2x8 floats of dout; a
    // table whose missing keys are errors waits for the lookup before returning, so nothing stays
    // queued on them.
    let s = unsafe { strata_lookup(t2.0, &k.t, &mut o.t, std::ptr::null(), std::ptr::null_mut()) };
    fails(s, Status::STRATA_KEY_NOT_FOUND, &["keys: key -5 (element 0) is not in the table"]);
}

#[test]
fn gpu_several_devices_replicate_and_shard() {
    let count = cuda::device_count();
    if count < 2 {
        skipped(if count == 0 { "no CUDA device" } else { "one CUDA device; replication and sharding need two" });
        return;
    }
    let mut rng = Rng(26);
    for (name, opts) in [
        ("replicated", TableOptions::default()),
        ("sharded", TableOptions { gpu_sharding: 1, ..TableOptions::default() }),
    ] {
        for keyed in [false, true] {
            let (t, keys) = random_table(&mut rng, 3000, 32, F16, keyed, &opts);
            for ordinal in 0..count {
                let ctx = gpu::ctx(ordinal);
                let s = gpu::stream(&ctx);
                let kb = random_keys(&mut rng, &keys, 777, I64);
                let n = 777;
                let dkeys = gpu::Buf::new(&ctx, &kb);
                let dout = gpu::Buf::new(&ctx, &vec![0xA5u8; n * 32 * 4]);
                let mut k = Desc::compact(dkeys.ptr as *const u8, I64, &[n as i64]).device(DLDeviceType::CUDA);
                let mut o = Desc::compact(dout.ptr as *const u8, F32, &[n as i64, 32]).device(DLDeviceType::CUDA);
                k.t.device.device_id = ordinal as i32;
                o.t.device.device_id = ordinal as i32;
                let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 0, ..LookupOptions::default() };
                let mut gs = LookupStats::default();
                // SAFETY: t.0 is live; k and o describe dkeys and dout on device `ordinal` (n keys
                // and n x 32 floats) and opts names s, a stream of that device's context; stats
                // make the call wait for the stream, while the buffers and t are alive.
                ok(unsafe { strata_lookup(t.0, &k.t, &mut o.t, &opts, &mut gs) });
                let mut want = vec![0u8; n * 32 * 4];
                let hk = Desc::compact(kb.as_ptr(), I64, &[n as i64]);
                let mut w = Desc::compact(want.as_mut_ptr(), F32, &[n as i64, 32]);
                let mut cs = LookupStats::default();
                // SAFETY: t.0 is live; hk and w describe kb and want (n keys and n x 32 floats),
                // host memory alive past the call; cs is a reference.
                ok(unsafe { strata_lookup(t.0, &hk.t, &mut w.t, std::ptr::null(), &mut cs) });
                assert_eq!((gs.hits, gs.misses), (cs.hits, cs.misses), "{name} on device {ordinal}");
                assert!(dout.read() == want, "{name} keyed={keyed} on device {ordinal}");
            }
        }
    }
}
