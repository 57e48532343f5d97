//! Pooled lookups and batches of requests on CUDA tensors: validation, devices and streams.
//! [`super::requests`] stages and runs them.
//!
//! The stream rules are `strata_lookup`'s (see [`super::run`]): everything is queued on
//! `opts->stream` of the device the CUDA tensors are on (each device's context is made current
//! for the call and the host's current context restored after it); keys, offsets, weights and
//! out on the device, in managed memory or in page-locked host memory are read and written in
//! place, while those in pageable host memory are staged (keys, offsets and weights read on the
//! host and copied in; `out` written in device memory and copied back, which waits). The call
//! waits for the stream only when stats are asked for, the table's missing keys are errors, or
//! `out` is pageable host memory.
//!
//! Offsets in pageable host memory are checked on the host before anything is queued, as the
//! CPU path checks them. Offsets the kernels read in place cannot be read on the host without
//! waiting for the stream: the kernels check them as they read them, a bad one clamps the bags
//! it touches into the keys (nothing outside `out` is ever written), and the call fails with the
//! CPU path's message when it waits for one of the reasons above.
//!
//! A batch ([`validate`] each request, then [`run`] them) checks every request before any is
//! queued; the requests on one device run together (see [`super::requests`]: one launch for all
//! requests on static or uvm tables).

use super::backend::Stream;
use super::device::Device;
use super::requests::{InPlace, Lookup, Shape, check_request};
use super::residency::{Placed, Residency};
use super::run::{CurrentContext, check_stream, device_visible, ranges_overlap};
use crate::dlpack::{TensorView, Walk, device_name};
use crate::error::{Error, Result};
use crate::model::{CheckedBags, GpuOptions, LookupOptions, LookupStats, Request, RowSource};
use cudarc::driver::sys;
use dlpark::ffi::DLDeviceType;
use std::sync::Arc;

/// A request checked for its device: its tensors, the device, and its table's placement there.
pub(crate) struct Valid<'a> {
    source: &'a dyn RowSource,
    resident: &'a Residency,
    /// `None`: nothing to do (no keys, or no bags).
    work: Option<Work>,
    want_stats: bool,
}

struct Work {
    device: Arc<Device>,
    placed: Arc<Placed>,
    shape: Shape,
    in_place: InPlace,
}

/// Whether a CUDA lookup reads these offsets on the host: only from pageable host memory (the
/// kernels read the others in stream order).
fn read_on_host(v: &TensorView) -> bool {
    v.device.device_type == DLDeviceType::CPU
}

/// The CUDA device of a request's tensors (`(view, argument)` pairs): every CUDA tensor on one
/// device, the others in host memory.
fn request_device(views: &[(&TensorView, &'static str)]) -> Result<usize> {
    let mut first: Option<(&TensorView, &'static str, usize)> = None;
    for &(v, arg) in views {
        match v.device.device_type {
            DLDeviceType::CPU | DLDeviceType::CUDAHOST => continue,
            DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED => {}
            _ => {
                return Err(Error::Device {
                    arg,
                    msg: format!(
                        "device {}; expected host memory (kDLCPU, kDLCUDAHost) or the CUDA device of the lookup's other \
                         tensors (kDLCUDA, kDLCUDAManaged)",
                        device_name(v.device)
                    ),
                });
            }
        }
        let id = usize::try_from(v.device.device_id)
            .map_err(|_| Error::Device { arg, msg: format!("device {}; expected device_id >= 0", device_name(v.device)) })?;
        match first {
            None => first = Some((v, arg, id)),
            Some((f, farg, fid)) if fid != id => {
                let verb = if farg == "out" { "is" } else { "are" };
                return Err(Error::Device {
                    arg,
                    msg: format!(
                        "device {} but {farg} {verb} on {}; expected every CUDA tensor of a lookup on the same device",
                        device_name(v.device),
                        device_name(f.device)
                    ),
                });
            }
            Some(_) => {}
        }
    }
    first.map(|(_, _, id)| id).ok_or_else(|| Error::Internal("a CUDA lookup without a CUDA tensor".into()))
}

/// Fails unless a tensor the kernels read in place has strides that reduce to one.
fn require_linear(v: &TensorView, arg: &'static str) -> Result<()> {
    if Walk::new(&v.shape, &v.strides).linear_stride().is_none() {
        return Err(Error::layout(
            arg,
            format!("strides {:?} of a device tensor of shape {:?}; expected strides that reduce to one", v.strides, v.shape),
        ));
    }
    Ok(())
}

/// Checks `r`, a lookup in `source` (placed on devices by `gpu`, its copies there in
/// `resident`), for its device (see the module docs) without queueing anything.
///
/// # Safety
/// As for `Table::lookup_request`: the tensors must describe memory valid as DLPack requires
/// (host offsets readable) until the stream has run the lookup, and `opts.stream()` must be NULL
/// or a stream of the device's primary context.
pub(crate) unsafe fn validate<'a>(
    source: &'a dyn RowSource,
    gpu: &GpuOptions,
    resident: &'a Residency,
    r: &Request,
    opts: &LookupOptions,
) -> Result<Valid<'a>> {
    crate::util::threads::resolve_threads(opts.num_threads)?;
    for (t, arg) in r.tensors() {
        super::run::require_served(t, arg)?;
    }
    let nothing = || Valid { source, resident, work: None, want_stats: r.want_stats };
    // SAFETY: forwarded from the caller.
    let shape = unsafe { check_request(source.dim(), r, read_on_host) }?;
    // Without a driver or device CUDA tensors are refused, even when there is nothing to look up.
    if super::device_count() == 0 {
        let (t, arg) = r.tensors().find(|(t, _)| super::run::is_cuda(t)).unwrap_or((r.keys, "keys"));
        return Err(Error::Device { arg, msg: format!("device {}; {}", device_name(t.device), super::unsupported_reason()) });
    }
    let Some(shape) = shape else {
        return Ok(nothing());
    };
    let (k, o, offsets, w) = match &shape {
        Shape::Plain(c) => (&c.k, &c.o, None, None),
        Shape::Pooled(c, _) => {
            let offsets = match &c.bags {
                CheckedBags::Fixed(_) => None,
                CheckedBags::Read(_, v) | CheckedBags::InPlace { view: v, .. } => Some(v),
            };
            (&c.k, &c.o, offsets, c.w.as_ref())
        }
    };
    let mut views = vec![(k, "keys")];
    views.extend(offsets.map(|v| (v, "offsets")));
    views.extend(w.map(|v| (v, "weights")));
    views.push((o, "out"));
    let ordinal = request_device(&views)?;
    let in_place = InPlace {
        keys: device_visible(k.device.device_type),
        weights: w.is_some_and(|w| device_visible(w.device.device_type)),
        out: device_visible(o.device.device_type),
    };
    if in_place.keys {
        require_linear(k, "keys")?;
    }
    if let Some(w) = w
        && in_place.weights
    {
        require_linear(w, "weights")?;
    }
    if let Shape::Plain(c) = &shape {
        if in_place.out && c.lead.linear_stride().is_none() {
            return Err(Error::layout(
                "out",
                format!(
                    "strides {:?} of a device tensor of shape {:?}; expected the leading dimensions' strides to reduce to one",
                    c.o.strides, c.o.shape
                ),
            ));
        }
        if in_place.keys && in_place.out && ranges_overlap(c.o.byte_range(), c.k.byte_range()) {
            return Err(Error::layout("out", "overlaps the memory of keys; expected separate buffers"));
        }
    }
    let _restore = CurrentContext::save();
    let device = Device::get(ordinal)?;
    let s = Stream { device: device.clone(), stream: opts.stream() as sys::CUstream };
    check_stream(&device, s.stream)?;
    let placed = resident.placed(source, gpu, &device, &s)?;
    Ok(Valid { work: Some(Work { device, placed, shape, in_place }), ..nothing() })
}

/// Runs validated requests: those on one device together on `opts.stream()` (see
/// [`super::requests`]). Returns each request's stats, or the first error and its request.
///
/// # Safety
/// As for [`validate`], for every request.
pub(crate) unsafe fn run(valid: &[&Valid], opts: &LookupOptions) -> std::result::Result<Vec<LookupStats>, (usize, Error)> {
    let mut stats = vec![LookupStats::default(); valid.len()];
    // Requests by device, in the order devices first appear.
    let mut groups: Vec<(Arc<Device>, Vec<usize>)> = Vec::new();
    for (i, v) in valid.iter().enumerate() {
        let Some(w) = &v.work else { continue };
        match groups.iter_mut().find(|(d, _)| d.ordinal == w.device.ordinal) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((w.device.clone(), vec![i])),
        }
    }
    for (device, idx) in groups {
        let _restore = CurrentContext::save();
        let s = Stream { device, stream: opts.stream() as sys::CUstream };
        let jobs: Vec<Lookup> = idx
            .iter()
            .map(|&i| {
                let v = valid[i];
                let w = v.work.as_ref().expect("grouped requests have work");
                Lookup {
                    table: v.source,
                    inflight: &v.resident.inflight,
                    placed: &w.placed,
                    shape: &w.shape,
                    in_place: w.in_place,
                    want_stats: v.want_stats,
                }
            })
            .collect();
        // SAFETY: forwarded from the caller; in-place tensors are device-visible (validated).
        let found = unsafe { super::requests::run(&s, &jobs) }.map_err(|(j, e)| (idx[j], e))?;
        for (&i, f) in idx.iter().zip(found) {
            stats[i] = f;
        }
    }
    Ok(stats)
}

/// A pooled lookup (`r.pooling` is not `None`) in `table` where a tensor is a CUDA tensor (see
/// the module docs).
///
/// # Safety
/// As for `Table::lookup_request`; device tensors must be valid on their device until the
/// stream has run the lookup, and `opts.stream()` must be NULL or a stream of that device's
/// primary context.
pub(crate) unsafe fn lookup(
    table: &dyn RowSource,
    gpu: &GpuOptions,
    resident: &Residency,
    r: &Request,
    opts: &LookupOptions,
) -> Result<LookupStats> {
    // SAFETY: forwarded from the caller.
    let v = unsafe { validate(table, gpu, resident, r, opts) }?;
    // SAFETY: forwarded from the caller.
    let mut stats = unsafe { run(&[&v], opts) }.map_err(|(_, e)| e)?;
    Ok(stats.pop().unwrap_or_default())
}
