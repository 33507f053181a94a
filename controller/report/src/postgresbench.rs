//! A run's pgbench figures in the result schema of ClickHouse's
//! PostgresBench (github.com/ClickHouse/PostgresBench, `*/results/*.json`:
//! `system`, `instance`, `postgres_version`, `benchmark`, `load`,
//! `results[]`), so a pgfleet run can sit in that table: one document per
//! class and pgbench entry, its replicas as the runs.
//!
//! Figures PostgresBench takes from pgbench's summary come from pgfleet's
//! own: `latency_avg_ms` is the mean, `latency_stddev_ms` and
//! `latency_p95_ms` are read from the window's latency histogram, and
//! `initial_connection_time_ms` is left out (pgfleet's window starts after
//! its clients connected and warmed up).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

use pgfleet_proto::workload::pgbench::{Metrics, PointParams};

use crate::Report;

/// One document per (class, pgbench point), named
/// `postgresbench-<class>[-<n>].json` (n from 2 when a class has several).
pub fn documents(doc: &Report) -> Vec<(String, Json)> {
    // Replicas of one point share its parameters.
    let mut groups: BTreeMap<(String, String), Vec<(PointParams, Metrics)>> = BTreeMap::new();
    for r in doc.results.iter().filter(|r| r.workload() == "pgbench") {
        let (Ok(p), Ok(m)) = (
            serde_json::from_value::<PointParams>(Json::Object(r.params.clone())),
            serde_json::from_value::<Metrics>(r.metrics.clone()),
        ) else {
            continue;
        };
        let key = serde_json::to_string(&p).unwrap_or_default();
        groups
            .entry((r.class().to_string(), key))
            .or_default()
            .push((p, m));
    }
    let mut per_class: BTreeMap<String, usize> = BTreeMap::new();
    groups
        .into_iter()
        .map(|((class, _), runs)| {
            let n = per_class.entry(class.clone()).or_default();
            *n += 1;
            let name = if *n == 1 {
                format!("postgresbench-{}.json", file_part(&class))
            } else {
                format!("postgresbench-{}-{n}.json", file_part(&class))
            };
            (name, document(doc, &class, &runs))
        })
        .collect()
}

/// Writes `documents` into `dir`; the paths written.
pub fn write(doc: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (name, d) in documents(doc) {
        let path = dir.join(name);
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&d).unwrap_or_default() + "\n",
        )?;
        written.push(path);
    }
    Ok(written)
}

/// A class name as a file name's part: letters, digits, `-` and `_`.
fn file_part(class: &str) -> String {
    class
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn document(doc: &Report, class: &str, runs: &[(PointParams, Metrics)]) -> Json {
    let env = doc
        .environment
        .instance_classes
        .get(class)
        .map(|c| c.env.clone())
        .unwrap_or_default();
    let (cpus, memory) = (env.cpus(), env.memory_bytes());
    let gb = |b: u64| (b as f64 / (1u64 << 30) as f64 * 10.0).round() / 10.0;
    let caps = &env.storage.caps;
    let storage = if env.storage.emulated && caps.is_capped() {
        format!(
            "{} (emulated: {} read / {} write IOPS, {} / {} MiB/s)",
            env.storage.profile, caps.read_iops, caps.write_iops, caps.read_mbps, caps.write_mbps
        )
    } else {
        format!("{} (this host's disk)", env.storage.profile)
    };
    let p = &runs[0].0;
    let workload = match p.script.as_str() {
        "tpcb-like" => "TPC-B (built-in)".to_string(),
        other => other.to_string(),
    };
    // The cell that loaded (replicas restoring its dataset load nothing).
    let load = runs
        .iter()
        .map(|(_, m)| m.load.load_seconds)
        .find(|s| *s > 0.0);
    json!({
        "system": format!("pgfleet: {class} ({})", env.storage.profile),
        "date": doc.started_at.get(..10).unwrap_or(""),
        "machine": format!("{cpus}vCPU, {}GB RAM", gb(memory)),
        "instance": {
            "label": class,
            "type": if env.instance.instance_type.is_empty() { "local" } else { env.instance.instance_type.as_str() },
            "vcpus": cpus,
            "ram_gb": gb(memory),
            "storage_type": storage,
        },
        "cluster_size": 1,
        "tuned": if env.postgres.settings.is_empty() { "no" } else { "settings in comment" },
        "comment": format!(
            "pgfleet run {} of scenario {}; PostgreSQL settings: {}",
            doc.run_id,
            doc.scenario,
            env.postgres
                .settings
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "postgres_version": env.postgres.version.split_whitespace().next().unwrap_or(""),
        "benchmark": {
            "tool": if p.driver == "pgbench" { "pgbench" } else { "pgfleet (pgbench-compatible driver)" },
            "workload": workload,
            "scale_factor": p.scale,
            "clients": p.clients,
            "threads": p.threads,
            "duration": p.duration_s,
            "query_mode": "prepared",
        },
        "load": { "load_time_seconds": load },
        "results": runs.iter().enumerate().map(|(i, (_, m))| {
            let (stddev, p95) = histogram_figures(&m.latency_histogram_us);
            json!({
                "run": i + 1,
                "tps": m.tps,
                "transactions": m.transactions,
                "failed_transactions": m.failures,
                "latency_avg_ms": m.latency_ms_mean,
                "latency_stddev_ms": stddev,
                "latency_p95_ms": p95,
                "latency_p99_ms": m.latency_ms_p99,
            })
        }).collect::<Vec<_>>(),
    })
}

/// The standard deviation and the 95th percentile, in ms, of a latency
/// histogram in µs (`[value, count]` pairs, values ascending).
fn histogram_figures(h: &[[u64; 2]]) -> (Option<f64>, Option<f64>) {
    let n: u64 = h.iter().map(|[_, c]| c).sum();
    if n == 0 {
        return (None, None);
    }
    let mean = h.iter().map(|[v, c]| *v as f64 * *c as f64).sum::<f64>() / n as f64;
    let var = h
        .iter()
        .map(|[v, c]| (*v as f64 - mean).powi(2) * *c as f64)
        .sum::<f64>()
        / n as f64;
    let rank = (0.95 * n as f64).ceil() as u64;
    let mut seen = 0;
    let p95 = h.iter().find_map(|[v, c]| {
        seen += c;
        (seen >= rank).then_some(*v as f64 / 1000.0)
    });
    (Some(var.sqrt() / 1000.0), p95)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_gives_the_spread_and_the_95th_percentile() {
        // 95 transactions of 1 ms, 5 of 11 ms: mean 1.5 ms.
        let (sd, p95) = histogram_figures(&[[1000, 95], [11000, 5]]);
        assert_eq!(p95, Some(1.0));
        assert!((sd.unwrap() - (0.95f64 * 0.25 + 0.05 * 90.25).sqrt()).abs() < 1e-9);
        let (_, p95) = histogram_figures(&[[1000, 94], [11000, 6]]);
        assert_eq!(p95, Some(11.0));
        assert_eq!(histogram_figures(&[]), (None, None));
        assert_eq!(file_part("gp3 x/y"), "gp3_x_y");
    }
}
