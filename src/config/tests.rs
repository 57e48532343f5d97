//! Unit tests of the two steps; `tests/config.rs` tests whole files through `parse` and `load`.

use super::json::{self, DatabaseType, DeviceId, Float, ModelJson, Uint, UpdateSourceType};
use super::validate::{self, Range};
use super::*;
use serde::Deserialize;
use serde_json::Value;

/// `json` read as a `T`, or the message of the value's error.
fn read<T: for<'de> Deserialize<'de>>(json: &str) -> std::result::Result<T, String> {
    let v: Value = serde_json::from_str(json).unwrap();
    T::deserialize(&v).map_err(|e| e.to_string())
}

fn msg<T: std::fmt::Debug>(r: std::result::Result<T, Problem>) -> String {
    r.unwrap_err().msg
}

#[test]
fn comments_are_blanked_outside_strings_only() {
    let text = "{\"a\": \"x//y /*z*/\", // note é\n \"b\": /* 256 MiB\n */ 1}";
    let out = json::blank_comments(text);
    assert_eq!(out.len(), text.len());
    assert_eq!(out.lines().count(), text.lines().count());
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["a"], "x//y /*z*/");
    assert_eq!(v["b"], 1);
    // An escaped quote does not end the string.
    let v: Value = serde_json::from_str(&json::blank_comments(r#"{"a": "q\"//"} // c"#)).unwrap();
    assert_eq!(v["a"], "q\"//");
    // An unterminated block comment blanks the rest.
    assert_eq!(json::blank_comments("1 /* x").trim(), "1");
    assert!(matches!(json::blank_comments("{}"), std::borrow::Cow::Borrowed(_)));
}

#[test]
fn paths_and_names() {
    assert_eq!(join(ROOT, "models"), "models");
    assert_eq!(join("models[1]", "sparse_files"), "models[1].sparse_files");
    assert_eq!(index("models[1].sparse_files", 0), "models[1].sparse_files[0]");
    assert_eq!(validate::one_of(&["a"]), "\"a\"");
    assert_eq!(validate::one_of(&["a", "b", "c"]), "one of \"a\", \"b\" or \"c\"");
    assert_eq!(OverflowPolicy::EvictLeastUsed.to_string(), "evict_least_used");
    assert_eq!(VolatileDbKind::ParallelHashMap.as_str(), "parallel_hash_map");
    assert_eq!(PersistentDbKind::RocksDb.as_str(), "rocks_db");
    assert_eq!(EmbeddingCacheType::Uvm.as_str(), "uvm");
}

#[test]
fn names_and_aliases_are_serde_names() {
    let choice = |s: &str| read::<json::Choice<DatabaseType>>(s).unwrap().value;
    assert_eq!(choice("\"parallel_hashmap\""), Some(DatabaseType::ParallelHashMap));
    assert_eq!(choice("\"multi_process_map\""), Some(DatabaseType::MultiProcessHashMap));
    assert_eq!(choice("\"redis\""), Some(DatabaseType::RedisCluster));
    assert_eq!(choice("\"rocks\""), Some(DatabaseType::RocksDb));
    assert_eq!(choice("\"Hash_Map\""), None);
    let c = read::<json::Choice<UpdateSourceType>>("\"kafka_mq\"").unwrap();
    assert_eq!((c.name.as_str(), c.value), ("kafka_mq", Some(UpdateSourceType::KafkaMessageQueue)));
    for p in [OverflowPolicy::EvictRandom, OverflowPolicy::EvictLeastUsed, OverflowPolicy::EvictOldest] {
        assert_eq!(read::<OverflowPolicy>(&format!("\"{p}\"")).unwrap(), p);
        assert_eq!(read::<OverflowPolicy>(&format!("\"{}\"", &p.as_str()[6..])).unwrap(), p);
    }
    for t in [EmbeddingCacheType::Dynamic, EmbeddingCacheType::Static, EmbeddingCacheType::Uvm] {
        assert_eq!(read::<EmbeddingCacheType>(&format!("\"{t}\"")).unwrap(), t);
    }
}

#[test]
fn values_of_the_wrong_kind_say_what_they_are() {
    assert_eq!(read::<Uint>("7").unwrap(), Uint(7));
    assert_eq!(read::<Uint>("1e6").unwrap(), Uint(1_000_000));
    assert_eq!(read::<Uint>("18446744073709551615").unwrap(), Uint(u64::MAX));
    assert_eq!(read::<Uint>("-3").unwrap_err(), "expected a non-negative integer, got -3");
    assert_eq!(read::<Uint>("1.5").unwrap_err(), "expected a non-negative integer, got 1.5");
    assert_eq!(read::<Uint>("\"4\"").unwrap_err(), "expected a non-negative integer, got a string");
    assert_eq!(read::<DeviceId>("-1").unwrap(), DeviceId(-1));
    assert_eq!(read::<DeviceId>("-1.5").unwrap_err(), "expected a non-negative integer, got -1.5");
    assert_eq!(read::<Float>("0").unwrap(), Float(0.into()));
    assert_eq!(read::<Float>("true").unwrap_err(), "expected a number, got a boolean");
    assert_eq!(read::<json::Flag>("null").unwrap_err(), "expected a boolean (true or false), got null");
    assert_eq!(read::<json::Text>("[]").unwrap_err(), "expected a string, got an array");
    assert_eq!(read::<json::List<Uint>>("{}").unwrap_err(), "expected an array, got an object");
    assert_eq!(read::<json::Obj<ModelJson>>("[1]").unwrap_err(), "expected an object, got an array");
    // null is a value, not an absent field.
    assert_eq!(read::<json::Obj<ModelJson>>(r#"{"embedding_table_names": null}"#).unwrap_err(), "expected an array, got null");
}

#[test]
fn ranges_are_checked_with_the_number_as_written() {
    let n = |s: &str| read::<Float>(s).unwrap();
    assert_eq!(validate::uint(&Uint(7), "x", 1).unwrap(), 7);
    assert_eq!(msg(validate::uint(&Uint(0), "x", 1)), "0 is too small; expected an integer >= 1");
    assert_eq!(msg(validate::float(&n("1.5"), "x", Range::Fraction)), "1.5 is out of range; expected a fraction in [0, 1]");
    assert_eq!(msg(validate::float(&n("0"), "x", Range::PositiveFraction)), "0 is out of range; expected a fraction in (0, 1]");
    assert_eq!(msg(validate::float(&n("-1"), "x", Range::NonNegative)), "-1 is out of range; expected a number >= 0");
    assert_eq!(msg(validate::float32(&n("1e39"), "x", Range::Any)), "1e+39 is out of range for a 32-bit float");
    assert_eq!(msg(validate::device(&DeviceId(-1), "x")), "-1 is not a device id; expected an integer >= 0");
    assert_eq!(msg(validate::device(&DeviceId(1 << 31), "x")), "2147483648 is too large for a device id");
    assert_eq!(validate::device(&DeviceId(3), "x").unwrap(), 3);
}

#[test]
fn defaults_are_hps_defaults() {
    let v = VolatileDbConfig::default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(
        v,
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
            refresh_interval_ms: 1000,
            redis: None,
        }
    );
    assert_eq!(
        PersistentDbConfig::default(),
        PersistentDbConfig {
            kind: PersistentDbKind::Disabled,
            path: std::env::temp_dir().join("rocksdb"),
            read_only: false,
            max_batch_size: 65536,
            initialize_after_startup: true,
        }
    );
    // The f64 defaults of the file's numbers are exactly HPS's f32 ones.
    let m = ModelJson::default();
    assert_eq!(validate::float32(&m.gpucacheper, "x", Range::Any).unwrap(), 0.2f32);
    assert_eq!(validate::float32(&m.hit_rate_threshold, "x", Range::Any).unwrap(), 0.9f32);
}

#[test]
fn json_errors_carry_line_and_column() {
    let e = serde_json::from_str::<Value>("{\n  \"a\": 1\n  \"b\": 2}").unwrap_err();
    assert_eq!(json::json_error_message(&e), "invalid JSON at line 3, column 3: expected `,` or `}`; expected a JSON object");
}

#[test]
fn errors_and_warnings_name_their_paths() {
    let text = r#"{"models": [{"model": "m", "x": 1}, {"model": 2}], "zz": {"a": 1}}"#;
    let p = json::read(text).err().unwrap();
    assert_eq!((p.path.as_str(), p.msg.as_str()), ("models[1].model", "expected a string, got a number"));
    let p = json::read("[]").err().unwrap();
    assert_eq!((p.path.as_str(), p.msg.as_str()), (ROOT, "expected an object, got an array"));
    let (_, ignored) = json::read(r#"{"models": [{"b": 1, "a": {"c": 2}}], "zz": {"a": 1}}"#).unwrap();
    let got: Vec<String> = ignored.iter().map(|f| join(&f.object, &f.key)).collect();
    assert_eq!(got, ["models[0].a", "models[0].b", "zz"]);
}

#[test]
fn refresh_interval_ms_is_read_without_a_warning() {
    let (doc, ignored) = json::read(r#"{"volatile_db": {"refresh_interval_ms": 50}, "models": []}"#).unwrap();
    assert!(ignored.is_empty(), "{ignored:?}");
    assert_eq!(validate::volatile_db(&doc.volatile_db).unwrap().refresh_interval_ms, 50);
    assert_eq!(VolatileDbConfig::default().refresh_interval_ms, 1000);
    let (doc, _) = json::read(r#"{"volatile_db": {"refresh_interval_ms": 0}}"#).unwrap();
    assert_eq!(validate::volatile_db(&doc.volatile_db).unwrap().refresh_interval_ms, 0);
    assert!(json::read(r#"{"volatile_db": {"refresh_interval_ms": -1}}"#).is_err());
}
