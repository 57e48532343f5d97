//! Row formats: how a table stores one row. Float rows hold `dim` elements of a float dtype;
//! quantized rows are FBGEMM's fused row-wise layouts, byte for byte, so weights FBGEMM or
//! TorchRec quantized can be handed over unchanged:
//!
//! | format | a row of `dim` values | bytes |
//! | --- | --- | --- |
//! | [`RowFormat::Int8`] | `dim` uint8, then float32 scale, float32 bias | `dim + 8` |
//! | [`RowFormat::Int4`] | `dim / 2` bytes (element `2i` in the low nibble of byte `i`), then float16 scale, float16 bias | `dim / 2 + 4` |
//! | [`RowFormat::Fp8`] | `dim` float8 e4m3fn (OCP FP8: 1 sign, 4 exponent, 3 mantissa bits, bias 7, no infinities), then float32 scale | `dim + 4` |
//!
//! An int8/int4 value `q` stands for `fma(q, scale, bias)` in float32 (one rounding, as FBGEMM's
//! dequantizing kernels compute it); an fp8 value `e` for `float(e) * scale` (one rounding).
//! fp8 rows are scaled so that the row's largest magnitude is e4m3's largest, 448, and rounded
//! to nearest even (PyTorch's `float8_e4m3fn` cast of `x / scale`). [`quantize_row`] is FBGEMM's quantizer
//! (`FloatToFused8BitRowwiseQuantized`, `FloatToFusedNBitRowwiseQuantizedSBHalf` with 4 bits),
//! bit for bit. Everything here is a plain function of its arguments: any thread may call it.

use crate::dlpack::FloatDtype;

/// How a table stores its rows; fixed when the table is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFormat {
    /// `dim` elements of a float dtype.
    Float(FloatDtype),
    /// FBGEMM's fused 8-bit row-wise layout: `dim` uint8, float32 scale, float32 bias.
    Int8,
    /// FBGEMM's fused 4-bit row-wise layout (`dim` even): two values a byte, low nibble first,
    /// then float16 scale and float16 bias.
    Int4,
    /// `dim` float8 e4m3fn values, then a float32 scale.
    Fp8,
}

impl From<FloatDtype> for RowFormat {
    fn from(d: FloatDtype) -> Self {
        RowFormat::Float(d)
    }
}

impl RowFormat {
    /// Bytes of one row of `dim` values.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            RowFormat::Float(d) => dim * d.size(),
            RowFormat::Int8 => dim + 8,
            RowFormat::Int4 => dim.div_ceil(2) + 4,
            RowFormat::Fp8 => dim + 4,
        }
    }

    /// The float dtype of float rows; `None` for quantized ones.
    pub fn float(self) -> Option<FloatDtype> {
        match self {
            RowFormat::Float(d) => Some(d),
            _ => None,
        }
    }

    /// Whether rows are quantized.
    pub fn is_quantized(self) -> bool {
        self.float().is_none()
    }

    /// The format's name, as `Table.from_array(storage=...)` and `ps.json` spell it.
    pub fn name(self) -> &'static str {
        match self {
            RowFormat::Float(FloatDtype::F32) => "float32",
            RowFormat::Float(FloatDtype::F16) => "float16",
            RowFormat::Float(FloatDtype::BF16) => "bfloat16",
            RowFormat::Int8 => "int8",
            RowFormat::Int4 => "int4",
            RowFormat::Fp8 => "fp8",
        }
    }

    /// The format a name stands for (see [`RowFormat::name`]).
    pub fn parse(s: &str) -> Option<RowFormat> {
        [
            RowFormat::Float(FloatDtype::F32),
            RowFormat::Float(FloatDtype::F16),
            RowFormat::Float(FloatDtype::BF16),
            RowFormat::Int8,
            RowFormat::Int4,
            RowFormat::Fp8,
        ]
        .into_iter()
        .find(|f| f.name() == s)
    }

    /// Why `dim` cannot be stored in this format, if it cannot.
    pub fn check_dim(self, dim: usize) -> Option<String> {
        (self == RowFormat::Int4 && !dim.is_multiple_of(2))
            .then(|| format!("dim = {dim}; int4 rows hold two values a byte and need an even dim (as FBGEMM's)"))
    }
}

/// Rounds to the nearest integer, ties to even, and keeps the low 8 bits (C's `lrintf`
/// stored into a `uint8_t`).
#[inline]
fn lrint_u8(x: f32) -> u8 {
    x.round_ties_even() as i64 as u8
}

/// Quantizes one row of `src.len()` float32 values into `dst` (`format.row_bytes(src.len())`
/// bytes) as FBGEMM's quantizer does. Float formats store the values rounded to nearest even.
/// Fails, saying why, on a NaN or infinite value, and for int4 on values whose scale or bias
/// does not fit a float16 (beyond about ±65504, where FBGEMM would store an infinity); `dst`
/// then holds nothing meaningful.
///
/// # Panics
/// When `dst` is not `format.row_bytes(src.len())` long, or an int4 row has an odd length.
pub fn quantize_row(format: RowFormat, src: &[f32], dst: &mut [u8]) -> Result<(), String> {
    let dim = src.len();
    assert_eq!(dst.len(), format.row_bytes(dim), "quantize_row: row bytes");
    if let Some(c) = src.iter().position(|x| !x.is_finite())
        && format.is_quantized()
    {
        return Err(format!("value {} at column {c}; {} rows need finite values", src[c], format.name()));
    }
    let (min, max) = src.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    match format {
        RowFormat::Float(d) => {
            for (c, &x) in src.iter().enumerate() {
                match d {
                    FloatDtype::F32 => dst[c * 4..c * 4 + 4].copy_from_slice(&x.to_le_bytes()),
                    FloatDtype::F16 => dst[c * 2..c * 2 + 2].copy_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                    FloatDtype::BF16 => dst[c * 2..c * 2 + 2].copy_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
                }
            }
        }
        RowFormat::Int8 => {
            // FBGEMM: scale = range / 255, bias = min, q = lrint((x - min) * 255 / (range + 1e-8)).
            let range = max - min;
            if !range.is_finite() {
                return Err(format!("values from {min} to {max}; an int8 row's range (max - min) must be a finite float32"));
            }
            let inverse = 255.0f32 / (range + 1e-8f32);
            for (q, &x) in dst[..dim].iter_mut().zip(src) {
                *q = lrint_u8((x - min) * inverse);
            }
            dst[dim..dim + 4].copy_from_slice(&(range / 255.0f32).to_le_bytes());
            dst[dim + 4..dim + 8].copy_from_slice(&min.to_le_bytes());
        }
        RowFormat::Int4 => {
            assert!(dim.is_multiple_of(2), "quantize_row: int4 rows need an even dim");
            // FBGEMM: the bias is min rounded to float16, the scale range / 15 rounded to
            // float16 (1 when that is 0 or its inverse overflows), q clamped to 0..=15.
            let bias = half::f16::from_f32(min);
            let min = bias.to_f32();
            let range = max - min;
            let mut scale = half::f16::from_f32(if range == 0.0 { 1.0 } else { range / 15.0 }).to_f32();
            if scale == 0.0 {
                scale = 1.0;
            }
            let mut inverse = 1.0f32 / scale;
            if inverse.is_infinite() {
                scale = 1.0;
                inverse = 1.0;
            }
            if !bias.is_finite() || !scale.is_finite() {
                return Err(format!("values from {min} to {max}; an int4 row's float16 scale and bias need values within about ±65504"));
            }
            let bytes = dim / 2;
            for (i, b) in dst[..bytes].iter_mut().enumerate() {
                let q = |x: f32| ((x - min) * inverse).round_ties_even().clamp(0.0, 15.0) as u8;
                *b = q(src[2 * i]) | (q(src[2 * i + 1]) << 4);
            }
            dst[bytes..bytes + 2].copy_from_slice(&half::f16::from_f32(scale).to_le_bytes());
            dst[bytes + 2..bytes + 4].copy_from_slice(&bias.to_le_bytes());
        }
        RowFormat::Fp8 => {
            // scale = max |x| / 448 (1 for a row of zeros), e = e4m3(x / scale).
            let amax = min.abs().max(max.abs());
            let scale = if amax == 0.0 { 1.0 } else { amax / 448.0 };
            if !(scale.is_finite() && scale > 0.0) {
                return Err(format!("values up to {amax} in magnitude; an fp8 row's scale (max |x| / 448) must be a positive float32"));
            }
            for (q, &x) in dst[..dim].iter_mut().zip(src) {
                *q = f32_to_e4m3(x / scale);
            }
            dst[dim..dim + 4].copy_from_slice(&scale.to_le_bytes());
        }
    }
    Ok(())
}

/// `x` as float8 e4m3fn, rounded to nearest even, magnitudes beyond 448 saturated to 448 (`x`
/// finite).
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    let code = if a < 2f32.powi(-6) {
        // Subnormals: m * 2^-9, m = 0..=7 (8 is the smallest normal, 2^-6, code 8).
        (a * 512.0).round_ties_even() as u8
    } else {
        // The exponent from the float32's own bits (exact), at most 8 (saturated below).
        let e = ((a.to_bits() >> 23) as i32 - 127).min(8);
        let m = (a / 2f32.powi(e) * 8.0 - 8.0).round_ties_even() as i32; // 0..=8 below 2^9
        let (e, m) = if m >= 8 { (e + 1, 0) } else { (e, m) };
        (((e + 7) << 3) | m).min(0x7E) as u8
    };
    sign | code
}

/// A float8 e4m3fn value widened to float32 (exact; 0x7F, e4m3fn's NaN, which the quantizer
/// never writes, reads as 480).
#[inline(always)]
pub fn e4m3_to_f32(e: u8) -> f32 {
    // The magnitude bits put at float32's exponent and mantissa positions, times 2^120: normal
    // and subnormal codes alike (what the SIMD kernels do).
    let bits = ((e as u32 & 0x7F) << 20) | ((e as u32 & 0x80) << 24);
    f32::from_bits(bits) * f32::from_bits(0x7B80_0000) // 2^120
}

/// Value `col` of the row of `dim` values at `row`, in float32 (the scalar reference every
/// kernel matches).
///
/// # Safety
/// `row` must be readable for `format.row_bytes(dim)` bytes, aligned for a float format's
/// element; `col < dim`.
#[inline(always)]
pub unsafe fn value(format: RowFormat, row: *const u8, dim: usize, col: usize) -> f32 {
    // SAFETY: the caller's row holds row_bytes(dim) bytes and col < dim, so every read below is
    // inside it; quantized rows are read unaligned.
    unsafe {
        match format {
            RowFormat::Float(d) => d.load_f32(row.add(col * d.size())),
            RowFormat::Int8 => {
                let (scale, bias) = int8_params(row, dim);
                (*row.add(col) as f32).mul_add(scale, bias)
            }
            RowFormat::Int4 => {
                let (scale, bias) = int4_params(row, dim);
                let b = *row.add(col / 2);
                (((b >> ((col & 1) * 4)) & 15) as f32).mul_add(scale, bias)
            }
            RowFormat::Fp8 => e4m3_to_f32(*row.add(col)) * fp8_scale(row, dim),
        }
    }
}

/// The float32 scale and bias of an int8 row of `dim` values.
///
/// # Safety
/// `row` readable for `dim + 8` bytes.
#[inline(always)]
pub(crate) unsafe fn int8_params(row: *const u8, dim: usize) -> (f32, f32) {
    // SAFETY: the caller's row holds dim + 8 bytes; read unaligned.
    unsafe { ((row.add(dim) as *const f32).read_unaligned(), (row.add(dim + 4) as *const f32).read_unaligned()) }
}

/// The float32 scale of an fp8 row of `dim` values.
///
/// # Safety
/// `row` readable for `dim + 4` bytes.
#[inline(always)]
pub(crate) unsafe fn fp8_scale(row: *const u8, dim: usize) -> f32 {
    // SAFETY: the caller's row holds dim + 4 bytes; read unaligned.
    unsafe { (row.add(dim) as *const f32).read_unaligned() }
}

/// The scale and bias of an int4 row of `dim` values, widened to float32.
///
/// # Safety
/// `row` readable for `dim / 2 + 4` bytes.
#[inline(always)]
pub(crate) unsafe fn int4_params(row: *const u8, dim: usize) -> (f32, f32) {
    let at = dim.div_ceil(2);
    // SAFETY: the caller's row holds at + 4 bytes; read unaligned.
    unsafe {
        let s = (row.add(at) as *const u16).read_unaligned();
        let b = (row.add(at + 2) as *const u16).read_unaligned();
        (half::f16::from_bits(s).to_f32(), half::f16::from_bits(b).to_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(seed: u64, n: usize, dim: usize, int4: bool) -> Vec<Vec<f32>> {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..n)
            .map(|i| {
                (0..dim)
                    .map(|_| match i % 4 {
                        0 => 3.5, // a constant row: range 0
                        1 => ((next() % 2_000_001) as f32 - 1e6) * 1e-30,
                        2 => ((next() % 2_000_001) as f32 - 1e6) * if int4 { 0.03 } else { 1e24 },
                        _ => ((next() % 20_001) as f32 - 10_000.0) / 777.0,
                    })
                    .collect()
            })
            .collect()
    }

    /// int8: the scale and bias as FBGEMM writes them, every value within half a step of its
    /// input, and the dequantized value the reference formula.
    #[test]
    fn int8_rows_round_trip_within_half_a_step() {
        for dim in [1, 2, 7, 64, 129] {
            for row in rows(7, 12, dim, false) {
                let mut q = vec![0u8; RowFormat::Int8.row_bytes(dim)];
                quantize_row(RowFormat::Int8, &row, &mut q).unwrap();
                let (min, max) = row.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
                // SAFETY: q holds one int8 row of dim values.
                let (scale, bias) = unsafe { int8_params(q.as_ptr(), dim) };
                assert_eq!(bias, min);
                assert_eq!(scale, (max - min) / 255.0);
                for c in 0..dim {
                    // SAFETY: as above, c < dim.
                    let v = unsafe { value(RowFormat::Int8, q.as_ptr(), dim, c) };
                    assert_eq!(v, (q[c] as f32).mul_add(scale, bias));
                    // Below FBGEMM's epsilon (1e-8) a range is not resolved: values fall to the bias.
                    let tol = if max - min < 1e-6 { max - min } else { scale * 0.5001 + row[c].abs() * 1e-6 };
                    assert!((v - row[c]).abs() <= tol, "dim {dim} col {c}: {v} vs {}", row[c]);
                }
            }
        }
    }

    /// int4: float16 scale and bias, values clamped to 0..=15, packed low nibble first.
    #[test]
    fn int4_rows_pack_two_values_a_byte() {
        for dim in [2, 8, 64, 130] {
            for row in rows(11, 12, dim, true) {
                let mut q = vec![0u8; RowFormat::Int4.row_bytes(dim)];
                quantize_row(RowFormat::Int4, &row, &mut q).unwrap();
                // SAFETY: q holds one int4 row of dim values.
                let (scale, bias) = unsafe { int4_params(q.as_ptr(), dim) };
                let min = row.iter().copied().fold(f32::INFINITY, f32::min);
                assert_eq!(bias, half::f16::from_f32(min).to_f32());
                for c in 0..dim {
                    let nib = (q[c / 2] >> ((c % 2) * 4)) & 15;
                    // SAFETY: c < dim.
                    let v = unsafe { value(RowFormat::Int4, q.as_ptr(), dim, c) };
                    assert_eq!(v, (nib as f32).mul_add(scale, bias));
                }
            }
        }
        assert!(RowFormat::Int4.check_dim(3).is_some() && RowFormat::Int4.check_dim(4).is_none());
    }

    /// fp8: every e4m3fn code widens exactly (against a decoding from its fields), the
    /// encoder rounds every float32 between codes to the nearer code (ties to the even code)
    /// and saturates beyond 448, and a row's largest magnitude becomes 448 times its scale.
    #[test]
    fn fp8_rows_are_e4m3fn_scaled_to_448() {
        let decode = |e: u8| {
            let (s, ex, m) = ((e >> 7) as i32, ((e >> 3) & 15) as i32, (e & 7) as f64);
            let mag = if ex == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(ex - 7) };
            (if s == 1 { -mag } else { mag }) as f32
        };
        for e in 0..=255u8 {
            if e & 0x7F == 0x7F {
                continue;
            }
            assert_eq!(e4m3_to_f32(e).to_bits(), decode(e).to_bits(), "code {e:#x}");
            assert_eq!(f32_to_e4m3(decode(e)) & 0x7F, e & 0x7F, "code {e:#x} round trip");
        }
        // Between neighbouring codes: the nearer one; at the midpoint the even one.
        for e in 0..0x7Eu8 {
            let (lo, hi) = (decode(e), decode(e + 1));
            let mid = (lo + hi) / 2.0;
            assert_eq!(f32_to_e4m3(mid), if e % 2 == 0 { e } else { e + 1 }, "midpoint above {e:#x}");
            assert_eq!(f32_to_e4m3(lo + (hi - lo) * 0.25), e);
            assert_eq!(f32_to_e4m3(lo + (hi - lo) * 0.75), e + 1);
            assert_eq!(f32_to_e4m3(-(lo + (hi - lo) * 0.75)), 0x80 | (e + 1));
        }
        assert_eq!(f32_to_e4m3(1e9), 0x7E);
        assert_eq!(f32_to_e4m3(-500.0), 0xFE);
        for row in rows(3, 12, 32, false) {
            let mut q = vec![0u8; RowFormat::Fp8.row_bytes(32)];
            quantize_row(RowFormat::Fp8, &row, &mut q).unwrap();
            // SAFETY: q holds one fp8 row of 32 values.
            let scale = unsafe { fp8_scale(q.as_ptr(), 32) };
            let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            let at = row.iter().position(|x| x.abs() == amax).unwrap();
            assert_eq!(q[at] & 0x7F, 0x7E, "the largest magnitude is 448");
            // SAFETY: as above.
            let v = unsafe { value(RowFormat::Fp8, q.as_ptr(), 32, at) };
            assert!((v.abs() - amax).abs() <= amax * 1e-6, "{v} vs {amax} (scale {scale})");
        }
    }

    /// NaN and infinities are refused with their column.
    #[test]
    fn non_finite_values_are_refused() {
        for f in [RowFormat::Int8, RowFormat::Int4, RowFormat::Fp8] {
            let mut q = vec![0u8; f.row_bytes(4)];
            assert!(quantize_row(f, &[1.0, 2.0, f32::NAN, 0.0], &mut q).unwrap_err().contains("column 2"));
            assert!(quantize_row(f, &[f32::NEG_INFINITY, 2.0, 1.0, 0.0], &mut q).unwrap_err().contains("column 0"));
        }
        let mut q = vec![0u8; RowFormat::Int8.row_bytes(2)];
        assert!(quantize_row(RowFormat::Int8, &[-3e38, 3e38], &mut q).unwrap_err().contains("finite"));
        let mut q = vec![0u8; RowFormat::Int4.row_bytes(2)];
        assert!(quantize_row(RowFormat::Int4, &[-1e6, 1.0], &mut q).unwrap_err().contains("65504"));
        assert!(quantize_row(RowFormat::Int4, &[0.0, 1e6], &mut q).unwrap_err().contains("65504"));
        for f in ["float32", "float16", "bfloat16", "int8", "int4", "fp8"] {
            assert_eq!(RowFormat::parse(f).unwrap().name(), f);
        }
        assert_eq!(RowFormat::parse("int2"), None);
    }
}
