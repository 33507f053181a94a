//! The scenario reference (docs/scenario-reference.md), generated from the
//! parser itself, as the PgfleetRun CRD's schema is: every part of a
//! scenario lists the keys its serde type accepts, so neither can drift
//! from what `pgfleet validate` takes. A test keeps the document current
//! (`PGFLEET_BLESS=1` rewrites it).

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::Path;

use pgfleet_proto::workload::KINDS;

/// The keys a part of a scenario accepts: `prefix` opens the part (e.g.
/// `fleet: [{`), then an unknown key makes the parser list the known ones.
pub fn keys(prefix: &str) -> Vec<String> {
    const PROBE: &str = "zz-not-a-key";
    let close: String = prefix
        .chars()
        .rev()
        .filter_map(|c| match c {
            '[' => Some(']'),
            '{' => Some('}'),
            _ => None,
        })
        .collect();
    let text = format!("{prefix}{PROBE}: 1{close}\n");
    let e = match crate::parse(Path::new("crd"), &text) {
        Ok(_) => return Vec::new(),
        Err(e) => e,
    };
    // "unknown field `zz-not-a-key`, expected one of a, b" (serde), or
    // "…: this kind's keys are a, b (and every kind's: kind, on, …)".
    let m = e
        .message
        .replace(" (and every kind's: ", ", ")
        .replace(')', "");
    let list = m
        .split_once("expected one of ")
        .or_else(|| m.split_once("keys are "))
        .map(|(_, l)| l)
        .unwrap_or_default();
    list.split(',')
        .map(|k| k.trim().trim_matches('`').trim().to_string())
        .filter(|k| !k.is_empty() && k != PROBE && !k.contains(' '))
        .collect()
}

/// The keys every workload entry takes, whatever its kind.
pub fn common_workload_keys() -> Vec<String> {
    let per_kind: Vec<BTreeSet<String>> = KINDS
        .iter()
        .map(|k| {
            keys(&format!("workloads: [{{kind: {}, ", k.name))
                .into_iter()
                .collect()
        })
        .collect();
    let mut common = per_kind.first().cloned().unwrap_or_default();
    for k in &per_kind[1..] {
        common = common.intersection(k).cloned().collect();
    }
    common.into_iter().collect()
}

/// A part's keys, then those of each of its keys that is a map of its own
/// (`storage: {...}`), one level down.
fn part(md: &mut String, heading: &str, prefix: &str, path: &str) {
    let own = keys(prefix);
    let _ = writeln!(md, "{heading}\n\n{}\n", list(&own));
    let mut nested_any = false;
    for k in own
        .iter()
        .filter(|k| !["fleet", "checks", "workloads"].contains(&k.as_str()))
    {
        let nested = keys(&format!("{prefix}{k}: {{"));
        if !nested.is_empty() {
            let _ = writeln!(md, "- `{path}{k}`: {}", list(&nested));
            nested_any = true;
        }
    }
    if nested_any {
        md.push('\n');
    }
}

fn list(keys: &[String]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// docs/scenario-reference.md.
pub fn markdown() -> String {
    let mut md = String::from(
        "# Scenario reference\n\n\
<!-- Generated from the scenario parser (`pgfleet_scenario::reference`), as the PgfleetRun CRD's \
schema is; do not edit: `PGFLEET_BLESS=1 cargo test -p pgfleet-scenario reference` rewrites it. -->\n\n\
Every key a scenario file takes, part by part, as the parser accepts them: an unknown key \
is an error that lists these. What each key means, its default and its range are in the \
error messages of `pgfleet validate` and in the guides ([running locally](running-locally.md), \
[datasets](datasets.md), [checks and history](checks-and-history.md)); the shipped \
scenarios in `scenarios/` use them all.\n\n",
    );
    part(&mut md, "## Top level", "", "");
    part(
        &mut md,
        "## A fleet entry (`fleet: [...]`)",
        "fleet: [{",
        "fleet[].",
    );
    part(
        &mut md,
        "## A check (`checks: [...]`)",
        "checks: [{",
        "checks[].",
    );
    let common = common_workload_keys();
    let _ = writeln!(
        md,
        "## A workload entry (`workloads: [...]`)\n\nEvery kind takes {}; each kind adds its own \
         keys below. A key listed as swept may be given a list of values (`clients: [1, 4, 16]`): \
         the entry then has one point per combination.\n",
        list(&common)
    );
    for kind in KINDS {
        let own: Vec<String> = keys(&format!("workloads: [{{kind: {}, ", kind.name))
            .into_iter()
            .filter(|k| !common.contains(k))
            .collect();
        let _ = writeln!(md, "### `{}`\n\n{}\n", kind.name, kind.description);
        let _ = writeln!(md, "- keys: {}", list(&own));
        let swept: Vec<String> = kind.swept.iter().map(|s| s.to_string()).collect();
        if !swept.is_empty() {
            let _ = writeln!(md, "- swept: {}", list(&swept));
        }
        if !kind.compared.is_empty() {
            md.push_str(
                "- metrics (summarized per class, compared between classes, usable in checks):\n",
            );
            for m in kind.compared {
                let better = match m.better {
                    pgfleet_proto::workload::Better::Higher => "higher is better",
                    pgfleet_proto::workload::Better::Lower => "lower is better",
                };
                let _ = writeln!(
                    md,
                    "  - `{}` ({}, {better}): {}",
                    m.name, m.unit, m.description
                );
            }
        }
        md.push('\n');
    }
    md.truncate(md.trim_end().len());
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/scenario-reference.md is what the parser accepts today.
    #[test]
    fn the_scenario_reference_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/scenario-reference.md");
        let want = markdown();
        if std::env::var_os("PGFLEET_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is not what the parser accepts: run `PGFLEET_BLESS=1 cargo test -p pgfleet-scenario \
             reference` and commit it",
            path.display()
        );
        // The parser's lists are read, not empty.
        assert!(
            keys("fleet: [{").contains(&"name".to_string()),
            "{:?}",
            keys("fleet: [{")
        );
        assert!(common_workload_keys().contains(&"kind".to_string()));
        assert!(want.contains("### `pgbench`") && want.contains("`scale`"));
    }
}
