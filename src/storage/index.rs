//! The keyed index: 64-bit key -> row number, in at most 16 bytes per key.
//!
//! Open addressing over cache-line buckets: each 64-byte bucket holds up to five
//! (key, row) pairs, filled left to right; a key lives in the bucket its hash selects or,
//! when that one is full, in the next bucket with room (linear probing by bucket). The table
//! is sized for a load of at most 0.85 (`64 / (5 * 0.85) = 15.1` bytes per key). At that load
//! most buckets are full, so each bucket also records whether an insert ever passed over it:
//! a lookup stops at the first bucket that holds the key, has a free slot, or never
//! overflowed, and a missing key usually costs one cache line like a present one.
//!
//! Slots store `row + 1`, so zeroed memory is an empty index: the buckets live in anonymous
//! memory (huge-page advised when large) that needs no initialising pass.
//!
//! Built once, then read-only: any number of threads may look up at once.

use crate::error::{Error, Result};
use crate::util::hash::mix;

const SLOTS: usize = 5;
/// Keys a batched lookup ([`KeyIndex::get_batch`]) hashes and prefetches ahead of the one it
/// probes.
const BATCH_AHEAD: usize = 16;
const EMPTY: u32 = 0;
/// Highest load factor the index is built for.
const MAX_LOAD: f64 = 0.85;
/// Largest row number a keyed index can hold.
pub(crate) const MAX_ROWS: u64 = u32::MAX as u64 - 1;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Bucket {
    keys: [u64; SLOTS],
    rows: [u32; SLOTS],
    /// 1 once an insert found this bucket full and moved on to the next.
    overflowed: u32,
}

/// A read-only hash index from canonical 64-bit keys to row numbers.
pub struct KeyIndex {
    /// The buckets: `nb` of them at `map[start..]`.
    map: memmap2::MmapMut,
    start: usize,
    nb: usize,
    len: usize,
}

// SAFETY: the index owns its anonymous mapping outright and holds no thread-bound state, so
// it may move to and be dropped on any thread.
unsafe impl Send for KeyIndex {}
// SAFETY: the mapping is only written during `build` (through `&mut self`), before the index
// is shared; every `&self` method only reads it.
unsafe impl Sync for KeyIndex {}

impl KeyIndex {
    /// Builds an index over `keys`, where `keys[i]` is the key of row `i`.
    ///
    /// `value` turns a canonical key back into the caller's value for messages; `arg` names
    /// the argument the keys came from. Fails on a duplicate key or more than [`MAX_ROWS`] rows.
    pub fn build(keys: impl ExactSizeIterator<Item = u64>, value: impl Fn(u64) -> i128, arg: &'static str) -> Result<Self> {
        let n = keys.len();
        if n as u64 > MAX_ROWS {
            return Err(Error::invalid(arg, format!("{n} keys; a keyed table holds at most {MAX_ROWS} rows")));
        }
        let nb = ((n as f64 / (SLOTS as f64 * MAX_LOAD)).ceil() as usize).max(1);
        // Always leave at least one free slot so every probe sequence ends.
        let nb = if nb * SLOTS <= n { n / SLOTS + 1 } else { nb };
        let bytes = nb * std::mem::size_of::<Bucket>();
        let (map, start) = crate::util::memory::anon(bytes, "keyed index")?;
        let mut idx = KeyIndex { map, start, nb, len: 0 };
        for (row, key) in keys.enumerate() {
            idx.insert(key, row as u32).map_err(|first| Error::DuplicateKey {
                arg,
                key: value(key),
                first: first as u64,
                second: row as u64,
            })?;
        }
        Ok(idx)
    }

    fn buckets(&self) -> &[Bucket] {
        // SAFETY: the mapping holds nb zero-initialised (valid) buckets from `start`, which is
        // page-aligned (so aligned for Bucket).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.start) as *const Bucket, self.nb) }
    }

    fn buckets_mut(&mut self) -> &mut [Bucket] {
        // SAFETY: as in `buckets`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(self.start) as *mut Bucket, self.nb) }
    }

    /// Inserts a new key; on a duplicate returns the row already holding it.
    fn insert(&mut self, key: u64, row: u32) -> std::result::Result<(), u32> {
        let nb = self.nb;
        let mut b = self.home(key);
        loop {
            let bucket = &mut self.buckets_mut()[b];
            for s in 0..SLOTS {
                if bucket.rows[s] == EMPTY {
                    bucket.keys[s] = key;
                    bucket.rows[s] = row + 1;
                    self.len += 1;
                    return Ok(());
                }
                if bucket.keys[s] == key {
                    return Err(bucket.rows[s] - 1);
                }
            }
            bucket.overflowed = 1;
            b += 1;
            if b == nb {
                b = 0;
            }
        }
    }

    /// The bucket a key hashes to.
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        ((mix(key) as u128 * self.nb as u128) >> 64) as usize
    }

    /// The buckets as raw memory: their address and count (64 bytes each). The CUDA executor
    /// copies them to the device unchanged and probes them with the same hash.
    #[cfg(feature = "cuda")]
    pub(crate) fn raw_buckets(&self) -> (*const u8, usize) {
        (self.buckets().as_ptr() as *const u8, self.nb)
    }

    /// Hints the CPU to fetch the bucket `key` starts in.
    #[inline(always)]
    pub fn prefetch(&self, key: u64) {
        self.prefetch_bucket(self.home(key));
    }

    /// The row of `key`, if present. Each bucket's five keys are compared without branches
    /// into a match mask; slots fill left to right and are never emptied, so a match is a hit
    /// unless its slot is empty (a zero key matching an empty slot), and a bucket has a free
    /// slot exactly when its last one is free. The probe moves on only past full buckets that
    /// overflowed.
    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<usize> {
        self.get_from(self.home(key), key)
    }

    /// The rows of `keys` into `rows` (as long as `keys`), `absent` for a missing key: each
    /// key is hashed once and its bucket prefetched [`BATCH_AHEAD`] (16) keys before it is
    /// probed, so that many bucket misses are in flight at once.
    #[inline(always)]
    pub fn get_batch(&self, keys: &[u64], rows: &mut [usize], absent: usize) {
        const AHEAD: usize = BATCH_AHEAD;
        let n = keys.len().min(rows.len());
        let mut homes = [0usize; AHEAD];
        for (home, &key) in homes.iter_mut().zip(&keys[..n.min(AHEAD)]) {
            *home = self.home(key);
            self.prefetch_bucket(*home);
        }
        for i in 0..n {
            let home = homes[i % AHEAD];
            if i + AHEAD < n {
                let next = self.home(keys[i + AHEAD]);
                self.prefetch_bucket(next);
                homes[i % AHEAD] = next;
            }
            rows[i] = self.get_from(home, keys[i]).unwrap_or(absent);
        }
    }

    /// Hints the CPU to fetch bucket `b` (< nb).
    #[inline(always)]
    fn prefetch_bucket(&self, b: usize) {
        crate::util::prefetch(self.buckets().as_ptr().wrapping_add(b) as *const u8);
    }

    /// The row of `key`, probing from bucket `b` (its home).
    #[inline(always)]
    fn get_from(&self, mut b: usize, key: u64) -> Option<usize> {
        let nb = self.nb;
        let buckets = self.buckets();
        loop {
            // SAFETY: b < nb always (home() < nb; wraps below).
            let bucket = unsafe { buckets.get_unchecked(b) };
            let mut hit = 0u32;
            for s in 0..SLOTS {
                hit |= ((bucket.keys[s] == key) as u32) << s;
            }
            while hit != 0 {
                let row = bucket.rows[hit.trailing_zeros() as usize];
                if row != EMPTY {
                    return Some(row as usize - 1);
                }
                hit &= hit - 1;
            }
            if bucket.rows[SLOTS - 1] == EMPTY || bucket.overflowed == 0 {
                return None;
            }
            b += 1;
            if b == nb {
                b = 0;
            }
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of memory the index holds.
    pub fn bytes(&self) -> usize {
        self.nb * std::mem::size_of::<Bucket>()
    }

    /// Every (key, row) pair, in bucket order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.buckets()
            .iter()
            .flat_map(|b| (0..SLOTS).filter(move |&s| b.rows[s] != EMPTY).map(move |s| (b.keys[s], b.rows[s] as usize - 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state
    }

    #[test]
    fn finds_every_key_and_rejects_others() {
        for n in [0usize, 1, 4, 5, 6, 17, 1000, 100_000] {
            let mut s = n as u64 + 1;
            let mut keys: Vec<u64> = (0..n).map(|_| lcg(&mut s)).collect();
            keys.sort_unstable();
            keys.dedup();
            let idx = KeyIndex::build(keys.iter().copied(), |k| k as i128, "keys").unwrap();
            assert_eq!(idx.len(), keys.len());
            let set: std::collections::HashMap<u64, usize> = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
            for (i, &k) in keys.iter().enumerate() {
                assert_eq!(idx.get(k), Some(i));
            }
            for _ in 0..1000 {
                let k = lcg(&mut s);
                assert_eq!(idx.get(k), set.get(&k).copied());
            }
            let mut pairs: Vec<_> = idx.iter().collect();
            pairs.sort_by_key(|p| p.1);
            assert_eq!(pairs, keys.iter().copied().zip(0..).collect::<Vec<_>>());
            if n >= 1000 {
                let per_key = idx.bytes() as f64 / n as f64;
                assert!(per_key <= 16.0, "{per_key} bytes per key");
            }
        }
    }

    #[test]
    fn sequential_and_clustered_keys() {
        // Dense ranges and keys that share low bits must not pile up in one bucket.
        let keys: Vec<u64> = (1..50_000u64).map(|i| i << 20).chain(0..50_000).collect();
        let idx = KeyIndex::build(keys.iter().copied(), |k| k as i128, "keys").unwrap();
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(idx.get(k), Some(i));
        }
        assert_eq!(idx.get(u64::MAX), None);
    }

    #[test]
    fn zero_key_against_empty_slots_and_long_probe_chains() {
        // Key 0 equals the key field of every empty slot: only a stored 0 may be found. At the
        // index's full load many buckets overflow into the next one.
        for with_zero in [false, true] {
            let mut s = 99u64;
            let mut keys: Vec<u64> = (0..997).map(|_| lcg(&mut s) | 1).collect();
            if with_zero {
                keys[500] = 0;
            }
            keys.sort_unstable();
            keys.dedup();
            let idx = KeyIndex::build(keys.iter().copied(), |k| k as i128, "keys").unwrap();
            let reference: std::collections::HashMap<u64, usize> = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
            assert_eq!(idx.get(0), reference.get(&0).copied());
            for probe in keys.iter().copied().chain((0..5000).map(|_| lcg(&mut s))) {
                assert_eq!(idx.get(probe), reference.get(&probe).copied());
            }
        }
        // A single bucket: every probe starts and ends in it.
        let idx = KeyIndex::build([0u64, 5, 9].into_iter(), |k| k as i128, "keys").unwrap();
        assert_eq!((idx.get(0), idx.get(5), idx.get(9), idx.get(1)), (Some(0), Some(1), Some(2), None));
        let idx = KeyIndex::build([5u64].into_iter(), |k| k as i128, "keys").unwrap();
        assert_eq!((idx.get(0), idx.get(5)), (None, Some(0)));
    }

    #[test]
    fn batched_lookups_match_single_ones() {
        // Random keys, misses and repeats, in batches shorter and longer than the prefetch
        // distance, against a HashMap reference.
        let mut s = 5u64;
        let keys: Vec<u64> = (0..20_000).map(|_| lcg(&mut s)).collect();
        let idx = KeyIndex::build(keys.iter().copied(), |k| k as i128, "keys").unwrap();
        let reference: std::collections::HashMap<u64, usize> = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        for n in [0usize, 1, BATCH_AHEAD - 1, BATCH_AHEAD, BATCH_AHEAD + 1, 1000] {
            let probe: Vec<u64> = (0..n)
                .map(|i| match lcg(&mut s) % 4 {
                    0 => lcg(&mut s),
                    1 => keys[i % 3],
                    _ => keys[(lcg(&mut s) % 20_000) as usize],
                })
                .collect();
            let mut rows = vec![7usize; n];
            idx.get_batch(&probe, &mut rows, usize::MAX);
            let want: Vec<usize> = probe.iter().map(|k| reference.get(k).copied().unwrap_or(usize::MAX)).collect();
            assert_eq!(rows, want, "batch of {n}");
        }
    }

    #[test]
    fn duplicate_key_names_both_rows() {
        let e = KeyIndex::build([7u64, 8, 9, 8].into_iter(), |k| k as i128, "keys").err().unwrap();
        assert_eq!(e.to_string(), "keys: key 8 appears at rows 1 and 3; expected unique keys");
    }
}
