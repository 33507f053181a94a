//! report.md's read-write section: seeds/004's read tests (cold and
//! OS-cache sequential scans per io_method, random reads from disk) and its
//! write test with the device bytes behind the write-amplification figure.

use crate::Report;
use std::fmt::Write;

use pgfleet_proto::workload::read_write::{Metrics, PointParams};

use super::table::{Number, Plots, Row, by_class, mib, num, sig};

fn f(v: impl Number) -> String {
    v.number().map(sig).unwrap_or_else(|| "–".into())
}

pub fn section(
    md: &mut String,
    _plots: &mut Plots,
    _doc: &Report,
    results: &[Row<PointParams, Metrics>],
) {
    let _ = writeln!(
        md,
        "\n## read-write: reads and writes of seeds/004's test table\n\n\
         `test_table (id serial, col1 int, txt varchar = repeat(md5(i), 15))`. Sequential scans are \
         `EXPLAIN (ANALYZE, BUFFERS)` of `count(*) ... WHERE txt <> ...`: cold = restart with the database's files \
         evicted from the OS page cache, OS cache = restart only (mean of the repeats; I/O ms sums parallel workers). \
         Device bytes are the cluster's own: its own loop device under PGDATA (exact, writeback included) where \
         the agent could make one (root, losetup, mkfs.ext4), else its block-I/O cgroup (on cgroup v1 without \
         buffered writeback, so the write test's bytes are short); – where neither. Write amplification = device \
         bytes / the table's bytes (every row was rewritten): each page reaches the device as a full-page image in \
         the WAL and again from the checkpoint, and the new row versions fill new pages. Device / PostgreSQL = \
         device bytes / (dirty pages PostgreSQL wrote + WAL): about 1 when the device bytes are exact."
    );
    for (class, rs) in by_class(results) {
        let _ = writeln!(md, "\n### {class}");
        if let Some(src) = rs.iter().find_map(|r| r.metrics.device_source.as_deref()) {
            let _ = writeln!(md, "\nDevice bytes: {src}.");
        }
        let seq: Vec<_> = rs
            .iter()
            .filter(|r| r.params.test.starts_with("seq-"))
            .collect();
        if !seq.is_empty() {
            let _ = writeln!(
                md,
                "\n| scan | io_method | rows | table MiB | execution ms | I/O read ms | shared read | shared hit | device read MiB |\n|---|---|---|---|---|---|---|---|---|"
            );
            for r in seq {
                let (p, m) = (&r.params, &r.metrics);
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    p.test,
                    p.io_method,
                    p.rows,
                    mib(m.table_bytes),
                    f(m.execution_ms),
                    f(m.io_read_ms),
                    num(m.shared_read, 0),
                    num(m.shared_hit, 0),
                    mib(m.device_read_bytes),
                );
            }
        }
        for r in rs.iter().filter(|r| r.params.test == "random-read") {
            let m = &r.metrics;
            let _ = writeln!(
                md,
                "\nRandom reads (`SELECT txt ... WHERE id = :id` from a cold start, io_method {}): **{} TPS**, latency mean {} ms, p99 {} ms; \
                 PostgreSQL's page read {} ms over {} blocks; device read {} MiB of a {} MiB table.",
                r.params.io_method,
                num(m.tps, 0),
                f(m.latency_ms_mean),
                f(m.latency_ms_p99),
                f(m.page_read_ms_avg),
                num(m.blocks_read, 0),
                mib(m.device_read_bytes),
                mib(m.table_bytes),
            );
        }
        for r in rs.iter().filter(|r| r.params.test == "write") {
            let m = &r.metrics;
            let _ = writeln!(
                md,
                "\n| write test | UPDATE s | CHECKPOINT s | dirty pages MiB | WAL MiB | device wrote MiB | of which CHECKPOINT | write amplification | device / PostgreSQL |\n|---|---|---|---|---|---|---|---|---|\n\
                 | {} rows | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.params.rows,
                num(m.update_seconds, 2),
                num(m.checkpoint_seconds, 2),
                mib(m.dirty_page_bytes),
                mib(m.wal_bytes),
                mib(m.device_write_bytes),
                mib(m.device_write_bytes_checkpoint),
                num(m.write_amplification, 2),
                num(m.device_vs_postgres, 2),
            );
        }
    }
}
