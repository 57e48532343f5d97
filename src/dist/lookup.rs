//! The collective lookup on a [`DistTable`]:
//! 1. each rank validates its `keys` and `out` (as a local lookup would), reads its keys and
//!    buckets them by owner (counts, then one counting-sort pass); the all-to-all of per-owner
//!    counts also carries each rank's validation status, so a bad input on one rank fails the
//!    call on every rank;
//! 2. keys owned by other ranks go to their owners (all-to-all-v); a rank's own keys never
//!    travel;
//! 3. owners gather the rows other ranks asked for: with the CPU executor, as float32 (exact for
//!    every float dtype), for a float table; as the stored bytes for a quantized one, whose rows
//!    thus travel quantized (int8 at dim 64: 72 bytes a row instead of 256);
//! 4. those rows (and, for keyed tables, found flags) come back (all-to-all-v);
//! 5. each rank writes every key's row into `out` in one pass in its keys' order, in `out`'s
//!    dtype (dequantizing quantized rows): received rows from the exchange buffer, its own keys'
//!    rows straight from its local partition, the default row for misses. With
//!    `STRATA_MISSING_ERROR` the ranks then agree, so a missing key on any rank fails the call on
//!    every rank. A pooled lookup of a quantized table ([`DistTable::pool_stored`]) pools the
//!    rows where they lie instead, received or local, dequantized inside the float32
//!    accumulation.
//!
//! Rows thus cross memory once for a local key (table to `out`, as in a single process) and
//! three times for a remote one (table to the send buffer, the exchange, the receive buffer to
//! `out`). The buffers are kept between calls, in huge-page memory, and never zeroed.

use super::comm::{Comm, displs, size};
use super::scratch::Scratch;
use super::table::{DistTable, LocalPart, Route};
use crate::dlpack::{FloatDtype, KeyDtype, Walk};
use crate::error::{Error, Result};
use crate::exec::cpu::{Found, Gather};
use crate::exec::pool;
use crate::exec::pooled::pool_gathered;
use crate::kernels::{RowFn, RowFormat, prefetch_row, row_fn, store_fence};
use crate::model::{KeySource, OutTarget, PooledPlan};
use crate::model::{LookupOptions, LookupStats, Plan, Request, plan};
use crate::model::{MissingKey, Rows, StaticTable};
use crate::util::lock::lock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Keys a writer handles at a time in step 5 (its stack buffers hold one chunk).
const CHUNK: usize = 256;
/// Keys a writer takes from the shared counter at a time in step 5.
const TASK: usize = 2048;
/// How many keys ahead step 5 prefetches rows (and, two stages further, index buckets).
const AHEAD: usize = 6;
/// Output bytes from which step 5 writes with non-temporal stores (as the CPU gather does).
const STREAM_BYTES: usize = 4 << 20;
/// `pos` of a key no rank holds.
const NOWHERE: u32 = u32::MAX;
/// `pos` of a key this rank holds (its row is read from the local partition).
const LOCAL: u32 = u32::MAX - 1;

/// The phases of a lookup, as timed in [`DistTiming`](super::DistTiming).
#[derive(Clone, Copy)]
enum Phase {
    Bucket,
    KeyExchange,
    Gather,
    RowExchange,
    Reorder,
}

/// Times a lookup's phases: each [`Laps::lap`] charges the time since the previous one.
struct Laps {
    start: Instant,
    last: Instant,
    spent: [f64; 5],
    keys: u64,
    keys_sent: u64,
    keys_served: u64,
    bytes_sent: u64,
    threads: u64,
}

impl Laps {
    fn new() -> Self {
        let now = Instant::now();
        Laps { start: now, last: now, spent: [0.0; 5], keys: 0, keys_sent: 0, keys_served: 0, bytes_sent: 0, threads: 0 }
    }

    fn lap(&mut self, phase: Phase) {
        let now = Instant::now();
        self.spent[phase as usize] += (now - self.last).as_secs_f64();
        self.last = now;
    }

    fn add_to(&self, t: &mut super::DistTiming) {
        let [b, k, g, r, o] = self.spent;
        t.bucket_s += b;
        t.key_exchange_s += k;
        t.gather_s += g;
        t.row_exchange_s += r;
        t.reorder_s += o;
        t.keys += self.keys;
        t.keys_sent += self.keys_sent;
        t.keys_served += self.keys_served;
        t.bytes_sent += self.bytes_sent;
        t.threads = self.threads;
    }
}

/// A rank's validated request, before any exchange.
struct RankRequest<P> {
    /// What the rows are for: a plain lookup's plan (`None` when this rank has no keys: it still
    /// takes part in the exchanges), or nothing (a pooled lookup's caller holds its plan).
    plan: P,
    /// Keys for each rank (0 for this one: its own keys do not travel).
    counts: Vec<i32>,
    threads: usize,
}

impl DistTable {
    /// Collective: every rank of the table's communicator must call it, in the same order for
    /// the same table. See [`crate::table::Table::lookup`] for `keys`, `out` and the result.
    /// `opts.num_threads` 0 means this rank's share of its node's CPUs (see
    /// [`Comm::node_threads`]).
    ///
    /// `r` is a plain request (its pooling is not looked at).
    pub fn lookup(&self, r: &Request, opts: &LookupOptions) -> Result<LookupStats> {
        self.collective(|comm, scratch, laps| self.lookup_with(comm, scratch, r, opts, laps))
    }

    /// A pooled lookup of a quantized table, collective as [`DistTable::lookup`]: `p` is every
    /// rank's agreed plan. The rows travel quantized and are pooled where they lie (received, or
    /// in this rank's partitions), dequantized inside the float32 accumulation in key order, as
    /// a single-process table pools them; a missing key contributes the default row.
    pub(crate) fn pool_stored(&self, p: &PooledPlan, opts: &LookupOptions) -> Result<LookupStats> {
        self.collective(|comm, s, laps| {
            let keys = (p.nnz > 0).then_some((&p.keys, p.nnz));
            let local = self.bucket(s, keys, opts).map(|(counts, threads)| RankRequest { plan: (), counts, threads });
            laps.lap(Phase::Bucket);
            let (req, recv) = self.exchange_counts(comm, local)?;
            self.fetch(comm, s, &req.counts, &recv, req.threads, laps);
            let rows = self.sources(s);
            if self.missing == MissingKey::Error {
                let first = (0..s.keys.len()).find(|&i| rows.row(i).is_none());
                let missing = first.map(|index| Error::KeyNotFound { key: p.key_dtype.value(s.keys[index]), index });
                comm.agree(missing.map_or(Ok(()), Err))?;
            }
            let row = |i: usize| rows.row(i).map_or(std::ptr::null(), |(r, _)| r);
            let found = pool_gathered(&row, self.format, self.dim, &self.default_row, p)?;
            laps.lap(Phase::Reorder);
            Ok(LookupStats { hits: found.hits, misses: found.misses, ..LookupStats::default() })
        })
    }

    /// Runs one collective call with the communicator and scratch held, timing its phases.
    fn collective<T>(&self, call: impl FnOnce(&mut Comm, &mut Scratch, &mut Laps) -> Result<T>) -> Result<T> {
        let mut state = lock(&self.state);
        let (comm, scratch) = &mut *state;
        let mut laps = Laps::new();
        let result = call(comm, scratch, &mut laps);
        let exchange = comm.take_time();
        let mut t = lock(&self.timing);
        t.lookups += 1;
        t.total_s += laps.start.elapsed().as_secs_f64();
        t.exchange_s += exchange.as_secs_f64();
        laps.add_to(&mut t);
        result
    }

    /// The error of a lookup this rank refuses at the C boundary, before [`DistTable::lookup`]
    /// (a NULL tensor, unreadable options): takes part in the lookup's first collective step,
    /// the count exchange, with the error, so the other ranks fail with it as they would for a
    /// bad tensor found inside the lookup, instead of waiting for this rank forever.
    pub(crate) fn refuse_lookup(&self, e: Error) -> Error {
        let mut state = lock(&self.state);
        match self.exchange_counts(&mut state.0, Err::<RankRequest<()>, _>(e)) {
            Err(e) => e,
            Ok(_) => Error::Internal("the count exchange dropped an error".into()),
        }
    }

    /// A lookup's first collective step: each rank sends every other rank how many keys it asks
    /// of it, or, when its own step 1 failed, its error's code (negated) in their place. Returns
    /// this rank's request and the counts the others ask of it, or the first failing rank's
    /// error on every rank ([`Comm::settle`]).
    fn exchange_counts<P>(&self, comm: &mut Comm, local: Result<RankRequest<P>>) -> Result<(RankRequest<P>, Vec<i64>)> {
        let send: Vec<i64> = match &local {
            Ok(r) => r.counts.iter().map(|&c| c as i64).collect(),
            Err(e) => vec![-(e.kind().code() as i64); self.size],
        };
        let recv = comm.all_to_all(&send);
        let codes: Vec<i32> = recv.iter().map(|&c| if c < 0 { -c as i32 } else { 0 }).collect();
        Ok((comm.settle(local, &codes)?, recv))
    }

    /// The collective verdict on a step every rank ran locally (see [`Comm::agree`]): every
    /// rank gets `Ok` when every rank succeeded, else every rank fails.
    pub(crate) fn agree<T>(&self, local: Result<T>) -> Result<T> {
        let mut state = lock(&self.state);
        state.0.agree(local)
    }

    /// The collective lookup with the communicator and scratch held.
    fn lookup_with(&self, comm: &mut Comm, s: &mut Scratch, r: &Request, opts: &LookupOptions, laps: &mut Laps) -> Result<LookupStats> {
        let local = self.request(s, r, opts);
        laps.lap(Phase::Bucket);
        let (req, recv) = self.exchange_counts(comm, local)?;
        self.fetch(comm, s, &req.counts, &recv, req.threads, laps);
        let result = self.write(s, &req);
        laps.lap(Phase::Reorder);
        if self.missing == MissingKey::Error { comm.agree(result) } else { result }
    }

    /// The format rows travel in: a quantized table's own rows (fewer bytes than any float),
    /// float32 for a float table (exact for every float dtype).
    pub(crate) fn wire(&self) -> RowFormat {
        if self.format.is_quantized() { self.format } else { RowFormat::Float(FloatDtype::F32) }
    }

    /// Steps 2 to 4, once every rank's counts are known (`counts`: this rank's keys for each
    /// rank; `recv`: the keys each rank asks of this one): the keys go to their owners, which
    /// serve their rows, and the rows (with found flags, keyed tables) come back into `back`.
    fn fetch(&self, comm: &mut Comm, s: &mut Scratch, counts: &[i32], recv: &[i64], threads: usize, laps: &mut Laps) {
        let recv_counts: Vec<i32> = recv.iter().map(|&c| c as i32).collect();
        laps.lap(Phase::KeyExchange);

        self.by_owner(s, counts);
        laps.lap(Phase::Bucket);
        let served: usize = recv_counts.iter().map(|&c| c as usize).sum();
        size(&mut s.asked, served);
        comm.exchange(&s.send, counts, &recv_counts, 1, &mut s.asked);
        laps.lap(Phase::KeyExchange);
        self.serve(s, threads);
        laps.lap(Phase::Gather);
        let row_bytes = self.wire().row_bytes(self.dim);
        comm.exchange(s.rows.as_slice(), &recv_counts, counts, row_bytes, s.back.as_mut_slice());
        let keyed = matches!(self.route, Route::Keyed);
        if keyed {
            size(&mut s.back_found, s.send.len());
            comm.exchange(&s.found, &recv_counts, counts, 1, &mut s.back_found);
        }
        laps.lap(Phase::RowExchange);
        let sent = s.send.len() as u64;
        laps.keys = s.keys.len() as u64;
        laps.keys_sent = sent;
        laps.keys_served = served as u64;
        laps.bytes_sent = sent * 8 + served as u64 * (row_bytes as u64 + keyed as u64);
        laps.threads = threads as u64;
    }

    /// Step 1 of a plain lookup on this rank: validates the tensors, then [`DistTable::bucket`]s
    /// the keys.
    fn request(&self, s: &mut Scratch, r: &Request, opts: &LookupOptions) -> Result<RankRequest<Option<Plan>>> {
        let ranges: Vec<(usize, usize)> = self.local.iter().map(|p| p.table.store().byte_range()).collect();
        let planned = plan(self.dim, ranges.first().copied().unwrap_or((0, 0)), r, opts)?;
        for range in ranges.iter().skip(1) {
            // (This pass only checks out against another local partition.)
            plan(self.dim, *range, r, opts)?;
        }
        let (counts, threads) = self.bucket(s, planned.as_ref().map(|p| (&p.keys, p.n)), opts)?;
        Ok(RankRequest { plan: planned, counts, threads })
    }

    /// Step 1 once the keys are checked (`keys`: where they are and how many; `None` when this
    /// rank has none): reads them, finds their owners and counts the keys for each other rank
    /// (returned, with the threads to run on); sizes the receive buffer (the one allocation that
    /// may fail here, which is agreed on with the rest).
    fn bucket(&self, s: &mut Scratch, keys: Option<(&KeySource, usize)>, opts: &LookupOptions) -> Result<(Vec<i32>, usize)> {
        // (A rank without keys of its own still serves other ranks' keys on these threads.)
        let threads = match opts.num_threads {
            0 => self.threads,
            n => crate::util::threads::resolve_threads(n)?,
        };
        let mut counts = vec![0i32; self.size];
        let n = keys.map_or(0, |(_, n)| n);
        // (MPI counts are int; below that bound `pos` never reaches LOCAL or NOWHERE.)
        if n > i32::MAX as usize {
            return Err(Error::invalid(
                "keys",
                format!("{n} keys; a lookup on a distributed table takes at most {} keys per rank", i32::MAX),
            ));
        }
        size(&mut s.keys, n);
        if let Some((source, _)) = keys {
            let mut offs = [0isize; CHUNK];
            for (c, chunk) in s.keys.chunks_mut(CHUNK).enumerate() {
                source.read(c * CHUNK, chunk, &mut offs[..chunk.len()]);
            }
        }
        size(&mut s.dest, n);
        let me = self.rank;
        for (&k, d) in s.keys.iter().zip(s.dest.iter_mut()) {
            *d = match self.owner(k) {
                Some(o) => {
                    if o != me {
                        counts[o] += 1;
                    }
                    o as u32
                }
                None => NOWHERE,
            };
        }
        let remote: usize = counts.iter().map(|&c| c as usize).sum();
        s.back.resize(remote * self.wire().row_bytes(self.dim))?;
        Ok((counts, threads))
    }

    /// Puts the keys for other ranks in owner order (`send`) and notes where each of the
    /// caller's keys' rows will be (`pos`).
    fn by_owner(&self, s: &mut Scratch, counts: &[i32]) {
        let mut next: Vec<u32> = displs(counts).iter().map(|&d| d as u32).collect();
        size(&mut s.send, counts.iter().map(|&c| c as usize).sum());
        size(&mut s.pos, s.keys.len());
        let me = self.rank as u32;
        for ((&k, &d), p) in s.keys.iter().zip(&s.dest).zip(s.pos.iter_mut()) {
            *p = if d == NOWHERE {
                NOWHERE
            } else if d == me {
                LOCAL
            } else {
                let slot = next[d as usize];
                next[d as usize] += 1;
                s.send[slot as usize] = k;
                slot
            };
        }
    }

    /// Step 3: this rank's rows for the keys other ranks asked it for (`asked`), as they travel
    /// ([`DistTable::wire`]) in `rows`, and (keyed tables) whether each key was found, in
    /// `found`.
    fn serve(&self, s: &mut Scratch, threads: usize) {
        if self.format.is_quantized() {
            return self.serve_stored(s, threads);
        }
        let (m, dim) = (s.asked.len(), self.dim);
        s.rows.resize_or_abort(m * dim * 4);
        let rows = s.rows.as_mut_slice_of::<f32>();
        match (&self.route, self.local.as_slice()) {
            (Route::Keyed, [share]) => {
                gather(&share.table, &s.asked, rows, threads);
                size(&mut s.found, m);
                if let Rows::Keyed(ix) = &share.table.rows {
                    // The gather probed these buckets already, but long ago for a large batch:
                    // prefetch them again, a fixed distance ahead.
                    for (i, (f, &k)) in s.found.iter_mut().zip(&s.asked).enumerate() {
                        if let Some(&ahead) = s.asked.get(i + 4 * AHEAD) {
                            ix.prefetch(ahead);
                        }
                        *f = ix.get(k).is_some() as u8;
                    }
                }
            }
            (_, [part]) => {
                let start = part.start as u64;
                s.asked.iter_mut().for_each(|k| *k -= start);
                gather(&part.table, &s.asked, rows, threads);
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
                        rows[i * dim..(i + 1) * dim].copy_from_slice(&got[j * dim..(j + 1) * dim]);
                    }
                }
            }
        }
    }

    /// Step 3 for a quantized table: the stored bytes of the rows other ranks asked for, copied
    /// as they are (split over `threads`), and whether each was found (read for keyed tables
    /// only).
    fn serve_stored(&self, s: &mut Scratch, threads: usize) {
        let (m, rb) = (s.asked.len(), self.format.row_bytes(self.dim));
        s.rows.resize_or_abort(m * rb);
        size(&mut s.found, m);
        let local = LocalRows::of(&self.local);
        let tasks: Vec<Mutex<StoredTask>> = s
            .asked
            .chunks(TASK)
            .zip(s.rows.as_mut_slice().chunks_mut(TASK * rb))
            .zip(s.found.chunks_mut(TASK))
            .map(|((keys, rows), found)| Mutex::new((keys, rows, found)))
            .collect();
        let next = AtomicUsize::new(0);
        pool::run(threads.min(tasks.len()).max(1), || {
            while let Some(task) = tasks.get(next.fetch_add(1, Ordering::Relaxed)) {
                let mut task = lock(task);
                let (keys, rows, found) = &mut *task;
                for (i, &k) in keys.iter().enumerate() {
                    if let Some(&ahead) = keys.get(i + 2 * AHEAD) {
                        local.prefetch(ahead);
                    }
                    let row = local.row(k);
                    found[i] = row.is_some() as u8;
                    if let Some(src) = row {
                        // SAFETY: src is the start of a row of a local table (LocalRows::row checked
                        // the key), which holds rb bytes of the table's format, alive and unchanged
                        // for the call.
                        rows[i * rb..(i + 1) * rb].copy_from_slice(unsafe { std::slice::from_raw_parts(src, rb) });
                    }
                }
            }
        });
    }

    /// Where each of this rank's keys' rows is once the rows came back.
    fn sources<'a>(&'a self, s: &'a Scratch) -> Sources<'a> {
        Sources {
            s,
            found: matches!(self.route, Route::Keyed).then_some(&s.back_found[..]),
            back: s.back.as_slice(),
            row_bytes: self.wire().row_bytes(self.dim),
            local: LocalRows::of(&self.local),
        }
    }

    /// Step 5: writes every key's row into `out` in the caller's order (in parallel runs of
    /// keys) and counts hits and misses.
    fn write(&self, s: &Scratch, req: &RankRequest<Option<Plan>>) -> Result<LookupStats> {
        let Some(plan) = &req.plan else { return Ok(LookupStats::default()) };
        let (n, dim) = (plan.n, self.dim);
        let out = &plan.out;
        let stream = n.saturating_mul(dim * out.dtype.size()) >= STREAM_BYTES;
        let contiguous = out.col_stride == 1;
        let w = Writer {
            src: self.sources(s),
            out,
            dim,
            from_back: row_fn(self.wire(), out.dtype, contiguous, stream),
            from_local: self.local.first().map(|p| row_fn(p.table.format(), out.dtype, contiguous, stream)),
            default: row_fn(FloatDtype::F32, out.dtype, contiguous, stream),
            default_row: &self.default_row,
        };
        let next = AtomicUsize::new(0);
        let parts = pool::run(req.threads.min(n.div_ceil(TASK)).max(1), || {
            let mut f = Found::default();
            loop {
                let lo = next.fetch_add(TASK, Ordering::Relaxed);
                if lo >= n {
                    break;
                }
                let hi = (lo + TASK).min(n);
                for c in (lo..hi).step_by(CHUNK) {
                    w.chunk(c, (c + CHUNK).min(hi), &mut f);
                }
            }
            if stream {
                store_fence();
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

/// A share of [`DistTable::serve_stored`]'s work: asked keys, their rows and their found flags.
type StoredTask<'a> = (&'a [u64], &'a mut [u8], &'a mut [u8]);

/// Where this rank's own keys' rows are.
enum LocalRows<'a> {
    /// None here.
    Empty,
    /// One dense partition holding global rows `start ..`.
    Dense { start: u64, table: &'a StaticTable },
    /// A keyed share.
    Keyed(&'a StaticTable, &'a crate::storage::index::KeyIndex),
    /// Several dense partitions (replicas).
    Parts(&'a [LocalPart]),
}

impl<'a> LocalRows<'a> {
    fn of(local: &'a [LocalPart]) -> Self {
        match local {
            [] => LocalRows::Empty,
            [p] => match &p.table.rows {
                Rows::Keyed(ix) => LocalRows::Keyed(&p.table, ix),
                Rows::Dense => LocalRows::Dense { start: p.start as u64, table: &p.table },
            },
            parts => LocalRows::Parts(parts),
        }
    }

    /// Hints the index bucket of `key` into cache (keyed shares).
    #[inline(always)]
    fn prefetch(&self, key: u64) {
        if let LocalRows::Keyed(_, ix) = self {
            ix.prefetch(key);
        }
    }

    /// The row of `key` (which `owner` placed on this rank) in its table's dtype, or `None` for
    /// a key a keyed share lacks.
    #[inline(always)]
    fn row(&self, key: u64) -> Option<*const u8> {
        match self {
            LocalRows::Empty => None,
            LocalRows::Dense { start, table } => Some(table.store().row_ptr((key - start) as usize)),
            LocalRows::Keyed(table, ix) => ix.get(key).map(|r| table.store().row_ptr(r)),
            LocalRows::Parts(parts) => parts
                .iter()
                .find(|p| (p.start as u64..(p.start + p.table.len()) as u64).contains(&key))
                .map(|p| p.table.store().row_ptr((key - p.start as u64) as usize)),
        }
    }
}

/// Where this rank's keys' rows are after the exchanges: received ones in `back` (`row_bytes`
/// apart, with found flags for keyed tables), its own in its local partitions.
struct Sources<'a> {
    s: &'a Scratch,
    found: Option<&'a [u8]>,
    back: &'a [u8],
    row_bytes: usize,
    local: LocalRows<'a>,
}

impl Sources<'_> {
    /// Key `i`'s row and whether it is a local one (in the table's format; a received one is in
    /// the wire format), or `None` for a miss.
    #[inline(always)]
    fn row(&self, i: usize) -> Option<(*const u8, bool)> {
        let p = self.s.pos[i];
        if p == NOWHERE {
            return None;
        }
        if p == LOCAL {
            return self.local.row(self.s.keys[i]).map(|r| (r, true));
        }
        let p = p as usize;
        if self.found.is_some_and(|f| f[p] == 0) {
            return None;
        }
        Some((self.back[p * self.row_bytes..].as_ptr(), false))
    }
}

/// Step 5's view of one lookup, shared by its writers.
struct Writer<'a> {
    src: Sources<'a>,
    out: &'a OutTarget,
    dim: usize,
    from_back: RowFn,
    from_local: Option<RowFn>,
    default: RowFn,
    default_row: &'a [f32],
}

// SAFETY: the raw pointers (in `out` and the local tables) are only dereferenced by `chunk`, on
// the distinct output rows of the keys each writer takes, within the lookup call.
unsafe impl Sync for Writer<'_> {}

impl Writer<'_> {
    /// The source row of key `i` (a received row in the wire format, a local row in the
    /// table's format or the float32 default row) with its kernel, and whether it is a hit.
    #[inline(always)]
    fn source(&self, i: usize) -> (*const u8, RowFn, bool) {
        let miss = (self.default_row.as_ptr() as *const u8, self.default, false);
        match self.src.row(i) {
            Some((r, false)) => (r, self.from_back, true),
            Some((r, true)) => self.from_local.map_or(miss, |k| (r, k, true)),
            None => miss,
        }
    }

    /// Writes the rows of keys `lo..hi` (at most [`CHUNK`]): sources resolved and prefetched
    /// [`AHEAD`] keys ahead of the copies (index buckets of local keys twice as far ahead).
    fn chunk(&self, lo: usize, hi: usize, f: &mut Found) {
        let m = hi - lo;
        let mut offs = [0isize; CHUNK];
        let mut src: [(*const u8, RowFn, bool); CHUNK] = [(std::ptr::null(), self.default, false); CHUNK];
        self.out.walk.fill(lo, &mut offs[..m]);
        let keys = &self.src.s.keys[lo..hi];
        let pos = &self.src.s.pos[lo..hi];
        let row_bytes = self.src.row_bytes;
        let prefetch_bucket = |j: usize| {
            if pos[j] == LOCAL {
                self.src.local.prefetch(keys[j]);
            }
        };
        (0..m.min(2 * AHEAD)).for_each(prefetch_bucket);
        for (j, sj) in src.iter_mut().enumerate().take(m.min(AHEAD)) {
            *sj = self.source(lo + j);
            prefetch_row(sj.0, row_bytes);
        }
        let size = self.out.dtype.size() as isize;
        let cs = self.out.col_stride;
        for j in 0..m {
            if j + 2 * AHEAD < m {
                prefetch_bucket(j + 2 * AHEAD);
            }
            if j + AHEAD < m {
                src[j + AHEAD] = self.source(lo + j + AHEAD);
                prefetch_row(src[j + AHEAD].0, row_bytes);
            }
            let (ptr, kernel, hit) = src[j];
            if hit {
                f.hits += 1;
            } else {
                f.misses += 1;
                if f.first_miss.is_none_or(|(i, _)| lo + j < i) {
                    f.first_miss = Some((lo + j, keys[j]));
                }
            }
            // SAFETY: ptr holds dim elements of the kernel's source format (a row of `back`,
            // which holds a row of the wire format per received key; a row of a local table, below its row
            // count since `owner` and `LocalRows::row` checked the key; or the default row);
            // the destination is key lo + j's output row, which the plan validated to lie in
            // `out`, apart from other keys' rows and from the keys and local tables. `back` and
            // the default row are this table's own memory, never `out`.
            unsafe { kernel(ptr, self.out.ptr.wrapping_offset(offs[j] * size), self.dim, cs) };
        }
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
    let source = KeySource { ptr: keys.as_ptr().cast(), dtype: KeyDtype::U64, walk: Walk::new(&[n], &[1]), elem: 8 };
    let target = OutTarget { ptr: rows.as_mut_ptr().cast(), dtype: FloatDtype::F32, walk: Walk::new(&[n], &[dim as isize]), col_stride: 1 };
    Gather { table, keys: &source, out: &target, n, threads }.run();
}
