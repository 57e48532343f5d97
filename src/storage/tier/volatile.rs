//! The volatile tier: a sharded in-memory hash map with bounded capacity and eviction.
//!
//! HPS's `volatile_db` of type `hash_map`: embedding rows (`dim` float32 values) keyed by
//! canonical 64-bit keys, spread over `num_partitions` shards by a hash of the key. A shard
//! holds at most `overflow_margin` rows; inserting a new key into a full shard first evicts
//! rows by the [`OverflowPolicy`] until the shard holds `overflow_resolution_target *
//! overflow_margin` rows (rounded down, and at most `overflow_margin - 1`), then inserts the
//! key, so a row always survives its own insert.
//!
//! # Memory layout (per shard)
//! - Rows live in a slab of fixed-size chunks (`Box<[f32]>`, about 256 KiB each, the last one
//!   cut so the shard never holds room for more than `overflow_margin` rows), indexed by a
//!   slot number; the slots of erased or evicted rows go on a free list and are reused before
//!   the slab grows. Chunks are never moved, so growing costs no copy.
//! - Per slot: its key (`u64`), its insertion sequence (`u64`, 0 = free slot; for
//!   [`OverflowPolicy::EvictOldest`]) and its lookup count (`AtomicU32`, for
//!   [`OverflowPolicy::EvictLeastUsed`]).
//! - A key -> slot map: open addressing with linear probing over 12-byte entries (key,
//!   slot + 1), a power-of-two table kept at most 3/4 full, with backward-shift deletion (no
//!   tombstones).
//!
//! For 128-dim rows that is 512 bytes of row plus 20 bytes of slot metadata plus 16-32 bytes
//! of map per row: about 1.07x the raw vectors when full (measured in the tests; the target is
//! at most 1.25x). [`VolatileTier::bytes`] reports the memory actually held.
//!
//! # Threading
//! [`VolatileTier`] is `Send + Sync`; every method takes `&self`. Each shard has one
//! [`RwLock`]: lookups share it (and copy the row while holding it, so a reader sees the
//! whole old row or the whole new row, never a mix), inserts and erases hold it exclusively.
//! No call ever holds two shard locks at once. Batched calls sort each block of
//! [`BLOCK`] keys by shard and take each shard's lock once per block. A poisoned lock is
//! recovered (a panic inside this module cannot leave a shard half-updated in a way that
//! breaks memory safety, and a cache may always drop rows). Counters are atomics kept per
//! shard and summed on demand.

// Keys are hashed with the keyed index's MurmurHash3 finaliser (`mix`): the shard comes from
// the high bits, the map position from the low bits.
use crate::util::hash::mix;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Target size of one slab chunk.
const CHUNK_BYTES: usize = 256 << 10;
/// Keys handled per lock acquisition in the batched calls: bounds how long a reader holds
/// a shard against writers (and the other way round).
pub(crate) const BLOCK: usize = 1024;
/// Most rows one shard can index (slots are `u32`, stored as `slot + 1`).
const MAX_ROWS_PER_SHARD: usize = u32::MAX as usize - 1;
/// Most shards a tier may have.
const MAX_PARTITIONS: usize = 1 << 20;
/// Smallest key-map table.
const MIN_TABLE: usize = 16;
/// Lookup counters stop counting here (so concurrent increments can never wrap).
const USE_SATURATION: u32 = u32::MAX - (1 << 16);

/// Which rows a full shard evicts: HPS's `volatile_db.overflow_policy`, also the parsed
/// configuration's value (`config::VolatileDbConfig::overflow_policy`). Deserialises from HPS's
/// names and its parser's aliases (`random`, `least_used`, `oldest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// `"evict_random"` (HPS's default): uniformly random rows.
    #[serde(alias = "random")]
    EvictRandom,
    /// `"evict_least_used"`: the rows looked up the fewest times since they were inserted (an
    /// overwrite keeps the count); ties go to the oldest row.
    #[serde(alias = "least_used")]
    EvictLeastUsed,
    /// `"evict_oldest"`: the rows inserted or last overwritten earliest.
    #[serde(alias = "oldest")]
    EvictOldest,
}

impl OverflowPolicy {
    /// HPS's name for the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            OverflowPolicy::EvictRandom => "evict_random",
            OverflowPolicy::EvictLeastUsed => "evict_least_used",
            OverflowPolicy::EvictOldest => "evict_oldest",
        }
    }
}

impl std::fmt::Display for OverflowPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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


/// One key-map entry: a key and `slot + 1` (0 = empty), 12 bytes.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Entry {
    lo: u32,
    hi: u32,
    slot1: u32,
}

impl Entry {
    #[inline(always)]
    fn key(self) -> u64 {
        (self.hi as u64) << 32 | self.lo as u64
    }
}

/// Open-addressing key -> slot map with linear probing, at most 3/4 full.
struct Table {
    entries: Vec<Entry>,
    mask: usize,
    len: usize,
}

impl Table {
    fn new() -> Self {
        Table { entries: Vec::new(), mask: 0, len: 0 }
    }

    /// The slot of `key` (`h = mix(key)`).
    #[inline]
    fn find(&self, key: u64, h: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mut i = h as usize & self.mask;
        loop {
            let e = self.entries[i];
            if e.slot1 == 0 {
                return None;
            }
            if e.key() == key {
                return Some(e.slot1 - 1);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Makes room for one more key; false when the bigger table cannot be allocated.
    fn reserve_one(&mut self) -> bool {
        let need = self.len + 1;
        if need * 4 <= self.entries.len() * 3 {
            return true;
        }
        let mut cap = (self.entries.len() * 2).max(MIN_TABLE);
        while need * 4 > cap * 3 {
            cap *= 2;
        }
        let mut entries = Vec::new();
        if entries.try_reserve_exact(cap).is_err() {
            return false;
        }
        entries.resize(cap, Entry::default());
        let old = std::mem::replace(&mut self.entries, entries);
        self.mask = cap - 1;
        for e in old {
            if e.slot1 != 0 {
                self.place(e, mix(e.key()));
            }
        }
        true
    }

    /// Puts an entry whose key is absent into the first free position of its probe sequence.
    #[inline]
    fn place(&mut self, e: Entry, h: u64) {
        let mut i = h as usize & self.mask;
        while self.entries[i].slot1 != 0 {
            i = (i + 1) & self.mask;
        }
        self.entries[i] = e;
    }

    /// Adds an absent key; [`Table::reserve_one`] must have succeeded first.
    fn insert_new(&mut self, key: u64, h: u64, slot: u32) {
        debug_assert!(self.find(key, h).is_none());
        debug_assert!((self.len + 1) * 4 <= self.entries.len() * 3);
        self.place(Entry { lo: key as u32, hi: (key >> 32) as u32, slot1: slot + 1 }, h);
        self.len += 1;
    }

    /// Removes `key` and returns its slot. Backward-shift deletion: later entries of the
    /// probe run move back into the hole when their home position allows it.
    fn remove(&mut self, key: u64, h: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask;
        let mut i = h as usize & mask;
        loop {
            let e = self.entries[i];
            if e.slot1 == 0 {
                return None;
            }
            if e.key() == key {
                break;
            }
            i = (i + 1) & mask;
        }
        let slot = self.entries[i].slot1 - 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let e = self.entries[j];
            if e.slot1 == 0 {
                break;
            }
            let home = mix(e.key()) as usize & mask;
            // `e` may fill the hole at `i` when `i` lies on its probe path (home ..= j).
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(i) & mask) {
                self.entries[i] = e;
                i = j;
            }
        }
        self.entries[i] = Entry::default();
        self.len -= 1;
        Some(slot)
    }

    fn bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }
}

/// The fixed shape of every shard.
#[derive(Clone, Copy)]
struct Geometry {
    dim: usize,
    /// log2 of the rows in a full chunk.
    shift: u32,
    /// Most rows per shard.
    margin: usize,
    /// Rows a full shard evicts down to before inserting a new key (< margin).
    resolve_to: usize,
    policy: OverflowPolicy,
}

/// The contents of one shard (behind its lock).
struct Slots {
    map: Table,
    /// Chunk `c` holds slots `c << shift ..`; every chunk but the last is full size.
    chunks: Vec<Box<[f32]>>,
    /// Slots backed by chunks.
    allocated: usize,
    /// Per slot ever handed out (`len` = high-water mark): key, sequence (0 = free), uses.
    keys: Vec<u64>,
    seq: Vec<u64>,
    uses: Vec<AtomicU32>,
    /// Free slots below the high-water mark.
    free: Vec<u32>,
    next_seq: u64,
    /// splitmix64 state for [`OverflowPolicy::EvictRandom`].
    rng: u64,
}

/// What inserting one row did.
enum Upsert {
    Inserted { evicted: u64 },
    Overwritten,
    /// Memory for the row could not be allocated; the row is not cached.
    Dropped { evicted: u64 },
}

impl Slots {
    fn new(seed: u64) -> Self {
        Slots {
            map: Table::new(),
            chunks: Vec::new(),
            allocated: 0,
            keys: Vec::new(),
            seq: Vec::new(),
            uses: Vec::new(),
            free: Vec::new(),
            next_seq: 1,
            rng: seed,
        }
    }

    #[inline(always)]
    fn row(&self, g: &Geometry, slot: u32) -> &[f32] {
        let s = slot as usize;
        let off = (s & ((1 << g.shift) - 1)) * g.dim;
        &self.chunks[s >> g.shift][off..off + g.dim]
    }

    #[inline(always)]
    fn row_mut(&mut self, g: &Geometry, slot: u32) -> &mut [f32] {
        let s = slot as usize;
        let off = (s & ((1 << g.shift) - 1)) * g.dim;
        &mut self.chunks[s >> g.shift][off..off + g.dim]
    }

    /// Counts a lookup of `slot` (under the read lock).
    #[inline(always)]
    fn touch(&self, slot: u32) {
        let u = &self.uses[slot as usize];
        if u.load(Relaxed) < USE_SATURATION {
            u.fetch_add(1, Relaxed);
        }
    }

    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A slot for a new row: a freed one, the next one of the slab, or a new chunk's first.
    /// `None` when the memory cannot be allocated.
    fn alloc_slot(&mut self, g: &Geometry) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        let s = self.keys.len();
        if s == self.allocated {
            let rows = (1usize << g.shift).min(g.margin - self.allocated);
            if rows == 0 {
                return None;
            }
            let mut chunk: Vec<f32> = Vec::new();
            chunk.try_reserve_exact(rows * g.dim).ok()?;
            chunk.resize(rows * g.dim, 0.0);
            let more = self.allocated + rows - self.keys.len();
            self.chunks.try_reserve(1).ok()?;
            self.keys.try_reserve_exact(more).ok()?;
            self.seq.try_reserve_exact(more).ok()?;
            self.uses.try_reserve_exact(more).ok()?;
            self.chunks.push(chunk.into_boxed_slice());
            self.allocated += rows;
        }
        self.keys.push(0);
        self.seq.push(0);
        self.uses.push(AtomicU32::new(0));
        Some(s as u32)
    }

    /// Removes the row in `slot` and frees the slot.
    fn remove_slot(&mut self, slot: u32) {
        let s = slot as usize;
        let key = self.keys[s];
        let removed = self.map.remove(key, mix(key));
        debug_assert_eq!(removed, Some(slot));
        self.seq[s] = 0;
        self.uses[s].store(0, Relaxed);
        self.free.push(slot);
    }

    /// Evicts rows by the policy until at most `to` remain; returns how many went.
    fn evict_to(&mut self, g: &Geometry, to: usize) -> u64 {
        let live = self.map.len;
        if live <= to {
            return 0;
        }
        let k = live - to;
        let mut cand: Vec<u32> = (0..self.keys.len() as u32).filter(|&s| self.seq[s as usize] != 0).collect();
        debug_assert_eq!(cand.len(), live);
        match g.policy {
            OverflowPolicy::EvictRandom => {
                // Partial Fisher-Yates: the first k candidates become a uniform sample.
                for i in 0..k {
                    let n = (cand.len() - i) as u64;
                    let j = i + ((self.next_random() as u128 * n as u128) >> 64) as usize;
                    cand.swap(i, j);
                }
            }
            OverflowPolicy::EvictOldest => {
                if k < cand.len() {
                    let seq = &self.seq;
                    cand.select_nth_unstable_by_key(k - 1, |&s| seq[s as usize]);
                }
            }
            OverflowPolicy::EvictLeastUsed => {
                if k < cand.len() {
                    let (seq, uses) = (&self.seq, &self.uses);
                    cand.select_nth_unstable_by_key(k - 1, |&s| (uses[s as usize].load(Relaxed), seq[s as usize]));
                }
            }
        }
        for &s in &cand[..k] {
            self.remove_slot(s);
        }
        k as u64
    }

    /// Inserts or overwrites one row (under the write lock).
    fn upsert(&mut self, g: &Geometry, key: u64, row: &[f32]) -> Upsert {
        let h = mix(key);
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(s) = self.map.find(key, h) {
            self.row_mut(g, s).copy_from_slice(row);
            self.seq[s as usize] = seq;
            return Upsert::Overwritten;
        }
        let evicted = if self.map.len >= g.margin { self.evict_to(g, g.resolve_to) } else { 0 };
        if !self.map.reserve_one() {
            return Upsert::Dropped { evicted };
        }
        let Some(s) = self.alloc_slot(g) else {
            return Upsert::Dropped { evicted };
        };
        self.row_mut(g, s).copy_from_slice(row);
        let i = s as usize;
        self.keys[i] = key;
        self.seq[i] = seq;
        self.uses[i].store(0, Relaxed);
        self.map.insert_new(key, h, s);
        Upsert::Inserted { evicted }
    }

    /// Bytes held by this shard's contents.
    fn bytes(&self, g: &Geometry) -> usize {
        self.map.bytes()
            + self.allocated * g.dim * std::mem::size_of::<f32>()
            + self.chunks.capacity() * std::mem::size_of::<Box<[f32]>>()
            + self.keys.capacity() * std::mem::size_of::<u64>()
            + self.seq.capacity() * std::mem::size_of::<u64>()
            + self.uses.capacity() * std::mem::size_of::<AtomicU32>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
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
        self.len.store(s.map.len, Relaxed);
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
    pub fn new(
        dim: usize,
        num_partitions: usize,
        overflow_margin: usize,
        policy: OverflowPolicy,
        resolution_target: f64,
    ) -> Result<Self> {
        if dim == 0 {
            return Err(Error::invalid("dim", "0; expected at least 1 element per row"));
        }
        if dim > (isize::MAX as usize) / (4 * std::mem::size_of::<f32>()) {
            return Err(Error::invalid("dim", format!("{dim}; a row of that many floats overflows the address space")));
        }
        if num_partitions == 0 || num_partitions > MAX_PARTITIONS {
            return Err(Error::invalid(
                "num_partitions",
                format!("{num_partitions}; expected between 1 and {MAX_PARTITIONS}"),
            ));
        }
        if overflow_margin == 0 {
            return Err(Error::invalid("overflow_margin", "0; expected at least 1 row per partition"));
        }
        if !(resolution_target > 0.0 && resolution_target <= 1.0) {
            return Err(Error::invalid(
                "overflow_resolution_target",
                format!("{resolution_target}; expected a fraction in (0, 1]"),
            ));
        }
        let margin = overflow_margin.min(MAX_ROWS_PER_SHARD);
        let resolve_to = ((resolution_target * margin as f64).floor() as usize).min(margin - 1);
        let chunk_rows = (CHUNK_BYTES / (dim * std::mem::size_of::<f32>())).max(1);
        let shift = usize::BITS - 1 - chunk_rows.leading_zeros(); // floor(log2)
        let geo = Geometry { dim, shift, margin, resolve_to, policy };
        let shards = (0..num_partitions)
            .map(|i| Shard {
                slots: RwLock::new(Slots::new(0x5eed_0000_0000_0000 ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))),
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
        match s.map.find(key, mix(key)) {
            Some(slot) => {
                dst.copy_from_slice(s.row(&self.geo, slot));
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
        self.for_each_shard_run(keys, |shard, idx| {
            let (mut h, mut m) = (0u64, 0u64);
            {
                let s = shard.read();
                for &i in idx {
                    let key = keys[i];
                    match s.map.find(key, mix(key)) {
                        Some(slot) => {
                            s.touch(slot);
                            f(i, Some(s.row(g, slot)));
                            h += 1;
                        }
                        None => {
                            f(i, None);
                            m += 1;
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
    /// current block (at most [`BLOCK`] keys). If memory for a new row cannot be
    /// allocated the row is silently not cached. Panics if `rows.len() != keys.len() * dim`.
    pub fn insert_many(&self, keys: &[u64], rows: &[f32]) -> u64 {
        let g = &self.geo;
        let dim = g.dim;
        assert_eq!(rows.len(), keys.len() * dim, "VolatileTier::insert_many: rows length; expected keys.len() * dim");
        let mut total = 0u64;
        self.for_each_shard_run(keys, |shard, idx| {
            let (mut ins, mut over, mut ev) = (0u64, 0u64, 0u64);
            {
                let mut s = shard.write();
                for &i in idx {
                    match s.upsert(g, keys[i], &rows[i * dim..(i + 1) * dim]) {
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
                    if let Some(slot) = s.map.find(key, mix(key)) {
                        s.remove_slot(slot);
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

    /// Whether `key` is held now (neither a hit nor a miss, nor a use).
    pub fn contains(&self, key: u64) -> bool {
        self.shards[self.shard_of(key)].read().map.find(key, mix(key)).is_some()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::AtomicBool;

    fn splitmix(s: &mut u64) -> u64 {
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn random_rows(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n * dim).map(|_| (splitmix(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect()
    }

    fn random_keys(n: usize, seed: u64) -> Vec<u64> {
        let mut s = seed;
        let mut seen = HashSet::new();
        let mut keys = Vec::with_capacity(n);
        while keys.len() < n {
            let k = splitmix(&mut s);
            if seen.insert(k) {
                keys.push(k);
            }
        }
        keys
    }

    fn row(t: &VolatileTier, key: u64) -> Option<Vec<f32>> {
        let mut v = vec![0.0; t.dim()];
        t.get(key, &mut v).then_some(v)
    }

    fn shard_lens(t: &VolatileTier) -> Vec<usize> {
        t.shards.iter().map(|s| s.len.load(Relaxed)).collect()
    }

    #[test]
    fn new_rejects_bad_parameters() {
        let p = OverflowPolicy::EvictRandom;
        let cases: [(Result<VolatileTier>, &str); 8] = [
            (VolatileTier::new(0, 1, 1, p, 0.5), "dim"),
            (VolatileTier::new(8, 0, 1, p, 0.5), "num_partitions"),
            (VolatileTier::new(8, MAX_PARTITIONS + 1, 1, p, 0.5), "num_partitions"),
            (VolatileTier::new(8, 1, 0, p, 0.5), "overflow_margin"),
            (VolatileTier::new(8, 1, 1, p, 0.0), "overflow_resolution_target"),
            (VolatileTier::new(8, 1, 1, p, -0.1), "overflow_resolution_target"),
            (VolatileTier::new(8, 1, 1, p, 1.5), "overflow_resolution_target"),
            (VolatileTier::new(8, 1, 1, p, f64::NAN), "overflow_resolution_target"),
        ];
        for (r, arg) in cases {
            let e = r.err().expect("bad parameter accepted");
            assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
            assert!(e.to_string().starts_with(&format!("{arg}: ")), "{e}");
        }
        assert!(VolatileTier::new(8, 1, 1, p, 1.0).is_ok());
        assert!(VolatileTier::new(8, 1, usize::MAX, p, 0.8).is_ok());
        assert_eq!(OverflowPolicy::EvictLeastUsed.to_string(), "evict_least_used");
    }

    #[test]
    fn get_after_insert_returns_exact_row() {
        let dim = 37;
        let t = VolatileTier::new(dim, 7, 100_000, OverflowPolicy::EvictOldest, 0.8).unwrap();
        let n = 20_000;
        let keys = random_keys(n, 1);
        let rows = random_rows(n, dim, 2);
        assert_eq!(t.insert_many(&keys, &rows), 0);
        assert_eq!(t.len(), n);
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(row(&t, k).unwrap(), &rows[i * dim..(i + 1) * dim]);
            assert!(t.contains(k));
        }
        let mut out = vec![f32::NAN; n * dim];
        let mut found = vec![false; n];
        assert_eq!(t.get_many(&keys, &mut out, &mut found), (n as u64, 0));
        assert!(found.iter().all(|&f| f));
        assert_eq!(out, rows);
        // Keys that share low or high bits, and the extremes.
        let special: Vec<u64> = (1..2000u64).map(|i| i << 40).chain([0, u64::MAX, 1, u64::MAX - 1]).collect();
        let srows = random_rows(special.len(), dim, 3);
        t.insert_many(&special, &srows);
        for (i, &k) in special.iter().enumerate() {
            assert_eq!(row(&t, k).unwrap(), &srows[i * dim..(i + 1) * dim]);
        }
    }

    #[test]
    fn overwrite_replaces_row_and_last_duplicate_wins() {
        let dim = 16;
        let t = VolatileTier::new(dim, 4, 1000, OverflowPolicy::EvictRandom, 0.5).unwrap();
        let keys = random_keys(500, 4);
        let a = random_rows(500, dim, 5);
        let b = random_rows(500, dim, 6);
        t.insert_many(&keys, &a);
        t.insert_many(&keys[..250], &b[..250 * dim]);
        assert_eq!(t.len(), 500);
        for (i, &k) in keys.iter().enumerate() {
            let want = if i < 250 { &b[i * dim..(i + 1) * dim] } else { &a[i * dim..(i + 1) * dim] };
            assert_eq!(row(&t, k).unwrap(), want);
        }
        // One batch naming a key three times keeps the last row.
        let k = keys[400];
        let dup_keys = [k, keys[0], k, k];
        let dup_rows = random_rows(4, dim, 7);
        t.insert_many(&dup_keys, &dup_rows);
        assert_eq!(row(&t, k).unwrap(), &dup_rows[3 * dim..]);
        assert_eq!(row(&t, keys[0]).unwrap(), &dup_rows[dim..2 * dim]);
        let st = t.stats();
        assert_eq!((st.insertions, st.overwrites, st.rows), (500, 254, 500));
    }

    #[test]
    fn erase_removes_rows_and_reuses_their_memory() {
        let dim = 8;
        let t = VolatileTier::new(dim, 3, 10_000, OverflowPolicy::EvictOldest, 0.8).unwrap();
        let keys = random_keys(3000, 8);
        let rows = random_rows(3000, dim, 9);
        t.insert_many(&keys, &rows);
        let slab = |t: &VolatileTier| t.shards.iter().map(|s| s.read().allocated).sum::<usize>();
        let slab_full = slab(&t);
        let mut gone: Vec<u64> = keys.iter().copied().step_by(2).collect();
        gone.push(12345); // absent
        gone.push(keys[0]); // named twice
        assert_eq!(t.erase_many(&gone), 1500);
        assert_eq!(t.len(), 1500);
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(t.contains(k), i % 2 == 1);
            if i % 2 == 1 {
                assert_eq!(row(&t, k).unwrap(), &rows[i * dim..(i + 1) * dim]);
            }
        }
        // Reinserting into freed slots needs no new row memory.
        let new_keys = random_keys(1500, 10).into_iter().map(|k| k | 1 << 63).collect::<Vec<_>>();
        let new_rows = random_rows(1500, dim, 11);
        t.insert_many(&new_keys, &new_rows);
        assert_eq!(slab(&t), slab_full);
        for (i, &k) in new_keys.iter().enumerate() {
            assert_eq!(row(&t, k).unwrap(), &new_rows[i * dim..(i + 1) * dim]);
        }
        assert_eq!(t.erase_many(&keys), 1500);
        assert_eq!(t.erase_many(&new_keys), 1500);
        assert!(t.is_empty());
        assert_eq!(t.stats().erasures, 4500);
    }

    #[test]
    fn misses_are_counted() {
        let dim = 4;
        let t = VolatileTier::new(dim, 2, 100, OverflowPolicy::EvictLeastUsed, 0.5).unwrap();
        let mut v = [7.0f32; 4];
        assert!(!t.get(42, &mut v));
        assert_eq!(v, [7.0; 4], "a miss leaves dst alone");
        t.insert_many(&[1, 2, 3], &[1.0; 12]);
        let keys = [1, 5, 2, 6, 7, 3, 1];
        let mut out = vec![-1.0; keys.len() * dim];
        let mut found = vec![true; keys.len()];
        assert_eq!(t.get_many(&keys, &mut out, &mut found), (4, 3));
        assert_eq!(found, [true, false, true, false, false, true, true]);
        assert_eq!(&out[dim..2 * dim], &[-1.0; 4]);
        assert!(!t.contains(5));
        let st = t.stats();
        assert_eq!((st.hits, st.misses), (4, 4));
    }

    #[test]
    fn least_used_evicts_the_unused() {
        let dim = 8;
        let t = VolatileTier::new(dim, 1, 100, OverflowPolicy::EvictLeastUsed, 0.5).unwrap();
        let keys = random_keys(101, 12);
        let rows = random_rows(101, dim, 13);
        assert_eq!(t.insert_many(&keys[..100], &rows[..100 * dim]), 0);
        // Look up a random half of the keys, each a different number of times.
        let mut s = 14u64;
        let mut used: Vec<usize> = (0..100).collect();
        for i in 0..100 {
            let j = i + (splitmix(&mut s) % (100 - i) as u64) as usize;
            used.swap(i, j);
        }
        used.truncate(50);
        let mut buf = vec![0.0; dim];
        for (n, &i) in used.iter().enumerate() {
            for _ in 0..=n % 5 {
                assert!(t.get(keys[i], &mut buf));
            }
        }
        assert_eq!(t.insert_many(&keys[100..], &rows[100 * dim..]), 50);
        assert_eq!(t.len(), 51);
        let used: HashSet<usize> = used.into_iter().collect();
        for i in 0..101 {
            let survives = used.contains(&i) || i == 100;
            assert_eq!(t.contains(keys[i]), survives, "key {i}");
            if survives {
                assert_eq!(row(&t, keys[i]).unwrap(), &rows[i * dim..(i + 1) * dim]);
            }
        }

        // Graded counts: key i looked up i times; resolving to 70 evicts keys 0..30.
        let t = VolatileTier::new(dim, 1, 100, OverflowPolicy::EvictLeastUsed, 0.7).unwrap();
        t.insert_many(&keys[..100], &rows[..100 * dim]);
        for (i, &k) in keys[..100].iter().enumerate() {
            let batch = vec![k; i];
            t.visit_many(&batch, |_, r| assert!(r.is_some()));
        }
        // An overwrite keeps the count: key 99 stays the most used.
        t.insert_many(&keys[99..100], &rows[..dim]);
        assert_eq!(t.insert_many(&keys[100..], &rows[100 * dim..]), 30);
        for (i, &k) in keys[..101].iter().enumerate() {
            assert_eq!(t.contains(k), i >= 30, "key {i}");
        }
    }

    #[test]
    fn oldest_evicts_in_insertion_order() {
        let dim = 4;
        let t = VolatileTier::new(dim, 1, 100, OverflowPolicy::EvictOldest, 0.75).unwrap();
        let keys = random_keys(140, 15);
        let rows = random_rows(140, dim, 16);
        // Insert in four batches, then overwrite keys 0..10 (making them the newest) and
        // look the oldest up a lot (which Oldest must ignore).
        for c in 0..4 {
            t.insert_many(&keys[c * 25..(c + 1) * 25], &rows[c * 25 * dim..(c + 1) * 25 * dim]);
        }
        t.insert_many(&keys[..10], &rows[..10 * dim]);
        let mut buf = vec![0.0; dim];
        for _ in 0..10 {
            for &k in &keys[10..20] {
                assert!(t.get(k, &mut buf));
            }
        }
        // Full: the next new key evicts the 25 oldest (keys 10..35), then is inserted.
        assert_eq!(t.insert_many(&keys[100..101], &rows[100 * dim..101 * dim]), 25);
        for (i, &k) in keys[..101].iter().enumerate() {
            assert_eq!(t.contains(k), !(10..35).contains(&i), "key {i}");
        }
        assert_eq!(t.len(), 76);
        // 24 more fill it again; the 25th evicts keys 35..60.
        assert_eq!(t.insert_many(&keys[101..125], &rows[101 * dim..125 * dim]), 0);
        assert_eq!(t.insert_many(&keys[125..126], &rows[125 * dim..126 * dim]), 25);
        for (i, &k) in keys[..126].iter().enumerate() {
            assert_eq!(t.contains(k), !(10..60).contains(&i), "key {i}");
        }
    }

    #[test]
    fn random_evicts_the_right_count_and_keeps_survivors_intact() {
        let dim = 12;
        let n = 1000;
        let t = VolatileTier::new(dim, 1, n, OverflowPolicy::EvictRandom, 0.6).unwrap();
        let keys = random_keys(n + 1, 17);
        let rows = random_rows(n + 1, dim, 18);
        assert_eq!(t.insert_many(&keys[..n], &rows[..n * dim]), 0);
        assert_eq!(t.insert_many(&keys[n..], &rows[n * dim..]), 400);
        assert_eq!(t.len(), 601);
        assert!(t.contains(keys[n]), "the row being inserted survives");
        let mut evicted_early = 0;
        let mut evicted_late = 0;
        for i in 0..=n {
            match row(&t, keys[i]) {
                Some(r) => assert_eq!(r, &rows[i * dim..(i + 1) * dim]),
                None if i < n / 2 => evicted_early += 1,
                None => evicted_late += 1,
            }
        }
        assert_eq!(evicted_early + evicted_late, 400);
        // Uniform over insertion order: both halves lose about 200 (far from 0 or 400).
        assert!((120..=280).contains(&evicted_early), "{evicted_early} of the first half evicted");
        assert_eq!(t.stats().evictions, 400);
    }

    #[test]
    fn eviction_resolves_down_to_the_target() {
        for (np, margin, target, policy) in [
            (4, 50, 0.6, OverflowPolicy::EvictRandom),
            (3, 10, 1.0, OverflowPolicy::EvictOldest),
            (2, 10, 0.3, OverflowPolicy::EvictLeastUsed),
            (1, 1, 0.5, OverflowPolicy::EvictOldest),
            (5, 7, 0.99, OverflowPolicy::EvictRandom),
        ] {
            let dim = 3;
            let t = VolatileTier::new(dim, np, margin, policy, target).unwrap();
            let resolve_to = ((target * margin as f64).floor() as usize).min(margin - 1);
            let keys = random_keys(500, 19);
            let rows = random_rows(500, dim, 20);
            let mut total = 0;
            for i in 0..500 {
                let before = shard_lens(&t);
                let ev = t.insert_many(&keys[i..i + 1], &rows[i * dim..(i + 1) * dim]);
                let after = shard_lens(&t);
                let s = t.shard_of(keys[i]);
                if before[s] == margin {
                    assert_eq!(ev as usize, margin - resolve_to);
                    assert_eq!(after[s], resolve_to + 1);
                } else {
                    assert_eq!(ev, 0);
                    assert_eq!(after[s], before[s] + 1);
                }
                assert!(after.iter().all(|&l| l <= margin));
                assert!(t.contains(keys[i]));
                total += ev;
            }
            let st = t.stats();
            assert_eq!(st.evictions, total);
            assert_eq!(st.insertions - st.evictions, t.len() as u64);
            // A batch larger than the whole tier also stays within bounds.
            let big = random_keys(2000, 21);
            t.insert_many(&big, &random_rows(2000, dim, 22));
            assert!(shard_lens(&t).iter().all(|&l| l <= margin));
            let st = t.stats();
            assert_eq!(st.insertions - st.evictions, t.len() as u64);
        }
    }

    #[test]
    fn stats_are_exact() {
        let dim = 5;
        let t = VolatileTier::new(dim, 4, 1000, OverflowPolicy::EvictOldest, 0.8).unwrap();
        assert_eq!(t.stats(), VolatileStats { bytes: t.bytes() as u64, ..Default::default() });
        let keys: Vec<u64> = (0..200).collect();
        let rows = random_rows(200, dim, 23);
        t.insert_many(&keys[..100], &rows[..100 * dim]);
        t.insert_many(&keys[50..150], &rows[50 * dim..150 * dim]);
        let mut out = vec![0.0; 200 * dim];
        let mut found = vec![false; 200];
        assert_eq!(t.get_many(&keys, &mut out, &mut found), (150, 50));
        let mut buf = vec![0.0; dim];
        assert!(!t.get(999, &mut buf));
        assert!(t.get(0, &mut buf));
        assert_eq!(t.erase_many(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 500]), 10);
        assert!(t.contains(10));
        let st = t.stats();
        assert_eq!(
            st,
            VolatileStats {
                hits: 151,
                misses: 51,
                insertions: 150,
                overwrites: 50,
                erasures: 10,
                evictions: 0,
                rows: 140,
                bytes: t.bytes() as u64,
            }
        );
    }

    /// Fills 4 shards x 10,000 rows of 128 floats and checks the memory held against the
    /// raw vectors (rows * 512 bytes), at full capacity, half full, and after heavy churn.
    #[test]
    fn bytes_within_1_25x_raw_at_capacity_dim128() {
        let dim = 128;
        let (np, margin) = (4, 10_000);
        let raw = |rows: usize| (rows * dim * 4) as f64;
        let t = VolatileTier::new(dim, np, margin, OverflowPolicy::EvictOldest, 1.0).unwrap();
        let mut s = 24u64;
        let batch = 4096;
        let mut keys = vec![0u64; batch];
        let mut rows = vec![0f32; batch * dim];
        let mut half_ratio = None;
        while t.len() < np * margin {
            for k in keys.iter_mut() {
                *k = splitmix(&mut s);
            }
            for (i, r) in rows.chunks_mut(dim).enumerate() {
                r.fill(i as f32);
            }
            t.insert_many(&keys, &rows);
            if half_ratio.is_none() && t.len() >= np * margin / 2 {
                half_ratio = Some(t.bytes() as f64 / raw(t.len()));
            }
        }
        let full = t.bytes() as f64 / raw(t.len());
        let half = half_ratio.unwrap();
        eprintln!("volatile tier, dim 128: bytes/raw {full:.4} full, {half:.4} half full");
        assert!(full <= 1.25, "{full}");
        assert!(half <= 1.25, "{half}");

        // Churn with a resolution target below 1: memory stays bounded by the capacity.
        let t = VolatileTier::new(dim, np, margin, OverflowPolicy::EvictLeastUsed, 0.8).unwrap();
        for _ in 0..30 {
            for k in keys.iter_mut() {
                *k = splitmix(&mut s);
            }
            t.insert_many(&keys, &rows);
        }
        let churn = t.bytes() as f64 / raw(np * margin);
        eprintln!("after churn: bytes/raw-at-capacity {churn:.4}, {} rows", t.len());
        assert!(churn <= 1.25, "{churn}");
    }

    #[test]
    fn key_map_matches_a_model_under_random_inserts_and_removes() {
        for universe in [8u64, 50, 1000] {
            let mut table = Table::new();
            let mut model: HashMap<u64, u32> = HashMap::new();
            let mut s = universe;
            let mut next_slot = 0u32;
            for _ in 0..20_000 {
                // Keys sharing their low bits so probe runs wrap and interleave.
                let key = (splitmix(&mut s) % universe) << 48 | 7;
                let h = mix(key);
                if splitmix(&mut s).is_multiple_of(3) {
                    assert_eq!(table.remove(key, h), model.remove(&key));
                } else if let std::collections::hash_map::Entry::Vacant(e) = model.entry(key) {
                    assert!(table.reserve_one());
                    table.insert_new(key, h, next_slot);
                    e.insert(next_slot);
                    next_slot += 1;
                }
                assert_eq!(table.len, model.len());
                assert!(table.len * 4 <= table.entries.len() * 3 || table.len == 0);
                let probe = (splitmix(&mut s) % (universe + 2)) << 48 | 7;
                assert_eq!(table.find(probe, mix(probe)), model.get(&probe).copied());
            }
            for (&k, &v) in &model {
                assert_eq!(table.find(k, mix(k)), Some(v));
            }
        }
    }

    #[test]
    fn tier_matches_a_model_under_random_operations() {
        let dim = 6;
        let t = VolatileTier::new(dim, 3, 1 << 20, OverflowPolicy::EvictRandom, 0.5).unwrap();
        let mut model: HashMap<u64, Vec<f32>> = HashMap::new();
        let mut s = 25u64;
        for round in 0..400 {
            let n = (splitmix(&mut s) % 64) as usize;
            let keys: Vec<u64> = (0..n).map(|_| splitmix(&mut s) % 3000).collect();
            if splitmix(&mut s).is_multiple_of(3) {
                let expect = keys.iter().collect::<HashSet<_>>().iter().filter(|k| model.contains_key(k)).count();
                assert_eq!(t.erase_many(&keys) as usize, expect);
                for k in &keys {
                    model.remove(k);
                }
            } else {
                let rows = random_rows(n, dim, round);
                assert_eq!(t.insert_many(&keys, &rows), 0);
                for (i, &k) in keys.iter().enumerate() {
                    model.insert(k, rows[i * dim..(i + 1) * dim].to_vec());
                }
            }
            assert_eq!(t.len(), model.len());
        }
        for k in 0..3000u64 {
            assert_eq!(row(&t, k).as_ref(), model.get(&k));
        }
    }

    /// 4 readers and 2 writers on a small, constantly evicting tier. Every element of a row
    /// encodes (key, version, position) in its bits; a reader must never see a row mixing
    /// versions or keys.
    #[test]
    fn concurrent_reads_never_see_torn_rows() {
        const DIM: usize = 64;
        const KEYS: u64 = 256;
        let (np, margin) = (4, 40);
        let t = VolatileTier::new(DIM, np, margin, OverflowPolicy::EvictRandom, 0.75).unwrap();
        // Bits 22..30: key (< 256, so never an inf or NaN pattern); 6..22: version; 0..6: j.
        let encode = |key: u64, v: u32, j: usize| f32::from_bits((key as u32) << 22 | (v & 0xffff) << 6 | j as u32);
        let check = |key: u64, r: &[f32]| {
            let v0 = (r[0].to_bits() >> 6) & 0xffff;
            for (j, x) in r.iter().enumerate() {
                let b = x.to_bits();
                assert_eq!(b >> 22, key as u32, "row of key {key} holds another key's element at {j}");
                assert_eq!((b >> 6) & 0xffff, v0, "torn row for key {key}: element {j}");
                assert_eq!(b & 63, j as u32);
            }
        };
        let stop = AtomicBool::new(false);
        let reads = AtomicU64::new(0);
        let found = AtomicU64::new(0);
        std::thread::scope(|sc| {
            for r in 0..4u64 {
                let (t, stop, reads, found) = (&t, &stop, &reads, &found);
                sc.spawn(move || {
                    let mut s = 100 + r;
                    let mut buf = vec![0.0; DIM];
                    let mut out = vec![0.0; 8 * DIM];
                    let mut hit = vec![false; 8];
                    while !stop.load(Relaxed) {
                        let key = splitmix(&mut s) % KEYS;
                        if t.get(key, &mut buf) {
                            check(key, &buf);
                            found.fetch_add(1, Relaxed);
                        }
                        let keys: Vec<u64> = (0..8).map(|_| splitmix(&mut s) % KEYS).collect();
                        t.get_many(&keys, &mut out, &mut hit);
                        for (i, &k) in keys.iter().enumerate() {
                            if hit[i] {
                                check(k, &out[i * DIM..(i + 1) * DIM]);
                            }
                        }
                        assert!(t.len() <= np * margin);
                        reads.fetch_add(9, Relaxed);
                    }
                });
            }
            let writers: Vec<_> = (0..2u32)
                .map(|w| {
                    let t = &t;
                    sc.spawn(move || {
                        let mut s = 200 + w as u64;
                        for it in 0..3000u32 {
                            let v = it * 2 + w;
                            let keys: Vec<u64> = (0..16).map(|_| splitmix(&mut s) % KEYS).collect();
                            if it % 10 == 9 {
                                t.erase_many(&keys[..4]);
                                continue;
                            }
                            let rows: Vec<f32> =
                                keys.iter().flat_map(|&k| (0..DIM).map(move |j| encode(k, v, j))).collect();
                            t.insert_many(&keys, &rows);
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            stop.store(true, Relaxed);
        });
        assert!(reads.load(Relaxed) > 0 && found.load(Relaxed) > 0);
        let held = (0..KEYS).filter(|&k| t.contains(k)).count();
        assert_eq!(t.len(), held);
        assert!(held <= np * margin);
        let st = t.stats();
        assert_eq!(st.insertions - st.evictions - st.erasures, held as u64);
        for k in 0..KEYS {
            if let Some(r) = row(&t, k) {
                check(k, &r);
            }
        }
    }
}
