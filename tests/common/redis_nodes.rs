//! A local Redis Cluster for tests and benchmarks: three `redis-server` nodes on 127.0.0.1, on
//! free ports, in a folder of the caller's, with a password, made a cluster with
//! `redis-cli --cluster create`; nodes can be killed, stopped and restarted; every process is
//! reaped on shutdown (and on drop).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nodes' password.
pub const PASSWORD: &str = "strata-test-pw";

pub struct Node {
    pub port: u16,
    pub conf: PathBuf,
    pub child: Option<Child>,
}

pub struct RedisCluster {
    pub dir: PathBuf,
    pub nodes: Vec<Node>,
    pub extra: Vec<Child>,
}

/// `redis-server`, installed with apt-get when missing and possible; `Err(reason)` otherwise.
pub fn redis_server() -> Result<(), String> {
    let have = |c: &str| Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if have("redis-server") && have("redis-cli") {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("redis-server is not installed and this is not root (apt-get install redis-server)".into());
    }
    let _ = Command::new("apt-get").args(["update", "-qq"]).status();
    let st = Command::new("apt-get")
        .args(["install", "-y", "-qq", "redis-server", "redis-tools"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status();
    if have("redis-server") && have("redis-cli") { Ok(()) } else { Err(format!("redis-server could not be installed (apt-get: {st:?})")) }
}

/// A port that is free, and whose cluster bus port (+10000) is free too.
pub fn free_port(taken: &[u16]) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 55000 && !taken.contains(&p) && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-a", PASSWORD, "--no-auth-warning"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl RedisCluster {
    pub fn start(dir: &Path) -> RedisCluster {
        let mut nodes: Vec<Node> = Vec::new();
        for _ in 0..3 {
            let taken: Vec<u16> = nodes.iter().map(|n| n.port).collect();
            let port = free_port(&taken);
            let d = dir.join(format!("node{port}"));
            std::fs::create_dir_all(&d).unwrap();
            let conf = d.join("redis.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\ncluster-enabled yes\ncluster-config-file nodes.conf\n\
                     cluster-node-timeout 2000\ncluster-require-full-coverage no\nrequirepass {PASSWORD}\nmasterauth {PASSWORD}\n\
                     save \"\"\nappendonly no\nlogfile {}\n",
                    d.display(),
                    d.join("log").display()
                ),
            )
            .unwrap();
            nodes.push(Node { port, conf, child: None });
        }
        let mut c = RedisCluster { dir: dir.to_path_buf(), nodes, extra: Vec::new() };
        for i in 0..3 {
            c.run_node(i);
        }
        let addrs: Vec<String> = c.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.push("--cluster-yes");
        let out = cli(c.nodes[0].port, &args);
        assert!(out.contains("All 16384 slots covered"), "redis-cli --cluster create: {out}");
        c.wait_ok();
        c
    }

    pub fn run_node(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let child = Command::new("redis-server")
            .arg(&n.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        n.child = Some(child);
        let port = n.port;
        wait_for("a node to answer PING", Duration::from_secs(10), || cli(port, &["ping"]).contains("PONG"));
    }

    /// Every live node reports the cluster ok.
    pub fn wait_ok(&self) {
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            wait_for("cluster_state:ok", Duration::from_secs(30), || cli(n.port, &["cluster", "info"]).contains("cluster_state:ok"));
        }
    }

    pub fn seeds(&self) -> String {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect::<Vec<_>>().join(",")
    }

    pub fn signal(&mut self, i: usize, sig: i32) {
        let pid = self.nodes[i].child.as_ref().unwrap().id() as i32;
        // SAFETY: kill with a pid of our own child and a valid signal number.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        if sig == libc::SIGKILL {
            let _ = self.nodes[i].child.take().unwrap().wait();
        }
    }

    /// A plain (non-cluster) redis-server, for the open-error checks.
    pub fn plain(&mut self) -> u16 {
        let taken: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        let port = free_port(&taken);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--requirepass", PASSWORD, "--dir"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.extra.push(child);
        wait_for("the plain server", Duration::from_secs(10), || cli(port, &["ping"]).contains("PONG"));
        port
    }

    /// SIGTERM to all, SIGKILL after 3 s; every process is reaped.
    pub fn shutdown(&mut self) {
        let mut all: Vec<Child> = self.nodes.iter_mut().filter_map(|n| n.child.take()).chain(self.extra.drain(..)).collect();
        for c in &all {
            // SAFETY: kill with a pid of our own (unreaped) child.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            // SAFETY: as above.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let end = Instant::now() + Duration::from_secs(3);
        for c in &mut all {
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > end {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for c in &mut all {
            assert!(c.try_wait().unwrap().is_some(), "redis-server {} still running", c.id());
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
