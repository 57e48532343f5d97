//! Lookups on a parameter server's tiered table: keys in chunks over the calling thread and pool
//! workers, each chunk resolved through the tiers ([`TieredTable::fetch`]) and written into
//! `out` with the default row for keys found nowhere.

use crate::error::{Error, Result};
use crate::exec::pool;
use crate::model::{LookupStats, Plan, TierScratch, TieredTable};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys per chunk of a tiered lookup.
const CHUNK: usize = 512;

/// What one participant of a lookup found.
#[derive(Default)]
struct Found {
    volatile_hits: u64,
    persistent_hits: u64,
    misses: u64,
    first_miss: Option<(usize, u64)>,
}

impl TieredTable {
    /// Runs a validated lookup: volatile tier, then persistent tier, then the default row.
    pub(crate) fn lookup(&self, p: &Plan) -> Result<LookupStats> {
        let by_tasks = p.n.div_ceil(CHUNK * 4).max(1);
        let threads = p.threads.min(by_tasks).max(1);
        let next = AtomicUsize::new(0);
        let parts = pool::run(threads, || {
            let mut found = Found::default();
            let mut scratch = Scratch::new(self.dim());
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
        self.record_lookup(p.n as u64, total.volatile_hits, total.persistent_hits, total.misses);
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
        let dim = self.dim();
        p.keys.read(lo, &mut s.keys[..n], &mut s.offs[..n]);
        let (vh, ph) = self.fetch(&s.keys[..n], &mut s.rows[..n * dim], &mut s.present[..n], &mut s.tiers)?;
        found.volatile_hits += vh;
        found.persistent_hits += ph;
        for i in 0..n {
            if !s.present[i] {
                found.misses += 1;
                if self.missing_is_error() && found.first_miss.is_none_or(|(j, _)| lo + i < j) {
                    found.first_miss = Some((lo + i, s.keys[i]));
                }
            }
        }
        // SAFETY: the plan validated out for every key index below p.n; hi <= p.n.
        unsafe { p.out.write_f32_rows(lo, dim, &s.rows[..n * dim], &s.present[..n], self.default_row(), &mut s.offs) };
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
