//! Limits shared by every layer, with no dependencies of their own.

/// Largest `dim` (elements per row) a table may have: far above any embedding, and small
/// enough that a row's byte size never overflows. Exported to C as `STRATA_MAX_DIM`
/// (`table.rs`, which asserts the two are equal).
pub(crate) const MAX_DIM: usize = 1 << 24;
