//! `STRATA_NUM_THREADS` sets the default thread count (read once, at first use), and a lookup
//! never has more threads working for it than it asked for.

mod common;
use common::*;
use std::collections::HashSet;

#[test]
fn env_sets_the_default_and_calls_stay_within_their_budget() {
    // The only test in this binary, so nothing has read the variable yet.
    // SAFETY: set_var needs that no other thread reads or writes the environment meanwhile. This
    // binary has one test, so only libtest's main thread exists besides this one, and it just
    // waits; strata starts its pool threads later, on first use.
    unsafe { std::env::set_var("STRATA_NUM_THREADS", "3") };
    assert_eq!(strata_default_num_threads(), 3);

    // Threads that run strata work are the caller and pool workers named strata-N; count the
    // distinct pool threads that exist afterwards by name.
    let mut rng = Rng(31);
    let (keys, vectors) = random_table(&mut rng, 4000, 64);
    let t = Owned::build(&vectors, 4000, 64, Some(&keys), &TableOptions::default());
    let q: Vec<i64> = (0..200_000).map(|i| keys[i % 4000]).collect();
    let mut out = vec![0f32; q.len() * 64];
    let k = Desc::compact(q.as_ptr().cast(), I64, &[q.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[q.len() as i64, 64]);
    for threads in [1, 2, 0] {
        let opts = LookupOptions { num_threads: threads, ..LookupOptions::default() };
        // SAFETY: t is a live table (Owned); k and o describe q and out (200000 keys, 200000x64
        // floats), alive past the call; opts is a reference.
        ok(unsafe { strata_lookup(t.0, &k.t, &mut o.t, &opts, std::ptr::null_mut()) });
    }
    let names: HashSet<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .filter(|n| n.starts_with("strata-"))
        .collect();
    // default 3 threads = the caller + 2 pool workers
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(&out[..64], &vectors[..64]);
}
