//! `pgfleet compare BASELINE CANDIDATE`: two runs' reports (run ids in the
//! store, or `report.json` files such as a baseline kept as a CI artifact)
//! matched point by point (same workload, same parameters, same instance
//! class), and per compared metric the ratio of the candidate's median to
//! the baseline's with a bootstrap confidence interval and a verdict:
//! faster, slower, or no difference at the given level. Gates such as
//! `--fail-if 'tps < -5%'` judge the change's interval like checks do.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use crate::document::{Bounds, Judged, Params, Report, Summary, Verdict};
use crate::entries::finite;
use crate::figure::{Figure, higher_is_better};
use pgfleet_scenario::stats;

/// A gate: fail when `metric` changed by less than (`<`) or more than
/// (`>`) `percent`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    pub text: String,
    pub metric: String,
    pub below: bool,
    pub percent: f64,
}

/// Parses `tps < -5%`, `latency_ms_p99 > +10%`.
pub fn parse_gate(s: &str) -> Result<Gate, String> {
    let bad = || {
        format!(
            "`{s}` is not a gate: write METRIC < -N% or METRIC > +N%, e.g. 'tps < -5%' or 'latency_ms_p99 > 10%'"
        )
    };
    let (metric, rest, below) = match (s.split_once('<'), s.split_once('>')) {
        (Some((m, r)), None) => (m, r, true),
        (None, Some((m, r))) => (m, r, false),
        _ => return Err(bad()),
    };
    let metric = metric.trim();
    let pct = rest.trim().strip_suffix('%').ok_or_else(bad)?;
    let percent: f64 = pct
        .trim()
        .trim_start_matches('+')
        .parse()
        .map_err(|_| bad())?;
    if metric.is_empty()
        || !metric
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        || !percent.is_finite()
    {
        return Err(bad());
    }
    Ok(Gate {
        text: s.trim().to_string(),
        metric: metric.to_string(),
        below,
        percent,
    })
}

/// One matched (point, class, metric): the candidate's figure against the
/// baseline's.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub workload: String,
    pub params: Params,
    pub class: String,
    pub metric: String,
    pub baseline_value: f64,
    pub candidate_value: f64,
    pub baseline_clusters: usize,
    pub candidate_clusters: usize,
    pub merged: bool,
    pub ratio: f64,
    pub interval: Bounds,
    pub confidence: f64,
    pub change_percent: f64,
    /// `faster`, `slower` or `no difference`.
    pub verdict: &'static str,
}

/// The cost of a million transactions of a class on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    pub class: String,
    pub currency: String,
    pub baseline_per_million_transactions: f64,
    pub candidate_per_million_transactions: f64,
    pub ratio: Option<f64>,
    pub tps_ratio: Option<f64>,
}

/// A comparable point: workload and parameters.
fn point_key(s: &Summary) -> String {
    format!("{}|{}", s.workload, s.params_text())
}

/// Rows: one per matched (point, class, metric).
pub fn compare(baseline: &Report, candidate: &Report, level: f64) -> Vec<Row> {
    let index = |doc: &'_ Report| -> BTreeMap<String, Summary> {
        doc.summaries
            .iter()
            .map(|s| (point_key(s), s.clone()))
            .collect()
    };
    let (base, cand) = (index(baseline), index(candidate));
    let mut rows = Vec::new();
    for (key, b) in &base {
        let Some(c) = cand.get(key) else { continue };
        for (class, bm) in &b.classes {
            let Some(cm) = c.class(class) else { continue };
            for metric in bm.metrics.keys() {
                let (Some(fb), Some(fc)) = (Figure::of(bm, metric), Figure::of(cm, metric)) else {
                    continue;
                };
                let seed = stats::seed_of(&format!("{key}{class}{metric}"));
                let (ratio, i) = fc.ratio(&fb, level, seed);
                let up = higher_is_better(&b.workload, metric);
                let verdict = if !(i.lo.is_finite() && i.hi.is_finite()) {
                    "no difference"
                } else if i.lo > 1.0 {
                    if up { "faster" } else { "slower" }
                } else if i.hi < 1.0 {
                    if up { "slower" } else { "faster" }
                } else {
                    "no difference"
                };
                rows.push(Row {
                    workload: b.workload.clone(),
                    params: b.params.clone(),
                    class: class.clone(),
                    metric: metric.clone(),
                    baseline_value: fb.value(),
                    candidate_value: fc.value(),
                    baseline_clusters: fb.clusters(),
                    candidate_clusters: fc.clusters(),
                    merged: fb.merged() && fc.merged(),
                    ratio,
                    interval: [finite(i.lo), finite(i.hi)],
                    confidence: level,
                    change_percent: (ratio - 1.0) * 100.0,
                    verdict,
                });
            }
        }
    }
    rows
}

/// Each gate on each row of its metric, judged like a check: `passes`
/// when the whole interval of the change is on the allowed side.
pub fn judge_gates(rows: &[Row], gates: &[Gate], inconclusive_passes: bool) -> Vec<Judged> {
    let mut out = Vec::new();
    for g in gates {
        for r in rows.iter().filter(|r| r.metric == g.metric) {
            let [lo, hi] = r.interval.map(|x| x.unwrap_or(f64::NAN));
            let change = stats::Interval {
                lo: (lo - 1.0) * 100.0,
                hi: (hi - 1.0) * 100.0,
            };
            let (min, max) = if g.below {
                (Some(g.percent), None)
            } else {
                (None, Some(g.percent))
            };
            let verdict = stats::judge(change, min, max);
            let label = crate::checks::point_words(Some(&r.params), None, None);
            out.push(Judged {
                name: format!(
                    "{} ({}{})",
                    g.text,
                    r.class,
                    if label.is_empty() {
                        String::new()
                    } else {
                        format!(", {label}")
                    }
                ),
                gate: Some(g.text.clone()),
                class: r.class.clone(),
                metric: g.metric.clone(),
                point: Some(r.params.clone()),
                observed: finite(r.change_percent),
                interval: Some([finite(change.lo), finite(change.hi)]),
                confidence: r.confidence,
                verdict,
                passes: verdict.passes(inconclusive_passes),
                ..Judged::default()
            });
        }
    }
    out
}

/// The cost of a million transactions per class on both sides (when both
/// reports priced their classes in one currency), beside the TPS ratio.
pub fn costs(baseline: &Report, candidate: &Report) -> Vec<CostRow> {
    let (Some(b), Some(c)) = (&baseline.costs, &candidate.costs) else {
        return Vec::new();
    };
    if b.currency != c.currency {
        return Vec::new();
    }
    let tps = |doc: &Report, class: &str| {
        crate::figure::first_value(
            &doc.summaries,
            pgfleet_proto::workload::Kind::Pgbench.name(),
            class,
            pgfleet_proto::workload::pgbench::TPS.name,
        )
    };
    let mut out = Vec::new();
    for (class, bc) in &b.classes {
        let (Some(x), Some(y)) = (
            bc.per_million_transactions,
            c.classes
                .get(class)
                .and_then(|c| c.per_million_transactions),
        ) else {
            continue;
        };
        let tps_ratio = match (tps(candidate, class), tps(baseline, class)) {
            (Some(n), Some(d)) if d > 0.0 => Some(n / d),
            _ => None,
        };
        out.push(CostRow {
            class: class.clone(),
            currency: b.currency.clone(),
            baseline_per_million_transactions: x,
            candidate_per_million_transactions: y,
            ratio: (x > 0.0).then(|| y / x),
            tps_ratio,
        });
    }
    out
}

/// The comparison as Markdown.
pub fn markdown(baseline: &str, candidate: &str, rows: &[Row], gates: &[Judged]) -> String {
    use crate::checks::{point_words, shown_number as f};
    let mut md = format!(
        "# pgfleet compare\n\nbaseline `{baseline}`, candidate `{candidate}`: the candidate's median over clusters divided by the baseline's, with a bootstrap interval.\n\n"
    );
    if !gates.is_empty() {
        let ok = gates.iter().all(|g| g.passes);
        let _ = writeln!(
            md,
            "## Gates: {}\n\n| | gate | change | interval |\n|---|---|---|---|",
            if ok { "passed" } else { "FAILED" }
        );
        for g in gates {
            let mark = match (g.verdict, g.passes) {
                (Verdict::Passed, _) => "✅ passed",
                (Verdict::Failed, _) => "❌ failed",
                (_, true) => "⚠️ inconclusive (counts as passed)",
                _ => "⚠️ inconclusive",
            };
            let [lo, hi] = g.interval.unwrap_or([None, None]);
            let _ = writeln!(
                md,
                "| {mark} | {} | {} % | {} % … {} % |",
                g.name,
                f(g.observed),
                f(lo),
                f(hi)
            );
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "## Metrics\n\n| workload | point | class | metric | baseline | candidate | ratio | interval | verdict |\n|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {}x | {}–{} | {} |",
            r.workload,
            point_words(Some(&r.params), None, None),
            r.class,
            r.metric,
            f(finite(r.baseline_value)),
            f(finite(r.candidate_value)),
            f(finite(r.ratio)),
            f(r.interval[0]),
            f(r.interval[1]),
            r.verdict
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(values: &[f64], p99: &[f64]) -> Report {
        serde_json::from_value(json!({"summaries": [{
            "workload": "pgbench", "params": {"script": "random-update", "clients": 8},
            "classes": {"nvme": {"tps": {"values": values}, "latency_ms_p99": {"values": p99}, "cells": values.len()}},
        }]}))
        .unwrap()
    }

    #[test]
    fn gates_parse_and_refuse_with_an_example() {
        assert_eq!(
            parse_gate("tps < -5%").unwrap(),
            Gate {
                text: "tps < -5%".into(),
                metric: "tps".into(),
                below: true,
                percent: -5.0
            }
        );
        let g = parse_gate(" latency_ms_p99 > +10 % ").unwrap();
        assert!(!g.below && g.percent == 10.0 && g.metric == "latency_ms_p99");
        for bad in ["tps", "tps < 5", "< -5%", "tps <> 5%", "t ps < 5%"] {
            let e = parse_gate(bad).unwrap_err();
            assert!(e.contains("e.g. 'tps < -5%'"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_clear_drop_is_slower_and_fails_the_gate_and_noise_is_no_difference() {
        let base = doc(
            &[1000.0, 1010.0, 990.0, 1005.0, 995.0],
            &[10.0, 11.0, 10.5, 9.5, 10.2],
        );
        // 20 % fewer transactions; p99 unchanged within noise.
        let cand = doc(
            &[800.0, 805.0, 795.0, 810.0, 790.0],
            &[10.1, 10.9, 10.4, 9.7, 10.3],
        );
        let rows = compare(&base, &cand, 0.95);
        let tps = rows.iter().find(|r| r.metric == "tps").unwrap();
        assert_eq!(tps.verdict, "slower");
        assert!((tps.ratio - 0.8).abs() < 0.01);
        let p99 = rows.iter().find(|r| r.metric == "latency_ms_p99").unwrap();
        assert_eq!(p99.verdict, "no difference", "{p99:?}");
        let gates = judge_gates(&rows, &[parse_gate("tps < -5%").unwrap()], false);
        assert_eq!(gates.len(), 1);
        assert_eq!(gates[0].verdict, Verdict::Failed);
        // A 2 % drop passes a 5 % gate; latency down is faster.
        let cand = doc(
            &[985.0, 990.0, 980.0, 992.0, 978.0],
            &[5.0, 5.2, 5.1, 4.9, 5.0],
        );
        let rows = compare(&base, &cand, 0.95);
        let gates = judge_gates(&rows, &[parse_gate("tps < -5%").unwrap()], false);
        assert_eq!(gates[0].verdict, Verdict::Passed, "{:?}", gates[0]);
        let p99 = rows.iter().find(|r| r.metric == "latency_ms_p99").unwrap();
        assert_eq!(p99.verdict, "faster");
    }

    /// A fault's figure compares like TPS: a longer crash recovery is
    /// slower and fails a gate on it.
    #[test]
    fn a_longer_crash_recovery_is_slower_and_fails_its_gate() {
        let doc = |rec: &[f64]| -> Report {
            serde_json::from_value(json!({"summaries": [{
                "workload": "pgbench", "params": {"script": "random-update", "faults": [{"kind": "crash", "at_s": 60.0}]},
                "classes": {"gp3": {"recovery_seconds": {"values": rec}, "cells": rec.len()}},
            }]}))
            .unwrap()
        };
        let rows = compare(
            &doc(&[10.0, 10.5, 9.8, 10.2]),
            &doc(&[14.0, 14.6, 13.9, 14.2]),
            0.95,
        );
        let r = rows
            .iter()
            .find(|r| r.metric == "recovery_seconds")
            .unwrap();
        assert_eq!(r.verdict, "slower", "{r:?}");
        let gates = judge_gates(
            &rows,
            &[parse_gate("recovery_seconds > +20%").unwrap()],
            false,
        );
        assert_eq!(gates[0].verdict, Verdict::Failed, "{:?}", gates[0]);
    }

    #[test]
    fn points_match_on_workload_parameters_only() {
        let base = doc(&[1000.0], &[10.0]);
        let mut other = doc(&[500.0], &[10.0]);
        other.summaries[0]
            .params
            .insert("clients".into(), json!(16));
        assert!(compare(&base, &other, 0.95).is_empty());
    }
}
