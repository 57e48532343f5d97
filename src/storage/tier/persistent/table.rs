//! Reads and writes of one table: [`PersistentTable`]'s `get_many`, `upsert`, `erase`, `scan`
//! and `len`, each in one LMDB transaction.

use super::format::{LeRow, Rows};
use super::registry::StoreInner;
use crate::error::{Error, Result};
use crate::kernels::RowFormat;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One table of a [`PersistentStore`](super::PersistentStore): an LMDB database of rows of `dim`
/// values by 64-bit key, stored as the table's [`format`](Self::format) (float32, or converted
/// or quantized when the table was created so); rows go in and come out as float32.
///
/// Cheap to clone (a shared handle; clones share counters); `Send + Sync`: any number of threads
/// may read and write it at once. It keeps the store's environment open while it lives.
#[derive(Clone)]
pub struct PersistentTable {
    pub(super) inner: Arc<TableInner>,
    /// Whether writes are refused (the handle came from a read-only store).
    pub(super) read_only: bool,
}

impl std::fmt::Debug for PersistentTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentTable")
            .field("name", &self.inner.name)
            .field("dim", &self.inner.dim)
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// A table open in this process, shared by all its handles.
pub(super) struct TableInner {
    pub(super) store: Arc<StoreInner>,
    pub(super) name: String,
    pub(super) db: Rows,
    pub(super) dim: usize,
    pub(super) format: RowFormat,
    hits: AtomicU64,
    misses: AtomicU64,
    upserts: AtomicU64,
    erases: AtomicU64,
}

impl TableInner {
    pub(super) fn new(store: Arc<StoreInner>, name: &str, db: Rows, dim: usize, format: RowFormat) -> Self {
        TableInner {
            store,
            name: name.to_owned(),
            db,
            dim,
            format,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            upserts: AtomicU64::new(0),
            erases: AtomicU64::new(0),
        }
    }
}

/// A table's commit counter as one write transaction found it (`before`) and left it (`after`,
/// `before + 1` when the transaction changed the table). A `before` other than the value a
/// process last saw means another process committed a write in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// The counter when the write transaction began (under LMDB's writer lock).
    pub before: u64,
    /// The counter the transaction committed.
    pub after: u64,
}

/// Cumulative counters of one table in this process (all handles of the table share them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PersistentStats {
    /// Keys found by [`PersistentTable::get_many`].
    pub hits: u64,
    /// Keys not found by [`PersistentTable::get_many`].
    pub misses: u64,
    /// Rows currently in the table (all processes' committed writes), 0 if it cannot be read.
    pub rows: u64,
    /// Rows written by [`PersistentTable::upsert`] (a key given twice in one call counts twice).
    pub upserts: u64,
    /// Rows removed by [`PersistentTable::erase`] (keys that were present).
    pub erases: u64,
}

impl PersistentTable {
    /// The table's name in its store.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.inner.dim
    }

    /// How the table stores its rows (recorded when it was created: a table of a store written
    /// before formats existed is float32).
    pub fn format(&self) -> RowFormat {
        self.inner.format
    }

    /// Whether writes through this handle are refused.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn err(&self, op: &str) -> impl Fn(heed::Error) -> Error + '_ {
        self.inner.store.heed(&self.inner.name, op)
    }

    /// Rows in the table: every committed write of every process (one read transaction; O(1)).
    pub fn len(&self) -> Result<u64> {
        let t = &self.inner;
        let rtxn = t.store.env.read_txn().map_err(self.err("begin read transaction"))?;
        t.db.len(&rtxn).map_err(self.err("count rows"))
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> Result<bool> {
        self.len().map(|n| n == 0)
    }

    fn check_batch(&self, keys: usize, values: usize, arg: &'static str) -> Result<()> {
        let dim = self.inner.dim;
        match keys.checked_mul(dim) {
            Some(n) if n == values => Ok(()),
            _ => Err(Error::invalid(
                arg,
                format!("{values} values; expected {keys} keys x dim {dim} = {} values", keys as u128 * dim as u128),
            )),
        }
    }

    /// Decodes the stored row of `key` into `out`; a row of the wrong length is
    /// [`Error::Store`] "corrupt row".
    fn decode(&self, key: u64, row: LeRow, out: &mut [f32]) -> Result<()> {
        row.decode_into(key, self.inner.format, out).map_err(|c| Error::Store { what: self.inner.name.clone(), msg: c.0 })
    }

    /// The stored bytes of the row of `key` (`format().row_bytes(dim)`); a row of the wrong
    /// length is [`Error::Store`] "corrupt row".
    fn stored<'a>(&self, key: u64, row: LeRow<'a>) -> Result<&'a [u8]> {
        row.bytes(key, self.inner.format, self.inner.dim).map_err(|c| Error::Store { what: self.inner.name.clone(), msg: c.0 })
    }

    /// For each `keys[i]` that is present, copies its row into `out[i*dim..(i+1)*dim]` and sets
    /// `found[i] = true`; for a missing key sets `found[i] = false` and leaves its `out` row as
    /// it was. `out` must hold `keys.len() * dim` values and `found` `keys.len()` flags.
    ///
    /// The whole batch reads one consistent snapshot (one read transaction): it sees every
    /// update committed before it began and none that commits during it, so every row is whole.
    /// Never blocks on writers; safe from any number of threads. Returns `(hits, misses)` and adds
    /// them to the table's [`stats`](Self::stats). A stored row of the wrong length is
    /// [`Error::Store`] "corrupt row".
    pub fn get_many(&self, keys: &[u64], out: &mut [f32], found: &mut [bool]) -> Result<(u64, u64)> {
        self.get_many_stored(keys, out, None, found)
    }

    /// [`get_many`](Self::get_many), also copying each found row's stored bytes into `stored`
    /// when given (`keys.len() * format().row_bytes(dim)` bytes, row `i` at `i * row_bytes`):
    /// what a tier of the same format keeps, exactly.
    pub fn get_many_stored(&self, keys: &[u64], out: &mut [f32], mut stored: Option<&mut [u8]>, found: &mut [bool]) -> Result<(u64, u64)> {
        self.check_batch(keys.len(), out.len(), "out")?;
        let row_bytes = self.inner.format.row_bytes(self.inner.dim);
        if let Some(s) = &stored
            && s.len() != keys.len() * row_bytes
        {
            return Err(Error::invalid("stored", format!("{} bytes; expected {} keys x {row_bytes}", s.len(), keys.len())));
        }
        if found.len() != keys.len() {
            return Err(Error::invalid("found", format!("{} flags; expected one per key ({})", found.len(), keys.len())));
        }
        if keys.is_empty() {
            return Ok((0, 0));
        }
        let t = &self.inner;
        let dim = t.dim;
        let rtxn = t.store.env.read_txn().map_err(self.err("begin read transaction"))?;
        let (mut hits, mut misses) = (0u64, 0u64);
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by_key(|&i| keys[i]);
        for i in order {
            let k = keys[i];
            match t.db.get(&rtxn, &k).map_err(self.err("read row"))? {
                Some(row) => {
                    self.decode(k, row, &mut out[i * dim..(i + 1) * dim])?;
                    if let Some(s) = stored.as_deref_mut() {
                        s[i * row_bytes..(i + 1) * row_bytes].copy_from_slice(self.stored(k, row)?);
                    }
                    found[i] = true;
                    hits += 1;
                }
                None => {
                    found[i] = false;
                    misses += 1;
                }
            }
        }
        drop(rtxn);
        t.hits.fetch_add(hits, Relaxed);
        t.misses.fetch_add(misses, Relaxed);
        Ok((hits, misses))
    }

    fn check_writable(&self, op: &str) -> Result<()> {
        if self.read_only {
            return Err(Error::Store {
                what: self.inner.name.clone(),
                msg: format!(
                    "is read-only (the persistent store at {} was opened with read_only = true); {op} refused",
                    self.inner.store.folder()
                ),
            });
        }
        Ok(())
    }

    /// Inserts or overwrites the rows of `keys` (`rows` holds `keys.len() * dim` values, row `i`
    /// at `rows[i*dim..]`), stored as the table's format; a key given twice keeps its last row.
    /// A row the format cannot hold (NaN or infinite values of a quantized table) fails the
    /// call, naming it, before anything is written.
    ///
    /// One write transaction, committed durably (data `fdatasync`ed, then the meta page written
    /// synchronously) before `Ok` is returned: a process killed right after loses nothing, and a
    /// process killed during the call leaves all of the batch or none of it. Concurrent readers
    /// see each row old or new, never mixed. Writers (threads and processes) take turns.
    pub fn upsert(&self, keys: &[u64], rows: &[f32]) -> Result<()> {
        self.upsert_counted(keys, rows).map(|_| ())
    }

    /// [`upsert`](Self::upsert), also returning the table's commit counter as this write
    /// transaction found and left it (`None` for an empty batch, which writes nothing).
    pub fn upsert_counted(&self, keys: &[u64], rows: &[f32]) -> Result<Option<Commit>> {
        self.check_writable("upsert")?;
        self.check_batch(keys.len(), rows.len(), "rows")?;
        if keys.is_empty() {
            return Ok(None);
        }
        let t = &self.inner;
        let dim = t.dim;
        // Write in key order (B-tree locality); the sort is stable, so duplicates keep their order.
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i]);
        let row_bytes = t.format.row_bytes(dim);
        let mut encoded = vec![0u8; keys.len() * row_bytes];
        let mut buf = Vec::with_capacity(row_bytes);
        for (i, bytes) in encoded.chunks_exact_mut(row_bytes).enumerate() {
            let row = LeRow::encode(t.format, &rows[i * dim..(i + 1) * dim], &mut buf)
                .map_err(|m| Error::invalid("rows", format!("row {i}: {m} (table {} stores {} rows)", t.name, t.format.name())))?;
            bytes.copy_from_slice(row.bytes(keys[i], t.format, dim).map_err(|c| Error::Internal(c.0))?);
        }
        let mut wtxn = t.store.env.write_txn().map_err(self.err("upsert: begin write transaction"))?;
        for i in order {
            let row = LeRow::from_le_bytes(&encoded[i * row_bytes..(i + 1) * row_bytes]);
            t.db.put(&mut wtxn, &keys[i], &row).map_err(self.err("upsert"))?;
        }
        let commit = self.count_commit(&mut wtxn, true, "upsert")?;
        wtxn.commit().map_err(self.err("upsert: commit"))?;
        t.upserts.fetch_add(keys.len() as u64, Relaxed);
        Ok(Some(commit))
    }

    /// Removes the rows of `keys` (missing keys are ignored); returns how many rows were removed.
    /// One write transaction, committed durably before returning, like [`upsert`](Self::upsert).
    pub fn erase(&self, keys: &[u64]) -> Result<u64> {
        self.erase_counted(keys).map(|(n, _)| n)
    }

    /// [`erase`](Self::erase), also returning the table's commit counter as this write
    /// transaction found and left it (it moves only when a row was removed; `None` for an
    /// empty batch).
    pub fn erase_counted(&self, keys: &[u64]) -> Result<(u64, Option<Commit>)> {
        self.check_writable("erase")?;
        if keys.is_empty() {
            return Ok((0, None));
        }
        let t = &self.inner;
        let mut sorted = keys.to_vec();
        sorted.sort_unstable();
        let mut wtxn = t.store.env.write_txn().map_err(self.err("erase: begin write transaction"))?;
        let mut erased = 0u64;
        for k in sorted {
            if t.db.delete(&mut wtxn, &k).map_err(self.err("erase"))? {
                erased += 1;
            }
        }
        let commit = self.count_commit(&mut wtxn, erased > 0, "erase")?;
        wtxn.commit().map_err(self.err("erase: commit"))?;
        t.erases.fetch_add(erased, Relaxed);
        Ok((erased, Some(commit)))
    }

    /// Reads the table's commit counter inside write transaction `wtxn` and, when `changed`,
    /// adds 1 to it there (so it commits, or not, with the rows).
    fn count_commit(&self, wtxn: &mut heed::RwTxn, changed: bool, op: &str) -> Result<Commit> {
        let t = &self.inner;
        let catalog = t.store.catalog.ok_or_else(|| Error::Internal("read-write store without metadata database".into()))?;
        let before = catalog.commits(wtxn, &t.name).map_err(self.err(op))?;
        let after = if changed { before.wrapping_add(1) } else { before };
        if changed {
            catalog.put_commits(wtxn, &t.name, after).map_err(self.err(op))?;
        }
        Ok(Commit { before, after })
    }

    /// The table's commit counter now: how many upserts, and erases that removed a row, any
    /// process has committed to it (one read transaction and one metadata read; cheap). 0 for
    /// a table never written since this counter was introduced.
    pub fn commits(&self) -> Result<u64> {
        let t = &self.inner;
        let Some(catalog) = t.store.catalog else { return Ok(0) };
        let rtxn = t.store.env.read_txn().map_err(self.err("begin read transaction"))?;
        catalog.commits(&rtxn, &t.name).map_err(self.err("read commit counter"))
    }

    /// The table's counters in this process, and its current row count.
    pub fn stats(&self) -> PersistentStats {
        let t = &self.inner;
        PersistentStats {
            hits: t.hits.load(Relaxed),
            misses: t.misses.load(Relaxed),
            rows: self.len().unwrap_or(0),
            upserts: t.upserts.load(Relaxed),
            erases: t.erases.load(Relaxed),
        }
    }

    /// Calls `f(key, row)` for the first `limit` rows in numeric key order (`usize::MAX` for
    /// all), from one consistent snapshot. For tests and for warming a volatile tier. `f` may read
    /// the table; a long scan keeps the pages of its snapshot from being reused meanwhile. A
    /// stored key that is not 8 bytes is [`Error::Store`] "corrupt key".
    pub fn scan(&self, limit: usize, mut f: impl FnMut(u64, &[f32])) -> Result<()> {
        let mut row = vec![0f32; self.inner.dim];
        self.scan_stored(limit, |key, stored| {
            self.decode(key, LeRow::from_le_bytes(stored), &mut row)?;
            f(key, &row);
            Ok(())
        })
    }

    /// [`scan`](Self::scan) of the rows' stored bytes (`format().row_bytes(dim)` each, length
    /// checked); an error of `f` ends the scan with it.
    pub fn scan_stored(&self, limit: usize, mut f: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let t = &self.inner;
        let rtxn = t.store.env.read_txn().map_err(self.err("begin read transaction"))?;
        for item in t.db.iter(&rtxn).map_err(self.err("scan"))?.take(limit) {
            let (key, stored) = item.map_err(self.err("scan"))?;
            f(key, self.stored(key, stored)?)?;
        }
        Ok(())
    }
}
