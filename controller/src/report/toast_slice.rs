//! report.md's toast-slice section (seeds/000's tables and plot).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value as Json;

use super::markdown::ms;
use super::plot::{Series, line_chart};

const MODES: &[&str] = &["external", "pglz", "lz4"];

/// One section per (instance class, dataset, value size): latency table,
/// storage/buffers table, and the latency-vs-offset plot.
pub fn section(md: &mut String, plots: &mut Vec<(String, String)>, _doc: &Json, results: &[&Json]) {
    let mut groups: BTreeMap<(String, String, u64, String), Vec<&Json>> = BTreeMap::new();
    for r in results {
        let key = (
            r["instance_class"].as_str().unwrap_or("").to_string(),
            r["params"]["dataset"].as_str().unwrap_or("").to_string(),
            r["params"]["value_bytes"].as_u64().unwrap_or(0),
            r["params"]["cache"].as_str().unwrap_or("warm").to_string(),
        );
        groups.entry(key).or_default().push(r);
    }
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## toast-slice: {} bytes out of one large value\n\nLatency is the mean of each timed run of the prepared \
         query, median over repeats (as pgbench's `latency average` in the article). Buffers are from a warm \
         `EXPLAIN (ANALYZE, BUFFERS)` read by primary key. A warm cache: a warm-up, then each repeat a closed \
         loop of reads from memory; a cold one: each repeat one read right after the cluster restarted and its \
         files left the page cache.",
        results
            .first()
            .and_then(|r| r["params"]["slice_bytes"].as_u64())
            .unwrap_or(100)
    );
    for ((class, dataset, size, cache), rs) in groups {
        let mut offsets: Vec<(u64, String)> = rs
            .iter()
            .map(|r| {
                (
                    r["params"]["offset"].as_u64().unwrap_or(0),
                    r["params"]["offset_label"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect();
        offsets.sort();
        offsets.dedup();
        let modes: Vec<&str> = MODES
            .iter()
            .copied()
            .filter(|m| rs.iter().any(|r| r["params"]["storage_mode"] == *m))
            .collect();
        let find = |m: &str, o: u64| {
            rs.iter().find(|r| {
                r["params"]["storage_mode"] == m && r["params"]["offset"].as_u64() == Some(o)
            })
        };
        let _ = writeln!(
            md,
            "\n### {dataset}, {} ({class}, {cache} cache)\n",
            pgfleet_proto::workload::human_bytes(size)
        );
        let header: Vec<String> = offsets
            .iter()
            .map(|(b, l)| format!("{l} (byte {b})"))
            .collect();
        let _ = writeln!(
            md,
            "Latency, ms (p50 / p99 in the JSON):\n\n| storage | {} |\n|---|{}",
            header.join(" | "),
            "---|".repeat(offsets.len())
        );
        for m in &modes {
            let cells: Vec<String> = offsets
                .iter()
                .map(|(o, _)| {
                    find(m, *o)
                        .map(|r| ms(&r["metrics"]["latency_ms_mean"]))
                        .unwrap_or_else(|| "–".into())
                })
                .collect();
            let _ = writeln!(md, "| {} | {} |", m.to_uppercase(), cells.join(" | "));
        }
        let _ = writeln!(
            md,
            "\nStorage and shared buffers (hit / read):\n\n| storage | stored bytes | compression | external | {} |\n|---|---|---|---|{}",
            header.join(" | "),
            "---|".repeat(offsets.len())
        );
        for m in &modes {
            let Some(first) = offsets.iter().find_map(|(o, _)| find(m, *o)) else {
                continue;
            };
            let mt = &first["metrics"];
            let bufs: Vec<String> = offsets
                .iter()
                .map(|(o, _)| {
                    find(m, *o)
                        .map(|r| {
                            format!(
                                "{} / {}",
                                r["metrics"]["buffers_shared_hit"],
                                r["metrics"]["buffers_shared_read"]
                            )
                        })
                        .unwrap_or_else(|| "–".into())
                })
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                m.to_uppercase(),
                mt["stored_bytes"],
                mt["compression"].as_str().unwrap_or("none"),
                if mt["external"].as_bool().unwrap_or(false) {
                    "yes"
                } else {
                    "no"
                },
                bufs.join(" | ")
            );
        }
        let series: Vec<Series> = modes
            .iter()
            .map(|m| Series {
                name: m.to_uppercase(),
                points: offsets
                    .iter()
                    .filter_map(|(o, _)| {
                        find(m, *o).map(|r| {
                            (
                                (*o - 1) as f64 / size.max(1) as f64 * 100.0,
                                r["metrics"]["latency_ms_mean"].as_f64().unwrap_or(f64::NAN),
                            )
                        })
                    })
                    .collect(),
            })
            .collect();
        let name = format!(
            "toast-slice-{class}-{dataset}-{}.svg",
            pgfleet_proto::workload::human_bytes(size)
        );
        let svg = line_chart(
            &format!(
                "toast-slice: {dataset} {} ({class})",
                pgfleet_proto::workload::human_bytes(size)
            ),
            "offset, % of the value",
            "latency, ms",
            &series,
        );
        let _ = writeln!(md, "\n![latency against offset per storage mode]({name})");
        plots.push((name, svg));
    }
}
