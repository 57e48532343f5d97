//! Executing lookups: the CPU thread pool ([`pool`]), the gather ([`cpu`]), pooled lookups
//! (`pooled`), a batch's host requests as one piece of work (`batch`), the tiered fetch
//! ([`tiered`]), and the CUDA kernels ([`cuda`], feature `cuda`). The row kernels they all use
//! are the leaf [`crate::kernels`].

pub(crate) mod batch;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod pool;
pub(crate) mod pooled;
pub mod tiered;
