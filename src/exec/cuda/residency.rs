//! Where a table's rows are for lookups on each CUDA device, made on the first lookup there:
//!
//! - static: the vectors (quantized rows as they are stored: the kernels dequantize them), the
//!   keyed index's buckets (unchanged) and the default row copied to device memory;
//! - uvm: the vectors page-locked and mapped where they are (`cuMemHostRegister`), the index
//!   and default row in device memory: the GPU reads rows over the bus, nothing is copied;
//! - cache: a [`CacheState`] of `gpu_cache_fraction` of the rows, filled on demand from the
//!   host table or tiers (server tables served from tiers always use a cache: they have no flat
//!   copy to place); a cache of quantized rows holds them dequantized, as float32;
//! - shards: the rows split over every visible device, each holding its rows and (keyed
//!   tables) an index of its keys; every device's kernels may read and write its peers' memory.
//!
//! A [`Residency`] belongs to one table (the table layer's `Table`) and is dropped before the table's rows. Dropping it
//! waits for queued work that still refers to the table (host functions and background cache
//! inserts, counted by [`InFlight`]).

use super::backend::{Backend, Mem};
use super::cache::CacheState;
use super::device::{Device, cuda_call};
use super::inflight::InFlight;
use super::params::GatherParams;
use crate::dlpack::FloatDtype;
use crate::error::Result;
use crate::kernels::RowFormat;
use crate::model::{GpuOptions, GpuPlacement, GpuSharding, RowSource, Rows, StaticTable};
use crate::storage::index::KeyIndex;
use crate::util::lock::lock;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// A table's placements on CUDA devices (see the module docs).
#[derive(Default)]
pub struct Residency {
    placed: Mutex<HashMap<usize, Arc<Placed>>>,
    registration: Mutex<Option<Arc<Registration>>>,
    pub(crate) inflight: Arc<InFlight>,
}

impl Drop for Residency {
    /// Waits for strata's queued host functions and background inserts, then for all work on
    /// the devices that hold a placement (a kernel queued on the caller's stream may still read
    /// the table's device memory), and frees the placements.
    fn drop(&mut self) {
        self.inflight.wait();
        let placed = self.placed.get_mut().unwrap_or_else(|e| e.into_inner());
        for &ordinal in placed.keys() {
            if let Ok(d) = Device::get(ordinal)
                && d.bind().is_ok()
            {
                // SAFETY: plain synchronisation of the bound context.
                unsafe { sys::cuCtxSynchronize() };
            }
        }
        placed.clear();
    }
}

/// How one device serves a table.
pub(crate) enum Placed {
    /// One gather kernel over rows this device can address.
    Gather(GatherSource),
    /// A GPU cache in front of the host table or tiers.
    Cache(Arc<CacheState>),
    /// Every device's share; the lookup's device is among them.
    Shards(Vec<(Arc<Device>, GatherSource)>),
    /// Shards all run on the lookup's own backend, one after another (the emulator).
    EmulatedShards(Vec<GatherSource>),
}

/// Rows a gather kernel can read on one device: the table part of [`GatherParams`], and the
/// memory that backs it.
pub(crate) struct GatherSource {
    pub params: GatherParams,
    pub format: RowFormat,
    _mem: Vec<Mem>,
    _registration: Option<Arc<Registration>>,
}

impl GatherSource {
    /// A source over memory the device addresses as given (`table`, `buckets`, `default_row`
    /// are device-visible addresses).
    pub(crate) fn new(
        st: &StaticTable,
        table: u64,
        buckets: u64,
        default_row: u64,
        mem: Vec<Mem>,
        registration: Option<Arc<Registration>>,
    ) -> Self {
        let num_buckets = match &st.rows {
            Rows::Dense => 0,
            Rows::Keyed(ix) => ix.raw_buckets().1 as u64,
        };
        let rows = st.len() as u64;
        let params = GatherParams {
            table,
            rows,
            row_stride: kernel_stride(st.format(), st.store().stride_bytes()),
            buckets: if num_buckets == 0 { 0 } else { buckets },
            num_buckets,
            default_row,
            owned_lo: 0,
            owned_hi: rows,
            shard: 0,
            num_shards: 1,
            dim: st.dim() as u32,
            ..GatherParams::default()
        };
        GatherSource { params, format: st.format(), _mem: mem, _registration: registration }
    }
}

impl GatherSource {
    /// A source over host memory kept alive elsewhere (the emulator's shards).
    pub(crate) fn from_params(params: GatherParams, format: RowFormat) -> Self {
        GatherSource { params, format, _mem: Vec::new(), _registration: None }
    }
}

/// A row stride of `bytes` as the kernels count it: elements of a float format, bytes of a
/// quantized one (the kernels address quantized rows as bytes).
fn kernel_stride(format: RowFormat, bytes: usize) -> u64 {
    (bytes / format.float().map_or(1, |d| d.size())) as u64
}

/// The dtype of the rows a cache of `format` rows holds: the table's own float dtype, float32
/// for quantized rows (the host resolves misses into float32, exactly the dequantized values).
pub(crate) fn cache_dtype(format: RowFormat) -> FloatDtype {
    format.float().unwrap_or(FloatDtype::F32)
}

/// Host memory page-locked and mapped for every device (`cuMemHostRegister`, portable);
/// unregistered on drop.
pub(crate) struct Registration {
    ptr: *mut c_void,
    device: Arc<Device>,
}

// SAFETY: a registration is a process-wide property of the memory: `ptr` is only handed to
// cuMemHostUnregister on drop, which may run on any thread once it binds the device's context.
unsafe impl Send for Registration {}
// SAFETY: a Registration has no methods that use `ptr`; sharing one only shares the handle.
unsafe impl Sync for Registration {}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.ptr.is_null() && self.device.bind().is_ok() {
            // SAFETY: registered by `Registration::new`.
            unsafe { sys::cuMemHostUnregister(self.ptr) };
        }
    }
}

impl Registration {
    /// Registers `[start, start + bytes)` (widened to whole pages).
    fn new(device: &Arc<Device>, start: usize, bytes: usize) -> Result<Self> {
        let page = 4096;
        let lo = start & !(page - 1);
        let hi = (start + bytes).next_multiple_of(page);
        device.bind()?;
        let base = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // Read-only registration also works for read-only file mappings; not every system has it.
        // SAFETY: [lo, hi) is the caller's range of mapped host memory widened to whole pages
        // (pages are mapped whole); the context is bound above. The store behind it outlives the
        // registration: a Table declares its residency, which holds it, before its rows.
        let mut r = unsafe { sys::cuMemHostRegister_v2(lo as *mut c_void, hi - lo, base | sys::CU_MEMHOSTREGISTER_READ_ONLY) };
        if r != sys::CUresult::CUDA_SUCCESS && r != sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED {
            // SAFETY: as above, the same page range, without the read-only flag.
            r = unsafe { sys::cuMemHostRegister_v2(lo as *mut c_void, hi - lo, base) };
        }
        if r == sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED {
            // The host registered it (e.g. pinned it for its own copies): use it, leave it be.
            return Ok(Registration { ptr: std::ptr::null_mut(), device: device.clone() });
        }
        cuda_call(r, || format!("cuMemHostRegister of the table's {bytes} bytes (uvm placement)"))?;
        Ok(Registration { ptr: lo as *mut c_void, device: device.clone() })
    }
}

/// Copies `bytes` from host `src` into new device memory.
fn upload(device: &Arc<Device>, src: *const u8, bytes: usize, what: &str) -> Result<Mem> {
    let m = Mem::device(device, bytes, what)?;
    if bytes > 0 {
        // SAFETY: src is readable for bytes; m is bytes long.
        cuda_call(unsafe { sys::cuMemcpyHtoD_v2(m.dev, src as *const c_void, bytes) }, || {
            format!("cuMemcpyHtoD of {bytes} bytes ({what}) to device {}", device.ordinal)
        })?;
    }
    Ok(m)
}

/// Device-visible address of registered host memory at `host`.
fn mapped_address(device: &Arc<Device>, host: *const u8) -> Result<u64> {
    device.bind()?;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: a query on host memory the context bound above may have registered (an
    // unregistered pointer is an error, not undefined); `dev` is a live out-parameter.
    cuda_call(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) }, || {
        "cuMemHostGetDevicePointer for the table's rows".into()
    })?;
    Ok(dev)
}

/// The bytes a store's rows span: from row 0 to the end of the last row.
fn span(st: &StaticTable) -> usize {
    let s = st.store();
    if s.rows() == 0 { 0 } else { (s.rows() - 1) * s.stride_bytes() + s.format().row_bytes(s.dim()) }
}

/// The index's buckets and the default row, in device memory.
fn upload_index_and_default(device: &Arc<Device>, st: &StaticTable) -> Result<(Mem, Mem)> {
    let (ptr, nb) = match &st.rows {
        Rows::Dense => (std::ptr::null(), 0),
        Rows::Keyed(ix) => ix.raw_buckets(),
    };
    let index = upload(device, ptr, nb * 64, "the keyed index")?;
    let default = upload(device, st.default_row().as_ptr() as *const u8, st.dim() * 4, "the default row")?;
    Ok((index, default))
}

impl Residency {
    /// How `device` serves `table`, made on first use. `backend` allocates cache memory.
    pub(crate) fn placed(
        &self,
        table: &dyn RowSource,
        gpu: &GpuOptions,
        device: &Arc<Device>,
        backend: &dyn Backend,
    ) -> Result<Arc<Placed>> {
        let mut map = lock(&self.placed);
        if let Some(p) = map.get(&device.ordinal) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.place(table, *gpu, device, backend)?);
        if let Placed::Shards(shards) = &*p {
            for (d, _) in shards {
                map.insert(d.ordinal, p.clone());
            }
        }
        map.insert(device.ordinal, p.clone());
        Ok(p)
    }

    fn place(&self, table: &dyn RowSource, gpu: GpuOptions, device: &Arc<Device>, backend: &dyn Backend) -> Result<Placed> {
        let Some(st) = table.as_static() else {
            // Tiers have no flat copy to place: static and uvm become a cache of every row.
            let fraction = if gpu.placement == GpuPlacement::Cache { gpu.cache_fraction } else { 1.0 };
            let c =
                CacheState::new(backend, table.len(), table.dim(), FloatDtype::F32, fraction, gpu.hit_rate_threshold, table.default_row())?;
            return Ok(Placed::Cache(Arc::new(c)));
        };
        if gpu.sharding == GpuSharding::Shard && super::device_count() > 1 {
            return Ok(Placed::Shards(shard(st)?));
        }
        Ok(match gpu.placement {
            GpuPlacement::Static => {
                let vectors = upload(device, st.store().row_ptr_or_base(), span(st), "the table copy")?;
                let (index, default) = upload_index_and_default(device, st)?;
                let (t, b, d) = (vectors.dev, index.dev, default.dev);
                Placed::Gather(GatherSource::new(st, t, b, d, vec![vectors, index, default], None))
            }
            GpuPlacement::Uvm => {
                let reg = {
                    let mut r = lock(&self.registration);
                    match &*r {
                        Some(reg) => reg.clone(),
                        None => {
                            let start = st.store().row_ptr_or_base() as usize;
                            let reg = Arc::new(Registration::new(device, start, span(st).max(1))?);
                            *r = Some(reg.clone());
                            reg
                        }
                    }
                };
                let table_addr = mapped_address(device, st.store().row_ptr_or_base())?;
                let (index, default) = upload_index_and_default(device, st)?;
                let (b, d) = (index.dev, default.dev);
                Placed::Gather(GatherSource::new(st, table_addr, b, d, vec![index, default], Some(reg)))
            }
            GpuPlacement::Cache => {
                let dtype = cache_dtype(st.format());
                let c = CacheState::new(backend, st.len(), st.dim(), dtype, gpu.cache_fraction, gpu.hit_rate_threshold, st.default_row())?;
                Placed::Cache(Arc::new(c))
            }
        })
    }
}

/// Which of `num_shards` shards owns keyed-table key `key` (as the gather kernel decides).
pub(crate) fn key_owner(key: u64, num_shards: u32) -> u32 {
    ((crate::util::hash::mix(key) & 0xffff_ffff) % num_shards as u64) as u32
}

/// One shard of a static table, on the host: the rows `[lo, hi)` of a dense table, or a keyed
/// table's rows owned by this shard ([`key_owner`]) packed with an index of their keys.
pub(crate) struct HostShard {
    pub lo: usize,
    pub hi: usize,
    pub packed: Option<(Vec<u8>, KeyIndex)>,
}

/// Splits a static table into `count` shards.
pub(crate) fn split(st: &StaticTable, count: usize) -> Result<Vec<HostShard>> {
    let (row_bytes, rows) = (st.format().row_bytes(st.dim()), st.len());
    (0..count)
        .map(|s| match &st.rows {
            Rows::Dense => Ok(HostShard { lo: rows * s / count, hi: rows * (s + 1) / count, packed: None }),
            Rows::Keyed(ix) => {
                let mine: Vec<(u64, usize)> = ix.iter().filter(|&(k, _)| key_owner(k, count as u32) == s as u32).collect();
                let index = KeyIndex::build(mine.iter().map(|&(k, _)| k), |k| k as i64 as i128, "keys")?;
                let mut packed = vec![0u8; mine.len() * row_bytes];
                for (j, &(_, r)) in mine.iter().enumerate() {
                    // SAFETY: r < rows; a row is row_bytes bytes of the store's format.
                    let src = unsafe { std::slice::from_raw_parts(st.store().row_ptr(r), row_bytes) };
                    packed[j * row_bytes..(j + 1) * row_bytes].copy_from_slice(src);
                }
                Ok(HostShard { lo: 0, hi: mine.len(), packed: Some((packed, index)) })
            }
        })
        .collect()
}

/// Gather parameters of shard `s` of `count`, given where its rows, index and default row are.
pub(crate) fn shard_params(
    st: &StaticTable,
    h: &HostShard,
    s: usize,
    count: usize,
    table: u64,
    buckets: u64,
    default_row: u64,
) -> GatherParams {
    let mut p = GatherSource::new(st, table, buckets, default_row, Vec::new(), None).params;
    if let Some((_, index)) = &h.packed {
        p.row_stride = kernel_stride(st.format(), st.format().row_bytes(st.dim()));
        p.buckets = buckets;
        p.num_buckets = index.raw_buckets().1 as u64;
    }
    p.owned_lo = h.lo as u64;
    p.owned_hi = h.hi as u64;
    p.shard = s as u32;
    p.num_shards = count as u32;
    p
}

/// Splits a static table over every visible device (see [`split`]), each shard's rows, index
/// and default row in its device's memory.
fn shard(st: &StaticTable) -> Result<Vec<(Arc<Device>, GatherSource)>> {
    let count = super::device_count();
    let devices: Vec<Arc<Device>> = (0..count).map(Device::get).collect::<Result<_>>()?;
    for a in &devices {
        for b in &devices {
            a.enable_peer_access(b)?;
        }
    }
    let (dim, row_bytes) = (st.dim(), st.format().row_bytes(st.dim()));
    let mut shards = Vec::with_capacity(count);
    for (s, (device, h)) in devices.iter().zip(split(st, count)?).enumerate() {
        let default = upload(device, st.default_row().as_ptr() as *const u8, dim * 4, "the default row")?;
        let (v, b) = match &h.packed {
            None => {
                let store = st.store();
                let bytes = if h.hi > h.lo { (h.hi - h.lo - 1) * store.stride_bytes() + row_bytes } else { 0 };
                let start = if h.hi > h.lo { store.row_ptr(h.lo) } else { store.row_ptr_or_base() };
                (upload(device, start, bytes, "a table shard")?, None)
            }
            Some((packed, index)) => {
                let (bp, nb) = index.raw_buckets();
                (upload(device, packed.as_ptr(), packed.len(), "a table shard")?, Some(upload(device, bp, nb * 64, "a shard's index")?))
            }
        };
        let params = shard_params(st, &h, s, count, v.dev, b.as_ref().map_or(0, |b| b.dev), default.dev);
        let mut mem = vec![v, default];
        mem.extend(b);
        shards.push((device.clone(), GatherSource { params, format: st.format(), _mem: mem, _registration: None }));
    }
    Ok(shards)
}
