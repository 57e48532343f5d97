//! A shard's key -> slot map: a [`hashbrown::HashTable`] of 12-byte entries (key, slot).
//!
//! The caller hashes each key once with [`mix`] and passes the hash in. The table holds at most
//! 7/8 of its buckets, and 13 bytes per bucket (the entry and a control byte); it grows by
//! doubling, and a table filled up by removed keys' tombstones is rebuilt at its size (see
//! [`KeyMap::reserve_one`]).

use crate::util::hash::mix;
use hashbrown::HashTable;

/// One entry: a key (as two halves, so the entry is 12 bytes, not 16) and its slot.
#[derive(Clone, Copy)]
struct Entry {
    lo: u32,
    hi: u32,
    slot: u32,
}

impl Entry {
    #[inline(always)]
    fn key(self) -> u64 {
        (self.hi as u64) << 32 | self.lo as u64
    }
}

/// The table's hash for a key hashed `h = mix(key)`. The table places a key by the low bits of
/// its hash and tags it with the top 7, but the shard already came from the top bits of `h`
/// (every key in a shard shares them), so the tag is refreshed with bits 32..39 of `h`. The
/// low bits, and so the place, are `h`'s own.
#[inline(always)]
fn table_hash(h: u64) -> u64 {
    h ^ (h >> 32 << 57)
}

#[inline(always)]
fn rehash(e: &Entry) -> u64 {
    table_hash(mix(e.key()))
}

/// A key -> slot map.
pub(super) struct KeyMap {
    table: HashTable<Entry>,
}

impl KeyMap {
    pub(super) fn new() -> Self {
        KeyMap { table: HashTable::new() }
    }

    /// The slot of `key` (`h = mix(key)`).
    #[inline]
    pub(super) fn find(&self, key: u64, h: u64) -> Option<u32> {
        self.table.find(table_hash(h), |e| e.key() == key).map(|e| e.slot)
    }

    /// Makes room for one more key; false when the bigger table cannot be allocated.
    ///
    /// When the table is out of room it is rebuilt here, sized for its keys plus an eighth
    /// more, instead of being left to [`HashTable::try_reserve`]: that one doubles any table
    /// more than half full, even when the room went to the tombstones of removed keys, so a
    /// shard that evicts and inserts at its margin would end up with twice the buckets it
    /// needs. Rebuilding costs one move per key, at most once per `len / 8` inserts.
    pub(super) fn reserve_one(&mut self) -> bool {
        let len = self.table.len();
        if len < self.table.capacity() {
            return true;
        }
        let mut fresh = HashTable::new();
        if fresh.try_reserve(len + 1 + len / 8, rehash).is_err() {
            return false;
        }
        for e in std::mem::replace(&mut self.table, fresh) {
            self.table.insert_unique(rehash(&e), e, rehash);
        }
        true
    }

    /// Adds an absent key; [`KeyMap::reserve_one`] must have succeeded first (so this never
    /// allocates).
    pub(super) fn insert_new(&mut self, key: u64, h: u64, slot: u32) {
        debug_assert!(self.find(key, h).is_none());
        debug_assert!(self.table.len() < self.table.capacity());
        self.table.insert_unique(table_hash(h), Entry { lo: key as u32, hi: (key >> 32) as u32, slot }, rehash);
    }

    /// Removes `key` and returns its slot.
    pub(super) fn remove(&mut self, key: u64, h: u64) -> Option<u32> {
        match self.table.find_entry(table_hash(h), |e| e.key() == key) {
            Ok(entry) => Some(entry.remove().0.slot),
            Err(_) => None,
        }
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Keys the map holds without growing.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Bytes of memory held.
    pub(super) fn bytes(&self) -> usize {
        self.table.allocation_size()
    }
}
