//! Pooled lookups on CUDA tensors. PLACEHOLDER while the kernels are written: refuses.

use crate::error::{Error, Result};
use crate::model::{GpuOptions, LookupOptions, LookupStats, Pooling, RowSource};
use super::residency::Residency;
use dlpark::ffi::DLTensor;

/// A pooled lookup where a tensor is a CUDA tensor.
///
/// # Safety
/// As for `Table::lookup_pooled`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn lookup(
    _table: &dyn RowSource,
    _gpu: &GpuOptions,
    _resident: &Residency,
    _keys: &DLTensor,
    _offsets: Option<&DLTensor>,
    _weights: Option<&DLTensor>,
    _pooling: Pooling,
    _out: &DLTensor,
    _opts: &LookupOptions,
    _want_stats: bool,
) -> Result<LookupStats> {
    Err(Error::Device { arg: "keys", msg: "pooled lookups on CUDA tensors: not built yet".into() })
}
