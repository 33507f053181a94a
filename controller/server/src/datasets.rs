//! `pgfleet datasets`: the local dataset store seen from the command line
//! (list, remove; `build` is a run in `build` mode, `run::run_scenario`), and
//! the plan of a build: one cell per dataset a scenario's cells reuse.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use pgfleet_proto::dataset::{LocalStore, Manifest, Mode};
use pgfleet_proto::workload::{approx_bytes, approx_seconds};

use serde::Serialize;

use pgfleet_scenario::{self as scenario, PlannedCell};
use pgfleet_store::Error;
use pgfleet_store::Result;

/// A dataset as the stored runs saw it (`GET /v1/datasets`): which agent
/// built it and when, and how often cells restored it. The agents' stores
/// are the truth (a dataset removed there is built again by the next cell
/// that needs it); this is the controller's record of them.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct DatasetView {
    pub fingerprint: String,
    pub label: String,
    pub bytes: u64,
    /// Each build: run, cell, agent, finished at.
    pub builds: Vec<DatasetUse>,
    /// Cells that restored it, and the last one.
    pub restored: u64,
    pub last_restored: Option<DatasetUse>,
    /// Published copies found corrupt and built again.
    pub discarded: u64,
    /// The runs whose cells used it.
    pub runs: Vec<String>,
    /// On Kubernetes with `--dataset-snapshots`: the VolumeSnapshots that
    /// hold it (later runs' volumes of their storage class start from them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotView>,
}

/// A VolumeSnapshot holding a dataset.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct SnapshotView {
    pub name: String,
    pub storage_class: String,
    pub ready: bool,
    pub created: String,
}

/// Adds the snapshots holding each dataset to `views` (a dataset only a
/// snapshot holds gets a view of its own).
pub fn with_snapshots(views: &mut Vec<DatasetView>, snaps: &[crate::agents::kubernetes::Snapshot]) {
    for snap in snaps {
        for held in &snap.datasets {
            let i = match views.iter().position(|v| v.fingerprint == held.fingerprint) {
                Some(i) => i,
                None => {
                    views.push(DatasetView {
                        fingerprint: held.fingerprint.clone(),
                        label: held.label.clone(),
                        bytes: held.bytes,
                        ..Default::default()
                    });
                    views.len() - 1
                }
            };
            views[i].snapshots.push(SnapshotView {
                name: snap.name.clone(),
                storage_class: snap.storage_class.clone(),
                ready: snap.ready,
                created: snap.created.clone(),
            });
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct DatasetUse {
    pub run_id: String,
    pub cell_id: String,
    pub agent_id: Option<String>,
    pub finished_at: Option<String>,
}

/// The datasets the stored cells built or restored, by fingerprint (cells
/// that loaded their own with `data: fresh` have none).
pub fn seen(store: &pgfleet_store::Store) -> Result<Vec<DatasetView>> {
    let mut by_fp: std::collections::BTreeMap<String, DatasetView> = Default::default();
    for row in store.dataset_uses()? {
        let d = &row.provenance;
        let run_id = row.run_id;
        let Some(fp) = d["fingerprint"].as_str().filter(|f| !f.is_empty()) else {
            continue;
        };
        let v = by_fp.entry(fp.to_string()).or_insert_with(|| DatasetView {
            fingerprint: fp.to_string(),
            label: d["label"].as_str().unwrap_or("").to_string(),
            ..Default::default()
        });
        if let Some(b) = d["bytes"].as_u64().filter(|b| *b > 0) {
            v.bytes = b;
        }
        let u = DatasetUse {
            run_id: run_id.clone(),
            cell_id: row.cell_id,
            agent_id: row.agent_id,
            finished_at: row.finished_at,
        };
        match d["how"].as_str() {
            Some("built") => v.builds.push(u),
            Some("restored") => {
                v.restored += 1;
                v.last_restored = Some(u);
            }
            _ => {}
        }
        if d["discarded"].is_string() {
            v.discarded += 1;
        }
        if !v.runs.contains(&run_id) {
            v.runs.push(run_id);
        }
    }
    Ok(by_fp.into_values().collect())
}

/// The cells of `pgfleet datasets build`: for each dataset the plan's cells
/// would reuse, its first cell needing one agent (else its first cell), in
/// `build` mode (publish it if it is not; measure nothing).
pub fn builds(cells: Vec<PlannedCell>) -> Vec<PlannedCell> {
    let mut chosen: Vec<(String, PlannedCell)> = Vec::new();
    for c in cells.into_iter().filter(|c| c.dataset == Mode::Reuse) {
        let Some(key) = c.params.dataset().map(|d| d.plan_key()) else {
            continue;
        };
        match chosen.iter_mut().find(|(k, _)| *k == key) {
            None => chosen.push((key, c)),
            Some((_, first)) if first.multi_role() && !c.multi_role() => *first = c,
            Some(_) => {}
        }
    }
    chosen
        .into_iter()
        .map(|(_, mut c)| {
            c.dataset = Mode::Build;
            c.cell_id = format!("{}-dataset", c.cell_id);
            c
        })
        .collect()
}

/// The scenarios (of `scenarios`) whose cells would use `m`: same loader
/// and keys (the PostgreSQL format is the agent's to match).
fn users(m: &Manifest, scenarios: &[(PathBuf, Vec<PlannedCell>)]) -> Vec<String> {
    scenarios
        .iter()
        .filter(|(_, cells)| {
            cells.iter().any(|c| {
                c.dataset != Mode::Fresh
                    && c.params
                        .dataset()
                        .is_some_and(|d| d.loader == m.dataset.loader && d.keys == m.dataset.keys)
            })
        })
        .map(|(p, _)| p.display().to_string())
        .collect()
}

/// `pgfleet datasets list`: one line per published dataset, oldest first.
pub fn list(dir: &Path, scenario_files: &[PathBuf]) -> Result<String> {
    let store = LocalStore::new(dir);
    let found = store
        .list()
        .map_err(|e| Error::Datasets(format!("reading the store {}: {e}", dir.display())))?;
    let mut scenarios = Vec::new();
    for f in scenario_files {
        let sc = scenario::load(f)?;
        scenarios.push((f.clone(), scenario::plan(&sc)));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut out = String::new();
    if found.is_empty() {
        let _ = writeln!(out, "no datasets in {}", dir.display());
        return Ok(out);
    }
    let w = found
        .iter()
        .map(|m| m.fingerprint.len())
        .max()
        .unwrap_or(11);
    let _ = writeln!(
        out,
        "{:<w$}  {:>9}  {:>9}  {:<10}  {:>8}  built by",
        "fingerprint", "size", "age", "postgres", "load"
    );
    let mut total = 0;
    for m in &found {
        total += m.bytes;
        let _ = write!(
            out,
            "{:<w$}  {:>9}  {:>9}  {:<10}  {:>8}  {} on {}",
            m.fingerprint,
            approx_bytes(m.bytes),
            approx_seconds(now.saturating_sub(m.created_at) as f64),
            m.postgres_version,
            approx_seconds(m.build_seconds),
            m.built_by,
            m.host
        );
        if !scenario_files.is_empty() {
            let u = users(m, &scenarios);
            let _ = write!(
                out,
                "; used by: {}",
                if u.is_empty() {
                    "none of the scenarios given".to_string()
                } else {
                    u.join(", ")
                }
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "{} dataset(s), {} in {}",
        found.len(),
        approx_bytes(total),
        dir.display()
    );
    Ok(out)
}

/// `pgfleet datasets rm`: removes each dataset (refused while a cell
/// builds or restores it).
pub fn remove(dir: &Path, fingerprints: &[String]) -> Result<String> {
    let store = LocalStore::new(dir);
    let mut out = String::new();
    for fp in fingerprints {
        let bytes = store.remove(fp).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::Usage(format!(
                "{e}: `pgfleet datasets list --dataset-dir {}` shows the fingerprints there",
                dir.display()
            )),
            _ => Error::Datasets(format!("removing {fp}: {e}")),
        })?;
        let _ = writeln!(out, "removed {fp} ({})", approx_bytes(bytes));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::Held;
    use crate::agents::kubernetes::Snapshot;

    /// `pgfleet datasets build` builds each dataset once, on a cell that
    /// needs one agent where one exists (a logical-drain cell shares its
    /// publisher's dataset with pgbench's cells of that scale).
    #[test]
    fn each_dataset_is_built_once_by_a_single_role_cell_where_one_exists() {
        let plan = |text: &str| {
            let s = pgfleet_scenario::parse(Path::new("b.yaml"), text).unwrap();
            builds(pgfleet_scenario::plan(&s))
        };
        let fleet = "name: b\nfleet: [{name: a, count: 2}]\nworkloads:\n";
        let drain = "  - {kind: logical-drain, scale: 3, replicas: 2}\n";
        let cells = plan(&format!(
            "{fleet}{drain}  - {{kind: pgbench, scale: 3, replicas: 2}}\n  - {{kind: pgbench, scale: 4}}\n"
        ));
        let ids: Vec<(&str, Mode)> = cells
            .iter()
            .map(|c| (c.cell_id.as_str(), c.dataset))
            .collect();
        assert_eq!(
            ids,
            [
                ("w1-a-tpcb-like-r1-dataset", Mode::Build),
                ("w2-a-tpcb-like-dataset", Mode::Build)
            ]
        );
        let cells = plan(&format!("{fleet}{drain}"));
        assert_eq!(cells.len(), 1);
        assert!(cells[0].multi_role() && cells[0].dataset_class() == "a");
    }

    /// `GET /v1/datasets` on Kubernetes: each dataset lists the snapshots
    /// holding it; one only a snapshot holds is listed too.
    #[test]
    fn snapshots_are_listed_with_the_datasets_they_hold() {
        let held = |fp: &str| Held {
            fingerprint: fp.into(),
            plan_key: format!("[\"{fp}\"]"),
            label: "pgbench-s500".into(),
            bytes: 7 << 30,
        };
        let mut views = vec![DatasetView {
            fingerprint: "a".into(),
            restored: 3,
            ..Default::default()
        }];
        let snap = |name: &str, ds: Vec<Held>| Snapshot {
            name: name.into(),
            storage_class: "gp3".into(),
            ready: true,
            restore_bytes: 0,
            created: "2026-12-04T10:00:00Z".into(),
            datasets: ds,
        };
        with_snapshots(
            &mut views,
            &[
                snap("s1", vec![held("a")]),
                snap("s2", vec![held("a"), held("b")]),
            ],
        );
        assert_eq!(views.len(), 2);
        let names = |v: &DatasetView| {
            v.snapshots
                .iter()
                .map(|s| s.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&views[0]), ["s1", "s2"]);
        assert_eq!(views[0].restored, 3);
        assert_eq!(views[1].fingerprint, "b");
        assert_eq!(views[1].bytes, 7 << 30);
        assert_eq!(names(&views[1]), ["s2"]);
    }
}
