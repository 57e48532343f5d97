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

/// Prepares a read-only file mapping for random row reads: advises transparent huge pages (the
/// kernel honours it only where the file system supports them) and, when the mapping fits in
/// half the machine's memory, populates its page tables up front (`MADV_POPULATE_READ`,
/// reading the file if it is not cached), so the first lookups after opening a table do not
/// each pay a page fault. Larger files are left to fault in as rows are read.
pub(crate) fn prefault_for_reads(map: &memmap2::Mmap) {
    #[cfg(target_os = "linux")]
    {
        if std::env::var_os("STRATA_NO_HUGE_PAGES").is_none() {
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        // SAFETY: sysconf has no preconditions.
        let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        let phys = (pages.max(0) as u128) * (page.max(0) as u128);
        if (map.len() as u128) * 2 <= phys {
            // SAFETY: the range is the whole mapping, which is alive; MADV_POPULATE_READ only
            // faults its pages in for reading (kernels before 5.14 reject it, and the pages then
            // fault in on first read, as without it).
            unsafe { libc::madvise(map.as_ptr() as *mut libc::c_void, map.len(), libc::MADV_POPULATE_READ) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}
