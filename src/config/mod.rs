//! Parameter-server configuration: HPS `ps.json`, parsed with JSON paths in every error.
//!
//! [`parse`] and [`load`] read the JSON file that NVIDIA HugeCTR's Hierarchical Parameter
//! Server (HPS) takes, with HPS's field names, meanings and defaults (HugeCTR 3.x-24.x), into a
//! [`PsConfig`], in two steps:
//!
//! 1. `json`: the text, with its comments blanked, is read as JSON, then deserialised into
//!    types that mirror the file (serde derive; HPS's defaults and its parser's aliases are
//!    serde attributes). `serde_path_to_error` names the JSON path of a value of the wrong
//!    type; `serde_ignored` reports every field no type reads.
//! 2. `validate`: one pass checks what the types cannot say and builds the [`PsConfig`], in the
//!    order HPS reads the file (the root, `volatile_db`, `persistent_db`, `update_source`, then
//!    each model), the sparse model folders on disk last.
//!
//! So every problem names its JSON path:
//!
//! - an invalid file is an [`Error::Config`] (`STRATA_CONFIG_ERROR`) whose `path` is the field
//!   (`models[1].sparse_files[0]`, or `(root)`) and whose `msg` says what was wrong and what was
//!   expected: a wrong JSON type, an out-of-range value, an unknown enum string (listing the
//!   accepted ones), a missing required field, per-table lists of different lengths, duplicate
//!   model or table names, a sparse model folder that is missing or incomplete, invalid JSON
//!   (with line and column), or a value strata does not support (`multi_process_hash_map`,
//!   a Kafka update source, remote file systems, TLS to Redis). A file with several
//!   problems reports one: invalid JSON first, then the first value of a wrong type (in the
//!   order of the document, keys sorted), then the first failed check of the validation pass;
//! - a field strata does not know, or knows but does not use, is reported in
//!   [`PsConfig::warnings`] with its path, never silently dropped.
//!
//! Where HPS's documentation and its parser disagree, the parser of HugeCTR 23.x wins for
//! defaults (the values HPS really used), except where the documentation states a default the
//! parser does not apply (see [`PsConfig::supportlonglong`], [`VolatileDbConfig::kind`]).
//!
//! Beyond HPS: `//` and `/* */` comments are accepted (HPS's own documentation annotates its
//! examples with them), and relative paths (`sparse_files`, `persistent_db.path`) are resolved
//! against the folder of the `ps.json` (`base_dir`), not the process's working directory.

mod json;
#[cfg(test)]
mod tests;
mod validate;

use crate::error::{Error, Result};
pub use crate::storage::tier::volatile::OverflowPolicy;
use std::path::{Path, PathBuf};

/// A parsed HPS `ps.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct PsConfig {
    /// The file name used in messages (the `file` argument of [`parse`], the path for [`load`]).
    pub file: String,
    /// Whether keys are 64-bit (HPS `supportlonglong`). HPS documents the default as `true`
    /// (HugeCTR 23.x's parser makes the field mandatory); strata uses `true`.
    pub supportlonglong: bool,
    /// The volatile (host-memory) tier, `volatile_db`.
    pub volatile_db: VolatileDbConfig,
    /// The persistent (on-disk) tier, `persistent_db`.
    pub persistent_db: PersistentDbConfig,
    /// The models, in file order; at least one, with unique names.
    pub models: Vec<ModelConfig>,
    /// Fields present in the file that strata does not know or does not use, each as
    /// `"models[0].dense_file: ignored (dense model files are not served by strata)"` or
    /// `"volatile_db.foo: unknown field"`, in document order per object (keys sorted).
    pub warnings: Vec<String>,
}

impl PsConfig {
    /// The model called `name`.
    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.model == name)
    }
}

/// One entry of `models`. Every per-table list has one entry per sparse file (table).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model's name (`model`, required, unique in the file).
    pub model: String,
    /// One HugeCTR sparse model folder (`key` + `emb_vector`) per embedding table
    /// (`sparse_files`, required, at least one). Relative paths are resolved against the
    /// folder of the `ps.json`; every folder was checked to exist and hold both files, with
    /// sizes that agree with `embedding_vecsize_per_table`.
    pub sparse_files: Vec<PathBuf>,
    /// Table names (`embedding_table_names`); default `sparse_embedding0`,
    /// `sparse_embedding1`, ... (what HPS's parser generates). Unique within the model.
    pub embedding_table_names: Vec<String>,
    /// Floats per row of each table (`embedding_vecsize_per_table`, required),
    /// `1..=STRATA_MAX_DIM` (`strata::ffi::STRATA_MAX_DIM`).
    pub embedding_vecsize_per_table: Vec<usize>,
    /// The value of every element of a missing key's row, per table
    /// (`default_value_for_each_table`); default 0.0 for every table.
    pub default_value_for_each_table: Vec<f32>,
    /// How each table stores its rows (`strata_storage_per_table`, a strata extension HPS
    /// does not have): float32 (the default) or converted or quantized (`float16`, `bfloat16`,
    /// `int8`, `int4`), in the volatile tier and in a table served without tiers. Rows read
    /// from the persistent tier are passed through the same format, so a key's row is the same
    /// from every tier.
    pub strata_storage_per_table: Vec<crate::kernels::RowFormat>,
    /// The most keys one sample looks up in each table
    /// (`maxnum_catfeature_query_per_table_per_sample`, required by HPS, >= 1). HPS sizes its
    /// GPU buffers with it (`max_batch_size` x this).
    pub maxnum_catfeature_query_per_table_per_sample: Vec<usize>,
    /// The most samples in one lookup batch (`max_batch_size`); default 64, >= 1.
    pub max_batch_size: usize,
    /// CUDA devices the model is deployed on (`deployed_device_list`); default `[0]`, not
    /// empty, ids >= 0.
    pub deployed_device_list: Vec<i32>,
    /// Whether lookups go through a GPU embedding cache (`gpucache`); default `true`.
    pub gpucache: bool,
    /// Fraction of each table the GPU cache holds (`gpucacheper`); default 0.2, in [0, 1].
    pub gpucacheper: f32,
    /// GPU cache hit rate above which missing keys are inserted asynchronously
    /// (`hit_rate_threshold`); default 0.9, >= 0. HPS documents values above 1 as "always
    /// insert synchronously", so they are accepted.
    pub hit_rate_threshold: f32,
    /// Whether the GPU holds each whole table, lookup-only (`use_static_table`); default
    /// `false`. `true` forces [`EmbeddingCacheType::Static`], as in HPS.
    pub use_static_table: bool,
    /// The GPU cache implementation (`embedding_cache_type`): `dynamic` (default), `static`,
    /// `uvm`.
    pub embedding_cache_type: EmbeddingCacheType,
    /// GPU cache worker buffers (`num_of_worker_buffer_in_pool`); default 1 (HPS's parser), >= 1.
    pub num_of_worker_buffer_in_pool: usize,
    /// GPU cache refresh buffers (`num_of_refresher_buffer_in_pool`); default 1, >= 1.
    pub num_of_refresher_buffer_in_pool: usize,
    /// Fraction of the GPU cache refreshed per refresh iteration
    /// (`cache_refresh_percentage_per_iteration`); default 0.0, in [0, 1].
    pub cache_refresh_percentage_per_iteration: f32,
    /// Seconds before the first GPU cache refresh (`refresh_delay`); default 0.0, >= 0.
    pub refresh_delay: f32,
    /// Seconds between GPU cache refreshes (`refresh_interval`); default 0.0 (none), >= 0.
    pub refresh_interval: f32,
}

impl ModelConfig {
    /// Number of embedding tables (sparse files).
    pub fn num_tables(&self) -> usize {
        self.sparse_files.len()
    }

    /// The index of the table called `name`.
    pub fn table_id(&self, name: &str) -> Option<usize> {
        self.embedding_table_names.iter().position(|n| n == name)
    }
}

/// HPS `embedding_cache_type`: how the GPU caches a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingCacheType {
    /// `"dynamic"`: a GPU cache that inserts missed keys (default).
    Dynamic,
    /// `"static"`: the whole table on the GPU, lookup only.
    Static,
    /// `"uvm"`: the table in unified (host) memory, read by the GPU.
    Uvm,
}

/// HPS `volatile_db.type`, as far as strata serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VolatileDbKind {
    /// `"disabled"`: no volatile tier; lookups go to the persistent tier.
    Disabled,
    /// `"hash_map"`: a host hash map.
    HashMap,
    /// `"parallel_hash_map"`: a host hash map split into `num_partitions` concurrently used
    /// shards (HPS's documented default).
    ParallelHashMap,
    /// `"redis_cluster"` (alias `"redis"`): the rows in a Redis Cluster shared by every process
    /// that opens it ([`VolatileDbConfig::redis`]).
    RedisCluster,
}

/// HPS `persistent_db.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PersistentDbKind {
    /// `"disabled"` (default): no persistent tier.
    Disabled,
    /// `"rocks_db"`: HPS's name for its on-disk tier. strata serves it with its own embedded
    /// store at [`PersistentDbConfig::path`].
    RocksDb,
}

impl EmbeddingCacheType {
    /// HPS's name for the value.
    pub fn as_str(self) -> &'static str {
        match self {
            EmbeddingCacheType::Dynamic => "dynamic",
            EmbeddingCacheType::Static => "static",
            EmbeddingCacheType::Uvm => "uvm",
        }
    }
}

impl VolatileDbKind {
    /// HPS's name for the value.
    pub fn as_str(self) -> &'static str {
        match self {
            VolatileDbKind::Disabled => "disabled",
            VolatileDbKind::HashMap => "hash_map",
            VolatileDbKind::ParallelHashMap => "parallel_hash_map",
            VolatileDbKind::RedisCluster => "redis_cluster",
        }
    }
}

impl PersistentDbKind {
    /// HPS's name for the value.
    pub fn as_str(self) -> &'static str {
        match self {
            PersistentDbKind::Disabled => "disabled",
            PersistentDbKind::RocksDb => "rocks_db",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(EmbeddingCacheType, VolatileDbKind, PersistentDbKind);

/// HPS `volatile_db`: the host-memory tier in front of the persistent one. The whole section
/// is optional; [`Default`] gives HPS's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct VolatileDbConfig {
    /// `type`: default `parallel_hash_map` (HPS's documented default; HugeCTR 23.x's parser
    /// instead disables the tier when a `volatile_db` section lacks `type`, which its own
    /// source marks as a wart). Also accepted: HPS's aliases (`hashmap`, `parallel_hashmap`,
    /// `none`, ...), and `redis_cluster` (alias `redis`). `multi_process_hash_map` is refused.
    pub kind: VolatileDbKind,
    /// Shards per table (`num_partitions`); default min(16, CPUs available), >= 1; for
    /// `redis_cluster` the partitions of each table in Redis, default 16 (HPS's), the same in
    /// every process sharing the cluster.
    pub num_partitions: usize,
    /// Most rows a partition holds before its overflow policy runs (`overflow_margin`);
    /// default `usize::MAX` (no limit), >= 1.
    pub overflow_margin: usize,
    /// Which rows an overflowing partition evicts (`overflow_policy`); default `evict_random`.
    pub overflow_policy: OverflowPolicy,
    /// Fraction of `overflow_margin` a partition is shrunk to on overflow
    /// (`overflow_resolution_target`); default 0.8, in (0, 1].
    pub overflow_resolution_target: f64,
    /// Fraction of each table loaded into the tier at start (`initial_cache_rate`); default
    /// 1.0, in [0, 1].
    pub initial_cache_rate: f64,
    /// Whether rows found in the persistent tier are inserted here (`cache_missed_embeddings`);
    /// default `false`.
    pub cache_missed_embeddings: bool,
    /// Rows per batch of bulk inserts, lookups and evictions (`max_batch_size`); default
    /// 65536, >= 1.
    pub max_batch_size: usize,
    /// Whether the tier is filled from the sparse files at start (`initialize_after_startup`);
    /// default `true`.
    pub initialize_after_startup: bool,
    /// How often, at most, a table checks whether another process committed to its persistent
    /// tier (`refresh_interval_ms`, a strata extension; HPS had no equivalent); default 1000,
    /// 0 = at every lookup. A lookup that finds the table's commit counter moved by another
    /// process empties the table's volatile tier (and any GPU cache of it) first, so a foreign
    /// upsert or erase is seen by every lookup that starts `refresh_interval_ms` or more after
    /// it committed: within the interval plus one lookup. A process's own writes never count.
    pub refresh_interval_ms: u64,
    /// The Redis fields, for `type = "redis_cluster"` only (`None` otherwise).
    pub redis: Option<RedisConfig>,
}

/// HPS's `volatile_db` fields of a `redis_cluster` (HugeCTR's `RedisClusterBackendParams`),
/// with HPS's defaults, and strata's timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// `address`: comma-separated `host:port` seeds, any node of the cluster; default
    /// `127.0.0.1:7000`. strata tries each in turn at open (HPS used only the first).
    pub seeds: Vec<String>,
    /// `user_name`: the Redis ACL user; default `default`.
    pub user_name: String,
    /// `password`: the user's password in plain text; default empty (no AUTH).
    pub password: Secret,
    /// `num_node_connections`: most connections kept open to one node; default 5, >= 1.
    pub num_node_connections: usize,
    /// `max_get_batch_size`: keys per pipelined lookup batch; default `max_batch_size`, >= 1.
    pub max_get_batch_size: usize,
    /// `max_set_batch_size`: keys per pipelined write batch; default `max_batch_size`, >= 1.
    pub max_set_batch_size: usize,
    /// `refresh_time_after_fetch`: whether lookups refresh the overflow metadata (time for
    /// `evict_oldest`, use count for `evict_least_used`) of the rows they read; default `true`
    /// (what HugeCTR 23.x always did; HPS 3.x's flag defaulted to false).
    pub refresh_time_after_fetch: bool,
    /// `strata_redis_timeout_ms` (strata's extension): the bound on each connect, pipeline
    /// write and reply; default 1000, >= 1. A node that misses it is treated as down.
    pub timeout_ms: u64,
}

/// A password: compared and cloned like a string, never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

impl Default for VolatileDbConfig {
    /// HPS's defaults: an empty `volatile_db` section.
    fn default() -> Self {
        validate::volatile_db(&json::VolatileDbJson::default()).expect("HPS's defaults are valid")
    }
}

/// HPS `persistent_db`: the on-disk tier. The whole section is optional; [`Default`] gives
/// HPS's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct PersistentDbConfig {
    /// `type`: `disabled` (default) or `rocks_db` (also `rocksdb`, `rocks`, `none`, ...).
    pub kind: PersistentDbKind,
    /// The store's folder (`path`); default `<temp dir>/rocksdb` as in HPS. A relative path is
    /// resolved against the folder of the `ps.json`. It need not exist; if it does, it must be
    /// a folder.
    pub path: PathBuf,
    /// Whether the store is opened read-only (`read_only`); default `false`.
    pub read_only: bool,
    /// Rows per batch of bulk reads and writes (`max_batch_size`); default 65536, >= 1.
    pub max_batch_size: usize,
    /// Whether the store is filled from the sparse files at start
    /// (`initialize_after_startup`); default `true`.
    pub initialize_after_startup: bool,
}

impl Default for PersistentDbConfig {
    /// HPS's defaults: an empty `persistent_db` section.
    fn default() -> Self {
        validate::persistent_db(&json::PersistentDbJson::default(), Path::new(".")).expect("HPS's defaults are valid")
    }
}

/// Reads `path` and parses it with [`parse`]; relative paths inside are resolved against the
/// file's folder (made absolute). A file that cannot be read is an [`Error::Io`].
pub fn load(path: &Path) -> Result<PsConfig> {
    let text =
        std::fs::read_to_string(path).map_err(|source| Error::Io { arg: "ps_json_path", path: path.display().to_string(), source })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let base = std::path::absolute(parent).unwrap_or_else(|_| parent.to_path_buf());
    parse(&text, &path.display().to_string(), &base)
}

/// Parses the text of a `ps.json`. `file` names it in messages; relative paths inside are
/// resolved against `base_dir`. Checks every sparse model folder on disk.
pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<PsConfig> {
    let (doc, ignored) = json::read(text).map_err(|p| p.into_error(file))?;
    validate::validate(&doc, ignored, file, base_dir).map_err(|p| p.into_error(file))
}

// ---------------------------------------------------------------------------------------------
// JSON paths, shared by both steps.

/// The path of the whole document in error messages.
const ROOT: &str = "(root)";

/// What is wrong with the file, and where: an [`Error::Config`] once the file is named.
#[derive(Debug, Clone, PartialEq)]
struct Problem {
    /// The JSON path of the value (`models[1].sparse_files[0]`), or [`ROOT`].
    path: String,
    msg: String,
}

impl Problem {
    fn new(path: &str, msg: impl Into<String>) -> Problem {
        Problem { path: path.to_string(), msg: msg.into() }
    }

    fn into_error(self, file: &str) -> Error {
        Error::Config { file: file.to_string(), path: self.path, msg: self.msg }
    }
}

/// `parent.key`, or `key` at the root.
fn join(parent: &str, key: &str) -> String {
    if parent == ROOT { key.to_string() } else { format!("{parent}.{key}") }
}

/// `parent[i]`.
fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}
