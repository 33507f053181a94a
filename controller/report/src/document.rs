//! report.json as types: what `build` writes, what the Markdown, HTML,
//! checks, `compare` and `history` read. Every field a renderer reads is a
//! field here; the kinds' own figures stay the kinds' types
//! (`pgfleet_proto::workload::<kind>::{PointParams, Metrics}`), read from
//! `results[].params` / `metrics` by their sections.
//!
//! `version` says which shape a file has. Version 1 is every report.json
//! written before the field existed: the same shape, so it reads as is
//! (fields added since have defaults). A file of a newer version than this
//! pgfleet knows is refused with what to do.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value as Json;

use pgfleet_proto::dataset::Provenance;
use pgfleet_proto::environment::Environment;
use pgfleet_scenario::labels::Labels;

/// The report.json shape this pgfleet writes.
pub const VERSION: u32 = 2;

/// Parameters of a point, by name, as the kind reports them (plus swept
/// keys its point does not report): open by nature, compared as a whole.
pub type Params = serde_json::Map<String, Json>;

/// A run's report document (report.json).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    #[serde(default = "version_1")]
    pub version: u32,
    pub run_id: String,
    pub scenario: String,
    pub scenario_path: String,
    /// The run's final status (`succeeded`, `failed`, `cancelled`, …).
    pub status: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub seconds: Option<f64>,
    pub estimated_seconds: Option<f64>,
    pub labels: Labels,
    /// What a Kubernetes run kept for debugging (`cleanup: keep`).
    pub kept: Option<Kept>,
    pub environment: Environments,
    /// Each class against the first (`guards.rs`).
    pub differences: Vec<Difference>,
    pub warnings: Vec<String>,
    pub cells: Vec<Cell>,
    pub results: Vec<ResultRow>,
    pub summaries: Vec<Summary>,
    pub comparisons: Vec<Comparison>,
    pub entry_comparisons: Vec<EntryComparison>,
    pub check_summary: CheckSummary,
    pub checks: Vec<Judged>,
    /// The stored scenario no longer parses: no check was judged.
    pub check_error: Option<String>,
    pub costs: Option<Costs>,
    /// Per cell, its seconds as pgbench-style kinds report them.
    pub timeseries: BTreeMap<String, Vec<Second>>,
    /// Every other kind of sample a workload sent, as sent:
    /// `{<sample kind>: {<cell_id>: [..]}}` (the kind's own types).
    pub samples: BTreeMap<String, BTreeMap<String, Vec<Json>>>,
}

fn version_1() -> u32 {
    1
}

/// Why a report.json could not be read.
#[derive(Debug)]
pub struct ReadError(pub String);

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Report {
    /// Reads a report.json's text (`what` names it in errors).
    pub fn read(what: &str, text: &str) -> Result<Report, ReadError> {
        let doc: Report = serde_json::from_str(text)
            .map_err(|e| ReadError(format!("{what}: not a pgfleet report.json ({e})")))?;
        if doc.version > VERSION {
            return Err(ReadError(format!(
                "{what}: a version {} report.json, newer than this pgfleet reads (version {VERSION}): \
                 read it with the pgfleet that wrote it, or upgrade this one",
                doc.version
            )));
        }
        Ok(doc)
    }

    /// The summaries of `kind`, in the report's order.
    pub fn summaries_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Summary> + 'a {
        self.summaries.iter().filter(move |s| s.workload == kind)
    }

    /// The class the report compares the others with (the comparisons'
    /// baseline: the fleet's first class that has results).
    pub fn baseline_class(&self) -> Option<&str> {
        self.comparisons.first().map(|c| c.baseline_class.as_str())
    }

    /// Whether every judged check passes (no check: true).
    pub fn checks_pass(&self) -> bool {
        self.check_summary.ok
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Environments {
    pub instance_classes: Classes,
}

/// A class's environment in the report: its first measured cell's (the
/// cluster's own view), else what its agents' registrations said
/// (`measured: false`: not compared, and the report says so).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassEnvironment {
    #[serde(flatten)]
    pub env: Environment,
    #[serde(default)]
    pub agents: Vec<String>,
    #[serde(default)]
    pub measured: bool,
}

/// The run's classes by name (report.json's `environment.instance_classes`).
pub type Classes = BTreeMap<String, ClassEnvironment>;

/// What a Kubernetes run kept (`cleanup: keep`) and until when.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Kept {
    pub until: String,
    pub namespace: String,
    pub objects: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub owner: String,
}

/// A class against the baseline class: what differs besides storage, or
/// the classes none of whose cells reported their environment.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Difference {
    pub class: String,
    pub baseline: String,
    pub differs: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unmeasured: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Cell {
    pub cell_id: String,
    pub workload: String,
    pub instance_class: String,
    pub agent: Option<String>,
    pub state: String,
    pub error: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub seconds: Option<f64>,
    pub estimate_seconds: Option<f64>,
    /// That estimate by phase (reports of runs planned before phases have
    /// none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_phases: Option<pgfleet_proto::workload::Phases>,
    /// The cluster's own view, as the agent sent it (a multi-role cell's
    /// is `{<role>: ..}`): `pgfleet_proto::environment::Environment`.
    pub environment: Option<Json>,
}

impl Cell {
    /// Where its data came from, when the agent said.
    pub fn dataset(&self) -> Option<Provenance> {
        dataset_of(self.environment.as_ref())
    }

    /// A multi-role cell's environments by role.
    pub fn roles(&self) -> Option<BTreeMap<String, pgfleet_proto::environment::Environment>> {
        BTreeMap::deserialize(self.environment.as_ref()?).ok()
    }

    /// Its environment as a single-role cell's.
    pub fn single(&self) -> Option<pgfleet_proto::environment::Environment> {
        pgfleet_proto::environment::Environment::deserialize(self.environment.as_ref()?).ok()
    }
}

/// Where a cell's data came from, from its environment as the agent sent
/// it (`environment.dataset`).
pub fn dataset_of(environment: Option<&Json>) -> Option<Provenance> {
    #[derive(Deserialize)]
    struct Of {
        dataset: Option<Provenance>,
    }
    Of::deserialize(environment?).ok()?.dataset
}

/// One cell's result: its point and the kind's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ResultRow {
    pub workload: Option<String>,
    pub instance_class: Option<String>,
    pub agent: Option<String>,
    pub cell_id: String,
    pub params: Params,
    /// Its point in its entry's sweep (`{"clients": 16}`).
    pub point: Params,
    /// The kind's `Metrics`, as JSON.
    pub metrics: Json,
}

impl ResultRow {
    pub fn workload(&self) -> &str {
        self.workload.as_deref().unwrap_or("")
    }

    pub fn class(&self) -> &str {
        self.instance_class.as_deref().unwrap_or("")
    }
}

/// One measured point of one workload entry: per class, its figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    /// The workload entry's index.
    pub entry: Option<usize>,
    pub workload: String,
    pub script: Option<String>,
    pub params: Params,
    pub point: Params,
    pub classes: BTreeMap<String, ClassFigures>,
    /// What sets its entry apart from the kind's other entries
    /// (`entries.rs`; empty when it is the only one).
    pub label: String,
}

impl Summary {
    /// A class's figures, when it has this point.
    pub fn class(&self, class: &str) -> Option<&ClassFigures> {
        self.classes.get(class)
    }

    /// Its parameters as JSON text (what seeds and keys are made of).
    pub fn params_text(&self) -> String {
        params_text(&self.params)
    }

    /// A class's figure of `metric`.
    pub fn figure(&self, class: &str, metric: &str) -> Option<&MetricFigure> {
        self.classes.get(class)?.metrics.get(metric)
    }
}

/// A class's figures at a point.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ClassFigures {
    /// How many cells (clusters) the figures are over.
    pub cells: usize,
    /// Each cluster's latency histogram (`[[value_us, count], ..]`), when
    /// every one sent it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_histograms_us: Option<Vec<Vec<[u64; 2]>>>,
    /// The kind's compared metrics.
    #[serde(flatten)]
    pub metrics: BTreeMap<String, MetricFigure>,
}

/// A class's figure of one metric: `value` is the class's figure (for a
/// latency quantile with every cluster's histogram the merged
/// distribution's quantile, `merged`; else the median over clusters),
/// `values` each cluster's.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MetricFigure {
    #[serde(deserialize_with = "nan_if_null")]
    pub value: f64,
    pub merged: bool,
    #[serde(deserialize_with = "nan_if_null")]
    pub median: f64,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub values: Vec<f64>,
}

/// A class's figure against the baseline class's, at one point.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Comparison {
    pub entry: Option<usize>,
    pub workload: String,
    pub script: Option<String>,
    pub metric: String,
    pub baseline_class: String,
    pub class: String,
    #[serde(deserialize_with = "nan_if_null")]
    pub ratio: f64,
}

/// A later workload entry's point against the first entry's (`entries.rs`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EntryComparison {
    pub workload: String,
    pub class: String,
    pub metric: String,
    pub entry: Option<usize>,
    pub label: String,
    pub baseline_entry: Option<usize>,
    pub baseline_label: String,
    #[serde(deserialize_with = "nan_if_null")]
    pub ratio: f64,
    pub interval: Bounds,
    pub confidence: f64,
}

/// An interval's ends; null where it is not a number.
pub type Bounds = [Option<f64>; 2];

/// Totals over the judged checks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckSummary {
    pub checks: usize,
    pub passed: usize,
    pub failed: usize,
    pub inconclusive: usize,
    pub ok: bool,
}

impl Default for CheckSummary {
    fn default() -> Self {
        CheckSummary {
            checks: 0,
            passed: 0,
            failed: 0,
            inconclusive: 0,
            ok: true,
        }
    }
}

/// A check (or a `compare` gate) judged on one point (`checks.rs`,
/// `trend.rs`, `compare.rs`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Judged {
    pub name: String,
    /// A `compare` gate's text (`tps < -5%`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    pub metric: String,
    pub class: String,
    /// The class it is divided by (`earlier runs` for a history check).
    pub baseline: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_entry: Option<usize>,
    pub confidence: f64,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub entry: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The point's parameters.
    pub point: Option<Params>,
    /// Its point in its entry's sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Params>,
    pub observed: Option<f64>,
    pub interval: Option<Bounds>,
    /// Clusters on each side (`{<class>: n}`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub clusters: BTreeMap<String, usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merged: Option<bool>,
    pub verdict: Verdict,
    pub passes: bool,
    pub note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<HistoryJudgement>,
}

/// How an interval stands against a bound, as report.json writes it.
pub use pgfleet_scenario::stats::Verdict;

/// A history check's earlier runs and the segment it judged against.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HistoryJudgement {
    pub window: usize,
    pub max_drop: f64,
    pub same_labels: Vec<String>,
    pub earlier_runs: usize,
    pub not_comparable: usize,
    /// The earlier runs' figures, oldest first (absent below the minimum).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_start: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_runs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_median: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change_points: Option<usize>,
}

/// What the run cost, per class (`cost.rs`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Costs {
    pub currency: String,
    pub classes: BTreeMap<String, ClassCost>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ClassCost {
    pub per_hour: f64,
    pub breakdown: pgfleet_scenario::Price,
    pub cells: usize,
    pub cell_hours: f64,
    pub run: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_million_transactions: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_vacuum: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_drain: Option<f64>,
}

/// One second of a pgbench-style cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Second {
    pub second: Option<u64>,
    pub tps: Option<f64>,
    pub latency_ms_mean: Option<f64>,
    pub latency_ms_p50: Option<f64>,
    pub latency_ms_p99: Option<f64>,
}

/// Parameters as JSON text.
pub fn params_text(p: &Params) -> String {
    serde_json::to_string(p).unwrap_or_default()
}

/// An f64 that JSON wrote as null (not a number when written).
fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A report.json written before the version field reads as version 1,
    /// with what it holds; one of a newer version is refused, saying what
    /// to do; what this pgfleet writes reads back the same.
    #[test]
    fn versions_old_reports_read_newer_ones_are_refused() {
        let v1 = json!({
            "run_id": "r", "status": "succeeded", "started_at": "2026-12-01T10:00:00Z",
            "summaries": [{"entry": 0, "workload": "pgbench", "script": "random-update",
                "params": {"script": "random-update", "clients": 8}, "point": {},
                "classes": {"nvme": {"cells": 2, "latency_histograms_us": [[[100, 3]], [[120, 1]]],
                    "tps": {"value": 1000.0, "merged": false, "median": 1000.0, "min": 990.0, "max": 1010.0,
                            "values": [990.0, 1010.0]}}}}],
            "comparisons": [{"entry": 0, "workload": "pgbench", "script": "random-update", "metric": "tps",
                "baseline_class": "nvme", "class": "gp3", "ratio": null}],
            "checks": [{"name": "c", "metric": "tps", "class": "gp3", "baseline": "nvme", "confidence": 0.95,
                "max": 0.5, "observed": 0.2, "interval": [0.18, null], "clusters": {"gp3": 2, "nvme": 2},
                "verdict": "passed", "passes": true, "note": null}],
            "check_summary": {"checks": 1, "passed": 1, "failed": 0, "inconclusive": 0, "ok": true},
            "timeseries": {"w0-nvme-r0": [{"second": 1, "tps": 990, "latency_ms_p99": 4.5}]},
        });
        let doc = Report::read("old.json", &v1.to_string()).unwrap();
        assert_eq!(doc.version, 1);
        let f = doc.summaries[0].figure("nvme", "tps").unwrap();
        assert_eq!((f.value, f.values.len()), (1000.0, 2));
        assert_eq!(
            doc.summaries[0].classes["nvme"]
                .latency_histograms_us
                .as_ref()
                .map(Vec::len),
            Some(2)
        );
        assert!(doc.comparisons[0].ratio.is_nan(), "null is not a number");
        assert_eq!(doc.checks[0].verdict, Verdict::Passed);
        assert_eq!(doc.checks[0].interval, Some([Some(0.18), None]));
        assert!(doc.checks_pass());
        assert_eq!(doc.timeseries["w0-nvme-r0"][0].tps, Some(990.0));

        let written = serde_json::to_string(&Report {
            version: VERSION,
            ..doc.clone()
        })
        .unwrap();
        let again = Report::read("new.json", &written).unwrap();
        assert_eq!(again.version, VERSION);
        assert_eq!(serde_json::to_string(&again).unwrap(), written);

        let mut future = v1.clone();
        future["version"] = json!(VERSION + 1);
        let e = Report::read("ci/baseline.json", &future.to_string()).unwrap_err();
        assert!(
            e.0.starts_with(&format!(
                "ci/baseline.json: a version {} report.json",
                VERSION + 1
            )) && e.0.contains("upgrade"),
            "{e}"
        );
        let e = Report::read("x.json", "{\"summaries\": 3}").unwrap_err();
        assert!(e.0.starts_with("x.json: not a pgfleet report.json"), "{e}");
    }
}
