//! report.md: run summary, cells, environment, and per workload the
//! article-style tables with their plots.

use std::fmt::Write;

use serde_json::Value as Json;

/// A kind's section of report.md: the markdown, the plots it embeds (file
/// name, SVG), the whole report document, and the kind's results.
pub type Section = fn(&mut String, &mut Vec<(String, String)>, &Json, &[&Json]);

/// The report's sections, one per workload kind, in this order.
const SECTIONS: &[(&str, Section)] = &[
    ("toast-slice", super::toast_slice::section),
    ("pgbench-init", super::pgbench_init::section),
    ("pgbench", super::pgbench::section),
    ("vacuum-bloat", super::vacuum_bloat::section),
    ("logical-drain", super::logical_drain::section),
];

/// Returns the markdown and the plots it embeds (file name, SVG).
pub fn render(doc: &Json) -> (String, Vec<(String, String)>) {
    let mut md = String::new();
    let mut plots = Vec::new();
    let s = |v: &Json| v.as_str().unwrap_or("").to_string();
    let _ = writeln!(md, "# pgfleet run {}\n", s(&doc["run_id"]));
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(
        md,
        "| scenario | `{}` ({}) |",
        s(&doc["scenario"]),
        s(&doc["scenario_path"])
    );
    let _ = writeln!(md, "| status | **{}** |", s(&doc["status"]));
    let _ = writeln!(md, "| started | {} |", s(&doc["started_at"]));
    let _ = writeln!(md, "| finished | {} |\n", s(&doc["finished_at"]));

    let _ = writeln!(md, "## Environment\n");
    let _ = writeln!(
        md,
        "| instance class | agents | PostgreSQL | storage | host | settings |\n|---|---|---|---|---|---|"
    );
    if let Some(classes) = doc["environment"]["instance_classes"].as_object() {
        for (name, c) in classes {
            let agents: Vec<String> = c["agents"]
                .as_array()
                .map(|a| a.iter().map(s).collect())
                .unwrap_or_default();
            let settings: Vec<String> = c["postgres"]["settings"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
                .unwrap_or_default();
            let caps = &c["storage"]["caps"];
            let capped = ["read_iops", "write_iops", "read_mbps", "write_mbps"]
                .iter()
                .any(|k| caps[*k].as_u64().unwrap_or(0) > 0);
            let emulated = match (c["storage"]["emulated"].as_bool().unwrap_or(false), capped) {
                (true, _) => format!(
                    "emulated: {}/{} IOPS, {}/{} MiB/s read/write",
                    caps["read_iops"], caps["write_iops"], caps["read_mbps"], caps["write_mbps"]
                ),
                (false, true) => "caps NOT applied (emulate: false), the disk as is".to_string(),
                (false, false) => "real".to_string(),
            };
            let mem = c["host"]["memory_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64;
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} ({emulated}) | {} cores, {mem:.1} GiB | {} |",
                agents.join(", "),
                s(&c["postgres"]["version"]),
                s(&c["storage"]["profile"]),
                c["host"]["cores"],
                settings.join(", ")
            );
        }
    }

    let _ = writeln!(
        md,
        "\n## Cells\n\n| cell | agent | state | error |\n|---|---|---|---|"
    );
    for c in doc["cells"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            s(&c["cell_id"]),
            s(&c["agent"]),
            s(&c["state"]),
            s(&c["error"]).replace('|', "\\|").replace('\n', " ")
        );
    }

    for (kind, section) in SECTIONS {
        let results: Vec<&Json> = doc["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["workload"] == *kind)
            .collect();
        if !results.is_empty() {
            section(&mut md, &mut plots, doc, &results);
        }
    }
    (md, plots)
}

/// Bytes as MiB with one decimal.
pub fn mib(v: &Json) -> String {
    num(
        &Json::from(v.as_f64().unwrap_or(f64::NAN) / (1u64 << 20) as f64),
        1,
    )
}

/// A column of a per-class table: header, metric, decimals; `bytes` columns
/// show the median in MiB.
pub struct Column {
    pub header: &'static str,
    pub metric: &'static str,
    pub digits: usize,
    pub bytes: bool,
}

/// A seconds figure the seeds published per storage class, for the ratio
/// line under a per-class table.
pub struct Seeds {
    pub what: &'static str,
    pub metric: &'static str,
    pub nvme_s: f64,
    pub ebs_s: f64,
}

/// The per-class table of a kind's summaries (median over its clusters,
/// min–max) and each class's ratio to the first for `seeds.metric`, next
/// to the seeds' EBS gp3 / NVMe ratio.
pub fn class_table(
    md: &mut String,
    doc: &Json,
    kind: &str,
    title: &str,
    columns: &[Column],
    seeds: &Seeds,
) {
    for sm in doc["summaries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["workload"] == kind)
    {
        let Some(classes) = sm["classes"].as_object() else {
            continue;
        };
        let headers: Vec<&str> = columns.iter().map(|c| c.header).collect();
        let _ = writeln!(
            md,
            "\n### {title} per instance class (median over clusters, min–max)\n\n| class | cells | {} |\n|---|---|{}",
            headers.join(" | "),
            "---|".repeat(columns.len())
        );
        for (name, c) in classes {
            let cells: Vec<String> = columns
                .iter()
                .map(|col| {
                    let x = &c[col.metric];
                    if col.bytes {
                        mib(&x["median"])
                    } else {
                        let d = col.digits;
                        format!(
                            "{} ({}–{})",
                            num(&x["median"], d),
                            num(&x["min"], d),
                            num(&x["max"], d)
                        )
                    }
                })
                .collect();
            let _ = writeln!(md, "| {name} | {} | {} |", c["cells"], cells.join(" | "));
        }
    }
    for c in doc["comparisons"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["workload"] == kind && c["metric"] == seeds.metric)
    {
        let _ = writeln!(
            md,
            "\n{} ratio: {} / {} = **{}x** (seeds/002: EBS gp3 / NVMe = {:.0} / {:.0} s = {:.2}x)",
            seeds.what,
            c["class"].as_str().unwrap_or(""),
            c["baseline_class"].as_str().unwrap_or(""),
            num(&c["ratio"], 2),
            seeds.ebs_s,
            seeds.nvme_s,
            seeds.ebs_s / seeds.nvme_s
        );
    }
}

pub fn ms(v: &Json) -> String {
    v.as_f64()
        .map(|x| format!("{x:.3}"))
        .unwrap_or_else(|| "–".into())
}

pub fn num(v: &Json, digits: usize) -> String {
    v.as_f64()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "–".into())
}
