//! The host side of a batch: every plain and pooled request on a static table, run as one piece
//! of work. Each request is cut into tasks (a few thousand keys: whole bags for a pooled one);
//! the participants (the calling thread and pool workers) take tasks of any request from one
//! shared counter, so a batch of many small requests wakes the pool once, not once a request,
//! and a batch of uneven requests keeps every participant busy to the end (FBGEMM's table-batched
//! embedding splits over tables and bags alike). Borrows the tables and plans for the call.

use super::cpu::{BYTES_PER_THREAD, Found, Gather};
use super::pool;
use super::pooled::{self, PooledTasks, Rowset};
use crate::error::{Error, Result};
use crate::kernels::store_fence;
use crate::model::{LookupStats, Plan, PooledPlan, StaticTable};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One request of a batch on a static table, validated.
pub(crate) enum Job<'a> {
    Plain(&'a StaticTable, &'a Plan),
    Pooled(&'a StaticTable, &'a PooledPlan),
}

/// A job's tasks.
enum Tasks<'a> {
    Plain(super::cpu::GatherTasks<'a>),
    Pooled(PooledTasks<'a>),
}

impl Tasks<'_> {
    fn count(&self) -> usize {
        match self {
            Tasks::Plain(t) => t.tasks,
            Tasks::Pooled(t) => t.tasks,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Tasks::Plain(t) => t.bytes,
            Tasks::Pooled(t) => t.bytes,
        }
    }
}

/// Runs `jobs` on at most `threads` participants; each job's stats, or its error (a missing key
/// of a table whose missing keys are errors).
pub(crate) fn run(jobs: &[Job], threads: usize) -> Vec<Result<LookupStats>> {
    // What the tasks borrow, built first: the gathers and the pooled lookups' row sources.
    let gathers: Vec<Option<Gather>> = jobs
        .iter()
        .map(|j| match j {
            Job::Plain(t, p) => Some(Gather { table: t, keys: &p.keys, out: &p.out, n: p.n, threads: p.threads }),
            Job::Pooled(..) => None,
        })
        .collect();
    let fills: Vec<_> = jobs
        .iter()
        .map(|j| match j {
            Job::Plain(t, _) | Job::Pooled(t, _) => pooled::static_fill(t),
        })
        .collect();
    let rowsets: Vec<Rowset> = jobs
        .iter()
        .zip(&fills)
        .map(|(j, f)| match j {
            Job::Plain(t, _) | Job::Pooled(t, _) => Rowset::of_static(t, f),
        })
        .collect();
    let tasks: Vec<Tasks> = jobs
        .iter()
        .zip(&gathers)
        .zip(&rowsets)
        .map(|((j, g), rows)| match (j, g) {
            (Job::Plain(..), Some(g)) => Tasks::Plain(g.tasks()),
            (Job::Pooled(_, p), _) => Tasks::Pooled(PooledTasks::new(p, rows)),
            (Job::Plain(..), None) => unreachable!("every plain job has its gather"),
        })
        .collect();
    // starts[j]: the first global task of job j.
    let mut starts = Vec::with_capacity(jobs.len() + 1);
    let mut total = 0;
    for t in &tasks {
        starts.push(total);
        total += t.count();
    }
    let bytes: usize = tasks.iter().map(Tasks::bytes).sum();
    let asked = jobs
        .iter()
        .map(|j| match j {
            Job::Plain(_, p) => p.threads,
            Job::Pooled(_, p) => p.threads,
        })
        .min()
        .unwrap_or(1);
    let threads = threads.min(asked).min((bytes / BYTES_PER_THREAD).max(1)).min(total).max(1);
    let next = AtomicUsize::new(0);
    let parts = pool::run(threads, || {
        pooled::with_scratch(|s| {
            let mut found = vec![Found::default(); jobs.len()];
            let mut failed: Vec<Option<Error>> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let j = starts.partition_point(|&s| s <= i) - 1;
                match &tasks[j] {
                    Tasks::Plain(t) => t.run(i - starts[j], &mut found[j]),
                    Tasks::Pooled(t) => {
                        if let Err(e) = t.run(i - starts[j], s, &mut found[j]) {
                            failed.resize_with(jobs.len(), || None);
                            failed[j].get_or_insert(e);
                        }
                    }
                }
            }
            store_fence();
            (found, failed)
        })
    });
    let mut found = vec![Found::default(); jobs.len()];
    let mut failed: Vec<Option<Error>> = (0..jobs.len()).map(|_| None).collect();
    for (f, e) in parts {
        for (a, b) in found.iter_mut().zip(f) {
            *a = a.merge(b);
        }
        for (a, b) in failed.iter_mut().zip(e) {
            if a.is_none() {
                *a = b;
            }
        }
    }
    found
        .into_iter()
        .zip(failed)
        .zip(jobs)
        .map(|((f, e), j)| {
            if let Some(e) = e {
                return Err(e);
            }
            let key_dtype = match j {
                Job::Plain(_, p) => p.key_dtype,
                Job::Pooled(_, p) => p.key_dtype,
            };
            match f.first_miss {
                Some((index, key)) => Err(Error::KeyNotFound { key: key_dtype.value(key), index }),
                None => Ok(LookupStats { hits: f.hits, misses: f.misses, ..LookupStats::default() }),
            }
        })
        .collect()
}
