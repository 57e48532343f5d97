//! Runs the CUDA lookup algorithms against a CPU build of the kernels (tests only).
//!
//! `tests/cuda_emulated.rs` compiles `gather.cu` as C++ with `tests/cuda_emu/` (each warp's 32
//! lanes run as fibers that meet at warp collectives) into a shared library and loads it here.
//! The lookups below use the same parameter structs, the same gather and cache code
//! ([`super::run::execute`], [`super::cache`]), the same pooled and batch code
//! ([`super::requests`]) and the same shard split as the GPU path; only memory (host memory
//! stands in for device memory) and launches (the emulator) differ. Host functions and
//! background inserts run at once, in order.

use super::backend::{Backend, HostFn, Job, Mem, Spawner};
use super::cache::CacheState;
use super::inflight::InFlight;
use super::params::{BatchParams, CacheParams, GatherParams, PooledParams};
use super::requests::{InPlace, Lookup, check_request};
use super::residency::{GatherSource, Placed, shard_params, split};
use super::run::lookup_on;
use crate::error::{Error, Result};
use crate::model::RowSource;
use crate::model::Rows;
use crate::model::{LookupStats, check};
use dlpark::ffi::DLTensor;
use std::ffi::{CString, c_void};
use std::sync::Arc;

type Launch = unsafe extern "C" fn(*mut c_void, i32, u32, u32, *const c_void);

/// The kernel emulator: a shared library built from `gather.cu` and `tests/cuda_emu/launch.cc`.
pub struct Emulator {
    lib: *mut c_void,
    launch: Launch,
    /// Multiprocessors the grid sizes assume (small, so emulated grids stay small).
    pub sms: u32,
}

// SAFETY: `lib` is a process-wide dlopen handle (never closed) and `launch` a plain function
// pointer into it; neither is tied to the thread that loaded the library.
unsafe impl Send for Emulator {}
// SAFETY: an Emulator is never mutated; dlsym may be called from any thread, and launches are
// serialised by `&self` users (one test thread per emulator).
unsafe impl Sync for Emulator {}

impl Emulator {
    /// Loads the emulator library at `path`.
    pub fn load(path: &std::path::Path) -> std::result::Result<Self, String> {
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: dlopen of a library the test built, by a NUL-terminated path.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // SAFETY: dlopen just failed on this thread, so dlerror returns a non-NULL,
            // NUL-terminated message.
            return Err(format!("dlopen {}: {:?}", path.display(), unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) }));
        }
        // SAFETY: lib is the live handle dlopen just returned; the name is a C string literal.
        let sym = unsafe { libc::dlsym(lib, c"strata_emu_launch".as_ptr()) };
        if sym.is_null() {
            return Err("strata_emu_launch is missing".into());
        }
        // SAFETY: the symbol has this signature (launch.cc).
        let launch = unsafe { std::mem::transmute::<*mut c_void, Launch>(sym) };
        Ok(Emulator { lib, launch, sms: 2 })
    }

    /// sizeof GatherParams, CacheParams, Bucket, PooledParams and BatchParams as the C++ side
    /// sees them.
    pub fn sizes(&self) -> [u64; 5] {
        let mut s = [0u64; 5];
        // SAFETY: dlsym on the loaded library, with a NUL-terminated name.
        let f = unsafe { libc::dlsym(self.lib, c"strata_emu_sizes".as_ptr()) };
        assert!(!f.is_null());
        // SAFETY: the symbol has this signature (launch.cc).
        let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut u64)>(f) };
        // SAFETY: `s` has room for the 5 sizes strata_emu_sizes writes.
        unsafe { f(s.as_mut_ptr()) };
        s
    }

    /// Runs kernel `name`, whose parameter struct is of `kind` (launch.cc: 0 CacheParams,
    /// 1 GatherParams, 2 PooledParams, 3 BatchParams).
    fn run(&self, name: &str, kind: i32, grid: u32, params: *const c_void) -> Result<()> {
        let c = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: self.lib is the handle `load` opened, never closed; c is NUL-terminated.
        let k = unsafe { libc::dlsym(self.lib, c.as_ptr()) };
        if k.is_null() {
            return Err(Error::Internal(format!("kernel {name} is not in the emulator")));
        }
        // SAFETY: k is a kernel of the parameter kind `kind` says; params points at one.
        unsafe { (self.launch)(k, kind, grid, super::backend::BLOCK, params) };
        Ok(())
    }
}

impl Backend for Emulator {
    fn sms(&self) -> u32 {
        self.sms
    }
    fn alloc_device(&self, bytes: usize, _what: &str) -> Result<Mem> {
        Ok(Mem::host(bytes))
    }
    fn alloc_mapped(&self, bytes: usize, _what: &str) -> Result<Mem> {
        Ok(Mem::host(bytes))
    }
    fn alloc_stream(&self, bytes: usize, _what: &str) -> Result<Mem> {
        Ok(Mem::host(bytes))
    }
    unsafe fn copy_to_device(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: emulated device memory is host memory; the caller guarantees src readable and
        // dst writable for bytes (copy_to_device's contract). At every call site src is a host
        // buffer and dst an emulated allocation, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, bytes) };
        Ok(())
    }
    unsafe fn launch_gather(&self, name: &str, grid: u32, p: &GatherParams) -> Result<()> {
        self.run(name, 1, grid, p as *const GatherParams as *const c_void)
    }
    unsafe fn launch_cache(&self, name: &str, grid: u32, p: &CacheParams) -> Result<()> {
        self.run(name, 0, grid, p as *const CacheParams as *const c_void)
    }
    unsafe fn launch_pooled(&self, name: &str, grid: u32, p: &PooledParams) -> Result<()> {
        self.run(name, 2, grid, p as *const PooledParams as *const c_void)
    }
    unsafe fn launch_batch(&self, name: &str, grid: u32, p: &BatchParams) -> Result<()> {
        self.run(name, 3, grid, p as *const BatchParams as *const c_void)
    }
    unsafe fn zero(&self, dev: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees [dev, dev + bytes) is (emulated, so host) device memory
        // this work may write (zero's contract).
        unsafe { std::ptr::write_bytes(dev as *mut u8, 0, bytes) };
        Ok(())
    }
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees both ranges hold `bytes` and are valid now (the emulator
        // copies at once). At every call site dst is pinned staging or a host buffer distinct
        // from the emulated allocation src, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, bytes) };
        Ok(())
    }
    fn upload(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: as for Stream::upload, the caller passes a readable source and a device range
        // (here host memory) of `bytes`; they are distinct buffers.
        unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, bytes) };
        Ok(())
    }
    fn download(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: as for Stream::download, the caller passes a writable destination and a device
        // range (here host memory) of `bytes`; they are distinct buffers.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, bytes) };
        Ok(())
    }
    fn host_fn(&self, f: HostFn) -> Result<()> {
        f();
        Ok(())
    }
    fn spawner(&self) -> Spawner {
        let me = Emulator { lib: self.lib, launch: self.launch, sms: self.sms };
        Box::new(move |job: Job| job(&me))
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// How an emulated lookup finds rows.
#[derive(Debug, Clone, Copy)]
pub enum Placement {
    /// One gather over the table's rows (what static and uvm placements run).
    Gather,
    /// A cache of `fraction` of the rows with a hit-rate threshold.
    Cache { fraction: f32, threshold: f32 },
    /// `count` shards, each gathering the keys it owns.
    Shards { count: usize },
}

/// A placement made once and used by several emulated lookups (caches keep their rows).
pub struct Emulated {
    placed: Placed,
    inflight: Arc<InFlight>,
    _shards: Vec<super::residency::HostShard>,
}

impl Emulated {
    /// Places `table` as `placement` in host memory.
    pub fn place(emu: &Emulator, table: &dyn RowSource, placement: Placement) -> Result<Self> {
        let mut shards_host = Vec::new();
        let placed = match (placement, table.as_static()) {
            (Placement::Gather, Some(st)) => {
                let buckets = match &st.rows {
                    Rows::Keyed(ix) => ix.raw_buckets().0 as u64,
                    Rows::Dense => 0,
                };
                let src =
                    GatherSource::new(st, st.store().row_ptr_or_base() as u64, buckets, st.default_row().as_ptr() as u64, Vec::new(), None);
                Placed::Gather(src)
            }
            (Placement::Shards { count }, Some(st)) => {
                shards_host = split(st, count)?;
                let mut v = Vec::new();
                for (s, h) in shards_host.iter().enumerate() {
                    let (table_addr, buckets) = match &h.packed {
                        Some((rows, index)) => (rows.as_ptr() as u64, index.raw_buckets().0 as u64),
                        None => (if h.hi > h.lo { st.store().row_ptr(h.lo) as u64 } else { st.store().row_ptr_or_base() as u64 }, 0),
                    };
                    let params = shard_params(st, h, s, count, table_addr, buckets, st.default_row().as_ptr() as u64);
                    v.push(GatherSource::from_params(params, st.format()));
                }
                return Ok(Emulated { placed: Placed::EmulatedShards(v), inflight: Default::default(), _shards: shards_host });
            }
            (Placement::Cache { fraction, threshold }, st) => {
                let dtype = st.map_or(crate::dlpack::FloatDtype::F32, |st| super::residency::cache_dtype(st.format()));
                let (rows, dim, default) = (table.len(), table.dim(), table.default_row());
                Placed::Cache(Arc::new(CacheState::new(emu, rows, dim, dtype, fraction, threshold, default)?))
            }
            _ => return Err(Error::invalid("placement", "gather and shard placements need a static table")),
        };
        Ok(Emulated { placed, inflight: Default::default(), _shards: shards_host })
    }

    /// The hit rate of the cache's last lookup (cache placements only).
    pub fn last_hit_rate(&self) -> Option<f32> {
        match &self.placed {
            Placed::Cache(c) => Some(c.last_hit_rate()),
            _ => None,
        }
    }

    /// Looks `keys` up into `out` (host tensors standing in for device tensors) through this
    /// placement on the emulator, with stats.
    ///
    /// # Safety
    /// As for `Table::lookup`; `table` must be the table this placement was made for.
    pub unsafe fn lookup(&self, emu: &Emulator, table: &dyn RowSource, keys: &DLTensor, out: &DLTensor) -> Result<LookupStats> {
        // SAFETY: the caller guarantees keys and out are valid DLPack tensors, so their shape
        // and strides are readable.
        let Some(c) = check(table.dim(), unsafe { crate::dlpack::TensorView::new(keys, "keys") }?, unsafe {
            crate::dlpack::TensorView::new(out, "out")
        }?)?
        else {
            return Ok(LookupStats::default());
        };
        // Host memory is the emulator's device memory: keys and out the kernels can address with
        // one stride are used in place; the others take the staging path of host tensors.
        let keys_in_place = crate::dlpack::Walk::new(&c.k.shape, &c.k.strides).linear_stride().is_some();
        let out_in_place = c.lead.linear_stride().is_some();
        // SAFETY: c was checked above; the caller guarantees the tensors valid (the emulator runs
        // the work before returning) and that table is the one `placed` was made for, whose
        // in-flight count is ours. Host memory is the emulator's device memory, so in-place
        // tensors are device-visible, and they are in place only when their strides reduce to one.
        unsafe { lookup_on(emu, table, &self.inflight, &self.placed, &c, keys_in_place, out_in_place, true) }
    }
}

/// Which of an emulated request's tensors take the path of pageable host memory on a GPU
/// (keys, offsets and weights read on the host and copied in, `out` written in device memory and
/// copied back); the others are addressed in place by the kernels, as device tensors are.
/// Offsets in place are checked by the kernels.
#[derive(Debug, Clone, Copy, Default)]
pub struct Staged {
    pub keys: bool,
    pub offsets: bool,
    pub weights: bool,
    pub out: bool,
}

/// One request of an emulated batch ([`lookup_batch`]): a lookup of `request`'s tensors in
/// `table` through its placement `placed`. Borrows all three for the call only.
pub struct Request<'a> {
    pub placed: &'a Emulated,
    pub table: &'a dyn RowSource,
    pub request: crate::model::Request<'a>,
}

/// Runs `requests` as the GPU path runs a batch on one device (those whose placement is a
/// gather in one launch of the batch kernel), each tensor staged as `staged` says. A request's
/// stats are counted when it asks for them (`want_stats`), as on a GPU.
/// Every request is checked first; errors name the request (`requests[3].offsets: ...`).
///
/// # Safety
/// Every request's tensors must be valid host memory as DLPack requires.
pub unsafe fn lookup_batch(emu: &Emulator, requests: &[Request], staged: Staged) -> Result<Vec<LookupStats>> {
    // SAFETY: forwarded from the caller.
    unsafe { run_requests(emu, requests, staged) }.map_err(|(i, e)| e.within(format!("requests[{i}].")))
}

/// # Safety
/// As for [`lookup_batch`].
unsafe fn run_requests(emu: &Emulator, requests: &[Request], staged: Staged) -> std::result::Result<Vec<LookupStats>, (usize, Error)> {
    let read_offsets: fn(&crate::dlpack::TensorView) -> bool = if staged.offsets { |_| true } else { |_| false };
    let mut shapes = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        // SAFETY: forwarded from the caller.
        let shape = unsafe { check_request(r.table.dim(), &r.request, read_offsets) };
        if let Some(s) = shape.map_err(|e| (i, e))? {
            shapes.push((i, s));
        }
    }
    let in_place = InPlace { keys: !staged.keys, weights: !staged.weights, out: !staged.out };
    let jobs: Vec<Lookup> = shapes
        .iter()
        .map(|(i, shape)| {
            let r = &requests[*i];
            Lookup {
                table: r.table,
                inflight: &r.placed.inflight,
                placed: &r.placed.placed,
                shape,
                in_place,
                want_stats: r.request.want_stats,
            }
        })
        .collect();
    // SAFETY: forwarded from the caller; host memory is the emulator's device memory.
    let found = unsafe { super::requests::run(emu, &jobs) }.map_err(|(j, e)| (shapes[j].0, e))?;
    let mut stats = vec![LookupStats::default(); requests.len()];
    for ((i, _), f) in shapes.iter().zip(found) {
        stats[*i] = f;
    }
    Ok(stats)
}

impl Emulated {
    /// A lookup of `r` (plain or pooled: see `Table::lookup_request`) in `table` through this
    /// placement on the emulator, each tensor staged as `staged` says.
    ///
    /// # Safety
    /// As for `Table::lookup_request`, with host tensors; `table` must be the table this
    /// placement was made for.
    pub unsafe fn lookup_request(
        &self,
        emu: &Emulator,
        table: &dyn RowSource,
        r: &crate::model::Request,
        staged: Staged,
    ) -> Result<LookupStats> {
        let r = Request { placed: self, table, request: *r };
        // SAFETY: forwarded from the caller.
        let mut stats = unsafe { run_requests(emu, &[r], staged) }.map_err(|(_, e)| e)?;
        Ok(stats.pop().unwrap_or_default())
    }
}
