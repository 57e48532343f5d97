//! The bulk loader: a table's first open from a HugeCTR sparse folder (read through
//! [`crate::storage::hugectr`]), in large durable transactions that record the table as
//! loading until the last one marks it complete.

use super::format::{Catalog, LeRow, Rows, TableRecord};
use super::registry::StoreInner;
use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::kernels::RowFormat;
use crate::storage::hugectr::SparseFolder;
use heed::{MdbError, PutFlags, RwTxn};
use std::collections::HashMap;

/// How a first open creates a table or loads a sparse folder. Only tests use anything but the
/// default, apart from `format`.
#[derive(Debug, Clone, Copy)]
pub(super) struct LoadParams {
    /// How a new table stores its rows (float32 by default).
    pub(super) format: RowFormat,
    /// Commit (durably) after about this many bytes of keys and rows.
    pub(super) txn_bytes: usize,
    /// Keys sorted at once: the first run is appended in key order (`MDB_APPEND`, packed pages),
    /// later runs are inserted. Bounds the sort buffer to 16 bytes per key of a run.
    pub(super) run_keys: usize,
    /// Test hook: stop right after this many commits, as a crash would, with no clean-up.
    pub(super) crash_after_commits: Option<usize>,
}

impl Default for LoadParams {
    fn default() -> Self {
        LoadParams { format: RowFormat::Float(FloatDtype::F32), txn_bytes: 128 << 20, run_keys: 1 << 24, crash_after_commits: None }
    }
}

/// Bulk-loads `sparse` into `db` of store `s`, starting in `wtxn` (which holds the write lock and
/// in which `db` was opened). Counts durable commits in `commits`.
#[allow(clippy::too_many_arguments)]
pub(super) fn load<'a>(
    s: &'a StoreInner,
    mut wtxn: RwTxn<'a>,
    db: Rows,
    catalog: Catalog,
    name: &str,
    dim: usize,
    sparse: &SparseFolder,
    params: LoadParams,
    commits: &mut usize,
) -> Result<()> {
    let e = |op: &'static str| s.heed(name, op);
    db.clear(&mut wtxn).map_err(e("load: clear"))?;
    let format = params.format;
    let loading = TableRecord { complete: false, dim: dim as u64, format };
    catalog.put_record(&mut wtxn, name, loading).map_err(e("load: write metadata"))?;
    let row_bytes = dim * 4;
    let float32 = format == RowFormat::Float(FloatDtype::F32);
    let mut values = vec![0f32; if float32 { 0 } else { dim }];
    let mut buf = Vec::new();
    let vecs = sparse.vecs();
    let run_keys = params.run_keys.max(1);
    let mut order: Vec<(u64, u64)> = Vec::new();
    let mut in_txn = 0usize;
    let mut start = 0usize;
    while start < sparse.rows {
        let end = sparse.rows.min(start.saturating_add(run_keys));
        order.clear();
        order
            .try_reserve_exact(end - start)
            .map_err(|_| Error::OutOfMemory { what: "persistent load sort buffer", bytes: (end - start) * 16 })?;
        order.extend((start..end).map(|r| (sparse.key(r), r as u64)));
        order.sort_unstable();
        if order.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(duplicate_error(sparse));
        }
        // The first run lands in an empty database in key order: append (packed pages).
        let flags = if start == 0 { PutFlags::APPEND } else { PutFlags::NO_OVERWRITE };
        for &(k, r) in &order {
            let r = r as usize;
            // `emb_vector` holds little-endian float32 rows: a float32 table's encoding already;
            // other formats convert or quantize them.
            let src = &vecs[r * row_bytes..(r + 1) * row_bytes];
            let row = if float32 {
                LeRow::from_le_bytes(src)
            } else {
                for (v, c) in values.iter_mut().zip(src.chunks_exact(4)) {
                    *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
                LeRow::encode(format, &values, &mut buf)
                    .map_err(|m| Error::invalid("dir/emb_vector", format!("row {r}: {m} (table {name} stores {} rows)", format.name())))?
            };
            match db.put_with_flags(&mut wtxn, flags, &k, &row) {
                Err(heed::Error::Mdb(MdbError::KeyExist)) => return Err(duplicate_error(sparse)),
                r => r.map_err(e("load: write row"))?,
            }
            in_txn += row_bytes + 8;
            if in_txn >= params.txn_bytes {
                wtxn.commit().map_err(e("load: commit"))?;
                *commits += 1;
                in_txn = 0;
                if params.crash_after_commits == Some(*commits) {
                    return Err(Error::Internal(format!("simulated crash after {commits} load commits")));
                }
                wtxn = s.env.write_txn().map_err(e("load: begin write transaction"))?;
            }
        }
        start = end;
    }
    let complete = TableRecord { complete: true, dim: dim as u64, format };
    catalog.put_record(&mut wtxn, name, complete).map_err(e("load: write metadata"))?;
    wtxn.commit().map_err(e("load: commit"))?;
    *commits += 1;
    Ok(())
}

/// Best effort: removes what a failed load committed, so the table reads as never created.
/// If this fails too, the "loading" record makes the next open redo the load.
pub(super) fn discard(s: &StoreInner, db: Rows, catalog: Catalog, name: &str) {
    if let Ok(mut wtxn) = s.env.write_txn()
        && db.clear(&mut wtxn).is_ok()
        && catalog.delete_record(&mut wtxn, name).is_ok()
    {
        let _ = wtxn.commit();
    }
}

/// The error `Table::open` reports for a folder's keys: the first row (in file order)
/// whose key an earlier row already has.
fn duplicate_error(sparse: &SparseFolder) -> Error {
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for r in 0..sparse.rows {
        let k = sparse.key(r);
        if let Some(&first) = seen.get(&k) {
            return Error::DuplicateKey { arg: "dir/key", key: k as i64 as i128, first, second: r as u64 };
        }
        seen.insert(k, r as u64);
    }
    Error::Internal("a duplicate key was reported but none was found".into())
}
