//! A Redis Cluster client for the tier: the slot map, a few connections per primary node, and
//! one call, [`Cluster::run`], that sends a list of commands (each with its hash slot) to their
//! nodes as one pipeline per node, all nodes' pipelines written before any reply is read, so a
//! batch costs one round trip per node, with the nodes working at once.
//!
//! Failures stay with their node: a node that does not answer within the timeout, refuses the
//! connection or drops it fails its own commands ([`Failure`]), the other nodes' commands
//! succeed. A failed node is not dialled again for [`RETRY_AFTER`] (its commands fail at once
//! meanwhile), then the next call reconnects. `MOVED`, `ASK`, `TRYAGAIN` and `CLUSTERDOWN`
//! replies refresh the slot map (`CLUSTER SLOTS`) and the affected commands are sent once more.
//!
//! Built on the `redis` crate's connections, commands and RESP parser; see the tier's module
//! docs for why not on its `ClusterConnection`.

use super::layout::SLOTS;
use redis::{Cmd, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a node that failed is left alone before the next call dials it again.
pub const RETRY_AFTER: Duration = Duration::from_millis(500);

/// Why a command got no reply from its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `host:port` of the node, or `slot N` when no node serves the slot.
    pub node: String,
    pub msg: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redis node {}: {}", self.node, self.msg)
    }
}

/// A problem at open, with the `volatile_db` field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenProblem {
    /// `address`, `password`, `user_name`, ...
    pub field: &'static str,
    pub msg: String,
}

/// How to reach a cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterOptions {
    /// Seed nodes, `host:port` each.
    pub seeds: Vec<String>,
    /// ACL user (`"default"` is Redis's own).
    pub user_name: String,
    /// Empty: no AUTH.
    pub password: String,
    /// Most connections kept open to one node (HPS `num_node_connections`).
    pub connections_per_node: usize,
    /// Bound on connecting, and on each write and read of a reply.
    pub timeout: Duration,
}

/// Which primary serves each slot.
struct Topology {
    /// Node index per slot; `u16::MAX`: no node.
    slots: Vec<u16>,
    /// `host:port` per node index.
    nodes: Vec<String>,
}

/// A node's idle connections and its failure state.
struct Node {
    addr: String,
    idle: Mutex<Vec<redis::Connection>>,
    /// Until when the node is not dialled again.
    down_until: Mutex<Option<Instant>>,
}

/// Cumulative counters of a cluster client.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClusterStats {
    /// Connections opened (the first ones and reconnections).
    pub connects: u64,
    /// Node failures seen (timeouts, refused or dropped connections).
    pub node_failures: u64,
    /// Slot map refreshes.
    pub refreshes: u64,
}

/// A cluster client: see the module docs. `Send + Sync`.
pub struct Cluster {
    opts: ClusterOptions,
    topo: RwLock<Arc<Topology>>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    stats: Mutex<ClusterStats>,
}

/// How a node's reply to one command went.
enum Reply {
    Ok(Value),
    /// The cluster moved the slot (or is resharding): refresh and resend.
    Redirect(String),
    Failed(Failure),
}

impl Cluster {
    /// Connects to the first seed that answers, checks that it is a cluster node and reads the
    /// slot map. Errors name the field at fault.
    pub fn open(opts: ClusterOptions) -> Result<Cluster, OpenProblem> {
        if opts.seeds.is_empty() {
            return Err(OpenProblem { field: "address", msg: "is empty; expected host:port seeds, comma-separated".into() });
        }
        let c = Cluster {
            opts,
            topo: RwLock::new(Arc::new(Topology { slots: vec![u16::MAX; SLOTS], nodes: Vec::new() })),
            nodes: Mutex::new(HashMap::new()),
            stats: Mutex::new(ClusterStats::default()),
        };
        let mut why = Vec::new();
        for seed in &c.opts.seeds {
            let mut conn = match c.connect(seed) {
                Ok(conn) => conn,
                Err(e) => {
                    if is_auth_error(&e) {
                        return Err(OpenProblem {
                            field: "password",
                            msg: format!(
                                "Redis node {seed} refused user \"{}\" with this password ({e}); expected the credentials of a Redis ACL user (user_name, password)",
                                c.opts.user_name
                            ),
                        });
                    }
                    why.push(format!("{seed}: {e}"));
                    continue;
                }
            };
            match read_slots(&mut conn, seed) {
                Ok(t) => {
                    let covered = t.slots.iter().filter(|&&n| n != u16::MAX).count();
                    if covered < SLOTS {
                        return Err(OpenProblem {
                            field: "address",
                            msg: format!(
                                "the cluster of {seed} serves {covered} of the {SLOTS} hash slots; expected a cluster whose slots are all assigned"
                            ),
                        });
                    }
                    *c.topo.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
                    c.give_back(seed, conn);
                    return Ok(c);
                }
                Err(e) if e.to_lowercase().contains("cluster support disabled") => {
                    return Err(OpenProblem {
                        field: "address",
                        msg: format!(
                            "{seed} is a Redis server without cluster mode ({e}); expected the nodes of a Redis Cluster (cluster-enabled yes)"
                        ),
                    });
                }
                Err(e) if e.contains("NOAUTH") || e.contains("NOPERM") => {
                    return Err(OpenProblem {
                        field: "password",
                        msg: format!(
                            "Redis node {seed}: {e}; expected the credentials of a Redis ACL user allowed to run CLUSTER SLOTS, HMGET, HSET, HDEL, INCR and EVAL"
                        ),
                    });
                }
                Err(e) => why.push(format!("{seed}: {e}")),
            }
        }
        Err(OpenProblem {
            field: "address",
            msg: format!("no seed answered as a Redis Cluster node within {} ms ({})", c.opts.timeout.as_millis(), why.join("; ")),
        })
    }

    /// The options it was opened with.
    pub fn options(&self) -> &ClusterOptions {
        &self.opts
    }

    /// Counters so far.
    pub fn stats(&self) -> ClusterStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut ClusterStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// A new connection to `addr`, authenticated, with the timeouts set.
    fn connect(&self, addr: &str) -> redis::RedisResult<redis::Connection> {
        let info = connection_info(addr, &self.opts)?;
        let client = redis::Client::open(info)?;
        let conn = client.get_connection_with_timeout(self.opts.timeout)?;
        conn.set_read_timeout(Some(self.opts.timeout))?;
        conn.set_write_timeout(Some(self.opts.timeout))?;
        self.count(|s| s.connects += 1);
        Ok(conn)
    }

    fn node(&self, addr: &str) -> Arc<Node> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(Node { addr: addr.to_string(), idle: Mutex::new(Vec::new()), down_until: Mutex::new(None) }))
            .clone()
    }

    /// An idle connection to `addr`, or a new one; fails at once while the node is left alone.
    fn take(&self, node: &Node) -> Result<redis::Connection, Failure> {
        if let Some(c) = node.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(c);
        }
        {
            let down = node.down_until.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = *down
                && Instant::now() < t
            {
                return Err(Failure { node: node.addr.clone(), msg: "is unreachable (it failed less than 500 ms ago)".into() });
            }
        }
        match self.connect(&node.addr) {
            Ok(c) => {
                *node.down_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
                Ok(c)
            }
            Err(e) => Err(self.fail(node, &e)),
        }
    }

    /// Records that `node` failed with `e` and returns the failure.
    fn fail(&self, node: &Node, e: &redis::RedisError) -> Failure {
        node.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
        *node.down_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + RETRY_AFTER);
        self.count(|s| s.node_failures += 1);
        let msg = if e.is_timeout() {
            format!("did not answer within {} ms (strata_redis_timeout_ms)", self.opts.timeout.as_millis())
        } else {
            e.to_string()
        };
        Failure { node: node.addr.clone(), msg }
    }

    fn give_back(&self, addr: &str, conn: redis::Connection) {
        let node = self.node(addr);
        let mut idle = node.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.opts.connections_per_node {
            idle.push(conn);
        }
    }

    /// Sends each `(slot, command)` to the primary serving its slot, one pipeline per node (see
    /// the module docs); returns each command's reply, in order, or why it got none.
    pub fn run(&self, cmds: &[(u16, Cmd)]) -> Vec<Result<Value, Failure>> {
        let mut out: Vec<Option<Result<Value, Failure>>> = (0..cmds.len()).map(|_| None).collect();
        let all: Vec<usize> = (0..cmds.len()).collect();
        let redirected = self.run_once(cmds, &all, &mut out);
        if !redirected.is_empty() {
            self.refresh();
            // Those redirected twice keep their first reply's failure.
            self.run_once(cmds, &redirected, &mut out);
        }
        out.into_iter().map(|r| r.unwrap_or_else(|| Err(Failure { node: "?".into(), msg: "no reply".into() }))).collect()
    }

    /// One pass of [`run`](Self::run) over the commands `which`; returns those redirected.
    fn run_once(&self, cmds: &[(u16, Cmd)], which: &[usize], out: &mut [Option<Result<Value, Failure>>]) -> Vec<usize> {
        let topo = self.topo.read().unwrap_or_else(|e| e.into_inner()).clone();
        // Group by node.
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); topo.nodes.len()];
        for &i in which {
            let n = topo.slots[cmds[i].0 as usize];
            if n == u16::MAX {
                out[i] = Some(Err(Failure { node: format!("slot {}", cmds[i].0), msg: "is served by no node of the cluster".into() }));
            } else {
                groups[n as usize].push(i);
            }
        }
        // Write every node's pipeline first...
        let mut sent: Vec<(Arc<Node>, redis::Connection, &[usize])> = Vec::new();
        for (n, idx) in groups.iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let node = self.node(&topo.nodes[n]);
            let mut packed = Vec::new();
            for &i in idx {
                cmds[i].1.write_packed_command(&mut packed);
            }
            let sent_ok = self.take(&node).and_then(|mut conn| match conn.send_packed_command(&packed) {
                Ok(()) => Ok(conn),
                Err(e) => Err(self.fail(&node, &e)),
            });
            match sent_ok {
                Ok(conn) => sent.push((node, conn, idx)),
                Err(f) => {
                    for &i in idx {
                        out[i] = Some(Err(f.clone()));
                    }
                }
            }
        }
        // ...then read every node's replies.
        let mut redirected = Vec::new();
        for (node, mut conn, idx) in sent {
            let mut broken = None;
            for &i in idx {
                if let Some(f) = &broken {
                    out[i] = Some(Err(Failure::clone(f)));
                    continue;
                }
                match classify(conn.recv_response(), &node.addr) {
                    Ok(Reply::Ok(v)) => out[i] = Some(Ok(v)),
                    Ok(Reply::Redirect(why)) => {
                        out[i] = Some(Err(Failure { node: node.addr.clone(), msg: why }));
                        redirected.push(i);
                    }
                    Ok(Reply::Failed(f)) => out[i] = Some(Err(f)),
                    Err(e) => {
                        let f = self.fail(&node, &e);
                        out[i] = Some(Err(f.clone()));
                        broken = Some(f);
                    }
                }
            }
            if broken.is_none() {
                self.give_back(&node.addr, conn);
            }
        }
        redirected
    }

    /// Reads the slot map again from any node that answers (the known nodes, then the seeds).
    pub fn refresh(&self) {
        let known: Vec<String> = self.topo.read().unwrap_or_else(|e| e.into_inner()).nodes.clone();
        for addr in known.iter().chain(self.opts.seeds.iter()) {
            let node = self.node(addr);
            let Ok(mut conn) = self.take(&node) else { continue };
            if let Ok(t) = read_slots(&mut conn, addr) {
                *self.topo.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
                self.give_back(addr, conn);
                self.count(|s| s.refreshes += 1);
                return;
            }
        }
    }

    /// The primaries, `host:port` each.
    pub fn primaries(&self) -> Vec<String> {
        self.topo.read().unwrap_or_else(|e| e.into_inner()).nodes.clone()
    }
}

/// A reply as [`Reply`]; `Err` for a broken connection (the node failed).
fn classify(r: redis::RedisResult<Value>, addr: &str) -> redis::RedisResult<Reply> {
    let r = r.and_then(|v| v.extract_error());
    match r {
        Ok(v) => Ok(Reply::Ok(v)),
        Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() => Err(e),
        Err(e) => {
            use redis::{ErrorKind as K, ServerErrorKind as S};
            match e.kind() {
                K::Server(S::Moved | S::Ask | S::TryAgain | S::ClusterDown) => Ok(Reply::Redirect(e.to_string())),
                _ => Ok(Reply::Failed(Failure { node: addr.to_string(), msg: e.to_string() })),
            }
        }
    }
}

/// Whether a connection error is a refused AUTH.
fn is_auth_error(e: &redis::RedisError) -> bool {
    let s = e.to_string();
    matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
        || s.contains("WRONGPASS")
        || s.contains("NOAUTH")
        || s.contains("invalid password")
}

fn connection_info(addr: &str, opts: &ClusterOptions) -> redis::RedisResult<ConnectionInfo> {
    let (host, port) = split_addr(addr).map_err(|m| redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "bad address", m)))?;
    let mut r = RedisConnectionInfo::default().set_skip_set_lib_name();
    if !opts.password.is_empty() {
        r = r.set_username(&opts.user_name).set_password(&opts.password);
    }
    Ok(redis::ConnectionAddr::Tcp(host, port).into_connection_info()?.set_redis_settings(r))
}

/// `host:port` as its parts.
pub fn split_addr(addr: &str) -> Result<(String, u16), String> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("\"{addr}\" has no port; expected host:port"))?;
    let port: u16 = port.parse().map_err(|_| format!("\"{addr}\": port \"{port}\" is not a number in 1..=65535"))?;
    if host.is_empty() || port == 0 {
        return Err(format!("\"{addr}\" is not host:port"));
    }
    Ok((host.trim_start_matches('[').trim_end_matches(']').to_string(), port))
}

/// The slot map from `CLUSTER SLOTS` on `conn` (a connection to `addr`); an empty host in the
/// reply means `addr`'s host.
fn read_slots(conn: &mut redis::Connection, addr: &str) -> Result<Topology, String> {
    let v: Value = redis::cmd("CLUSTER").arg("SLOTS").query(conn).map_err(|e| e.to_string())?;
    let own_host = split_addr(addr).map(|(h, _)| h).unwrap_or_default();
    let Value::Array(ranges) = v else { return Err(format!("CLUSTER SLOTS gave {v:?}")) };
    let mut t = Topology { slots: vec![u16::MAX; SLOTS], nodes: Vec::new() };
    for r in ranges {
        let Value::Array(items) = r else { continue };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(primary))) = (items.first(), items.get(1), items.get(2)) else {
            continue;
        };
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        };
        let host = if host.is_empty() || host == "?" { own_host.clone() } else { host };
        let Some(Value::Int(port)) = primary.get(1) else { continue };
        let a = format!("{host}:{port}");
        let n = match t.nodes.iter().position(|x| *x == a) {
            Some(n) => n,
            None => {
                t.nodes.push(a);
                t.nodes.len() - 1
            }
        };
        for s in (*lo).max(0)..=(*hi).min(SLOTS as i64 - 1) {
            t.slots[s as usize] = n as u16;
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(split_addr("127.0.0.1:7000"), Ok(("127.0.0.1".into(), 7000)));
        assert_eq!(split_addr("[::1]:7000"), Ok(("::1".into(), 7000)));
        assert!(split_addr("localhost").is_err());
        assert!(split_addr("h:0").is_err());
        assert!(split_addr("h:x").is_err());
        assert!(split_addr(":1").is_err());
    }

    #[test]
    fn no_seed_answering_is_an_address_problem() {
        // A port nothing listens on: the connection is refused at once.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let opts = ClusterOptions {
            seeds: vec![format!("127.0.0.1:{port}")],
            user_name: "default".into(),
            password: String::new(),
            connections_per_node: 1,
            timeout: Duration::from_millis(200),
        };
        let e = Cluster::open(opts).err().unwrap();
        assert_eq!(e.field, "address");
        assert!(e.msg.contains(&format!("127.0.0.1:{port}")), "{}", e.msg);
    }
}
