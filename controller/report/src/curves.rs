//! Sweeps' curves: for each workload entry that swept keys (`clients: [1,
//! 4, 16, 64]`), its kind's headline metric (the first it compares) and
//! its p99 latency against the swept key with the most values, one line
//! per instance class, and one plot per combination of
//! the other swept keys (TPS against clients at scale 100, then at scale
//! 1000): where a class saturates is where its line bends. A table gives
//! every point's figures.

use std::collections::BTreeSet;
use std::fmt::Write;

use serde_json::Value as Json;

use super::plot::{Series, class_color, line_chart};
use crate::checks::shown_number;
use crate::document::{Report, Summary};
use crate::entries::shown;

/// A swept value on an axis: a number, or a size such as `1GiB` in MiB.
fn x_of(v: &Json) -> Option<f64> {
    v.as_f64().or_else(|| {
        let bytes = pgfleet_proto::workload::ByteSize::Text(v.as_str()?.to_string())
            .bytes()
            .ok()?;
        Some(bytes as f64 / (1u64 << 20) as f64)
    })
}

/// A file-name-safe rendering of a point.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// A summary's value of a swept key (null: not swept there).
fn at<'a>(s: &'a Summary, key: &str) -> &'a Json {
    s.point.get(key).unwrap_or(&Json::Null)
}

pub fn render(md: &mut String, plots: &mut Vec<(String, String)>, doc: &Report) {
    let all = &doc.summaries;
    let mut entries: Vec<Option<usize>> = all
        .iter()
        .filter(|s| !s.point.is_empty())
        .map(|s| s.entry)
        .collect();
    entries.dedup();
    if entries.is_empty() {
        return;
    }
    let _ = writeln!(md, "## Sweeps\n");
    for entry in entries {
        let points: Vec<&Summary> = all.iter().filter(|s| s.entry == entry).collect();
        let entry = entry.map_or("null".to_string(), |e| e.to_string());
        entry_curves(md, plots, doc, &entry, &points);
    }
}

fn entry_curves(
    md: &mut String,
    plots: &mut Vec<(String, String)>,
    doc: &Report,
    entry: &str,
    points: &[&Summary],
) {
    let kind = points[0].workload.as_str();
    let keys: Vec<String> = points[0].point.keys().cloned().collect();
    let distinct = |k: &str| {
        points
            .iter()
            .map(|s| at(s, k).to_string())
            .collect::<BTreeSet<_>>()
            .len()
    };
    // The axis: the key with the most values (the first such, by name).
    let Some(x_key) = keys
        .iter()
        .rev()
        .max_by_key(|k| distinct(k))
        .cloned()
        .filter(|k| points.iter().all(|s| x_of(at(s, k)).is_some()))
    else {
        return;
    };
    let others: Vec<&String> = keys.iter().filter(|k| **k != x_key).collect();
    let metrics: Vec<&str> = pgfleet_proto::workload::info(kind)
        .map(|k| k.compared)
        .unwrap_or(&[])
        .iter()
        .map(|m| m.name)
        .filter(|m| {
            points
                .iter()
                .any(|s| s.classes.values().any(|c| c.metrics.contains_key(*m)))
        })
        .collect();
    let mut classes: Vec<String> = Vec::new();
    for s in points {
        for c in s.classes.keys() {
            if !classes.contains(c) {
                classes.push(c.clone());
            }
        }
    }
    let _ = writeln!(
        md,
        "### workloads[{entry}] ({kind}): {} against {x_key}\n",
        metrics.join(", ")
    );
    // The table: one row per point and class.
    let _ = writeln!(
        md,
        "| {} | class | {} |\n|{}",
        keys.join(" | "),
        metrics.join(" | "),
        "---|".repeat(keys.len() + 1 + metrics.len())
    );
    let mut rows: Vec<&&Summary> = points.iter().collect();
    rows.sort_by(|a, b| {
        let k =
            |s: &Summary| -> Vec<String> { others.iter().map(|o| at(s, o).to_string()).collect() };
        k(a).cmp(&k(b)).then(
            x_of(at(a, &x_key))
                .unwrap_or(0.0)
                .total_cmp(&x_of(at(b, &x_key)).unwrap_or(0.0)),
        )
    });
    for s in &rows {
        for class in &classes {
            let Some(c) = s.class(class) else {
                continue;
            };
            let vals: Vec<String> = keys.iter().map(|k| shown(at(s, k))).collect();
            let figs: Vec<String> = metrics
                .iter()
                .map(|m| shown_number(c.metrics.get(*m).map(|f| f.value)))
                .collect();
            let _ = writeln!(
                md,
                "| {} | {class} | {} |",
                vals.join(" | "),
                figs.join(" | ")
            );
        }
    }
    md.push('\n');
    // One plot per metric and combination of the other swept keys.
    let mut outer: Vec<Vec<(String, Json)>> = Vec::new();
    for s in &rows {
        let o: Vec<(String, Json)> = others
            .iter()
            .map(|k| ((*k).clone(), at(s, k).clone()))
            .collect();
        if !outer.contains(&o) {
            outer.push(o);
        }
    }
    let x_label = if points.iter().any(|s| at(s, &x_key).is_string()) {
        format!("{x_key}, MiB")
    } else {
        x_key.clone()
    };
    // Plotted: the kind's headline metric (its first) and its tail latency.
    let plotted: Vec<&str> = metrics
        .iter()
        .enumerate()
        .filter(|(i, m)| *i == 0 || m.contains("p99"))
        .map(|(_, m)| *m)
        .collect();
    for o in &outer {
        let words: Vec<String> = o.iter().map(|(k, v)| format!("{k} {}", shown(v))).collect();
        let at_outer = if words.is_empty() {
            String::new()
        } else {
            format!(" at {}", words.join(", "))
        };
        for metric in &plotted {
            let series: Vec<Series> = classes
                .iter()
                .map(|class| Series {
                    name: class.clone(),
                    points: rows
                        .iter()
                        .filter(|s| o.iter().all(|(k, v)| at(s, k) == v))
                        .filter_map(|s| {
                            Some((x_of(at(s, &x_key))?, s.figure(class, metric)?.value))
                        })
                        .collect(),
                    color: Some(class_color(doc, class)),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            if series.is_empty() {
                continue;
            }
            let name = format!("sweep-w{entry}-{metric}{}.svg", slug(&at_outer));
            let title = format!("workloads[{entry}] {kind}: {metric} against {x_key}{at_outer}");
            let _ = writeln!(md, "![{metric} against {x_key}{at_outer}]({name})\n");
            plots.push((name, line_chart(&title, &x_label, metric, &series)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_two_key_sweep_plots_against_the_longer_key_per_outer_value() {
        let mut summaries = Vec::new();
        for scale in [10, 100] {
            for clients in [1, 4, 16] {
                summaries.push(json!({
                    "entry": 0, "workload": "pgbench",
                    "point": {"scale": scale, "clients": clients},
                    "classes": {
                        "nvme": {"tps": {"value": (clients * 100) as f64}},
                        "gp3": {"tps": {"value": (clients.min(4) * 100) as f64}},
                    },
                }));
            }
        }
        summaries.push(json!({"entry": 1, "workload": "pgbench", "point": {},
                              "classes": {"nvme": {"tps": {"value": 1.0}}}}));
        let doc: Report = serde_json::from_value(json!({ "summaries": summaries })).unwrap();
        let (mut md, mut plots) = (String::new(), Vec::new());
        render(&mut md, &mut plots, &doc);
        assert!(
            md.contains("### workloads[0] (pgbench): tps against clients"),
            "{md}"
        );
        assert!(
            !md.contains("workloads[1]"),
            "an entry without a sweep has no curve"
        );
        let names: Vec<&str> = plots.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "sweep-w0-tps-at-scale-10.svg",
                "sweep-w0-tps-at-scale-100.svg"
            ]
        );
        // 2 scales x 3 clients x 2 classes.
        assert_eq!(md.matches("| gp3 |").count(), 6, "{md}");
        assert!(md.contains("| 16 | 10 | nvme | 1600 |"), "{md}");
        assert!(plots[0].1.contains("gp3") && plots[0].1.contains("nvme"));
    }

    #[test]
    fn sizes_are_plotted_in_mib() {
        assert_eq!(x_of(&json!("1GiB")), Some(1024.0));
        assert_eq!(x_of(&json!(16)), Some(16.0));
        assert_eq!(x_of(&json!("fast")), None);
    }
}
