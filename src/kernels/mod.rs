//! Row kernels: the leaf every CPU executor (plain, pooled, tiered, distributed, the host side of
//! a batch) uses to touch rows. Nothing here knows tables, plans or tensors: a kernel gets
//! addresses, a length and a dtype.
//!
//! - [`row_fn`]: copy or convert one row, table dtype to out dtype, contiguous or strided, with
//!   ordinary or non-temporal stores ([`copy`]);
//! - [`Pooler`]: add a run of rows, each scaled by its weight or not, into a float32
//!   accumulator held in vector registers, prefetching rows ahead ([`pool`]);
//! - [`prefetch_row`]: hint every cache line of a row;
//! - [`keys::count_at_least`]: count the keys past a dense store (its misses) ([`keys`]).
//!
//! The instruction set is chosen once per process ([`isa`]): AVX-512 (AVX512F), else AVX2 with
//! F16C and FMA, else the portable code, which every build has and the tests also run.
//! `STRATA_KERNELS=portable|avx2|avx512` asks for a lower set than the CPU has (never a higher
//! one). Row formats ([`format`]): float32, float16, bfloat16, FBGEMM's fused int8 and int4
//! row-wise layouts and fp8 (e4m3fn with a row scale); each is one `Elem` of [`pool`], which
//! also gives its dequantizing copy.
//! Threading: kernels are plain functions on the caller's thread; any thread may call them.

pub mod copy;
pub mod format;
pub mod keys;
pub mod pool;

pub use copy::{row_fn, store_fence};
pub use format::{RowFormat, quantize_row};
pub use pool::round_trip;

/// Copies one row of `dim` values from `src` (table format) to `dst` (out dtype, `col_stride`
/// elements apart).
///
/// Safety: `src` must be readable for one row of `dim` values of the source format (float
/// rows: contiguous, aligned elements), and `dst` writable for `dim` aligned elements of the out
/// dtype `col_stride` elements apart, not overlapping `src`. [`row_fn`] picks the contiguous
/// kernels only for `col_stride == 1`.
pub type RowFn = unsafe fn(src: *const u8, dst: *mut u8, dim: usize, col_stride: usize);
pub use pool::{Divide, Pooler, RowsOf};

/// An instruction set the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler for the build's baseline (SSE2 on x86-64).
    Portable,
    /// AVX2 with F16C and FMA: 8 float32 lanes, half-precision conversion and fused
    /// multiply-add (quantized rows) in hardware.
    Avx2,
    /// AVX-512 (AVX512F): 16 float32 lanes, 32 vector registers.
    Avx512,
}

impl Isa {
    /// The best set this CPU supports.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every set this CPU can run, lowest first (the tests compare each with the portable one).
    pub fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= Isa::detected()).collect()
    }

    /// The set's name, as `STRATA_KERNELS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    fn parse(s: &str) -> Option<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512].into_iter().find(|i| i.name() == s.trim())
    }
}

/// The instruction set the library's kernels use: [`Isa::detected`], lowered by
/// `STRATA_KERNELS` (read once; an unknown value is ignored).
pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let best = Isa::detected();
        match std::env::var("STRATA_KERNELS").ok().as_deref().and_then(Isa::parse) {
            Some(asked) => asked.min(best),
            None => best,
        }
    })
}

/// Hints every cache line of the `bytes` at `p` (up to the first 1 KiB) into cache. NULL: nothing.
/// A hint never faults, whatever the address.
#[inline(always)]
pub fn prefetch_row(p: *const u8, bytes: usize) {
    if p.is_null() || bytes == 0 {
        return;
    }
    let first = p as usize & !63;
    let last = (p as usize + bytes.min(1024) - 1) & !63;
    let mut line = first;
    while line <= last {
        crate::util::prefetch(line as *const u8);
        line += 64;
    }
}
