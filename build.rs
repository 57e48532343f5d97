//! Generates the C header into OUT_DIR with cbindgen. The committed `include/strata.h` is
//! compared with it by the `header_is_fresh` test; build.rs never writes into the source tree.
//!
//! It also gives the cdylib its SONAME on ELF targets: `libstrata.so.<major>`, or
//! `libstrata.so.0.<minor>` while the version is 0.x (where a minor version may change the ABI).

use std::path::{Path, PathBuf};

fn main() {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let out_dir = std::env::var("OUT_DIR").unwrap();
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml")).expect("cbindgen.toml");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed to generate strata.h")
        .write_to_file(format!("{out_dir}/strata.h"));
    soname(Path::new(&out_dir));
}

/// The SONAME for version `major.minor`: `libstrata.so.0.<minor>` while 0.x, else
/// `libstrata.so.<major>`.
fn soname_of(major: &str, minor: &str) -> String {
    if major == "0" { format!("libstrata.so.0.{minor}") } else { format!("libstrata.so.{major}") }
}

/// Sets the cdylib's SONAME (ELF targets only) and links `<soname> -> libstrata.so` next to the
/// library in cargo's output folder, so that programs linked there with `-lstrata` (whose
/// NEEDED entry is the SONAME) still find it at run time; `libstrata.so` itself stays where it
/// always was, for hosts that load it by path.
fn soname(out_dir: &Path) {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let family = std::env::var("CARGO_CFG_TARGET_FAMILY").unwrap_or_default();
    let elf = family.split(',').any(|f| f == "unix")
        && !matches!(os.as_str(), "macos" | "ios" | "tvos" | "watchos" | "visionos");
    if !elf {
        return;
    }
    let name = soname_of(
        &std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap(),
        &std::env::var("CARGO_PKG_VERSION_MINOR").unwrap(),
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{name}");
    // OUT_DIR is <target>/<profile>/build/strata-<hash>/out; the library goes to <target>/<profile>
    // (and <profile>/deps). Best effort: a missing link only affects hosts linked by -lstrata there.
    let Some(profile_dir) = artifact_dir(out_dir) else { return };
    for dir in [profile_dir.clone(), profile_dir.join("deps")] {
        // A link left by another version would hand its programs this, incompatible, library.
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let stale = entry.file_name().to_str().is_some_and(|n| n.starts_with("libstrata.so.") && n != name);
            if stale && std::fs::read_link(entry.path()).is_ok_and(|t| t == Path::new("libstrata.so")) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let link = dir.join(&name);
        if std::fs::read_link(&link).is_ok_and(|t| t == Path::new("libstrata.so")) {
            continue;
        }
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        if let Err(e) = std::os::unix::fs::symlink("libstrata.so", &link) {
            println!("cargo:warning=could not link {} -> libstrata.so: {e}", link.display());
        }
    }
}

/// cargo's output folder for this profile, from OUT_DIR's usual layout; None if it differs.
fn artifact_dir(out_dir: &Path) -> Option<PathBuf> {
    let build = out_dir.parent()?.parent()?;
    (build.file_name()? == "build").then(|| build.parent().map(Path::to_path_buf))?
}
