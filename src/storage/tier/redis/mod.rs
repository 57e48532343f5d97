//! The Redis Cluster volatile tier (HPS `volatile_db.type = "redis_cluster"`): a table's rows in
//! a Redis Cluster that many processes (and machines) share, in HPS's layout ([`layout`]).
//!
//! # What the process keeps
//! No rows. Per cluster: the slot map (16384 node numbers), up to `num_node_connections` idle
//! connections per primary node, and counters; per table: the names and hash slots of its
//! `num_partitions` partitions. Every lookup reads Redis.
//!
//! # Reads
//! [`RedisTier::get_many`] splits keys into batches of `max_get_batch_size`; a batch is one
//! `HMGET` per partition it touches, all sent as one pipeline per node (one round trip per node
//! per batch, the nodes answering at once). Keys whose node failed are reported unavailable and
//! counted; the table then reads them from the persistent tier or gives the default row.
//!
//! # Writes, and why a promotion never puts an older row back
//! Each partition has a write counter (`...}g`). A write of keys (upsert or erase) runs:
//! 1. [`invalidate`](RedisTier::invalidate): per partition `INCR g` then `HDEL` of the keys,
//!    all nodes at once. If a node fails, the write stops here with the node named (the table
//!    writes nothing to its persistent tier).
//! 2. the persistent tier's commit (the table's part);
//! 3. [`write`](RedisTier::write) (upsert: `INCR g`, `HSET`) or `invalidate` again (erase).
//!
//! A promotion (a persistent hit copied into Redis, `cache_missed_embeddings`, and the warm-up
//! at open) first reads the counters of its partitions ([`generations`](RedisTier::generations)),
//! then reads the persistent tier, then runs a script that writes its rows (`HSETNX`) only if
//! the partition's counter is still the one it read. A writer increments the counter after its
//! commit and before it writes, so either the promotion's persistent read saw the commit, or
//! its script runs before the writer's step 3 (which overwrites or deletes the row), or the
//! script sees a moved counter and writes nothing.
//!
//! # Overflow
//! After an `HSET`, a partition holding more than `overflow_margin` rows is shrunk to
//! `overflow_resolution_target` of it, as HPS did: random rows, or by the `...}t` metadata
//! (oldest time, or least use count) for `evict_oldest` / `evict_least_used`.

pub mod cluster;
pub mod layout;

pub use cluster::{Cluster, ClusterOptions, ClusterStats, Failure, OpenProblem};

use redis::{Cmd, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Which rows an overflowing partition gives up (HPS `overflow_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    Random,
    LeastUsed,
    Oldest,
}

/// A table's Redis settings (from `volatile_db`).
#[derive(Debug, Clone, PartialEq)]
pub struct RedisTableOptions {
    /// Partitions of each table (HPS `num_partitions`); fixed for the life of the data.
    pub num_partitions: usize,
    /// Keys per lookup batch (`max_get_batch_size`).
    pub max_get_batch_size: usize,
    /// Keys per write batch (`max_set_batch_size`).
    pub max_set_batch_size: usize,
    /// Rows a partition may hold before it is shrunk (`overflow_margin`).
    pub overflow_margin: usize,
    pub eviction: Eviction,
    /// Fraction of `overflow_margin` a partition is shrunk to (`overflow_resolution_target`).
    pub resolution_target: f64,
    /// Whether lookups refresh the overflow metadata of the rows they read
    /// (`refresh_time_after_fetch`; only for `evict_oldest` / `evict_least_used`).
    pub refresh_after_fetch: bool,
    /// Bytes of a key in a hash field: 8 (`supportlonglong`) or 4.
    pub key_width: usize,
}

/// One partition's Redis keys and their slot.
struct Part {
    v: Vec<u8>,
    t: Vec<u8>,
    g: Vec<u8>,
    slot: u16,
}

/// Cumulative counters of a Redis tier.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RedisStats {
    pub hits: u64,
    pub misses: u64,
    /// Keys looked up whose node failed (served by the next tier or the default row).
    pub unavailable: u64,
    /// Rows promoted into Redis (persistent hits and the warm-up).
    pub promoted: u64,
    /// Rows evicted by overflow resolution.
    pub evictions: u64,
    /// Writes whose step 3 (after the persistent commit) failed on some node.
    pub late_write_failures: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    unavailable: AtomicU64,
    promoted: AtomicU64,
    evictions: AtomicU64,
    late_write_failures: AtomicU64,
}

/// The write counters of some partitions, as read before a persistent read.
#[derive(Debug, Default, Clone)]
pub struct Generations(HashMap<usize, Vec<u8>>);

/// Writes `ARGV[4..]` (field, value pairs) into hash `KEYS[1]` with HSETNX if `KEYS[2]` (the
/// write counter) still reads `ARGV[1]`; `ARGV[2]` is the policy (`r`, `u`, `o`), `ARGV[3]` the
/// time for `o`; metadata in `KEYS[3]`. Returns the rows written, or -1 if the counter moved.
const PROMOTE: &str = r"
local g = redis.call('GET', KEYS[2]) or ''
if g ~= ARGV[1] then return -1 end
local n = 0
for i = 4, #ARGV, 2 do
  local w = redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  if w == 1 then
    n = n + 1
    if ARGV[2] == 'o' then redis.call('HSET', KEYS[3], ARGV[i], ARGV[3])
    elseif ARGV[2] == 'u' then redis.call('HINCRBY', KEYS[3], ARGV[i], 1) end
  end
end
return n
";

/// A table's volatile tier in a Redis cluster. `Send + Sync`. See the module docs.
pub struct RedisTier {
    cluster: Arc<Cluster>,
    tag: String,
    dim: usize,
    opts: RedisTableOptions,
    parts: Vec<Part>,
    counters: Counters,
}

impl RedisTier {
    /// The tier of table `table` of model `model` (HPS tag `hps_et.<model>.<table>`) in `cluster`.
    pub fn new(cluster: Arc<Cluster>, model: &str, table: &str, dim: usize, opts: RedisTableOptions) -> Self {
        let tag = layout::tag(model, table);
        let parts = (0..opts.num_partitions.max(1))
            .map(|p| {
                let v = layout::hash_key(&tag, p, 'v');
                Part {
                    slot: layout::slot(v.as_bytes()),
                    t: layout::hash_key(&tag, p, 't').into_bytes(),
                    g: layout::hash_key(&tag, p, 'g').into_bytes(),
                    v: v.into_bytes(),
                }
            })
            .collect();
        RedisTier { cluster, tag, dim, opts, parts, counters: Counters::default() }
    }

    /// HPS's tag of the table.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Keys per lookup batch.
    pub fn get_batch(&self) -> usize {
        self.opts.max_get_batch_size
    }

    /// The cluster client.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    fn part(&self, key: u64) -> usize {
        layout::partition_of(key, self.parts.len())
    }

    fn field(&self, key: u64) -> Vec<u8> {
        layout::field(key, self.opts.key_width)[..self.opts.key_width].to_vec()
    }

    /// Key indices of `keys[lo..hi]` grouped by partition.
    fn by_part(&self, keys: &[u64]) -> Vec<(usize, Vec<usize>)> {
        let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, &k) in keys.iter().enumerate() {
            groups.entry(self.part(k)).or_default().push(i);
        }
        let mut v: Vec<_> = groups.into_iter().collect();
        v.sort_unstable_by_key(|g| g.0);
        v
    }

    /// Looks `keys` up: rows into `out` (`keys.len() * dim`), whether each was found into
    /// `found`. Returns (hits, keys whose node failed). Never fails: a failed node's keys are
    /// not found (and counted).
    pub fn get_many(&self, keys: &[u64], out: &mut [f32], found: &mut [bool]) -> (u64, u64) {
        let dim = self.dim;
        let row_bytes = dim * 4;
        found.fill(false);
        let (mut hits, mut unavailable) = (0u64, 0u64);
        let mut touched: Vec<u64> = Vec::new();
        let batch = self.opts.max_get_batch_size.max(1);
        let mut lo = 0;
        while lo < keys.len() {
            let hi = (lo + batch).min(keys.len());
            let groups = self.by_part(&keys[lo..hi]);
            let cmds: Vec<(u16, Cmd)> = groups
                .iter()
                .map(|(p, idx)| {
                    let mut c = redis::cmd("HMGET");
                    c.arg(&self.parts[*p].v[..]);
                    for &i in idx {
                        c.arg(&layout::field(keys[lo + i], self.opts.key_width)[..self.opts.key_width]);
                    }
                    (self.parts[*p].slot, c)
                })
                .collect();
            let replies = self.cluster.run(&cmds);
            for ((_, idx), reply) in groups.iter().zip(replies) {
                let values = match reply {
                    Ok(Value::Array(values)) if values.len() == idx.len() => values,
                    _ => {
                        unavailable += idx.len() as u64;
                        continue;
                    }
                };
                for (&i, v) in idx.iter().zip(values) {
                    if let Value::BulkString(b) = v
                        && b.len() == row_bytes
                    {
                        let k = lo + i;
                        for (d, c) in out[k * dim..(k + 1) * dim].iter_mut().zip(b.chunks_exact(4)) {
                            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        }
                        found[k] = true;
                        hits += 1;
                        if self.opts.refresh_after_fetch && self.opts.eviction != Eviction::Random {
                            touched.push(keys[k]);
                        }
                    }
                }
            }
            lo = hi;
        }
        let c = &self.counters;
        c.hits.fetch_add(hits, Relaxed);
        c.unavailable.fetch_add(unavailable, Relaxed);
        c.misses.fetch_add(keys.len() as u64 - hits - unavailable, Relaxed);
        if !touched.is_empty() {
            self.touch(&touched);
        }
        (hits, unavailable)
    }

    /// Refreshes the overflow metadata of rows just read (best effort, as HPS's background
    /// refresh: a failure only leaves older metadata).
    fn touch(&self, keys: &[u64]) {
        let now = now_bytes();
        let mut cmds = Vec::new();
        for (p, idx) in self.by_part(keys) {
            let part = &self.parts[p];
            match self.opts.eviction {
                Eviction::Oldest => {
                    let mut c = redis::cmd("HSET");
                    c.arg(&part.t[..]);
                    for &i in &idx {
                        c.arg(&self.field(keys[i])[..]).arg(&now[..]);
                    }
                    cmds.push((part.slot, c));
                }
                Eviction::LeastUsed => {
                    for &i in &idx {
                        let mut c = redis::cmd("HINCRBY");
                        c.arg(&part.t[..]).arg(&self.field(keys[i])[..]).arg(1);
                        cmds.push((part.slot, c));
                    }
                }
                Eviction::Random => {}
            }
        }
        let _ = self.cluster.run(&cmds);
    }

    /// The write counters of the partitions of `keys` (read before a persistent read that
    /// will be promoted). Partitions whose node failed are left out (their rows are not
    /// promoted).
    pub fn generations(&self, keys: &[u64]) -> Generations {
        let mut parts: Vec<usize> = keys.iter().map(|&k| self.part(k)).collect();
        parts.sort_unstable();
        parts.dedup();
        self.generations_of(&parts)
    }

    fn generations_of(&self, parts: &[usize]) -> Generations {
        let cmds: Vec<(u16, Cmd)> = parts
            .iter()
            .map(|&p| {
                let mut c = redis::cmd("GET");
                c.arg(&self.parts[p].g[..]);
                (self.parts[p].slot, c)
            })
            .collect();
        let mut g = Generations::default();
        for (&p, r) in parts.iter().zip(self.cluster.run(&cmds)) {
            match r {
                Ok(Value::BulkString(b)) => {
                    g.0.insert(p, b);
                }
                Ok(Value::Nil) => {
                    g.0.insert(p, Vec::new());
                }
                _ => {}
            }
        }
        g
    }

    /// Promotes rows read from the persistent tier after `gens` was read: each partition's rows
    /// are written (where absent) only if its counter has not moved. Returns the rows written.
    /// Best effort: a failed node's rows are simply not promoted.
    pub fn promote(&self, keys: &[u64], rows: &[f32], gens: &Generations) -> u64 {
        let dim = self.dim;
        let now = now_bytes();
        let mode = match self.opts.eviction {
            Eviction::Random => "r",
            Eviction::LeastUsed => "u",
            Eviction::Oldest => "o",
        };
        let mut written = 0;
        let mut overflowing = Vec::new();
        for chunk in (0..keys.len()).collect::<Vec<_>>().chunks(self.opts.max_set_batch_size.max(1)) {
            let ks: Vec<u64> = chunk.iter().map(|&i| keys[i]).collect();
            let mut cmds = Vec::new();
            let mut cmd_parts = Vec::new();
            for (p, idx) in self.by_part(&ks) {
                let Some(g) = gens.0.get(&p) else { continue };
                let part = &self.parts[p];
                let mut c = redis::cmd("EVAL");
                c.arg(PROMOTE).arg(3).arg(&part.v[..]).arg(&part.g[..]).arg(&part.t[..]).arg(&g[..]).arg(mode).arg(&now[..]);
                for &i in &idx {
                    let j = chunk[i];
                    c.arg(&self.field(keys[j])[..]).arg(row_bytes(&rows[j * dim..(j + 1) * dim]));
                }
                cmds.push((part.slot, c));
                let mut h = redis::cmd("HLEN");
                h.arg(&part.v[..]);
                cmds.push((part.slot, h));
                cmd_parts.push(p);
            }
            let replies = self.cluster.run(&cmds);
            for (j, p) in cmd_parts.into_iter().enumerate() {
                if let Ok(Value::Int(n)) = &replies[2 * j]
                    && *n > 0
                {
                    written += *n as u64;
                }
                if let Ok(Value::Int(len)) = &replies[2 * j + 1]
                    && *len as u64 > self.opts.overflow_margin as u64
                {
                    overflowing.push(p);
                }
            }
        }
        self.counters.promoted.fetch_add(written, Relaxed);
        for p in overflowing {
            self.resolve_overflow(p);
        }
        written
    }

    /// Step 1 (and, for erases, step 3) of a write: moves the counters of the partitions of
    /// `keys` and deletes the keys' rows. Returns the rows deleted, or the first node failure.
    pub fn invalidate(&self, keys: &[u64]) -> Result<u64, Failure> {
        let mut deleted = 0u64;
        for chunk in keys.chunks(self.opts.max_set_batch_size.max(1)) {
            let mut cmds = Vec::new();
            let mut del_at = Vec::new();
            for (p, idx) in self.by_part(chunk) {
                let part = &self.parts[p];
                let mut inc = redis::cmd("INCR");
                inc.arg(&part.g[..]);
                let mut del = redis::cmd("HDEL");
                del.arg(&part.v[..]);
                let mut meta = redis::cmd("HDEL");
                meta.arg(&part.t[..]);
                for &i in &idx {
                    let f = self.field(chunk[i]);
                    del.arg(&f[..]);
                    meta.arg(&f[..]);
                }
                cmds.push((part.slot, inc));
                del_at.push(cmds.len());
                cmds.push((part.slot, del));
                if self.opts.eviction != Eviction::Random {
                    cmds.push((part.slot, meta));
                }
            }
            let replies = self.cluster.run(&cmds);
            if let Some(f) = replies.iter().find_map(|r| r.as_ref().err()) {
                return Err(f.clone());
            }
            for &i in &del_at {
                if let Ok(Value::Int(n)) = &replies[i] {
                    deleted += (*n).max(0) as u64;
                }
            }
        }
        Ok(deleted)
    }

    /// Step 3 of an upsert: moves the counters, then writes the rows (and their metadata);
    /// shrinks partitions that overflow. Returns the first node failure, after trying every node.
    pub fn write(&self, keys: &[u64], rows: &[f32]) -> Result<(), Failure> {
        let dim = self.dim;
        let now = now_bytes();
        let mut first_failure = None;
        let mut overflowing = Vec::new();
        for (c_i, chunk) in keys.chunks(self.opts.max_set_batch_size.max(1)).enumerate() {
            let base = c_i * self.opts.max_set_batch_size.max(1);
            let mut cmds = Vec::new();
            let mut lens = Vec::new();
            for (p, idx) in self.by_part(chunk) {
                let part = &self.parts[p];
                let mut inc = redis::cmd("INCR");
                inc.arg(&part.g[..]);
                cmds.push((part.slot, inc));
                let mut set = redis::cmd("HSET");
                set.arg(&part.v[..]);
                for &i in &idx {
                    let j = base + i;
                    set.arg(&self.field(keys[j])[..]).arg(row_bytes(&rows[j * dim..(j + 1) * dim]));
                }
                cmds.push((part.slot, set));
                match self.opts.eviction {
                    Eviction::Oldest => {
                        let mut m = redis::cmd("HSET");
                        m.arg(&part.t[..]);
                        for &i in &idx {
                            m.arg(&self.field(keys[base + i])[..]).arg(&now[..]);
                        }
                        cmds.push((part.slot, m));
                    }
                    Eviction::LeastUsed => {
                        for &i in &idx {
                            let mut m = redis::cmd("HINCRBY");
                            m.arg(&part.t[..]).arg(&self.field(keys[base + i])[..]).arg(1);
                            cmds.push((part.slot, m));
                        }
                    }
                    Eviction::Random => {}
                }
                let mut h = redis::cmd("HLEN");
                h.arg(&part.v[..]);
                lens.push((cmds.len(), p));
                cmds.push((part.slot, h));
            }
            let replies = self.cluster.run(&cmds);
            for (at, p) in lens {
                if let Ok(Value::Int(len)) = &replies[at]
                    && *len as u64 > self.opts.overflow_margin as u64
                {
                    overflowing.push(p);
                }
            }
            if let Some(f) = replies.into_iter().find_map(|r| r.err()) {
                first_failure.get_or_insert(f);
            }
        }
        overflowing.sort_unstable();
        overflowing.dedup();
        for p in overflowing {
            self.resolve_overflow(p);
        }
        match first_failure {
            Some(f) => {
                self.counters.late_write_failures.fetch_add(1, Relaxed);
                Err(f)
            }
            None => Ok(()),
        }
    }

    /// Counts a write whose step 3 failed (the table reports it as a late failure).
    pub fn note_late_failure(&self) {
        self.counters.late_write_failures.fetch_add(1, Relaxed);
    }

    /// Shrinks partition `p` to `overflow_resolution_target * overflow_margin` rows (best effort).
    fn resolve_overflow(&self, p: usize) {
        let part = &self.parts[p];
        let target = ((self.opts.overflow_margin as f64) * self.opts.resolution_target + 0.5) as u64;
        let run1 = |c: Cmd| self.cluster.run(&[(part.slot, c)]).pop().and_then(|r| r.ok());
        // The candidates, in eviction order.
        let mut order: Vec<Vec<u8>> = match self.opts.eviction {
            Eviction::Random => {
                let mut c = redis::cmd("HKEYS");
                c.arg(&part.v[..]);
                let Some(Value::Array(fields)) = run1(c) else { return };
                let mut f: Vec<Vec<u8>> =
                    fields.into_iter().filter_map(|v| if let Value::BulkString(b) = v { Some(b) } else { None }).collect();
                shuffle(&mut f);
                f
            }
            Eviction::LeastUsed | Eviction::Oldest => {
                let mut c = redis::cmd("HKEYS");
                c.arg(&part.v[..]);
                let Some(Value::Array(fields)) = run1(c) else { return };
                let mut m = redis::cmd("HGETALL");
                m.arg(&part.t[..]);
                let meta: HashMap<Vec<u8>, u64> = match run1(m) {
                    Some(Value::Array(kv)) => kv
                        .chunks_exact(2)
                        .filter_map(|kv| match (&kv[0], &kv[1]) {
                            (Value::BulkString(k), Value::BulkString(v)) => Some((k.clone(), rank(v, self.opts.eviction))),
                            _ => None,
                        })
                        .collect(),
                    Some(Value::Map(kv)) => kv
                        .into_iter()
                        .filter_map(|kv| match kv {
                            (Value::BulkString(k), Value::BulkString(v)) => Some((k, rank(&v, self.opts.eviction))),
                            _ => None,
                        })
                        .collect(),
                    _ => HashMap::new(),
                };
                let mut f: Vec<(u64, Vec<u8>)> = fields
                    .into_iter()
                    .filter_map(|v| if let Value::BulkString(b) = v { Some((meta.get(&b).copied().unwrap_or(0), b)) } else { None })
                    .collect();
                f.sort_unstable();
                f.into_iter().map(|x| x.1).collect()
            }
        };
        let mut len = order.len() as u64;
        if len <= target {
            return;
        }
        let excess = (len - target) as usize;
        order.truncate(excess);
        for chunk in order.chunks(self.opts.max_set_batch_size.max(1)) {
            let mut del = redis::cmd("HDEL");
            del.arg(&part.v[..]);
            let mut meta = redis::cmd("HDEL");
            meta.arg(&part.t[..]);
            for f in chunk {
                del.arg(&f[..]);
                meta.arg(&f[..]);
            }
            let replies = self.cluster.run(&[(part.slot, del), (part.slot, meta)]);
            if let Some(Ok(Value::Int(n))) = replies.first() {
                self.counters.evictions.fetch_add(*n as u64, Relaxed);
                len = len.saturating_sub(*n as u64);
            }
            if len <= target {
                break;
            }
        }
    }

    /// Rows the table holds in Redis (one `HLEN` per partition), or the first node failure.
    pub fn len(&self) -> Result<u64, Failure> {
        let cmds: Vec<(u16, Cmd)> = self
            .parts
            .iter()
            .map(|p| {
                let mut c = redis::cmd("HLEN");
                c.arg(&p.v[..]);
                (p.slot, c)
            })
            .collect();
        let mut n = 0;
        for r in self.cluster.run(&cmds) {
            match r? {
                Value::Int(k) => n += k.max(0) as u64,
                v => return Err(Failure { node: "?".into(), msg: format!("HLEN gave {v:?}") }),
            }
        }
        Ok(n)
    }

    /// Whether the table holds no rows in Redis (a failed node counts as empty).
    pub fn is_empty(&self) -> bool {
        self.len().map_or(true, |n| n == 0)
    }

    /// The write counters of every partition (for the warm-up at open).
    pub fn all_generations(&self) -> Generations {
        let all: Vec<usize> = (0..self.parts.len()).collect();
        self.generations_of(&all)
    }

    /// Counters so far.
    pub fn stats(&self) -> RedisStats {
        let c = &self.counters;
        RedisStats {
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            unavailable: c.unavailable.load(Relaxed),
            promoted: c.promoted.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            late_write_failures: c.late_write_failures.load(Relaxed),
        }
    }
}

/// A row as HPS stores it: little-endian float32.
fn row_bytes(row: &[f32]) -> Vec<u8> {
    row.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Now as HPS's `time_t` metadata: 8 bytes, little-endian seconds since the epoch.
fn now_bytes() -> [u8; 8] {
    let s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    s.to_le_bytes()
}

/// A metadata value as an eviction rank (smaller goes first): a time_t for `Oldest`, a
/// decimal count for `LeastUsed`.
fn rank(v: &[u8], e: Eviction) -> u64 {
    match e {
        Eviction::Oldest if v.len() == 8 => i64::from_le_bytes(v.try_into().unwrap_or([0; 8])).max(0) as u64,
        _ => std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()).map_or(0, |n| n.max(0) as u64),
    }
}

/// Fisher-Yates with a xorshift generator seeded from the clock (eviction needs no more).
fn shuffle<T>(v: &mut [T]) {
    let mut x = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0x9E37_79B9, |d| d.as_nanos() as u64) | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}
