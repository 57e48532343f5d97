//! The collective lookup on a [`DistTable`]:
//! 1. each rank validates its `keys` and `out` (as a local lookup would), reads its keys and
//!    routes each to its owner; the all-to-all of per-owner counts also carries each rank's
//!    validation status, so a bad input on one rank fails the call on every rank;
//! 2. keys go to their owners (all-to-all-v);
//! 3. owners gather the rows with the CPU executor, as float32 (exact for every table dtype);
//! 4. rows (and, for keyed tables, found flags) come back (all-to-all-v);
//! 5. each rank writes them into `out` in its keys' order, in `out`'s dtype, with the default
//!    row for misses. With `STRATA_MISSING_ERROR` the ranks then agree, so a missing key on any
//!    rank fails the call on every rank.

use crate::util::lock::lock;
use super::comm::{Comm, displs, refill};
use super::table::{DistTable, Route};
use crate::dlpack::{FloatDtype, KeyDtype, Walk};
use crate::error::{Error, Result};
use crate::exec::cpu::{Found, Gather};
use crate::model::{KeySource, OutTarget};
use crate::exec::pool;
use crate::model::{LookupOptions, LookupStats, Plan, plan};
use crate::model::{MissingKey, Rows, StaticTable};
use dlpark::ffi::DLTensor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Keys a writer takes at a time in step 5.
const CHUNK: usize = 256;
/// `dest` of a key no rank holds.
const NOWHERE: u32 = u32::MAX;

/// Buffers a distributed table's lookups reuse from call to call (kept beside its communicator,
/// about `2 * keys * dim * 4` bytes after a call): first-touching fresh pages can cost more than
/// the exchange itself.
#[derive(Default)]
pub(crate) struct Scratch {
    /// This rank's keys (canonical), in the caller's order; their owners; their place in `send`.
    keys: Vec<u64>,
    dest: Vec<u32>,
    pos: Vec<u32>,
    /// Keys in owner order, and the keys other ranks asked this rank for.
    send: Vec<u64>,
    asked: Vec<u64>,
    /// `asked` as rows of a local partition.
    local: Vec<u64>,
    /// Rows this rank serves, and rows it gets back (float32), with found flags (keyed tables).
    rows: Vec<f32>,
    back: Vec<f32>,
    found: Vec<u8>,
    back_found: Vec<u8>,
}

/// A rank's validated request, before any exchange.
struct Request {
    /// `None` when this rank has no keys (it still takes part in the exchanges).
    plan: Option<Plan>,
    /// Keys for each rank.
    counts: Vec<i32>,
}

impl DistTable {
    /// Collective: every rank of the table's communicator must call it, in the same order for
    /// the same table. See [`crate::table::Table::lookup`] for `keys`, `out` and the result.
    ///
    /// # Safety
    /// As for [`crate::table::Table::lookup`].
    pub unsafe fn lookup(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<LookupStats> {
        let mut state = lock(&self.state);
        let (comm, scratch) = &mut *state;
        let start = Instant::now();
        // SAFETY: lookup_with needs Table::lookup's contract, which our caller upholds.
        let result = unsafe { self.lookup_with(comm, scratch, keys, out, opts) };
        let exchange = comm.take_time();
        let mut t = lock(&self.timing);
        t.lookups += 1;
        t.total_s += start.elapsed().as_secs_f64();
        t.exchange_s += exchange.as_secs_f64();
        result
    }

    /// The collective verdict on a step every rank ran locally (see [`Comm::agree`]): every
    /// rank gets `Ok` when every rank succeeded, else every rank fails.
    pub(crate) fn agree<T>(&self, local: Result<T>) -> Result<T> {
        let mut state = lock(&self.state);
        state.0.agree(local)
    }

    /// The collective lookup with the communicator and scratch held.
    ///
    /// # Safety
    /// As for [`crate::table::Table::lookup`].
    unsafe fn lookup_with(
        &self,
        comm: &mut Comm,
        s: &mut Scratch,
        keys: &DLTensor,
        out: &DLTensor,
        opts: &LookupOptions,
    ) -> Result<LookupStats> {
        // SAFETY: request needs Table::lookup's contract, which our caller upholds.
        let local = unsafe { self.request(s, keys, out, opts) };
        let send: Vec<i64> = match &local {
            Ok(r) => r.counts.iter().map(|&c| c as i64).collect(),
            Err(e) => vec![-(e.kind().code() as i64); self.size],
        };
        let recv = comm.all_to_all(&send);
        let codes: Vec<i32> = recv.iter().map(|&c| if c < 0 { -c as i32 } else { 0 }).collect();
        let req = comm.settle(local, &codes)?;
        let recv_counts: Vec<i32> = recv.iter().map(|&c| c as i32).collect();

        self.by_owner(s, &req.counts);
        comm.exchange(&s.send, &req.counts, &recv_counts, 1, &mut s.asked);
        self.serve(s, req.plan.as_ref().map_or(1, |p| p.threads));
        comm.exchange(&s.rows, &recv_counts, &req.counts, self.dim, &mut s.back);
        let keyed = matches!(self.route, Route::Keyed);
        if keyed {
            comm.exchange(&s.found, &recv_counts, &req.counts, 1, &mut s.back_found);
        }
        let result = self.write(s, &req, keyed);
        if self.missing == MissingKey::Error { comm.agree(result) } else { result }
    }

    /// Step 1 on this rank: validates the tensors, reads the keys and finds their owners.
    ///
    /// # Safety
    /// As for [`crate::table::Table::lookup`].
    unsafe fn request(&self, s: &mut Scratch, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<Request> {
        let ranges: Vec<(usize, usize)> = self.local.iter().map(|p| p.table.store().byte_range()).collect();
        // SAFETY: plan needs Table::lookup's contract for keys and out, which our caller upholds.
        let plan = unsafe { plan(self.dim, ranges.first().copied().unwrap_or((0, 0)), keys, out, opts) }?;
        for r in ranges.iter().skip(1) {
            // SAFETY: as above; this pass only checks out against another local partition.
            unsafe { crate::model::plan(self.dim, *r, keys, out, opts) }?;
        }
        let mut counts = vec![0i32; self.size];
        let n = plan.as_ref().map_or(0, |p| p.n);
        if n > i32::MAX as usize {
            return Err(Error::invalid(
                "keys",
                format!("{n} keys; a lookup on a distributed table takes at most {} keys per rank", i32::MAX),
            ));
        }
        refill(&mut s.keys, n);
        if let Some(plan) = &plan {
            let mut offs = [0isize; CHUNK];
            for (c, chunk) in s.keys.chunks_mut(CHUNK).enumerate() {
                plan.keys.read(c * CHUNK, chunk, &mut offs[..chunk.len()]);
            }
        }
        s.dest.clear();
        s.dest.extend(s.keys.iter().map(|&k| match self.owner(k) {
            Some(o) => {
                counts[o] += 1;
                o as u32
            }
            None => NOWHERE,
        }));
        Ok(Request { plan, counts })
    }

    /// Puts the keys in owner order (`send`) and notes where each of the caller's keys went.
    fn by_owner(&self, s: &mut Scratch, counts: &[i32]) {
        let mut next: Vec<u32> = displs(counts).iter().map(|&d| d as u32).collect();
        refill(&mut s.send, counts.iter().map(|&c| c as usize).sum());
        s.pos.clear();
        for (&k, &d) in s.keys.iter().zip(&s.dest) {
            if d == NOWHERE {
                s.pos.push(NOWHERE);
                continue;
            }
            let p = next[d as usize];
            next[d as usize] += 1;
            s.send[p as usize] = k;
            s.pos.push(p);
        }
    }

    /// Step 3: this rank's rows for the keys other ranks asked it for (`asked`), as float32 in
    /// `rows`, and (keyed tables) whether each key was found, in `found`.
    fn serve(&self, s: &mut Scratch, threads: usize) {
        let (m, dim) = (s.asked.len(), self.dim);
        refill(&mut s.rows, m * dim);
        match (&self.route, self.local.as_slice()) {
            (Route::Keyed, [share]) => {
                gather(&share.table, &s.asked, &mut s.rows, threads);
                s.found.clear();
                if let Rows::Keyed(ix) = &share.table.rows {
                    s.found.extend(s.asked.iter().map(|&k| ix.get(k).is_some() as u8));
                }
            }
            (_, [part]) => {
                s.local.clear();
                s.local.extend(s.asked.iter().map(|&k| k - part.start as u64));
                gather(&part.table, &s.local, &mut s.rows, threads);
            }
            (_, parts) => {
                // Several local partitions (replicas of several): gather each one's keys apart.
                for part in parts {
                    let (lo, hi) = (part.start as u64, (part.start + part.table.len()) as u64);
                    let idx: Vec<usize> = (0..m).filter(|&i| (lo..hi).contains(&s.asked[i])).collect();
                    let local: Vec<u64> = idx.iter().map(|&i| s.asked[i] - lo).collect();
                    let mut got = vec![0f32; idx.len() * dim];
                    gather(&part.table, &local, &mut got, threads);
                    for (j, &i) in idx.iter().enumerate() {
                        s.rows[i * dim..(i + 1) * dim].copy_from_slice(&got[j * dim..(j + 1) * dim]);
                    }
                }
            }
        }
    }

    /// Step 5: writes every key's row into `out` (in parallel chunks) and counts hits and misses.
    fn write(&self, s: &Scratch, req: &Request, keyed: bool) -> Result<LookupStats> {
        let Some(plan) = &req.plan else { return Ok(LookupStats::default()) };
        let (n, dim) = (plan.n, self.dim);
        let found = keyed.then_some(&s.back_found[..]);
        let next = AtomicUsize::new(0);
        let by_tasks = n.div_ceil(CHUNK * 8).max(1);
        let parts = pool::run(plan.threads.min(by_tasks).max(1), || {
            let mut f = Found::default();
            let mut staging = vec![0f32; CHUNK * dim];
            let mut present = [false; CHUNK];
            let mut offs = [0isize; CHUNK];
            loop {
                let lo = next.fetch_add(CHUNK, Ordering::Relaxed);
                if lo >= n {
                    break;
                }
                let hi = (lo + CHUNK).min(n);
                for i in lo..hi {
                    let p = s.pos[i];
                    let hit = p != NOWHERE && found.is_none_or(|fl| fl[p as usize] != 0);
                    present[i - lo] = hit;
                    if hit {
                        let p = p as usize;
                        staging[(i - lo) * dim..(i - lo + 1) * dim].copy_from_slice(&s.back[p * dim..(p + 1) * dim]);
                        f.hits += 1;
                    } else {
                        f.misses += 1;
                        if f.first_miss.is_none() {
                            f.first_miss = Some((i, s.keys[i]));
                        }
                    }
                }
                // SAFETY: the plan validated out for n keys; lo..hi are within them.
                unsafe { plan.out.write_f32_rows(lo, dim, &staging, &present[..hi - lo], &self.default_row, &mut offs) };
            }
            f
        });
        let mut total = LookupStats::default();
        let mut first: Option<(usize, u64)> = None;
        for f in parts {
            total.hits += f.hits;
            total.misses += f.misses;
            first = match (first, f.first_miss) {
                (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
                (a, b) => a.or(b),
            };
        }
        if let (MissingKey::Error, Some((index, key))) = (self.missing, first) {
            return Err(Error::KeyNotFound { key: plan.key_dtype.value(key), index });
        }
        Ok(total)
    }
}

/// Gathers the rows of `keys` (canonical, uint64) from `table` into `rows` (float32, `dim` per
/// key) with the CPU executor.
fn gather(table: &StaticTable, keys: &[u64], rows: &mut [f32], threads: usize) {
    let n = keys.len();
    if n == 0 {
        return;
    }
    let dim = table.dim();
    let g = Gather {
        table,
        keys: KeySource { ptr: keys.as_ptr().cast(), dtype: KeyDtype::U64, walk: Walk::new(&[n], &[1]), elem: 8 },
        out: OutTarget {
            ptr: rows.as_mut_ptr().cast(),
            dtype: FloatDtype::F32,
            walk: Walk::new(&[n], &[dim as isize]),
            col_stride: 1,
        },
        n,
        threads,
    };
    g.run();
}
