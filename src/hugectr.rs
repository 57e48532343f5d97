//! HugeCTR's sparse model format: a folder holding `key` (little-endian int64, one per row)
//! and `emb_vector` (float32, row-major, rows x dim, same order), with no headers.
//!
//! [`SparseFolder::open`] maps both files read-only and checks them once, with the messages
//! every reader of the format reports (`strata_table_open`, the persistent tier's first load).

use crate::error::{Error, Result};
use crate::limits::MAX_DIM;
use std::path::Path;

/// Fails unless `1 <= dim <= MAX_DIM`.
pub(crate) fn check_dim(dim: usize) -> Result<()> {
    if dim == 0 || dim > MAX_DIM {
        return Err(Error::invalid("dim", format!("{dim}; expected 1 <= dim <= {MAX_DIM}")));
    }
    Ok(())
}

/// A HugeCTR sparse folder, mapped read-only and checked. The files must not be truncated while
/// it (or a table made from its mapping) is alive.
pub(crate) struct SparseFolder {
    keys: Option<memmap2::Mmap>,
    vecs: Option<memmap2::Mmap>,
    /// Rows (= keys) in the folder.
    pub rows: usize,
}

impl SparseFolder {
    /// Maps `dir/key` and `dir/emb_vector` and checks that they hold whole keys and whole rows
    /// of `dim` float32 values, one row per key.
    pub fn open(dir: &Path, dim: usize) -> Result<SparseFolder> {
        check_dim(dim)?;
        let key_path = dir.join("key");
        let vec_path = dir.join("emb_vector");
        let keys = map_file(&key_path)?;
        let vecs = map_file(&vec_path)?;
        let key_len = keys.as_ref().map_or(0, |m| m.len());
        let vec_len = vecs.as_ref().map_or(0, |m| m.len());
        if key_len % 8 != 0 {
            return Err(Error::file(
                "dir",
                format!(
                    "{}: {key_len} bytes is not a whole number of int64 keys (8 bytes each); the file is truncated",
                    key_path.display()
                ),
            ));
        }
        let row_bytes = dim * 4;
        if vec_len % row_bytes != 0 {
            return Err(Error::file(
                "dim",
                format!(
                    "{dim} does not divide {}: {vec_len} bytes is not a whole number of {dim}-float32 rows ({row_bytes} bytes each)",
                    vec_path.display()
                ),
            ));
        }
        let rows = key_len / 8;
        if vec_len / row_bytes != rows {
            return Err(Error::file(
                "dir",
                format!(
                    "{} holds {rows} keys but {} holds {} rows of dim {dim}; expected one row per key",
                    key_path.display(),
                    vec_path.display(),
                    vec_len / row_bytes
                ),
            ));
        }
        Ok(SparseFolder { keys, vecs, rows })
    }

    /// The `key` file's bytes.
    pub fn key_bytes(&self) -> &[u8] {
        self.keys.as_deref().unwrap_or(&[])
    }

    /// The `emb_vector` file's bytes.
    pub fn vecs(&self) -> &[u8] {
        self.vecs.as_deref().unwrap_or(&[])
    }

    /// Canonical key of row `r` (`r < rows`).
    pub fn key(&self, r: usize) -> u64 {
        let b = &self.key_bytes()[r * 8..r * 8 + 8];
        u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
    }

    /// Gives up the key mapping and returns the vector mapping (`None` for an empty table).
    pub fn into_vectors(self) -> Option<memmap2::Mmap> {
        self.vecs
    }
}

/// Maps a whole file read-only; `None` for an empty file (which cannot be mapped).
fn map_file(path: &Path) -> Result<Option<memmap2::Mmap>> {
    let io = |source| Error::Io { arg: "dir", path: path.display().to_string(), source };
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: mapped read-only; documented that the files must not be truncated while mapped.
    let m = unsafe { memmap2::Mmap::map(&f) }.map_err(io)?;
    Ok(Some(m))
}
