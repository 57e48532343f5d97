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
    text.lines().filter(|l| !l.trim_start().starts_with("//")).map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
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

/// The graph with (`tests`) or without the unit tests' own references. A name the crate root
/// re-exports (`crate::Table`) counts as a use of the module it comes from.
fn graph_of(tests: bool) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let tree = Tree::of(&src);
    let root_exports: BTreeMap<String, String> = tree
        .exports
        .get(&Vec::<String>::new())
        .into_iter()
        .flatten()
        .filter_map(|(name, origin)| Some((name.clone(), origin.first()?.clone())))
        .collect();
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
            let r = root_exports.get(&r).cloned().unwrap_or(r);
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

/// The crate's module tree: every module (a path of names from the crate root; `[]` is the root)
/// with its file, and what each module re-exports (`pub use`, `pub(crate) use`): the name and
/// the absolute path it stands for.
struct Tree {
    modules: BTreeMap<Vec<String>, PathBuf>,
    exports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
}

impl Tree {
    fn of(src: &Path) -> Tree {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut modules = BTreeMap::new();
        for f in &files {
            modules.insert(module_path(src, f), f.clone());
        }
        let mut exports = BTreeMap::new();
        for (m, f) in &modules {
            let code = code_of(&std::fs::read_to_string(f).unwrap());
            let mut names = BTreeMap::new();
            for stmt in code.split(';') {
                let t = stmt.trim();
                let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use "].iter().find_map(|p| t.strip_prefix(p)) else {
                    continue;
                };
                for path in expand(rest) {
                    let (path, alias) = match path.split_once(" as ") {
                        Some((p, a)) => (p.trim().to_string(), a.trim().to_string()),
                        None => (path.clone(), path.rsplit("::").next().unwrap_or("").to_string()),
                    };
                    if let Some(abs) = absolute(m, &path, &modules) {
                        names.insert(alias, abs);
                    }
                }
            }
            exports.insert(m.clone(), names);
        }
        Tree { modules, exports }
    }

    /// The module a path names (absolute, as from [`absolute`]), following re-exports: the
    /// deepest module along it, or the module a re-exported name comes from.
    fn resolve(&self, path: &[String]) -> Vec<String> {
        let mut at: Vec<String> = Vec::new();
        for (i, seg) in path.iter().enumerate() {
            let mut next = at.clone();
            next.push(seg.clone());
            if self.modules.contains_key(&next) {
                at = next;
                continue;
            }
            if let Some(origin) = self.exports.get(&at).and_then(|e| e.get(seg))
                && origin.len() > at.len()
                && origin != path
            {
                let mut rest = origin.clone();
                rest.extend(path[i + 1..].iter().cloned());
                return self.resolve(&rest);
            }
            break;
        }
        at
    }
}

/// The module path of a file of `src/` (`model/plan.rs` -> `[model, plan]`, `model/mod.rs` ->
/// `[model]`, `lib.rs` -> `[]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_str().unwrap().to_string()).collect();
    let last = parts.pop().unwrap();
    if last != "mod.rs" && last != "lib.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The paths of a `use` tree or a path expression, groups expanded: `a::{b, c::{d, e}}` ->
/// `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(open) = tree.find('{') else { return vec![tree.trim().to_string()] };
    let prefix = tree[..open].trim().to_string();
    let mut depth = 0;
    let mut items = Vec::new();
    let mut start = open + 1;
    for (j, c) in tree.char_indices().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    items.push(tree[start..j].to_string());
                    break;
                }
            }
            ',' if depth == 1 => {
                items.push(tree[start..j].to_string());
                start = j + 1;
            }
            _ => {}
        }
    }
    items
        .into_iter()
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .flat_map(|i| {
            expand(&i)
                .into_iter()
                .map(|e| if e == "self" { prefix.trim_end_matches("::").to_string() } else { format!("{prefix}{e}") })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `path` as written in module `m` (`crate::a::b`, `super::a`, `self::a`, or a child's name
/// `a::b`), made absolute; `None` for paths outside the crate.
fn absolute(m: &[String], path: &str, modules: &BTreeMap<Vec<String>, PathBuf>) -> Option<Vec<String>> {
    let segs: Vec<String> = path.split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let mut at: Vec<String> = m.to_vec();
    let mut i = 0;
    match segs.first()?.as_str() {
        "crate" => {
            at.clear();
            i = 1;
        }
        "self" => i = 1,
        "super" => {
            while segs.get(i).is_some_and(|s| s == "super") {
                at.pop()?;
                i += 1;
            }
        }
        first => {
            // A child module of m (2018 paths); anything else is another crate.
            let mut child = m.to_vec();
            child.push(first.to_string());
            if !modules.contains_key(&child) {
                return None;
            }
        }
    }
    at.extend(segs[i..].iter().cloned());
    Some(at)
}

/// Every path a module's code names (`crate::...`, `super::...`, `self::...`, `use` of a child),
/// groups expanded.
fn paths_in(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for key in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(key) {
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':') {
                continue;
            }
            // The path runs to the first character that cannot continue it (a group is kept
            // whole, to its closing brace).
            let mut depth = 0;
            let mut end = i;
            for (j, c) in code[i..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    c if depth > 0 || c.is_alphanumeric() || c == '_' || c == ':' => {}
                    _ if depth > 0 => {}
                    _ => {
                        end = i + j;
                        break;
                    }
                }
                end = i + j + c.len_utf8();
            }
            out.extend(expand(code[i..end].trim_end_matches(':')));
        }
    }
    // `use child::...` inside a module (2018 paths relative to the module).
    for stmt in code.split(';') {
        let t = stmt.trim_start();
        let t = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "].iter().find_map(|p| t.strip_prefix(p));
        if let Some(rest) = t {
            let rest = rest.trim();
            if !rest.starts_with("crate::") && !rest.starts_with("super::") && !rest.starts_with("self::") {
                out.extend(expand(rest));
            }
        }
    }
    out
}

/// Inside every folder of `src/`, its children (files and subfolders) form no cycle: for each
/// folder, an edge from child `a` to child `b` when code in `a` names something in `b`, directly
/// or through a re-export (the folder's `mod.rs` re-exporting `b`'s names counts as `b`).
#[test]
fn modules_inside_each_folder_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let tree = Tree::of(&src);
    let mut cycles = Vec::new();
    let folders: BTreeSet<Vec<String>> =
        tree.modules.keys().filter(|m| tree.modules.keys().any(|c| c.len() == m.len() + 1 && c.starts_with(m))).cloned().collect();
    for folder in &folders {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, f) in &tree.modules {
            if m.len() <= folder.len() || !m.starts_with(folder) || f.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let child = m[folder.len()].clone();
            let code = code_of(&std::fs::read_to_string(f).unwrap());
            let deps = g.entry(child.clone()).or_default();
            for p in paths_in(&code) {
                let Some(abs) = absolute(m, &p, &tree.modules) else { continue };
                let target = tree.resolve(&abs);
                if target.len() > folder.len() && target.starts_with(folder) && target[folder.len()] != child {
                    deps.insert(target[folder.len()].clone());
                }
            }
        }
        if let Some(c) = find_cycle(&g) {
            let name = if folder.is_empty() { "src".to_string() } else { format!("src/{}", folder.join("/")) };
            cycles.push(format!("{name}: {}", c.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "modules inside a folder form a cycle:\n{}", cycles.join("\n"));
}

#[test]
fn the_tree_follows_re_exports() {
    assert_eq!(expand("a::{b, c::{d, e as f}, self}"), ["a::b", "a::c::d", "a::c::e as f", "a"]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let tree = Tree::of(&src);
    let v = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    // crate::Table is table::Table (lib.rs re-exports it)
    assert_eq!(tree.resolve(&v("Table")), v("table"));
    assert_eq!(tree.resolve(&v("table::Table")), v("table"));
    // a name a folder re-exports from a child is that child's
    assert_eq!(tree.resolve(&v("model::Request")), v("model::request"));
    assert_eq!(absolute(&v("model::plan"), "super::Request", &tree.modules), Some(v("model::Request")));
}
