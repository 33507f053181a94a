//! The agent's own Prometheus metrics, served at `/metrics` when the agent
//! is started with `--metrics-addr` (a pod scraped directly by a PodMonitor,
//! or a local agent found through the controller's `/sd/agents`).
//!
//! They are about this agent, not the run (the controller merges the runs'
//! figures across agents): whether its session is up, how often it had to
//! reconnect, the cells it runs and finished, the samples it sent and still
//! holds for replay, and the driver's transactions it measured. Labels stay
//! bounded: a sample kind, a cell status, a failure class.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

pub struct AgentMetrics {
    registry: Registry,
    /// 1 with this agent's versions as labels (who it is comes with the
    /// target: /sd/agents' labels, or the pod's).
    pub info: IntGaugeVec,
    /// 1 while a session with the controller is up.
    pub connected: IntGauge,
    /// Sessions registered with the controller (the first, then each reconnect).
    pub sessions: IntCounter,
    /// Cells running now.
    pub cells_running: IntGauge,
    /// Cells finished, by status.
    pub cells_finished: IntCounterVec,
    /// Samples sent (replays not counted again), by kind.
    pub samples_sent: IntCounterVec,
    /// Samples kept for replay until the controller acknowledges them.
    pub samples_unacked: IntGauge,
    /// The driver's measured transactions (from its live seconds).
    pub transactions: IntCounter,
    /// The driver's failed transactions, by class.
    pub failures: IntCounterVec,
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentMetrics")
    }
}

fn must<T>(r: prometheus::Result<T>) -> T {
    // Names and labels are constants: a failure is a bug.
    r.expect("metric definition")
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    pub fn new() -> AgentMetrics {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = must($m);
                must(registry.register(Box::new(m.clone())));
                m
            }};
        }
        AgentMetrics {
            info: reg!(IntGaugeVec::new(
                Opts::new(
                    "pgfleet_agent_info",
                    "This agent's versions (always 1); its id, class and storage profile are the target's labels."
                ),
                &["agent_version", "postgres_version"]
            )),
            connected: reg!(IntGauge::new(
                "pgfleet_agent_connected",
                "1 while the agent's session with the controller is up."
            )),
            sessions: reg!(IntCounter::new(
                "pgfleet_agent_sessions_total",
                "Sessions registered with the controller: the first and each reconnect."
            )),
            cells_running: reg!(IntGauge::new(
                "pgfleet_agent_cells_running",
                "Cells this agent is running."
            )),
            cells_finished: reg!(IntCounterVec::new(
                Opts::new(
                    "pgfleet_agent_cells_finished_total",
                    "Cells this agent finished, by status (succeeded, failed, cancelled)."
                ),
                &["status"]
            )),
            samples_sent: reg!(IntCounterVec::new(
                Opts::new(
                    "pgfleet_agent_samples_sent_total",
                    "Samples sent to the controller (replays not counted again), by kind."
                ),
                &["kind"]
            )),
            samples_unacked: reg!(IntGauge::new(
                "pgfleet_agent_samples_unacknowledged",
                "Samples kept for replay until the controller acknowledges them."
            )),
            transactions: reg!(IntCounter::new(
                "pgfleet_agent_transactions_total",
                "Transactions the driver measured on this agent (its live seconds)."
            )),
            failures: reg!(IntCounterVec::new(
                Opts::new(
                    "pgfleet_agent_transaction_failures_total",
                    "Failed transactions the driver measured on this agent, by class."
                ),
                &["class"]
            )),
            registry,
        }
    }

    /// Counts one sample as it is first sent; a `live` second adds its
    /// transactions and failures.
    pub fn sample_sent(&self, s: &pgfleet_proto::v1::CellSample) {
        self.samples_sent.with_label_values(&[&s.kind]).inc();
        if s.kind == "live"
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&s.data_json)
        {
            self.transactions
                .inc_by(v["transactions"].as_u64().unwrap_or(0));
            for (class, n) in v["failures"].as_object().into_iter().flatten() {
                self.failures
                    .with_label_values(&[class])
                    .inc_by(n.as_u64().unwrap_or(0));
            }
        }
    }

    pub fn cell_finished(&self, status: pgfleet_proto::v1::CellStatus) {
        use pgfleet_proto::v1::CellStatus as S;
        let name = match status {
            S::Succeeded => "succeeded",
            S::Cancelled => "cancelled",
            _ => "failed",
        };
        self.cells_finished.with_label_values(&[name]).inc();
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Serves `/metrics` on `bind` until the runtime ends; returns the bound
/// address (port 0 picks a free one).
pub async fn serve(bind: SocketAddr, metrics: Arc<AgentMetrics>) -> std::io::Result<SocketAddr> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    m.render(),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_seconds_count_their_transactions_and_failures() {
        let m = AgentMetrics::new();
        let s = pgfleet_proto::v1::CellSample {
            kind: "live".into(),
            data_json: r#"{"transactions": 120, "failures": {"serialization": 3}}"#.into(),
            ..Default::default()
        };
        m.sample_sent(&s);
        m.sample_sent(&s);
        m.sample_sent(&pgfleet_proto::v1::CellSample {
            kind: "pg_stat".into(),
            data_json: r#"{"transactions": 99}"#.into(),
            ..Default::default()
        });
        assert_eq!(m.transactions.get(), 240);
        assert_eq!(m.failures.with_label_values(&["serialization"]).get(), 6);
        assert_eq!(m.samples_sent.with_label_values(&["live"]).get(), 2);
        let text = m.render();
        assert!(
            text.contains("pgfleet_agent_samples_sent_total{kind=\"pg_stat\"} 1"),
            "{text}"
        );
    }
}
