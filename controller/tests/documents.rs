//! The documents a newcomer reads stay true and short: every path and
//! identifier in backticks in ARCHITECTURE.md (and the in-depth code map)
//! exists in the repository, and the landing pages keep their word limits.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file of the repository (relative paths), build output aside.
fn files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if [".git", "target", "runs", "pgfleet-data"].contains(&name.as_str()) {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    out
}

type Words = BTreeSet<String>;

fn split_words(text: &str, out: &mut Words) {
    for w in text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.')) {
        for part in [w, w.trim_matches('.')] {
            out.insert(part.to_string());
        }
        out.extend(w.split('.').map(String::from));
    }
}

/// The words of each Rust module by its name (`http` for `http.rs`,
/// `scheduler` for `scheduler/*.rs`), to check `module::item` paths.
fn module_words(root: &Path, files: &[String]) -> std::collections::BTreeMap<String, Words> {
    let mut out: std::collections::BTreeMap<String, Words> = Default::default();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        let p = Path::new(f);
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        let mut names = vec![];
        if !["mod", "lib", "main"].contains(&stem.as_str()) {
            names.push(stem);
        }
        if let Some(dir) = p.parent().and_then(|d| d.file_name()) {
            let dir = dir.to_string_lossy().into_owned();
            if dir != "src" && dir != "tests" {
                names.push(dir);
            }
        }
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_default();
        for n in names {
            split_words(&text, out.entry(n).or_default());
        }
    }
    out
}

/// The words of the sources (Rust, protobuf, Cargo manifests, scripts).
fn words(root: &Path, files: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for f in files {
        // Not this test's own list of names that must not exist.
        if f.ends_with("tests/documents.rs") {
            continue;
        }
        let source = [".rs", ".proto", ".toml", ".yaml", ".sh"]
            .iter()
            .any(|x| f.ends_with(x))
            || f.ends_with("Makefile")
            || f.ends_with(".ci/run");
        if !source {
            continue;
        }
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_default();
        split_words(&text, &mut out);
    }
    out
}

/// The names every check reads.
struct Repo {
    files: Vec<String>,
    words: Words,
    modules: std::collections::BTreeMap<String, Words>,
}

impl Repo {
    fn read() -> Repo {
        let root = repo();
        let files = files(&root);
        Repo {
            words: words(&root, &files),
            modules: module_words(&root, &files),
            files,
        }
    }
}

/// The backticked spans of `text`, code blocks aside.
fn spans(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
            out.push(inside.to_string());
        }
    }
    out
}

/// What a span names that does not exist, or None when it names nothing
/// checkable (a command, a value, a setting) or something that exists.
fn missing(span: &str, repo: &Repo) -> Option<String> {
    let (files, words) = (&repo.files, &repo.words);
    let s = span.trim_end_matches("()");
    // Commands, values, templates (`<kind>.rs`) and absolute paths
    // (`/metrics`, `/sys/block`: not the repository's) are not names.
    if s.is_empty()
        || s.contains(char::is_whitespace)
        || s.contains(['<', '{'])
        || s.starts_with('/')
        || s.starts_with(['-', '\\', '$', ':', '.'])
    {
        return None;
    }
    let is_file = |name: &str| {
        [
            ".rs", ".md", ".toml", ".proto", ".yaml", ".yml", ".sh", ".json", ".html", ".svg",
            ".py",
        ]
        .iter()
        .any(|x| name.ends_with(x))
    };
    if s.contains('/') && !s.contains("://") && !s.contains('<') && !s.contains('=') {
        // A path: from the repository's root, or the end of one.
        let path = s.trim_end_matches('/');
        let found = files.iter().any(|f| {
            f == path || f.starts_with(&format!("{path}/")) || f.ends_with(&format!("/{path}"))
        });
        let dir_found = files.iter().any(|f| f.contains(&format!("/{path}/")));
        return (!found && !dir_found).then(|| format!("path `{span}`"));
    }
    if is_file(s) {
        // A file name: a file of that name, or one the code writes.
        let found = files
            .iter()
            .any(|f| f == s || f.ends_with(&format!("/{s}")))
            || words.contains(s);
        return (!found).then(|| format!("file `{span}`"));
    }
    let ident = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
    };
    let segments: Vec<&str> = s.split("::").collect();
    if segments.iter().all(|w| ident(w))
        && s.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
    {
        // An identifier (or a path of them): each segment is a word of the
        // sources; an item after a module's name is a word of that module.
        let module = segments[..segments.len() - 1]
            .iter()
            .rev()
            .find_map(|m| repo.modules.get(*m));
        let last = segments[segments.len() - 1];
        if let Some(m) = module
            && !m.contains(last)
        {
            return Some(format!("identifier `{span}` (`{last}` not in that module)"));
        }
        let absent: Vec<&&str> = segments.iter().filter(|w| !words.contains(**w)).collect();
        return (!absent.is_empty())
            .then(|| format!("identifier `{span}` ({absent:?} not in the sources)"));
    }
    None
}

fn check(doc: &str, repo: &Repo) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(self::repo().join(doc)).unwrap();
    let spans = spans(&text);
    let bad: Vec<String> = spans
        .iter()
        .filter_map(|s| missing(s, repo))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    (spans.len(), bad)
}

#[test]
fn every_path_and_identifier_in_architecture_md_exists() {
    let repo = Repo::read();
    for doc in ["ARCHITECTURE.md", "docs/code-map.md"] {
        let (read, bad) = check(doc, &repo);
        assert!(read > 50, "{doc}: read only {read} spans in backticks");
        assert!(
            bad.is_empty(),
            "{doc} names what the repository does not have:\n{}",
            bad.join("\n")
        );
    }
}

#[test]
fn the_checker_tells_a_name_that_exists_from_one_that_does_not() {
    let repo = Repo::read();
    for exists in [
        "controller/server/src/http.rs",
        "agent/src/",
        "Core::apply",
        "pgfleet-report",
        "plan.rs",
    ] {
        assert_eq!(missing(exists, &repo), None, "{exists}");
    }
    for absent in [
        "controller/src/serve.rs",
        "serve::execute",
        "TESTING.md",
        "Store::add_samples_gone",
    ] {
        assert!(missing(absent, &repo).is_some(), "{absent}");
    }
    // Commands and values are not names.
    assert_eq!(missing("pgfleet run --out runs/x", &repo), None);
}

#[test]
fn the_landing_pages_stay_short() {
    let count = |doc: &str| {
        std::fs::read_to_string(repo().join(doc))
            .unwrap()
            .split_whitespace()
            .count()
    };
    assert!(
        count("README.md") <= 2_500,
        "README.md: {} words (limit 2,500)",
        count("README.md")
    );
    assert!(
        count("ARCHITECTURE.md") <= 3_000,
        "ARCHITECTURE.md: {} words (limit 3,000)",
        count("ARCHITECTURE.md")
    );
}
