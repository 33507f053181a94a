//! report.md's logical-drain section: the backlog each cell built, how long
//! it took to drain, per-class medians against the seeds' figures, the lag
//! over time, and the settings the kind gave each role's cluster.

use crate::Report;
use std::fmt::Write;

use pgfleet_proto::workload::Kind;
use pgfleet_proto::workload::logical_drain::{Lag, Metrics, PointParams};

use super::table::{Column, Plots, Row, SamplesPlot, Seeds, class_table, mib, num, samples_plot};

/// seeds/002: draining a 10 GB logical-replication backlog, NVMe vs EBS gp3.
const SEEDS_NVME_S: f64 = 139.0;
const SEEDS_EBS_S: f64 = 238.0;

pub fn section(md: &mut String, plots: &mut Plots, doc: &Report, rs: &[Row<PointParams, Metrics>]) {
    let _ = writeln!(
        md,
        "\n## logical-drain: draining a logical-replication backlog\n\n\
         Backlog = WAL the slot retained when apply resumed. Drain = from `ALTER SUBSCRIPTION ... ENABLE` \
         to the subscriber seeing a marker committed after the backlog. Rows match = pgbench_accounts' \
         row count and order-independent checksum equal on both clusters afterwards.\n\n\
         | cell | agents | scale | backlog target MiB | backlog MiB | built in s | drain s | drain MB/s | rows match | initial sync s | spilled txns |\n\
         |---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rs {
        let m = &r.metrics;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.cell_id,
            r.agent,
            r.params.scale,
            mib(m.backlog_target_bytes),
            mib(m.backlog_bytes),
            num(m.backlog_seconds, 1),
            num(m.drain_seconds, 2),
            num(m.drain_mb_per_s, 1),
            if m.rows_match { "yes" } else { "**NO**" },
            num(m.initial_sync_seconds, 2),
            num(m.spill_txns, 0),
        );
    }
    class_table(
        md,
        doc,
        Kind::LogicalDrain,
        "Drain",
        &[
            Column {
                header: "drain s",
                metric: "drain_seconds",
                digits: 2,
                bytes: false,
            },
            Column {
                header: "drain MB/s",
                metric: "drain_mb_per_s",
                digits: 1,
                bytes: false,
            },
            Column {
                header: "backlog MiB",
                metric: "backlog_bytes",
                digits: 1,
                bytes: true,
            },
        ],
        &Seeds {
            what: "Drain time",
            metric: "drain_seconds",
            nvme_s: SEEDS_NVME_S,
            ebs_s: SEEDS_EBS_S,
        },
    );
    // The settings the kind gave each role's cluster, from the first cell.
    if let Some(env) = rs
        .first()
        .and_then(|r| doc.cells.iter().find(|c| c.cell_id == r.cell_id))
        .and_then(|c| c.roles())
    {
        let _ = writeln!(md, "\nRole clusters (first cell):\n");
        for (role, e) in env {
            let s = |name: &str| {
                e.postgres
                    .settings
                    .get(name)
                    .map_or("?".to_string(), String::clone)
            };
            let version = match e.postgres.version.as_str() {
                "" => "?",
                v => v,
            };
            let _ = writeln!(
                md,
                "- {role}: PostgreSQL {version}, wal_level={}, max_wal_senders={}, max_replication_slots={}",
                s("wal_level"),
                s("max_wal_senders"),
                s("max_replication_slots"),
            );
        }
    }
    partitions(md, rs);
    samples_plot(
        md,
        plots,
        doc,
        rs,
        &SamplesPlot {
            sample: "lag",
            file: "drain-lag.svg",
            title: "Logical replication: backlog left while draining",
            x_label: "second",
            y_label: "lag (MiB)",
            point: |p: &Lag| Some((p.second, p.lag_bytes as f64 / (1u64 << 20) as f64)),
            edges: |m| {
                [
                    Some((0.0, m.backlog_bytes as f64 / (1u64 << 20) as f64)),
                    Some((m.drain_seconds, 0.0)),
                ]
            },
            // Each cell's partitions, in its class's colour.
            spans: |m| {
                m.faults
                    .iter()
                    .map(|f| (f.start_s, f.end_s, f.label.clone()))
                    .collect()
            },
        },
    );
}

/// The drain's partitions: per cell, the WAL still to receive when the
/// network came back and the seconds from then until the backlog was
/// applied (the lag plot below shades each cut in its class's colour).
fn partitions(md: &mut String, rs: &[Row<PointParams, Metrics>]) {
    let rows: Vec<String> = rs
        .iter()
        .flat_map(|r| {
            r.metrics.faults.iter().map(move |f| {
                format!(
                    "| {} | {} | {} | {:.1}–{:.1} | {} | {} | {} |",
                    r.cell_id,
                    r.class,
                    f.label,
                    f.start_s,
                    f.end_s,
                    num(
                        f.lag_bytes_at_heal.map(|b| b as f64 / (1u64 << 20) as f64),
                        1
                    ),
                    num(f.catch_up_s, 2),
                    num(r.metrics.drain_seconds, 2),
                )
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nPartitions (the network between the subscriber's server and the publisher's cut, then healed; \
         seconds from apply's resumption):\n\n\
         | cell | class | fault | cut s | lag at heal MiB | catch-up s | drain s |\n|---|---|---|---|---|---|---|\n{}",
        rows.join("\n")
    );
}
