//! The crate's layers: builds the graph of top-level modules from the `crate::` paths in
//! `src/` and fails on any cycle, and on any edge that points up the layer order that
//! `src/lib.rs` documents. The unit tests (`#[cfg(test)] mod ...` and `tests.rs` files) are held
//! to the same order: a test that needs a higher layer to build what it checks belongs to that
//! layer's tests (as the tiered table's race tests live with the server's).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first; a module may use modules of its own layer or lower ones (without
/// cycles). Must list every top-level module of `src/`.
const LAYERS: &[&[&str]] = &[
    &["error", "limits", "util", "dlpack"],
    &["kernels"],
    &["storage"],
    &["model"],
    &["exec"],
    &["table", "partition", "dist", "config", "server"],
    &["ffi"],
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for lib.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// The code of a file without comments and without its test module.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") && lines.peek().is_some_and(|n| n.trim_start().starts_with("mod ")) {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The whole file without comments, test modules included.
fn comments_out(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::name` the code refers to, including `use crate::{a, b::c}` groups.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        refs.insert(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
                if depth == 0 {
                    refs.insert(ident(group[start..j].trim()));
                    break;
                }
            }
        } else {
            refs.insert(ident(rest));
        }
    }
    refs.retain(|r| !r.is_empty());
    refs
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    graph_of(false)
}

/// The graph with (`tests`) or without the unit tests' own references.
fn graph_of(tests: bool) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        if !tests && f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let Some(m) = module_of(&src, &f) else { continue };
        let text = std::fs::read_to_string(&f).unwrap();
        let code = if tests { comments_out(&text) } else { code_of(&text) };
        let deps = g.entry(m.clone()).or_default();
        for r in crate_refs(&code) {
            if r != m {
                deps.insert(r);
            }
        }
    }
    g
}

/// A cycle through the graph, if there is one, as the modules along it.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            match state.get(d.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| s == d).unwrap();
                    let mut c = stack[from..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                0 if g.contains_key(d.as_str()) => {
                    if let Some(c) = visit(d, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, g, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_finder_finds_what_it_should() {
    let code = code_of(
        "use crate::a::B;\nuse crate::{c::D, e};\n// use crate::commented;\nfn f() { crate::g::h(); }\n#[cfg(test)]\nmod tests { use crate::t; }\n",
    );
    let refs: Vec<String> = crate_refs(&code).into_iter().collect();
    assert_eq!(refs, ["a", "c", "e", "g"]);
    // With the unit tests: the test module's reference counts, the comment's does not.
    let with_tests = "use crate::a::B;\n// use crate::commented;\n#[cfg(test)]\nmod tests { use crate::t; } // crate::c\n";
    let refs: Vec<String> = crate_refs(&comments_out(with_tests)).into_iter().collect();
    assert_eq!(refs, ["a", "t"]);
    let mut g = BTreeMap::new();
    g.insert("x".to_string(), BTreeSet::from(["y".to_string()]));
    g.insert("y".to_string(), BTreeSet::from(["z".to_string()]));
    g.insert("z".to_string(), BTreeSet::from(["x".to_string()]));
    assert_eq!(find_cycle(&g), Some(vec!["x".into(), "y".into(), "z".into(), "x".into()]));
    g.get_mut("z").unwrap().clear();
    assert_eq!(find_cycle(&g), None);
}

#[test]
fn top_level_modules_form_no_cycle() {
    let g = graph();
    if let Some(c) = find_cycle(&g) {
        panic!("the modules form a cycle: {}\nthe graph: {g:#?}", c.join(" -> "));
    }
}

#[test]
fn every_module_uses_only_its_layer_and_those_below() {
    layers_hold(&graph());
}

#[test]
fn unit_tests_use_only_their_layer_and_those_below() {
    layers_hold(&graph_of(true));
}

fn layers_hold(g: &BTreeMap<String, BTreeSet<String>>) {
    let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let mut wrong = Vec::new();
    for (m, deps) in g {
        let Some(lm) = layer(m) else {
            wrong.push(format!("{m} is in no layer of LAYERS (tests/layers.rs)"));
            continue;
        };
        for d in deps {
            match layer(d) {
                Some(ld) if ld <= lm => {}
                Some(_) => wrong.push(format!("{m} (layer {lm}) uses {d}, a higher layer")),
                None if g.contains_key(d) => wrong.push(format!("{d} is in no layer")),
                None => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
