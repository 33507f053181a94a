//! No crate of the workspace has an import circle between its files: each
//! file (module) may use the ones below it, never one that uses it back.
//! Cargo already keeps the crates themselves in layers (ARCHITECTURE.md's
//! map); this test keeps the files inside each crate the same way.
//!
//! Read from the source text, test code left out (`#[cfg(test)]` items):
//! every `crate::`, `super::` and `self::` path and `use` tree, and every
//! path through a child module (`child::item`). A module and one child of
//! it using each other is allowed (a parent declaring its child and the
//! child using the parent's types is how Rust modules are written).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;
type Graph = BTreeMap<Module, BTreeSet<Module>>;

/// The text without comments, string contents and `#[cfg(test)]` items.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if text[i..].starts_with("//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with("/*") {
            i += text[i..].find("*/").map_or(b.len() - i, |e| e + 2);
        } else if let Some(hashes) = raw_string_at(&text[i..]) {
            // r"...", r#"..."#: up to the quote followed by as many #s.
            let close = format!("\"{}", "#".repeat(hashes));
            let body = i + 2 + hashes;
            i = text[body..]
                .find(&close)
                .map_or(b.len(), |e| body + e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' && !text[..i].ends_with('\'') {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if text[i..].starts_with("#[cfg(test)]") {
            // Skip the item: up to its `;` or its matching `}`.
            let mut j = i + "#[cfg(test)]".len();
            while j < b.len() && b[j] != b';' && b[j] != b'{' {
                j += 1;
            }
            if j < b.len() && b[j] == b'{' {
                let mut depth = 0;
                while j < b.len() {
                    depth += (b[j] == b'{') as i32 - (b[j] == b'}') as i32;
                    if depth == 0 {
                        break;
                    }
                    j += 1;
                }
            }
            i = j + 1;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The number of `#`s of a raw string starting here (`r"`, `r#"`, ...).
fn raw_string_at(s: &str) -> Option<usize> {
    let rest = s.strip_prefix('r')?;
    let hashes = rest.len() - rest.trim_start_matches('#').len();
    rest[hashes..].starts_with('"').then_some(hashes)
}

/// `a::{b, c::{d, self}}` → `a::b`, `a::c::d`, `a::c`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("").replace(' ', "");
        return vec![path];
    };
    let prefix = &tree[..open];
    let close = tree.rfind('}').filter(|c| *c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for ch in inner.chars() {
        depth += (ch == '{') as i32 - (ch == '}') as i32;
        if ch == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    parts.push(cur);
    let mut out = Vec::new();
    for part in parts.iter().filter(|p| !p.trim().is_empty()) {
        for e in expand(part) {
            if e == "self" {
                out.push(prefix.trim_end_matches("::").trim().to_string());
            } else {
                out.push(format!("{}{e}", prefix.trim()));
            }
        }
    }
    out
}

fn ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path starting with `crate`, `super` or `self` the code names.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `use` trees (their braces hold several paths).
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before_ok = !rest[..i].ends_with(ident);
        rest = &rest[i + 4..];
        if before_ok && let Some(end) = rest.find(';') {
            out.extend(expand(&rest[..end]));
        }
    }
    // Paths in code.
    for root in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(root) {
            if code[..i].ends_with(|c: char| ident(c) || c == ':') {
                continue;
            }
            let path: String = code[i..]
                .chars()
                .take_while(|c| ident(*c) || *c == ':')
                .collect();
            out.push(path);
        }
    }
    out
}

/// The modules of the crate whose sources are under `src`.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut m: Module = rel
                    .iter()
                    .map(|s| s.to_string_lossy().into_owned())
                    .collect();
                if m.last().is_some_and(|l| l == "mod") {
                    m.pop();
                }
                if m == ["lib"] || m == ["main"] {
                    m.clear();
                }
                out.entry(m).or_insert(p);
            }
        }
    }
    out
}

/// File → the files of the same crate its (non-test) code uses.
fn graph(src: &Path) -> Graph {
    let mods = modules(src);
    let mut g = Graph::new();
    for (m, file) in &mods {
        let code = strip(&std::fs::read_to_string(file).unwrap());
        let uses = g.entry(m.clone()).or_default();
        // A child named in a path (`child::item`).
        for c in mods.keys() {
            if c.len() == m.len() + 1 && c.starts_with(m) {
                let name = format!("{}::", c[m.len()]);
                let named = code
                    .match_indices(&name)
                    .any(|(i, _)| !code[..i].ends_with(|ch: char| ident(ch) || ch == ':'));
                if named {
                    uses.insert(c.clone());
                }
            }
        }
        // A nested module named from the crate's top (`workload::fio::x`
        // where `workload` was imported).
        for c in mods.keys().filter(|c| c.len() >= 2 && *c != m) {
            let name = format!("{}::", c.join("::"));
            let named = code
                .match_indices(&name)
                .any(|(i, _)| !code[..i].ends_with(|ch: char| ident(ch) || ch == ':'));
            if named {
                uses.insert(c.clone());
            }
        }
        for path in paths(&code) {
            let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            let full: Vec<String> = match segs.first() {
                Some(&"crate") => segs[1..].iter().map(|s| s.to_string()).collect(),
                Some(&"super") | Some(&"self") => {
                    let mut cur = m.clone();
                    let mut k = 0;
                    while k < segs.len() && (segs[k] == "super" || segs[k] == "self") {
                        if segs[k] == "super" {
                            cur.pop();
                        }
                        k += 1;
                    }
                    cur.extend(segs[k..].iter().map(|s| s.to_string()));
                    cur
                }
                _ => continue,
            };
            // The longest prefix that is a module of the crate.
            let target = (0..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|p| mods.contains_key(p));
            if let Some(t) = target
                && &t != m
                && !t.is_empty()
            {
                uses.insert(t);
            }
        }
    }
    g
}

/// The strongly connected components with more than one file (Tarjan).
fn circles(g: &Graph) -> Vec<Vec<Module>> {
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = s.g.get_key_value(w).map_or(w, |(k, _)| k);
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    // A module and one child of it using each other is allowed.
    s.out
        .into_iter()
        .filter(|c| !(c.len() == 2 && (c[0].len() + 1 == c[1].len() && c[1].starts_with(&c[0]))))
        .collect()
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "(root)".into()
    } else {
        m.join("::")
    }
}

/// The `src` directories of the workspace's crates.
fn crates() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let file = p.file_name().unwrap().to_string_lossy().into_owned();
            if !p.is_dir()
                || file.starts_with('.')
                || ["target", "runs", "pgfleet-data"].contains(&file.as_str())
            {
                continue;
            }
            if file == "src" && d.join("Cargo.toml").exists() {
                out.push(p);
            } else {
                dirs.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_crate_has_an_import_circle_between_its_files() {
    let crates = crates();
    let names: Vec<String> = crates
        .iter()
        .map(|c| c.parent().unwrap().display().to_string())
        .collect();
    // Every crate of the workspace is read (the proto, the agent, the
    // controller's binary and its five crates).
    assert!(crates.len() >= 8, "read {names:?}");
    let mut found = Vec::new();
    for src in &crates {
        let g = graph(src);
        for c in circles(&g) {
            let names: Vec<String> = c.iter().map(name).collect();
            found.push(format!(
                "{}: {}",
                src.parent().unwrap().display(),
                names.join(", ")
            ));
        }
    }
    assert!(
        found.is_empty(),
        "files that use each other (move what both need into a module below them, \
         or hand it in as a parameter):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_sees_what_is_there() {
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("server/src");
    let g = graph(&server);
    let m = |s: &str| -> Module { s.split("::").map(String::from).collect() };
    // `use crate::{a, b}`, `crate::a::b` in code, `super::` and children.
    assert!(
        g[&m("scheduler")].contains(&m("writer")),
        "{:?}",
        g[&m("scheduler")]
    );
    assert!(g[&m("http")].contains(&m("queue")));
    assert!(g[&m("scheduler")].contains(&m("scheduler::ui")));
    assert!(g[&m("runner")].contains(&m("scheduler")));
}

#[test]
fn a_circle_is_found_and_a_parent_with_its_child_is_not_one() {
    let m = |s: &str| -> Module {
        s.split("::")
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect()
    };
    let mut g = Graph::new();
    for (from, to) in [
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("d", "a"),
        ("p", "p::c"),
        ("p::c", "p"),
    ] {
        g.entry(m(from)).or_default().insert(m(to));
        g.entry(m(to)).or_default();
    }
    assert_eq!(circles(&g), vec![vec![m("a"), m("b"), m("c")]]);
    assert_eq!(
        expand("crate::{a, b::{c, self}, d as e}"),
        ["crate::a", "crate::b::c", "crate::b", "crate::d"]
    );
    let code = strip(
        "use crate::x; // crate::y\n let s = \"crate::z\";\n#[cfg(test)]\nmod tests { use crate::w; }",
    );
    assert_eq!(paths(&code), ["crate::x", "crate::x"]);
}

/// The agent's layers, top first, as ARCHITECTURE.md's map states them:
/// a file may use files of its own layer and the layers below it, never
/// one above. Every top-level module must be placed here (a new one
/// too: say where it sits, here and in ARCHITECTURE.md).
const AGENT_LAYERS: &[&[&str]] = &[
    &["session"],
    &["cell"],
    &["workload"],
    &["direct"],
    &["keep", "dataset", "hydrate", "remote"],
    &[
        "cluster",
        "driver",
        "sampler",
        "sandbox",
        "assign",
        "metrics",
        "pgbin",
        "host",
        "blocking",
        "failpoint",
        "pglz",
    ],
];

/// Inside `workload/`, what every kind may use besides itself: the
/// dispatch (`mod.rs`), the context and the shared steps. A kind uses no
/// other kind; outside `workload/`, only the dispatch and the context are
/// used (the kinds are reached through `workload::run`, `load`, `probe_storage`).
const WORKLOAD_SHARED: &[&str] = &[
    "context",
    "drive",
    "pgbench_init",
    "fault",
    "ledger",
    "documents",
];

/// What of `g` goes against `layers` and the workload rules.
fn against_layers(g: &Graph, layers: &[&[&str]], shared: &[&str]) -> Vec<String> {
    let layer = |m: &Module| -> Option<usize> {
        let top = m.first()?;
        layers.iter().position(|l| l.contains(&top.as_str()))
    };
    let mut out = Vec::new();
    for (from, tos) in g {
        if from.is_empty() {
            continue;
        }
        let Some(lf) = layer(from) else {
            out.push(format!("{}: in no layer", name(from)));
            continue;
        };
        for to in tos {
            let Some(lt) = layer(to) else { continue };
            if lt < lf {
                out.push(format!(
                    "{} uses {}, a layer above it",
                    name(from),
                    name(to)
                ));
            }
            let kind = |m: &Module| -> Option<String> {
                (m.len() >= 2 && m[0] == "workload" && !shared.contains(&m[1].as_str()))
                    .then(|| m[1].clone())
            };
            match (from.first().map(String::as_str), kind(to)) {
                (Some("workload"), Some(k)) if from.len() >= 2 && from[1] != k => {
                    out.push(format!(
                        "{} uses the kind {}: move what both need into a shared step",
                        name(from),
                        name(to)
                    ));
                }
                (Some(top), Some(_)) if top != "workload" => {
                    out.push(format!(
                        "{} reaches into the kind {}: go through workload's dispatch",
                        name(from),
                        name(to)
                    ));
                }
                (Some(top), None)
                    if top != "workload"
                        && to.len() >= 2
                        && to[0] == "workload"
                        && to[1] != "context" =>
                {
                    out.push(format!(
                        "{} reaches into {}: go through workload's dispatch or its context",
                        name(from),
                        name(to)
                    ));
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn the_agents_files_keep_its_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/src");
    let found = against_layers(&graph(&src), AGENT_LAYERS, WORKLOAD_SHARED);
    assert!(
        found.is_empty(),
        "the agent's layers (ARCHITECTURE.md: session → cell → workload → direct → datasets → cluster and the rest):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_use_against_the_layers_is_found() {
    let m = |s: &str| -> Module { s.split("::").map(String::from).collect() };
    let mut g = Graph::new();
    for (from, to) in [
        ("keep", "workload"),
        ("workload::a", "workload::b"),
        ("workload::a", "workload::context"),
        ("cell", "workload::b"),
        ("cell", "workload"),
        ("cell", "workload::context"),
        ("workload::a", "cluster"),
        ("stray", "cluster"),
    ] {
        g.entry(m(from)).or_default().insert(m(to));
    }
    let layers: &[&[&str]] = &[&["cell"], &["workload"], &["keep"], &["cluster"]];
    let found = against_layers(&g, layers, &["context"]);
    assert_eq!(
        found,
        [
            "cell reaches into the kind workload::b: go through workload's dispatch",
            "keep uses workload, a layer above it",
            "stray: in no layer",
            "workload::a uses the kind workload::b: move what both need into a shared step",
        ],
        "{found:#?}"
    );
}
