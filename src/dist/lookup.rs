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

use super::comm::{Comm, displs};
use super::table::{DistTable, Route};
use crate::dlpack::{FloatDtype, KeyDtype, Walk};
use crate::error::{Error, Result};
use crate::exec::cpu::{Found, Gather, KeySource, OutTarget};
use crate::exec::pool;
use crate::lookup::{LookupOptions, LookupStats, Plan, plan};
use crate::table::{MissingKey, Rows, StaticTable};
use dlpark::ffi::DLTensor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Keys a writer takes at a time in step 5.
const CHUNK: usize = 256;
/// `dest` of a key no rank holds.
const NOWHERE: u32 = u32::MAX;

/// A rank's validated request, before any exchange.
struct Request {
    /// `None` when this rank has no keys (it still takes part in the exchanges).
    plan: Option<Plan>,
    /// Canonical keys, in the caller's order.
    keys: Vec<u64>,
    /// Owner of each key, or [`NOWHERE`].
    dest: Vec<u32>,
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
        let mut comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let start = Instant::now();
        let result = unsafe { self.lookup_with(&mut comm, keys, out, opts) };
        let exchange = comm.take_time();
        let mut t = self.timing.lock().unwrap_or_else(|e| e.into_inner());
        t.lookups += 1;
        t.total_s += start.elapsed().as_secs_f64();
        t.exchange_s += exchange.as_secs_f64();
        result
    }

    unsafe fn lookup_with(&self, comm: &mut Comm, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<LookupStats> {
        let local = unsafe { self.request(keys, out, opts) };
        let send: Vec<i64> = match &local {
            Ok(r) => r.counts.iter().map(|&c| c as i64).collect(),
            Err(e) => vec![-(e.status() as i64); self.size],
        };
        let recv = comm.all_to_all(&send);
        let codes: Vec<i32> = recv.iter().map(|&c| if c < 0 { -c as i32 } else { 0 }).collect();
        let req = comm.settle(local, &codes)?;
        let recv_counts: Vec<i32> = recv.iter().map(|&c| c as i32).collect();

        let (send_keys, pos) = self.by_owner(&req);
        let asked = comm.exchange(&send_keys, &req.counts, &recv_counts, 1);
        let threads = req.plan.as_ref().map_or(1, |p| p.threads);
        let (rows, found) = self.serve(&asked, threads);
        let keyed = matches!(self.route, Route::Keyed);
        let back = comm.exchange(&rows, &recv_counts, &req.counts, self.dim);
        let back_found = if keyed { comm.exchange(&found, &recv_counts, &req.counts, 1) } else { Vec::new() };
        let result = self.write(&req, &pos, &back, keyed.then_some(&back_found[..]));
        if self.missing == MissingKey::STRATA_MISSING_ERROR { comm.agree(result) } else { result }
    }

    /// Step 1 on this rank: validates the tensors and routes the keys.
    unsafe fn request(&self, keys: &DLTensor, out: &DLTensor, opts: &LookupOptions) -> Result<Request> {
        let ranges: Vec<(usize, usize)> = self.local.iter().map(|p| p.table.store().byte_range()).collect();
        let plan = unsafe { plan(self.dim, ranges.first().copied().unwrap_or((0, 0)), keys, out, opts) }?;
        for r in ranges.iter().skip(1) {
            unsafe { crate::lookup::plan(self.dim, *r, keys, out, opts) }?;
        }
        let mut req = Request { plan: None, keys: Vec::new(), dest: Vec::new(), counts: vec![0; self.size] };
        let Some(plan) = plan else { return Ok(req) };
        if plan.n > i32::MAX as usize {
            return Err(Error::invalid(
                "keys",
                format!("{} keys; a lookup on a distributed table takes at most {} keys per rank", plan.n, i32::MAX),
            ));
        }
        req.keys = vec![0u64; plan.n];
        let mut offs = vec![0isize; CHUNK];
        for (c, chunk) in req.keys.chunks_mut(CHUNK).enumerate() {
            plan.keys.read(c * CHUNK, chunk, &mut offs[..chunk.len()]);
        }
        req.dest = req
            .keys
            .iter()
            .map(|&k| match self.owner(k) {
                Some(o) => {
                    req.counts[o] += 1;
                    o as u32
                }
                None => NOWHERE,
            })
            .collect();
        req.plan = Some(plan);
        Ok(req)
    }

    /// The keys in owner order, and where each of the caller's keys went.
    fn by_owner(&self, req: &Request) -> (Vec<u64>, Vec<u32>) {
        let mut next: Vec<u32> = displs(&req.counts).iter().map(|&d| d as u32).collect();
        let total: usize = req.counts.iter().map(|&c| c as usize).sum();
        let mut send = vec![0u64; total];
        let pos = req
            .keys
            .iter()
            .zip(&req.dest)
            .map(|(&k, &d)| {
                if d == NOWHERE {
                    return NOWHERE;
                }
                let p = next[d as usize];
                next[d as usize] += 1;
                send[p as usize] = k;
                p
            })
            .collect();
        (send, pos)
    }

    /// Step 3: this rank's rows for the keys other ranks asked it for, as float32, and (keyed
    /// tables) whether each key was found.
    fn serve(&self, asked: &[u64], threads: usize) -> (Vec<f32>, Vec<u8>) {
        let m = asked.len();
        let mut rows = vec![0f32; m * self.dim];
        match (&self.route, self.local.as_slice()) {
            (Route::Keyed, [share]) => {
                gather(&share.table, asked, &mut rows, threads);
                let found = match &share.table.rows {
                    Rows::Keyed(ix) => asked.iter().map(|&k| ix.get(k).is_some() as u8).collect(),
                    Rows::Dense => vec![1; m],
                };
                (rows, found)
            }
            (_, [part]) => {
                let local: Vec<u64> = asked.iter().map(|&k| k - part.start as u64).collect();
                gather(&part.table, &local, &mut rows, threads);
                (rows, Vec::new())
            }
            (_, parts) => {
                // Several local partitions (replicas of several): gather each one's keys apart.
                for part in parts {
                    let (lo, hi) = (part.start as u64, (part.start + part.table.len()) as u64);
                    let idx: Vec<usize> = (0..m).filter(|&i| (lo..hi).contains(&asked[i])).collect();
                    let local: Vec<u64> = idx.iter().map(|&i| asked[i] - lo).collect();
                    let mut got = vec![0f32; idx.len() * self.dim];
                    gather(&part.table, &local, &mut got, threads);
                    for (j, &i) in idx.iter().enumerate() {
                        rows[i * self.dim..(i + 1) * self.dim].copy_from_slice(&got[j * self.dim..(j + 1) * self.dim]);
                    }
                }
                (rows, Vec::new())
            }
        }
    }

    /// Step 5: writes every key's row into `out` (in parallel chunks) and counts hits and misses.
    fn write(&self, req: &Request, pos: &[u32], back: &[f32], found: Option<&[u8]>) -> Result<LookupStats> {
        let Some(plan) = &req.plan else { return Ok(LookupStats::default()) };
        let (n, dim) = (plan.n, self.dim);
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
                    let p = pos[i];
                    let hit = p != NOWHERE && found.is_none_or(|fl| fl[p as usize] != 0);
                    present[i - lo] = hit;
                    if hit {
                        let p = p as usize;
                        staging[(i - lo) * dim..(i - lo + 1) * dim].copy_from_slice(&back[p * dim..(p + 1) * dim]);
                        f.hits += 1;
                    } else {
                        f.misses += 1;
                        if f.first_miss.is_none() {
                            f.first_miss = Some((i, req.keys[i]));
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
        if let (MissingKey::STRATA_MISSING_ERROR, Some((index, key))) = (self.missing, first) {
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
