//! Executing lookups: the CPU thread pool ([`pool`]) and gather kernels ([`cpu`]), and the
//! CUDA kernels ([`cuda`], feature `cuda`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod pool;
pub(crate) mod pooled;
pub mod tiered;
