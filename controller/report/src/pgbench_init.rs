//! report.md's pgbench-init section: the loads.

use crate::Report;
use std::fmt::Write;

use pgfleet_proto::workload::pgbench_init::{InitParams, Metrics};

use super::table::{Plots, Row, num};

pub fn section(
    md: &mut String,
    _plots: &mut Plots,
    _doc: &Report,
    rows: &[Row<InitParams, Metrics>],
) {
    let _ = writeln!(
        md,
        "\n## pgbench-init: loading\n\n| cell | agent | scale | connections | rows | seconds | rows/s |\n|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let (p, m) = (&r.params, &r.metrics);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.cell_id,
            r.agent,
            p.scale,
            p.load_connections,
            m.rows_loaded,
            num(m.load_seconds, 2),
            num(m.rows_per_second, 0)
        );
    }
}
