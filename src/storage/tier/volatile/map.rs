//! A shard's key -> slot map.
//!
//! Open addressing with linear probing over 12-byte entries (key, slot + 1), a power-of-two
//! table kept at most 3/4 full, with backward-shift deletion (no tombstones). The caller hashes
//! each key once with [`mix`] and passes the hash in.
//!
//! Why not `hashbrown::HashTable`: it was tried (same 12-byte entries, plus a rebuild so that
//! tombstones never make it double) and measured. At the tiered benchmark's default size
//! (10M rows x 32, 500k rows per shard) it held more memory (volatile tier 335.3 MiB against
//! 331.3) and found keys more slowly (25-31 ns against 19-21 per uniform lookup, 17-22 against
//! 11-13 per Zipf(1.1) lookup, the two maps side by side in one process): a hit costs a cache
//! miss on the control bytes and another on the entry, where here the key sits in the entry
//! the probe lands on. The whole tiered lookup did not tell the two apart on a loaded 2-core
//! machine. hashbrown held less memory only where a shard's size falls between 3/4 and 7/8
//! of a power of two (63.2 MiB against 68.7 at 2M rows x 32).

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

/// Open-addressing key -> slot map with linear probing, at most 3/4 full.
pub(super) struct KeyMap {
    entries: Vec<Entry>,
    mask: usize,
    len: usize,
}

impl KeyMap {
    pub(super) fn new() -> Self {
        KeyMap { entries: Vec::new(), mask: 0, len: 0 }
    }

    /// The slot of `key` (`h = mix(key)`).
    #[inline]
    pub(super) fn find(&self, key: u64, h: u64) -> Option<u32> {
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
    pub(super) fn reserve_one(&mut self) -> bool {
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

    /// Adds an absent key; [`KeyMap::reserve_one`] must have succeeded first.
    pub(super) fn insert_new(&mut self, key: u64, h: u64, slot: u32) {
        debug_assert!(self.find(key, h).is_none());
        debug_assert!((self.len + 1) * 4 <= self.entries.len() * 3);
        self.place(Entry { lo: key as u32, hi: (key >> 32) as u32, slot1: slot + 1 }, h);
        self.len += 1;
    }

    /// Removes `key` and returns its slot. Backward-shift deletion: later entries of the
    /// probe run move back into the hole when their home position allows it.
    pub(super) fn remove(&mut self, key: u64, h: u64) -> Option<u32> {
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

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Keys the map holds without growing.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.entries.len() / 4 * 3
    }

    /// Bytes of memory held.
    pub(super) fn bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }
}
