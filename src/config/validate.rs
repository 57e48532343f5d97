//! Step 2: the one validation pass. Checks what the file's types cannot say (ranges, lists
//! that must have one entry per table, unique names, values strata does not support, the
//! sparse model folders on disk) and builds the [`PsConfig`], each problem at its JSON path.
//!
//! The pass reads the file in HPS's order: the top level, `volatile_db`, `persistent_db`,
//! `update_source`, then each model, and the sparse model folders last, so that every mistake
//! in the text is reported before any on disk. The fields no type read become warnings in the
//! same order, each object's keys sorted.

use super::json::{
    Choice, DatabaseType, DeviceId, Float, IgnoredField, List, ModelJson, Obj, PersistentDbJson, PsJson, Text, Uint, UpdateSourceJson,
    UpdateSourceType, VolatileDbJson,
};
use super::{
    EmbeddingCacheType, ModelConfig, PersistentDbConfig, PersistentDbKind, Problem, PsConfig, ROOT, RedisConfig, Secret, VolatileDbConfig,
    VolatileDbKind, index, join,
};
use crate::limits::MAX_DIM;
use crate::storage::hugectr::{self, FolderProblem, SizeMismatch};
use std::path::{Path, PathBuf};

type Checked<T> = Result<T, Problem>;

/// Checks `doc` and builds its configuration; `ignored` are the fields no type read.
pub(super) fn validate(doc: &PsJson, ignored: Vec<IgnoredField>, file: &str, base_dir: &Path) -> Checked<PsConfig> {
    let mut pass = Pass { base_dir, ignored, warnings: Vec::new() };
    pass.report(ROOT, TOP_IGNORED);
    let volatile_db = volatile_db(&doc.volatile_db)?;
    let from = pass.warnings.len();
    pass.report("volatile_db", VOLATILE_IGNORED);
    pass.warnings.extend(redis_unused(&doc.volatile_db, volatile_db.kind));
    pass.warnings[from..].sort();
    let persistent_db = persistent_db(&doc.persistent_db, base_dir)?;
    pass.report("persistent_db", PERSISTENT_IGNORED);
    update_source(&doc.update_source)?;
    pass.report("update_source", UPDATE_SOURCE_IGNORED);
    let models = pass.models(&doc.models)?;
    if volatile_db.kind == VolatileDbKind::RedisCluster {
        for (i, m) in models.iter().enumerate() {
            if let Some(j) = m.strata_storage_per_table.iter().position(|f| *f != crate::dlpack::FloatDtype::F32.into()) {
                return Err(Problem::new(
                    &format!("models[{i}].strata_storage_per_table[{j}]"),
                    format!(
                        "\"{}\" with volatile_db.type \"redis_cluster\"; the Redis tier stores float32 rows (use \"float32\", or an in-process hash_map tier)",
                        m.strata_storage_per_table[j].name()
                    ),
                ));
            }
        }
    }
    // Nothing else is ever left unread; should it be, it is still reported.
    let rest = std::mem::take(&mut pass.ignored);
    pass.warnings.extend(rest.iter().map(|f| format!("{}: unknown field", join(&f.object, &f.key))));
    Ok(PsConfig {
        file: file.to_string(),
        supportlonglong: doc.supportlonglong.0,
        volatile_db,
        persistent_db,
        models,
        warnings: pass.warnings,
    })
}

// ---------------------------------------------------------------------------------------------
// The fields each object may hold without being used: what to say about each.

const TOP_IGNORED: &[(&str, &str)] =
    &[("fuse_embedding_table", "strata looks each table up on its own; table fusion is an HPS GPU-plugin optimisation")];

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

const REDIS: &str = "only used when volatile_db.type is redis_cluster";
const SHM: &str = "only used by multi_process_hash_map, which strata does not support";
const KAFKA: &str = "only used with a Kafka update source, which strata does not support";
const OLD_BATCH: &str = "HPS 3.x name; strata reads max_batch_size";
const VOLATILE_IGNORED: &[(&str, &str)] = &[
    ("shared_memory_size", SHM),
    ("shared_memory_name", SHM),
    ("shared_memory_auto_remove", SHM),
    ("allocation_rate", "strata allocates the volatile tier itself"),
    ("update_filters", KAFKA),
];

/// The warnings for the `redis_cluster` fields a `volatile_db` of another `kind` holds, and for
/// the TLS files of a cluster without `enable_tls`.
fn redis_unused(v: &VolatileDbJson, kind: VolatileDbKind) -> Vec<String> {
    let given = |name: &str, present: bool| present.then(|| name.to_string());
    let tls_files = [
        given("tls_ca_certificate", v.tls_ca_certificate.is_some()),
        given("tls_client_certificate", v.tls_client_certificate.is_some()),
        given("tls_client_key", v.tls_client_key.is_some()),
        given("tls_server_name_identification", v.tls_server_name_identification.is_some()),
    ];
    let mut out = Vec::new();
    if kind == VolatileDbKind::RedisCluster {
        for f in tls_files.into_iter().flatten() {
            out.push(format!("volatile_db.{f}: ignored (enable_tls is false; strata connects to Redis without TLS)"));
        }
        return out;
    }
    let fields = [
        (given("address", v.address.is_some()), REDIS),
        (given("user_name", v.user_name.is_some()), REDIS),
        (given("password", v.password.is_some()), REDIS),
        (given("num_node_connections", v.num_node_connections.is_some()), REDIS),
        (given("enable_tls", v.enable_tls.is_some()), REDIS),
        (given("strata_redis_timeout_ms", v.strata_redis_timeout_ms.is_some()), REDIS),
        (
            given("refresh_time_after_fetch", v.refresh_time_after_fetch.is_some()),
            "HPS 3.x option, used by redis_cluster only; the overflow policy decides what is tracked",
        ),
        (given("max_get_batch_size", v.max_get_batch_size.is_some()), OLD_BATCH),
        (given("max_set_batch_size", v.max_set_batch_size.is_some()), OLD_BATCH),
    ];
    for (f, why) in fields {
        if let Some(f) = f {
            out.push(format!("volatile_db.{f}: ignored ({why})"));
        }
    }
    for f in tls_files.into_iter().flatten() {
        out.push(format!("volatile_db.{f}: ignored ({REDIS})"));
    }
    out
}

/// The `redis_cluster` fields, with HPS's defaults (HugeCTR's `RedisClusterBackendParams`).
fn redis(v: &VolatileDbJson, max_batch_size: usize) -> Checked<RedisConfig> {
    let text = |t: &Option<Text>, default: &str| t.as_ref().map_or(default.to_string(), |t| t.0.clone());
    let at = "volatile_db.address";
    let address = text(&v.address, "127.0.0.1:7000");
    let mut seeds = Vec::new();
    for a in address.split(',').map(str::trim) {
        if a.is_empty() {
            return Err(Problem::new(at, format!("\"{address}\" has an empty entry; expected host:port seeds, comma-separated")));
        }
        crate::storage::tier::redis::cluster::split_addr(a).map_err(|m| Problem::new(at, format!("{m} (in \"{address}\")")))?;
        seeds.push(a.to_string());
    }
    if v.enable_tls.as_ref().is_some_and(|f| f.0) {
        return Err(Problem::new(
            "volatile_db.enable_tls",
            "true is not supported: strata connects to Redis without TLS; expected false (use a private network, or a TLS tunnel to each node)",
        ));
    }
    let user_name = text(&v.user_name, "default");
    if user_name.is_empty() {
        return Err(Problem::new("volatile_db.user_name", "is an empty string; expected a Redis ACL user name (default \"default\")"));
    }
    let batch = |u: &Option<Uint>, at: &str| u.as_ref().map_or(Ok(max_batch_size), |u| uint(u, at, 1));
    Ok(RedisConfig {
        seeds,
        user_name,
        password: Secret(text(&v.password, "")),
        num_node_connections: v.num_node_connections.as_ref().map_or(Ok(5), |u| uint(u, "volatile_db.num_node_connections", 1))?,
        max_get_batch_size: batch(&v.max_get_batch_size, "volatile_db.max_get_batch_size")?,
        max_set_batch_size: batch(&v.max_set_batch_size, "volatile_db.max_set_batch_size")?,
        refresh_time_after_fetch: v.refresh_time_after_fetch.as_ref().is_none_or(|f| f.0),
        timeout_ms: v.strata_redis_timeout_ms.as_ref().map_or(Ok(1000), |u| uint(u, "volatile_db.strata_redis_timeout_ms", 1))? as u64,
    })
}

const PERSISTENT_IGNORED: &[(&str, &str)] = &[
    ("num_threads", "a RocksDB driver setting; strata's store needs no threads of its own"),
    ("max_get_batch_size", OLD_BATCH),
    ("max_set_batch_size", OLD_BATCH),
    ("update_filters", KAFKA),
];

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
// Values.

/// The accepted names of an enum, quoted, for messages.
pub(super) fn one_of(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    match q.len() {
        0 => String::new(),
        1 => q[0].clone(),
        n => format!("one of {} or {}", q[..n - 1].join(", "), q[n - 1]),
    }
}

/// Allowed range of a floating-point field.
#[derive(Clone, Copy)]
pub(super) enum Range {
    /// [0, 1]
    Fraction,
    /// (0, 1]
    PositiveFraction,
    /// [0, inf)
    NonNegative,
    /// any finite value
    Any,
}

/// A required field's value, or "is missing".
fn required<'a, T>(v: &'a Option<T>, at: &str, what: &str) -> Checked<&'a T> {
    v.as_ref().ok_or_else(|| Problem::new(at, format!("is missing; it is required: {what}")))
}

fn non_empty<'a>(v: &'a Text, at: &str) -> Checked<&'a str> {
    if v.0.is_empty() {
        return Err(Problem::new(at, "is an empty string; expected a non-empty string"));
    }
    Ok(&v.0)
}

/// An integer of at least `min`, as a `usize`.
pub(super) fn uint(v: &Uint, at: &str, min: usize) -> Checked<usize> {
    let u = usize::try_from(v.0).map_err(|_| Problem::new(at, format!("{} does not fit in this machine's size type", v.0)))?;
    if u < min {
        return Err(Problem::new(at, format!("{u} is too small; expected an integer >= {min}")));
    }
    Ok(u)
}

/// A finite number in `range`.
pub(super) fn float(v: &Float, at: &str, range: Range) -> Checked<f64> {
    let n = &v.0;
    let x = n.as_f64().filter(|x| x.is_finite()).ok_or_else(|| Problem::new(at, format!("{n} is not a finite number")))?;
    let (ok, expected) = match range {
        Range::Fraction => ((0.0..=1.0).contains(&x), "a fraction in [0, 1]"),
        Range::PositiveFraction => (x > 0.0 && x <= 1.0, "a fraction in (0, 1]"),
        Range::NonNegative => (x >= 0.0, "a number >= 0"),
        Range::Any => (true, ""),
    };
    if !ok {
        return Err(Problem::new(at, format!("{n} is out of range; expected {expected}")));
    }
    Ok(x)
}

/// A finite number in `range` that fits a 32-bit float.
pub(super) fn float32(v: &Float, at: &str, range: Range) -> Checked<f32> {
    let y = float(v, at, range)? as f32;
    if y.is_infinite() {
        return Err(Problem::new(at, format!("{} is out of range for a 32-bit float", v.0)));
    }
    Ok(y)
}

/// A CUDA device ordinal: an integer in [0, i32::MAX].
pub(super) fn device(v: &DeviceId, at: &str) -> Checked<i32> {
    let u = u64::try_from(v.0).map_err(|_| Problem::new(at, format!("{} is not a device id; expected an integer >= 0", v.0)))?;
    let u = uint(&Uint(u), at, 0)?;
    i32::try_from(u).map_err(|_| Problem::new(at, format!("{u} is too large for a device id")))
}

/// Each element of `list`, checked by `f` with its own path (`at[i]`).
fn each<T, U>(list: &List<T>, at: &str, f: impl Fn(&T, &str) -> Checked<U>) -> Checked<Vec<U>> {
    list.iter().enumerate().map(|(i, v)| f(v, &index(at, i))).collect()
}

/// Resolves a path from the file against `base_dir`.
fn resolve(base_dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() { p.to_path_buf() } else { base_dir.join(p) }
}

// ---------------------------------------------------------------------------------------------
// Sections.

pub(super) fn volatile_db(v: &VolatileDbJson) -> Checked<VolatileDbConfig> {
    const ACCEPTED: &[&str] = &["parallel_hash_map", "hash_map", "redis_cluster", "disabled"];
    let (at, s) = ("volatile_db.type", &v.kind.name);
    let kind = match v.kind.value {
        Some(DatabaseType::ParallelHashMap) => VolatileDbKind::ParallelHashMap,
        Some(DatabaseType::HashMap) => VolatileDbKind::HashMap,
        Some(DatabaseType::Disabled) => VolatileDbKind::Disabled,
        Some(DatabaseType::RedisCluster) => VolatileDbKind::RedisCluster,
        Some(DatabaseType::MultiProcessHashMap) => {
            return Err(Problem::new(
                at,
                format!("\"{s}\" is not supported: strata has no shared-memory volatile tier; expected {}", one_of(ACCEPTED)),
            ));
        }
        Some(DatabaseType::RocksDb) => {
            return Err(Problem::new(
                at,
                format!("\"{s}\" is a persistent database type (use it in persistent_db); expected {}", one_of(ACCEPTED)),
            ));
        }
        None => {
            return Err(Problem::new(at, format!("unknown volatile database type \"{s}\"; expected {}", one_of(ACCEPTED))));
        }
    };
    let overflow_policy =
        known(&v.overflow_policy, "volatile_db.overflow_policy", "overflow policy", &["evict_random", "evict_least_used", "evict_oldest"])?;
    let max_batch_size = uint(&v.max_batch_size, "volatile_db.max_batch_size", 1)?;
    let redis = match kind {
        VolatileDbKind::RedisCluster => Some(redis(v, max_batch_size)?),
        _ => None,
    };
    Ok(VolatileDbConfig {
        kind,
        redis,
        num_partitions: match &v.num_partitions {
            Some(n) => uint(n, "volatile_db.num_partitions", 1)?,
            // Every process sharing a cluster must split tables alike: HPS's fixed 16, not a
            // number that depends on each machine's CPUs.
            None if kind == VolatileDbKind::RedisCluster => 16,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(16),
        },
        overflow_margin: uint(&v.overflow_margin, "volatile_db.overflow_margin", 1)?,
        overflow_policy,
        overflow_resolution_target: float(
            &v.overflow_resolution_target,
            "volatile_db.overflow_resolution_target",
            Range::PositiveFraction,
        )?,
        initial_cache_rate: float(&v.initial_cache_rate, "volatile_db.initial_cache_rate", Range::Fraction)?,
        cache_missed_embeddings: v.cache_missed_embeddings.0,
        max_batch_size,
        initialize_after_startup: v.initialize_after_startup.0,
        refresh_interval_ms: v.refresh_interval_ms.0,
    })
}

/// The value of `c`, or "unknown {what} "...", expected {accepted}".
fn known<T: Copy>(c: &Choice<T>, at: &str, what: &str, accepted: &[&str]) -> Checked<T> {
    c.value.ok_or_else(|| Problem::new(at, format!("unknown {what} \"{}\"; expected {}", c.name, one_of(accepted))))
}

pub(super) fn persistent_db(p: &PersistentDbJson, base_dir: &Path) -> Checked<PersistentDbConfig> {
    const ACCEPTED: &[&str] = &["disabled", "rocks_db"];
    let (at, s) = ("persistent_db.type", &p.kind.name);
    let kind = match p.kind.value {
        Some(DatabaseType::Disabled) => PersistentDbKind::Disabled,
        Some(DatabaseType::RocksDb) => PersistentDbKind::RocksDb,
        Some(DatabaseType::HashMap | DatabaseType::ParallelHashMap | DatabaseType::MultiProcessHashMap | DatabaseType::RedisCluster) => {
            return Err(Problem::new(
                at,
                format!("\"{s}\" is a volatile database type (use it in volatile_db); expected {}", one_of(ACCEPTED)),
            ));
        }
        None => {
            return Err(Problem::new(at, format!("unknown persistent database type \"{s}\"; expected {}", one_of(ACCEPTED))));
        }
    };
    let path = match &p.path {
        None => std::env::temp_dir().join("rocksdb"),
        Some(path) => {
            let at = "persistent_db.path";
            let resolved = resolve(base_dir, non_empty(path, at)?);
            if resolved.exists() && !resolved.is_dir() {
                return Err(Problem::new(
                    at,
                    format!("{} exists and is not a folder; expected the persistent store's folder", resolved.display()),
                ));
            }
            resolved
        }
    };
    Ok(PersistentDbConfig {
        kind,
        path,
        read_only: p.read_only.0,
        max_batch_size: uint(&p.max_batch_size, "persistent_db.max_batch_size", 1)?,
        initialize_after_startup: p.initialize_after_startup.0,
    })
}

/// `update_source`: only the absence of one (`"null"`) is accepted.
fn update_source(u: &UpdateSourceJson) -> Checked<()> {
    let Some(kind) = &u.kind else { return Ok(()) };
    let (at, s) = ("update_source.type", &kind.name);
    match kind.value {
        Some(UpdateSourceType::Null) => Ok(()),
        Some(UpdateSourceType::KafkaMessageQueue) => Err(Problem::new(
            at,
            format!(
                "\"{s}\" is not supported: strata takes no updates from Kafka; apply them with strata_table_upsert / strata_table_erase, and set type to \"null\" or remove update_source"
            ),
        )),
        None => Err(Problem::new(at, format!("unknown update source type \"{s}\"; expected \"null\" (strata supports no update source)"))),
    }
}

// ---------------------------------------------------------------------------------------------
// The pass over the models, with the warnings.

struct Pass<'a> {
    base_dir: &'a Path,
    /// The fields no type read, not yet reported.
    ignored: Vec<IgnoredField>,
    warnings: Vec<String>,
}

impl Pass<'_> {
    /// Reports the unread fields of the object at `object`: with their reason when they are in
    /// `known`, else as unknown.
    fn report(&mut self, object: &str, known: &[(&str, &str)]) {
        let (here, rest) = std::mem::take(&mut self.ignored).into_iter().partition(|f| f.object == object);
        self.ignored = rest;
        for f in here {
            let path = join(object, &f.key);
            match known.iter().find(|(k, _)| *k == f.key) {
                Some((_, why)) => self.warnings.push(format!("{path}: ignored ({why})")),
                None => self.warnings.push(format!("{path}: unknown field")),
            }
        }
    }

    fn models(&mut self, models: &Option<List<Obj<ModelJson>>>) -> Checked<Vec<ModelConfig>> {
        let items = required(models, "models", "an array with one object per model")?;
        if items.is_empty() {
            return Err(Problem::new("models", "is empty; expected at least one model"));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, m) in items.iter().enumerate() {
            let path = index("models", i);
            out.push(self.model(m, &path)?);
            self.report(&path, MODEL_IGNORED);
        }
        for j in 0..out.len() {
            if let Some(i) = (0..j).find(|&i| out[i].model == out[j].model) {
                return Err(Problem::new(
                    &format!("models[{j}].model"),
                    format!("duplicate model name \"{}\" (also models[{i}].model); expected unique names", out[j].model),
                ));
            }
        }
        // Files last, so that every mistake in the text is reported before any on disk.
        for (i, m) in out.iter().enumerate() {
            for (j, dir) in m.sparse_files.iter().enumerate() {
                check_sparse_folder(dir, m.embedding_vecsize_per_table[j], i, j)?;
            }
        }
        Ok(out)
    }

    fn model(&mut self, m: &ModelJson, path: &str) -> Checked<ModelConfig> {
        let at = |key: &str| join(path, key);
        let base_dir = self.base_dir;
        let name = non_empty(required(&m.model, &at("model"), "the model's name")?, &at("model"))?.to_string();

        let sparse_path = at("sparse_files");
        let sparse = required(&m.sparse_files, &sparse_path, "one HugeCTR sparse model folder per embedding table")?;
        if sparse.is_empty() {
            return Err(Problem::new(&sparse_path, "is empty; expected at least one sparse model folder (one per embedding table)"));
        }
        let sparse_files = each(sparse, &sparse_path, |f, at| {
            let s = non_empty(f, at)?;
            if let Some((scheme, _)) = s.split_once("://") {
                return Err(Problem::new(
                    at,
                    format!("\"{s}\": remote file systems ({scheme}://) are not supported; expected a local folder"),
                ));
            }
            Ok(resolve(base_dir, s))
        })?;
        let tables = sparse_files.len();

        let vecsize_path = at("embedding_vecsize_per_table");
        let vecsize = required(&m.embedding_vecsize_per_table, &vecsize_path, "the number of floats per row of each table")?;
        let vecsize = each(vecsize, &vecsize_path, |v, at| {
            let d = uint(v, at, 1)?;
            if d > MAX_DIM {
                return Err(Problem::new(at, format!("{d} is too large; expected at most {MAX_DIM} floats per row")));
            }
            Ok(d)
        })?;
        let maxnum_path = at("maxnum_catfeature_query_per_table_per_sample");
        let maxnum =
            required(&m.maxnum_catfeature_query_per_table_per_sample, &maxnum_path, "the most keys one sample looks up in each table")?;
        let maxnum = each(maxnum, &maxnum_path, |v, at| uint(v, at, 1))?;
        let names = m
            .embedding_table_names
            .as_ref()
            .map(|l| each(l, &at("embedding_table_names"), |v, at| non_empty(v, at).map(str::to_string)))
            .transpose()?;
        let defaults = m
            .default_value_for_each_table
            .as_ref()
            .map(|l| each(l, &at("default_value_for_each_table"), |v, at| float32(v, at, Range::Any)))
            .transpose()?;

        let storage = m
            .strata_storage_per_table
            .as_ref()
            .map(|l| {
                each(l, &at("strata_storage_per_table"), |v, at| {
                    crate::kernels::RowFormat::parse(&v.0).ok_or_else(|| {
                        Problem::new(at, format!("\"{}\"; expected \"float32\", \"float16\", \"bfloat16\", \"int8\" or \"int4\"", v.0))
                    })
                })
            })
            .transpose()?;
        if let Some(s) = &storage {
            for (j, f) in s.iter().enumerate() {
                if let Some(msg) = vecsize.get(j).and_then(|&d| f.check_dim(d)) {
                    return Err(Problem::new(&index(&at("strata_storage_per_table"), j), msg));
                }
            }
        }

        let lengths = [
            ("embedding_vecsize_per_table", Some(vecsize.len())),
            ("strata_storage_per_table", storage.as_ref().map(Vec::len)),
            ("maxnum_catfeature_query_per_table_per_sample", Some(maxnum.len())),
            ("embedding_table_names", names.as_ref().map(Vec::len)),
            ("default_value_for_each_table", defaults.as_ref().map(Vec::len)),
        ];
        for (key, len) in lengths {
            if let Some(n) = len
                && n != tables
            {
                return Err(Problem::new(
                    &at(key),
                    format!(
                        "has {n} {} but {sparse_path} has {tables}; expected one entry per sparse file (embedding table)",
                        if n == 1 { "entry" } else { "entries" }
                    ),
                ));
            }
        }
        let embedding_table_names = names.unwrap_or_else(|| (0..tables).map(|i| format!("sparse_embedding{i}")).collect());
        for j in 0..tables {
            if let Some(i) = (0..j).find(|&i| embedding_table_names[i] == embedding_table_names[j]) {
                return Err(Problem::new(
                    &index(&at("embedding_table_names"), j),
                    format!(
                        "duplicate table name \"{}\" (also embedding_table_names[{i}]); expected unique names within a model",
                        embedding_table_names[j]
                    ),
                ));
            }
        }

        let deployed_device_list = each(&m.deployed_device_list, &at("deployed_device_list"), device)?;
        if deployed_device_list.is_empty() {
            return Err(Problem::new(&at("deployed_device_list"), "is empty; expected at least one device id"));
        }

        let use_static_table = m.use_static_table.0;
        let mut embedding_cache_type = match &m.embedding_cache_type {
            None => EmbeddingCacheType::Dynamic,
            Some(c) => known(c, &at("embedding_cache_type"), "embedding cache type", &["dynamic", "static", "uvm"])?,
        };
        if use_static_table && embedding_cache_type != EmbeddingCacheType::Static {
            if m.embedding_cache_type.is_some() {
                self.warnings.push(format!(
                    "{}: \"{embedding_cache_type}\" overridden by use_static_table = true (as in HPS)",
                    at("embedding_cache_type")
                ));
            }
            embedding_cache_type = EmbeddingCacheType::Static;
        }

        Ok(ModelConfig {
            model: name,
            sparse_files,
            embedding_table_names,
            embedding_vecsize_per_table: vecsize,
            default_value_for_each_table: defaults.unwrap_or_else(|| vec![0.0; tables]),
            strata_storage_per_table: storage.unwrap_or_else(|| vec![crate::dlpack::FloatDtype::F32.into(); tables]),
            maxnum_catfeature_query_per_table_per_sample: maxnum,
            max_batch_size: uint(&m.max_batch_size, &at("max_batch_size"), 1)?,
            deployed_device_list,
            gpucache: m.gpucache.0,
            gpucacheper: float32(&m.gpucacheper, &at("gpucacheper"), Range::Fraction)?,
            hit_rate_threshold: float32(&m.hit_rate_threshold, &at("hit_rate_threshold"), Range::NonNegative)?,
            use_static_table,
            embedding_cache_type,
            num_of_worker_buffer_in_pool: uint(&m.num_of_worker_buffer_in_pool, &at("num_of_worker_buffer_in_pool"), 1)?,
            num_of_refresher_buffer_in_pool: uint(&m.num_of_refresher_buffer_in_pool, &at("num_of_refresher_buffer_in_pool"), 1)?,
            cache_refresh_percentage_per_iteration: float32(
                &m.cache_refresh_percentage_per_iteration,
                &at("cache_refresh_percentage_per_iteration"),
                Range::Fraction,
            )?,
            refresh_delay: float32(&m.refresh_delay, &at("refresh_delay"), Range::NonNegative)?,
            refresh_interval: float32(&m.refresh_interval, &at("refresh_interval"), Range::NonNegative)?,
        })
    }
}

/// Checks that `dir` is a HugeCTR sparse model folder whose `key` and `emb_vector` agree with
/// `dim` ([`hugectr::inspect`]), for table `table` of model `model`.
fn check_sparse_folder(dir: &Path, dim: usize, model: usize, table: usize) -> Checked<()> {
    const WHAT: &str = "a HugeCTR sparse model folder holds `key` and `emb_vector`";
    let Err(problem) = hugectr::inspect(dir, dim) else { return Ok(()) };
    let msg = match problem {
        FolderProblem::Missing => format!("{}: folder does not exist; {WHAT}", dir.display()),
        FolderProblem::NotAFolder => format!("{}: is not a folder; {WHAT}", dir.display()),
        FolderProblem::Lacks(name) => format!("{}: lacks `{name}`; {WHAT}", dir.display()),
        FolderProblem::NotAFile(f) => format!("{}: is not a file; {WHAT}", f.display()),
        FolderProblem::Io(f, e) => format!("{}: {e}", f.display()),
        FolderProblem::Sizes(SizeMismatch::PartialKey { key_bytes }) => {
            format!("{}: {key_bytes} bytes is not a whole number of int64 keys (8 bytes each)", dir.join("key").display())
        }
        FolderProblem::Sizes(SizeMismatch::Vectors { rows, vec_bytes, expected }) => format!(
            "{}: {vec_bytes} bytes; expected {expected} ({rows} keys in `key` x {dim} float32 per row from models[{model}].embedding_vecsize_per_table[{table}])",
            dir.join("emb_vector").display()
        ),
    };
    Err(Problem::new(&format!("models[{model}].sparse_files[{table}]"), msg))
}
