//! report.md's toast-probe section: seeds/003's tables, measured on this
//! run's clusters, with the article's published figures in a column beside
//! the measured ones (`pgfleet_proto::workload::toast_probe::ARTICLE`).

use crate::Report;
use std::fmt::Write;

use super::table::{Plots, Row, by_class, num, sig};
use pgfleet_proto::workload::toast_probe::{Metrics, PROBES, PointParams, Probe, article};

/// A column of a probe's table: header and how a point shows it.
type Cell = (&'static str, fn(&PointParams, &Metrics) -> String);
/// An article column: metric, header, how its figure shows.
type ArticleColumn = (&'static str, &'static str, fn(f64) -> String);

fn int(v: Option<i64>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "–".into())
}

fn text(v: &Option<String>, none: &str) -> String {
    v.as_deref().unwrap_or(none).to_string()
}

fn mb(v: Option<i64>) -> String {
    num(v.map(|x| x as f64 / 1e6), 1)
}

/// Per probe: title, what it shows, its columns, and the metric the
/// article published (with how to show the article's figure).
struct Table {
    probe: Probe,
    title: &'static str,
    about: &'static str,
    columns: &'static [Cell],
    article: &'static [ArticleColumn],
}

const TABLES: &[Table] = &[
    Table {
        probe: Probe::Threshold,
        title: "values around the TOAST threshold",
        about: "`repeat('x', n)` in a text column: rows over 2,032 bytes trigger TOAST, so 2,000 characters stay raw and 2,001 compress (or, EXTERNAL, move out).",
        columns: &[
            ("chars", |p, _| p.case.clone()),
            ("mode", |p, _| p.storage_mode.name().into()),
            ("stored bytes", |_, m| int(m.stored_bytes)),
            ("compression", |_, m| text(&m.compression, "none")),
            ("placement", |_, m| text(&m.placement, "")),
            ("heap tuple bytes", |_, m| int(m.heap_tuple_bytes)),
        ],
        article: &[("stored_bytes", "article stored bytes", |x| {
            format!("{x:.0}")
        })],
    },
    Table {
        probe: Probe::Placement,
        title: "where four values end up",
        about: "The article's four values: 200 short characters, 10 KB repetitive, 200 KB random (md5 hex), 1.1 MB repetitive sentence. TOAST chunks and bytes come from the value's TOAST pointer (`pg_column_toast_chunk_id()` on 17+, the pointer in the heap tuple by pageinspect before).",
        columns: &[
            ("value", |p, _| p.case.clone()),
            ("mode", |p, _| p.storage_mode.name().into()),
            ("raw bytes", |_, m| int(m.raw_bytes)),
            ("stored bytes", |_, m| int(m.stored_bytes)),
            ("compression", |_, m| text(&m.compression, "none")),
            ("placement", |_, m| text(&m.placement, "")),
            ("heap tuple bytes", |_, m| int(m.heap_tuple_bytes)),
            ("TOAST chunks", |_, m| int(m.toast_chunks)),
            ("TOAST bytes", |_, m| int(m.toast_bytes)),
        ],
        article: &[("stored_bytes", "article stored bytes", |x| {
            format!("{x:.0}")
        })],
    },
    Table {
        probe: Probe::Window,
        title: "the compression window",
        about: "Random 6-letter words from a vocabulary of V (`setseed`): at V = 500 a word recurs ~3.5 KB back, inside pglz's 4 KiB window; at 5,000 ~35 KB back, inside lz4's 64 KiB only. pglz gives up when it cannot save 25 %.",
        columns: &[
            ("vocabulary", |p, _| p.case.clone()),
            ("mode", |p, _| p.storage_mode.name().into()),
            ("raw bytes", |_, m| int(m.raw_bytes)),
            ("stored bytes", |_, m| int(m.stored_bytes)),
            ("compression", |_, m| text(&m.compression, "none")),
            ("gave up", |_, m| match m.gave_up {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "–".into(),
            }),
        ],
        article: &[("stored_bytes", "article stored bytes", |x| {
            format!("{x:.0}")
        })],
    },
    Table {
        probe: Probe::Json,
        title: "JSON order documents",
        about: "Order documents of 25–100 line items with the same five keys (sku, name, qty, price_cents, tags) as jsonb, copied from an uncompressed source into one table per mode; each load timed after a checkpoint. Table = heap + TOAST (`pg_table_size`).",
        columns: &[
            ("mode", |p, _| p.storage_mode.name().into()),
            ("raw MB", |_, m| mb(m.raw_bytes)),
            ("table MB", |_, m| mb(m.total_bytes)),
            ("heap MB", |_, m| mb(m.heap_bytes)),
            ("TOAST MB", |_, m| mb(m.toast_table_bytes)),
            ("load s (each)", |_, m| {
                let each: Vec<String> = m.loads_seconds.iter().map(|s| num(s, 2)).collect();
                format!("{} ({})", num(m.load_seconds, 2), each.join(", "))
            }),
        ],
        article: &[
            ("total_bytes", "article table MB", |x| {
                format!("{:.0}", x / 1e6)
            }),
            ("load_seconds", "article load s", |x| format!("{x:.2}")),
        ],
    },
    Table {
        probe: Probe::Reads,
        title: "prefix and mid-value reads",
        about: "One query over all values: `left(body, 200)` of the text (prefix), and 200 bytes at byte 500,000 of a bytea copy (mid). Buffers from a warm `EXPLAIN (ANALYZE, BUFFERS)`; latency of the whole query in a closed loop, median over repeats. pglz bounds the compressed bytes a prefix needs (one chunk); lz4 cannot, and EXTERNAL knows which chunk holds a byte.",
        columns: &[
            ("read", |p, _| p.case.clone()),
            ("mode", |p, _| p.storage_mode.name().into()),
            ("stored MB", |_, m| mb(m.stored_bytes)),
            ("buffers hit", |_, m| int(m.buffers_shared_hit)),
            ("buffers read", |_, m| int(m.buffers_shared_read)),
            ("latency ms p50", |_, m| {
                m.latency_ms_p50.map(sig).unwrap_or_else(|| "–".into())
            }),
            ("p99", |_, m| {
                m.latency_ms_p99.map(sig).unwrap_or_else(|| "–".into())
            }),
        ],
        article: &[
            ("buffers_shared_hit", "article buffers", |x| {
                format!("{x:.0}")
            }),
            ("latency_ms_p50", "article ms", sig),
        ],
    },
];

pub fn section(
    md: &mut String,
    _plots: &mut Plots,
    doc: &Report,
    results: &[Row<PointParams, Metrics>],
) {
    let _ = writeln!(
        md,
        "\n## toast-probe: what gets TOASTed (seeds/003)\n\nMeasured on each instance class's cluster; \
         the article's figures (PostgreSQL 18) beside them where it published one."
    );
    for (class, rs) in by_class(results) {
        let version = doc
            .environment
            .instance_classes
            .get(class)
            .map_or("", |c| c.env.postgres.version.as_str());
        let _ = writeln!(
            md,
            "\n### {class}{}",
            if version.is_empty() {
                String::new()
            } else {
                format!(" (PostgreSQL {version})")
            }
        );
        for t in TABLES {
            let points: Vec<_> = rs.iter().filter(|r| r.params.probe == t.probe).collect();
            if points.is_empty() {
                continue;
            }
            let mut headers: Vec<&str> = t.columns.iter().map(|c| c.0).collect();
            headers.extend(t.article.iter().map(|a| a.1));
            let _ = writeln!(
                md,
                "\n#### {}: {}\n\n{}\n\n| {} |\n|{}",
                t.probe.name(),
                t.title,
                t.about,
                headers.join(" | "),
                "---|".repeat(headers.len())
            );
            for r in points {
                let (p, m) = (&r.params, &r.metrics);
                let mut cells: Vec<String> = t.columns.iter().map(|c| (c.1)(p, m)).collect();
                for (metric, _, show) in t.article {
                    let a = article(t.probe.name(), p.storage_mode.name(), &p.case, metric);
                    cells.push(a.map(show).unwrap_or_else(|| "–".into()));
                }
                let _ = writeln!(md, "| {} |", cells.join(" | "));
            }
        }
    }
    debug_assert_eq!(TABLES.len(), PROBES.len());
}
