//! What the benchmarks share: interleaved medians, and building and running a hand-written
//! baseline from ../shared/anchors/.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Median seconds of each case over `rounds` rounds after one warm-up round. Each round runs
/// every case once, so drift in a shared machine's speed reaches all cases alike.
pub fn medians(rounds: usize, cases: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for c in cases.iter_mut() {
        c();
    }
    let mut times = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (c, t) in cases.iter_mut().zip(times.iter_mut()) {
            let t0 = Instant::now();
            c();
            t.push(t0.elapsed().as_secs_f64());
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort_by(|a, b| a.partial_cmp(b).unwrap());
            t[t.len() / 2]
        })
        .collect()
}

/// How much of the process's anonymous memory transparent huge pages back (Linux), for reading
/// the numbers: random row reads slow down markedly when the tables get only 4 KiB pages.
pub fn huge_pages() -> String {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let field = |name: &str| rollup.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok());
    match (field("AnonHugePages:"), field("Anonymous:")) {
        (Some(h), Some(a)) => format!("huge pages: {} of {} MiB of anonymous memory", h / 1024, a / 1024),
        _ => "huge pages: unknown (no /proc/self/smaps_rollup)".into(),
    }
}

/// Runs this benchmark under the same page rules as its anchor: unless `STRATA_NO_HUGE_PAGES`
/// is set, re-executes the process with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (added to any
/// tunables already set), so the benchmark's own buffers (the memcpy source and destination,
/// the read-limit scan, `out`, the key arrays) get the transparent-huge-page advice strata
/// gives its tables and [`run_anchor`] gives the anchor. Without it, where THP is in `madvise`
/// mode, the limits were measured on 4 KiB pages and came out slower than the anchor's own
/// (the pooled read limit by about 2x), which flattered every ratio against them. Returns a
/// line that says which pages the process runs on. (Under valgrind, set the tunable beforehand:
/// a re-executed process runs outside it.)
pub fn same_pages_as_the_anchor() -> String {
    const TUNABLE: &str = "glibc.malloc.hugetlb=1";
    if std::env::var_os("STRATA_NO_HUGE_PAGES").is_some() {
        return "STRATA_NO_HUGE_PAGES set: the benchmark's own buffers and the anchor's on 4 KiB pages".into();
    }
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if tunables.split(':').any(|t| t == TUNABLE) {
        return format!(
            "the benchmark's own buffers and the anchor's on huge pages where the kernel grants them (GLIBC_TUNABLES={tunables})"
        );
    }
    let joined = if tunables.is_empty() { TUNABLE.to_string() } else { format!("{tunables}:{TUNABLE}") };
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let err = std::os::unix::process::CommandExt::exec(Command::new(exe).args(std::env::args_os().skip(1)).env("GLIBC_TUNABLES", joined));
    panic!("re-executing the benchmark with GLIBC_TUNABLES failed: {err}");
}

/// Builds `../shared/anchors/<name>.cc` (or `$<env>`) with g++ -O3 -march=native and `libs`,
/// runs it with `args`, echoes its output, and returns it.
pub fn run_anchor(name: &str, env: &str, libs: &[&str], args: &[usize]) -> Result<String, String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| manifest.join(format!("../shared/anchors/{name}.cc")));
    if !src.exists() {
        return Err(format!("{} not found", src.display()));
    }
    let bin = manifest.join("target").join(name);
    let built = Command::new("g++")
        .args(["-O3", "-march=native", "-std=c++17"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .args(libs)
        .arg("-pthread")
        .output()
        .map_err(|e| format!("g++: {e}"))?;
    if !built.status.success() {
        return Err(format!("building the anchor failed: {}", String::from_utf8_lossy(&built.stderr).lines().next().unwrap_or("")));
    }
    // strata advises its tables for transparent huge pages (unless STRATA_NO_HUGE_PAGES is
    // set); where the kernel's THP mode is `madvise`, the anchor's std::vector and hash map
    // would otherwise sit on 4 KiB pages and pay a TLB miss on every random row. glibc's
    // malloc tunable gives the anchor the same advice without changing its source.
    let huge = std::env::var_os("STRATA_NO_HUGE_PAGES").is_none();
    let mut cmd = Command::new(&bin);
    cmd.args(args.iter().map(|v| v.to_string())).stdout(std::process::Stdio::piped());
    if huge {
        let tunables = match std::env::var("GLIBC_TUNABLES") {
            Ok(t) if !t.is_empty() => format!("{t}:glibc.malloc.hugetlb=1"),
            _ => "glibc.malloc.hugetlb=1".to_string(),
        };
        cmd.env("GLIBC_TUNABLES", tunables);
    }
    let mut child = cmd.spawn().map_err(|e| format!("running the anchor: {e}"))?;
    // Its largest huge-page backing while it runs, read from /proc, to show the advice took.
    let rollup = format!("/proc/{}/smaps_rollup", child.id());
    let mut peak = (0u64, 0u64);
    while child.try_wait().map_err(|e| format!("running the anchor: {e}"))?.is_none() {
        let text = std::fs::read_to_string(&rollup).unwrap_or_default();
        let field = |name: &str| text.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok());
        if let (Some(h), Some(a)) = (field("AnonHugePages:"), field("Anonymous:")) {
            peak = peak.max((h, a));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().map_err(|e| format!("running the anchor: {e}"))?;
    println!(
        "  anchor> (huge pages: {} of {} MiB of anonymous memory at most, {})",
        peak.0 / 1024,
        peak.1 / 1024,
        if huge { "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" } else { "STRATA_NO_HUGE_PAGES set: 4 KiB pages" }
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    print!("{}", text.lines().map(|l| format!("  anchor> {l}\n")).collect::<String>());
    Ok(text)
}

/// The milliseconds, as seconds, on the anchor's line starting with `prefix`: the number right
/// before the line's first " ms".
pub fn anchor_seconds(text: &str, prefix: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with(prefix))?;
    let before = &line[..line.find(" ms")?];
    before.rsplit([' ', ':']).next()?.parse::<f64>().ok().map(|v| v / 1e3)
}

/// The latency of one random 64-byte line of a `bytes`-long region of huge-page memory (as
/// strata's tables get), by a pointer chase: each load's address comes from the one before, so
/// exactly one miss is in flight. Median of 5 chases of `steps` loads, in seconds.
///
/// With it a throughput turns into the number of lines a thread keeps in flight (Little's law:
/// lines in flight = lines per second x latency), which is what bounds random-row reads when
/// the core's miss buffers, not the memory's bandwidth, are the limit.
pub fn random_line_latency(bytes: usize, steps: usize) -> f64 {
    const LINE: usize = 64;
    let lines = (bytes / LINE).max(2);
    let mut map = memmap2::MmapMut::map_anon(lines * LINE + (2 << 20)).expect("map the latency probe");
    let start = (map.as_ptr() as usize).next_multiple_of(2 << 20) - map.as_ptr() as usize;
    let _ = map.advise_range(memmap2::Advice::HugePage, start, lines * LINE - lines * LINE % (2 << 20));
    // SAFETY: the range from `start` holds lines * LINE bytes of the mapping, aligned for u64.
    let region = unsafe { std::slice::from_raw_parts_mut(map.as_mut_ptr().add(start) as *mut u64, lines * LINE / 8) };
    // One random cycle through every line (Sattolo's algorithm), each line holding the index of
    // the next one's first word.
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for i in (1..lines).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % i as u64) as usize);
    }
    for w in 0..lines {
        let (from, to) = (order[w] as usize, order[(w + 1) % lines] as usize);
        region[from * LINE / 8] = (to * LINE / 8) as u64;
    }
    drop(order);
    let mut at = 0usize;
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..steps {
                at = region[at] as usize;
            }
            t0.elapsed().as_secs_f64() / steps as f64
        })
        .collect();
    std::hint::black_box(at);
    runs.sort_by(f64::total_cmp);
    runs[2]
}
