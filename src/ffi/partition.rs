//! The `__partitioned__` protocol in C: its structs (`strata_partitioned`, `strata_partition`,
//! `strata_partition_location`, `strata_partition_get_fn`, each starting with `size_t
//! struct_size`, see [`super::sized`]) and their initialisers; the conversion of a C description
//! into the core's [`Description`], and of the core's [`TableDescription`] into the C
//! description strata hands out ([`OwnedPartitioned`]); the exports: validation, tables from
//! descriptions, descriptions of tables, tables spread over MPI ranks.
//!
//! A C description borrows everything: a `strata_partitioned` and what it points to must stay
//! valid for the call it is passed to. `desc->partitions` and each partition's `locations` are
//! arrays of extensible structs, strided by their elements' `struct_size`.

use super::boundary::{arg_ref, boundary, c_path, opt_ref, out_handle};
use super::handle::boxed;
use super::sized::{Extensible, in_array};
use super::status::Status;
use super::table::{strata_table, strata_table_options, table_arg, table_options};
use crate::error::{Error, Result};
use crate::partition::{Description, Location, PartData, PartDesc, TableDescription, grid_len, part_name, validate};
use dlpark::ffi::DLTensor;
use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::{null, null_mut};

/// Resolves a partition's `handle` into its local data, or NULL when it is not local.
pub type strata_partition_get_fn = Option<unsafe extern "C" fn(user: *mut c_void, handle: *mut c_void) -> *const DLTensor>;

/// A `__partitioned__` description. Initialise with `strata_partitioned_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct strata_partitioned {
    /// `sizeof(strata_partitioned)`, set by `strata_partitioned_default()`.
    pub struct_size: usize,
    pub ndim: i32,
    /// The global shape, `ndim` sizes.
    pub shape: *const i64,
    /// Partitions per dimension, `ndim` counts (each >= 1).
    pub partition_tiling: *const i64,
    /// One entry per grid position, row-major over the grid (`prod(partition_tiling)` entries),
    /// strided by their `struct_size`, which every entry must carry alike.
    pub partitions: *const strata_partition,
    /// Grid positions owned by this process (SPMD): `num_locals * ndim` indices, or NULL when
    /// every partition with data is local.
    pub locals: *const i64,
    pub num_locals: i32,
    /// Turns a partition's `handle` into its data; may be NULL when every `data` is given.
    pub get: strata_partition_get_fn,
    /// Passed to `get` as `user`.
    pub get_user: *mut c_void,
}

impl Default for strata_partitioned {
    fn default() -> Self {
        strata_partitioned {
            struct_size: size_of::<Self>(),
            ndim: 0,
            shape: null(),
            partition_tiling: null(),
            partitions: null(),
            locals: null(),
            num_locals: 0,
            get: None,
            get_user: null_mut(),
        }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern (the function
// pointer is an Option, NULL being None).
unsafe impl Extensible for strata_partitioned {
    const NAME: &'static str = "strata_partitioned";
    const FIRST_SIZE: usize = 72;
}

/// A `strata_partitioned` with `struct_size = sizeof(strata_partitioned)` and every other field
/// 0 or NULL: fill in `ndim`, `shape`, `partition_tiling` and `partitions` (and `locals`, `get`
/// as needed).
#[unsafe(no_mangle)]
pub extern "C" fn strata_partitioned_default() -> strata_partitioned {
    strata_partitioned::default()
}

/// One grid position of a `strata_partitioned`. Initialise with `strata_partition_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct strata_partition {
    /// `sizeof(strata_partition)`, set by `strata_partition_default()`; the same in every
    /// element of `partitions` (its stride).
    pub struct_size: usize,
    /// `ndim` offsets of the partition in the global array.
    pub start: *const i64,
    /// `ndim` sizes of the partition.
    pub shape: *const i64,
    /// The partition's data when it is local and given as a DLPack tensor; else NULL.
    pub data: *const DLTensor,
    /// An opaque handle resolved through the description's `get` when `data` is NULL (may be NULL
    /// for partitions that are not local).
    pub handle: *mut c_void,
    /// Owners of the partition: one for a plain partition, several for a replicated one; an
    /// array of `num_locations` elements strided by their `struct_size`.
    pub locations: *const strata_partition_location,
    pub num_locations: i32,
}

impl Default for strata_partition {
    fn default() -> Self {
        strata_partition {
            struct_size: size_of::<Self>(),
            start: null(),
            shape: null(),
            data: null(),
            handle: null_mut(),
            locations: null(),
            num_locations: 0,
        }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_partition {
    const NAME: &'static str = "strata_partition";
    const FIRST_SIZE: usize = 56;
}

/// A `strata_partition` with `struct_size = sizeof(strata_partition)` and every other field 0
/// or NULL. Every element of one `partitions` array must carry the same `struct_size` (the
/// array's stride): initialise each with this function.
#[unsafe(no_mangle)]
pub extern "C" fn strata_partition_default() -> strata_partition {
    strata_partition::default()
}

/// Where a partition lives (an in-struct, and an out-struct of `strata_table_partitioned`): an
/// MPI rank (Heat's `location`), and optionally the host, process and device of the latest
/// draft's `(ip, pid, device)` tuples. Initialise with `strata_partition_location_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct strata_partition_location {
    /// `sizeof(strata_partition_location)`, set by `strata_partition_location_default()`; the
    /// same in every element of one `locations` array (its stride).
    pub struct_size: usize,
    /// MPI rank in the communicator the description belongs to; -1 (the default) when not given.
    pub rank: i32,
    /// Device ordinal, or -1 (the default) for host memory.
    pub device_id: i32,
    /// Process id, or 0 (the default) when not given.
    pub pid: i64,
    /// Host name or address (NUL-terminated), or NULL (the default).
    pub host: *const c_char,
}

impl Default for strata_partition_location {
    fn default() -> Self {
        strata_partition_location { struct_size: size_of::<Self>(), rank: -1, device_id: -1, pid: 0, host: null() }
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_partition_location {
    const NAME: &'static str = "strata_partition_location";
    const FIRST_SIZE: usize = 32;
}

/// A `strata_partition_location` with `struct_size = sizeof(strata_partition_location)`, `rank`
/// -1 (not given), `device_id` -1 (host memory), `pid` 0 and `host` NULL. Every element of one
/// `locations` array must carry the same `struct_size`: initialise each with this function.
#[unsafe(no_mangle)]
pub extern "C" fn strata_partition_location_default() -> strata_partition_location {
    strata_partition_location::default()
}

/// Reads `n` int64 values at `p`; `what` names them in errors ("shape is NULL; expected 2
/// values").
///
/// # Safety
/// `p` must be NULL or point to `n` readable values.
unsafe fn values(p: *const i64, n: usize, what: &str) -> Result<Vec<i64>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(Error::invalid("desc", format!("{what} is NULL; expected {n} values")));
    }
    // SAFETY: the caller vouches for n readable values at p, which is not NULL.
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
}

/// Converts a C description into the core's [`Description`]: reads `desc` and every array it
/// points to (checking each struct's `struct_size` and each array's stride), and wraps `get` as
/// a closure the core calls on local handles only. The protocol's rules are the core's to check
/// ([`crate::partition::validate`]); only what reading needs is checked here: `ndim`, the
/// pointers, the counts, and the global shape and tiling (which say how many partitions to read).
///
/// # Safety
/// `desc` must be NULL or it and everything it points to must be readable as documented on
/// [`strata_partitioned`] for `'a`; `get`, when given, must be callable with `get_user` and the
/// entries' handles.
pub(crate) unsafe fn description<'a>(desc: *const strata_partitioned) -> Result<Description<'a>> {
    if desc.is_null() {
        return Err(Error::Null { arg: "desc" });
    }
    // SAFETY: the caller vouches for `struct_size` readable bytes at desc.
    let d = unsafe { super::sized::read_in(desc, "desc") }?;
    if d.ndim < 1 {
        return Err(Error::invalid("desc", format!("ndim = {}; expected at least 1", d.ndim)));
    }
    let nd = d.ndim as usize;
    // SAFETY (values): the caller vouches for ndim values at each array pointer.
    // SAFETY: `d.shape` is NULL or points to the values the description promises (this export's # Safety section).
    let shape = unsafe { values(d.shape, nd, "shape") }?;
    // SAFETY: `d.partition_tiling` is NULL or points to the values the description promises (this export's # Safety section).
    let tiling = unsafe { values(d.partition_tiling, nd, "partition_tiling") }?;
    let count = grid_len(&shape, &tiling)?;
    if d.partitions.is_null() {
        return Err(Error::Null { arg: "desc->partitions" });
    }
    // SAFETY: the caller vouches for prod(partition_tiling) entries at partitions.
    let entries = unsafe { in_array(d.partitions, count, "desc", "partitions") }?;
    let mut parts = Vec::with_capacity(count);
    for idx in 0..entries.len() {
        let e = entries.get(idx)?;
        let name = part_name(idx, &tiling);
        // SAFETY (values): the caller vouches for ndim values at start and shape.
        // SAFETY: `e.start` is NULL or points to the values the description promises (this export's # Safety section).
        let start = unsafe { values(e.start, nd, &format!("{name}: start")) }?;
        // SAFETY: `e.shape` is NULL or points to the values the description promises (this export's # Safety section).
        let pshape = unsafe { values(e.shape, nd, &format!("{name}: shape")) }?;
        let mut locations = Vec::new();
        if e.num_locations > 0 && !e.locations.is_null() {
            let n = e.num_locations as usize;
            // SAFETY: the caller vouches for num_locations locations at e.locations.
            let locs = unsafe { in_array(e.locations, n, "desc", &format!("partitions[{idx}].locations")) }?;
            for i in 0..n {
                let l = locs.get(i)?;
                // SAFETY: the caller vouches for NULL or a NUL-terminated host name.
                let host = (!l.host.is_null()).then(|| unsafe { CStr::from_ptr(l.host) }.to_string_lossy().into_owned());
                locations.push(Location { rank: l.rank, device_id: l.device_id, pid: l.pid, host });
            }
        }
        let data = if !e.data.is_null() {
            // SAFETY: the caller vouches for a readable DLTensor at data.
            PartData::Tensor(unsafe { &*e.data })
        } else if !e.handle.is_null() {
            PartData::Handle(e.handle)
        } else {
            PartData::Absent
        };
        parts.push(PartDesc { start, shape: pshape, data, locations });
    }
    if d.num_locals < 0 || (d.num_locals > 0 && d.locals.is_null()) || (d.num_locals == 0 && !d.locals.is_null()) {
        return Err(Error::invalid(
            "desc",
            format!(
                "locals is {} with num_locals = {}; expected NULL with 0, or num_locals > 0 grid positions",
                if d.locals.is_null() { "NULL" } else { "given" },
                d.num_locals
            ),
        ));
    }
    let locals = if d.locals.is_null() {
        None
    } else {
        // SAFETY: the caller vouches for num_locals * ndim values at locals.
        let flat = unsafe { values(d.locals, d.num_locals as usize * nd, "locals") }?;
        Some(flat.chunks(nd).map(<[i64]>::to_vec).collect())
    };
    let (get, user) = (d.get, d.get_user);
    let get = get.map(|f| {
        Box::new(move |handle: *mut c_void| {
            // SAFETY: the caller's callback, with its user pointer and one of its handles; it
            // returns NULL or a tensor readable for the call.
            unsafe { f(user, handle).as_ref() }
        }) as Box<dyn Fn(*mut c_void) -> Option<&'a DLTensor> + 'a>
    });
    Ok(Description { shape, tiling, parts, locals, get })
}

/// A description strata made of one of its tables (`strata_table_partitioned`), with the
/// storage its pointers point into.
#[repr(C)]
pub(crate) struct OwnedPartitioned {
    /// What the C caller sees; must stay the first field (the pointer handed out is to it).
    desc: strata_partitioned,
    // Never resized after the pointers into them are taken.
    _shape: Vec<i64>,
    _tiling: Vec<i64>,
    _starts: Vec<Vec<i64>>,
    _shapes: Vec<Vec<i64>>,
    _strides: Vec<Vec<i64>>,
    _hosts: Vec<CString>,
    _data: Vec<DLTensor>,
    _locations: Vec<Vec<strata_partition_location>>,
    _partitions: Vec<strata_partition>,
}

/// The `get` of the descriptions strata makes: each local partition's handle is its `data`.
unsafe extern "C" fn get_local(_user: *mut c_void, handle: *mut c_void) -> *const DLTensor {
    handle as *const DLTensor
}

impl OwnedPartitioned {
    /// Lays a description out in C: local partitions carry their view as `data`, and the same
    /// through `handle` and `get`; other partitions carry neither.
    pub(crate) fn new(t: TableDescription) -> Box<Self> {
        let n = t.parts.len();
        let mut o = Box::new(OwnedPartitioned {
            desc: strata_partitioned { ndim: t.shape.len() as i32, get: Some(get_local), ..Default::default() },
            _shape: t.shape,
            _tiling: t.tiling,
            _starts: t.parts.iter().map(|p| p.start.clone()).collect(),
            _shapes: t.parts.iter().map(|p| p.shape.clone()).collect(),
            _strides: t.parts.iter().map(|p| p.data.as_ref().map_or_else(Vec::new, |v| v.strides.clone())).collect(),
            _hosts: Vec::new(),
            _data: Vec::with_capacity(n),
            _locations: Vec::with_capacity(n),
            _partitions: Vec::with_capacity(n),
        });
        // First every tensor and location (`_data` and `_locations` are not pushed to once a
        // pointer into them is taken) ...
        let mut data_index = Vec::with_capacity(n);
        for (i, p) in t.parts.iter().enumerate() {
            data_index.push(p.data.as_ref().map(|v| {
                let tensor = DLTensor {
                    data: v.ptr,
                    device: v.device,
                    ndim: o._shapes[i].len() as i32,
                    dtype: v.dtype,
                    shape: o._shapes[i].as_mut_ptr(),
                    strides: o._strides[i].as_mut_ptr(),
                    byte_offset: 0,
                };
                o._data.push(tensor);
                o._data.len() - 1
            }));
            let mut locations = Vec::with_capacity(p.locations.len());
            for l in &p.locations {
                let host = match &l.host {
                    Some(h) => {
                        o._hosts.push(CString::new(h.replace('\0', " ")).unwrap_or_default());
                        o._hosts.last().expect("just pushed").as_ptr()
                    }
                    None => null(),
                };
                locations.push(strata_partition_location { rank: l.rank, device_id: l.device_id, pid: l.pid, host, ..Default::default() });
            }
            o._locations.push(locations);
        }
        // ... then the partitions that point into them.
        for (i, di) in data_index.into_iter().enumerate() {
            let data = di.map_or(null(), |k| &o._data[k] as *const DLTensor);
            let entry = strata_partition {
                start: o._starts[i].as_ptr(),
                shape: o._shapes[i].as_ptr(),
                data,
                handle: data as *mut c_void,
                locations: o._locations[i].as_ptr(),
                num_locations: o._locations[i].len() as i32,
                ..Default::default()
            };
            o._partitions.push(entry);
        }
        o.desc.shape = o._shape.as_ptr();
        o.desc.partition_tiling = o._tiling.as_ptr();
        o.desc.partitions = o._partitions.as_ptr();
        o
    }

    /// Hands the description to C; [`OwnedPartitioned::free`] takes it back.
    pub(crate) fn into_raw(self: Box<Self>) -> *mut strata_partitioned {
        // The description is the first field of a repr(C) struct: the same address.
        Box::into_raw(self) as *mut strata_partitioned
    }

    /// Frees a description made by [`OwnedPartitioned::into_raw`].
    ///
    /// # Safety
    /// `p` must come from [`OwnedPartitioned::into_raw`] and not have been freed.
    pub(crate) unsafe fn free(p: *mut strata_partitioned) {
        // SAFETY: made by into_raw from a Box<OwnedPartitioned>, whose first field (repr(C)) is
        // the description handed out.
        drop(unsafe { Box::from_raw(p as *mut OwnedPartitioned) });
    }
}

/// Checks a `__partitioned__` description against every rule of the protocol: at least one
/// partition per dimension, one partition per grid position, starts and shapes inside the global
/// shape, partitions that tile it exactly (no gap, no overlap; replication is one partition with
/// several locations), at least one location each, the same kind of `data` in every entry (a
/// `get` callback when they are handles), `locals` inside the grid and holding data, and local
/// data agreeing with its partition's shape and with the other partitions' dtype. A violation is
/// `STRATA_INVALID_ARGUMENT` naming the grid position and the rule, e.g.
/// "partition (2,0): start[0]+shape[0] = 31 exceeds shape[0] = 27". Every struct's `struct_size`
/// is checked too (an older size reads defaults for the fields it lacks); the elements of
/// `partitions`, and those of each `locations`, are `struct_size` bytes apart and must all carry
/// the same one. Borrows `desc` for the call; calls `get` on local handles.
///
/// # Safety
/// `desc` is NULL or points to `struct_size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_partitioned_validate(desc: *const strata_partitioned) -> Status {
    boundary(|| {
        // whose tensors (and get's) are valid DLPack tensors for the call.
        // SAFETY: `desc` is NULL or valid as this export's # Safety section requires.
        let d = unsafe { description(desc) }?;
        // SAFETY: the description and the data it points to are valid for the call, as this export's # Safety section requires.
        unsafe { validate(d) }?;
        Ok(())
    })
}

/// Builds a dense table (key = global row number) from a [rows, dim] description split along
/// rows (tiling (P, 1); (1, 1) and replicated partitions too).
///
/// `comm` NULL: a single process holding every partition. Ownership: a single partition
/// (tiling (1, 1), or one replicated partition) whose rows have unit element stride and are at
/// least `dim` elements apart is borrowed without a copy: its memory must stay valid and unchanged
/// until `strata_table_free`. Otherwise the partitions are copied into one table (and may be
/// freed after the call).
///
/// `comm` non-NULL: points to an MPI communicator as an `MPI_Fint` (`MPI_Comm_c2f(comm)`,
/// mpi4py's `comm.py2f()`); the table is spread over its ranks. Collective: every rank of
/// `comm` must call it, each passing the same shape, tiling, starts and shapes, with data for
/// the partitions it holds: those whose locations list that rank, or that its `locals` list (and
/// only those). The owners of a partition are the union of what the ranks say: every rank its
/// locations name on any rank, and every rank holding it (so Heat's replicated arrays, described
/// on every rank with a single location and `locals` [(0, 0)], are replicated on every rank);
/// each owner must hold the data. strata duplicates `comm` (the caller keeps its own) and frees
/// the duplicate in `strata_table_free`, which is then collective too (call it before
/// `MPI_Finalize`); it never initialises or finalises MPI, which must be initialised. Each local
/// partition is borrowed under the same rule as above, else copied. A description that is
/// invalid on one rank fails the call on every rank: that rank reports its own error, the others
/// `rank R failed the collective call: ...` with its status and message. Descriptions that
/// differ between ranks (shape, tiling, starts, shapes, dtype, options) fail on every rank with
/// one message naming the rank that differs from most and quoting its values beside theirs:
/// "partition (2,0): start[0] = 14, shape[0] = 7 on rank 0 but start[0] = 14, shape[0] = 6 on
/// rank 3". `strata_lookup` on the table is collective. A build without the `mpi` feature
/// answers `STRATA_UNSUPPORTED_DEVICE` (see `strata_mpi_available`).
///
/// # Safety
/// `desc` is NULL or points to `struct_size` readable bytes; `comm` is NULL or readable; `opts` is
/// NULL or points to `struct_size` readable bytes; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_from_partitioned(
    desc: *const strata_partitioned,
    comm: *const i32,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // borrowed partitions alive and unchanged until strata_table_free.
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `comm` is NULL or valid as this export's # Safety section requires.
        let comm = unsafe { opt_ref(comm) }.copied();
        // Errors reading the description or the options are the core's to report: with a
        // communicator every rank learns of them in the collective call.
        // SAFETY: `desc` is NULL or valid as this export's # Safety section requires.
        let desc = unsafe { description(desc) };
        // SAFETY: `opts` is NULL or valid as this export's # Safety section requires.
        let options = unsafe { table_options(opts) };
        // SAFETY: the description and the data it points to are valid for the call, as this export's # Safety section requires.
        let table = unsafe { crate::dist::table_from_description(desc, comm, options) }?;
        *out = boxed(table);
        Ok(())
    })
}

/// Opens a HugeCTR sparse folder (as `strata_table_open`) as one table spread over the ranks of
/// `comm` (a pointer to an `MPI_Fint`, as in `strata_table_from_partitioned`): each rank keeps
/// the rows whose keys hash to it, copied out of the mapped files (only those rows' pages of
/// `emb_vector` are read; every rank reads `key`). Collective: every rank must call it, with the
/// same folder contents, `dim` and options; an error on one rank (a missing file, a duplicate
/// key) fails the call on every rank. The table is keyed; `strata_lookup` on it is collective.
/// Ownership: nothing is borrowed after the call; the communicator is duplicated as in
/// `strata_table_from_partitioned`. A build without the `mpi` feature answers
/// `STRATA_UNSUPPORTED_DEVICE`.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated string; `comm` is NULL or readable; `opts` is NULL or points
/// to `struct_size` readable bytes; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_open_distributed(
    dir: *const c_char,
    dim: i64,
    comm: *const i32,
    opts: *const strata_table_options,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `dir` is NULL or valid as this export's # Safety section requires.
        let dir = unsafe { c_path(dir, "dir") }?;
        // SAFETY: `comm` is NULL or valid as this export's # Safety section requires.
        let fint = *unsafe { arg_ref(comm, "comm") }?;
        // An error reading the options fails the collective call on every rank.
        // SAFETY: `opts` is NULL or valid as this export's # Safety section requires.
        let options = unsafe { table_options(opts) };
        *out = boxed(crate::dist::open(dir, dim, fint, options)?);
        Ok(())
    })
}

/// Describes a dense table with the protocol: shape [rows, dim], tiling (1, 1), one partition
/// owned by rank 0 whose `data` is a DLPack view of the table's vectors and whose `handle`
/// resolves to the same through `get` (which returns NULL for nothing else). A dense
/// distributed table is described as it is spread: tiling (P, 1), each partition's locations
/// the ranks that hold it, `data` and `handle` only for this rank's partitions (NULL for the
/// others, for which `get` returns NULL); it is not collective. Ownership: `*out`
/// is owned by strata, valid while the table lives, and freed with `strata_partitioned_free`.
/// Keyed and server tables have no such view (`STRATA_INVALID_ARGUMENT`).
///
/// # Safety
/// `table` is NULL or a live table handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_partitioned(table: *const strata_table, out: *mut *mut strata_partitioned) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
        let t = unsafe { table_arg(table, "table") }?;
        *out = OwnedPartitioned::new(t.describe()?).into_raw();
        Ok(())
    })
}

/// Frees a description from `strata_table_partitioned`. NULL is a no-op.
///
/// # Safety
/// `desc` is NULL or points to `struct_size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_partitioned_free(desc: *mut strata_partitioned) {
    boundary(|| {
        if !desc.is_null() {
            // SAFETY: the caller passes a description from strata_table_partitioned, once.
            unsafe { OwnedPartitioned::free(desc) };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The first published layouts (strata 0.3), frozen: fields are only ever appended.
    #[test]
    fn first_published_layouts_are_frozen() {
        assert_eq!(
            [
                offset_of!(strata_partition_location, struct_size),
                offset_of!(strata_partition_location, rank),
                offset_of!(strata_partition_location, device_id),
                offset_of!(strata_partition_location, pid),
                offset_of!(strata_partition_location, host),
            ],
            [0, 8, 12, 16, 24]
        );
        assert_eq!(
            [
                offset_of!(strata_partition, struct_size),
                offset_of!(strata_partition, start),
                offset_of!(strata_partition, shape),
                offset_of!(strata_partition, data),
                offset_of!(strata_partition, handle),
                offset_of!(strata_partition, locations),
                offset_of!(strata_partition, num_locations),
            ],
            [0, 8, 16, 24, 32, 40, 48]
        );
        assert_eq!(
            [
                offset_of!(strata_partitioned, struct_size),
                offset_of!(strata_partitioned, ndim),
                offset_of!(strata_partitioned, shape),
                offset_of!(strata_partitioned, partition_tiling),
                offset_of!(strata_partitioned, partitions),
                offset_of!(strata_partitioned, locals),
                offset_of!(strata_partitioned, num_locals),
                offset_of!(strata_partitioned, get),
                offset_of!(strata_partitioned, get_user),
            ],
            [0, 8, 16, 24, 32, 40, 48, 56, 64]
        );
        fn first<T: Extensible>() -> usize {
            T::FIRST_SIZE
        }
        assert_eq!(first::<strata_partition_location>(), 32);
        assert_eq!(first::<strata_partition>(), 56);
        assert_eq!(first::<strata_partitioned>(), 72);
        assert_eq!(size_of::<strata_partition_location>(), 32);
        assert_eq!(size_of::<strata_partition>(), 56);
        assert_eq!(size_of::<strata_partitioned>(), 72);
    }

    #[test]
    fn defaults_set_struct_size_and_say_nothing() {
        let l = strata_partition_location::default();
        assert_eq!((l.struct_size, l.rank, l.device_id, l.pid, l.host), (32, -1, -1, 0, null()));
        let p = strata_partition::default();
        assert_eq!((p.struct_size, p.num_locations), (56, 0));
        assert!(p.start.is_null() && p.shape.is_null() && p.data.is_null() && p.handle.is_null() && p.locations.is_null());
        let d = strata_partitioned::default();
        assert_eq!((d.struct_size, d.ndim, d.num_locals), (72, 0, 0));
        assert!(d.shape.is_null() && d.partitions.is_null() && d.locals.is_null() && d.get.is_none() && d.get_user.is_null());
    }
}
