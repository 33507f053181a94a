//! report.md: run summary, cells, environment, and per workload the
//! article-style tables with their plots.

use std::fmt::Write;

use pgfleet_proto::workload::{Kind, approx_seconds};
use serde::de::DeserializeOwned;
use serde_json::Value as Json;

use crate::table::{Plots, Row, Section, num, sig};

/// The section of `kind`: one arm per kind, so a kind without a section
/// does not compile. Sections appear in the kinds' table order.
pub(super) fn section(
    kind: Kind,
    md: &mut String,
    plots: &mut Plots,
    doc: &Json,
    results: &[&Json],
) {
    match kind {
        Kind::Fio => typed(kind, super::fio::section, md, plots, doc, results),
        Kind::ToastSlice => typed(kind, super::toast_slice::section, md, plots, doc, results),
        Kind::PgbenchInit => typed(kind, super::pgbench_init::section, md, plots, doc, results),
        Kind::Pgbench => typed(kind, super::pgbench::section, md, plots, doc, results),
        Kind::VacuumBloat => typed(kind, super::vacuum_bloat::section, md, plots, doc, results),
        Kind::LogicalDrain => typed(kind, super::logical_drain::section, md, plots, doc, results),
        Kind::ToastProbe => typed(kind, super::toast_probe::section, md, plots, doc, results),
        Kind::CompressionAnalysis => typed(
            kind,
            super::compression_analysis::section,
            md,
            plots,
            doc,
            results,
        ),
        Kind::ReadWrite => typed(kind, super::read_write::section, md, plots, doc, results),
    }
}

/// Reads `results` as the kind's points and renders the section; results
/// this pgfleet cannot read as such (stored by another version) are named
/// under it instead of failing the report.
fn typed<P: DeserializeOwned, M: DeserializeOwned>(
    kind: Kind,
    section: Section<P, M>,
    md: &mut String,
    plots: &mut Plots,
    doc: &Json,
    results: &[&Json],
) {
    let mut rows = Vec::new();
    let mut unread = Vec::new();
    for r in results {
        let cell_id = r["cell_id"].as_str().unwrap_or("");
        match (P::deserialize(&r["params"]), M::deserialize(&r["metrics"])) {
            (Ok(params), Ok(metrics)) => rows.push(Row {
                cell_id,
                class: r["instance_class"].as_str().unwrap_or(""),
                agent: r["agent"].as_str().unwrap_or(""),
                params,
                metrics,
                raw: r,
            }),
            (Err(e), _) | (_, Err(e)) => unread.push(format!("`{cell_id}` ({e})")),
        }
    }
    if !rows.is_empty() {
        section(md, plots, doc, &rows);
    }
    if !unread.is_empty() {
        let _ = writeln!(
            md,
            "\n{} {kind} result(s) could not be read as this pgfleet's `{kind}` figures (stored by another version?), \
             so they are not in the tables above; report.json has them as stored: {}",
            unread.len(),
            unread.join(", ")
        );
    }
}

/// The checks' verdicts, first: what a pipeline gates on.
fn checks(md: &mut String, doc: &Json) {
    let Some(list) = doc["checks"].as_array().filter(|l| !l.is_empty()) else {
        return;
    };
    let sm = &doc["check_summary"];
    let _ = writeln!(
        md,
        "## Checks: {}\n\n{} passed, {} failed, {} inconclusive (an interval straddling its bound counts as failed unless the check says `inconclusive: pass`).\n\n\
         | | check | point | figure | observed | interval | bound | clusters |\n|---|---|---|---|---|---|---|---|",
        if sm["ok"] == true { "passed" } else { "FAILED" },
        sm["passed"],
        sm["failed"],
        sm["inconclusive"]
    );
    for e in list {
        let mark = match (e["verdict"].as_str(), e["passes"] == true) {
            (Some("passed"), _) => "✅ passed",
            (Some("failed"), _) => "❌ failed",
            (_, true) => "⚠️ inconclusive (counts as passed)",
            _ => "⚠️ inconclusive",
        };
        let figure = match e["baseline"].as_str() {
            Some(b) => format!(
                "{} {} / {b}",
                e["metric"].as_str().unwrap_or(""),
                e["class"].as_str().unwrap_or("")
            ),
            None => format!(
                "{} of {}",
                e["metric"].as_str().unwrap_or(""),
                e["class"].as_str().unwrap_or("")
            ),
        };
        let f = |v: &Json| v.as_f64().map(sig).unwrap_or_else(|| "–".into());
        let bound = match (e["min"].as_f64(), e["max"].as_f64()) {
            (Some(lo), Some(hi)) => format!("{} … {}", sig(lo), sig(hi)),
            (Some(lo), None) => format!("≥ {}", sig(lo)),
            (None, Some(hi)) => format!("≤ {}", sig(hi)),
            _ => String::new(),
        };
        let clusters = e["clusters"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {mark} | {} | {} | {figure} | {} | {:.0} %: {}–{} | {bound} | {clusters} |",
            e["name"].as_str().unwrap_or(""),
            super::checks::point_label(e),
            f(&e["observed"]),
            e["confidence"].as_f64().unwrap_or(0.95) * 100.0,
            f(&e["interval"][0]),
            f(&e["interval"][1]),
        );
    }
    for e in list.iter().filter(|e| e["note"].is_string()) {
        let _ = writeln!(
            md,
            "\n- {}: {}",
            e["name"].as_str().unwrap_or(""),
            e["note"].as_str().unwrap_or("")
        );
    }
    md.push('\n');
}

/// Returns the markdown and the plots it embeds (file name, SVG).
/// What a Kubernetes run kept for debugging (`cleanup: keep`), with how
/// to look at it and when it goes.
fn kept(md: &mut String, doc: &Json) {
    let k = &doc["kept"];
    let Some(objects) = k["objects"].as_array() else {
        return;
    };
    let ns = k["namespace"].as_str().unwrap_or("");
    let _ = writeln!(
        md,
        "## Kept for debugging

`cleanup:` kept this run's objects in namespace `{ns}` until {} (then serve deletes them):
",
        k["until"].as_str().unwrap_or("")
    );
    for o in objects {
        let _ = writeln!(md, "- `{}`", o.as_str().unwrap_or(""));
    }
    let pod = objects
        .iter()
        .filter_map(|o| o.as_str())
        .find(|o| o.starts_with("pod/"))
        .unwrap_or("pod/NAME");
    let _ = writeln!(
        md,
        "
An agent's log: `kubectl -n {ns} logs {pod}`. Delete them now: `kubectl -n {ns} delete configmap {} --cascade=foreground`.
",
        k["owner"].as_str().unwrap_or("")
    );
}

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
    let _ = writeln!(md, "| finished | {} |", s(&doc["finished_at"]));
    if let Some(labels) = doc["labels"].as_object().filter(|l| !l.is_empty()) {
        // Labels are the submitter's text: shown as code, never as Markdown.
        let shown: Vec<String> = labels
            .iter()
            .map(|(k, v)| inline_code(&format!("{k}={}", v.as_str().unwrap_or(""))))
            .collect();
        let _ = writeln!(md, "| labels | {} |", shown.join(" "));
    }
    md.push('\n');
    checks(&mut md, doc);
    for w in doc["warnings"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "> ⚠️ {}\n",
            w.as_str().unwrap_or("").trim_start_matches("warning: ")
        );
    }

    kept(&mut md, doc);
    history_checks(&mut md, &mut plots, doc);
    storage_classes(&mut md, doc);
    costs(&mut md, doc);

    let _ = writeln!(md, "## Environment\n");
    let _ = writeln!(
        md,
        "| instance class | agents | PostgreSQL | instance | storage | host | settings |\n|---|---|---|---|---|---|---|"
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
                (true, _) => {
                    let d = &c["storage"]["delivered"];
                    let got = |k: &str| {
                        d[k]["delivered"]
                            .as_f64()
                            .map(sig)
                            .unwrap_or_else(|| "–".into())
                    };
                    let probe = if d["error"].is_string() {
                        "; not probed".to_string()
                    } else if d.is_object() {
                        format!(
                            "; fio probe delivered {}/{} IOPS, {}/{} MiB/s",
                            got("read_iops"),
                            got("write_iops"),
                            got("read_mbps"),
                            got("write_mbps")
                        )
                    } else {
                        String::new()
                    };
                    let cap = |k: &str| match caps[k].as_u64() {
                        Some(0) | None => "uncapped".to_string(),
                        Some(n) => n.to_string(),
                    };
                    if caps["combined"].as_bool() == Some(true) {
                        format!(
                            "emulated: {} IOPS, {} MiB/s of reads and writes together{probe}",
                            cap("read_iops"),
                            cap("read_mbps")
                        )
                    } else {
                        format!(
                            "emulated: {}/{} IOPS, {}/{} MiB/s read/write{probe}",
                            cap("read_iops"),
                            cap("write_iops"),
                            cap("read_mbps"),
                            cap("write_mbps")
                        )
                    }
                }
                (false, true) => "caps NOT applied (emulate: false), the disk as is".to_string(),
                (false, false) => "real".to_string(),
            };
            let mem = c["host"]["memory_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64;
            let i = &c["instance"];
            let mut limits = Vec::new();
            if let Some(m) = i["memory_bytes"].as_u64().filter(|m| *m > 0) {
                limits.push(pgfleet_proto::workload::approx_bytes(m));
            }
            if let Some(n) = i["cpus"].as_u64().filter(|n| *n > 0) {
                limits.push(format!("{n} CPU{}", if n == 1 { "" } else { "s" }));
            }
            let instance = match (s(&i["type"]), limits.is_empty(), i["emulated"].as_bool()) {
                (t, true, _) if t.is_empty() => "the host".to_string(),
                (t, true, _) => format!("{t} (the host's memory and CPUs)"),
                (t, false, Some(true)) => format!("{t} {} (emulated)", limits.join(", "))
                    .trim()
                    .to_string(),
                (t, false, _) => format!("{t} {} (NOT emulated: the host's)", limits.join(", "))
                    .trim()
                    .to_string(),
            };
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {instance} | {} ({emulated}) | {} cores, {mem:.1} GiB | {} |",
                agents.join(", "),
                s(&c["postgres"]["version"]),
                s(&c["storage"]["profile"]),
                c["host"]["cores"],
                settings.join(", ")
            );
        }
    }

    emulation_limits(&mut md, doc);
    roles(&mut md, doc);
    let _ = writeln!(
        md,
        "\n## Cells\n\n| cell | agent | state | took | estimated | error |\n|---|---|---|---|---|---|"
    );
    let secs = |v: &Json| v.as_f64().map(approx_seconds).unwrap_or_default();
    for c in doc["cells"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            s(&c["cell_id"]),
            s(&c["agent"]),
            s(&c["state"]),
            secs(&c["seconds"]),
            secs(&c["estimate_seconds"]),
            s(&c["error"]).replace('|', "\\|").replace('\n', " ")
        );
    }
    estimates(&mut md, doc);

    datasets(&mut md, doc);
    super::curves::render(&mut md, &mut plots, doc);

    for kind in Kind::ALL {
        let results: Vec<&Json> = doc["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["workload"] == kind.name())
            .collect();
        if !results.is_empty() {
            section(*kind, &mut md, &mut plots, doc, &results);
        }
    }
    (md, plots)
}

/// How the plan's estimates held: the run's wall clock and the succeeded
/// cells' times against their estimates (what `validate` and the ETA
/// said), so a user sees when to trust them.
fn estimates(md: &mut String, doc: &Json) {
    let ratios: Vec<f64> = doc["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["state"] == "succeeded")
        .filter_map(|c| {
            let (took, est) = (c["seconds"].as_f64()?, c["estimate_seconds"].as_f64()?);
            (est > 0.0).then_some(took / est)
        })
        .collect();
    let mut parts = Vec::new();
    if let (Some(took), Some(est)) = (
        doc["seconds"].as_f64(),
        doc["estimated_seconds"].as_f64().filter(|e| *e > 0.0),
    ) {
        parts.push(format!(
            "the run took {} against an estimate of {} ({:.2}x)",
            approx_seconds(took),
            approx_seconds(est),
            took / est
        ));
    }
    if !ratios.is_empty() {
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let within = ratios.iter().filter(|r| (0.7..=1.3).contains(*r)).count();
        parts.push(format!(
            "its succeeded cells took {:.2}x their estimates (median; {:.2}x to {:.2}x), {} of {} within ±30 %",
            pgfleet_scenario::stats::median(&sorted),
            sorted[0],
            sorted[sorted.len() - 1],
            within,
            ratios.len()
        ));
    }
    if !parts.is_empty() {
        let _ = writeln!(
            md,
            "\nEstimates: {}. They come from each kind's work (CPU time, bytes, I/Os) over the class's CPUs and storage caps, corrected by what earlier cells of the same kind, class and dataset step took where the store held any (`pgfleet validate` lists them); this run's cells correct the next run's.",
            parts.join("; ")
        );
    }
}

/// The seeds/002 talk's figures: NVMe, then EBS gp3.
const SEEDS: &[(&str, &str, f64, f64)] = &[
    ("tps", "TPS", 16_030.0, 1_734.0),
    ("latency_ms_mean", "latency ms", 4.0, 36.9),
    ("vacuum_seconds", "VACUUM s", 366.0, 964.0),
    ("drain_seconds", "drain s", 139.0, 238.0),
];

/// The talk's table (seeds/002), when a run measured more than one of its
/// three measurements: per class the median TPS, latency, VACUUM and drain
/// seconds with min–max, each class's ratio to the first, and the seeds'
/// published figures.
fn storage_classes(md: &mut String, doc: &Json) {
    let kinds = [
        ("pgbench", "tps"),
        ("pgbench", "latency_ms_mean"),
        ("vacuum-bloat", "vacuum_seconds"),
        ("logical-drain", "drain_seconds"),
    ];
    let summaries: Vec<&Json> = doc["summaries"].as_array().into_iter().flatten().collect();
    let first = |kind: &str| summaries.iter().find(|s| s["workload"] == kind).copied();
    let present = ["pgbench", "vacuum-bloat", "logical-drain"]
        .iter()
        .filter(|k| first(k).is_some())
        .count();
    if present < 2 {
        return;
    }
    let mut classes: Vec<String> = Vec::new();
    for sm in &summaries {
        for c in sm["classes"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            if !classes.contains(c) {
                classes.push(c.clone());
            }
        }
    }
    // The baseline is the first class of the fleet, as in the comparisons.
    let baseline = super::figure::baseline_class(doc).map(str::to_string);
    if let Some(b) = &baseline {
        classes.retain(|c| c != b);
        classes.insert(0, b.clone());
    }
    // With prices: what a million transactions cost per class, beside TPS
    // (the figure that decides between instance storage and gp3).
    let cost = |class: &str| doc["costs"]["classes"][class]["per_million_transactions"].as_f64();
    let currency = doc["costs"]["currency"].as_str().unwrap_or("");
    let priced = classes.iter().any(|c| cost(c).is_some());
    let _ = writeln!(
        md,
        "## Storage classes at a glance (seeds/002's table)\n\n\
         Median over each class's clusters (min–max). Latency is the mean transaction latency of the \
         random UPDATE, as the talk reports it.\n\n\
         | class | TPS | latency ms | VACUUM s | drain s |{}\n|---|---|---|---|---|{}",
        if priced {
            format!(" {currency} per 1M transactions |")
        } else {
            String::new()
        },
        if priced { "---|" } else { "" }
    );
    let figure = |class: &str, kind: &str, metric: &str, d: usize| -> (String, Option<f64>) {
        let Some(x) = first(kind).map(|s| &s["classes"][class][metric]) else {
            return ("–".into(), None);
        };
        if x.is_null() {
            return ("–".into(), None);
        }
        (
            format!(
                "{} ({}–{})",
                num(&x["value"], d),
                num(&x["min"], d),
                num(&x["max"], d)
            ),
            x["value"].as_f64(),
        )
    };
    let mut medians: Vec<Vec<Option<f64>>> = Vec::new();
    for c in &classes {
        let mut cells: Vec<(String, Option<f64>)> = kinds
            .iter()
            .zip([0, 3, 1, 1])
            .map(|((k, m), d)| figure(c, k, m, d))
            .collect();
        if priced {
            cells.push((cost(c).map(sig).unwrap_or_else(|| "–".into()), cost(c)));
        }
        let _ = writeln!(
            md,
            "| {c} | {} |",
            cells
                .iter()
                .map(|x| x.0.clone())
                .collect::<Vec<_>>()
                .join(" | ")
        );
        medians.push(cells.iter().map(|x| x.1).collect());
    }
    for (i, c) in classes.iter().enumerate().skip(1) {
        let ratios: Vec<String> = (0..medians[0].len())
            .map(|k| match (medians[0][k], medians[i][k]) {
                (Some(b), Some(x)) if b != 0.0 => format!("{:.2}x", x / b),
                _ => "–".into(),
            })
            .collect();
        let _ = writeln!(md, "| **{c} / {}** | {} |", classes[0], ratios.join(" | "));
    }
    let mut seeds: Vec<String> = SEEDS.iter().map(|s| format!("{} / {}", s.2, s.3)).collect();
    let mut ratios: Vec<String> = SEEDS.iter().map(|s| format!("{:.2}x", s.3 / s.2)).collect();
    if priced {
        seeds.push("–".into());
        ratios.push("–".into());
    }
    let _ = writeln!(md, "| seeds/002: NVMe / EBS gp3 | {} |", seeds.join(" | "));
    let _ = writeln!(
        md,
        "| **seeds/002: EBS gp3 / NVMe** | {} |\n",
        ratios.join(" | ")
    );
}

/// What emulated storage cannot express, under the environment table when
/// a class's storage is emulated with caps: rates are capped, a device's
/// per-I/O latency is not added (no device-mapper `delay` here).
fn emulation_limits(md: &mut String, doc: &Json) {
    let emulated: Vec<&String> = doc["environment"]["instance_classes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, c)| {
            c["storage"]["emulated"].as_bool() == Some(true)
                && ["read_iops", "write_iops", "read_mbps", "write_mbps"]
                    .iter()
                    .any(|k| c["storage"]["caps"][*k].as_u64().unwrap_or(0) > 0)
        })
        .map(|(name, _)| name)
        .collect();
    if emulated.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nEmulated storage ({}) caps rates — IOPS and MiB/s, each direction on its own, or one budget for reads and writes split by demand \
         every 250 ms where the profile's figures cover both (gp3) — and nothing else: it adds no per-I/O latency \
         (an EBS volume's network round trip), and a read or write is as fast as this host's disk until the cap queues it. \
         Where a workload waits on single I/Os rather than on the rate, the emulated device is faster than the real one, and a ratio \
         against it is understated (BENCHMARKS.md, \"nvme-vs-gp3\", measures how far its ratios land from the seeds' on EBS, and why).",
        emulated
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Each judged history check's series: the earlier comparable runs'
/// figures, the median of the runs since their last change, and this run.
fn history_checks(md: &mut String, plots: &mut Vec<(String, String)>, doc: &Json) {
    let judged: Vec<&Json> = doc["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["history"]["values"].is_array())
        .collect();
    if judged.is_empty() {
        return;
    }
    let _ = writeln!(md, "## History checks\n");
    for (i, c) in judged.iter().enumerate() {
        let h = &c["history"];
        let values: Vec<f64> = h["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Json::as_f64)
            .collect();
        let start = h["segment_start"].as_u64().unwrap_or(0) as usize;
        let median = h["segment_median"].as_f64().unwrap_or(f64::NAN);
        let this = c["observed"].as_f64().map(|r| r * median);
        let n = values.len() as f64;
        let mut series = vec![
            super::plot::Series {
                name: "earlier runs".into(),
                points: values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| ((i + 1) as f64, *v))
                    .collect(),
                color: None,
            },
            super::plot::Series {
                name: "since the last change".into(),
                points: vec![((start + 1) as f64, median), (n + 1.0, median)],
                color: None,
            },
        ];
        if let Some(y) = this {
            series.push(super::plot::Series {
                name: "this run".into(),
                points: vec![(n + 1.0, y)],
                color: None,
            });
        }
        let metric = c["metric"].as_str().unwrap_or("");
        let class = c["class"].as_str().unwrap_or("");
        let name = format!("history-check-{i}.svg");
        plots.push((
            name.clone(),
            super::plot::line_chart(
                &format!(
                    "{}: {metric} of {class} over runs",
                    c["name"].as_str().unwrap_or("")
                ),
                "run (oldest first; the last is this one)",
                metric,
                &series,
            ),
        ));
        let _ = writeln!(
            md,
            "**{}** ({} earlier comparable runs, {} change point(s); the whole series: `pgfleet history {} --metric {metric} --class {class}`, or `GET /v1/history?scenario={}&metric={metric}&class={class}` on serve)\n\n![{metric} over runs]({name})\n",
            c["name"].as_str().unwrap_or(""),
            values.len(),
            h["change_points"],
            s_of(&doc["scenario"]),
            s_of(&doc["scenario"]),
        );
    }
}

fn s_of(v: &Json) -> String {
    v.as_str().unwrap_or("").to_string()
}

/// The run's cost per class (`report/cost.rs`), and against the first
/// class: the cost of a million transactions beside the TPS ratio (the
/// figure that decides between instance NVMe and gp3).
fn costs(md: &mut String, doc: &Json) {
    let Some(classes) = doc["costs"]["classes"]
        .as_object()
        .filter(|c| !c.is_empty())
    else {
        return;
    };
    let cur = doc["costs"]["currency"].as_str().unwrap_or("");
    let money = |v: &Json| match v.as_f64() {
        Some(x) if x >= 100.0 => format!("{x:.0} {cur}"),
        Some(x) if x >= 1.0 => format!("{x:.2} {cur}"),
        Some(x) => format!("{} {cur}", sig(x)),
        None => "–".into(),
    };
    let _ = writeln!(
        md,
        "## Cost ({cur})\n\nFrom the scenario's `price:` per class (a month is 730 hours); a cell costs its wall time on one instance. \
         Per million transactions: the price per hour over the class's pgbench TPS.\n\n\
         | class | per hour | this run (cell hours) | per 1M transactions | per VACUUM | per drain |\n|---|---|---|---|---|---|"
    );
    for (class, c) in classes {
        let _ = writeln!(
            md,
            "| {class} | {} | {} ({:.2} h) | {} | {} | {} |",
            money(&c["per_hour"]),
            money(&c["run"]),
            c["cell_hours"].as_f64().unwrap_or(0.0),
            money(&c["per_million_transactions"]),
            money(&c["per_vacuum"]),
            money(&c["per_drain"]),
        );
    }
    // Ratios against the comparisons' baseline class (else the first).
    let baseline = super::figure::baseline_class(doc)
        .filter(|b| classes.contains_key(*b))
        .or_else(|| classes.keys().next().map(String::as_str))
        .unwrap_or("");
    let tps = |class: &str| {
        super::figure::first_value(super::figure::summaries(doc), "pgbench", class, "tps")
    };
    let b = &classes[baseline];
    let mut rows = Vec::new();
    for (class, c) in classes.iter().filter(|(k, _)| k.as_str() != baseline) {
        let ratio = |k: &str| match (c[k].as_f64(), b[k].as_f64()) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
            _ => "–".into(),
        };
        let tps_ratio = match (tps(class), tps(baseline)) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
            _ => "–".into(),
        };
        rows.push(format!(
            "| {class} / {baseline} | {} | {tps_ratio} | {} | {} | {} |",
            ratio("per_hour"),
            ratio("per_million_transactions"),
            ratio("per_vacuum"),
            ratio("per_drain")
        ));
    }
    if !rows.is_empty() {
        let _ = writeln!(
            md,
            "\n| ratio | per hour | TPS | cost per 1M transactions | per VACUUM | per drain |\n|---|---|---|---|---|---|\n{}",
            rows.join("\n")
        );
    }
    md.push('\n');
}

/// Where each cell's data came from (`environment.dataset`, the agent's
/// `dataset::Provenance`): built and published, restored, or loaded fresh.
fn datasets(md: &mut String, doc: &Json) {
    let cells: Vec<&Json> = doc["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["environment"]["dataset"].is_object())
        .collect();
    if cells.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Datasets\n\nA cell's data is built once (loaded, published to the agent's dataset store after a clean shutdown) and restored by later cells that need the same bytes (`data: reuse`, the default), or loaded by the cell itself (`data: fresh`). \
         Built and restored cells start alike: the server freshly started, the data's files dropped from the page cache, then read back through the server as a load leaves them (`rewarmed`); `fresh` cells measure right after their own load (`as loaded`). \
         A restored cell's load figures are its builder's. \
         With `reuse_cluster: true` a cell may instead reuse the cluster the previous cell of its dataset left on its agent, after the kind's reset (`reused`: its cache is as that cell left it, not rewarmed). \
         On an agent whose volume was created from a dataset snapshot (Kubernetes, `--dataset-snapshots`), the first cell restoring a dataset the snapshot brought reads every block of it first (`storage.hydrate: read-all`): such a volume fetches blocks lazily on first touch. \
         A cell given a volume of that snapshot for itself reads its blocks the same way, then uses the dataset where it lies (`in place`: no copy).\n\n\
         | cell | dataset | how | wait s | load s | publish s | restore s | restore MB/s | cache | note |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let s = |v: &Json| v.as_str().unwrap_or("").to_string();
    let secs = |v: &Json| match v.as_f64() {
        Some(x) if x > 0.0 => format!("{x:.1}"),
        _ => "–".into(),
    };
    let mut stores: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for c in cells {
        let d = &c["environment"]["dataset"];
        if let Some(st) = d["store"].as_str().filter(|st| !st.is_empty()) {
            stores
                .entry(st.to_string())
                .or_default()
                .insert(s(&c["agent"]));
        }
        let mut note = Vec::new();
        if let Some(b) = d["built_by"].as_str().filter(|b| !b.is_empty()) {
            note.push(format!("built by {b}"));
        }
        if d["method"] == "in-place" {
            note.push(format!(
                "in place on a volume of its own ({}), no copy",
                s(&d["store"])
            ));
        }
        if let Some(why) = d["discarded"].as_str() {
            note.push(format!("**a published copy did not match its manifest and was discarded** ({why}); this cell built it again"));
        }
        if let Some(why) = d["not_published"].as_str() {
            note.push(format!("not published: {why}"));
        }
        // The object store behind the agents' stores (`--dataset-remote`).
        if let Some(x) = d["download_seconds"].as_f64().filter(|x| *x > 0.0) {
            note.push(format!(
                "downloaded from {} in {x:.1} s ({:.0} MB/s)",
                s(&d["remote"]),
                d["download_mb_per_s"].as_f64().unwrap_or(0.0)
            ));
        }
        if let Some(x) = d["upload_seconds"].as_f64().filter(|x| *x > 0.0) {
            note.push(format!(
                "uploaded to {} in {x:.1} s ({} compressed)",
                s(&d["remote"]),
                pgfleet_proto::workload::approx_bytes(d["uploaded_bytes"].as_u64().unwrap_or(0))
            ));
        }
        if let Some(why) = d["remote_error"].as_str() {
            note.push(format!("the remote store was not used: {why}"));
        }
        if let Some(first) = d["reused_from"].as_str() {
            note.push(format!(
                "**reused the cluster of cell {first}** (cell {} on it), reset in {:.1} s",
                d["reused_by_cells"],
                d["reset_seconds"].as_f64().unwrap_or(0.0)
            ));
        }
        if let Some(why) = d["not_reused"].as_str() {
            note.push(format!("not reused: {why}"));
        }
        let h = &d["hydration"];
        if h.is_object() {
            let snap = s(&h["snapshot"]);
            let by = s(&h["by_cell"]);
            note.push(if h["hydrated"] != true {
                format!("**not hydrated** (volume from snapshot {snap}, `hydrate: none`): its figures include the lazy restore")
            } else {
                format!(
                    "volume from snapshot {snap}, hydrated {}: first byte after {:.0} ms, {} in {:.1} s ({:.0} MB/s)",
                    if by == s(&c["cell_id"]) { "by this cell".to_string() } else { format!("by cell {by}") },
                    h["ttfb_ms"].as_f64().unwrap_or(0.0),
                    pgfleet_proto::workload::approx_bytes(h["bytes"].as_u64().unwrap_or(0)),
                    h["seconds"].as_f64().unwrap_or(0.0),
                    h["mb_per_s"].as_f64().unwrap_or(0.0),
                )
            });
        }
        let _ = writeln!(
            md,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} |",
            s(&c["cell_id"]),
            d["fingerprint"]
                .as_str()
                .filter(|f| !f.is_empty())
                .or(d["label"].as_str())
                .unwrap_or(""),
            s(&d["how"]),
            secs(&d["wait_seconds"]),
            secs(&d["load_seconds"]),
            secs(&d["publish_seconds"]),
            secs(&d["restore_seconds"]),
            secs(&d["restore_mb_per_s"]),
            s(&d["cache"]),
            note.join("; ").replace('|', "\\|").replace('\n', " ")
        );
    }
    if !stores.is_empty() {
        let _ = writeln!(
            md,
            "\nDataset stores: {}.",
            stores
                .into_iter()
                .map(|(st, agents)| format!(
                    "`{st}` ({})",
                    agents.into_iter().collect::<Vec<_>>().join(", ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
}

/// Which PostgreSQL role ran what, per class (from the cells' environment).
fn roles(md: &mut String, doc: &Json) {
    let Some(classes) = doc["environment"]["instance_classes"].as_object() else {
        return;
    };
    for (name, c) in classes {
        let r = &c["roles"];
        let Some(sql) = r["scenario_sql"].as_str() else {
            continue;
        };
        let how = if r["scenario_sql_superuser"].as_bool().unwrap_or(false) {
            "**a superuser** (the scenario set allow_shell)"
        } else {
            "no superuser, no server-file or server-program roles"
        };
        let _ = writeln!(
            md,
            "\nClass `{name}`: scenario SQL (scripts, defines, setup_sql) ran as `{sql}` ({how}); pgfleet's own steps (loading, statistics, CHECKPOINT, cache eviction) as `{}`.",
            r["agent_steps"].as_str().unwrap_or("")
        );
    }
}

/// `text` as inline code in a table cell: a code span with more backticks
/// than the text holds, `|` escaped (GitHub splits cells on it even there).
fn inline_code(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let text = text.replace('|', "\\|");
    format!("{fence} {text} {fence}")
}

#[cfg(test)]
mod render_tests {
    use super::*;

    /// Labels show under the run's header as code: a `|` or a backtick in
    /// a value neither splits the table nor ends the code span.
    #[test]
    fn kept_objects_are_listed_with_how_to_look_and_when_they_go() {
        let (md, _) = render(&serde_json::json!({"run_id": "r", "kept": {
            "until": "2026-12-04T10:00:00Z", "namespace": "bench", "owner": "pgfleet-run-r",
            "objects": ["configmap/pgfleet-run-r", "pod/pgfleet-r-a-0", "persistentvolumeclaim/pgfleet-r-a-0-data"]}}));
        assert!(md.contains("## Kept for debugging"), "{md}");
        assert!(md.contains("until 2026-12-04T10:00:00Z"), "{md}");
        assert!(
            md.contains("- `persistentvolumeclaim/pgfleet-r-a-0-data`"),
            "{md}"
        );
        assert!(
            md.contains("`kubectl -n bench logs pod/pgfleet-r-a-0`"),
            "{md}"
        );
        assert!(
            md.contains("delete configmap pgfleet-run-r --cascade=foreground"),
            "{md}"
        );
        let (md, _) = render(&serde_json::json!({"run_id": "r"}));
        assert!(!md.contains("Kept for debugging"), "{md}");
    }

    /// A restore from a volume snapshot says how the snapshot's blocks
    /// were read first, by which cell; an unhydrated one is said in bold.
    #[test]
    fn datasets_say_how_a_snapshots_volume_was_hydrated() {
        let cell = |id: &str, h: serde_json::Value| {
            serde_json::json!({"cell_id": id, "agent": "g0", "environment": {"dataset": {
                "fingerprint": "pgbench-s500-x", "how": "restored", "cache": "rewarmed", "hydration": h}}})
        };
        let h = serde_json::json!({"snapshot": "pgfleet-r-gp3-0-datasets", "mode": "read-all", "hydrated": true,
            "by_cell": "a", "ttfb_ms": 41.5, "seconds": 310.2, "bytes": 7_600_000_000u64, "mb_per_s": 24.5});
        let lazy =
            serde_json::json!({"snapshot": "s2", "mode": "none", "hydrated": false, "bytes": 0});
        let mut own = cell("d", h.clone());
        own["environment"]["dataset"]["method"] = "in-place".into();
        own["environment"]["dataset"]["store"] = "/cells/0/datasets".into();
        let (md, _) = render(&serde_json::json!({"run_id": "r",
            "cells": [cell("a", h.clone()), cell("b", h), cell("c", lazy), own]}));
        assert!(
            md.contains("in place on a volume of its own (/cells/0/datasets), no copy"),
            "{md}"
        );
        assert_eq!(
            md.matches("no copy").count(),
            2,
            "the intro and cell d alone: {md}"
        );
        assert!(
            md.contains("volume from snapshot pgfleet-r-gp3-0-datasets, hydrated by this cell: first byte after 42 ms, 7.1 GiB in 310.2 s (24 MB/s)"),
            "{md}"
        );
        assert!(md.contains("hydrated by cell a: first byte"), "{md}");
        assert!(
            md.contains("**not hydrated** (volume from snapshot s2, `hydrate: none`)"),
            "{md}"
        );
    }

    /// Each cell's time beside its estimate, and how the estimates held:
    /// the run's wall clock and the succeeded cells' ratios.
    #[test]
    fn cells_show_their_time_against_the_estimate() {
        let doc = serde_json::json!({"run_id": "r", "seconds": 600.0, "estimated_seconds": 480.0,
            "cells": [
                {"cell_id": "a", "state": "succeeded", "seconds": 100.0, "estimate_seconds": 80.0},
                {"cell_id": "b", "state": "succeeded", "seconds": 50.0, "estimate_seconds": 100.0},
                {"cell_id": "c", "state": "succeeded", "seconds": 90.0, "estimate_seconds": 100.0},
                {"cell_id": "d", "state": "failed", "seconds": 1.0, "estimate_seconds": 100.0},
                {"cell_id": "e", "state": "pending"}]});
        let (md, _) = render(&doc);
        assert!(
            md.contains("| a |  | succeeded | 100 s | 80 s |  |"),
            "{md}"
        );
        assert!(md.contains("| e |  | pending |  |  |  |"), "{md}");
        assert!(
            md.contains("the run took 10 min against an estimate of 8 min (1.25x)"),
            "{md}"
        );
        assert!(
            md.contains("took 0.90x their estimates (median; 0.50x to 1.25x), 2 of 3 within ±30 %"),
            "{md}"
        );
        // A run stored before estimates were: no line.
        let (md, _) = render(
            &serde_json::json!({"run_id": "r", "cells": [{"cell_id": "a", "state": "succeeded", "seconds": 3.0}]}),
        );
        assert!(!md.contains("Estimates:"), "{md}");
    }

    #[test]
    fn labels_render_as_code_in_the_header() {
        let doc = serde_json::json!({"run_id": "r", "status": "succeeded",
            "labels": {"branch": "main", "note": "a|b`c"}});
        let (md, _) = render(&doc);
        assert!(
            md.contains("| labels | ` branch=main ` `` note=a\\|b`c `` |\n"),
            "{md}"
        );
        let (md, _) = render(&serde_json::json!({"run_id": "r", "labels": {}}));
        assert!(!md.contains("| labels |"), "{md}");
    }

    /// The cost section: per class, and the cost of a million
    /// transactions against the baseline class beside the TPS ratio.
    #[test]
    fn costs_render_per_class_with_ratios() {
        let doc = serde_json::json!({"run_id": "r",
            "comparisons": [{"baseline_class": "nvme"}],
            "summaries": [{"workload": "pgbench", "classes": {
                "nvme": {"tps": {"value": 10000.0}}, "gp3": {"tps": {"value": 1000.0}}}}],
            "costs": {"currency": "USD", "classes": {
                "gp3": {"per_hour": 1.1, "run": 2.2, "cell_hours": 2.0, "per_million_transactions": 0.30556},
                "nvme": {"per_hour": 1.0, "run": 0.5, "cell_hours": 0.5, "per_million_transactions": 0.027778}}}});
        let (md, _) = render(&doc);
        assert!(md.contains("## Cost (USD)"), "{md}");
        // Both tables start at the line's start (an indented one is code).
        assert!(md.contains("\n| class | per hour |"), "{md}");
        assert!(md.contains("\n| ratio | per hour |"), "{md}");
        assert!(
            md.contains("| gp3 | 1.10 USD | 2.20 USD (2.00 h) | 0.306 USD | – | – |"),
            "{md}"
        );
        assert!(
            md.contains("| gp3 / nvme | 1.10x | 0.10x | 11.00x | – | – |"),
            "{md}"
        );
        let (md, _) = render(&serde_json::json!({"run_id": "r"}));
        assert!(!md.contains("## Cost"), "{md}");
    }

    /// A class with emulated caps gets the note of what emulation cannot
    /// express; a report without one does not.
    #[test]
    fn emulated_storage_says_what_it_cannot_express() {
        let env = |emulated: bool, iops: u64| {
            serde_json::json!({"run_id": "r", "environment": {"instance_classes": {"gp3": {
                "storage": {"profile": "gp3", "emulated": emulated, "caps": {"read_iops": iops}}}}}})
        };
        let (md, _) = render(&env(true, 375));
        assert!(md.contains("Emulated storage (`gp3`) caps rates"), "{md}");
        assert!(md.contains("adds no per-I/O latency"), "{md}");
        for doc in [env(false, 375), env(true, 0)] {
            let (md, _) = render(&doc);
            assert!(!md.contains("Emulated storage ("), "{md}");
        }
    }

    /// The storage-suite table carries the cost of a million transactions
    /// when the classes are priced, and its ratio beside the TPS ratio.
    #[test]
    fn the_storage_table_shows_cost_beside_tps() {
        let class = |tps: f64, vac: f64| {
            serde_json::json!({
            "tps": {"value": tps, "min": tps, "max": tps},
            "vacuum_seconds": {"value": vac, "min": vac, "max": vac}})
        };
        let mut doc = serde_json::json!({"run_id": "r",
            "comparisons": [{"baseline_class": "nvme"}],
            "summaries": [
                {"workload": "pgbench", "classes": {"nvme": class(10000.0, 0.0), "gp3": class(1000.0, 0.0)}},
                {"workload": "vacuum-bloat", "classes": {"nvme": class(0.0, 10.0), "gp3": class(0.0, 26.0)}}],
            "costs": {"currency": "USD", "classes": {
                "gp3": {"per_million_transactions": 0.30556},
                "nvme": {"per_million_transactions": 0.027778}}}});
        let (md, _) = render(&doc);
        assert!(
            md.contains("| drain s | USD per 1M transactions |\n|---|---|---|---|---|---|"),
            "{md}"
        );
        assert!(md.contains("| **gp3 / nvme** | 0.10x |"), "{md}");
        assert!(md.contains(" | 11.00x |\n"), "{md}");
        doc["costs"] = serde_json::json!(null);
        let (md, _) = render(&doc);
        assert!(md.contains("| drain s |\n|---|---|---|---|---|\n"), "{md}");
    }
}
