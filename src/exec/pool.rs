//! The CPU worker pool and the thread-count policy.
//!
//! One process-wide pool of `default_threads() - 1` workers (the process's CPUs, whichever
//! thread creates it; they run on the process's affinity mask) is created on first parallel
//! use (the calling thread is always the remaining participant). A call asking for `n` threads
//! runs on the calling thread plus at most `n - 1` pool workers, so it never has more than `n`
//! threads working for it; `n = 1` never touches the pool. Many host threads may submit at
//! once; they share the workers.

use crate::util::lock::lock;
use std::sync::OnceLock;

pub use crate::util::threads::{default_threads, resolve_threads};

fn pool() -> Option<&'static rayon_core::ThreadPool> {
    static POOL: OnceLock<Option<rayon_core::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let workers = default_threads().saturating_sub(1);
        if workers == 0 {
            return None;
        }
        // The workers run on the process's CPUs, not on the mask of the thread that happened to
        // make the first parallel call (which they would inherit).
        let mask = crate::util::threads::process_mask();
        rayon_core::ThreadPoolBuilder::new()
            .num_threads(workers)
            .thread_name(|i| format!("strata-{i}"))
            .start_handler(move |_| crate::util::threads::run_on(&mask))
            .build()
            .ok()
    })
    .as_ref()
}

/// Runs `work` on `threads` participants at once (the caller plus up to `threads - 1` pool
/// workers) and returns each participant's result. `work` must share out its own work items
/// (e.g. with an atomic counter): a participant may start late or not at all before the others
/// have finished everything. Panics in `work` propagate to the caller.
pub fn run<R: Send>(threads: usize, work: impl Fn() -> R + Sync) -> Vec<R> {
    let helpers = match pool() {
        Some(p) if threads > 1 => (threads - 1).min(p.current_num_threads()),
        _ => 0,
    };
    if helpers == 0 {
        return vec![work()];
    }
    let p = pool().expect("checked above");
    let results = std::sync::Mutex::new(Vec::with_capacity(helpers + 1));
    p.in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| {
                let r = work();
                lock(&results).push(r);
            });
        }
        let r = work();
        lock(&results).push(r);
    });
    results.into_inner().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    #[test]
    fn one_thread_runs_inline() {
        let me = std::thread::current().id();
        let ids = run(1, || std::thread::current().id());
        assert_eq!(ids, vec![me]);
    }

    #[test]
    fn never_more_participants_than_asked() {
        for t in 1..=4 {
            let seen = Mutex::new(HashSet::new());
            let out = run(t, || {
                seen.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(std::time::Duration::from_millis(5));
            });
            assert!(out.len() <= t);
            assert!(seen.lock().unwrap().len() <= t);
        }
    }

    #[test]
    fn negative_threads_rejected() {
        assert!(resolve_threads(-1).unwrap_err().to_string().contains("opts->num_threads"));
        assert_eq!(resolve_threads(3).unwrap(), 3);
        assert!(resolve_threads(0).unwrap() >= 1);
    }
}
