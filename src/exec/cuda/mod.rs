//! The CUDA side (cargo feature `cuda`, on by default): lookups on CUDA tensors, enqueued on the
//! caller's stream.
//!
//! cudarc loads `libcuda` and `libnvrtc` dynamically, so the library builds and loads on
//! machines with neither; every entry point checks for them first instead of letting a missing
//! library panic. The kernels (`gather.cu`) are CUDA C compiled by NVRTC once per device
//! architecture.
//!
//! - [`device`]: contexts, compiled kernels, streams.
//! - [`backend`]: memory, launches, copies and host functions in stream order.
//! - [`residency`]: where a table's rows are on each device (static copy, mapped host memory,
//!   cache, shards), made on first use.
//! - [`run`]: a lookup on CUDA tensors: validation, staging of host tensors, launches.
//! - [`pooled`]: pooled lookups and batches of requests on CUDA tensors: validation, devices
//!   and streams; [`requests`] runs them on a backend (staging, launches, results).
//! - [`params`]: the kernels' parameter structs.
//! - [`emulate`]: runs the same algorithms against a CPU build of the kernels (tests only).

pub(crate) mod backend;
pub(crate) mod cache;
pub(crate) mod device;
#[doc(hidden)]
pub mod emulate;
pub(crate) mod inflight;
pub(crate) mod io;
pub mod params;
pub(crate) mod pooled;
pub(crate) mod readback;
pub(crate) mod requests;
pub(crate) mod residency;
pub(crate) mod run;

pub use residency::Residency;

use crate::error::{Error, Result};
use crate::util::lock::lock;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The CUDA C source of every kernel.
pub(crate) const GATHER_SOURCE: &str = include_str!("gather.cu");

/// Key dtypes, table dtypes and output dtypes the kernels are instantiated for, by name.
pub(crate) const KEY_NAMES: [&str; 4] = ["i32", "i64", "u32", "u64"];
/// Table and output dtype names of the kernels.
pub(crate) const FLOAT_NAMES: [&str; 3] = ["f32", "f16", "bf16"];
/// Quantized row formats the gather and pooled kernels read (`io::format_name`); a cache of
/// such a table holds float32 rows, so they have no cache kernels.
pub(crate) const QUANTIZED_NAMES: [&str; 3] = ["int8", "int4", "fp8"];

/// Every kernel's name: `strata_gather_<keys>_<table>_<out>`,
/// `strata_cache_probe_<keys>_<table>_<out>`, `strata_cache_fill_<table>_<out>`,
/// `strata_cache_insert_<table>`, `strata_pooled_<table>`, `strata_pool_rows` and
/// `strata_batch` (quantized tables: gathers and pooled kernels only).
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for k in KEY_NAMES {
        for t in FLOAT_NAMES {
            for o in FLOAT_NAMES {
                v.push(format!("strata_gather_{k}_{t}_{o}"));
                v.push(format!("strata_cache_probe_{k}_{t}_{o}"));
            }
        }
        for t in QUANTIZED_NAMES {
            for o in FLOAT_NAMES {
                v.push(format!("strata_gather_{k}_{t}_{o}"));
            }
        }
    }
    for t in FLOAT_NAMES {
        for o in FLOAT_NAMES {
            v.push(format!("strata_cache_fill_{t}_{o}"));
        }
        v.push(format!("strata_cache_insert_{t}"));
    }
    for t in FLOAT_NAMES.into_iter().chain(QUANTIZED_NAMES) {
        v.push(format!("strata_pooled_{t}"));
    }
    v.push("strata_pool_rows".into());
    v.push("strata_batch".into());
    v
}

pub use crate::util::cuda::{device_count, unsupported_reason};

/// The kernels' launch bounds: threads per block, and the blocks per multiprocessor their
/// registers must allow (`STRATA_BLOCK` and `STRATA_MIN_BLOCKS` in gather.cu).
pub fn launch_bounds() -> (u32, u32) {
    (backend::BLOCK, backend::MIN_BLOCKS_PER_SM)
}

/// Whether NVRTC (`libnvrtc.so.12`) can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only probes whether the shared library can be loaded.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles the kernels to PTX for a virtual architecture such as `"compute_90"`.
pub fn compile_gather(arch: &'static str) -> Result<String> {
    if !nvrtc_available() {
        return Err(Error::Device {
            arg: "nvrtc",
            msg: "libnvrtc.so.12 cannot be loaded: install the nvidia-cuda-nvrtc-cu12 wheel or a CUDA toolkit and put \
                  its lib folder on LD_LIBRARY_PATH"
                .into(),
        });
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        name: Some("strata_gather.cu".into()),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let compiled = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(GATHER_SOURCE, opts))
        .map_err(|_| Error::Internal("NVRTC panicked while compiling the gather kernels".into()))?;
    let ptx = compiled.map_err(|e| Error::Internal(format!("NVRTC could not compile the gather kernels for {arch}: {e:?}")))?;
    Ok(ptx.to_src())
}

/// The kernels' PTX for compute capability `major.minor`, compiled once per process.
pub(crate) fn compile_gather_for(major: i32, minor: i32) -> Result<String> {
    static PTX: OnceLock<Mutex<HashMap<(i32, i32), String>>> = OnceLock::new();
    let mut cache = lock(PTX.get_or_init(Default::default));
    if let Some(p) = cache.get(&(major, minor)) {
        return Ok(p.clone());
    }
    // NVRTC wants a 'static name; one small string per architecture, for the process's life.
    let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
    let ptx = compile_gather(arch)?;
    cache.insert((major, minor), ptx.clone());
    Ok(ptx)
}
