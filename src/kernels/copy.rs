//! Copying one row: table dtype to out dtype, contiguous or strided, with ordinary or
//! non-temporal (streaming) stores. [`row_fn`] picks the kernel of a combination once per call;
//! every executor that writes rows (plain, pooled, tiered, distributed) goes through it.

use super::format::RowFormat;
use crate::dlpack::FloatDtype;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::RowFn;

trait Elem: Copy {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}
impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl Elem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

unsafe fn copy_contiguous<const SIZE: usize>(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src and dst each hold dim contiguous SIZE-byte elements (this
    // kernel serves only col_stride 1 and equal dtypes) and do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, dim * SIZE) };
}

/// Copies `dim * SIZE` bytes with non-temporal stores (x86-64), ordinary ones elsewhere. The
/// caller issues [`store_fence`] before the output is handed back.
unsafe fn copy_streaming<const SIZE: usize>(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    let bytes = dim * SIZE;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the RowFn contract: src and dst each hold `bytes` contiguous bytes and do not
    // overlap. `head` bytes are copied plainly up to dst's next 16-byte boundary, then every
    // 64- and 16-byte step stays below `left`, so all reads and writes are inside the row;
    // the streaming stores need 16-byte aligned dst, which `head` provides, and the loads are
    // unaligned ones. SSE2 is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = ((16 - (dst as usize & 15)) & 15).min(bytes);
        if head != 0 {
            std::ptr::copy_nonoverlapping(src, dst, head);
        }
        let (mut s, mut d, mut left) = (src.add(head), dst.add(head), bytes - head);
        while left >= 64 {
            let a = _mm_loadu_si128(s as *const __m128i);
            let b = _mm_loadu_si128(s.add(16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(48) as *const __m128i);
            _mm_stream_si128(d as *mut __m128i, a);
            _mm_stream_si128(d.add(16) as *mut __m128i, b);
            _mm_stream_si128(d.add(32) as *mut __m128i, c);
            _mm_stream_si128(d.add(48) as *mut __m128i, e);
            s = s.add(64);
            d = d.add(64);
            left -= 64;
        }
        while left >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            s = s.add(16);
            d = d.add(16);
            left -= 16;
        }
        if left != 0 {
            std::ptr::copy_nonoverlapping(s, d, left);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the RowFn contract: src and dst each hold `bytes` contiguous bytes and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, bytes)
    };
}

/// [`copy_streaming`] with 32-byte loads and non-temporal stores, for CPUs with AVX (half the
/// instructions per row; [`row_fn`] picks it only where AVX is detected at run time). A row
/// that starts 16 bytes past a 32-byte boundary (as rows of a `malloc`ed output do) begins and
/// ends with one 16-byte streaming store, so no cache line is written both ways.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_streaming_avx<const SIZE: usize>(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    use std::arch::x86_64::{__m128i, __m256i, _mm_loadu_si128, _mm_stream_si128, _mm256_loadu_si256, _mm256_stream_si256};
    let bytes = dim * SIZE;
    // SAFETY: the RowFn contract: src and dst each hold `bytes` contiguous bytes and do not
    // overlap. `head` bytes are copied plainly up to dst's next 16-byte boundary; the 16-byte
    // step to a 32-byte boundary, every 64- and 32-byte step and the last 16-byte step each
    // stay below `left`, so all reads and writes are inside the row. The streaming stores get
    // the alignment they need (16 bytes for the 128-bit ones, 32 for the 256-bit ones) from
    // the steps before them; the loads are unaligned ones. AVX is enabled on this function and
    // row_fn only picks it when the CPU has it.
    unsafe {
        let head = ((16 - (dst as usize & 15)) & 15).min(bytes);
        if head != 0 {
            std::ptr::copy_nonoverlapping(src, dst, head);
        }
        let (mut s, mut d, mut left) = (src.add(head), dst.add(head), bytes - head);
        if d as usize & 31 != 0 && left >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            s = s.add(16);
            d = d.add(16);
            left -= 16;
        }
        while left >= 64 {
            let a = _mm256_loadu_si256(s as *const __m256i);
            let b = _mm256_loadu_si256(s.add(32) as *const __m256i);
            _mm256_stream_si256(d as *mut __m256i, a);
            _mm256_stream_si256(d.add(32) as *mut __m256i, b);
            s = s.add(64);
            d = d.add(64);
            left -= 64;
        }
        if left >= 32 {
            _mm256_stream_si256(d as *mut __m256i, _mm256_loadu_si256(s as *const __m256i));
            s = s.add(32);
            d = d.add(32);
            left -= 32;
        }
        if left >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            s = s.add(16);
            d = d.add(16);
            left -= 16;
        }
        if left != 0 {
            std::ptr::copy_nonoverlapping(s, d, left);
        }
    }
}

/// The streaming copy for `SIZE`-byte elements: the AVX one where the CPU has AVX.
fn streaming<const SIZE: usize>() -> RowFn {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        return copy_streaming_avx::<SIZE>;
    }
    copy_streaming::<SIZE>
}

/// Orders earlier non-temporal stores before anything that follows.
#[inline]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

unsafe fn copy_strided<T: Copy>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
    let (s, d) = (src as *const T, dst as *mut T);
    for i in 0..dim {
        // SAFETY: the RowFn contract: src holds dim contiguous T and dst element i * cs is
        // inside the output row for i < dim; T matches both dtypes (row_fn pairs them).
        unsafe { *d.add(i * cs) = *s.add(i) };
    }
}

unsafe fn convert<S: Elem, D: Elem>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
    let (s, d) = (src as *const S, dst as *mut D);
    for i in 0..dim {
        // SAFETY: the RowFn contract: src holds dim contiguous S and dst element i * cs (a D) is
        // inside the output row for i < dim; row_fn pairs S and D with the two dtypes.
        unsafe { *d.add(i * cs) = D::from_f32((*s.add(i)).to_f32()) };
    }
}

unsafe fn f32_to_f16(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned f32 and dst dim aligned, contiguous f16
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe { (std::slice::from_raw_parts(src as *const f32, dim), std::slice::from_raw_parts_mut(dst as *mut f16, dim)) };
    d.convert_from_f32_slice(s);
}

unsafe fn f32_to_bf16(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned f32 and dst dim aligned, contiguous bf16
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe { (std::slice::from_raw_parts(src as *const f32, dim), std::slice::from_raw_parts_mut(dst as *mut bf16, dim)) };
    d.convert_from_f32_slice(s);
}

unsafe fn f16_to_f32(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned f16 and dst dim aligned, contiguous f32
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe { (std::slice::from_raw_parts(src as *const f16, dim), std::slice::from_raw_parts_mut(dst as *mut f32, dim)) };
    s.convert_to_f32_slice(d);
}

unsafe fn bf16_to_f32(src: *const u8, dst: *mut u8, dim: usize, _: usize) {
    // SAFETY: the RowFn contract: src holds dim aligned bf16 and dst dim aligned, contiguous f32
    // (row_fn picks this kernel only for col_stride 1), and the two do not overlap, so the
    // shared and the mutable slice alias nothing.
    let (s, d) = unsafe { (std::slice::from_raw_parts(src as *const bf16, dim), std::slice::from_raw_parts_mut(dst as *mut f32, dim)) };
    s.convert_to_f32_slice(d);
}

/// The row kernel for a (table row format, out dtype, contiguous row?, streaming?)
/// combination. Quantized rows are dequantized by the pooling layer's SIMD code
/// ([`super::pool::convert_fn`]), with ordinary stores.
pub fn row_fn(src: impl Into<RowFormat>, dst: FloatDtype, contiguous: bool, stream: bool) -> RowFn {
    use FloatDtype::*;
    let src = match src.into() {
        RowFormat::Float(d) => d,
        q => return super::pool::convert_fn(super::isa(), q, dst),
    };
    match (src, dst, contiguous) {
        (F32, F32, true) if stream => streaming::<4>(),
        (F16, F16, true) | (BF16, BF16, true) if stream => streaming::<2>(),
        (F32, F32, true) => copy_contiguous::<4>,
        (F16, F16, true) | (BF16, BF16, true) => copy_contiguous::<2>,
        (F32, F32, false) => copy_strided::<u32>,
        (F16, F16, false) | (BF16, BF16, false) => copy_strided::<u16>,
        (F32, F16, true) => f32_to_f16,
        (F32, BF16, true) => f32_to_bf16,
        (F16, F32, true) => f16_to_f32,
        (BF16, F32, true) => bf16_to_f32,
        (F32, F16, false) => convert::<f32, f16>,
        (F32, BF16, false) => convert::<f32, bf16>,
        (F16, F32, false) => convert::<f16, f32>,
        (BF16, F32, false) => convert::<bf16, f32>,
        (F16, BF16, _) => convert::<f16, bf16>,
        (BF16, F16, _) => convert::<bf16, f16>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both streaming copies, every destination alignment and row length up to a few lines:
    /// exactly the row's bytes change, to the source's values.
    #[test]
    fn streaming_copies_write_exactly_the_row() {
        let src: Vec<u8> = (0..700u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut kernels: Vec<RowFn> = vec![copy_streaming::<1>];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            kernels.push(copy_streaming_avx::<1>);
        }
        for kernel in kernels {
            for align in 0..64 {
                for len in (0..300).chain([511, 512, 513, 640]) {
                    let mut dst = vec![0xEEu8; 800];
                    let at = (64 - dst.as_ptr() as usize % 64) % 64 + align;
                    // SAFETY: src holds 700 >= len + 5 bytes, dst[at..] holds at least len bytes
                    // (at < 128, len <= 640, 800 bytes), and the two vectors do not overlap.
                    unsafe { kernel(src[5..].as_ptr(), dst[at..].as_mut_ptr(), len, 1) };
                    store_fence();
                    assert!(dst[..at].iter().all(|&b| b == 0xEE), "before the row: align {align} len {len}");
                    assert_eq!(&dst[at..at + len], &src[5..5 + len], "align {align} len {len}");
                    assert!(dst[at + len..].iter().all(|&b| b == 0xEE), "after the row: align {align} len {len}");
                }
            }
        }
    }
}
