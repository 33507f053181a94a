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

use serde_json::{Value as Json, json};

use super::figure::Figure;
use pgfleet_scenario::Check;
use pgfleet_scenario::stats::{self, Interval, Verdict};

/// Every check on every point it applies to.
pub fn evaluate(checks: &[Check], summaries: &[Json]) -> Vec<Json> {
    let mut out = Vec::new();
    // History checks need the store: `trend.rs` judges them.
    for c in checks.iter().filter(|c| c.history.is_none()) {
        let points: Vec<&Json> = summaries
            .iter()
            .filter(|s| c.applies_to(s))
            .filter(|s| {
                let base = match c.baseline_entry {
                    Some(e) => super::entries::baseline_of(summaries, s, Some(e)),
                    None => Some(*s),
                };
                let has =
                    |s: &Json, class: &str| Figure::of(&s["classes"][class], &c.metric).is_some();
                has(s, &c.class)
                    && c.baseline
                        .as_deref()
                        .is_none_or(|b| base.is_some_and(|x| has(x, b)))
            })
            .collect();
        let base = json!({
            "name": c.name, "metric": c.metric, "class": c.class, "baseline": c.baseline,
            "baseline_entry": c.baseline_entry,
            "confidence": c.confidence, "min": c.min, "max": c.max,
        });
        if points.is_empty() {
            let mut e = base.clone();
            e["verdict"] = json!(Verdict::Inconclusive.as_str());
            e["passes"] = json!(c.inconclusive_passes);
            e["note"] = json!(format!(
                "no result of class `{}`{} measured `{}`: did its cells fail?",
                c.class,
                c.baseline
                    .as_ref()
                    .map(|b| format!(" and baseline `{b}`"))
                    .unwrap_or_default(),
                c.metric
            ));
            out.push(e);
            continue;
        }
        for s in points {
            let figure = |class: &str| Figure::of(&s["classes"][class], &c.metric);
            let Some(mine) = figure(&c.class) else {
                continue;
            };
            let seed = stats::seed_of(&format!("{}{}", c.name, s["params"]));
            // The baseline: another class at this point, or (with
            // `baseline_workload`) a class at the other entry's same point.
            let base_summary = match c.baseline_entry {
                Some(e) => super::entries::baseline_of(summaries, s, Some(e)),
                None => Some(s),
            };
            let theirs = c
                .baseline
                .as_deref()
                .and_then(|b| Some((b, Figure::of(&base_summary?["classes"][b], &c.metric)?)));
            if c.baseline.is_some() && theirs.is_none() {
                continue;
            }
            let (observed, interval, clusters) = match theirs {
                Some((b, theirs)) => {
                    let (r, i) = mine.ratio(&theirs, c.confidence, seed);
                    (
                        r,
                        i,
                        json!({c.class.as_str(): mine.clusters(), b: theirs.clusters()}),
                    )
                }
                None => (
                    mine.value(),
                    mine.interval(c.confidence, seed),
                    json!({c.class.as_str(): mine.clusters()}),
                ),
            };
            let verdict = stats::judge(interval, c.min, c.max);
            let passes = match verdict {
                Verdict::Passed => true,
                Verdict::Failed => false,
                Verdict::Inconclusive => c.inconclusive_passes,
            };
            let mut e = base.clone();
            e["entry"] = s["entry"].clone();
            e["label"] = s["label"].clone();
            e["point"] = s["params"].clone();
            e["sweep"] = s["point"].clone();
            e["observed"] = finite(observed);
            e["interval"] = json!([finite(interval.lo), finite(interval.hi)]);
            e["clusters"] = clusters;
            e["merged"] = json!(mine.merged());
            e["verdict"] = json!(verdict.as_str());
            e["passes"] = json!(passes);
            if verdict == Verdict::Inconclusive {
                e["note"] = json!(inconclusive_note(interval, c));
            }
            out.push(e);
        }
    }
    out
}

fn finite(x: f64) -> Json {
    if x.is_finite() { json!(x) } else { Json::Null }
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
pub fn summary(evaluated: &[Json]) -> Json {
    let count = |v: &str| evaluated.iter().filter(|e| e["verdict"] == v).count();
    json!({
        "checks": evaluated.len(),
        "passed": count("passed"),
        "failed": count("failed"),
        "inconclusive": count("inconclusive"),
        "ok": evaluated.iter().all(|e| e["passes"] == true),
    })
}

/// A check's point in words: the parameters that tell points apart, then
/// those that tell its workload entry from the kind's others.
pub fn point_label(e: &Json) -> String {
    let Some(p) = e["point"].as_object() else {
        return String::new();
    };
    let entry = e["label"].as_str().filter(|l| !l.is_empty());
    let keys = [
        "script", "size", "storage", "offset", "length", "mode", "clients",
    ];
    let swept = e["sweep"].as_object();
    p.iter()
        .filter(|(k, _)| keys.contains(&k.as_str()) || swept.is_some_and(|s| s.contains_key(*k)))
        .map(|(k, v)| {
            format!(
                "{k} {}",
                v.as_str().map(str::to_string).unwrap_or(v.to_string())
            )
        })
        .chain(entry.map(str::to_string))
        .collect::<Vec<_>>()
        .join(", ")
}

/// JUnit XML: one test case per evaluated check, for CI test tabs.
pub fn junit(suite: &str, evaluated: &[Json]) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let failures = evaluated.iter().filter(|e| e["passes"] != true).count();
    let mut x = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\">\n",
        esc(suite),
        evaluated.len()
    );
    for e in evaluated {
        let label = point_label(e);
        let name = if label.is_empty() {
            e["name"].as_str().unwrap_or("").to_string()
        } else {
            format!("{} [{label}]", e["name"].as_str().unwrap_or(""))
        };
        let detail = describe(e);
        x.push_str(&format!(
            "  <testcase classname=\"{}\" name=\"{}\">\n",
            esc(suite),
            esc(&name)
        ));
        if e["passes"] != true {
            x.push_str(&format!(
                "    <failure message=\"{}\">{}</failure>\n",
                esc(e["verdict"].as_str().unwrap_or("")),
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

/// `observed 0.31 (95 % interval 0.28–0.35), bound ≤ 0.5: passed`.
pub fn describe(e: &Json) -> String {
    let n = |v: &Json| match v.as_f64() {
        Some(x) => super::table::sig(x),
        None => "–".to_string(),
    };
    let what = match e["baseline"].as_str() {
        Some(b) => format!(
            "{} {} / {}",
            e["metric"].as_str().unwrap_or(""),
            e["class"].as_str().unwrap_or(""),
            b
        ),
        None => format!(
            "{} of {}",
            e["metric"].as_str().unwrap_or(""),
            e["class"].as_str().unwrap_or("")
        ),
    };
    let bound = match (e["min"].as_f64(), e["max"].as_f64()) {
        (Some(lo), Some(hi)) => {
            format!("{} ≤ x ≤ {}", super::table::sig(lo), super::table::sig(hi))
        }
        (Some(lo), None) => format!("≥ {}", super::table::sig(lo)),
        (None, Some(hi)) => format!("≤ {}", super::table::sig(hi)),
        (None, None) => String::new(),
    };
    let mut s = format!(
        "{what}: {} ({:.0} % interval {}–{}), bound {bound}: {}",
        n(&e["observed"]),
        e["confidence"].as_f64().unwrap_or(0.95) * 100.0,
        n(&e["interval"][0]),
        n(&e["interval"][1]),
        e["verdict"].as_str().unwrap_or("")
    );
    if let Some(note) = e["note"].as_str() {
        s.push_str(&format!(" ({note})"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summaries() -> Vec<Json> {
        vec![json!({
            "entry": 0, "workload": "pgbench", "params": {"script": "random-update"},
            "classes": {
                "nvme": {"tps": {"values": [1000.0, 1100.0, 1050.0, 990.0]}, "latency_ms_p99": {"values": [4.0, 12.0, 6.0, 9.0]}},
                "gp3": {"tps": {"values": [200.0, 210.0, 190.0, 205.0]}},
            },
        })]
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
        assert_eq!(e["verdict"], "passed", "{e}");
        assert!((e["observed"].as_f64().unwrap() - 0.195).abs() < 0.01);
        // ... but not at least half.
        assert_eq!(
            one(check("tps", "gp3", Some("nvme"), Some(0.5), None))["verdict"],
            "failed"
        );
        // p99 spread 4..12 ms: a 10 ms bound is inside the interval.
        let e = one(check("latency_ms_p99", "nvme", None, None, Some(10.0)));
        assert_eq!(e["verdict"], "inconclusive", "{e}");
        assert_eq!(e["passes"], false);
        let mut c = check("latency_ms_p99", "nvme", None, None, Some(10.0));
        c.inconclusive_passes = true;
        assert_eq!(one(c)["passes"], true);
        // No result for the class: inconclusive, said why.
        let e = one(check("latency_ms_p99", "gp3", None, None, Some(10.0)));
        assert_eq!(e["verdict"], "inconclusive");
        assert!(e["note"].as_str().unwrap().contains("did its cells fail"));
        // A check on another workload entry matches nothing.
        let mut c = check("tps", "nvme", None, Some(1.0), None);
        c.workload = Some(1);
        assert_eq!(one(c)["verdict"], "inconclusive");
    }

    #[test]
    fn exit_codes_follow_status_then_checks() {
        use pgfleet_store::exit;
        let doc = |status: &str, ok: Option<bool>| json!({"status": status, "check_summary": ok.map(|o| json!({"ok": o})).unwrap_or(Json::Null)});
        assert_eq!(exit::of_report(&doc("succeeded", None)), exit::OK);
        assert_eq!(exit::of_report(&doc("succeeded", Some(true))), exit::OK);
        assert_eq!(
            exit::of_report(&doc("succeeded", Some(false))),
            exit::FAILED
        );
        assert_eq!(exit::of_report(&doc("failed", Some(true))), exit::INFRA);
        assert_eq!(exit::of_report(&doc("failed", Some(false))), exit::INFRA);
        assert_eq!(exit::of_report(&doc("interrupted", None)), exit::INFRA);
        assert_eq!(
            exit::of_report(&doc("cancelled", Some(false))),
            exit::CANCELLED
        );
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

    /// Two entries of one kind at the same point: each evaluation names
    /// its entry by what sets it apart.
    #[test]
    fn a_checks_point_names_its_entry() {
        let mut s = summaries();
        let mut short = s[0].clone();
        short["entry"] = json!(1);
        short["params"]["duration_s"] = json!(6);
        s[0]["params"]["duration_s"] = json!(60);
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
