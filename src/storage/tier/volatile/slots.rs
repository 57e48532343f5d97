//! The contents of one shard: rows in a slab of fixed-size chunks, indexed by slot number, the
//! per-slot metadata the eviction policies read, the key -> slot map, and inserting, overwriting,
//! erasing and evicting rows. Everything here runs under the shard's lock (see the parent
//! module); nothing here locks.

use super::evict::{OverflowPolicy, SplitMix64};
use super::map::KeyMap;
use crate::util::hash::mix;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Target size of one slab chunk.
const CHUNK_BYTES: usize = 256 << 10;
/// Most rows one shard can index (slots are `u32`).
const MAX_ROWS_PER_SHARD: usize = u32::MAX as usize - 1;
/// Lookup counters stop counting here (so concurrent increments can never wrap).
const USE_SATURATION: u32 = u32::MAX - (1 << 16);

/// The fixed shape of every shard.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    pub(super) dim: usize,
    /// log2 of the rows in a full chunk.
    shift: u32,
    /// Most rows per shard.
    pub(super) margin: usize,
    /// Rows a full shard evicts down to before inserting a new key (< margin).
    resolve_to: usize,
    pub(super) policy: OverflowPolicy,
}

impl Geometry {
    /// The shape of shards of `dim`-float rows holding at most `overflow_margin` rows (capped at
    /// `u32::MAX - 1`) and evicting down to `resolution_target` of that. The arguments are
    /// checked by the caller: `dim > 0` and small enough for a row to fit in the address space,
    /// `overflow_margin > 0`, `0 < resolution_target <= 1`.
    pub(super) fn new(dim: usize, overflow_margin: usize, policy: OverflowPolicy, resolution_target: f64) -> Self {
        let margin = overflow_margin.min(MAX_ROWS_PER_SHARD);
        let resolve_to = ((resolution_target * margin as f64).floor() as usize).min(margin - 1);
        let chunk_rows = (CHUNK_BYTES / (dim * std::mem::size_of::<f32>())).max(1);
        let shift = usize::BITS - 1 - chunk_rows.leading_zeros(); // floor(log2)
        Geometry { dim, shift, margin, resolve_to, policy }
    }
}

/// The contents of one shard (behind its lock).
pub(super) struct Slots {
    map: KeyMap,
    /// Chunk `c` holds slots `c << shift ..`; every chunk but the last is full size.
    chunks: Vec<Box<[f32]>>,
    /// Slots backed by chunks.
    pub(super) allocated: usize,
    /// Per slot ever handed out (`len` = high-water mark): key, sequence (0 = free), uses.
    keys: Vec<u64>,
    seq: Vec<u64>,
    uses: Vec<AtomicU32>,
    /// Free slots below the high-water mark.
    free: Vec<u32>,
    next_seq: u64,
    /// For [`OverflowPolicy::EvictRandom`].
    rng: SplitMix64,
}

/// What inserting one row did.
pub(super) enum Upsert {
    Inserted {
        evicted: u64,
    },
    Overwritten,
    /// Memory for the row could not be allocated; the row is not cached.
    Dropped {
        evicted: u64,
    },
}

impl Slots {
    pub(super) fn new(seed: u64) -> Self {
        Slots {
            map: KeyMap::new(),
            chunks: Vec::new(),
            allocated: 0,
            keys: Vec::new(),
            seq: Vec::new(),
            uses: Vec::new(),
            free: Vec::new(),
            next_seq: 1,
            rng: SplitMix64::new(seed),
        }
    }

    /// Rows held.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// The slot holding `key`'s row, if any (`h = mix(key)`).
    #[inline(always)]
    pub(super) fn find(&self, key: u64, h: u64) -> Option<u32> {
        self.map.find(key, h)
    }

    #[inline(always)]
    pub(super) fn row(&self, g: &Geometry, slot: u32) -> &[f32] {
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
    pub(super) fn touch(&self, slot: u32) {
        let u = &self.uses[slot as usize];
        if u.load(Relaxed) < USE_SATURATION {
            u.fetch_add(1, Relaxed);
        }
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
    pub(super) fn remove_slot(&mut self, slot: u32) {
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
        let live = self.map.len();
        if live <= to {
            return 0;
        }
        let k = live - to;
        let mut cand: Vec<u32> = (0..self.keys.len() as u32).filter(|&s| self.seq[s as usize] != 0).collect();
        debug_assert_eq!(cand.len(), live);
        g.policy.choose_victims(&mut cand, k, &self.seq, &self.uses, &mut self.rng);
        for &s in &cand[..k] {
            self.remove_slot(s);
        }
        k as u64
    }

    /// Inserts or overwrites one row (under the write lock).
    pub(super) fn upsert(&mut self, g: &Geometry, key: u64, row: &[f32]) -> Upsert {
        let h = mix(key);
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(s) = self.map.find(key, h) {
            self.row_mut(g, s).copy_from_slice(row);
            self.seq[s as usize] = seq;
            return Upsert::Overwritten;
        }
        let evicted = if self.map.len() >= g.margin { self.evict_to(g, g.resolve_to) } else { 0 };
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
    pub(super) fn bytes(&self, g: &Geometry) -> usize {
        self.map.bytes()
            + self.allocated * g.dim * std::mem::size_of::<f32>()
            + self.chunks.capacity() * std::mem::size_of::<Box<[f32]>>()
            + self.keys.capacity() * std::mem::size_of::<u64>()
            + self.seq.capacity() * std::mem::size_of::<u64>()
            + self.uses.capacity() * std::mem::size_of::<AtomicU32>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
}
