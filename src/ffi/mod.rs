//! The C ABI: `extern "C"` functions, argument checks, the panic boundary and status mapping.
//! No logic lives here: every export checks its pointers, makes one call into the core and
//! returns a status.

mod lookup;
mod partition;
mod server;
mod table;

use crate::error::{Error, Result, Status};
use std::cell::{Cell, RefCell};
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

/// Major version of this library (agrees with Cargo.toml).
pub const STRATA_VERSION_MAJOR: u32 = 0;
/// Minor version of this library (agrees with Cargo.toml).
pub const STRATA_VERSION_MINOR: u32 = 2;
/// Patch version of this library (agrees with Cargo.toml).
pub const STRATA_VERSION_PATCH: u32 = 0;
/// `MAJOR * 10000 + MINOR * 100 + PATCH`, for `#if STRATA_VERSION_NUMBER >= ...` checks.
pub const STRATA_VERSION_NUMBER: u32 = STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Whether this thread is inside an export (its panics are reported, not printed).
    static IN_EXPORT: Cell<bool> = const { Cell::new(false) };
    /// Where and why the last panic inside an export happened.
    static PANIC_REPORT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs, once, a panic hook that keeps panics inside strata's exports off the host's
/// stderr (they become `STRATA_INTERNAL` with the panic's location and message) and passes
/// every other panic to the hook that was there before.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_EXPORT.with(Cell::get) {
                PANIC_REPORT.with(|r| *r.borrow_mut() = Some(info.to_string().replace('\n', " ")));
            } else {
                previous(info);
            }
        }));
    });
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into())
}

/// Runs an export's body: catches panics, records the error message for
/// `strata_last_error`, and maps the result to a status. Every fallible export goes through it.
pub(crate) fn boundary(f: impl FnOnce() -> Result<()>) -> Status {
    install_panic_hook();
    let outer = IN_EXPORT.with(|b| b.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_EXPORT.with(|b| b.set(outer));
    let err = match result {
        Ok(Ok(())) => return Status::STRATA_OK,
        Ok(Err(e)) => e,
        Err(p) => {
            let report = PANIC_REPORT.with(|r| r.borrow_mut().take());
            Error::Internal(format!("panic inside strata: {}", report.unwrap_or_else(|| panic_message(p.as_ref()))))
        }
    };
    set_last_error(&err.to_string());
    err.status()
}

/// Borrows a required pointer argument, or fails with `STRATA_NULL_ARGUMENT` naming `arg`.
pub(crate) unsafe fn arg_ref<'a, T>(p: *const T, arg: &'static str) -> Result<&'a T> {
    unsafe { p.as_ref() }.ok_or(Error::Null { arg })
}

/// Borrows an optional pointer argument.
pub(crate) unsafe fn opt_ref<'a, T>(p: *const T) -> Option<&'a T> {
    unsafe { p.as_ref() }
}

/// Copies an optional options struct, or its defaults when `p` is NULL.
pub(crate) unsafe fn opt_or_default<T: Copy + Default>(p: *const T) -> T {
    unsafe { opt_ref(p) }.copied().unwrap_or_default()
}

/// Checks an out-parameter, clears it, and returns it for writing.
pub(crate) unsafe fn out_arg<'a, T>(p: *mut *mut T, arg: &'static str) -> Result<&'a mut *mut T> {
    let slot = unsafe { p.as_mut() }.ok_or(Error::Null { arg })?;
    *slot = std::ptr::null_mut();
    Ok(slot)
}

/// Borrows a required NUL-terminated path argument, or fails with `STRATA_NULL_ARGUMENT`.
pub(crate) unsafe fn c_path<'a>(p: *const c_char, arg: &'static str) -> Result<&'a std::path::Path> {
    let s = unsafe { std::ffi::CStr::from_ptr(arg_ref(p, arg)?) };
    #[cfg(unix)]
    return Ok(std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(s.to_bytes())));
    #[cfg(not(unix))]
    return s.to_str().map(std::path::Path::new).map_err(|_| Error::invalid(arg, "is not valid UTF-8"));
}

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
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The name of a `strata_status` value (`"STRATA_KEY_NOT_FOUND"`), or
/// `"STRATA_UNKNOWN_STATUS"` for a value that is not one. The string is static.
#[unsafe(no_mangle)]
pub extern "C" fn strata_status_name(status: i32) -> *const c_char {
    Status::ALL
        .iter()
        .find(|s| **s as i32 == status)
        .map_or(c"STRATA_UNKNOWN_STATUS".as_ptr(), |s| s.name().as_ptr())
}

/// 1 when this build has CUDA support and a CUDA driver with at least one device is present,
/// else 0. Never fails: without a driver (or without the `cuda` feature) it returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn strata_cuda_available() -> i32 {
    #[cfg(feature = "cuda")]
    {
        catch_unwind(crate::exec::cuda::device_count).map_or(0, |n| (n > 0) as i32)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

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

/// The number of threads a lookup with `num_threads = 0` may use: `STRATA_NUM_THREADS` if
/// set, else the CPUs in the process's affinity mask (read once, at first use).
#[unsafe(no_mangle)]
pub extern "C" fn strata_default_num_threads() -> i32 {
    match catch_unwind(crate::exec::pool::default_threads) {
        Ok(n) => n.min(i32::MAX as usize) as i32,
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn version_agrees_with_cargo() {
        let v = unsafe { CStr::from_ptr(strata_version()) }.to_str().unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        assert_eq!(STRATA_VERSION_MAJOR.to_string(), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(STRATA_VERSION_MINOR.to_string(), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(STRATA_VERSION_PATCH.to_string(), env!("CARGO_PKG_VERSION_PATCH"));
        assert_eq!(
            STRATA_VERSION_NUMBER,
            STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH
        );
    }

    #[test]
    fn panics_become_internal_errors() {
        let s = boundary(|| panic!("boom"));
        assert_eq!(s, Status::STRATA_INTERNAL);
        let msg = unsafe { CStr::from_ptr(strata_last_error()) }.to_str().unwrap();
        assert!(msg.contains("boom"), "{msg}");
    }

    #[test]
    fn build_features_follow_the_cargo_features() {
        let f = strata_build_features();
        assert_eq!(f & STRATA_FEATURE_CUDA != 0, cfg!(feature = "cuda"));
        assert_eq!(f & !(STRATA_FEATURE_CUDA | STRATA_FEATURE_MPI), 0);
    }

    #[test]
    fn status_names() {
        let n = |s| unsafe { CStr::from_ptr(strata_status_name(s)) }.to_str().unwrap();
        assert_eq!(n(0), "STRATA_OK");
        assert_eq!(n(7), "STRATA_KEY_NOT_FOUND");
        assert_eq!(n(-3), "STRATA_UNKNOWN_STATUS");
    }
}
