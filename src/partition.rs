//! The `__partitioned__` protocol (IntelPython DPPY-Spec, as Heat implements it), in plain Rust:
//! a [`Description`] of a global shape split into a grid of partitions, each with its start,
//! shape, owners and (where local) data. strata validates such a description, builds tables
//! from it, and describes its own tables with a [`TableDescription`].
//!
//! The C structs (`strata_partitioned` and the rest) live in `ffi`, which converts a C
//! description into a [`Description`] and lays a [`TableDescription`] out in C.

use crate::dlpack::{FloatDtype, TensorView, dtype_name, require_host};
use crate::error::{Error, Result};
use crate::model::{RowFormat, StaticTable, TableOptions, quantized_store_named};
use crate::storage::store::Store;
use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType, DLTensor};
use std::ffi::c_void;

/// Where a partition lives: an MPI rank (Heat's `location`), and optionally the host, process
/// and device of the latest draft's `(ip, pid, device)` tuples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// MPI rank in the communicator the description belongs to; -1 when not given.
    pub rank: i32,
    /// Device ordinal, or -1 for host memory.
    pub device_id: i32,
    /// Process id, or 0 when not given.
    pub pid: i64,
    /// Host name or address.
    pub host: Option<String>,
}

impl Location {
    /// Owned by MPI rank `rank`, in host memory, nothing else given.
    pub fn rank(rank: i32) -> Self {
        Location { rank, device_id: -1, pid: 0, host: None }
    }
}

/// A partition's data, as a description gives it.
#[derive(Debug, Clone, Copy)]
pub enum PartData<'a> {
    /// No data here (the partition is not local).
    Absent,
    /// The data as a DLPack tensor.
    Tensor(&'a DLTensor),
    /// An opaque handle the description's `get` resolves into the data when the partition is
    /// local.
    Handle(*mut c_void),
}

/// One grid position of a [`Description`].
#[derive(Debug, Clone)]
pub struct PartDesc<'a> {
    /// `ndim` offsets of the partition in the global array.
    pub start: Vec<i64>,
    /// `ndim` sizes of the partition.
    pub shape: Vec<i64>,
    pub data: PartData<'a>,
    /// Owners: one for a plain partition, several for a replicated one.
    pub locations: Vec<Location>,
}

/// Resolves a partition's handle into its local data, or `None` when it is not local.
pub type Resolve<'a> = dyn Fn(*mut c_void) -> Option<&'a DLTensor> + 'a;

/// A `__partitioned__` description, as given: nothing is checked until [`validate`].
pub struct Description<'a> {
    /// The global shape (`ndim` sizes).
    pub shape: Vec<i64>,
    /// Partitions per dimension (`ndim` counts, each >= 1).
    pub tiling: Vec<i64>,
    /// One entry per grid position, row-major over the grid (`prod(tiling)` entries).
    pub parts: Vec<PartDesc<'a>>,
    /// Grid positions owned by this process (SPMD), or `None` when every partition with data
    /// is local.
    pub locals: Option<Vec<Vec<i64>>>,
    /// Turns a partition's handle into its data; may be `None` when no entry is a handle.
    pub get: Option<Box<Resolve<'a>>>,
}

/// A validated description, in plain Rust.
pub(crate) struct Layout {
    pub shape: Vec<usize>,
    pub tiling: Vec<usize>,
    /// Per grid position: start, shape, owners and its local data (if resolved).
    pub parts: Vec<Part>,
}

pub(crate) struct Part {
    pub grid: Vec<usize>,
    pub start: Vec<usize>,
    pub shape: Vec<usize>,
    /// Read by distributed tables only.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub locations: Vec<Location>,
    pub data: Option<TensorView>,
    /// Whether the description's `locals` list it (false when it gives no `locals`).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub in_locals: bool,
}

/// How messages name a grid position: `partition (2,0)`.
pub(crate) fn grid_name(g: &[usize]) -> String {
    let inner: Vec<String> = g.iter().map(|x| x.to_string()).collect();
    format!("partition ({})", inner.join(","))
}

/// The grid position of entry `idx` of a row-major grid `tiling`.
fn grid_position(idx: usize, tiling: &[usize]) -> Vec<usize> {
    let mut grid = vec![0usize; tiling.len()];
    let mut rem = idx;
    for d in (0..tiling.len()).rev() {
        grid[d] = rem % tiling[d];
        rem /= tiling[d];
    }
    grid
}

/// How messages name entry `idx` of a description whose tiling [`grid_len`] accepted.
pub(crate) fn part_name(idx: usize, tiling: &[i64]) -> String {
    let tiling: Vec<usize> = tiling.iter().map(|&t| t.max(1) as usize).collect();
    grid_name(&grid_position(idx, &tiling))
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

/// Checks `n` values as sizes or offsets; `what` names them in errors.
fn sizes(v: &[i64], n: usize, what: &str) -> Result<Vec<usize>> {
    if v.len() != n {
        return Err(Error::invalid("desc", format!("{what} has {} values; expected {n}", v.len())));
    }
    v.iter()
        .enumerate()
        .map(|(i, &x)| usize::try_from(x).map_err(|_| Error::invalid("desc", format!("{what}[{i}] = {x}; expected a non-negative value"))))
        .collect()
}

/// The global shape and tiling, checked (ndim >= 1, non-negative sizes, at least one and not
/// too many partitions), and the number of grid positions.
fn dims(shape: &[i64], tiling: &[i64]) -> Result<(Vec<usize>, Vec<usize>, usize)> {
    if shape.is_empty() {
        return Err(Error::invalid("desc", "ndim = 0; expected at least 1"));
    }
    let nd = shape.len();
    let shape = sizes(shape, nd, "shape")?;
    let tiling = sizes(tiling, nd, "partition_tiling")?;
    if let Some(i) = tiling.iter().position(|&t| t == 0) {
        return Err(Error::invalid("desc", format!("partition_tiling[{i}] = 0; expected at least 1 partition per dimension")));
    }
    let count = tiling
        .iter()
        .try_fold(1usize, |a, &t| a.checked_mul(t))
        .filter(|&c| c <= 1 << 24)
        .ok_or_else(|| Error::invalid("desc", format!("partition_tiling {tiling:?} has too many partitions")))?;
    Ok((shape, tiling, count))
}

/// The number of grid positions of a description with this global shape and tiling (how many
/// partitions it has), after the checks of the protocol that concern them alone.
pub(crate) fn grid_len(shape: &[i64], tiling: &[i64]) -> Result<usize> {
    Ok(dims(shape, tiling)?.2)
}

/// Checks every rule of the protocol and resolves local data: see `strata_partitioned_validate`.
///
/// # Safety
/// Every tensor of `d`, and every tensor its `get` returns, must be a valid DLPack tensor whose
/// memory stays readable while the result is used.
pub(crate) unsafe fn validate(d: Description<'_>) -> Result<Layout> {
    let (shape, tiling, count) = dims(&d.shape, &d.tiling)?;
    let nd = shape.len();
    if d.parts.len() != count {
        return Err(Error::invalid(
            "desc",
            format!("{} partitions; expected one per grid position of partition_tiling {tiling:?} ({count})", d.parts.len()),
        ));
    }
    struct Checked<'a> {
        grid: Vec<usize>,
        start: Vec<usize>,
        shape: Vec<usize>,
        locations: Vec<Location>,
        data: PartData<'a>,
    }
    let mut parts = Vec::with_capacity(count);
    // entries with data, with a handle: (count, first grid position)
    type Kind = (usize, Option<Vec<usize>>);
    let mut kinds: (Kind, Kind) = ((0, None), (0, None));
    for (idx, p) in d.parts.into_iter().enumerate() {
        let grid = grid_position(idx, &tiling);
        let name = grid_name(&grid);
        let start = sizes(&p.start, nd, &format!("{name}: start"))?;
        let pshape = sizes(&p.shape, nd, &format!("{name}: shape"))?;
        for dd in 0..nd {
            let end = start[dd] as u128 + pshape[dd] as u128;
            if end > shape[dd] as u128 {
                return Err(Error::invalid("desc", format!("{name}: start[{dd}]+shape[{dd}] = {end} exceeds shape[{dd}] = {}", shape[dd])));
            }
        }
        if p.locations.is_empty() {
            return Err(Error::invalid("desc", format!("{name}: location is empty; expected at least one owner")));
        }
        match p.data {
            PartData::Tensor(_) => {
                kinds.0.0 += 1;
                kinds.0.1.get_or_insert_with(|| grid.clone());
            }
            PartData::Handle(_) => {
                kinds.1.0 += 1;
                kinds.1.1.get_or_insert_with(|| grid.clone());
            }
            PartData::Absent => {}
        }
        parts.push(Checked { grid, start, shape: pshape, locations: p.locations, data: p.data });
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
            for p in parts.iter().filter(|p| p.grid[dd] == i) {
                match first {
                    None => first = Some((p.start[dd], p.shape[dd], &p.grid)),
                    Some((s, n, g)) if s != p.start[dd] || n != p.shape[dd] => {
                        return Err(Error::invalid(
                            "desc",
                            format!(
                                "{}: start[{dd}] = {}, shape[{dd}] = {}; expected {s} and {n} like {} in the same grid slice",
                                grid_name(&p.grid),
                                p.start[dd],
                                p.shape[dd],
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
                return Err(Error::invalid("desc", format!("{}: start[{dd}] = {s}; expected {expect_start}: it {how}", grid_name(g))));
            }
            expect_start = s + n;
        }
        if expect_start != shape[dd] {
            let last = parts.iter().find(|p| p.grid[dd] == tiling[dd] - 1).map(|p| grid_name(&p.grid)).unwrap_or_default();
            return Err(Error::invalid(
                "desc",
                format!("{last}: the partitions end at {expect_start} along dimension {dd}; expected shape[{dd}] = {}", shape[dd]),
            ));
        }
    }
    // Locals, then resolve and check local data.
    let locals: Option<Vec<usize>> = match &d.locals {
        None => None,
        Some(list) => {
            let mut v = Vec::with_capacity(list.len());
            for (l, pos) in list.iter().enumerate() {
                let pos = sizes(pos, nd, &format!("locals[{l}]"))?;
                if pos.iter().zip(&tiling).any(|(p, t)| p >= t) {
                    return Err(Error::invalid("desc", format!("locals[{l}] = {pos:?} is outside partition_tiling {tiling:?}")));
                }
                v.push(pos.iter().zip(&tiling).fold(0, |a, (p, t)| a * t + p));
            }
            Some(v)
        }
    };
    let mut dtype: Option<(DLDataType, String)> = None;
    let mut out = Vec::with_capacity(count);
    for (idx, p) in parts.into_iter().enumerate() {
        let name = grid_name(&p.grid);
        let local = locals.as_ref().is_none_or(|l| l.contains(&idx));
        let tensor = match p.data {
            PartData::Tensor(t) => Some(t),
            PartData::Handle(h) if local => (d.get.as_ref().expect("checked above"))(h),
            _ => None,
        };
        if locals.is_some() && local && tensor.is_none() {
            return Err(Error::invalid("desc", format!("{name} is listed in locals but has no data; expected local data")));
        }
        let view = match tensor {
            None => None,
            Some(t) => {
                // SAFETY: the caller vouches for every tensor of the description and of get.
                let v = unsafe { TensorView::new(t, "desc") }.map_err(|e| in_partition(e, &name))?;
                if v.shape != p.shape {
                    return Err(Error::invalid(
                        "desc",
                        format!("{name}: data has shape {:?}; expected the partition's shape {:?}", v.shape, p.shape),
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
            }
        };
        let in_locals = locals.is_some() && local;
        out.push(Part { grid: p.grid, start: p.start, shape: p.shape, locations: p.locations, data: view, in_locals });
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
            format!(
                "partition_tiling {:?} splits the columns; expected ({}, 1): tables are split along rows",
                layout.tiling, layout.tiling[0]
            ),
        ));
    }
    Ok((layout.shape[0], layout.shape[1]))
}

/// Builds a single-process table from a validated [`rows, dim`] description split along rows
/// (tiling (P, 1)), every partition local. One partition (tiling (1, 1), or a replicated one)
/// with unit element stride is borrowed without a copy; several partitions are copied into one
/// table. Dense: the key of a row is its global row number. With an `options.storage` other
/// than the data's dtype, the rows are copied and quantized (or converted) row by row, as
/// `strata_table_from_dlpack` does.
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
    let format = options.storage.unwrap_or(RowFormat::Float(dtype));
    if format != RowFormat::Float(dtype) {
        // Copied, each row quantized (or converted) from where it lies; a row that cannot be
        // stored fails, naming it (and its partition, when there are several).
        if let Some(m) = format.check_dim(dim) {
            return Err(Error::invalid("desc", m));
        }
        let part_of =
            |r: usize| layout.parts.iter().find(|p| (p.start[0]..p.start[0] + p.shape[0]).contains(&r)).expect("rows tile the shape");
        let read = |r: usize, row: &mut [f32]| {
            let p = part_of(r);
            let v = p.data.as_ref().expect("checked above");
            let at = (r - p.start[0]) as isize * v.strides[0];
            for (c, x) in row.iter_mut().enumerate() {
                // SAFETY: element (r - start, c) lies inside the partition's view, which
                // validated every element addressable and aligned for dtype; the caller
                // guarantees it is readable.
                *x = unsafe { dtype.load_f32(v.at(at + c as isize * v.strides[1])) };
            }
        };
        let failed = |r: usize, m: String| match layout.parts.len() {
            1 => Error::invalid("desc", format!("row {r}: {m}")),
            _ => Error::invalid("desc", format!("{}: row {}: {m}", grid_name(&part_of(r).grid), r - part_of(r).start[0])),
        };
        return StaticTable::dense_over(quantized_store_named(format, rows, dim, read, failed)?, options);
    }
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
        Ok(())
    })?;
    StaticTable::dense_over(store, options)
}

/// A description strata makes of one of its tables ([`describe`], `DistTable::describe`),
/// which `ffi` lays out in C: a [rows, dim] array split along rows.
#[derive(Debug, Clone)]
pub struct TableDescription {
    /// The global shape, [rows, dim].
    pub shape: Vec<i64>,
    /// (partitions, 1).
    pub tiling: Vec<i64>,
    /// One per partition, in row order.
    pub parts: Vec<DescribedPart>,
}

/// One partition of a [`TableDescription`].
#[derive(Debug, Clone)]
pub struct DescribedPart {
    pub start: Vec<i64>,
    pub shape: Vec<i64>,
    /// The ranks that hold it.
    pub locations: Vec<Location>,
    /// Its rows, when this process holds them.
    pub data: Option<DataView>,
}

/// A partition's rows in this process, as a DLPack tensor of the partition's shape describes
/// them: valid while the table lives.
#[derive(Debug, Clone)]
pub struct DataView {
    pub ptr: *mut c_void,
    pub device: DLDevice,
    pub dtype: DLDataType,
    /// Element strides, one per dimension.
    pub strides: Vec<i64>,
}

/// One partition of a table being described: rows `start..start + rows`, owned by `ranks`,
/// with its vectors when this process holds them.
pub(crate) struct RowPart<'a> {
    pub start: usize,
    pub rows: usize,
    pub ranks: Vec<i32>,
    pub store: Option<&'a Store>,
}

/// Describes a [rows, dim] table split along rows into `parts` (in row order): local partitions
/// carry a view of their store (valid while the table lives); other partitions carry none.
pub(crate) fn describe_parts(rows: usize, dim: usize, parts: Vec<RowPart>) -> TableDescription {
    let pid = std::process::id() as i64;
    let n = parts.len();
    let parts = parts
        .into_iter()
        .map(|p| {
            let here = p.store.is_some();
            DescribedPart {
                start: vec![p.start as i64, 0],
                shape: vec![p.rows as i64, dim as i64],
                locations: p
                    .ranks
                    .iter()
                    .map(|&rank| Location { rank, device_id: -1, pid: if here { pid } else { 0 }, host: None })
                    .collect(),
                data: p.store.map(|store| DataView {
                    ptr: store.row_ptr_or_base() as *mut c_void,
                    device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
                    dtype: store.dtype().dl(),
                    strides: vec![store.row_stride() as i64, 1],
                }),
            }
        })
        .collect();
    TableDescription { shape: vec![rows as i64, dim as i64], tiling: vec![n as i64, 1], parts }
}

/// Describes a dense table as one local partition (tiling (1, 1)) owned by rank 0, whose data
/// is a view of the table's vectors (valid while the table lives).
pub(crate) fn describe(t: &StaticTable) -> Result<TableDescription> {
    if t.is_keyed() {
        return Err(Error::invalid(
            "table",
            "is keyed: its rows are not positions of an array; expected a dense table (keys are row numbers)",
        ));
    }
    let store = t.store();
    let part = RowPart { start: 0, rows: store.rows(), ranks: vec![0], store: Some(store) };
    Ok(describe_parts(store.rows(), store.dim(), vec![part]))
}

// ---- one description from several ranks ----------------------------------------------------

/// One description from several ranks: what each rank claims, and the merge every rank runs the
/// same way over all the claims (distributed tables, feature `mpi`; tested without it).
pub(crate) mod claims {
    #![cfg_attr(not(feature = "mpi"), allow(dead_code))]
    use super::grid_name;
    use crate::dlpack::{FloatDtype, dtype_name};
    use crate::error::{Error, Result};
    use crate::model::{MissingKey, RowFormat};

    /// What one rank passed to a collective build of a [rows, dim] table split along rows, once its
    /// own checks passed: every rank gathers every rank's claim and merges them the same way
    /// ([`merge_claims`]), so all reach the same table or the same error.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct RankClaim {
        pub shape: [usize; 2],
        /// One per partition, in row order.
        pub parts: Vec<ClaimedPart>,
        /// The dtype of this rank's data; `None` when it holds none.
        pub dtype: Option<FloatDtype>,
        pub default_value: f32,
        pub missing: MissingKey,
        /// How the table stores its rows (`opts->storage`; `None`: as given).
        pub storage: Option<RowFormat>,
    }

    /// One partition of a [`RankClaim`].
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct ClaimedPart {
        pub start: usize,
        pub rows: usize,
        /// The ranks its locations name in this rank's description.
        pub locations: Vec<i32>,
        /// Whether this rank holds it: it has the data and names itself in the locations or lists
        /// the partition in `locals`.
        pub here: bool,
    }

    const NO_DTYPE: u64 = u64::MAX;
    const DTYPES: [FloatDtype; 3] = [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16];
    /// Storages (`opts->storage`) as numbers: their index.
    pub(crate) const STORAGES: [Option<RowFormat>; 7] = [
        None,
        Some(RowFormat::Float(FloatDtype::F32)),
        Some(RowFormat::Float(FloatDtype::F16)),
        Some(RowFormat::Float(FloatDtype::BF16)),
        Some(RowFormat::Int8),
        Some(RowFormat::Int4),
        Some(RowFormat::Fp8),
    ];

    /// How messages name a storage.
    pub(crate) fn storage_name(s: Option<RowFormat>) -> &'static str {
        s.map_or("as given", RowFormat::name)
    }

    /// A storage as a number ([`STORAGES`]).
    pub(crate) fn storage_code(s: Option<RowFormat>) -> u64 {
        STORAGES.iter().position(|x| *x == s).unwrap_or(0) as u64
    }

    fn missing_name(m: MissingKey) -> &'static str {
        match m {
            MissingKey::Fill => "fill",
            MissingKey::Error => "error",
        }
    }

    fn fnv(h: u64, v: u64) -> u64 {
        v.to_le_bytes().iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    }

    impl RankClaim {
        /// The claim as plain numbers, for an all-gather: rows, dim, partitions, dtype, the default
        /// value's bits, missing, storage, then per partition start, rows, here, the number of
        /// locations and the locations.
        pub fn encode(&self) -> Vec<u64> {
            let dtype = self.dtype.map_or(NO_DTYPE, |d| DTYPES.iter().position(|x| *x == d).unwrap_or(0) as u64);
            let mut v = vec![
                self.shape[0] as u64,
                self.shape[1] as u64,
                self.parts.len() as u64,
                dtype,
                self.default_value.to_bits() as u64,
                self.missing as u64,
                storage_code(self.storage),
            ];
            for p in &self.parts {
                v.extend([p.start as u64, p.rows as u64, p.here as u64, p.locations.len() as u64]);
                v.extend(p.locations.iter().map(|&r| r as u32 as u64));
            }
            v
        }

        /// The inverse of [`RankClaim::encode`]; `None` for anything `encode` cannot make.
        pub fn decode(v: &[u64]) -> Option<RankClaim> {
            let head = v.get(..7)?;
            let dtype = match head[3] {
                NO_DTYPE => None,
                c => Some(*DTYPES.get(usize::try_from(c).ok()?)?),
            };
            let missing = match head[5] {
                0 => MissingKey::Fill,
                1 => MissingKey::Error,
                _ => return None,
            };
            let storage = *STORAGES.get(usize::try_from(head[6]).ok()?)?;
            let mut parts = Vec::new();
            let mut rest = &v[7..];
            for _ in 0..head[2] {
                let [start, rows, here, n] = *rest.get(..4)? else { return None };
                let n = usize::try_from(n).ok()?;
                let locations = rest.get(4..4 + n)?.iter().map(|&r| r as u32 as i32).collect();
                parts.push(ClaimedPart { start: start as usize, rows: rows as usize, locations, here: here != 0 });
                rest = &rest[4 + n..];
            }
            rest.is_empty().then_some(RankClaim {
                shape: [head[0] as usize, head[1] as usize],
                parts,
                dtype,
                default_value: f32::from_bits(head[4] as u32),
                missing,
                storage,
            })
        }

        /// What every rank's claim must share when no rank holds a partition its own description
        /// does not name it for, as three numbers: a hash of the shape, partitions, locations and
        /// options; whether this rank holds a partition only through `locals` (then the owners are a
        /// union over ranks); the dtype. Equal summaries on every rank (dtypes: on every rank with
        /// data) mean every rank's locations are the owners: no claim needs to travel.
        pub fn summary(&self, rank: usize) -> [u64; 3] {
            let mut plain = self.clone();
            plain.dtype = None;
            plain.parts.iter_mut().for_each(|p| p.here = false);
            let hash = plain.encode().into_iter().fold(0xcbf2_9ce4_8422_2325u64, fnv);
            let extra = self.parts.iter().any(|p| p.here && !p.locations.contains(&(rank as i32)));
            [hash, extra as u64, self.encode()[3]]
        }
    }

    /// The dtype of the first rank with data, from every rank's [`RankClaim::summary`].
    pub(crate) fn summary_dtype(all: &[u64]) -> Option<FloatDtype> {
        all.chunks(3).find(|x| x[2] != NO_DTYPE).and_then(|x| DTYPES.get(x[2] as usize).copied())
    }

    /// Whether every rank's summary allows the owners to be read off one rank's claim.
    pub(crate) fn summaries_agree(all: &[u64]) -> bool {
        let s: Vec<&[u64]> = all.chunks(3).collect();
        let dtypes: Vec<u64> = s.iter().map(|x| x[2]).filter(|&d| d != NO_DTYPE).collect();
        s.iter().all(|x| x[0] == s[0][0] && x[1] == 0) && dtypes.iter().all(|&d| d == dtypes[0])
    }

    /// The value most ranks give (a tie goes to the lowest rank), as the lowest rank giving it, and
    /// the lowest rank giving another: `None` when all agree.
    fn odd_one_out<T: PartialEq>(values: &[T]) -> Option<(usize, usize)> {
        let (mut best, mut best_count) = (0, 0);
        for i in 0..values.len() {
            if values[..i].contains(&values[i]) {
                continue;
            }
            let count = values.iter().filter(|v| **v == values[i]).count();
            if count > best_count {
                (best, best_count) = (i, count);
            }
            if 2 * best_count > values.len() {
                break;
            }
        }
        values.iter().position(|v| *v != values[best]).map(|odd| (best, odd))
    }

    fn ranks_list(r: &[usize]) -> String {
        r.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Merges every rank's claim (`claims[r]` from rank r) into the owners of each partition, the
    /// union of what the ranks say: the ranks any rank's locations name, and every rank that holds
    /// the partition (Heat describes a replicated array on every rank with one partition whose
    /// location is a single rank, and data and `locals` on every rank). Where the claims disagree,
    /// the error names the rank whose claim differs from what most ranks say and quotes its values
    /// beside theirs: `partition (2,0): start[0] = 14, shape[0] = 6 on rank 3 but start[0] = 14,
    /// shape[0] = 7 on rank 0`. Every rank named as an owner must hold the partition.
    pub(crate) fn merge_claims(claims: &[RankClaim]) -> Result<Vec<Vec<i32>>> {
        let same = "; expected the same description on every rank (each with its own local data)";
        let differ = |what: &str, good: usize, a: String, bad: usize, b: String| {
            Error::invalid("desc", format!("{what}{a} on rank {good} but {b} on rank {bad}{same}"))
        };
        let shapes: Vec<_> = claims.iter().map(|c| c.shape).collect();
        if let Some((g, b)) = odd_one_out(&shapes) {
            return Err(differ("shape ", g, format!("{:?}", shapes[g]), b, format!("{:?}", shapes[b])));
        }
        let tilings: Vec<_> = claims.iter().map(|c| c.parts.len()).collect();
        if let Some((g, b)) = odd_one_out(&tilings) {
            return Err(differ("partition_tiling ", g, format!("({}, 1)", tilings[g]), b, format!("({}, 1)", tilings[b])));
        }
        for p in 0..tilings[0] {
            let spans: Vec<_> = claims.iter().map(|c| (c.parts[p].start, c.parts[p].rows)).collect();
            if let Some((g, b)) = odd_one_out(&spans) {
                let quote = |(s, n): (usize, usize)| format!("start[0] = {s}, shape[0] = {n}");
                return Err(differ(&format!("{}: ", grid_name(&[p, 0])), g, quote(spans[g]), b, quote(spans[b])));
            }
        }
        let opts: Vec<_> = claims.iter().map(|c| (c.default_value.to_bits(), c.missing, c.storage)).collect();
        if let Some((g, b)) = odd_one_out(&opts) {
            let (what, a, v) = if opts[g].0 != opts[b].0 {
                ("default_value", claims[g].default_value.to_string(), claims[b].default_value.to_string())
            } else if opts[g].1 != opts[b].1 {
                ("missing_key", missing_name(claims[g].missing).to_string(), missing_name(claims[b].missing).to_string())
            } else {
                ("storage", storage_name(claims[g].storage).to_string(), storage_name(claims[b].storage).to_string())
            };
            return Err(Error::invalid(
                "opts",
                format!("{what} {a} on rank {g} but {v} on rank {b}; expected the same options on every rank"),
            ));
        }
        let holders: Vec<usize> = (0..claims.len()).filter(|&r| claims[r].dtype.is_some()).collect();
        let dtypes: Vec<_> = holders.iter().map(|&r| claims[r].dtype).collect();
        if let Some((g, b)) = odd_one_out(&dtypes) {
            let name = |d: Option<FloatDtype>| dtype_name(d.unwrap_or(FloatDtype::F32).dl());
            return Err(Error::invalid(
                "desc",
                format!(
                    "local data has dtype {} on rank {} but {} on rank {}; expected one dtype on every rank",
                    name(dtypes[g]),
                    holders[g],
                    name(dtypes[b]),
                    holders[b]
                ),
            ));
        }
        let mut owners = Vec::with_capacity(tilings[0]);
        for p in 0..tilings[0] {
            let held: Vec<usize> = (0..claims.len()).filter(|&r| claims[r].parts[p].here).collect();
            let mut union: Vec<i32> = held.iter().map(|&r| r as i32).collect();
            for (r, c) in claims.iter().enumerate() {
                for &o in &c.parts[p].locations {
                    if !held.contains(&(o as usize)) {
                        let holders = match held.is_empty() {
                            true => "no rank holds it".to_string(),
                            false => format!("it is held on rank(s) {}", ranks_list(&held)),
                        };
                        return Err(Error::invalid(
                            "desc",
                            format!(
                                "{}: locations {:?} on rank {r} name rank {o}, which has no data for it ({holders}); \
                                 expected data on every rank a partition's locations name",
                                grid_name(&[p, 0]),
                                c.parts[p].locations
                            ),
                        ));
                    }
                    if !union.contains(&o) {
                        union.push(o);
                    }
                }
            }
            if union.is_empty() {
                let name = grid_name(&[p, 0]);
                return Err(Error::invalid("desc", format!("{name}: no rank holds it; expected at least one owner")));
            }
            union.sort_unstable();
            owners.push(union);
        }
        Ok(owners)
    }
}

#[cfg(test)]
mod tests {
    use super::claims::*;
    use crate::dlpack::FloatDtype;
    use crate::model::{MissingKey, RowFormat};

    /// A claim of `rows` split into partitions owned by `owners`, holding `here`.
    fn claim(rows: &[usize], owners: &[Vec<i32>], here: &[bool]) -> RankClaim {
        let mut start = 0;
        let parts = rows
            .iter()
            .zip(owners)
            .zip(here)
            .map(|((&n, o), &h)| {
                let p = ClaimedPart { start, rows: n, locations: o.clone(), here: h };
                start += n;
                p
            })
            .collect();
        let dtype = here.iter().any(|&h| h).then_some(FloatDtype::F32);
        RankClaim { shape: [start, 4], parts, dtype, default_value: 0.0, missing: MissingKey::Fill, storage: None }
    }

    #[test]
    fn claims_travel_as_numbers_and_back() {
        let mut c = claim(&[7, 7, 6], &[vec![0], vec![1, 2], vec![2]], &[false, true, true]);
        c.dtype = Some(FloatDtype::BF16);
        c.default_value = -1.5;
        c.missing = MissingKey::Error;
        assert_eq!(RankClaim::decode(&c.encode()), Some(c.clone()));
        for storage in [Some(RowFormat::Int8), Some(RowFormat::Int4), Some(RowFormat::Fp8), Some(RowFormat::Float(FloatDtype::F16)), None] {
            let q = RankClaim { storage, ..c.clone() };
            assert_eq!(RankClaim::decode(&q.encode()), Some(q));
        }
        let v = c.encode();
        assert_eq!(RankClaim::decode(&v[..v.len() - 1]), None);
        assert_eq!(RankClaim::decode(&[v.clone(), vec![0]].concat()), None);
    }

    #[test]
    fn equal_claims_need_no_merge_and_heats_replicas_do() {
        let split: Vec<RankClaim> = (0..3).map(|r| claim(&[4, 4, 3], &[vec![0], vec![1], vec![2]], &[r == 0, r == 1, r == 2])).collect();
        let all: Vec<u64> = split.iter().enumerate().flat_map(|(r, c)| c.summary(r)).collect();
        assert!(summaries_agree(&all));
        assert_eq!(summary_dtype(&all), Some(FloatDtype::F32));
        assert_eq!(merge_claims(&split).unwrap(), vec![vec![0], vec![1], vec![2]]);
        // Heat's split=None on 3 ranks: location [2] everywhere, data and locals everywhere
        let heat: Vec<RankClaim> = (0..3).map(|_| claim(&[10], &[vec![2]], &[true])).collect();
        let all: Vec<u64> = heat.iter().enumerate().flat_map(|(r, c)| c.summary(r)).collect();
        assert!(!summaries_agree(&all));
        assert_eq!(merge_claims(&heat).unwrap(), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn a_differing_rank_is_named_with_its_own_values() {
        // rank 0 is the odd one out among 4: the majority is the reference
        let owners = [vec![0], vec![1], vec![2], vec![3]];
        let mut c: Vec<RankClaim> = (0..4).map(|r| claim(&[7, 7, 7, 6], &owners, &[r == 0, r == 1, r == 2, r == 3])).collect();
        c[0] = claim(&[7, 7, 6, 7], &owners, &[true, false, false, false]);
        let e = merge_claims(&c).unwrap_err().to_string();
        let want = "partition (2,0): start[0] = 14, shape[0] = 7 on rank 1 but start[0] = 14, shape[0] = 6 on rank 0";
        assert!(e.contains(want), "{e}");
        let mut c: Vec<RankClaim> = (0..3).map(|_| claim(&[5], &[vec![0, 1, 2]], &[true])).collect();
        c[2].default_value = 2.5;
        let e = merge_claims(&c).unwrap_err().to_string();
        assert!(e.contains("opts: default_value 0 on rank 0 but 2.5 on rank 2"), "{e}");
        c[2].default_value = 0.0;
        c[1].missing = MissingKey::Error;
        let e = merge_claims(&c).unwrap_err().to_string();
        assert!(e.contains("missing_key fill on rank 0 but error on rank 1"), "{e}");
        c[1].missing = MissingKey::Fill;
        c[0].storage = Some(RowFormat::Int8);
        let e = merge_claims(&c).unwrap_err().to_string();
        assert!(e.contains("opts: storage as given on rank 1 but int8 on rank 0"), "{e}");
        c[0].storage = None;
        c[2].dtype = Some(FloatDtype::F16);
        let e = merge_claims(&c).unwrap_err().to_string();
        assert!(e.contains("local data has dtype float32 on rank 0 but float16 on rank 2"), "{e}");
        let c = [claim(&[5], &[vec![0, 1]], &[true]), claim(&[5], &[vec![0]], &[false])];
        let e = merge_claims(&c).unwrap_err().to_string();
        let want = "partition (0,0): locations [0, 1] on rank 0 name rank 1, which has no data for it (it is held on rank(s) 0)";
        assert!(e.contains(want), "{e}");
    }
}
