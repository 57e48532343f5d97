//! Library-wide exports: versions, build features, statuses and the last error.

use super::boundary::{boundary, last_error};
use super::status::Status;
use std::ffi::c_char;

/// Major version of this library (agrees with Cargo.toml).
pub const STRATA_VERSION_MAJOR: u32 = 0;
/// Minor version of this library (agrees with Cargo.toml).
pub const STRATA_VERSION_MINOR: u32 = 3;
/// Patch version of this library (agrees with Cargo.toml).
pub const STRATA_VERSION_PATCH: u32 = 1;
/// `MAJOR * 10000 + MINOR * 100 + PATCH`, for `#if STRATA_VERSION_NUMBER >= ...` checks.
pub const STRATA_VERSION_NUMBER: u32 = STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH;

/// The library version, `"MAJOR.MINOR.PATCH"`, as a static string.
#[unsafe(no_mangle)]
pub extern "C" fn strata_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the last failed call on this thread (naming the argument at fault and what
/// was expected), or "" if none failed yet. The string is owned by strata and stays valid until
/// the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn strata_last_error() -> *const c_char {
    last_error()
}

/// The name of a `strata_status` value (`"STRATA_KEY_NOT_FOUND"`), or
/// `"STRATA_UNKNOWN_STATUS"` for a value that is not one. The string is static.
#[unsafe(no_mangle)]
pub extern "C" fn strata_status_name(status: i32) -> *const c_char {
    Status::ALL.iter().find(|s| **s as i32 == status).map_or(c"STRATA_UNKNOWN_STATUS".as_ptr(), |s| s.name().as_ptr())
}

/// 1 when this build has CUDA support and a CUDA driver with at least one device is present,
/// else 0. Never fails: without a driver (or without the `cuda` feature) it returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn strata_cuda_available() -> i32 {
    boundary(|| {
        #[cfg(feature = "cuda")]
        return Ok((crate::exec::cuda::device_count() > 0) as i32);
        #[cfg(not(feature = "cuda"))]
        return Ok(0);
    })
}

/// Largest `dim` (elements per row) a table may have: far above any embedding, and small
/// enough that a row's byte size never overflows.
pub const STRATA_MAX_DIM: usize = 1 << 24;
// A literal above so that cbindgen exports it; the layers below use `limits::MAX_DIM`.
const _: () = assert!(STRATA_MAX_DIM == crate::limits::MAX_DIM);

/// Bit of `strata_build_features()`: this library was built with CUDA support (cargo feature
/// `cuda`, CMake option `STRATA_CUDA`). Whether a device is present is `strata_cuda_available()`.
pub const STRATA_FEATURE_CUDA: u32 = 1 << 0;
/// Bit of `strata_build_features()`: this library was built with MPI support (cargo feature
/// `mpi`, CMake option `STRATA_MPI`).
pub const STRATA_FEATURE_MPI: u32 = 1 << 1;

/// What this build contains, as `STRATA_FEATURE_*` bits. A host compiled against an installed
/// strata can compare it with the `STRATA_HAS_CUDA` / `STRATA_HAS_MPI` macros of
/// `strata_features.h` (written next to `strata.h` by CMake). Never fails.
#[unsafe(no_mangle)]
pub extern "C" fn strata_build_features() -> u32 {
    let mut bits = 0;
    if cfg!(feature = "cuda") {
        bits |= STRATA_FEATURE_CUDA;
    }
    if cfg!(feature = "mpi") {
        bits |= STRATA_FEATURE_MPI;
    }
    bits
}

/// 1 when this build can spread tables over MPI ranks (cargo feature `mpi`:
/// `strata_table_from_partitioned` with a communicator, `strata_table_open_distributed`), else
/// 0. Never fails, and never calls MPI.
#[unsafe(no_mangle)]
pub extern "C" fn strata_mpi_available() -> i32 {
    crate::dist::available() as i32
}

/// The number of threads a lookup with `num_threads = 0` made from the calling thread may use:
/// `STRATA_NUM_THREADS` if set, else the CPUs in the calling thread's affinity mask (read once
/// per thread). A thread pinned to one core gets 1; the worker pool is sized from the process's
/// mask whichever thread creates it, and its workers run on the process's CPUs.
#[unsafe(no_mangle)]
pub extern "C" fn strata_default_num_threads() -> i32 {
    let n: i32 = boundary(|| Ok(crate::util::threads::calling_thread_threads().min(i32::MAX as usize) as i32));
    n.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn version_agrees_with_cargo() {
        // SAFETY: strata_version returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(strata_version()) }.to_str().unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        assert_eq!(STRATA_VERSION_MAJOR.to_string(), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(STRATA_VERSION_MINOR.to_string(), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(STRATA_VERSION_PATCH.to_string(), env!("CARGO_PKG_VERSION_PATCH"));
        assert_eq!(STRATA_VERSION_NUMBER, STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH);
    }

    #[test]
    fn build_features_follow_the_cargo_features() {
        let f = strata_build_features();
        assert_eq!(f & STRATA_FEATURE_CUDA != 0, cfg!(feature = "cuda"));
        assert_eq!(f & !(STRATA_FEATURE_CUDA | STRATA_FEATURE_MPI), 0);
    }

    #[test]
    fn status_names() {
        // SAFETY: strata_status_name returns a static NUL-terminated string.
        let n = |s| unsafe { CStr::from_ptr(strata_status_name(s)) }.to_str().unwrap();
        assert_eq!(n(0), "STRATA_OK");
        assert_eq!(n(7), "STRATA_KEY_NOT_FOUND");
        assert_eq!(n(-3), "STRATA_UNKNOWN_STATUS");
    }
}
