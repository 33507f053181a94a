//! What every workload is given and shares: the cell's context (its
//! cluster, progress, samples, cancellation, role and peers), its phases,
//! the output it returns, and the measuring helpers kinds have in common.
//! Kinds use this module, never `cell` or the dispatch in `workload`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::sampler::{Sampler, Sampling};
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellProgress, CellSample, Endpoint, agent_message::Msg};
use pgfleet_proto::workload as kinds;

/// A phase of a cell, as a span under the current one (the cell's).
pub fn phase(name: &'static str) -> tracing::Span {
    tracing::info_span!(target: "pgfleet", "phase", otel.name = name, phase = name)
}

/// A dataset's load figures (rows, seconds, rows/s, seconds per step; the
/// form pgbench-init reports): reported by the cell that loaded it, and by
/// the cells that restore it (from its manifest).
pub type Loaded = kinds::pgbench_init::Metrics;

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
    /// The cell's dataset, loaded or restored before the workload runs
    /// (kinds that declare one).
    pub loaded: Option<Loaded>,
    /// The fio program (`--fio`), for kind fio.
    pub fio: std::path::PathBuf,
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
            loaded: None,
            fio: "fio".into(),
        }
    }

    /// The dataset's load figures (set before the workload runs).
    pub fn loaded(&self) -> Result<Loaded> {
        self.loaded.clone().ok_or_else(|| Error::Workload {
            workload: "dataset".into(),
            message: "the cell's dataset was not loaded before its workload ran".into(),
        })
    }

    /// Waits until `role`'s cluster is up and returns where it is (no
    /// bound: a role that fails ends the cell, which cancels this wait).
    pub async fn peer(&self, role: &str) -> Result<Endpoint> {
        let mut rx = self.peers.clone();
        tokio::select! {
            r = rx.wait_for(|m| m.contains_key(role)) => match r {
                Ok(m) => Ok(m[role].clone()),
                Err(_) => Err(Error::Session("the session ended while waiting for a peer".into())),
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
                    // Numbered by the session as it sends them.
                    seq: 0,
                })),
            })
            .await
            .map_err(|_| Error::Session("event channel closed".into()))
    }

    /// The cell's own cluster sampled every second from now on.
    pub async fn sample_own_cluster(&self) -> Result<Sampler> {
        Sampler::start(
            &self.cluster.server(),
            Sampling::every_second(self.cluster.device_stat_file()),
            self.events.clone(),
            self.cell_id.clone(),
        )
        .await
    }

    pub fn check_cancel(&self) -> Result<()> {
        if self.cancel.is_cancelled() {
            Err(Error::Cancelled("cell cancelled".into()))
        } else {
            Ok(())
        }
    }
}

/// One repeat of a closed loop: calls and latency figures.
#[derive(Debug, Clone, Default)]
pub struct RepeatSummary {
    pub calls: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The measurement loop of the read kinds: awaits `call` back to back until
/// `dur` elapses (at least once), recording each call's latency (ns) in an
/// HDR histogram.
pub async fn closed_loop<F, Fut>(
    dur: Duration,
    cancel: &CancellationToken,
    mut call: F,
) -> Result<RepeatSummary>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1_000, 600_000_000_000, 3)
        .map_err(|e| Error::Workload {
            workload: "measure".into(),
            message: format!("histogram: {e}"),
        })?;
    let mut sum_ns: u128 = 0;
    let start = Instant::now();
    loop {
        if cancel.is_cancelled() {
            return Err(Error::Cancelled("cell cancelled".into()));
        }
        let t = Instant::now();
        call().await?;
        let ns = t.elapsed().as_nanos();
        hist.saturating_record(ns as u64);
        sum_ns += ns;
        if start.elapsed() >= dur {
            break;
        }
    }
    let n = hist.len();
    let ms = |ns: u64| ns as f64 / 1e6;
    Ok(RepeatSummary {
        calls: n,
        mean_ms: sum_ns as f64 / n.max(1) as f64 / 1e6,
        p50_ms: ms(hist.value_at_quantile(0.5)),
        p99_ms: ms(hist.value_at_quantile(0.99)),
        max_ms: ms(hist.max()),
    })
}

/// Warm `EXPLAIN (ANALYZE, BUFFERS)` of `sql` (run twice, the second
/// recorded): (shared hit, shared read, top plan node, execution ms).
pub async fn explain_buffers(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<(i64, i64, String, f64)> {
    let sql = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}");
    let mut doc = serde_json::Value::Null;
    for _ in 0..2 {
        doc = client.query_one(&sql, &[]).await?.get(0);
    }
    let top = &doc[0];
    let plan = &top["Plan"];
    let num = |v: &serde_json::Value| v.as_i64().unwrap_or(0);
    Ok((
        num(&plan["Shared Hit Blocks"]),
        num(&plan["Shared Read Blocks"]),
        plan["Node Type"].as_str().unwrap_or("").to_string(),
        top["Execution Time"].as_f64().unwrap_or(f64::NAN),
    ))
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
