//! report.md's pgbench section: every cell, per-class medians, ratios,
//! TPS and p99 over time.

use crate::Report;
use std::fmt::Write;

use pgfleet_proto::workload::pgbench::{Metrics, PointParams};
use pgfleet_proto::workload::{Cache, per};

use super::plot::{Series, line_chart};
use super::table::{Plots, Row, figure_cell, num};
use crate::document::{ClassFigures, EntryComparison, Second, Summary};
use pgfleet_proto::workload::Kind;
use serde::Deserialize;

/// pgbench: every cell's figures, per-class medians, ratios, TPS over time.
pub fn section(md: &mut String, plots: &mut Plots, doc: &Report, rs: &[Row<PointParams, Metrics>]) {
    let _ = writeln!(
        md,
        "\n## pgbench: transactions\n\nLatency from each transaction's (scheduled) start, ms. Page read time is \
         pg_stat_database's blk_read_time per block read; WAL sync time is pg_stat_wal's per sync, over the measured window.\n\n\
         | cell | agent | script | clients/threads | tps | p50 | p90 | p99 | max | transactions | failures | page read ms | WAL sync ms | checkpoints | top wait events |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rs {
        let (p, m) = (&r.params, &r.metrics);
        let i = &m.internals;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.cell_id,
            r.agent,
            p.script,
            p.clients,
            p.threads,
            num(m.tps, 1),
            num(m.latency_ms_p50, 3),
            num(m.latency_ms_p90, 3),
            num(m.latency_ms_p99, 3),
            num(m.latency_ms_max, 3),
            m.transactions,
            m.failures,
            num(i.page_read_ms_avg, 3),
            num(i.wal_sync_ms_avg, 3),
            i.checkpoints,
            i.top_wait_events
                .iter()
                .take(3)
                .map(|w| format!("{} {:.0} %", w.event, w.share * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    steadiness(md, rs);
    io_per_transaction(md, rs);
    for (gi, sm) in doc.summaries_of(Kind::Pgbench.name()).enumerate() {
        point_section(md, plots, doc, rs, gi, sm);
    }
}

/// Whether each timed window's throughput held: the windows that drifted
/// are named with their drift, so a figure from a run that never settled
/// is read as such, not as the class's.
fn steadiness(md: &mut String, rs: &[Row<PointParams, Metrics>]) {
    let judged: Vec<&Row<PointParams, Metrics>> =
        rs.iter().filter(|r| r.metrics.steady.is_some()).collect();
    if judged.is_empty() {
        return;
    }
    let drifting: Vec<String> = judged
        .iter()
        .filter(|r| r.metrics.steady == Some(false))
        .map(|r| {
            let m = &r.metrics;
            let [lo, hi] = m.drift_interval_pct.unwrap_or([f64::NAN; 2]);
            format!(
                "{} ({:+.1} % over the window, 95 % interval {:+.1} to {:+.1} %)",
                r.cell_id,
                m.drift_pct.unwrap_or(f64::NAN),
                lo,
                hi
            )
        })
        .collect();
    let _ = writeln!(
        md,
        "
Steady windows (TPS drift over the window under {} %, or not significant): {} of {}{}",
        pgfleet_proto::workload::steady::DRIFT_PCT,
        judged.len() - drifting.len(),
        judged.len(),
        if drifting.is_empty() {
            ".".to_string()
        } else {
            format!("; **drifting**: {}.", drifting.join("; "))
        }
    );
    // `duration_s: auto`: where each window ended, and whether it had to
    // stop at its longest without settling.
    let auto: Vec<&&Row<PointParams, Metrics>> =
        judged.iter().filter(|r| r.params.until_steady).collect();
    if !auto.is_empty() {
        let ended: Vec<String> = auto
            .iter()
            .map(|r| {
                let w = r.metrics.window_s.unwrap_or(f64::NAN);
                let longest = r.params.duration_s.unwrap_or(f64::NAN);
                let why = if r.metrics.steady == Some(true) {
                    "steady"
                } else {
                    "**not steady by its longest**"
                };
                format!("{} {:.0} s of {:.0} ({why})", r.cell_id, w, longest)
            })
            .collect();
        let _ = writeln!(
            md,
            "
Windows of `duration_s: auto` (measured until steady): {}.",
            ended.join("; ")
        );
    }
}

/// One measured point (a summary): its per-class table, TPS ratios, the
/// comparison with the kind's first entry, and TPS and p99 over time.
fn point_section(
    md: &mut String,
    plots: &mut Plots,
    doc: &Report,
    rs: &[Row<PointParams, Metrics>],
    gi: usize,
    sm: &Summary,
) {
    let script = sm.script.as_deref().unwrap_or("");
    let label = sm.label.as_str();
    let point = PointParams::deserialize(&serde_json::Value::Object(sm.params.clone()));
    let cache = match point.map(|p| p.cache) {
        Ok(Cache::Cold) => {
            "cold (the cluster restarted, its database's files evicted from the page cache)"
        }
        _ => "warm (as the load left it)",
    };
    let heading = if label.is_empty() {
        script.to_string()
    } else {
        format!("{script} ({label})")
    };
    let entry = sm.entry;
    let _ = writeln!(
        md,
        "\n### {heading}: per instance class\n\n\
         Cache when the measurement started: **{cache}**. \
         Latency quantiles are those of all the class's transactions (its clusters' histograms merged); \
         the other figures are medians over clusters. In brackets: min–max over clusters.\n\n\
         | class | clusters | tps | latency p50 ms | latency p99 ms | page read ms | WAL sync ms | device I/O per txn |\n|---|---|---|---|---|---|---|---|"
    );
    let classes = &sm.classes;
    let cell = |c: &ClassFigures, k: &str, d: usize| match c.metrics.get(k) {
        Some(f) => figure_cell(Some(f), d, false),
        None => "–".to_string(),
    };
    for (name, c) in classes {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            c.cells,
            cell(c, "tps", 1),
            cell(c, "latency_ms_p50", 3),
            cell(c, "latency_ms_p99", 3),
            cell(c, "page_read_ms_avg", 3),
            cell(c, "wal_sync_ms_avg", 3),
            cell(c, "device_ios_per_txn", 2)
        );
    }
    let ratios: Vec<String> = doc
        .comparisons
        .iter()
        .filter(|c| c.entry == entry && c.metric == "tps")
        .map(|c| {
            format!(
                "{} / {} = **{}x**",
                c.class,
                c.baseline_class,
                num(c.ratio, 2)
            )
        })
        .collect();
    if !ratios.is_empty() {
        let _ = writeln!(md, "\nTPS ratio: {}", ratios.join(", "));
    }
    against_first_entry(md, doc, sm.entry);
    let stem = format!("pgbench-{gi}-{script}");
    over_time(md, plots, doc, rs, sm, &stem, &heading);
    let mine: Vec<&Row<PointParams, Metrics>> = rs
        .iter()
        .filter(|r| r.raw.params == sm.params && crate::entry_of(r.cell_id) == entry)
        .collect();
    super::faults::sections(md, plots, doc, &mine, sm, &stem);
}

/// Against the first entry of the kind that differs only in its
/// parameters: the ratios with their intervals.
fn against_first_entry(md: &mut String, doc: &Report, entry: Option<usize>) {
    let against: Vec<&EntryComparison> = doc
        .entry_comparisons
        .iter()
        .filter(|c| c.entry == entry && c.workload == "pgbench")
        .filter(|c| ["tps", "latency_ms_p50", "latency_ms_p99"].contains(&c.metric.as_str()))
        .collect();
    if let Some(first) = against.first() {
        let _ = writeln!(
            md,
            "\nAgainst {} ({}), ratio with its 95 % interval:\n\n| class | metric | ratio | interval |\n|---|---|---|---|",
            first.baseline_label,
            format_args!(
                "workload entry {}",
                first
                    .baseline_entry
                    .map_or("null".to_string(), |e| e.to_string())
            )
        );
        for c in against {
            let _ = writeln!(
                md,
                "| {} | {} | {}x | {}–{} |",
                c.class,
                c.metric,
                num(c.ratio, 3),
                num(c.interval[0], 3),
                num(c.interval[1], 3)
            );
        }
    }
}

/// TPS and p99 latency over time: per class, the mean over its cells of
/// each second, one plot each (`{file_stem}-tps.svg`, `-p99.svg`).
fn over_time(
    md: &mut String,
    plots: &mut Plots,
    doc: &Report,
    rs: &[Row<PointParams, Metrics>],
    sm: &Summary,
    file_stem: &str,
    heading: &str,
) {
    let entry = sm.entry;
    // This summary's cells: its entry's, at its point.
    let mine = |r: &Row<PointParams, Metrics>| {
        r.raw.params == sm.params && crate::entry_of(r.cell_id) == entry
    };
    let classes = &sm.classes;
    let over_time = |field: fn(&Second) -> Option<f64>| -> Vec<Series> {
        classes
            .keys()
            .map(|class| {
                let cells = rs.iter().filter(|r| r.class == class.as_str() && mine(r));
                Series {
                    name: class.clone(),
                    points: super::table::class_means(doc, cells.map(|r| r.cell_id), field, |_| {
                        true
                    })
                    .into_iter()
                    .map(|(s, v)| (s as f64, v))
                    .collect(),
                    color: Some(super::plot::class_color(doc, class)),
                }
            })
            .collect()
    };
    type Field = fn(&Second) -> Option<f64>;
    for (field, file, title, y, alt) in [
        (
            (|s| s.tps) as Field,
            "tps",
            "TPS over time per class",
            "transactions per second",
            "TPS over time per instance class",
        ),
        (
            (|s| s.latency_ms_p99) as Field,
            "p99",
            "p99 latency over time per class",
            "p99 latency (ms)",
            "p99 latency over time per instance class",
        ),
    ] {
        let series = over_time(field);
        if series.iter().any(|s| !s.points.is_empty()) {
            let name = format!("{file_stem}-{file}.svg");
            plots.push((
                name.clone(),
                line_chart(&format!("{heading}: {title}"), "second", y, &series),
            ));
            let _ = writeln!(md, "\n![{alt}]({name})");
        }
    }
}

/// Per cell: what the storage under test did per committed transaction,
/// beside what PostgreSQL asked of it, where the cluster had a device of
/// its own (nothing otherwise: no exact count exists).
fn io_per_transaction(md: &mut String, rs: &[Row<PointParams, Metrics>]) {
    let rows: Vec<String> = rs
        .iter()
        .filter_map(|r| {
            let i = &r.metrics.internals;
            let n = i.commits.filter(|&n| n > 0)?;
            let (reads, writes) = (i.device_reads?, i.device_writes?);
            let p = |v: Option<u64>| v.map(|v| v as f64 / n as f64);
            let kib_per_write = i
                .device_write_bytes
                .and_then(|b| per(b, writes))
                .map(|b| b / 1024.0);
            Some(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.cell_id,
                r.class,
                n,
                num(p(Some(reads)), 2),
                num(p(Some(writes)), 2),
                num(kib_per_write, 1),
                num(p(i.device_flushes), 2),
                num(p(i.blocks_read), 2),
                num(p(i.page_writes), 2),
                num(p(i.wal_writes), 2),
                num(p(i.wal_syncs), 2),
            ))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n### I/O per transaction\n\n\
         What each cluster's own block device completed per committed transaction over the measured window \
         (requests after the block layer merged adjacent ones, as a cloud volume's IOPS count them), \
         beside what PostgreSQL asked for: blocks read from outside shared buffers (pg_stat_database), pages written \
         (backends, checkpointer, background writer: pg_stat_io, pg_stat_bgwriter before 16), WAL writes and syncs. \
         Device reads below PostgreSQL's were served by the page cache; device writes above its page and WAL writes \
         are the filesystem's (its journal, after each sync). An IOPS cap divided by the device's reads and writes per \
         transaction bounds the TPS (an emulated cap counts I/Os before the block layer merges them, so it binds \
         somewhat lower when writes merge).\n\n\
         | cell | class | transactions | device reads | device writes | KiB per device write | device flushes | \
         PostgreSQL page reads | page writes | WAL writes | WAL syncs |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
}
