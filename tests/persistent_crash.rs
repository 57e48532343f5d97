//! Crash test of the persistent tier: every upsert that returned `Ok` survives a SIGKILL.
//!
//! The test re-executes its own binary as a child (`STRATA_CRASH_CHILD=<store folder>` selects
//! the child mode of the same `#[test]` function). The child opens the store and upserts
//! deterministic batches in a loop, printing `ACK <seed>` and flushing after each upsert returns
//! `Ok`. The parent kills it with SIGKILL after a random delay, reads every acknowledgement that
//! reached the pipe, reopens the store and checks:
//! - every acknowledged batch is there with its exact values (each batch owns a disjoint key
//!   range, regenerated from its seed);
//! - a batch is all there or not at all: the "hot" keys, rewritten by every batch, hold one whole
//!   batch's rows, from the last acknowledged batch or the one after it (committed, killed before
//!   its acknowledgement), and that batch's own keys are all present while the next one's are all
//!   absent;
//! - the row count is exactly the hot keys plus the rows of the committed batches.
//!
//! Several rounds run against the same store, so later rounds also recheck earlier rounds' data
//! after more crashes. The random seed is printed; `STRATA_CRASH_SEED=<n>` replays a run.
//!
//! The test runs twice: once upserting through the persistent tier's Rust API, and once through
//! the public C ABI (`strata_server_open_json`, `strata_server_table`, `strata_table_upsert` on a
//! server table with a volatile tier in front of the store), checking the same store afterwards.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use strata::storage::tier::persistent::{PersistentStore, PersistentTable};

const CHILD_ENV: &str = "STRATA_CRASH_CHILD";
/// Set in the child when it upserts through the C ABI of a parameter server.
const VIA_SERVER_ENV: &str = "STRATA_CRASH_VIA_SERVER";
const ROUND_ENV: &str = "STRATA_CRASH_ROUND";
const TABLE: &str = "crash/table0";
const DIM: usize = 16;
/// Keys `0..HOT` are rewritten by every batch.
const HOT: u64 = 8;
/// Batch `seed` owns keys `(seed + 1) * SPAN ..`, at most `MAX_OWN` of them.
const SPAN: u64 = 1 << 12;
const MAX_OWN: u64 = 300;
/// Seeds of round `r` are `r * ROUND_SEEDS + i` (all below 2^17, so hot values are exact).
const ROUND_SEEDS: u64 = 10_000;
const ROUNDS: u64 = 6;

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The keys a batch owns (besides the hot keys).
fn own_keys(seed: u64) -> std::ops::Range<u64> {
    let mut r = seed ^ 0x5EED;
    let n = 1 + splitmix(&mut r) % MAX_OWN;
    let base = (seed + 1) * SPAN;
    base..base + n
}

/// Element `j` of own key `k` in batch `seed`: pseudo-random finite bits.
fn own_value(seed: u64, k: u64, j: usize) -> f32 {
    let mut r = seed.wrapping_mul(31).wrapping_add(k).wrapping_mul(1_000_003).wrapping_add(j as u64);
    // Clearing bit 30 keeps the exponent below all-ones: never NaN or infinity.
    f32::from_bits(splitmix(&mut r) as u32 & 0xBFFF_FFFF)
}

/// Element `j` of hot key `h`'s row in batch `seed`: exact in float32 (seeds stay below 2^17).
fn hot_value(seed: u64, h: u64, j: usize) -> f32 {
    (seed * 128 + h * DIM as u64 + j as u64) as f32
}

fn batch(seed: u64) -> (Vec<u64>, Vec<f32>) {
    let mut keys = Vec::new();
    let mut rows = Vec::new();
    for h in 0..HOT {
        keys.push(h);
        rows.extend((0..DIM).map(|j| hot_value(seed, h, j)));
    }
    for k in own_keys(seed) {
        keys.push(k);
        rows.extend((0..DIM).map(|j| own_value(seed, k, j)));
    }
    (keys, rows)
}

/// The ps.json of the server variant: table `crash/table0` (= TABLE) of dim DIM, created from
/// an empty sparse folder beside the store, with a volatile tier in front of the store.
fn server_config(dir: &Path) -> String {
    format!(
        r#"{{ "volatile_db": {{ "type": "parallel_hash_map", "num_partitions": 2 }},
             "persistent_db": {{ "type": "rocks_db", "path": "{}" }},
             "models": [ {{ "model": "crash", "sparse_files": ["{}"], "embedding_table_names": ["table0"],
                           "embedding_vecsize_per_table": [{DIM}], "maxnum_catfeature_query_per_table_per_sample": [1] }} ] }}"#,
        dir.display(),
        dir.with_extension("sparse").display()
    )
}

/// Upserts one batch through the C ABI into `table`, which must be a live table (the child's,
/// borrowed from a server it never frees).
fn server_upsert(table: *mut strata::ffi::strata_table, keys: &[u64], rows: &[f32]) {
    use common::*;
    let k = Desc::compact(keys.as_ptr().cast(), U64, &[keys.len() as i64]);
    let v = Desc::compact(rows.as_ptr().cast(), F32, &[keys.len() as i64, DIM as i64]);
    // SAFETY: table is a live table (the caller's promise, above); k and v describe keys and rows,
    // which strata reads during the call only.
    ok(unsafe { strata_table_upsert(table, &k.t, &v.t) });
}

/// Writes one batch of keys and their rows.
type Upsert = Box<dyn FnMut(&[u64], &[f32])>;

/// Child mode: upsert batches forever, acknowledging each on stdout once it returned Ok.
fn child(dir: &Path, round: u64, via_server: bool) {
    let mut upsert: Upsert = if via_server {
        use common::*;
        let json = std::ffi::CString::new(server_config(dir)).unwrap();
        let mut server = std::ptr::null_mut();
        // SAFETY: json is a NUL-terminated string alive past the call; NULL base_dir means the
        // current directory; server is a reference.
        ok(unsafe { strata_server_open_json(json.as_ptr(), std::ptr::null(), &mut server) });
        let model = std::ffi::CString::new("crash").unwrap();
        let mut table = std::ptr::null_mut();
        // SAFETY: server is the live server just opened, which this child never frees (it is
        // killed); model is a NUL-terminated string alive past the call; table is a reference.
        ok(unsafe { strata_server_table(server, model.as_ptr(), 0, &mut table) });
        Box::new(move |k: &[u64], r: &[f32]| server_upsert(table, k, r))
    } else {
        let store = PersistentStore::open(dir, false).expect("child: open store");
        let table = store.table(TABLE, DIM, None).expect("child: open table");
        Box::new(move |k: &[u64], r: &[f32]| table.upsert(k, r).expect("child: upsert"))
    };
    let mut out = std::io::stdout().lock();
    for i in 0..ROUND_SEEDS {
        let seed = round * ROUND_SEEDS + i;
        let (keys, rows) = batch(seed);
        upsert(&keys, &rows);
        // Written straight to the stdout handle (not print!), so it reaches the pipe now.
        writeln!(out, "ACK {seed}").and_then(|_| out.flush()).expect("child: write ACK");
    }
    // Out of seeds (a very fast disk): wait for the kill rather than exit.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn get(t: &PersistentTable, keys: &[u64]) -> (Vec<f32>, Vec<bool>) {
    let mut out = vec![0f32; keys.len() * DIM];
    let mut found = vec![false; keys.len()];
    t.get_many(keys, &mut out, &mut found).expect("get_many");
    (out, found)
}

/// Checks the store after a crash: `acked` are the acknowledged batches, `extras` the batches
/// earlier checks found committed without an acknowledgement, `allowed` the batches the hot keys
/// may hold now. Returns the batch the hot keys hold, if any.
fn verify(dir: &Path, acked: &[u64], extras: &[u64], allowed: &[Option<u64>]) -> Option<u64> {
    let store = PersistentStore::open(dir, true).expect("reopen store read-only");
    let t = store.table(TABLE, DIM, None).expect("reopen table");
    // Every acknowledged batch's own rows, exactly.
    for &seed in acked {
        let keys: Vec<u64> = own_keys(seed).collect();
        let (out, found) = get(&t, &keys);
        for (i, &k) in keys.iter().enumerate() {
            assert!(found[i], "acknowledged batch {seed}: key {k} is missing after SIGKILL");
            for j in 0..DIM {
                assert_eq!(
                    out[i * DIM + j].to_bits(),
                    own_value(seed, k, j).to_bits(),
                    "acknowledged batch {seed}: key {k} element {j} differs after SIGKILL"
                );
            }
        }
    }
    // The hot keys hold one whole batch: the last acknowledged one or the next.
    let hot: Vec<u64> = (0..HOT).collect();
    let (out, found) = get(&t, &hot);
    let hot_seed = if found[0] {
        assert!(found.iter().all(|&f| f), "hot keys partly present: {found:?}");
        let seed = (out[0] as u64) / 128;
        for h in 0..HOT as usize {
            for j in 0..DIM {
                assert_eq!(out[h * DIM + j], hot_value(seed, h as u64, j), "hot key {h} mixes batches");
            }
        }
        Some(seed)
    } else {
        assert!(found.iter().all(|&f| !f), "hot keys partly present: {found:?}");
        None
    };
    assert!(allowed.contains(&hot_seed), "hot keys hold batch {hot_seed:?}; expected one of {allowed:?}");
    // Atomicity of the batch committed last and of the one after it (never committed).
    let mut rows = 0;
    if let Some(s) = hot_seed {
        let keys: Vec<u64> = own_keys(s).collect();
        let (_, found) = get(&t, &keys);
        assert!(found.iter().all(|&f| f), "batch {s} wrote the hot keys but not all its own keys");
        if !acked.contains(&s) && !extras.contains(&s) {
            rows += keys.len() as u64; // committed, killed before its ACK
        }
        let next: Vec<u64> = own_keys(s + 1).collect();
        let (_, found) = get(&t, &next);
        assert!(found.iter().all(|&f| !f), "batch {} is partly or wholly present but never committed", s + 1);
        rows += HOT;
    }
    let own = |s: &u64| own_keys(*s).end - own_keys(*s).start;
    rows += acked.iter().map(own).sum::<u64>() + extras.iter().map(own).sum::<u64>();
    assert_eq!(t.len().unwrap(), rows, "row count: hot keys plus every committed batch");
    hot_seed
}

#[test]
fn acknowledged_upserts_survive_sigkill() {
    crash_test("acknowledged_upserts_survive_sigkill", false);
}

#[test]
fn acknowledged_server_upserts_survive_sigkill() {
    crash_test("acknowledged_server_upserts_survive_sigkill", true);
}

/// The crash test of the module docs; the child upserts through the server's C ABI when
/// `via_server`, else through the persistent tier's Rust API.
fn crash_test(test_name: &str, via_server: bool) {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        let round = std::env::var(ROUND_ENV).ok().and_then(|r| r.parse().ok()).unwrap_or(0);
        child(Path::new(&dir), round, std::env::var_os(VIA_SERVER_ENV).is_some());
        return;
    }
    let mut rng = std::env::var("STRATA_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    eprintln!("persistent_crash: STRATA_CRASH_SEED={rng}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ps");
    if via_server {
        // the server creates its table from an empty HugeCTR folder
        let sparse = dir.with_extension("sparse");
        std::fs::create_dir_all(&sparse).unwrap();
        std::fs::write(sparse.join("key"), b"").unwrap();
        std::fs::write(sparse.join("emb_vector"), b"").unwrap();
    }
    let exe = std::env::current_exe().unwrap();
    let mut acked: Vec<u64> = Vec::new();
    let mut extras: Vec<u64> = Vec::new();
    let mut hot: Option<u64> = None;
    let test_start = Instant::now();
    for round in 0..ROUNDS {
        let mut cmd = Command::new(&exe);
        if via_server {
            cmd.env(VIA_SERVER_ENV, "1");
        }
        let mut child = cmd
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &dir)
            .env(ROUND_ENV, round.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest may print "test <name> ... " just before the first ACK, on its line.
                if let Some(pos) = line.find("ACK ") {
                    tx.send(line[pos + 4..].trim().parse::<u64>().expect("ACK line")).unwrap();
                }
            }
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        // Round 0 kills early (during start-up, open or the first commits); the others after
        // 0.05-0.8 s of upserts.
        let delay = if round == 0 { splitmix(&mut rng) % 40 } else { 50 + splitmix(&mut rng) % 750 };
        let deadline = Instant::now() + Duration::from_millis(delay);
        let mut exited = None;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                exited = Some(status);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(status) = exited {
            panic!("child exited by itself ({status}) in round {round}:\n{}", err_reader.join().unwrap());
        }
        // SAFETY: plain kill(2) on our own child, which has not been reaped (so its pid is not reused).
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        assert_eq!(rc, 0, "kill failed");
        let status = child.wait().unwrap();
        reader.join().unwrap();
        let stderr_text = err_reader.join().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "child did not die of SIGKILL: {status}\n{stderr_text}");
        let round_acks: Vec<u64> = rx.try_iter().collect();
        for (i, &s) in round_acks.iter().enumerate() {
            assert_eq!(s, round * ROUND_SEEDS + i as u64, "ACKs out of order");
        }
        acked.extend(&round_acks);
        // The hot keys hold this round's last acknowledged batch or the one after it; with no
        // acknowledgement this round, the batch they held before or this round's first batch.
        let allowed = match round_acks.last() {
            Some(&l) => [Some(l), Some(l + 1)],
            None => [hot, Some(round * ROUND_SEEDS)],
        };
        // Round 0 may kill the child before it created the table: then nothing was committed.
        let exists = PersistentStore::open(&dir, true).and_then(|s| s.table(TABLE, DIM, None)).is_ok();
        if exists || !acked.is_empty() {
            hot = verify(&dir, &acked, &extras, &allowed);
            if let Some(s) = hot
                && !acked.contains(&s)
                && !extras.contains(&s)
            {
                extras.push(s);
            }
        }
        eprintln!(
            "persistent_crash: round {round}: killed after {delay} ms, {} batches acknowledged ({} in all, {} more \
             committed unacknowledged), hot keys at batch {hot:?}; all present",
            round_acks.len(),
            acked.len(),
            extras.len()
        );
    }
    assert!(acked.len() >= 20, "only {} batches were acknowledged in {ROUNDS} rounds", acked.len());
    eprintln!("persistent_crash: {} acknowledged batches verified in {:?}", acked.len(), test_start.elapsed());
}
