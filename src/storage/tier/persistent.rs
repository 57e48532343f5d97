//! The persistent tier: an embedded LMDB store on local disk (through `heed`), the successor of
//! HPS's RocksDB persistent database.
//!
//! A [`PersistentStore`] is one LMDB environment (a folder); a [`PersistentTable`] is one named
//! table in it, holding `dim` float32 values per 64-bit key. A table is created from a HugeCTR
//! sparse folder on its first open and reused afterwards; updates ([`PersistentTable::upsert`],
//! [`PersistentTable::erase`]) are durable when they return.
//!
//! # On-disk layout
//! The store folder holds LMDB's two files, `data.mdb` (the B-trees) and `lock.mdb` (the reader
//! table and the writer mutex). Inside `data.mdb`:
//! - the named database `strata.meta` maps
//!   - the key `"\0format"` to `"strata-persistent-1"` (the layout version), and
//!   - each table name (UTF-8, e.g. `wdl/table0`) to a 16-byte record
//!     `[layout u32 LE = 1][state u32 LE: 0 = loading, 1 = complete][dim u64 LE]`;
//! - each table is the named database `t/<name>`: key = the canonical 64-bit key (the bit pattern
//!   of HugeCTR's int64) as 8 **big-endian** bytes, so LMDB's byte order is numeric `u64` order;
//!   value = the row as `dim` little-endian float32 (`dim * 4` bytes, checked on every read).
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

use crate::error::{Error, Result};
use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, MdbError, PutFlags, RwTxn, WithoutTls};
use std::collections::HashMap;
use crate::storage::hugectr::SparseFolder;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Virtual size of the memory map: 1 TiB, the most a store can hold. LMDB maps lazily and the
/// data file only grows as data is written, so this costs address space, not memory or disk.
/// Where the process may not reserve that much (a `ulimit -v`, valgrind), `open` retries with
/// a quarter of the size each time, down to 1 GiB.
#[cfg(target_pointer_width = "64")]
const MAP_SIZE: usize = 1 << 40;
#[cfg(not(target_pointer_width = "64"))]
const MAP_SIZE: usize = 1 << 30;

/// Most tables one store may hold (LMDB sizes per-transaction arrays by this, so it stays modest).
pub(crate) const MAX_TABLES: u32 = 255;
/// Reader slots: concurrent read transactions across all processes sharing the store.
const MAX_READERS: u32 = 1024;
/// Longest table name in bytes (LMDB keys, database names included, are at most 511 bytes).
pub(crate) const MAX_TABLE_NAME: usize = 400;

const META_DB: &str = "strata.meta";
const TABLE_PREFIX: &str = "t/";
const FORMAT_KEY: &[u8] = b"\0format";
const FORMAT: &[u8] = b"strata-persistent-1";
const META_LAYOUT: u32 = 1;
const STATE_LOADING: u32 = 0;
const STATE_COMPLETE: u32 = 1;

/// How a first open loads a sparse folder. Only tests use anything but the default.
#[derive(Debug, Clone, Copy)]
struct LoadParams {
    /// Commit (durably) after about this many bytes of keys and rows.
    txn_bytes: usize,
    /// Keys sorted at once: the first run is appended in key order (`MDB_APPEND`, packed pages),
    /// later runs are inserted. Bounds the sort buffer to 16 bytes per key of a run.
    run_keys: usize,
    /// Test hook: stop right after this many commits, as a crash would, with no clean-up.
    crash_after_commits: Option<usize>,
}

impl Default for LoadParams {
    fn default() -> Self {
        LoadParams { txn_bytes: 128 << 20, run_keys: 1 << 24, crash_after_commits: None }
    }
}

/// Environments open in this process, by canonical folder. LMDB must not open one environment
/// twice in a process (closing one copy would drop the other's locks), so a second
/// [`PersistentStore::open`] of a folder shares the first one's environment.
static OPEN_STORES: Mutex<Vec<(PathBuf, Weak<StoreInner>)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct StoreInner {
    env: Env<WithoutTls>,
    /// Canonical folder.
    dir: PathBuf,
    /// Whether the environment itself is `MDB_RDONLY`.
    env_read_only: bool,
    /// `strata.meta`; `None` only in a read-only environment no strata process ever wrote.
    meta: Option<Database<Bytes, Bytes>>,
    /// Tables handed out, by name, so one table has one set of counters and one handle.
    /// Serialises table opens (LMDB wants database handles opened one transaction at a time).
    tables: Mutex<HashMap<String, Weak<TableInner>>>,
}

impl StoreInner {
    fn heed(&self, what: &str, op: &str) -> impl Fn(heed::Error) -> Error + '_ {
        let what = what.to_owned();
        let op = op.to_owned();
        move |e| heed_error(e, &what, &op, &self.dir)
    }

    fn folder(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Maps a heed error: I/O errors (including LMDB's errno codes) to [`Error::Io`] on the store
/// folder, everything else to [`Error::Store`] naming `what` and the operation.
fn heed_error(e: heed::Error, what: &str, op: &str, dir: &Path) -> Error {
    match e {
        heed::Error::Io(source) => Error::Io { arg: "dir", path: dir.display().to_string(), source },
        e => Error::Store { what: what.to_owned(), msg: format!("{op}: {e}") },
    }
}

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

/// One table of a [`PersistentStore`]: an LMDB database of `dim`-float32 rows by 64-bit key.
///
/// Cheap to clone (a shared handle; clones share counters); `Send + Sync`: any number of threads
/// may read and write it at once. It keeps the store's environment open while it lives.
#[derive(Clone)]
pub struct PersistentTable {
    inner: Arc<TableInner>,
    /// Whether writes are refused (the handle came from a read-only store).
    read_only: bool,
}

impl std::fmt::Debug for PersistentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentStore").field("dir", &self.inner.dir).field("read_only", &self.read_only).finish()
    }
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

struct TableInner {
    store: Arc<StoreInner>,
    name: String,
    db: Database<Bytes, Bytes>,
    dim: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    upserts: AtomicU64,
    erases: AtomicU64,
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

/// A table's metadata record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    complete: bool,
    dim: u64,
}

impl Meta {
    fn encode(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&META_LAYOUT.to_le_bytes());
        let state = if self.complete { STATE_COMPLETE } else { STATE_LOADING };
        b[4..8].copy_from_slice(&state.to_le_bytes());
        b[8..16].copy_from_slice(&self.dim.to_le_bytes());
        b
    }

    fn decode(name: &str, v: &[u8]) -> Result<Meta> {
        let corrupt =
            |why: String| Error::Store { what: name.to_owned(), msg: format!("corrupt metadata record: {why}") };
        if v.len() != 16 {
            return Err(corrupt(format!("{} bytes; expected 16", v.len())));
        }
        let word = |r: std::ops::Range<usize>| u32::from_le_bytes(<[u8; 4]>::try_from(&v[r]).unwrap_or([0; 4]));
        let layout = word(0..4);
        if layout != META_LAYOUT {
            return Err(corrupt(format!("layout {layout}; this strata reads layout {META_LAYOUT}")));
        }
        let complete = match word(4..8) {
            STATE_LOADING => false,
            STATE_COMPLETE => true,
            s => return Err(corrupt(format!("state {s}; expected 0 (loading) or 1 (complete)"))),
        };
        let dim = u64::from_le_bytes(<[u8; 8]>::try_from(&v[8..16]).unwrap_or([0; 8]));
        Ok(Meta { complete, dim })
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
    Error::Store {
        what: name.to_owned(),
        msg: format!("has dim {stored} in the persistent store at {dir}, but dim {asked} was asked for"),
    }
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
        let io = |source| Error::Io { arg: "dir", path: dir.display().to_string(), source };
        if read_only {
            if !dir.join("data.mdb").is_file() {
                return Err(Error::Store {
                    what: dir.display().to_string(),
                    msg: "holds no persistent store (no data.mdb); a read-only store must exist already: \
                          open it read-write once to create it"
                        .into(),
                });
            }
        } else {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let canon = dir.canonicalize().map_err(io)?;
        let mut open = lock(&OPEN_STORES);
        open.retain(|(_, w)| w.strong_count() > 0);
        if let Some(inner) = open.iter().find(|(p, _)| *p == canon).and_then(|(_, w)| w.upgrade()) {
            if inner.env_read_only && !read_only {
                return Err(Error::Store {
                    what: canon.display().to_string(),
                    msg: "is already open read-only in this process; drop every handle on it before opening it read-write"
                        .into(),
                });
            }
            return Ok(PersistentStore { inner, read_only });
        }
        let inner = Arc::new(Self::open_env(&canon, read_only)?);
        open.push((canon, Arc::downgrade(&inner)));
        Ok(PersistentStore { inner, read_only })
    }

    fn open_env(dir: &Path, read_only: bool) -> Result<StoreInner> {
        let what = dir.display().to_string();
        let err = |op: &str| {
            let what = what.clone();
            let op = op.to_owned();
            move |e| heed_error(e, &what, &op, dir)
        };
        let mut opts = EnvOpenOptions::new().read_txn_without_tls();
        opts.map_size(MAP_SIZE).max_dbs(MAX_TABLES + 1).max_readers(MAX_READERS);
        let mut flags = EnvFlags::NO_READ_AHEAD;
        if read_only {
            flags |= EnvFlags::READ_ONLY;
        }
        // SAFETY: only "safe" flags are set: no NO_SYNC, NO_META_SYNC, MAP_ASYNC or NO_LOCK.
        unsafe { opts.flags(flags) };
        let mut attempts = 0;
        let mut map_size = MAP_SIZE;
        let env = loop {
            // SAFETY: LMDB's files are only ever modified through LMDB (documented: the folder
            // must not be edited by hand or live on a network file system), and this process
            // opens each folder once (OPEN_STORES), as LMDB requires.
            match unsafe { opts.open(dir) } {
                // The last handle of a previous open may still be closing on another thread.
                Err(heed::Error::EnvAlreadyOpened) if attempts < 200 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                // The address space reservation was refused: try a smaller map.
                Err(heed::Error::Io(e))
                    if map_size > 1 << 30 && matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOMEM)) =>
                {
                    map_size /= 4;
                    opts.map_size(map_size);
                }
                r => break r.map_err(err("open"))?,
            }
        };
        // Reader slots left by killed processes would pin old pages forever; free them.
        env.clear_stale_readers().map_err(err("clear stale readers"))?;
        let check_format = |v: Option<&[u8]>| match v {
            Some(f) if f != FORMAT => Err(Error::Store {
                what: what.clone(),
                msg: format!(
                    "holds a store of format {:?}; this strata reads {:?}",
                    String::from_utf8_lossy(f),
                    String::from_utf8_lossy(FORMAT)
                ),
            }),
            _ => Ok(()),
        };
        let meta = if read_only {
            let rtxn = env.read_txn().map_err(err("begin read transaction"))?;
            let meta: Option<Database<Bytes, Bytes>> =
                env.open_database(&rtxn, Some(META_DB)).map_err(err("open metadata"))?;
            if let Some(m) = meta {
                check_format(m.get(&rtxn, FORMAT_KEY).map_err(err("read format"))?)?;
            }
            // Committing a read transaction keeps the database handle it opened.
            rtxn.commit().map_err(err("open metadata"))?;
            meta
        } else {
            let mut wtxn = env.write_txn().map_err(err("begin write transaction"))?;
            let meta: Database<Bytes, Bytes> =
                env.create_database(&mut wtxn, Some(META_DB)).map_err(err("create metadata"))?;
            let format = meta.get(&wtxn, FORMAT_KEY).map_err(err("read format"))?;
            check_format(format)?;
            if format.is_none() {
                meta.put(&mut wtxn, FORMAT_KEY, FORMAT).map_err(err("write format"))?;
            }
            wtxn.commit().map_err(err("create metadata"))?;
            Some(meta)
        };
        Ok(StoreInner { env, dir: dir.to_owned(), env_read_only: read_only, meta, tables: Mutex::new(HashMap::new()) })
    }

    /// The store's folder (canonical).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Whether this handle refuses writes.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Opens table `name` (e.g. `"wdl/table0"`, at most [`MAX_TABLE_NAME`] bytes, no NUL) with
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

    fn table_with(&self, name: &str, dim: usize, init: Option<&Path>, params: LoadParams) -> Result<PersistentTable> {
        check_name(name)?;
        crate::storage::hugectr::check_dim(dim)?;
        let s = &self.inner;
        let mut tables = lock(&s.tables);
        if let Some(t) = tables.get(name).and_then(Weak::upgrade) {
            if t.dim != dim {
                return Err(dim_mismatch(name, &s.folder(), t.dim as u64, dim));
            }
            return Ok(PersistentTable { inner: t, read_only: self.read_only });
        }
        let db_name = format!("{TABLE_PREFIX}{name}");
        let db = if self.read_only || s.env_read_only {
            self.open_existing(name, &db_name, dim)?
        } else {
            self.open_or_load(name, &db_name, dim, init, params)?
        };
        let inner = Arc::new(TableInner {
            store: s.clone(),
            name: name.to_owned(),
            db,
            dim,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            upserts: AtomicU64::new(0),
            erases: AtomicU64::new(0),
        });
        tables.retain(|_, w| w.strong_count() > 0);
        tables.insert(name.to_owned(), Arc::downgrade(&inner));
        Ok(PersistentTable { inner, read_only: self.read_only })
    }

    fn read_meta(&self, txn: &heed::RoTxn, name: &str) -> Result<Option<Meta>> {
        let s = &self.inner;
        let Some(meta) = s.meta else { return Ok(None) };
        match meta.get(txn, name.as_bytes()).map_err(s.heed(name, "read metadata"))? {
            Some(v) => Meta::decode(name, v).map(Some),
            None => Ok(None),
        }
    }

    /// Read-only path: the table must exist and be complete.
    fn open_existing(&self, name: &str, db_name: &str, dim: usize) -> Result<Database<Bytes, Bytes>> {
        let s = &self.inner;
        let rtxn = s.env.read_txn().map_err(s.heed(name, "begin read transaction"))?;
        match self.read_meta(&rtxn, name)? {
            None => Err(Error::Store {
                what: name.to_owned(),
                msg: format!(
                    "is not in the persistent store at {}, which is open read-only, so the table cannot be created",
                    s.folder()
                ),
            }),
            Some(Meta { complete: false, .. }) => {
                Err(interrupted(name, &s.folder(), "open the store read-write with the sparse folder to redo it"))
            }
            Some(m) if m.dim != dim as u64 => Err(dim_mismatch(name, &s.folder(), m.dim, dim)),
            Some(_) => {
                let db = s
                    .env
                    .open_database::<Bytes, Bytes>(&rtxn, Some(db_name))
                    .map_err(s.heed(name, "open table"))?
                    .ok_or_else(|| Error::Store {
                        what: name.to_owned(),
                        msg: format!("has metadata but no database {db_name:?}: the store is corrupt"),
                    })?;
                rtxn.commit().map_err(s.heed(name, "open table"))?;
                Ok(db)
            }
        }
    }

    /// Read-write path: reuse, create empty, or (re)load.
    fn open_or_load(
        &self,
        name: &str,
        db_name: &str,
        dim: usize,
        init: Option<&Path>,
        params: LoadParams,
    ) -> Result<Database<Bytes, Bytes>> {
        let s = &self.inner;
        let meta_db = s.meta.ok_or_else(|| Error::Internal("read-write store without metadata database".into()))?;
        // Check the sparse folder before taking the write lock, and only if a load may follow.
        let before = {
            let rtxn = s.env.read_txn().map_err(s.heed(name, "begin read transaction"))?;
            self.read_meta(&rtxn, name)?
        };
        let sparse = match (before, init) {
            (Some(Meta { complete: true, .. }), _) | (_, None) => None,
            (_, Some(folder)) => Some(SparseFolder::open(folder, dim)?),
        };
        let mut wtxn = s.env.write_txn().map_err(s.heed(name, "begin write transaction"))?;
        // Decide again under the write lock: another process may have loaded it meanwhile.
        let now = self.read_meta(&wtxn, name)?;
        let db: Database<Bytes, Bytes> =
            s.env.create_database(&mut wtxn, Some(db_name)).map_err(s.heed(name, "open table"))?;
        match (now, sparse) {
            (Some(m), _) if m.complete => {
                if m.dim != dim as u64 {
                    return Err(dim_mismatch(name, &s.folder(), m.dim, dim));
                }
                wtxn.commit().map_err(s.heed(name, "open table"))?;
                Ok(db)
            }
            (None, None) => {
                // A new, empty table (a leftover database of a failed load is emptied).
                db.clear(&mut wtxn).map_err(s.heed(name, "create table"))?;
                let rec = Meta { complete: true, dim: dim as u64 }.encode();
                meta_db.put(&mut wtxn, name.as_bytes(), &rec).map_err(s.heed(name, "create table"))?;
                wtxn.commit().map_err(s.heed(name, "create table"))?;
                Ok(db)
            }
            (Some(_), None) => Err(interrupted(name, &s.folder(), "give the sparse folder again to redo it")),
            (_, Some(sparse)) => {
                let mut commits = 0;
                match self.load(wtxn, db, meta_db, name, dim, &sparse, params, &mut commits) {
                    Ok(()) => Ok(db),
                    Err(e) => {
                        if commits > 0 && params.crash_after_commits.is_none() {
                            self.discard(db, meta_db, name);
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    /// Bulk-loads `sparse` into `db`, starting in `wtxn` (which holds the write lock and in
    /// which `db` was opened). Counts durable commits in `commits`.
    #[allow(clippy::too_many_arguments)]
    fn load<'a>(
        &'a self,
        mut wtxn: RwTxn<'a>,
        db: Database<Bytes, Bytes>,
        meta_db: Database<Bytes, Bytes>,
        name: &str,
        dim: usize,
        sparse: &SparseFolder,
        params: LoadParams,
        commits: &mut usize,
    ) -> Result<()> {
        let s = &self.inner;
        let e = |op: &'static str| s.heed(name, op);
        db.clear(&mut wtxn).map_err(e("load: clear"))?;
        let loading = Meta { complete: false, dim: dim as u64 }.encode();
        meta_db.put(&mut wtxn, name.as_bytes(), &loading).map_err(e("load: write metadata"))?;
        let row_bytes = dim * 4;
        let vecs = sparse.vecs();
        let run_keys = params.run_keys.max(1);
        let mut order: Vec<(u64, u64)> = Vec::new();
        let mut in_txn = 0usize;
        let mut start = 0usize;
        while start < sparse.rows {
            let end = sparse.rows.min(start.saturating_add(run_keys));
            order.clear();
            order
                .try_reserve_exact(end - start)
                .map_err(|_| Error::OutOfMemory { what: "persistent load sort buffer", bytes: (end - start) * 16 })?;
            order.extend((start..end).map(|r| (sparse.key(r), r as u64)));
            order.sort_unstable();
            if order.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(duplicate_error(sparse));
            }
            // The first run lands in an empty database in key order: append (packed pages).
            let flags = if start == 0 { PutFlags::APPEND } else { PutFlags::NO_OVERWRITE };
            for &(k, r) in &order {
                let r = r as usize;
                let row = &vecs[r * row_bytes..(r + 1) * row_bytes];
                match db.put_with_flags(&mut wtxn, flags, &k.to_be_bytes(), row) {
                    Err(heed::Error::Mdb(MdbError::KeyExist)) => return Err(duplicate_error(sparse)),
                    r => r.map_err(e("load: write row"))?,
                }
                in_txn += row_bytes + 8;
                if in_txn >= params.txn_bytes {
                    wtxn.commit().map_err(e("load: commit"))?;
                    *commits += 1;
                    in_txn = 0;
                    if params.crash_after_commits == Some(*commits) {
                        return Err(Error::Internal(format!("simulated crash after {commits} load commits")));
                    }
                    wtxn = s.env.write_txn().map_err(e("load: begin write transaction"))?;
                }
            }
            start = end;
        }
        let complete = Meta { complete: true, dim: dim as u64 }.encode();
        meta_db.put(&mut wtxn, name.as_bytes(), &complete).map_err(e("load: write metadata"))?;
        wtxn.commit().map_err(e("load: commit"))?;
        *commits += 1;
        Ok(())
    }

    /// Best effort: removes what a failed load committed, so the table reads as never created.
    /// If this fails too, the "loading" record makes the next open redo the load.
    fn discard(&self, db: Database<Bytes, Bytes>, meta_db: Database<Bytes, Bytes>, name: &str) {
        let s = &self.inner;
        if let Ok(mut wtxn) = s.env.write_txn()
            && db.clear(&mut wtxn).is_ok()
            && meta_db.delete(&mut wtxn, name.as_bytes()).is_ok()
        {
            let _ = wtxn.commit();
        }
    }
}



/// Decodes a stored row into `out` (`dim` values), checking its length.
fn decode_row(name: &str, key: u64, v: &[u8], out: &mut [f32]) -> Result<()> {
    if v.len() != out.len() * 4 {
        return Err(Error::Store {
            what: name.to_owned(),
            msg: format!(
                "corrupt row for key {key}: {} bytes; expected {} ({} float32)",
                v.len(),
                out.len() * 4,
                out.len()
            ),
        });
    }
    for (o, c) in out.iter_mut().zip(v.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Ok(())
}

impl PersistentTable {
    /// The table's name in its store.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Elements (float32) per row.
    pub fn dim(&self) -> usize {
        self.inner.dim
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
        self.check_batch(keys.len(), out.len(), "out")?;
        if found.len() != keys.len() {
            return Err(Error::invalid(
                "found",
                format!("{} flags; expected one per key ({})", found.len(), keys.len()),
            ));
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
            match t.db.get(&rtxn, &k.to_be_bytes()).map_err(self.err("read row"))? {
                Some(v) => {
                    decode_row(&t.name, k, v, &mut out[i * dim..(i + 1) * dim])?;
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
    /// at `rows[i*dim..]`); a key given twice keeps its last row.
    ///
    /// One write transaction, committed durably (data `fdatasync`ed, then the meta page written
    /// synchronously) before `Ok` is returned: a process killed right after loses nothing, and a
    /// process killed during the call leaves all of the batch or none of it. Concurrent readers
    /// see each row old or new, never mixed. Writers (threads and processes) take turns.
    pub fn upsert(&self, keys: &[u64], rows: &[f32]) -> Result<()> {
        self.check_writable("upsert")?;
        self.check_batch(keys.len(), rows.len(), "rows")?;
        if keys.is_empty() {
            return Ok(());
        }
        let t = &self.inner;
        let dim = t.dim;
        // Write in key order (B-tree locality); the sort is stable, so duplicates keep their order.
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i]);
        let mut buf = vec![0u8; dim * 4];
        let mut wtxn = t.store.env.write_txn().map_err(self.err("upsert: begin write transaction"))?;
        for i in order {
            for (b, v) in buf.chunks_exact_mut(4).zip(&rows[i * dim..(i + 1) * dim]) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            t.db.put(&mut wtxn, &keys[i].to_be_bytes(), &buf).map_err(self.err("upsert"))?;
        }
        wtxn.commit().map_err(self.err("upsert: commit"))?;
        t.upserts.fetch_add(keys.len() as u64, Relaxed);
        Ok(())
    }

    /// Removes the rows of `keys` (missing keys are ignored); returns how many rows were removed.
    /// One write transaction, committed durably before returning, like [`upsert`](Self::upsert).
    pub fn erase(&self, keys: &[u64]) -> Result<u64> {
        self.check_writable("erase")?;
        if keys.is_empty() {
            return Ok(0);
        }
        let t = &self.inner;
        let mut sorted = keys.to_vec();
        sorted.sort_unstable();
        let mut wtxn = t.store.env.write_txn().map_err(self.err("erase: begin write transaction"))?;
        let mut erased = 0u64;
        for k in sorted {
            if t.db.delete(&mut wtxn, &k.to_be_bytes()).map_err(self.err("erase"))? {
                erased += 1;
            }
        }
        wtxn.commit().map_err(self.err("erase: commit"))?;
        t.erases.fetch_add(erased, Relaxed);
        Ok(erased)
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
    /// the table; a long scan keeps the pages of its snapshot from being reused meanwhile.
    pub fn scan(&self, limit: usize, mut f: impl FnMut(u64, &[f32])) -> Result<()> {
        let t = &self.inner;
        let rtxn = t.store.env.read_txn().map_err(self.err("begin read transaction"))?;
        let mut row = vec![0f32; t.dim];
        for item in t.db.iter(&rtxn).map_err(self.err("scan"))?.take(limit) {
            let (k, v) = item.map_err(self.err("scan"))?;
            let key = match <[u8; 8]>::try_from(k) {
                Ok(b) => u64::from_be_bytes(b),
                Err(_) => {
                    return Err(Error::Store {
                        what: t.name.clone(),
                        msg: format!("corrupt key: {} bytes; expected 8", k.len()),
                    });
                }
            };
            decode_row(&t.name, key, v, &mut row)?;
            f(key, &row);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::{Table, TableOptions};
    use std::io::Write;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<PersistentStore>();
        assert_send_sync::<PersistentTable>();
    }

    /// Value `j` of key `k`'s row in generated folders (exact in float32).
    fn val(k: u64, j: usize) -> f32 {
        ((k % 100_003) as f32) * 0.5 + j as f32
    }

    /// Writes a HugeCTR sparse folder with `keys` and rows of `dim` values `val(k, j)`.
    fn write_sparse(dir: &Path, keys: &[i64], dim: usize) {
        std::fs::create_dir_all(dir).unwrap();
        let mut kf = Vec::with_capacity(keys.len() * 8);
        let mut vf = Vec::with_capacity(keys.len() * dim * 4);
        for &k in keys {
            kf.extend_from_slice(&k.to_le_bytes());
            for j in 0..dim {
                vf.extend_from_slice(&val(k as u64, j).to_le_bytes());
            }
        }
        std::fs::write(dir.join("key"), kf).unwrap();
        std::fs::write(dir.join("emb_vector"), vf).unwrap();
    }

    /// Scrambled, distinct keys, some negative as int64.
    fn gen_keys(n: usize) -> Vec<i64> {
        (0..n as u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i << 7)) as i64).collect()
    }

    fn read_all(t: &PersistentTable, keys: &[u64]) -> (Vec<f32>, Vec<bool>) {
        let mut out = vec![f32::NAN; keys.len() * t.dim()];
        let mut found = vec![false; keys.len()];
        t.get_many(keys, &mut out, &mut found).unwrap();
        (out, found)
    }

    fn check_rows(t: &PersistentTable, keys: &[i64]) {
        let dim = t.dim();
        let ks: Vec<u64> = keys.iter().map(|&k| k as u64).collect();
        let (out, found) = read_all(t, &ks);
        for (i, &k) in ks.iter().enumerate() {
            assert!(found[i], "key {k} missing");
            for j in 0..dim {
                assert_eq!(out[i * dim + j].to_bits(), val(k, j).to_bits(), "key {k} element {j}");
            }
        }
    }

    fn store_msg(e: &Error) -> String {
        assert_eq!(e.kind(), ErrorKind::Store, "{e}");
        e.to_string()
    }

    #[test]
    fn open_creates_the_folder_and_shares_the_environment() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/ps");
        let s = PersistentStore::open(&dir, false).unwrap();
        assert!(dir.join("data.mdb").is_file());
        assert!(!s.is_read_only());
        let s2 = PersistentStore::open(&dir, false).unwrap();
        assert!(Arc::ptr_eq(&s.inner, &s2.inner));
        let t = s.table("m/t", 4, None).unwrap();
        t.upsert(&[1], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        // Same table through the other handle: one set of counters.
        let t2 = s2.table("m/t", 4, None).unwrap();
        assert!(Arc::ptr_eq(&t.inner, &t2.inner));
        // A read-only view of an environment open read-write refuses writes.
        let ro = PersistentStore::open(&dir, true).unwrap();
        let e = ro.table("m/t", 4, None).unwrap().upsert(&[2], &[0.0; 4]).unwrap_err();
        assert!(store_msg(&e).contains("read-only"), "{e}");
        drop((s, s2, t, t2, ro));
        // Closed: opens afresh, data still there.
        let s = PersistentStore::open(&dir, false).unwrap();
        let t = s.table("m/t", 4, None).unwrap();
        assert_eq!(read_all(&t, &[1]).0, vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn bulk_load_reads_back_every_row_in_key_order() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = gen_keys(5000);
        write_sparse(&tmp.path().join("sparse"), &keys, 8);
        let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
        let t = s.table("wdl/table0", 8, Some(&tmp.path().join("sparse"))).unwrap();
        assert_eq!(t.dim(), 8);
        assert_eq!(t.name(), "wdl/table0");
        assert_eq!(t.len().unwrap(), 5000);
        check_rows(&t, &keys);
        let mut sorted: Vec<u64> = keys.iter().map(|&k| k as u64).collect();
        sorted.sort_unstable();
        let mut seen = Vec::new();
        t.scan(usize::MAX, |k, row| {
            assert_eq!(row.len(), 8);
            for (j, v) in row.iter().enumerate() {
                assert_eq!(*v, val(k, j));
            }
            seen.push(k);
        })
        .unwrap();
        assert_eq!(seen, sorted, "scan must visit every key in numeric u64 order");
        let mut first = Vec::new();
        t.scan(10, |k, _| first.push(k)).unwrap();
        assert_eq!(first, sorted[..10]);
        let st = t.stats();
        assert_eq!((st.hits, st.misses, st.rows, st.upserts, st.erases), (5000, 0, 5000, 0, 0));
    }

    #[test]
    fn load_in_many_transactions_and_runs() {
        // Small runs and transactions: later runs insert (not append) and commits interleave.
        let tmp = tempfile::tempdir().unwrap();
        let keys = gen_keys(3001);
        write_sparse(&tmp.path().join("sparse"), &keys, 3);
        let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
        let params = LoadParams { txn_bytes: 1000, run_keys: 700, crash_after_commits: None };
        let t = s.table_with("t", 3, Some(&tmp.path().join("sparse")), params).unwrap();
        assert_eq!(t.len().unwrap(), 3001);
        check_rows(&t, &keys);
    }

    #[test]
    fn empty_sparse_folder_gives_an_empty_table() {
        let tmp = tempfile::tempdir().unwrap();
        write_sparse(&tmp.path().join("sparse"), &[], 4);
        let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
        let t = s.table("t", 4, Some(&tmp.path().join("sparse"))).unwrap();
        assert_eq!(t.len().unwrap(), 0);
        assert!(t.is_empty().unwrap());
    }

    #[test]
    fn reopen_reuses_the_table_without_the_sparse_files() {
        let tmp = tempfile::tempdir().unwrap();
        let sparse = tmp.path().join("sparse");
        let keys = gen_keys(777);
        write_sparse(&sparse, &keys, 16);
        let ps = tmp.path().join("ps");
        {
            let s = PersistentStore::open(&ps, false).unwrap();
            let t = s.table("m/t0", 16, Some(&sparse)).unwrap();
            t.upsert(&[12345], &[7.0; 16]).unwrap();
        }
        std::fs::remove_dir_all(&sparse).unwrap();
        let s = PersistentStore::open(&ps, false).unwrap();
        // The folder is gone: reopening must not read it, and must not reload over the upsert.
        let t = s.table("m/t0", 16, Some(&sparse)).unwrap();
        assert_eq!(t.len().unwrap(), 778);
        check_rows(&t, &keys);
        assert_eq!(read_all(&t, &[12345]).0, vec![7.0; 16]);
        drop((s, t));
        let ro = PersistentStore::open(&ps, true).unwrap();
        let t = ro.table("m/t0", 16, None).unwrap();
        check_rows(&t, &keys);
    }

    #[test]
    fn dim_mismatch_names_the_table_and_both_dims() {
        let tmp = tempfile::tempdir().unwrap();
        let ps = tmp.path().join("ps");
        let s = PersistentStore::open(&ps, false).unwrap();
        let t = s.table("m/emb", 8, None).unwrap();
        let m = store_msg(&s.table("m/emb", 16, None).unwrap_err());
        assert!(m.contains("m/emb") && m.contains("dim 8") && m.contains("dim 16"), "{m}");
        drop((s, t));
        // From the metadata, after a reopen, read-write and read-only.
        let s = PersistentStore::open(&ps, false).unwrap();
        let m = store_msg(&s.table("m/emb", 16, None).unwrap_err());
        assert!(m.contains("m/emb") && m.contains("dim 8") && m.contains("dim 16"), "{m}");
        drop(s);
        let s = PersistentStore::open(&ps, true).unwrap();
        let m = store_msg(&s.table("m/emb", 4, None).unwrap_err());
        assert!(m.contains("m/emb") && m.contains("dim 8") && m.contains("dim 4"), "{m}");
    }

    #[test]
    fn read_only_refuses_writes_with_a_clear_message() {
        let tmp = tempfile::tempdir().unwrap();
        let ps = tmp.path().join("ps");
        let missing = PersistentStore::open(&tmp.path().join("nothing"), true).err().unwrap();
        assert!(store_msg(&missing).contains("read-only store must exist"), "{missing}");
        {
            let s = PersistentStore::open(&ps, false).unwrap();
            s.table("m/t", 2, None).unwrap().upsert(&[5, 6], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        }
        let s = PersistentStore::open(&ps, true).unwrap();
        assert!(s.is_read_only());
        let t = s.table("m/t", 2, None).unwrap();
        assert!(t.is_read_only());
        let (out, found) = read_all(&t, &[5, 6, 7]);
        assert_eq!(found, vec![true, true, false]);
        assert_eq!(&out[..4], &[1.0, 2.0, 3.0, 4.0]);
        for e in [t.upsert(&[5], &[0.0, 0.0]).unwrap_err(), t.erase(&[5]).unwrap_err(), t.upsert(&[], &[]).unwrap_err()]
        {
            let m = store_msg(&e);
            assert!(m.starts_with("m/t: is read-only") && m.contains("read_only = true"), "{m}");
        }
        assert_eq!(t.len().unwrap(), 2);
        // Tables cannot be created or loaded read-only.
        let e = s.table("m/other", 2, None).unwrap_err();
        assert!(store_msg(&e).contains("open read-only"), "{e}");
        write_sparse(&tmp.path().join("sparse"), &[1, 2], 2);
        let e = s.table("m/other", 2, Some(&tmp.path().join("sparse"))).unwrap_err();
        assert!(store_msg(&e).contains("m/other"), "{e}");
        // Read-write while open read-only in this process is refused.
        let e = PersistentStore::open(&ps, false).err().unwrap();
        assert!(store_msg(&e).contains("already open read-only"), "{e}");
    }

    #[test]
    fn upsert_erase_len_and_stats_are_exact() {
        let tmp = tempfile::tempdir().unwrap();
        let s = PersistentStore::open(tmp.path(), false).unwrap();
        let t = s.table("t", 3, None).unwrap();
        assert_eq!(t.len().unwrap(), 0);
        let rows: Vec<f32> = (0..12).map(|v| v as f32).collect();
        t.upsert(&[10, 20, 30, 40], &rows).unwrap();
        assert_eq!(t.len().unwrap(), 4);
        // Overwrite one key and add one; a key given twice keeps its last row.
        t.upsert(&[20, 50, 50], &[-1.0, -2.0, -3.0, 9.0, 9.0, 9.0, 5.0, 5.0, 5.0]).unwrap();
        assert_eq!(t.len().unwrap(), 5);
        let (out, found) = read_all(&t, &[20, 50, 10]);
        assert_eq!(found, vec![true; 3]);
        assert_eq!(out, vec![-1.0, -2.0, -3.0, 5.0, 5.0, 5.0, 0.0, 1.0, 2.0]);
        assert_eq!(t.erase(&[10, 10, 99]).unwrap(), 1);
        assert_eq!(t.erase(&[]).unwrap(), 0);
        assert_eq!(t.len().unwrap(), 4);
        let (_, found) = read_all(&t, &[10, 99]);
        assert_eq!(found, vec![false, false]);
        assert_eq!(t.stats(), PersistentStats { hits: 3, misses: 2, rows: 4, upserts: 7, erases: 1 });
        // Wrong lengths are argument errors and change nothing.
        let e = t.upsert(&[1, 2], &[0.0; 5]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().starts_with("rows: 5 values; expected 2 keys x dim 3 = 6"), "{e}");
        let e = t.get_many(&[1], &mut [0.0; 2], &mut [false]).unwrap_err();
        assert!(e.to_string().starts_with("out: "), "{e}");
        let e = t.get_many(&[1], &mut [0.0; 3], &mut []).unwrap_err();
        assert!(e.to_string().starts_with("found: "), "{e}");
        assert_eq!(t.len().unwrap(), 4);
        assert_eq!(t.stats().upserts, 7);
    }

    #[test]
    fn get_many_reports_misses_and_leaves_their_rows() {
        let tmp = tempfile::tempdir().unwrap();
        let s = PersistentStore::open(tmp.path(), false).unwrap();
        let t = s.table("t", 2, None).unwrap();
        t.upsert(&[1, u64::MAX, 1 << 63], &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5]).unwrap();
        let keys = [0, 1, 2, u64::MAX, 1 << 63, 7];
        let mut out = vec![-9.0f32; 12];
        let mut found = vec![true; 6];
        assert_eq!(t.get_many(&keys, &mut out, &mut found).unwrap(), (3, 3));
        assert_eq!(found, vec![false, true, false, true, true, false]);
        assert_eq!(out, vec![-9.0, -9.0, 1.0, 1.5, -9.0, -9.0, 2.0, 2.5, 3.0, 3.5, -9.0, -9.0]);
        assert_eq!(t.get_many(&[], &mut [], &mut []).unwrap(), (0, 0));
        let st = t.stats();
        assert_eq!((st.hits, st.misses), (3, 3));
        // Big-endian keys: the order is numeric even across the sign bit of int64.
        let mut order = Vec::new();
        t.scan(usize::MAX, |k, _| order.push(k)).unwrap();
        assert_eq!(order, vec![1, 1 << 63, u64::MAX]);
    }

    #[test]
    fn concurrent_readers_see_whole_rows() {
        const DIM: usize = 32;
        const KEYS: u64 = 64;
        const VERSIONS: u64 = 60;
        // Element j of key k at version v: exact in float32, and says which (k, v) it belongs to.
        fn enc(k: u64, v: u64, j: usize) -> f32 {
            (k * 100_000 + v * 100 + j as u64) as f32
        }
        let tmp = tempfile::tempdir().unwrap();
        let s = PersistentStore::open(tmp.path(), false).unwrap();
        let t = s.table("t", DIM, None).unwrap();
        let keys: Vec<u64> = (0..KEYS).collect();
        let write = |v: u64| {
            let rows: Vec<f32> = keys.iter().flat_map(|&k| (0..DIM).map(move |j| enc(k, v, j))).collect();
            t.upsert(&keys, &rows).unwrap();
        };
        write(0);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    let mut last = vec![0u64; KEYS as usize];
                    let mut reads = 0;
                    while !done.load(Relaxed) || reads < 5 {
                        let (out, found) = read_all(&t, &keys);
                        assert!(found.iter().all(|&f| f));
                        let mut batch_v = None;
                        for (i, &k) in keys.iter().enumerate() {
                            let row = &out[i * DIM..(i + 1) * DIM];
                            let v = (row[0] as u64 - k * 100_000) / 100;
                            for (j, x) in row.iter().enumerate() {
                                assert_eq!(*x, enc(k, v, j), "torn row: key {k} element {j}");
                            }
                            // Versions never go back, and one batch sees one snapshot.
                            assert!(v >= last[i]);
                            last[i] = v;
                            assert_eq!(*batch_v.get_or_insert(v), v, "a batch mixed two versions");
                        }
                        reads += 1;
                    }
                });
            }
            for v in 1..VERSIONS {
                write(v);
            }
            done.store(true, Relaxed);
        });
        let (out, _) = read_all(&t, &keys);
        assert_eq!(out[DIM], enc(1, VERSIONS - 1, 0));
    }

    #[test]
    fn malformed_sparse_folders_fail_like_table_open() {
        let tmp = tempfile::tempdir().unwrap();
        let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
        let case = |name: &str, setup: &dyn Fn(&Path), dim: usize| {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            setup(&dir);
            let want = Table::open(&dir, dim as i64, TableOptions::default()).err().unwrap();
            let got = s.table(name, dim, Some(&dir)).err().unwrap();
            assert_eq!(got.to_string(), want.to_string(), "case {name}");
            assert_eq!(got.kind(), want.kind(), "case {name}");
            // Nothing is left behind: the name opens as a new, empty table.
            let t = s.table(name, dim, None).unwrap();
            assert_eq!(t.len().unwrap(), 0, "case {name}");
        };
        case("no_key", &|d| std::fs::write(d.join("emb_vector"), [0u8; 8]).unwrap(), 2);
        case("no_vectors", &|d| std::fs::write(d.join("key"), [0u8; 8]).unwrap(), 2);
        case(
            "truncated_key",
            &|d| {
                std::fs::write(d.join("key"), [0u8; 12]).unwrap();
                std::fs::write(d.join("emb_vector"), [0u8; 8]).unwrap();
            },
            2,
        );
        case(
            "dim_does_not_divide",
            &|d| {
                std::fs::write(d.join("key"), [0u8; 8]).unwrap();
                std::fs::write(d.join("emb_vector"), [0u8; 12]).unwrap();
            },
            2,
        );
        case(
            "count_mismatch",
            &|d| {
                std::fs::write(d.join("key"), [0u8; 16]).unwrap();
                std::fs::write(d.join("emb_vector"), [0u8; 24]).unwrap();
            },
            2,
        );
        case("duplicates", &|d| write_sparse(d, &[5, -1, 7, -1, 5, 9], 2), 2);
        let e = s.table("bad_dim", 0, Some(tmp.path())).unwrap_err();
        assert_eq!(e.to_string(), Table::open(tmp.path(), 0, TableOptions::default()).err().unwrap().to_string());
    }

    #[test]
    fn duplicate_found_after_commits_leaves_no_table() {
        let tmp = tempfile::tempdir().unwrap();
        let sparse = tmp.path().join("sparse");
        let mut keys = gen_keys(2000);
        keys[1500] = keys[3]; // in a later run than its first occurrence
        write_sparse(&sparse, &keys, 4);
        let want = Table::open(&sparse, 4, TableOptions::default()).err().unwrap().to_string();
        assert!(want.contains("rows 3 and 1500"), "{want}");
        let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
        let params = LoadParams { txn_bytes: 2000, run_keys: 500, crash_after_commits: None };
        let e = s.table_with("t", 4, Some(&sparse), params).err().unwrap();
        assert_eq!(e.to_string(), want);
        assert_eq!(s.table("t", 4, None).unwrap().len().unwrap(), 0);
    }

    #[test]
    fn an_interrupted_load_is_detected_and_redone() {
        let tmp = tempfile::tempdir().unwrap();
        let sparse = tmp.path().join("sparse");
        let keys = gen_keys(2500);
        write_sparse(&sparse, &keys, 4);
        let ps = tmp.path().join("ps");
        {
            let s = PersistentStore::open(&ps, false).unwrap();
            let params = LoadParams { txn_bytes: 4000, run_keys: 1 << 20, crash_after_commits: Some(2) };
            let e = s.table_with("m/t", 4, Some(&sparse), params).err().unwrap();
            assert!(e.to_string().contains("simulated crash"), "{e}");
        }
        // The partial load is visible in LMDB, but the table is recorded as loading.
        let s = PersistentStore::open(&ps, false).unwrap();
        let e = s.table("m/t", 4, None).unwrap_err();
        let m = store_msg(&e);
        assert!(m.starts_with("m/t: ") && m.contains("interrupted") && m.contains("sparse folder"), "{m}");
        drop(s);
        let ro = PersistentStore::open(&ps, true).unwrap();
        assert!(store_msg(&ro.table("m/t", 4, None).unwrap_err()).contains("interrupted"));
        drop(ro);
        let s = PersistentStore::open(&ps, false).unwrap();
        let t = s.table("m/t", 4, Some(&sparse)).unwrap();
        assert_eq!(t.len().unwrap(), 2500);
        check_rows(&t, &keys);
    }

    #[test]
    fn bad_names_and_corrupt_rows_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let s = PersistentStore::open(tmp.path(), false).unwrap();
        for (name, want) in [("", "name: is empty"), ("a\0b", "NUL"), (&"x".repeat(401)[..], "at most 400")] {
            let e = s.table(name, 4, None).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains(want), "{e}");
        }
        let e = s.table("t", 0, None).unwrap_err();
        assert_eq!(e.to_string(), format!("dim: 0; expected 1 <= dim <= {}", crate::limits::MAX_DIM));
        let t = s.table("t", 4, None).unwrap();
        // Write a row of the wrong length behind the table's back.
        let env = &s.inner.env;
        let mut w = env.write_txn().unwrap();
        t.inner.db.put(&mut w, &9u64.to_be_bytes(), &[0u8; 12]).unwrap();
        w.commit().unwrap();
        let e = t.get_many(&[9], &mut [0.0; 4], &mut [false]).unwrap_err();
        assert_eq!(store_msg(&e), "t: corrupt row for key 9: 12 bytes; expected 16 (4 float32)");
        let e = t.scan(usize::MAX, |_, _| ()).unwrap_err();
        assert!(store_msg(&e).contains("corrupt row"));
        let mut w = env.write_txn().unwrap();
        t.inner.db.put(&mut w, b"abc", &[0u8; 16]).unwrap();
        w.commit().unwrap();
        let mut w = env.write_txn().unwrap();
        t.inner.db.delete(&mut w, &9u64.to_be_bytes()).unwrap();
        w.commit().unwrap();
        let e = t.scan(usize::MAX, |_, _| ()).unwrap_err();
        assert_eq!(store_msg(&e), "t: corrupt key: 3 bytes; expected 8");
    }

    /// `cargo test --release --lib tier::persistent::tests::bulk_load_timing -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bulk_load_timing() {
        let rows: usize = std::env::var("STRATA_LOAD_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        let dim = 128;
        let tmp = tempfile::tempdir().unwrap();
        let sparse = tmp.path().join("sparse");
        std::fs::create_dir_all(&sparse).unwrap();
        let keys = gen_keys(rows);
        let mut kf = std::io::BufWriter::new(std::fs::File::create(sparse.join("key")).unwrap());
        let mut vf = std::io::BufWriter::new(std::fs::File::create(sparse.join("emb_vector")).unwrap());
        for &k in &keys {
            kf.write_all(&k.to_le_bytes()).unwrap();
            for j in 0..dim {
                vf.write_all(&val(k as u64, j).to_le_bytes()).unwrap();
            }
        }
        drop((kf, vf));
        let s = PersistentStore::open(&tmp.path().join("ps"), false).unwrap();
        let t0 = std::time::Instant::now();
        let t = s.table("t", dim, Some(&sparse)).unwrap();
        let load = t0.elapsed();
        let size = std::fs::metadata(tmp.path().join("ps/data.mdb")).unwrap().len();
        let probe: Vec<u64> = keys.iter().step_by(7).map(|&k| k as u64).collect();
        let mut out = vec![0f32; probe.len() * dim];
        let mut found = vec![false; probe.len()];
        let mut get = Vec::new();
        for _ in 0..2 {
            let t0 = std::time::Instant::now();
            t.get_many(&probe, &mut out, &mut found).unwrap();
            get.push(t0.elapsed());
        }
        let t0 = std::time::Instant::now();
        let batch: Vec<u64> = keys[..1000].iter().map(|&k| k as u64).collect();
        t.upsert(&batch, &vec![1.0; 1000 * dim]).unwrap();
        let up = t0.elapsed();
        println!(
            "bulk load {rows} x {dim}: {load:?} ({:.0} MB/s of rows), data.mdb {:.0} MiB; \
             get_many of {} random keys: first pass {:?}, second {:?}; durable upsert of 1000 rows {up:?}",
            (rows * dim * 4) as f64 / load.as_secs_f64() / 1e6,
            size as f64 / (1 << 20) as f64,
            probe.len(),
            get[0],
            get[1]
        );
        assert_eq!(t.len().unwrap(), rows as u64);
        assert!(found.iter().all(|&f| f));
    }
}

/// The error `Table::open` reports for a folder's keys: the first row (in file order)
/// whose key an earlier row already has.
fn duplicate_error(sparse: &SparseFolder) -> Error {
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for r in 0..sparse.rows {
        let k = sparse.key(r);
        if let Some(&first) = seen.get(&k) {
            return Error::DuplicateKey { arg: "dir/key", key: k as i64 as i128, first, second: r as u64 };
        }
        seen.insert(k, r as u64);
    }
    Error::Internal("a duplicate key was reported but none was found".into())
}
