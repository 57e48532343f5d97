//! The parameter server (`strata_server_*`) and table updates (`strata_table_upsert`,
//! `strata_table_erase`), and a table's counters: `strata_table_stats` and
//! `strata_table_get_stats`.

use super::boundary::{arg_mut, arg_ref, boundary, c_str, out_handle, write_opt};
pub use super::handle::strata_server;
use super::handle::{boxed, free_boxed, handle_arg, lent};
use super::sized::{Extensible, out_struct_required};
use super::status::Status;
use super::table::{storage_value, strata_table, table_arg};
use crate::dlpack::Vouched;
use crate::error::Result;
use crate::model::TableStats;
use crate::server::Server;
use crate::table::Table;
use dlpark::ffi::DLTensor;
use std::ffi::c_char;
use std::path::Path;

/// Borrows the server of a required handle argument.
///
/// # Safety
/// `p` must be NULL or a live handle.
unsafe fn server_arg<'a>(p: *const strata_server) -> Result<&'a Server> {
    // SAFETY: forwarded.
    Ok(unsafe { handle_arg(p, "server") }?.as_ref())
}

/// Answers a count through a required `int32_t *` out-parameter.
///
/// # Safety
/// `p` must be NULL or writable.
unsafe fn write_count(p: *mut i32, arg: &'static str, n: usize) -> Result<()> {
    // SAFETY: forwarded.
    *unsafe { arg_mut(p, arg) }? = n.min(i32::MAX as usize) as i32;
    Ok(())
}

/// Cumulative counters of one table, all tiers (an out-struct, `strata_table_get_stats`).
/// Initialise `struct_size` with `strata_table_stats_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct strata_table_stats {
    /// `sizeof(strata_table_stats)`, set by `strata_table_stats_default()`.
    pub struct_size: usize,
    /// Lookup calls that succeeded.
    pub lookups: u64,
    /// Keys looked up.
    pub keys: u64,
    /// Keys found in the volatile tier.
    pub volatile_hits: u64,
    /// Keys found in the persistent tier (after missing the volatile tier).
    pub persistent_hits: u64,
    /// Keys found in no tier (given the default value).
    pub misses: u64,
    /// Rows the volatile tier evicted to stay within its capacity.
    pub evictions: u64,
    /// Rows the volatile tier holds now.
    pub volatile_rows: u64,
    /// Bytes the volatile tier holds now.
    pub volatile_bytes: u64,
    /// Rows the persistent tier holds now.
    pub persistent_rows: u64,
    /// Keys written by `strata_table_upsert`.
    pub upserts: u64,
    /// Keys removed by `strata_table_erase`.
    pub erases: u64,
    /// (0.3.1) A `strata_storage`: how the table stores its rows (a parameter-server table: its
    /// volatile tier's rows), as `strata_table_info.storage`.
    pub storage: i32,
    /// (0.3.1) Bytes of one stored row, as `strata_table_info.row_bytes`: `volatile_bytes` is
    /// `volatile_rows` of them plus the tier's index.
    pub row_bytes: u64,
}

impl Default for strata_table_stats {
    fn default() -> Self {
        TableStats::default().into()
    }
}

// SAFETY: repr(C), starts with struct_size, every field accepts any bit pattern.
unsafe impl Extensible for strata_table_stats {
    const NAME: &'static str = "strata_table_stats";
    const FIRST_SIZE: usize = 96;
}

impl From<TableStats> for strata_table_stats {
    fn from(s: TableStats) -> Self {
        strata_table_stats {
            struct_size: size_of::<Self>(),
            lookups: s.lookups,
            keys: s.keys,
            volatile_hits: s.volatile_hits,
            persistent_hits: s.persistent_hits,
            misses: s.misses,
            evictions: s.evictions,
            volatile_rows: s.volatile_rows,
            volatile_bytes: s.volatile_bytes,
            persistent_rows: s.persistent_rows,
            upserts: s.upserts,
            erases: s.erases,
            storage: 0,
            row_bytes: 0,
        }
    }
}

impl strata_table_stats {
    /// `table`'s counters and how it stores its rows.
    fn of(table: &Table) -> Self {
        let info = table.info();
        strata_table_stats {
            storage: storage_value(info.format),
            row_bytes: info.format.row_bytes(info.dim as usize) as u64,
            ..table.stats().into()
        }
    }
}

/// A `strata_table_stats` with `struct_size = sizeof(strata_table_stats)` and zero counters,
/// to pass to `strata_table_get_stats`. The header's `strata_table_stats_default` is a macro
/// for this name.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_stats_default_0_3_1() -> strata_table_stats {
    strata_table_stats::default()
}

/// `strata_table_stats` as 0.3.0 laid it out (up to `erases`, 96 bytes): what
/// `strata_table_stats_default` returns.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct strata_table_stats_v0_3 {
    /// 96: the 0.3.0 fields.
    pub struct_size: usize,
    pub lookups: u64,
    pub keys: u64,
    pub volatile_hits: u64,
    pub persistent_hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub volatile_rows: u64,
    pub volatile_bytes: u64,
    pub persistent_rows: u64,
    pub upserts: u64,
    pub erases: u64,
}

const _: () = assert!(size_of::<strata_table_stats_v0_3>() == 96, "0.3.0's strata_table_stats is 96 bytes");

/// The 0.3.0 initialiser, for hosts built against 0.3.0's header: `struct_size = 96` and zero
/// counters, in the room those hosts have. This header's `strata_table_stats_default` is a
/// macro for `strata_table_stats_default_0_3_1`.
#[unsafe(no_mangle)]
pub extern "C" fn strata_table_stats_default() -> strata_table_stats_v0_3 {
    let d = strata_table_stats::default();
    strata_table_stats_v0_3 {
        struct_size: size_of::<strata_table_stats_v0_3>(),
        lookups: d.lookups,
        keys: d.keys,
        volatile_hits: d.volatile_hits,
        persistent_hits: d.persistent_hits,
        misses: d.misses,
        evictions: d.evictions,
        volatile_rows: d.volatile_rows,
        volatile_bytes: d.volatile_bytes,
        persistent_rows: d.persistent_rows,
        upserts: d.upserts,
        erases: d.erases,
    }
}

/// Opens a parameter server from an HPS configuration file (`ps.json`): every model's tables,
/// tiered as its `volatile_db` and `persistent_db` say. Relative paths in the file are relative
/// to its folder. Configuration errors give `STRATA_CONFIG_ERROR` with the JSON path
/// (`models[1].sparse_files[0]`) and the reason. Fields strata ignores or does not know are
/// listed by `strata_server_warning`.
///
/// One server per configuration per process, as HPS kept: opening a configuration that is
/// already open in this process (the same canonical file path, however spelled, with unchanged
/// content) returns another handle to the same server, with the same tiers and tables, so an
/// update through one handle is seen through every other and memory does not multiply with the
/// number of plugin instances or op kernels. A different configuration whose `persistent_db`
/// names the store folder of one already open is refused with `STRATA_CONFIG_ERROR` naming
/// both (it would keep a volatile tier of its own over the same store and serve stale rows).
/// Thread-safe: many threads may open and free at once.
///
/// Ownership: on success `*out` receives a counted handle the caller frees with
/// `strata_server_free`; the server closes with the last handle.
///
/// # Safety
/// `ps_json_path` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_open(ps_json_path: *const c_char, out: *mut *mut strata_server) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `ps_json_path` is NULL or valid as this export's # Safety section requires.
        let path = unsafe { c_str(ps_json_path, "ps_json_path") }?;
        *out = boxed(crate::server::open_shared(Path::new(path))?);
        Ok(())
    })
}

/// `strata_server_open` from JSON text; relative paths are relative to `base_dir` (NULL: the
/// current directory). The text is only read during the call. The same text with the same
/// (canonical) base folder opens the same server, as `strata_server_open` does for a file.
///
/// # Safety
/// `json` is NULL or a NUL-terminated string; `base_dir` is NULL or a NUL-terminated string; `out`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_open_json(json: *const c_char, base_dir: *const c_char, out: *mut *mut strata_server) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `json` is NULL or valid as this export's # Safety section requires.
        let json = unsafe { c_str(json, "json") }?;
        // SAFETY: `base_dir` is NULL or valid as this export's # Safety section requires.
        let base = if base_dir.is_null() { "." } else { unsafe { c_str(base_dir, "base_dir") }? };
        *out = boxed(crate::server::open_json_shared(json, Path::new(base))?);
        Ok(())
    })
}

/// Frees one handle of a server; the last handle of a server frees it and all its tables, in
/// whatever order the handles go. NULL is a no-op. After the last handle, no lookup or update on
/// its tables may be running or start.
///
/// # Safety
/// `server` is NULL or a live server handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_free(server: *mut strata_server) {
    boundary(|| {
        // SAFETY: `server` is NULL or a handle from strata, not used after this call.
        unsafe { free_boxed(server) };
        Ok(())
    })
}

/// Table `table_id` (its index in the model's `sparse_files`) of `model`. Every handle of one
/// server lends the same table pointer. Ownership: borrowed from the server, valid while any
/// handle of the server is open; `strata_table_free` on it is a no-op.
///
/// # Safety
/// `server` is NULL or a live server handle; `model` is NULL or a NUL-terminated string; `out` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_table(
    server: *mut strata_server,
    model: *const c_char,
    table_id: i32,
    out: *mut *mut strata_table,
) -> Status {
    boundary(|| {
        // SAFETY: `out` is NULL or valid as this export's # Safety section requires.
        let out = unsafe { out_handle(out, "out") }?;
        // SAFETY: `server` is NULL or valid as this export's # Safety section requires.
        let server = unsafe { server_arg(server) }?;
        // SAFETY: `model` is NULL or valid as this export's # Safety section requires.
        let model = unsafe { c_str(model, "model") }?;
        *out = lent(server.table(model, table_id)?);
        Ok(())
    })
}

/// The number of models in `*count`.
///
/// # Safety
/// `server` is NULL or a live server handle; `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_num_models(server: *const strata_server, count: *mut i32) -> Status {
    boundary(|| {
        // SAFETY: `server` is NULL or valid as this export's # Safety section requires.
        let s = unsafe { server_arg(server) }?;
        // SAFETY: `count` is NULL or valid as this export's # Safety section requires.
        unsafe { write_count(count, "count", s.models().len()) }
    })
}

/// The name of model `index` in `*name` (owned by the server, valid until it is freed) and its
/// number of tables in `*num_tables` (may be NULL).
///
/// # Safety
/// `server` is NULL or a live server handle; `name` is NULL or writable; `num_tables` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_model(
    server: *const strata_server,
    index: i32,
    name: *mut *const c_char,
    num_tables: *mut i32,
) -> Status {
    boundary(|| {
        // SAFETY: `server` is NULL or valid as this export's # Safety section requires.
        let server = unsafe { server_arg(server) }?;
        // SAFETY: `name` is NULL or valid as this export's # Safety section requires.
        let name = unsafe { arg_mut(name, "name") }?;
        let m = server.model_at(index)?;
        *name = m.name.as_ptr();
        // SAFETY: `num_tables` is NULL or valid as this export's # Safety section requires.
        unsafe { write_opt(num_tables, m.tables.len() as i32) };
        Ok(())
    })
}

/// The name of table `table_id` of `model` (its `embedding_table_names` entry, which defaults
/// to `sparse_embeddingN` as in HPS), owned by the server and valid until it is freed.
///
/// # Safety
/// `server` is NULL or a live server handle; `model` is NULL or a NUL-terminated string; `name` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_table_name(
    server: *const strata_server,
    model: *const c_char,
    table_id: i32,
    name: *mut *const c_char,
) -> Status {
    boundary(|| {
        // SAFETY: `server` is NULL or valid as this export's # Safety section requires.
        let server = unsafe { server_arg(server) }?;
        // SAFETY: `model` is NULL or valid as this export's # Safety section requires.
        let model = unsafe { c_str(model, "model") }?;
        // SAFETY: `name` is NULL or valid as this export's # Safety section requires.
        let name = unsafe { arg_mut(name, "name") }?;
        *name = server.table_name(model, table_id)?.as_ptr();
        Ok(())
    })
}

/// The number of configuration warnings (fields ignored or unknown) in `*count`.
///
/// # Safety
/// `server` is NULL or a live server handle; `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_num_warnings(server: *const strata_server, count: *mut i32) -> Status {
    boundary(|| {
        // SAFETY: `server` is NULL or valid as this export's # Safety section requires.
        let s = unsafe { server_arg(server) }?;
        // SAFETY: `count` is NULL or valid as this export's # Safety section requires.
        unsafe { write_count(count, "count", s.warnings().len()) }
    })
}

/// Warning `index` ("models[0].dense_file: ignored ..."), owned by the server.
///
/// # Safety
/// `server` is NULL or a live server handle; `text` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_warning(server: *const strata_server, index: i32, text: *mut *const c_char) -> Status {
    boundary(|| {
        // SAFETY: `server` is NULL or valid as this export's # Safety section requires.
        let server = unsafe { server_arg(server) }?;
        // SAFETY: `text` is NULL or valid as this export's # Safety section requires.
        let text = unsafe { arg_mut(text, "text") }?;
        *text = server.warning(index)?.as_ptr();
        Ok(())
    })
}

/// Inserts or overwrites rows of a server table: `keys` a 1-D integer tensor of n keys,
/// `vectors` [n, dim] float32/float16/bfloat16, host memory, read during the call only. When
/// this returns `STRATA_OK` the rows are committed to the persistent tier (if the table has
/// one): a crash right after loses nothing. Lookups running meanwhile see each row old or new,
/// never a mix. Tables that cannot change (static tables, read-only persistent tiers) give
/// `STRATA_READ_ONLY`.
///
/// # Safety
/// `table` is NULL or a live table handle; `keys` is NULL or a DLPack tensor whose memory is valid
/// as its shape, strides and device describe; `vectors` is NULL or a DLPack tensor whose memory is
/// valid as its shape, strides and device describe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_upsert(table: *mut strata_table, keys: *const DLTensor, vectors: *const DLTensor) -> Status {
    boundary(|| {
        // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
        let table = unsafe { table_arg(table, "table") }?;
        // SAFETY: `keys` is NULL or valid, and its memory too, as this export's # Safety section requires.
        let keys = unsafe { Vouched::new(arg_ref(keys, "keys")?) };
        // SAFETY: `vectors` is NULL or valid, and its memory too, as this export's # Safety section requires.
        let vectors = unsafe { Vouched::new(arg_ref(vectors, "vectors")?) };
        table.upsert(keys, vectors)
    })
}

/// Removes `keys` (a 1-D integer tensor) from every tier of a server table; `*erased` (may be
/// NULL) receives how many it held. Same durability and errors as `strata_table_upsert`.
///
/// # Safety
/// `table` is NULL or a live table handle; `keys` is NULL or a DLPack tensor whose memory is valid
/// as its shape, strides and device describe; `erased` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_erase(table: *mut strata_table, keys: *const DLTensor, erased: *mut u64) -> Status {
    boundary(|| {
        // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
        let table = unsafe { table_arg(table, "table") }?;
        // SAFETY: `keys` is NULL or valid, and its memory too, as this export's # Safety section requires.
        let n = table.erase(unsafe { Vouched::new(arg_ref(keys, "keys")?) })?;
        // SAFETY: `erased` is NULL or valid as this export's # Safety section requires.
        unsafe { write_opt(erased, n) };
        Ok(())
    })
}

/// Cumulative counters of a table's tiers since it was opened: lookups, per-tier hits, misses,
/// evictions, rows and bytes, upserts and erases (all zero for static tables). `stats` is an
/// out-struct: set its `struct_size` first (`strata_table_stats_default()`).
///
/// # Safety
/// `table` is NULL or a live table handle; `stats` is NULL or points to `struct_size` writable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_get_stats(table: *const strata_table, stats: *mut strata_table_stats) -> Status {
    boundary(|| {
        // SAFETY: `table` is NULL or valid as this export's # Safety section requires.
        let table = unsafe { table_arg(table, "table") }?;
        // SAFETY: `stats` is NULL or valid as this export's # Safety section requires.
        let stats = unsafe { out_struct_required(stats, "stats") }?;
        stats.write(&strata_table_stats::of(table));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::sized::Extensible;
    use std::mem::offset_of;

    /// The first published layout (strata 0.3), frozen: fields are only ever appended.
    #[test]
    fn first_published_layout_is_frozen() {
        assert_eq!([offset_of!(strata_table_stats, lookups), offset_of!(strata_table_stats, erases)], [8, 88]);
        assert_eq!(strata_table_stats::FIRST_SIZE, 96);
        // 0.3.1 appended how rows are stored.
        assert_eq!([offset_of!(strata_table_stats, storage), offset_of!(strata_table_stats, row_bytes)], [96, 104]);
        assert_eq!(size_of::<strata_table_stats>(), 112);
        assert_eq!(strata_table_stats_default().struct_size, 96);
        assert_eq!(strata_table_stats_default_0_3_1().struct_size, 112);
    }
}
