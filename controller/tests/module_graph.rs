//! The controller's modules form no circle: each top-level module of
//! controller/src may use the ones below it, never one that uses it back
//! (ARCHITECTURE.md's code map depends on it: http → queue ← serve, the
//! scheduler's core below its task, the store below everything).
//!
//! Read from the source text: every `crate::<module>` a module's non-test
//! code names (in paths and `use crate::{a, b}` lists).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module -> the top-level modules its code uses.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "main" || top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // Tests may reach anywhere.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let uses = g.entry(top.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            if let Some(list) = rest.strip_prefix('{') {
                let list = &list[..list.find('}').unwrap_or(list.len())];
                for item in list.split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    uses.insert(name);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                uses.insert(name);
            }
        }
        uses.remove(&top);
    }
    let modules: BTreeSet<String> = g.keys().cloned().collect();
    for uses in g.values_mut() {
        uses.retain(|m| modules.contains(m));
    }
    g
}

/// A circle through `from`, if there is one (depth-first search).
fn circle(g: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    fn walk(
        g: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        target: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in &g[at] {
            if next == target {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(g, next, target, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_string()];
    walk(g, from, from, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn the_controllers_modules_form_no_circle() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(g.len() >= 15, "read {} modules: {:?}", g.len(), g.keys());
    // The reader sees what is there: the scheduler uses the store and the
    // writer; http uses the queue.
    assert!(g["scheduler"].contains("store") && g["scheduler"].contains("writer"));
    assert!(g["http"].contains("queue"));
    let circles: Vec<String> = g
        .keys()
        .filter_map(|m| circle(&g, m))
        .map(|c| c.join(" → "))
        .collect();
    assert!(
        circles.is_empty(),
        "modules that use each other (move what both need below them):\n{}",
        circles.join("\n")
    );
}

#[test]
fn a_circle_is_found_and_named() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, uses) in [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ] {
        g.insert(m.into(), uses.into_iter().map(String::from).collect());
    }
    assert_eq!(circle(&g, "a").unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(circle(&g, "d"), None);
}
