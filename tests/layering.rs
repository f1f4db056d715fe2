//! The source's layering, read from its `use` lines and paths: no import circle between any two
//! modules of src/, and the volume domain's rooms used only downwards (state < space < copies <
//! the operations in volume/), never reaching up to the gRPC faces or the server.
//!
//! A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`). A module using its own ancestors
//! (`super::Volumes` from a child) is how Rust nests, not a circle, and is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `volume/state/mod.rs` → "volume::state"; lib.rs → "" (the crate root).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts.join("::")
}

/// The source without comments, string literals and its `#[cfg(test)] mod tests` (tests may
/// reach anywhere).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut code = String::with_capacity(text.len());
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut in_string = false;
        for c in line.chars() {
            match c {
                '"' => in_string = !in_string,
                _ if in_string => {}
                _ => code.push(c),
            }
        }
        code.push('\n');
    }
    code
}

/// Every path beginning with `crate::` or `super::` in `code`, with `use` trees expanded
/// (`use super::{a, b::c}` gives `super::a` and `super::b::c`).
fn paths_in(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let (before, from) = rest.split_at(at);
        let starts_word = before
            .chars()
            .last()
            .is_none_or(|c| !c.is_alphanumeric() && c != '_');
        let end = from.find(';').unwrap_or(from.len());
        if starts_word {
            let tree: String = from[4..end]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            expand("", &tree, &mut paths);
        }
        rest = &from[end.min(from.len())..];
        if rest.is_empty() {
            break;
        }
        rest = &rest[1..];
    }
    // Paths written inline, e.g. `crate::host::tree::beyond_limit(…)`.
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let begin = from + at;
            let end = code[begin..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |n| begin + n);
            // `pub(in crate::volume)` names a scope, not a use.
            if !code[..begin].ends_with("in ") {
                paths.push(code[begin..end].trim_end_matches(':').to_string());
            }
            from = end;
        }
    }
    paths
}

fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let Some(open) = tree.find('{') else {
        let leaf = tree.split(" as ").next().unwrap_or(tree);
        out.push(format!("{prefix}{leaf}"));
        return;
    };
    let head = &tree[..open];
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    let mut parts = Vec::new();
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        if part == "self" {
            out.push(format!("{prefix}{}", head.trim_end_matches(':')));
        } else {
            expand(&format!("{prefix}{head}"), part, out);
        }
    }
}

/// The longest module `path` names, seen from `module`.
fn target(modules: &BTreeSet<String>, module: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = match parts.first() {
        Some(&"crate") => Vec::new(),
        Some(&"super") => {
            let mut base: Vec<&str> = module.split("::").filter(|p| !p.is_empty()).collect();
            while parts.first() == Some(&"super") {
                base.pop();
                parts.remove(0);
            }
            parts.insert(0, "super");
            base
        }
        _ => return None,
    };
    let mut found = None;
    for part in &parts[1..] {
        base.push(part);
        let name = base.join("::");
        if modules.contains(&name) {
            found = Some(name);
        } else {
            break;
        }
    }
    found
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // The benchmark binary is a crate of its own (src/bench/main.rs), with its own `crate`.
    files.retain(|f| !f.starts_with(src.join("bench")) && !f.ends_with("main.rs"));
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let module = module_of(&src, file);
        let code = code_of(&fs::read_to_string(file).unwrap());
        let uses = graph.entry(module.clone()).or_default();
        for path in paths_in(&code) {
            if let Some(used) = target(&modules, &module, &path) {
                let ancestor =
                    module == used || used.is_empty() || module.starts_with(&format!("{used}::"));
                if !ancestor {
                    uses.insert(used);
                }
            }
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = graph();
    assert!(
        graph.contains_key("volume::state::journal") && graph["volume"].contains("config"),
        "the source was not read as expected: {graph:#?}"
    );
    assert_eq!(circles(&graph), Vec::<Vec<String>>::new());
}

#[test]
fn the_volume_rooms_are_used_downwards_only() {
    let graph = graph();
    // What each room may not use: the rooms above it, and the layers above the domain.
    let above_the_domain = [
        "request",
        "driver",
        "controller",
        "node",
        "identity",
        "server",
    ];
    let rules: [(&str, &[&str]); 3] = [
        ("volume::state", &["volume::space", "volume::copies"]),
        ("volume::space", &["volume::copies"]),
        ("volume::copies", &[]),
    ];
    let mut wrong = Vec::new();
    for (module, uses) in &graph {
        if !module.starts_with("volume") {
            continue;
        }
        for used in uses {
            let upper_room = rules.iter().any(|(room, forbidden)| {
                (module == room || module.starts_with(&format!("{room}::")))
                    && forbidden
                        .iter()
                        .any(|f| used == f || used.starts_with(&format!("{f}::")))
            });
            let upper_layer = above_the_domain
                .iter()
                .any(|f| used == f || used.starts_with(&format!("{f}::")));
            if upper_room || upper_layer {
                wrong.push(format!("{module} uses {used}"));
            }
        }
    }
    assert_eq!(wrong, Vec::<String>::new());
}

/// `state` and `space` use nothing of the level above them, not even `Volumes` (which a
/// module may name as its ancestor's, and which the graph leaves out for that reason).
#[test]
fn the_lower_rooms_do_not_use_the_volumes_above_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("volume"), &mut files);
    let mut all = Vec::new();
    rust_files(&src, &mut all);
    let modules: BTreeSet<String> = all.iter().map(|f| module_of(&src, f)).collect();
    let mut wrong = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        if !(module.starts_with("volume::state") || module.starts_with("volume::space")) {
            continue;
        }
        let code = code_of(&fs::read_to_string(file).unwrap());
        for path in paths_in(&code) {
            if target(&modules, &module, &path).as_deref() == Some("volume") {
                wrong.push(format!("{module}: {path}"));
            }
        }
    }
    assert_eq!(wrong, Vec::<String>::new());
}

#[test]
fn a_circle_is_seen_when_there_is_one() {
    // The reader itself: two modules that use each other are one circle.
    let mut graph = Graph::new();
    graph.insert("a".into(), ["b".to_string()].into());
    graph.insert("b".into(), ["a".to_string()].into());
    graph.insert("c".into(), ["a".to_string()].into());
    assert_eq!(circles(&graph), [["a".to_string(), "b".to_string()]]);
    let code = code_of("use super::{x, y::{z, self}};\nfn f() { crate::host::tree::f(); }\n");
    let paths = paths_in(&code);
    for expected in [
        "super::x",
        "super::y::z",
        "super::y",
        "crate::host::tree::f",
    ] {
        assert!(
            paths.iter().any(|p| p == expected),
            "{expected} in {paths:?}"
        );
    }
}
