//! Lookups on a parameter server's tiered table, in rounds of at most [`ROUND`] keys, each in two
//! phases over the calling thread and pool workers:
//! 1. the volatile tier: keys in chunks of [`CHUNK`] (a Redis tier: of its `max_get_batch_size`,
//!    each one pipelined batch); hits are written into `out`, the other
//!    keys get the default row for now and are listed (key, flat index);
//! 2. the persistent tier: the listed keys of the whole round, sorted and deduplicated, read in
//!    runs of [`RUN`] keys (one LMDB read transaction each) and written over their default rows.
//!
//! Sorting the round's misses together is what makes the LMDB reads cheap: consecutive keys
//! share the B-tree's upper pages, which stay in cache (measured with the tiered benchmark's
//! data: 1.3-1.4 us of CPU per read against 2.0-2.3 us when each chunk of 512 keys read its own
//! ~70 misses).

use crate::error::{Error, Result};
use crate::exec::pool;
use crate::model::{LookupStats, Plan, Promote, TieredTable};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys per chunk of the volatile phase.
const CHUNK: usize = 512;
/// Fewest keys per Redis batch when a round is split over participants.
const REDIS_MIN: usize = 2048;
/// Distinct keys per persistent read (one read transaction).
const RUN: usize = 1024;
/// Most keys per round: bounds the memory of the miss list (24 bytes a miss).
const ROUND: usize = 1 << 18;

/// What one participant of a lookup found.
#[derive(Default)]
struct Found {
    volatile_hits: u64,
    persistent_hits: u64,
    misses: u64,
    first_miss: Option<(usize, u64)>,
}

impl Found {
    fn add(&mut self, f: Found) {
        self.volatile_hits += f.volatile_hits;
        self.persistent_hits += f.persistent_hits;
        self.misses += f.misses;
        self.first_miss = match (self.first_miss, f.first_miss) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        };
    }

    /// Counts `count` keys found nowhere, the first at flat index `index`.
    fn miss(&mut self, count: u64, index: usize, key: u64, is_error: bool) {
        self.misses += count;
        if is_error && self.first_miss.is_none_or(|(j, _)| index < j) {
            self.first_miss = Some((index, key));
        }
    }
}

impl TieredTable {
    /// Runs a validated lookup: volatile tier, then persistent tier, then the default row.
    pub(crate) fn lookup(&self, p: &Plan) -> Result<LookupStats> {
        self.refresh()?;
        let mut total = Found::default();
        let mut misses: Vec<(u64, usize)> = Vec::new();
        let mut lo = 0;
        while lo < p.n {
            let hi = (lo + ROUND).min(p.n);
            total.add(self.round(p, lo, hi, &mut misses)?);
            lo = hi;
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

    /// Looks up flat key indices `lo..hi` into `out` (both phases); `misses` is reused.
    fn round(&self, p: &Plan, lo: usize, hi: usize, misses: &mut Vec<(u64, usize)>) -> Result<Found> {
        let dim = self.dim();
        let n = hi - lo;
        // A Redis tier's chunk is a pipelined batch (one round trip per node): one per
        // participant at a time, so batches of several participants overlap.
        let (chunk, per_thread) = match self.redis_batch() {
            Some(b) => {
                // Split a round over the participants (batches of at least REDIS_MIN keys), so
                // one parses replies while the nodes answer another.
                let c = b.min(n.div_ceil(p.threads.max(1)).max(REDIS_MIN)).min(n).max(1);
                (c, c)
            }
            None => (CHUNK, CHUNK * 4),
        };
        let threads = p.threads.min(n.div_ceil(per_thread)).max(1);
        // Phase 1: the volatile tier.
        let next = AtomicUsize::new(lo);
        let parts = pool::run(threads, || {
            let mut s = Scratch::new(dim, chunk);
            let mut listed = Vec::new();
            let mut hits = 0;
            loop {
                let a = next.fetch_add(chunk, Ordering::Relaxed);
                if a >= hi {
                    break;
                }
                let b = (a + chunk).min(hi);
                let m = b - a;
                p.keys.read(a, &mut s.keys[..m], &mut s.offs[..m]);
                hits += self.fetch_volatile(&s.keys[..m], &mut s.rows[..m * dim], &mut s.present[..m]);
                // SAFETY: the plan validated out for every key index below p.n; b <= p.n.
                unsafe { p.out.write_f32_rows(a, dim, &s.rows[..m * dim], &s.present[..m], self.default_row(), &mut s.offs) };
                listed.extend((0..m).filter(|&i| !s.present[i]).map(|i| (s.keys[i], a + i)));
            }
            (hits, listed)
        });
        let mut found = Found::default();
        misses.clear();
        for (hits, listed) in parts {
            found.volatile_hits += hits;
            misses.extend(listed);
        }
        if misses.is_empty() {
            return Ok(found);
        }
        // Phase 2: the persistent tier, in key order, each distinct key read once.
        misses.sort_unstable();
        let is_error = self.missing_is_error();
        if !self.has_persistent() {
            let mut i = 0;
            while i < misses.len() {
                let j = group_end(misses, i);
                found.miss((j - i) as u64, misses[i].1, misses[i].0, is_error);
                i = j;
            }
            return Ok(found);
        }
        let starts: Vec<usize> = {
            let mut v = Vec::with_capacity(misses.len() + 1);
            let mut i = 0;
            while i < misses.len() {
                v.push(i);
                i = group_end(misses, i);
            }
            v.push(misses.len());
            v
        };
        let distinct = starts.len() - 1;
        let threads = p.threads.min(distinct.div_ceil(RUN)).max(1);
        let next = AtomicUsize::new(0);
        let misses = &*misses;
        let parts = pool::run(threads, || -> Result<Found> {
            let mut f = Found::default();
            let mut s = Scratch::new(dim, RUN);
            let mut promote = Promote::default();
            loop {
                let a = next.fetch_add(RUN, Ordering::Relaxed);
                if a >= distinct {
                    break;
                }
                let b = (a + RUN).min(distinct);
                let m = b - a;
                for (j, k) in s.keys[..m].iter_mut().enumerate() {
                    *k = misses[starts[a + j]].0;
                }
                let rows = &mut s.rows[..m * dim];
                self.read_persistent(&s.keys[..m], rows, &mut s.present[..m], &mut promote)?;
                for j in 0..m {
                    let group = &misses[starts[a + j]..starts[a + j + 1]];
                    if !s.present[j] {
                        f.miss(group.len() as u64, group[0].1, group[0].0, is_error);
                        continue;
                    }
                    f.persistent_hits += group.len() as u64;
                    for &(_, index) in group {
                        // SAFETY: the plan validated out for every key index below p.n, and
                        // index < hi <= p.n.
                        unsafe {
                            p.out.write_f32_rows(index, dim, &rows[j * dim..(j + 1) * dim], &[true], self.default_row(), &mut s.offs[..1])
                        };
                    }
                }
            }
            Ok(f)
        });
        for part in parts {
            found.add(part?);
        }
        Ok(found)
    }
}

/// The end of the run of entries of `sorted` that share `sorted[i]`'s key.
fn group_end(sorted: &[(u64, usize)], i: usize) -> usize {
    let key = sorted[i].0;
    let mut j = i + 1;
    while j < sorted.len() && sorted[j].0 == key {
        j += 1;
    }
    j
}

/// Per-participant buffers of a tiered lookup, reused across chunks.
struct Scratch {
    keys: Vec<u64>,
    offs: Vec<isize>,
    rows: Vec<f32>,
    present: Vec<bool>,
}

impl Scratch {
    fn new(dim: usize, n: usize) -> Self {
        Scratch { keys: vec![0; n], offs: vec![0; n], rows: vec![0.0; n * dim], present: vec![false; n] }
    }
}
