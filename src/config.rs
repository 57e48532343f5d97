//! Parameter-server configuration: HPS `ps.json`, parsed with JSON paths in every error.
//!
//! [`parse`] and [`load`] read the JSON file that NVIDIA HugeCTR's Hierarchical Parameter
//! Server (HPS) takes, with HPS's field names, meanings and defaults (HugeCTR 3.x-24.x), into a
//! [`PsConfig`]. The JSON is walked by hand so that every problem names its JSON path:
//!
//! - an invalid file is an [`Error::Config`] (`STRATA_CONFIG_ERROR`) whose `path` is the field
//!   (`models[1].sparse_files[0]`, or `(root)`) and whose `msg` says what was wrong and what was
//!   expected: a wrong JSON type, an out-of-range value, an unknown enum string (listing the
//!   accepted ones), a missing required field, per-table lists of different lengths, duplicate
//!   model or table names, a sparse model folder that is missing or incomplete, invalid JSON
//!   (with line and column), or a value strata does not support (`redis_cluster`,
//!   `multi_process_hash_map`, a Kafka update source, remote file systems);
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

use crate::error::{Error, Result};
use crate::hugectr::{self, FolderProblem, SizeMismatch};
use crate::limits::MAX_DIM as STRATA_MAX_DIM;
pub use crate::tier::volatile::OverflowPolicy;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The path of the whole document in error messages.
const ROOT: &str = "(root)";

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
    /// `1..=STRATA_MAX_DIM`.
    pub embedding_vecsize_per_table: Vec<usize>,
    /// The value of every element of a missing key's row, per table
    /// (`default_value_for_each_table`); default 0.0 for every table.
    pub default_value_for_each_table: Vec<f32>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// `none`, ...). `redis_cluster` and `multi_process_hash_map` are refused.
    pub kind: VolatileDbKind,
    /// Shards per table (`num_partitions`); default min(16, CPUs available), >= 1.
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
}

impl Default for VolatileDbConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        VolatileDbConfig {
            kind: VolatileDbKind::ParallelHashMap,
            num_partitions: cpus.min(16),
            overflow_margin: usize::MAX,
            overflow_policy: OverflowPolicy::EvictRandom,
            overflow_resolution_target: 0.8,
            initial_cache_rate: 1.0,
            cache_missed_embeddings: false,
            max_batch_size: 65536,
            initialize_after_startup: true,
        }
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
    fn default() -> Self {
        PersistentDbConfig {
            kind: PersistentDbKind::Disabled,
            path: std::env::temp_dir().join("rocksdb"),
            read_only: false,
            max_batch_size: 65536,
            initialize_after_startup: true,
        }
    }
}

/// Reads `path` and parses it with [`parse`]; relative paths inside are resolved against the
/// file's folder (made absolute). A file that cannot be read is an [`Error::Io`].
pub fn load(path: &Path) -> Result<PsConfig> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        arg: "ps_json_path",
        path: path.display().to_string(),
        source,
    })?;
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
    let mut p = Parser { file, base_dir, warnings: Vec::new() };
    let cleaned = blank_comments(text);
    let root: Value = serde_json::from_str(&cleaned).map_err(|e| p.err(ROOT, json_error_message(&e)))?;
    let root = p.object(&root, ROOT)?;
    p.report_fields(&root, TOP_USED, TOP_IGNORED);

    let supportlonglong = p.opt_bool(&root, "supportlonglong", true)?;
    let volatile_db = match root.get("volatile_db") {
        Some(v) => p.volatile_db(v)?,
        None => VolatileDbConfig::default(),
    };
    let persistent_db = match root.get("persistent_db") {
        Some(v) => p.persistent_db(v)?,
        None => PersistentDbConfig::default(),
    };
    if let Some(v) = root.get("update_source") {
        p.update_source(v)?;
    }
    let models = p.models(&root)?;
    Ok(PsConfig { file: file.to_string(), supportlonglong, volatile_db, persistent_db, models, warnings: p.warnings })
}

// ---------------------------------------------------------------------------------------------
// Which fields each object may hold.

const TOP_USED: &[&str] = &["supportlonglong", "models", "volatile_db", "persistent_db", "update_source"];
const TOP_IGNORED: &[(&str, &str)] = &[(
    "fuse_embedding_table",
    "strata looks each table up on its own; table fusion is an HPS GPU-plugin optimisation",
)];

const MODEL_USED: &[&str] = &[
    "model",
    "sparse_files",
    "embedding_table_names",
    "embedding_vecsize_per_table",
    "default_value_for_each_table",
    "maxnum_catfeature_query_per_table_per_sample",
    "max_batch_size",
    "deployed_device_list",
    "gpucache",
    "gpucacheper",
    "hit_rate_threshold",
    "use_static_table",
    "embedding_cache_type",
    "num_of_worker_buffer_in_pool",
    "num_of_refresher_buffer_in_pool",
    "cache_refresh_percentage_per_iteration",
    "refresh_delay",
    "refresh_interval",
];
const DENSE: &str = "the dense network is not served by strata";
const MODEL_IGNORED: &[(&str, &str)] = &[
    ("dense_file", "dense model files are not served by strata"),
    ("network_file", DENSE),
    ("non_trainable_params_file", DENSE),
    ("maxnum_des_feature_per_sample", "dense features are not served by strata"),
    ("label_dim", DENSE),
    ("slot_num", DENSE),
    ("use_mixed_precision", DENSE),
    ("scaler", DENSE),
    ("use_algorithm_search", DENSE),
    ("use_cuda_graph", DENSE),
    ("thread_pool_size", "strata sizes its own thread pool (STRATA_NUM_THREADS, lookup options)"),
    ("use_context_stream", "strata always runs on the stream given to each lookup"),
    ("i64_input_key", "the key type comes from each lookup's key tensor"),
    ("device_id", "HPS replaced it with deployed_device_list"),
    ("use_hctr_cache_implementation", "an HPS GPU-cache implementation switch"),
    ("init_ec", "an HPS GPU-cache implementation switch"),
    ("enable_pagelock", "an HPS GPU-cache implementation switch"),
    ("fp8_quant", "strata keeps the vectors as stored (no quantisation)"),
];

const VOLATILE_USED: &[&str] = &[
    "type",
    "num_partitions",
    "overflow_margin",
    "overflow_policy",
    "overflow_resolution_target",
    "initial_cache_rate",
    "cache_missed_embeddings",
    "max_batch_size",
    "initialize_after_startup",
];
const REDIS: &str = "only used by redis_cluster, which strata does not support";
const SHM: &str = "only used by multi_process_hash_map, which strata does not support";
const KAFKA: &str = "only used with a Kafka update source, which strata does not support";
const OLD_BATCH: &str = "HPS 3.x name; strata reads max_batch_size";
const VOLATILE_IGNORED: &[(&str, &str)] = &[
    ("address", REDIS),
    ("user_name", REDIS),
    ("password", REDIS),
    ("num_node_connections", REDIS),
    ("enable_tls", REDIS),
    ("tls_ca_certificate", REDIS),
    ("tls_client_certificate", REDIS),
    ("tls_client_key", REDIS),
    ("tls_server_name_identification", REDIS),
    ("shared_memory_size", SHM),
    ("shared_memory_name", SHM),
    ("shared_memory_auto_remove", SHM),
    ("allocation_rate", "strata allocates the volatile tier itself"),
    ("refresh_time_after_fetch", "HPS 3.x option; the overflow policy decides what is tracked"),
    ("max_get_batch_size", OLD_BATCH),
    ("max_set_batch_size", OLD_BATCH),
    ("update_filters", KAFKA),
];

const PERSISTENT_USED: &[&str] = &["type", "path", "read_only", "max_batch_size", "initialize_after_startup"];
const PERSISTENT_IGNORED: &[(&str, &str)] = &[
    ("num_threads", "a RocksDB driver setting; strata's store needs no threads of its own"),
    ("max_get_batch_size", OLD_BATCH),
    ("max_set_batch_size", OLD_BATCH),
    ("update_filters", KAFKA),
];

const UPDATE_SOURCE_USED: &[&str] = &["type"];
const NO_SOURCE: &str = "no update source is configured";
const UPDATE_SOURCE_IGNORED: &[(&str, &str)] = &[
    ("brokers", NO_SOURCE),
    ("metadata_refresh_interval_ms", NO_SOURCE),
    ("receive_buffer_size", NO_SOURCE),
    ("poll_timeout_ms", NO_SOURCE),
    ("max_batch_size", NO_SOURCE),
    ("failure_backoff_ms", NO_SOURCE),
    ("max_commit_interval", NO_SOURCE),
];

// ---------------------------------------------------------------------------------------------
// The walker.

/// `parent.key`, or `key` at the root.
fn join(parent: &str, key: &str) -> String {
    if parent == ROOT { key.to_string() } else { format!("{parent}.{key}") }
}

/// `parent[i]`.
fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

/// "a string", "an array", ... for "got ..." in messages.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The accepted names of an enum, quoted, for messages.
fn one_of(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    match q.len() {
        0 => String::new(),
        1 => q[0].clone(),
        n => format!("one of {} or {}", q[..n - 1].join(", "), q[n - 1]),
    }
}

/// An object of the document and its JSON path.
struct Obj<'v> {
    map: &'v Map<String, Value>,
    path: String,
}

impl<'v> Obj<'v> {
    fn get(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key)
    }
    fn at(&self, key: &str) -> String {
        join(&self.path, key)
    }
}

/// Allowed range of a floating-point field.
#[derive(Clone, Copy)]
enum Range {
    /// [0, 1]
    Fraction,
    /// (0, 1]
    PositiveFraction,
    /// [0, inf)
    NonNegative,
    /// any finite value
    Any,
}

struct Parser<'a> {
    file: &'a str,
    base_dir: &'a Path,
    warnings: Vec<String>,
}

impl<'a> Parser<'a> {
    fn err(&self, path: &str, msg: impl Into<String>) -> Error {
        Error::Config { file: self.file.to_string(), path: path.to_string(), msg: msg.into() }
    }

    /// Reports every field of `o` that is not in `used`: with its reason when it is in
    /// `ignored`, else as unknown.
    fn report_fields(&mut self, o: &Obj, used: &[&str], ignored: &[(&str, &str)]) {
        for key in o.map.keys() {
            if used.contains(&key.as_str()) {
                continue;
            }
            let path = o.at(key);
            match ignored.iter().find(|(k, _)| k == key) {
                Some((_, why)) => self.warnings.push(format!("{path}: ignored ({why})")),
                None => self.warnings.push(format!("{path}: unknown field")),
            }
        }
    }

    // ---- values ----

    fn object<'v>(&self, v: &'v Value, path: &str) -> Result<Obj<'v>> {
        match v {
            Value::Object(map) => Ok(Obj { map, path: path.to_string() }),
            other => Err(self.err(path, format!("expected an object, got {}", kind_of(other)))),
        }
    }

    fn array<'v>(&self, v: &'v Value, path: &str) -> Result<&'v [Value]> {
        match v {
            Value::Array(a) => Ok(a),
            other => Err(self.err(path, format!("expected an array, got {}", kind_of(other)))),
        }
    }

    fn string<'v>(&self, v: &'v Value, path: &str) -> Result<&'v str> {
        match v {
            Value::String(s) => Ok(s),
            other => Err(self.err(path, format!("expected a string, got {}", kind_of(other)))),
        }
    }

    fn non_empty_string<'v>(&self, v: &'v Value, path: &str) -> Result<&'v str> {
        let s = self.string(v, path)?;
        if s.is_empty() {
            return Err(self.err(path, "is an empty string; expected a non-empty string"));
        }
        Ok(s)
    }

    fn boolean(&self, v: &Value, path: &str) -> Result<bool> {
        match v {
            Value::Bool(b) => Ok(*b),
            other => Err(self.err(path, format!("expected a boolean (true or false), got {}", kind_of(other)))),
        }
    }

    /// A non-negative integer (an integral float such as `1e6` is accepted) of at least `min`.
    fn uint(&self, v: &Value, path: &str, min: usize) -> Result<usize> {
        let Value::Number(n) = v else {
            return Err(self.err(path, format!("expected a non-negative integer, got {}", kind_of(v))));
        };
        let u = if let Some(u) = n.as_u64() {
            u
        } else if let Some(i) = n.as_i64() {
            return Err(self.err(path, format!("expected a non-negative integer, got {i}")));
        } else {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f >= 0.0 && f < u64::MAX as f64 {
                f as u64
            } else {
                return Err(self.err(path, format!("expected a non-negative integer, got {n}")));
            }
        };
        let u =
            usize::try_from(u).map_err(|_| self.err(path, format!("{u} does not fit in this machine's size type")))?;
        if u < min {
            return Err(self.err(path, format!("{u} is too small; expected an integer >= {min}")));
        }
        Ok(u)
    }

    /// A finite number in `range`.
    fn float(&self, v: &Value, path: &str, range: Range) -> Result<f64> {
        let Value::Number(n) = v else {
            return Err(self.err(path, format!("expected a number, got {}", kind_of(v))));
        };
        let x = n
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.err(path, format!("{n} is not a finite number")))?;
        let (ok, expected) = match range {
            Range::Fraction => ((0.0..=1.0).contains(&x), "a fraction in [0, 1]"),
            Range::PositiveFraction => (x > 0.0 && x <= 1.0, "a fraction in (0, 1]"),
            Range::NonNegative => (x >= 0.0, "a number >= 0"),
            Range::Any => (true, ""),
        };
        if !ok {
            return Err(self.err(path, format!("{n} is out of range; expected {expected}")));
        }
        Ok(x)
    }

    /// A finite number in `range` that fits a 32-bit float.
    fn float32(&self, v: &Value, path: &str, range: Range) -> Result<f32> {
        let x = self.float(v, path, range)?;
        let y = x as f32;
        if y.is_infinite() {
            return Err(self.err(path, format!("{v} is out of range for a 32-bit float")));
        }
        Ok(y)
    }

    /// A CUDA device ordinal: an integer in [0, i32::MAX].
    fn device(&self, v: &Value, path: &str) -> Result<i32> {
        if let Value::Number(n) = v
            && let Some(i) = n.as_i64()
            && i < 0
        {
            return Err(self.err(path, format!("{i} is not a device id; expected an integer >= 0")));
        }
        let u = self.uint(v, path, 0)?;
        i32::try_from(u).map_err(|_| self.err(path, format!("{u} is too large for a device id")))
    }

    // ---- optional fields with defaults ----

    fn opt_bool(&self, o: &Obj, key: &str, default: bool) -> Result<bool> {
        o.get(key).map_or(Ok(default), |v| self.boolean(v, &o.at(key)))
    }

    fn opt_uint(&self, o: &Obj, key: &str, default: usize, min: usize) -> Result<usize> {
        o.get(key).map_or(Ok(default), |v| self.uint(v, &o.at(key), min))
    }

    fn opt_float(&self, o: &Obj, key: &str, default: f64, range: Range) -> Result<f64> {
        o.get(key).map_or(Ok(default), |v| self.float(v, &o.at(key), range))
    }

    fn opt_float32(&self, o: &Obj, key: &str, default: f32, range: Range) -> Result<f32> {
        o.get(key).map_or(Ok(default), |v| self.float32(v, &o.at(key), range))
    }

    /// A required field.
    fn required<'v>(&self, o: &Obj<'v>, key: &str, what: &str) -> Result<&'v Value> {
        o.get(key).ok_or_else(|| self.err(&o.at(key), format!("is missing; it is required: {what}")))
    }

    /// The elements of the array at `o.key`, each converted by `f` with its own path.
    fn list<T>(&self, o: &Obj, key: &str, f: impl Fn(&Self, &Value, &str) -> Result<T>) -> Result<Option<Vec<T>>> {
        let Some(v) = o.get(key) else { return Ok(None) };
        let path = o.at(key);
        let items = self.array(v, &path)?;
        let out = items.iter().enumerate().map(|(i, x)| f(self, x, &index(&path, i))).collect::<Result<Vec<T>>>()?;
        Ok(Some(out))
    }

    /// Resolves a path from the file against `base_dir`.
    fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() { p.to_path_buf() } else { self.base_dir.join(p) }
    }

    // ---- sections ----

    fn volatile_db(&mut self, v: &Value) -> Result<VolatileDbConfig> {
        let o = self.object(v, "volatile_db")?;
        let d = VolatileDbConfig::default();
        let kind = match o.get("type") {
            None => d.kind,
            Some(t) => {
                let path = o.at("type");
                let s = self.string(t, &path)?;
                const ACCEPTED: &[&str] = &["parallel_hash_map", "hash_map", "disabled"];
                match s {
                    "parallel_hash_map" | "parallel_hashmap" | "parallel_hash" | "parallel_map" => {
                        VolatileDbKind::ParallelHashMap
                    }
                    "hash_map" | "hashmap" | "hash" | "map" => VolatileDbKind::HashMap,
                    "disabled" | "disable" | "none" => VolatileDbKind::Disabled,
                    "redis_cluster" | "redis" => {
                        return Err(self.err(
                            &path,
                            format!(
                                "\"{s}\" is not supported: strata has no distributed (Redis) volatile tier; expected {} (each process keeps its own host tier)",
                                one_of(ACCEPTED)
                            ),
                        ));
                    }
                    "multi_process_hash_map" | "multi_process_hashmap" | "multi_process_hash" | "multi_process_map" => {
                        return Err(self.err(
                            &path,
                            format!(
                                "\"{s}\" is not supported: strata has no shared-memory volatile tier; expected {}",
                                one_of(ACCEPTED)
                            ),
                        ));
                    }
                    "rocks_db" | "rocksdb" | "rocks" => {
                        return Err(self.err(
                            &path,
                            format!(
                                "\"{s}\" is a persistent database type (use it in persistent_db); expected {}",
                                one_of(ACCEPTED)
                            ),
                        ));
                    }
                    _ => {
                        return Err(self.err(
                            &path,
                            format!("unknown volatile database type \"{s}\"; expected {}", one_of(ACCEPTED)),
                        ));
                    }
                }
            }
        };
        let overflow_policy = match o.get("overflow_policy") {
            None => d.overflow_policy,
            Some(t) => {
                let path = o.at("overflow_policy");
                match self.string(t, &path)? {
                    "evict_random" | "random" => OverflowPolicy::EvictRandom,
                    "evict_least_used" | "least_used" => OverflowPolicy::EvictLeastUsed,
                    "evict_oldest" | "oldest" => OverflowPolicy::EvictOldest,
                    s => {
                        return Err(self.err(
                            &path,
                            format!(
                                "unknown overflow policy \"{s}\"; expected {}",
                                one_of(&["evict_random", "evict_least_used", "evict_oldest"])
                            ),
                        ));
                    }
                }
            }
        };
        let cfg = VolatileDbConfig {
            kind,
            num_partitions: self.opt_uint(&o, "num_partitions", d.num_partitions, 1)?,
            overflow_margin: self.opt_uint(&o, "overflow_margin", d.overflow_margin, 1)?,
            overflow_policy,
            overflow_resolution_target: self.opt_float(
                &o,
                "overflow_resolution_target",
                d.overflow_resolution_target,
                Range::PositiveFraction,
            )?,
            initial_cache_rate: self.opt_float(&o, "initial_cache_rate", d.initial_cache_rate, Range::Fraction)?,
            cache_missed_embeddings: self.opt_bool(&o, "cache_missed_embeddings", d.cache_missed_embeddings)?,
            max_batch_size: self.opt_uint(&o, "max_batch_size", d.max_batch_size, 1)?,
            initialize_after_startup: self.opt_bool(&o, "initialize_after_startup", d.initialize_after_startup)?,
        };
        self.report_fields(&o, VOLATILE_USED, VOLATILE_IGNORED);
        Ok(cfg)
    }

    fn persistent_db(&mut self, v: &Value) -> Result<PersistentDbConfig> {
        let o = self.object(v, "persistent_db")?;
        let d = PersistentDbConfig::default();
        let kind = match o.get("type") {
            None => d.kind,
            Some(t) => {
                let path = o.at("type");
                let s = self.string(t, &path)?;
                const ACCEPTED: &[&str] = &["disabled", "rocks_db"];
                match s {
                    "disabled" | "disable" | "none" => PersistentDbKind::Disabled,
                    "rocks_db" | "rocksdb" | "rocks" => PersistentDbKind::RocksDb,
                    "hash_map"
                    | "hashmap"
                    | "hash"
                    | "map"
                    | "parallel_hash_map"
                    | "parallel_hashmap"
                    | "parallel_hash"
                    | "parallel_map"
                    | "multi_process_hash_map"
                    | "multi_process_hashmap"
                    | "multi_process_hash"
                    | "multi_process_map"
                    | "redis_cluster"
                    | "redis" => {
                        return Err(self.err(
                            &path,
                            format!(
                                "\"{s}\" is a volatile database type (use it in volatile_db); expected {}",
                                one_of(ACCEPTED)
                            ),
                        ));
                    }
                    _ => {
                        return Err(self.err(
                            &path,
                            format!("unknown persistent database type \"{s}\"; expected {}", one_of(ACCEPTED)),
                        ));
                    }
                }
            }
        };
        let path = match o.get("path") {
            None => d.path,
            Some(p) => {
                let at = o.at("path");
                let resolved = self.resolve(self.non_empty_string(p, &at)?);
                if resolved.exists() && !resolved.is_dir() {
                    return Err(self.err(
                        &at,
                        format!(
                            "{} exists and is not a folder; expected the persistent store's folder",
                            resolved.display()
                        ),
                    ));
                }
                resolved
            }
        };
        let cfg = PersistentDbConfig {
            kind,
            path,
            read_only: self.opt_bool(&o, "read_only", d.read_only)?,
            max_batch_size: self.opt_uint(&o, "max_batch_size", d.max_batch_size, 1)?,
            initialize_after_startup: self.opt_bool(&o, "initialize_after_startup", d.initialize_after_startup)?,
        };
        self.report_fields(&o, PERSISTENT_USED, PERSISTENT_IGNORED);
        Ok(cfg)
    }

    /// `update_source`: only the absence of one (`"null"`) is accepted.
    fn update_source(&mut self, v: &Value) -> Result<()> {
        let o = self.object(v, "update_source")?;
        if let Some(t) = o.get("type") {
            let path = o.at("type");
            match self.string(t, &path)? {
                "null" | "none" => {}
                s @ ("kafka_message_queue" | "kafka_mq" | "kafka") => {
                    return Err(self.err(
                        &path,
                        format!(
                            "\"{s}\" is not supported: strata takes no updates from Kafka; apply them with strata_table_upsert / strata_table_erase, and set type to \"null\" or remove update_source"
                        ),
                    ));
                }
                s => {
                    return Err(self.err(
                        &path,
                        format!(
                            "unknown update source type \"{s}\"; expected \"null\" (strata supports no update source)"
                        ),
                    ));
                }
            }
        }
        self.report_fields(&o, UPDATE_SOURCE_USED, UPDATE_SOURCE_IGNORED);
        Ok(())
    }

    fn models(&mut self, root: &Obj) -> Result<Vec<ModelConfig>> {
        let v = self.required(root, "models", "an array with one object per model")?;
        let items = self.array(v, "models")?;
        if items.is_empty() {
            return Err(self.err("models", "is empty; expected at least one model"));
        }
        let mut models = Vec::with_capacity(items.len());
        for (i, m) in items.iter().enumerate() {
            models.push(self.model(m, &index("models", i))?);
        }
        for j in 0..models.len() {
            if let Some(i) = (0..j).find(|&i| models[i].model == models[j].model) {
                return Err(self.err(
                    &format!("models[{j}].model"),
                    format!(
                        "duplicate model name \"{}\" (also models[{i}].model); expected unique names",
                        models[j].model
                    ),
                ));
            }
        }
        // Files last, so that every mistake in the text is reported before any on disk.
        for (i, m) in models.iter().enumerate() {
            for (j, dir) in m.sparse_files.iter().enumerate() {
                self.check_sparse_folder(dir, m.embedding_vecsize_per_table[j], i, j)?;
            }
        }
        Ok(models)
    }

    fn model(&mut self, v: &Value, path: &str) -> Result<ModelConfig> {
        let o = self.object(v, path)?;
        let name = self.non_empty_string(self.required(&o, "model", "the model's name")?, &o.at("model"))?.to_string();

        let sparse = self.required(&o, "sparse_files", "one HugeCTR sparse model folder per embedding table")?;
        let sparse_path = o.at("sparse_files");
        let sparse_items = self.array(sparse, &sparse_path)?;
        if sparse_items.is_empty() {
            return Err(
                self.err(&sparse_path, "is empty; expected at least one sparse model folder (one per embedding table)")
            );
        }
        let mut sparse_files = Vec::with_capacity(sparse_items.len());
        for (j, f) in sparse_items.iter().enumerate() {
            let at = index(&sparse_path, j);
            let s = self.non_empty_string(f, &at)?;
            if let Some((scheme, _)) = s.split_once("://") {
                return Err(self.err(
                    &at,
                    format!("\"{s}\": remote file systems ({scheme}://) are not supported; expected a local folder"),
                ));
            }
            sparse_files.push(self.resolve(s));
        }
        let tables = sparse_files.len();

        self.required(&o, "embedding_vecsize_per_table", "the number of floats per row of each table")?;
        let vecsize = self
            .list(&o, "embedding_vecsize_per_table", |p, v, at| {
                let d = p.uint(v, at, 1)?;
                if d > STRATA_MAX_DIM {
                    return Err(
                        p.err(at, format!("{d} is too large; expected at most {STRATA_MAX_DIM} floats per row"))
                    );
                }
                Ok(d)
            })?
            .unwrap_or_default();
        self.required(
            &o,
            "maxnum_catfeature_query_per_table_per_sample",
            "the most keys one sample looks up in each table",
        )?;
        let maxnum = self
            .list(&o, "maxnum_catfeature_query_per_table_per_sample", |p, v, at| p.uint(v, at, 1))?
            .unwrap_or_default();
        let names = self.list(&o, "embedding_table_names", |p, v, at| p.non_empty_string(v, at).map(str::to_string))?;
        let defaults = self.list(&o, "default_value_for_each_table", |p, v, at| p.float32(v, at, Range::Any))?;

        let lengths = [
            ("embedding_vecsize_per_table", Some(vecsize.len())),
            ("maxnum_catfeature_query_per_table_per_sample", Some(maxnum.len())),
            ("embedding_table_names", names.as_ref().map(Vec::len)),
            ("default_value_for_each_table", defaults.as_ref().map(Vec::len)),
        ];
        for (key, len) in lengths {
            if let Some(n) = len
                && n != tables
            {
                return Err(self.err(
                    &o.at(key),
                    format!(
                        "has {n} {} but {sparse_path} has {tables}; expected one entry per sparse file (embedding table)",
                        if n == 1 { "entry" } else { "entries" }
                    ),
                ));
            }
        }
        let embedding_table_names =
            names.unwrap_or_else(|| (0..tables).map(|i| format!("sparse_embedding{i}")).collect());
        for j in 0..tables {
            if let Some(i) = (0..j).find(|&i| embedding_table_names[i] == embedding_table_names[j]) {
                return Err(self.err(
                    &index(&o.at("embedding_table_names"), j),
                    format!(
                        "duplicate table name \"{}\" (also embedding_table_names[{i}]); expected unique names within a model",
                        embedding_table_names[j]
                    ),
                ));
            }
        }

        let deployed_device_list =
            self.list(&o, "deployed_device_list", |p, v, at| p.device(v, at))?.unwrap_or_else(|| vec![0]);
        if deployed_device_list.is_empty() {
            return Err(self.err(&o.at("deployed_device_list"), "is empty; expected at least one device id"));
        }

        let use_static_table = self.opt_bool(&o, "use_static_table", false)?;
        let mut embedding_cache_type = match o.get("embedding_cache_type") {
            None => EmbeddingCacheType::Dynamic,
            Some(t) => {
                let at = o.at("embedding_cache_type");
                match self.string(t, &at)? {
                    "dynamic" => EmbeddingCacheType::Dynamic,
                    "static" => EmbeddingCacheType::Static,
                    "uvm" => EmbeddingCacheType::Uvm,
                    s => {
                        return Err(self.err(
                            &at,
                            format!(
                                "unknown embedding cache type \"{s}\"; expected {}",
                                one_of(&["dynamic", "static", "uvm"])
                            ),
                        ));
                    }
                }
            }
        };
        if use_static_table && embedding_cache_type != EmbeddingCacheType::Static {
            if o.get("embedding_cache_type").is_some() {
                self.warnings.push(format!(
                    "{}: \"{embedding_cache_type}\" overridden by use_static_table = true (as in HPS)",
                    o.at("embedding_cache_type")
                ));
            }
            embedding_cache_type = EmbeddingCacheType::Static;
        }

        let cfg = ModelConfig {
            model: name,
            sparse_files,
            embedding_table_names,
            embedding_vecsize_per_table: vecsize,
            default_value_for_each_table: defaults.unwrap_or_else(|| vec![0.0; tables]),
            maxnum_catfeature_query_per_table_per_sample: maxnum,
            max_batch_size: self.opt_uint(&o, "max_batch_size", 64, 1)?,
            deployed_device_list,
            gpucache: self.opt_bool(&o, "gpucache", true)?,
            gpucacheper: self.opt_float32(&o, "gpucacheper", 0.2, Range::Fraction)?,
            hit_rate_threshold: self.opt_float32(&o, "hit_rate_threshold", 0.9, Range::NonNegative)?,
            use_static_table,
            embedding_cache_type,
            num_of_worker_buffer_in_pool: self.opt_uint(&o, "num_of_worker_buffer_in_pool", 1, 1)?,
            num_of_refresher_buffer_in_pool: self.opt_uint(&o, "num_of_refresher_buffer_in_pool", 1, 1)?,
            cache_refresh_percentage_per_iteration: self.opt_float32(
                &o,
                "cache_refresh_percentage_per_iteration",
                0.0,
                Range::Fraction,
            )?,
            refresh_delay: self.opt_float32(&o, "refresh_delay", 0.0, Range::NonNegative)?,
            refresh_interval: self.opt_float32(&o, "refresh_interval", 0.0, Range::NonNegative)?,
        };
        self.report_fields(&o, MODEL_USED, MODEL_IGNORED);
        Ok(cfg)
    }

    /// Checks that `dir` is a HugeCTR sparse model folder whose `key` and `emb_vector` agree
    /// with `dim` (see [`hugectr::inspect`]).
    fn check_sparse_folder(&self, dir: &Path, dim: usize, model: usize, table: usize) -> Result<()> {
        const WHAT: &str = "a HugeCTR sparse model folder holds `key` and `emb_vector`";
        let Err(problem) = hugectr::inspect(dir, dim) else { return Ok(()) };
        let msg = match problem {
            FolderProblem::Missing => format!("{}: folder does not exist; {WHAT}", dir.display()),
            FolderProblem::NotAFolder => format!("{}: is not a folder; {WHAT}", dir.display()),
            FolderProblem::Lacks(name) => format!("{}: lacks `{name}`; {WHAT}", dir.display()),
            FolderProblem::NotAFile(f) => format!("{}: is not a file; {WHAT}", f.display()),
            FolderProblem::Io(f, e) => format!("{}: {e}", f.display()),
            FolderProblem::Sizes(SizeMismatch::PartialKey { key_bytes }) => format!(
                "{}: {key_bytes} bytes is not a whole number of int64 keys (8 bytes each)",
                dir.join("key").display()
            ),
            FolderProblem::Sizes(SizeMismatch::Vectors { rows, vec_bytes, expected }) => format!(
                "{}: {vec_bytes} bytes; expected {expected} ({rows} keys in `key` x {dim} float32 per row from models[{model}].embedding_vecsize_per_table[{table}])",
                dir.join("emb_vector").display()
            ),
        };
        Err(self.err(&format!("models[{model}].sparse_files[{table}]"), msg))
    }
}

/// serde_json's message with the position moved to the front: "invalid JSON at line 3,
/// column 5: expected `,` or `}`".
fn json_error_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let what = match full.rfind(" at line ") {
        Some(i) if e.line() > 0 => &full[..i],
        _ => full.as_str(),
    };
    if e.line() > 0 {
        format!("invalid JSON at line {}, column {}: {what}; expected a JSON object", e.line(), e.column())
    } else {
        format!("invalid JSON: {what}; expected a JSON object")
    }
}

/// Replaces `//` and `/* */` comments outside strings with spaces (newlines kept), so that
/// line and column numbers of the remaining text are unchanged.
fn blank_comments(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('/') {
        return std::borrow::Cow::Borrowed(text);
    }
    let src = text.as_bytes();
    let mut out = src.to_vec();
    let (mut i, mut in_string) = (0, false);
    while i < src.len() {
        let c = src[i];
        if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
        } else if c == b'"' {
            in_string = true;
            i += 1;
        } else if c == b'/' && src.get(i + 1) == Some(&b'/') {
            while i < src.len() && src[i] != b'\n' {
                out[i] = b' ';
                i += 1;
            }
        } else if c == b'/' && src.get(i + 1) == Some(&b'*') {
            out[i] = b' ';
            out[i + 1] = b' ';
            i += 2;
            while i < src.len() && !(src[i] == b'*' && src.get(i + 1) == Some(&b'/')) {
                if src[i] != b'\n' {
                    out[i] = b' ';
                }
                i += 1;
            }
            // The closing "*/" (absent when the comment runs to the end of the text).
            for b in out.iter_mut().skip(i).take(2) {
                *b = b' ';
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    // Only ASCII bytes outside strings were replaced, by ASCII spaces: still UTF-8.
    std::borrow::Cow::Owned(String::from_utf8(out).expect("blanking comments keeps UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_are_blanked_outside_strings_only() {
        let text = "{\"a\": \"x//y /*z*/\", // note é\n \"b\": /* 256 MiB\n */ 1}";
        let out = blank_comments(text);
        assert_eq!(out.len(), text.len());
        assert_eq!(out.lines().count(), text.lines().count());
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["a"], "x//y /*z*/");
        assert_eq!(v["b"], 1);
        // An escaped quote does not end the string.
        let v: Value = serde_json::from_str(&blank_comments(r#"{"a": "q\"//"} // c"#)).unwrap();
        assert_eq!(v["a"], "q\"//");
        // An unterminated block comment blanks the rest.
        assert_eq!(blank_comments("1 /* x").trim(), "1");
        assert!(matches!(blank_comments("{}"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn paths_and_names() {
        assert_eq!(join(ROOT, "models"), "models");
        assert_eq!(join("models[1]", "sparse_files"), "models[1].sparse_files");
        assert_eq!(index("models[1].sparse_files", 0), "models[1].sparse_files[0]");
        assert_eq!(one_of(&["a"]), "\"a\"");
        assert_eq!(one_of(&["a", "b", "c"]), "one of \"a\", \"b\" or \"c\"");
        assert_eq!(OverflowPolicy::EvictLeastUsed.to_string(), "evict_least_used");
        assert_eq!(VolatileDbKind::ParallelHashMap.as_str(), "parallel_hash_map");
        assert_eq!(PersistentDbKind::RocksDb.as_str(), "rocks_db");
        assert_eq!(EmbeddingCacheType::Uvm.as_str(), "uvm");
    }

    #[test]
    fn numbers() {
        let p = Parser { file: "f", base_dir: Path::new("."), warnings: Vec::new() };
        let n = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert_eq!(p.uint(&n("7"), "x", 1).unwrap(), 7);
        assert_eq!(p.uint(&n("1e6"), "x", 1).unwrap(), 1_000_000);
        assert_eq!(p.uint(&n("18446744073709551615"), "x", 1).unwrap() as u64, u64::MAX);
        let msg = |e: Error| match e {
            Error::Config { msg, .. } => msg,
            e => panic!("{e}"),
        };
        assert_eq!(msg(p.uint(&n("-3"), "x", 0).unwrap_err()), "expected a non-negative integer, got -3");
        assert_eq!(msg(p.uint(&n("1.5"), "x", 0).unwrap_err()), "expected a non-negative integer, got 1.5");
        assert_eq!(msg(p.uint(&n("0"), "x", 1).unwrap_err()), "0 is too small; expected an integer >= 1");
        assert_eq!(msg(p.uint(&n("\"4\""), "x", 0).unwrap_err()), "expected a non-negative integer, got a string");
        assert_eq!(
            msg(p.float(&n("1.5"), "x", Range::Fraction).unwrap_err()),
            "1.5 is out of range; expected a fraction in [0, 1]"
        );
        assert_eq!(
            msg(p.float32(&n("1e39"), "x", Range::Any).unwrap_err()),
            "1e+39 is out of range for a 32-bit float"
        );
        assert_eq!(msg(p.device(&n("-1"), "x").unwrap_err()), "-1 is not a device id; expected an integer >= 0");
        assert_eq!(p.device(&n("3"), "x").unwrap(), 3);
    }

    #[test]
    fn json_errors_carry_line_and_column() {
        let e = serde_json::from_str::<Value>("{\n  \"a\": 1\n  \"b\": 2}").unwrap_err();
        assert_eq!(
            json_error_message(&e),
            "invalid JSON at line 3, column 3: expected `,` or `}`; expected a JSON object"
        );
    }
}
