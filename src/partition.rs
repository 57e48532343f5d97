//! The `__partitioned__` protocol (IntelPython DPPY-Spec, as Heat implements it) in C: a global
//! shape split into a grid of partitions, each with its start, shape, owners and (where local)
//! data. strata validates such a description, builds tables from it, and describes its own
//! tables with it.
//!
//! The C structs borrow everything: a [`Partitioned`] and what it points to must stay valid for
//! the call it is passed to. Descriptions strata produces (`strata_table_partitioned`) are owned
//! by strata and freed with `strata_partitioned_free`.

use crate::dlpack::{FloatDtype, TensorView, dtype_name, require_host};
use crate::error::{Error, Result};
use crate::storage::store::Store;
use crate::model::{StaticTable, TableOptions};
use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType, DLTensor};
use std::ffi::{c_char, c_void};

/// Where a partition lives: an MPI rank (Heat's `location`), and optionally the host, process
/// and device of the latest draft's `(ip, pid, device)` tuples.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PartitionLocation {
    /// MPI rank in the communicator the description belongs to; -1 when not given.
    pub rank: i32,
    /// Device ordinal, or -1 for host memory.
    pub device_id: i32,
    /// Process id, or 0 when not given.
    pub pid: i64,
    /// Host name or address (NUL-terminated), or NULL.
    pub host: *const c_char,
}

/// One grid position of a [`Partitioned`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Partition {
    /// `ndim` offsets of the partition in the global array.
    pub start: *const i64,
    /// `ndim` sizes of the partition.
    pub shape: *const i64,
    /// The partition's data when it is local and given as a DLPack tensor; else NULL.
    pub data: *const DLTensor,
    /// An opaque handle resolved through the description's `get` when `data` is NULL (may be NULL
    /// for partitions that are not local).
    pub handle: *mut c_void,
    /// Owners of the partition: one for a plain partition, several for a replicated one.
    pub locations: *const PartitionLocation,
    pub num_locations: i32,
}

/// Resolves a partition's `handle` into its local data, or NULL when it is not local.
pub type PartitionGet = Option<unsafe extern "C" fn(user: *mut c_void, handle: *mut c_void) -> *const DLTensor>;

/// A `__partitioned__` description.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Partitioned {
    pub ndim: i32,
    /// The global shape, `ndim` sizes.
    pub shape: *const i64,
    /// Partitions per dimension, `ndim` counts (each >= 1).
    pub partition_tiling: *const i64,
    /// One entry per grid position, row-major over the grid (`prod(partition_tiling)` entries).
    pub partitions: *const Partition,
    /// Grid positions owned by this process (SPMD): `num_locals * ndim` indices, or NULL when
    /// every partition with data is local.
    pub locals: *const i64,
    pub num_locals: i32,
    /// Turns a partition's `handle` into its data; may be NULL when every `data` is given.
    pub get: PartitionGet,
    /// Passed to `get` as `user`.
    pub get_user: *mut c_void,
}

/// A validated description, in plain Rust.
pub(crate) struct Layout {
    pub shape: Vec<usize>,
    pub tiling: Vec<usize>,
    /// Per grid position: start, shape and its local data (if resolved).
    pub parts: Vec<Part>,
}

pub(crate) struct Part {
    pub grid: Vec<usize>,
    pub start: Vec<usize>,
    pub shape: Vec<usize>,
    pub data: Option<TensorView>,
}

/// How messages name a grid position: `partition (2,0)`.
pub(crate) fn grid_name(g: &[usize]) -> String {
    let inner: Vec<String> = g.iter().map(|x| x.to_string()).collect();
    format!("partition ({})", inner.join(","))
}

/// Puts a partition's name before an error about its data, keeping the error's status.
fn in_partition(e: Error, name: &str) -> Error {
    match e {
        Error::Layout { arg, msg } => Error::Layout { arg, msg: format!("{name}: data: {msg}") },
        Error::Null { arg } => Error::invalid(arg, format!("{name}: data: a required pointer is NULL")),
        Error::Dtype { arg, got, expected } => Error::Dtype { arg, got: format!("{got} in {name}"), expected },
        Error::Invalid { arg, msg } => Error::Invalid { arg, msg: format!("{name}: data: {msg}") },
        other => Error::invalid("desc", format!("{name}: data: {other}")),
    }
}

/// Reads `n` i64 values at `p` as sizes or offsets; `what` names them in errors.
unsafe fn sizes(p: *const i64, n: usize, what: &str) -> Result<Vec<usize>> {
    if n > 0 && p.is_null() {
        return Err(Error::invalid("desc", format!("{what} is NULL; expected {n} values")));
    }
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let x = unsafe { *p.add(i) };
        if x < 0 {
            return Err(Error::invalid("desc", format!("{what}[{i}] = {x}; expected a non-negative value")));
        }
        v.push(x as usize);
    }
    Ok(v)
}

/// Checks every rule of the protocol and resolves local data: see `strata_partitioned_validate`.
///
/// # Safety
/// `d` and everything it points to must be readable as documented on [`Partitioned`].
pub(crate) unsafe fn validate(d: &Partitioned) -> Result<Layout> {
    if d.ndim < 1 {
        return Err(Error::invalid("desc", format!("ndim = {}; expected at least 1", d.ndim)));
    }
    let nd = d.ndim as usize;
    let shape = unsafe { sizes(d.shape, nd, "shape") }?;
    let tiling = unsafe { sizes(d.partition_tiling, nd, "partition_tiling") }?;
    if let Some(i) = tiling.iter().position(|&t| t == 0) {
        return Err(Error::invalid("desc", format!("partition_tiling[{i}] = 0; expected at least 1 partition per dimension")));
    }
    let count = tiling.iter().try_fold(1usize, |a, &t| a.checked_mul(t)).filter(|&c| c <= 1 << 24).ok_or_else(|| {
        Error::invalid("desc", format!("partition_tiling {tiling:?} has too many partitions"))
    })?;
    if d.partitions.is_null() {
        return Err(Error::Null { arg: "desc->partitions" });
    }
    let mut parts = Vec::with_capacity(count);
    // entries with data, with a handle: (count, first grid position)
    type Kind = (usize, Option<Vec<usize>>);
    let mut kinds: (Kind, Kind) = ((0, None), (0, None));
    for idx in 0..count {
        let mut grid = vec![0usize; nd];
        let mut rem = idx;
        for dd in (0..nd).rev() {
            grid[dd] = rem % tiling[dd];
            rem /= tiling[dd];
        }
        let name = grid_name(&grid);
        let p = unsafe { &*d.partitions.add(idx) };
        let start = unsafe { sizes(p.start, nd, &format!("{name}: start")) }?;
        let pshape = unsafe { sizes(p.shape, nd, &format!("{name}: shape")) }?;
        for dd in 0..nd {
            let end = start[dd] as u128 + pshape[dd] as u128;
            if end > shape[dd] as u128 {
                return Err(Error::invalid(
                    "desc",
                    format!("{name}: start[{dd}]+shape[{dd}] = {end} exceeds shape[{dd}] = {}", shape[dd]),
                ));
            }
        }
        if p.num_locations < 1 || p.locations.is_null() {
            return Err(Error::invalid("desc", format!("{name}: location is empty; expected at least one owner")));
        }
        if !p.data.is_null() {
            kinds.0.0 += 1;
            kinds.0.1.get_or_insert_with(|| grid.clone());
        } else if !p.handle.is_null() {
            kinds.1.0 += 1;
            kinds.1.1.get_or_insert_with(|| grid.clone());
        }
        parts.push((grid, start, pshape, p.data, p.handle));
    }
    if let ((nd_, Some(first_data)), (nh, Some(first_handle))) = (&kinds.0, &kinds.1) {
        // name the first entry of the less common kind
        let (odd, other, what, other_what) = if nh <= nd_ {
            (first_handle, first_data, "an opaque handle", "DLPack data")
        } else {
            (first_data, first_handle, "DLPack data", "an opaque handle")
        };
        return Err(Error::invalid(
            "desc",
            format!(
                "{} carries {what} but {} carries {other_what}; expected the same kind of data in every entry",
                grid_name(odd),
                grid_name(other)
            ),
        ));
    }
    if let (_, Some(first_handle)) = &kinds.1
        && d.get.is_none()
    {
        return Err(Error::invalid(
            "desc",
            format!("{} carries an opaque handle but get is NULL; expected a get callback", grid_name(first_handle)),
        ));
    }
    // Exact tiling: along each dimension, the partitions of one grid index share start and size,
    // the first starts at 0, each starts where the previous one ends, and the last ends at shape.
    for dd in 0..nd {
        let mut expect_start = 0usize;
        for i in 0..tiling[dd] {
            let mut first: Option<(usize, usize, &Vec<usize>)> = None;
            for (grid, start, pshape, ..) in parts.iter().filter(|p| p.0[dd] == i) {
                match first {
                    None => first = Some((start[dd], pshape[dd], grid)),
                    Some((s, n, g)) if s != start[dd] || n != pshape[dd] => {
                        return Err(Error::invalid(
                            "desc",
                            format!(
                                "{}: start[{dd}] = {}, shape[{dd}] = {}; expected {s} and {n} like {} in the same grid slice",
                                grid_name(grid),
                                start[dd],
                                pshape[dd],
                                grid_name(g)
                            ),
                        ));
                    }
                    _ => {}
                }
            }
            let (s, n, g) = first.expect("every grid index has partitions");
            if s != expect_start {
                let how = if s > expect_start { "leaves a gap" } else { "overlaps the previous partition" };
                return Err(Error::invalid(
                    "desc",
                    format!("{}: start[{dd}] = {s}; expected {expect_start}: it {how}", grid_name(g)),
                ));
            }
            expect_start = s + n;
        }
        if expect_start != shape[dd] {
            let last = parts.iter().find(|p| p.0[dd] == tiling[dd] - 1).map(|p| grid_name(&p.0)).unwrap_or_default();
            return Err(Error::invalid(
                "desc",
                format!(
                    "{last}: the partitions end at {expect_start} along dimension {dd}; expected shape[{dd}] = {}",
                    shape[dd]
                ),
            ));
        }
    }
    // Locals, then resolve and check local data.
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
    let locals: Option<Vec<usize>> = if d.locals.is_null() {
        None
    } else {
        let mut v = Vec::new();
        for l in 0..d.num_locals as usize {
            let pos = unsafe { sizes(d.locals.add(l * nd), nd, &format!("locals[{l}]")) }?;
            if pos.iter().zip(&tiling).any(|(p, t)| p >= t) {
                return Err(Error::invalid("desc", format!("locals[{l}] = {pos:?} is outside partition_tiling {tiling:?}")));
            }
            v.push(pos.iter().zip(&tiling).fold(0, |a, (p, t)| a * t + p));
        }
        Some(v)
    };
    let mut dtype: Option<(DLDataType, String)> = None;
    let mut out = Vec::with_capacity(count);
    for (idx, (grid, start, pshape, data, handle)) in parts.into_iter().enumerate() {
        let name = grid_name(&grid);
        let local = locals.as_ref().is_none_or(|l| l.contains(&idx));
        let tensor = if !data.is_null() {
            data
        } else if !handle.is_null() && local {
            // SAFETY: the caller's callback, with the caller's user pointer and handle.
            unsafe { (d.get.expect("checked above"))(d.get_user, handle) }
        } else {
            std::ptr::null()
        };
        if locals.is_some() && local && tensor.is_null() {
            return Err(Error::invalid("desc", format!("{name} is listed in locals but has no data; expected local data")));
        }
        let view = if tensor.is_null() {
            None
        } else {
            let v = unsafe { TensorView::new(&*tensor, "desc") }.map_err(|e| in_partition(e, &name))?;
            if v.shape != pshape {
                return Err(Error::invalid(
                    "desc",
                    format!("{name}: data has shape {:?}; expected the partition's shape {pshape:?}", v.shape),
                ));
            }
            match &dtype {
                None => dtype = Some((v.dtype, name.clone())),
                Some((dt, first)) if *dt != v.dtype => {
                    return Err(Error::invalid(
                        "desc",
                        format!("{name}: data has dtype {}; expected {} like {first}", dtype_name(v.dtype), dtype_name(*dt)),
                    ));
                }
                _ => {}
            }
            Some(v)
        };
        out.push(Part { grid, start, shape: pshape, data: view });
    }
    Ok(Layout { shape, tiling, parts: out })
}

/// Checks that a validated description is a [rows, dim] array split along rows (tiling
/// (P, 1)); returns (rows, dim).
pub(crate) fn check_row_split(layout: &Layout) -> Result<(usize, usize)> {
    if layout.shape.len() != 2 {
        return Err(Error::invalid("desc", format!("ndim = {}; expected 2 ([rows, dim])", layout.shape.len())));
    }
    if layout.tiling[1] != 1 {
        return Err(Error::invalid(
            "desc",
            format!("partition_tiling {:?} splits the columns; expected ({}, 1): tables are split along rows", layout.tiling, layout.tiling[0]),
        ));
    }
    Ok((layout.shape[0], layout.shape[1]))
}

/// Builds a single-process table from a validated [`rows, dim`] description split along rows
/// (tiling (P, 1)), every partition local. One partition (tiling (1, 1), or a replicated one)
/// with unit element stride is borrowed without a copy; several partitions are copied into one
/// table. Dense: the key of a row is its global row number.
///
/// # Safety
/// For a borrowed table, the partition's memory must stay valid and unchanged until the table
/// is freed.
pub(crate) unsafe fn table_from(layout: Layout, options: TableOptions) -> Result<StaticTable> {
    let (rows, dim) = check_row_split(&layout)?;
    let mut dtype = None;
    for p in &layout.parts {
        let Some(v) = &p.data else {
            return Err(Error::invalid(
                "desc",
                format!("{} has no local data; without a communicator every partition must be local", grid_name(&p.grid)),
            ));
        };
        require_host(v.device, "desc")?;
        dtype = Some(FloatDtype::of(v.dtype, "desc")?);
    }
    let dtype = dtype.unwrap_or(FloatDtype::F32);
    if layout.parts.len() == 1 {
        let v = layout.parts[0].data.as_ref().expect("checked above");
        // Borrowed rows are read as `dim` adjacent elements, `row stride` apart.
        let unit_columns = dim <= 1 || v.strides[1] == 1;
        let rows_apart = rows <= 1 || v.strides[0] >= dim as isize;
        if unit_columns && rows_apart {
            let rs = if rows > 1 { v.strides[0] as usize } else { dim };
            // SAFETY: validated view; the caller keeps the memory alive (documented).
            let store = unsafe { Store::borrowed(v.ptr, dtype, rows, dim, rs.max(dim)) };
            return StaticTable::dense_over(store, options);
        }
    }
    let size = dtype.size();
    let store = Store::alloc(dtype, rows, dim, |buf| {
        for p in &layout.parts {
            let v = p.data.as_ref().expect("checked above");
            for r in 0..p.shape[0] {
                for c in 0..dim {
                    let dst = ((p.start[0] + r) * dim + c) * size;
                    // SAFETY: the view validated every element.
                    let src = unsafe { std::slice::from_raw_parts(v.at(r as isize * v.strides[0] + c as isize * v.strides[1]), size) };
                    buf[dst..dst + size].copy_from_slice(src);
                }
            }
        }
    })?;
    StaticTable::dense_over(store, options)
}

/// A description strata made of one of its tables, with the storage its pointers point into.
#[repr(C)]
pub struct OwnedPartitioned {
    /// What the C caller sees; must stay the first field (the pointer handed out is to it).
    pub(crate) desc: Partitioned,
    // Never resized after the pointers into them are taken.
    _shape: [i64; 2],
    _tiling: [i64; 2],
    _starts: Vec<[i64; 2]>,
    _shapes: Vec<[i64; 2]>,
    _strides: Vec<[i64; 2]>,
    _data: Vec<DLTensor>,
    _locations: Vec<Vec<PartitionLocation>>,
    _partitions: Vec<Partition>,
}

unsafe extern "C" fn get_local(_user: *mut c_void, handle: *mut c_void) -> *const DLTensor {
    handle as *const DLTensor
}

/// One partition of a description strata makes: rows `start..start + store.rows()` (or `rows`
/// when not local), owned by `ranks`, with its vectors when this process holds them.
pub(crate) struct Described<'a> {
    pub start: usize,
    pub rows: usize,
    pub ranks: Vec<i32>,
    pub store: Option<&'a Store>,
}

/// Describes a [rows, dim] table split along rows into `parts` (in row order): local partitions
/// carry a DLPack view of their store (valid while the table lives) as `data`, and the same
/// through `handle` and `get`; other partitions carry neither.
pub(crate) fn describe_parts(rows: usize, dim: usize, parts: Vec<Described>) -> Box<OwnedPartitioned> {
    let n = parts.len();
    let mut o = Box::new(OwnedPartitioned {
        desc: Partitioned {
            ndim: 2,
            shape: std::ptr::null(),
            partition_tiling: std::ptr::null(),
            partitions: std::ptr::null(),
            locals: std::ptr::null(),
            num_locals: 0,
            get: Some(get_local),
            get_user: std::ptr::null_mut(),
        },
        _shape: [rows as i64, dim as i64],
        _tiling: [n as i64, 1],
        _starts: parts.iter().map(|p| [p.start as i64, 0]).collect(),
        _shapes: parts.iter().map(|p| [p.rows as i64, dim as i64]).collect(),
        _strides: parts.iter().map(|p| [p.store.map_or(dim, |s| s.row_stride()) as i64, 1]).collect(),
        _data: Vec::with_capacity(n),
        _locations: Vec::with_capacity(n),
        _partitions: Vec::with_capacity(n),
    });
    let pid = std::process::id() as i64;
    for (i, p) in parts.iter().enumerate() {
        let data = p.store.map(|store| {
            o._data.push(DLTensor {
                data: store.row_ptr_or_base() as *mut c_void,
                device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
                ndim: 2,
                dtype: store.dtype().dl(),
                shape: o._shapes[i].as_mut_ptr(),
                strides: o._strides[i].as_mut_ptr(),
                byte_offset: 0,
            });
            o._data.last().expect("just pushed") as *const DLTensor
        });
        let here = p.store.is_some();
        o._locations.push(
            p.ranks
                .iter()
                .map(|&rank| PartitionLocation { rank, device_id: -1, pid: if here { pid } else { 0 }, host: std::ptr::null() })
                .collect(),
        );
        let data = data.unwrap_or(std::ptr::null());
        o._partitions.push(Partition {
            start: o._starts[i].as_ptr(),
            shape: o._shapes[i].as_ptr(),
            data,
            handle: data as *mut c_void,
            locations: o._locations[i].as_ptr(),
            num_locations: p.ranks.len() as i32,
        });
    }
    o.desc.shape = o._shape.as_ptr();
    o.desc.partition_tiling = o._tiling.as_ptr();
    o.desc.partitions = o._partitions.as_ptr();
    o
}

/// Describes a dense table as one local partition (tiling (1, 1)) owned by rank 0, whose data
/// is a DLPack view of the table's vectors (valid while the table lives).
pub(crate) fn describe(t: &StaticTable) -> Result<Box<OwnedPartitioned>> {
    if t.is_keyed() {
        return Err(Error::invalid(
            "table",
            "is keyed: its rows are not positions of an array; expected a dense table (keys are row numbers)",
        ));
    }
    let store = t.store();
    let part = Described { start: 0, rows: store.rows(), ranks: vec![0], store: Some(store) };
    Ok(describe_parts(store.rows(), store.dim(), vec![part]))
}
