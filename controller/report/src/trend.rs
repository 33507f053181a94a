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

use std::collections::BTreeMap;

use super::comparable::{Key, key_of, point_key};
use super::figure::Figure;
use crate::changepoint;
use crate::checks::asked;
use crate::document::{HistoryJudgement, Judged, Summary, Verdict};
use crate::entries::finite;
use pgfleet_scenario::Check;
use pgfleet_scenario::stats;
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
    summaries: &[Summary],
) -> Result<Vec<Judged>> {
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
            .find(|s| c.applies_to(s.entry, &s.point))
            .map_or("", |s| s.workload.as_str());
        let higher = crate::figure::higher_is_better(kind, &c.metric);
        let (min, max) = if higher {
            (Some(1.0 - h.max_drop), None)
        } else {
            (None, Some(1.0 + h.max_drop))
        };
        let base = Judged {
            baseline: Some("earlier runs".into()),
            baseline_entry: None,
            min,
            max,
            ..asked(c)
        };
        let figure = |s: &Summary| Figure::of(s.class(&c.class)?, &c.metric);
        let points: Vec<&Summary> = summaries
            .iter()
            .filter(|s| c.applies_to(s.entry, &s.point))
            .filter(|s| figure(s).is_some())
            .collect();
        if points.is_empty() {
            out.push(Judged {
                verdict: Verdict::Inconclusive,
                passes: c.inconclusive_passes,
                note: Some(format!(
                    "no result of class `{}` measured `{}`: did its cells fail?",
                    c.class, c.metric
                )),
                ..base.clone()
            });
            continue;
        }
        for s in points {
            let Some(mine) = figure(s) else {
                continue;
            };
            let pk = point_key(s);
            let prev: Vec<f64> = pool
                .iter()
                .filter_map(|f| {
                    let x = f.summaries.iter().find(|x| point_key(x) == pk)?;
                    Some(figure(x)?.value())
                })
                .filter(|v| v.is_finite())
                .collect();
            out.push(against_earlier(
                c,
                h,
                run,
                s,
                &mine,
                prev,
                not_comparable,
                &base,
            ));
        }
    }
    Ok(out)
}

/// A history check on one point: this run's figure against the earlier
/// comparable runs' (`prev`, oldest first) since their last change point.
#[allow(clippy::too_many_arguments)]
fn against_earlier(
    c: &Check,
    h: &pgfleet_scenario::HistoryBound,
    run: &RunRow,
    s: &Summary,
    mine: &Figure,
    prev: Vec<f64>,
    not_comparable: usize,
    base: &Judged,
) -> Judged {
    let mut e = Judged {
        entry: s.entry,
        point: Some(s.params.clone()),
        sweep: Some(s.point.clone()),
        ..base.clone()
    };
    let (min, max) = (base.min, base.max);
    let mut about = HistoryJudgement {
        window: h.window,
        max_drop: h.max_drop,
        same_labels: h.same_labels.clone(),
        earlier_runs: prev.len(),
        not_comparable,
        ..HistoryJudgement::default()
    };
    if prev.len() < MIN_RUNS {
        e.verdict = Verdict::Inconclusive;
        e.passes = c.inconclusive_passes;
        e.observed = finite(mine.value());
        e.interval = Some([None, None]);
        e.clusters = BTreeMap::from([
            (c.class.clone(), mine.clusters()),
            ("earlier runs".to_string(), prev.len()),
        ]);
        e.note = Some(format!(
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
        e.history = Some(about);
        return e;
    }
    let cps = changepoint::detect(&prev, &changepoint::Options::default());
    let segment = &prev[cps.last().map_or(0, |c| c.index)..];
    let seed = stats::seed_of(&format!("{}{}{}", c.name, s.params_text(), run.id));
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
    about.segment_start = Some(prev.len() - segment.len());
    about.segment_runs = Some(segment.len());
    about.segment_median = Some(segment_median);
    about.change_points = Some(cps.len());
    about.values = Some(prev.clone());
    e.observed = finite(observed);
    e.interval = Some([finite(interval.lo), finite(interval.hi)]);
    e.clusters = BTreeMap::from([
        (c.class.clone(), mine.clusters()),
        ("earlier runs".to_string(), segment.len()),
    ]);
    e.merged = Some(mine.merged());
    e.verdict = verdict;
    e.passes = verdict.passes(c.inconclusive_passes);
    if verdict == Verdict::Inconclusive {
        e.note = Some(format!(
            "the {:.0} % interval of this run against the {} earlier runs since their last change straddles the bound",
            c.confidence * 100.0,
            segment.len()
        ));
    }
    e.history = Some(about);
    e
}
