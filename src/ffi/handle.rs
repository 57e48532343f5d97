//! The opaque handles of the header: what each is in Rust and who owns it, declared once.
//!
//! A handle type is an empty Rust struct that C sees only as `struct name *`; a pointer to it
//! is a pointer to the Rust value behind it ([`Castable::Rust`]). How the caller holds it is its
//! [`Castable::Ownership`]: [`Boxed`] (made by `Box::into_raw`, freed once by its `*_free`), the
//! only kind so far; a value owned elsewhere is [`lent`]. The functions below are the only code
//! that turns a handle into a value or back, so a constructor, its `*_free` and every export
//! taking the handle cannot disagree.

use super::boundary::arg_ref;
use crate::error::Result;
use crate::server::Server;
use crate::table::Table;
use std::sync::Arc;

/// The handle is a `Box<Castable::Rust>` of the caller's.
pub(crate) struct Boxed;

/// An opaque C handle type and the Rust value behind it.
///
/// # Safety
/// Implementors are never constructed: every pointer to one is a pointer to a `Rust` value,
/// made by the functions of this module.
pub(crate) unsafe trait Castable {
    /// The value behind the handle.
    type Rust;
    /// [`Boxed`].
    type Ownership;
}

/// The table behind a `strata_table*` handle: a static table, a tiered table of a parameter
/// server, or a table spread over MPI ranks. Many threads may look it up at once.
///
/// Ownership is declared here, once: a handle either owns its table (the constructors below;
/// `strata_table_free` drops it) or borrows it from a server (`strata_server_table`; the
/// server frees it, and `strata_table_free` is a no-op).
// In Rust: a Table, Boxed; a server's tables are `lent` (see free_table).
pub struct strata_table {
    _opaque: [u8; 0],
}

// SAFETY: strata_table has a private field and no constructor; its pointers come from this module.
unsafe impl Castable for strata_table {
    type Rust = Table;
    type Ownership = Boxed;
}

/// A handle to the parameter server of a configuration. Every handle opened on the same
/// configuration in one process shares one server and one set of `strata_table` handles for its
/// tables (see `strata_server_open`).
///
/// Ownership: each handle is counted; `strata_server_free` drops one, and the server closes
/// with the last. Threading: any thread may use or free a handle; lookups and updates on the
/// tables may run at once from many threads.
// In Rust: a Boxed Arc<Server>, one count each (each open returns its own handle); the server's
// tables are lent by pointer, so every handle of one server gives the same strata_table pointers.
pub struct strata_server {
    _opaque: [u8; 0],
}

// SAFETY: strata_server has a private field and no constructor; its pointers come from this module.
unsafe impl Castable for strata_server {
    type Rust = Arc<Server>;
    type Ownership = Boxed;
}

impl strata_table {
    /// The table, for Rust code holding a handle (benchmarks, tests).
    pub fn table(&self) -> &Table {
        // SAFETY: every strata_table reference points to a Table (Castable's contract).
        unsafe { &*(self as *const strata_table).cast::<Table>() }
    }
}

/// A new [`Boxed`] handle owning `v`, for the caller to free once.
pub(crate) fn boxed<H: Castable<Ownership = Boxed>>(v: H::Rust) -> *mut H {
    Box::into_raw(Box::new(v)).cast()
}

/// Drops a [`Boxed`] handle's value; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or a handle made by [`boxed`], not used after this call.
pub(crate) unsafe fn free_boxed<H: Castable<Ownership = Boxed>>(p: *mut H) {
    if !p.is_null() {
        // SAFETY: made by Box::into_raw in `boxed`, and the caller gives it up.
        drop(unsafe { Box::from_raw(p.cast::<H::Rust>()) });
    }
}

/// A handle to `v`, owned elsewhere (a server's table), valid while its owner keeps it.
pub(crate) fn lent<H: Castable>(v: &H::Rust) -> *mut H {
    (v as *const H::Rust).cast_mut().cast()
}

/// Borrows the value behind a required handle argument, or fails with `STRATA_NULL_ARGUMENT`
/// naming `arg`.
///
/// # Safety
/// `p` is NULL or a live handle.
pub(crate) unsafe fn handle_arg<'a, H: Castable>(p: *const H, arg: &'static str) -> Result<&'a H::Rust> {
    // SAFETY: a live handle points to its Rust value (Castable's contract); NULL is refused.
    unsafe { arg_ref(p.cast::<H::Rust>(), arg) }
}

/// Frees a table handle: an owned table is dropped; a table a server lends (`strata_server_table`)
/// is left to its server, a no-op, as is NULL.
///
/// # Safety
/// `p` is NULL or a live handle, not used after this call.
pub(crate) unsafe fn free_table(p: *mut strata_table) {
    // SAFETY: NULL or a live handle, as the caller guarantees.
    if let Ok(t) = unsafe { handle_arg(p, "table") }
        && !crate::server::lends(t)
    {
        // SAFETY: a table no server lends was made by `boxed`; the caller gives it up.
        unsafe { free_boxed(p) };
    }
}

/// Borrows the table of a required handle argument.
///
/// # Safety
/// `p` must be NULL or a live handle.
pub(crate) unsafe fn table_arg<'a>(p: *const strata_table, arg: &'static str) -> Result<&'a Table> {
    // SAFETY: forwarded.
    unsafe { handle_arg(p, arg) }
}
