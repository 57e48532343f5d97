//! HugeCTR's sparse model format: a folder holding `key` (little-endian int64, one per row)
//! and `emb_vector` (float32, row-major, rows x dim, same order), with no headers.
//!
//! [`SparseFolder::open`] maps both files read-only and checks them once, with the messages
//! every reader of the format reports (`strata_table_open`, the persistent tier's first load).
//! [`inspect`] checks a folder from its files' sizes alone, without opening them (the
//! configuration's check of every `sparse_files` entry). Both check the sizes with
//! [`check_sizes`].

use crate::error::{Error, Result};
use crate::limits::MAX_DIM;
use crate::util::memory::prefault_for_reads;
use std::path::{Path, PathBuf};

/// Fails unless `1 <= dim <= MAX_DIM`.
pub(crate) fn check_dim(dim: usize) -> Result<()> {
    if dim == 0 || dim > MAX_DIM {
        return Err(Error::invalid("dim", format!("{dim}; expected 1 <= dim <= {MAX_DIM}")));
    }
    Ok(())
}

/// How the sizes of a sparse folder's `key` and `emb_vector` disagree ([`check_sizes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SizeMismatch {
    /// `key` is not a whole number of int64 keys.
    PartialKey { key_bytes: u64 },
    /// `emb_vector` does not hold one row of `dim` float32 values per key.
    Vectors { rows: u64, vec_bytes: u64, expected: u128 },
}

/// The number of rows of a sparse folder whose `key` holds `key_bytes` and whose `emb_vector`
/// holds `vec_bytes`, with `dim` float32 values per row.
pub(crate) fn check_sizes(key_bytes: u64, vec_bytes: u64, dim: usize) -> std::result::Result<u64, SizeMismatch> {
    if !key_bytes.is_multiple_of(8) {
        return Err(SizeMismatch::PartialKey { key_bytes });
    }
    let rows = key_bytes / 8;
    let expected = (rows as u128) * (dim as u128) * 4;
    if vec_bytes as u128 != expected {
        return Err(SizeMismatch::Vectors { rows, vec_bytes, expected });
    }
    Ok(rows)
}

/// What [`inspect`] found wrong with a sparse folder.
#[derive(Debug)]
pub(crate) enum FolderProblem {
    /// The folder does not exist.
    Missing,
    /// The path exists and is not a folder.
    NotAFolder,
    /// The folder lacks this file (`"key"` or `"emb_vector"`).
    Lacks(&'static str),
    /// This path (the folder's `key` or `emb_vector`) is not a file.
    NotAFile(PathBuf),
    /// This path (the folder or one of its files) could not be inspected.
    Io(PathBuf, std::io::Error),
    /// The files' sizes disagree with each other or with `dim`.
    Sizes(SizeMismatch),
}

/// Checks, from metadata only, that `dir` is a sparse folder holding `key` and `emb_vector`
/// files whose sizes agree with `dim` ([`check_sizes`]); returns its number of rows.
pub(crate) fn inspect(dir: &Path, dim: usize) -> std::result::Result<u64, FolderProblem> {
    let meta = std::fs::metadata(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FolderProblem::Missing,
        _ => FolderProblem::Io(dir.to_path_buf(), e),
    })?;
    if !meta.is_dir() {
        return Err(FolderProblem::NotAFolder);
    }
    let mut sizes = [0u64; 2];
    for (size, name) in sizes.iter_mut().zip(["key", "emb_vector"]) {
        let f = dir.join(name);
        let m = std::fs::metadata(&f).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FolderProblem::Lacks(name),
            _ => FolderProblem::Io(f.clone(), e),
        })?;
        if !m.is_file() {
            return Err(FolderProblem::NotAFile(f));
        }
        *size = m.len();
    }
    check_sizes(sizes[0], sizes[1], dim).map_err(FolderProblem::Sizes)
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
        let row_bytes = dim * 4;
        let rows = match check_sizes(key_len as u64, vec_len as u64, dim) {
            Ok(rows) => rows as usize,
            Err(SizeMismatch::PartialKey { .. }) => {
                return Err(Error::file(
                    "dir",
                    format!(
                        "{}: {key_len} bytes is not a whole number of int64 keys (8 bytes each); the file is truncated",
                        key_path.display()
                    ),
                ));
            }
            Err(SizeMismatch::Vectors { .. }) if !vec_len.is_multiple_of(row_bytes) => {
                return Err(Error::file(
                    "dim",
                    format!(
                        "{dim} does not divide {}: {vec_len} bytes is not a whole number of {dim}-float32 rows ({row_bytes} bytes each)",
                        vec_path.display()
                    ),
                ));
            }
            Err(SizeMismatch::Vectors { rows, .. }) => {
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
        };
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

    /// Gives up the key mapping and returns the vector mapping (`None` for an empty table),
    /// prepared for random row reads (see [`prefault_for_reads`]).
    pub fn into_vectors(self) -> Option<memmap2::Mmap> {
        if let Some(m) = &self.vecs {
            prefault_for_reads(m);
        }
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
