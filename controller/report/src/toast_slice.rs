//! report.md's toast-slice section (seeds/000's tables and plot).

use crate::Report;
use std::collections::BTreeMap;
use std::fmt::Write;

use pgfleet_proto::workload::Cache;
use pgfleet_proto::workload::toast_slice::{Metrics, PointParams, StorageMode};

use super::plot::{Series, line_chart};
use super::table::{Plots, Row, ms};

const MODES: &[StorageMode] = &[
    StorageMode::External,
    StorageMode::Pglz,
    StorageMode::Lz4,
    StorageMode::Default,
];

type R<'a> = Row<'a, PointParams, Metrics>;

/// One section per (instance class, dataset, value size): latency table,
/// storage/buffers table, and the latency-vs-offset plot.
pub fn section(md: &mut String, plots: &mut Plots, _doc: &Report, rows: &[R]) {
    let mut groups: BTreeMap<(&str, &str, u64, bool), Vec<&R>> = BTreeMap::new();
    for r in rows {
        let p = &r.params;
        let key = (
            r.class,
            p.dataset.name(),
            p.value_bytes,
            p.cache == Cache::Cold,
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
        rows.first().map(|r| r.params.slice_bytes).unwrap_or(100)
    );
    for ((class, dataset, size, cold), rs) in groups {
        let cache = if cold { Cache::Cold } else { Cache::Warm };
        let mut offsets: Vec<(u64, &str)> = rs
            .iter()
            .map(|r| (r.params.offset, r.params.offset_label.as_str()))
            .collect();
        offsets.sort();
        offsets.dedup();
        let modes: Vec<StorageMode> = MODES
            .iter()
            .copied()
            .filter(|m| rs.iter().any(|r| r.params.storage_mode == *m))
            .collect();
        let find = |m: StorageMode, o: u64| {
            rs.iter()
                .find(|r| r.params.storage_mode == m && r.params.offset == o)
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
                    find(*m, *o)
                        .map(|r| ms(r.metrics.latency_ms_mean))
                        .unwrap_or_else(|| "–".into())
                })
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} |",
                m.name().to_uppercase(),
                cells.join(" | ")
            );
        }
        let _ = writeln!(
            md,
            "\nStorage and shared buffers (hit / read):\n\n| storage | stored bytes | compression | external | {} |\n|---|---|---|---|{}",
            header.join(" | "),
            "---|".repeat(offsets.len())
        );
        for m in &modes {
            let Some(first) = offsets.iter().find_map(|(o, _)| find(*m, *o)) else {
                continue;
            };
            let mt = &first.metrics;
            let bufs: Vec<String> = offsets
                .iter()
                .map(|(o, _)| {
                    find(*m, *o)
                        .map(|r| {
                            format!(
                                "{} / {}",
                                r.metrics.buffers_shared_hit, r.metrics.buffers_shared_read
                            )
                        })
                        .unwrap_or_else(|| "–".into())
                })
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                m.name().to_uppercase(),
                mt.stored_bytes,
                mt.compression.as_deref().unwrap_or("none"),
                if mt.external { "yes" } else { "no" },
                bufs.join(" | ")
            );
        }
        let series: Vec<Series> = modes
            .iter()
            .map(|m| Series {
                name: m.name().to_uppercase(),
                points: offsets
                    .iter()
                    .filter_map(|(o, _)| {
                        find(*m, *o).map(|r| {
                            (
                                o.saturating_sub(1) as f64 / size.max(1) as f64 * 100.0,
                                r.metrics.latency_ms_mean,
                            )
                        })
                    })
                    .collect(),
                color: None,
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
