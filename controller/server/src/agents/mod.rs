//! Where agents come from. A source starts agents for the fleet and later
//! stops them and cleans up after them; the agents then dial the controller
//! and register like any other. The scheduler only learns which agent ids to
//! expect, so a Kubernetes source (pods pinned to node pools, volumes from
//! the storage class under test) slots in beside `local` without touching it.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub mod kubernetes;
pub mod local;

/// One agent a source launched.
#[derive(Debug, Clone)]
pub struct Launched {
    pub agent_id: String,
    pub instance_class: String,
}

/// A dataset an agent's store holds (`Dataset::plan_key`: what a plan's
/// cells are matched by; the fingerprint adds the PostgreSQL build).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Held {
    pub fingerprint: String,
    pub plan_key: String,
    pub label: String,
    pub bytes: u64,
}

/// How a run ended, for its source: whether it succeeded, and the datasets
/// each agent's store gained in it (built and published there, or
/// downloaded into it), which a source may keep (CSI snapshots).
#[derive(Debug, Clone, Default)]
pub struct RunEnd {
    pub succeeded: bool,
    pub gained: BTreeMap<String, Vec<Held>>,
}

impl RunEnd {
    /// From the run's cells: each cell's dataset provenance.
    pub fn of(succeeded: bool, cells: &[pgfleet_store::CellRow]) -> RunEnd {
        let mut gained: BTreeMap<String, Vec<Held>> = BTreeMap::new();
        for c in cells {
            let (Some(agent), Some(d)) =
                (&c.agent_id, c.environment.as_ref().map(|e| &e["dataset"]))
            else {
                continue;
            };
            // A multi-role cell's dataset names its role's agent.
            let agent = d["agent"].as_str().unwrap_or(agent).to_string();
            let built = d["how"] == "built" && d["not_published"].is_null();
            let downloaded = d["how"] == "restored" && d["download_seconds"].as_f64() > Some(0.0);
            let plan_key = d["plan_key"].as_str().unwrap_or_default();
            if !(built || downloaded) || plan_key.is_empty() {
                continue;
            }
            let held = Held {
                fingerprint: d["fingerprint"].as_str().unwrap_or_default().to_string(),
                plan_key: plan_key.to_string(),
                label: d["label"].as_str().unwrap_or_default().to_string(),
                bytes: d["bytes"].as_u64().unwrap_or(0),
            };
            let list = gained.entry(agent).or_default();
            if !list.iter().any(|h| h.fingerprint == held.fingerprint) {
                list.push(held);
            }
        }
        RunEnd { succeeded, gained }
    }
}

pub trait AgentSource: Send {
    /// The agents launched, for the scheduler to expect.
    fn launched(&self) -> Vec<Launched>;
    /// Waits for agents to exit after the controller told them to shut down
    /// (bounded), stops the rest, and removes everything they left.
    fn shutdown(&mut self) -> BoxFuture<'_, ()>;
    /// `shutdown` at the run's end, by the scenario's `cleanup:` where the
    /// source keeps anything: what it kept, for the report (none here).
    fn finish(&mut self, end: RunEnd) -> BoxFuture<'_, Option<serde_json::Value>> {
        let _ = end;
        let f = self.shutdown();
        Box::pin(async move {
            f.await;
            None
        })
    }
}
