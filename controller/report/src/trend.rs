//! History checks: a run's figure against the earlier comparable runs of
//! its scenario (`checks: - history: {metric, class, window, max_drop}`).
//!
//! The earlier runs are those of the same scenario that succeeded before
//! this one, whose comparability key (`comparable.rs`) equals this run's
//! and, with `same_labels`, whose labels agree with this run's on those
//! keys; the last `window` of them. Their figures at the check's point form
//! a series; its change points (`changepoint.rs`) split it, and the last
//! segment (the runs since the last change) is the baseline. The observed
//! figure is this run's figure divided by the segment's median, with a
//! bootstrap interval resampling this run's clusters and the segment's
//! runs; the bound is `1 - max_drop` for metrics where higher is better,
//! `1 + max_drop` for the others, judged like every check (passed, failed,
//! inconclusive). Fewer than 3 earlier runs is inconclusive, with the count.
//!
//! report.json: history checks are `checks[]` entries like the others
//! (`baseline: "earlier runs"`, `min` or `max` the bound), with
//! `history: {window, max_drop, same_labels, earlier_runs, not_comparable,
//! values (the earlier runs' figures, oldest first), segment_start,
//! segment_runs, segment_median, change_points}`; report.md plots each.

use serde_json::{Value as Json, json};

use super::comparable::{Key, key_of, point_key};
use super::figure::Figure;
use crate::changepoint;
use pgfleet_scenario::Check;
use pgfleet_scenario::stats::{self, Verdict};
use pgfleet_store::Result;
use pgfleet_store::{RunRow, Store};

/// The fewest earlier runs a history check judges against.
pub const MIN_RUNS: usize = 3;

/// Every history check among `checks` on every point it applies to.
pub fn judge(
    store: &Store,
    run: &RunRow,
    key: &dyn Fn(&[String]) -> Key,
    checks: &[Check],
    summaries: &[Json],
) -> Result<Vec<Json>> {
    let checks: Vec<&Check> = checks.iter().filter(|c| c.history.is_some()).collect();
    if checks.is_empty() {
        return Ok(Vec::new());
    }
    // The scenario's earlier successful runs, oldest first.
    let mut before = Vec::new();
    for r in store.runs()? {
        if r.id == run.id
            || r.scenario_name != run.scenario_name
            || r.status != "succeeded"
            || r.started_at >= run.started_at
        {
            continue;
        }
        before.push(super::figures(store, &r.id)?);
    }
    let mut out = Vec::new();
    for c in checks {
        let Some(h) = &c.history else { continue };
        // The comparable ones (without the settings the check follows),
        // and how many could not be compared.
        let mine = key(&h.vary);
        let mut earlier = Vec::new();
        let mut not_comparable = 0;
        for f in &before {
            if key_of(store, f, &h.vary)? == mine {
                earlier.push(f);
            } else {
                not_comparable += 1;
            }
        }
        let same = |f: &&super::Figures| {
            h.same_labels
                .iter()
                .all(|l| f.run.labels.0.get(l) == run.labels.0.get(l))
        };
        let pool: Vec<&super::Figures> = earlier.into_iter().filter(same).collect();
        let pool = &pool[pool.len().saturating_sub(h.window)..];
        // The direction the metric's kind declares (the points a check
        // applies to are of kinds that compare it alike).
        let kind = summaries
            .iter()
            .find(|s| c.applies_to(s))
            .and_then(|s| s["workload"].as_str())
            .unwrap_or("");
        let higher = crate::figure::higher_is_better(kind, &c.metric);
        let (min, max) = if higher {
            (Some(1.0 - h.max_drop), None)
        } else {
            (None, Some(1.0 + h.max_drop))
        };
        let base = json!({
            "name": c.name, "metric": c.metric, "class": c.class, "baseline": "earlier runs",
            "confidence": c.confidence, "min": min, "max": max,
        });
        let points: Vec<&Json> = summaries
            .iter()
            .filter(|s| c.applies_to(s))
            .filter(|s| Figure::of(&s["classes"][c.class.as_str()], &c.metric).is_some())
            .collect();
        if points.is_empty() {
            let mut e = base.clone();
            e["verdict"] = json!(Verdict::Inconclusive.as_str());
            e["passes"] = json!(c.inconclusive_passes);
            e["note"] = json!(format!(
                "no result of class `{}` measured `{}`: did its cells fail?",
                c.class, c.metric
            ));
            out.push(e);
            continue;
        }
        for s in points {
            let Some(mine) = Figure::of(&s["classes"][c.class.as_str()], &c.metric) else {
                continue;
            };
            let pk = point_key(s);
            let prev: Vec<f64> = pool
                .iter()
                .filter_map(|f| {
                    let x = f.summaries.iter().find(|x| point_key(x) == pk)?;
                    Some(Figure::of(&x["classes"][c.class.as_str()], &c.metric)?.value())
                })
                .filter(|v| v.is_finite())
                .collect();
            let mut e = base.clone();
            e["entry"] = s["entry"].clone();
            e["point"] = s["params"].clone();
            e["sweep"] = s["point"].clone();
            let mut about = json!({
                "window": h.window, "max_drop": h.max_drop, "same_labels": h.same_labels,
                "earlier_runs": prev.len(), "not_comparable": not_comparable,
            });
            if prev.len() < MIN_RUNS {
                e["verdict"] = json!(Verdict::Inconclusive.as_str());
                e["passes"] = json!(c.inconclusive_passes);
                e["observed"] = json!(mine.value());
                e["interval"] = json!([Json::Null, Json::Null]);
                e["clusters"] =
                    json!({c.class.as_str(): mine.clusters(), "earlier runs": prev.len()});
                e["note"] = json!(format!(
                    "{} comparable earlier run{} of this scenario{} ({MIN_RUNS} needed){}",
                    prev.len(),
                    if prev.len() == 1 { "" } else { "s" },
                    if h.same_labels.is_empty() {
                        String::new()
                    } else {
                        format!(" with the same {}", h.same_labels.join(", "))
                    },
                    if not_comparable > 0 {
                        format!(
                            "; {not_comparable} earlier runs differ in their scenario text or environment (`pgfleet history` says how)"
                        )
                    } else {
                        String::new()
                    }
                ));
                e["history"] = about;
                out.push(e);
                continue;
            }
            let cps = changepoint::detect(&prev, &changepoint::Options::default());
            let segment = &prev[cps.last().map_or(0, |c| c.index)..];
            let seed = stats::seed_of(&format!("{}{}{}", c.name, s["params"], run.id));
            let interval = stats::bootstrap_ratio(
                (mine.clusters(), |i: &[usize]| mine.at(i)),
                (segment.len(), |i: &[usize]| {
                    stats::median(&i.iter().map(|&k| segment[k]).collect::<Vec<_>>())
                }),
                c.confidence,
                seed,
            );
            let segment_median = stats::median(segment);
            let observed = mine.value() / segment_median;
            let verdict = stats::judge(interval, min, max);
            about["values"] = json!(prev);
            about["segment_start"] = json!(prev.len() - segment.len());
            about["segment_runs"] = json!(segment.len());
            about["segment_median"] = json!(segment_median);
            about["change_points"] = json!(cps.len());
            e["observed"] = finite(observed);
            e["interval"] = json!([finite(interval.lo), finite(interval.hi)]);
            e["clusters"] =
                json!({c.class.as_str(): mine.clusters(), "earlier runs": segment.len()});
            e["merged"] = json!(mine.merged());
            e["verdict"] = json!(verdict.as_str());
            e["passes"] = json!(match verdict {
                Verdict::Passed => true,
                Verdict::Failed => false,
                Verdict::Inconclusive => c.inconclusive_passes,
            });
            if verdict == Verdict::Inconclusive {
                e["note"] = json!(format!(
                    "the {:.0} % interval of this run against the {} earlier runs since their last change straddles the bound",
                    c.confidence * 100.0,
                    segment.len()
                ));
            }
            e["history"] = about;
            out.push(e);
        }
    }
    Ok(out)
}

fn finite(x: f64) -> Json {
    if x.is_finite() { json!(x) } else { Json::Null }
}
