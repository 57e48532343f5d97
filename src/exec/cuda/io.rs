//! Where one CUDA lookup's keys are read and rows written ([`Io`]), and the kernels' names for
//! dtypes.

use crate::dlpack::{FloatDtype, KeyDtype};
use crate::kernels::RowFormat;

/// The kernels' name for a key dtype.
pub(crate) fn key_name(k: KeyDtype) -> &'static str {
    match k {
        KeyDtype::I32 => "i32",
        KeyDtype::I64 => "i64",
        KeyDtype::U32 => "u32",
        KeyDtype::U64 => "u64",
    }
}

/// The kernels' name for a float dtype.
pub(crate) fn float_name(f: FloatDtype) -> &'static str {
    match f {
        FloatDtype::F32 => "f32",
        FloatDtype::F16 => "f16",
        FloatDtype::BF16 => "bf16",
    }
}

/// The kernels' name for a table's row format: its float dtype's name, or `int8`, `int4`, `fp8`.
pub(crate) fn format_name(f: RowFormat) -> &'static str {
    match f {
        RowFormat::Float(d) => float_name(d),
        RowFormat::Int8 | RowFormat::Int4 | RowFormat::Fp8 => f.name(),
    }
}

/// Where one lookup's keys are read and rows written, as device-visible addresses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Io {
    pub keys: u64,
    pub key_dtype: KeyDtype,
    pub key_stride: i64,
    pub n: u64,
    pub out: u64,
    pub out_dtype: FloatDtype,
    pub out_row_stride: i64,
    pub out_col_stride: i64,
}
