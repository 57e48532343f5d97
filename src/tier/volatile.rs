//! The volatile tier: a sharded in-memory hash map with bounded capacity and eviction.
