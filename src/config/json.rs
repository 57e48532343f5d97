//! Step 1: `ps.json` as written. The text, its comments blanked, is read as JSON and
//! deserialised into types that mirror the file, with HPS's defaults and its parser's aliases as
//! serde attributes.
//!
//! Each value is read into a type that accepts only its JSON kind (a [`Uint`], a [`Text`], a
//! [`List`], an [`Obj`], ...) and refuses any other with "expected ..., got ...";
//! `serde_path_to_error` adds the value's JSON path. Values are checked no further here: ranges,
//! lengths, names and files are the validation pass's (`validate.rs`). Fields no type reads are
//! collected by `serde_ignored` as [`IgnoredField`]s.

use super::{EmbeddingCacheType, OverflowPolicy, Problem, ROOT, index, join};
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};
use std::fmt;
use std::marker::PhantomData;

// ---------------------------------------------------------------------------------------------
// The file's objects.

/// The whole file. HPS's defaults are those of [`Default`].
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(super) struct PsJson {
    pub supportlonglong: Flag,
    pub volatile_db: Obj<VolatileDbJson>,
    pub persistent_db: Obj<PersistentDbJson>,
    pub update_source: Obj<UpdateSourceJson>,
    /// Required.
    #[serde(deserialize_with = "present")]
    pub models: Option<List<Obj<ModelJson>>>,
}

impl Default for PsJson {
    fn default() -> Self {
        PsJson {
            supportlonglong: Flag(true),
            volatile_db: Obj(VolatileDbJson::default()),
            persistent_db: Obj(PersistentDbJson::default()),
            update_source: Obj(UpdateSourceJson::default()),
            models: None,
        }
    }
}

/// One entry of `models`. HPS's defaults are those of [`Default`]; the lists whose default has
/// one entry per table are `None` when absent.
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(super) struct ModelJson {
    /// Required.
    #[serde(deserialize_with = "present")]
    pub model: Option<Text>,
    /// Required.
    #[serde(deserialize_with = "present")]
    pub sparse_files: Option<List<Text>>,
    #[serde(deserialize_with = "present")]
    pub embedding_table_names: Option<List<Text>>,
    /// Required.
    #[serde(deserialize_with = "present")]
    pub embedding_vecsize_per_table: Option<List<Uint>>,
    #[serde(deserialize_with = "present")]
    pub default_value_for_each_table: Option<List<Float>>,
    /// A strata extension: how each table stores its rows (`"float32"`, the default, or
    /// `"float16"`, `"bfloat16"`, `"int8"`, `"int4"`).
    #[serde(deserialize_with = "present")]
    pub strata_storage_per_table: Option<List<Text>>,
    /// Required.
    #[serde(deserialize_with = "present")]
    pub maxnum_catfeature_query_per_table_per_sample: Option<List<Uint>>,
    pub max_batch_size: Uint,
    pub deployed_device_list: List<DeviceId>,
    pub gpucache: Flag,
    pub gpucacheper: Float,
    pub hit_rate_threshold: Float,
    pub use_static_table: Flag,
    /// `None` when absent (`dynamic`), so that `use_static_table` overriding a written value
    /// can be reported.
    #[serde(deserialize_with = "present")]
    pub embedding_cache_type: Option<Choice<EmbeddingCacheType>>,
    pub num_of_worker_buffer_in_pool: Uint,
    pub num_of_refresher_buffer_in_pool: Uint,
    pub cache_refresh_percentage_per_iteration: Float,
    pub refresh_delay: Float,
    pub refresh_interval: Float,
}

impl Default for ModelJson {
    fn default() -> Self {
        ModelJson {
            model: None,
            sparse_files: None,
            embedding_table_names: None,
            embedding_vecsize_per_table: None,
            default_value_for_each_table: None,
            strata_storage_per_table: None,
            maxnum_catfeature_query_per_table_per_sample: None,
            max_batch_size: Uint(64),
            deployed_device_list: List(vec![DeviceId(0)]),
            gpucache: Flag(true),
            gpucacheper: Float::from(0.2),
            hit_rate_threshold: Float::from(0.9),
            use_static_table: Flag(false),
            embedding_cache_type: None,
            num_of_worker_buffer_in_pool: Uint(1),
            num_of_refresher_buffer_in_pool: Uint(1),
            cache_refresh_percentage_per_iteration: Float::from(0.0),
            refresh_delay: Float::from(0.0),
            refresh_interval: Float::from(0.0),
        }
    }
}

/// `volatile_db`. HPS's defaults are those of [`Default`].
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(super) struct VolatileDbJson {
    #[serde(rename = "type")]
    pub kind: Choice<DatabaseType>,
    /// `None` when absent: its default depends on the type (the validation pass's).
    #[serde(deserialize_with = "present")]
    pub num_partitions: Option<Uint>,
    pub overflow_margin: Uint,
    pub overflow_policy: Choice<OverflowPolicy>,
    pub overflow_resolution_target: Float,
    pub initial_cache_rate: Float,
    pub cache_missed_embeddings: Flag,
    pub max_batch_size: Uint,
    pub initialize_after_startup: Flag,
    pub refresh_interval_ms: Uint,
    // The redis_cluster fields; `None` when absent (the validation pass warns about those given
    // to another type).
    #[serde(deserialize_with = "present")]
    pub address: Option<Text>,
    #[serde(deserialize_with = "present")]
    pub user_name: Option<Text>,
    #[serde(deserialize_with = "present")]
    pub password: Option<Text>,
    #[serde(deserialize_with = "present")]
    pub num_node_connections: Option<Uint>,
    #[serde(deserialize_with = "present")]
    pub max_get_batch_size: Option<Uint>,
    #[serde(deserialize_with = "present")]
    pub max_set_batch_size: Option<Uint>,
    #[serde(deserialize_with = "present")]
    pub refresh_time_after_fetch: Option<Flag>,
    #[serde(deserialize_with = "present")]
    pub enable_tls: Option<Flag>,
    #[serde(deserialize_with = "present")]
    pub tls_ca_certificate: Option<Text>,
    #[serde(deserialize_with = "present")]
    pub tls_client_certificate: Option<Text>,
    #[serde(deserialize_with = "present")]
    pub tls_client_key: Option<Text>,
    #[serde(deserialize_with = "present")]
    pub tls_server_name_identification: Option<Text>,
    /// strata's extension: the bound on each Redis connect, write and reply.
    #[serde(deserialize_with = "present")]
    pub strata_redis_timeout_ms: Option<Uint>,
}

impl Default for VolatileDbJson {
    fn default() -> Self {
        VolatileDbJson {
            kind: Choice::known("parallel_hash_map", DatabaseType::ParallelHashMap),
            num_partitions: None,
            overflow_margin: Uint(usize::MAX as u64),
            overflow_policy: Choice::known("evict_random", OverflowPolicy::EvictRandom),
            overflow_resolution_target: Float::from(0.8),
            initial_cache_rate: Float::from(1.0),
            cache_missed_embeddings: Flag(false),
            max_batch_size: Uint(65536),
            initialize_after_startup: Flag(true),
            refresh_interval_ms: Uint(1000),
            address: None,
            user_name: None,
            password: None,
            num_node_connections: None,
            max_get_batch_size: None,
            max_set_batch_size: None,
            refresh_time_after_fetch: None,
            enable_tls: None,
            tls_ca_certificate: None,
            tls_client_certificate: None,
            tls_client_key: None,
            tls_server_name_identification: None,
            strata_redis_timeout_ms: None,
        }
    }
}

/// `persistent_db`. HPS's defaults are those of [`Default`]; `path` is `None` when absent
/// (`<temp dir>/rocksdb`, which is neither resolved nor checked).
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(super) struct PersistentDbJson {
    #[serde(rename = "type")]
    pub kind: Choice<DatabaseType>,
    #[serde(deserialize_with = "present")]
    pub path: Option<Text>,
    pub read_only: Flag,
    pub max_batch_size: Uint,
    pub initialize_after_startup: Flag,
}

impl Default for PersistentDbJson {
    fn default() -> Self {
        PersistentDbJson {
            kind: Choice::known("disabled", DatabaseType::Disabled),
            path: None,
            read_only: Flag(false),
            max_batch_size: Uint(65536),
            initialize_after_startup: Flag(true),
        }
    }
}

/// `update_source`; absent or without `type`, there is none.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct UpdateSourceJson {
    #[serde(rename = "type", deserialize_with = "present")]
    pub kind: Option<Choice<UpdateSourceType>>,
}

/// HPS's database types (`DatabaseType_t`), named as its parser accepts them. Which section
/// accepts which is the validation pass's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum DatabaseType {
    #[serde(alias = "disable", alias = "none")]
    Disabled,
    #[serde(alias = "hashmap", alias = "hash", alias = "map")]
    HashMap,
    #[serde(alias = "parallel_hashmap", alias = "parallel_hash", alias = "parallel_map")]
    ParallelHashMap,
    #[serde(alias = "multi_process_hashmap", alias = "multi_process_hash", alias = "multi_process_map")]
    MultiProcessHashMap,
    #[serde(alias = "redis")]
    RedisCluster,
    #[serde(alias = "rocksdb", alias = "rocks")]
    RocksDb,
}

/// HPS's update source types (`UpdateSourceType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum UpdateSourceType {
    #[serde(alias = "none")]
    Null,
    #[serde(alias = "kafka_mq", alias = "kafka")]
    KafkaMessageQueue,
}

/// For a field that is `None` only when absent: `null` is then a value of the wrong kind, like
/// any other (serde's `Option` would read it as absent).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

// ---------------------------------------------------------------------------------------------
// Values: each accepts the JSON kinds of its `Accept` methods and refuses the others.

/// A boolean.
#[derive(Debug)]
pub(super) struct Flag(pub bool);

/// A string (possibly empty).
#[derive(Debug)]
pub(super) struct Text(pub String);

/// A non-negative integer: a JSON integer, or an integral float such as `1e6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Uint(pub u64);

/// A CUDA device ordinal as written: any JSON integer, or a value a [`Uint`] accepts.
/// Negative ordinals are refused by the validation pass, with their own message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DeviceId(pub i128);

/// A number, kept as written (`0`, `-1`, `1.5`, `1e+39`) so that messages show it that way.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Float(pub Number);

/// An array.
#[derive(Debug)]
pub(super) struct List<T>(pub Vec<T>);

/// An object.
#[derive(Debug)]
pub(super) struct Obj<T>(pub T);

/// A string naming one value of `T` (by a serde name or alias of `T`), or none (`value` is
/// `None` for a name `T` does not know). The validation pass refuses unknown names.
#[derive(Debug)]
pub(super) struct Choice<T> {
    pub name: String,
    pub value: Option<T>,
}

impl<T> Choice<T> {
    fn known(name: &str, value: T) -> Choice<T> {
        Choice { name: name.to_string(), value: Some(value) }
    }
}

impl From<f64> for Float {
    /// A finite default.
    fn from(x: f64) -> Float {
        Float(Number::from_f64(x).expect("a finite default"))
    }
}

impl<T> std::ops::Deref for List<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> std::ops::Deref for Obj<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A value type that accepts some JSON kinds. [`Kinds`] hands each JSON kind to the method of
/// the same name, whose default refuses it: "expected {EXPECTED}, got a string".
trait Accept<'de>: Sized {
    /// What the value must be, for messages: "a string", "an array", ...
    const EXPECTED: &'static str;

    fn boolean<E: de::Error>(_: bool) -> Result<Self, E> {
        Err(refuse::<Self, E>("a boolean"))
    }
    fn number<E: de::Error>(_: Number) -> Result<Self, E> {
        Err(refuse::<Self, E>("a number"))
    }
    fn string<E: de::Error>(_: &str) -> Result<Self, E> {
        Err(refuse::<Self, E>("a string"))
    }
    fn null<E: de::Error>() -> Result<Self, E> {
        Err(refuse::<Self, E>("null"))
    }
    fn array<A: SeqAccess<'de>>(_: A) -> Result<Self, A::Error> {
        Err(refuse::<Self, A::Error>("an array"))
    }
    fn object<A: MapAccess<'de>>(_: A) -> Result<Self, A::Error> {
        Err(refuse::<Self, A::Error>("an object"))
    }
}

/// "expected {T::EXPECTED}, got {got}".
fn refuse<'de, T: Accept<'de>, E: de::Error>(got: &str) -> E {
    E::custom(format_args!("expected {}, got {got}", T::EXPECTED))
}

/// The visitor of every [`Accept`] type.
struct Kinds<T>(PhantomData<T>);

impl<'de, T: Accept<'de>> Visitor<'de> for Kinds<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTED)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
        T::boolean(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        T::number(v.into())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::number(v.into())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        match Number::from_f64(v) {
            Some(n) => T::number(n),
            None => Err(E::custom(format_args!("{v} is not a finite number"))),
        }
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        T::string(v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        T::null()
    }
    fn visit_none<E: de::Error>(self) -> Result<T, E> {
        T::null()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::array(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::object(map)
    }
}

/// `Deserialize` for [`Accept`] types: whatever the JSON kind, [`Kinds`] sees it.
macro_rules! deserialize_by_kind {
    ($($t:ident $(<$p:ident>)?),*) => {$(
        impl<'de $(, $p: Deserialize<'de>)?> Deserialize<'de> for $t $(<$p>)? {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(Kinds(PhantomData))
            }
        }
    )*};
}
deserialize_by_kind!(Flag, Text, Uint, DeviceId, Float, List<T>, Obj<T>, Choice<T>);

impl<'de> Accept<'de> for Flag {
    const EXPECTED: &'static str = "a boolean (true or false)";
    fn boolean<E: de::Error>(v: bool) -> Result<Self, E> {
        Ok(Flag(v))
    }
}

impl<'de> Accept<'de> for Text {
    const EXPECTED: &'static str = "a string";
    fn string<E: de::Error>(v: &str) -> Result<Self, E> {
        Ok(Text(v.to_string()))
    }
}

impl<'de> Accept<'de> for Uint {
    const EXPECTED: &'static str = "a non-negative integer";
    fn number<E: de::Error>(n: Number) -> Result<Self, E> {
        if let Some(u) = n.as_u64() {
            return Ok(Uint(u));
        }
        if let Some(i) = n.as_i64() {
            return Err(E::custom(format_args!("expected a non-negative integer, got {i}")));
        }
        let f = n.as_f64().unwrap_or(f64::NAN);
        if f.fract() == 0.0 && f >= 0.0 && f < u64::MAX as f64 {
            Ok(Uint(f as u64))
        } else {
            Err(E::custom(format_args!("expected a non-negative integer, got {n}")))
        }
    }
}

impl<'de> Accept<'de> for DeviceId {
    const EXPECTED: &'static str = Uint::EXPECTED;
    fn number<E: de::Error>(n: Number) -> Result<Self, E> {
        match n.as_i64() {
            Some(i) if i < 0 => Ok(DeviceId(i.into())),
            _ => Uint::number(n).map(|u| DeviceId(u.0.into())),
        }
    }
}

impl<'de> Accept<'de> for Float {
    const EXPECTED: &'static str = "a number";
    fn number<E: de::Error>(n: Number) -> Result<Self, E> {
        Ok(Float(n))
    }
}

impl<'de, T: Deserialize<'de>> Accept<'de> for List<T> {
    const EXPECTED: &'static str = "an array";
    fn array<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(List(items))
    }
}

impl<'de, T: Deserialize<'de>> Accept<'de> for Obj<T> {
    const EXPECTED: &'static str = "an object";
    fn object<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Obj)
    }
}

impl<'de, T: Deserialize<'de>> Accept<'de> for Choice<T> {
    const EXPECTED: &'static str = "a string";
    fn string<E: de::Error>(v: &str) -> Result<Self, E> {
        let value = T::deserialize(IntoDeserializer::<de::value::Error>::into_deserializer(v)).ok();
        Ok(Choice { name: v.to_string(), value })
    }
}

// ---------------------------------------------------------------------------------------------
// Reading the text.

/// A field of the file that no type reads: the JSON path of its object ([`ROOT`] for the top
/// level) and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct IgnoredField {
    pub object: String,
    pub key: String,
}

/// Reads the text of a `ps.json`: its comments blanked, as JSON, then into a [`PsJson`]. Also
/// returns the fields no type read, in the order met (the keys of an object sorted).
pub(super) fn read(text: &str) -> Result<(PsJson, Vec<IgnoredField>), Problem> {
    let text = blank_comments(text);
    let value: Value = serde_json::from_str(&text).map_err(|e| Problem::new(ROOT, json_error_message(&e)))?;
    let mut ignored = Vec::new();
    let mut note = |path: serde_ignored::Path| ignored.push(ignored_field(&path));
    let doc: Obj<PsJson> = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&value, &mut note)).map_err(|e| {
        let path = if e.path().iter().next().is_none() { ROOT.to_string() } else { e.path().to_string() };
        Problem { path, msg: e.into_inner().to_string() }
    })?;
    Ok((doc.0, ignored))
}

/// The object and key of an ignored field's path.
fn ignored_field(path: &serde_ignored::Path) -> IgnoredField {
    match path {
        serde_ignored::Path::Map { parent, key } => IgnoredField { object: json_path(parent), key: key.clone() },
        // Only object fields are ever left unread; anything else is reported at its own path.
        other => IgnoredField { object: ROOT.to_string(), key: json_path(other) },
    }
}

/// `models[1].sparse_files`, as the rest of the messages write paths.
fn json_path(path: &serde_ignored::Path) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => ROOT.to_string(),
        Path::Seq { parent, index: i } => index(&json_path(parent), *i),
        Path::Map { parent, key } => join(&json_path(parent), key),
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => json_path(parent),
    }
}

/// serde_json's message with the position moved to the front: "invalid JSON at line 3,
/// column 5: expected `,` or `}`".
pub(super) fn json_error_message(e: &serde_json::Error) -> String {
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
///
/// A pre-pass of its own rather than the `json_comments` crate: that crate blanks the newlines
/// inside block comments (moving the line numbers of every later JSON error), and refuses a
/// lone `/` or an unterminated string or comment with a bare I/O error instead of letting
/// serde_json report it with its line and column.
pub(super) fn blank_comments(text: &str) -> std::borrow::Cow<'_, str> {
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
