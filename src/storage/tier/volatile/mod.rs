//! The volatile tier: a sharded in-memory hash map with bounded capacity and eviction.
//!
//! HPS's `volatile_db` of type `hash_map`: embedding rows (`dim` float32 values) keyed by
//! canonical 64-bit keys, spread over `num_partitions` shards by a hash of the key. A shard
//! holds at most `overflow_margin` rows; inserting a new key into a full shard first evicts
//! rows by the [`OverflowPolicy`] until the shard holds `overflow_resolution_target *
//! overflow_margin` rows (rounded down, and at most `overflow_margin - 1`), then inserts the
//! key, so a row always survives its own insert.
//!
//! # Layout of this module
//! - this file: the tier, its shards and their locks, batching keys by shard, counters;
//! - `slots`: the contents of one shard (rows, per-slot metadata, insert, erase, evict);
//! - `map`: a shard's key -> slot map;
//! - `evict`: the [`OverflowPolicy`] and the choice of the rows it evicts.
//!
//! # Memory layout (per shard)
//! - Rows live in a slab of fixed-size chunks (`Box<[f32]>`, about 256 KiB each, the last one
//!   cut so the shard never holds room for more than `overflow_margin` rows), indexed by a
//!   slot number; the slots of erased or evicted rows go on a free list and are reused before
//!   the slab grows. Chunks are never moved, so growing costs no copy.
//! - Per slot: its insertion stamp (`u32`, 0 = free slot; the order of inserts and
//!   overwrites, for [`OverflowPolicy::EvictOldest`] and the least-used policy's ties,
//!   renumbered in order when it would overflow) and its lookup count (`AtomicU16`,
//!   saturating, for [`OverflowPolicy::EvictLeastUsed`]): 6 bytes.
//! - A key -> slot map: open addressing with linear probing over 12-byte entries (key,
//!   slot + 1), at most 4/5 full, with backward-shift deletion (no tombstones). It doubles while
//!   it grows but stops at the size the shard's `overflow_margin` rows need, so a full shard's
//!   map costs 15 bytes a row. The key is kept only there: eviction walks the map.
//!
//! For 32-dim rows that is 128 bytes of row plus 6 of slot metadata plus 15 of map per row at
//! capacity: 1.17x the raw vectors full, 1.24x at 94% of capacity (where the tiered benchmark
//! reads it); for 128-dim rows 1.04x (the tests check the 1.25x bound at both widths).
//! [`VolatileTier::bytes`] reports the memory actually held.
//!
//! # Threading
//! [`VolatileTier`] is `Send + Sync`; every method takes `&self`. Each shard has one
//! [`RwLock`]: lookups share it (and copy the row while holding it, so a reader sees the
//! whole old row or the whole new row, never a mix), inserts and erases hold it exclusively.
//! A batched lookup runs a short software pipeline over each shard's keys (prefetching the map
//! entry two steps ahead and the found row one step ahead), and counts a use with a plain
//! load and store rather than a locked increment (a race may lose a count, never a row).
//! No call ever holds two shard locks at once. Batched calls sort each block of
//! `BLOCK` (1024) keys by shard and take each shard's lock once per block. A poisoned lock is
//! recovered (a panic inside this module cannot leave a shard half-updated in a way that
//! breaks memory safety, and a cache may always drop rows). Counters are atomics kept per
//! shard and summed on demand.

mod evict;
mod map;
mod slots;
#[cfg(test)]
mod tests;

pub use evict::OverflowPolicy;

use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::kernels::RowFormat;
// Keys are hashed with the keyed index's MurmurHash3 finaliser (`mix`): the shard comes from
// the high bits, the map position from the low bits.
use crate::util::hash::mix;
use crate::util::prefetch;
use slots::{Geometry, RowIn, Slots, Upsert};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Keys handled per lock acquisition in the batched calls: bounds how long a reader holds
/// a shard against writers (and the other way round).
pub(crate) const BLOCK: usize = 1024;
/// Keys between the stages of [`VolatileTier::visit_many`]'s pipeline.
const AHEAD: usize = 6;
/// Its ring of found slots (a power of two above `AHEAD`).
const RING: usize = 8;
/// No slot: the key is not held.
const NONE: u32 = u32::MAX;
/// Most shards a tier may have.
const MAX_PARTITIONS: usize = 1 << 20;

/// A snapshot of a tier's counters (cumulative since it was created) and size. Each field is
/// read atomically, but the fields are not one atomic snapshot while other threads work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolatileStats {
    /// Keys found by `get`, `get_many` and `visit_many`.
    pub hits: u64,
    /// Keys not found by them.
    pub misses: u64,
    /// New keys added by `insert_many` (overwrites are not counted here).
    pub insertions: u64,
    /// Rows of keys already present that `insert_many` replaced.
    pub overwrites: u64,
    /// Rows removed by `erase_many`.
    pub erasures: u64,
    /// Rows evicted to resolve overflows.
    pub evictions: u64,
    /// Rows held now (`insertions - erasures - evictions`, once writers are quiet).
    pub rows: u64,
    /// Bytes held now, as [`VolatileTier::bytes`].
    pub bytes: u64,
}

/// One shard: its lock and contents, plus counters readable without the lock. Aligned so
/// two shards never share a cache line.
#[repr(align(128))]
struct Shard {
    slots: RwLock<Slots>,
    /// Rows and bytes held, stored under the write lock after every change.
    len: AtomicUsize,
    bytes: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    insertions: AtomicU64,
    overwrites: AtomicU64,
    erasures: AtomicU64,
    evictions: AtomicU64,
}

impl Shard {
    fn read(&self) -> RwLockReadGuard<'_, Slots> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Slots> {
        self.slots.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the size after a change (called with the write lock held).
    fn publish(&self, s: &Slots, g: &Geometry) {
        self.len.store(s.len(), Relaxed);
        self.bytes.store(s.bytes(g), Relaxed);
    }
}

/// The volatile tier of one table: a bounded, sharded, concurrent cache of `dim`-float rows.
///
/// `Send + Sync`: share it (e.g. in an `Arc`) and call any method from any number of
/// threads at once. It owns all its memory; rows handed in are copied, rows handed out are
/// copied into the caller's buffer (or lent to a callback for the duration of a read lock).
pub struct VolatileTier {
    geo: Geometry,
    resolution_target: f64,
    /// The margin as configured (the one in `geo` is capped at `u32::MAX - 1`).
    overflow_margin: usize,
    shards: Box<[Shard]>,
}

impl VolatileTier {
    /// A tier of rows of `dim` floats in `num_partitions` shards of at most
    /// `overflow_margin` rows each (a margin above `u32::MAX - 1` is capped there), evicting
    /// by `policy` down to `resolution_target * overflow_margin` rows when a shard overflows.
    ///
    /// No row memory is allocated until rows are inserted. Errors ([`Error::Invalid`], naming
    /// the parameter): `dim == 0` (or absurdly large), `num_partitions` outside
    /// 1..=1048576, `overflow_margin == 0`, `resolution_target` outside (0, 1].
    pub fn new(dim: usize, num_partitions: usize, overflow_margin: usize, policy: OverflowPolicy, resolution_target: f64) -> Result<Self> {
        VolatileTier::stored_as(FloatDtype::F32.into(), dim, num_partitions, overflow_margin, policy, resolution_target)
    }

    /// [`VolatileTier::new`] with rows stored as `format`: rows go in and come out as `dim`
    /// float32 values; in between a slot holds the row converted or quantized (int8 rows take
    /// `dim + 8` bytes, rounded up to 4: about 3.5x the rows of float32 in the same memory at
    /// dim 64). A row comes out as `format` holds it (dequantized); a row it cannot hold (NaN
    /// or infinite values for quantized formats) is not cached.
    pub fn stored_as(
        format: RowFormat,
        dim: usize,
        num_partitions: usize,
        overflow_margin: usize,
        policy: OverflowPolicy,
        resolution_target: f64,
    ) -> Result<Self> {
        if let Some(m) = format.check_dim(dim) {
            return Err(Error::invalid("dim", m));
        }
        if dim == 0 {
            return Err(Error::invalid("dim", "0; expected at least 1 element per row"));
        }
        if dim > (isize::MAX as usize) / (4 * std::mem::size_of::<f32>()) {
            return Err(Error::invalid("dim", format!("{dim}; a row of that many floats overflows the address space")));
        }
        if num_partitions == 0 || num_partitions > MAX_PARTITIONS {
            return Err(Error::invalid("num_partitions", format!("{num_partitions}; expected between 1 and {MAX_PARTITIONS}")));
        }
        if overflow_margin == 0 {
            return Err(Error::invalid("overflow_margin", "0; expected at least 1 row per partition"));
        }
        if !(resolution_target > 0.0 && resolution_target <= 1.0) {
            return Err(Error::invalid("overflow_resolution_target", format!("{resolution_target}; expected a fraction in (0, 1]")));
        }
        let geo = Geometry::new(format, dim, overflow_margin, policy, resolution_target);
        let shards = (0..num_partitions)
            .map(|i| Shard {
                slots: RwLock::new(Slots::new(&geo, 0x5eed_0000_0000_0000 ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))),
                len: AtomicUsize::new(0),
                bytes: AtomicUsize::new(0),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                insertions: AtomicU64::new(0),
                overwrites: AtomicU64::new(0),
                erasures: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
            })
            .collect();
        Ok(VolatileTier { geo, resolution_target, overflow_margin, shards })
    }

    /// Floats per row.
    pub fn dim(&self) -> usize {
        self.geo.dim
    }

    /// How slots store rows.
    pub fn format(&self) -> RowFormat {
        self.geo.format
    }

    /// Number of shards.
    pub fn num_partitions(&self) -> usize {
        self.shards.len()
    }

    /// Most rows per shard, as configured.
    pub fn overflow_margin(&self) -> usize {
        self.overflow_margin
    }

    /// The eviction policy.
    pub fn policy(&self) -> OverflowPolicy {
        self.geo.policy
    }

    /// The fraction of `overflow_margin` a full shard evicts down to.
    pub fn resolution_target(&self) -> f64 {
        self.resolution_target
    }

    /// Most rows the tier can hold: `num_partitions * overflow_margin` (saturating).
    pub fn capacity(&self) -> usize {
        self.shards.len().saturating_mul(self.geo.margin)
    }

    #[inline(always)]
    fn shard_of(&self, key: u64) -> usize {
        ((mix(key) as u128 * self.shards.len() as u128) >> 64) as usize
    }

    /// Calls `f(shard, indices)` for each run of keys that share a shard, a block of
    /// [`BLOCK`] keys at a time; indices within a run are in increasing order.
    fn for_each_shard_run(&self, keys: &[u64], mut f: impl FnMut(&Shard, &[usize])) {
        let mut order: Vec<u64> = Vec::with_capacity(keys.len().min(BLOCK));
        let mut idx: Vec<usize> = Vec::with_capacity(keys.len().min(BLOCK));
        for (b, block) in keys.chunks(BLOCK).enumerate() {
            let base = b * BLOCK;
            if self.shards.len() == 1 {
                idx.clear();
                idx.extend(base..base + block.len());
                f(&self.shards[0], &idx);
                continue;
            }
            order.clear();
            order.extend(block.iter().enumerate().map(|(i, &k)| (self.shard_of(k) as u64) << 32 | i as u64));
            order.sort_unstable();
            let mut start = 0;
            while start < order.len() {
                let shard = order[start] >> 32;
                let mut end = start + 1;
                while end < order.len() && order[end] >> 32 == shard {
                    end += 1;
                }
                idx.clear();
                idx.extend(order[start..end].iter().map(|&o| base + (o as u32) as usize));
                f(&self.shards[shard as usize], &idx);
                start = end;
            }
        }
    }

    /// Copies the row of `key` into `dst` and returns true (a hit, and one use of the row for
    /// [`OverflowPolicy::EvictLeastUsed`]), or returns false (a miss) and leaves `dst` alone.
    ///
    /// Safe with concurrent inserts and erases: the copy is made under the shard's read
    /// lock, so it is the whole old row or the whole new row. Panics if `dst.len() != dim`.
    pub fn get(&self, key: u64, dst: &mut [f32]) -> bool {
        assert_eq!(dst.len(), self.geo.dim, "VolatileTier::get: dst holds {} floats; expected dim", dst.len());
        let shard = &self.shards[self.shard_of(key)];
        let s = shard.read();
        match s.find(key, mix(key)) {
            Some(slot) => {
                self.geo.decode(s.row(&self.geo, slot), dst);
                s.touch(slot);
                drop(s);
                shard.hits.fetch_add(1, Relaxed);
                true
            }
            None => {
                drop(s);
                shard.misses.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// Looks up every key and calls `f(i, Some(row))` for a hit on `keys[i]` or `f(i, None)`
    /// for a miss; returns (hits, misses). Each key is visited exactly once, grouped by shard
    /// (not in index order). `f` runs while the key's shard is read-locked, so the row it
    /// sees is consistent; it must not call back into this tier's writers (that deadlocks)
    /// and should be short. Runs on the calling thread only.
    pub fn visit_many(&self, keys: &[u64], mut f: impl FnMut(usize, Option<&[f32]>)) -> (u64, u64) {
        let g = &self.geo;
        let (mut hits, mut misses) = (0u64, 0u64);
        // Rows of a converted or quantized tier are decoded here, one at a time.
        let mut decoded = vec![0f32; if g.plain() { 0 } else { g.dim }];
        self.for_each_shard_run(keys, |shard, idx| {
            let (mut h, mut m) = (0u64, 0u64);
            {
                let s = shard.read();
                // A software pipeline over the run: the map entry of key n + 2 * AHEAD is
                // prefetched, key n + AHEAD is found and its row and count prefetched, and key
                // n is handed to `f`, so the three cache misses of a hit overlap across keys.
                let mut ring = [NONE; RING];
                let resolve = |n: usize, ring: &mut [u32; RING]| {
                    let key = keys[idx[n]];
                    let slot = s.find(key, mix(key)).unwrap_or(NONE);
                    if slot != NONE {
                        s.prefetch_slot(g, slot);
                    }
                    ring[n % RING] = slot;
                };
                for n in 0..idx.len().min(2 * AHEAD) {
                    prefetch(s.probe_start(mix(keys[idx[n]])));
                }
                for n in 0..idx.len().min(AHEAD) {
                    resolve(n, &mut ring);
                }
                for (n, &i) in idx.iter().enumerate() {
                    if let Some(&j) = idx.get(n + 2 * AHEAD) {
                        prefetch(s.probe_start(mix(keys[j])));
                    }
                    if n + AHEAD < idx.len() {
                        resolve(n + AHEAD, &mut ring);
                    }
                    match ring[n % RING] {
                        NONE => {
                            f(i, None);
                            m += 1;
                        }
                        slot => {
                            s.touch(slot);
                            if g.plain() {
                                f(i, Some(s.row(g, slot)));
                            } else {
                                g.decode(s.row(g, slot), &mut decoded);
                                f(i, Some(&decoded));
                            }
                            h += 1;
                        }
                    }
                }
            }
            if h > 0 {
                shard.hits.fetch_add(h, Relaxed);
            }
            if m > 0 {
                shard.misses.fetch_add(m, Relaxed);
            }
            hits += h;
            misses += m;
        });
        (hits, misses)
    }

    /// Batched [`get`](Self::get): for each `keys[i]` found, copies its row into
    /// `out[i * dim..(i + 1) * dim]` and sets `found[i] = true`; for a miss sets
    /// `found[i] = false` and leaves that part of `out` alone. Returns (hits, misses).
    /// Runs on the calling thread; split the batch over threads to parallelise.
    /// Panics if `out.len() != keys.len() * dim` or `found.len() != keys.len()`.
    pub fn get_many(&self, keys: &[u64], out: &mut [f32], found: &mut [bool]) -> (u64, u64) {
        let dim = self.geo.dim;
        assert_eq!(out.len(), keys.len() * dim, "VolatileTier::get_many: out length; expected keys.len() * dim");
        assert_eq!(found.len(), keys.len(), "VolatileTier::get_many: found length; expected keys.len()");
        self.visit_many(keys, |i, row| match row {
            Some(r) => {
                out[i * dim..(i + 1) * dim].copy_from_slice(r);
                found[i] = true;
            }
            None => found[i] = false,
        })
    }

    /// Inserts or overwrites rows: `keys[i]` gets `rows[i * dim..(i + 1) * dim]` (copied).
    /// A key given twice ends with its last row. A new key in a full shard first makes that
    /// shard evict by the policy down to the resolution target. Returns the number of rows
    /// evicted. Writers to one shard are serialised; readers of that shard wait for the
    /// current block (at most `BLOCK` = 1024 keys). If memory for a new row cannot be
    /// allocated the row is silently not cached. Panics if `rows.len() != keys.len() * dim`.
    pub fn insert_many(&self, keys: &[u64], rows: &[f32]) -> u64 {
        let dim = self.geo.dim;
        assert_eq!(rows.len(), keys.len() * dim, "VolatileTier::insert_many: rows length; expected keys.len() * dim");
        self.insert_rows(keys, |i| RowIn::Values(&rows[i * dim..(i + 1) * dim]))
    }

    /// [`insert_many`](Self::insert_many) of rows already in the tier's [`format`](Self::format)
    /// (`format().row_bytes(dim)` bytes each, back to back, e.g. as a persistent tier of the
    /// same format stores them), kept exactly as given. Panics if `rows` is not `keys.len()`
    /// such rows.
    pub fn insert_many_stored(&self, keys: &[u64], rows: &[u8]) -> u64 {
        let row_bytes = self.geo.format.row_bytes(self.geo.dim);
        assert_eq!(rows.len(), keys.len() * row_bytes, "VolatileTier::insert_many_stored: rows length; expected keys.len() * row bytes");
        self.insert_rows(keys, |i| RowIn::Stored(&rows[i * row_bytes..(i + 1) * row_bytes]))
    }

    /// Inserts or overwrites `keys[i]` with `row(i)` (see [`insert_many`](Self::insert_many)).
    fn insert_rows<'a>(&self, keys: &[u64], row: impl Fn(usize) -> RowIn<'a>) -> u64 {
        let g = &self.geo;
        let mut total = 0u64;
        self.for_each_shard_run(keys, |shard, idx| {
            let (mut ins, mut over, mut ev) = (0u64, 0u64, 0u64);
            {
                let mut s = shard.write();
                for &i in idx {
                    match s.upsert(g, keys[i], row(i)) {
                        Upsert::Inserted { evicted } => {
                            ins += 1;
                            ev += evicted;
                        }
                        Upsert::Overwritten => over += 1,
                        Upsert::Dropped { evicted } => ev += evicted,
                    }
                }
                shard.publish(&s, g);
            }
            shard.insertions.fetch_add(ins, Relaxed);
            shard.overwrites.fetch_add(over, Relaxed);
            shard.evictions.fetch_add(ev, Relaxed);
            total += ev;
        });
        total
    }

    /// Removes the rows of `keys` that are present; returns how many were removed. Their
    /// memory stays with the shard for reuse by later inserts.
    pub fn erase_many(&self, keys: &[u64]) -> u64 {
        let g = &self.geo;
        let mut total = 0u64;
        self.for_each_shard_run(keys, |shard, idx| {
            let mut n = 0u64;
            {
                let mut s = shard.write();
                for &i in idx {
                    let key = keys[i];
                    if let Some(slot) = s.find(key, mix(key)) {
                        s.remove(key, slot);
                        n += 1;
                    }
                }
                shard.publish(&s, g);
            }
            shard.erasures.fetch_add(n, Relaxed);
            total += n;
        });
        total
    }

    /// Removes every row and returns how many were removed (counted as erasures). Each shard
    /// is emptied under its write lock, one shard at a time, and gives its row memory back; a
    /// row inserted into an already emptied shard meanwhile stays.
    pub fn clear(&self) -> u64 {
        let g = &self.geo;
        let mut total = 0u64;
        for (i, shard) in self.shards.iter().enumerate() {
            let n = {
                let mut s = shard.write();
                let n = s.len() as u64;
                *s = Slots::new(g, 0x5eed_0000_0000_0000 ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n);
                shard.publish(&s, g);
                n
            };
            shard.erasures.fetch_add(n, Relaxed);
            total += n;
        }
        total
    }

    /// Whether `key` is held now (neither a hit nor a miss, nor a use).
    pub fn contains(&self, key: u64) -> bool {
        self.shards[self.shard_of(key)].read().find(key, mix(key)).is_some()
    }

    /// Rows held now (lock-free; exact when no writer is running).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len.load(Relaxed)).sum()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the tier holds: the struct, its shards, their key maps, row chunks,
    /// slot metadata and free lists (allocated capacity, not just what is in use).
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.shards.len() * std::mem::size_of::<Shard>()
            + self.shards.iter().map(|s| s.bytes.load(Relaxed)).sum::<usize>()
    }

    /// The counters and size now.
    pub fn stats(&self) -> VolatileStats {
        let sum = |f: fn(&Shard) -> &AtomicU64| self.shards.iter().map(|s| f(s).load(Relaxed)).sum::<u64>();
        VolatileStats {
            hits: sum(|s| &s.hits),
            misses: sum(|s| &s.misses),
            insertions: sum(|s| &s.insertions),
            overwrites: sum(|s| &s.overwrites),
            erasures: sum(|s| &s.erasures),
            evictions: sum(|s| &s.evictions),
            rows: self.len() as u64,
            bytes: self.bytes() as u64,
        }
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<VolatileTier>();
};
