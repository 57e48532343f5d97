//! Lookups in C: `strata_lookup_options`, `strata_lookup_request`, `strata_lookup_stats` and
//! `strata_pooling`, their initialisers and conversions; `strata_lookup`, its managed-tensor
//! variants, `strata_lookup_pooled` and `strata_lookup_batch`.

use super::boundary::opt_ref;
use super::boundary::{arg_ref, boundary};
use super::sized::{Extensible, OutStruct, in_array, out_struct, read_in};
use super::status::Status;
use super::table::{strata_table, table_arg};
use super::tensor::check_managed;
use crate::error::{Error, Result};
use crate::model::{LookupOptions, LookupStats, Pooling, Request};
use crate::table::{BatchRequest, Call};
use dlpark::ManagedTensorBase;
use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use std::ffi::c_void;

/// How a pooled lookup reduces a bag's rows to one row (`strata_lookup_pooled`,
/// `strata_lookup_request.pooling`). TensorFlow's `embedding_lookup_sparse` combiners.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum strata_pooling {
    /// No pooling: a plain lookup, one row per key (in `strata_lookup_request` only).
    STRATA_POOL_NONE = 0,
    /// Σ wⱼ·row(kⱼ) per bag.
    STRATA_POOL_SUM = 1,
    /// The sum divided by Σ wⱼ (zeros when that is 0).
    STRATA_POOL_MEAN = 2,
    /// The sum divided by √(Σ wⱼ²) (zeros when that is 0).
    STRATA_POOL_SQRTN = 3,
}

/// The pooling a C caller asked for: `None` for `STRATA_POOL_NONE`.
pub(crate) fn pooling_of(v: i32, arg: &'static str) -> Result<Option<Pooling>> {
    match v {
        0 => Ok(None),
        1 => Ok(Some(Pooling::Sum)),
        2 => Ok(Some(Pooling::Mean)),
        3 => Ok(Some(Pooling::Sqrtn)),
        p => Err(Error::invalid(
            arg,
            format!(
                "{p}; expected STRATA_POOL_SUM (1), STRATA_POOL_MEAN (2) or STRATA_POOL_SQRTN (3), or STRATA_POOL_NONE (0) for a plain lookup"
            ),
        )),
    }
}

/// Per-call lookup options (an in-struct). Initialise with `strata_lookup_options_default()`;
/// a NULL pointer means the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct strata_lookup_options {
    /// `sizeof(strata_lookup_options)`, set by `strata_lookup_options_default()`.
    pub struct_size: usize,
    /// A `cudaStream_t` / `CUstream` for CUDA tensors. Ignored for host tensors, which are
    /// read and written before the call returns. Default NULL.
    pub stream: *mut c_void,
    /// CPU threads for this call: 0 = the library default (the process affinity mask, or
    /// `STRATA_NUM_THREADS`), 1 = only the calling thread, n = at most n threads. Default 0.
    pub num_threads: i32,
}

impl Default for strata_lookup_options {
    fn default() -> Self {
        let d = LookupOptions::default();
        strata_lookup_options { struct_size: size_of::<Self>(), stream: d.stream(), num_threads: d.num_threads }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_lookup_options {
    const NAME: &'static str = "strata_lookup_options";
    const FIRST_SIZE: usize = 24;
}

impl strata_lookup_options {
    /// The core's options for these.
    ///
    /// # Safety
    /// `self.stream` must be as [`LookupOptions::on_stream`] requires (the lookup exports'
    /// contract with their caller).
    pub(crate) unsafe fn core(&self) -> LookupOptions {
        // SAFETY: forwarded from the caller.
        unsafe { LookupOptions::on_stream(self.stream, self.num_threads) }
    }
}

/// Default lookup options (`struct_size = sizeof(strata_lookup_options)`): no stream, the
/// library's default thread count.
#[unsafe(no_mangle)]
pub extern "C" fn strata_lookup_options_default() -> strata_lookup_options {
    strata_lookup_options::default()
}

/// What one lookup found (an out-struct). Initialise `struct_size` with
/// `strata_lookup_stats_default()`; strata writes only the fields it covers.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct strata_lookup_stats {
    /// `sizeof(strata_lookup_stats)`, set by `strata_lookup_stats_default()`.
    pub struct_size: usize,
    /// Keys found in the table (in any tier).
    pub hits: u64,
    /// Keys not in the table (filled with the default value).
    pub misses: u64,
    /// Of the hits, keys found in a server table's volatile tier (0 for other tables).
    pub volatile_hits: u64,
    /// Of the hits, keys found in a server table's persistent tier (0 for other tables).
    pub persistent_hits: u64,
}

impl Default for strata_lookup_stats {
    fn default() -> Self {
        LookupStats::default().into()
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_lookup_stats {
    const NAME: &'static str = "strata_lookup_stats";
    const FIRST_SIZE: usize = 40;
}

impl From<LookupStats> for strata_lookup_stats {
    fn from(s: LookupStats) -> Self {
        strata_lookup_stats {
            struct_size: size_of::<Self>(),
            hits: s.hits,
            misses: s.misses,
            volatile_hits: s.volatile_hits,
            persistent_hits: s.persistent_hits,
        }
    }
}

/// A `strata_lookup_stats` with `struct_size = sizeof(strata_lookup_stats)` and zero counts,
/// to pass to the lookups.
#[unsafe(no_mangle)]
pub extern "C" fn strata_lookup_stats_default() -> strata_lookup_stats {
    strata_lookup_stats::default()
}

/// The checked tensors (as the caller read them), options and stats, then one call into the
/// core. A bad argument on a distributed table is refused collectively
/// ([`crate::table::Table::refuse`]), so the other ranks do not wait for this one.
///
/// # Safety
/// `table` must be NULL or a live handle; `opts` and `stats` NULL or valid for their
/// `struct_size` bytes.
unsafe fn run(
    table: *const strata_table,
    tensors: Result<(&DLTensor, &DLTensor)>,
    opts: *const strata_lookup_options,
    stats: *mut strata_lookup_stats,
) -> Result<()> {
    // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
    let table = unsafe { table_arg(table, "table") };
    let (table, (keys, out)) = match (table, tensors) {
        (Ok(t), Ok(k)) => (t, k),
        // A tensor error comes before a table error, as it always has.
        (Ok(t), Err(e)) => return Err(t.refuse(Call::Lookup, e)),
        (Err(_), Err(e)) | (Err(e), Ok(_)) => return Err(e),
    };
    let args = || -> Result<_> {
        // SAFETY: `opts` is NULL or valid, and its stream NULL or live, as this export's
        // # Safety section requires.
        let opts = unsafe { read_in(opts, "opts")?.core() };
        // SAFETY: `stats` is NULL or valid as this export's # Safety section requires.
        let stats = unsafe { out_struct(stats, "stats") }?;
        Ok((opts, stats))
    };
    let (opts, stats) = args().map_err(|e| table.refuse(Call::Lookup, e))?;
    // SAFETY: the pointers are NULL or valid as this export's # Safety section requires.
    let found = unsafe { table.lookup_request(&Request::plain(keys, out, stats.is_some()), &opts) }?;
    write_stats(stats, found);
    Ok(())
}

/// Writes a lookup's stats where the caller asked for them.
fn write_stats(stats: Option<OutStruct<strata_lookup_stats>>, found: LookupStats) {
    if let Some(s) = stats {
        s.write(&found.into());
    }
}

/// Looks up `keys` in `table` and writes one row per key into `out`.
///
/// - `keys`: int32, int64, uint32 or uint64; any shape, strides (negative too) and
///   byte_offset. Keys compare as 64-bit patterns: signed dtypes sign-extended, unsigned
///   zero-extended.
/// - `out`: float32, float16 or bfloat16; shape `[*keys.shape, dim]` or `[numel(keys), dim]`;
///   non-negative, non-overlapping strides (sorted by size, each steps past the extent of the
///   smaller ones); must not overlap `keys` or the table's vectors.
/// - Host tensors (kDLCPU, kDLCUDAHost) run on CPU threads and are read and written before the
///   call returns. When `keys` or `out` is a CUDA tensor (kDLCUDA, kDLCUDAManaged; both on
///   the same `device_id`), the lookup is queued on `opts->stream` (a `cudaStream_t` of that
///   device's primary context; NULL = the legacy default stream) and the call returns without
///   waiting, unless `stats` is not NULL, `out` is pageable host memory (kDLCPU), or the
///   table's missing keys are errors. Host keys with device out and device keys with host out
///   are served too. Device tensors must stay valid until the stream has run the lookup, and
///   the table must not be freed before then either (`strata_table_free` waits for strata's
///   own queued host work, not for the caller's kernels). Where the table's rows are on the
///   device is `strata_table_options.gpu_placement`. Without a CUDA driver or device, CUDA
///   tensors get `STRATA_UNSUPPORTED_DEVICE`; a failing CUDA call gets `STRATA_CUDA_ERROR`.
/// - `opts` may be NULL (defaults). `stats` may be NULL; else it receives hits and misses (an
///   out-struct: set its `struct_size` with `strata_lookup_stats_default()`).
/// - Missing keys get the table's default value, or `STRATA_KEY_NOT_FOUND` when the table was
///   built with `STRATA_MISSING_ERROR` (then `out` is unspecified).
/// - Zero keys is a valid no-op.
///
/// Ownership: borrows `keys` and `out` for the call only. Threading: many threads may look up
/// one table at once; each call uses at most `opts->num_threads` threads (the caller's included).
///
/// On a distributed table (built with a communicator) the call is collective: every rank of its
/// communicator must call it, for the same tables in the same order, each with its own keys;
/// make one such call per table at a time on each rank. A failure on any rank (a bad tensor, or
/// a missing key under `STRATA_MISSING_ERROR`) fails it on every rank.
///
/// # Safety
/// `table` is NULL or a live table handle; `keys` is NULL or a DLPack tensor whose memory is valid
/// as its shape, strides and device describe; `out` is NULL or a DLPack tensor whose memory is
/// valid as its shape, strides and device describe; `opts` is NULL or points to `struct_size`
/// readable bytes; `stats` is NULL or points to `struct_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_lookup(
    table: *mut strata_table,
    keys: *const DLTensor,
    out: *mut DLTensor,
    opts: *const strata_lookup_options,
    stats: *mut strata_lookup_stats,
) -> Status {
    boundary(|| {
        let tensors = || -> Result<_> {
            // SAFETY: `keys` is NULL or valid as this export's # Safety section requires.
            let keys = unsafe { arg_ref(keys, "keys") }?;
            // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
            let out = unsafe { arg_ref(out, "out") }?;
            Ok((keys, out))
        };
        // SAFETY: forwarded: the caller upholds this export's # Safety section.
        unsafe { run(table, tensors(), opts, stats) }
    })
}

/// # Safety
/// Pointers as for `strata_lookup_managed`: NULL or valid managed tensors and table.
unsafe fn run_managed<M: ManagedTensorBase>(
    table: *mut strata_table,
    keys: *const M,
    out: *mut M,
    opts: *const strata_lookup_options,
    stats: *mut strata_lookup_stats,
) -> Status {
    boundary(|| {
        let tensors = || -> Result<_> {
            // SAFETY: `keys` is NULL or valid as this export's # Safety section requires.
            let keys = unsafe { arg_ref(keys, "keys") }?;
            // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
            let out = unsafe { arg_ref(out, "out") }?;
            check_managed(keys, "keys", false)?;
            check_managed(out, "out", true)?;
            Ok((keys.tensor(), out.tensor()))
        };
        // SAFETY: forwarded: the caller upholds this export's # Safety section.
        unsafe { run(table, tensors(), opts, stats) }
    })
}

/// `strata_lookup` on legacy managed tensors. Ownership: borrows; never calls a deleter.
///
/// # Safety
/// `table` is NULL or a live table handle; `keys` is NULL or a DLPack tensor whose memory is valid
/// as its shape, strides and device describe; `out` is NULL or a DLPack tensor whose memory is
/// valid as its shape, strides and device describe; `opts` is NULL or points to `struct_size`
/// readable bytes; `stats` is NULL or points to `struct_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_lookup_managed(
    table: *mut strata_table,
    keys: *const DLManagedTensor,
    out: *mut DLManagedTensor,
    opts: *const strata_lookup_options,
    stats: *mut strata_lookup_stats,
) -> Status {
    // SAFETY: forwarded.
    unsafe { run_managed(table, keys, out, opts, stats) }
}

/// `strata_lookup` on versioned managed tensors (DLPack 1.x). An `out` flagged
/// `DLPACK_FLAG_BITMASK_READ_ONLY` is refused with `STRATA_READ_ONLY`. Ownership: borrows;
/// never calls a deleter.
///
/// # Safety
/// `table` is NULL or a live table handle; `keys` is NULL or a DLPack tensor whose memory is valid
/// as its shape, strides and device describe; `out` is NULL or a DLPack tensor whose memory is
/// valid as its shape, strides and device describe; `opts` is NULL or points to `struct_size`
/// readable bytes; `stats` is NULL or points to `struct_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_lookup_managed_versioned(
    table: *mut strata_table,
    keys: *const DLManagedTensorVersioned,
    out: *mut DLManagedTensorVersioned,
    opts: *const strata_lookup_options,
    stats: *mut strata_lookup_stats,
) -> Status {
    // SAFETY: forwarded.
    unsafe { run_managed(table, keys, out, opts, stats) }
}

/// One lookup of a `strata_lookup_batch` (an in-struct; an array's stride is its elements'
/// `struct_size`). Initialise each with `strata_lookup_request_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct strata_lookup_request {
    /// `sizeof(strata_lookup_request)`, set by `strata_lookup_request_default()`; the same in
    /// every element of one array.
    pub struct_size: usize,
    /// The table to look up (any kind; a distributed table makes the batch collective).
    pub table: *mut strata_table,
    /// As `strata_lookup`'s keys (plain), or `strata_lookup_pooled`'s keys (pooled).
    pub keys: *const DLTensor,
    /// Pooled requests with 1-D keys: `B + 1` offsets; NULL otherwise.
    pub offsets: *const DLTensor,
    /// Pooled requests: NULL or float32 weights of the keys' shape; NULL for plain requests.
    pub weights: *const DLTensor,
    /// A `strata_pooling`: `STRATA_POOL_NONE` (the default) for a plain lookup.
    pub pooling: i32,
    /// The rows: `[*keys.shape, dim]` or `[numel(keys), dim]` (plain), `[B, dim]` (pooled).
    pub out: *mut DLTensor,
    /// NULL, or this request's stats (an out-struct with its `struct_size` set).
    pub stats: *mut strata_lookup_stats,
}

impl Default for strata_lookup_request {
    fn default() -> Self {
        strata_lookup_request {
            struct_size: size_of::<Self>(),
            table: std::ptr::null_mut(),
            keys: std::ptr::null(),
            offsets: std::ptr::null(),
            weights: std::ptr::null(),
            pooling: strata_pooling::STRATA_POOL_NONE as i32,
            out: std::ptr::null_mut(),
            stats: std::ptr::null_mut(),
        }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_lookup_request {
    const NAME: &'static str = "strata_lookup_request";
    const FIRST_SIZE: usize = 64;
}

/// A `strata_lookup_request` with `struct_size = sizeof(strata_lookup_request)`, every pointer
/// NULL and `pooling = STRATA_POOL_NONE`.
#[unsafe(no_mangle)]
pub extern "C" fn strata_lookup_request_default() -> strata_lookup_request {
    strata_lookup_request::default()
}

/// Looks up bags of keys in `table` and writes one pooled row per bag into `out`, as HPS's
/// `SparseLookupLayer` and TensorFlow's `embedding_lookup_sparse` do.
///
/// - `keys`: int32, int64, uint32 or uint64, any strides: 1-D `[nnz]` with `offsets` a 1-D
///   int32/int64 tensor of `B + 1` entries (`offsets[0] = 0`, non-decreasing,
///   `offsets[B] = nnz`: PyTorch's `include_last_offset` form), or 2-D `[B, L]` with `offsets`
///   NULL (fixed hotness, each row one bag).
/// - `weights`: NULL, or float32 of the keys' shape.
/// - `pooling`: `STRATA_POOL_SUM`, `STRATA_POOL_MEAN` or `STRATA_POOL_SQRTN`. Per bag, sum =
///   Σ wⱼ·row(kⱼ); mean = sum / Σ wⱼ; sqrtn = sum / √(Σ wⱼ²), with wⱼ = 1 without weights. An
///   empty bag, or a zero weight total for mean or sqrtn, gives zeros. Accumulation is float32
///   in key order within a bag, whatever the table's dtype.
/// - `out`: `[B, dim]` float32, float16 or bfloat16, non-negative, non-overlapping strides;
///   nothing outside it is written.
/// - A missing key contributes the table's default row and counts as a miss; with
///   `STRATA_MISSING_ERROR` it fails the call (`out` is then unspecified). `stats` counts keys.
/// - `opts`, `stats`, devices and streams as in `strata_lookup`. On a distributed table the
///   call is collective.
///
/// Ownership: borrows every tensor for the call only. Threading: as `strata_lookup`.
///
/// # Safety
/// `table` is NULL or a live table handle; `keys`, `offsets`, `weights` and `out` are NULL or
/// DLPack tensors whose memory is valid as their shape, strides and device describe; `opts` is
/// NULL or points to `struct_size` readable bytes; `stats` is NULL or points to `struct_size`
/// writable bytes.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // the C signature: one argument per tensor
pub unsafe extern "C" fn strata_lookup_pooled(
    table: *mut strata_table,
    keys: *const DLTensor,
    offsets: *const DLTensor,
    weights: *const DLTensor,
    pooling: i32,
    out: *mut DLTensor,
    opts: *const strata_lookup_options,
    stats: *mut strata_lookup_stats,
) -> Status {
    boundary(|| {
        // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
        let table = unsafe { table_arg(table, "table") }?;
        // (On a distributed table the other ranks learn of a bad argument here.)
        // SAFETY: the pointers are NULL or valid, as this export's # Safety section requires.
        let (r, opts, stats) =
            unsafe { pooled_args(keys, offsets, weights, pooling, out, opts, stats) }.map_err(|e| table.refuse(Call::Pooled, e))?;
        write_stats(stats, table.lookup_request(&r, &opts)?);
        Ok(())
    })
}

/// The arguments of `strata_lookup_pooled` besides the table, checked in the order the errors
/// are reported: the tensors' NULL checks, `pooling`, `opts`, `stats`.
///
/// # Safety
/// As for `strata_lookup_pooled`, for `'a`.
#[allow(clippy::type_complexity, clippy::too_many_arguments)] // the C call's arguments, one each
unsafe fn pooled_args<'a>(
    keys: *const DLTensor,
    offsets: *const DLTensor,
    weights: *const DLTensor,
    pooling: i32,
    out: *mut DLTensor,
    opts: *const strata_lookup_options,
    stats: *mut strata_lookup_stats,
) -> Result<(Request<'a>, LookupOptions, Option<OutStruct<strata_lookup_stats>>)> {
    // SAFETY: `keys` and `out` are NULL or valid, as the caller guarantees.
    let (keys, out) = unsafe { (arg_ref(keys, "keys")?, arg_ref(out, "out")?) };
    let pooling = Pooling::required(pooling_of(pooling, "pooling")?, "pooling")?;
    // SAFETY: `opts` is NULL or valid, and its stream NULL or live, as the caller guarantees.
    let opts = unsafe { read_in(opts, "opts")?.core() };
    // SAFETY: `stats` is NULL or valid, as the caller guarantees.
    let stats = unsafe { out_struct(stats, "stats") }?;
    // SAFETY: `offsets` and `weights` are NULL or valid, and every tensor valid for 'a, as the
    // caller guarantees.
    let r = unsafe { Request::new(keys, opt_ref(offsets), opt_ref(weights), Some(pooling), out, stats.is_some()) };
    Ok((r, opts, stats))
}

impl strata_lookup_request {
    /// This request as the core's, with its stats out-struct: the table and tensors NULL-checked,
    /// `pooling` known, `offsets` and `weights` only with a pooling. An error names the field.
    ///
    /// # Safety
    /// The request's pointers must be NULL or valid for `'a`, as `strata_lookup_batch` requires.
    unsafe fn read<'a>(&self) -> Result<(BatchRequest<'a>, Option<OutStruct<strata_lookup_stats>>)> {
        // SAFETY: the pointers are NULL or valid, as the caller guarantees.
        let (table, keys, out, offsets, weights, stats) = unsafe {
            (
                table_arg(self.table, "table")?,
                arg_ref(self.keys, "keys")?,
                arg_ref(self.out, "out")?,
                opt_ref(self.offsets),
                opt_ref(self.weights),
                out_struct(self.stats, "stats")?,
            )
        };
        let pooling = pooling_of(self.pooling, "pooling")?;
        // SAFETY: every tensor is NULL-checked and valid, as the caller guarantees.
        let request = unsafe { Request::new(keys, offsets, weights, pooling, out, stats.is_some()) };
        request.fields_agree()?;
        Ok((BatchRequest { table, request }, stats))
    }
}

/// Runs `n` lookups, plain or pooled, on tables of any dims and dtypes, as one piece of work:
/// the results equal `n` separate `strata_lookup` / `strata_lookup_pooled` calls. On the CPU
/// the batch is one dispatch (a batch of many small requests costs about one call); every
/// request is validated before any output is written, and an error names the request
/// (`requests[7].keys: ...`): the fields of every request (`struct_size`, NULL pointers,
/// `pooling`) are checked first, then the tensors of every request, each pass in order.
/// `opts` applies to every request. A request on a distributed table
/// makes the call collective: every rank passes the same tables in the same order. `n = 0` is
/// a no-op. A rank that refuses a collective batch before it can read any of its distributed
/// tables (an unreadable request array, or a NULL table where the other ranks pass a
/// distributed one) still fails every rank, naming itself, when the process's distributed
/// tables were all built over one group of ranks; such a refused batch is then taken to be
/// collective on that group (a batch of local tables only, refused that way, waits for the
/// other ranks' next collective batch).
///
/// Ownership: borrows the requests and their tensors for the call only.
///
/// # Safety
/// `requests` is NULL (only with `n = 0`) or points to `n` requests, each `requests[0].struct_size`
/// bytes, whose pointers are NULL or valid as in `strata_lookup_pooled`; `opts` is NULL or points
/// to `struct_size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_lookup_batch(
    requests: *const strata_lookup_request,
    n: usize,
    opts: *const strata_lookup_options,
) -> Status {
    boundary(|| {
        // SAFETY: the pointers are NULL or valid, as this export's # Safety section requires.
        let (batch, stats, opts) = unsafe { batch_args(requests, n, opts) }?;
        let found = crate::table::lookup_batch(&batch, &opts)?;
        stats.into_iter().zip(found).for_each(|(s, f)| write_stats(s, f));
        Ok(())
    })
}

/// The arguments of `strata_lookup_batch`, checked in the order the errors are reported: the
/// array, `opts`, then each request's fields. A refused argument fails a collective batch on
/// every rank: the other ranks wait in the batch's first agreement ([`crate::dist::refuse_batch`],
/// given the tables this rank can read; an unreadable array names none).
///
/// # Safety
/// As for `strata_lookup_batch`, for `'a`.
#[allow(clippy::type_complexity)] // the requests, their stats and the options, as the export takes them
unsafe fn batch_args<'a>(
    requests: *const strata_lookup_request,
    n: usize,
    opts: *const strata_lookup_options,
) -> Result<(Vec<BatchRequest<'a>>, Vec<Option<OutStruct<strata_lookup_stats>>>, LookupOptions)> {
    use crate::dist::refuse_batch;
    if n > 0 && requests.is_null() {
        return Err(refuse_batch([], Error::Null { arg: "requests" }));
    }
    // SAFETY: `requests` points to n requests, as the caller guarantees.
    let list = unsafe { in_array(requests, n, "requests", "requests") }.map_err(|e| refuse_batch([], e))?;
    // SAFETY: each request's table is NULL or a live handle, as the caller guarantees.
    let readable = (0..n).filter_map(|i| list.get(i).ok().and_then(|r| unsafe { table_arg(r.table, "table") }.ok()));
    let refuse = |e: Error| refuse_batch(readable.clone(), e);
    // SAFETY: `opts` is NULL or valid, and its stream NULL or live, as the caller guarantees.
    let opts = unsafe { read_in(opts, "opts").map_err(&refuse)?.core() };
    let (mut batch, mut stats) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        // SAFETY: the request's pointers are NULL or valid, as the caller guarantees.
        let (request, s) = unsafe { list.get(i).map_err(&refuse)?.read() }.map_err(|e| refuse(e.within(format!("requests[{i}]."))))?;
        batch.push(request);
        stats.push(s);
    }
    Ok((batch, stats, opts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::sized::Extensible;
    use std::mem::offset_of;

    /// The first published layouts (strata 0.3), frozen: fields are only ever appended.
    #[test]
    fn first_published_layouts_are_frozen() {
        assert_eq!([offset_of!(strata_lookup_options, stream), offset_of!(strata_lookup_options, num_threads)], [8, 16]);
        assert_eq!(
            [
                offset_of!(strata_lookup_stats, hits),
                offset_of!(strata_lookup_stats, misses),
                offset_of!(strata_lookup_stats, volatile_hits),
                offset_of!(strata_lookup_stats, persistent_hits),
            ],
            [8, 16, 24, 32]
        );
        assert_eq!(strata_lookup_options::FIRST_SIZE, 24);
        assert_eq!(strata_lookup_stats::FIRST_SIZE, 40);
        assert_eq!(size_of::<strata_lookup_options>(), 24);
        assert_eq!(size_of::<strata_lookup_stats>(), 40);
    }
}
