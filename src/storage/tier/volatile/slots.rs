//! The contents of one shard: rows in a slab of fixed-size chunks, indexed by slot number, the
//! per-slot metadata the eviction policies read, the key -> slot map, and inserting, overwriting,
//! erasing and evicting rows. Everything here runs under the shard's lock (see the parent
//! module); nothing here locks.

use super::evict::{OverflowPolicy, SplitMix64};
use super::map::KeyMap;
use crate::dlpack::FloatDtype;
use crate::kernels::{RowFn, RowFormat, quantize_row};
use crate::util::hash::mix;
use crate::util::prefetch;
use std::sync::atomic::{AtomicU16, Ordering::Relaxed};

/// Target size of one slab chunk.
const CHUNK_BYTES: usize = 256 << 10;
/// Most rows one shard can index (slots are `u32`).
const MAX_ROWS_PER_SHARD: usize = u32::MAX as usize - 1;

/// A row handed to a shard: `dim` float32 values, or a row already in the shard's format
/// (`format.row_bytes(dim)` bytes, e.g. as the persistent tier of the same format stores it).
#[derive(Clone, Copy)]
pub(super) enum RowIn<'a> {
    Values(&'a [f32]),
    Stored(&'a [u8]),
}

/// The fixed shape of every shard.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    /// Values per row (what callers hand in and get back, as float32).
    pub(super) dim: usize,
    /// How a slot stores its row: float32, or converted/quantized ([`Geometry::encode`]).
    pub(super) format: RowFormat,
    /// 4-byte words a slot's row takes (`dim` for float32; a quantized row's bytes rounded up).
    pub(super) words: usize,
    /// Writes a stored row out as `dim` float32 values.
    decode: RowFn,
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
    /// Rows are stored as `format` (checked by the caller against `dim`).
    pub(super) fn new(format: RowFormat, dim: usize, overflow_margin: usize, policy: OverflowPolicy, resolution_target: f64) -> Self {
        let margin = overflow_margin.min(MAX_ROWS_PER_SHARD);
        let resolve_to = ((resolution_target * margin as f64).floor() as usize).min(margin - 1);
        let words = format.row_bytes(dim).div_ceil(4);
        let chunk_rows = (CHUNK_BYTES / (words * std::mem::size_of::<f32>())).max(1);
        let shift = usize::BITS - 1 - chunk_rows.leading_zeros(); // floor(log2)
        let decode = crate::kernels::pool::convert_fn(crate::kernels::isa(), format, FloatDtype::F32);
        Geometry { dim, format, words, decode, shift, margin, resolve_to, policy }
    }

    /// Whether slots hold float32 rows as given.
    #[inline(always)]
    pub(super) fn plain(&self) -> bool {
        self.format == RowFormat::Float(FloatDtype::F32)
    }

    /// Writes `row` into a slot's words in the tier's format (values converted or quantized,
    /// stored rows copied as they are); false (the slot then holds nothing meaningful) when the
    /// format cannot hold the values (NaN or infinite values in a quantized row).
    fn encode(&self, row: RowIn, slot: &mut [f32]) -> bool {
        if let (true, RowIn::Values(v)) = (self.plain(), row) {
            slot.copy_from_slice(v);
            return true;
        }
        let bytes = self.format.row_bytes(self.dim);
        // SAFETY: a float slice's memory is readable and writable as bytes (any bit pattern is a
        // valid f32 and u8); `bytes <= 4 * words = 4 * slot.len()`.
        let dst = unsafe { std::slice::from_raw_parts_mut(slot.as_mut_ptr().cast::<u8>(), bytes) };
        match row {
            RowIn::Values(v) => quantize_row(self.format, v, dst).is_ok(),
            RowIn::Stored(b) => {
                dst.copy_from_slice(b);
                true
            }
        }
    }

    /// Writes a slot's row (its words) into `dst` as `dim` float32 values.
    #[inline(always)]
    pub(super) fn decode(&self, slot: &[f32], dst: &mut [f32]) {
        if self.plain() {
            dst.copy_from_slice(slot);
            return;
        }
        debug_assert!(slot.len() == self.words && dst.len() == self.dim);
        // SAFETY: `decode` is the row kernel of this format into contiguous float32: it reads
        // one stored row (`row_bytes(dim) <= 4 * words` bytes of `slot`) and writes `dim`
        // float32 into `dst`, which does not overlap it.
        unsafe { (self.decode)(slot.as_ptr().cast(), dst.as_mut_ptr().cast(), self.dim, 1) }
    }
}

/// The contents of one shard (behind its lock).
///
/// Per slot it keeps 6 bytes besides the row: an insertion stamp and a lookup count. The key
/// lives only in the map (eviction walks the map's entries), so a 32-float row costs 128 + 6 +
/// 15 (map) bytes at capacity.
pub(super) struct Slots {
    map: KeyMap,
    /// Chunk `c` holds slots `c << shift ..`; every chunk but the last is full size.
    chunks: Vec<Box<[f32]>>,
    /// Slots backed by chunks.
    pub(super) allocated: usize,
    /// Per slot ever handed out (`len` = high-water mark): the insertion stamp (0 = free; the
    /// order of inserts and overwrites, renumbered when it would overflow) and the lookup count
    /// (saturating).
    stamp: Vec<u32>,
    uses: Vec<AtomicU16>,
    /// Free slots below the high-water mark.
    free: Vec<u32>,
    next_stamp: u32,
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
    /// An empty shard of at most `g.margin` rows.
    pub(super) fn new(g: &Geometry, seed: u64) -> Self {
        Slots {
            map: KeyMap::new(g.margin),
            chunks: Vec::new(),
            allocated: 0,
            stamp: Vec::new(),
            uses: Vec::new(),
            free: Vec::new(),
            next_stamp: 1,
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

    /// The stored row of `slot`: `g.words` words (the row itself for float32 tiers; decode
    /// others with [`Geometry::decode`]).
    #[inline(always)]
    pub(super) fn row(&self, g: &Geometry, slot: u32) -> &[f32] {
        let s = slot as usize;
        let off = (s & ((1 << g.shift) - 1)) * g.words;
        &self.chunks[s >> g.shift][off..off + g.words]
    }

    #[inline(always)]
    fn row_mut(&mut self, g: &Geometry, slot: u32) -> &mut [f32] {
        let s = slot as usize;
        let off = (s & ((1 << g.shift) - 1)) * g.words;
        &mut self.chunks[s >> g.shift][off..off + g.words]
    }

    /// Where the map probe of a key hashing to `h` starts: for prefetching.
    #[inline(always)]
    pub(super) fn probe_start(&self, h: u64) -> *const u8 {
        self.map.probe_start(h)
    }

    /// Prefetches the row and the lookup count of `slot`.
    #[inline(always)]
    pub(super) fn prefetch_slot(&self, g: &Geometry, slot: u32) {
        let row = self.row(g, slot);
        let bytes = std::mem::size_of_val(row).min(512);
        let p = row.as_ptr().cast::<u8>();
        let mut off = 0;
        while off < bytes {
            prefetch(p.wrapping_add(off));
            off += 64;
        }
        prefetch(self.uses[slot as usize..].as_ptr().cast());
    }

    /// Counts a lookup of `slot` (under the read lock). A plain load and store, not a locked
    /// read-modify-write: two readers counting the same row at once may count it once, which
    /// an eviction policy can afford, and a hot row's count costs no bus lock. Saturates.
    #[inline(always)]
    pub(super) fn touch(&self, slot: u32) {
        let u = &self.uses[slot as usize];
        let v = u.load(Relaxed);
        if v < u16::MAX {
            u.store(v + 1, Relaxed);
        }
    }

    /// Makes the next insertion stamp `v` (to test the renumbering).
    #[cfg(test)]
    pub(super) fn set_next_stamp(&mut self, v: u32) {
        self.next_stamp = v;
    }

    /// The next insertion stamp; renumbers the live ones (keeping their order) when the
    /// counter would overflow.
    fn take_stamp(&mut self) -> u32 {
        if self.next_stamp == u32::MAX {
            let mut live: Vec<u32> = (0..self.stamp.len() as u32).filter(|&s| self.stamp[s as usize] != 0).collect();
            live.sort_unstable_by_key(|&s| self.stamp[s as usize]);
            for (rank, &s) in live.iter().enumerate() {
                self.stamp[s as usize] = rank as u32 + 1;
            }
            self.next_stamp = live.len() as u32 + 1;
        }
        let t = self.next_stamp;
        self.next_stamp += 1;
        t
    }

    /// A slot for a new row: a freed one, the next one of the slab, or a new chunk's first.
    /// `None` when the memory cannot be allocated.
    fn alloc_slot(&mut self, g: &Geometry) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        let s = self.stamp.len();
        if s == self.allocated {
            let rows = (1usize << g.shift).min(g.margin - self.allocated);
            if rows == 0 {
                return None;
            }
            let mut chunk: Vec<f32> = Vec::new();
            chunk.try_reserve_exact(rows * g.words).ok()?;
            chunk.resize(rows * g.words, 0.0);
            let more = self.allocated + rows - self.stamp.len();
            self.chunks.try_reserve(1).ok()?;
            self.stamp.try_reserve_exact(more).ok()?;
            self.uses.try_reserve_exact(more).ok()?;
            self.chunks.push(chunk.into_boxed_slice());
            self.allocated += rows;
        }
        self.stamp.push(0);
        self.uses.push(AtomicU16::new(0));
        Some(s as u32)
    }

    /// Removes `key` (held in `slot`) and frees the slot.
    pub(super) fn remove(&mut self, key: u64, slot: u32) {
        let removed = self.map.remove(key, mix(key));
        debug_assert_eq!(removed, Some(slot));
        self.free_slot(slot);
    }

    fn free_slot(&mut self, slot: u32) {
        let s = slot as usize;
        self.stamp[s] = 0;
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
        let policy = g.policy;
        let mut cand: Vec<(u64, u64)> = self
            .map
            .iter()
            .map(|(key, slot)| {
                let s = slot as usize;
                (policy.rank(self.stamp[s], self.uses[s].load(Relaxed)), key)
            })
            .collect();
        debug_assert_eq!(cand.len(), live);
        policy.choose_victims(&mut cand, k, &mut self.rng);
        for &(_, key) in &cand[..k] {
            if let Some(slot) = self.map.remove(key, mix(key)) {
                self.free_slot(slot);
            }
        }
        k as u64
    }

    /// Inserts or overwrites one row (under the write lock). A row the tier's format cannot
    /// hold is not cached (and an older row of its key goes, so no reader sees it).
    pub(super) fn upsert(&mut self, g: &Geometry, key: u64, row: RowIn) -> Upsert {
        let h = mix(key);
        if let Some(s) = self.map.find(key, h) {
            if !g.encode(row, self.row_mut(g, s)) {
                self.remove(key, s);
                return Upsert::Dropped { evicted: 0 };
            }
            let t = self.take_stamp();
            self.stamp[s as usize] = t;
            return Upsert::Overwritten;
        }
        let evicted = if self.map.len() >= g.margin { self.evict_to(g, g.resolve_to) } else { 0 };
        if !self.map.reserve_one() {
            return Upsert::Dropped { evicted };
        }
        let Some(s) = self.alloc_slot(g) else {
            return Upsert::Dropped { evicted };
        };
        if !g.encode(row, self.row_mut(g, s)) {
            self.free_slot(s);
            return Upsert::Dropped { evicted };
        }
        let i = s as usize;
        let t = self.take_stamp();
        self.stamp[i] = t;
        self.uses[i].store(0, Relaxed);
        self.map.insert_new(key, h, s);
        Upsert::Inserted { evicted }
    }

    /// Bytes held by this shard's contents.
    pub(super) fn bytes(&self, g: &Geometry) -> usize {
        self.map.bytes()
            + self.allocated * g.words * std::mem::size_of::<f32>()
            + self.chunks.capacity() * std::mem::size_of::<Box<[f32]>>()
            + self.stamp.capacity() * std::mem::size_of::<u32>()
            + self.uses.capacity() * std::mem::size_of::<AtomicU16>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
}
