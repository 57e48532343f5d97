//! One server per configuration per process, as HPS kept one parameter server per process:
//! every TensorFlow layer, TensorRT plugin instance and Triton model instance that opens the
//! same `ps.json` shares its tiers, so memory does not multiply and an update through one
//! handle is seen through every other.
//!
//! - A configuration file is the same when its canonical path is the same (whatever the
//!   spelling: `a/./b/../ps.json`) and its content is unchanged; JSON text is the same when
//!   the text and the canonical base folder are.
//! - Two different configurations that name the same persistent store folder would share the
//!   store but not the volatile tier of a table, so an upsert through one would go unseen
//!   through the other: the second is refused with `STRATA_CONFIG_ERROR` naming both.
//! - The registry holds the servers weakly: a server closes when its last `Arc` goes.
//! - It is the process's one registry of servers: a table pointer a server lends is known by
//!   it ([`lends`]), so freeing one leaves it to its server.
//!
//! Thread-safe: opens of many threads are serialised by the registry's lock (an open that
//! builds a server holds it, so two threads never build the same configuration twice).

use super::Server;
use crate::config;
use crate::error::{Error, Result};
use crate::table::Table;
use crate::util::lock::lock;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// What makes two opens the same configuration.
#[derive(PartialEq, Eq)]
enum Key {
    /// A file: its canonical path and its content.
    File(PathBuf, String),
    /// JSON text and the canonical folder its relative paths are relative to.
    Text(String, PathBuf),
}

struct Entry {
    key: Key,
    /// How messages name the configuration (its file, or "JSON text with base folder ...").
    origin: String,
    /// The canonical persistent store folder, when the configuration has a persistent tier.
    store: Option<PathBuf>,
    server: Weak<Server>,
}

static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Test hook: run once by the next open right after it has dropped the dead entries, with the
/// registry's lock held (a test drops a server's last handle there, where the race it checks
/// needs it).
#[cfg(test)]
pub(super) static AFTER_RETAIN: Mutex<Option<Box<dyn FnOnce() + Send>>> = Mutex::new(None);

/// The server of the configuration file at `path`, opened once per process.
pub fn open(path: &Path) -> Result<Arc<Server>> {
    let io = |source| Error::Io { arg: "ps_json_path", path: path.display().to_string(), source };
    let canonical = std::fs::canonicalize(path).map_err(io)?;
    let text = std::fs::read_to_string(&canonical).map_err(io)?;
    let base = canonical.parent().map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let origin = path.display().to_string();
    shared(Key::File(canonical, text.clone()), origin.clone(), || config::parse(&text, &origin, &base))
}

/// The server of a configuration given as JSON text (relative paths relative to `base_dir`),
/// opened once per process for the same text and base folder.
pub fn open_json(text: &str, base_dir: &Path) -> Result<Arc<Server>> {
    let base =
        std::fs::canonicalize(base_dir).map_err(|source| Error::Io { arg: "base_dir", path: base_dir.display().to_string(), source })?;
    let origin = format!("JSON text with base folder {}", base.display());
    shared(Key::Text(text.to_string(), base.clone()), origin, || config::parse(text, "ps.json", &base))
}

/// Whether `table` is a table of a server open in this process: the tables the servers lend
/// (`strata_server_table`), which they free themselves.
pub fn lends(table: &Table) -> bool {
    // Upgraded under the lock, checked and dropped after it.
    let live: Vec<Arc<Server>> = lock(&REGISTRY).iter().filter_map(|e| e.server.upgrade()).collect();
    live.iter().any(|s| s.holds(table))
}

/// The live server of `key`, or a new one built from `parse`'s configuration.
fn shared(key: Key, origin: String, parse: impl FnOnce() -> Result<config::PsConfig>) -> Result<Arc<Server>> {
    let mut reg = lock(&REGISTRY);
    reg.retain(|e| e.server.strong_count() > 0);
    #[cfg(test)]
    if let Some(f) = lock(&AFTER_RETAIN).take() {
        f();
    }
    if let Some(s) = reg.iter().find(|e| e.key == key).and_then(|e| e.server.upgrade()) {
        return Ok(s);
    }
    // Handles are dropped without the registry's lock, so this configuration's own server may
    // have lost its last handle since the retain above: its entry must not be taken for another
    // configuration on the same store. (Found by tests/c/shared_server.c under valgrind: an open
    // of `ps.json` refused because `sub/../ps.json`, the same file, was closing.)
    reg.retain(|e| e.key != key);
    let cfg = parse()?;
    let store = match cfg.persistent_db.kind {
        config::PersistentDbKind::Disabled => None,
        _ => Some(std::fs::canonicalize(&cfg.persistent_db.path).unwrap_or_else(|_| cfg.persistent_db.path.clone())),
    };
    if let Some(path) = &store
        && let Some(other) = reg.iter().find(|e| e.store.as_ref() == Some(path) && e.server.strong_count() > 0)
    {
        return Err(Error::Config {
            file: origin,
            path: "persistent_db.path".into(),
            msg: format!(
                "{} is the persistent store of {}, which this process has open with another configuration; two \
                 configurations on one store would each keep their own volatile tier and serve stale rows, so open \
                 that configuration itself, or give this one its own store",
                path.display(),
                other.origin
            ),
        });
    }
    let server = Arc::new(Server::from_config(cfg)?);
    // The store folder exists now: record its canonical path for the next configuration.
    let store = store.map(|p| std::fs::canonicalize(&p).unwrap_or(p));
    reg.push(Entry { key, origin, store, server: Arc::downgrade(&server) });
    Ok(server)
}
