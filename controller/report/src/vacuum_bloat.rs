//! report.md's vacuum-bloat section: the bloat each cell was given, how
//! long VACUUM took, per-class medians against the seeds' figures, and
//! VACUUM's progress over time.

use crate::Report;
use std::fmt::Write;

use pgfleet_proto::workload::Cache;
use pgfleet_proto::workload::Kind;
use pgfleet_proto::workload::vacuum_bloat::{Metrics, PointParams, Progress};

use super::table::{
    Column, Plots, Row, SamplesPlot, Seeds, class_table, mib, no_spans, num, samples_plot,
};

/// seeds/002: VACUUM of >10 GB of bloat, NVMe vs EBS gp3.
const SEEDS_NVME_S: f64 = 366.0;
const SEEDS_EBS_S: f64 = 964.0;

pub fn section(md: &mut String, plots: &mut Plots, doc: &Report, rs: &[Row<PointParams, Metrics>]) {
    let _ = writeln!(
        md,
        "\n## vacuum-bloat: VACUUM of dead tuples\n\n\
         Bloat = dead tuple bytes in pgbench_accounts just before VACUUM (pgstattuple_approx: \
         exact for dead tuples, reading only the pages not all-visible; or the statistics views \
         where pgstattuple is missing). Heap MB/s = table size / VACUUM seconds. Page read \
         and WAL sync time over VACUUM's window.\n\n\
         | cell | agent | scale | bloat target MiB | bloat MiB (method) | dead tuples before → removed | table MiB | index MiB | VACUUM s | heap MB/s | index passes | page read ms | WAL sync ms |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rs {
        let m = &r.metrics;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} ({}) | {} → {} | {} | {} | {} | {} | {} | {} | {} |",
            r.cell_id,
            r.agent,
            r.params.scale,
            mib(m.bloat_target_bytes),
            mib(m.bloat_bytes),
            m.bloat_method,
            m.dead_tuples_before,
            m.dead_tuples_removed,
            mib(m.table_bytes),
            mib(m.index_bytes),
            num(m.vacuum_seconds, 2),
            num(m.heap_mb_per_s, 1),
            m.index_vacuum_count,
            num(m.internals.page_read_ms_avg, 3),
            num(m.internals.wal_sync_ms_avg, 3),
        );
    }
    if let Some(r) = rs.first() {
        let cache = match r.params.cache {
            Cache::Cold => {
                "cold: the table's files were evicted from the OS page cache before VACUUM"
            }
            Cache::Warm => "warm: the table's pages stayed in the OS page cache",
        };
        let _ = writeln!(md, "\n`{}`; cache {cache}.", r.params.vacuum);
    }
    class_table(
        md,
        doc,
        Kind::VacuumBloat,
        "VACUUM",
        &[
            Column {
                header: "VACUUM s",
                metric: "vacuum_seconds",
                digits: 2,
                bytes: false,
            },
            Column {
                header: "heap MB/s",
                metric: "heap_mb_per_s",
                digits: 1,
                bytes: false,
            },
            Column {
                header: "bloat MiB",
                metric: "bloat_bytes",
                digits: 1,
                bytes: true,
            },
        ],
        &Seeds {
            what: "VACUUM time",
            metric: "vacuum_seconds",
            nvme_s: SEEDS_NVME_S,
            ebs_s: SEEDS_EBS_S,
        },
    );
    // Heap blocks scanned over time, per cell: VACUUM's pace.
    samples_plot(
        md,
        plots,
        doc,
        rs,
        &SamplesPlot {
            sample: "vacuum",
            file: "vacuum-progress.svg",
            title: "VACUUM: heap blocks scanned",
            x_label: "second",
            y_label: "% of heap blocks scanned",
            point: |p: &Progress| {
                let total = Some(p.heap_blks_total as f64).filter(|t| *t > 0.0)?;
                Some((p.second, 100.0 * p.heap_blks_scanned as f64 / total))
            },
            edges: |m| [Some((0.0, 0.0)), Some((m.vacuum_seconds, 100.0))],
            spans: no_spans,
        },
    );
}
