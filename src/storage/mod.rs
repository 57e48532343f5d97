//! Storage: where rows live and how keys find them, with no notion of a lookup.
//!
//! - [`store`]: a table's vectors (a copy, a caller's adopted tensor, or a mapped file);
//! - [`index`]: the keyed hash index of static tables;
//! - [`hugectr`]: HugeCTR's sparse model folders (`key` + `emb_vector`), checked in one place;
//! - [`tier`]: the parameter server's tiers, [`tier::volatile`] (host memory, evicting) and
//!   [`tier::persistent`] (LMDB).

pub mod hugectr;
pub mod index;
pub mod store;
pub mod tier;
