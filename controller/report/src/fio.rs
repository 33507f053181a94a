//! report.md's fio section: what each class's storage delivered to fio in
//! the cluster's cgroups, job by job, next to the caps its profile asks
//! for; plots of IOPS and p99 latency against queue depth per class.

use crate::Report;
use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value as Json;

use super::plot::{Series, line_chart};
use super::table::{Plots, Row, by_class, mib, sig};
use crate::document::Summary;
use pgfleet_proto::environment::Storage;
use pgfleet_proto::workload::fio::{Metrics, PointParams};
use serde::Deserialize;

/// The cap a job is held to by the class's profile, when emulated and
/// capped: (unit, value).
fn cap(storage: &Storage, p: &PointParams) -> Option<(&'static str, f64)> {
    if !storage.emulated {
        return None;
    }
    let caps = &storage.caps;
    let read = p.job.contains("read");
    let (unit, v) = match (p.job.starts_with("seq-"), read) {
        (true, true) => ("MiB/s", caps.read_mbps),
        (true, false) => ("MiB/s", caps.write_mbps),
        (false, true) => ("IOPS", caps.read_iops),
        (false, false) => ("IOPS", caps.write_iops),
    };
    (v > 0).then_some((unit, v as f64))
}

pub fn section(
    md: &mut String,
    plots: &mut Plots,
    doc: &Report,
    results: &[Row<PointParams, Metrics>],
) {
    let _ = writeln!(
        md,
        "\n## fio: what the storage delivered\n\n\
         fio on each class's data volume, in the cgroups of that class's clusters (emulated instance and \
         storage caps). Random jobs: 8 KiB (PostgreSQL's page); sequential: 1 MiB; wal-fsync: 8 KiB writes \
         each followed by fdatasync (latencies are the fdatasync's, what a commit waits for). Latency is total \
         per I/O. \"of cap\" = the job's IOPS (random) or MiB/s (sequential) against the profile's emulated cap. \
         Device MiB: the cluster's own device (its loop device, exact, or its block-I/O cgroup; ramp and file \
         layout included; – where not accounted)."
    );
    let classes = &doc.environment.instance_classes;
    let mut by_job: BTreeMap<String, Vec<(String, u32, Metrics)>> = BTreeMap::new();
    for (class, rs) in by_class(results) {
        let storage = classes
            .get(class)
            .map(|c| c.env.storage.clone())
            .unwrap_or_default();
        let storage = &storage;
        let profile = if storage.profile.is_empty() {
            "?"
        } else {
            storage.profile.as_str()
        };
        let how = if storage.emulated {
            "emulated"
        } else {
            "the host's own device, not emulated"
        };
        let _ = writeln!(
            md,
            "\n### {class} (storage {profile}: {how})\n\n\
             | job | block | QD | direct | IOPS | MiB/s | of cap | lat mean ms | p50 | p99 | p99.9 | device read MiB | device write MiB |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let mut fio_version = String::new();
        for r in &rs {
            let (p, m) = (&r.params, &r.metrics);
            let of_cap = cap(storage, p)
                .map(|(unit, v)| {
                    let got = if unit == "IOPS" { m.iops } else { m.mib_per_s };
                    format!("{:.0} % of {} {unit}", 100.0 * got / v, sig(v))
                })
                .unwrap_or_else(|| "–".into());
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {of_cap} | {} | {} | {} | {} | {} | {} |",
                p.job,
                pgfleet_proto::workload::human_bytes(p.block_size),
                p.queue_depth,
                if p.direct { "yes" } else { "no" },
                sig(m.iops),
                sig(m.mib_per_s),
                sig(m.latency_ms_mean),
                sig(m.latency_ms_p50),
                sig(m.latency_ms_p99),
                sig(m.latency_ms_p999),
                mib(m.device_read_bytes),
                mib(m.device_write_bytes),
            );
            fio_version = m.fio.clone();
            by_job.entry(p.job.clone()).or_default().push((
                class.to_string(),
                p.queue_depth,
                m.clone(),
            ));
        }
        if !fio_version.is_empty() {
            let _ = writeln!(md, "\n{fio_version}.");
        }
        if let Some(src) = rs.iter().find_map(|r| r.metrics.device_source.as_deref()) {
            let _ = writeln!(md, "Device bytes: {src}.");
        }
    }
    compare(md, doc);
    // Random jobs over several queue depths: the curve shows where the
    // device (or its cap) saturates and latency starts to queue.
    for (job, pts) in &by_job {
        let depths: std::collections::BTreeSet<u32> = pts.iter().map(|p| p.1).collect();
        if depths.len() < 2 {
            continue;
        }
        for (metric, label, get) in [
            (
                "iops",
                "IOPS",
                (|m: &Metrics| m.iops) as fn(&Metrics) -> f64,
            ),
            ("p99", "p99 latency, ms", |m: &Metrics| m.latency_ms_p99),
        ] {
            let mut series: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
            for (class, qd, m) in pts {
                series.entry(class).or_default().push((*qd as f64, get(m)));
            }
            let series: Vec<Series> = series
                .into_iter()
                .map(|(name, mut points)| {
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        name: name.to_string(),
                        points,
                        color: Some(super::plot::class_color(doc, name)),
                    }
                })
                .collect();
            let name = format!("fio-{job}-{metric}.svg");
            let svg = line_chart(
                &format!("fio {job}: {label} by queue depth"),
                "queue depth",
                label,
                &series,
            );
            let _ = writeln!(md, "\n![fio {job}: {label} by queue depth]({name})");
            plots.push((name, svg));
        }
    }
}

/// Each job's figures side by side per class (the class's median over its
/// cells), and each class's IOPS and p99 as a ratio to the baseline class
/// (the fleet's first, as in every comparison).
fn compare(md: &mut String, doc: &Report) {
    let Some(baseline) = doc
        .comparisons
        .iter()
        .find(|c| c.workload == "fio")
        .map(|c| c.baseline_class.as_str())
    else {
        return;
    };
    let summaries: Vec<&Summary> = doc.summaries_of("fio").collect();
    let Some(first) = summaries.first().map(|s| &s.classes) else {
        return;
    };
    let others: Vec<&str> = first
        .keys()
        .map(|k| k.as_str())
        .filter(|k| *k != baseline)
        .collect();
    let mut head = format!("| job | QD | {baseline} IOPS | {baseline} p99 ms |");
    let mut rule = String::from("|---|---|---|---|");
    for o in &others {
        head += &format!(" {o} IOPS | {o} p99 ms | IOPS {o} / {baseline} | p99 {o} / {baseline} |");
        rule += "---|---|---|---|";
    }
    let _ = writeln!(
        md,
        "
### Between classes (median over each class's cells; ratios to {baseline})

{head}
{rule}"
    );
    for sm in summaries {
        let sm_value = |class: &str, m: &str| sm.figure(class, m).map_or(f64::NAN, |f| f.value);
        let (base, v) = (baseline, &sm_value);
        let p = PointParams::deserialize(&Json::Object(sm.params.clone())).ok();
        let mut row = format!(
            "| {} | {} | {} | {} |",
            p.as_ref().map_or("", |p| p.job.as_str()),
            p.as_ref()
                .map_or("null".to_string(), |p| p.queue_depth.to_string()),
            sig(v(base, "iops")),
            sig(v(base, "latency_ms_p99")),
        );
        for o in &others {
            let c = *o;
            row += &format!(
                " {} | {} | {}x | {}x |",
                sig(v(c, "iops")),
                sig(v(c, "latency_ms_p99")),
                sig(v(c, "iops") / v(base, "iops")),
                sig(v(c, "latency_ms_p99") / v(base, "latency_ms_p99")),
            );
        }
        let _ = writeln!(md, "{row}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResultRow;
    use pgfleet_proto::workload::Kind;
    use serde_json::json;

    fn result(class: &str, job: &str, qd: u32, iops: f64) -> Json {
        json!({
            "workload": "fio", "instance_class": class, "cell_id": format!("{class}-fio"),
            "params": {"job": job, "block_size": 8192, "queue_depth": qd, "direct": true, "size_bytes": 1u64 << 30},
            "metrics": {"iops": iops, "mib_per_s": iops * 8192.0 / 1048576.0, "latency_ms_mean": 1.0,
                        "latency_ms_p50": 0.5, "latency_ms_p99": qd as f64, "latency_ms_p999": 2.0 * qd as f64,
                        "io_bytes": 1000, "runtime_s": 10.0, "device_read_bytes": 3u64 << 20, "fio": "fio-3.33"},
        })
    }

    #[test]
    fn each_class_against_its_caps_and_curves_by_queue_depth() {
        let doc = json!({"environment": {"instance_classes": {
            "nvme": {"storage": {"profile": "nvme", "emulated": false, "caps": {}}},
            "gp3": {"storage": {"profile": "gp3", "emulated": true,
                    "caps": {"read_iops": 3000, "write_iops": 3000, "read_mbps": 125, "write_mbps": 125}}},
        }}});
        let rs = [
            result("nvme", "rand-read", 1, 9000.0),
            result("nvme", "rand-read", 32, 90000.0),
            result("gp3", "rand-read", 1, 1500.0),
            result("gp3", "rand-read", 32, 2970.0),
        ];
        let rs: Vec<ResultRow> = rs
            .iter()
            .map(|r| serde_json::from_value(r.clone()).unwrap())
            .collect();
        let (summaries, comparisons) = super::super::summarize(&rs);
        let mut doc: Report = serde_json::from_value(doc).unwrap();
        doc.summaries = summaries;
        doc.comparisons = comparisons;
        let refs: Vec<&ResultRow> = rs.iter().collect();
        let (mut md, mut plots) = (String::new(), Vec::new());
        super::super::markdown::section(Kind::Fio, &mut md, &mut plots, &doc, &refs);
        assert!(md.contains("### gp3 (storage gp3: emulated)"), "{md}");
        assert!(
            md.contains("### nvme (storage nvme: the host's own device, not emulated)"),
            "{md}"
        );
        // gp3 at depth 32 reached 99 % of its 3,000 IOPS cap; nvme has none.
        assert!(
            md.contains("| rand-read | 8KiB | 32 | yes | 2970 | 23.20 | 99 % of 3000 IOPS |"),
            "{md}"
        );
        assert!(
            md.contains("| rand-read | 8KiB | 1 | yes | 9000 | 70.31 | – |"),
            "{md}"
        );
        assert!(md.contains("| 3.0 |"), "device read MiB: {md}");
        // The classes side by side, ratios to the first class that reported.
        assert!(
            md.contains("| job | QD | nvme IOPS | nvme p99 ms | gp3 IOPS | gp3 p99 ms | IOPS gp3 / nvme | p99 gp3 / nvme |"),
            "{md}"
        );
        assert!(
            md.contains("| rand-read | 32 | 90000 | 32.00 | 2970 | 32.00 | 0.0330x | 1.00x |"),
            "{md}"
        );
        let names: Vec<&str> = plots.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(names, ["fio-rand-read-iops.svg", "fio-rand-read-p99.svg"]);
        assert!(plots[0].1.contains("gp3") && plots[0].1.contains("nvme"));
        assert!(!md.contains("could not be read"), "{md}");
    }

    /// A result whose figures this version cannot read (stored by another
    /// one) is named under the section; the others still render.
    #[test]
    fn unreadable_results_are_named_not_fatal() {
        let doc = Report::default();
        let mut bad = result("gp3", "rand-read", 1, 1.0);
        bad["cell_id"] = json!("gp3-old");
        bad["metrics"]["iops"] = json!("many");
        let rs: Vec<ResultRow> = [result("nvme", "rand-read", 1, 9000.0), bad]
            .into_iter()
            .map(|r| serde_json::from_value(r).unwrap())
            .collect();
        let refs: Vec<&ResultRow> = rs.iter().collect();
        let (mut md, mut plots) = (String::new(), Vec::new());
        super::super::markdown::section(Kind::Fio, &mut md, &mut plots, &doc, &refs);
        assert!(md.contains("| rand-read | 8KiB | 1 | yes | 9000 |"), "{md}");
        assert!(
            md.contains("1 fio result(s) could not be read")
                && md.contains("`gp3-old` (invalid type"),
            "{md}"
        );
    }
}
