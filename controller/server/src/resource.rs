//! The `PgfleetRun` custom resource (`pgfleetruns.pgfleet.io`, v1alpha1)
//! and the reconcile loop `serve --agents kubernetes` runs over it.
//!
//! A resource's `spec` is a scenario (the keys of a scenario file). The
//! loop (kube-runtime's `Controller`, one reconcile per change of a
//! resource and every few seconds while its run lives):
//!
//! 1. deleted (a deletion timestamp) → cancel its run, wait until the run
//!    has ended (its pods and volumes are deleted as every run's are), then
//!    remove the finalizer;
//! 2. no finalizer → add it (so a deletion waits for step 1);
//! 3. no run yet → submit the spec as any API submission is submitted,
//!    with `pgfleetrun/<uid>` as the idempotency key: a restarted `serve`
//!    finds the run again instead of starting another. A scenario that
//!    cannot run gets `Accepted=False` with the located message (the
//!    field path, `spec.workloads[0].scale`, in place of file:line);
//! 4. the status follows the run: phase, cells done/total, verdict, the
//!    checks' summary, the report's URL and the conditions `Accepted`,
//!    `Running`, `Succeeded` and `Failed` (`kubectl wait
//!    --for=condition=Succeeded`). It is patched only when it changed.
//!
//! The CRD's schema is generated from the scenario's own serde types (the
//! keys they accept, see `spec_schema`), so the API server refuses an
//! unknown key (`kubectl apply` validates strictly) exactly where
//! `pgfleet validate` would; the values are checked by the same
//! validation as every scenario, in step 3.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::queue::{Rejected, RunQueue};
use pgfleet_scenario::labels::Labels;
use pgfleet_store::RunStatus;

pub const GROUP: &str = "pgfleet.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "PgfleetRun";
pub const PLURAL: &str = "pgfleetruns";
/// Held on every resource with a run until the run has ended.
pub const FINALIZER: &str = "pgfleet.io/run";

/// A `PgfleetRun`: a scenario to run, and how its run went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PgfleetRun {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The scenario, as in a scenario file.
    #[serde(default)]
    pub spec: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
}

impl kube::Resource for PgfleetRun {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The idempotency key of a resource's run.
pub fn run_key(uid: &str) -> String {
    format!("pgfleetrun/{uid}")
}

// ---------------------------------------------------------------- the CRD

/// The CustomResourceDefinition (deploy/base/crd.yaml is this, as YAML;
/// `pgfleet crd` prints it).
pub fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{PLURAL}.{GROUP}"),
            "labels": {"app.kubernetes.io/name": "pgfleet"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": format!("{KIND}List"),
                "plural": PLURAL,
                "singular": "pgfleetrun",
                "shortNames": ["pfr"],
                "categories": ["pgfleet"],
            },
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Cells", "type": "string", "jsonPath": ".status.cells"},
                    {"name": "Verdict", "type": "string", "jsonPath": ".status.verdict"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A pgfleet run: `spec` is a scenario (the keys of a scenario file, see scenarios/); `serve --agents kubernetes` runs it and keeps `status` up to date.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema(),
                        "status": status_schema(),
                    },
                }},
            }],
        },
    })
}

/// The CRD as YAML, with a header saying where it comes from.
pub fn crd_yaml() -> String {
    format!(
        "# Generated by `pgfleet crd` from the scenario's types: do not edit\n# (controller/tests/kubernetes.rs checks it is current).\n{}",
        serde_saphyr::to_string(&crd()).unwrap_or_default()
    )
}

/// A key whose value the scenario's validation checks (any type here).
fn any(description: &str) -> Value {
    json!({"x-kubernetes-preserve-unknown-fields": true, "description": description})
}

fn object_of(keys: &[String], what: &str) -> Value {
    let props: Map<String, Value> = keys
        .iter()
        .map(|k| (k.clone(), any(&format!("{what}'s `{k}`"))))
        .collect();
    json!({"type": "object", "properties": props})
}

/// The scenario's keys, read from its serde types: each accepts exactly
/// the keys it lists when it meets one it does not know (the lists
/// `deny_unknown_fields` keeps), so the schema cannot drift from the
/// parser. Workload entries list every kind's keys; `kind` is an enum.
pub fn spec_schema() -> Value {
    let top = pgfleet_scenario::reference::keys("");
    let fleet = pgfleet_scenario::reference::keys("fleet: [{");
    let checks = pgfleet_scenario::reference::keys("checks: [{");
    let kinds = pgfleet_proto::workload::names();
    let mut workload_keys = BTreeSet::new();
    for k in &kinds {
        workload_keys.extend(pgfleet_scenario::reference::keys(&format!(
            "workloads: [{{kind: {k}, "
        )));
    }
    let workload_keys: Vec<String> = workload_keys.into_iter().collect();
    let mut props = Map::new();
    for k in &top {
        let v = match k.as_str() {
            "name" | "description" | "currency" => {
                json!({"type": "string", "description": format!("the scenario's `{k}`")})
            }
            "fleet" => json!({"type": "array", "description": "instance classes and their agents",
                              "items": object_of(&fleet, "a fleet entry")}),
            "checks" => json!({"type": "array", "description": "verdicts on the results",
                               "items": object_of(&checks, "a check")}),
            "workloads" => {
                let mut item = object_of(&workload_keys, "a workload entry");
                item["properties"]["kind"] = json!({"type": "string", "enum": kinds});
                item["required"] = json!(["kind"]);
                json!({"type": "array", "description": "what runs; each entry's `kind` picks the keys it takes",
                       "items": item})
            }
            _ => any(&format!("the scenario's `{k}`")),
        };
        props.insert(k.clone(), v);
    }
    json!({
        "type": "object",
        "description": "A scenario, as in a scenario file; `name` defaults to the resource's name.",
        "required": ["fleet", "workloads"],
        "properties": props,
    })
}

fn status_schema() -> Value {
    let condition = json!({
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    });
    let count = json!({"type": "integer"});
    json!({
        "type": "object",
        "description": "How the resource's run goes (set by pgfleet serve).",
        "properties": {
            "phase": {"type": "string", "description": "Pending, Rejected, Queued, Running, Succeeded, Failed, Cancelled or Interrupted"},
            "runId": {"type": "string"},
            "cells": {"type": "string", "description": "cells done / total"},
            "cellsDone": count,
            "cellsTotal": count,
            "cellsFailed": count,
            "verdict": {"type": "string", "description": "passed, failed (a check failed) or error (the run did not succeed)"},
            "checks": {"type": "object", "properties": {
                "checks": count, "passed": count, "failed": count, "inconclusive": count,
            }},
            "reportUrl": {"type": "string"},
            "message": {"type": "string"},
            "observedGeneration": {"type": "integer", "format": "int64"},
            "conditions": {"type": "array", "items": condition,
                            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        },
    })
}

// ----------------------------------------------------------- the status

/// Where a resource's run stands, for its status.
#[derive(Debug, Clone, PartialEq)]
enum Standing {
    /// Its spec cannot run: the located message.
    Rejected(String),
    /// The queue is full: submitted again later.
    Waiting(String),
    Run(RunView),
}

#[derive(Debug, Clone, PartialEq)]
struct RunView {
    id: String,
    status: RunStatus,
    done: usize,
    total: usize,
    failed: usize,
    /// The checks' summary (terminal runs).
    checks: Option<Value>,
    error: Option<String>,
}

impl RunView {
    fn verdict(&self) -> Option<&'static str> {
        if !self.status.is_terminal() {
            return None;
        }
        if self.status != RunStatus::Succeeded {
            return Some("error");
        }
        let failed = self
            .checks
            .as_ref()
            .and_then(|c| c["failed"].as_u64())
            .unwrap_or(0);
        Some(if failed > 0 { "failed" } else { "passed" })
    }
}

fn phase(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Queued => "Queued",
        RunStatus::Running => "Running",
        RunStatus::Succeeded => "Succeeded",
        RunStatus::Failed => "Failed",
        RunStatus::Cancelled => "Cancelled",
        RunStatus::Interrupted => "Interrupted",
    }
}

/// (type, status, reason, message) of each condition.
fn conditions(s: &Standing) -> Vec<(&'static str, &'static str, String, String)> {
    match s {
        Standing::Rejected(m) => vec![
            ("Accepted", "False", "InvalidScenario".into(), m.clone()),
            ("Running", "False", "Rejected".into(), String::new()),
            ("Succeeded", "False", "Rejected".into(), String::new()),
            ("Failed", "True", "Rejected".into(), m.clone()),
        ],
        Standing::Waiting(m) => vec![("Accepted", "Unknown", "QueueFull".into(), m.clone())],
        Standing::Run(r) => {
            let mut c = vec![(
                "Accepted",
                "True",
                "Submitted".into(),
                format!("run {}", r.id),
            )];
            let running = match r.status {
                RunStatus::Queued => ("False", "Queued"),
                RunStatus::Running => ("True", "Running"),
                _ => ("False", "Finished"),
            };
            c.push((
                "Running",
                running.0,
                running.1.into(),
                format!("{}/{} cells done", r.done, r.total),
            ));
            if let Some(v) = r.verdict() {
                let (reason, message) = match (v, r.status) {
                    ("passed", _) => ("Passed", "the run succeeded and its checks pass".into()),
                    ("failed", _) => (
                        "ChecksFailed",
                        format!(
                            "{} check(s) failed: see the report",
                            r.checks
                                .as_ref()
                                .map(|c| c["failed"].clone())
                                .unwrap_or(json!(0))
                        ),
                    ),
                    (_, RunStatus::Cancelled) => ("Cancelled", "the run was cancelled".into()),
                    (_, RunStatus::Interrupted) => (
                        "Interrupted",
                        "the controller running it stopped without finishing it".into(),
                    ),
                    _ => (
                        "RunFailed",
                        r.error
                            .clone()
                            .unwrap_or_else(|| format!("{} of {} cells failed", r.failed, r.total)),
                    ),
                };
                let ok = v == "passed";
                c.push((
                    "Succeeded",
                    if ok { "True" } else { "False" },
                    reason.into(),
                    message.clone(),
                ));
                c.push((
                    "Failed",
                    if ok { "False" } else { "True" },
                    reason.into(),
                    if ok { String::new() } else { message },
                ));
            }
            c
        }
    }
}

/// The status for `s`, keeping each condition's transition time from
/// `prev` while its status is unchanged.
fn status_value(
    s: &Standing,
    generation: Option<i64>,
    prev: Option<&Value>,
    api_url: &str,
) -> Value {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let prev_conditions = prev
        .and_then(|p| p["conditions"].as_array())
        .cloned()
        .unwrap_or_default();
    let conds: Vec<Value> = conditions(s)
        .into_iter()
        .map(|(t, st, reason, message)| {
            let since = prev_conditions
                .iter()
                .find(|c| c["type"] == t && c["status"] == st)
                .and_then(|c| c["lastTransitionTime"].as_str())
                .map(str::to_string)
                .unwrap_or_else(|| now.clone());
            let mut c = json!({"type": t, "status": st, "reason": reason,
                               "lastTransitionTime": since});
            if !message.is_empty() {
                c["message"] = json!(message);
            }
            if let Some(g) = generation {
                c["observedGeneration"] = json!(g);
            }
            c
        })
        .collect();
    let mut v = json!({"conditions": conds});
    if let Some(g) = generation {
        v["observedGeneration"] = json!(g);
    }
    match s {
        Standing::Rejected(m) => {
            v["phase"] = json!("Rejected");
            v["message"] = json!(m);
        }
        Standing::Waiting(m) => {
            v["phase"] = json!("Pending");
            v["message"] = json!(m);
        }
        Standing::Run(r) => {
            v["phase"] = json!(phase(r.status));
            v["runId"] = json!(r.id);
            v["cells"] = json!(format!("{}/{}", r.done, r.total));
            v["cellsDone"] = json!(r.done);
            v["cellsTotal"] = json!(r.total);
            v["cellsFailed"] = json!(r.failed);
            v["reportUrl"] = json!(format!(
                "{}/v1/runs/{}/report.html",
                api_url.trim_end_matches('/'),
                r.id
            ));
            if let Some(verdict) = r.verdict() {
                v["verdict"] = json!(verdict);
            }
            if let Some(c) = &r.checks {
                v["checks"] = json!({"checks": c["checks"], "passed": c["passed"],
                                     "failed": c["failed"], "inconclusive": c["inconclusive"]});
            }
            if let Some(e) = &r.error {
                v["message"] = json!(e);
            }
        }
    }
    v
}

/// Whether two statuses say the same (transition times aside).
fn same_status(a: &Value, b: Option<&Value>) -> bool {
    fn strip(v: &Value) -> Value {
        let mut v = v.clone();
        if let Some(cs) = v["conditions"].as_array_mut() {
            for c in cs {
                if let Some(o) = c.as_object_mut() {
                    o.remove("lastTransitionTime");
                }
            }
        }
        v
    }
    b.is_some_and(|b| strip(a) == strip(b))
}

// ------------------------------------------------------- the reconciler

/// What the reconciler needs.
pub struct Ctx {
    pub client: kube::Client,
    pub namespace: String,
    pub served: Arc<RunQueue>,
    /// serve's API as clients reach it (the report's URL).
    pub api_url: String,
    /// How often a live run's status is refreshed.
    pub refresh: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Pgfleet(String),
}

impl From<pgfleet_store::Error> for ReconcileError {
    fn from(e: pgfleet_store::Error) -> Self {
        ReconcileError::Pgfleet(e.to_string())
    }
}

/// Runs the reconcile loop over the namespace's PgfleetRuns until
/// `shutdown` (running reconciles finish first).
pub async fn run(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let api: Api<PgfleetRun> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    tracing::info!(namespace = %ctx.namespace, "watching PgfleetRuns");
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!(error = %e, "PgfleetRun reconcile");
            }
        })
        .await;
}

fn error_policy(obj: Arc<PgfleetRun>, e: &ReconcileError, _: Arc<Ctx>) -> Action {
    tracing::warn!(resource = obj.metadata.name.as_deref().unwrap_or(""), error = %e, "PgfleetRun: retrying in 5 s");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(obj: Arc<PgfleetRun>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let api: Api<PgfleetRun> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let name = obj.metadata.name.clone().unwrap_or_default();
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    let store = &ctx.served.service.store;
    let existing = store.run_by_idempotency_key(&run_key(&uid))?;
    let finalizers = obj.metadata.finalizers.clone().unwrap_or_default();
    let held = finalizers.iter().any(|f| f == FINALIZER);

    if obj.metadata.deletion_timestamp.is_some() {
        if !held {
            return Ok(Action::await_change());
        }
        if let Some(id) = &existing
            && ctx.served.cancel(id)
        {
            // Cancelling: the finalizer stays until the run has ended and
            // its agents' objects are deleted.
            tracing::info!(resource = %name, run = %id, "PgfleetRun deleted: cancelling its run");
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": rest,
                "resourceVersion": obj.metadata.resource_version,
            }})),
        )
        .await?;
        return Ok(Action::await_change());
    }

    if !held {
        let mut all = finalizers.clone();
        all.push(FINALIZER.into());
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": all,
                "resourceVersion": obj.metadata.resource_version,
            }})),
        )
        .await?;
    }

    let standing = match existing {
        Some(id) => Standing::Run(view(&ctx.served, &id)?),
        None => submit(&ctx.served, &obj, &uid)?,
    };
    let mut status = status_value(
        &standing,
        obj.metadata.generation,
        obj.status.as_ref(),
        &ctx.api_url,
    );
    // A run is what its spec was when accepted.
    if matches!(standing, Standing::Run(_)) && obj.metadata.generation.is_some_and(|g| g > 1) {
        status["message"] = json!(
            "the spec changed after the run was accepted; the run is unchanged: create a new PgfleetRun for a new run"
        );
    }
    if !same_status(&status, obj.status.as_ref()) {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    }
    Ok(match standing {
        Standing::Rejected(_) => Action::await_change(),
        Standing::Waiting(_) => Action::requeue(Duration::from_secs(10)),
        Standing::Run(r) if r.status.is_terminal() => Action::requeue(Duration::from_secs(3600)),
        Standing::Run(_) => Action::requeue(ctx.refresh),
    })
}

/// Submits a resource's spec as a run.
fn submit(served: &RunQueue, obj: &PgfleetRun, uid: &str) -> Result<Standing, ReconcileError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let mut spec = obj.spec.clone();
    spec.entry("name").or_insert_with(|| json!(name));
    // JSON is YAML: the scenario parser reads the spec as written.
    let yaml = serde_json::to_string_pretty(&Value::Object(spec)).unwrap_or_default();
    let mut labels = Labels::default();
    labels.0.insert("pgfleetrun".into(), name.clone());
    if let Some(ns) = &obj.metadata.namespace {
        labels.0.insert("namespace".into(), ns.clone());
    }
    let file = format!("pgfleetrun/{name}");
    match served.submit(&file, &yaml, Some(&run_key(uid)), labels) {
        Ok((id, _)) => {
            tracing::info!(resource = %name, run = %id, "PgfleetRun accepted");
            Ok(Standing::Run(view(served, &id)?))
        }
        Err(Rejected::Invalid(e) | Rejected::Forbidden(e)) => {
            let at = if e.field.is_empty() {
                "spec".to_string()
            } else {
                format!("spec.{}", e.field)
            };
            Ok(Standing::Rejected(format!("{at}: {}", e.message)))
        }
        Err(Rejected::Busy(n)) => Ok(Standing::Waiting(format!(
            "{n} runs wait in serve's queue (--max-queued-runs): submitted again when one starts"
        ))),
        // The resource's spec changed after its run was made: the run
        // stands for it (a run's scenario is fixed once it is queued).
        Err(Rejected::Conflict(_)) => {
            match served.service.store.run_by_idempotency_key(&run_key(uid))? {
                Some(id) => Ok(Standing::Run(view(served, &id)?)),
                None => Err(ReconcileError::Pgfleet(format!(
                    "the run of PgfleetRun {name} is not in the store"
                ))),
            }
        }
        Err(Rejected::Store(e)) => Err(e.into()),
    }
}

/// A run as its resource's status shows it.
fn view(served: &RunQueue, id: &str) -> Result<RunView, ReconcileError> {
    let store = &served.service.store;
    let run = store
        .run(id)?
        .ok_or_else(|| ReconcileError::Pgfleet(format!("run {id} is not in the store")))?;
    let status = RunStatus::parse(&run.status).unwrap_or(RunStatus::Interrupted);
    let cells = store.cells(id)?;
    let done = cells
        .iter()
        .filter(|c| matches!(c.state.as_str(), "succeeded" | "failed" | "cancelled"))
        .count();
    let failed = cells.iter().filter(|c| c.state == "failed").count();
    let checks = if status.is_terminal() {
        let dir = served.report_dir(id)?;
        std::fs::read_to_string(dir.join("report.json"))
            .ok()
            .and_then(|t| pgfleet_report::Report::read("report.json", &t).ok())
            .and_then(|doc| serde_json::to_value(doc.check_summary).ok())
    } else {
        None
    };
    let error = cells
        .iter()
        .find_map(|c| c.error.clone())
        .filter(|_| status == RunStatus::Failed);
    Ok(RunView {
        id: id.to_string(),
        status,
        done,
        total: cells.len(),
        failed,
        checks,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_lists_the_scenario_keys_and_every_kind() {
        let s = spec_schema();
        let props = s["properties"].as_object().unwrap();
        for k in ["name", "fleet", "workloads", "checks", "oversubscribe"] {
            assert!(props.contains_key(k), "{k}: {s}");
        }
        let fleet = s["properties"]["fleet"]["items"]["properties"]
            .as_object()
            .unwrap();
        for k in [
            "name",
            "count",
            "storage",
            "instance",
            "postgres",
            "kubernetes",
        ] {
            assert!(fleet.contains_key(k), "fleet {k}: {s}");
        }
        let w = &s["properties"]["workloads"]["items"];
        for k in [
            "kind", "replicas", "data", "on", "scale", "clients", "offsets",
        ] {
            assert!(w["properties"].get(k).is_some(), "workload {k}: {w}");
        }
        assert!(
            w["properties"]["kind"]["enum"]
                .as_array()
                .unwrap()
                .contains(&json!("pgbench"))
        );
        let checks = &s["properties"]["checks"]["items"]["properties"];
        for k in ["name", "metric", "ratio", "history", "min", "max", "at"] {
            assert!(checks.get(k).is_some(), "check {k}: {checks}");
        }
    }

    fn run(status: RunStatus, failed_checks: u64) -> Standing {
        Standing::Run(RunView {
            id: "r1".into(),
            status,
            done: 2,
            total: 2,
            failed: 0,
            checks: Some(json!({"checks": 1, "passed": 1 - failed_checks,
                                "failed": failed_checks, "inconclusive": 0})),
            error: None,
        })
    }

    fn condition(v: &Value, t: &str) -> (String, String) {
        let c = v["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .unwrap_or_else(|| panic!("no {t}: {v}"));
        (
            c["status"].as_str().unwrap().into(),
            c["reason"].as_str().unwrap().into(),
        )
    }

    #[test]
    fn conditions_follow_the_run_and_a_failed_check_is_not_success() {
        let v = status_value(&run(RunStatus::Succeeded, 0), Some(3), None, "http://x");
        assert_eq!(v["phase"], "Succeeded");
        assert_eq!(v["verdict"], "passed");
        assert_eq!(v["cells"], "2/2");
        assert_eq!(v["observedGeneration"], 3);
        assert_eq!(v["reportUrl"], "http://x/v1/runs/r1/report.html");
        assert_eq!(condition(&v, "Succeeded"), ("True".into(), "Passed".into()));
        assert_eq!(condition(&v, "Failed").0, "False");

        let v = status_value(&run(RunStatus::Succeeded, 1), None, None, "http://x");
        assert_eq!(v["verdict"], "failed");
        assert_eq!(
            condition(&v, "Succeeded"),
            ("False".into(), "ChecksFailed".into())
        );
        assert_eq!(condition(&v, "Failed").0, "True");

        let v = status_value(&run(RunStatus::Running, 0), None, None, "http://x");
        assert_eq!(condition(&v, "Running").0, "True");
        assert!(v["verdict"].is_null(), "{v}");
        assert!(v["conditions"].as_array().unwrap().len() == 2, "{v}");

        let v = status_value(
            &Standing::Rejected("spec.workloads[0].scale: must be at least 1".into()),
            Some(1),
            None,
            "http://x",
        );
        assert_eq!(v["phase"], "Rejected");
        assert_eq!(
            condition(&v, "Accepted"),
            ("False".into(), "InvalidScenario".into())
        );
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let old = json!({"conditions": [
            {"type": "Accepted", "status": "True", "reason": "Submitted", "lastTransitionTime": "2020-01-01T00:00:00Z"},
            {"type": "Running", "status": "False", "reason": "Queued", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        ]});
        let v = status_value(&run(RunStatus::Running, 0), None, Some(&old), "u");
        let at = |t: &str| {
            v["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == t)
                .unwrap()["lastTransitionTime"]
                .clone()
        };
        assert_eq!(at("Accepted"), "2020-01-01T00:00:00Z");
        assert_ne!(at("Running"), "2020-01-01T00:00:00Z");
        // The same standing again is no change.
        let again = status_value(&run(RunStatus::Running, 0), None, Some(&v), "u");
        assert!(same_status(&again, Some(&v)));
        assert!(!same_status(&again, Some(&old)));
    }
}
