//! Parameter-server tables: a volatile in-memory tier in front of a persistent on-disk tier,
//! then the table's default value, as HPS looked rows up.
//!
//! A [`TieredTable`] is `Send + Sync`. Lookups may run on many threads while others upsert or
//! erase: each tier hands out whole rows (old or new, never a mix). An upsert is written to the
//! persistent tier (durably, one transaction) before the volatile tier, so an acknowledged
//! upsert survives a crash; readers may see the new row in the volatile tier only after that.

use crate::error::{Error, Result};
use crate::exec::pool;
use crate::lookup::{LookupStats, Plan};
use crate::table::MissingKey;
use crate::storage::tier::persistent::PersistentTable;
use crate::storage::tier::volatile::VolatileTier;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Keys per chunk of a tiered lookup.
const CHUNK: usize = 512;

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
}

/// A table of a parameter server: see the module docs.
pub struct TieredTable {
    /// `model/table`, for messages.
    pub(crate) name: String,
    dim: usize,
    volatile: Option<VolatileTier>,
    persistent: Option<PersistentTable>,
    /// Promote persistent-tier hits into the volatile tier (`cache_missed_embeddings`).
    cache_missed: bool,
    /// The persistent tier is read-only (`persistent_db.read_only`).
    read_only: bool,
    default_row: Vec<f32>,
    missing: MissingKey,
    counters: Counters,
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
}

/// What one participant of a lookup found.
#[derive(Default)]
struct Found {
    volatile_hits: u64,
    persistent_hits: u64,
    misses: u64,
    first_miss: Option<(usize, u64)>,
}

impl TieredTable {
    /// A table over the given tiers (at least one). `default_value` fills rows found nowhere.
    pub(crate) fn new(
        name: String,
        dim: usize,
        volatile: Option<VolatileTier>,
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
            counters: Counters::default(),
        }
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Rows the table holds: the persistent tier's count, else the volatile tier's.
    pub fn len(&self) -> usize {
        match (&self.persistent, &self.volatile) {
            (Some(p), _) => p.len().unwrap_or(0) as usize,
            (None, Some(v)) => v.len(),
            (None, None) => 0,
        }
    }

    /// Cumulative counters.
    pub fn stats(&self) -> TableStats {
        let c = &self.counters;
        let v = self.volatile.as_ref().map(|v| v.stats());
        TableStats {
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

    /// Runs a validated lookup: volatile tier, then persistent tier, then the default row.
    pub(crate) fn lookup(&self, p: &Plan) -> Result<LookupStats> {
        let by_tasks = p.n.div_ceil(CHUNK * 4).max(1);
        let threads = p.threads.min(by_tasks).max(1);
        let next = AtomicUsize::new(0);
        let parts = pool::run(threads, || {
            let mut found = Found::default();
            let mut scratch = Scratch::new(self.dim);
            loop {
                let lo = next.fetch_add(CHUNK, Ordering::Relaxed);
                if lo >= p.n {
                    break;
                }
                self.chunk(p, lo, (lo + CHUNK).min(p.n), &mut scratch, &mut found)?
            }
            Ok(found)
        });
        let mut total = Found::default();
        for part in parts {
            let f = part?;
            total.volatile_hits += f.volatile_hits;
            total.persistent_hits += f.persistent_hits;
            total.misses += f.misses;
            total.first_miss = match (total.first_miss, f.first_miss) {
                (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
                (a, b) => a.or(b),
            };
        }
        if let Some((index, key)) = total.first_miss {
            return Err(Error::KeyNotFound { key: p.key_dtype.value(key), index });
        }
        let c = &self.counters;
        c.lookups.fetch_add(1, Ordering::Relaxed);
        c.keys.fetch_add(p.n as u64, Ordering::Relaxed);
        c.volatile_hits.fetch_add(total.volatile_hits, Ordering::Relaxed);
        c.persistent_hits.fetch_add(total.persistent_hits, Ordering::Relaxed);
        c.misses.fetch_add(total.misses, Ordering::Relaxed);
        Ok(LookupStats {
            hits: total.volatile_hits + total.persistent_hits,
            misses: total.misses,
            volatile_hits: total.volatile_hits,
            persistent_hits: total.persistent_hits,
        })
    }

    /// Looks up flat key indices `lo..hi` into `out`.
    fn chunk(&self, p: &Plan, lo: usize, hi: usize, s: &mut Scratch, found: &mut Found) -> Result<()> {
        let n = hi - lo;
        let dim = self.dim;
        p.keys.read(lo, &mut s.keys[..n], &mut s.offs[..n]);
        let (vh, ph) = self.fetch(&s.keys[..n], &mut s.rows[..n * dim], &mut s.present[..n], &mut s.tiers)?;
        found.volatile_hits += vh;
        found.persistent_hits += ph;
        for i in 0..n {
            if !s.present[i] {
                found.misses += 1;
                if self.missing == MissingKey::Error && found.first_miss.is_none_or(|(j, _)| lo + i < j) {
                    found.first_miss = Some((lo + i, s.keys[i]));
                }
            }
        }
        // SAFETY: the plan validated out for every key index below p.n; hi <= p.n.
        unsafe { p.out.write_f32_rows(lo, dim, &s.rows[..n * dim], &s.present[..n], &self.default_row, &mut s.offs) };
        Ok(())
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
        if let Some(v) = &self.volatile {
            let (h, _) = v.get_many(keys, rows, present);
            vh = h;
        }
        if let Some(t) = &self.persistent {
            s.missing.clear();
            s.missing.extend((0..n).filter(|&i| !present[i]));
            if !s.missing.is_empty() {
                let m = s.missing.len();
                s.miss_keys.clear();
                s.miss_keys.extend(s.missing.iter().map(|&i| keys[i]));
                s.miss_rows.resize(m * dim, 0.0);
                s.miss_found.clear();
                s.miss_found.resize(m, false);
                let (h, _) = t.get_many(&s.miss_keys, &mut s.miss_rows, &mut s.miss_found)?;
                ph = h;
                for (j, &i) in s.missing.iter().enumerate() {
                    if s.miss_found[j] {
                        rows[i * dim..(i + 1) * dim].copy_from_slice(&s.miss_rows[j * dim..(j + 1) * dim]);
                        present[i] = true;
                    }
                }
                if self.cache_missed && h > 0
                    && let Some(v) = &self.volatile {
                        s.promote_keys.clear();
                        s.promote_rows.clear();
                        for (j, &k) in s.miss_keys.iter().enumerate() {
                            if s.miss_found[j] {
                                s.promote_keys.push(k);
                                s.promote_rows.extend_from_slice(&s.miss_rows[j * dim..(j + 1) * dim]);
                            }
                        }
                        v.insert_many(&s.promote_keys, &s.promote_rows);
                    }
            }
        }
        Ok((vh, ph))
    }

    /// Whether a missing key fails the lookup.
    pub(crate) fn missing_is_error(&self) -> bool {
        self.missing == MissingKey::Error
    }

    /// The default row (float32).
    pub(crate) fn default_row(&self) -> &[f32] {
        &self.default_row
    }

    /// Changes when rows are written or erased (GPU caches compare it to drop stale rows).
    pub(crate) fn generation(&self) -> u64 {
        self.counters.upserts.load(Ordering::Relaxed) + self.counters.erases.load(Ordering::Relaxed)
    }

    /// Inserts or overwrites rows (`rows.len() == keys.len() * dim`): the persistent tier first
    /// (durable on return), then the volatile tier.
    pub(crate) fn upsert(&self, keys: &[u64], rows: &[f32]) -> Result<()> {
        self.writable()?;
        if let Some(p) = &self.persistent {
            p.upsert(keys, rows)?;
        }
        if let Some(v) = &self.volatile {
            v.insert_many(keys, rows);
        }
        self.counters.upserts.fetch_add(keys.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Removes keys from every tier; returns how many the table held.
    pub(crate) fn erase(&self, keys: &[u64]) -> Result<u64> {
        self.writable()?;
        let from_persistent = match &self.persistent {
            Some(p) => Some(p.erase(keys)?),
            None => None,
        };
        let from_volatile = self.volatile.as_ref().map_or(0, |v| v.erase_many(keys));
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

/// Per-participant buffers of a tiered lookup, reused across chunks.
struct Scratch {
    keys: Vec<u64>,
    offs: Vec<isize>,
    rows: Vec<f32>,
    present: Vec<bool>,
    tiers: TierScratch,
}

impl Scratch {
    fn new(dim: usize) -> Self {
        Scratch {
            keys: vec![0; CHUNK],
            offs: vec![0; CHUNK],
            rows: vec![0.0; CHUNK * dim],
            present: vec![false; CHUNK],
            tiers: TierScratch::default(),
        }
    }
}

/// Buffers of [`TieredTable::fetch`], reused across calls.
#[derive(Default)]
pub(crate) struct TierScratch {
    missing: Vec<usize>,
    miss_keys: Vec<u64>,
    miss_rows: Vec<f32>,
    miss_found: Vec<bool>,
    promote_keys: Vec<u64>,
    promote_rows: Vec<f32>,
}
