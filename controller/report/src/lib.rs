//! Reports, rendered only from the store: `report.json` (the contract later
//! tooling and CI depend on), `report.md` with the article-style tables, and
//! SVG plots.
//!
//! report.json:
//! `{run_id, scenario, status, started_at, finished_at,
//!   environment: {instance_classes: {<class>: {postgres: {version, settings},
//!                 storage: {profile, emulated}, host: {cores, memory_bytes, hostname},
//!                 instance: {type, memory_bytes, cpus, emulated, cgroups}, agents}}},
//!   cells: [{cell_id, workload, instance_class, agent, state, error, started_at, finished_at,
//!            environment (a multi-role cell's: {<role>: ...})}],
//!   results: [{workload, instance_class, agent, cell_id, params, metrics}],
//!   summaries: [{workload, script, params, classes: {<class>: {<metric>: {value, merged, median, min, max, values},
//!                latency_histograms_us, cells}}}] (`value` is the class's figure: for latency quantiles
//!                with every cluster's histogram the merged distribution's quantile (`merged`), else the
//!                median over clusters; `values` per cluster; `figure.rs`),
//!   summaries[].entry / comparisons[].entry: the workload entry's index,
//!   comparisons: [{entry, workload, script, metric, baseline_class, class, ratio}],
//!   differences, warnings: see `guards.rs`;
//!   summaries[].label, entry_comparisons: see `entries.rs`;
//!   checks, check_summary: see `checks.rs` (history checks: `trend.rs`);
//!   costs: see `cost.rs`; check_error: the stored
//!   scenario no longer parses (no checks judged),
//!   timeseries: {<cell_id>: [{second, tps, latency_ms_mean, latency_ms_p50, latency_ms_p99}]},
//!   samples: {<sample kind>: {<cell_id>: [<as the workload sent it>]}}}`
//!   (every sample kind but the sampler's `pg_stat` and the `second`s above;
//!   e.g. toast-slice's `repeat`, vacuum-bloat's `vacuum` progress)
//!
//! `results[].params` / `metrics` are the kinds' typed points
//! (`pgfleet_proto::workload::<kind>::{PointParams, Metrics}`) as JSON.
//!
//! Summaries and comparisons cover each kind's `compared` metrics
//! (`pgfleet_proto::workload::KINDS`): the per-class figure, min and max
//! over cells, and each class's figure divided by the first class's.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value as Json, json};

use pgfleet_store::Error;
use pgfleet_store::Result;
use pgfleet_store::Store;

pub mod changepoint;
pub mod checks;
pub mod comparable;
pub mod compare;
mod compression_analysis;
pub mod cost;
mod curves;
pub mod entries;
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
    pub results: Vec<Json>,
    pub summaries: Vec<Json>,
    pub comparisons: Vec<Json>,
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
    let results: Vec<Json> = results
        .iter()
        .map(|r| {
            let c = by_id.get(r.cell_id.as_str());
            // A swept key the kind's point does not report (say pgbench's
            // fillfactor) still sets its points apart.
            let point = c.map(|c| c.point.clone()).unwrap_or_default();
            let mut params = r.params.clone();
            if let Some(p) = params.as_object_mut() {
                for (k, v) in &point {
                    p.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            json!({
                "workload": c.map(|c| c.workload.clone()),
                "instance_class": c.map(|c| c.instance_class.clone()),
                "agent": c.and_then(|c| c.agent_id.clone()),
                "cell_id": r.cell_id,
                "params": params,
                "point": point,
                "metrics": r.metrics,
            })
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
pub fn build(store: &Store, run_id: &str) -> Result<Json> {
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
    let env_classes = serde_json::to_value(&classes).unwrap_or_default();
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
    let compared: Vec<&str> = comparisons
        .iter()
        .filter_map(|c| c["class"].as_str())
        .collect();
    let mut warnings = guards::warnings(&differences, &plan_warnings, &compared);
    warnings.extend(guards::oversubscribed(&classes, &cells));
    warnings.extend(guards::delivered(&classes));
    warnings.extend(guards::unbound(&classes, &results));
    warnings.extend(guards::datasets(&cells));
    if results.iter().any(|r| r["workload"] == "pgbench") {
        warnings.extend(guards::dirty_fill(
            &results,
            &store.samples(run_id, "pg_stat")?,
        ));
    }
    let mut timeseries = serde_json::Map::new();
    for (cell, data) in store.samples(run_id, "second")? {
        let e = timeseries.entry(cell).or_insert_with(|| json!([]));
        if let Some(a) = e.as_array_mut() {
            a.push(json!({"second": data["second"], "tps": data["tps"], "latency_ms_mean": data["latency_ms_mean"],
                          "latency_ms_p50": data["latency_ms_p50"], "latency_ms_p99": data["latency_ms_p99"]}));
        }
    }
    // Every other kind of sample a workload sent, as sent (the sampler's
    // pg_stat deltas stay in the store: `pgfleet` reads them, reports sum them).
    let mut samples = serde_json::Map::new();
    for kind in store.sample_kinds(run_id)? {
        if kind == "pg_stat" || kind == "second" {
            continue;
        }
        let mut by_cell = serde_json::Map::new();
        for (cell, data) in store.samples(run_id, &kind)? {
            if let Some(a) = by_cell
                .entry(cell)
                .or_insert_with(|| json!([]))
                .as_array_mut()
            {
                a.push(data);
            }
        }
        samples.insert(kind, Json::Object(by_cell));
    }
    Ok(json!({
        "run_id": run.id,
        "scenario": run.scenario_name,
        "scenario_path": run.scenario_path,
        "status": run.status,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "seconds": run.seconds(),
        "estimated_seconds": run.estimated_seconds,
        "labels": run.labels,
        "kept": run.kept,
        "environment": {"instance_classes": env_classes},
        "differences": differences,
        "warnings": warnings,
        "cells": cells.iter().map(|c| json!({
            "cell_id": c.cell_id, "workload": c.workload, "instance_class": c.instance_class,
            "agent": c.agent_id, "state": c.state, "error": c.error,
            "started_at": c.started_at, "finished_at": c.finished_at,
            "seconds": c.seconds(), "estimate_seconds": c.estimate_seconds,
            "environment": c.environment,
        })).collect::<Vec<_>>(),
        "results": results,
        "summaries": summaries,
        "comparisons": comparisons,
        "entry_comparisons": entry_comparisons,
        "check_summary": checks::summary(&checks),
        "checks": checks,
        "check_error": check_error,
        "costs": costs,
        "timeseries": timeseries,
        "samples": samples,
    }))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    pgfleet_scenario::stats::median(v)
}

/// The workload entry (index in `workloads`) a cell belongs to: its id
/// starts `w<index>-`.
fn entry_of(cell_id: &str) -> Option<usize> {
    cell_id.strip_prefix('w')?.split('-').next()?.parse().ok()
}

/// Groups results of the same kind and point parameters by instance class:
/// per-class medians of the kind's compared metrics with min, max and each
/// cell's value; then each class's median against the first class's (the
/// baseline).
fn summarize(results: &[Json]) -> (Vec<Json>, Vec<Json>) {
    let mut groups: Vec<(String, Vec<&Json>)> = Vec::new();
    for r in results {
        let entry = entry_of(r["cell_id"].as_str().unwrap_or(""));
        let key = format!("{entry:?}{}{}", r["workload"], r["params"]);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    let (mut summaries, mut comparisons) = (Vec::new(), Vec::new());
    for (_, rs) in groups {
        let compared: Vec<&str> = rs[0]["workload"]
            .as_str()
            .and_then(pgfleet_proto::workload::info)
            .map(|k| k.compared.iter().map(|m| m.name).collect())
            .unwrap_or_default();
        let mut classes: Vec<String> = Vec::new();
        for r in &rs {
            let c = r["instance_class"].as_str().unwrap_or("").to_string();
            if !classes.contains(&c) {
                classes.push(c);
            }
        }
        let mut per_class = serde_json::Map::new();
        let mut medians: BTreeMap<(String, &str), f64> = BTreeMap::new();
        for c in &classes {
            let mine: Vec<&&Json> = rs
                .iter()
                .filter(|r| r["instance_class"] == c.as_str())
                .collect();
            let mut m = serde_json::Map::new();
            // Each cluster's latency histogram, when every one sent it: the
            // class's latency quantiles are its merged distribution's.
            let hists: Option<Vec<Json>> = mine
                .iter()
                .map(|r| {
                    let h = &r["metrics"]["latency_histogram_us"];
                    h.as_array().filter(|a| !a.is_empty()).map(|_| h.clone())
                })
                .collect();
            if let Some(h) = hists {
                m.insert("latency_histograms_us".into(), Json::Array(h));
            }
            for metric in &compared {
                let mut vals: Vec<f64> = mine
                    .iter()
                    .filter_map(|r| r["metrics"][*metric].as_f64())
                    .collect();
                if vals.is_empty() {
                    continue;
                }
                let values = vals.clone();
                let med = median(&mut vals);
                m.insert(metric.to_string(), json!({"values": values}));
                let figure = figure::Figure::of(&Json::Object(m.clone()), metric);
                let value = figure.as_ref().map(|f| f.value()).unwrap_or(med);
                medians.insert((c.clone(), metric), value);
                m.insert(
                    metric.to_string(),
                    json!({"value": value, "merged": figure.is_some_and(|f| f.merged()),
                           "median": med, "min": vals.first(), "max": vals.last(), "values": values}),
                );
            }
            m.insert("cells".into(), json!(mine.len()));
            per_class.insert(c.clone(), Json::Object(m));
        }
        let first = &rs[0];
        let entry = entry_of(first["cell_id"].as_str().unwrap_or(""));
        summaries.push(json!({
            "entry": entry,
            "workload": first["workload"],
            "script": first["params"]["script"],
            "params": first["params"],
            "point": first["point"],
            "classes": per_class,
        }));
        let Some(base) = classes.first() else {
            continue;
        };
        for c in classes.iter().skip(1) {
            for metric in &compared {
                if let (Some(b), Some(x)) = (
                    medians.get(&(base.clone(), metric)),
                    medians.get(&(c.clone(), metric)),
                ) && *b != 0.0
                {
                    comparisons.push(json!({
                        "entry": entry,
                        "workload": first["workload"], "script": first["params"]["script"],
                        "metric": metric, "baseline_class": base, "class": c, "ratio": x / b,
                    }));
                }
            }
        }
    }
    (summaries, comparisons)
}

/// Writes report.json, report.md and the plots into `dir`; returns the
/// report document.
pub fn write(store: &Store, run_id: &str, dir: &Path) -> Result<Json> {
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
