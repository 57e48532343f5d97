//! A shard's key -> slot map.
//!
//! Open addressing with linear probing over 12-byte entries (key, slot + 1), kept at most 4/5
//! full, with backward-shift deletion (no tombstones). The caller hashes each key once with
//! [`mix`] and passes the hash in. A key's home position comes from the low 32 bits of its hash
//! (the shard was chosen by the high bits) by a multiply-shift, so the table may have any size:
//! it doubles while it grows, but never beyond what the shard's most rows need
//! (`max_rows * 5 / 4`), so a full shard's map costs 15 bytes a row, not the 16-32 of a
//! power-of-two table.
//!
//! Why not `hashbrown::HashTable`: it was tried (same 12-byte entries, plus a rebuild so that
//! tombstones never make it double) and measured. At the tiered benchmark's default size
//! (10M rows x 32, 500k rows per shard) it held more memory (volatile tier 335.3 MiB against
//! 331.3) and found keys more slowly (25-31 ns against 19-21 per uniform lookup, 17-22 against
//! 11-13 per Zipf(1.1) lookup, the two maps side by side in one process): a hit costs a cache
//! miss on the control bytes and another on the entry, where here the key sits in the entry
//! the probe lands on.

use crate::util::hash::mix;

/// Smallest key-map table.
const MIN_TABLE: usize = 16;

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

/// Open-addressing key -> slot map with linear probing, at most 4/5 full.
pub(super) struct KeyMap {
    entries: Vec<Entry>,
    len: usize,
    /// Most entries the table ever needs: room for the shard's most rows at 4/5 load.
    max_table: usize,
}

/// Whether a table of `cap` entries may hold `n` keys (at most 4/5 full).
#[inline(always)]
fn fits(n: usize, cap: usize) -> bool {
    n.saturating_mul(5) <= cap.saturating_mul(4)
}

impl KeyMap {
    /// An empty map for a shard holding at most `max_rows` keys (no memory until the first key).
    pub(super) fn new(max_rows: usize) -> Self {
        let max_table = max_rows.saturating_mul(5).div_ceil(4).max(MIN_TABLE);
        KeyMap { entries: Vec::new(), len: 0, max_table }
    }

    /// The home position of hash `h` in a table of `cap` entries.
    #[inline(always)]
    fn home(h: u64, cap: usize) -> usize {
        (((h & 0xffff_ffff) as u128 * cap as u128) >> 32) as usize
    }

    /// The position after `i`.
    #[inline(always)]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.entries.len() { 0 } else { i + 1 }
    }

    /// Where `key` would be looked for first (`h = mix(key)`): for prefetching.
    #[inline(always)]
    pub(super) fn probe_start(&self, h: u64) -> *const u8 {
        let cap = self.entries.len();
        if cap == 0 {
            return std::ptr::null();
        }
        self.entries[Self::home(h, cap)..].as_ptr().cast()
    }

    /// The slot of `key` (`h = mix(key)`).
    #[inline]
    pub(super) fn find(&self, key: u64, h: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mut i = Self::home(h, self.entries.len());
        loop {
            let e = self.entries[i];
            if e.slot1 == 0 {
                return None;
            }
            if e.key() == key {
                return Some(e.slot1 - 1);
            }
            i = self.next(i);
        }
    }

    /// Every (key, slot) held, in table order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries.iter().filter(|e| e.slot1 != 0).map(|e| (e.key(), e.slot1 - 1))
    }

    /// Makes room for one more key; false when the bigger table cannot be allocated (or the
    /// shard's most rows are already held).
    pub(super) fn reserve_one(&mut self) -> bool {
        let need = self.len + 1;
        if fits(need, self.entries.len()) {
            return true;
        }
        let mut cap = (self.entries.len() * 2).max(MIN_TABLE);
        while !fits(need, cap) {
            cap *= 2;
        }
        let cap = cap.min(self.max_table.max(need.saturating_mul(5).div_ceil(4)));
        if !fits(need, cap) {
            return false;
        }
        let mut entries = Vec::new();
        if entries.try_reserve_exact(cap).is_err() {
            return false;
        }
        entries.resize(cap, Entry::default());
        let old = std::mem::replace(&mut self.entries, entries);
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
        let mut i = Self::home(h, self.entries.len());
        while self.entries[i].slot1 != 0 {
            i = self.next(i);
        }
        self.entries[i] = e;
    }

    /// Adds an absent key; [`KeyMap::reserve_one`] must have succeeded first.
    pub(super) fn insert_new(&mut self, key: u64, h: u64, slot: u32) {
        debug_assert!(self.find(key, h).is_none());
        debug_assert!(fits(self.len + 1, self.entries.len()));
        self.place(Entry { lo: key as u32, hi: (key >> 32) as u32, slot1: slot + 1 }, h);
        self.len += 1;
    }

    /// Removes `key` and returns its slot. Backward-shift deletion: later entries of the
    /// probe run move back into the hole when their home position allows it.
    pub(super) fn remove(&mut self, key: u64, h: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let cap = self.entries.len();
        let mut i = Self::home(h, cap);
        loop {
            let e = self.entries[i];
            if e.slot1 == 0 {
                return None;
            }
            if e.key() == key {
                break;
            }
            i = self.next(i);
        }
        let slot = self.entries[i].slot1 - 1;
        // Distance from a to b going forward around the table.
        let dist = |a: usize, b: usize| if b >= a { b - a } else { b + cap - a };
        let mut j = i;
        loop {
            j = self.next(j);
            let e = self.entries[j];
            if e.slot1 == 0 {
                break;
            }
            let home = Self::home(mix(e.key()), cap);
            // `e` may fill the hole at `i` when `i` lies on its probe path (home ..= j).
            if dist(home, j) >= dist(i, j) {
                self.entries[i] = e;
                i = j;
            }
        }
        self.entries[i] = Entry::default();
        self.len -= 1;
        Some(slot)
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Keys the map holds without growing.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.entries.len() * 4 / 5
    }

    /// Bytes of memory held.
    pub(super) fn bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }
}
