//! [`DistTable`]: who owns which rows, this rank's share, and how the table is built
//! collectively from a description or a HugeCTR folder.

use super::DistTiming;
use super::channel::{self, Channel};
use super::comm::Comm;
use super::scratch::Scratch;
use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::model::{MissingKey, RowFormat, StaticTable, TableInfo, TableOptions, quantized_store_named};
use crate::partition::claims::{
    ClaimedPart, RankClaim, STORAGES, merge_claims, storage_code, storage_name, summaries_agree, summary_dtype,
};
use crate::partition::{
    Description, Layout, Part, RowPart, TableDescription, check_row_split, describe_parts, grid_name, table_from, validate,
};
use crate::storage::hugectr::SparseFolder;
use crate::storage::index::KeyIndex;
use crate::storage::store::Store;
use crate::util::hash::mix;
use crate::util::lock::lock;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Who owns a key.
pub(crate) enum Route {
    /// Row ranges: partition `p` holds rows `ends[p-1]..ends[p]` (from 0), owned by `owners[p]`.
    Dense { ends: Vec<usize>, owners: Vec<Vec<i32>> },
    /// Keys hashed over the ranks ([`key_owner`]).
    Keyed,
}

/// A share of the table on this rank: global rows `start..start + table.len()` of a dense
/// table, or (keyed) the keys that hash to this rank.
pub(crate) struct LocalPart {
    pub start: usize,
    pub table: StaticTable,
}

/// A table spread over the ranks of a communicator. Built collectively; its lookups are
/// collective (every rank calls, in the same order) and are serialised on each rank, so at most
/// one runs per table at a time. Owns a duplicate of the host's communicator, freed with the
/// table; the host's MPI is never finalised.
pub struct DistTable {
    /// The communicator and the buffers lookups reuse; held for the whole of a collective call.
    pub(crate) state: Mutex<(Comm, Scratch)>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) dim: usize,
    /// Rows of the whole table (dense: the global shape; keyed: keys over all ranks).
    pub(crate) rows: usize,
    /// How every share stores its rows (the same on every rank).
    pub(crate) format: RowFormat,
    pub(crate) route: Route,
    pub(crate) local: Vec<LocalPart>,
    pub(crate) default_row: Vec<f32>,
    pub(crate) missing: MissingKey,
    pub(crate) timing: Mutex<DistTiming>,
    /// Threads of a lookup that asks for the default (`num_threads` 0): this rank's share of
    /// the CPUs it shares with the other ranks on its node ([`Comm::node_threads`]).
    pub(crate) threads: usize,
    /// Where the batches that hold this table agree: the channel of its group of ranks.
    pub(crate) channel: Arc<Channel>,
}

// SAFETY: the communicator handle is a process-wide MPI handle, only used under the `state`
// mutex by the thread making a collective call, so the table may move to another thread; every
// other field is Send.
unsafe impl Send for DistTable {}
// SAFETY: the communicator is only used under the `state` mutex, `timing` is behind its own, and
// everything else is immutable after construction (StaticTable is Sync).
unsafe impl Sync for DistTable {}

/// The rank that owns `key` in a keyed table over `size` ranks. Seeded apart from the index's
/// own hash, so a rank's keys still spread over its index's buckets.
pub(crate) fn key_owner(key: u64, size: usize) -> usize {
    (mix(key ^ 0x5bd1_e995_9e37_79b9) % size as u64) as usize
}

/// Options for the shares: owners always fill (the table's own policy is applied by the rank
/// that asked).
fn share_options(options: TableOptions) -> TableOptions {
    TableOptions { missing: MissingKey::Fill, ..options }
}

/// Every rank's claim, in rank order: only the small summaries travel when they show that every
/// rank's locations are the owners; else the whole claims, merged (union of owners, or an error
/// quoting the rank that differs).
fn gather_claims(comm: &mut Comm, mine: RankClaim) -> Result<(RankClaim, Vec<Vec<i32>>)> {
    let summaries = comm.all_gather(&mine.summary(comm.rank));
    if summaries_agree(&summaries) {
        let owners = mine.parts.iter().map(|p| p.locations.clone()).collect();
        return Ok((RankClaim { dtype: summary_dtype(&summaries), ..mine }, owners));
    }
    let v = mine.encode();
    let lens = comm.all_gather(&[v.len() as u64]);
    let width = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut padded = v;
    padded.resize(width, 0);
    let all = comm.all_gather(&padded);
    let claims = (0..comm.size)
        .map(|r| {
            RankClaim::decode(&all[r * width..r * width + lens[r] as usize])
                .ok_or_else(|| Error::Internal(format!("rank {r} sent a malformed description summary")))
        })
        .collect::<Result<Vec<_>>>()?;
    let owners = merge_claims(&claims)?;
    let dtype = claims.iter().find_map(|c| c.dtype);
    Ok((RankClaim { dtype, ..mine }, owners))
}

impl DistTable {
    /// Collective: see `strata_table_from_partitioned` with a communicator. `d` and `options`
    /// may be the errors of reading them, which fail the call on every rank.
    ///
    /// # Safety
    /// As for [`validate`]; borrowed partitions must stay valid and unchanged until the table is
    /// dropped.
    pub(crate) unsafe fn from_partitioned(d: Result<Description<'_>>, fint: i32, options: Result<TableOptions>) -> Result<Self> {
        let mut comm = Comm::duplicate(fint)?;
        let (rank, size) = (comm.rank, comm.size);
        // SAFETY: our caller guarantees d is valid as validate requires and that borrowed
        // partitions outlive the table, which is what local_partitions needs.
        let local = options.and_then(|options| Ok((unsafe { local_partitions(d?, rank, size, options) }?, options)));
        let ((claim, local), options) = comm.agree(local)?;
        let (claim, owners) = gather_claims(&mut comm, claim)?;
        let ends = claim.parts.iter().map(|p| p.start + p.rows).collect();
        let route = Route::Dense { ends, owners };
        let format = options.storage.unwrap_or(RowFormat::Float(claim.dtype.unwrap_or(FloatDtype::F32)));
        let [rows, dim] = claim.shape;
        Ok(DistTable::assemble(comm, rows, dim, format, route, local, options))
    }

    /// Collective: see `strata_table_open_distributed`. `options` may be the error of reading
    /// them, which fails the call on every rank.
    pub(crate) fn open(dir: &Path, dim: i64, fint: i32, options: Result<TableOptions>) -> Result<Self> {
        let mut comm = Comm::duplicate(fint)?;
        let (rank, size) = (comm.rank, comm.size);
        let local = options.and_then(|options| Ok((load_share(dir, dim, rank, size, options)?, options)));
        let ((share, file_rows), options) = comm.agree(local)?;
        let format = options.storage.unwrap_or(RowFormat::Float(FloatDtype::F32));
        let mine =
            [dim as u64, file_rows as u64, options.default_value.to_bits() as u64, options.missing as u64, storage_code(options.storage)];
        let all = comm.all_gather(&mine);
        if let Some(r) = (1..comm.size).find(|&r| all[r * 5..r * 5 + 5] != all[..5]) {
            let (a, b) = (&all[..5], &all[r * 5..r * 5 + 5]);
            let what = if a[0] != b[0] {
                format!("dim {} on rank 0 but {} on rank {r}", a[0], b[0])
            } else if a[1] != b[1] {
                format!("the folder holds {} rows on rank 0 but {} on rank {r}", a[1], b[1])
            } else if a[2] != b[2] {
                let v = |x: u64| f32::from_bits(x as u32);
                format!("default_value {} on rank 0 but {} on rank {r}", v(a[2]), v(b[2]))
            } else if a[3] != b[3] {
                let m = |x: u64| if x == MissingKey::Error as u64 { "error" } else { "fill" };
                format!("missing_key {} on rank 0 but {} on rank {r}", m(a[3]), m(b[3]))
            } else {
                let f = |x: u64| storage_name(STORAGES[x as usize]);
                format!("storage {} on rank 0 but {} on rank {r}", f(a[4]), f(b[4]))
            };
            return Err(Error::invalid("dir", format!("{what}; expected the same folder, dim and options on every rank")));
        }
        let dim = dim as usize;
        let local = vec![LocalPart { start: 0, table: share }];
        Ok(DistTable::assemble(comm, file_rows, dim, format, Route::Keyed, local, options))
    }

    /// Collective (it asks the node's ranks for their CPUs).
    fn assemble(
        mut comm: Comm,
        rows: usize,
        dim: usize,
        format: RowFormat,
        route: Route,
        local: Vec<LocalPart>,
        options: TableOptions,
    ) -> Self {
        let missing = options.missing;
        let threads = comm.node_threads();
        let channel = channel::of(&comm);
        DistTable {
            threads,
            channel,
            rank: comm.rank,
            size: comm.size,
            state: Mutex::new((comm, Scratch::default())),
            dim,
            rows,
            format,
            route,
            local,
            default_row: vec![options.default_value; dim],
            missing,
            timing: Mutex::new(DistTiming::default()),
        }
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Rows of the whole table, over all ranks.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether the whole table holds no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// A summary of the whole table; byte counts are this rank's share.
    pub fn info(&self) -> TableInfo {
        let keyed = matches!(self.route, Route::Keyed);
        TableInfo {
            rows: self.rows as i64,
            dim: self.dim as i64,
            format: self.format,
            keyed,
            mapped: false,
            adopted: false,
            index_bytes: self.local.iter().map(|p| p.table.index_bytes() as u64).sum(),
            vector_bytes: self.local.iter().map(|p| p.table.store().vector_bytes() as u64).sum(),
        }
    }

    /// Cumulative lookup timing on this rank.
    pub fn timing(&self) -> DistTiming {
        *lock(&self.timing)
    }

    /// Describes a dense distributed table with the protocol: every partition with its owners
    /// (ranks of the communicator), `data` (and `handle`) only for this rank's partitions, which
    /// view the table's memory (the caller's, for borrowed partitions). Keyed tables have no
    /// array view.
    pub(crate) fn describe(&self) -> Result<TableDescription> {
        let Route::Dense { ends, owners } = &self.route else {
            return Err(Error::invalid(
                "table",
                "is keyed: its rows are not positions of an array; expected a dense table (keys are row numbers)",
            ));
        };
        if self.format.is_quantized() {
            return Err(Error::invalid("table", format!("stores {} rows, which has no __partitioned__ view", self.format.name())));
        }
        let parts = ends
            .iter()
            .zip(owners)
            .enumerate()
            .map(|(p, (&end, ranks))| {
                let start = if p == 0 { 0 } else { ends[p - 1] };
                let mine = ranks.contains(&(self.rank as i32));
                let store = self.local.iter().find(|l| mine && l.start == start).map(|l| l.table.store());
                RowPart { start, rows: end - start, ranks: ranks.clone(), store }
            })
            .collect();
        Ok(describe_parts(self.rows, self.dim, parts))
    }

    /// The rank that serves `key` (canonical form) for a lookup made on this rank, or `None`
    /// when no rank holds it (a dense row out of range). A row of a replicated partition is
    /// served locally when this rank holds a replica, else by one replica chosen by row.
    #[inline]
    pub(crate) fn owner(&self, key: u64) -> Option<usize> {
        match &self.route {
            Route::Keyed => Some(key_owner(key, self.size)),
            Route::Dense { ends, owners } => {
                if key >= self.rows as u64 {
                    return None;
                }
                let p = ends.partition_point(|&e| e as u64 <= key);
                let o = &owners[p];
                if o.len() == 1 {
                    Some(o[0] as usize)
                } else if o.contains(&(self.rank as i32)) {
                    Some(self.rank)
                } else {
                    Some(o[key as usize % o.len()] as usize)
                }
            }
        }
    }
}

/// This rank's side of building from a description: validates it, checks the rules a
/// distributed table adds (owners are ranks of the communicator; a rank has data exactly for the
/// partitions it holds: those whose locations list it, or that its `locals` list), builds a table
/// over each partition it holds (borrowed when its strides allow, as for a single partition in
/// one process; else copied), and says what it was given ([`RankClaim`]), for the ranks to merge.
///
/// # Safety
/// As for [`validate`]; borrowed partitions must stay valid and unchanged until the tables
/// built over them are dropped.
unsafe fn local_partitions(d: Description<'_>, rank: usize, size: usize, options: TableOptions) -> Result<(RankClaim, Vec<LocalPart>)> {
    // SAFETY: our caller guarantees every tensor of d (and of its get) is valid DLPack memory
    // that stays readable, as validate requires.
    let layout = unsafe { validate(d) }?;
    let (rows, dim) = check_row_split(&layout)?;
    let Layout { parts, .. } = layout;
    let mut claimed = Vec::with_capacity(parts.len());
    let mut local = Vec::new();
    let mut dtype = None;
    for p in parts {
        let name = grid_name(&p.grid);
        let mut ranks = Vec::with_capacity(p.locations.len());
        for (i, l) in p.locations.iter().enumerate() {
            if l.rank < 0 || l.rank as usize >= size {
                return Err(Error::invalid(
                    "desc",
                    format!("{name}: location[{i}].rank = {}; expected a rank of comm (0..{size})", l.rank),
                ));
            }
            if ranks.contains(&l.rank) {
                return Err(Error::invalid("desc", format!("{name}: rank {} appears twice in its locations", l.rank)));
            }
            ranks.push(l.rank);
        }
        let listed = ranks.contains(&(rank as i32));
        let mine = listed || p.in_locals;
        match (&p.data, mine) {
            (None, true) => {
                return Err(Error::invalid(
                    "desc",
                    format!("{name} lists this rank ({rank}) among its locations but has no data here; expected its local data"),
                ));
            }
            (Some(_), false) => {
                return Err(Error::invalid(
                    "desc",
                    format!(
                        "{name} has data on rank {rank} but its locations {ranks:?} do not list this rank; \
                         expected data only for the partitions this rank's locations or locals name"
                    ),
                ));
            }
            _ => {}
        }
        claimed.push(ClaimedPart { start: p.start[0], rows: p.shape[0], locations: ranks, here: mine });
        if mine {
            let start = p.start[0];
            let given = p.data.as_ref().map(|v| v.dtype);
            let one = Layout {
                shape: p.shape.clone(),
                tiling: vec![1, 1],
                parts: vec![Part {
                    grid: p.grid,
                    start: vec![0, 0],
                    shape: p.shape,
                    locations: p.locations,
                    data: p.data,
                    in_locals: p.in_locals,
                }],
            };
            // SAFETY: `one` holds a partition of the validated layout; our caller guarantees a
            // borrowed partition stays valid and unchanged until its table is dropped.
            let table = unsafe { table_from(one, share_options(options)) }.map_err(|e| match e {
                Error::Invalid { arg, msg } => Error::Invalid { arg, msg: format!("{name}: {msg}") },
                other => other,
            })?;
            // (The data's dtype, which the table checked, whatever it stores.)
            dtype = given.map(|d| FloatDtype::of(d, "desc")).transpose()?;
            local.push(LocalPart { start, table });
        }
    }
    let claim = RankClaim {
        shape: [rows, dim],
        parts: claimed,
        dtype,
        default_value: options.default_value,
        missing: options.missing,
        storage: options.storage,
    };
    Ok((claim, local))
}

/// This rank's share of a HugeCTR folder: the rows whose keys hash to `rank`. Every rank reads
/// the key file; of the vector file only the pages of its own rows are touched (mapped, then
/// copied into the share). Returns the share and the folder's row count.
fn load_share(dir: &Path, dim: i64, rank: usize, size: usize, options: TableOptions) -> Result<(StaticTable, usize)> {
    let dim = usize::try_from(dim).map_err(|_| Error::invalid("dim", format!("{dim}; expected 1 <= dim")))?;
    let folder = SparseFolder::open(dir, dim)?;
    let mine: Vec<usize> = (0..folder.rows).filter(|&r| key_owner(folder.key(r), size) == rank).collect();
    let index = KeyIndex::build(mine.iter().map(|&r| folder.key(r)), |k| k as i64 as i128, "dir/key").map_err(|e| match e {
        // name the rows of the file, not of this rank's share
        Error::DuplicateKey { arg, key, first, second } => {
            Error::DuplicateKey { arg, key, first: mine[first as usize] as u64, second: mine[second as usize] as u64 }
        }
        other => other,
    })?;
    let row_bytes = dim * 4;
    let vecs = folder.vecs();
    let store = match options.storage.filter(|&f| f != RowFormat::Float(FloatDtype::F32)) {
        // Quantized (or converted) at load, as strata_table_open does, naming the file's row.
        Some(format) => {
            if let Some(m) = format.check_dim(dim) {
                return Err(Error::invalid("dim", m));
            }
            let read = |i: usize, row: &mut [f32]| {
                let at = mine[i] * row_bytes;
                for (x, b) in row.iter_mut().zip(vecs[at..at + row_bytes].chunks_exact(4)) {
                    *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            };
            quantized_store_named(format, mine.len(), dim, read, |i, m| Error::invalid("dir/emb_vector", format!("row {}: {m}", mine[i])))?
        }
        None => Store::alloc(FloatDtype::F32, mine.len(), dim, |buf| {
            for (i, &r) in mine.iter().enumerate() {
                buf[i * row_bytes..(i + 1) * row_bytes].copy_from_slice(&vecs[r * row_bytes..(r + 1) * row_bytes]);
            }
            Ok(())
        })?,
    };
    let table = StaticTable::keyed_over(store, index, share_options(options))?;
    Ok((table, folder.rows))
}
