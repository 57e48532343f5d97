//! A parameter server: the tables of every model in an HPS `ps.json`, built once and served
//! through the same `strata_table*` lookups as any other table.
//!
//! Each table is tiered as the configuration says: a volatile tier (`volatile_db`, holding
//! `initial_cache_rate` of the rows at start) in front of a persistent tier (`persistent_db`,
//! created from the sparse files on first open and reused afterwards). With both tiers
//! disabled a table is served straight from its memory-mapped sparse files and is immutable.
//! A [`Server`] is `Send + Sync`; its tables live as long as it does.

mod shared;
pub use shared::{lends, open as open_shared, open_json as open_json_shared};

use crate::config::{self, PersistentDbKind, PsConfig, VolatileDbKind};
use crate::error::{Error, Result};
use crate::model::{FloatDtype, GpuOptions, MissingKey, StaticTable, TableOptions};
use crate::model::{TieredTable, Volatile};
use crate::storage::tier::persistent::PersistentStore;
use crate::storage::tier::redis::{self as redis_tier, Cluster, ClusterOptions, RedisTableOptions, RedisTier};
use crate::storage::tier::volatile::{OverflowPolicy, VolatileTier};
use crate::table::Table;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::sync::Arc;

/// One model of a server and its tables, in `sparse_files` order.
pub struct ServerModel {
    pub(crate) name: CString,
    pub(crate) table_names: Vec<CString>,
    /// Boxed: `strata_server_table` lends pointers to them, which must not move.
    #[allow(clippy::vec_box)]
    pub(crate) tables: Vec<Box<Table>>,
}

/// The tables of every model of a configuration. See the module docs.
pub struct Server {
    pub(crate) models: Vec<ServerModel>,
    pub(crate) warnings: Vec<CString>,
    /// Kept open for the tables' lifetime.
    _store: Option<PersistentStore>,
}

impl Server {
    /// Opens the configuration file at `path` (relative paths in it are relative to its folder).
    pub fn open(path: &Path) -> Result<Server> {
        Server::from_config(config::load(path)?)
    }

    /// Opens a configuration given as JSON text; relative paths are relative to `base_dir`.
    pub fn from_json(text: &str, base_dir: &Path) -> Result<Server> {
        Server::from_config(config::parse(text, "ps.json", base_dir)?)
    }

    /// Builds every table of `cfg`.
    pub fn from_config(cfg: PsConfig) -> Result<Server> {
        let store = match cfg.persistent_db.kind {
            PersistentDbKind::Disabled => None,
            _ => Some(PersistentStore::open(&cfg.persistent_db.path, cfg.persistent_db.read_only)?),
        };
        let v = &cfg.volatile_db;
        let cluster = match &v.redis {
            Some(r) if v.kind == VolatileDbKind::RedisCluster => Some(Arc::new(open_cluster(&cfg, r)?)),
            _ => None,
        };
        let mut models = Vec::with_capacity(cfg.models.len());
        for m in &cfg.models {
            let mut tables = Vec::with_capacity(m.sparse_files.len());
            let mut table_names = Vec::with_capacity(m.sparse_files.len());
            for (i, sparse) in m.sparse_files.iter().enumerate() {
                let dim = m.embedding_vecsize_per_table[i];
                let default_value = m.default_value_for_each_table.get(i).copied().unwrap_or(0.0);
                let table_name = m.embedding_table_names.get(i).cloned().unwrap_or_else(|| format!("table{i}"));
                let name = format!("{}/{}", m.model, table_name);
                let format = m.strata_storage_per_table[i];
                let stored = (format != FloatDtype::F32.into()).then_some(format);
                let options = TableOptions { default_value, storage: stored, ..gpu_options(m) };
                let volatile = match (v.kind, &cluster, &v.redis) {
                    (VolatileDbKind::Disabled, _, _) => None,
                    (VolatileDbKind::RedisCluster, Some(c), Some(r)) => {
                        redis_names(&cfg, m, &table_name)?;
                        Some(Volatile::Redis(Box::new(RedisTier::new(c.clone(), &m.model, &table_name, dim, redis_table_options(&cfg, r)))))
                    }
                    _ => Some(Volatile::Local(VolatileTier::stored_as(
                        format,
                        dim,
                        v.num_partitions,
                        v.overflow_margin,
                        v.overflow_policy,
                        v.overflow_resolution_target,
                    )?)),
                };
                let table = match (&store, volatile) {
                    (None, None) => StaticTable::open(sparse, dim as i64, options)?.into(),
                    (store, volatile) => {
                        let persistent = match store {
                            Some(s) => Some(s.table_stored_as(&name, dim, format, Some(sparse))?),
                            None => None,
                        };
                        // The commit counter before warming: a write committed during the warm
                        // scan is then noticed at the first lookup.
                        let seen = match &persistent {
                            Some(p) => p.commits()?,
                            None => 0,
                        };
                        match &volatile {
                            Some(Volatile::Local(vt)) => warm(vt, persistent.as_ref(), sparse, dim, v.initial_cache_rate)?,
                            Some(Volatile::Redis(rt)) => warm_redis(rt, persistent.as_ref(), sparse, dim, v.initial_cache_rate)?,
                            None => {}
                        }
                        let read_only = persistent.is_some() && cfg.persistent_db.read_only;
                        Table::new(
                            TieredTable::new(
                                name.clone(),
                                dim,
                                volatile,
                                persistent,
                                v.cache_missed_embeddings,
                                read_only,
                                default_value,
                                MissingKey::Fill,
                            )
                            .stored_as(format)
                            .refreshing(std::time::Duration::from_millis(v.refresh_interval_ms), seen),
                            options.gpu,
                        )
                    }
                };
                tables.push(Box::new(table));
                table_names.push(cstring(&table_name, "embedding_table_names")?);
            }
            models.push(ServerModel { name: cstring(&m.model, "model")?, table_names, tables });
        }
        let warnings = cfg.warnings.iter().map(|w| CString::new(w.replace('\0', " ")).unwrap_or_default()).collect();
        Ok(Server { models, warnings, _store: store })
    }

    /// The model named `model`.
    pub fn model(&self, model: &str) -> Result<&ServerModel> {
        self.models.iter().find(|m| m.name.to_bytes() == model.as_bytes()).ok_or_else(|| {
            let names: Vec<String> = self.models.iter().map(|m| m.name.to_string_lossy().into_owned()).collect();
            Error::invalid("model", format!("\"{model}\" is not in the configuration; its models are {names:?}"))
        })
    }

    /// Table `table_id` of `model`.
    pub fn table(&self, model: &str, table_id: i32) -> Result<&Table> {
        let m = self.model(model)?;
        usize::try_from(table_id).ok().and_then(|i| m.tables.get(i)).map(|t| &**t).ok_or_else(|| {
            Error::invalid(
                "table_id",
                format!("{table_id}; model \"{model}\" has tables 0..{} ({} sparse files)", m.tables.len(), m.tables.len()),
            )
        })
    }

    /// The name of table `table_id` of `model` (its `embedding_table_names` entry).
    pub fn table_name(&self, model: &str, table_id: i32) -> Result<&CStr> {
        self.table(model, table_id)?;
        Ok(&self.model(model)?.table_names[table_id as usize])
    }

    /// Model `index`, in configuration order.
    pub fn model_at(&self, index: i32) -> Result<&ServerModel> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.models.get(i))
            .ok_or_else(|| Error::invalid("index", format!("{index}; the server has models 0..{}", self.models.len())))
    }

    /// Warning `index` ("models[0].dense_file: ignored ...").
    pub fn warning(&self, index: i32) -> Result<&CStr> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.warnings.get(i))
            .map(|w| w.as_c_str())
            .ok_or_else(|| Error::invalid("index", format!("{index}; the server has warnings 0..{}", self.warnings.len())))
    }

    /// Whether `table` is one of this server's tables.
    pub fn holds(&self, table: &Table) -> bool {
        self.models.iter().any(|m| m.tables.iter().any(|t| std::ptr::eq(&**t, table)))
    }

    /// The models, in configuration order.
    pub fn models(&self) -> &[ServerModel] {
        &self.models
    }

    /// Configuration fields strata ignored or did not know, with their JSON paths.
    pub fn warnings(&self) -> &[CString] {
        &self.warnings
    }
}

/// Connects to the cluster of a `redis_cluster` configuration; a problem is a configuration
/// error naming its `volatile_db` field.
fn open_cluster(cfg: &PsConfig, r: &config::RedisConfig) -> Result<Cluster> {
    Cluster::open(ClusterOptions {
        seeds: r.seeds.clone(),
        user_name: r.user_name.clone(),
        password: r.password.0.clone(),
        connections_per_node: r.num_node_connections,
        timeout: std::time::Duration::from_millis(r.timeout_ms),
    })
    .map_err(|p| Error::Config { file: cfg.file.clone(), path: format!("volatile_db.{}", p.field), msg: p.msg })
}

/// A table's Redis settings from the configuration.
fn redis_table_options(cfg: &PsConfig, r: &config::RedisConfig) -> RedisTableOptions {
    let v = &cfg.volatile_db;
    RedisTableOptions {
        num_partitions: v.num_partitions,
        max_get_batch_size: r.max_get_batch_size,
        max_set_batch_size: r.max_set_batch_size,
        overflow_margin: v.overflow_margin,
        eviction: match v.overflow_policy {
            OverflowPolicy::EvictRandom => redis_tier::Eviction::Random,
            OverflowPolicy::EvictLeastUsed => redis_tier::Eviction::LeastUsed,
            OverflowPolicy::EvictOldest => redis_tier::Eviction::Oldest,
        },
        resolution_target: v.overflow_resolution_target,
        refresh_after_fetch: r.refresh_time_after_fetch,
        key_width: if cfg.supportlonglong { 8 } else { 4 },
    }
}

/// Model and table names end up inside Redis hash tags (`hps_et{hps_et.<model>.<table>/p0}v`):
/// braces there would split a partition's keys over slots.
fn redis_names(cfg: &PsConfig, m: &crate::config::ModelConfig, table: &str) -> Result<()> {
    let i = cfg.models.iter().position(|x| x.model == m.model).unwrap_or(0);
    let bad = |s: &str| s.contains('{') || s.contains('}');
    let (path, name) = if bad(&m.model) {
        (format!("models[{i}].model"), m.model.as_str())
    } else if bad(table) {
        (format!("models[{i}].embedding_table_names"), table)
    } else {
        return Ok(());
    };
    Err(Error::Config {
        file: cfg.file.clone(),
        path,
        msg: format!(
            "\"{name}\" contains a brace; with volatile_db.type redis_cluster names must not contain {{ or }} (HPS allows [a-zA-Z0-9_-])"
        ),
    })
}

/// Warms a Redis tier at open (`initial_cache_rate`), unless the cluster already holds that
/// many rows of the table (another process, or HPS, filled it). Rows go in as promotions: only
/// where absent, and not into a partition another process wrote meanwhile.
fn warm_redis(
    r: &RedisTier,
    persistent: Option<&crate::storage::tier::persistent::PersistentTable>,
    sparse: &Path,
    dim: usize,
    rate: f64,
) -> Result<()> {
    const BATCH: usize = 4096;
    let total = match persistent {
        Some(p) => p.len()? as usize,
        None => StaticTable::open(sparse, dim as i64, TableOptions::default())?.len(),
    };
    let limit = (total as f64 * rate).ceil() as usize;
    if limit == 0 || r.len().is_ok_and(|n| n as usize >= limit) {
        return Ok(());
    }
    let gens = r.all_generations();
    let mut keys = Vec::with_capacity(BATCH);
    let mut rows = Vec::with_capacity(BATCH * dim);
    let flush = |keys: &mut Vec<u64>, rows: &mut Vec<f32>| {
        r.promote(keys, rows, &gens);
        keys.clear();
        rows.clear();
    };
    match persistent {
        Some(p) => p.scan(limit, |k, row| {
            keys.push(k);
            rows.extend_from_slice(row);
            if keys.len() == BATCH {
                flush(&mut keys, &mut rows);
            }
        })?,
        None => {
            let t = StaticTable::open(sparse, dim as i64, TableOptions::default())?;
            for (k, row) in t.rows_in_file_order().take(limit) {
                keys.push(k);
                rows.extend_from_slice(row);
                if keys.len() == BATCH {
                    flush(&mut keys, &mut rows);
                }
            }
        }
    }
    flush(&mut keys, &mut rows);
    Ok(())
}

fn cstring(s: &str, what: &'static str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(what, format!("{s:?} contains a NUL byte")))
}

/// Loads `rate` of a table's rows into its volatile tier at start (HPS `initial_cache_rate`):
/// from the persistent tier when there is one, else from the sparse files.
fn warm(
    v: &VolatileTier,
    persistent: Option<&crate::storage::tier::persistent::PersistentTable>,
    sparse: &Path,
    dim: usize,
    rate: f64,
) -> Result<()> {
    const BATCH: usize = 4096;
    let mut keys = Vec::with_capacity(BATCH);
    let mut rows = Vec::with_capacity(BATCH * dim);
    let flush = |keys: &mut Vec<u64>, rows: &mut Vec<f32>| {
        v.insert_many(keys, rows);
        keys.clear();
        rows.clear();
    };
    match persistent {
        Some(p) if p.format() == v.format() => {
            // Rows the volatile tier stores as the persistent tier does go in as stored.
            let limit = (p.len()? as f64 * rate).ceil() as usize;
            let mut stored = Vec::new();
            p.scan_stored(limit, |k, row| {
                keys.push(k);
                stored.extend_from_slice(row);
                if keys.len() == BATCH {
                    v.insert_many_stored(&keys, &stored);
                    keys.clear();
                    stored.clear();
                }
                Ok(())
            })?;
            v.insert_many_stored(&keys, &stored);
            keys.clear();
        }
        Some(p) => {
            let total = p.len()? as f64;
            let limit = (total * rate).ceil() as usize;
            p.scan(limit, |k, row| {
                keys.push(k);
                rows.extend_from_slice(row);
                if keys.len() == BATCH {
                    flush(&mut keys, &mut rows);
                }
            })?;
        }
        None => {
            let t = StaticTable::open(sparse, dim as i64, TableOptions::default())?;
            let limit = (t.len() as f64 * rate).ceil() as usize;
            for (k, r) in t.rows_in_file_order().take(limit) {
                keys.push(k);
                rows.extend_from_slice(r);
                if keys.len() == BATCH {
                    flush(&mut keys, &mut rows);
                }
            }
        }
    }
    flush(&mut keys, &mut rows);
    Ok(())
}

/// A model's HPS GPU fields as table options: `use_static_table` places the whole table on the
/// GPU; without `gpucache` every GPU lookup is resolved on the host (a cache of no rows);
/// otherwise `embedding_cache_type` picks a cache of `gpucacheper` of the rows (dynamic), the
/// whole table (static) or the table in mapped host memory (uvm). Tables served from tiers have
/// no flat copy to place: static and uvm become a cache of every row.
fn gpu_options(m: &crate::config::ModelConfig) -> TableOptions {
    use crate::config::EmbeddingCacheType;
    use crate::model::GpuPlacement::*;
    let (placement, cache_fraction) = if m.use_static_table {
        (Static, 1.0)
    } else if !m.gpucache {
        (Cache, 0.0)
    } else {
        match m.embedding_cache_type {
            EmbeddingCacheType::Dynamic => (Cache, m.gpucacheper),
            EmbeddingCacheType::Static => (Static, 1.0),
            EmbeddingCacheType::Uvm => (Uvm, 1.0),
        }
    };
    let gpu = GpuOptions { placement, cache_fraction, hit_rate_threshold: m.hit_rate_threshold, ..GpuOptions::default() };
    TableOptions { gpu, ..TableOptions::default() }
}

#[cfg(test)]
mod tests;
