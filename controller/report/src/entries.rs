//! Workload entries of one kind that differ only in their parameters (say
//! `driver: pgfleet` and `driver: pgbench`, or two `fillfactor`s): each
//! summary gets a `label` naming what sets it apart from its siblings, and
//! each later entry's points are compared with the first entry's matching
//! point, per class and metric, like classes are (ratio and interval).
//!
//! report.json: `summaries[].label`, `entry_comparisons: [{workload, class,
//! metric, entry, label, baseline_entry, baseline_label, ratio, interval,
//! confidence}]`.

use std::collections::BTreeSet;

use serde_json::{Value as Json, json};

use super::figure::Figure;
use pgfleet_scenario::stats;

const LEVEL: f64 = 0.95;

fn params(s: &Json) -> Vec<(String, Json)> {
    s["params"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

/// Keys whose value is not the same in every one of `of`.
fn varying<'a>(of: impl Iterator<Item = &'a Json> + Clone) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for s in of.clone() {
        for (k, v) in params(s) {
            if of.clone().any(|o| o["params"][k.as_str()] != v) {
                keys.insert(k);
            }
        }
    }
    keys
}

/// The keys that vary within an entry (its points), per kind.
fn point_keys(summaries: &[Json], kind: &Json) -> BTreeSet<String> {
    let mut entries: Vec<&Json> = summaries
        .iter()
        .filter(|s| &s["workload"] == kind)
        .map(|s| &s["entry"])
        .collect();
    entries.dedup();
    entries
        .into_iter()
        .flat_map(|e| {
            varying(
                summaries
                    .iter()
                    .filter(move |s| &s["workload"] == kind && &s["entry"] == e),
            )
        })
        .collect()
}

/// Labels each summary with the parameters that set its entry apart from
/// the other entries of its kind (empty when it is the only one).
pub fn label(summaries: &mut [Json]) {
    let snapshot = summaries.to_vec();
    for s in summaries.iter_mut() {
        let kind = s["workload"].clone();
        let points = point_keys(&snapshot, &kind);
        let apart: Vec<String> = varying(snapshot.iter().filter(|o| o["workload"] == kind))
            .into_iter()
            .filter(|k| !points.contains(k))
            .collect();
        let text = apart
            .iter()
            .map(|k| {
                let v = &s["params"][k.as_str()];
                format!(
                    "{k} {}",
                    v.as_str().map(str::to_string).unwrap_or(v.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        s["label"] = json!(text);
    }
}

/// The first entry's summary matching `s`'s point (same values of the
/// keys that vary within an entry), when `s` belongs to a later entry of
/// the same kind; with `baseline_entry`, that entry's instead of the first.
pub fn baseline_of<'a>(
    summaries: &'a [Json],
    s: &Json,
    baseline_entry: Option<usize>,
) -> Option<&'a Json> {
    let kind = &s["workload"];
    let first = baseline_entry.map(|e| json!(e)).or_else(|| {
        summaries
            .iter()
            .find(|o| &o["workload"] == kind)
            .map(|o| o["entry"].clone())
    })?;
    if s["entry"] == first {
        return None;
    }
    let points = point_keys(summaries, kind);
    summaries.iter().find(|o| {
        &o["workload"] == kind
            && o["entry"] == first
            && points
                .iter()
                .all(|k| o["params"][k.as_str()] == s["params"][k.as_str()])
    })
}

/// Every later entry's point against the first entry's, per class and metric.
pub fn comparisons(summaries: &[Json]) -> Vec<Json> {
    let mut out = Vec::new();
    for s in summaries {
        let Some(b) = baseline_of(summaries, s, None) else {
            continue;
        };
        let Some(classes) = s["classes"].as_object() else {
            continue;
        };
        for (class, c) in classes {
            for metric in c.as_object().into_iter().flat_map(|m| m.keys()) {
                let (Some(x), Some(y)) = (
                    Figure::of(c, metric),
                    Figure::of(&b["classes"][class.as_str()], metric),
                ) else {
                    continue;
                };
                let seed =
                    stats::seed_of(&format!("{}{}{class}{metric}", s["params"], b["params"]));
                let (ratio, i) = x.ratio(&y, LEVEL, seed);
                out.push(json!({
                    "workload": s["workload"], "class": class, "metric": metric,
                    "entry": s["entry"], "label": s["label"],
                    "baseline_entry": b["entry"], "baseline_label": b["label"],
                    "ratio": ratio, "interval": [i.lo, i.hi], "confidence": LEVEL,
                }));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_that_differ_in_one_parameter_are_labelled_and_compared() {
        let mut s = vec![
            json!({"entry": 0, "workload": "pgbench", "params": {"script": "random-update", "driver": "pgfleet", "clients": 8},
                   "classes": {"a": {"tps": {"values": [1000.0, 1020.0]}}}}),
            json!({"entry": 1, "workload": "pgbench", "params": {"script": "random-update", "driver": "pgbench", "clients": 8},
                   "classes": {"a": {"tps": {"values": [950.0, 960.0]}}}}),
            json!({"entry": 2, "workload": "vacuum-bloat", "params": {"fillfactor": 100},
                   "classes": {"a": {"vacuum_seconds": {"values": [3.0]}}}}),
        ];
        label(&mut s);
        assert_eq!(s[0]["label"], "driver pgfleet");
        assert_eq!(s[1]["label"], "driver pgbench");
        assert_eq!(s[2]["label"], "");
        let c = comparisons(&s);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0]["baseline_label"], "driver pgfleet");
        assert!((c[0]["ratio"].as_f64().unwrap() - 955.0 / 1010.0).abs() < 1e-9);
    }

    #[test]
    fn points_of_an_entry_pair_with_the_same_point_of_the_first() {
        let mut s = vec![];
        for (e, mode) in [(0, "pglz"), (1, "lz4")] {
            for size in [1000, 2000] {
                s.push(json!({"entry": e, "workload": "toast-slice", "params": {"size": size, "compression": mode},
                              "classes": {"a": {"latency_ms_p50": {"values": [size as f64 / 1000.0]}}}}));
            }
        }
        label(&mut s);
        assert_eq!(
            s[2]["label"], "compression lz4",
            "size varies within an entry: not a label"
        );
        let b = baseline_of(&s, &s[3], None).unwrap();
        assert_eq!(b["params"]["size"], 2000);
        assert_eq!(b["params"]["compression"], "pglz");
        assert_eq!(comparisons(&s).len(), 2);
    }
}
