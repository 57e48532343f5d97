//! What the GPU lookup algorithms need from a device: memory, launches and copies in stream
//! order, and stream-ordered host functions. [`Stream`] is the real one (a CUDA device and the
//! caller's stream); the tests drive the same algorithms through a CPU emulator of the kernels
//! (`emulate`), so that the planning, parameter marshalling and cache protocol run in CI.

use super::device::{Device, cuda_call};
use super::params::{BatchParams, CacheParams, GatherParams, PooledParams};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// Memory a lookup or placement uses: its device-visible address, and its host address when
/// the host can read it (pinned or emulated memory). Freed on drop.
pub(crate) struct Mem {
    /// Device-visible address.
    pub dev: u64,
    /// Host address (NULL for device memory).
    pub host: *mut u8,
    pub bytes: usize,
    owner: MemOwner,
}

enum MemOwner {
    Device(Arc<Device>),
    /// From the stream-ordered allocator; freed in stream order on this stream.
    StreamOrdered(Arc<Device>, sys::CUstream),
    Pinned(Arc<Device>),
    Host(#[allow(dead_code)] Vec<u64>),
}

// SAFETY: a Mem owns its allocation; its raw host pointer and stream are plain driver handles
// the driver accepts from any thread, and dropping it binds the owning device's context before
// freeing, so it may be freed on any thread.
unsafe impl Send for Mem {}
// SAFETY: `&self` only reads the addresses; the memory behind them is reached only through
// unsafe calls (`host_slice`, the Backend's copies and launches) whose callers order their
// accesses with the stream.
unsafe impl Sync for Mem {}

impl Mem {
    /// Zeroed host memory standing in for device memory (the emulator).
    pub(crate) fn host(bytes: usize) -> Mem {
        let mut v = vec![0u64; bytes.div_ceil(8).max(1)];
        let host = v.as_mut_ptr() as *mut u8;
        Mem { dev: host as u64, host, bytes, owner: MemOwner::Host(v) }
    }

    /// `bytes` of device memory on `device`, zeroed.
    pub(crate) fn device(device: &Arc<Device>, bytes: usize, what: &str) -> Result<Mem> {
        device.bind()?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: plain allocation in the bound context.
        cuda_call(unsafe { sys::cuMemAlloc_v2(&mut dev, bytes.max(1)) }, || {
            format!("cuMemAlloc of {bytes} bytes for {what} on device {}", device.ordinal)
        })?;
        let m = Mem { dev, host: std::ptr::null_mut(), bytes, owner: MemOwner::Device(device.clone()) };
        // SAFETY: dev is the allocation of at least `bytes` just made in the bound context.
        cuda_call(unsafe { sys::cuMemsetD8_v2(dev, 0, bytes) }, || format!("cuMemsetD8 of {what}"))?;
        Ok(m)
    }

    /// `bytes` of page-locked host memory mapped into every device's address space, zeroed.
    pub(crate) fn pinned(device: &Arc<Device>, bytes: usize, what: &str) -> Result<Mem> {
        device.bind()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: plain allocation in the bound context.
        cuda_call(unsafe { sys::cuMemHostAlloc(&mut host, bytes.max(1), flags) }, || {
            format!("cuMemHostAlloc of {bytes} bytes for {what}")
        })?;
        let mut m = Mem { dev: 0, host: host as *mut u8, bytes, owner: MemOwner::Pinned(device.clone()) };
        // SAFETY: the allocation is `bytes` long.
        unsafe { std::ptr::write_bytes(m.host, 0, bytes) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host is the pinned allocation just made with DEVICEMAP in the bound context,
        // and dev is a live out-parameter.
        cuda_call(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }, || format!("cuMemHostGetDevicePointer for {what}"))?;
        m.dev = dev;
        Ok(m)
    }

    /// The memory as a typed host slice (pinned or emulated memory only).
    ///
    /// # Safety
    /// No device work may write the range while the slice is used, and no other slice of it
    /// may be alive (the memory is shared with the device, so `&self` cannot guard it). `T`
    /// must be a plain type valid for any bit pattern and aligned to at most 8 bytes.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn host_slice<T>(&self, len: usize) -> &mut [T] {
        assert!(!self.host.is_null() && len * std::mem::size_of::<T>() <= self.bytes);
        // SAFETY: host is non-NULL and the slice fits in the allocation (asserted above); host
        // memory is page-aligned (cuMemHostAlloc) or a Vec<u64>, so aligned for T, and it was
        // zeroed when allocated, so initialised. The caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.host as *mut T, len) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        match &self.owner {
            MemOwner::Device(d) => {
                if d.bind().is_ok() {
                    // SAFETY: allocated by cuMemAlloc; queued work that used it holds the table's
                    // in-flight count, which its owner waits for before dropping.
                    unsafe { sys::cuMemFree_v2(self.dev) };
                }
            }
            MemOwner::StreamOrdered(d, stream) => {
                if d.bind().is_ok() {
                    // SAFETY: allocated by cuMemAllocAsync; freed after the work queued on the
                    // stream before this point.
                    unsafe { sys::cuMemFreeAsync(self.dev, *stream) };
                }
            }
            MemOwner::Pinned(d) => {
                if d.bind().is_ok() {
                    // SAFETY: allocated by cuMemHostAlloc and freed only here; as for device
                    // memory, queued work that used it is waited for before its owner drops it.
                    unsafe { sys::cuMemFreeHost(self.host as *mut c_void) };
                }
            }
            MemOwner::Host(_) => {}
        }
    }
}

/// A host function run in stream order: after all work queued before it, before all work
/// queued after it. It must not call CUDA.
pub(crate) type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// Work for a background thread, given a backend on the device's internal stream.
pub(crate) type Job = Box<dyn FnOnce(&dyn Backend) + Send + 'static>;
/// Starts a [`Job`]; callable from a host function (it makes no CUDA call itself).
pub(crate) type Spawner = Box<dyn FnOnce(Job) + Send + 'static>;

/// A device and a stream to queue work on.
pub(crate) trait Backend {
    /// Multiprocessors, for grid sizes.
    fn sms(&self) -> u32;
    /// Zeroed device memory.
    fn alloc_device(&self, bytes: usize, what: &str) -> Result<Mem>;
    /// Zeroed page-locked host memory the device can address.
    fn alloc_mapped(&self, bytes: usize, what: &str) -> Result<Mem>;
    /// Device memory for this stream's work only (not zeroed), freed in stream order on drop.
    fn alloc_stream(&self, bytes: usize, what: &str) -> Result<Mem>;
    /// Queues a copy of `bytes` from host `src` to device-visible `dst`. The source may be
    /// reused once this returns (pageable sources are staged by the driver before it returns).
    ///
    /// # Safety
    /// `src` must be readable for `bytes`, and `dst` device memory this work may write for
    /// `bytes`.
    unsafe fn copy_to_device(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()>;
    /// Queues a gather kernel.
    ///
    /// # Safety
    /// Every address in `p` must be valid for what the kernel reads and writes.
    unsafe fn launch_gather(&self, name: &str, grid: u32, p: &GatherParams) -> Result<()>;
    /// Queues a cache kernel.
    ///
    /// # Safety
    /// As for [`Backend::launch_gather`].
    unsafe fn launch_cache(&self, name: &str, grid: u32, p: &CacheParams) -> Result<()>;
    /// Queues a pooled kernel (`strata_pooled_*`, `strata_pool_rows`).
    ///
    /// # Safety
    /// As for [`Backend::launch_gather`].
    unsafe fn launch_pooled(&self, name: &str, grid: u32, p: &PooledParams) -> Result<()>;
    /// Queues the batch kernel (`strata_batch`).
    ///
    /// # Safety
    /// As for [`Backend::launch_gather`], for `p` and every request it points to.
    unsafe fn launch_batch(&self, name: &str, grid: u32, p: &BatchParams) -> Result<()>;
    /// Queues zeroing `bytes` of device memory at `dev`.
    ///
    /// # Safety
    /// The range must be device memory this work may write.
    unsafe fn zero(&self, dev: u64, bytes: usize) -> Result<()>;
    /// Queues a copy of `bytes` from device-visible `src` to host `dst`.
    ///
    /// # Safety
    /// Both ranges valid until the copy completes; `dst` pinned for it to be asynchronous.
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()>;
    /// Copies `bytes` from host `src` to device-visible `dst` now (synchronously).
    fn upload(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()>;
    /// Copies `bytes` from device-visible `src` to host `dst` after all queued work (waits).
    fn download(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()>;
    /// Queues a host function.
    fn host_fn(&self, f: HostFn) -> Result<()>;
    /// The CUDA stream behind this backend, if it is one.
    fn as_stream(&self) -> Option<&Stream> {
        None
    }
    /// A way to run work on a background thread with the device's internal stream.
    fn spawner(&self) -> Spawner;
    /// Waits for everything queued so far.
    fn synchronize(&self) -> Result<()>;
}

/// Threads per block of every launch (`STRATA_BLOCK`, the kernels' `__launch_bounds__`).
pub(crate) const BLOCK: u32 = 256;
/// Blocks per multiprocessor the kernels' registers must allow (`STRATA_MIN_BLOCKS` in
/// gather.cu): ptxas keeps them at 64 a thread or fewer, so occupancy is at least 50%.
pub(crate) const MIN_BLOCKS_PER_SM: u32 = 4;

/// Blocks for `n` rows of one warp each: enough to fill every multiprocessor several times
/// over, no more than there are rows.
pub(crate) fn grid(sms: u32, n: u64) -> u32 {
    let warps_per_block = (BLOCK / 32) as u64;
    let needed = n.div_ceil(warps_per_block).max(1);
    needed.min(sms.max(1) as u64 * 16) as u32
}

/// A CUDA device and a (borrowed) stream of the caller's.
pub(crate) struct Stream {
    pub device: Arc<Device>,
    pub stream: sys::CUstream,
}

// SAFETY: a CUstream may be used from any thread (every use binds the device's context
// first); the caller keeps it alive during the call, and the Arc<Device> is Send + Sync.
unsafe impl Send for Stream {}
// SAFETY: a Stream is never mutated; concurrent launches and copies on one CUstream from
// several threads are allowed by the driver.
unsafe impl Sync for Stream {}

impl Stream {
    fn launch(&self, name: &str, grid: u32, params: *const c_void) -> Result<()> {
        let f = self.device.function(name)?;
        let mut args = [params as *mut c_void];
        self.device.bind()?;
        // SAFETY: the kernel takes one parameter struct by value; `params` points at it and
        // cuLaunchKernel copies it before returning.
        cuda_call(
            unsafe { sys::cuLaunchKernel(f, grid, 1, 1, BLOCK, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut()) },
            || format!("cuLaunchKernel {name} ({grid} blocks) on device {}", self.device.ordinal),
        )
    }
}

unsafe extern "C" fn run_host_fn(data: *mut c_void) {
    // SAFETY: `data` is the Box<HostFn> leaked by `host_fn`, run exactly once.
    let f = unsafe { Box::from_raw(data as *mut HostFn) };
    // A panic must not unwind into the driver's thread.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

impl Backend for Stream {
    fn sms(&self) -> u32 {
        self.device.sms
    }

    fn alloc_device(&self, bytes: usize, what: &str) -> Result<Mem> {
        Mem::device(&self.device, bytes, what)
    }

    fn alloc_mapped(&self, bytes: usize, what: &str) -> Result<Mem> {
        Mem::pinned(&self.device, bytes, what)
    }

    fn alloc_stream(&self, bytes: usize, what: &str) -> Result<Mem> {
        self.device.bind()?;
        let mut dev = 0;
        // SAFETY: stream-ordered allocation on the caller's stream.
        cuda_call(unsafe { sys::cuMemAllocAsync(&mut dev, bytes.max(1), self.stream) }, || {
            format!("cuMemAllocAsync of {bytes} bytes for {what} on device {}", self.device.ordinal)
        })?;
        Ok(Mem { dev, host: std::ptr::null_mut(), bytes, owner: MemOwner::StreamOrdered(self.device.clone(), self.stream) })
    }

    unsafe fn copy_to_device(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the caller guarantees src readable and dst writable for bytes (copy_to_device's
        // contract); the device's context is bound and self.stream is a stream of it.
        cuda_call(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, self.stream) }, || {
            format!("cuMemcpyHtoDAsync of {bytes} bytes")
        })
    }

    unsafe fn launch_gather(&self, name: &str, grid: u32, p: &GatherParams) -> Result<()> {
        self.launch(name, grid, p as *const GatherParams as *const c_void)
    }

    unsafe fn launch_cache(&self, name: &str, grid: u32, p: &CacheParams) -> Result<()> {
        self.launch(name, grid, p as *const CacheParams as *const c_void)
    }

    unsafe fn launch_pooled(&self, name: &str, grid: u32, p: &PooledParams) -> Result<()> {
        self.launch(name, grid, p as *const PooledParams as *const c_void)
    }

    unsafe fn launch_batch(&self, name: &str, grid: u32, p: &BatchParams) -> Result<()> {
        self.launch(name, grid, p as *const BatchParams as *const c_void)
    }

    unsafe fn zero(&self, dev: u64, bytes: usize) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the caller guarantees [dev, dev + bytes) is device memory this work may write
        // (zero's contract); the context is bound and self.stream is a stream of it.
        cuda_call(unsafe { sys::cuMemsetD8Async(dev, 0, bytes, self.stream) }, || "cuMemsetD8Async".into())
    }

    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the caller guarantees both ranges hold `bytes` and stay valid until the copy
        // completes (copy_to_host's contract); the context is bound.
        cuda_call(unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes, self.stream) }, || {
            format!("cuMemcpyDtoHAsync of {bytes} bytes")
        })
    }

    fn upload(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: the caller passes a readable source and a device range of `bytes`.
        cuda_call(unsafe { sys::cuMemcpyHtoD_v2(dst, src as *const c_void, bytes) }, || {
            format!("cuMemcpyHtoD of {bytes} bytes to device {}", self.device.ordinal)
        })
    }

    fn download(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.synchronize()?;
        // SAFETY: the caller passes a writable destination and a device range of `bytes`.
        cuda_call(unsafe { sys::cuMemcpyDtoH_v2(dst as *mut c_void, src, bytes) }, || {
            format!("cuMemcpyDtoH of {bytes} bytes from device {}", self.device.ordinal)
        })
    }

    fn as_stream(&self) -> Option<&Stream> {
        Some(self)
    }

    fn spawner(&self) -> Spawner {
        let device = self.device.clone();
        Box::new(move |job: Job| {
            std::thread::spawn(move || {
                let b = Stream { stream: device.internal, device };
                job(&b);
            });
        })
    }

    fn host_fn(&self, f: HostFn) -> Result<()> {
        self.device.bind()?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: run_host_fn takes back the box exactly once.
        let r = unsafe { sys::cuLaunchHostFunc(self.stream, Some(run_host_fn), data) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // Not queued: free the closure here.
            // SAFETY: the driver refused the host function, so run_host_fn never takes `data`;
            // it came from Box::into_raw above and is reclaimed once, here.
            drop(unsafe { Box::from_raw(data as *mut HostFn) });
        }
        cuda_call(r, || "cuLaunchHostFunc".into())
    }

    fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: self.stream is the caller's live stream or the device's internal one, both of
        // the context bound just above.
        cuda_call(unsafe { sys::cuStreamSynchronize(self.stream) }, || {
            format!("cuStreamSynchronize (an earlier launch on this stream may have failed) on device {}", self.device.ordinal)
        })
    }
}
