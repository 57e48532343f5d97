//! The `strata_table` handle: what it holds and who owns it, declared once.

use super::boundary::arg_ref;
use crate::error::Result;
use crate::table::Table;
use std::ptr::NonNull;

/// The table behind a `strata_table*` handle: a static table, a tiered table of a parameter
/// server, or a table spread over MPI ranks. Many threads may look it up at once.
///
/// Ownership is declared here, once: a handle either owns its table (the constructors below;
/// `strata_table_free` drops it) or borrows it from a server (`strata_server_table`; the
/// server frees it, and `strata_table_free` is a no-op).
pub struct strata_table(Held);

#[allow(clippy::large_enum_variant)] // each handle is one heap allocation already; boxing Owned would add an indirection per lookup
enum Held {
    Owned(Table),
    /// A table of a `strata_server`, which outlives this handle (it holds the handle).
    Server(NonNull<Table>),
}

impl strata_table {
    /// A new handle that owns `table`, for the caller to free with `strata_table_free`.
    pub(crate) fn into_owned_raw(table: Table) -> *mut strata_table {
        Box::into_raw(Box::new(strata_table(Held::Owned(table))))
    }

    /// A handle to a server's table; the server keeps it and frees `table` after it.
    pub(crate) fn borrowed_from_server(table: &Table) -> strata_table {
        strata_table(Held::Server(NonNull::from(table)))
    }

    /// Frees a handle the caller will not use again: an owned handle drops its table; a server's
    /// handle is left to the server (a no-op). NULL is a no-op.
    ///
    /// # Safety
    /// `p` is NULL or a live handle from strata, not used after this call.
    pub(crate) unsafe fn free(p: *mut strata_table) {
        // SAFETY: `p` is NULL or a live handle, as the caller guarantees.
        if let Some(t) = unsafe { p.as_ref() }
            && matches!(t.0, Held::Owned(_))
        {
            // SAFETY: owned handles are made by Box::into_raw in into_owned_raw, and the caller
            // does not use this one again.
            drop(unsafe { Box::from_raw(p) });
        }
    }

    /// The table, for Rust code holding a handle (benchmarks, tests).
    pub fn table(&self) -> &Table {
        self.get()
    }

    /// The table.
    pub(crate) fn get(&self) -> &Table {
        match &self.0 {
            Held::Owned(t) => t,
            // SAFETY: a server handle is held by its server, which keeps the table alive.
            Held::Server(t) => unsafe { t.as_ref() },
        }
    }
}

/// Borrows the table of a required handle argument.
///
/// # Safety
/// `p` must be NULL or a live handle.
pub(crate) unsafe fn table_arg<'a>(p: *const strata_table, arg: &'static str) -> Result<&'a Table> {
    // SAFETY: forwarded.
    Ok(unsafe { arg_ref(p, arg) }?.get())
}
