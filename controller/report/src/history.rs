//! `pgfleet history`: a scenario's figures over its runs, with the change
//! points found in them (`changepoint`), compared only across runs that
//! can be compared.
//!
//! Runs are comparable when their comparability key is equal
//! (`report/comparable.rs`: scenario text, each class's environment,
//! datasets). The reference is the latest run picked; every other run
//! whose key differs is left out, and the history says which and why.
//!
//! Per point (workload entry and parameters), class and metric, a series
//! holds each comparable run's figure (the class's median over its
//! clusters, with its bootstrap interval), the change points of the
//! figures, and the latest run's standing against the median of the last
//! segment (the runs since the last change, the latest excluded).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::changepoint::{self, ChangePoint};
use crate::comparable::{key_of, point_key, why_not};
use crate::document::Summary;
use crate::figure::Figure;
use pgfleet_scenario::labels::Labels;
use pgfleet_store::Store;

use pgfleet_scenario::stats;
use pgfleet_store::Error;
use pgfleet_store::Result;

/// Which runs and series a history covers.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// The scenario's name (`scenario_name` reads it from a file).
    pub scenario: String,
    /// Only these metrics (default: every compared metric).
    pub metrics: Vec<String>,
    pub class: Option<String>,
    /// Only points whose label, workload or parameters contain this.
    pub point: Option<String>,
    pub labels: Labels,
    /// The last this many comparable runs.
    pub last: usize,
    /// PostgreSQL settings left out of the comparability key: runs that
    /// differ in them are compared (the change is what is followed).
    pub vary: Vec<String>,
    pub level: f64,
    pub options: changepoint::Options,
}

#[derive(Debug, Clone, Serialize)]
pub struct History {
    pub scenario: String,
    /// The run the others are compared with (the latest picked).
    pub reference: String,
    pub runs: Vec<RunRef>,
    /// Runs of the scenario left out, each with why.
    pub excluded: Vec<Excluded>,
    /// The settings followed (`--vary`): runs differing in them compared.
    pub vary: Vec<String>,
    pub series: Vec<Series>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunRef {
    pub id: String,
    pub started_at: String,
    pub labels: Labels,
}

#[derive(Debug, Clone, Serialize)]
pub struct Excluded {
    pub run_id: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub point: String,
    pub workload: String,
    pub params: crate::Params,
    pub class: String,
    pub metric: String,
    pub higher_is_better: bool,
    pub values: Vec<Value>,
    pub change_points: Vec<Change>,
    pub latest: Option<Standing>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Value {
    pub run_id: String,
    pub value: f64,
    pub interval: [f64; 2],
    pub clusters: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// The first run of the new segment.
    pub run_id: String,
    #[serde(flatten)]
    pub at: ChangePoint,
    pub change_percent: f64,
}

/// The latest run against the runs since the last change.
#[derive(Debug, Clone, Serialize)]
pub struct Standing {
    pub run_id: String,
    pub value: f64,
    pub segment_median: f64,
    /// Runs in the segment (the latest excluded).
    pub segment_runs: usize,
    pub change_percent: f64,
}

/// The scenario name the CLI's argument names: a file's `name`, else the
/// text. (The API takes names only: it never reads the server's files.)
pub fn scenario_name(q: &str) -> Result<String> {
    let p = Path::new(q);
    if p.is_file() {
        let yaml = pgfleet_scenario::read(p)?;
        return Ok(pgfleet_scenario::parse(p, &yaml)?.name.value);
    }
    Ok(q.to_string())
}

pub fn history(store: &Store, q: &Query) -> Result<History> {
    let name = q.scenario.clone();
    let runs: Vec<_> = store
        .runs()?
        .into_iter()
        .filter(|r| r.scenario_name == name && r.labels.matches(&q.labels))
        .collect();
    if runs.is_empty() {
        return Err(Error::Usage(format!(
            "no run of scenario `{name}`{} in the store: `pgfleet list` shows the runs",
            if q.labels.is_empty() {
                String::new()
            } else {
                format!(" labelled {}", q.labels)
            }
        )));
    }
    let mut excluded = Vec::new();
    let mut measured = Vec::new();
    for r in runs {
        if r.status != "succeeded" {
            excluded.push(Excluded {
                run_id: r.id,
                reason: format!("it {}", r.status),
            });
            continue;
        }
        let f = crate::figures(store, &r.id)?;
        let key = key_of(store, &f, &q.vary)?;
        measured.push((f, key));
    }
    let Some((reference, ref_key)) = measured.last().map(|(f, k)| (f.run.id.clone(), k.clone()))
    else {
        return Err(Error::Usage(format!(
            "no run of scenario `{name}` succeeded: nothing to compare ({} runs left out)",
            excluded.len()
        )));
    };
    let mut comparable = Vec::new();
    for (f, key) in measured {
        match why_not(&key, &ref_key) {
            Some(reason) => excluded.push(Excluded {
                run_id: f.run.id.clone(),
                reason,
            }),
            None => comparable.push(f),
        }
    }
    let last = if q.last == 0 { usize::MAX } else { q.last };
    if comparable.len() > last {
        for f in comparable.drain(..comparable.len() - last) {
            excluded.push(Excluded {
                run_id: f.run.id,
                reason: format!("older than the last {last} comparable runs (--last)"),
            });
        }
    }
    excluded.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    let series = build_series(&comparable, q);
    Ok(History {
        scenario: name,
        reference,
        runs: comparable
            .iter()
            .map(|f| RunRef {
                id: f.run.id.clone(),
                started_at: f.run.started_at.clone(),
                labels: f.run.labels.clone(),
            })
            .collect(),
        excluded,
        vary: q.vary.clone(),
        series,
    })
}

fn point_label(s: &Summary) -> String {
    if s.label.is_empty() {
        s.workload.clone()
    } else {
        format!("{} ({})", s.workload, s.label)
    }
}

fn build_series(runs: &[crate::Figures], q: &Query) -> Vec<Series> {
    // (point key) -> (class, metric) -> values in run order.
    let mut out: BTreeMap<(String, String, String), Series> = BTreeMap::new();
    let mut order: Vec<(String, String, String)> = Vec::new();
    for f in runs {
        for s in &f.summaries {
            let point = point_label(s);
            let text = format!("{point} {}", s.params_text());
            if q.point.as_ref().is_some_and(|p| !text.contains(p.as_str())) {
                continue;
            }
            let point_key = point_key(s);
            for (class, cm) in &s.classes {
                if q.class.as_ref().is_some_and(|c| c != class) {
                    continue;
                }
                for metric in cm.metrics.keys() {
                    if !q.metrics.is_empty() && !q.metrics.contains(metric) {
                        continue;
                    }
                    let Some(fig) = Figure::of(cm, metric) else {
                        continue;
                    };
                    let id = (point_key.clone(), class.clone(), metric.clone());
                    let seed = stats::seed_of(&format!("{}{point_key}{class}{metric}", f.run.id));
                    let i = fig.interval(q.level, seed);
                    let entry = out.entry(id.clone()).or_insert_with(|| {
                        order.push(id.clone());
                        Series {
                            point: point.clone(),
                            workload: s.workload.clone(),
                            params: s.params.clone(),
                            class: class.clone(),
                            metric: metric.clone(),
                            higher_is_better: crate::figure::higher_is_better(&s.workload, metric),
                            values: Vec::new(),
                            change_points: Vec::new(),
                            latest: None,
                        }
                    });
                    entry.values.push(Value {
                        run_id: f.run.id.clone(),
                        value: fig.value(),
                        interval: [i.lo, i.hi],
                        clusters: fig.clusters(),
                    });
                }
            }
        }
    }
    order
        .into_iter()
        .filter_map(|id| out.remove(&id))
        .map(|mut s| {
            let x: Vec<f64> = s.values.iter().map(|v| v.value).collect();
            let cps = changepoint::detect(&x, &q.options);
            let start = cps.last().map_or(0, |c| c.index);
            s.change_points = cps
                .into_iter()
                .map(|c| Change {
                    run_id: s.values[c.index].run_id.clone(),
                    change_percent: percent(c.after, c.before),
                    at: c,
                })
                .collect();
            if x.len() >= 2 {
                let segment = &x[start.min(x.len() - 1)..x.len() - 1];
                let segment = if segment.is_empty() {
                    &x[..x.len() - 1]
                } else {
                    segment
                };
                let m = stats::median(segment);
                let latest = x[x.len() - 1];
                s.latest = Some(Standing {
                    run_id: s.values[x.len() - 1].run_id.clone(),
                    value: latest,
                    segment_median: m,
                    segment_runs: segment.len(),
                    change_percent: percent(latest, m),
                });
            }
            s
        })
        .collect()
}

fn percent(new: f64, old: f64) -> f64 {
    if old == 0.0 {
        0.0
    } else {
        (new / old - 1.0) * 100.0
    }
}

/// history.md's text and its plots (file name, SVG).
pub fn markdown(h: &History) -> (String, Vec<(String, String)>) {
    let mut md = String::new();
    let mut plots = Vec::new();
    let _ = writeln!(md, "# pgfleet history of `{}`\n", h.scenario);
    let _ = writeln!(
        md,
        "{} comparable runs (the reference: {}, the latest).",
        h.runs.len(),
        h.reference
    );
    if !h.vary.is_empty() {
        let _ = writeln!(
            md,
            "\nFollowing {}: runs that differ in {} are compared, so a change shows as a step in the series.",
            h.vary
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(", "),
            if h.vary.len() == 1 { "it" } else { "them" }
        );
    }
    if !h.excluded.is_empty() {
        let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
        for e in &h.excluded {
            *by_reason.entry(e.reason.as_str()).or_default() += 1;
        }
        let _ = writeln!(md, "\nLeft out:\n");
        for (reason, n) in by_reason {
            let _ = writeln!(
                md,
                "- {n} run{}: {}",
                if n == 1 { "" } else { "s" },
                reason.replace('|', "\\|")
            );
        }
    }
    for (i, s) in h.series.iter().enumerate() {
        let _ = writeln!(
            md,
            "\n## {} · class `{}` · {}\n",
            s.point, s.class, s.metric
        );
        if let Some(l) = &s.latest {
            let better = (l.change_percent > 0.0) == s.higher_is_better;
            let _ = writeln!(
                md,
                "Latest run {}: {} against {} (median of the {} run{} since the last change): **{:+.1} %**{}.\n",
                l.run_id,
                crate::table::sig(l.value),
                crate::table::sig(l.segment_median),
                l.segment_runs,
                if l.segment_runs == 1 { "" } else { "s" },
                l.change_percent,
                if l.change_percent.abs() < 0.05 {
                    ""
                } else if better {
                    " (better)"
                } else {
                    " (worse)"
                }
            );
        }
        if s.change_points.is_empty() {
            let _ = writeln!(md, "No change point in {} runs.\n", s.values.len());
        } else {
            let _ = writeln!(md, "| change at run | before | after | change | p |");
            let _ = writeln!(md, "|---|---:|---:|---:|---:|");
            for c in &s.change_points {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:+.1} % | {:.3} |",
                    c.run_id,
                    crate::table::sig(c.at.before),
                    crate::table::sig(c.at.after),
                    c.change_percent,
                    c.at.p_value
                );
            }
            md.push('\n');
        }
        let name = format!("history-{i}.svg");
        let mut segment = Vec::new();
        let bounds: Vec<usize> = std::iter::once(0)
            .chain(s.change_points.iter().map(|c| c.at.index))
            .chain(std::iter::once(s.values.len()))
            .collect();
        for w in bounds.windows(2) {
            let m = stats::median(
                &s.values[w[0]..w[1]]
                    .iter()
                    .map(|v| v.value)
                    .collect::<Vec<_>>(),
            );
            segment.push(((w[0] + 1) as f64, m));
            segment.push((w[1] as f64, m));
        }
        let svg = crate::plot::line_chart(
            &format!("{} · {} · {}", s.point, s.class, s.metric),
            "run (oldest first)",
            &s.metric,
            &[
                crate::plot::Series {
                    name: "run".into(),
                    points: s
                        .values
                        .iter()
                        .enumerate()
                        .map(|(i, v)| ((i + 1) as f64, v.value))
                        .collect(),
                    color: None,
                },
                crate::plot::Series {
                    name: "segment median".into(),
                    points: segment,
                    color: None,
                },
            ],
        );
        let _ = writeln!(md, "![{}]({name})\n", s.metric);
        let _ = writeln!(md, "| run | labels | value | interval |");
        let _ = writeln!(md, "|---|---|---:|---|");
        for v in &s.values {
            let labels = h
                .runs
                .iter()
                .find(|r| r.id == v.run_id)
                .map(|r| r.labels.to_string())
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} – {} |",
                v.run_id,
                labels.replace('|', "\\|").replace('`', "'"),
                crate::table::sig(v.value),
                crate::table::sig(v.interval[0]),
                crate::table::sig(v.interval[1])
            );
        }
        plots.push((name, svg));
    }
    (md, plots)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store holding a scenario's runs as a CI pipeline would leave
    /// them: a step in TPS at the sixth comparable run, one run on another
    /// PostgreSQL version, one failed run and one of another branch.
    #[test]
    fn history_finds_a_step_and_says_which_runs_it_left_out() {
        use pgfleet_store::{CellState, NewRun, Owner, RunStatus};
        use serde_json::json;
        let dir = std::env::temp_dir().join(format!("pgfleet-history-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir.join("s.db")).unwrap();
        let yaml = "name: h\nfleet: [{name: gp3}]\nworkloads: [{kind: pgbench, scale: 1, script: random-update, duration_s: 1}]\n";
        let sc = pgfleet_scenario::parse(Path::new("h.yaml"), yaml).unwrap();
        let cells = pgfleet_scenario::plan(&sc);
        let mut n = 0;
        let mut run_with =
            |yaml: &str, tps: f64, pg: &str, branch: &str, status: RunStatus| -> String {
                n += 1;
                let id = format!("r{n:02}");
                let labels = Labels::parse(&[format!("branch={branch}")]).unwrap();
                store
                    .create_run(&NewRun {
                        id: &id,
                        name: "h",
                        yaml,
                        labels: &labels,
                        cells: &cells,
                        ..NewRun::bare("", Owner::Run)
                    })
                    .unwrap();
                let info = pgfleet_store::Registration {
                    postgres_version: pg.to_string(),
                    cores: 2,
                    memory_bytes: 1 << 30,
                    ..Default::default()
                };
                store.register_agent(&id, "a-1", "gp3", &info).unwrap();
                let env = json!({"postgres": {"version": pg, "settings": {"fsync": "on"}},
                "storage": {"profile": "gp3"}, "host": {"cores": 2, "memory_bytes": 1 << 30}});
                for c in &cells {
                    let point = (
                        json!({"clients": 2}),
                        json!({"tps": tps, "latency_ms_p99": 1000.0 / tps}),
                    );
                    let state = if status == RunStatus::Succeeded {
                        CellState::Succeeded
                    } else {
                        CellState::Failed
                    };
                    store
                        .finish_cell(&id, &c.cell_id, state, None, Some(&env), &[point])
                        .unwrap();
                }
                store.finish_run(&id, status).unwrap();
                // Runs are ordered by when they were stored (milliseconds).
                std::thread::sleep(std::time::Duration::from_millis(3));
                id
            };
        let mut run = |tps: f64, pg: &str, branch: &str, status: RunStatus| {
            run_with(yaml, tps, pg, branch, status)
        };
        let tps = [
            1010.0, 990.0, 1003.0, 997.0, 1008.0, 702.0, 695.0, 705.0, 699.0, 701.0,
        ];
        let mut ids = Vec::new();
        for (i, t) in tps.iter().enumerate() {
            if i == 3 {
                run(400.0, "17.2", "main", RunStatus::Succeeded);
                run(1000.0, "15.18", "main", RunStatus::Failed);
                run(50.0, "15.18", "dev", RunStatus::Succeeded);
            }
            ids.push(run(*t, "15.18", "main", RunStatus::Succeeded));
        }
        let q = Query {
            scenario: "h".into(),
            labels: Labels::parse(&["branch=main"]).unwrap(),
            last: 30,
            level: 0.95,
            ..Default::default()
        };
        let h = history(&store, &q).unwrap();
        assert_eq!(h.reference, ids[9]);
        assert_eq!(h.runs.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), ids);
        let reasons: Vec<&str> = h.excluded.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "class `gp3`: PostgreSQL version: 17.2 (the reference: 15.18)",
                "it failed"
            ],
            "{:?}",
            h.excluded
        );
        let tps_series = h.series.iter().find(|s| s.metric == "tps").unwrap();
        assert!(tps_series.higher_is_better);
        assert_eq!(
            tps_series.change_points.len(),
            1,
            "{:?}",
            tps_series.change_points
        );
        let c = &tps_series.change_points[0];
        assert_eq!(c.run_id, ids[5]);
        assert!((c.change_percent + 30.0).abs() < 2.0, "{c:?}");
        let latest = tps_series.latest.as_ref().unwrap();
        assert_eq!(latest.segment_runs, 4);
        assert!(latest.change_percent.abs() < 1.0, "{latest:?}");
        let p99 = h
            .series
            .iter()
            .find(|s| s.metric == "latency_ms_p99")
            .unwrap();
        assert_eq!(p99.change_points[0].run_id, ids[5]);
        // --last keeps the newest comparable runs and says so.
        let h = history(
            &store,
            &Query {
                last: 4,
                ..q.clone()
            },
        )
        .unwrap();
        assert_eq!(h.runs.len(), 4);
        assert!(h.series[0].change_points.is_empty());
        assert_eq!(
            h.excluded
                .iter()
                .filter(|e| e.reason.contains("--last"))
                .count(),
            6
        );
        let (md, plots) = markdown(&h);
        assert!(md.contains("- 6 runs: older than the last 4"), "{md}");
        assert_eq!(plots.len(), h.series.len());
        // History checks: the same scenario with a check (checks do not
        // change what is comparable), judged against the runs since the
        // step (about 700 TPS).
        let checked = format!(
            "{yaml}checks:\n  - name: holds\n    history: {{ metric: tps, class: gp3, max_drop: 5%, same_labels: [branch] }}\n"
        );
        let verdict = |id: &str| {
            let doc = serde_json::to_value(crate::build(&store, id).unwrap()).unwrap();
            let c = doc["checks"].as_array().unwrap()[0].clone();
            (
                c["verdict"].as_str().unwrap().to_string(),
                c,
                doc["check_summary"]["ok"].clone(),
            )
        };
        let ok = run_with(&checked, 698.0, "15.18", "main", RunStatus::Succeeded);
        let (v, c, summary_ok) = verdict(&ok);
        assert_eq!(v, "passed", "{c}");
        assert_eq!(c["history"]["segment_runs"], 5, "{c}");
        assert_eq!(c["history"]["change_points"], 1, "{c}");
        assert_eq!(c["min"], 0.95, "{c}");
        assert_eq!(summary_ok, true);
        let (md, plots) = crate::markdown::render(&crate::build(&store, &ok).unwrap());
        assert!(
            md.contains("## History checks")
                && md.contains("**holds** (10 earlier comparable runs, 1 change point(s)"),
            "{md}"
        );
        assert!(
            plots
                .iter()
                .any(|(n, svg)| n == "history-check-0.svg" && svg.contains("this run"))
        );
        let slow = run_with(&checked, 560.0, "15.18", "main", RunStatus::Succeeded);
        let (v, c, summary_ok) = verdict(&slow);
        assert_eq!(v, "failed", "{c}");
        assert!((c["observed"].as_f64().unwrap() - 0.8).abs() < 0.01, "{c}");
        assert_eq!(summary_ok, false);
        let other = run_with(&checked, 700.0, "15.18", "dev2", RunStatus::Succeeded);
        let (v, c, _) = verdict(&other);
        assert_eq!(v, "inconclusive", "{c}");
        let note = c["note"].as_str().unwrap();
        assert!(
            note.contains(
                "0 comparable earlier runs of this scenario with the same branch (3 needed)"
            ) && note.contains("1 earlier runs differ"),
            "{note}"
        );
        // A scenario without runs, or none labelled so, is a clear error.
        let none = Query {
            labels: Labels::parse(&["branch=nope"]).unwrap(),
            ..q.clone()
        };
        let e = history(&store, &none).unwrap_err().to_string();
        assert!(e.contains("labelled branch=nope"), "{e}");
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
