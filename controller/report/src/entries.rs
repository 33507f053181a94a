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

use serde_json::Value as Json;

use super::figure::Figure;
use crate::document::{EntryComparison, Summary};
use pgfleet_scenario::stats;

const LEVEL: f64 = 0.95;

/// Keys whose value is not the same in every one of `of`.
fn varying<'a>(of: impl Iterator<Item = &'a Summary> + Clone) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for s in of.clone() {
        for (k, v) in &s.params {
            if of.clone().any(|o| o.params.get(k) != Some(v)) {
                keys.insert(k.clone());
            }
        }
    }
    keys
}

/// The keys that vary within an entry (its points), per kind.
fn point_keys(summaries: &[Summary], kind: &str) -> BTreeSet<String> {
    let mut entries: Vec<Option<usize>> = summaries
        .iter()
        .filter(|s| s.workload == kind)
        .map(|s| s.entry)
        .collect();
    entries.dedup();
    entries
        .into_iter()
        .flat_map(|e| {
            varying(
                summaries
                    .iter()
                    .filter(move |s| s.workload == kind && s.entry == e),
            )
        })
        .collect()
}

/// A parameter's value as a label shows it (strings unquoted).
pub fn shown(v: &Json) -> String {
    // A list of faults reads as their labels ("crash at 60 s").
    if let Ok(faults) =
        <Vec<pgfleet_proto::workload::fault::Fault> as serde::Deserialize>::deserialize(v)
        && !faults.is_empty()
    {
        let labels: Vec<String> = faults.iter().map(|f| f.label()).collect();
        return format!("[{}]", labels.join(", "));
    }
    v.as_str().map(str::to_string).unwrap_or(v.to_string())
}

/// Labels each summary with the parameters that set its entry apart from
/// the other entries of its kind (empty when it is the only one).
pub fn label(summaries: &mut [Summary]) {
    let snapshot = summaries.to_vec();
    for s in summaries.iter_mut() {
        let points = point_keys(&snapshot, &s.workload);
        let apart: Vec<String> = varying(snapshot.iter().filter(|o| o.workload == s.workload))
            .into_iter()
            .filter(|k| !points.contains(k))
            .collect();
        s.label = apart
            .iter()
            .map(|k| format!("{k} {}", shown(s.params.get(k).unwrap_or(&Json::Null))))
            .collect::<Vec<_>>()
            .join(", ");
    }
}

/// The first entry's summary matching `s`'s point (same values of the
/// keys that vary within an entry), when `s` belongs to a later entry of
/// the same kind; with `baseline_entry`, that entry's instead of the first.
pub fn baseline_of<'a>(
    summaries: &'a [Summary],
    s: &Summary,
    baseline_entry: Option<usize>,
) -> Option<&'a Summary> {
    let kind = s.workload.as_str();
    let first = match baseline_entry {
        Some(e) => Some(e),
        None => summaries.iter().find(|o| o.workload == kind)?.entry,
    };
    if s.entry == first {
        return None;
    }
    let points = point_keys(summaries, kind);
    summaries.iter().find(|o| {
        o.workload == kind
            && o.entry == first
            && points.iter().all(|k| o.params.get(k) == s.params.get(k))
    })
}

/// Every later entry's point against the first entry's, per class and metric.
pub fn comparisons(summaries: &[Summary]) -> Vec<EntryComparison> {
    let mut out = Vec::new();
    for s in summaries {
        let Some(b) = baseline_of(summaries, s, None) else {
            continue;
        };
        for (class, c) in &s.classes {
            for metric in c.metrics.keys() {
                let (Some(x), Some(y)) = (
                    Figure::of(c, metric),
                    b.class(class).and_then(|bc| Figure::of(bc, metric)),
                ) else {
                    continue;
                };
                let seed = stats::seed_of(&format!(
                    "{}{}{class}{metric}",
                    s.params_text(),
                    b.params_text()
                ));
                let (ratio, i) = x.ratio(&y, LEVEL, seed);
                out.push(EntryComparison {
                    workload: s.workload.clone(),
                    class: class.clone(),
                    metric: metric.clone(),
                    entry: s.entry,
                    label: s.label.clone(),
                    baseline_entry: b.entry,
                    baseline_label: b.label.clone(),
                    ratio,
                    interval: [finite(i.lo), finite(i.hi)],
                    confidence: LEVEL,
                });
            }
        }
    }
    out
}

/// A number JSON can hold (not NaN or infinite), else none.
pub fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn typed(v: Vec<Json>) -> Vec<Summary> {
        v.into_iter()
            .map(|j| serde_json::from_value(j).unwrap())
            .collect()
    }

    #[test]
    fn entries_that_differ_in_one_parameter_are_labelled_and_compared() {
        let mut s = typed(vec![
            json!({"entry": 0, "workload": "pgbench", "params": {"script": "random-update", "driver": "pgfleet", "clients": 8},
                   "classes": {"a": {"tps": {"values": [1000.0, 1020.0]}}}}),
            json!({"entry": 1, "workload": "pgbench", "params": {"script": "random-update", "driver": "pgbench", "clients": 8},
                   "classes": {"a": {"tps": {"values": [950.0, 960.0]}}}}),
            json!({"entry": 2, "workload": "vacuum-bloat", "params": {"fillfactor": 100},
                   "classes": {"a": {"vacuum_seconds": {"values": [3.0]}}}}),
        ]);
        label(&mut s);
        assert_eq!(s[0].label, "driver pgfleet");
        assert_eq!(s[1].label, "driver pgbench");
        assert_eq!(s[2].label, "");
        let c = comparisons(&s);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].baseline_label, "driver pgfleet");
        assert!((c[0].ratio - 955.0 / 1010.0).abs() < 1e-9);
    }

    #[test]
    fn points_of_an_entry_pair_with_the_same_point_of_the_first() {
        let mut v = vec![];
        for (e, mode) in [(0, "pglz"), (1, "lz4")] {
            for size in [1000, 2000] {
                v.push(json!({"entry": e, "workload": "toast-slice", "params": {"size": size, "compression": mode},
                              "classes": {"a": {"latency_ms_p50": {"values": [size as f64 / 1000.0]}}}}));
            }
        }
        let mut s = typed(v);
        label(&mut s);
        assert_eq!(
            s[2].label, "compression lz4",
            "size varies within an entry: not a label"
        );
        let b = baseline_of(&s, &s[3], None).unwrap();
        assert_eq!(b.params["size"], 2000);
        assert_eq!(b.params["compression"], "pglz");
        assert_eq!(comparisons(&s).len(), 2);
    }
}
