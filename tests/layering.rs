//! The source's layering, read from its `use` lines and paths: no import circle between any two
//! modules of src/, and each wing using only what sits below it (`RULES`, checked by `broken`):
//! host uses nothing of ours; the volume domain's rooms are used only downwards (state < space <
//! copies < the operations in volume/) and never reach up to the faces, the server, the admin API
//! or the cluster; the cluster wing's controller and node loops use only its kit, and not the
//! host; nothing below the faces uses them. Every room is named in docs/development.md's Layout.
//!
//! A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`). A module using its own ancestors
//! (`super::Volumes` from a child) is how Rust nests, not a circle, and is left out; lib.rs's own
//! items are the module `lib` (`ROOT`).

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
    // `super::Volumes` names the parent itself; `crate::VERSION` the root ("").
    let mut found = Some(base.join("::")).filter(|name| modules.contains(name));
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

/// lib.rs's own items (the generated `csi` and `admin_api`, the version constants) as a module
/// of their own: lib.rs is everyone's ancestor, yet what it holds is a real dependency.
const ROOT: &str = "lib";

/// `crate::VERSION`, not the bare `crate` of `use crate::{…}` read inline.
fn names_an_item(path: &str) -> bool {
    !matches!(path.rsplit("::").next(), Some("crate" | "super"))
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
                if used.is_empty() && names_an_item(&path) {
                    uses.insert(ROOT.to_string());
                    continue;
                }
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

/// A room (a module and all under it) that may use no module of the `forbidden` rooms ("" is
/// every module) except those of the `allowed` rooms and its own, and why.
type Rule = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static str,
);

/// Each wing uses only what sits below it: host < volume (state < space < copies) < faces <
/// server, admin, metrics; the cluster wing beside the faces, over the domain.
const RULES: &[Rule] = &[
    (
        "host",
        &[""],
        &[],
        "host is mechanics: it knows nothing of ours",
    ),
    (
        "volume::state",
        &["volume::space", "volume::copies"],
        &[],
        "state is the lowest room of the domain",
    ),
    (
        "volume::space",
        &["volume::copies"],
        &[],
        "space sits below copies",
    ),
    (
        "volume",
        &["cluster", "faces", "server", "admin"],
        &[],
        "the domain is called by the faces, the admin API and the cluster, never calls them",
    ),
    (
        "class",
        &["faces"],
        &[],
        "the faces read classes, not the other way",
    ),
    (
        "cluster",
        &["faces"],
        &[],
        "the faces sit beside the cluster: what both need lives below them (volume, class)",
    ),
    (
        "cluster::controller",
        &["host"],
        &[],
        "the controller reaches the host only through volume",
    ),
    (
        "cluster::node",
        &["host"],
        &[],
        "a node's loops reach the host only through volume",
    ),
    (
        "cluster::kit",
        &["cluster"],
        &[],
        "kit is what controller and node share: nothing of theirs",
    ),
    (
        "cluster::controller",
        &["cluster"],
        &["cluster::kit"],
        "of the cluster wing, the controller uses only kit (loops and orphans use it)",
    ),
    (
        "cluster::node",
        &["cluster"],
        &["cluster::kit"],
        "of the cluster wing, a node's loops use only kit (loops and orphans use them)",
    ),
];

/// Uses the rules forbid that are right anyway: (module, used, why).
type Exception = (&'static str, &'static str, &'static str);

const EXCEPTIONS: &[Exception] = &[(
    "host::archive",
    ROOT,
    "crate::LONG_VERSION: the release named in the error for a too-new export format",
)];

/// `module` is `room` or under it ("" holds everything).
fn within(module: &str, room: &str) -> bool {
    room.is_empty() || module == room || module.starts_with(&format!("{room}::"))
}

/// Every use in `graph` a rule forbids and no exception allows, with the rule's why.
fn broken(graph: &Graph, rules: &[Rule], exceptions: &[Exception]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (module, uses) in graph {
        for (room, forbidden, allowed, why) in rules.iter().filter(|r| within(module, r.0)) {
            for used in uses {
                let barred = !within(used, room)
                    && forbidden.iter().any(|f| within(used, f))
                    && !allowed.iter().any(|a| within(used, a));
                let excused = exceptions.iter().any(|(m, u, _)| m == module && u == used);
                if barred && !excused {
                    wrong.push(format!("{module} uses {used}: {why}"));
                }
            }
        }
    }
    wrong
}

#[test]
fn every_room_uses_only_what_the_rules_allow() {
    assert_eq!(broken(&graph(), RULES, EXCEPTIONS), Vec::<String>::new());
}

/// A rule naming a room that is gone guards nothing (the old list named `request`, `driver`…,
/// moved under faces/ by issue 40); an exception no longer needed is dropped.
#[test]
fn the_rules_name_rooms_that_exist() {
    let graph = graph();
    let exists = |room: &str| room.is_empty() || graph.keys().any(|m| within(m, room));
    let mut missing = Vec::new();
    for (room, forbidden, allowed, _) in RULES {
        let named = [room].into_iter().chain(*forbidden).chain(*allowed);
        missing.extend(named.filter(|r| !exists(r)).map(|r| r.to_string()));
    }
    for (module, used, _) in EXCEPTIONS {
        if !graph.get(*module).is_some_and(|uses| uses.contains(*used)) {
            missing.push(format!("exception {module} uses {used}"));
        }
    }
    assert_eq!(missing, Vec::<String>::new());
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
    // A path naming an item of a module names that module, the root's items included.
    let modules: BTreeSet<String> = ["", "volume", "volume::state", "volume::state::store"]
        .map(String::from)
        .into();
    let from = "volume::state::store";
    let volume = target(&modules, from, "super::super::Volumes");
    assert_eq!(volume.as_deref(), Some("volume"));
    assert_eq!(
        target(&modules, from, "crate::VERSION").as_deref(),
        Some("")
    );
    assert!(names_an_item("crate::VERSION") && !names_an_item("crate"));
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

/// A hand-made graph of `(module, used)` arrows.
fn graph_of(arrows: &[(&str, &str)]) -> Graph {
    let mut graph = Graph::new();
    for (module, used) in arrows {
        graph
            .entry(module.to_string())
            .or_default()
            .insert(used.to_string());
    }
    graph
}

/// The arrows of `graph_of(arrows)` that `RULES` forbid, as "module uses used".
fn forbidden_arrows(arrows: &[(&str, &str)], exceptions: &[Exception]) -> Vec<String> {
    let wrong = broken(&graph_of(arrows), RULES, exceptions);
    wrong
        .iter()
        .map(|w| w.split(": ").next().unwrap_or(w).to_string())
        .collect()
}

#[test]
fn host_using_anything_of_ours_outside_host_is_named() {
    let arrows = [
        ("host::copy", "host::tree"),
        ("host::mount", "error"),
        ("host::archive::export", "volume::state"),
        ("host::archive", ROOT),
    ];
    let named = forbidden_arrows(&arrows, &[]);
    assert_eq!(named.len(), 3, "{named:?}");
    assert!(named.iter().any(|n| n == "host::mount uses error"));
    assert!(named.iter().any(|n| n == "host::archive uses lib"));
    // The listed exception, and only it, is let through.
    assert_eq!(forbidden_arrows(&arrows, EXCEPTIONS).len(), 2);
}

#[test]
fn the_domain_using_what_sits_above_it_is_named() {
    let arrows = [
        ("volume::create", "host::mount"),
        ("volume::copies::cow", "volume::space::pool"),
        ("volume::publish", "faces::request"),
        ("volume::state::store", "cluster::kit::names"),
        ("volume::stats", "server"),
        ("volume", "admin::service"),
        ("volume::state::journal", "volume::copies"),
    ];
    let named = forbidden_arrows(&arrows, &[]);
    assert_eq!(
        named,
        [
            "volume uses admin::service",
            "volume::publish uses faces::request",
            "volume::state::journal uses volume::copies",
            "volume::state::store uses cluster::kit::names",
            "volume::stats uses server",
        ]
    );
}

#[test]
fn the_cluster_loops_reaching_the_host_are_named() {
    let arrows = [
        ("cluster::controller::placement::run", "host::mount"),
        ("cluster::node::overflow", "host"),
        ("cluster::node::overflow", "volume::overflow"),
        ("cluster::controller", "volume"),
    ];
    assert_eq!(
        forbidden_arrows(&arrows, &[]),
        [
            "cluster::controller::placement::run uses host::mount",
            "cluster::node::overflow uses host",
        ]
    );
}

#[test]
fn an_arrow_up_or_sideways_inside_the_cluster_is_named() {
    let arrows = [
        ("cluster::kit::client", "cluster::node"),
        (
            "cluster::controller::class_check",
            "cluster::node::overflow",
        ),
        ("cluster::node::project_audit", "cluster::loops"),
        ("cluster::controller::nodeloss::view", "cluster::orphans"),
        ("cluster::node::nodeloss::report", "cluster::controller"),
        // Allowed: kit from below, a room's own modules, loops and orphans from above.
        ("cluster::node::overflow", "cluster::kit::task"),
        (
            "cluster::controller::nodeloss::view",
            "cluster::controller::nodeloss::decide",
        ),
        ("cluster::loops", "cluster::node::overflow"),
        ("cluster::orphans", "cluster::controller::nodeloss::view"),
    ];
    assert_eq!(
        forbidden_arrows(&arrows, &[]),
        [
            "cluster::controller::class_check uses cluster::node::overflow",
            "cluster::controller::nodeloss::view uses cluster::orphans",
            "cluster::kit::client uses cluster::node",
            "cluster::node::nodeloss::report uses cluster::controller",
            "cluster::node::project_audit uses cluster::loops",
        ]
    );
}

#[test]
fn a_face_used_from_below_is_named() {
    let arrows = [
        ("class", "faces::request"),
        ("cluster::kit::slim", "faces::driver"),
        ("host::fsstat", "faces::node"),
        ("volume::capability", "faces::request"),
        // Allowed: what sits above the faces.
        ("server", "faces::driver"),
        ("admin::service", "faces::driver"),
        ("metrics::http", "faces::driver"),
    ];
    assert_eq!(
        forbidden_arrows(&arrows, &[]),
        [
            "class uses faces::request",
            "cluster::kit::slim uses faces::driver",
            "host::fsstat uses faces::node",
            "volume::capability uses faces::request",
        ]
    );
}

/// The rooms of src/ as the docs write them: `admin/`, `cluster/kit/`, `cli.rs`.
fn rooms(src: &Path) -> Vec<String> {
    let mut rooms = Vec::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            rooms.push(format!("{name}/"));
        } else if name.ends_with(".rs") {
            rooms.push(name);
        }
    }
    // The cluster wing's rooms are told apart in the docs too.
    rooms.extend(["cluster/controller/", "cluster/node/", "cluster/kit/"].map(String::from));
    rooms.sort();
    rooms
}

/// The text of docs/development.md's "Layout" section.
fn layout_of(doc: &str) -> &str {
    let start = doc.find("\n## Layout").expect("a Layout section");
    let rest = &doc[start + 1..];
    rest.find("\n## ").map_or(rest, |end| &rest[..end])
}

/// The rooms `layout` does not name: as `src/…`, or (a sub-room) on an indented line of its own
/// as the volume's rooms are.
fn unnamed(layout: &str, rooms: &[String]) -> Vec<String> {
    let named = |room: &str| {
        let last = room
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(room);
        layout.contains(&format!("src/{room}"))
            || (room.matches('/').count() > 1
                && layout
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{last}/"))))
    };
    rooms.iter().filter(|r| !named(r)).cloned().collect()
}

#[test]
fn every_room_is_named_in_the_layout_docs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("docs/development.md")).unwrap();
    let rooms = rooms(&root.join("src"));
    assert!(rooms.contains(&"volume/".to_string()), "{rooms:?}");
    assert_eq!(unnamed(layout_of(&doc), &rooms), Vec::<String>::new());
}

#[test]
fn a_room_missing_from_the_layout_is_named() {
    let doc = "# Dev\n## Layout\nsrc/host/  mounts\nsrc/cluster/  the API\n  kit/  shared\n\
               src/cli.rs  flags\n## Next\nsrc/error.rs\n";
    let rooms = [
        "cli.rs",
        "cluster/",
        "cluster/kit/",
        "cluster/node/",
        "error.rs",
        "host/",
    ];
    let rooms: Vec<String> = rooms.map(String::from).to_vec();
    assert_eq!(
        unnamed(layout_of(doc), &rooms),
        ["cluster/node/", "error.rs"]
    );
}

/// Loose files at the top of src/ are where rooms go missing: past this, make a room.
const MOST_LOOSE_FILES: usize = 12;

/// The loose files, if there are more than `most`.
fn too_many_loose(rooms: &[String], most: usize) -> Option<Vec<String>> {
    let loose: Vec<String> = rooms
        .iter()
        .filter(|r| r.ends_with(".rs"))
        .cloned()
        .collect();
    (loose.len() > most).then_some(loose)
}

#[test]
fn src_has_few_loose_files() {
    let rooms = rooms(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert_eq!(too_many_loose(&rooms, MOST_LOOSE_FILES), None);
}

#[test]
fn one_loose_file_too_many_is_named() {
    let mut rooms: Vec<String> = (0..MOST_LOOSE_FILES).map(|i| format!("f{i}.rs")).collect();
    rooms.push("host/".into());
    assert_eq!(too_many_loose(&rooms, MOST_LOOSE_FILES), None);
    rooms.push("one_more.rs".into());
    assert_eq!(
        too_many_loose(&rooms, MOST_LOOSE_FILES).map(|l| l.len()),
        Some(13)
    );
}
