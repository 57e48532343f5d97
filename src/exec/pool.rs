//! The CPU worker pool and the thread-count policy.
//!
//! One process-wide set of `default_threads() - 1` workers (the process's CPUs, whichever
//! thread creates it; they run on the process's affinity mask) is started on first parallel
//! use (the calling thread is always the remaining participant). A call asking for `n` threads
//! runs on the calling thread plus at most `n - 1` workers, so it never has more than `n`
//! threads working for it; `n = 1` never touches the pool. Many host threads may submit at
//! once; each takes the workers that are free at that moment and runs with fewer (or alone)
//! when they are not, so no call waits for a worker to become free.
//!
//! A worker that finishes spins for [`spin`] (`STRATA_SPIN_US`, 100 us by default) before it
//! sleeps, and so does a caller that waits for its workers: a sleeping thread took 12-37 us to
//! wake on the 2-vCPU machine of docs/performance.md, a fifth to a half of a 60-us pooled call.
//! A caller that does sleep is woken with `Thread::unpark`; the last worker unparks it even when
//! it did not sleep, so a host thread's own `park` may return once early (as `park` may anyway).

use crate::util::lock::lock;
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

pub use crate::util::threads::{default_threads, resolve_threads};

/// How long an idle worker, or a caller waiting for its workers, spins before it sleeps:
/// `STRATA_SPIN_US` microseconds (0 = sleep at once), 100 by default. Read once.
fn spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("STRATA_SPIN_US").ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(100);
        Duration::from_micros(us)
    })
}

/// Waits until `done()` holds: spins for up to [`spin`], then parks (woken by whoever makes it
/// hold, which must `unpark` this thread after it does; spurious wakes are re-checked).
fn wait(done: impl Fn() -> bool) {
    let limit = spin();
    if !limit.is_zero() {
        let t0 = Instant::now();
        loop {
            for _ in 0..64 {
                if done() {
                    return;
                }
                std::hint::spin_loop();
            }
            if t0.elapsed() >= limit {
                break;
            }
        }
    }
    while !done() {
        thread::park();
    }
}

/// One call's work as its workers see it. It lives on the caller's stack: the caller returns
/// (or unwinds) only once `pending` is 0, and a worker touches it no more after its decrement.
struct Job<'a> {
    work: &'a (dyn Fn() + Sync),
    /// Workers that took the job and have not finished it.
    pending: AtomicUsize,
    /// Woken by the worker that brings `pending` to 0.
    caller: Thread,
    /// The first panic of a worker, resumed on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// One worker thread and the slot a caller hands it a job through.
struct Worker {
    /// Set by the caller that claims the worker, cleared by the worker once its job is done:
    /// only the claimer writes `job`.
    busy: AtomicBool,
    /// The job handed over; null while none is waiting to be started.
    job: AtomicPtr<Job<'static>>,
    thread: OnceLock<Thread>,
}

impl Worker {
    /// The worker thread's loop: wait for a job, run it, report, repeat.
    fn serve(&self) {
        loop {
            wait(|| !self.job.load(Ordering::Acquire).is_null());
            let p = self.job.swap(std::ptr::null_mut(), Ordering::Acquire);
            // SAFETY: a non-null `job` was stored by the caller that claimed this worker and
            // points at that caller's `Job`, which stays alive until `pending` reaches 0, which
            // cannot happen before this worker's decrement below.
            let job = unsafe { &*p };
            if let Err(e) = catch_unwind(AssertUnwindSafe(job.work)) {
                lock(&job.panic).get_or_insert(e);
            }
            let caller = job.caller.clone();
            self.busy.store(false, Ordering::Release);
            if job.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                caller.unpark();
            }
        }
    }
}

/// The workers, started on first use (none on a one-CPU process), and the id of the process
/// that started them. They are leaked: they serve until the process ends. A child made by
/// `fork` inherits the slots but not the threads, so it must not use them (see [`run`]).
fn pool() -> &'static (u32, &'static [Worker]) {
    static POOL: OnceLock<(u32, &'static [Worker])> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = default_threads().saturating_sub(1);
        let ws: &'static [Worker] = Box::leak(
            (0..n)
                .map(|_| Worker { busy: AtomicBool::new(true), job: AtomicPtr::new(std::ptr::null_mut()), thread: OnceLock::new() })
                .collect(),
        );
        let mask = crate::util::threads::process_mask();
        for (i, w) in ws.iter().enumerate() {
            let mask = mask.clone();
            // The workers run on the process's CPUs, not on the mask of the thread that
            // happened to make the first parallel call (which they would inherit).
            let spawned = thread::Builder::new().name(format!("strata-{i}")).spawn(move || {
                crate::util::threads::run_on(&mask);
                w.serve()
            });
            // A worker whose thread could not start stays busy, so no call ever claims it.
            if let Ok(h) = spawned {
                let _ = w.thread.set(h.thread().clone());
                w.busy.store(false, Ordering::Release);
            }
        }
        (std::process::id(), ws)
    })
}

/// The workers this process may hand work to: none in a child forked after they started.
fn workers() -> &'static [Worker] {
    let (pid, ws) = pool();
    // One getpid per parallel call (each is at least 256 KiB of work). A forked child that
    // claimed a slot would wait forever for a thread it does not have; it runs alone instead.
    if *pid == std::process::id() { ws } else { &[] }
}

/// Runs `work` on `threads` participants at once (the caller plus up to `threads - 1`
/// workers, those free at the call) and returns each participant's result. `work` must share
/// out its own work items (e.g. with an atomic counter): a participant may start late or not
/// at all before the others have finished everything. A panic in `work` propagates to the
/// caller once every participant has finished. In a child forked after the workers started,
/// the caller runs alone.
pub fn run<R: Send>(threads: usize, work: impl Fn() -> R + Sync) -> Vec<R> {
    if threads <= 1 {
        return vec![work()];
    }
    let mut claimed = Vec::with_capacity(threads - 1);
    for w in workers() {
        if claimed.len() == threads - 1 {
            break;
        }
        if w.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            claimed.push(w);
        }
    }
    if claimed.is_empty() {
        return vec![work()];
    }
    let results = Mutex::new(Vec::with_capacity(claimed.len() + 1));
    let each = || {
        let r = work();
        lock(&results).push(r);
    };
    let job = Job { work: &each, pending: AtomicUsize::new(claimed.len()), caller: thread::current(), panic: Mutex::new(None) };
    let p = std::ptr::from_ref(&job).cast_mut().cast::<Job<'static>>();
    for w in &claimed {
        w.job.store(p, Ordering::Release);
        if let Some(t) = w.thread.get() {
            t.unpark();
        }
    }
    let mine = catch_unwind(AssertUnwindSafe(each));
    // The workers borrow `job`, `each` and `results`: nothing of this frame may go before
    // they are done, not even by unwinding.
    wait(|| job.pending.load(Ordering::Acquire) == 0);
    if let Err(e) = mine {
        resume_unwind(e);
    }
    if let Some(e) = lock(&job.panic).take() {
        resume_unwind(e);
    }
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
    fn every_item_runs_once_and_each_participant_reports() {
        // Work shared out by a counter, as the executors do: every item exactly once, every
        // participant's result back, for as many threads as asked and more than the pool has.
        for t in 1..=6 {
            for _ in 0..50 {
                let next = AtomicUsize::new(0);
                let seen: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
                let parts = run(t, || {
                    let mut mine = 0;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= seen.len() {
                            break mine;
                        }
                        seen[i].fetch_add(1, Ordering::Relaxed);
                        mine += i;
                    }
                });
                assert!(!parts.is_empty() && parts.len() <= t.min(workers().len() + 1));
                assert_eq!(parts.iter().sum::<usize>(), 999 * 1000 / 2);
                assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn no_participant_outlives_the_call() {
        // Each participant sleeps before it writes to the caller's frame: the call must not
        // return before the last of them is done.
        // Each counts itself at its start too: one still running would be missing from `done`
        // but not from `started` (and a call that returned early would also lack its result).
        for _ in 0..20 {
            let started = AtomicUsize::new(0);
            let done = AtomicUsize::new(0);
            let parts = run(4, || {
                started.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(2));
                done.fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(done.load(Ordering::SeqCst), started.load(Ordering::SeqCst));
            assert_eq!(done.load(Ordering::SeqCst), parts.len());
        }
    }

    #[test]
    fn a_workers_panic_reaches_the_caller_and_the_pool_goes_on() {
        if workers().is_empty() {
            eprintln!("skipped: one CPU, no workers to panic");
            return;
        }
        let me = std::thread::current().id();
        // Other tests share the workers, so a call may find them busy and run alone: try until
        // a worker takes part, for up to a minute.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut panicked = false;
        while !panicked && std::time::Instant::now() < deadline {
            // A worker that starts panics; the caller's share is empty, so it waits for it.
            let r = std::panic::catch_unwind(|| {
                run(2, || {
                    if std::thread::current().id() != me {
                        panic!("worker panic");
                    }
                })
            });
            match r {
                Err(e) => {
                    assert_eq!(e.downcast_ref::<&str>(), Some(&"worker panic"));
                    panicked = true;
                }
                Ok(_) => std::thread::sleep(std::time::Duration::from_micros(500)),
            }
        }
        assert!(panicked, "no worker took part in a minute of calls");
        // The worker that panicked serves the next calls.
        let ids = Mutex::new(HashSet::new());
        while ids.lock().unwrap().len() < 2 && std::time::Instant::now() < deadline + std::time::Duration::from_secs(60) {
            run(2, || {
                ids.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(std::time::Duration::from_micros(200));
            });
        }
        assert!(ids.lock().unwrap().len() >= 2);
    }

    #[test]
    fn many_host_threads_share_the_workers() {
        // Host threads that submit at once each get the free workers or run alone; none waits
        // for another's workers, and every call still does all its items.
        std::thread::scope(|sc| {
            for h in 0..8usize {
                sc.spawn(move || {
                    for c in 0..100usize {
                        let next = AtomicUsize::new(0);
                        let n = 200 + h * 37 + c;
                        let parts = run(3, || {
                            let mut sum = 0;
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                if i >= n {
                                    break sum;
                                }
                                sum += i;
                            }
                        });
                        assert_eq!(parts.iter().sum::<usize>(), n * (n - 1) / 2);
                    }
                });
            }
        });
    }

    #[test]
    fn a_forked_child_runs_alone() {
        // The workers exist before the fork; the child has none of their threads, and its
        // parallel call must still finish (on the child's one thread) and do every item.
        let _ = run(2, || ());
        // SAFETY: the child only runs `run` with a closure of atomics and a Vec, then leaves
        // with `_exit`, which runs no atexit handlers or destructors of the parent's state.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let next = AtomicUsize::new(0);
            let parts = run(2, || {
                let mut sum = 0usize;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= 1000 {
                        break sum;
                    }
                    sum += i;
                }
            });
            // The child sees no workers, so the call ran on its own thread alone.
            let ok = workers().is_empty() && parts.len() == 1 && parts[0] == 999 * 1000 / 2;
            // SAFETY: ends the child at once, as a forked child of a threaded process should.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child; `status` is a live local.
            let r = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
            if r == child {
                break;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: kills and reaps our own child, which has hung.
                unsafe {
                    libc::kill(child, libc::SIGKILL);
                    libc::waitpid(child, &mut status, 0);
                }
                panic!("the forked child's parallel call did not finish in 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status}");
    }

    #[test]
    fn negative_threads_rejected() {
        assert!(resolve_threads(-1).unwrap_err().to_string().contains("opts->num_threads"));
        assert_eq!(resolve_threads(3).unwrap(), 3);
        assert!(resolve_threads(0).unwrap() >= 1);
    }
}
