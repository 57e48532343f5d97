//! Parameter-server tables: a volatile in-memory tier in front of a persistent on-disk tier,
//! then the table's default value, as HPS looked rows up.
//!
//! A [`TieredTable`] is `Send + Sync`. Lookups may run on many threads while others upsert or
//! erase: each tier hands out whole rows (old or new, never a mix). An upsert is written to the
//! persistent tier (durably, one transaction) before the volatile tier, so an acknowledged
//! upsert survives a crash; readers may see the new row in the volatile tier only after that.
//!
//! # Updates from another process
//! Another process may write the same persistent store (LMDB serves several processes). Each
//! persistent table keeps a commit counter that every write transaction of every process
//! moves ([`PersistentTable::commits`]). A table remembers the counter value its volatile tier
//! reflects; at most every `refresh_interval` a lookup reads the counter (one cheap read
//! transaction) before it reads the volatile tier, and when another process moved it, the
//! volatile tier is emptied (and [`generation`](TieredTable::generation) moves, so GPU caches
//! drop their rows too), so the lookup and those after it read the persistent tier. A lookup
//! that starts `refresh_interval` or more after a foreign commit returned therefore sees it.
//! This process's own writes read the counter inside their write transaction: the value they
//! find is the one they expect unless another process wrote in between, which empties the
//! volatile tier too; their own increment never does.

use super::options::MissingKey;
use crate::error::{Error, Result};
use crate::kernels::{RowFormat, quantize_row, round_trip};
use crate::storage::tier::persistent::PersistentTable;
use crate::storage::tier::redis::{Failure, RedisTier};
use crate::storage::tier::volatile::VolatileTier;
use crate::util::lock;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Cumulative counters of one table, all tiers (`strata_table_get_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Lookup calls that succeeded.
    pub lookups: u64,
    /// Keys looked up.
    pub keys: u64,
    /// Keys found in the volatile tier.
    pub volatile_hits: u64,
    /// Keys found in the persistent tier (after missing the volatile tier).
    pub persistent_hits: u64,
    /// Keys found in no tier (given the default value).
    pub misses: u64,
    /// Rows the volatile tier evicted to stay within its capacity.
    pub evictions: u64,
    /// Rows the volatile tier holds now.
    pub volatile_rows: u64,
    /// Bytes the volatile tier holds now.
    pub volatile_bytes: u64,
    /// Rows the persistent tier holds now.
    pub persistent_rows: u64,
    /// Keys written by `strata_table_upsert`.
    pub upserts: u64,
    /// Keys removed by `strata_table_erase`.
    pub erases: u64,
    /// Keys a Redis volatile tier could not be asked for because their node failed (they were
    /// read from the persistent tier or given the default row, and are counted there too). Not
    /// in `strata_table_stats`.
    pub volatile_unavailable: u64,
}

/// A table's volatile tier: in this process, or in a Redis cluster shared with others.
pub(crate) enum Volatile {
    Local(VolatileTier),
    /// Boxed: its connection state would double the size of every tiered table.
    Redis(Box<RedisTier>),
}

impl Volatile {
    fn get_many(&self, keys: &[u64], rows: &mut [f32], present: &mut [bool]) -> u64 {
        match self {
            Volatile::Local(v) => v.get_many(keys, rows, present).0,
            Volatile::Redis(r) => r.get_many(keys, rows, present).0,
        }
    }
}

/// A Redis node's failure as a store error.
fn store_error(table: &str, f: Failure) -> Error {
    Error::Store { what: format!("table {table}: Redis node {}", f.node), msg: f.msg }
}

/// A table of a parameter server: see the module docs.
pub struct TieredTable {
    /// `model/table`, for messages.
    pub(crate) name: String,
    dim: usize,
    volatile: Option<Volatile>,
    persistent: Option<PersistentTable>,
    /// Promote persistent-tier hits into the volatile tier (`cache_missed_embeddings`).
    cache_missed: bool,
    /// The persistent tier is read-only (`persistent_db.read_only`).
    read_only: bool,
    default_row: Vec<f32>,
    missing: MissingKey,
    /// How rows are served: every row read, from any tier, is what this format holds for it
    /// (see [`TieredTable::stored_as`]).
    format: RowFormat,
    counters: Counters,
    /// Orders promotions against writes: a writer holds it exclusively from its persistent
    /// commit through its volatile update and then bumps the count; a promotion notes the
    /// count before its persistent read and inserts, under the shared lock, only if the count
    /// has not moved, so it never puts back a row older than a committed write.
    writes: RwLock<u64>,
    /// Notices other processes' commits (tables with a persistent tier).
    refresh: Option<Refresh>,
}

/// When to look for other processes' commits, and the commit counter last seen.
struct Refresh {
    interval: Duration,
    start: Instant,
    /// Nanoseconds after `start` from which a lookup reads the counter again. Raised only
    /// after a check has finished (emptied the volatile tier if it had to).
    next_check: AtomicU64,
    /// The persistent table's commit counter the volatile tier reflects. Changed only with
    /// `writes` held exclusively.
    seen: AtomicU64,
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    keys: AtomicU64,
    volatile_hits: AtomicU64,
    persistent_hits: AtomicU64,
    misses: AtomicU64,
    upserts: AtomicU64,
    erases: AtomicU64,
    /// Times the volatile tier was emptied for another process's commits.
    invalidations: AtomicU64,
}

impl TieredTable {
    /// A table over the given tiers (at least one). `default_value` fills rows found nowhere.
    // One argument per field; the server passes them straight from a parsed table config.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        dim: usize,
        volatile: Option<Volatile>,
        persistent: Option<PersistentTable>,
        cache_missed: bool,
        read_only: bool,
        default_value: f32,
        missing: MissingKey,
    ) -> Self {
        TieredTable {
            name,
            dim,
            volatile,
            persistent,
            cache_missed,
            read_only,
            default_row: vec![default_value; dim],
            missing,
            format: crate::dlpack::FloatDtype::F32.into(),
            counters: Counters::default(),
            writes: RwLock::new(0),
            refresh: None,
        }
    }

    /// Serves rows as `format` holds them (the volatile tier, built with the same format, stores
    /// them so). A persistent tier created with the same format stores the same bytes, which
    /// promotions copy into the volatile tier as they are; one of another format (float32, in a
    /// store written before row formats) keeps rows as written, and a row read from it is
    /// passed through the format before it is returned. Either way a key's row is the same
    /// whichever tier it comes from. Upserts refuse rows the format cannot hold.
    pub(crate) fn stored_as(mut self, format: RowFormat) -> Self {
        self.format = format;
        self
    }

    /// How rows are served.
    pub fn format(&self) -> RowFormat {
        self.format
    }

    /// Makes the table notice other processes' commits to its persistent tier (see the module
    /// docs): at most every `interval` (`Duration::ZERO`: at every lookup). `seen` is the
    /// persistent table's commit counter read before the volatile tier was warmed. No effect
    /// without a persistent tier.
    pub(crate) fn refreshing(mut self, interval: Duration, seen: u64) -> Self {
        if self.persistent.is_some() {
            self.refresh = Some(Refresh { interval, start: Instant::now(), next_check: AtomicU64::new(0), seen: AtomicU64::new(seen) });
        }
        self
    }

    /// Times the volatile tier was emptied because another process committed to the table.
    pub fn invalidations(&self) -> u64 {
        self.counters.invalidations.load(Ordering::Relaxed)
    }

    /// If a check is due, reads the persistent commit counter and, when another process moved
    /// it, empties the volatile tier (under `writes`, so no promotion that read the persistent
    /// tier before the check inserts afterwards, and no writer of this process runs meanwhile).
    pub(crate) fn refresh(&self) -> Result<()> {
        let (Some(r), Some(p)) = (&self.refresh, &self.persistent) else { return Ok(()) };
        let now = r.start.elapsed().as_nanos() as u64;
        if now < r.next_check.load(Ordering::Acquire) {
            return Ok(());
        }
        if p.commits()? != r.seen.load(Ordering::Acquire) {
            let mut writes = lock::write(&self.writes);
            // Read again with this process's writers quiet: a difference now is foreign.
            let commits = p.commits()?;
            if commits != r.seen.load(Ordering::Acquire) {
                self.invalidate(&mut writes);
                r.seen.store(commits, Ordering::Release);
            }
        }
        let next = now.saturating_add(u64::try_from(r.interval.as_nanos()).unwrap_or(u64::MAX));
        r.next_check.fetch_max(next, Ordering::AcqRel);
        Ok(())
    }

    /// Empties the volatile tier for another process's commits (`writes` held exclusively).
    fn invalidate(&self, writes: &mut u64) {
        // A Redis tier is shared and kept current by every writer: nothing to drop.
        if let Some(Volatile::Local(v)) = &self.volatile {
            v.clear();
        }
        *writes += 1;
        self.counters.invalidations.fetch_add(1, Ordering::Relaxed);
    }

    /// After this process's write transaction `c` (with `writes` held exclusively): when it
    /// found a counter other than the one last seen, another process wrote in between, so the
    /// volatile tier is emptied first; then the counter this write left is the one seen.
    fn after_own_commit(&self, writes: &mut u64, c: Option<crate::storage::tier::persistent::Commit>) {
        let (Some(r), Some(c)) = (&self.refresh, c) else { return };
        if c.before != r.seen.load(Ordering::Acquire) {
            self.invalidate(writes);
        }
        r.seen.store(c.after, Ordering::Release);
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Rows the table holds: the persistent tier's count, else the volatile tier's.
    pub fn len(&self) -> usize {
        match (&self.persistent, &self.volatile) {
            (Some(p), _) => p.len().unwrap_or(0) as usize,
            (None, Some(Volatile::Local(v))) => v.len(),
            (None, Some(Volatile::Redis(r))) => r.len().unwrap_or(0) as usize,
            (None, None) => 0,
        }
    }

    /// Whether the table holds no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cumulative counters.
    pub fn stats(&self) -> TableStats {
        let c = &self.counters;
        let (v, unavailable) = match &self.volatile {
            Some(Volatile::Local(v)) => (Some(v.stats()), 0),
            Some(Volatile::Redis(r)) => {
                let rows = r.len().unwrap_or(0);
                let s = r.stats();
                let v = crate::storage::tier::volatile::VolatileStats {
                    evictions: s.evictions,
                    rows,
                    bytes: rows * (self.dim as u64) * 4,
                    ..Default::default()
                };
                (Some(v), s.unavailable)
            }
            None => (None, 0),
        };
        TableStats {
            volatile_unavailable: unavailable,
            lookups: c.lookups.load(Ordering::Relaxed),
            keys: c.keys.load(Ordering::Relaxed),
            volatile_hits: c.volatile_hits.load(Ordering::Relaxed),
            persistent_hits: c.persistent_hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            evictions: v.as_ref().map_or(0, |v| v.evictions),
            volatile_rows: v.as_ref().map_or(0, |v| v.rows),
            volatile_bytes: v.as_ref().map_or(0, |v| v.bytes),
            persistent_rows: self.persistent.as_ref().and_then(|p| p.len().ok()).unwrap_or(0),
            upserts: c.upserts.load(Ordering::Relaxed),
            erases: c.erases.load(Ordering::Relaxed),
        }
    }

    /// Resolves canonical `keys` through the tiers: float32 rows into `rows`
    /// (`keys.len() * dim`), whether each was found into `present`; promotes persistent hits
    /// to the volatile tier when the configuration asks. Returns (volatile hits, persistent
    /// hits). Missing keys' rows are left as they are.
    pub(crate) fn fetch(&self, keys: &[u64], rows: &mut [f32], present: &mut [bool], s: &mut TierScratch) -> Result<(u64, u64)> {
        let n = keys.len();
        let dim = self.dim;
        let (mut vh, mut ph) = (0, 0);
        present.fill(false);
        self.refresh()?;
        if let Some(v) = &self.volatile {
            vh = v.get_many(keys, rows, present);
        }
        if self.persistent.is_some() {
            s.missing.clear();
            s.missing.extend((0..n).filter(|&i| !present[i]));
            if !s.missing.is_empty() {
                let m = s.missing.len();
                s.miss_keys.clear();
                s.miss_keys.extend(s.missing.iter().map(|&i| keys[i]));
                s.miss_rows.resize(m * dim, 0.0);
                s.miss_found.clear();
                s.miss_found.resize(m, false);
                ph = self.read_persistent(&s.miss_keys, &mut s.miss_rows, &mut s.miss_found, &mut s.promote)?;
                for (j, &i) in s.missing.iter().enumerate() {
                    if s.miss_found[j] {
                        rows[i * dim..(i + 1) * dim].copy_from_slice(&s.miss_rows[j * dim..(j + 1) * dim]);
                        present[i] = true;
                    }
                }
            }
        }
        Ok((vh, ph))
    }

    /// Whether the table has a persistent tier.
    pub(crate) fn has_persistent(&self) -> bool {
        self.persistent.is_some()
    }

    /// With a Redis volatile tier, its keys per lookup batch (`max_get_batch_size`, one round
    /// trip per node); `None` for an in-process tier or none.
    pub(crate) fn redis_batch(&self) -> Option<usize> {
        match &self.volatile {
            Some(Volatile::Redis(r)) => Some(r.get_batch().max(1)),
            _ => None,
        }
    }

    /// Looks `keys` up in the volatile tier only (see [`VolatileTier::get_many`]); returns the
    /// hits. Without a volatile tier, finds nothing.
    pub(crate) fn fetch_volatile(&self, keys: &[u64], rows: &mut [f32], present: &mut [bool]) -> u64 {
        match &self.volatile {
            Some(v) => v.get_many(keys, rows, present),
            None => {
                present.fill(false);
                0
            }
        }
    }

    /// Reads `keys` from the persistent tier (one read transaction; sorted keys read fastest):
    /// rows into `rows` (`keys.len() * dim`), whether each was found into `found`, and promotes
    /// the rows found into the volatile tier when the configuration asks, unless a write of this
    /// process committed since the read began (so a promotion never puts back a row older than
    /// a committed write). Returns the hits. Without a persistent tier, finds nothing.
    pub(crate) fn read_persistent(&self, keys: &[u64], rows: &mut [f32], found: &mut [bool], s: &mut Promote) -> Result<u64> {
        let Some(t) = &self.persistent else {
            found.fill(false);
            return Ok(0);
        };
        let dim = self.dim;
        let before = *lock::read(&self.writes);
        // A Redis promotion is guarded by the partitions' write counters, read before the
        // persistent read (see storage::tier::redis).
        let gens = match &self.volatile {
            Some(Volatile::Redis(r)) if self.cache_missed => Some(r.generations(keys)),
            _ => None,
        };
        // Rows the volatile tier stores as the persistent tier does are promoted as stored.
        let same_format = t.format() == self.format;
        let promote_stored = same_format && self.cache_missed && matches!(&self.volatile, Some(Volatile::Local(_)));
        let row_bytes = self.format.row_bytes(dim);
        let (h, _) = if promote_stored {
            s.read.resize(keys.len() * row_bytes, 0);
            t.get_many_stored(keys, rows, Some(&mut s.read), found)?
        } else {
            t.get_many(keys, rows, found)?
        };
        #[cfg(test)]
        race::after_persistent_read(self);

        if self.cache_missed
            && h > 0
            && let Some(v) = &self.volatile
        {
            s.keys.clear();
            s.rows.clear();
            s.stored.clear();
            for (j, &k) in keys.iter().enumerate() {
                if found[j] {
                    s.keys.push(k);
                    if promote_stored {
                        s.stored.extend_from_slice(&s.read[j * row_bytes..(j + 1) * row_bytes]);
                    } else {
                        s.rows.extend_from_slice(&rows[j * dim..(j + 1) * dim]);
                    }
                }
            }
            match v {
                Volatile::Local(v) => {
                    let writes = lock::read(&self.writes);
                    if *writes == before {
                        if promote_stored {
                            v.insert_many_stored(&s.keys, &s.stored);
                        } else {
                            v.insert_many(&s.keys, &s.rows);
                        }
                    }
                }
                Volatile::Redis(r) => {
                    if let Some(g) = &gens {
                        r.promote(&s.keys, &s.rows, g);
                    }
                }
            }
        }
        // Rows of a persistent tier of another format were promoted as read; the caller gets
        // them as the table's format holds them.
        if !same_format {
            let mut scratch = Vec::new();
            for (j, row) in rows.chunks_exact_mut(dim).enumerate() {
                if found[j] {
                    // (A row the format cannot hold, from a file never checked, stays as read.)
                    let _ = round_trip(self.format, row, &mut scratch);
                }
            }
        }
        Ok(h)
    }

    /// Whether a missing key fails the lookup.
    pub(crate) fn missing_is_error(&self) -> bool {
        self.missing == MissingKey::Error
    }

    /// The default row (float32).
    pub(crate) fn default_row(&self) -> &[f32] {
        &self.default_row
    }

    /// Counts one successful lookup of `keys` keys.
    pub(crate) fn record_lookup(&self, keys: u64, volatile_hits: u64, persistent_hits: u64, misses: u64) {
        let c = &self.counters;
        c.lookups.fetch_add(1, Ordering::Relaxed);
        c.keys.fetch_add(keys, Ordering::Relaxed);
        c.volatile_hits.fetch_add(volatile_hits, Ordering::Relaxed);
        c.persistent_hits.fetch_add(persistent_hits, Ordering::Relaxed);
        c.misses.fetch_add(misses, Ordering::Relaxed);
    }

    /// Changes when rows are written or erased, here or (once noticed) by another process: GPU
    /// caches compare it at the start of each lookup to drop stale rows, so it first runs a due
    /// check for other processes' commits (an error there is left for the lookup's own read of
    /// the tiers to report).
    pub(crate) fn generation(&self) -> u64 {
        let _ = self.refresh();
        let c = &self.counters;
        c.upserts.load(Ordering::Relaxed) + c.erases.load(Ordering::Relaxed) + c.invalidations.load(Ordering::Relaxed)
    }

    /// Inserts or overwrites rows (`rows.len() == keys.len() * dim`): the persistent tier first
    /// (durable on return), then the volatile tier.
    ///
    /// With a Redis tier (see `storage::tier::redis`): the keys' Redis rows are deleted first
    /// (a failed node fails the upsert here, naming the node, before anything is committed),
    /// then the persistent commit, then the rows are written to Redis. A failure of that last
    /// step leaves the keys absent from Redis (lookups read the committed rows from the
    /// persistent tier) and the upsert succeeds; without a persistent tier it is the error.
    pub(crate) fn upsert(&self, keys: &[u64], rows: &[f32]) -> Result<()> {
        self.writable()?;
        if self.format.is_quantized() {
            let mut scratch = vec![0u8; self.format.row_bytes(self.dim)];
            for (i, row) in rows.chunks_exact(self.dim).enumerate() {
                quantize_row(self.format, row, &mut scratch).map_err(|m| {
                    Error::invalid("vectors", format!("row {i}: {m} (table {} stores {} rows)", self.name, self.format.name()))
                })?;
            }
        }
        let mut writes = lock::write(&self.writes);
        if let (Some(Volatile::Redis(r)), Some(_)) = (&self.volatile, &self.persistent) {
            r.invalidate(keys).map_err(|f| store_error(&self.name, f))?;
        }
        if let Some(p) = &self.persistent {
            let c = p.upsert_counted(keys, rows)?;
            self.after_own_commit(&mut writes, c);
        }
        match &self.volatile {
            Some(Volatile::Local(v)) => {
                v.insert_many(keys, rows);
            }
            Some(Volatile::Redis(r)) => {
                if let Err(f) = r.write(keys, rows)
                    && self.persistent.is_none()
                {
                    return Err(store_error(&self.name, f));
                }
            }
            None => {}
        }
        *writes += 1;
        drop(writes);
        self.counters.upserts.fetch_add(keys.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Removes keys from every tier; returns how many the table held. With a Redis tier the
    /// keys are deleted from Redis before (a failed node fails the erase there, naming it) and
    /// again after the persistent commit (a failure then is only counted).
    pub(crate) fn erase(&self, keys: &[u64]) -> Result<u64> {
        self.writable()?;
        let mut writes = lock::write(&self.writes);
        let mut from_redis = 0;
        if let Some(Volatile::Redis(r)) = &self.volatile {
            from_redis = r.invalidate(keys).map_err(|f| store_error(&self.name, f))?;
        }
        let from_persistent = match &self.persistent {
            Some(p) => {
                let (n, c) = p.erase_counted(keys)?;
                self.after_own_commit(&mut writes, c);
                Some(n)
            }
            None => None,
        };
        let from_volatile = match &self.volatile {
            Some(Volatile::Local(v)) => v.erase_many(keys),
            Some(Volatile::Redis(r)) => {
                if self.persistent.is_some() && r.invalidate(keys).is_err() {
                    r.note_late_failure();
                }
                from_redis
            }
            None => 0,
        };
        *writes += 1;
        drop(writes);
        let erased = from_persistent.unwrap_or(from_volatile);
        self.counters.erases.fetch_add(erased, Ordering::Relaxed);
        Ok(erased)
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Immutable {
                what: format!("table {}", self.name),
                why: "its persistent_db is read_only in the server configuration".into(),
            });
        }
        Ok(())
    }
}

/// Buffers of [`TieredTable::fetch`], reused across calls.
#[derive(Default)]
pub(crate) struct TierScratch {
    missing: Vec<usize>,
    miss_keys: Vec<u64>,
    miss_rows: Vec<f32>,
    miss_found: Vec<bool>,
    promote: Promote,
}

/// Buffers of [`TieredTable::read_persistent`]'s promotions, reused across calls.
#[derive(Default)]
pub(crate) struct Promote {
    keys: Vec<u64>,
    rows: Vec<f32>,
    /// Rows as the persistent tier stores them (when the volatile tier stores the same format).
    read: Vec<u8>,
    stored: Vec<u8>,
}

/// Test builds only: a hook between a promotion's persistent read and its volatile insert, so
/// that tests can force the promotion race without sleeps (the server's tests, which build
/// tiered tables from a configuration, use it).
#[cfg(test)]
pub(crate) mod race {
    use super::TieredTable;
    use std::cell::RefCell;

    /// A write to make between a promotion's persistent read and its volatile insert.
    type Hook = Box<dyn FnOnce(&TieredTable)>;

    thread_local! {
        /// Run once, on this thread, right after a promotion's persistent read.
        static HOOK: RefCell<Option<Hook>> = RefCell::new(None);
    }

    /// Makes `f` run once, on this thread, right after the next persistent read of a
    /// promotion's keys.
    pub(crate) fn after_next_persistent_read(f: impl FnOnce(&TieredTable) + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    /// Called by `read_persistent` (test builds only) after the persistent read of a chunk's
    /// misses.
    pub(super) fn after_persistent_read(t: &TieredTable) {
        if let Some(f) = HOOK.with(|h| h.borrow_mut().take()) {
            f(t);
        }
    }
}
