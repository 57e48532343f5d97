//! The one error type of strata and its mapping to `strata_status`.
//!
//! Every fallible function in the core returns [`Result<T>`]; the FFI layer turns an
//! [`Error`] into a [`Status`] with [`Error::status`] (the only place that mapping lives)
//! and stores its message for `strata_last_error`.

use std::ffi::CStr;

/// Result of every fallible strata operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
    pub(crate) const ALL: [Status; 16] = [
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

/// Everything that can go wrong in strata. `arg` fields name the C argument at fault
/// (`"keys"`, `"out"`, `"vectors"`, `"dir"`, ...), and the message says what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required pointer was NULL.
    #[error("{arg}: is NULL; expected a valid pointer")]
    Null { arg: &'static str },

    /// Wrong rank, shape or value.
    #[error("{arg}: {msg}")]
    Invalid { arg: &'static str, msg: String },

    /// Unsupported dtype.
    #[error("{arg}: dtype {got}; expected {expected}")]
    Dtype { arg: &'static str, got: String, expected: &'static str },

    /// Unsupported device.
    #[error("{arg}: {msg}")]
    Device { arg: &'static str, msg: String },

    /// Unusable strides, offset or alignment.
    #[error("{arg}: {msg}")]
    Layout { arg: &'static str, msg: String },

    /// `out` is flagged read-only.
    #[error("{arg}: is flagged DLPACK_FLAG_BITMASK_READ_ONLY; expected a writable tensor")]
    ReadOnly { arg: &'static str },

    /// An update to a table that cannot change.
    #[error("{what} is read-only: {why}")]
    Immutable { what: String, why: String },

    /// A key is missing and missing keys are errors for this table.
    #[error("keys: key {key} (element {index}) is not in the table; the table's options make a missing key an error")]
    KeyNotFound { key: i128, index: usize },

    /// A key appears twice among a table's keys.
    #[error("{arg}: key {key} appears at rows {first} and {second}; expected unique keys")]
    DuplicateKey { arg: &'static str, key: i128, first: u64, second: u64 },

    /// A file could not be opened, read or mapped.
    #[error("{arg}: {path}: {source}")]
    Io { arg: &'static str, path: String, source: std::io::Error },

    /// A table file does not hold what it should.
    #[error("{arg}: {msg}")]
    File { arg: &'static str, msg: String },

    /// An allocation failed.
    #[error("{what}: cannot allocate {bytes} bytes")]
    OutOfMemory { what: &'static str, bytes: usize },

    /// A bug in strata: a caught panic or a broken invariant.
    #[error("internal error: {0}")]
    Internal(String),

    /// An invalid parameter-server configuration; `path` is the JSON path
    /// (`models[1].sparse_files[0]`) or `"(root)"`.
    #[error("{file}: {path}: {msg}")]
    Config { file: String, path: String, msg: String },

    /// The persistent store failed, or refused a write (read-only).
    #[error("{what}: {msg}")]
    Store { what: String, msg: String },

    /// A CUDA driver call failed; `call` names it (`cuMemAlloc for the table copy on device 0`).
    #[error("CUDA: {call}: {msg}")]
    Cuda { call: String, msg: String },
    /// Another rank failed a collective call, so this rank fails it too, with that rank's
    /// status and message.
    #[error("rank {rank} failed the collective call: {msg}")]
    Remote { rank: i32, status: Status, msg: String },
}

impl Error {
    /// The status this error is reported with. The only error-to-status mapping in strata.
    pub fn status(&self) -> Status {
        match self {
            Error::Null { .. } => Status::STRATA_NULL_ARGUMENT,
            Error::Invalid { .. } => Status::STRATA_INVALID_ARGUMENT,
            Error::Dtype { .. } => Status::STRATA_UNSUPPORTED_DTYPE,
            Error::Device { .. } => Status::STRATA_UNSUPPORTED_DEVICE,
            Error::Layout { .. } => Status::STRATA_INVALID_LAYOUT,
            Error::ReadOnly { .. } | Error::Immutable { .. } => Status::STRATA_READ_ONLY,
            Error::KeyNotFound { .. } => Status::STRATA_KEY_NOT_FOUND,
            Error::DuplicateKey { .. } => Status::STRATA_DUPLICATE_KEY,
            Error::Io { .. } => Status::STRATA_IO_ERROR,
            Error::File { .. } => Status::STRATA_INVALID_FILE,
            Error::OutOfMemory { .. } => Status::STRATA_OUT_OF_MEMORY,
            Error::Internal(_) => Status::STRATA_INTERNAL,
            Error::Config { .. } => Status::STRATA_CONFIG_ERROR,
            Error::Store { .. } => Status::STRATA_STORE_ERROR,
            Error::Cuda { .. } => Status::STRATA_CUDA_ERROR,
            Error::Remote { status, .. } => *status,
        }
    }

    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(arg: &'static str, msg: impl Into<String>) -> Self {
        Error::Invalid { arg, msg: msg.into() }
    }

    /// Shorthand for [`Error::Layout`].
    pub fn layout(arg: &'static str, msg: impl Into<String>) -> Self {
        Error::Layout { arg, msg: msg.into() }
    }

    /// Shorthand for [`Error::File`].
    pub fn file(arg: &'static str, msg: impl Into<String>) -> Self {
        Error::File { arg, msg: msg.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_and_names_agree() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as i32, i as i32);
            assert!(s.name().to_str().unwrap().starts_with("STRATA_"));
            assert_eq!(format!("{s:?}"), s.name().to_str().unwrap());
        }
    }

    #[test]
    fn messages_name_the_argument() {
        let e = Error::Dtype { arg: "keys", got: "float32".into(), expected: "int32, int64, uint32 or uint64" };
        assert_eq!(e.to_string(), "keys: dtype float32; expected int32, int64, uint32 or uint64");
        assert_eq!(e.status(), Status::STRATA_UNSUPPORTED_DTYPE);
        assert_eq!(Error::Null { arg: "table" }.status(), Status::STRATA_NULL_ARGUMENT);
    }
}
