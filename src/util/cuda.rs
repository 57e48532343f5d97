//! Whether this machine has a CUDA driver and devices, probed without any other CUDA call (so a
//! missing `libcuda` never panics). A leaf: messages of lower layers can say why a CUDA tensor
//! is not served.

use std::sync::OnceLock;

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

/// Why a CUDA tensor cannot be served here, for `STRATA_UNSUPPORTED_DEVICE` messages.
pub fn unsupported_reason() -> &'static str {
    if device_count() == 0 {
        "no CUDA driver or device is present on this machine (strata_cuda_available() returns 0)"
    } else {
        "this tensor's device is not a CUDA device strata serves"
    }
}
