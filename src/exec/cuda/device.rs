//! CUDA devices as strata uses them: the primary context (the one PyTorch, CuPy and the CUDA
//! runtime use), the kernels compiled by NVRTC for the device's architecture (once per
//! architecture, cached for the process), the multiprocessor count, and an internal stream for
//! background cache inserts and shard launches. One [`Device`] per ordinal, made on first use
//! and kept for the life of the process.

use super::compile_gather_for;
use crate::error::{Error, Result};
use crate::util::lock::lock;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, sys};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Fails with [`Error::Cuda`] unless `r` is `CUDA_SUCCESS`; `call` names the call.
pub(crate) fn cuda_call(r: sys::CUresult, call: impl FnOnce() -> String) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver writes static strings (or leaves NULL for unknown codes).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        // SAFETY: p is not NULL here, and the driver's error names and descriptions are static,
        // NUL-terminated strings.
        if p.is_null() { String::new() } else { unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned() }
    };
    Err(Error::Cuda { call: call(), msg: format!("{} ({})", s(name), s(text)) })
}

/// One CUDA device.
pub(crate) struct Device {
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Internal non-blocking stream (background inserts, shard work).
    pub internal: sys::CUstream,
    _module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
}

// SAFETY: the context and module handles are usable from any thread, and so is the internal
// stream (every use binds the context first); nothing in a Device is tied to the thread that
// opened it.
unsafe impl Send for Device {}
// SAFETY: a Device is immutable after `open` (the function map included), and the driver
// allows its handles to be used from several threads at once.
unsafe impl Sync for Device {}

impl Device {
    /// The device with `ordinal`, made (context retained, kernels loaded) on first use.
    pub(crate) fn get(ordinal: usize) -> Result<Arc<Device>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
        let count = super::device_count();
        if ordinal >= count {
            return Err(Error::Device { arg: "device_id", msg: format!("CUDA device {ordinal} does not exist; this machine has {count}") });
        }
        let mut map = lock(DEVICES.get_or_init(Default::default));
        if let Some(d) = map.get(&ordinal) {
            return Ok(d.clone());
        }
        let d = Arc::new(Device::open(ordinal)?);
        map.insert(ordinal, d.clone());
        Ok(d)
    }

    fn open(ordinal: usize) -> Result<Device> {
        let cu =
            |e: cudarc::driver::DriverError, what: &str| Error::Cuda { call: format!("{what} on device {ordinal}"), msg: format!("{e:?}") };
        let ctx = CudaContext::new(ordinal).map_err(|e| cu(e, "retaining the primary context"))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| cu(e, "reading the compute capability"))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| cu(e, "reading the multiprocessor count"))? as u32;
        let ptx = compile_gather_for(major, minor)?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(|e| cu(e, "loading the kernels (cuModuleLoadData)"))?;
        let mut functions = HashMap::new();
        for name in super::kernel_names() {
            let f = module.load_function(&name).map_err(|e| cu(e, &format!("finding kernel {name}")))?;
            functions.insert(name, f);
        }
        ctx.bind_to_thread().map_err(|e| cu(e, "binding the context"))?;
        let mut internal: sys::CUstream = std::ptr::null_mut();
        cuda_call(
            // SAFETY: the device's context was bound to this thread just above; `internal` is a
            // live out-parameter.
            unsafe { sys::cuStreamCreate(&mut internal, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
            || format!("cuStreamCreate on device {ordinal}"),
        )?;
        Ok(Device { ordinal, ctx, sms, internal, _module: module, functions })
    }

    /// Makes this device's primary context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::Cuda { call: format!("cuCtxSetCurrent for device {}", self.ordinal), msg: format!("{e:?}") })
    }

    /// The kernel called `name`.
    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction> {
        self.functions
            .get(name)
            .map(|f| f.cu_function())
            .ok_or_else(|| Error::Internal(format!("kernel {name} is not in the compiled module")))
    }

    /// Lets this device's kernels read and write `peer`'s memory (idempotent).
    pub(crate) fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        if peer.ordinal == self.ordinal {
            return Ok(());
        }
        let mut can = 0;
        let dev = |o: usize| {
            cudarc::driver::result::device::get(o as i32)
                .map_err(|e| Error::Cuda { call: format!("cuDeviceGet({o})"), msg: format!("{e:?}") })
        };
        let (mine, theirs) = (dev(self.ordinal)?, dev(peer.ordinal)?);
        // SAFETY: a query on two device handles from cuDeviceGet; `can` is a live out-parameter.
        cuda_call(unsafe { sys::cuDeviceCanAccessPeer(&mut can, mine, theirs) }, || "cuDeviceCanAccessPeer".into())?;
        if can == 0 {
            return Err(Error::Device {
                arg: "opts->gpu_sharding",
                msg: format!(
                    "CUDA device {} cannot access device {}'s memory (no peer access); sharding needs it",
                    self.ordinal, peer.ordinal
                ),
            });
        }
        self.bind()?;
        // SAFETY: this device's context is bound just above, and peer's primary context is live
        // (peer holds an Arc of it).
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
        if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            cuda_call(r, || format!("cuCtxEnablePeerAccess from device {} to {}", self.ordinal, peer.ordinal))?;
        }
        // Memory from `peer`'s stream-ordered allocator (strata's staging, and hosts that use
        // cudaMallocAsync) needs its own grant.
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: theirs is a device handle from cuDeviceGet; `pool` is a live out-parameter.
        cuda_call(unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, theirs) }, || "cuDeviceGetDefaultMemPool".into())?;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: self.ordinal as i32 },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: pool is the peer's default pool from the call above, and `desc` is the one
        // initialised descriptor the count of 1 says.
        cuda_call(unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }, || {
            format!("cuMemPoolSetAccess for device {} on device {}'s pool", self.ordinal, peer.ordinal)
        })
    }
}
