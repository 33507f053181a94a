//! report.md's pgbench-init section: the loads.

use std::fmt::Write;

use serde_json::Value as Json;

use super::markdown::num;

pub fn section(
    md: &mut String,
    _plots: &mut Vec<(String, String)>,
    _doc: &Json,
    results: &[&Json],
) {
    let _ = writeln!(
        md,
        "\n## pgbench-init: loading\n\n| cell | agent | scale | connections | rows | seconds | rows/s |\n|---|---|---|---|---|---|---|"
    );
    for r in results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r["cell_id"].as_str().unwrap_or(""),
            r["agent"].as_str().unwrap_or(""),
            r["params"]["scale"],
            r["params"]["load_connections"],
            r["metrics"]["rows_loaded"],
            num(&r["metrics"]["load_seconds"], 2),
            num(&r["metrics"]["rows_per_second"], 0)
        );
    }
}
