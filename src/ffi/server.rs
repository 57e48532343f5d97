//! The parameter server (`strata_server_*`) and table updates (`strata_table_upsert`,
//! `strata_table_erase`, `strata_table_get_stats`).

use super::{arg_ref, boundary, out_arg};
use crate::error::{Error, Result, Status};
use crate::server::Server;
use crate::table::Table;
use crate::tiered::TableStats;
use dlpark::ffi::DLTensor;
use std::ffi::{CStr, c_char};
use std::path::Path;

/// A required C string argument, as UTF-8.
unsafe fn arg_str<'a>(p: *const c_char, arg: &'static str) -> Result<&'a str> {
    let p = unsafe { arg_ref(p, arg) }?;
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| Error::invalid(arg, "is not valid UTF-8"))
}

/// Opens a parameter server from an HPS configuration file (`ps.json`): every model's tables,
/// tiered as its `volatile_db` and `persistent_db` say. Relative paths in the file are relative
/// to its folder. Configuration errors give `STRATA_CONFIG_ERROR` with the JSON path
/// (`models[1].sparse_files[0]`) and the reason. Fields strata ignores or does not know are
/// listed by `strata_server_warning`.
///
/// Ownership: on success `*out` receives a server the caller frees with `strata_server_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_open(ps_json_path: *const c_char, out: *mut *mut Server) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        let path = unsafe { arg_str(ps_json_path, "ps_json_path") }?;
        *out = Box::into_raw(Box::new(Server::open(Path::new(path))?));
        Ok(())
    })
}

/// `strata_server_open` from JSON text; relative paths are relative to `base_dir` (NULL: the
/// current directory). The text is only read during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_open_json(
    json: *const c_char,
    base_dir: *const c_char,
    out: *mut *mut Server,
) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        let json = unsafe { arg_str(json, "json") }?;
        let base = if base_dir.is_null() { "." } else { unsafe { arg_str(base_dir, "base_dir") }? };
        *out = Box::into_raw(Box::new(Server::from_json(json, Path::new(base))?));
        Ok(())
    })
}

/// Frees a server and all its tables. NULL is a no-op. No lookup or update on its tables may
/// be running or start afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_free(server: *mut Server) {
    if !server.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(unsafe { Box::from_raw(server) })));
    }
}

/// Table `table_id` (its index in the model's `sparse_files`) of `model`. Ownership: borrowed
/// from the server, valid until `strata_server_free`; `strata_table_free` on it is a no-op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_table(
    server: *mut Server,
    model: *const c_char,
    table_id: i32,
    out: *mut *mut Table,
) -> Status {
    boundary(|| {
        let out = unsafe { out_arg(out, "out") }?;
        let server = unsafe { arg_ref(server, "server") }?;
        let model = unsafe { arg_str(model, "model") }?;
        *out = server.table(model, table_id)? as *const Table as *mut Table;
        Ok(())
    })
}

/// The number of models in `*count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_num_models(server: *const Server, count: *mut i32) -> Status {
    boundary(|| {
        let server = unsafe { arg_ref(server, "server") }?;
        let count = unsafe { count.as_mut() }.ok_or(Error::Null { arg: "count" })?;
        *count = server.models().len() as i32;
        Ok(())
    })
}

/// The name of model `index` in `*name` (owned by the server, valid until it is freed) and its
/// number of tables in `*num_tables` (may be NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_model(
    server: *const Server,
    index: i32,
    name: *mut *const c_char,
    num_tables: *mut i32,
) -> Status {
    boundary(|| {
        let server = unsafe { arg_ref(server, "server") }?;
        let name = unsafe { name.as_mut() }.ok_or(Error::Null { arg: "name" })?;
        let m = usize::try_from(index).ok().and_then(|i| server.models().get(i)).ok_or_else(|| {
            Error::invalid("index", format!("{index}; the server has models 0..{}", server.models().len()))
        })?;
        *name = m.name.as_ptr();
        if let Some(n) = unsafe { num_tables.as_mut() } {
            *n = m.tables.len() as i32;
        }
        Ok(())
    })
}

/// The name of table `table_id` of `model` (its `embedding_table_names` entry, or `tableN`), owned
/// by the server.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_table_name(
    server: *const Server,
    model: *const c_char,
    table_id: i32,
    name: *mut *const c_char,
) -> Status {
    boundary(|| {
        let server = unsafe { arg_ref(server, "server") }?;
        let model = unsafe { arg_str(model, "model") }?;
        let name = unsafe { name.as_mut() }.ok_or(Error::Null { arg: "name" })?;
        server.table(model, table_id)?;
        *name = server.model(model)?.table_names[table_id as usize].as_ptr();
        Ok(())
    })
}

/// The number of configuration warnings (fields ignored or unknown) in `*count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_num_warnings(server: *const Server, count: *mut i32) -> Status {
    boundary(|| {
        let server = unsafe { arg_ref(server, "server") }?;
        let count = unsafe { count.as_mut() }.ok_or(Error::Null { arg: "count" })?;
        *count = server.warnings().len() as i32;
        Ok(())
    })
}

/// Warning `index` ("models[0].dense_file: ignored ..."), owned by the server.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_server_warning(server: *const Server, index: i32, text: *mut *const c_char) -> Status {
    boundary(|| {
        let server = unsafe { arg_ref(server, "server") }?;
        let text = unsafe { text.as_mut() }.ok_or(Error::Null { arg: "text" })?;
        let w = usize::try_from(index).ok().and_then(|i| server.warnings().get(i)).ok_or_else(|| {
            Error::invalid("index", format!("{index}; the server has warnings 0..{}", server.warnings().len()))
        })?;
        *text = w.as_ptr();
        Ok(())
    })
}

/// Inserts or overwrites rows of a server table: `keys` a 1-D integer tensor of n keys,
/// `vectors` [n, dim] float32/float16/bfloat16, host memory, read during the call only. When
/// this returns `STRATA_OK` the rows are committed to the persistent tier (if the table has
/// one): a crash right after loses nothing. Lookups running meanwhile see each row old or new,
/// never a mix. Tables that cannot change (static tables, read-only persistent tiers) give
/// `STRATA_READ_ONLY`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_upsert(table: *mut Table, keys: *const DLTensor, vectors: *const DLTensor) -> Status {
    boundary(|| {
        let table = unsafe { arg_ref(table, "table") }?;
        let keys = unsafe { arg_ref(keys, "keys") }?;
        let vectors = unsafe { arg_ref(vectors, "vectors") }?;
        unsafe { table.upsert(keys, vectors) }
    })
}

/// Removes `keys` (a 1-D integer tensor) from every tier of a server table; `*erased` (may be
/// NULL) receives how many it held. Same durability and errors as `strata_table_upsert`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_erase(table: *mut Table, keys: *const DLTensor, erased: *mut u64) -> Status {
    boundary(|| {
        let table = unsafe { arg_ref(table, "table") }?;
        let keys = unsafe { arg_ref(keys, "keys") }?;
        let n = unsafe { table.erase(keys) }?;
        if let Some(e) = unsafe { erased.as_mut() } {
            *e = n;
        }
        Ok(())
    })
}

/// Cumulative counters of a table's tiers since it was opened: lookups, per-tier hits, misses,
/// evictions, rows and bytes, upserts and erases (all zero for static tables).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_table_get_stats(table: *const Table, stats: *mut TableStats) -> Status {
    boundary(|| {
        let table = unsafe { arg_ref(table, "table") }?;
        let stats = unsafe { stats.as_mut() }.ok_or(Error::Null { arg: "stats" })?;
        *stats = table.stats();
        Ok(())
    })
}
