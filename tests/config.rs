//! HPS `ps.json` parsing (`strata::config`): configurations shaped like HPS's documented
//! examples, every default, every refused configuration with its status and exact JSON path,
//! fields reported as ignored or unknown, and paths resolved against the config's folder.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use strata::config::*;
use strata::{Error, ErrorKind, Status};

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Writes a HugeCTR sparse folder `dir/name` with `rows` keys and `rows x dim` float32 zeros.
fn sparse(dir: &Path, name: &str, rows: usize, dim: usize) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let keys: Vec<u8> = (0..rows as i64).flat_map(|k| (k * 3 + 1).to_le_bytes()).collect();
    std::fs::write(d.join("key"), keys).unwrap();
    std::fs::write(d.join("emb_vector"), vec![0u8; rows * dim * 4]).unwrap();
    d
}

/// A folder with the sparse folders the base config names: t0 (3 x 4), t1 (2 x 8), t2 (0 x 2).
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    sparse(dir.path(), "t0", 3, 4);
    sparse(dir.path(), "t1", 2, 8);
    sparse(dir.path(), "t2", 0, 2);
    dir
}

/// A valid two-model config over `workdir()`, holding only what HPS requires.
fn base() -> Value {
    json!({
        "supportlonglong": true,
        "models": [
            {
                "model": "m0",
                "sparse_files": ["t0", "t1"],
                "embedding_vecsize_per_table": [4, 8],
                "maxnum_catfeature_query_per_table_per_sample": [1, 3]
            },
            {
                "model": "m1",
                "sparse_files": ["t2"],
                "embedding_vecsize_per_table": [2],
                "maxnum_catfeature_query_per_table_per_sample": [1]
            }
        ]
    })
}

/// `v` with the value at JSON pointer `ptr` replaced by (or, for a new key, set to) `x`.
fn set(mut v: Value, ptr: &str, x: Value) -> Value {
    let (parent, key) = ptr.rsplit_once('/').unwrap();
    match v.pointer_mut(parent).unwrap() {
        Value::Object(m) => {
            m.insert(key.to_string(), x);
        }
        Value::Array(a) => a[key.parse::<usize>().unwrap()] = x,
        other => panic!("{parent} is {other}"),
    }
    v
}

/// `v` without the field at JSON pointer `ptr`.
fn remove(mut v: Value, ptr: &str) -> Value {
    let (parent, key) = ptr.rsplit_once('/').unwrap();
    v.pointer_mut(parent).unwrap().as_object_mut().unwrap().remove(key).unwrap();
    v
}

fn parse_in(dir: &Path, v: &Value) -> strata::Result<PsConfig> {
    parse(&v.to_string(), "ps.json", dir)
}

fn ok(dir: &Path, v: &Value) -> PsConfig {
    parse_in(dir, v).unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts `r` is a config error at exactly `path` whose message contains `fragment`;
/// returns the message.
#[track_caller]
fn config_error(r: strata::Result<PsConfig>, path: &str, fragment: &str) -> String {
    let e = match r {
        Ok(c) => panic!("expected a config error at {path}, got {c:?}"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let shown = e.to_string();
    let Error::Config { file, path: p, msg } = e else { unreachable!() };
    assert_eq!(p, path, "wrong JSON path in: {shown}");
    assert!(msg.contains(fragment), "message {msg:?} lacks {fragment:?}");
    assert_eq!(shown, format!("{file}: {p}: {msg}"));
    msg
}

#[track_caller]
fn refused(dir: &Path, v: &Value, path: &str, fragment: &str) -> String {
    let r = parse_in(dir, v);
    if let Err(Error::Config { file, .. }) = &r {
        assert_eq!(file, "ps.json");
    }
    config_error(r, path, fragment)
}

fn cpus_or_16() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(16)
}

// ---------------------------------------------------------------------------------------------
// Configurations shaped like HPS's documented examples.

#[test]
fn hps_demo_fixture_loads_with_paths_from_its_folder() {
    // Loaded by a relative path (tests run in the package root): the sparse folders come back
    // absolute, under the fixture's folder.
    let rel = Path::new("tests/data/config/hps_demo/ps.json");
    let c = load(rel).unwrap_or_else(|e| panic!("{e}"));
    let folder = std::path::absolute("tests/data/config/hps_demo").unwrap();
    assert_eq!(c.file, rel.display().to_string());
    assert!(c.supportlonglong);
    assert_eq!(c.models.len(), 1);
    let m = &c.models[0];
    assert_eq!(m.model, "hps_demo");
    assert_eq!(m.sparse_files, vec![folder.join("hps_demo0_sparse_1000.model"), folder.join("hps_demo1_sparse_1000.model")]);
    assert!(m.sparse_files.iter().all(|p| p.is_absolute() && p.is_dir()));
    assert_eq!(m.embedding_table_names, ["sparse_embedding1", "sparse_embedding2"]);
    assert_eq!(m.embedding_vecsize_per_table, [4, 8]);
    assert_eq!(m.default_value_for_each_table, [1.0, -0.5]);
    assert_eq!(m.maxnum_catfeature_query_per_table_per_sample, [2, 26]);
    assert_eq!(m.max_batch_size, 1024);
    assert_eq!(m.deployed_device_list, [0]);
    assert!(m.gpucache);
    assert_eq!((m.gpucacheper, m.hit_rate_threshold), (1.0, 1.0));
    assert_eq!((m.num_of_worker_buffer_in_pool, m.num_of_refresher_buffer_in_pool), (3, 1));
    assert_eq!(m.embedding_cache_type, EmbeddingCacheType::Dynamic);
    assert_eq!(m.num_tables(), 2);
    assert_eq!(m.table_id("sparse_embedding2"), Some(1));
    assert_eq!(m.table_id("sparse_embedding0"), None);
    assert_eq!(c.model("hps_demo"), Some(m));
    assert_eq!(c.model("wdl"), None);
    // No volatile_db / persistent_db sections: HPS's defaults.
    assert_eq!(c.volatile_db, VolatileDbConfig::default());
    assert_eq!(c.persistent_db, PersistentDbConfig::default());
    assert_eq!(
        c.warnings,
        [
            "models[0].dense_file: ignored (dense model files are not served by strata)",
            "models[0].maxnum_des_feature_per_sample: ignored (dense features are not served by strata)",
            "models[0].network_file: ignored (the dense network is not served by strata)",
        ]
    );
}

#[test]
fn load_reports_a_missing_file_as_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("absent.json");
    let e = load(&p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(matches!(&e, Error::Io { path, .. } if *path == p.display().to_string()), "{e:?}");
    assert!(e.to_string().contains("absent.json"), "{e}");
    // A folder is not a readable file either.
    assert_eq!(load(dir.path()).unwrap_err().kind(), ErrorKind::Io);
}

#[test]
fn load_names_the_file_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ps.json");
    std::fs::write(&p, r#"{"models": 5}"#).unwrap();
    let e = load(&p).unwrap_err();
    let Error::Config { file, path, msg } = &e else { panic!("{e:?}") };
    assert_eq!(file, &p.display().to_string());
    assert_eq!((path.as_str(), msg.as_str()), ("models", "expected an array, got a number"));
    assert_eq!(e.to_string(), format!("{}: models: expected an array, got a number", p.display()));
}

#[test]
fn two_models_with_database_sections_like_the_hps_docs() {
    let dir = workdir();
    let store = dir.path().join("store");
    // Shaped like HPS's documented `models`, `volatile_db`, `persistent_db` and
    // `update_source` examples, comments included.
    let text = r#"{
      "supportlonglong": false,
      "fuse_embedding_table": false,
      "models": [
        {
          "model": "wdl",
          "sparse_files": ["t0", "t1"],
          "dense_file": "wdl_dense_20000.model",
          "network_file": "wdl.json",
          "num_of_worker_buffer_in_pool": 4,
          "num_of_refresher_buffer_in_pool": 2,
          "deployed_device_list": [0, 1],
          "max_batch_size": 64,
          "default_value_for_each_table": [0.0, 0.25],
          "maxnum_des_feature_per_sample": 26,
          "maxnum_catfeature_query_per_table_per_sample": [2, 26],
          "embedding_vecsize_per_table": [4, 8],
          "embedding_table_names": ["table1", "table2"],
          "refresh_delay": 0,
          "refresh_interval": 30.5,
          "hit_rate_threshold": 0.75,
          "gpucacheper": 0.1,
          "gpucache": true,
          "cache_refresh_percentage_per_iteration": 0.2,
          "label_dim": 1,
          "slot_num": 10,
          "use_static_table": false,
          "use_context_stream": false
        },
        {
          "model": "dcn",
          "sparse_files": ["t2"],
          "embedding_vecsize_per_table": [2],
          "maxnum_catfeature_query_per_table_per_sample": [1],
          "embedding_cache_type": "uvm",
          "gpucache": false
        }
      ],
      "volatile_db": {
        "type": "hash_map",
        "address": "127.0.0.1:7003,127.0.0.1:7004",
        "user_name": "default",
        "password": "",
        "num_partitions": 8,
        "allocation_rate": 268435456,  // 256 MiB
        "max_batch_size": 1e5,
        "overflow_margin": 10000000,
        "overflow_policy": "evict_least_used",
        "overflow_resolution_target": 0.5,
        "initialize_after_startup": false,
        "initial_cache_rate": 0.2,
        "cache_missed_embeddings": true,
        "update_filters": [".+"]
      },
      "persistent_db": {
        "type": "rocks_db",
        "path": "store",
        "num_threads": 16,
        "read_only": true,
        "max_batch_size": 4096,
        "update_filters": [".+"]
      },
      /* No update source: strata takes updates through strata_table_upsert. */
      "update_source": { "type": "null", "brokers": "127.0.0.1:9092" }
    }"#;
    let c = parse(text, "ps.json", dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.supportlonglong);
    assert_eq!(c.models.len(), 2);

    let wdl = c.model("wdl").unwrap();
    assert_eq!(wdl.sparse_files, [dir.path().join("t0"), dir.path().join("t1")]);
    assert_eq!(wdl.embedding_table_names, ["table1", "table2"]);
    assert_eq!(wdl.embedding_vecsize_per_table, [4, 8]);
    assert_eq!(wdl.default_value_for_each_table, [0.0, 0.25]);
    assert_eq!(wdl.maxnum_catfeature_query_per_table_per_sample, [2, 26]);
    assert_eq!(wdl.max_batch_size, 64);
    assert_eq!(wdl.deployed_device_list, [0, 1]);
    assert!(wdl.gpucache);
    assert_eq!((wdl.gpucacheper, wdl.hit_rate_threshold), (0.1, 0.75));
    assert_eq!((wdl.num_of_worker_buffer_in_pool, wdl.num_of_refresher_buffer_in_pool), (4, 2));
    assert_eq!(wdl.cache_refresh_percentage_per_iteration, 0.2);
    assert_eq!((wdl.refresh_delay, wdl.refresh_interval), (0.0, 30.5));
    assert!(!wdl.use_static_table);
    assert_eq!(wdl.embedding_cache_type, EmbeddingCacheType::Dynamic);

    let dcn = &c.models[1];
    assert_eq!(dcn.model, "dcn");
    assert_eq!(dcn.sparse_files, [dir.path().join("t2")]);
    assert_eq!(dcn.embedding_table_names, ["sparse_embedding0"]);
    assert_eq!(dcn.default_value_for_each_table, [0.0]);
    assert!(!dcn.gpucache);
    assert_eq!(dcn.embedding_cache_type, EmbeddingCacheType::Uvm);

    assert_eq!(
        c.volatile_db,
        VolatileDbConfig {
            kind: VolatileDbKind::HashMap,
            num_partitions: 8,
            overflow_margin: 10_000_000,
            overflow_policy: OverflowPolicy::EvictLeastUsed,
            overflow_resolution_target: 0.5,
            initial_cache_rate: 0.2,
            cache_missed_embeddings: true,
            max_batch_size: 100_000,
            initialize_after_startup: false,
            refresh_interval_ms: 1000,
            redis: None,
        }
    );
    assert_eq!(
        c.persistent_db,
        PersistentDbConfig {
            kind: PersistentDbKind::RocksDb,
            path: store,
            read_only: true,
            max_batch_size: 4096,
            initialize_after_startup: true,
        }
    );
    let redis = "only used when volatile_db.type is redis_cluster";
    let kafka = "only used with a Kafka update source, which strata does not support";
    let dense = "the dense network is not served by strata";
    assert_eq!(
        c.warnings,
        [
            "fuse_embedding_table: ignored (strata looks each table up on its own; table fusion is an HPS GPU-plugin optimisation)"
                .to_string(),
            format!("volatile_db.address: ignored ({redis})"),
            "volatile_db.allocation_rate: ignored (strata allocates the volatile tier itself)".to_string(),
            format!("volatile_db.password: ignored ({redis})"),
            format!("volatile_db.update_filters: ignored ({kafka})"),
            format!("volatile_db.user_name: ignored ({redis})"),
            "persistent_db.num_threads: ignored (a RocksDB driver setting; strata's store needs no threads of its own)".to_string(),
            format!("persistent_db.update_filters: ignored ({kafka})"),
            "update_source.brokers: ignored (no update source is configured)".to_string(),
            "models[0].dense_file: ignored (dense model files are not served by strata)".to_string(),
            format!("models[0].label_dim: ignored ({dense})"),
            "models[0].maxnum_des_feature_per_sample: ignored (dense features are not served by strata)".to_string(),
            format!("models[0].network_file: ignored ({dense})"),
            format!("models[0].slot_num: ignored ({dense})"),
            "models[0].use_context_stream: ignored (strata always runs on the stream given to each lookup)".to_string(),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Defaults.

#[test]
fn every_default_is_hps_default() {
    let dir = workdir();
    let c = ok(dir.path(), &remove(base(), "/supportlonglong"));
    assert!(c.supportlonglong, "HPS documents supportlonglong = true by default");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);

    let v = &c.volatile_db;
    assert_eq!(v.kind, VolatileDbKind::ParallelHashMap);
    assert_eq!(v.num_partitions, cpus_or_16());
    assert_eq!(v.overflow_margin, usize::MAX);
    assert_eq!(v.overflow_policy, OverflowPolicy::EvictRandom);
    assert_eq!(v.overflow_resolution_target, 0.8);
    assert_eq!(v.initial_cache_rate, 1.0);
    assert!(!v.cache_missed_embeddings);
    assert_eq!(v.max_batch_size, 65536);
    assert!(v.initialize_after_startup);
    assert_eq!(*v, VolatileDbConfig::default());

    let p = &c.persistent_db;
    assert_eq!(p.kind, PersistentDbKind::Disabled);
    assert_eq!(p.path, std::env::temp_dir().join("rocksdb"));
    assert!(!p.read_only);
    assert_eq!(p.max_batch_size, 65536);
    assert!(p.initialize_after_startup);
    assert_eq!(*p, PersistentDbConfig::default());

    let m = &c.models[0];
    assert_eq!(m.embedding_table_names, ["sparse_embedding0", "sparse_embedding1"]);
    assert_eq!(m.default_value_for_each_table, [0.0, 0.0]);
    assert_eq!(m.max_batch_size, 64);
    assert_eq!(m.deployed_device_list, [0]);
    assert!(m.gpucache);
    assert_eq!(m.gpucacheper, 0.2);
    assert_eq!(m.hit_rate_threshold, 0.9);
    assert!(!m.use_static_table);
    assert_eq!(m.embedding_cache_type, EmbeddingCacheType::Dynamic);
    assert_eq!(m.num_of_worker_buffer_in_pool, 1);
    assert_eq!(m.num_of_refresher_buffer_in_pool, 1);
    assert_eq!(m.cache_refresh_percentage_per_iteration, 0.0);
    assert_eq!(m.refresh_delay, 0.0);
    assert_eq!(m.refresh_interval, 0.0);
}

#[test]
fn empty_sections_take_the_defaults() {
    let dir = workdir();
    let v = set(set(set(base(), "/volatile_db", json!({})), "/persistent_db", json!({})), "/update_source", json!({}));
    let c = ok(dir.path(), &v);
    assert_eq!(c.volatile_db, VolatileDbConfig::default());
    assert_eq!(c.persistent_db, PersistentDbConfig::default());
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn hps_aliases_and_edge_values_are_accepted() {
    let dir = workdir();
    type Check<'a> = &'a dyn Fn(&PsConfig) -> bool;
    let cases: [(&str, Value, Check); 17] = [
        ("/volatile_db", json!({"type": "hashmap"}), &|c| c.volatile_db.kind == VolatileDbKind::HashMap),
        ("/volatile_db", json!({"type": "parallel_hashmap"}), &|c| c.volatile_db.kind == VolatileDbKind::ParallelHashMap),
        ("/volatile_db", json!({"type": "disabled"}), &|c| c.volatile_db.kind == VolatileDbKind::Disabled),
        ("/volatile_db", json!({"type": "none"}), &|c| c.volatile_db.kind == VolatileDbKind::Disabled),
        ("/volatile_db", json!({"overflow_policy": "evict_oldest"}), &|c| c.volatile_db.overflow_policy == OverflowPolicy::EvictOldest),
        ("/volatile_db", json!({"overflow_policy": "least_used"}), &|c| c.volatile_db.overflow_policy == OverflowPolicy::EvictLeastUsed),
        ("/volatile_db", json!({"overflow_policy": "random"}), &|c| c.volatile_db.overflow_policy == OverflowPolicy::EvictRandom),
        // (0, 1]: 1 is allowed.
        ("/volatile_db", json!({"overflow_resolution_target": 1}), &|c| c.volatile_db.overflow_resolution_target == 1.0),
        ("/volatile_db", json!({"overflow_margin": 18446744073709551615u64}), &|c| c.volatile_db.overflow_margin == usize::MAX),
        ("/volatile_db", json!({"initial_cache_rate": 0}), &|c| c.volatile_db.initial_cache_rate == 0.0),
        ("/persistent_db", json!({"type": "rocksdb"}), &|c| c.persistent_db.kind == PersistentDbKind::RocksDb),
        ("/persistent_db", json!({"type": "disable"}), &|c| c.persistent_db.kind == PersistentDbKind::Disabled),
        ("/update_source", json!({"type": "none"}), &|c| c.warnings.is_empty()),
        // HPS documents hit_rate_threshold > 1 as "always insert synchronously".
        ("/models/0/hit_rate_threshold", json!(1.5), &|c| c.models[0].hit_rate_threshold == 1.5),
        ("/models/0/max_batch_size", json!(1e6), &|c| c.models[0].max_batch_size == 1_000_000),
        ("/models/0/embedding_cache_type", json!("static"), &|c| c.models[0].embedding_cache_type == EmbeddingCacheType::Static),
        ("/models/0/default_value_for_each_table", json!([-1, 2.5]), &|c| c.models[0].default_value_for_each_table == [-1.0, 2.5]),
    ];
    for (ptr, x, check) in cases {
        let v = set(base(), ptr, x.clone());
        let c = ok(dir.path(), &v);
        assert!(check(&c), "{ptr} = {x}: {c:?}");
    }
}

#[test]
fn use_static_table_forces_the_static_cache_as_in_hps() {
    let dir = workdir();
    let c = ok(dir.path(), &set(base(), "/models/0/use_static_table", json!(true)));
    assert!(c.models[0].use_static_table);
    assert_eq!(c.models[0].embedding_cache_type, EmbeddingCacheType::Static);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);

    let v = set(set(base(), "/models/1/use_static_table", json!(true)), "/models/1/embedding_cache_type", json!("uvm"));
    let c = ok(dir.path(), &v);
    assert_eq!(c.models[1].embedding_cache_type, EmbeddingCacheType::Static);
    assert_eq!(c.warnings, ["models[1].embedding_cache_type: \"uvm\" overridden by use_static_table = true (as in HPS)"]);
}

// ---------------------------------------------------------------------------------------------
// Unknown and ignored fields, and paths.

#[test]
fn unknown_fields_are_reported_with_their_paths() {
    let dir = workdir();
    let mut v = base();
    v = set(v, "/serving_mode", json!("fast"));
    v = set(v, "/models/1/embedding_dims", json!([2]));
    v = set(v, "/models/1/gpucache_per", json!(0.5));
    v = set(v, "/volatile_db", json!({"type": "parallel_hash_map", "capacity": 10}));
    v = set(v, "/persistent_db", json!({"compression": "lz4"}));
    v = set(v, "/update_source", json!({"type": "null", "topic": "x"}));
    let c = ok(dir.path(), &v);
    // Top level first, then each section as it is parsed, then the models; keys sorted
    // within an object.
    assert_eq!(
        c.warnings,
        [
            "serving_mode: unknown field",
            "volatile_db.capacity: unknown field",
            "persistent_db.compression: unknown field",
            "update_source.topic: unknown field",
            "models[1].embedding_dims: unknown field",
            "models[1].gpucache_per: unknown field",
        ]
    );
}

#[test]
fn ignored_gpu_and_dense_fields_are_reported_not_dropped() {
    let dir = workdir();
    let mut v = base();
    for (k, x) in [
        ("non_trainable_params_file", json!("x")),
        ("use_mixed_precision", json!(true)),
        ("scaler", json!(128)),
        ("use_algorithm_search", json!(true)),
        ("use_cuda_graph", json!(true)),
        ("thread_pool_size", json!(16)),
        ("i64_input_key", json!(true)),
        ("device_id", json!(0)),
        ("fp8_quant", json!(false)),
    ] {
        v = set(v, &format!("/models/0/{k}"), x);
    }
    v = set(v, "/volatile_db", json!({"shared_memory_size": 1, "max_get_batch_size": 10000, "enable_tls": false}));
    let c = ok(dir.path(), &v);
    let mut got = c.warnings.clone();
    got.sort();
    let mut want = vec![
        "models[0].device_id: ignored (HPS replaced it with deployed_device_list)",
        "models[0].fp8_quant: ignored (strata keeps the vectors as stored (no quantisation))",
        "models[0].i64_input_key: ignored (the key type comes from each lookup's key tensor)",
        "models[0].non_trainable_params_file: ignored (the dense network is not served by strata)",
        "models[0].scaler: ignored (the dense network is not served by strata)",
        "models[0].thread_pool_size: ignored (strata sizes its own thread pool (STRATA_NUM_THREADS, lookup options))",
        "models[0].use_algorithm_search: ignored (the dense network is not served by strata)",
        "models[0].use_cuda_graph: ignored (the dense network is not served by strata)",
        "models[0].use_mixed_precision: ignored (the dense network is not served by strata)",
        "volatile_db.enable_tls: ignored (only used when volatile_db.type is redis_cluster)",
        "volatile_db.max_get_batch_size: ignored (HPS 3.x name; strata reads max_batch_size)",
        "volatile_db.shared_memory_size: ignored (only used by multi_process_hash_map, which strata does not support)",
    ];
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn relative_paths_resolve_against_the_config_folder() {
    let dir = workdir();
    let elsewhere = tempfile::tempdir().unwrap();
    let abs = sparse(elsewhere.path(), "abs_table", 4, 4);
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    sparse(&dir.path().join("sub"), "nested", 1, 8);
    let v =
        set(set(base(), "/models/0/sparse_files", json!([abs.to_str().unwrap(), "sub/nested"])), "/persistent_db", json!({"path": "db"}));
    let c = ok(dir.path(), &v);
    assert_eq!(c.models[0].sparse_files, [abs, dir.path().join("sub/nested")]);
    assert_eq!(c.models[1].sparse_files, [dir.path().join("t2")]);
    assert_eq!(c.persistent_db.path, dir.path().join("db"));
    // The same text under another base folder fails: the folders are looked up there.
    refused(elsewhere.path(), &v, "models[0].sparse_files[1]", "folder does not exist");
}

// ---------------------------------------------------------------------------------------------
// Refused configurations: status, exact JSON path, message.

#[test]
fn invalid_json_names_line_and_column() {
    let dir = workdir();
    let text = "{\n  \"models\": [\n    {\"model\": \"a\",}\n  ]\n}";
    let msg = config_error(parse(text, "ps.json", dir.path()), "(root)", "invalid JSON at line 3, column");
    assert!(msg.contains("trailing comma"), "{msg}");
    config_error(parse("", "ps.json", dir.path()), "(root)", "invalid JSON at line 1, column 0: EOF while parsing");
    config_error(parse("{} {}", "ps.json", dir.path()), "(root)", "trailing characters");
    config_error(parse("[]", "ps.json", dir.path()), "(root)", "expected an object, got an array");
    config_error(parse("{}", "ps.json", dir.path()), "models", "is missing; it is required");
}

#[test]
fn wrong_types_and_missing_fields() {
    let dir = workdir();
    let d = dir.path();
    let cases: &[(Value, &str, &str)] = &[
        (set(base(), "/models", json!({})), "models", "expected an array, got an object"),
        (set(base(), "/models", json!([])), "models", "is empty; expected at least one model"),
        (set(base(), "/models/1", json!(3)), "models[1]", "expected an object, got a number"),
        (remove(base(), "/models/1/model"), "models[1].model", "is missing; it is required: the model's name"),
        (set(base(), "/models/0/model", json!(5)), "models[0].model", "expected a string, got a number"),
        (set(base(), "/models/0/model", json!("")), "models[0].model", "is an empty string; expected a non-empty string"),
        (remove(base(), "/models/0/sparse_files"), "models[0].sparse_files", "is missing; it is required"),
        (set(base(), "/models/0/sparse_files", json!("t0")), "models[0].sparse_files", "expected an array, got a string"),
        (set(base(), "/models/0/sparse_files", json!([])), "models[0].sparse_files", "is empty; expected at least one"),
        (set(base(), "/models/0/sparse_files/1", json!(7)), "models[0].sparse_files[1]", "expected a string, got a number"),
        (set(base(), "/models/0/sparse_files/1", json!(null)), "models[0].sparse_files[1]", "expected a string, got null"),
        (remove(base(), "/models/1/embedding_vecsize_per_table"), "models[1].embedding_vecsize_per_table", "is missing; it is required"),
        (
            remove(base(), "/models/0/maxnum_catfeature_query_per_table_per_sample"),
            "models[0].maxnum_catfeature_query_per_table_per_sample",
            "is missing; it is required",
        ),
        (
            set(base(), "/models/0/embedding_vecsize_per_table", json!(4)),
            "models[0].embedding_vecsize_per_table",
            "expected an array, got a number",
        ),
        (
            set(base(), "/models/0/embedding_vecsize_per_table/1", json!("8")),
            "models[0].embedding_vecsize_per_table[1]",
            "expected a non-negative integer, got a string",
        ),
        (
            set(base(), "/models/0/embedding_vecsize_per_table/1", json!(8.5)),
            "models[0].embedding_vecsize_per_table[1]",
            "expected a non-negative integer, got 8.5",
        ),
        (
            set(base(), "/models/0/embedding_table_names", json!(["a", 2])),
            "models[0].embedding_table_names[1]",
            "expected a string, got a number",
        ),
        (set(base(), "/models/0/embedding_table_names", json!(["a", ""])), "models[0].embedding_table_names[1]", "is an empty string"),
        (
            set(base(), "/models/0/default_value_for_each_table", json!(["0", 1])),
            "models[0].default_value_for_each_table[0]",
            "expected a number, got a string",
        ),
        (set(base(), "/models/0/deployed_device_list", json!("0")), "models[0].deployed_device_list", "expected an array, got a string"),
        (set(base(), "/models/0/gpucache", json!("yes")), "models[0].gpucache", "expected a boolean (true or false), got a string"),
        (
            set(base(), "/models/0/use_static_table", json!(1)),
            "models[0].use_static_table",
            "expected a boolean (true or false), got a number",
        ),
        (set(base(), "/models/1/gpucacheper", json!("0.5")), "models[1].gpucacheper", "expected a number, got a string"),
        (set(base(), "/models/0/embedding_cache_type", json!(2)), "models[0].embedding_cache_type", "expected a string, got a number"),
        (set(base(), "/supportlonglong", json!("true")), "supportlonglong", "expected a boolean (true or false), got a string"),
        (set(base(), "/volatile_db", json!([])), "volatile_db", "expected an object, got an array"),
        (set(base(), "/volatile_db", json!({"type": 3})), "volatile_db.type", "expected a string, got a number"),
        (
            set(base(), "/volatile_db", json!({"cache_missed_embeddings": 1})),
            "volatile_db.cache_missed_embeddings",
            "expected a boolean (true or false), got a number",
        ),
        (
            set(base(), "/volatile_db", json!({"initialize_after_startup": "no"})),
            "volatile_db.initialize_after_startup",
            "expected a boolean",
        ),
        (set(base(), "/persistent_db", json!("rocks_db")), "persistent_db", "expected an object, got a string"),
        (set(base(), "/persistent_db", json!({"path": 5})), "persistent_db.path", "expected a string, got a number"),
        (set(base(), "/persistent_db", json!({"path": ""})), "persistent_db.path", "is an empty string"),
        (set(base(), "/persistent_db", json!({"read_only": "no"})), "persistent_db.read_only", "expected a boolean"),
        (set(base(), "/update_source", json!("kafka")), "update_source", "expected an object, got a string"),
    ];
    for (v, path, fragment) in cases {
        refused(d, v, path, fragment);
    }
}

#[test]
fn out_of_range_values() {
    let dir = workdir();
    let d = dir.path();
    let cases: &[(&str, Value, &str, &str)] = &[
        (
            "/models/0/embedding_vecsize_per_table/1",
            json!(-8),
            "models[0].embedding_vecsize_per_table[1]",
            "expected a non-negative integer, got -8",
        ),
        (
            "/models/0/embedding_vecsize_per_table/0",
            json!(0),
            "models[0].embedding_vecsize_per_table[0]",
            "0 is too small; expected an integer >= 1",
        ),
        (
            "/models/0/embedding_vecsize_per_table/0",
            json!(16_777_217),
            "models[0].embedding_vecsize_per_table[0]",
            "16777217 is too large; expected at most 16777216",
        ),
        (
            "/models/1/maxnum_catfeature_query_per_table_per_sample/0",
            json!(0),
            "models[1].maxnum_catfeature_query_per_table_per_sample[0]",
            "expected an integer >= 1",
        ),
        ("/models/0/max_batch_size", json!(-5), "models[0].max_batch_size", "expected a non-negative integer, got -5"),
        ("/models/0/max_batch_size", json!(0), "models[0].max_batch_size", "0 is too small; expected an integer >= 1"),
        ("/models/0/deployed_device_list", json!([]), "models[0].deployed_device_list", "is empty; expected at least one device id"),
        (
            "/models/0/deployed_device_list",
            json!([0, -1]),
            "models[0].deployed_device_list[1]",
            "-1 is not a device id; expected an integer >= 0",
        ),
        ("/models/0/deployed_device_list", json!([4294967296u64]), "models[0].deployed_device_list[0]", "too large for a device id"),
        ("/models/0/gpucacheper", json!(1.5), "models[0].gpucacheper", "1.5 is out of range; expected a fraction in [0, 1]"),
        ("/models/0/gpucacheper", json!(-0.1), "models[0].gpucacheper", "-0.1 is out of range; expected a fraction in [0, 1]"),
        ("/models/1/hit_rate_threshold", json!(-0.5), "models[1].hit_rate_threshold", "-0.5 is out of range; expected a number >= 0"),
        (
            "/models/0/cache_refresh_percentage_per_iteration",
            json!(2),
            "models[0].cache_refresh_percentage_per_iteration",
            "expected a fraction in [0, 1]",
        ),
        ("/models/0/refresh_interval", json!(-1), "models[0].refresh_interval", "-1 is out of range; expected a number >= 0"),
        ("/models/0/refresh_delay", json!(-0.5), "models[0].refresh_delay", "expected a number >= 0"),
        ("/models/0/num_of_worker_buffer_in_pool", json!(0), "models[0].num_of_worker_buffer_in_pool", "expected an integer >= 1"),
        ("/models/0/num_of_refresher_buffer_in_pool", json!(-1), "models[0].num_of_refresher_buffer_in_pool", "got -1"),
        (
            "/models/0/default_value_for_each_table",
            json!([0, 1e39]),
            "models[0].default_value_for_each_table[1]",
            "out of range for a 32-bit float",
        ),
        ("/volatile_db", json!({"num_partitions": 0}), "volatile_db.num_partitions", "0 is too small; expected an integer >= 1"),
        ("/volatile_db", json!({"num_partitions": -2}), "volatile_db.num_partitions", "got -2"),
        ("/volatile_db", json!({"overflow_margin": -1}), "volatile_db.overflow_margin", "expected a non-negative integer, got -1"),
        ("/volatile_db", json!({"overflow_margin": 0}), "volatile_db.overflow_margin", "expected an integer >= 1"),
        (
            "/volatile_db",
            json!({"overflow_resolution_target": 0}),
            "volatile_db.overflow_resolution_target",
            "0 is out of range; expected a fraction in (0, 1]",
        ),
        (
            "/volatile_db",
            json!({"overflow_resolution_target": 1.5}),
            "volatile_db.overflow_resolution_target",
            "expected a fraction in (0, 1]",
        ),
        (
            "/volatile_db",
            json!({"initial_cache_rate": 1.2}),
            "volatile_db.initial_cache_rate",
            "1.2 is out of range; expected a fraction in [0, 1]",
        ),
        ("/volatile_db", json!({"initial_cache_rate": -0.1}), "volatile_db.initial_cache_rate", "expected a fraction in [0, 1]"),
        ("/volatile_db", json!({"max_batch_size": 0}), "volatile_db.max_batch_size", "expected an integer >= 1"),
        ("/persistent_db", json!({"max_batch_size": -1}), "persistent_db.max_batch_size", "got -1"),
    ];
    for (ptr, x, path, fragment) in cases {
        refused(d, &set(base(), ptr, x.clone()), path, fragment);
    }
}

#[test]
fn unknown_enum_strings_list_the_accepted_ones() {
    let dir = workdir();
    let d = dir.path();
    refused(
        d,
        &set(base(), "/models/0/embedding_cache_type", json!("lru")),
        "models[0].embedding_cache_type",
        "unknown embedding cache type \"lru\"; expected one of \"dynamic\", \"static\" or \"uvm\"",
    );
    refused(
        d,
        &set(base(), "/volatile_db", json!({"overflow_policy": "lru"})),
        "volatile_db.overflow_policy",
        "unknown overflow policy \"lru\"; expected one of \"evict_random\", \"evict_least_used\" or \"evict_oldest\"",
    );
    refused(
        d,
        &set(base(), "/volatile_db", json!({"type": "memcached"})),
        "volatile_db.type",
        "unknown volatile database type \"memcached\"; expected one of \"parallel_hash_map\", \"hash_map\", \"redis_cluster\" or \"disabled\"",
    );
    refused(
        d,
        &set(base(), "/persistent_db", json!({"type": "leveldb"})),
        "persistent_db.type",
        "unknown persistent database type \"leveldb\"; expected one of \"disabled\" or \"rocks_db\"",
    );
    refused(
        d,
        &set(base(), "/update_source", json!({"type": "rabbitmq"})),
        "update_source.type",
        "unknown update source type \"rabbitmq\"; expected \"null\"",
    );
    // A type valid for the other database section is named as such.
    refused(d, &set(base(), "/volatile_db", json!({"type": "rocks_db"})), "volatile_db.type", "\"rocks_db\" is a persistent database type");
    refused(
        d,
        &set(base(), "/persistent_db", json!({"type": "hash_map"})),
        "persistent_db.type",
        "\"hash_map\" is a volatile database type",
    );
}

#[test]
fn redis_cluster_fields_have_hps_meanings_and_defaults() {
    let dir = workdir();
    let d = dir.path();
    for t in ["redis_cluster", "redis"] {
        let c = ok(d, &set(base(), "/volatile_db", json!({"type": t, "max_batch_size": 1000})));
        assert_eq!(c.volatile_db.kind, VolatileDbKind::RedisCluster);
        assert_eq!(c.volatile_db.num_partitions, 16, "HPS's 16, whatever this machine's CPUs");
        let r = c.volatile_db.redis.unwrap();
        assert_eq!(r.seeds, ["127.0.0.1:7000"]);
        assert_eq!((r.user_name.as_str(), r.password.0.as_str()), ("default", ""));
        assert_eq!((r.num_node_connections, r.max_get_batch_size, r.max_set_batch_size), (5, 1000, 1000));
        assert!(r.refresh_time_after_fetch);
        assert_eq!(r.timeout_ms, 1000);
    }
    let v = json!({"type": "redis_cluster", "address": "10.0.0.1:7000, 10.0.0.2:7001", "user_name": "hps",
                   "password": "secret", "num_node_connections": 2, "max_get_batch_size": 512, "max_set_batch_size": 64,
                   "refresh_time_after_fetch": false, "strata_redis_timeout_ms": 250, "enable_tls": false,
                   "tls_ca_certificate": "ca.crt"});
    let c = ok(d, &set(base(), "/volatile_db", v));
    let r = c.volatile_db.redis.clone().unwrap();
    assert_eq!(r.seeds, ["10.0.0.1:7000", "10.0.0.2:7001"]);
    assert_eq!((r.user_name.as_str(), r.password.0.as_str()), ("hps", "secret"));
    assert_eq!((r.num_node_connections, r.max_get_batch_size, r.max_set_batch_size, r.timeout_ms), (2, 512, 64, 250));
    assert!(!r.refresh_time_after_fetch);
    assert!(!format!("{c:?}").contains("secret"), "the password is not printed");
    assert_eq!(c.warnings, ["volatile_db.tls_ca_certificate: ignored (enable_tls is false; strata connects to Redis without TLS)"]);
    for (v, path, needle) in [
        (json!({"type": "redis_cluster", "address": "host"}), "volatile_db.address", "has no port"),
        (json!({"type": "redis_cluster", "address": "h:1,,h:2"}), "volatile_db.address", "empty entry"),
        (json!({"type": "redis_cluster", "address": "h:99999"}), "volatile_db.address", "is not a number"),
        (json!({"type": "redis_cluster", "address": 7000}), "volatile_db.address", "expected a string"),
        (json!({"type": "redis_cluster", "enable_tls": true}), "volatile_db.enable_tls", "true is not supported"),
        (json!({"type": "redis_cluster", "strata_redis_timeout_ms": 0}), "volatile_db.strata_redis_timeout_ms", "too small"),
        (json!({"type": "redis_cluster", "max_get_batch_size": 0}), "volatile_db.max_get_batch_size", "too small"),
        (json!({"type": "redis_cluster", "num_node_connections": 0}), "volatile_db.num_node_connections", "too small"),
        (json!({"type": "redis_cluster", "user_name": ""}), "volatile_db.user_name", "empty string"),
    ] {
        refused(d, &set(base(), "/volatile_db", v), path, needle);
    }
    // Redis fields given to an in-process tier are listed, not used.
    let c = ok(
        d,
        &set(base(), "/volatile_db", json!({"type": "hash_map", "address": "h:1", "strata_redis_timeout_ms": 5, "tls_client_key": "k"})),
    );
    assert_eq!(c.volatile_db.redis, None);
    let redis = "only used when volatile_db.type is redis_cluster";
    assert_eq!(
        c.warnings,
        [
            format!("volatile_db.address: ignored ({redis})"),
            format!("volatile_db.strata_redis_timeout_ms: ignored ({redis})"),
            format!("volatile_db.tls_client_key: ignored ({redis})"),
        ]
    );
}

#[test]
fn unsupported_hps_features_are_config_errors() {
    let dir = workdir();
    let d = dir.path();
    refused(
        d,
        &set(base(), "/volatile_db", json!({"type": "multi_process_hash_map"})),
        "volatile_db.type",
        "\"multi_process_hash_map\" is not supported: strata has no shared-memory volatile tier",
    );
    for t in ["kafka_message_queue", "kafka"] {
        refused(
            d,
            &set(base(), "/update_source", json!({"type": t, "brokers": "127.0.0.1:9092"})),
            "update_source.type",
            "is not supported: strata takes no updates from Kafka; apply them with strata_table_upsert",
        );
    }
    for url in ["hdfs://localhost:9000/dir/to/model", "s3://bucket/t1", "gs://bucket/object", "https://storage.googleapis.com/b/o"] {
        let msg = refused(d, &set(base(), "/models/0/sparse_files/1", json!(url)), "models[0].sparse_files[1]", "remote file systems");
        assert!(msg.contains(url.split("://").next().unwrap()), "{msg}");
    }
}

#[test]
fn per_table_lists_need_one_entry_per_sparse_file() {
    let dir = workdir();
    let d = dir.path();
    let cases: &[(&str, Value, &str)] = &[
        ("/models/0/embedding_vecsize_per_table", json!([4]), "has 1 entry but models[0].sparse_files has 2"),
        ("/models/0/maxnum_catfeature_query_per_table_per_sample", json!([1, 2, 3]), "has 3 entries but models[0].sparse_files has 2"),
        ("/models/0/embedding_table_names", json!(["a"]), "has 1 entry but models[0].sparse_files has 2"),
        ("/models/1/default_value_for_each_table", json!([]), "has 0 entries but models[1].sparse_files has 1"),
        ("/models/1/embedding_table_names", json!(["a", "b"]), "has 2 entries but models[1].sparse_files has 1"),
    ];
    for (ptr, x, fragment) in cases {
        let path = ptr.trim_start_matches('/').replacen("models/0/", "models[0].", 1).replacen("models/1/", "models[1].", 1);
        let msg = refused(d, &set(base(), ptr, x.clone()), &path, fragment);
        assert!(msg.ends_with("expected one entry per sparse file (embedding table)"), "{msg}");
    }
}

#[test]
fn duplicate_names_are_refused() {
    let dir = workdir();
    let d = dir.path();
    refused(
        d,
        &set(base(), "/models/1/model", json!("m0")),
        "models[1].model",
        "duplicate model name \"m0\" (also models[0].model); expected unique names",
    );
    refused(
        d,
        &set(base(), "/models/0/embedding_table_names", json!(["emb", "emb"])),
        "models[0].embedding_table_names[1]",
        "duplicate table name \"emb\" (also embedding_table_names[0])",
    );
    // The same name in two models is fine.
    let v = set(set(base(), "/models/0/embedding_table_names", json!(["emb", "x"])), "/models/1/embedding_table_names", json!(["emb"]));
    ok(d, &v);
}

#[test]
fn sparse_folders_are_checked_on_disk() {
    let dir = workdir();
    let d = dir.path();
    let with = |f: &str| set(base(), "/models/0/sparse_files/1", json!(f));

    let msg = refused(d, &with("nope"), "models[0].sparse_files[1]", "folder does not exist");
    assert!(msg.contains(&d.join("nope").display().to_string()), "{msg}");

    std::fs::write(d.join("plain_file"), b"x").unwrap();
    refused(d, &with("plain_file"), "models[0].sparse_files[1]", "plain_file: is not a folder");

    sparse(d, "no_key", 2, 8);
    std::fs::remove_file(d.join("no_key/key")).unwrap();
    refused(d, &with("no_key"), "models[0].sparse_files[1]", "lacks `key`; a HugeCTR sparse model folder holds `key` and `emb_vector`");

    sparse(d, "no_vec", 2, 8);
    std::fs::remove_file(d.join("no_vec/emb_vector")).unwrap();
    refused(d, &with("no_vec"), "models[0].sparse_files[1]", "lacks `emb_vector`");

    sparse(d, "key_dir", 2, 8);
    std::fs::remove_file(d.join("key_dir/key")).unwrap();
    std::fs::create_dir(d.join("key_dir/key")).unwrap();
    refused(d, &with("key_dir"), "models[0].sparse_files[1]", "key: is not a file");

    sparse(d, "odd_key", 2, 8);
    std::fs::write(d.join("odd_key/key"), [0u8; 12]).unwrap();
    refused(d, &with("odd_key"), "models[0].sparse_files[1]", "12 bytes is not a whole number of int64 keys");

    // t1 holds 2 rows of 8 floats; a config saying 6 does not match the file.
    let msg = refused(
        d,
        &set(base(), "/models/0/embedding_vecsize_per_table/1", json!(6)),
        "models[0].sparse_files[1]",
        "64 bytes; expected 48 (2 keys in `key` x 6 float32 per row from models[0].embedding_vecsize_per_table[1])",
    );
    assert!(msg.contains("emb_vector"), "{msg}");

    // Mistakes in the text are reported before those on disk.
    let v = set(with("nope"), "/models/1/gpucacheper", json!(2));
    refused(d, &v, "models[1].gpucacheper", "out of range");
}

#[test]
fn persistent_path_must_be_a_folder_when_it_exists() {
    let dir = workdir();
    std::fs::write(dir.path().join("db_file"), b"x").unwrap();
    let msg = refused(
        dir.path(),
        &set(base(), "/persistent_db", json!({"type": "rocks_db", "path": "db_file"})),
        "persistent_db.path",
        "exists and is not a folder",
    );
    assert!(msg.contains(&dir.path().join("db_file").display().to_string()), "{msg}");
    std::fs::create_dir(dir.path().join("db")).unwrap();
    let c = ok(dir.path(), &set(base(), "/persistent_db", json!({"type": "rocks_db", "path": "db"})));
    assert_eq!(c.persistent_db.path, dir.path().join("db"));
}

#[test]
fn status_of_every_config_error_is_strata_config_error() {
    assert_eq!(Status::STRATA_CONFIG_ERROR as i32, 13);
    let e = Error::Config { file: "ps.json".into(), path: "(root)".into(), msg: "m".into() };
    assert_eq!(e.kind(), ErrorKind::Config);
    assert_eq!(e.to_string(), "ps.json: (root): m");
}
