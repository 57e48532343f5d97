//! A lookup on CUDA tensors: checks, where keys and rows are read and written, and the launches,
//! all queued on the caller's stream.
//!
//! - Keys and out on the device (kDLCUDA, kDLCUDAManaged) or in page-locked host memory
//!   (kDLCUDAHost) are read and written by the kernels in place; their strides must reduce to
//!   one stride per key (keys) and per row (out's leading dimensions).
//! - Keys in pageable host memory (kDLCPU) are read on the host (any strides) and copied to the
//!   device in stream order; the call returns once the driver has taken them.
//! - `out` in pageable host memory: rows are gathered into device memory, copied back and
//!   written into `out` before the call returns, so the call waits for the stream.
//! - Stats, or a table whose missing keys are errors, make the call wait for the stream;
//!   otherwise it returns once the work is queued.

use super::backend::{Backend, Mem, Stream, grid};
use super::cache::CacheCounts;
use super::device::{Device, cuda_call};
use super::inflight::InFlight;
use super::io::{Io, float_name, format_name, key_name};
use super::params::GatherParams;
use super::residency::Residency;
use super::residency::{GatherSource, Placed};
use crate::dlpack::{KeyDtype, TensorView, Walk, device_name};
use crate::error::{Error, Result};
use crate::model::{Checked, LookupOptions, LookupStats, check};
use crate::model::{GpuOptions, RowSource};
use crate::util::lock::lock;
use cudarc::driver::sys;
use dlpark::ffi::{DLDeviceType, DLTensor};
use std::sync::{Arc, Mutex};

/// Counts a lookup asks for: `[hits, misses]` in device memory per gather launch, or the
/// cache's host-side counts.
pub(crate) enum Counts {
    None,
    Device(Vec<Mem>),
    Cache(Arc<Mutex<CacheCounts>>),
    /// `[hits, misses]` at this device address (memory the caller keeps alive).
    Slot(u64),
}

impl Counts {
    /// Reads the counts (after the stream was synchronised).
    pub(crate) fn read(&self, b: &dyn Backend) -> Result<Option<(u64, u64)>> {
        match self {
            Counts::None => Ok(None),
            Counts::Device(mems) => {
                let (mut h, mut m) = (0, 0);
                for mem in mems {
                    let mut c = [0u64; 2];
                    b.download(c.as_mut_ptr() as *mut u8, mem.dev, 16)?;
                    h += c[0];
                    m += c[1];
                }
                Ok(Some((h, m)))
            }
            Counts::Cache(c) => {
                let c = *lock(c);
                Ok(Some((c.hits, c.misses)))
            }
            Counts::Slot(at) => {
                let mut c = [0u64; 2];
                b.download(c.as_mut_ptr() as *mut u8, *at, 16)?;
                Ok(Some((c[0], c[1])))
            }
        }
    }
}

/// Queues the lookup of `io` through `placed` on `b`'s stream.
///
/// # Safety
/// `io` must describe device-visible memory valid until the stream has run this work;
/// `placed` and `inflight` must belong to the residency of the table `table` is.
pub(crate) unsafe fn execute(
    b: &dyn Backend,
    table: &dyn RowSource,
    inflight: &Arc<InFlight>,
    placed: &Placed,
    io: &Io,
    want_counts: bool,
) -> Result<Counts> {
    match placed {
        Placed::Gather(src) => {
            // SAFETY: our caller guarantees io as gather needs it; src's memory is the
            // placement's, alive as long as `placed`.
            let counts = unsafe { gather(b, src, io, want_counts) }?;
            Ok(counts.map_or(Counts::None, |c| Counts::Device(vec![c])))
        }
        Placed::Cache(cache) => {
            let counts = want_counts.then(|| Arc::new(Mutex::new(CacheCounts::default())));
            // A table whose missing keys are errors needs every miss resolved to tell.
            // SAFETY: our caller guarantees io valid until the stream has run this work, and
            // that this cache and `inflight` belong to `table`'s residency.
            unsafe { cache.lookup(b, table, inflight, io, counts.clone(), table.missing_is_error()) }?;
            Ok(counts.map_or(Counts::None, Counts::Cache))
        }
        Placed::EmulatedShards(shards) => {
            let mut counts = Vec::new();
            for src in shards {
                // SAFETY: as for Placed::Gather: io is valid per our caller, src alive with placed.
                counts.extend(unsafe { gather(b, src, io, want_counts) }?);
            }
            Ok(if want_counts { Counts::Device(counts) } else { Counts::None })
        }
        Placed::Shards(shards) => {
            let Some(s) = b.as_stream() else {
                return Err(Error::Internal("sharded tables run on CUDA streams only".into()));
            };
            // SAFETY: execute_shards needs what our caller guarantees of io.
            unsafe { execute_shards(s, shards, io, want_counts) }
        }
    }
}

/// Queues one gather of `io` over `src` on `b`; returns its `[hits, misses]` counters (device
/// memory of `b`) when asked for.
///
/// # Safety
/// As for [`execute`].
unsafe fn gather(b: &dyn Backend, src: &GatherSource, io: &Io, want_counts: bool) -> Result<Option<Mem>> {
    let counts = if want_counts { Some(b.alloc_device(16, "lookup counts")?) } else { None };
    let p = gather_params(&src.params, io, counts.as_ref().map_or(0, |c| c.dev));
    let name = format!("strata_gather_{}_{}_{}", key_name(io.key_dtype), format_name(src.format), float_name(io.out_dtype));
    // SAFETY: p's keys and out come from io, valid until the stream has run this work (our
    // caller's guarantee); its table, index and default row are src's memory, which the
    // placement keeps alive; counts is the 16 bytes just allocated on b, or 0 for none. The
    // kernel's name matches p's dtypes.
    unsafe { b.launch_gather(&name, grid(b.sms(), io.n), &p) }?;
    Ok(counts)
}

fn gather_params(table: &GatherParams, io: &Io, counts: u64) -> GatherParams {
    GatherParams {
        keys: io.keys,
        key_stride: io.key_stride,
        n: io.n,
        out: io.out,
        out_row_stride: io.out_row_stride,
        out_col_stride: io.out_col_stride,
        counts,
        ..*table
    }
}

/// An event recorded on `stream` (in `device`'s context), destroyed once it has completed.
fn record(device: &Device, stream: sys::CUstream) -> Result<sys::CUevent> {
    device.bind()?;
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: the device's context is bound above; `ev` is a live out-parameter.
    cuda_call(unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }, || "cuEventCreate".into())?;
    // SAFETY: ev was created just above in this context, and stream is a stream of this device
    // (the caller's, checked by check_stream, or the device's internal one).
    let r = unsafe { sys::cuEventRecord(ev, stream) };
    // SAFETY: the record failed, so nothing refers to ev: it is destroyed once, here.
    cuda_call(r, || "cuEventRecord".into())
        .inspect_err(|_| unsafe {
            sys::cuEventDestroy_v2(ev);
        })
        .map(|_| ev)
}

/// Makes `stream` wait for `ev`, then releases `ev` (the driver frees it once it completed).
fn wait_and_release(device: &Device, stream: sys::CUstream, ev: sys::CUevent) -> Result<()> {
    device.bind()?;
    // SAFETY: ev was recorded by `record` and not yet released; stream is a stream of this
    // device, whose context is bound above.
    let r = unsafe { sys::cuStreamWaitEvent(stream, ev, 0) };
    // SAFETY: ev is released once, here; the driver frees it only once it has completed, so the
    // wait queued above still sees it.
    unsafe { sys::cuEventDestroy_v2(ev) };
    cuda_call(r, || "cuStreamWaitEvent".into())
}

/// Each shard's device gathers the keys it owns, reading keys from and writing rows to the
/// caller's device through peer access; the caller's stream waits for every shard.
///
/// # Safety
/// As for [`execute`].
unsafe fn execute_shards(s: &Stream, shards: &[(Arc<Device>, GatherSource)], io: &Io, want_counts: bool) -> Result<Counts> {
    let mut counts = Vec::new();
    let start = record(&s.device, s.stream)?;
    let mut done = Vec::new();
    let result = (|| -> Result<()> {
        for (device, src) in shards {
            let own = device.ordinal == s.device.ordinal;
            let stream = if own { s.stream } else { device.internal };
            if !own {
                device.bind()?;
                // SAFETY: start was recorded on the caller's stream above and is destroyed only
                // after this loop; stream is this device's internal stream, its context bound.
                cuda_call(unsafe { sys::cuStreamWaitEvent(stream, start, 0) }, || "cuStreamWaitEvent".into())?;
            }
            let b = Stream { device: device.clone(), stream };
            // SAFETY: our caller guarantees io as gather needs it; peer access between every
            // pair of devices was enabled when the shards were placed, so this device's kernels
            // may address the caller's keys and out; src's memory lives with the placement.
            counts.extend(unsafe { gather(&b, src, io, want_counts) }?);
            if !own {
                done.push((device.clone(), record(device, stream)?));
            }
        }
        Ok(())
    })();
    // SAFETY: start came from `record` and every wait on it is queued; it is released once,
    // here, and the driver frees it once it has completed.
    unsafe { sys::cuEventDestroy_v2(start) };
    for (_, ev) in done {
        wait_and_release(&s.device, s.stream, ev)?;
    }
    result?;
    Ok(if want_counts { Counts::Device(counts) } else { Counts::None })
}

/// Whether the kernels can address memory of this device type directly.
pub(crate) fn device_visible(t: DLDeviceType) -> bool {
    matches!(t, DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED | DLDeviceType::CUDAHOST)
}

/// The CUDA device a lookup runs on: the one its CUDA tensors are on.
fn lookup_device(k: &TensorView, o: &TensorView) -> Result<usize> {
    let on_cuda = |v: &TensorView| matches!(v.device.device_type, DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED);
    let id = |v: &TensorView, arg: &'static str| {
        usize::try_from(v.device.device_id)
            .map_err(|_| Error::Device { arg, msg: format!("device {}; expected device_id >= 0", device_name(v.device)) })
    };
    match (on_cuda(k), on_cuda(o)) {
        (true, true) => {
            let (a, b) = (id(k, "keys")?, id(o, "out")?);
            if a != b {
                return Err(Error::Device {
                    arg: "out",
                    msg: format!(
                        "device {} but keys are on {}; expected both on the same CUDA device",
                        device_name(o.device),
                        device_name(k.device)
                    ),
                });
            }
            Ok(a)
        }
        (true, false) => id(k, "keys"),
        (false, true) => id(o, "out"),
        (false, false) => Err(Error::Internal("a CUDA lookup without a CUDA tensor".into())),
    }
}

/// Restores the calling thread's current CUDA context when dropped: strata binds the device's
/// primary context for its own calls and leaves the host's thread as it found it.
pub(crate) struct CurrentContext(sys::CUcontext);

impl CurrentContext {
    pub(crate) fn save() -> Self {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: reads the calling thread's current context (NULL when none).
        unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        CurrentContext(ctx)
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        // SAFETY: the context was current on this thread when the call began.
        unsafe { sys::cuCtxSetCurrent(self.0) };
    }
}

/// Whether the tensor is a CUDA tensor (so the lookup runs on the GPU path).
pub(crate) fn is_cuda(t: &DLTensor) -> bool {
    matches!(t.device.device_type, DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED)
}

/// Fails unless `t` is on a device the CUDA path serves: host memory (kDLCPU, kDLCUDAHost) or a
/// CUDA device (kDLCUDA, kDLCUDAManaged). Checked before the shapes, so that a tensor on another
/// device is refused even when it has no elements.
pub(crate) fn require_served(t: &DLTensor, arg: &'static str) -> Result<()> {
    match t.device.device_type {
        DLDeviceType::CPU | DLDeviceType::CUDAHOST | DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED => Ok(()),
        _ => Err(Error::Device {
            arg,
            msg: format!(
                "device {}; strata serves host memory (kDLCPU, kDLCUDAHost) and CUDA devices (kDLCUDA, kDLCUDAManaged)",
                device_name(t.device)
            ),
        }),
    }
}

/// A lookup where `keys` or `out` is a CUDA tensor (see the module docs). `want_stats` makes the
/// call wait for the stream and count hits and misses.
///
/// # Safety
/// As for `Table::lookup`; device tensors must be valid on their device until the stream has
/// run the lookup, and `opts.stream()` must be NULL or a stream of that device's primary context.
/// `resident` must be the residency of the table `table` is: it waits for work that refers to
/// the table before the table is freed.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn lookup(
    table: &dyn RowSource,
    gpu: &GpuOptions,
    resident: &Residency,
    keys: &DLTensor,
    out: &DLTensor,
    opts: &LookupOptions,
    want_stats: bool,
) -> Result<LookupStats> {
    let dim = table.dim();
    crate::util::threads::resolve_threads(opts.num_threads)?;
    require_served(keys, "keys")?;
    require_served(out, "out")?;
    // SAFETY: the caller guarantees keys and out are valid DLPack tensors, so their shape and
    // strides are readable.
    let checked = check(dim, unsafe { TensorView::new(keys, "keys") }?, unsafe { TensorView::new(out, "out") }?)?;
    // Without a driver or device CUDA tensors are refused, even when there is nothing to look up.
    if super::device_count() == 0 {
        let (arg, t) = if is_cuda(keys) { ("keys", keys) } else { ("out", out) };
        return Err(Error::Device { arg, msg: format!("device {}; {}", device_name(t.device), super::unsupported_reason()) });
    }
    let Some(c) = checked else {
        return Ok(LookupStats::default());
    };
    let ordinal = lookup_device(&c.k, &c.o)?;
    let _restore = CurrentContext::save();
    let device = Device::get(ordinal)?;
    let s = Stream { device: device.clone(), stream: opts.stream() as sys::CUstream };
    check_stream(&device, s.stream)?;
    let keys_visible = device_visible(c.k.device.device_type);
    if keys_visible && Walk::new(&c.k.shape, &c.k.strides).linear_stride().is_none() {
        return Err(Error::layout(
            "keys",
            format!("strides {:?} of a device tensor of shape {:?}; expected strides that reduce to one", c.k.strides, c.k.shape),
        ));
    }
    let out_visible = device_visible(c.o.device.device_type);
    if out_visible && c.lead.linear_stride().is_none() {
        return Err(Error::layout(
            "out",
            format!(
                "strides {:?} of a device tensor of shape {:?}; expected the leading dimensions' strides to reduce to one",
                c.o.strides, c.o.shape
            ),
        ));
    }
    if keys_visible && out_visible && ranges_overlap(c.o.byte_range(), c.k.byte_range()) {
        return Err(Error::layout("out", "overlaps the memory of keys; expected separate buffers"));
    }
    let placed = resident.placed(table, gpu, &device, &s)?;
    // SAFETY: c was checked above; the in-place flags are set only for device-visible tensors
    // whose strides reduce to one, on `device` (lookup_device); the caller guarantees the
    // tensors valid until the stream has run the lookup, a live stream, and that `resident`,
    // whence `placed` and `inflight`, is `table`'s.
    unsafe { lookup_on(&s, table, &resident.inflight, &placed, &c, keys_visible, out_visible, want_stats) }
}

/// Runs a checked lookup through `placed` on `b`: keys and out the kernels address in place
/// when `keys_in_place` / `out_in_place` (their strides reduce to one), else keys read on the
/// host and copied in, rows gathered into device memory and copied back into `out`.
///
/// # Safety
/// As for [`lookup`]; in-place tensors must be device-visible for `b`; `placed` and `inflight`
/// must belong to the residency of the table `table` is.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn lookup_on(
    b: &dyn Backend,
    table: &dyn RowSource,
    inflight: &Arc<InFlight>,
    placed: &Placed,
    c: &Checked,
    keys_in_place: bool,
    out_in_place: bool,
    want_stats: bool,
) -> Result<LookupStats> {
    let (n, dim, od) = (c.n, table.dim(), c.od);
    // Keys: in place, or read on the host (any strides) and copied in.
    let mut key_buf = None;
    let (keys_addr, key_dtype, key_stride) = match Walk::new(&c.k.shape, &c.k.strides).linear_stride() {
        Some(stride) if keys_in_place => (c.k.ptr as u64, c.kd, stride as i64),
        _ => {
            let canonical = c.host_keys();
            let buf = b.alloc_stream(n * 8, "the keys")?;
            // SAFETY: buf is n * 8 bytes allocated for this stream's work just above; canonical
            // holds n u64 keys and may go once this returns (the driver has staged it).
            unsafe { b.copy_to_device(buf.dev, canonical.as_ptr() as *const u8, n * 8) }?;
            let addr = buf.dev;
            key_buf = Some(buf);
            (addr, KeyDtype::U64, 1)
        }
    };
    // Out: in place, or a device buffer copied back.
    let out_buf = match c.lead.linear_stride() {
        Some(_) if out_in_place => None,
        _ => Some(b.alloc_stream(n * dim * od.size(), "the rows")?),
    };
    let (out_addr, out_row_stride, out_col_stride) = match &out_buf {
        None => (c.o.ptr as u64, c.lead.linear_stride().unwrap_or(0) as i64, c.col_stride as i64),
        Some(buf) => (buf.dev, dim as i64, 1),
    };
    let io = Io { keys: keys_addr, key_dtype, key_stride, n: n as u64, out: out_addr, out_dtype: od, out_row_stride, out_col_stride };
    let missing_error = table.missing_is_error();
    let want_counts = want_stats || missing_error;
    // SAFETY: io's keys and out are the caller's in-place tensors (valid until the stream has
    // run this work, our contract) or key_buf and out_buf, stream-ordered memory freed only
    // after the work queued before their drop; placed and inflight are table's (our contract).
    let counts = unsafe { execute(b, table, inflight, placed, &io, want_counts) }?;

    if let Some(buf) = &out_buf {
        let mut rows = vec![0u8; n * dim * od.size()];
        b.download(rows.as_mut_ptr(), buf.dev, rows.len())?;
        // SAFETY: check() validated out for n rows of dim elements.
        unsafe { c.write_host_rows(&rows) };
    }
    let mut stats = LookupStats::default();
    if want_counts {
        b.synchronize()?;
        if let Some((hits, misses)) = counts.read(b)? {
            stats.hits = hits;
            stats.misses = misses;
        }
        if missing_error && stats.misses > 0 {
            return Err(super::readback::first_missing(table, c.kd, b, keys_addr, key_dtype, key_stride, n));
        }
    }
    drop(out_buf);
    drop(key_buf);
    Ok(stats)
}

pub(crate) fn ranges_overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// Fails unless `stream` is NULL, a special handle, or a stream of `device`'s primary context.
pub(crate) fn check_stream(device: &Device, stream: sys::CUstream) -> Result<()> {
    // NULL is the legacy default stream; 1 and 2 are cudaStreamLegacy and cudaStreamPerThread.
    if (stream as usize) <= 2 {
        return Ok(());
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: stream is a real handle (above 2), which the lookup's caller guarantees is a live
    // stream; `ctx` is a live out-parameter.
    cuda_call(unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }, || "cuStreamGetCtx(opts->stream)".into())?;
    if ctx != device.ctx.cu_ctx() {
        return Err(Error::invalid(
            "opts->stream",
            format!(
                "belongs to another CUDA context than device {}'s primary context; expected a stream of the device \
                 the tensors are on",
                device.ordinal
            ),
        ));
    }
    Ok(())
}
