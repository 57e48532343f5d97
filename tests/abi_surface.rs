//! What strata puts into a host's namespace: every name `include/strata.h` declares, and every
//! symbol `libstrata.so` exports.
//!
//! - The header declares only `strata_*` / `STRATA_*` names and DLPack's (`DL*`, `kDL*`,
//!   `DLPACK_*`): macros come from the C preprocessor itself (`cc -E -dM` on the header, less the
//!   same on its system includes alone, as C11 and C++17), the other names (typedefs, struct /
//!   union / enum tags, enum constants, functions, variables) from a small parser run over the
//!   header's preprocessed text (`cc -E`, only the lines that come from strata.h). The parser is
//!   tested on its own below, and the whole pipeline on a copy of the header with names added.
//! - libstrata.so exports exactly the header's functions (`nm -D --defined-only`) and no data.
//! - libstrata.so carries its SONAME (`readelf -d`).
//! - Every exported function carries the version node `libstrata.map` gives it (`readelf
//!   --dyn-syms`, `readelf -V`): the nodes chain in order, the map names exactly the header's
//!   functions, and the released node `STRATA_0.3` holds exactly the functions of the frozen
//!   0.3.0 header (`tests/abi/strata_0_3.h`), so a released node is never edited.
//!
//! The C compiler is `$CC`, else `cc`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn header() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include").join("strata.h")
}

/// Runs `cmd`, returning its stdout; panics with its stderr on failure.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn cc() -> Command {
    Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
}

/// Compiler flags for a language: C11 or C++17.
#[derive(Clone, Copy)]
enum Lang {
    C11,
    Cxx17,
}

impl Lang {
    fn flags(self) -> [&'static str; 2] {
        match self {
            Lang::C11 => ["-xc", "-std=c11"],
            Lang::Cxx17 => ["-xc++", "-std=c++17"],
        }
    }
}

// ---- macros, from the preprocessor --------------------------------------------------------

/// The names `cc -E -dM` reports for `file`.
fn macro_names(file: &Path, lang: Lang, include_dirs: &[&Path]) -> BTreeSet<String> {
    let mut cmd = cc();
    cmd.args(lang.flags()).args(["-E", "-dM"]);
    for d in include_dirs {
        cmd.arg(format!("-I{}", d.display()));
    }
    run(cmd.arg(file))
        .lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .map(|l| l.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap().to_string())
        .collect()
}

/// The macros `header` defines beyond those of the system headers it includes (`#include <...>`).
fn header_macros(header: &Path, lang: Lang, include_dirs: &[&Path]) -> BTreeSet<String> {
    let text = std::fs::read_to_string(header).unwrap();
    let system: String = text.lines().filter(|l| l.trim_start().starts_with("#include <")).map(|l| format!("{l}\n")).collect();
    let dir = tempfile::tempdir().unwrap();
    let baseline = dir.path().join("system_includes.h");
    std::fs::write(&baseline, system).unwrap();
    let before = macro_names(&baseline, lang, include_dirs);
    macro_names(header, lang, include_dirs).difference(&before).cloned().collect()
}

// ---- declarations, from the preprocessed header -------------------------------------------

/// The lines of `cc -E header` that come from `header` itself (by the preprocessor's line
/// markers), so that system headers are left out and only live `#if` branches remain.
fn preprocessed_own_lines(header: &Path, lang: Lang, include_dirs: &[&Path]) -> String {
    let mut cmd = cc();
    cmd.args(lang.flags()).arg("-E");
    for d in include_dirs {
        cmd.arg(format!("-I{}", d.display()));
    }
    let text = run(cmd.arg(header));
    let me = header.to_str().unwrap();
    let mut own = true;
    let mut kept = String::new();
    for line in text.lines() {
        if let Some(marker) = line.strip_prefix("# ") {
            // `# <line> "<file>" <flags>`
            if let Some(file) = marker.split('"').nth(1) {
                own = file == me;
            }
            continue;
        }
        if own && !line.starts_with('#') {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(&'static str),
    /// A number, string or character literal.
    Lit,
}

fn tokenize(src: &str) -> Vec<Tok> {
    const PUNCTS: [&str; 25] =
        ["...", "::", "->", "<<", ">>", "(", ")", "[", "]", "{", "}", ";", ",", "*", "=", ":", "&", "|", "+", "-", "/", "<", ">", "~", "?"];
    let b = src.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            toks.push(Tok::Ident(src[s..i].to_string()));
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                let exp = matches!(b[i], b'e' | b'E' | b'p' | b'P');
                i += 1;
                if exp && i < b.len() && matches!(b[i], b'+' | b'-') {
                    i += 1;
                }
            }
            toks.push(Tok::Lit);
        } else if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            toks.push(Tok::Lit);
        } else if let Some(p) = PUNCTS.iter().find(|p| src[i..].starts_with(**p)) {
            toks.push(Tok::Punct(p));
            i += p.len();
        } else {
            // any other operator character: no declaration needs it told apart
            toks.push(Tok::Punct("?"));
            i += 1;
        }
    }
    toks
}

/// Names a translation unit declares at file scope, by kind.
#[derive(Debug, Default, PartialEq)]
struct Decls {
    typedefs: BTreeSet<String>,
    tags: BTreeSet<String>,
    enum_constants: BTreeSet<String>,
    functions: BTreeSet<String>,
    variables: BTreeSet<String>,
}

impl Decls {
    fn all(&self) -> Vec<(&'static str, &String)> {
        let kinds = [
            ("typedef", &self.typedefs),
            ("tag", &self.tags),
            ("enum constant", &self.enum_constants),
            ("function", &self.functions),
            ("variable", &self.variables),
        ];
        kinds.into_iter().flat_map(|(k, set)| set.iter().map(move |n| (k, n))).collect()
    }
}

/// Words that never name what a declaration declares.
#[rustfmt::skip]
const KEYWORDS: &[&str] = &[
    "typedef", "extern", "static", "inline", "__inline", "__inline__", "const", "volatile", "restrict", "__restrict",
    "_Atomic", "signed", "unsigned", "short", "long", "int", "char", "float", "double", "void", "_Bool", "bool",
    "struct", "union", "enum", "register", "auto", "_Noreturn", "_Thread_local", "_Alignas", "_Complex",
];

fn is_ident(t: &Tok) -> Option<&str> {
    match t {
        Tok::Ident(s) => Some(s),
        _ => None,
    }
}

/// Index of the token that closes the bracket opened at `open`.
fn matching(toks: &[Tok], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct("(" | "[" | "{") => depth += 1,
            Tok::Punct(")" | "]" | "}") => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced brackets in the header's declarations");
}

/// Drops `__attribute__((...))`, `__declspec(...)` and `__extension__`.
fn strip_extensions(toks: Vec<Tok>) -> Vec<Tok> {
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        match is_ident(&toks[i]) {
            Some("__attribute__" | "__declspec" | "__asm__" | "__asm") if toks.get(i + 1) == Some(&Tok::Punct("(")) => {
                i = matching(&toks, i + 1) + 1;
            }
            Some("__extension__") => i += 1,
            _ => {
                out.push(toks[i].clone());
                i += 1;
            }
        }
    }
    out
}

/// Splits file-scope tokens into declarations: each ends at a `;` outside brackets, or at the
/// `}` of a function body.
fn split_declarations(toks: &[Tok]) -> Vec<&[Tok]> {
    let mut decls = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct("(" | "[") => i = matching(toks, i),
            Tok::Punct("{") => {
                let close = matching(toks, i);
                let body_of_function = i > start && toks[i - 1] == Tok::Punct(")");
                i = close;
                if body_of_function {
                    decls.push(&toks[start..=close]);
                    start = close + 1;
                }
            }
            Tok::Punct(";") => {
                decls.push(&toks[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    assert!(start == toks.len(), "the header's text ends inside a declaration: {:?}", &toks[start..]);
    decls
}

/// Records the tags and enum constants in `d` (at any depth: a nested struct or enum is at file
/// scope in C).
fn tags_and_constants(d: &[Tok], out: &mut Decls) {
    for i in 0..d.len() {
        let Some(kw @ ("struct" | "union" | "enum")) = is_ident(&d[i]) else { continue };
        let mut j = i + 1;
        if let Some(tag) = d.get(j).and_then(is_ident) {
            out.tags.insert(tag.to_string());
            j += 1;
        }
        if kw != "enum" {
            continue;
        }
        // `enum [tag] [: type] { A [= v], B, ... }`
        if d.get(j) == Some(&Tok::Punct(":")) {
            while j < d.len() && !matches!(d[j], Tok::Punct("{" | ";" | ")" | ",")) {
                j += 1;
            }
        }
        if d.get(j) != Some(&Tok::Punct("{")) {
            continue;
        }
        let close = matching(d, j);
        let mut k = j + 1;
        while k < close {
            let name = is_ident(&d[k]).unwrap_or_else(|| panic!("expected an enum constant at {:?}", &d[k..close]));
            out.enum_constants.insert(name.to_string());
            // skip `= value` up to the next comma outside brackets
            while k < close && d[k] != Tok::Punct(",") {
                if matches!(d[k], Tok::Punct("(" | "[" | "{")) {
                    k = matching(d, k);
                }
                k += 1;
            }
            k += 1;
        }
    }
}

/// The name one declarator declares: `(*name)(...)` / `(*name)[n]`, else the identifier before
/// the first `(` (a function), else the last identifier before any `[`, `=` or `:`.
fn declarator_name(chunk: &[Tok]) -> Option<(String, bool)> {
    let paren = chunk.iter().position(|t| *t == Tok::Punct("("));
    let name = match paren {
        Some(p) if chunk.get(p + 1) == Some(&Tok::Punct("*")) => {
            let inner = &chunk[p + 1..matching(chunk, p)];
            let n = inner.iter().filter_map(is_ident).find(|s| !KEYWORDS.contains(s));
            return n.map(|n| (n.to_string(), false));
        }
        Some(p) => return chunk[..p].last().and_then(is_ident).map(|n| (n.to_string(), true)),
        None => {
            let end = chunk.iter().position(|t| matches!(t, Tok::Punct("[" | "=" | ":"))).unwrap_or(chunk.len());
            chunk[..end].iter().rev().find_map(is_ident)
        }
    };
    name.map(|n| (n.to_string(), false))
}

/// Parses preprocessed C declarations (file scope) into the names they declare.
fn parse_decls(src: &str) -> Decls {
    let toks = strip_extensions(tokenize(src));
    let mut out = Decls::default();
    for d in split_declarations(&toks) {
        if d.is_empty() {
            continue;
        }
        tags_and_constants(d, &mut out);
        // The declaration without its braced bodies: specifiers and declarators.
        let mut flat = Vec::new();
        let mut i = 0;
        while i < d.len() {
            if d[i] == Tok::Punct("{") {
                i = matching(d, i) + 1;
            } else {
                flat.push(d[i].clone());
                i += 1;
            }
        }
        // `struct tag`, `enum tag : type`: declares only the tag.
        if matches!(flat.first().and_then(is_ident), Some("struct" | "union" | "enum"))
            && (flat.len() <= 2 || flat.get(2) == Some(&Tok::Punct(":")))
        {
            continue;
        }
        let typedef = flat.iter().any(|t| is_ident(t) == Some("typedef"));
        // declarators are separated by commas outside brackets
        let mut chunks = Vec::new();
        let (mut s, mut j) = (0, 0);
        while j < flat.len() {
            match flat[j] {
                Tok::Punct("(" | "[") => j = matching(&flat, j),
                Tok::Punct(",") => {
                    chunks.push(&flat[s..j]);
                    s = j + 1;
                }
                _ => {}
            }
            j += 1;
        }
        chunks.push(&flat[s..]);
        for chunk in chunks {
            let (name, function) =
                declarator_name(chunk).unwrap_or_else(|| panic!("cannot tell what this declaration declares: {chunk:?}"));
            assert!(!KEYWORDS.contains(&name.as_str()), "misread a declaration (name {name:?}): {d:?}");
            let set = if typedef {
                &mut out.typedefs
            } else if function {
                &mut out.functions
            } else {
                &mut out.variables
            };
            set.insert(name);
        }
    }
    out
}

// ---- the rule ------------------------------------------------------------------------------

/// strata's own names and DLPack's (`DL*`, `kDL*`, `DLPACK_*`).
fn allowed(name: &str) -> bool {
    name.starts_with("strata_") || name.starts_with("STRATA_") || name.starts_with("DL") || name.starts_with("kDL")
}

/// Every name `header` declares, as (kind, name): macros as C11 and as C++17, then the
/// declarations of its C11 text. `include_dirs` are searched for strata_features.h.
fn declared_names(header: &Path, include_dirs: &[&Path]) -> BTreeSet<(String, String)> {
    let mut names = BTreeSet::new();
    for lang in [Lang::C11, Lang::Cxx17] {
        for m in header_macros(header, lang, include_dirs) {
            names.insert(("macro".to_string(), m));
        }
    }
    let decls = parse_decls(&preprocessed_own_lines(header, Lang::C11, include_dirs));
    for (kind, n) in decls.all() {
        names.insert((kind.to_string(), n.clone()));
    }
    names
}

fn offending(names: &BTreeSet<(String, String)>) -> Vec<String> {
    names.iter().filter(|(_, n)| !allowed(n)).map(|(k, n)| format!("{k} {n}")).collect()
}

/// A folder with strata_features.h as CMake writes it (what strata.h includes when installed).
fn features_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let template = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("cmake").join("strata_features.h.in")).unwrap();
    let text = template.replace("@STRATA_HAS_CUDA@", "1").replace("@STRATA_HAS_MPI@", "1");
    std::fs::write(dir.path().join("strata_features.h"), text).unwrap();
    dir
}

#[test]
fn header_declares_only_strata_and_dlpack_names() {
    let features = features_dir();
    for dirs in [vec![], vec![features.path()]] {
        let names = declared_names(&header(), &dirs);
        // the lists are not empty: the pipeline found the header's names
        for kind in ["macro", "typedef", "tag", "enum constant", "function"] {
            assert!(names.iter().any(|(k, _)| k == kind), "found no {kind} in strata.h: {names:?}");
        }
        if !dirs.is_empty() {
            assert!(names.contains(&("macro".into(), "STRATA_HAS_CUDA".into())), "strata_features.h was not read");
        }
        let bad = offending(&names);
        assert!(
            bad.is_empty(),
            "include/strata.h declares names that are neither strata's (strata_*, STRATA_*) nor DLPack's \
             (DL*, kDL*, DLPACK_*); a host's own names could collide with them. Make them pub(crate) or \
             move them out of the exported modules:\n  {}",
            bad.join("\n  ")
        );
    }
}

/// The pipeline (preprocessor, line filter, parser, rule) finds names of every kind added to a
/// copy of the header, and nothing else.
#[test]
fn header_check_finds_added_names_of_every_kind() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("strata.h");
    let text = std::fs::read_to_string(header()).unwrap();
    let guard_end = text.rfind("#endif").expect("the include guard's #endif");
    let added = "#define LEAK_MACRO 1\n#define LEAK_FN_MACRO(x) (x)\ntypedef int leak_t;\n\
                 struct leak_tag { int a; };\nenum { LEAK_CONST = 1 << 2, LEAK_CONST2 };\n\
                 int leak_function(const struct strata_table *t);\nextern int leak_variable;\n\
                 typedef void (*leak_fn_t)(int);\n";
    std::fs::write(&copy, format!("{}{added}{}", &text[..guard_end], &text[guard_end..])).unwrap();
    let before = declared_names(&header(), &[]);
    let after = declared_names(&copy, &[]);
    let new: BTreeSet<String> = after.difference(&before).map(|(k, n)| format!("{k} {n}")).collect();
    let want: BTreeSet<String> = [
        "macro LEAK_MACRO",
        "macro LEAK_FN_MACRO",
        "typedef leak_t",
        "tag leak_tag",
        "enum constant LEAK_CONST",
        "enum constant LEAK_CONST2",
        "function leak_function",
        "variable leak_variable",
        "typedef leak_fn_t",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(new, want);
    assert!(after.is_superset(&before));
    for w in &want {
        assert!(offending(&after).contains(w), "{w} not flagged");
    }
}

#[test]
fn declaration_parser_reads_every_form() {
    let src = r#"
        typedef struct { int a; } T_anon;
        typedef struct tag_s { struct inner_s { int x; } in; enum inner_e { IE_A, IE_B = 3 } e; } T_s;
        struct fwd_s;
        struct body_s { int y; unsigned flag : 1; };
        enum e_t { EA = 1 << 2, EB = (3), EC = sizeof(struct body_s) };
        typedef enum { TA, TB = 2U, } T_e;
        typedef unsigned long long T_int;
        typedef const char *(*T_fn)(void *user, int (*cb)(int q));
        typedef int T_arr[4], *T_ptr;
        enum c23_e : int { CE_A };
        int f_plain(void);
        const struct body_s *f_ptr(const char *name, int n) __attribute__((nonnull(1)));
        void (*v_fnptr)(int);
        extern const int v_int, v_arr[3];
        static inline int f_inline(int x) { return x + 1; }
        double v_init = 1.5e+3;
    "#;
    let d = parse_decls(src);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(d.typedefs, set(&["T_anon", "T_s", "T_e", "T_int", "T_fn", "T_arr", "T_ptr"]));
    assert_eq!(d.tags, set(&["tag_s", "inner_s", "inner_e", "fwd_s", "body_s", "e_t", "c23_e"]));
    assert_eq!(d.enum_constants, set(&["IE_A", "IE_B", "EA", "EB", "EC", "TA", "TB", "CE_A"]));
    assert_eq!(d.functions, set(&["f_plain", "f_ptr", "f_inline"]));
    assert_eq!(d.variables, set(&["v_fnptr", "v_int", "v_arr", "v_init"]));
}

// ---- the shared library ----------------------------------------------------------------------

/// The cdylib cargo built with this test (target/<profile>/deps/libstrata.so, beside the test
/// executable).
#[cfg(target_os = "linux")]
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libstrata.so");
    assert!(lib.exists(), "{} is missing: the crate's cdylib is built with the tests (crate-type cdylib)", lib.display());
    lib
}

/// `libstrata.so` exports exactly the functions the header declares, and no data symbols.
#[cfg(target_os = "linux")]
#[test]
fn exported_symbols_are_the_header_functions() {
    let lib = cdylib();
    let (mut text, mut data, mut other) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for line in run(Command::new("nm").args(["-D", "--defined-only"]).arg(&lib)).lines() {
        // `<address> <type> <name>[@[@]<version>]`
        let f: Vec<&str> = line.split_whitespace().collect();
        let (kind, name) = match f.as_slice() {
            [_, k, n] | [k, n] => (*k, n.split('@').next().unwrap().to_string()),
            _ => panic!("unexpected nm line {line:?}"),
        };
        match kind {
            "T" | "t" | "W" | "w" | "i" => text.insert(name),
            "D" | "d" | "B" | "b" | "R" | "r" | "V" | "v" | "G" | "g" | "S" | "s" | "u" => data.insert(name),
            "A" => false, // symbol-version definitions
            _ => other.insert(format!("{kind} {name}")),
        };
    }
    let decls = parse_decls(&preprocessed_own_lines(&header(), Lang::C11, &[]));
    assert!(decls.functions.len() > 20, "the header's functions: {:?}", decls.functions);
    let extra: Vec<_> = text.difference(&decls.functions).collect();
    let missing: Vec<_> = decls.functions.difference(&text).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{} exports functions the header does not declare: {extra:?}; the header declares functions it \
         does not export: {missing:?}",
        lib.display()
    );
    assert_eq!(data, decls.variables, "exported data symbols (the header declares these variables: {:?})", decls.variables);
    assert!(other.is_empty(), "exported symbols of unexpected kinds: {other:?}");
}

/// `libstrata.so` carries `SONAME libstrata.so.0.<minor>` while the version is 0.x (a minor
/// version may change the ABI), else `libstrata.so.<major>`.
#[cfg(target_os = "linux")]
#[test]
fn cdylib_has_a_versioned_soname() {
    let (major, minor) = (env!("CARGO_PKG_VERSION_MAJOR"), env!("CARGO_PKG_VERSION_MINOR"));
    let want = if major == "0" { format!("libstrata.so.0.{minor}") } else { format!("libstrata.so.{major}") };
    let dynamic = run(Command::new("readelf").arg("-d").arg(cdylib()));
    let soname =
        dynamic.lines().find(|l| l.contains("(SONAME)")).and_then(|l| l.split('[').nth(1)).map(|s| s.trim_end_matches(']').to_string());
    assert_eq!(soname.as_deref(), Some(want.as_str()), "readelf -d:\n{dynamic}");
}

// ---- symbol versions -------------------------------------------------------------------------

/// `libstrata.map`'s nodes in order: (node, the node it inherits, its functions).
fn version_nodes() -> Vec<(String, Option<String>, BTreeSet<String>)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("libstrata.map")).unwrap();
    // Drop /* comments */, then read `NAME { global: a; b; local: *; } PARENT;` blocks.
    let mut plain = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("/*") {
        plain.push_str(&rest[..start]);
        rest = &rest[start + rest[start..].find("*/").expect("unclosed comment in libstrata.map") + 2..];
    }
    plain.push_str(rest);
    let mut nodes = Vec::new();
    let mut rest = plain.as_str();
    while let Some(open) = rest.find('{') {
        let name = rest[..open].trim().to_string();
        let close = open + rest[open..].find('}').expect("unclosed node in libstrata.map");
        let body = &rest[open + 1..close];
        let after = &rest[close + 1..];
        let end = after.find(';').expect("a node ends with `;`");
        let parent = Some(after[..end].trim().to_string()).filter(|p| !p.is_empty());
        let mut functions = BTreeSet::new();
        let mut local = false;
        for item in body.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let item = match item.split_once(':') {
                Some((scope, name)) => {
                    local = scope.trim() == "local";
                    name.trim()
                }
                None => item,
            };
            if item.is_empty() {
                continue;
            }
            if local {
                assert_eq!(item, "*", "{name}: the only local pattern is `*`");
            } else {
                assert!(item.starts_with("strata_") && !item.contains('*'), "{name}: {item:?} is not a strata_ function name");
                functions.insert(item.to_string());
            }
        }
        nodes.push((name, parent, functions));
        rest = &after[end + 1..];
    }
    assert!(rest.trim().is_empty(), "libstrata.map ends with {rest:?}");
    nodes
}

#[test]
fn version_script_names_every_header_function_in_chained_nodes() {
    let nodes = version_nodes();
    assert!(nodes.len() >= 2, "{nodes:?}");
    assert_eq!(nodes[0].0, "STRATA_0.3");
    assert_eq!(nodes[0].1, None, "the first node inherits nothing");
    for pair in nodes.windows(2) {
        assert_eq!(pair[1].1.as_deref(), Some(pair[0].0.as_str()), "{} must inherit the node before it", pair[1].0);
    }
    // A function is in one node, or in several when a later release re-versioned it (an
    // initialiser whose struct grew keeps its old symbol at the old node: docs/releasing.md).
    let mut all = BTreeSet::new();
    for (name, _, functions) in &nodes {
        assert!(!functions.is_empty(), "{name} is empty");
        all.extend(functions.iter().cloned());
    }
    let decls = parse_decls(&preprocessed_own_lines(&header(), Lang::C11, &[]));
    let unversioned: Vec<_> = decls.functions.difference(&all).collect();
    let gone: Vec<_> = all.difference(&decls.functions).collect();
    assert!(unversioned.is_empty(), "header functions with no node in libstrata.map (add them to a new node): {unversioned:?}");
    assert!(gone.is_empty(), "libstrata.map names functions the header no longer declares: {gone:?}");
    // A released node never changes: STRATA_0.3 is 0.3.0's header.
    let frozen = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("abi").join("strata_0_3.h");
    let released = parse_decls(&preprocessed_own_lines(&frozen, Lang::C11, &[])).functions;
    assert_eq!(nodes[0].2, released, "STRATA_0.3 must list exactly the functions of tests/abi/strata_0_3.h");
}

/// `readelf --dyn-syms` shows every exported function at its node, as the default version
/// (`name@@NODE`) at the last node that names it and as an older version (`name@NODE`) at any
/// earlier one, and `readelf -V` the nodes' definitions with their parents.
#[cfg(target_os = "linux")]
#[test]
fn exported_functions_carry_their_version_nodes() {
    let lib = cdylib();
    // (name, version, is the default version)
    let mut got = BTreeSet::new();
    for line in run(Command::new("readelf").args(["--dyn-syms", "--wide"]).arg(&lib)).lines() {
        // `Num: Value Size Type Bind Vis Ndx Name`
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[3] != "FUNC" || f[6] == "UND" {
            continue;
        }
        let entry = match (f[7].split_once("@@"), f[7].split_once('@')) {
            (Some((name, version)), _) => (name.to_string(), version.to_string(), true),
            (None, Some((name, version))) => (name.to_string(), version.to_string(), false),
            _ => panic!("{} has no version: {line:?}", f[7]),
        };
        got.insert(entry);
    }
    let nodes = version_nodes();
    let mut want = BTreeSet::new();
    for (i, (node, _, functions)) in nodes.iter().enumerate() {
        for f in functions {
            let later = nodes[i + 1..].iter().any(|(_, _, fs)| fs.contains(f));
            want.insert((f.clone(), node.clone(), !later));
        }
    }
    assert_eq!(got, want, "exported functions and their versions ({})", lib.display());
    let defs = run(Command::new("readelf").arg("-V").arg(&lib));
    for (node, parent, _) in version_nodes() {
        let line = defs.lines().position(|l| l.contains("Name: ") && l.trim_end().ends_with(&format!("Name: {node}")));
        let line = line.unwrap_or_else(|| panic!("readelf -V defines no {node}:\n{defs}"));
        if let Some(parent) = parent {
            let next = defs.lines().nth(line + 1).unwrap_or_default();
            assert!(next.contains(&format!("Parent 1: {parent}")), "{node}'s parent is not {parent}:\n{defs}");
        }
    }
}
