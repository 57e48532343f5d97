//! Generates the C header into OUT_DIR with cbindgen. The committed `include/strata.h` is
//! compared with it by the `header_is_fresh` test; build.rs never writes into the source tree.
//! From that header it derives `strata_cffi.h`, the same declarations as cffi's `ffi.cdef()` takes
//! them (see [`cffi`]); `header_cffi_is_fresh` compares it with `include/strata_cffi.h`.
//!
//! It also gives the cdylib its SONAME on ELF targets: `libstrata.so.<major>`, or
//! `libstrata.so.0.<minor>` while the version is 0.x (where a minor version may change the ABI),
//! and links it with the symbol versions of `libstrata.map` (see [`symbol_versions`]).

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
    let header = std::fs::read_to_string(format!("{out_dir}/strata.h")).expect("strata.h");
    std::fs::write(format!("{out_dir}/strata_cffi.h"), cffi::declarations(&header)).expect("strata_cffi.h");
    soname(Path::new(&out_dir));
    symbol_versions(Path::new(&crate_dir), Path::new(&out_dir));
}

/// Links the cdylib with `libstrata.map`, the version script that gives every exported function
/// its version node (Linux with glibc only).
///
/// rustc already hands the linker a version script of its own, an anonymous one listing the
/// exported functions: GNU ld refuses a second script beside an anonymous one, and under lld
/// (rustc's default linker here) rustc's script decides. So the cdylib is linked by GNU ld
/// through a wrapper written into OUT_DIR (`-fuse-ld=bfd` with `-B`, so the compiler driver
/// finds the wrapper as `ld.bfd`): it drops rustc's script and passes ours. Both scripts export
/// the same names; tests/abi_surface.rs checks the result against the header.
fn symbol_versions(crate_dir: &Path, out_dir: &Path) {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os != "linux" || env != "gnu" {
        return;
    }
    let map = crate_dir.join("libstrata.map");
    println!("cargo:rerun-if-changed={}", map.display());
    let dir = out_dir.join("version-script-linker");
    let Some(real) = find_in_path("ld.bfd", &dir) else {
        // The library still works without versions; tests/abi_surface.rs fails on it.
        println!(
            "cargo:warning=GNU ld (ld.bfd, from binutils) is not on PATH: libstrata.so is linked without the symbol versions of libstrata.map"
        );
        return;
    };
    std::fs::create_dir_all(&dir).expect("OUT_DIR/version-script-linker");
    let wrapper = dir.join("ld.bfd");
    let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    let script = format!(
        "#!/bin/sh\n\
         # Written by strata's build.rs: links libstrata.so with libstrata.map in place of rustc's\n\
         # anonymous version script (see symbol_versions in build.rs).\n\
         skip=\n\
         for arg do\n\
         \x20   shift\n\
         \x20   if [ -n \"$skip\" ]; then skip=; continue; fi\n\
         \x20   case $arg in\n\
         \x20       --version-script=*) continue ;;\n\
         \x20       --version-script) skip=1; continue ;;\n\
         \x20   esac\n\
         \x20   set -- \"$@\" \"$arg\"\n\
         done\n\
         exec {} \"$@\" --version-script={}\n",
        quote(&real),
        quote(&map)
    );
    std::fs::write(&wrapper, script).expect("the linker wrapper");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod the linker wrapper");
    }
    println!("cargo:rustc-cdylib-link-arg=-fuse-ld=bfd");
    println!("cargo:rustc-cdylib-link-arg=-B{}", dir.display());
}

/// The first `name` on PATH outside `skip`.
fn find_in_path(name: &str, skip: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).filter(|d| d != skip).map(|d| d.join(name)).find(|p| p.is_file())
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
    let elf = family.split(',').any(|f| f == "unix") && !matches!(os.as_str(), "macos" | "ios" | "tvos" | "watchos" | "visionos");
    if !elf {
        return;
    }
    let name = soname_of(&std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap(), &std::env::var("CARGO_PKG_VERSION_MINOR").unwrap());
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

/// The header as declarations for cffi's `ffi.cdef()`, which parses C declarations but has no
/// preprocessor: the conditionals are resolved as a C11 compiler that is not C++ sees them (with
/// no `strata_features.h` and no `<dlpack/dlpack.h>` before), integer `#define`s become
/// `enum { NAME = value };`, and every other preprocessor line (includes, guards, empty or
/// non-integer macros) is dropped. Comments stay: cffi skips them.
mod cffi {
    use std::collections::HashSet;

    /// A conditional's value in that reading, by its exact text; a condition not listed here
    /// stops the build, so that a new one is decided on purpose rather than guessed.
    fn condition(text: &str, defined: &HashSet<String>) -> bool {
        let word = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if let Some(name) = text.strip_prefix("defined(").and_then(|s| s.strip_suffix(')')).filter(|s| word(s)) {
            return defined.contains(name);
        }
        match text {
            // C23 fixed-type enums: cffi reads C11, where cbindgen's fallback is `typedef int32_t`.
            "defined(__cplusplus) || __STDC_VERSION__ >= 202311L" | "__STDC_VERSION__ >= 202311L" => false,
            _ => panic!("strata_cffi.h: no value for the conditional `#if {text}`; add it to build.rs"),
        }
    }

    /// Whether `value` is an integer constant expression of literals, earlier constants and
    /// operators cffi evaluates (`+ - * / % << >> & | ^`, parentheses).
    fn integer_expression(value: &str, constants: &HashSet<String>) -> bool {
        let mut has_digit = false;
        for token in value.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|t| !t.is_empty()) {
            if token.starts_with(|c: char| c.is_ascii_digit()) {
                let digits = token.trim_end_matches(['u', 'U', 'l', 'L']);
                has_digit |= digits.chars().all(|c| c.is_ascii_digit());
                if !digits.chars().all(|c| c.is_ascii_hexdigit() || c == 'x' || c == 'X') {
                    return false;
                }
            } else if !constants.contains(token) {
                return false;
            }
        }
        let operators = value.chars().all(|c| c.is_ascii_alphanumeric() || "_ ()+-*/%<>&|^".contains(c));
        !value.is_empty() && operators && (has_digit || value.chars().any(|c| c.is_ascii_alphabetic()))
    }

    /// Whether `#define` `rest` is for C callers only: a function-like macro, or a name for
    /// another identifier that is not an integer constant (a function's alias).
    fn is_alias(rest: &str, constants: &HashSet<String>) -> bool {
        let mut words = rest.split_whitespace();
        let name = words.next().unwrap_or("");
        let value: Vec<&str> = words.collect();
        let ident = |s: &str| {
            s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        name.contains('(') || (value.len() == 1 && ident(value[0]) && !constants.contains(value[0]))
    }

    pub fn declarations(header: &str) -> String {
        // One frame per open conditional: (this branch is taken, some branch was taken, the
        // enclosing region is active).
        let mut frames: Vec<(bool, bool, bool)> = Vec::new();
        let mut defined: HashSet<String> = HashSet::new();
        let mut constants: HashSet<String> = HashSet::new();
        let mut out = String::from(
            "/* strata's C declarations for cffi (`ffi.cdef(...)`), derived by build.rs from strata.h:\n \
             * no preprocessor lines, no system headers, integer constants as enums. Generated; do not edit. */\n",
        );
        let mut blank = true;
        for line in header.lines() {
            let active = frames.last().is_none_or(|f| f.0 && f.2);
            let trimmed = line.trim_start();
            let Some(directive) = trimmed.strip_prefix('#') else {
                if active && !(blank && line.trim().is_empty()) {
                    out.push_str(line);
                    out.push('\n');
                    blank = line.trim().is_empty();
                }
                continue;
            };
            // The directive without a trailing `// comment` (cbindgen's `#endif // ...`).
            let directive = directive.split("//").next().unwrap_or("").trim();
            let (keyword, rest) = directive.split_once(char::is_whitespace).unwrap_or((directive, ""));
            let rest = rest.trim();
            match keyword {
                "if" | "ifdef" | "ifndef" => {
                    let value = active
                        && match keyword {
                            "ifdef" => defined.contains(rest),
                            "ifndef" => !defined.contains(rest),
                            _ => condition(rest, &defined),
                        };
                    frames.push((value, value, active));
                }
                "elif" => {
                    let f = frames.last_mut().expect("strata.h: #elif without #if");
                    let value = f.2 && !f.1 && condition(rest, &defined);
                    f.0 = value;
                    f.1 |= value;
                }
                "else" => {
                    let f = frames.last_mut().expect("strata.h: #else without #if");
                    f.0 = f.2 && !f.1;
                    f.1 = true;
                }
                "endif" => {
                    frames.pop().expect("strata.h: #endif without #if");
                }
                // (A function-like macro, `name(...)`, or a function's alias, `name other_name`,
                // is for C callers only.)
                "define" if active && !is_alias(rest, &constants) => {
                    let (name, value) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                    let value = value.trim();
                    defined.insert(name.to_string());
                    if integer_expression(value, &constants) {
                        constants.insert(name.to_string());
                        out.push_str(&format!("enum {{ {name} = {value} }};\n"));
                        blank = false;
                    }
                }
                "include" | "define" | "undef" | "pragma" => {}
                _ => panic!("strata_cffi.h: unexpected directive `#{directive}` in strata.h"),
            }
        }
        assert!(frames.is_empty(), "strata.h: unbalanced conditionals");
        out
    }
}
