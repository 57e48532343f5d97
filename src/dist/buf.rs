//! A reusable exchange buffer in anonymous memory: advised for transparent huge pages when large
//! (rows are read from it at random) and populated once, when it grows, so a lookup neither
//! zeroes it nor faults its pages in.

use crate::util::memory::anon;
use std::marker::PhantomData;

/// Plain values for which every bit pattern, all-zero included, is a valid value.
///
/// # Safety
/// Implement only for such types.
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: every bit pattern of these is a valid value.
unsafe impl Plain for u64 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for u8 {}

/// `len` values of `T` in a mapping that only grows (by a quarter more than asked, so lookups
/// of slightly varying sizes do not map anew each time). Contents are unspecified after
/// [`Buf::resize`]: callers write before they read.
pub(crate) struct Buf<T: Plain> {
    map: Option<(memmap2::MmapMut, usize)>,
    cap: usize,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Plain> Default for Buf<T> {
    fn default() -> Self {
        Buf { map: None, cap: 0, len: 0, _t: PhantomData }
    }
}

impl<T: Plain> Buf<T> {
    /// Makes the buffer hold `len` values, mapping a larger one if needed. Fails (keeping the
    /// old mapping) when the memory cannot be mapped.
    pub fn resize(&mut self, len: usize) -> crate::error::Result<()> {
        if len > self.cap {
            let cap = len.saturating_add(len / 4);
            let bytes = cap
                .checked_mul(std::mem::size_of::<T>())
                .ok_or(crate::error::Error::OutOfMemory { what: "distributed lookup buffers", bytes: usize::MAX })?;
            self.map = Some(anon(bytes, "distributed lookup buffers")?);
            self.cap = cap;
        }
        self.len = len;
        Ok(())
    }

    /// [`Buf::resize`] for a step that cannot fail on one rank alone (the other ranks are
    /// already exchanging): out of memory aborts the process, as a `Vec` would, which ends the
    /// MPI job rather than leaving other ranks waiting.
    pub fn resize_or_abort(&mut self, len: usize) {
        if self.resize(len).is_err() {
            let bytes = len.saturating_mul(std::mem::size_of::<T>()).max(1);
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(bytes, 8).unwrap_or(std::alloc::Layout::new::<u64>()));
        }
    }

    pub fn as_slice(&self) -> &[T] {
        match &self.map {
            // SAFETY: the mapping holds cap >= len zero-initialised (so valid: T is Plain) values
            // from `start`, which is page-aligned (so aligned for T).
            Some((m, start)) => unsafe { std::slice::from_raw_parts(m.as_ptr().add(*start) as *const T, self.len) },
            None => &[],
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        match &mut self.map {
            // SAFETY: as in as_slice, and &mut self makes this the only access.
            Some((m, start)) => unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr().add(*start) as *mut T, self.len) },
            None => &mut [],
        }
    }
}

impl Buf<u8> {
    /// The bytes as values of `U` (as many whole ones as they hold): a plain view, since the
    /// mapping starts page-aligned.
    pub fn as_mut_slice_of<U: Plain>(&mut self) -> &mut [U] {
        let bytes = self.as_mut_slice();
        let n = bytes.len() / std::mem::size_of::<U>();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: the bytes start at the mapping's page-aligned start (so aligned for U) and hold
        // at least n * size_of::<U>() bytes, each a valid U whatever they are (U is Plain); the
        // &mut borrow of self makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut U, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_keeps_capacity_and_is_writable() {
        let mut b = Buf::<f32>::default();
        assert!(b.as_slice().is_empty());
        b.resize(1000).unwrap();
        assert_eq!(b.as_slice().len(), 1000);
        b.as_mut_slice().iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        // Shrinking and growing within the capacity keeps the mapping (and its contents).
        b.resize(10).unwrap();
        b.resize(1200).unwrap();
        assert_eq!(b.as_slice()[999], 999.0);
        b.resize(1 << 20).unwrap();
        assert_eq!(b.as_slice().len(), 1 << 20);
        b.as_mut_slice()[(1 << 20) - 1] = 1.0;
        assert!(Buf::<u64>::default().resize(usize::MAX / 4).is_err());
    }

    #[test]
    fn bytes_are_viewed_as_floats() {
        let mut b = Buf::<u8>::default();
        assert!(b.as_mut_slice_of::<f32>().is_empty());
        b.resize(10).unwrap();
        assert_eq!(b.as_mut_slice_of::<f32>().len(), 2);
        b.as_mut_slice_of::<f32>()[1] = 1.5;
        assert_eq!(&b.as_slice()[4..8], &1.5f32.to_ne_bytes());
    }
}
