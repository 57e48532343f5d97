//! Small utilities every layer may use: the key hash, software prefetch, anonymous memory, a
//! lock that survives poisoning, thread counts, and (feature `cuda`) whether CUDA devices are present.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod hash;
pub(crate) mod lock;
pub(crate) mod memory;
mod prefetch;
pub mod threads;

pub use prefetch::prefetch;
