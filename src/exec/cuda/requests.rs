//! Plain and pooled lookup requests on a [`Backend`], one or many at a time: staging of host
//! tensors, the launches and the results. The CUDA entry points ([`super::pooled`]) and the
//! emulator ([`super::emulate`]) run requests through here, so the tests run this code.
//!
//! - A request whose table one gather kernel serves (static and uvm placements) runs in the
//!   pooled kernel (`strata_pooled_<table>`) or, plain, the gather kernel; two or more such
//!   requests on one backend run together in one launch of the batch kernel (`strata_batch`),
//!   whatever their dtypes, dims and poolings.
//! - A request through a cache or shards runs on its own: plain ones as `strata_lookup` runs
//!   them ([`execute`]); pooled ones gather every key's row (float32) into device memory that way,
//!   then pool them (`strata_pool_rows`).
//! - Keys, offsets and weights the kernels cannot address in place are read on the host and
//!   copied in; an `out` they cannot address is written in device memory and copied back.
//! - The work waits for the stream only when a request asks for stats, its table's missing keys
//!   are errors, or its `out` is copied back. Offsets left in device memory are checked by the
//!   kernels as they read them: a bad offset fails the request (with the CPU path's message)
//!   when the work waits, and otherwise only clamps the bags it touches into the keys.

use super::backend::{Backend, Mem, grid};
use super::inflight::InFlight;
use super::io::{Io, format_name};
use super::params::PooledParams;
use super::readback::{first_missing, read_back};
use super::residency::Placed;
use super::run::{Counts, execute};
use crate::dlpack::{FloatDtype, KeyDtype, TensorView, Walk};
use crate::error::{Error, Result};
use crate::kernels::RowFormat;
use crate::model::{
    Checked, CheckedBags, Devices, KeySource, LookupStats, PooledChecked, Pooling, Request, RowSource, check, check_offset_values,
    check_pooled,
};
use std::sync::Arc;

/// What a request computes, checked.
pub(crate) enum Shape {
    /// One row per key.
    Plain(Box<Checked>),
    /// One pooled row per bag.
    Pooled(Box<PooledChecked>, Pooling),
}

/// Checks a request's tensors for a table of `dim` on any device: plain (`pooling` `None`) or
/// pooled, offsets read on the host where `read_offsets` says so. `None`: nothing to do (no
/// keys, or no bags).
///
/// # Safety
/// The tensors must describe memory valid as DLPack requires (offsets it reads readable on the
/// host).
pub(crate) unsafe fn check_request(dim: usize, r: &Request, read_offsets: fn(&TensorView) -> bool) -> Result<Option<Shape>> {
    Ok(match r.pooling {
        None => {
            // SAFETY: forwarded from the caller.
            let (k, o) = unsafe { (TensorView::new(r.keys, "keys")?, TensorView::new(r.out, "out")?) };
            check(dim, k, o)?.map(|c| Shape::Plain(Box::new(c)))
        }
        Some(p) => {
            // SAFETY: forwarded from the caller.
            let c = check_pooled(dim, r, Devices::Any { read_offsets })?;
            (c.b > 0).then(|| Shape::Pooled(Box::new(c), p))
        }
    })
}

/// Which of a request's tensors the kernels address where they are (else: keys and weights read
/// on the host and copied in, `out` written in device memory and copied back). A tensor whose
/// strides the kernels cannot follow is staged whatever this says. Offsets: as checked.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InPlace {
    pub keys: bool,
    pub weights: bool,
    pub out: bool,
}

/// A checked request, with its table and how the table is placed on the backend it runs on.
pub(crate) struct Lookup<'a> {
    pub table: &'a dyn RowSource,
    pub inflight: &'a Arc<InFlight>,
    pub placed: &'a Placed,
    pub shape: &'a Shape,
    pub in_place: InPlace,
    pub want_stats: bool,
}

/// The kernels' code for a key dtype (`PooledParams::key_dtype`).
fn key_code(k: KeyDtype) -> u32 {
    match k {
        KeyDtype::I32 => 0,
        KeyDtype::I64 => 1,
        KeyDtype::U32 => 2,
        KeyDtype::U64 => 3,
    }
}

/// The kernels' code for a float dtype (`PooledParams::out_dtype`, `table_dtype`).
fn float_code(f: FloatDtype) -> u32 {
    match f {
        FloatDtype::F32 => 0,
        FloatDtype::F16 => 1,
        FloatDtype::BF16 => 2,
    }
}

/// The kernels' code for a table's row format (`PooledParams::table_dtype`): a float dtype's
/// code, then 3 int8, 4 int4, 5 fp8.
fn format_code(f: RowFormat) -> u32 {
    match f {
        RowFormat::Float(d) => float_code(d),
        RowFormat::Int8 => 3,
        RowFormat::Int4 => 4,
        RowFormat::Fp8 => 5,
    }
}

/// Bytes of the per-request slot of device memory: `[hits, misses]` (u64), then the offsets'
/// status (u32).
const SLOT: usize = 32;

/// A request staged on the backend: its parameters (all but the table) and the memory they
/// refer to.
struct Prepared {
    params: PooledParams,
    /// Where keys are read (for the gathers and to find a missing key): `params.keys` holds
    /// keys of this dtype.
    key_dtype: KeyDtype,
    _staged: Vec<Mem>,
    out_buf: Option<Mem>,
    want_counts: bool,
    counts: Counts,
}

/// Copies `v` into new stream-ordered device memory.
fn upload<T: Copy>(b: &dyn Backend, v: &[T], what: &str) -> Result<Mem> {
    let bytes = std::mem::size_of_val(v);
    let m = b.alloc_stream(bytes, what)?;
    if bytes > 0 {
        // SAFETY: `m` is `bytes` of device memory for this work; `v` is readable for `bytes`.
        unsafe { b.copy_to_device(m.dev, v.as_ptr() as *const u8, bytes) }?;
    }
    Ok(m)
}

/// Stages `job` on `b`: copies in what the kernels cannot address in place and fills the
/// parameters; `slot` is its device memory for counts and the offsets' status (0: none).
///
/// # Safety
/// The job's tensors must be valid as checked; in-place ones device-visible for `b`.
unsafe fn prepare(b: &dyn Backend, job: &Lookup, slot: u64) -> Result<Prepared> {
    let dim = job.table.dim();
    let want_counts = job.want_stats || job.table.missing_is_error();
    let mut staged = Vec::new();
    let mut p = PooledParams { dim: dim as u32, counts: if want_counts { slot } else { 0 }, ..PooledParams::default() };
    let (key_dtype, out_buf) = match job.shape {
        Shape::Plain(c) => {
            let n = c.n;
            let key_dtype = match Walk::new(&c.k.shape, &c.k.strides).linear_stride() {
                Some(stride) if job.in_place.keys => {
                    (p.keys, p.key_stride) = (c.k.ptr as u64, stride as i64);
                    c.kd
                }
                _ => {
                    let m = upload(b, &c.host_keys(), "the keys")?;
                    (p.keys, p.key_stride) = (m.dev, 1);
                    staged.push(m);
                    KeyDtype::U64
                }
            };
            let out_buf = match c.lead.linear_stride() {
                Some(stride) if job.in_place.out => {
                    (p.out, p.out_row_stride, p.out_col_stride) = (c.o.ptr as u64, stride as i64, c.col_stride as i64);
                    None
                }
                _ => {
                    let m = b.alloc_stream(n * dim * c.od.size(), "the rows")?;
                    (p.out, p.out_row_stride, p.out_col_stride) = (m.dev, dim as i64, 1);
                    Some(m)
                }
            };
            (p.nnz, p.bags, p.hotness, p.out_dtype) = (n as u64, n as u64, 1, float_code(c.od));
            (key_dtype, out_buf)
        }
        Shape::Pooled(c, pooling) => {
            let nnz = c.nnz;
            let key_dtype = match Walk::new(&c.k.shape, &c.k.strides).linear_stride() {
                Some(stride) if job.in_place.keys || nnz == 0 => {
                    (p.keys, p.key_stride) = (c.k.ptr as u64, stride as i64);
                    c.kd
                }
                _ => {
                    let source = KeySource { ptr: c.k.ptr, dtype: c.kd, walk: Walk::new(&c.k.shape, &c.k.strides), elem: c.k.elem };
                    let mut keys = vec![0u64; nnz];
                    source.read(0, &mut keys, &mut vec![0isize; nnz]);
                    let m = upload(b, &keys, "the keys")?;
                    (p.keys, p.key_stride) = (m.dev, 1);
                    staged.push(m);
                    KeyDtype::U64
                }
            };
            match &c.bags {
                CheckedBags::Fixed(l) => p.hotness = *l as u64,
                CheckedBags::Read(offsets, _) => {
                    let v: Vec<i64> = offsets.iter().map(|&o| o as i64).collect();
                    let m = upload(b, &v, "the offsets")?;
                    (p.offsets, p.offsets_stride, p.offsets_wide) = (m.dev, 1, 1);
                    staged.push(m);
                }
                CheckedBags::InPlace { view, wide } => {
                    (p.offsets, p.offsets_stride, p.offsets_wide) = (view.ptr as u64, view.strides[0] as i64, *wide as u32);
                    p.status = if slot == 0 { 0 } else { slot + 16 };
                }
            }
            if let Some(w) = &c.w {
                match Walk::new(&w.shape, &w.strides).linear_stride() {
                    Some(stride) if job.in_place.weights || nnz == 0 => (p.weights, p.weight_stride) = (w.ptr as u64, stride as i64),
                    _ => {
                        let mut offs = vec![0isize; nnz];
                        Walk::new(&w.shape, &w.strides).fill(0, &mut offs);
                        let v: Vec<f32> = offs
                            .iter()
                            // SAFETY: the weights were checked as float32 of the keys' shape, so
                            // every flat index below nnz is a readable, aligned element.
                            .map(|&o| unsafe { *(w.at(o) as *const f32) })
                            .collect();
                        let m = upload(b, &v, "the weights")?;
                        (p.weights, p.weight_stride) = (m.dev, 1);
                        staged.push(m);
                    }
                }
            }
            let out_buf = if job.in_place.out {
                (p.out, p.out_row_stride, p.out_col_stride) = (c.o.ptr as u64, c.o.strides[0] as i64, c.o.strides[1] as i64);
                None
            } else {
                let m = b.alloc_stream(c.b * dim * c.od.size(), "the pooled rows")?;
                (p.out, p.out_row_stride, p.out_col_stride) = (m.dev, dim as i64, 1);
                Some(m)
            };
            p.pooling = match pooling {
                Pooling::Sum => 1,
                Pooling::Mean => 2,
                Pooling::Sqrtn => 3,
            };
            (p.nnz, p.bags, p.out_dtype) = (nnz as u64, c.b as u64, float_code(c.od));
            (key_dtype, out_buf)
        }
    };
    p.key_dtype = key_code(key_dtype);
    Ok(Prepared { params: p, key_dtype, _staged: staged, out_buf, want_counts, counts: Counts::None })
}

impl Prepared {
    /// The gather this request's keys go through (plain requests, and the gathers of pooled
    /// requests through a cache or shards), into `out` with the given layout.
    fn io(&self, out: u64, out_dtype: FloatDtype, out_row_stride: i64, out_col_stride: i64) -> Io {
        let p = &self.params;
        Io { keys: p.keys, key_dtype: self.key_dtype, key_stride: p.key_stride, n: p.nnz, out, out_dtype, out_row_stride, out_col_stride }
    }
}

/// Runs `jobs` on `b` (see the module docs); returns each one's stats, or the first error and
/// the job it belongs to.
///
/// # Safety
/// Every job's tensors must be valid as checked, until the stream has run the work; in-place
/// ones device-visible for `b`.
pub(crate) unsafe fn run(b: &dyn Backend, jobs: &[Lookup]) -> std::result::Result<Vec<LookupStats>, (usize, Error)> {
    let at = |i: usize| move |e: Error| (i, e);
    // One slot of device memory per request for counts and the offsets' status, zeroed at once.
    let needs_slot = jobs.iter().any(|j| {
        j.want_stats
            || j.table.missing_is_error()
            || matches!(j.shape, Shape::Pooled(c, _) if matches!(c.bags, CheckedBags::InPlace { .. }))
    });
    let slots = if needs_slot {
        let m = b.alloc_stream(jobs.len() * SLOT, "lookup counts").map_err(at(0))?;
        // SAFETY: the slots are this work's device memory.
        unsafe { b.zero(m.dev, m.bytes) }.map_err(at(0))?;
        Some(m)
    } else {
        None
    };
    let slot = |i: usize| slots.as_ref().map_or(0, |m| m.dev + (i * SLOT) as u64);
    let mut prepared = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        // SAFETY: forwarded from the caller.
        prepared.push(unsafe { prepare(b, job, slot(i)) }.map_err(at(i))?);
    }

    // Requests one gather kernel serves: two or more run in one launch of the batch kernel.
    let direct: Vec<usize> = (0..jobs.len()).filter(|&i| matches!(jobs[i].placed, Placed::Gather(_))).collect();
    let batched = direct.len() >= 2;
    if batched {
        let mut items = Vec::with_capacity(direct.len());
        let mut total = 0u64;
        for &i in &direct {
            let Placed::Gather(src) = jobs[i].placed else { unreachable!("filtered above") };
            let p = &mut prepared[i];
            if p.want_counts {
                p.counts = Counts::Slot(p.params.counts);
            }
            items.push(PooledParams { src: src.params, table_dtype: format_code(src.format), first: total, ..p.params });
            total += p.params.bags;
        }
        let items_mem = upload(b, &items, "the batch's requests").map_err(at(direct[0]))?;
        let params = super::params::BatchParams { items: items_mem.dev, count: items.len() as u64, total };
        // SAFETY: every request's addresses were checked and staged for this work.
        unsafe { b.launch_batch("strata_batch", grid(b.sms(), total), &params) }.map_err(at(direct[0]))?;
    }
    let mut gathered = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        if batched && matches!(job.placed, Placed::Gather(_)) {
            continue;
        }
        let p = &mut prepared[i];
        match (job.shape, job.placed) {
            (Shape::Plain(c), _) => {
                let io = p.io(p.params.out, c.od, p.params.out_row_stride, p.params.out_col_stride);
                // SAFETY: forwarded from the caller; the staged memory lives in `p`.
                p.counts = unsafe { execute(b, job.table, job.inflight, job.placed, &io, p.want_counts) }.map_err(at(i))?;
            }
            (Shape::Pooled(..), Placed::Gather(src)) => {
                let params = PooledParams { src: src.params, table_dtype: format_code(src.format), ..p.params };
                let name = format!("strata_pooled_{}", format_name(src.format));
                // SAFETY: forwarded from the caller; the staged memory lives in `p`.
                unsafe { b.launch_pooled(&name, grid(b.sms(), params.bags), &params) }.map_err(at(i))?;
                if p.want_counts {
                    p.counts = Counts::Slot(p.params.counts);
                }
            }
            (Shape::Pooled(..), _) => {
                // Every key's row through the placement's own lookup, then pooled.
                let dim = job.table.dim();
                let nnz = p.params.nnz as usize;
                let rows = b.alloc_stream(nnz * dim * 4, "the gathered rows").map_err(at(i))?;
                if nnz > 0 {
                    let io = p.io(rows.dev, FloatDtype::F32, dim as i64, 1);
                    // SAFETY: forwarded from the caller; `rows` holds nnz rows of dim float32.
                    p.counts = unsafe { execute(b, job.table, job.inflight, job.placed, &io, p.want_counts) }.map_err(at(i))?;
                }
                let params = PooledParams { rows: rows.dev, counts: 0, ..p.params };
                // SAFETY: as above.
                unsafe { b.launch_pooled("strata_pool_rows", grid(b.sms(), params.bags), &params) }.map_err(at(i))?;
                gathered.push(rows);
            }
        }
    }

    // Results: the work waits only when a request needs it to.
    let waits = prepared.iter().position(|p| p.want_counts || p.out_buf.is_some());
    if let Some(i) = waits {
        b.synchronize().map_err(at(i))?;
    }
    let mut stats = Vec::with_capacity(jobs.len());
    for (i, (job, p)) in jobs.iter().zip(&prepared).enumerate() {
        if waits.is_some() && p.params.status != 0 {
            let mut status = 0u32;
            b.download(&mut status as *mut u32 as *mut u8, p.params.status, 4).map_err(at(i))?;
            if status != 0 {
                return Err((i, bad_offsets(b, job.shape)));
            }
        }
        if let Some(buf) = &p.out_buf {
            let mut rows = vec![0u8; buf.bytes];
            b.download(rows.as_mut_ptr(), buf.dev, rows.len()).map_err(at(i))?;
            match job.shape {
                // SAFETY: check() validated out for n rows of dim elements; `rows` holds them.
                Shape::Plain(c) => unsafe { c.write_host_rows(&rows) },
                // SAFETY: check_pooled() validated out as [B, dim]; `rows` holds B compact rows.
                Shape::Pooled(c, _) => unsafe { write_pooled_rows(c, job.table.dim(), &rows) },
            }
        }
        let mut s = LookupStats::default();
        if p.want_counts {
            if let Some((hits, misses)) = p.counts.read(b).map_err(at(i))? {
                (s.hits, s.misses) = (hits, misses);
            }
            if job.table.missing_is_error() && s.misses > 0 {
                let kd = match job.shape {
                    Shape::Plain(c) => c.kd,
                    Shape::Pooled(c, _) => c.kd,
                };
                let q = &p.params;
                return Err((i, first_missing(job.table, kd, b, q.keys, p.key_dtype, q.key_stride, q.nnz as usize)));
            }
        }
        stats.push(s);
    }
    drop(gathered);
    drop(slots);
    Ok(stats)
}

/// Writes compact pooled rows (`B x dim` values of out's dtype, as bytes) into host `out`.
///
/// # Safety
/// `c.o` must be writable host memory as checked (`[B, dim]`).
unsafe fn write_pooled_rows(c: &PooledChecked, dim: usize, rows: &[u8]) {
    let size = c.od.size();
    let (row_stride, col_stride) = (c.o.strides[0], c.o.strides[1] as usize);
    for (b, row) in rows.chunks_exact(dim * size).enumerate() {
        let dst = c.o.at(b as isize * row_stride);
        if col_stride == 1 {
            // SAFETY: out holds row b's dim contiguous elements at dst.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), dst, row.len()) };
            continue;
        }
        for (col, src) in row.chunks_exact(size).enumerate() {
            // SAFETY: out holds element (b, col) at dst + col * col_stride elements.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.wrapping_add(col * col_stride * size), size) };
        }
    }
}

/// The error for offsets a kernel found bad: they are read back and checked as the CPU path
/// checks them, for its message.
fn bad_offsets(b: &dyn Backend, shape: &Shape) -> Error {
    let Shape::Pooled(c, _) = shape else {
        return Error::Internal("a plain lookup reported bad offsets".into());
    };
    let CheckedBags::InPlace { view, wide } = &c.bags else {
        return Error::Internal("offsets checked on the host were reported bad".into());
    };
    let elem = if *wide { 8 } else { 4 };
    let raw = match read_back(b, view.ptr as u64, elem, view.strides[0] as i64, view.shape[0]) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let values = raw.chunks_exact(elem).map(|c| {
        if *wide { i64::from_le_bytes(c.try_into().expect("8 bytes")) } else { i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64 }
    });
    match check_offset_values(values, c.nnz) {
        Err(e) => e,
        Ok(_) => Error::Internal("a kernel reported bad offsets that the host finds valid".into()),
    }
}
