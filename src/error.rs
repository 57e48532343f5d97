//! The one error type of strata and its mapping to `strata_status`.
//!
//! Every fallible function in the core returns [`Result<T>`]. [`Error::kind`] is the one place
//! an error is classified; the FFI layer reports each [`ErrorKind`] as the `strata_status` of
//! the same number and stores the message for `strata_last_error`.

/// Result of every fallible strata operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is. The FFI layer reports each kind as the
/// `strata_status` of the same number; [`ErrorKind::code`] is that number, which is also what
/// distributed calls send to the other ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A required pointer argument was NULL.
    NullArgument = 1,
    /// An argument has the wrong rank, shape or value.
    InvalidArgument = 2,
    /// A tensor's dtype is not one this function accepts.
    UnsupportedDtype = 3,
    /// A tensor lives on a device this build or machine cannot serve.
    UnsupportedDevice = 4,
    /// Strides, byte offset or alignment describe memory strata cannot use safely.
    InvalidLayout = 5,
    /// `out` is flagged read-only, or an update went to a table that cannot change.
    ReadOnly = 6,
    /// A key is missing and the table's options make that an error.
    KeyNotFound = 7,
    /// The same key appears twice in a table's keys.
    DuplicateKey = 8,
    /// A file could not be opened, read or mapped.
    Io = 9,
    /// A table file is truncated or does not match its companion file or `dim`.
    InvalidFile = 10,
    /// Memory for a table or index could not be allocated.
    OutOfMemory = 11,
    /// A bug inside strata (a caught panic).
    Internal = 12,
    /// A parameter-server configuration is invalid.
    Config = 13,
    /// A persistent store failed.
    Store = 14,
    /// The CUDA driver failed.
    Cuda = 15,
}

impl ErrorKind {
    /// Every kind, in code order (codes 1..=15).
    pub(crate) const ALL: [ErrorKind; 15] = [
        ErrorKind::NullArgument,
        ErrorKind::InvalidArgument,
        ErrorKind::UnsupportedDtype,
        ErrorKind::UnsupportedDevice,
        ErrorKind::InvalidLayout,
        ErrorKind::ReadOnly,
        ErrorKind::KeyNotFound,
        ErrorKind::DuplicateKey,
        ErrorKind::Io,
        ErrorKind::InvalidFile,
        ErrorKind::OutOfMemory,
        ErrorKind::Internal,
        ErrorKind::Config,
        ErrorKind::Store,
        ErrorKind::Cuda,
    ];

    /// The kind's number (the `strata_status` it is reported as).
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The kind of number `code`, or `None` for 0 and unknown numbers.
    pub fn from_code(code: i32) -> Option<ErrorKind> {
        ErrorKind::ALL.iter().copied().find(|k| k.code() == code)
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
    /// An error about one item of a list argument: `prefix` names it (`requests[7].`) and is
    /// put before the item's own message, whose kind it keeps.
    #[error("{prefix}{source}")]
    Within { prefix: String, source: Box<Error> },
    /// Another rank failed a collective call, so this rank fails it too, with that rank's
    /// status and message.
    #[error("rank {rank} failed the collective call: {msg}")]
    Remote { rank: i32, kind: ErrorKind, msg: String },
}

impl Error {
    /// What kind of failure this is. The only classification of errors in strata.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Null { .. } => ErrorKind::NullArgument,
            Error::Invalid { .. } => ErrorKind::InvalidArgument,
            Error::Dtype { .. } => ErrorKind::UnsupportedDtype,
            Error::Device { .. } => ErrorKind::UnsupportedDevice,
            Error::Layout { .. } => ErrorKind::InvalidLayout,
            Error::ReadOnly { .. } | Error::Immutable { .. } => ErrorKind::ReadOnly,
            Error::KeyNotFound { .. } => ErrorKind::KeyNotFound,
            Error::DuplicateKey { .. } => ErrorKind::DuplicateKey,
            Error::Io { .. } => ErrorKind::Io,
            Error::File { .. } => ErrorKind::InvalidFile,
            Error::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            Error::Internal(_) => ErrorKind::Internal,
            Error::Config { .. } => ErrorKind::Config,
            Error::Store { .. } => ErrorKind::Store,
            Error::Cuda { .. } => ErrorKind::Cuda,
            Error::Remote { kind, .. } => *kind,
            Error::Within { source, .. } => source.kind(),
        }
    }

    /// This error as one about item `prefix` of a list argument (`requests[7].`).
    /// Another rank's failure keeps its `rank R failed the collective call: ` head, with the
    /// prefix put before that rank's message (which is about the same item).
    pub fn within(self, prefix: impl Into<String>) -> Self {
        match self {
            Error::Remote { rank, kind, msg } => Error::Remote { rank, kind, msg: format!("{}{msg}", prefix.into()) },
            e => Error::Within { prefix: prefix.into(), source: Box::new(e) },
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
    fn kinds_and_codes_agree() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(k.code(), i as i32 + 1);
            assert_eq!(ErrorKind::from_code(k.code()), Some(*k));
        }
        assert_eq!(ErrorKind::from_code(0), None);
        assert_eq!(ErrorKind::from_code(16), None);
    }

    #[test]
    fn messages_name_the_argument() {
        let e = Error::Dtype { arg: "keys", got: "float32".into(), expected: "int32, int64, uint32 or uint64" };
        assert_eq!(e.to_string(), "keys: dtype float32; expected int32, int64, uint32 or uint64");
        assert_eq!(e.kind(), ErrorKind::UnsupportedDtype);
        assert_eq!(Error::Null { arg: "table" }.kind(), ErrorKind::NullArgument);
    }
}
