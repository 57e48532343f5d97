//! Checks of managed DLPack tensors that only the C layer can make: the producer's DLPack
//! version and the tensor's flags.

use crate::error::{Error, Result};
use dlpark::{DlpackFlags, ManagedTensorBase};

/// Checks a managed tensor's version (major 1; explicit strides from 1.2 on, as DLPack 1.2
/// requires of producers, while older producers may pass NULL strides for row-major) and,
/// when `writable`, that it is not flagged read-only. `arg` names it in messages.
pub(crate) fn check_managed<M: ManagedTensorBase>(m: &M, arg: &'static str, writable: bool) -> Result<()> {
    if let Some(v) = m.version() {
        if v.major != dlpark::ffi::DLPACK_MAJOR_VERSION {
            return Err(Error::invalid(arg, format!("DLPack version {}.{}; expected major version 1", v.major, v.minor)));
        }
        if v.minor >= 2 && m.tensor().ndim != 0 && m.tensor().strides.is_null() {
            return Err(Error::layout(
                arg,
                format!("strides is NULL in a DLPack {}.{} tensor; expected explicit strides", v.major, v.minor),
            ));
        }
    }
    if writable && m.flags().contains(DlpackFlags::READ_ONLY) {
        return Err(Error::ReadOnly { arg });
    }
    Ok(())
}
