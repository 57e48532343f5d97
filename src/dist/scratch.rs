//! The buffers a distributed table's lookups reuse from call to call.

use super::buf::Buf;

/// Buffers a distributed table's lookups reuse from call to call (kept beside its communicator;
/// after a call about `keys * (2 * row_bytes + 40)` bytes, `row_bytes` the size of a row on
/// the wire, most of it the two row buffers).
/// Nothing is zeroed between calls: each step writes what the next reads.
#[derive(Default)]
pub(crate) struct Scratch {
    /// This rank's keys (canonical), in the caller's order; their owners (`NOWHERE`: none);
    /// where each one's row will be: a slot of `back`, `LOCAL` or `NOWHERE`.
    pub(super) keys: Vec<u64>,
    pub(super) dest: Vec<u32>,
    pub(super) pos: Vec<u32>,
    /// Keys for other ranks in owner order, and the keys other ranks asked this rank for
    /// (turned into local row numbers in place for a dense partition).
    pub(super) send: Vec<u64>,
    pub(super) asked: Vec<u64>,
    /// Rows this rank serves, and rows it gets back, as they travel (bytes: float32 rows of a
    /// float table, a quantized table's own rows), with found flags (keyed tables).
    pub(super) rows: Buf<u8>,
    pub(super) back: Buf<u8>,
    pub(super) found: Vec<u8>,
    pub(super) back_found: Vec<u8>,
}
