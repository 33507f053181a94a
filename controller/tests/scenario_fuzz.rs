//! No scenario text crashes the parser, and what it accepts the agent
//! accepts: a seeded, bounded property test (`PGFLEET_FUZZ_CASES` cases,
//! default 3,000; `make test-all` runs more) over the shipped scenarios
//! mutated line by line and byte by byte with YAML's sharp edges (aliases,
//! tags, nesting, huge and negative numbers, paths, control characters).
//! Each case must parse or fail with a located error; each accepted one
//! must plan cells whose ids are safe path components, whose parameters
//! survive the wire (JSON and back) and pass the agent's own checks, and
//! whose settings the agent would write. A case that ever failed stays in
//! `REGRESSIONS`.

use std::path::Path;

use pgfleet_controller::scenario;
use pgfleet_proto::script::rng::Rng;
use pgfleet_proto::workload::Params;

const REGRESSIONS: &[&str] = &[
    // An alias bomb: must fail (or parse) without expanding 10^9 nodes.
    "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\ni: [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n",
    "name: x\nfleet: [{name: ../../etc, count: 1}]\nworkloads: [{kind: pgbench-init, scale: 1}]\n",
    "name: x\nfleet: [{name: a}]\nworkloads: [{kind: pgbench-init, scale: 18446744073709551615}]\n",
    "name: x\nfleet: [{name: a}]\nworkloads: [{kind: toast-slice, value_bytes: -1}]\n",
    "name: x\nfleet: [{name: a, postgres: {settings: {work_mem: \"1\\nshared_preload_libraries='x'\"}}}]\nworkloads: [{kind: pgbench-init, scale: 1}]\n",
    "",
    "---\n...\n",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
];

/// What a mutation may put in: YAML's sharp edges and values near limits.
const FRAGMENTS: &[&str] = &[
    "-1",
    "0",
    "18446744073709551616",
    "9223372036854775807",
    "1e308",
    "-0.0",
    ".nan",
    "null",
    "~",
    "true",
    "\"\"",
    "''",
    "&anchor x",
    "*anchor",
    "!!binary aGk=",
    "!!str 1",
    "{a: 1}",
    "[1, 2",
    "]",
    "{",
    ": :",
    "- -",
    "|",
    ">-",
    "\"\\u0000\"",
    "\"\\n\"",
    "../../x",
    "/etc/passwd",
    "archive_command: id",
    "allow_shell: true",
    "kind: pgbench",
    "kind: logical-drain",
    "kind: nosuch",
    "roles: {publisher: local}",
    "on: [nosuch]",
    "replicas: 100000",
    "count: 64",
    "10GiB",
    "1TB",
    "\t",
    "#",
    "\u{feff}",
    "é",
];

fn shipped() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                out.push((
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios"),
        &mut out,
    );
    out.sort();
    assert!(out.len() >= 10, "found {} scenarios", out.len());
    out
}

fn pick<'a, T>(rng: &mut Rng, v: &'a [T]) -> &'a T {
    &v[rng.range_u64(0, v.len() as u64 - 1) as usize]
}

/// One mutation of `text`: a line dropped, doubled or swapped; a value
/// replaced; a fragment inserted; a byte changed.
fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return pick(rng, FRAGMENTS).to_string();
    }
    let at = rng.range_u64(0, lines.len() as u64 - 1) as usize;
    match rng.range_u64(0, 5) {
        0 => {
            lines.remove(at);
        }
        1 => {
            let l = lines[at].clone();
            lines.insert(at, l);
        }
        2 => {
            let other = rng.range_u64(0, lines.len() as u64 - 1) as usize;
            lines.swap(at, other);
        }
        3 => {
            // Replace the value after a key's colon.
            let l = &lines[at];
            lines[at] = match l.split_once(": ") {
                Some((k, _)) => format!("{k}: {}", pick(rng, FRAGMENTS)),
                None => format!("{l} {}", pick(rng, FRAGMENTS)),
            };
        }
        4 => {
            let indent: String = lines[at].chars().take_while(|c| *c == ' ').collect();
            lines.insert(at, format!("{indent}{}", pick(rng, FRAGMENTS)));
        }
        _ => {
            let mut b = lines[at].clone().into_bytes();
            if !b.is_empty() {
                let i = rng.range_u64(0, b.len() as u64 - 1) as usize;
                b[i] = *pick(rng, b" :-[]{}&*!|>'\"#\t\\0");
            }
            lines[at] = String::from_utf8_lossy(&b).into_owned();
        }
    }
    lines.join("\n") + "\n"
}

/// The properties of one case.
fn check(name: &str, text: &str) {
    let path = Path::new("fuzz.yaml");
    match scenario::parse(path, text) {
        Err(e) => {
            assert!(!e.message.is_empty(), "{name}: an error without a message");
            assert!(
                e.line as usize <= text.lines().count() + 1,
                "{name}: error at line {} of a {}-line text: {e}",
                e.line,
                text.lines().count()
            );
        }
        Ok(sc) => {
            for c in scenario::plan(&sc) {
                assert!(
                    pgfleet_proto::is_safe_id(&c.cell_id),
                    "{name}: cell id {:?}",
                    c.cell_id
                );
                let back = Params::from_json(c.params.kind().name(), &c.params.to_json())
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(back, c.params, "{name}: parameters changed on the wire");
                back.check().unwrap_or_else(|e| {
                    panic!("{name}: the agent would refuse what validation accepted: {e}")
                });
                for (k, v) in &c.settings {
                    pgfleet_proto::settings::check(k, v, c.params.allow_shell()).unwrap_or_else(
                        |e| panic!("{name}: the agent would refuse setting {k}: {e}"),
                    );
                }
                let _ = c.params.estimate(&c.capacity);
            }
        }
    }
}

#[test]
fn no_scenario_text_crashes_the_parser_and_what_it_accepts_the_agent_accepts() {
    for (i, r) in REGRESSIONS.iter().enumerate() {
        check(&format!("regression {i}"), r);
    }
    let seeds = shipped();
    for (name, text) in &seeds {
        check(name, text);
    }
    let cases: usize = std::env::var("PGFLEET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(|n: usize| n / 20)
        .unwrap_or(3_000);
    let mut rng = Rng::seeded(0x5CE7A810);
    for i in 0..cases {
        let (name, text) = pick(&mut rng, &seeds);
        let mut t = text.clone();
        for _ in 0..rng.range_u64(1, 3) {
            t = mutate(&mut rng, &t);
        }
        check(&format!("case {i} from {name}"), &t);
    }
}
