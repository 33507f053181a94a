//! When two runs can be compared: their **comparability key**, the
//! scenario's text (parsed and normalized: comments, layout and key order
//! do not count, nor do its `checks`), each class's environment as the
//! guards read it (PostgreSQL version and settings, storage profile and
//! caps, instance, host cores and memory), and the datasets its cells
//! used. `pgfleet history` and history checks (`trend.rs`) compare only
//! runs with equal keys, and say why they left the others out. A history
//! may name PostgreSQL settings it follows (`vary`): they are left out of
//! the key, in the scenario's text and in the classes' environments, so a
//! change of them is a step in the series instead of a new series.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::document::Summary;
use pgfleet_scenario::stats;
use pgfleet_store::Result;
use pgfleet_store::Store;

/// What makes runs comparable: (what, value) pairs in a fixed order.
pub type Key = Vec<(String, String)>;

/// The scenario's text without what does not change what is measured:
/// parsed (comments, layout and key order gone), `checks` dropped, and the
/// classes' settings named in `vary`.
fn normalized_scenario(yaml: &str, vary: &[String]) -> String {
    match serde_saphyr::from_str::<Json>(yaml) {
        Ok(mut v) => {
            if let Some(m) = v.as_object_mut() {
                m.remove("checks");
            }
            for class in v["fleet"].as_array_mut().into_iter().flatten() {
                if let Some(settings) = class["postgres"]["settings"].as_object_mut() {
                    settings.retain(|k, _| !vary.contains(k));
                }
            }
            v.to_string()
        }
        Err(_) => yaml.to_string(),
    }
}

/// A stored run's key (its scenario text read from the store), without
/// the settings in `vary`.
pub fn key_of(store: &Store, f: &super::Figures, vary: &[String]) -> Result<Key> {
    let yaml = store.scenario_yaml(&f.run.id)?.unwrap_or_default();
    Ok(key(&yaml, &f.classes, &f.cells, vary))
}

/// The key of a run of scenario `yaml` with these classes and cells,
/// without the settings in `vary`.
pub fn key(
    yaml: &str,
    classes: &super::guards::Classes,
    cells: &[pgfleet_store::CellRow],
    vary: &[String],
) -> Key {
    let mut key: Key = vec![(
        "the scenario's text".into(),
        format!("{:016x}", stats::seed_of(&normalized_scenario(yaml, vary))),
    )];
    for (class, c) in classes {
        let e = &c.env;
        let mut part = |what: &str, v: String| key.push((format!("class `{class}`: {what}"), v));
        part("PostgreSQL version", e.postgres.version.clone());
        part(
            "PostgreSQL settings",
            e.postgres
                .settings
                .iter()
                .filter(|(k, _)| !vary.contains(k))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        let caps = e.storage.caps;
        part(
            "storage",
            format!(
                "{} (emulated {}; caps r {} w {} IOPS, r {} w {} MiB/s)",
                e.storage.profile,
                e.storage.emulated,
                caps.read_iops,
                caps.write_iops,
                caps.read_mbps,
                caps.write_mbps
            ),
        );
        part(
            "instance",
            format!(
                "{} ({} bytes, {} CPUs, emulated {})",
                e.instance.instance_type,
                e.instance.memory_bytes,
                e.instance.cpus,
                e.instance.emulated
            ),
        );
        part(
            "host",
            format!("{} cores, {} bytes", e.host.cores, e.host.memory_bytes),
        );
    }
    let mut datasets: Vec<String> = cells
        .iter()
        .filter_map(|c| crate::document::dataset_of(c.environment.as_ref()))
        .map(|d| d.fingerprint)
        .filter(|f| !f.is_empty())
        .collect();
    datasets.sort();
    datasets.dedup();
    key.push(("datasets".into(), datasets.join(", ")));
    key
}

/// The items of list `a` (`k=v, k=v`) that are not in list `b`.
fn only_in(a: &str, b: &str) -> String {
    let b: Vec<&str> = b.split(", ").collect();
    a.split(", ")
        .filter(|x| !b.contains(x))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a run with key `theirs` is not comparable with the reference's.
pub fn why_not(theirs: &Key, reference: &Key) -> Option<String> {
    let shorten = |s: &str| {
        if s.chars().count() > 80 {
            format!("{}…", s.chars().take(80).collect::<String>())
        } else if s.is_empty() {
            "none".into()
        } else {
            s.to_string()
        }
    };
    let r: BTreeMap<&str, &str> = reference
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let t: BTreeMap<&str, &str> = theirs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for (what, v) in &r {
        match t.get(what) {
            None => return Some(format!("{what}: the run has no such class")),
            Some(tv) if tv != v => {
                if what.ends_with("the scenario's text") {
                    return Some("another version of the scenario's text".into());
                }
                // A list (settings, datasets): only what differs.
                let (mine, theirs) = (only_in(tv, v), only_in(v, tv));
                return Some(format!(
                    "{what}: {} (the reference: {})",
                    shorten(&mine),
                    shorten(&theirs)
                ));
            }
            _ => {}
        }
    }
    t.keys()
        .find(|k| !r.contains_key(*k))
        .map(|k| format!("{k}: a class the reference does not have"))
}

/// A point of a run's summaries that another run's can match: the
/// workload entry, its kind and the point's parameters.
pub fn point_key(s: &Summary) -> String {
    format!(
        "{}|{}|{}",
        s.entry.map_or("null".to_string(), |e| e.to_string()),
        s.workload,
        s.params_text()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_key_ignores_layout_comments_order_and_checks() {
        let a = "name: s\nfleet: [{name: a}]\nworkloads: [{kind: pgbench, scale: 1}]\n";
        let b = "# a comment\nworkloads:\n  - scale: 1\n    kind: pgbench\nfleet:\n  - name: a\nname: s\nchecks: [{metric: tps, min: 1}]\n";
        let c = "name: s\nfleet: [{name: a}]\nworkloads: [{kind: pgbench, scale: 2}]\n";
        assert_eq!(normalized_scenario(a, &[]), normalized_scenario(b, &[]));
        assert_ne!(normalized_scenario(a, &[]), normalized_scenario(c, &[]));
        // Faults are part of what is measured: another fault, or another
        // moment for it, is another series.
        let crash = a.replace(
            "scale: 1}",
            "scale: 1, duration_s: 60, faults: [{kind: crash, at_s: 30}]}",
        );
        let later = crash.replace("at_s: 30", "at_s: 40");
        assert_ne!(
            normalized_scenario(a, &[]),
            normalized_scenario(&crash, &[])
        );
        assert_ne!(
            normalized_scenario(&crash, &[]),
            normalized_scenario(&later, &[])
        );
        // A followed setting is not part of the key; the others are.
        let on = "name: s\nfleet: [{name: a, postgres: {settings: {synchronous_commit: on, work_mem: 4MB}}}]\n";
        let off = on.replace("synchronous_commit: on", "synchronous_commit: off");
        let vary = ["synchronous_commit".to_string()];
        assert_ne!(normalized_scenario(on, &[]), normalized_scenario(&off, &[]));
        assert_eq!(
            normalized_scenario(on, &vary),
            normalized_scenario(&off, &vary)
        );
        assert_ne!(
            normalized_scenario(on, &vary),
            normalized_scenario(&on.replace("4MB", "8MB"), &vary)
        );
    }

    #[test]
    fn runs_that_differ_say_in_what() {
        let key = |v: &str, pg: &str| -> Key {
            vec![
                ("the scenario's text".into(), v.into()),
                ("class `gp3`: PostgreSQL version".into(), pg.into()),
            ]
        };
        assert_eq!(why_not(&key("1", "15.18"), &key("1", "15.18")), None);
        assert_eq!(
            why_not(&key("1", "17.2"), &key("1", "15.18")).unwrap(),
            "class `gp3`: PostgreSQL version: 17.2 (the reference: 15.18)"
        );
        assert_eq!(
            why_not(&key("2", "15.18"), &key("1", "15.18")).unwrap(),
            "another version of the scenario's text"
        );
        // Of a long list, only what differs.
        let settings = |sc: &str| -> Key {
            vec![(
                "class `a`: PostgreSQL settings".into(),
                format!(
                    "block_size=8192, effective_cache_size=4GB, fsync=on, shared_buffers=128MB, synchronous_commit={sc}, work_mem=4MB"
                ),
            )]
        };
        assert_eq!(
            why_not(&settings("off"), &settings("on")).unwrap(),
            "class `a`: PostgreSQL settings: synchronous_commit=off (the reference: synchronous_commit=on)"
        );
        let mut more = key("1", "15.18");
        more.push(("class `nvme`: host".into(), "2 cores".into()));
        assert!(
            why_not(&more, &key("1", "15.18"))
                .unwrap()
                .contains("a class the reference does not have")
        );
        assert!(
            why_not(&key("1", "15.18"), &more)
                .unwrap()
                .contains("no such class")
        );
    }
}
