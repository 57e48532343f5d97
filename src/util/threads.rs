//! How many threads a lookup may use: the library default and a caller's request.

use crate::error::{Error, Result};
use std::sync::OnceLock;

/// The process's thread count: `STRATA_NUM_THREADS` when set to a positive integer, else the
/// number of CPUs in the process's affinity mask ([`process_mask`], read once, at first use).
/// It sizes the worker pool, whichever thread creates it.
pub fn default_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| env_threads().unwrap_or_else(|| count(&process_mask())))
}

/// The default thread count of a call from this thread (`num_threads = 0`):
/// `STRATA_NUM_THREADS` when set to a positive integer, else the number of CPUs in the calling
/// thread's own affinity mask, read once per thread. A task runtime's worker pinned to one core
/// gets 1, the process's other threads are not affected.
pub fn calling_thread_threads() -> usize {
    thread_local! {
        static N: std::cell::OnceCell<usize> = const { std::cell::OnceCell::new() };
    }
    N.with(|n| *n.get_or_init(|| env_threads().unwrap_or_else(|| count(&thread_mask()))))
}

/// CPUs in a mask, at least 1 (the machine's parallelism where the mask could not be read).
fn count(mask: &[u64]) -> usize {
    match mask.iter().map(|w| w.count_ones() as usize).sum() {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// `STRATA_NUM_THREADS` when set to a positive integer.
pub fn env_threads() -> Option<usize> {
    std::env::var("STRATA_NUM_THREADS").ok().and_then(|s| s.trim().parse::<usize>().ok()).filter(|&n| n > 0)
}

/// The CPUs in this process's affinity mask, as a bit set (bit `c % 64` of word `c / 64` for
/// CPU `c`); empty where the mask cannot be read. The process's mask is its main thread's (the
/// thread whose id is the process id), whichever thread asks. Lets processes that share a
/// machine (MPI ranks) see which CPUs they share.
pub fn process_mask() -> Vec<u64> {
    #[cfg(target_os = "linux")]
    let mask = {
        // SAFETY: getpid has no preconditions.
        mask_of(unsafe { libc::getpid() })
    };
    #[cfg(not(target_os = "linux"))]
    let mask = Vec::new();
    mask
}

/// The calling thread's affinity mask, as [`process_mask`] gives it.
pub fn thread_mask() -> Vec<u64> {
    #[cfg(target_os = "linux")]
    let mask = mask_of(0);
    #[cfg(not(target_os = "linux"))]
    let mask = Vec::new();
    mask
}

/// The affinity mask of thread `tid` (0: the calling thread), as [`process_mask`] gives it.
#[cfg(target_os = "linux")]
fn mask_of(tid: libc::pid_t) -> Vec<u64> {
    // SAFETY: cpu_set_t is plain data (all zeros is an empty set); sched_getaffinity writes at
    // most the size it is given into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let cpus = 8 * std::mem::size_of::<libc::cpu_set_t>();
            let mut words = vec![0u64; cpus.div_ceil(64)];
            for c in (0..cpus).filter(|&c| libc::CPU_ISSET(c, &set)) {
                words[c / 64] |= 1 << (c % 64);
            }
            return words;
        }
    }
    Vec::new()
}

/// Sets the calling thread's affinity to `mask` (a [`process_mask`]); does nothing with an
/// empty mask or where affinity cannot be set. The pool's workers call it when they start, so
/// they run on the process's CPUs even when a pinned thread created the pool.
pub fn run_on(mask: &[u64]) {
    #[cfg(target_os = "linux")]
    if mask.iter().any(|&w| w != 0) {
        // SAFETY: cpu_set_t is plain data (all zeros is an empty set); CPU_SET is only given
        // CPUs below the set's capacity; sched_setaffinity reads the set it is given.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let cpus = 8 * std::mem::size_of::<libc::cpu_set_t>();
            for c in (0..cpus.min(mask.len() * 64)).filter(|&c| mask[c / 64] & (1 << (c % 64)) != 0) {
                libc::CPU_SET(c, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// Threads for one of several processes sharing a machine: each CPU of `mine` (an
/// [`affinity_mask`]) counted as the fraction of it this process gets when every mask of
/// `all` (this process's included) that holds the CPU shares it equally; at least 1.
/// With `STRATA_NUM_THREADS` set, that count instead.
pub fn shared_threads(mine: &[u64], all: &[Vec<u64>]) -> usize {
    if let Some(n) = env_threads() {
        return n;
    }
    if mine.iter().all(|&w| w == 0) {
        return default_threads();
    }
    let mut share = 0.0;
    for (w, &bits) in mine.iter().enumerate() {
        for b in (0..64).filter(|&b| bits & (1 << b) != 0) {
            let sharers = all.iter().filter(|m| m.get(w).is_some_and(|&x| x & (1 << b) != 0)).count().max(1);
            share += 1.0 / sharers as f64;
        }
    }
    // (A little slack: 6 CPUs shared 3 ways may add up to 1.999...)
    ((share + 1e-6).floor() as usize).max(1)
}

/// Resolves a caller's `num_threads` (0 = the calling thread's default,
/// [`calling_thread_threads`]; n > 0 = at most n) to a thread count.
pub fn resolve_threads(requested: i32) -> Result<usize> {
    match requested {
        0 => Ok(calling_thread_threads()),
        n if n > 0 => Ok(n as usize),
        n => Err(Error::invalid(
            "opts->num_threads",
            format!("{n}; expected 0 (library default), 1 (inline on the calling thread) or a positive count"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_threads_split_the_cpus_the_masks_share() {
        if env_threads().is_some() {
            return;
        }
        // Four processes, none bound, on 2 CPUs: 1 each; two bound to one CPU each: 1 each.
        let both = vec![0b11u64];
        assert_eq!(shared_threads(&both, &vec![both.clone(); 4]), 1);
        assert_eq!(shared_threads(&[0b01], &[vec![0b01], vec![0b10]]), 1);
        // Two unbound on 16 CPUs: 8 each; three: 5 each (16/3 rounded down).
        let sixteen = vec![0xffffu64];
        assert_eq!(shared_threads(&sixteen, &vec![sixteen.clone(); 2]), 8);
        assert_eq!(shared_threads(&sixteen, &vec![sixteen.clone(); 3]), 5);
        let six = vec![0b11_1111u64];
        assert_eq!(shared_threads(&six, &vec![six.clone(); 3]), 2);
        let twelve = vec![0xfffu64];
        assert_eq!(shared_threads(&twelve, &vec![twelve.clone(); 3]), 4);
        // One bound to CPUs 0-3, another unbound on 0-7: the first gets 4 halves, the second 4 + 2.
        let (low, all8) = (vec![0x0fu64], vec![0xffu64]);
        assert_eq!(shared_threads(&low, &[low.clone(), all8.clone()]), 2);
        assert_eq!(shared_threads(&all8, &[low.clone(), all8.clone()]), 6);
        // CPUs beyond the first word.
        let high = vec![0u64, 0b1111];
        assert_eq!(shared_threads(&high, std::slice::from_ref(&high)), 4);
    }

    #[test]
    fn affinity_mask_matches_default_count() {
        let m = process_mask();
        if cfg!(target_os = "linux") && env_threads().is_none() {
            let n: u32 = m.iter().map(|w| w.count_ones()).sum();
            assert_eq!(n as usize, default_threads());
        }
    }
}
