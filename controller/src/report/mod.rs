//! Reports, rendered only from the store: `report.json` (the contract later
//! tooling and CI depend on), `report.md` with the article-style tables, and
//! SVG plots.
//!
//! report.json:
//! `{run_id, scenario, status, started_at, finished_at,
//!   environment: {instance_classes: {<class>: {postgres: {version, settings},
//!                 storage: {profile, emulated}, host: {cores, memory_bytes, hostname}, agents}}},
//!   cells: [{cell_id, workload, instance_class, agent, state, error, started_at, finished_at}],
//!   results: [{workload, instance_class, agent, cell_id, params, metrics}]}`

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value as Json, json};

use crate::store::Store;
use crate::{Error, Result};

mod markdown;
pub mod plot;

/// Builds the report document of a run from the store.
pub fn build(store: &Store, run_id: &str) -> Result<Json> {
    let run = store.run(run_id)?.ok_or_else(|| {
        Error::Usage(format!(
            "no run `{run_id}` in the store; `pgfleet list` shows the runs"
        ))
    })?;
    let cells = store.cells(run_id)?;
    let agents = store.agents(run_id)?;
    let results = store.results(run_id)?;

    let mut classes: BTreeMap<String, Json> = BTreeMap::new();
    for a in &agents {
        let e = classes.entry(a.instance_class.clone()).or_insert_with(|| {
            json!({
                "postgres": {"version": a.info["postgres_version"], "settings": {}},
                "storage": {"profile": a.info["storage"]["profile"], "emulated": a.info["storage"]["emulated"]},
                "host": {"cores": a.info["cores"], "memory_bytes": a.info["memory_bytes"], "hostname": a.info["hostname"]},
                "agents": [],
            })
        });
        if let Some(list) = e["agents"].as_array_mut() {
            list.push(json!(a.agent_id));
        }
    }
    // The cluster's own view (settings as the server reports them) wins.
    for c in &cells {
        if let (Some(env), Some(class)) = (&c.environment, classes.get_mut(&c.instance_class))
            && class["postgres"]["settings"]
                .as_object()
                .is_some_and(|m| m.is_empty())
            && env.get("postgres").is_some()
        {
            class["postgres"] = env["postgres"].clone();
            class["storage"] = env["storage"].clone();
            class["host"] = env["host"].clone();
        }
    }
    let by_id: BTreeMap<&str, &crate::store::CellRow> =
        cells.iter().map(|c| (c.cell_id.as_str(), c)).collect();
    let results: Vec<Json> = results
        .iter()
        .map(|r| {
            let c = by_id.get(r.cell_id.as_str());
            json!({
                "workload": c.map(|c| c.workload.clone()),
                "instance_class": c.map(|c| c.instance_class.clone()),
                "agent": c.and_then(|c| c.agent_id.clone()),
                "cell_id": r.cell_id,
                "params": r.params,
                "metrics": r.metrics,
            })
        })
        .collect();
    Ok(json!({
        "run_id": run.id,
        "scenario": run.scenario_name,
        "scenario_path": run.scenario_path,
        "status": run.status,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "environment": {"instance_classes": classes},
        "cells": cells.iter().map(|c| json!({
            "cell_id": c.cell_id, "workload": c.workload, "instance_class": c.instance_class,
            "agent": c.agent_id, "state": c.state, "error": c.error,
            "started_at": c.started_at, "finished_at": c.finished_at,
        })).collect::<Vec<_>>(),
        "results": results,
    }))
}

/// Writes report.json, report.md and the plots into `dir`.
pub fn write(store: &Store, run_id: &str, dir: &Path) -> Result<()> {
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
    Ok(())
}
