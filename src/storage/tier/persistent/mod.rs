//! The persistent tier: an embedded LMDB store on local disk (through `heed`), the successor of
//! HPS's RocksDB persistent database.
//!
//! A [`PersistentStore`] is one LMDB environment (a folder); a [`PersistentTable`] is one named
//! table in it, holding a row of `dim` values per 64-bit key, stored as float32 or in the format
//! the table was created with (converted or quantized, e.g. FBGEMM's fused int8 rows). A table is created from a HugeCTR
//! sparse folder on its first open and reused afterwards; updates ([`PersistentTable::upsert`],
//! [`PersistentTable::erase`]) are durable when they return.
//!
//! # Layout of this module
//! - this file: [`PersistentStore`], opening tables (reuse, create or bulk-load);
//! - `registry`: one LMDB environment per folder per process, opened and shared;
//! - `format`: the on-disk format, as typed heed codecs;
//! - `load`: the bulk loader from a HugeCTR sparse folder;
//! - `table`: [`PersistentTable`]'s reads and writes.
//!
//! # On-disk layout
//! The store folder holds LMDB's two files, `data.mdb` (the B-trees) and `lock.mdb` (the reader
//! table and the writer mutex). Inside `data.mdb` (`format` has the codecs):
//! - the named database `strata.meta` maps
//!   - the key `"\0format"` to `"strata-persistent-1"` (the layout version), and
//!   - each table name (UTF-8, e.g. `wdl/table0`) to a record: 16 bytes
//!     `[layout u32 LE = 1][state u32 LE: 0 = loading, 1 = complete][dim u64 LE]` for a float32
//!     table (every table of a store written before row formats, so such stores read as they
//!     are), 24 bytes `[layout = 2][state][dim][row format u32 LE][0 u32]` for another format
//!     (`format.rs` lists the numbers), and
//!   - `"\0commits/<name>"` to the table's commit counter (`u64` LE, absent = 0), which every
//!     upsert and every erase that removed a row increments in its own transaction (how another
//!     process sharing the store notices a change: see [`PersistentTable::commits`]);
//! - each table is the named database `t/<name>`: key = the canonical 64-bit key (the bit pattern
//!   of HugeCTR's int64) as 8 **big-endian** bytes, so LMDB's byte order is numeric `u64` order;
//!   value = the row in the table's format: `dim` little-endian float32 (`dim * 4` bytes) for a
//!   float32 table, else `RowFormat::row_bytes(dim)` bytes of that format (checked on every read).
//!
//! # Durability
//! The environment is opened without `MDB_NOSYNC`, `MDB_NOMETASYNC`, `MDB_WRITEMAP` and
//! `MDB_MAPASYNC` (only `MDB_NORDAHEAD`, plus `MDB_NOTLS` and, when asked, `MDB_RDONLY`). So every
//! commit writes the transaction's new (copy-on-write) pages to `data.mdb`, `fdatasync`s them,
//! then writes the meta page that makes them current through an `O_DSYNC` descriptor, and only
//! then returns. An update that returned `Ok` is therefore on stable storage: a SIGKILL (or a
//! power cut) right after loses nothing, and a kill during a commit leaves the previous meta page
//! pointing at the previous, untouched pages: a transaction is all there or not there at all.
//!
//! # Threading
//! Every type here is `Send + Sync`. Reads run in LMDB read transactions (`MDB_NOTLS`, so a thread
//! may hold several at once), which never block and are never blocked by a writer; writes
//! serialise on LMDB's single-writer lock, which also excludes writers in other processes that
//! share the folder. Do not put a store on a network file system.

mod format;
mod load;
mod registry;
mod table;
#[cfg(test)]
mod tests;

pub use table::{Commit, PersistentStats, PersistentTable};

use crate::error::{Error, Result};
use crate::kernels::RowFormat;
use crate::storage::hugectr::SparseFolder;
use format::{Catalog, Rows, TABLE_PREFIX, TableRecord};
use load::LoadParams;
use registry::{StoreInner, lock};
use std::path::Path;
use std::sync::{Arc, Weak};
use table::TableInner;

/// Tables handed out, by store folder and name, so one table has one set of counters and one
/// handle (a table holds its store's environment, so an entry whose table is gone is never
/// taken for a later store on the same folder). Serialises table opens (LMDB wants database
/// handles opened one transaction at a time).
static OPEN_TABLES: std::sync::Mutex<std::collections::BTreeMap<(std::path::PathBuf, String), Weak<TableInner>>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Longest table name in bytes (LMDB keys, database names included, are at most 511 bytes).
pub(crate) const MAX_TABLE_NAME: usize = 400;

/// A persistent store: one LMDB environment in a folder on local disk.
///
/// Cheap to clone (a shared handle); `Send + Sync`. The environment closes when the last store
/// and table handle on it is dropped. Opening the same folder again in the same process while it
/// is open shares the environment. Other processes may open the folder at the same time (LMDB
/// locks across processes); only one process should bulk-load a given table at a time.
#[derive(Clone)]
pub struct PersistentStore {
    inner: Arc<StoreInner>,
    /// Whether this handle was opened read-only (it may share a read-write environment).
    read_only: bool,
}

impl std::fmt::Debug for PersistentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentStore").field("dir", &self.inner.dir).field("read_only", &self.read_only).finish()
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("name", "is empty; expected a table name such as \"model/table0\""));
    }
    if name.contains('\0') {
        return Err(Error::invalid("name", format!("{name:?} contains a NUL character")));
    }
    if name.len() > MAX_TABLE_NAME {
        return Err(Error::invalid("name", format!("is {} bytes long; expected at most {MAX_TABLE_NAME}", name.len())));
    }
    Ok(())
}

fn dim_mismatch(name: &str, dir: &str, stored: u64, asked: usize) -> Error {
    Error::Store { what: name.to_owned(), msg: format!("has dim {stored} in the persistent store at {dir}, but dim {asked} was asked for") }
}

fn interrupted(name: &str, dir: &str, how: &str) -> Error {
    Error::Store {
        what: name.to_owned(),
        msg: format!(
            "its first load from a sparse folder into the persistent store at {dir} was interrupted (the \
             process stopped before it completed); {how}"
        ),
    }
}

impl PersistentStore {
    /// Opens the store in folder `dir`, creating the folder and an empty store if missing (unless
    /// `read_only`). The environment maps up to 1 TiB lazily and is opened with synchronous
    /// commits (see the module docs). With `read_only`, the store must exist, the environment is
    /// opened `MDB_RDONLY` and every write through it fails with [`Error::Store`].
    ///
    /// Opening a folder already open in this process shares its environment; asking for
    /// read-write access to a folder open read-only in this process is an error (close it first).
    pub fn open(dir: &Path, read_only: bool) -> Result<Self> {
        Ok(PersistentStore { inner: registry::open(dir, read_only)?, read_only })
    }

    /// The store's folder (canonical).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Whether this handle refuses writes.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Opens table `name` (e.g. `"wdl/table0"`, at most `MAX_TABLE_NAME` (400) bytes, no NUL) with
    /// rows of `dim` float32.
    ///
    /// - If the table exists (a completed earlier load or creation), checks `dim` against the
    ///   recorded one ([`Error::Store`] naming the table and both dims on a mismatch) and reuses
    ///   it; `init` is not read.
    /// - Else, with `init = Some(folder)`, bulk-loads the HugeCTR sparse folder (`key`: int64 LE
    ///   per row; `emb_vector`: float32 rows x `dim`), checked exactly as [`crate::Table::open`]
    ///   checks it and with the same messages. Rows are sorted by key and written in large
    ///   durable transactions; the first records the table as "loading", the last as
    ///   "complete", so a load cut short by a crash is noticed and redone by the next open. A
    ///   load that fails (e.g. on a duplicate key) leaves no table behind.
    /// - Else (`init = None`) creates an empty table, unless an interrupted load is recorded
    ///   (an error: give the folder again to redo it).
    ///
    /// A read-only store only opens complete tables. Opens are serialised per store; a bulk
    /// load holds LMDB's write lock per transaction, so other tables' readers keep running.
    pub fn table(&self, name: &str, dim: usize, init: Option<&Path>) -> Result<PersistentTable> {
        self.table_with(name, dim, init, LoadParams::default())
    }

    /// [`table`](Self::table), creating (or loading) a new table with rows stored as `format`
    /// (a sparse folder's rows converted or quantized as they are loaded; one the format cannot
    /// hold fails the load, naming its row). An existing table keeps the format it was created
    /// with ([`PersistentTable::format`]): a store written before row formats holds float32.
    pub fn table_stored_as(&self, name: &str, dim: usize, format: RowFormat, init: Option<&Path>) -> Result<PersistentTable> {
        if let Some(m) = format.check_dim(dim) {
            return Err(Error::invalid("dim", m));
        }
        self.table_with(name, dim, init, LoadParams { format, ..LoadParams::default() })
    }

    fn table_with(&self, name: &str, dim: usize, init: Option<&Path>, params: LoadParams) -> Result<PersistentTable> {
        check_name(name)?;
        crate::storage::hugectr::check_dim(dim)?;
        let s = &self.inner;
        let mut tables = lock(&OPEN_TABLES);
        let key = (s.dir.clone(), name.to_owned());
        if let Some(t) = tables.get(&key).and_then(Weak::upgrade) {
            if t.dim != dim {
                return Err(dim_mismatch(name, &s.folder(), t.dim as u64, dim));
            }
            return Ok(PersistentTable { inner: t, read_only: self.read_only });
        }
        let db_name = format!("{TABLE_PREFIX}{name}");
        let (db, format) = if self.read_only || s.env_read_only {
            self.open_existing(name, &db_name, dim)?
        } else {
            self.open_or_load(name, &db_name, dim, init, params)?
        };
        let inner = Arc::new(TableInner::new(s.clone(), name, db, dim, format));
        tables.retain(|_, w| w.strong_count() > 0);
        tables.insert(key, Arc::downgrade(&inner));
        Ok(PersistentTable { inner, read_only: self.read_only })
    }

    /// Table `name`'s catalog record, if any.
    fn read_record(&self, txn: &heed::RoTxn, name: &str) -> Result<Option<TableRecord>> {
        let s = &self.inner;
        let Some(catalog) = s.catalog else { return Ok(None) };
        catalog.record(txn, name).map_err(s.heed(name, "read metadata"))
    }

    /// Read-only path: the table must exist and be complete. Returns it and its format.
    fn open_existing(&self, name: &str, db_name: &str, dim: usize) -> Result<(Rows, RowFormat)> {
        let s = &self.inner;
        let rtxn = s.env.read_txn().map_err(s.heed(name, "begin read transaction"))?;
        match self.read_record(&rtxn, name)? {
            None => Err(Error::Store {
                what: name.to_owned(),
                msg: format!("is not in the persistent store at {}, which is open read-only, so the table cannot be created", s.folder()),
            }),
            Some(TableRecord { complete: false, .. }) => {
                Err(interrupted(name, &s.folder(), "open the store read-write with the sparse folder to redo it"))
            }
            Some(r) if r.dim != dim as u64 => Err(dim_mismatch(name, &s.folder(), r.dim, dim)),
            Some(r) => {
                let db: Rows = s.env.open_database(&rtxn, Some(db_name)).map_err(s.heed(name, "open table"))?.ok_or_else(|| {
                    Error::Store { what: name.to_owned(), msg: format!("has metadata but no database {db_name:?}: the store is corrupt") }
                })?;
                rtxn.commit().map_err(s.heed(name, "open table"))?;
                Ok((db, r.format))
            }
        }
    }

    /// Read-write path: reuse, create empty, or (re)load (new tables in `params.format`).
    /// Returns the table and its format.
    fn open_or_load(&self, name: &str, db_name: &str, dim: usize, init: Option<&Path>, params: LoadParams) -> Result<(Rows, RowFormat)> {
        let s = &self.inner;
        let catalog: Catalog = s.catalog.ok_or_else(|| Error::Internal("read-write store without metadata database".into()))?;
        // Check the sparse folder before taking the write lock, and only if a load may follow.
        let before = {
            let rtxn = s.env.read_txn().map_err(s.heed(name, "begin read transaction"))?;
            self.read_record(&rtxn, name)?
        };
        let sparse = match (before, init) {
            (Some(TableRecord { complete: true, .. }), _) | (_, None) => None,
            (_, Some(folder)) => Some(SparseFolder::open(folder, dim)?),
        };
        let mut wtxn = s.env.write_txn().map_err(s.heed(name, "begin write transaction"))?;
        // Decide again under the write lock: another process may have loaded it meanwhile.
        let now = self.read_record(&wtxn, name)?;
        let db: Rows = s.env.create_database(&mut wtxn, Some(db_name)).map_err(s.heed(name, "open table"))?;
        match (now, sparse) {
            (Some(r), _) if r.complete => {
                if r.dim != dim as u64 {
                    return Err(dim_mismatch(name, &s.folder(), r.dim, dim));
                }
                wtxn.commit().map_err(s.heed(name, "open table"))?;
                Ok((db, r.format))
            }
            (None, None) => {
                // A new, empty table (a leftover database of a failed load is emptied).
                db.clear(&mut wtxn).map_err(s.heed(name, "create table"))?;
                let record = TableRecord { complete: true, dim: dim as u64, format: params.format };
                catalog.put_record(&mut wtxn, name, record).map_err(s.heed(name, "create table"))?;
                wtxn.commit().map_err(s.heed(name, "create table"))?;
                Ok((db, params.format))
            }
            (Some(_), None) => Err(interrupted(name, &s.folder(), "give the sparse folder again to redo it")),
            (_, Some(sparse)) => {
                let mut commits = 0;
                match load::load(s, wtxn, db, catalog, name, dim, &sparse, params, &mut commits) {
                    Ok(()) => Ok((db, params.format)),
                    Err(e) => {
                        if commits > 0 && params.crash_after_commits.is_none() {
                            load::discard(s, db, catalog, name);
                        }
                        Err(e)
                    }
                }
            }
        }
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<PersistentStore>();
    send_sync::<PersistentTable>();
};
