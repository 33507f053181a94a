//! Reports, rendered only from the store: `report.json` (the contract later
//! tooling and CI depend on), `report.md` with the article-style tables, and
//! SVG plots.
//!
//! report.json is `document::Report`: its fields and their meaning are
//! there, with the `version` that tells its shapes apart.
//!
//! `results[].params` / `metrics` are the kinds' typed points
//! (`pgfleet_proto::workload::<kind>::{PointParams, Metrics}`) as JSON.
//!
//! Summaries and comparisons cover each kind's `compared` metrics
//! (`pgfleet_proto::workload::KINDS`): the per-class figure, min and max
//! over cells, and each class's figure divided by the first class's.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value as Json;

use pgfleet_store::Error;
use pgfleet_store::Result;
use pgfleet_store::Store;

pub use document::{
    Cell, ClassFigures, Comparison, Judged, MetricFigure, Params, Report, ResultRow, Second,
    Summary,
};

pub mod changepoint;
pub mod checks;
pub mod comparable;
pub mod compare;
mod compression_analysis;
pub mod cost;
mod curves;
pub mod document;
pub mod entries;
mod faults;
pub mod figure;
mod fio;
pub mod guards;
pub mod history;
pub mod html;
mod logical_drain;
pub mod markdown;
mod pgbench;
mod pgbench_init;
pub mod plot;
pub mod postgresbench;
mod read_write;
pub mod table;
mod toast_probe;
mod toast_slice;
pub mod trend;
mod vacuum_bloat;

/// What a run measured, without its samples: its cells, classes, results
/// and summaries (per point, per class, the figures). The report is built
/// from it; `pgfleet history` reads it of each run it compares.
pub struct Figures {
    pub run: pgfleet_store::RunRow,
    pub cells: Vec<pgfleet_store::CellRow>,
    pub classes: guards::Classes,
    pub results: Vec<ResultRow>,
    pub summaries: Vec<Summary>,
    pub comparisons: Vec<Comparison>,
}

pub fn figures(store: &Store, run_id: &str) -> Result<Figures> {
    let run = store.run(run_id)?.ok_or_else(|| {
        Error::Usage(format!(
            "no run `{run_id}` in the store; `pgfleet list` shows the runs"
        ))
    })?;
    let cells = store.cells(run_id)?;
    let agents = store.agents(run_id)?;
    let results = store.results(run_id)?;

    let classes = guards::class_environments(&agents, &cells);
    let by_id: BTreeMap<&str, &pgfleet_store::CellRow> =
        cells.iter().map(|c| (c.cell_id.as_str(), c)).collect();
    let results: Vec<ResultRow> = results
        .iter()
        .map(|r| {
            let c = by_id.get(r.cell_id.as_str());
            // A swept key the kind's point does not report (say pgbench's
            // fillfactor) still sets its points apart.
            let point = c.map(|c| c.point.clone()).unwrap_or_default();
            let mut params = r.params.as_object().cloned().unwrap_or_default();
            for (k, v) in &point {
                params.entry(k.clone()).or_insert_with(|| v.clone());
            }
            ResultRow {
                workload: c.map(|c| c.workload.clone()),
                instance_class: c.map(|c| c.instance_class.clone()),
                agent: c.and_then(|c| c.agent_id.clone()),
                cell_id: r.cell_id.clone(),
                params,
                point,
                metrics: r.metrics.clone(),
            }
        })
        .collect();
    let (mut summaries, comparisons) = summarize(&results);
    entries::label(&mut summaries);
    Ok(Figures {
        run,
        cells,
        classes,
        results,
        summaries,
        comparisons,
    })
}

/// Builds the report document of a run from the store.
pub fn build(store: &Store, run_id: &str) -> Result<Report> {
    let Figures {
        run,
        cells,
        classes,
        results,
        summaries,
        comparisons,
    } = figures(store, run_id)?;
    let entry_comparisons = entries::comparisons(&summaries);
    // The scenario as it was run (stored with the run): its checks, and
    // its plan's warnings with the memory the clusters really had.
    let host_memory = classes
        .values()
        .map(|c| c.env.host.memory_bytes)
        .filter(|m| *m > 0)
        .min()
        .unwrap_or(0);
    let (checks, check_error, plan_warnings, costs) = match store.scenario_yaml(run_id)? {
        Some(yaml) => match pgfleet_scenario::parse(Path::new(&run.scenario_path), &yaml) {
            Ok(sc) => {
                let planned = pgfleet_scenario::plan(&sc);
                let all = sc.checks();
                let mut judged = checks::evaluate(&all, &summaries);
                // Only history checks need the run's comparability key
                // (and the earlier runs): not computed on every render.
                if all.iter().any(|c| c.history.is_some()) {
                    let key = |vary: &[String]| comparable::key(&yaml, &classes, &cells, vary);
                    judged.extend(trend::judge(store, &run, &key, &all, &summaries)?);
                }
                let costs = sc
                    .prices()
                    .map(|(currency, prices)| cost::costs(&currency, &prices, &summaries, &cells));
                (
                    judged,
                    None,
                    pgfleet_scenario::plan::warnings(&sc, &planned, host_memory),
                    costs,
                )
            }
            Err(e) => (Vec::new(), Some(e.to_string()), Vec::new(), None),
        },
        None => (Vec::new(), None, Vec::new(), None),
    };
    let differences = guards::differences(&classes);
    let compared: Vec<&str> = comparisons.iter().map(|c| c.class.as_str()).collect();
    let mut warnings = guards::warnings(&differences, &plan_warnings, &compared);
    warnings.extend(guards::oversubscribed(&classes, &cells));
    warnings.extend(guards::delivered(&classes));
    warnings.extend(guards::unbound(&classes, &results));
    warnings.extend(guards::datasets(&cells));
    if results.iter().any(|r| r.workload() == "pgbench") {
        warnings.extend(guards::dirty_fill(
            &results,
            &store.samples(run_id, "pg_stat")?,
        ));
    }
    let mut timeseries: BTreeMap<String, Vec<Second>> = BTreeMap::new();
    for (cell, data) in store.samples(run_id, "second")? {
        timeseries
            .entry(cell)
            .or_default()
            .push(Second::deserialize(&data).unwrap_or_default());
    }
    // Every other kind of sample a workload sent, as sent (the sampler's
    // pg_stat deltas stay in the store: `pgfleet` reads them, reports sum them).
    let mut samples: BTreeMap<String, BTreeMap<String, Vec<Json>>> = BTreeMap::new();
    for kind in store.sample_kinds(run_id)? {
        if kind == "pg_stat" || kind == "second" {
            continue;
        }
        let by_cell = samples.entry(kind.clone()).or_default();
        for (cell, data) in store.samples(run_id, &kind)? {
            by_cell.entry(cell).or_default().push(data);
        }
    }
    let cells = cells
        .iter()
        .map(|c| Cell {
            cell_id: c.cell_id.clone(),
            workload: c.workload.clone(),
            instance_class: c.instance_class.clone(),
            agent: c.agent_id.clone(),
            state: c.state.clone(),
            error: c.error.clone(),
            started_at: c.started_at.clone(),
            finished_at: c.finished_at.clone(),
            seconds: c.seconds(),
            estimate_seconds: c.estimate_seconds,
            estimate_phases: c.estimate.as_ref().map(|e| e.phases),
            environment: c.environment.clone(),
        })
        .collect();
    Ok(Report {
        version: document::VERSION,
        run_id: run.id.clone(),
        scenario: run.scenario_name.clone(),
        scenario_path: run.scenario_path.clone(),
        status: run.status.clone(),
        started_at: run.started_at.clone(),
        finished_at: run.finished_at.clone(),
        seconds: run.seconds(),
        estimated_seconds: run.estimated_seconds,
        labels: run.labels.clone(),
        kept: run
            .kept
            .as_ref()
            .and_then(|k| document::Kept::deserialize(k).ok()),
        environment: document::Environments {
            instance_classes: classes,
        },
        differences,
        warnings,
        cells,
        results,
        summaries,
        comparisons,
        entry_comparisons,
        check_summary: checks::summary(&checks),
        checks,
        check_error,
        costs,
        timeseries,
        samples,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    pgfleet_scenario::stats::median(v)
}

pub use pgfleet_scenario::plan::entry_of;

/// Groups results of the same kind and point parameters by instance class:
/// per-class medians of the kind's compared metrics with min, max and each
/// cell's value; then each class's median against the first class's (the
/// baseline).
fn summarize(results: &[ResultRow]) -> (Vec<Summary>, Vec<Comparison>) {
    // (entry, kind, parameters): a point of an entry.
    type Point<'a> = (Option<usize>, &'a str, &'a Params);
    let mut groups: Vec<(Point, Vec<&ResultRow>)> = Vec::new();
    for r in results {
        let key = (entry_of(&r.cell_id), r.workload(), &r.params);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    let (mut summaries, mut comparisons) = (Vec::new(), Vec::new());
    for ((entry, workload, params), rs) in groups {
        let compared: Vec<&str> = pgfleet_proto::workload::info(workload)
            .map(|k| k.compared.iter().map(|m| m.name).collect())
            .unwrap_or_default();
        let mut classes: Vec<&str> = Vec::new();
        for r in &rs {
            if !classes.contains(&r.class()) {
                classes.push(r.class());
            }
        }
        let mut per_class = BTreeMap::new();
        let mut medians: BTreeMap<(&str, &str), f64> = BTreeMap::new();
        for c in &classes {
            let mine: Vec<&&ResultRow> = rs.iter().filter(|r| r.class() == *c).collect();
            let mut figures = ClassFigures {
                cells: mine.len(),
                // Each cluster's latency histogram, when every one sent it:
                // the class's latency quantiles are its merged distribution's.
                latency_histograms_us: mine
                    .iter()
                    .map(|r| {
                        r.metrics
                            .get("latency_histogram_us")
                            .and_then(|h| <Vec<[u64; 2]>>::deserialize(h).ok())
                            .filter(|h| !h.is_empty())
                    })
                    .collect(),
                metrics: BTreeMap::new(),
            };
            for metric in &compared {
                let mut vals: Vec<f64> = mine
                    .iter()
                    .filter_map(|r| r.metrics.get(*metric)?.as_f64())
                    .collect();
                if vals.is_empty() {
                    continue;
                }
                let values = vals.clone();
                let med = median(&mut vals);
                let f = figure::Figure::of_values(&figures, metric, &values);
                let value = f.as_ref().map_or(med, |f| f.value());
                let merged = f.is_some_and(|f| f.merged());
                medians.insert((c, metric), value);
                figures.metrics.insert(
                    metric.to_string(),
                    MetricFigure {
                        value,
                        merged,
                        median: med,
                        min: vals.first().copied(),
                        max: vals.last().copied(),
                        values,
                    },
                );
            }
            per_class.insert(c.to_string(), figures);
        }
        let script = params
            .get("script")
            .and_then(Json::as_str)
            .map(str::to_string);
        let point = rs[0].point.clone();
        summaries.push(Summary {
            entry,
            workload: workload.to_string(),
            script: script.clone(),
            params: params.clone(),
            point,
            classes: per_class,
            label: String::new(),
        });
        let Some(base) = classes.first() else {
            continue;
        };
        for c in classes.iter().skip(1) {
            for metric in &compared {
                if let (Some(b), Some(x)) =
                    (medians.get(&(*base, *metric)), medians.get(&(*c, *metric)))
                    && *b != 0.0
                {
                    comparisons.push(Comparison {
                        entry,
                        workload: workload.to_string(),
                        script: script.clone(),
                        metric: metric.to_string(),
                        baseline_class: base.to_string(),
                        class: c.to_string(),
                        ratio: x / b,
                    });
                }
            }
        }
    }
    (summaries, comparisons)
}

/// Writes report.json, report.md and the plots into `dir`; returns the
/// report document.
pub fn write(store: &Store, run_id: &str, dir: &Path) -> Result<Report> {
    let doc = build(store, run_id)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Report(format!("creating {}: {e}", dir.display())))?;
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text)
            .map_err(|e| Error::Report(format!("writing {}: {e}", dir.join(name).display())))
    };
    write(
        "report.json",
        &serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )?;
    let (md, plots) = markdown::render(&doc);
    for (name, svg) in &plots {
        write(name, svg)?;
    }
    write("report.md", &md)?;
    let title = format!("pgfleet run {run_id}");
    write("report.html", &html::render(&title, &md, &plots))?;
    Ok(doc)
}
