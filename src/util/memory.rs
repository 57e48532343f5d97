//! Anonymous memory for tables and indexes: zeroed, huge-page aligned when large, populated up
//! front.

use crate::error::{Error, Result};

/// The transparent huge page size strata aligns large ranges to.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Maps `bytes` of zeroed anonymous memory; returns the mapping and the offset of the usable
/// range. A large range starts on a 2 MiB boundary and is advised for transparent huge pages
/// (random row reads then rarely miss the TLB); the range is populated up front, which costs
/// far less than faulting it in page by page while filling it.
pub(crate) fn anon(bytes: usize, what: &'static str) -> Result<(memmap2::MmapMut, usize)> {
    let huge = bytes >= HUGE_PAGE;
    let len = if huge { bytes + HUGE_PAGE } else { bytes };
    let map = memmap2::MmapMut::map_anon(len).map_err(|_| Error::OutOfMemory { what, bytes })?;
    let start = if huge { (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize } else { 0 };
    #[cfg(target_os = "linux")]
    {
        if huge && std::env::var_os("STRATA_NO_HUGE_PAGES").is_none() {
            let _ = map.advise_range(memmap2::Advice::HugePage, start, bytes - bytes % HUGE_PAGE);
        }
        // SAFETY: the range lies inside the mapping; MADV_POPULATE_WRITE only faults pages in
        // (kernels before 5.14 reject it, and the pages then fault in on first write).
        unsafe { libc::madvise(map.as_ptr().add(start) as *mut libc::c_void, bytes, libc::MADV_POPULATE_WRITE) };
    }
    Ok((map, start))
}
