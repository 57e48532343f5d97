//! Where a table's vectors live: an owned copy (in anonymous memory backed by transparent huge
//! pages where the kernel allows, so random row reads do not miss the TLB on every row), a
//! caller's DLPack tensor adopted without a copy, or a read-only memory map of a file.
//!
//! A [`Store`] is immutable once built and is `Send + Sync`: lookups on many threads read it
//! at once. Dropping it frees the copy, calls the adopted tensor's deleter exactly once, or
//! unmaps the file.

use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};

/// Size of a transparent huge page on x86-64 and most aarch64 kernels.
use crate::util::memory::{HUGE_PAGE, anon};

/// Keeps the memory behind a [`Store`] alive.
enum Owner {
    /// An anonymous mapping owned by the table.
    Anon(#[allow(dead_code)] memmap2::MmapMut),
    /// A caller's DLPack tensor; dropping it calls the producer's deleter once.
    Adopted(#[allow(dead_code)] dlpark::AllocationDeleter),
    /// A read-only file mapping.
    Mapped(#[allow(dead_code)] memmap2::Mmap),
    /// Nothing to free (an empty table, or memory the caller keeps alive).
    None,
}

/// Row-major vectors: `rows` rows of `dim` elements of `dtype`, row `r` starting at element
/// `r * row_stride`.
pub struct Store {
    ptr: *const u8,
    dtype: FloatDtype,
    rows: usize,
    dim: usize,
    row_stride: usize,
    owner: Owner,
}

// SAFETY: `ptr` points into memory the owner keeps alive wherever the store goes, and every
// owner kind may be dropped from any thread (DLPack deleters must be callable from any thread,
// as `Store::adopted` requires; borrowed memory is the caller's to keep alive).
unsafe impl Send for Store {}
// SAFETY: the store's memory is never written after construction, and `&self` methods only
// read it, so threads sharing a store never race.
unsafe impl Sync for Store {}

impl Store {
    /// Allocates a zeroed store for `rows x dim` compact elements (page-aligned; aligned to and
    /// advised for 2 MiB huge pages when large) and lets `fill` write it as bytes.
    pub fn alloc(dtype: FloatDtype, rows: usize, dim: usize, fill: impl FnOnce(&mut [u8])) -> Result<Self> {
        let bytes = rows
            .checked_mul(dim)
            .and_then(|n| n.checked_mul(dtype.size()))
            .filter(|&b| b <= isize::MAX as usize - HUGE_PAGE)
            .ok_or_else(|| Error::invalid("vectors", format!("{rows} x {dim} elements overflow the address space")))?;
        if bytes == 0 {
            return Ok(Store {
                ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
                dtype,
                rows,
                dim,
                row_stride: dim,
                owner: Owner::None,
            });
        }
        let (mut map, start) = anon(bytes, "table vectors")?;
        fill(&mut map[start..start + bytes]);
        let ptr = map[start..].as_ptr();
        Ok(Store { ptr, dtype, rows, dim, row_stride: dim, owner: Owner::Anon(map) })
    }

    /// Wraps memory owned by an adopted DLPack tensor; `deleter` is dropped (calling the
    /// producer's deleter) when the store is.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `rows` rows at `row_stride` elements, aligned for `dtype`,
    /// for as long as `deleter` is alive.
    pub unsafe fn adopted(
        ptr: *const u8,
        dtype: FloatDtype,
        rows: usize,
        dim: usize,
        row_stride: usize,
        deleter: dlpark::AllocationDeleter,
    ) -> Self {
        Store { ptr, dtype, rows, dim, row_stride, owner: Owner::Adopted(deleter) }
    }

    /// Wraps memory the caller keeps alive and unchanged for the store's lifetime (a borrowed
    /// `__partitioned__` partition); nothing is freed on drop.
    ///
    /// # Safety
    /// As for [`Store::adopted`], for as long as the store lives.
    pub unsafe fn borrowed(ptr: *const u8, dtype: FloatDtype, rows: usize, dim: usize, row_stride: usize) -> Self {
        let ptr = if rows * dim == 0 { std::ptr::NonNull::<u64>::dangling().as_ptr().cast() } else { ptr };
        Store { ptr, dtype, rows, dim, row_stride, owner: Owner::None }
    }

    /// Elements from one row's start to the next.
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// Address of row 0 (dangling but aligned when the store is empty).
    pub fn row_ptr_or_base(&self) -> *const u8 {
        self.ptr
    }

    /// Wraps a file mapping holding `rows x dim` compact little-endian float32 values.
    pub fn mapped(map: memmap2::Mmap, rows: usize, dim: usize) -> Self {
        let ptr = if rows * dim == 0 { std::ptr::NonNull::<u64>::dangling().as_ptr().cast() } else { map.as_ptr() };
        Store { ptr, dtype: FloatDtype::F32, rows, dim, row_stride: dim, owner: Owner::Mapped(map) }
    }

    /// Element dtype.
    pub fn dtype(&self) -> FloatDtype {
        self.dtype
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Address of row `r`'s first element. `r` must be below `rows()`.
    #[inline(always)]
    pub fn row_ptr(&self, r: usize) -> *const u8 {
        debug_assert!(r < self.rows);
        self.ptr.wrapping_add(r * self.row_stride * self.dtype.size())
    }

    /// The byte range the rows occupy, for overlap checks against outputs.
    pub fn byte_range(&self) -> (usize, usize) {
        if self.rows == 0 || self.dim == 0 {
            return (0, 0);
        }
        let start = self.ptr as usize;
        let end = start + ((self.rows - 1) * self.row_stride + self.dim) * self.dtype.size();
        (start, end)
    }

    /// Bytes the vectors occupy (what a compact copy would take).
    pub fn vector_bytes(&self) -> usize {
        self.rows * self.dim * self.dtype.size()
    }

    /// Whether the vectors are a memory-mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.owner, Owner::Mapped(_))
    }

    /// Whether the vectors are an adopted caller tensor.
    pub fn is_adopted(&self) -> bool {
        matches!(self.owner, Owner::Adopted(_))
    }
}
