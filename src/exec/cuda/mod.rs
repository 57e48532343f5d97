//! The CUDA side (cargo feature `cuda`, on by default): driver discovery and the gather
//! kernels, compiled at run time by NVRTC. cudarc loads `libcuda` and `libnvrtc` dynamically,
//! so the library builds and loads on machines with neither; every entry point checks for them
//! first instead of letting a missing library panic.
//!
//! Status: the kernels are compiled and checked (for sm_80 and sm_90) in CI; launching them on
//! the caller's stream, table placements and caches are not built yet, so CUDA tensors still get
//! `STRATA_UNSUPPORTED_DEVICE` with a message that says why.

use crate::error::{Error, Result};
use std::sync::OnceLock;

/// The CUDA C source of every gather kernel.
pub const GATHER_SOURCE: &str = include_str!("gather.cu");

/// Key dtypes, table dtypes and output dtypes the kernels are instantiated for, by name.
pub const KEY_NAMES: [&str; 4] = ["i32", "i64", "u32", "u64"];
/// Table and output dtype names of the kernels.
pub const FLOAT_NAMES: [&str; 3] = ["f32", "f16", "bf16"];

/// Every kernel's name, `strata_gather_<keys>_<table>_<out>`.
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for k in KEY_NAMES {
        for t in FLOAT_NAMES {
            for o in FLOAT_NAMES {
                v.push(format!("strata_gather_{k}_{t}_{o}"));
            }
        }
    }
    v
}

/// Number of CUDA devices the driver reports; 0 when there is no driver (checked before any
/// call, so a missing `libcuda` never panics).
pub fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return 0;
        }
        std::panic::catch_unwind(|| {
            cudarc::driver::result::init().ok()?;
            cudarc::driver::result::device::get_count().ok()
        })
        .ok()
        .flatten()
        .map_or(0, |n| n.max(0) as usize)
    })
}

/// Whether NVRTC (`libnvrtc.so.12`) can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only probes whether the shared library can be loaded.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles the gather kernels to PTX for a virtual architecture such as `"compute_90"`.
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

/// Why this build cannot serve a CUDA tensor yet, for `STRATA_UNSUPPORTED_DEVICE` messages.
pub fn unsupported_reason() -> &'static str {
    if device_count() == 0 {
        "no CUDA driver or device is present on this machine (strata_cuda_available() returns 0)"
    } else {
        "launching lookups on CUDA tensors is not part of this version yet"
    }
}
