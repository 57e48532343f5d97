//! Threads pinned to their own cores (Legate, Dask and Ray workers) must not shrink the process:
//! a first lookup made on a thread pinned to one CPU creates the worker pool with the process's
//! size, its workers run on the process's CPUs, `num_threads = 0` on that thread means one
//! thread, and on an unpinned thread the process's CPUs. The only test in this binary, so the
//! pool is created inside it.

mod common;
use common::*;

/// The CPUs of a task's `Cpus_allowed_list` (as `/proc/<pid>/task/<tid>/status` prints it).
fn allowed(status: &str) -> Vec<usize> {
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list").trim();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// The CPUs of this process's main thread.
fn process_cpus() -> Vec<usize> {
    allowed(&std::fs::read_to_string("/proc/self/status").unwrap())
}

/// The allowed CPUs of every pool worker (threads named strata-N).
fn worker_cpus() -> Vec<Vec<usize>> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let dir = e.unwrap().path();
            let name = std::fs::read_to_string(dir.join("comm")).ok()?;
            name.trim().starts_with("strata-").then(|| allowed(&std::fs::read_to_string(dir.join("status")).unwrap()))
        })
        .collect()
}

/// A table handle moved to another thread (tables are `Send + Sync`).
struct SendPtr(*mut Table);
// SAFETY: a strata table may be used from any thread, many at once (the header's threading rule).
unsafe impl Send for SendPtr {}
impl SendPtr {
    fn get(&self) -> *mut Table {
        self.0
    }
}

#[test]
fn a_pinned_first_caller_neither_shrinks_the_pool_nor_pins_its_workers() {
    if std::env::var_os("STRATA_NUM_THREADS").is_some() {
        println!("skipped: STRATA_NUM_THREADS is set, which fixes every thread count");
        return;
    }
    let cpus = process_cpus();
    if cpus.len() < 2 {
        println!("skipped: this process may run on one CPU only ({cpus:?}); pinning cannot shrink it");
        return;
    }
    let mut rng = Rng(7);
    let (keys, vectors) = random_table(&mut rng, 5000, 64);
    let t = Owned::build(&vectors, 5000, 64, Some(&keys), &TableOptions::default());
    let table = SendPtr(t.0);
    let q: Vec<i64> = (0..200_000).map(|_| keys[rng.below(5000) as usize]).collect();
    let row_of: std::collections::HashMap<i64, usize> = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    let expect: Vec<f32> = q.iter().flat_map(|k| vectors[row_of[k] * 64..row_of[k] * 64 + 64].to_vec()).collect();

    // A thread pinned to the process's first CPU makes the first lookups of the process.
    let pinned = cpus[0];
    let (q2, expect2) = (q.clone(), expect.clone());
    let on_pinned = std::thread::spawn(move || {
        // SAFETY: cpu_set_t is plain data (all zeros is an empty set); `pinned` is below its
        // capacity; sched_setaffinity(0, ...) pins only this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(pinned, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
        let threads_here = strata_default_num_threads();
        let mut out = vec![f32::NAN; q2.len() * 64];
        let k = Desc::compact(q2.as_ptr().cast(), I64, &[q2.len() as i64]);
        let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[q2.len() as i64, 64]);
        // num_threads = 2 asks for the pool (created now, from this pinned thread); then the
        // default, which on this thread is one thread.
        for threads in [2, 0] {
            let opts = LookupOptions { num_threads: threads, ..LookupOptions::default() };
            out.fill(f32::NAN);
            // SAFETY: the table outlives this thread (joined below); k and o describe q2 and
            // out, alive past the call.
            ok(unsafe { strata_lookup(table.get(), &k.t, &mut o.t, &opts, std::ptr::null_mut()) });
            assert!(out == expect2, "lookup on the pinned thread with num_threads = {threads}");
        }
        threads_here
    });
    let threads_on_pinned = on_pinned.join().unwrap();
    assert_eq!(threads_on_pinned, 1, "num_threads = 0 on a thread pinned to one CPU means that one CPU");

    // The pool has the process's size (the caller is the remaining participant) and every
    // worker runs on the process's CPUs, not on the pinned creator's one.
    let workers = worker_cpus();
    assert_eq!(workers.len(), cpus.len() - 1, "pool workers: {workers:?}, process CPUs {cpus:?}");
    for w in &workers {
        assert_eq!(w, &cpus, "a worker's allowed CPUs");
    }

    // On this (unpinned) thread the default is the process's CPUs, and a default lookup is right.
    assert_eq!(strata_default_num_threads() as usize, cpus.len());
    let mut out = vec![f32::NAN; q.len() * 64];
    let k = Desc::compact(q.as_ptr().cast(), I64, &[q.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[q.len() as i64, 64]);
    let opts = LookupOptions::default();
    // SAFETY: t is a live table; k and o describe q and out, alive past the call.
    ok(unsafe { strata_lookup(t.0, &k.t, &mut o.t, &opts, std::ptr::null_mut()) });
    assert!(out == expect);
}
