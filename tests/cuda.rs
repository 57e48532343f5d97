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
//!   several devices are used when present (replicas, shards). Pooled lookups
//!   (`strata_lookup_pooled`: every placement, pooling, table and out dtype, ragged and fixed
//!   hotness, weights, host/device mixes) and batches (`strata_lookup_batch`: 26 tables, plain
//!   and pooled, one device) are compared with the CPU path the same way; a pooled lookup queued
//!   behind a spinning kernel returns before the stream finishes; bad device offsets fail the
//!   call when it waits. Tables quantized at build (int8, int4, fp8) are compared the same way,
//!   plain and pooled, in every placement, and in the batch beside float tables. Without a
//!   device each of these prints "skipped: no CUDA device".
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
        // Float tables: 72 gathers and cache probes, 9 fills, 3 inserts; quantized ones: 36
        // gathers; 6 pooled kernels, strata_pool_rows and strata_batch.
        assert_eq!(cuda::kernel_names().len(), 128);
    }
}

/// Where ptxas is: `STRATA_PTXAS`, else `ptxas` on PATH.
fn ptxas() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_PTXAS") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.is_file())
}

/// One kernel as `ptxas -v` describes it.
#[derive(Default, Debug)]
struct Assembled {
    registers: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
    shared: u32,
}

/// The number before `unit` in `line` ("24 bytes stack frame" -> 24 for "bytes stack frame").
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output into each entry function's registers, stack and spills.
fn parse_ptxas(log: &str) -> Vec<(String, Assembled)> {
    let mut kernels: Vec<(String, Assembled)> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            kernels.push((name, Assembled::default()));
            continue;
        }
        let Some((_, k)) = kernels.last_mut() else { continue };
        if let Some(v) = number_before(line, "bytes stack frame") {
            k.stack = v;
            k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(u32::MAX);
            k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(u32::MAX);
        }
        if let Some(v) = number_before(line, "registers") {
            k.registers = v;
            k.shared = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    kernels
}

/// Theoretical occupancy (resident warps / 64) of a kernel on sm_90 at `block` threads a block:
/// 2048 threads, 32 blocks, 65,536 registers (allocated per warp in units of 256) and 228 KiB of
/// shared memory (plus 1 KiB reserved per block) per multiprocessor.
fn occupancy_sm90(registers: u32, shared: u32, block: u32) -> f64 {
    let warps = block.div_ceil(32);
    let by_threads = 2048 / block;
    let regs_per_warp = (registers.max(1) * 32).div_ceil(256) * 256;
    let by_registers = (65536 / regs_per_warp) / warps;
    let by_shared = (228 * 1024) / (shared + 1024);
    let blocks = by_threads.min(by_registers).min(by_shared).min(32);
    (blocks * warps) as f64 / 64.0
}

#[test]
fn ptxas_output_is_parsed() {
    let log = "ptxas info    : Compiling entry function 'k_a' for 'sm_90'\n\
               ptxas info    : Function properties for k_a\n\
               \x20   24 bytes stack frame, 28 bytes spill stores, 20 bytes spill loads\n\
               ptxas info    : Used 40 registers, used 0 barriers, 24 bytes cumulative stack size\n\
               ptxas info    : Compiling entry function 'k_b' for 'sm_90'\n\
               ptxas info    : Function properties for k_b\n\
               \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
               ptxas info    : Used 64 registers, used 1 barriers, 4096 bytes smem\n";
    let k = parse_ptxas(log);
    assert_eq!(k.len(), 2);
    assert_eq!((k[0].0.as_str(), k[0].1.registers, k[0].1.stack, k[0].1.spill_stores, k[0].1.spill_loads), ("k_a", 40, 24, 28, 20));
    assert_eq!((k[1].0.as_str(), k[1].1.registers, k[1].1.spill_stores, k[1].1.shared), ("k_b", 64, 0, 4096));
    // 32 registers: 8 blocks of 256 = 100%; 40: 6 blocks; 64: 4 blocks = 50%; 128: 2 blocks.
    assert_eq!(occupancy_sm90(32, 0, 256), 1.0);
    assert_eq!(occupancy_sm90(40, 0, 256), 0.75);
    assert_eq!(occupancy_sm90(64, 0, 256), 0.5);
    assert_eq!(occupancy_sm90(128, 0, 256), 0.25);
    assert_eq!(occupancy_sm90(32, 100 * 1024, 256), 0.25);
}

/// The one static measure of the GPU code a machine without a GPU can take: every kernel,
/// assembled by ptxas for sm_90 at the launch bounds strata uses, keeps its values in registers
/// (no local-memory spills) and leaves room for `MIN_BLOCKS_PER_SM` blocks a multiprocessor.
/// Prints each kernel's registers, stack and theoretical occupancy. ptxas comes from the
/// `nvidia-cuda-nvcc-cu12` wheel (scripts/test.sh sets STRATA_PTXAS); when STRATA_REQUIRE_NVRTC
/// is set, a missing ptxas fails the test.
#[test]
fn every_kernel_assembles_for_sm90_without_spills() {
    let (block, min_blocks) = cuda::launch_bounds();
    let source = include_str!("../src/exec/cuda/gather.cu");
    assert!(source.contains(&format!("#define STRATA_BLOCK {}\n", block)), "gather.cu's STRATA_BLOCK differs from BLOCK");
    assert!(
        source.contains(&format!("#define STRATA_MIN_BLOCKS {}\n", min_blocks)),
        "gather.cu's STRATA_MIN_BLOCKS differs from MIN_BLOCKS_PER_SM"
    );
    let required = std::env::var_os("STRATA_REQUIRE_NVRTC").is_some();
    if !cuda::nvrtc_available() {
        assert!(!required, "STRATA_REQUIRE_NVRTC is set but libnvrtc.so.12 cannot be loaded");
        skipped("NVRTC (libnvrtc.so.12) is not installed; scripts/test.sh installs it");
        return;
    }
    let Some(ptxas) = ptxas() else {
        assert!(!required, "STRATA_REQUIRE_NVRTC is set but ptxas was not found (set STRATA_PTXAS)");
        skipped("ptxas is not installed (the nvidia-cuda-nvcc-cu12 wheel has it; scripts/test.sh sets STRATA_PTXAS)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("strata-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ptx = dir.join("gather.ptx");
    std::fs::write(&ptx, cuda::compile_gather("compute_90").unwrap_or_else(|e| panic!("{e}"))).unwrap();
    let run = std::process::Command::new(&ptxas)
        .arg("-arch=sm_90")
        .arg("-v")
        .arg("--warn-on-spills")
        .arg(&ptx)
        .arg("-o")
        .arg(dir.join("gather.cubin"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas.display()));
    std::fs::remove_dir_all(&dir).ok();
    let log = String::from_utf8_lossy(&run.stderr).into_owned() + &String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "ptxas failed:\n{log}");
    let kernels = parse_ptxas(&log);
    let mut report = format!(
        "ptxas sm_90, {} threads a block, at least {} blocks a multiprocessor:\n{:<40} {:>5} {:>6} {:>7} {:>10}\n",
        block, min_blocks, "kernel", "regs", "stack", "spills", "occupancy"
    );
    let mut problems = Vec::new();
    for (name, k) in &kernels {
        let occ = occupancy_sm90(k.registers, k.shared, block);
        report += &format!("{name:<40} {:>5} {:>6} {:>7} {:>9.0}%\n", k.registers, k.stack, k.spill_stores + k.spill_loads, occ * 100.0);
        if k.spill_stores != 0 || k.spill_loads != 0 {
            problems.push(format!("{name}: {} bytes spill stores, {} bytes spill loads", k.spill_stores, k.spill_loads));
        }
        if occ < (min_blocks * block / 32) as f64 / 64.0 {
            problems.push(format!("{name}: occupancy {:.0}% with {} registers", occ * 100.0, k.registers));
        }
    }
    let _ = std::io::stderr().write_all(report.as_bytes());
    for name in cuda::kernel_names() {
        assert!(kernels.iter().any(|(n, _)| *n == name), "ptxas did not assemble {name}");
    }
    assert!(problems.is_empty(), "kernels spill to local memory or miss the occupancy bound:\n{}", problems.join("\n"));
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
fn random_table(
    rng: &mut Rng,
    rows: usize,
    dim: usize,
    dtype: dlpark::ffi::DLDataType,
    keyed: bool,
    opts: &TableOptions,
) -> (Owned, Vec<i64>) {
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
    assert_eq!(gpu::query(s), cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY, "strata_lookup without stats waited for the stream");
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
    for (name, opts) in [("replicated", TableOptions::default()), ("sharded", TableOptions { gpu_sharding: 1, ..TableOptions::default() })]
    {
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

// ---- pooled lookups and batches ----

fn pool_code(i: usize) -> i32 {
    [strata_pooling::STRATA_POOL_SUM, strata_pooling::STRATA_POOL_MEAN, strata_pooling::STRATA_POOL_SQRTN][i] as i32
}

#[test]
fn pooled_and_batch_cuda_tensors_without_a_driver_get_a_clear_status() {
    if cuda::device_count() > 0 {
        skipped("a CUDA device is present (this checks the refusal without one)");
        return;
    }
    let vectors: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let table = Owned::build(&vectors, 4, 2, None, &TableOptions::default());
    let keys = [1i64, 2, 3];
    let offsets = [0i64, 1, 3];
    let mut out = [0f32; 4];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[3]);
    let o = Desc::compact(offsets.as_ptr().cast(), I64, &[3]).device(DLDeviceType::CUDA);
    let mut out_d = Desc::compact(out.as_mut_ptr().cast(), F32, &[2, 2]);
    // SAFETY: the tensors describe live buffers of the shapes they give (host memory labelled CUDA: refused
    // before any access).
    let s = unsafe {
        strata_lookup_pooled(table.0, &k.t, &o.t, std::ptr::null(), pool_code(0), &mut out_d.t, std::ptr::null(), std::ptr::null_mut())
    };
    fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &["offsets: device kDLCUDA:0", "no CUDA driver or device is present"]);
    let hk = Desc::compact(keys.as_ptr().cast(), I64, &[3]);
    let mut dout = Desc::compact(out.as_mut_ptr().cast(), F32, &[3, 2]).device(DLDeviceType::CUDA);
    let mut req = [strata_lookup_request_default(), strata_lookup_request_default()];
    req[0].table = table.0;
    req[0].keys = &hk.t;
    req[0].out = &mut out_d.t;
    req[0].offsets = &o.t;
    req[0].pooling = pool_code(1);
    req[1].table = table.0;
    req[1].keys = &hk.t;
    req[1].out = &mut dout.t;
    // SAFETY: two requests of live descriptions; refused before any access.
    let s = unsafe { strata_lookup_batch(req.as_ptr(), 2, std::ptr::null()) };
    fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &["requests[0].offsets: device kDLCUDA:0"]);
    assert_eq!(out, [0.0; 4]);
}

/// Bags on the host: keys (bytes of `kd`), ragged (`offsets`) or fixed hotness, weights.
struct HostBags {
    kb: Vec<u8>,
    kd: dlpark::ffi::DLDataType,
    nnz: usize,
    b: usize,
    offsets: Option<Vec<i64>>,
    hotness: usize,
    weights: Option<Vec<f32>>,
}

impl HostBags {
    fn random(rng: &mut Rng, keys: &[i64], kd: dlpark::ffi::DLDataType, b: usize, ragged: bool, weighted: bool) -> HostBags {
        let (nnz, offsets, hotness) = if ragged {
            let mut off = vec![0i64];
            for _ in 0..b {
                let len = if rng.below(5) == 0 { 0 } else { 1 + rng.below(50) as i64 };
                off.push(off.last().unwrap() + len);
            }
            (*off.last().unwrap() as usize, Some(off), 0)
        } else {
            let l = 1 + rng.below(40) as usize;
            (b * l, None, l)
        };
        let kb = random_keys(rng, keys, nnz, kd);
        let weights = weighted.then(|| (0..nnz).map(|_| if rng.below(8) == 0 { 0.0 } else { rng.f32() * 3.0 }).collect());
        HostBags { kb, kd, nnz, b, offsets, hotness, weights }
    }

    fn key_shape(&self) -> Vec<i64> {
        if self.offsets.is_some() { vec![self.nnz as i64] } else { vec![self.b as i64, self.hotness as i64] }
    }
}

/// Where a pooled lookup's tensors live.
#[derive(Debug, Clone, Copy)]
enum PoolMix {
    AllDevice,
    HostInputsDeviceOut,
    DeviceInputsHostOut,
}

/// A pooled lookup on the CPU and through the GPU (tensors placed as `mix`, on stream `s`, stats
/// asked for), into poisoned outputs; returns both outputs and both stats.
#[allow(clippy::too_many_arguments)]
fn pooled_cpu_and_gpu(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    s: cudarc::driver::sys::CUstream,
    t: &Owned,
    bags: &HostBags,
    pooling: i32,
    od: dlpark::ffi::DLDataType,
    dim: usize,
    mix: PoolMix,
) -> ((Vec<u8>, LookupStats), (Vec<u8>, LookupStats)) {
    let bytes = bags.b * dim * elem_size(od);
    let shape = bags.key_shape();
    let ob: Vec<u8> = bags.offsets.iter().flatten().flat_map(|o| o.to_le_bytes()).collect();
    let wb: Vec<u8> = bags.weights.iter().flatten().flat_map(|w| w.to_le_bytes()).collect();
    let nb = bags.b as i64 + 1;
    let mut want = vec![0x5Au8; bytes];
    let k = Desc::compact(bags.kb.as_ptr(), bags.kd, &shape);
    let o = bags.offsets.as_ref().map(|_| Desc::compact(ob.as_ptr(), I64, &[nb]));
    let w = bags.weights.as_ref().map(|_| Desc::compact(wb.as_ptr(), F32, &shape));
    let opt = |d: &Option<Desc>| d.as_ref().map_or(std::ptr::null(), |d| &d.t as *const _);
    let mut wd = Desc::compact(want.as_mut_ptr(), od, &[bags.b as i64, dim as i64]);
    let mut cs = LookupStats::default();
    // SAFETY: the tensors describe live buffers of the shapes they give (host memory).
    ok(unsafe { strata_lookup_pooled(t.0, &k.t, opt(&o), opt(&w), pooling, &mut wd.t, std::ptr::null(), &mut cs) });

    let on_device = !matches!(mix, PoolMix::HostInputsDeviceOut);
    let (dk, dof, dw) = (gpu::Buf::new(ctx, &bags.kb), gpu::Buf::new(ctx, &ob), gpu::Buf::new(ctx, &wb));
    let dout = gpu::Buf::new(ctx, &vec![0xA5u8; bytes]);
    let mut host_out = vec![0xA5u8; bytes];
    let place = |d: Desc| if on_device { d.device(DLDeviceType::CUDA) } else { d };
    let gk = place(Desc::compact(if on_device { dk.ptr as *const u8 } else { bags.kb.as_ptr() }, bags.kd, &shape));
    let go = bags.offsets.as_ref().map(|_| place(Desc::compact(if on_device { dof.ptr as *const u8 } else { ob.as_ptr() }, I64, &[nb])));
    let gw = bags.weights.as_ref().map(|_| place(Desc::compact(if on_device { dw.ptr as *const u8 } else { wb.as_ptr() }, F32, &shape)));
    let mut gout = match mix {
        PoolMix::DeviceInputsHostOut => Desc::compact(host_out.as_mut_ptr(), od, &[bags.b as i64, dim as i64]),
        _ => Desc::compact(dout.ptr as *const u8, od, &[bags.b as i64, dim as i64]).device(DLDeviceType::CUDA),
    };
    let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 0, ..LookupOptions::default() };
    let mut gs = LookupStats::default();
    // SAFETY: the tensors describe live buffers of the shapes they give (host, or device memory of `ctx`), on
    // a stream of that device.
    let st = unsafe { strata_lookup_pooled(t.0, &gk.t, opt(&go), opt(&gw), pooling, &mut gout.t, &opts, &mut gs) };
    assert_eq!(st, Status::STRATA_OK, "{mix:?}: {}", last_error());
    gpu::sync(s);
    let got = match mix {
        PoolMix::DeviceInputsHostOut => host_out,
        _ => dout.read(),
    };
    ((want, cs), (got, gs))
}

/// A pooled lookup case: `t` (of `dim`, whose keys are `keys`), a pooling (index of
/// [`pool_code`]), ragged bags or a fixed hotness, weighted or not.
#[derive(Clone, Copy)]
struct PooledCase<'a> {
    t: &'a Owned,
    keys: &'a [i64],
    dim: usize,
    pooling: usize,
    ragged: bool,
    weighted: bool,
}

/// Random bags of `c` (random key and out dtypes, 1 to 300 bags) looked up on the CPU and on
/// device `ctx`'s stream `s`, with the tensors in each place a host may put them; checks rows
/// and stats agree. `what` names the table in a failure.
fn pooled_matches_in_every_mix(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    s: cudarc::driver::sys::CUstream,
    rng: &mut Rng,
    c: PooledCase,
    what: &str,
) {
    let kd = [I32, I64, U32, U64][rng.below(4) as usize];
    let od = [F32, F16, BF16][rng.below(3) as usize];
    let b = 1 + rng.below(300) as usize;
    let bags = HostBags::random(rng, c.keys, kd, b, c.ragged, c.weighted);
    for mix in [PoolMix::AllDevice, PoolMix::HostInputsDeviceOut, PoolMix::DeviceInputsHostOut] {
        let ((want, cs), (got, gs)) = pooled_cpu_and_gpu(ctx, s, c.t, &bags, pool_code(c.pooling), od, c.dim, mix);
        let (pooling, ragged, weighted) = (c.pooling, c.ragged, c.weighted);
        let what = format!("{what} pooling {pooling} ragged={ragged} weighted={weighted} keys {kd:?} out {od:?} {mix:?}");
        assert_eq!((gs.hits, gs.misses), (cs.hits, cs.misses), "{what}: stats");
        assert!(got == want, "{what}: pooled rows differ from the CPU path");
    }
}

#[test]
fn gpu_pooled_placements_dtypes_and_mixes_match_the_cpu_path() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    let mut rng = Rng(41);
    let placements = placements();
    for (name, opts) in [&placements[0], &placements[1], &placements[2], &placements[4]] {
        for keyed in [false, true] {
            for td in [F32, F16, BF16] {
                // 300: two passes of 256 columns per bag.
                let dim = if td == BF16 { 300 } else { 36 };
                let (t, keys) = random_table(&mut rng, 2000, dim, td, keyed, opts);
                for pooling in 0..3 {
                    for ragged in [true, false] {
                        for weighted in [false, true] {
                            let what = format!("{name} keyed={keyed} table {td:?}");
                            let case = PooledCase { t: &t, keys: &keys, dim, pooling, ragged, weighted };
                            pooled_matches_in_every_mix(&ctx, s, &mut rng, case, &what);
                        }
                    }
                }
            }
        }
    }
}

/// A table of `rows` x `dim` float32 values quantized at build as `opts.storage` says: random
/// rows, constant rows (scale 0), rows of extreme magnitudes (within what the format holds) and
/// of tiny ones.
fn quantized_table(rng: &mut Rng, rows: usize, dim: usize, keyed: bool, opts: &TableOptions) -> (Owned, Vec<i64>) {
    let big = if opts.storage == strata_storage::STRATA_STORAGE_INT4 as i32 { 3.0e4 } else { 1.0e37 };
    let mut data = Vec::with_capacity(rows * dim * 4);
    for r in 0..rows {
        let constant = rng.f32() * 20.0;
        for _ in 0..dim {
            let x = match r % 5 {
                0 => constant,
                1 => rng.f32() * big,
                2 => rng.f32() * 1e-36,
                _ => rng.f32() * 10.0,
            };
            data.extend_from_slice(&x.to_le_bytes());
        }
    }
    let keys: Vec<i64> = if keyed { (0..rows as i64).map(|r| r * 7919 - 50_000).collect() } else { (0..rows as i64).collect() };
    let t = Owned::build_bytes(&data, F32, rows, dim, keyed.then_some(&keys[..]), opts);
    (t, keys)
}

/// Device 0's context and a new stream on it; `None` (saying so) without a CUDA device.
fn device0() -> Option<(std::sync::Arc<cudarc::driver::CudaContext>, cudarc::driver::sys::CUstream)> {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return None;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    Some((ctx, s))
}

#[test]
fn gpu_quantized_tables_match_the_cpu_path() {
    let Some((ctx, s)) = device0() else { return };
    let mut rng = Rng(45);
    // Odd dims put scales at unaligned addresses; 300: two passes of 256 columns per bag.
    let formats = [
        (strata_storage::STRATA_STORAGE_INT8, 37),
        (strata_storage::STRATA_STORAGE_INT4, 36),
        (strata_storage::STRATA_STORAGE_FP8, 300),
        (strata_storage::STRATA_STORAGE_INT8, 300),
    ];
    for (storage, dim) in formats {
        // static, uvm, and caches of 30% and of every row
        for (name, opts) in placements().into_iter().filter(|(name, _)| *name != "cache 0") {
            for keyed in [false, true] {
                let opts = TableOptions { storage: storage as i32, ..opts };
                let (t, keys) = quantized_table(&mut rng, 2000, dim, keyed, &opts);
                let what = format!("{name} storage {storage:?} dim {dim} keyed={keyed}");
                for kd in [I32, U64] {
                    for od in [F32, F16, BF16] {
                        for mix in [Mix::DeviceDevice, Mix::HostKeysDeviceOut, Mix::DeviceKeysHostOut] {
                            let kb = random_keys(&mut rng, &keys, 777, kd);
                            let ((want, cs), (got, gs)) = cpu_and_gpu(&ctx, s, &t, &kb, kd, od, dim, mix);
                            assert_eq!((gs.hits, gs.misses), (cs.hits, cs.misses), "{what} keys {kd:?} out {od:?} {mix:?}: stats");
                            assert!(got == want, "{what} keys {kd:?} out {od:?} {mix:?}: rows differ from the CPU path");
                        }
                    }
                }
                for pooling in 0..3 {
                    for (ragged, weighted) in [(true, true), (false, false), (true, false)] {
                        let case = PooledCase { t: &t, keys: &keys, dim, pooling, ragged, weighted };
                        pooled_matches_in_every_mix(&ctx, s, &mut rng, case, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_pooled_large_batch_of_bags() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    let mut rng = Rng(42);
    for (name, opts) in placements().into_iter().take(3) {
        let (t, keys) = random_table(&mut rng, 200_000, 128, F32, true, &opts);
        // 20,000 bags of 20 keys, and ragged bags.
        for ragged in [false, true] {
            let mut bags = HostBags::random(&mut rng, &keys, I64, 20_000, ragged, false);
            if !ragged {
                bags.hotness = 20;
                bags.nnz = 20 * 20_000;
                bags.kb = random_keys(&mut rng, &keys, bags.nnz, I64);
            }
            let ((want, cs), (got, gs)) = pooled_cpu_and_gpu(&ctx, s, &t, &bags, pool_code(0), F32, 128, PoolMix::AllDevice);
            assert_eq!((gs.hits, gs.misses), (cs.hits, cs.misses), "{name}");
            assert!(got == want, "{name} ragged={ragged}: pooled rows differ from the CPU path");
        }
    }
}

#[test]
fn gpu_pooled_returns_before_the_stream_finishes_and_checks_device_offsets_when_it_waits() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    let mut rng = Rng(43);
    let (t, keys) = random_table(&mut rng, 1000, 16, F32, true, &TableOptions::default());
    let kb = random_keys(&mut rng, &keys, 100, I64);
    let offsets: Vec<i64> = vec![0, 10, 10, 60, 100];
    let ob: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    let (dk, dof) = (gpu::Buf::new(&ctx, &kb), gpu::Buf::new(&ctx, &ob));
    let dout = gpu::Buf::new(&ctx, &vec![0u8; 4 * 16 * 4]);
    let k = Desc::compact(dk.ptr as *const u8, I64, &[100]).device(DLDeviceType::CUDA);
    let o = Desc::compact(dof.ptr as *const u8, I64, &[5]).device(DLDeviceType::CUDA);
    let mut out = Desc::compact(dout.ptr as *const u8, F32, &[4, 16]).device(DLDeviceType::CUDA);
    let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 0, ..LookupOptions::default() };
    // Warm up (kernels compiled, table placed), then queue behind about two seconds of clocks.
    // SAFETY: the tensors describe live buffers of the shapes they give (device memory of `ctx`).
    ok(unsafe { strata_lookup_pooled(t.0, &k.t, &o.t, std::ptr::null(), pool_code(1), &mut out.t, &opts, std::ptr::null_mut()) });
    gpu::sync(s);
    let warm = dout.read();
    gpu::spin(&ctx, s, 2_000_000_000);
    // SAFETY: the tensors describe live buffers of the shapes they give (device memory of `ctx`).
    ok(unsafe { strata_lookup_pooled(t.0, &k.t, &o.t, std::ptr::null(), pool_code(1), &mut out.t, &opts, std::ptr::null_mut()) });
    assert_eq!(
        gpu::query(s),
        cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY,
        "strata_lookup_pooled without stats waited for the stream"
    );
    gpu::sync(s);
    assert!(dout.read() == warm, "rows after the queued pooled lookup ran");
    let mut want = vec![0u8; 4 * 16 * 4];
    let (hk, ho) = (Desc::compact(kb.as_ptr(), I64, &[100]), Desc::compact(ob.as_ptr(), I64, &[5]));
    let mut w = Desc::compact(want.as_mut_ptr(), F32, &[4, 16]);
    // SAFETY: the tensors describe live buffers of the shapes they give (host memory).
    ok(unsafe {
        strata_lookup_pooled(t.0, &hk.t, &ho.t, std::ptr::null(), pool_code(1), &mut w.t, std::ptr::null(), std::ptr::null_mut())
    });
    assert!(warm == want);
    // Bad offsets in device memory: the call that waits (stats) fails with the CPU path's message.
    let bad: Vec<u8> = [0i64, 10, 5, 60, 100].iter().flat_map(|o| o.to_le_bytes()).collect();
    let dbad = gpu::Buf::new(&ctx, &bad);
    let ob = Desc::compact(dbad.ptr as *const u8, I64, &[5]).device(DLDeviceType::CUDA);
    let mut st = LookupStats::default();
    // SAFETY: the tensors describe live buffers of the shapes they give (device memory of `ctx`).
    let r = unsafe { strata_lookup_pooled(t.0, &k.t, &ob.t, std::ptr::null(), pool_code(0), &mut out.t, &opts, &mut st) };
    fails(r, Status::STRATA_INVALID_ARGUMENT, &["offsets: offsets[2] = 5 is less than offsets[1] = 10"]);
    // Offsets in host memory are checked before anything is queued.
    let hb = Desc::compact(bad.as_ptr(), I64, &[5]);
    // SAFETY: the tensors describe live buffers of the shapes they give (device and host memory).
    let r = unsafe { strata_lookup_pooled(t.0, &k.t, &hb.t, std::ptr::null(), pool_code(0), &mut out.t, &opts, std::ptr::null_mut()) };
    fails(r, Status::STRATA_INVALID_ARGUMENT, &["offsets: offsets[2] = 5 is less than offsets[1] = 10"]);
    // Device keys with strides that do not reduce to one cannot be read in place.
    let k2 = Desc::new(dk.ptr as *const u8, I64, &[4, 5], &[1, 4], 0).device(DLDeviceType::CUDA);
    // SAFETY: the tensors describe live buffers of the shapes they give (device memory of `ctx`); refused
    // before any access.
    let r = unsafe {
        strata_lookup_pooled(t.0, &k2.t, std::ptr::null(), std::ptr::null(), pool_code(0), &mut out.t, &opts, std::ptr::null_mut())
    };
    fails(r, Status::STRATA_INVALID_LAYOUT, &["keys: strides [1, 4] of a device tensor"]);
    gpu::sync(s);
}

#[test]
fn gpu_batch_of_26_tables_matches_separate_calls() {
    if cuda::device_count() == 0 {
        skipped("no CUDA device");
        return;
    }
    let ctx = gpu::ctx(0);
    let s = gpu::stream(&ctx);
    let mut rng = Rng(44);
    let placements = placements();
    struct Case {
        t: Owned,
        dim: usize,
        od: dlpark::ffi::DLDataType,
        pooling: i32,
        bags: HostBags,
    }
    let cases: Vec<Case> = (0..26)
        .map(|i| {
            let dim = [4usize, 16, 64, 128, 300][i % 5];
            let td = [F32, F16, BF16][i % 3];
            // Mostly static tables (one launch for all of them), some uvm and cache ones.
            let opts = &placements[[0, 0, 0, 1, 2][i % 5]].1;
            // Some tables quantized at build (int8, int4, fp8), in the same launch as float ones.
            let storage = match i % 8 {
                3 => strata_storage::STRATA_STORAGE_INT8,
                5 => strata_storage::STRATA_STORAGE_INT4,
                7 => strata_storage::STRATA_STORAGE_FP8,
                _ => strata_storage::STRATA_STORAGE_AS_GIVEN,
            };
            let opts = &TableOptions { storage: storage as i32, ..*opts };
            let (t, keys) = random_table(&mut rng, 500 + 37 * i, dim, td, i % 2 == 0, opts);
            let pooling = [0, 1, 2, 3][i % 4];
            let kd = [I32, I64, U32, U64][i % 4];
            let b = 1 + rng.below(64) as usize;
            let bags = HostBags::random(&mut rng, &keys, kd, b, pooling == 0 || i % 3 == 0, pooling != 0 && i % 2 == 1);
            Case { t, dim, od: [F32, F16, BF16][i % 3], pooling, bags }
        })
        .collect();
    for round in 0..2 {
        let rows = |c: &Case| if c.pooling == 0 { c.bags.nnz } else { c.bags.b };
        let host_k: Vec<Desc> = cases.iter().map(|c| Desc::compact(c.bags.kb.as_ptr(), c.bags.kd, &c.bags.key_shape())).collect();
        let obytes: Vec<Vec<u8>> = cases.iter().map(|c| c.bags.offsets.iter().flatten().flat_map(|o| o.to_le_bytes()).collect()).collect();
        let wbytes: Vec<Vec<u8>> = cases.iter().map(|c| c.bags.weights.iter().flatten().flat_map(|w| w.to_le_bytes()).collect()).collect();
        // The CPU path, one call per table.
        let mut want: Vec<Vec<u8>> = cases.iter().map(|c| vec![0x5Au8; rows(c) * c.dim * elem_size(c.od)]).collect();
        let mut cpu_stats = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let mut w = Desc::compact(want[i].as_mut_ptr(), c.od, &[rows(c) as i64, c.dim as i64]);
            let mut st = LookupStats::default();
            if c.pooling == 0 {
                // SAFETY: the tensors describe live buffers of the shapes they give (host memory).
                ok(unsafe { strata_lookup(c.t.0, &host_k[i].t, &mut w.t, std::ptr::null(), &mut st) });
            } else {
                let o = c.bags.offsets.as_ref().map(|_| Desc::compact(obytes[i].as_ptr(), I64, &[c.bags.b as i64 + 1]));
                let wt = c.bags.weights.as_ref().map(|_| Desc::compact(wbytes[i].as_ptr(), F32, &c.bags.key_shape()));
                let opt = |d: &Option<Desc>| d.as_ref().map_or(std::ptr::null(), |d| &d.t as *const _);
                // SAFETY: the tensors describe live buffers of the shapes they give (host memory).
                ok(unsafe { strata_lookup_pooled(c.t.0, &host_k[i].t, opt(&o), opt(&wt), c.pooling, &mut w.t, std::ptr::null(), &mut st) });
            }
            cpu_stats.push(st);
        }
        // One batch on the device (round 1: host keys, offsets and weights, staged).
        let bufs: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    gpu::Buf::new(&ctx, &c.bags.kb),
                    gpu::Buf::new(&ctx, &obytes[i]),
                    gpu::Buf::new(&ctx, &wbytes[i]),
                    gpu::Buf::new(&ctx, &vec![0xA5u8; rows(c) * c.dim * elem_size(c.od)]),
                )
            })
            .collect();
        let dev = |d: Desc| if round == 0 { d.device(DLDeviceType::CUDA) } else { d };
        let keys: Vec<Desc> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                dev(Desc::compact(if round == 0 { bufs[i].0.ptr as *const u8 } else { c.bags.kb.as_ptr() }, c.bags.kd, &c.bags.key_shape()))
            })
            .collect();
        let offs: Vec<Option<Desc>> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (c.pooling != 0 && c.bags.offsets.is_some()).then(|| {
                    dev(Desc::compact(
                        if round == 0 { bufs[i].1.ptr as *const u8 } else { obytes[i].as_ptr() },
                        I64,
                        &[c.bags.b as i64 + 1],
                    ))
                })
            })
            .collect();
        let weights: Vec<Option<Desc>> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.bags.weights.as_ref().map(|_| {
                    dev(Desc::compact(if round == 0 { bufs[i].2.ptr as *const u8 } else { wbytes[i].as_ptr() }, F32, &c.bags.key_shape()))
                })
            })
            .collect();
        let mut outs: Vec<Desc> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| Desc::compact(bufs[i].3.ptr as *const u8, c.od, &[rows(c) as i64, c.dim as i64]).device(DLDeviceType::CUDA))
            .collect();
        let mut stats = vec![LookupStats::default(); cases.len()];
        let mut reqs: Vec<strata_lookup_request> = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let mut r = strata_lookup_request_default();
            r.table = c.t.0;
            r.keys = &keys[i].t;
            r.offsets = offs[i].as_ref().map_or(std::ptr::null(), |d| &d.t);
            r.weights = weights[i].as_ref().map_or(std::ptr::null(), |d| &d.t);
            r.pooling = c.pooling;
            r.out = &mut outs[i].t;
            r.stats = &mut stats[i];
            reqs.push(r);
        }
        let opts = LookupOptions { stream: s as *mut std::ffi::c_void, num_threads: 0, ..LookupOptions::default() };
        // SAFETY: every request's tensors describe live buffers of the shapes they give, on device 0.
        ok(unsafe { strata_lookup_batch(reqs.as_ptr(), reqs.len(), &opts) });
        gpu::sync(s);
        for (i, c) in cases.iter().enumerate() {
            assert_eq!((stats[i].hits, stats[i].misses), (cpu_stats[i].hits, cpu_stats[i].misses), "round {round} request {i}");
            assert!(
                bufs[i].3.read() == want[i],
                "round {round} request {i} (pooling {}, dim {}): rows differ from a separate call",
                c.pooling,
                c.dim
            );
        }
        // An invalid request: nothing of the batch runs, and the error names it.
        let bad_out = Desc::compact(bufs[5].3.ptr as *const u8, cases[5].od, &[rows(&cases[5]) as i64 + 1, cases[5].dim as i64])
            .device(DLDeviceType::CUDA);
        let poisoned: Vec<Vec<u8>> = cases.iter().map(|c| vec![0xA5u8; rows(c) * c.dim * elem_size(c.od)]).collect();
        for (i, b) in bufs.iter().enumerate() {
            ctx.bind_to_thread().unwrap();
            // SAFETY: `b.3` holds exactly poisoned[i].len() bytes of device memory.
            unsafe { cudarc::driver::result::memcpy_htod_sync(b.3.ptr, &poisoned[i]) }.unwrap();
        }
        let mut bad = reqs.clone();
        bad[5].out = &bad_out.t as *const _ as *mut _;
        // SAFETY: as above; request 5's out is refused before anything is queued.
        let r = unsafe { strata_lookup_batch(bad.as_ptr(), bad.len(), &opts) };
        fails(r, Status::STRATA_INVALID_ARGUMENT, &["requests[5].out: shape"]);
        gpu::sync(s);
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.3.read() == poisoned[i], "round {round}: request {i} ran in a batch that failed validation");
        }
    }
}
