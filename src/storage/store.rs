//! Where a table's vectors live: an owned copy (in anonymous memory backed by transparent huge
//! pages where the kernel allows, so random row reads do not miss the TLB on every row), a
//! caller's DLPack tensor adopted without a copy, or a read-only memory map of a file.
//!
//! A [`Store`] is immutable once built and is `Send + Sync`: lookups on many threads read it
//! at once. Dropping it frees the copy, calls the adopted tensor's deleter exactly once, or
//! unmaps the file.

use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::kernels::RowFormat;

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

/// Row-major vectors: `rows` rows of `dim` values stored as `format` (a float dtype, or a
/// quantized layout of `format.row_bytes(dim)` bytes a row), row `r` starting `r * stride`
/// bytes from the first.
pub struct Store {
    ptr: *const u8,
    format: RowFormat,
    rows: usize,
    dim: usize,
    /// Bytes from one row's start to the next.
    stride: usize,
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
    /// Allocates a zeroed store for `rows` compact rows of `dim` values as `format`
    /// (page-aligned; aligned to and advised for 2 MiB huge pages when large) and lets `fill`
    /// write it as bytes; a failing `fill` fails the call.
    pub fn alloc(format: impl Into<RowFormat>, rows: usize, dim: usize, fill: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<Self> {
        let format = format.into();
        let row_bytes = format.row_bytes(dim);
        let bytes = rows
            .checked_mul(row_bytes)
            .filter(|&b| b <= isize::MAX as usize - HUGE_PAGE)
            .ok_or_else(|| Error::invalid("vectors", format!("{rows} x {dim} elements overflow the address space")))?;
        if bytes == 0 {
            return Ok(Store {
                ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
                format,
                rows,
                dim,
                stride: row_bytes,
                owner: Owner::None,
            });
        }
        let (mut map, start) = anon(bytes, "table vectors")?;
        fill(&mut map[start..start + bytes])?;
        let ptr = map[start..].as_ptr();
        Ok(Store { ptr, format, rows, dim, stride: row_bytes, owner: Owner::Anon(map) })
    }

    /// Wraps memory owned by an adopted DLPack tensor; `deleter` is dropped (calling the
    /// producer's deleter) when the store is.
    ///
    /// `stride` is in bytes.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `rows` rows of `format.row_bytes(dim)` bytes, `stride`
    /// bytes apart, aligned for `format`, for as long as `deleter` is alive.
    pub unsafe fn adopted(
        ptr: *const u8,
        format: RowFormat,
        rows: usize,
        dim: usize,
        stride: usize,
        deleter: dlpark::AllocationDeleter,
    ) -> Self {
        Store { ptr, format, rows, dim, stride, owner: Owner::Adopted(deleter) }
    }

    /// Wraps memory the caller keeps alive and unchanged for the store's lifetime (a borrowed
    /// `__partitioned__` partition); nothing is freed on drop.
    ///
    /// # Safety
    /// As for [`Store::adopted`], for as long as the store lives.
    /// (Float rows; `row_stride` in elements.)
    pub unsafe fn borrowed(ptr: *const u8, dtype: FloatDtype, rows: usize, dim: usize, row_stride: usize) -> Self {
        let ptr = if rows * dim == 0 { std::ptr::NonNull::<u64>::dangling().as_ptr().cast() } else { ptr };
        Store { ptr, format: dtype.into(), rows, dim, stride: row_stride * dtype.size(), owner: Owner::None }
    }

    /// Elements from one row's start to the next, for float rows (quantized stores are never
    /// handed to the code that asks: `__partitioned__` views refuse them; CUDA placements use
    /// [`Store::stride_bytes`]).
    pub fn row_stride(&self) -> usize {
        self.stride / self.dtype().size()
    }

    /// Bytes from one row's start to the next.
    pub fn stride_bytes(&self) -> usize {
        self.stride
    }

    /// Address of row 0 (dangling but aligned when the store is empty).
    pub fn row_ptr_or_base(&self) -> *const u8 {
        self.ptr
    }

    /// Wraps a file mapping holding `rows x dim` compact little-endian float32 values.
    pub fn mapped(map: memmap2::Mmap, rows: usize, dim: usize) -> Self {
        let ptr = if rows * dim == 0 { std::ptr::NonNull::<u64>::dangling().as_ptr().cast() } else { map.as_ptr() };
        Store { ptr, format: FloatDtype::F32.into(), rows, dim, stride: dim * 4, owner: Owner::Mapped(map) }
    }

    /// How rows are stored.
    pub fn format(&self) -> RowFormat {
        self.format
    }

    /// The element dtype of float rows. Only for code that reads rows as floats, which
    /// quantized stores never reach (see [`Store::row_stride`]).
    ///
    /// # Panics
    /// On a quantized store (a bug in the caller's checks, caught at the C boundary).
    pub fn dtype(&self) -> FloatDtype {
        self.format.float().expect("a float store (quantized rows are refused before this point)")
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
        self.ptr.wrapping_add(r * self.stride)
    }

    /// The byte range the rows occupy, for overlap checks against outputs.
    pub fn byte_range(&self) -> (usize, usize) {
        if self.rows == 0 || self.dim == 0 {
            return (0, 0);
        }
        let start = self.ptr as usize;
        let end = start + (self.rows - 1) * self.stride + self.format.row_bytes(self.dim);
        (start, end)
    }

    /// Bytes the vectors occupy (what a compact copy would take).
    pub fn vector_bytes(&self) -> usize {
        self.rows * self.format.row_bytes(self.dim)
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
