//! Storage tiers of a parameter-server table: a volatile in-memory tier in front of a
//! persistent on-disk tier, looked up in that order before the table's default value.

pub mod persistent;
pub mod volatile;
