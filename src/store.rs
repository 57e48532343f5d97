//! Where a table's vectors live: an owned 64-byte-aligned copy, a caller's DLPack tensor
//! adopted without a copy, or a read-only memory map of a file.
//!
//! A [`Store`] is immutable once built and is `Send + Sync`: lookups on many threads read it
//! at once. Dropping it frees the copy, calls the adopted tensor's deleter exactly once, or
//! unmaps the file.

use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use std::alloc::{Layout, alloc, dealloc};

/// Keeps the memory behind a [`Store`] alive.
enum Owner {
    /// A 64-byte-aligned heap buffer of `layout`.
    Heap { ptr: *mut u8, layout: Layout },
    /// A caller's DLPack tensor; dropping it calls the producer's deleter once.
    Adopted(#[allow(dead_code)] dlpark::AllocationDeleter),
    /// A read-only file mapping.
    Mapped(#[allow(dead_code)] memmap2::Mmap),
    /// Nothing to free (empty table).
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

// SAFETY: the store's memory is never written after construction, and every owner kind may
// be dropped from any thread (DLPack deleters must be callable from any thread).
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Drop for Store {
    fn drop(&mut self) {
        if let Owner::Heap { ptr, layout } = self.owner {
            // SAFETY: allocated in `Store::alloc` with this layout.
            unsafe { dealloc(ptr, layout) };
        }
    }
}

impl Store {
    /// Allocates an uninitialised, 64-byte-aligned store for `rows x dim` compact elements and
    /// lets `fill` write it. `fill` receives the whole buffer as bytes.
    pub fn alloc(dtype: FloatDtype, rows: usize, dim: usize, fill: impl FnOnce(&mut [u8])) -> Result<Self> {
        let bytes = rows
            .checked_mul(dim)
            .and_then(|n| n.checked_mul(dtype.size()))
            .filter(|&b| b <= isize::MAX as usize - 64)
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
        let layout = Layout::from_size_align(bytes, 64).expect("size checked above");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory { what: "table vectors", bytes });
        }
        let store = Store { ptr, dtype, rows, dim, row_stride: dim, owner: Owner::Heap { ptr, layout } };
        // SAFETY: freshly allocated, `bytes` long, exclusively ours until returned. Zeroed first
        // so `fill` never sees uninitialised memory.
        let buf = unsafe {
            std::ptr::write_bytes(ptr, 0, bytes);
            std::slice::from_raw_parts_mut(ptr, bytes)
        };
        fill(buf);
        Ok(store)
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
