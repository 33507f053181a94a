//! Workloads: what an agent runs inside a provisioned cluster.
//!
//! Each kind's definition (parameters, metrics, validation, estimates) lives
//! in `pgfleet_proto::workload`; this module holds the code that runs it, one
//! file per kind, and `run`, the table that dispatches a cell's typed
//! parameters to it. How to add a kind: see the DEVELOPER NOTE in
//! `proto/src/workload/mod.rs` (here: a file and one line in `run`).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellProgress, CellSample, Endpoint, agent_message::Msg};
use pgfleet_proto::workload::{self as kinds, Params};

pub mod logical_drain;
pub mod pgbench;
pub mod pgbench_init;
pub mod toast_slice;
pub mod vacuum_bloat;

/// Runs a cell's workload: the table of kinds, one line each.
pub fn run<'a>(ctx: &'a mut CellContext<'_>, params: &'a Params) -> BoxFuture<'a, Result<Output>> {
    match params {
        Params::ToastSlice(p) => toast_slice::run(ctx, p),
        Params::PgbenchInit(p) => pgbench_init::run(ctx, p),
        Params::Pgbench(p) => pgbench::run(ctx, p),
        Params::VacuumBloat(p) => vacuum_bloat::run(ctx, p),
        Params::LogicalDrain(p) => logical_drain::run(ctx, p),
    }
}

/// One measured point on the wire: the kind's typed point as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub params_json: String,
    pub metrics_json: String,
}

impl Point {
    pub fn of<P: Serialize, M: Serialize>(p: &kinds::Point<P, M>) -> Point {
        Point {
            params_json: to_json(&p.params),
            metrics_json: to_json(&p.metrics),
        }
    }
    /// The point's parameters as JSON (for tests and tools).
    pub fn params(&self) -> serde_json::Value {
        serde_json::from_str(&self.params_json).unwrap_or_default()
    }
    pub fn metrics(&self) -> serde_json::Value {
        serde_json::from_str(&self.metrics_json).unwrap_or_default()
    }
}

pub fn to_json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[derive(Debug, Default)]
pub struct Output {
    pub points: Vec<Point>,
}

impl Output {
    pub fn of<P: Serialize, M: Serialize>(points: &[kinds::Point<P, M>]) -> Output {
        Output {
            points: points.iter().map(Point::of).collect(),
        }
    }
}

/// What a workload gets: the cluster, a way to report, a cancel signal,
/// and in a multi-role cell its role and its peers.
pub struct CellContext<'c> {
    pub cell_id: String,
    pub cluster: &'c Cluster,
    pub events: mpsc::Sender<AgentMessage>,
    pub cancel: CancellationToken,
    /// "" in a single-role cell.
    pub role: String,
    /// Fired when the cell's lead role has reported: a role that serves its
    /// cluster to peers ends then.
    pub release: CancellationToken,
    /// The other roles' endpoints, as the controller relays them.
    pub peers: watch::Receiver<BTreeMap<String, Endpoint>>,
}

impl<'c> CellContext<'c> {
    /// A single-role cell's context (tests, tools).
    pub fn new(
        cell_id: &str,
        cluster: &'c Cluster,
        events: mpsc::Sender<AgentMessage>,
        cancel: CancellationToken,
    ) -> Self {
        CellContext {
            cell_id: cell_id.to_string(),
            cluster,
            events,
            cancel,
            role: String::new(),
            release: CancellationToken::new(),
            peers: watch::channel(BTreeMap::new()).1,
        }
    }

    /// Waits until `role`'s cluster is up and returns where it is; fails
    /// after `timeout`, or when the cell is cancelled.
    pub async fn peer(&self, role: &str, timeout: std::time::Duration) -> Result<Endpoint> {
        let mut rx = self.peers.clone();
        let wait = rx.wait_for(|m| m.contains_key(role));
        tokio::select! {
            r = tokio::time::timeout(timeout, wait) => match r {
                Ok(Ok(m)) => Ok(m[role].clone()),
                Ok(Err(_)) => Err(Error::Session("the session ended while waiting for a peer".into())),
                Err(_) => Err(Error::Workload {
                    workload: "peers".into(),
                    message: format!("role {role} did not report its cluster within {timeout:?}"),
                }),
            },
            _ = self.cancel.cancelled() => Err(Error::Cancelled(format!("cancelled while waiting for role {role}"))),
        }
    }

    /// Serves this role's cluster to its peers until the cell's lead role
    /// is done (success) or the cell is cancelled.
    pub async fn serve_until_released(&self) -> Result<Output> {
        tokio::select! {
            _ = self.release.cancelled() => Ok(Output::default()),
            _ = self.cancel.cancelled() => Err(Error::Cancelled("cancelled while serving peers".into())),
        }
    }
}

impl CellContext<'_> {
    /// Progress is advisory: when the channel is full it is dropped, never
    /// blocking the measurement.
    pub fn progress(&self, phase: &str, done: u64, total: u64, message: impl Into<String>) {
        let _ = self.events.try_send(AgentMessage {
            msg: Some(Msg::Progress(CellProgress {
                cell_id: self.cell_id.clone(),
                phase: phase.to_string(),
                done,
                total,
                message: message.into(),
            })),
        });
    }

    /// Samples are data: they are queued, never dropped.
    pub async fn sample<T: Serialize + ?Sized>(&self, kind: &str, data: &T) -> Result<()> {
        self.events
            .send(AgentMessage {
                msg: Some(Msg::Sample(CellSample {
                    cell_id: self.cell_id.clone(),
                    kind: kind.to_string(),
                    data_json: to_json(data),
                })),
            })
            .await
            .map_err(|_| Error::Session("event channel closed".into()))
    }

    pub fn check_cancel(&self) -> Result<()> {
        if self.cancel.is_cancelled() {
            Err(Error::Cancelled("cell cancelled".into()))
        } else {
            Ok(())
        }
    }
}

/// Median of a non-empty slice (mean of the middle two for even lengths).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
