//! How many threads a lookup may use: the library default and a caller's request.

use crate::error::{Error, Result};
use std::sync::OnceLock;

/// The library's default thread count: `STRATA_NUM_THREADS` when set to a positive integer,
/// else the number of CPUs in the process's affinity mask (read once, at first use).
pub fn default_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("STRATA_NUM_THREADS")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(affinity_cpus)
    })
}

/// CPUs this process may run on (`sched_getaffinity`), at least 1.
fn affinity_cpus() -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                let n = libc::CPU_COUNT(&set);
                if n > 0 {
                    return n as usize;
                }
            }
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Resolves a caller's `num_threads` (0 = default, n > 0 = at most n) to a thread count.
pub fn resolve_threads(requested: i32) -> Result<usize> {
    match requested {
        0 => Ok(default_threads()),
        n if n > 0 => Ok(n as usize),
        n => Err(Error::invalid(
            "opts->num_threads",
            format!("{n}; expected 0 (library default), 1 (inline on the calling thread) or a positive count"),
        )),
    }
}
