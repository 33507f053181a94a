//! A scenario's `checks:` judged against a run's summaries: each check's
//! figure (a class's median over its clusters, or the ratio of two classes'
//! medians) with a bootstrap confidence interval, and a verdict: passed when
//! the whole interval satisfies the bound, failed when the whole interval
//! violates it, inconclusive otherwise (counted as failed unless the check
//! says `inconclusive: pass`).
//!
//! report.json: `checks: [{name, metric, class, baseline, entry, point,
//! observed, interval: [lo, hi], confidence, min, max, clusters, merged,
//! verdict, passes, note}]` (`merged`: a latency quantile of the class's
//! merged distribution, `figure.rs`) (one per check and measured point it applies to) and
//! `check_summary: {checks, passed, failed, inconclusive, ok}`.

use std::collections::BTreeMap;

use super::figure::Figure;
use crate::document::{CheckSummary, Judged, Summary, Verdict};
use crate::entries::{finite, shown};
use pgfleet_scenario::Check;
use pgfleet_scenario::stats::{self, Interval};

/// A check's judgement before it meets a point: what it asked.
pub(crate) fn asked(c: &Check) -> Judged {
    Judged {
        name: c.name.clone(),
        metric: c.metric.clone(),
        class: c.class.clone(),
        baseline: c.baseline.clone(),
        baseline_entry: c.baseline_entry,
        confidence: c.confidence,
        min: c.min,
        max: c.max,
        ..Judged::default()
    }
}

/// Every check on every point it applies to.
pub fn evaluate(checks: &[Check], summaries: &[Summary]) -> Vec<Judged> {
    let mut out = Vec::new();
    // History checks need the store: `trend.rs` judges them.
    for c in checks.iter().filter(|c| c.history.is_none()) {
        fn base_of<'a>(c: &Check, summaries: &'a [Summary], s: &'a Summary) -> Option<&'a Summary> {
            match c.baseline_entry {
                Some(e) => super::entries::baseline_of(summaries, s, Some(e)),
                None => Some(s),
            }
        }
        let base_of = |s| base_of(c, summaries, s);
        let has = |s: &Summary, class: &str| {
            s.class(class)
                .and_then(|f| Figure::of(f, &c.metric))
                .is_some()
        };
        let points: Vec<&Summary> = summaries
            .iter()
            .filter(|s| c.applies_to(s.entry, &s.point))
            .filter(|s| {
                has(s, &c.class)
                    && c.baseline
                        .as_deref()
                        .is_none_or(|b| base_of(s).is_some_and(|x| has(x, b)))
            })
            .collect();
        if points.is_empty() {
            out.push(Judged {
                verdict: Verdict::Inconclusive,
                passes: c.inconclusive_passes,
                note: Some(format!(
                    "no result of class `{}`{} measured `{}`: did its cells fail?",
                    c.class,
                    c.baseline
                        .as_ref()
                        .map(|b| format!(" and baseline `{b}`"))
                        .unwrap_or_default(),
                    c.metric
                )),
                ..asked(c)
            });
            continue;
        }
        for s in points {
            let figure = |s: &Summary, class: &str| Figure::of(s.class(class)?, &c.metric);
            let Some(mine) = figure(s, &c.class) else {
                continue;
            };
            let seed = stats::seed_of(&format!("{}{}", c.name, s.params_text()));
            // The baseline: another class at this point, or (with
            // `baseline_workload`) a class at the other entry's same point.
            let theirs = c
                .baseline
                .as_deref()
                .and_then(|b| Some((b, figure(base_of(s)?, b)?)));
            if c.baseline.is_some() && theirs.is_none() {
                continue;
            }
            let mut clusters = BTreeMap::from([(c.class.clone(), mine.clusters())]);
            let (observed, interval) = match theirs {
                Some((b, theirs)) => {
                    clusters.insert(b.to_string(), theirs.clusters());
                    mine.ratio(&theirs, c.confidence, seed)
                }
                None => (mine.value(), mine.interval(c.confidence, seed)),
            };
            let verdict = stats::judge(interval, c.min, c.max);
            out.push(Judged {
                entry: s.entry,
                label: Some(s.label.clone()),
                point: Some(s.params.clone()),
                sweep: Some(s.point.clone()),
                observed: finite(observed),
                interval: Some([finite(interval.lo), finite(interval.hi)]),
                clusters,
                merged: Some(mine.merged()),
                verdict,
                passes: verdict.passes(c.inconclusive_passes),
                note: (verdict == Verdict::Inconclusive).then(|| inconclusive_note(interval, c)),
                ..asked(c)
            });
        }
    }
    out
}

fn inconclusive_note(i: Interval, c: &Check) -> String {
    if !(i.lo.is_finite() && i.hi.is_finite()) {
        return "the figure is not a number (a zero baseline?)".into();
    }
    format!(
        "the {:.0} % interval straddles the bound: more replicas narrow it",
        c.confidence * 100.0
    )
}

/// Totals over the evaluated checks.
pub fn summary(evaluated: &[Judged]) -> CheckSummary {
    let count = |v: Verdict| evaluated.iter().filter(|e| e.verdict == v).count();
    CheckSummary {
        checks: evaluated.len(),
        passed: count(Verdict::Passed),
        failed: count(Verdict::Failed),
        inconclusive: count(Verdict::Inconclusive),
        ok: evaluated.iter().all(|e| e.passes),
    }
}

/// A point in words: the parameters that tell points apart (and those
/// swept), then what tells its workload entry from the kind's others.
pub fn point_words(
    point: Option<&crate::Params>,
    sweep: Option<&crate::Params>,
    label: Option<&str>,
) -> String {
    let Some(p) = point else {
        return String::new();
    };
    let entry = label.filter(|l| !l.is_empty());
    let keys = [
        "script", "size", "storage", "offset", "length", "mode", "clients",
    ];
    p.iter()
        .filter(|(k, _)| keys.contains(&k.as_str()) || sweep.is_some_and(|s| s.contains_key(*k)))
        .map(|(k, v)| format!("{k} {}", shown(v)))
        .chain(entry.map(str::to_string))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A check's point in words (`point_words`).
pub fn point_label(e: &Judged) -> String {
    point_words(e.point.as_ref(), e.sweep.as_ref(), e.label.as_deref())
}

/// JUnit XML: one test case per evaluated check, for CI test tabs.
pub fn junit(suite: &str, evaluated: &[Judged]) -> String {
    let esc = pgfleet_proto::escape::xml;
    let failures = evaluated.iter().filter(|e| !e.passes).count();
    let mut x = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\">\n",
        esc(suite),
        evaluated.len()
    );
    for e in evaluated {
        let label = point_label(e);
        let name = if label.is_empty() {
            e.name.clone()
        } else {
            format!("{} [{label}]", e.name)
        };
        let detail = describe(e);
        x.push_str(&format!(
            "  <testcase classname=\"{}\" name=\"{}\">\n",
            esc(suite),
            esc(&name)
        ));
        if !e.passes {
            x.push_str(&format!(
                "    <failure message=\"{}\">{}</failure>\n",
                esc(e.verdict.as_str()),
                esc(&detail)
            ));
        } else {
            x.push_str(&format!("    <system-out>{}</system-out>\n", esc(&detail)));
        }
        x.push_str("  </testcase>\n");
    }
    x.push_str("</testsuite>\n</testsuites>\n");
    x
}

/// A bound in words: `0.5 ≤ x ≤ 2`, `≥ 0.5`, `≤ 2`.
pub fn bound(min: Option<f64>, max: Option<f64>) -> String {
    use super::table::sig;
    match (min, max) {
        (Some(lo), Some(hi)) => format!("{} ≤ x ≤ {}", sig(lo), sig(hi)),
        (Some(lo), None) => format!("≥ {}", sig(lo)),
        (None, Some(hi)) => format!("≤ {}", sig(hi)),
        (None, None) => String::new(),
    }
}

/// A figure or an interval's end as a report shows it (`–`: none).
pub fn shown_number(v: Option<f64>) -> String {
    v.map(super::table::sig).unwrap_or_else(|| "–".to_string())
}

/// `observed 0.31 (95 % interval 0.28–0.35), bound ≤ 0.5: passed`.
pub fn describe(e: &Judged) -> String {
    let what = match &e.baseline {
        Some(b) => format!("{} {} / {}", e.metric, e.class, b),
        None => format!("{} of {}", e.metric, e.class),
    };
    let [lo, hi] = e.interval.unwrap_or([None, None]);
    let mut s = format!(
        "{what}: {} ({:.0} % interval {}–{}), bound {}: {}",
        shown_number(e.observed),
        e.confidence * 100.0,
        shown_number(lo),
        shown_number(hi),
        bound(e.min, e.max),
        e.verdict.as_str()
    );
    if let Some(note) = &e.note {
        s.push_str(&format!(" ({note})"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summaries() -> Vec<Summary> {
        vec![serde_json::from_value(json!({
            "entry": 0, "workload": "pgbench", "params": {"script": "random-update"},
            "classes": {
                "nvme": {"tps": {"values": [1000.0, 1100.0, 1050.0, 990.0]}, "latency_ms_p99": {"values": [4.0, 12.0, 6.0, 9.0]}},
                "gp3": {"tps": {"values": [200.0, 210.0, 190.0, 205.0]}},
            },
        }))
        .unwrap()]
    }

    fn check(
        metric: &str,
        class: &str,
        baseline: Option<&str>,
        min: Option<f64>,
        max: Option<f64>,
    ) -> Check {
        Check {
            name: format!("{metric} {class}"),
            metric: metric.into(),
            class: class.into(),
            baseline: baseline.map(str::to_string),
            workload: None,
            baseline_entry: None,
            min,
            max,
            confidence: 0.95,
            inconclusive_passes: false,
            history: None,
            at: Vec::new(),
        }
    }

    #[test]
    fn every_verdict() {
        let s = summaries();
        let one = |c: Check| evaluate(&[c], &s).remove(0);
        // gp3 / nvme ~ 0.19: at most half as fast.
        let e = one(check("tps", "gp3", Some("nvme"), None, Some(0.5)));
        assert_eq!(e.verdict, Verdict::Passed, "{e:?}");
        assert!((e.observed.unwrap() - 0.195).abs() < 0.01);
        // ... but not at least half.
        assert_eq!(
            one(check("tps", "gp3", Some("nvme"), Some(0.5), None)).verdict,
            Verdict::Failed
        );
        // p99 spread 4..12 ms: a 10 ms bound is inside the interval.
        let e = one(check("latency_ms_p99", "nvme", None, None, Some(10.0)));
        assert_eq!(e.verdict, Verdict::Inconclusive, "{e:?}");
        assert!(!e.passes);
        let mut c = check("latency_ms_p99", "nvme", None, None, Some(10.0));
        c.inconclusive_passes = true;
        assert!(one(c).passes);
        // No result for the class: inconclusive, said why.
        let e = one(check("latency_ms_p99", "gp3", None, None, Some(10.0)));
        assert_eq!(e.verdict, Verdict::Inconclusive);
        assert!(e.note.unwrap().contains("did its cells fail"));
        // A check on another workload entry matches nothing.
        let mut c = check("tps", "nvme", None, Some(1.0), None);
        c.workload = Some(1);
        assert_eq!(one(c).verdict, Verdict::Inconclusive);
    }

    #[test]
    fn exit_codes_follow_status_then_checks() {
        use pgfleet_store::exit;
        // A report without checks passes them (an older report.json
        // without `check_summary` too).
        let doc = |status: &str, ok: Option<bool>| {
            let mut v = json!({ "status": status });
            if let Some(ok) = ok {
                v["check_summary"] = json!({ "ok": ok });
            }
            let r: crate::Report = serde_json::from_value(v).unwrap();
            exit::of_report(&r.status, r.checks_pass())
        };
        assert_eq!(doc("succeeded", None), exit::OK);
        assert_eq!(doc("succeeded", Some(true)), exit::OK);
        assert_eq!(doc("succeeded", Some(false)), exit::FAILED);
        assert_eq!(doc("failed", Some(true)), exit::INFRA);
        assert_eq!(doc("failed", Some(false)), exit::INFRA);
        assert_eq!(doc("interrupted", None), exit::INFRA);
        assert_eq!(doc("cancelled", Some(false)), exit::CANCELLED);
    }

    #[test]
    fn junit_has_a_case_per_check_and_a_failure_per_failed_one() {
        let s = summaries();
        let e = evaluate(
            &[
                check("tps", "gp3", Some("nvme"), None, Some(0.5)),
                check("tps", "gp3", Some("nvme"), Some(0.5), None),
            ],
            &s,
        );
        let x = junit("pgfleet t", &e);
        assert!(x.contains("tests=\"2\" failures=\"1\""), "{x}");
        assert_eq!(x.matches("<testcase ").count(), 2);
        assert!(x.contains("[script random-update]"), "{x}");
    }

    /// Hostile text in a check's name (markup, control characters, a
    /// character XML forbids) leaves the JUnit document well-formed.
    #[test]
    fn junit_escapes_what_xml_forbids() {
        let s = summaries();
        let mut c = check("tps", "gp3", Some("nvme"), None, Some(0.5));
        c.name = "<b>x</b> & \"q\" \u{1b}[2J\u{0}\u{7}\n|y".into();
        let x = junit("pgfleet \u{1}t", &evaluate(&[c], &s));
        assert!(!x.contains("<b>"), "{x}");
        assert!(
            x.contains("&lt;b&gt;x&lt;/b&gt; &amp; &quot;q&quot;"),
            "{x}"
        );
        let bad = x
            .chars()
            .find(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'));
        assert_eq!(bad, None, "{x:?}");
    }

    /// Two entries of one kind at the same point: each evaluation names
    /// its entry by what sets it apart.
    #[test]
    fn a_checks_point_names_its_entry() {
        let mut s = summaries();
        let mut short = s[0].clone();
        short.entry = Some(1);
        short.params.insert("duration_s".into(), json!(6));
        s[0].params.insert("duration_s".into(), json!(60));
        s.push(short);
        crate::entries::label(&mut s);
        let e = evaluate(&[check("tps", "gp3", Some("nvme"), None, Some(0.5))], &s);
        let labels: Vec<String> = e.iter().map(point_label).collect();
        assert_eq!(
            labels,
            [
                "script random-update, duration_s 60",
                "script random-update, duration_s 6"
            ]
        );
    }
}
