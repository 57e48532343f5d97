//! The process-wide registry of open stores: one LMDB environment per folder per process,
//! opened here and shared by every [`PersistentStore`](super::PersistentStore) of the folder.

use super::format::{Catalog, Corrupt, FORMAT};
use crate::error::{Error, Result};
use heed::{Env, EnvFlags, EnvOpenOptions, WithoutTls};
use std::path::{Path, PathBuf};
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

/// Environments open in this process, by canonical folder. LMDB must not open one environment
/// twice in a process (closing one copy would drop the other's locks), so a second
/// [`PersistentStore::open`](super::PersistentStore::open) of a folder shares the first one's
/// environment.
static OPEN_STORES: Mutex<Vec<(PathBuf, Weak<StoreInner>)>> = Mutex::new(Vec::new());

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One open environment, shared by every store and table handle on its folder.
pub(super) struct StoreInner {
    pub(super) env: Env<WithoutTls>,
    /// Canonical folder.
    pub(super) dir: PathBuf,
    /// Whether the environment itself is `MDB_RDONLY`.
    pub(super) env_read_only: bool,
    /// `strata.meta`; `None` only in a read-only environment no strata process ever wrote.
    pub(super) catalog: Option<Catalog>,
}

impl StoreInner {
    /// Maps a heed error of operation `op` on `what` (a table name), as [`heed_error`].
    pub(super) fn heed(&self, what: &str, op: &str) -> impl Fn(heed::Error) -> Error + '_ {
        let what = what.to_owned();
        let op = op.to_owned();
        move |e| heed_error(e, &what, &op, &self.dir)
    }

    pub(super) fn folder(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Maps a heed error: I/O errors (including LMDB's errno codes) to [`Error::Io`] on the store
/// folder, stored bytes that do not decode to [`Error::Store`] naming `what` with the
/// [`Corrupt`] message, everything else to [`Error::Store`] naming `what` and the operation.
pub(super) fn heed_error(e: heed::Error, what: &str, op: &str, dir: &Path) -> Error {
    match e {
        heed::Error::Io(source) => Error::Io { arg: "dir", path: dir.display().to_string(), source },
        heed::Error::Decoding(e) if e.is::<Corrupt>() => Error::Store { what: what.to_owned(), msg: e.to_string() },
        e => Error::Store { what: what.to_owned(), msg: format!("{op}: {e}") },
    }
}

/// The environment of folder `dir`: the one already open in this process, or a newly opened
/// one (see [`PersistentStore::open`](super::PersistentStore::open) for the rules).
pub(super) fn open(dir: &Path, read_only: bool) -> Result<Arc<StoreInner>> {
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
                msg: "is already open read-only in this process; drop every handle on it before opening it read-write".into(),
            });
        }
        return Ok(inner);
    }
    let inner = Arc::new(open_env(&canon, read_only)?);
    open.push((canon, Arc::downgrade(&inner)));
    Ok(inner)
}

/// Opens the environment in `dir` (canonical) with synchronous commits, clears stale reader
/// slots, and checks (read-write: creates) the catalog and its layout version.
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
            Err(heed::Error::Io(e)) if map_size > 1 << 30 && matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOMEM)) => {
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
    let catalog = if read_only {
        let rtxn = env.read_txn().map_err(err("begin read transaction"))?;
        let catalog = Catalog::open(&env, &rtxn).map_err(err("open metadata"))?;
        if let Some(c) = catalog {
            check_format(c.format(&rtxn).map_err(err("read format"))?)?;
        }
        // Committing a read transaction keeps the database handle it opened.
        rtxn.commit().map_err(err("open metadata"))?;
        catalog
    } else {
        let mut wtxn = env.write_txn().map_err(err("begin write transaction"))?;
        let catalog = Catalog::create(&env, &mut wtxn).map_err(err("create metadata"))?;
        let format = catalog.format(&wtxn).map_err(err("read format"))?;
        check_format(format)?;
        if format.is_none() {
            catalog.put_format(&mut wtxn).map_err(err("write format"))?;
        }
        wtxn.commit().map_err(err("create metadata"))?;
        Some(catalog)
    };
    Ok(StoreInner { env, dir: dir.to_owned(), env_read_only: read_only, catalog })
}
