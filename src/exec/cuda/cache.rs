//! The GPU cache of a table's hot rows (placement `STRATA_GPU_CACHE`), and a lookup through it
//! with no host synchronisation:
//!
//! 1. `probe` (on the caller's stream) copies the hits into `out` and lists the misses (key and
//!    position) in page-locked host memory the GPU writes directly; the hit and miss counts go
//!    to device memory and are copied back behind it.
//! 2. A host function, run by the driver in stream order once the probe is done, resolves the
//!    misses on the host (static table, or volatile then persistent tier) into page-locked
//!    staging rows, unless the last completed lookup's hit rate reached `hit_rate_threshold`:
//!    then the misses get the default row now and a background thread resolves them and
//!    inserts them on the device's internal stream (HPS's asynchronous insert, without HPS's
//!    host synchronisation on every lookup).
//! 3. `fill` (on the caller's stream) writes the resolved rows (or defaults) into `out` and
//!    inserts them into the cache.
//!
//! Ordering the caller gets: every row of `out` is final when the stream reaches the end of
//! the lookup's work, as for any kernel. Rows inserted in the background become visible to
//! later lookups once their insert has run. A lookup on another stream may run concurrently:
//! each cache set has a seqlock, so a reader never returns a torn row (it treats the key as a
//! miss instead). Upserts and erases on a server table are seen by the cache at the next
//! lookup, which empties it first.
//!
//! The host functions refer to the table: its [`Residency`](super::Residency) waits for them
//! (and for background inserts) before the table is freed.

use super::backend::{Backend, HostFn, Mem, grid};
use super::inflight::InFlight;
use super::io::{Io, float_name, key_name};
use super::params::{CacheParams, FILL_DEFAULTS, FILL_ROWS, WAYS};
use crate::dlpack::FloatDtype;
use crate::error::Result;
use crate::model::RowSource;
use crate::util::lock::lock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One device's cache of a table's rows.
pub(crate) struct CacheState {
    /// Sets of [`WAYS`] rows; 0 = no rows cached (every key resolved on the host).
    pub sets: u64,
    dim: usize,
    dtype: FloatDtype,
    slot_keys: Option<Mem>,
    slot_used: Option<Mem>,
    set_version: Option<Mem>,
    vectors: Option<Mem>,
    /// The default row, in device memory.
    default_row: Mem,
    threshold: f32,
    /// Last-use clock (never 0, which marks an empty way).
    tick: AtomicU32,
    /// Hit rate of the last completed lookup, as f32 bits.
    last_hit_rate: AtomicU32,
    /// The table generation the cache holds rows of (server tables change).
    generation: AtomicU64,
    /// Staging buffers of finished lookups, for reuse.
    pool: Mutex<Vec<Staging>>,
}

/// Page-locked buffers of one lookup through the cache.
pub(crate) struct Staging {
    capacity: usize,
    /// Device: [hits, misses].
    counters: Mem,
    /// Host, mapped: [hits, misses] copied back, then the lookup's own results.
    host_counters: Mem,
    miss_keys: Mem,
    miss_index: Mem,
    rows: Mem,
    found: Mem,
    control: Mem,
}

impl Staging {
    fn new(b: &dyn Backend, capacity: usize, dim: usize) -> Result<Self> {
        Ok(Staging {
            capacity,
            counters: b.alloc_device(16, "cache counters")?,
            host_counters: b.alloc_mapped(32, "cache counters")?,
            miss_keys: b.alloc_mapped(capacity * 8, "cache miss keys")?,
            miss_index: b.alloc_mapped(capacity * 8, "cache miss positions")?,
            rows: b.alloc_mapped(capacity * dim * 4, "cache miss rows")?,
            found: b.alloc_mapped(capacity * 4, "cache miss flags")?,
            control: b.alloc_mapped(16, "cache control")?,
        })
    }
}

/// What a lookup through the cache found, known once its stream has passed the host function.
#[derive(Default, Clone, Copy)]
pub(crate) struct CacheCounts {
    pub hits: u64,
    pub misses: u64,
}

/// A pointer to the table's rows for host functions. The table's residency waits for every
/// host function that holds one (through [`InFlight`]) before the table is freed.
#[derive(Clone, Copy)]
struct TablePtr(*const (dyn RowSource + 'static));
// SAFETY: RowSource is Sync; see above for the lifetime.
unsafe impl Send for TablePtr {}

impl TablePtr {
    fn new(source: &dyn RowSource) -> Self {
        let p: *const (dyn RowSource + '_) = source;
        // SAFETY: only the lifetime bound is erased; the residency keeps the table alive for
        // as long as any work holding the pointer is in flight (see above).
        TablePtr(unsafe { std::mem::transmute::<*const (dyn RowSource + '_), *const (dyn RowSource + 'static)>(p) })
    }

    /// # Safety
    /// The table's residency must still be waiting for the work holding this pointer.
    unsafe fn get<'a>(self) -> &'a dyn RowSource {
        // SAFETY: the caller guarantees the table is still alive.
        unsafe { &*self.0 }
    }
}

impl CacheState {
    /// A cache of `fraction` of `rows` rows of `dim` elements of `dtype`, empty.
    pub(crate) fn new(
        b: &dyn Backend,
        rows: usize,
        dim: usize,
        dtype: FloatDtype,
        fraction: f32,
        threshold: f32,
        default_row: &[f32],
    ) -> Result<Self> {
        let capacity = (rows as f64 * fraction as f64).ceil() as usize;
        let sets = capacity.div_ceil(WAYS) as u64;
        let slots = sets as usize * WAYS;
        let alloc =
            |bytes: usize, what: &str| -> Result<Option<Mem>> { if sets == 0 { Ok(None) } else { b.alloc_device(bytes, what).map(Some) } };
        let default = b.alloc_device(dim * 4, "the default row")?;
        b.upload(default.dev, default_row.as_ptr() as *const u8, std::mem::size_of_val(default_row))?;
        Ok(CacheState {
            sets,
            dim,
            dtype,
            slot_keys: alloc(slots * 8, "cache keys")?,
            slot_used: alloc(slots * 4, "cache ways")?,
            set_version: alloc(sets as usize * 4, "cache versions")?,
            vectors: alloc(slots * dim * dtype.size(), "cache rows")?,
            default_row: default,
            threshold,
            tick: AtomicU32::new(1),
            last_hit_rate: AtomicU32::new(0f32.to_bits()),
            generation: AtomicU64::new(0),
            pool: Mutex::new(Vec::new()),
        })
    }

    /// The hit rate of the last lookup whose misses were resolved.
    pub(crate) fn last_hit_rate(&self) -> f32 {
        f32::from_bits(self.last_hit_rate.load(Ordering::Relaxed))
    }

    fn addr(m: &Option<Mem>) -> u64 {
        m.as_ref().map_or(0, |m| m.dev)
    }

    fn take_staging(&self, b: &dyn Backend, n: usize) -> Result<Staging> {
        let mut pool = lock(&self.pool);
        if let Some(i) = pool.iter().position(|s| s.capacity >= n) {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        Staging::new(b, n.next_power_of_two().max(1024), self.dim)
    }

    fn next_tick(&self) -> u32 {
        loop {
            let t = self.tick.fetch_add(1, Ordering::Relaxed);
            if t != 0 {
                return t;
            }
        }
    }

    /// Empties the cache when the table changed since its rows were cached (queued on `b`'s
    /// stream).
    fn prepare(&self, b: &dyn Backend, table: &dyn RowSource) -> Result<()> {
        let generation = table.generation();
        if self.generation.swap(generation, Ordering::Relaxed) != generation
            && let Some(used) = &self.slot_used
        {
            // SAFETY: the cache's own device memory.
            unsafe { b.zero(used.dev, used.bytes) }?;
        }
        Ok(())
    }

    /// Looks up `n` keys through the cache on `b`'s stream (see the module docs). `params`
    /// holds the keys and out; the result counts are filled in `counts` once the stream has
    /// passed the host function (read them after synchronising).
    ///
    /// # Safety
    /// `io` must describe valid device-visible keys and out, until
    /// the stream has run this work; `table` must be the table this cache belongs to, with its
    /// residency's `inflight`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn lookup(
        self: &Arc<Self>,
        b: &dyn Backend,
        table: &dyn RowSource,
        inflight: &Arc<InFlight>,
        io: &Io,
        counts: Option<Arc<Mutex<CacheCounts>>>,
        always_resolve: bool,
    ) -> Result<()> {
        let n = io.n as usize;
        self.prepare(b, table)?;
        let staging = self.take_staging(b, n)?;
        let (keys, table_dtype, out) = (key_name(io.key_dtype), float_name(self.dtype), float_name(io.out_dtype));
        let probe = format!("strata_cache_probe_{keys}_{table_dtype}_{out}");
        let fill = format!("strata_cache_fill_{table_dtype}_{out}");
        let mut params = CacheParams {
            keys: io.keys,
            key_stride: io.key_stride,
            n: io.n,
            out: io.out,
            out_row_stride: io.out_row_stride,
            out_col_stride: io.out_col_stride,
            ..CacheParams::default()
        };
        params.slot_keys = Self::addr(&self.slot_keys);
        params.slot_used = Self::addr(&self.slot_used);
        params.set_version = Self::addr(&self.set_version);
        params.vectors = Self::addr(&self.vectors);
        params.sets = self.sets;
        params.default_row = self.default_row.dev;
        params.counters = staging.counters.dev;
        params.miss_keys = staging.miss_keys.dev;
        params.miss_index = staging.miss_index.dev;
        params.rows = staging.rows.dev;
        params.found = staging.found.dev;
        params.control = staging.control.dev;
        params.dim = self.dim as u32;
        params.tick = self.next_tick();
        let g = grid(b.sms(), n as u64);
        // SAFETY: the staging is this lookup's alone (taken from the pool or new) with room for
        // at least n misses, and it stays alive until the last host function below has run;
        // counters is its 16 device bytes and host_counters its 32 mapped bytes. params' keys and
        // out come from io, valid until the stream has run this work (our caller's guarantee),
        // and its cache arrays are this cache's own device memory.
        unsafe {
            b.zero(staging.counters.dev, 16)?;
            b.launch_cache(&probe, g, &params)?;
            b.copy_to_host(staging.host_counters.host, staging.counters.dev, 16)?;
        }

        // Step 2: resolve the misses on the host, in stream order.
        let staging = Arc::new(staging);
        let (state, st2, tp, inf) = (self.clone(), staging.clone(), TablePtr::new(table), inflight.clone());
        let dim = self.dim;
        let background_rows = Arc::new(Mutex::new(None::<Vec<u64>>));
        let bg = background_rows.clone();
        let resolve: HostFn = Box::new(move || {
            // SAFETY: the probe has finished (stream order), so the staging's host side is ours.
            let hc = unsafe { st2.host_counters.host_slice::<u64>(4) };
            let (hits, m) = (hc[0], hc[1] as usize);
            let background = !always_resolve && f32::from_bits(state.last_hit_rate.load(Ordering::Relaxed)) >= state.threshold;
            // SAFETY: as above: the probe that wrote the m <= n miss keys has finished, and the
            // fill that reads them runs only after this function returns.
            let keys = unsafe { st2.miss_keys.host_slice::<u64>(m) };
            // SAFETY: as above; found is a separate allocation with room for n flags.
            let found = unsafe { st2.found.host_slice::<u32>(m) };
            // SAFETY: as above; control is a separate 16-byte allocation.
            let control = unsafe { st2.control.host_slice::<u32>(1) };
            let mut resolved = 0u64;
            if background && m > 0 {
                control[0] = FILL_DEFAULTS;
                *lock(&bg) = Some(keys.to_vec());
            } else {
                control[0] = FILL_ROWS;
                // SAFETY: as above; rows is a separate allocation with room for n rows of dim
                // float32 values, and m <= n.
                let rows = unsafe { st2.rows.host_slice::<f32>(m * dim) };
                let mut present = vec![false; m];
                // SAFETY: the residency waits for this function before the table is freed.
                let table = unsafe { tp.get() };
                if table.resolve(keys, rows, &mut present).is_err() {
                    present.fill(false);
                }
                for (f, &p) in found.iter_mut().zip(&present) {
                    *f = p as u32;
                    resolved += p as u64;
                }
            }
            let total = hits + m as u64;
            let rate = if total == 0 { 1.0 } else { hits as f32 / total as f32 };
            state.last_hit_rate.store(rate.to_bits(), Ordering::Relaxed);
            // The lookup's own counts: hits are keys the table holds, the rest got defaults.
            hc[2] = hits + resolved;
            hc[3] = m as u64 - resolved;
            drop(state);
            drop(st2);
            inf.done();
        });
        queue(b, inflight, resolve)?;

        // Step 3: write the misses' rows (or defaults) and insert them.
        // SAFETY: the same params as the probe: io's memory is valid per our caller, and the
        // staging (held by the host functions) and the cache's memory outlive this work.
        unsafe { b.launch_cache(&fill, g, &params)? };

        // Step 4: hand back the staging; start the background insert if step 2 asked for one.
        let (state, st3, tp, inf) = (self.clone(), staging, TablePtr::new(table), inflight.clone());
        let insert_name = format!("strata_cache_insert_{table_dtype}");
        let spawn = b.spawner();
        let finish: HostFn = Box::new(move || {
            // SAFETY: this runs after the fill in stream order, so no device work touches the
            // staging now, and step 2's slices are gone with its closure.
            let hc = unsafe { st3.host_counters.host_slice::<u64>(4) };
            if let Some(c) = counts {
                *lock(&c) = CacheCounts { hits: hc[2], misses: hc[3] };
            }
            let keys = lock(&background_rows).take();
            if let Some(keys) = keys {
                let job_state = state.clone();
                inf.start();
                let inf2 = inf.clone();
                spawn(Box::new(move |b: &dyn Backend| {
                    // SAFETY: the residency waits for this job (in flight) before the table goes.
                    let table = unsafe { tp.get() };
                    let _ = job_state.insert_in_background(b, table, &keys, &insert_name);
                    drop(job_state);
                    inf2.done();
                }));
            }
            // Step 2 dropped its reference before this ran, so this is the last one.
            if let Ok(s) = Arc::try_unwrap(st3) {
                lock(&state.pool).push(s);
            }
            drop(state);
            inf.done();
        });
        queue(b, inflight, finish)
    }

    /// Resolves `keys` on the host and inserts the found rows (background job; `b` is the
    /// device's internal stream, synchronised before returning).
    fn insert_in_background(&self, b: &dyn Backend, table: &dyn RowSource, keys: &[u64], name: &str) -> Result<()> {
        if self.sets == 0 || keys.is_empty() {
            return Ok(());
        }
        let m = keys.len();
        let staging = self.take_staging(b, m)?;
        // SAFETY: a staging in the pool has no device work pending (it returns there only after
        // its lookup's last host function, or after this function's synchronize), and this one
        // is ours alone, with room for m rows of dim float32 values.
        let rows = unsafe { staging.rows.host_slice::<f32>(m * self.dim) };
        let mut present = vec![false; m];
        table.resolve(keys, rows, &mut present)?;
        // SAFETY: as above; miss_keys is a separate allocation with room for m keys.
        unsafe { staging.miss_keys.host_slice::<u64>(m) }.copy_from_slice(keys);
        // SAFETY: as above; found is a separate allocation with room for m flags.
        for (f, &p) in unsafe { staging.found.host_slice::<u32>(m) }.iter_mut().zip(&present) {
            *f = p as u32;
        }
        let params = CacheParams {
            n: m as u64,
            slot_keys: Self::addr(&self.slot_keys),
            slot_used: Self::addr(&self.slot_used),
            set_version: Self::addr(&self.set_version),
            vectors: Self::addr(&self.vectors),
            sets: self.sets,
            default_row: self.default_row.dev,
            miss_keys: staging.miss_keys.dev,
            rows: staging.rows.dev,
            found: staging.found.dev,
            control: staging.control.dev,
            dim: self.dim as u32,
            tick: self.next_tick(),
            ..CacheParams::default()
        };
        // SAFETY: params name only this cache's device memory and the staging's m keys, rows and
        // flags, written above and kept until after the synchronize; keys and out stay 0 (the
        // insert kernel does not use them).
        let r = unsafe { b.launch_cache(name, grid(b.sms(), m as u64), &params) }.and_then(|_| b.synchronize());
        lock(&self.pool).push(staging);
        r
    }
}

/// Queues a host function that refers to the table, counted in flight until it has run (it
/// calls `inflight.done()` last).
fn queue(b: &dyn Backend, inflight: &InFlight, f: HostFn) -> Result<()> {
    inflight.start();
    b.host_fn(f).inspect_err(|_| inflight.done())
}
