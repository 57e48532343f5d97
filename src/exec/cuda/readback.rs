//! What a failed CUDA lookup reads back from where the kernels read, for its message: the
//! first missing key.

use super::backend::Backend;
use crate::dlpack::KeyDtype;
use crate::error::{Error, Result};
use crate::model::RowSource;

/// Reads `n` elements of `elem` bytes at device-visible `addr + i * stride` elements back to
/// the host, compacted (after the stream has run the work).
pub(crate) fn read_back(b: &dyn Backend, addr: u64, elem: usize, stride: i64, n: usize) -> Result<Vec<u8>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let (lo, hi) = if stride >= 0 { (0, (n as i64 - 1) * stride) } else { ((n as i64 - 1) * stride, 0) };
    let span = ((hi - lo + 1) as usize) * elem;
    let mut raw = vec![0u8; span];
    b.download(raw.as_mut_ptr(), (addr as i64 + lo * elem as i64) as u64, span)?;
    let mut out = Vec::with_capacity(n * elem);
    for i in 0..n as i64 {
        let at = ((i * stride - lo) as usize) * elem;
        out.extend_from_slice(&raw[at..at + elem]);
    }
    Ok(out)
}

/// The error for the first key (in key order) the table lacks, keys read back from where the
/// kernels read them (`dtype` at `addr`, one per `stride` elements); `kd` is the caller's key
/// dtype, for the message.
pub(crate) fn first_missing(
    table: &dyn RowSource,
    kd: KeyDtype,
    b: &dyn Backend,
    addr: u64,
    dtype: KeyDtype,
    stride: i64,
    n: usize,
) -> Error {
    let elem = match dtype {
        KeyDtype::I32 | KeyDtype::U32 => 4,
        KeyDtype::I64 | KeyDtype::U64 => 8,
    };
    let Ok(raw) = read_back(b, addr, elem, stride, n) else {
        return Error::KeyNotFound { key: -1, index: 0 };
    };
    // Decoded from bytes (no aligned read through the byte buffer).
    let canonical: Vec<u64> = raw.chunks_exact(elem).filter_map(|c| dtype.decode(c)).collect();
    let mut rows = vec![0f32; canonical.len() * table.dim()];
    let mut found = vec![false; canonical.len()];
    if table.resolve(&canonical, &mut rows, &mut found).is_ok()
        && let Some(i) = found.iter().position(|&f| !f)
    {
        return Error::KeyNotFound { key: kd.value(canonical[i]), index: i };
    }
    Error::Internal("the GPU lookup counted missing keys that the host finds in the table".into())
}
