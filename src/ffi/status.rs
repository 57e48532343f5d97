//! `strata_status`: the status every fallible C function returns, and the one mapping from the
//! core's errors to it.

use crate::error::ErrorKind;
use std::ffi::CStr;

/// Status code returned by every fallible C function. `STRATA_OK` is zero.
///
/// The values are part of the ABI: new codes are only ever appended.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum Status {
    /// Success.
    STRATA_OK = 0,
    /// A required pointer argument was NULL.
    STRATA_NULL_ARGUMENT = 1,
    /// An argument has the wrong rank, shape or value.
    STRATA_INVALID_ARGUMENT = 2,
    /// A tensor's dtype is not one this function accepts.
    STRATA_UNSUPPORTED_DTYPE = 3,
    /// A tensor lives on a device this build or machine cannot serve.
    STRATA_UNSUPPORTED_DEVICE = 4,
    /// Strides, byte offset or alignment describe memory strata cannot use safely.
    STRATA_INVALID_LAYOUT = 5,
    /// `out` is flagged read-only, or an update went to a table that cannot change.
    STRATA_READ_ONLY = 6,
    /// A key is missing and the table's options make that an error.
    STRATA_KEY_NOT_FOUND = 7,
    /// The same key appears twice in a table's keys.
    STRATA_DUPLICATE_KEY = 8,
    /// A file could not be opened, read or mapped.
    STRATA_IO_ERROR = 9,
    /// A table file is truncated or does not match its companion file or `dim`.
    STRATA_INVALID_FILE = 10,
    /// Memory for a table or index could not be allocated.
    STRATA_OUT_OF_MEMORY = 11,
    /// A bug inside strata (a caught panic); the message says where.
    STRATA_INTERNAL = 12,
    /// A parameter-server configuration (ps.json) is invalid; the message names the JSON path.
    STRATA_CONFIG_ERROR = 13,
    /// A persistent store (LMDB) failed, or a write went to a read-only table.
    STRATA_STORE_ERROR = 14,
    /// The CUDA driver failed (out of device memory, a failed launch or copy, an error left on
    /// the stream by earlier work); the message names the call and the driver's error.
    STRATA_CUDA_ERROR = 15,
}

impl Status {
    /// Every status, in value order.
    pub const ALL: [Status; 16] = [
        Status::STRATA_OK,
        Status::STRATA_NULL_ARGUMENT,
        Status::STRATA_INVALID_ARGUMENT,
        Status::STRATA_UNSUPPORTED_DTYPE,
        Status::STRATA_UNSUPPORTED_DEVICE,
        Status::STRATA_INVALID_LAYOUT,
        Status::STRATA_READ_ONLY,
        Status::STRATA_KEY_NOT_FOUND,
        Status::STRATA_DUPLICATE_KEY,
        Status::STRATA_IO_ERROR,
        Status::STRATA_INVALID_FILE,
        Status::STRATA_OUT_OF_MEMORY,
        Status::STRATA_INTERNAL,
        Status::STRATA_CONFIG_ERROR,
        Status::STRATA_STORE_ERROR,
        Status::STRATA_CUDA_ERROR,
    ];

    /// The status's C name, e.g. `"STRATA_KEY_NOT_FOUND"`, as a static C string.
    pub fn name(self) -> &'static CStr {
        match self {
            Status::STRATA_OK => c"STRATA_OK",
            Status::STRATA_NULL_ARGUMENT => c"STRATA_NULL_ARGUMENT",
            Status::STRATA_INVALID_ARGUMENT => c"STRATA_INVALID_ARGUMENT",
            Status::STRATA_UNSUPPORTED_DTYPE => c"STRATA_UNSUPPORTED_DTYPE",
            Status::STRATA_UNSUPPORTED_DEVICE => c"STRATA_UNSUPPORTED_DEVICE",
            Status::STRATA_INVALID_LAYOUT => c"STRATA_INVALID_LAYOUT",
            Status::STRATA_READ_ONLY => c"STRATA_READ_ONLY",
            Status::STRATA_KEY_NOT_FOUND => c"STRATA_KEY_NOT_FOUND",
            Status::STRATA_DUPLICATE_KEY => c"STRATA_DUPLICATE_KEY",
            Status::STRATA_IO_ERROR => c"STRATA_IO_ERROR",
            Status::STRATA_INVALID_FILE => c"STRATA_INVALID_FILE",
            Status::STRATA_OUT_OF_MEMORY => c"STRATA_OUT_OF_MEMORY",
            Status::STRATA_INTERNAL => c"STRATA_INTERNAL",
            Status::STRATA_CONFIG_ERROR => c"STRATA_CONFIG_ERROR",
            Status::STRATA_STORE_ERROR => c"STRATA_STORE_ERROR",
            Status::STRATA_CUDA_ERROR => c"STRATA_CUDA_ERROR",
        }
    }
}

/// Each kind of error is reported as the status of the same number: the one mapping from
/// errors to statuses.
impl From<ErrorKind> for Status {
    fn from(k: ErrorKind) -> Self {
        Status::ALL[k.code() as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_kind_has_the_status_of_its_number() {
        for k in ErrorKind::ALL {
            assert_eq!(Status::from(k) as i32, k.code());
        }
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as i32, i as i32);
            assert_eq!(format!("{s:?}"), s.name().to_str().unwrap());
        }
    }
}
