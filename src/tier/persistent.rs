//! The persistent tier: an LMDB environment on local disk.
