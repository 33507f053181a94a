//! report.md: run summary, cells, environment, and per workload the
//! article-style tables with their plots.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use pgfleet_proto::environment::Caps;
use pgfleet_proto::workload::{
    Kind, Metric, approx_bytes, approx_seconds, logical_drain, pgbench, vacuum_bloat,
};
use serde::de::DeserializeOwned;

use crate::checks::{point_label, shown_number};
use crate::document::{Cell, ClassCost, Judged, Report, ResultRow, Verdict};
use crate::table::{Plots, Row, Section, figure_cell, sig};

/// The section of `kind`: one arm per kind, so a kind without a section
/// does not compile. Sections appear in the kinds' table order.
pub(super) fn section(
    kind: Kind,
    md: &mut String,
    plots: &mut Plots,
    doc: &Report,
    results: &[&ResultRow],
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
    doc: &Report,
    results: &[&ResultRow],
) {
    let mut rows = Vec::new();
    let mut unread = Vec::new();
    for r in results {
        let params = serde_json::Value::Object(r.params.clone());
        match (P::deserialize(&params), M::deserialize(&r.metrics)) {
            (Ok(params), Ok(metrics)) => rows.push(Row {
                cell_id: &r.cell_id,
                class: r.class(),
                agent: r.agent.as_deref().unwrap_or(""),
                params,
                metrics,
                raw: r,
            }),
            (Err(e), _) | (_, Err(e)) => unread.push(format!("`{}` ({e})", r.cell_id)),
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

/// A check's verdict as the report marks it.
fn mark(e: &Judged) -> &'static str {
    match (e.verdict, e.passes) {
        (Verdict::Passed, _) => "✅ passed",
        (Verdict::Failed, _) => "❌ failed",
        (_, true) => "⚠️ inconclusive (counts as passed)",
        _ => "⚠️ inconclusive",
    }
}

/// The checks' verdicts, first: what a pipeline gates on.
fn checks(md: &mut String, doc: &Report) {
    let list = &doc.checks;
    if list.is_empty() {
        return;
    }
    let sm = &doc.check_summary;
    let _ = writeln!(
        md,
        "## Checks: {}\n\n{} passed, {} failed, {} inconclusive (an interval straddling its bound counts as failed unless the check says `inconclusive: pass`).\n\n\
         | | check | point | figure | observed | interval | bound | clusters |\n|---|---|---|---|---|---|---|---|",
        if sm.ok { "passed" } else { "FAILED" },
        sm.passed,
        sm.failed,
        sm.inconclusive
    );
    for e in list {
        let figure = match &e.baseline {
            Some(b) => format!("{} {} / {b}", e.metric, e.class),
            None => format!("{} of {}", e.metric, e.class),
        };
        let bound = match (e.min, e.max) {
            (Some(lo), Some(hi)) => format!("{} … {}", sig(lo), sig(hi)),
            (Some(lo), None) => format!("≥ {}", sig(lo)),
            (None, Some(hi)) => format!("≤ {}", sig(hi)),
            _ => String::new(),
        };
        let clusters = e
            .clusters
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let [lo, hi] = e.interval.unwrap_or([None, None]);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {figure} | {} | {:.0} %: {}–{} | {bound} | {clusters} |",
            mark(e),
            md_text(&e.name),
            md_text(&point_label(e)),
            shown_number(e.observed),
            e.confidence * 100.0,
            shown_number(lo),
            shown_number(hi),
        );
    }
    for e in list {
        if let Some(note) = &e.note {
            let _ = writeln!(md, "\n- {}: {}", md_text(&e.name), md_text(note));
        }
    }
    md.push('\n');
}

/// What a Kubernetes run kept for debugging (`cleanup: keep`), with how
/// to look at it and when it goes.
fn kept(md: &mut String, doc: &Report) {
    let Some(k) = &doc.kept else {
        return;
    };
    let ns = &k.namespace;
    let _ = writeln!(
        md,
        "## Kept for debugging

`cleanup:` kept this run's objects in namespace `{ns}` until {} (then serve deletes them):
",
        k.until
    );
    for o in &k.objects {
        let _ = writeln!(md, "- `{o}`");
    }
    let pod = k
        .objects
        .iter()
        .find(|o| o.starts_with("pod/"))
        .map_or("pod/NAME", String::as_str);
    let _ = writeln!(
        md,
        "
An agent's log: `kubectl -n {ns} logs {pod}`. Delete them now: `kubectl -n {ns} delete configmap {} --cascade=foreground`.
",
        k.owner
    );
}

/// Returns the markdown and the plots it embeds (file name, SVG).
pub fn render(doc: &Report) -> (String, Vec<(String, String)>) {
    let mut md = String::new();
    let mut plots = Vec::new();
    let _ = writeln!(md, "# pgfleet run {}\n", doc.run_id);
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(
        md,
        "| scenario | `{}` ({}) |",
        doc.scenario, doc.scenario_path
    );
    let _ = writeln!(md, "| status | **{}** |", doc.status);
    let _ = writeln!(md, "| started | {} |", doc.started_at);
    let _ = writeln!(
        md,
        "| finished | {} |",
        doc.finished_at.as_deref().unwrap_or("")
    );
    if !doc.labels.0.is_empty() {
        // Labels are the submitter's text: shown as code, never as Markdown.
        let shown: Vec<String> = doc
            .labels
            .0
            .iter()
            .map(|(k, v)| inline_code(&format!("{k}={v}")))
            .collect();
        let _ = writeln!(md, "| labels | {} |", shown.join(" "));
    }
    md.push('\n');
    checks(&mut md, doc);
    for w in &doc.warnings {
        let _ = writeln!(md, "> ⚠️ {}\n", w.trim_start_matches("warning: "));
    }

    kept(&mut md, doc);
    history_checks(&mut md, &mut plots, doc);
    storage_classes(&mut md, doc);
    costs(&mut md, doc);
    environment(&mut md, doc);
    emulation_limits(&mut md, doc);
    roles(&mut md, doc);
    cells(&mut md, doc);
    estimates(&mut md, doc);

    datasets(&mut md, doc);
    super::curves::render(&mut md, &mut plots, doc);

    for kind in Kind::ALL {
        let results: Vec<&ResultRow> = doc
            .results
            .iter()
            .filter(|r| r.workload() == kind.name())
            .collect();
        if !results.is_empty() {
            section(*kind, &mut md, &mut plots, doc, &results);
        }
    }
    (md, plots)
}

/// A class's storage in words: its caps as emulated (with what the fio
/// probe delivered), not applied, or the real device.
fn storage_words(storage: &pgfleet_proto::environment::Storage) -> String {
    let caps = &storage.caps;
    match (storage.emulated, caps.is_capped()) {
        (true, _) => {
            let d = storage.delivered.as_ref();
            let got = |k: &str| shown_number(d.and_then(|d| d.of(k)).map(|p| p.delivered));
            let probe = match d {
                Some(d) if d.error.is_some() => "; not probed".to_string(),
                Some(_) => format!(
                    "; fio probe delivered {}/{} IOPS, {}/{} MiB/s",
                    got("read_iops"),
                    got("write_iops"),
                    got("read_mbps"),
                    got("write_mbps")
                ),
                None => String::new(),
            };
            // A served volume's per-I/O latency, and what one I/O at a time took.
            let l = caps.latency;
            let latency = if l.is_zero() {
                String::new()
            } else {
                let ms = |us: u32| f64::from(us) / 1000.0;
                let took = match d.filter(|d| d.error.is_none()) {
                    Some(_) => format!(
                        " (probe at queue depth 1: {}/{}/{} ms)",
                        got("read_latency_ms"),
                        got("write_latency_ms"),
                        got("fdatasync_latency_ms")
                    ),
                    None => String::new(),
                };
                format!(
                    "; {}/{}/{} ms a read/write/flush{took}",
                    ms(l.read_us),
                    ms(l.write_us),
                    ms(l.flush_us)
                )
            };
            let probe = format!("{latency}{probe}");
            let cap = |v: u64| match v {
                0 => "uncapped".to_string(),
                n => n.to_string(),
            };
            if caps.combined {
                format!(
                    "emulated: {} IOPS, {} MiB/s of reads and writes together{probe}",
                    cap(caps.read_iops),
                    cap(caps.read_mbps)
                )
            } else {
                format!(
                    "emulated: {}/{} IOPS, {}/{} MiB/s read/write{probe}",
                    cap(caps.read_iops),
                    cap(caps.write_iops),
                    cap(caps.read_mbps),
                    cap(caps.write_mbps)
                )
            }
        }
        (false, true) => "caps NOT applied (emulate: false), the disk as is".to_string(),
        (false, false) => "real".to_string(),
    }
}

/// The classes' environments: agents, PostgreSQL, instance, storage, host
/// and settings.
fn environment(md: &mut String, doc: &Report) {
    let _ = writeln!(md, "## Environment\n");
    let _ = writeln!(
        md,
        "| instance class | agents | PostgreSQL | instance | storage | host | settings |\n|---|---|---|---|---|---|---|"
    );
    for (name, c) in &doc.environment.instance_classes {
        let e = &c.env;
        let settings: Vec<String> = e
            .postgres
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mem = e.host.memory_bytes as f64 / (1u64 << 30) as f64;
        let i = &e.instance;
        let mut limits = Vec::new();
        if i.memory_bytes > 0 {
            limits.push(approx_bytes(i.memory_bytes));
        }
        if i.cpus > 0 {
            let n = i.cpus;
            limits.push(format!("{n} CPU{}", if n == 1 { "" } else { "s" }));
        }
        let t = i.instance_type.as_str();
        let instance = match (limits.is_empty(), i.emulated) {
            (true, _) if t.is_empty() => "the host".to_string(),
            (true, _) => format!("{t} (the host's memory and CPUs)"),
            (false, true) => format!("{t} {} (emulated)", limits.join(", "))
                .trim()
                .to_string(),
            (false, false) => format!("{t} {} (NOT emulated: the host's)", limits.join(", "))
                .trim()
                .to_string(),
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {instance} | {} ({}) | {} cores, {mem:.1} GiB | {} |",
            c.agents.join(", "),
            postgres_words(&e.postgres),
            e.storage.profile,
            storage_words(&e.storage),
            e.host.cores,
            settings.join(", ")
        );
    }
}

/// The server's version and the build options the experiments use.
fn postgres_words(p: &pgfleet_proto::environment::Postgres) -> String {
    let version = pgfleet_proto::escape::markdown(&p.version);
    if p.build.is_empty() {
        version
    } else {
        format!("{version} with {}", p.build.join(", "))
    }
}

/// Every cell: its agent, state, time beside its estimate (of it moving
/// data, and the estimate by phase), and error.
fn cells(md: &mut String, doc: &Report) {
    let _ = writeln!(
        md,
        "\n## Cells\n\n| cell | agent | state | took | of it data | estimated | by phase | error |\n|---|---|---|---|---|---|---|---|"
    );
    let secs = |v: Option<f64>| v.map(approx_seconds).unwrap_or_default();
    for c in &doc.cells {
        let data = c
            .dataset()
            .filter(|_| c.seconds.is_some())
            .map(|d| d.data_seconds(&c.cell_id));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            c.cell_id,
            c.agent.as_deref().unwrap_or(""),
            c.state,
            secs(c.seconds),
            secs(data),
            secs(c.estimate_seconds),
            c.estimate_phases.map(|p| p.describe()).unwrap_or_default(),
            md_text(c.error.as_deref().unwrap_or(""))
        );
    }
}

/// How the plan's estimates held: the run's wall clock and the succeeded
/// cells' times against their estimates (what `validate` and the ETA
/// said), so a user sees when to trust them.
fn estimates(md: &mut String, doc: &Report) {
    let ratios: Vec<f64> = doc
        .cells
        .iter()
        .filter(|c| c.state == "succeeded")
        .filter_map(|c| {
            let (took, est) = (c.seconds?, c.estimate_seconds?);
            (est > 0.0).then_some(took / est)
        })
        .collect();
    let mut parts = Vec::new();
    if let (Some(took), Some(est)) = (doc.seconds, doc.estimated_seconds.filter(|e| *e > 0.0)) {
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
    let phases: Vec<_> = doc.cells.iter().filter_map(|c| c.estimate_phases).collect();
    if !phases.is_empty() {
        parts.push(format!(
            "of the cells' estimated time, {}",
            pgfleet_proto::workload::Phases::sum(&phases).shares()
        ));
    }
    let (took, data) = doc
        .cells
        .iter()
        .filter(|c| c.state == "succeeded")
        .filter_map(|c| {
            Some((
                c.seconds?,
                c.dataset().map_or(0.0, |d| d.data_seconds(&c.cell_id)),
            ))
        })
        .fold((0.0, 0.0), |a, (t, d)| (a.0 + t, a.1 + d));
    if took > 0.0 && data > 0.0 {
        parts.push(format!(
            "the succeeded cells spent {:.0} % of their time moving data",
            100.0 * data / took
        ));
    }
    if !parts.is_empty() {
        let _ = writeln!(
            md,
            "\nEstimates: {}. They come from each kind's work (CPU time, bytes, I/Os) over the class's CPUs and storage caps, corrected by what earlier cells took against the model where the store held any: moving data by cells of the same class that came by it the same way, the rest by cells of the same kind and class (`pgfleet validate` lists the corrections and their runs); this run's cells correct the next run's.",
            parts.join("; ")
        );
    }
}

/// The seeds/002 talk's table: each column's kind and metric (its
/// declaration), decimals, and the talk's figures for NVMe, then EBS gp3.
const SEEDS: &[(Kind, Metric, usize, f64, f64)] = &[
    (Kind::Pgbench, pgbench::TPS, 0, 16_030.0, 1_734.0),
    (Kind::Pgbench, pgbench::LATENCY_MS_MEAN, 3, 4.0, 36.9),
    (
        Kind::VacuumBloat,
        vacuum_bloat::VACUUM_SECONDS,
        1,
        366.0,
        964.0,
    ),
    (
        Kind::LogicalDrain,
        logical_drain::DRAIN_SECONDS,
        1,
        139.0,
        238.0,
    ),
];

/// The talk's table (seeds/002), when a run measured more than one of its
/// three measurements: per class the median TPS, latency, VACUUM and drain
/// seconds with min–max, each class's ratio to the first, and the seeds'
/// published figures.
fn storage_classes(md: &mut String, doc: &Report) {
    let first = |kind: Kind| doc.summaries.iter().find(|s| s.workload == kind.name());
    let present = [Kind::Pgbench, Kind::VacuumBloat, Kind::LogicalDrain]
        .into_iter()
        .filter(|k| first(*k).is_some())
        .count();
    if present < 2 {
        return;
    }
    let mut classes: Vec<String> = Vec::new();
    for sm in &doc.summaries {
        for c in sm.classes.keys() {
            if !classes.contains(c) {
                classes.push(c.clone());
            }
        }
    }
    // The baseline is the first class of the fleet, as in the comparisons.
    if let Some(b) = doc.baseline_class() {
        classes.retain(|c| c != b);
        classes.insert(0, b.to_string());
    }
    // With prices: what a million transactions cost per class, beside TPS
    // (the figure that decides between instance storage and gp3).
    let cost = |class: &str| {
        doc.costs
            .as_ref()?
            .classes
            .get(class)?
            .per_million_transactions
    };
    let currency = doc.costs.as_ref().map_or("", |c| c.currency.as_str());
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
    let figure = |class: &str, kind: Kind, metric: Metric, d: usize| -> (String, Option<f64>) {
        match first(kind).and_then(|s| s.figure(class, metric.name)) {
            Some(x) => (figure_cell(Some(x), d, false), Some(x.value)),
            None => ("–".into(), None),
        }
    };
    let mut medians: Vec<Vec<Option<f64>>> = Vec::new();
    for c in &classes {
        let mut cells: Vec<(String, Option<f64>)> = SEEDS
            .iter()
            .map(|(k, m, d, _, _)| figure(c, *k, *m, *d))
            .collect();
        if priced {
            cells.push((shown_number(cost(c)), cost(c)));
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
    let mut seeds: Vec<String> = SEEDS.iter().map(|s| format!("{} / {}", s.3, s.4)).collect();
    let mut ratios: Vec<String> = SEEDS.iter().map(|s| format!("{:.2}x", s.4 / s.3)).collect();
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
fn emulation_limits(md: &mut String, doc: &Report) {
    let emulated: Vec<&String> = doc
        .environment
        .instance_classes
        .iter()
        .filter(|(_, c)| c.env.storage.emulated && Caps::is_capped(&c.env.storage.caps))
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
fn history_checks(md: &mut String, plots: &mut Vec<(String, String)>, doc: &Report) {
    let judged: Vec<(&Judged, &crate::document::HistoryJudgement, &Vec<f64>)> = doc
        .checks
        .iter()
        .filter_map(|c| {
            let h = c.history.as_ref()?;
            Some((c, h, h.values.as_ref()?))
        })
        .collect();
    if judged.is_empty() {
        return;
    }
    let _ = writeln!(md, "## History checks\n");
    for (i, (c, h, values)) in judged.into_iter().enumerate() {
        let start = h.segment_start.unwrap_or(0);
        let median = h.segment_median.unwrap_or(f64::NAN);
        let this = c.observed.map(|r| r * median);
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
        let (metric, class) = (&c.metric, &c.class);
        let name = format!("history-check-{i}.svg");
        plots.push((
            name.clone(),
            super::plot::line_chart(
                &format!("{}: {metric} of {class} over runs", c.name),
                "run (oldest first; the last is this one)",
                metric,
                &series,
            ),
        ));
        let _ = writeln!(
            md,
            "**{}** ({} earlier comparable runs, {} change point(s); the whole series: `pgfleet history {} --metric {metric} --class {class}`, or `GET /v1/history?scenario={}&metric={metric}&class={class}` on serve)\n\n![{metric} over runs]({name})\n",
            md_text(&c.name),
            values.len(),
            h.change_points
                .map_or("null".to_string(), |n| n.to_string()),
            doc.scenario,
            doc.scenario,
        );
    }
}

/// The run's cost per class (`report/cost.rs`), and against the first
/// class: the cost of a million transactions beside the TPS ratio (the
/// figure that decides between instance NVMe and gp3).
fn costs(md: &mut String, doc: &Report) {
    let Some(costs) = doc.costs.as_ref().filter(|c| !c.classes.is_empty()) else {
        return;
    };
    let classes = &costs.classes;
    let cur = costs.currency.as_str();
    let money = |v: Option<f64>| match v {
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
            money(Some(c.per_hour)),
            money(Some(c.run)),
            c.cell_hours,
            money(c.per_million_transactions),
            money(c.per_vacuum),
            money(c.per_drain),
        );
    }
    // Ratios against the comparisons' baseline class (else the first).
    let baseline = doc
        .baseline_class()
        .filter(|b| classes.contains_key(*b))
        .or_else(|| classes.keys().next().map(String::as_str))
        .unwrap_or("");
    let tps = |class: &str| {
        super::figure::first_value(
            &doc.summaries,
            Kind::Pgbench.name(),
            class,
            pgbench::TPS.name,
        )
    };
    let Some(b) = classes.get(baseline) else {
        return;
    };
    let mut rows = Vec::new();
    for (class, c) in classes.iter().filter(|(k, _)| k.as_str() != baseline) {
        let ratio = |k: fn(&ClassCost) -> Option<f64>| match (k(c), k(b)) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
            _ => "–".into(),
        };
        let tps_ratio = match (tps(class), tps(baseline)) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
            _ => "–".into(),
        };
        rows.push(format!(
            "| {class} / {baseline} | {} | {tps_ratio} | {} | {} | {} |",
            ratio(|c| Some(c.per_hour)),
            ratio(|c| c.per_million_transactions),
            ratio(|c| c.per_vacuum),
            ratio(|c| c.per_drain)
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
fn datasets(md: &mut String, doc: &Report) {
    let cells: Vec<(&Cell, pgfleet_proto::dataset::Provenance)> = doc
        .cells
        .iter()
        .filter_map(|c| Some((c, c.dataset()?)))
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
    let secs = |x: f64| {
        if x > 0.0 {
            format!("{x:.1}")
        } else {
            "–".into()
        }
    };
    let mut stores: BTreeMap<String, BTreeSet<String>> = Default::default();
    for (c, d) in cells {
        let agent = c.agent.clone().unwrap_or_default();
        if !d.store.is_empty() {
            stores.entry(d.store.clone()).or_default().insert(agent);
        }
        let mut note = Vec::new();
        if !d.built_by.is_empty() {
            note.push(format!("built by {}", d.built_by));
        }
        if d.method == "in-place" {
            note.push(format!(
                "in place on a volume of its own ({}), no copy",
                d.store
            ));
        }
        if let Some(why) = &d.discarded {
            note.push(format!("**a published copy did not match its manifest and was discarded** ({why}); this cell built it again"));
        }
        if let Some(why) = &d.not_published {
            note.push(format!("not published: {why}"));
        }
        // The object store behind the agents' stores (`--dataset-remote`).
        if d.download_seconds > 0.0 {
            note.push(format!(
                "downloaded from {} in {:.1} s ({:.0} MB/s)",
                d.remote, d.download_seconds, d.download_mb_per_s
            ));
        }
        if d.upload_seconds > 0.0 {
            note.push(format!(
                "uploaded to {} in {:.1} s ({} compressed)",
                d.remote,
                d.upload_seconds,
                approx_bytes(d.uploaded_bytes)
            ));
        }
        if let Some(why) = &d.remote_error {
            note.push(format!("the remote store was not used: {why}"));
        }
        if !d.reused_from.is_empty() {
            note.push(format!(
                "**reused the cluster of cell {}** (cell {} on it), reset in {:.1} s",
                d.reused_from, d.reused_by_cells, d.reset_seconds
            ));
        }
        if let Some(why) = &d.not_reused {
            note.push(format!("not reused: {why}"));
        }
        if let Some(h) = &d.hydration {
            let snap = &h.snapshot;
            note.push(if !h.hydrated {
                format!("**not hydrated** (volume from snapshot {snap}, `hydrate: none`): its figures include the lazy restore")
            } else {
                format!(
                    "volume from snapshot {snap}, hydrated {}: first byte after {:.0} ms, {} in {:.1} s ({:.0} MB/s)",
                    if h.by_cell == c.cell_id { "by this cell".to_string() } else { format!("by cell {}", h.by_cell) },
                    h.ttfb_ms,
                    approx_bytes(h.bytes),
                    h.seconds,
                    h.mb_per_s,
                )
            });
        }
        let _ = writeln!(
            md,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.cell_id,
            if d.fingerprint.is_empty() {
                &d.label
            } else {
                &d.fingerprint
            },
            d.how,
            secs(d.wait_seconds),
            secs(d.load_seconds),
            secs(d.publish_seconds),
            secs(d.restore_seconds),
            secs(d.restore_mb_per_s),
            d.cache,
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
fn roles(md: &mut String, doc: &Report) {
    for (name, c) in &doc.environment.instance_classes {
        let Some(r) = &c.env.roles else {
            continue;
        };
        let how = if r.scenario_sql_superuser {
            "**a superuser** (the scenario set allow_shell)"
        } else {
            "no superuser, no server-file or server-program roles"
        };
        let _ = writeln!(
            md,
            "\nClass `{name}`: scenario SQL (scripts, defines, setup_sql) ran as `{}` ({how}); pgfleet's own steps (loading, statistics, CHECKPOINT, cache eviction) as `{}`.",
            r.scenario_sql, r.agent_steps
        );
    }
}

/// Text from outside (a check's name, a server's error) as Markdown text.
fn md_text(text: &str) -> String {
    pgfleet_proto::escape::markdown(text)
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
    // One line, no control character: a table row ends at a line break.
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.replace('|', "\\|");
    format!("{fence} {text} {fence}")
}

#[cfg(test)]
mod render_tests {
    fn render(v: serde_json::Value) -> (String, Vec<(String, String)>) {
        super::render(&serde_json::from_value(v).unwrap())
    }

    /// Labels show under the run's header as code: a `|` or a backtick in
    /// a value neither splits the table nor ends the code span.
    /// A cell's error from a server (markup, a link, an image, an escape
    /// sequence, a line break, a `|`) stays text in one table row.
    #[test]
    fn hostile_text_stays_text_in_report_md() {
        let (md, _) = render(serde_json::json!({"run_id": "r", "cells": [{
            "cell_id": "w0-local-a", "state": "failed",
            "error": "ERROR: <img src=x onerror=alert(1)> [x](http://evil) ![i](y)\u{1b}[2J\nnext | col"}]}));
        let row = md
            .lines()
            .find(|l| l.starts_with("| w0-local-a |"))
            .unwrap_or_else(|| panic!("{md}"));
        assert!(row.ends_with(" |"), "one row: {row}");
        assert_eq!(row.matches(" | ").count(), 7, "{row}");
        assert!(!md.contains("<img") && !md.contains("](http"), "{md}");
        assert!(!md.chars().any(|c| c.is_control() && c != '\n'), "{md:?}");
    }

    #[test]
    fn kept_objects_are_listed_with_how_to_look_and_when_they_go() {
        let (md, _) = render(serde_json::json!({"run_id": "r", "kept": {
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
        let (md, _) = render(serde_json::json!({"run_id": "r"}));
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
        let (md, _) = render(serde_json::json!({"run_id": "r",
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
                {"cell_id": "a", "state": "succeeded", "seconds": 100.0, "estimate_seconds": 80.0,
                 "estimate_phases": {"data": 50.0, "prepare": 10.0, "measure": 15.0, "other": 5.0},
                 "environment": {"dataset": {"how": "restored", "restore_seconds": 30.0, "rewarm_seconds": 10.0}}},
                {"cell_id": "b", "state": "succeeded", "seconds": 50.0, "estimate_seconds": 100.0,
                 "estimate_phases": {"data": 30.0, "prepare": 0.0, "measure": 60.0, "other": 10.0}},
                {"cell_id": "c", "state": "succeeded", "seconds": 90.0, "estimate_seconds": 100.0},
                {"cell_id": "d", "state": "failed", "seconds": 1.0, "estimate_seconds": 100.0},
                {"cell_id": "e", "state": "pending"}]});
        let (md, _) = render(doc.clone());
        assert!(
            md.contains(
                "| a |  | succeeded | 100 s | 40 s | 80 s | data 50 s · prepare 10 s · measure 15 s · other 5 s |  |"
            ),
            "{md}"
        );
        assert!(md.contains("| e |  | pending |  |  |  |  |  |"), "{md}");
        // Of 180 s estimated for a and b: data 80, prepare 10, measure 75,
        // other 15; of the 240 s the succeeded cells took, a moved data 40.
        assert!(
            md.contains("of the cells' estimated time, data movement 44 %, preparation 6 %, measuring 42 %, the rest 8 %"),
            "{md}"
        );
        assert!(
            md.contains("the succeeded cells spent 17 % of their time moving data"),
            "{md}"
        );
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
            serde_json::json!({"run_id": "r", "cells": [{"cell_id": "a", "state": "succeeded", "seconds": 3.0}]}),
        );
        assert!(!md.contains("Estimates:"), "{md}");
    }

    #[test]
    fn labels_render_as_code_in_the_header() {
        let doc = serde_json::json!({"run_id": "r", "status": "succeeded",
            "labels": {"branch": "main", "note": "a|b`c"}});
        let (md, _) = render(doc.clone());
        assert!(
            md.contains("| labels | ` branch=main ` `` note=a\\|b`c `` |\n"),
            "{md}"
        );
        let (md, _) = render(serde_json::json!({"run_id": "r", "labels": {}}));
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
        let (md, _) = render(doc.clone());
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
        let (md, _) = render(serde_json::json!({"run_id": "r"}));
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
        let (md, _) = render(env(true, 375));
        assert!(md.contains("Emulated storage (`gp3`) caps rates"), "{md}");
        assert!(md.contains("adds no per-I/O latency"), "{md}");
        for doc in [env(false, 375), env(true, 0)] {
            let (md, _) = render(doc);
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
        let (md, _) = render(doc.clone());
        assert!(
            md.contains("| drain s | USD per 1M transactions |\n|---|---|---|---|---|---|"),
            "{md}"
        );
        assert!(md.contains("| **gp3 / nvme** | 0.10x |"), "{md}");
        assert!(md.contains(" | 11.00x |\n"), "{md}");
        doc["costs"] = serde_json::json!(null);
        let (md, _) = render(doc.clone());
        assert!(md.contains("| drain s |\n|---|---|---|---|---|\n"), "{md}");
    }
}
