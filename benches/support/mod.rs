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
    let out = Command::new(&bin)
        .args(args.iter().map(|v| v.to_string()))
        .output()
        .map_err(|e| format!("running the anchor: {e}"))?;
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
