//! The panic boundary, the thread's last error, and the pointer-check helpers every export uses.
//!
//! Every export runs its body through [`boundary`], which catches panics, records the message
//! for `strata_last_error`, and turns the outcome into the export's C return type through
//! [`CReturn`] (a status, a value with a fallback such as -1, or nothing). Arguments are
//! borrowed through [`arg_ref`], [`arg_mut`], [`opt_ref`], [`out_handle`], [`write_opt`],
//! [`c_str`] and [`c_path`], so each NULL check is written once and names its argument.

use super::status::Status;
use crate::error::{Error, Result};
use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

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

/// The message `strata_last_error` returns on this thread; valid until the next failure.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
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

/// What an export returns to C, built from its body's result: the success value, or the
/// fallback for a failure (whose message is already recorded for `strata_last_error`).
pub(crate) trait CReturn {
    /// What the export's body produces on success.
    type Value;
    fn ok(v: Self::Value) -> Self;
    fn failed(e: &Error) -> Self;
}

/// Fallible exports return `STRATA_OK` or the error's status.
impl CReturn for Status {
    type Value = ();
    fn ok(_: ()) -> Self {
        Status::STRATA_OK
    }
    fn failed(e: &Error) -> Self {
        Status::from(e.kind())
    }
}

/// Counts (`strata_table_dim`, `strata_table_len`) return -1 on failure.
impl CReturn for i64 {
    type Value = i64;
    fn ok(v: i64) -> Self {
        v
    }
    fn failed(_: &Error) -> Self {
        -1
    }
}

/// Flags and counts that never fail (`strata_cuda_available`) return 0 if strata panicked.
impl CReturn for i32 {
    type Value = i32;
    fn ok(v: i32) -> Self {
        v
    }
    fn failed(_: &Error) -> Self {
        0
    }
}

/// `*_free` functions return nothing; a failure is only recorded.
impl CReturn for () {
    type Value = ();
    fn ok(_: ()) -> Self {}
    fn failed(_: &Error) -> Self {}
}

/// Runs an export's body: catches panics (reported as `STRATA_INTERNAL` with where and why),
/// records a failure's message for `strata_last_error`, and returns the C value. Every export
/// goes through it; no other code in strata catches panics.
pub(crate) fn boundary<R: CReturn>(f: impl FnOnce() -> Result<R::Value>) -> R {
    install_panic_hook();
    let outer = IN_EXPORT.with(|b| b.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_EXPORT.with(|b| b.set(outer));
    let err = match result {
        Ok(Ok(v)) => return R::ok(v),
        Ok(Err(e)) => e,
        Err(p) => {
            let report = PANIC_REPORT.with(|r| r.borrow_mut().take());
            Error::Internal(format!("panic inside strata: {}", report.unwrap_or_else(|| panic_message(p.as_ref()))))
        }
    };
    set_last_error(&err.to_string());
    R::failed(&err)
}

/// Borrows a required pointer argument, or fails with `STRATA_NULL_ARGUMENT` naming `arg`.
///
/// # Safety
/// `p` must be NULL or valid for reads of a `T` for `'a`.
pub(crate) unsafe fn arg_ref<'a, T>(p: *const T, arg: &'static str) -> Result<&'a T> {
    // SAFETY: the caller guarantees p is NULL or valid; as_ref maps NULL to None.
    match unsafe { p.as_ref() } {
        Some(r) => Ok(r),
        // Built here only: `ok_or(Error::Null { .. })` built (and dropped) it on every call.
        None => Err(Error::Null { arg }),
    }
}

/// Borrows a required out-pointer (`int32_t *count`), or fails with `STRATA_NULL_ARGUMENT`.
///
/// # Safety
/// `p` must be NULL or valid for writes of a `T` for `'a`, and not aliased meanwhile.
pub(crate) unsafe fn arg_mut<'a, T>(p: *mut T, arg: &'static str) -> Result<&'a mut T> {
    // SAFETY: the caller guarantees p is NULL or valid and unaliased.
    match unsafe { p.as_mut() } {
        Some(r) => Ok(r),
        None => Err(Error::Null { arg }),
    }
}

/// Borrows an optional pointer argument.
///
/// # Safety
/// `p` must be NULL or valid for reads of a `T` for `'a`.
pub(crate) unsafe fn opt_ref<'a, T>(p: *const T) -> Option<&'a T> {
    // SAFETY: the caller guarantees p is NULL or valid.
    unsafe { p.as_ref() }
}

/// Writes `v` through an optional out-pointer (`uint64_t *erased`); NULL means the caller
/// does not want it.
///
/// # Safety
/// `p` must be NULL or valid for writes of a `T`.
pub(crate) unsafe fn write_opt<T>(p: *mut T, v: T) {
    // SAFETY: the caller guarantees p is NULL or valid.
    if let Some(slot) = unsafe { p.as_mut() } {
        *slot = v;
    }
}

/// Checks a handle out-parameter (`strata_table **out`), clears it (so a failure leaves NULL),
/// and returns it for writing.
///
/// # Safety
/// `p` must be NULL or valid for writes of a pointer.
pub(crate) unsafe fn out_handle<'a, T>(p: *mut *mut T, arg: &'static str) -> Result<&'a mut *mut T> {
    // SAFETY: the caller guarantees p is NULL or valid.
    let slot = unsafe { arg_mut(p, arg) }?;
    *slot = std::ptr::null_mut();
    Ok(slot)
}

/// Borrows a required NUL-terminated string argument as UTF-8.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, arg: &'static str) -> Result<&'a str> {
    // SAFETY: the caller guarantees a NUL-terminated string when p is not NULL.
    let s = unsafe { CStr::from_ptr(arg_ref(p, arg)?) };
    s.to_str().map_err(|_| Error::invalid(arg, "is not valid UTF-8"))
}

/// Borrows a required NUL-terminated path argument (any bytes on Unix).
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn c_path<'a>(p: *const c_char, arg: &'static str) -> Result<&'a std::path::Path> {
    // SAFETY: the caller guarantees a NUL-terminated string when p is not NULL.
    let s = unsafe { CStr::from_ptr(arg_ref(p, arg)?) };
    #[cfg(unix)]
    return Ok(std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(s.to_bytes())));
    #[cfg(not(unix))]
    return s.to_str().map(std::path::Path::new).map_err(|_| Error::invalid(arg, "is not valid UTF-8"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_internal_errors() {
        let s: Status = boundary(|| panic!("boom"));
        assert_eq!(s, Status::STRATA_INTERNAL);
        // SAFETY: last_error returns a valid NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(last_error()) }.to_str().unwrap();
        assert!(msg.contains("boom"), "{msg}");
        let v: i64 = boundary(|| panic!("boom"));
        assert_eq!(v, -1);
    }

    #[test]
    fn errors_become_their_status_and_message() {
        let s: Status = boundary(|| Err(Error::Null { arg: "table" }));
        assert_eq!(s, Status::STRATA_NULL_ARGUMENT);
        // SAFETY: last_error returns a valid NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(last_error()) }.to_str().unwrap();
        assert_eq!(msg, "table: is NULL; expected a valid pointer");
    }
}
