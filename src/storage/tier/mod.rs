//! Storage tiers of a parameter-server table: a volatile in-memory tier in front of a
//! persistent on-disk tier, looked up in that order before the table's default value. The
//! volatile tier is either in the process ([`volatile`]) or in a Redis cluster shared by many
//! processes ([`redis`]).

pub mod persistent;
pub mod redis;
pub mod volatile;
