//! pgfleet-controller: scenarios, agent sessions, scheduling, the run store
//! and reports. The `pgfleet` binary is a thin CLI over this library.
//!
//! Architecture invariants:
//! - The agent never decides scheduling; the scheduler is the one place that
//!   advances a cell's state.
//! - Reports read only the store.
//! - The scheduler never knows where agents come from: sources (`agents/`)
//!   start them; they register over the same gRPC session either way.
//!
//! Cargo feature `server` (default): the controller itself (run, serve,
//! the agent sources, the Kubernetes side, the HTTP API). Without it the
//! crate is the client CI needs (`pgfleet submit/status/cancel`, and
//! validate, report, compare and history on a store): no kube, k8s-openapi,
//! axum or utoipa to build.

#[cfg(feature = "server")]
pub mod agents;
pub mod changepoint;
pub mod cli;
pub mod client;
pub mod compare;
#[cfg(feature = "server")]
pub mod controller;
#[cfg(feature = "server")]
pub mod datasets;
#[cfg(feature = "server")]
pub mod events;
#[cfg(feature = "server")]
pub mod grpc;
pub mod history;
#[cfg(feature = "server")]
pub mod http;
#[cfg(feature = "server")]
pub mod hub;
pub mod labels;
pub mod learned;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod queue;
pub mod report;
#[cfg(feature = "server")]
pub mod resource;
#[cfg(feature = "server")]
pub mod run;
pub mod scenario;
#[cfg(feature = "server")]
pub mod scheduler;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod service;
pub mod stats;
pub mod store;
#[cfg(feature = "server")]
pub mod tokens;
#[cfg(feature = "server")]
pub mod writer;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error("store: {0}")]
    Store(String),
    #[error("agents: {0}")]
    Agents(String),
    #[error("gRPC server: {0}")]
    Server(String),
    #[error("report: {0}")]
    Report(String),
    #[error("{0}")]
    Usage(String),
    #[error("datasets: {0}")]
    Datasets(String),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Store(e.to_string())
    }
}

impl Error {
    /// Exit code for the CLI (see `exit`).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Scenario(_) | Error::Usage(_) => exit::INVALID,
            Error::Store(_) | Error::Agents(_) | Error::Server(_) => exit::INFRA,
            Error::Report(_) | Error::Datasets(_) => exit::INFRA,
        }
    }
}

/// The exit codes of `pgfleet run` and `pgfleet submit`, one table for both.
pub mod exit {
    /// Every cell succeeded and every check passed.
    pub const OK: u8 = 0;
    /// A check failed, or was inconclusive: the numbers said no.
    pub const FAILED: u8 = 1;
    /// Invalid scenario or usage (nothing ran).
    pub const INVALID: u8 = 2;
    /// A cell failed, or the server or the run's infrastructure did:
    /// unreachable after retries, `--timeout` passed, an agent lost,
    /// agents could not start, the run was interrupted.
    pub const INFRA: u8 = 3;
    /// Cancelled (Ctrl-C, `pgfleet cancel`, `DELETE /v1/runs/{id}`).
    pub const CANCELLED: u8 = 130;

    /// For `--help`.
    pub const TABLE: &str = "Exit codes (run, submit and compare): 0 every cell succeeded and every check \
passed; 1 a check (or a compare gate) failed or was inconclusive: the numbers said no; \
2 invalid scenario or usage; 3 a cell failed, or the server or the run's infrastructure did \
(unreachable, --timeout passed, agent lost, agents could not start, run interrupted); 130 cancelled.";

    /// The code for a run's final status, before its checks: a run
    /// that succeeded is 0 here; `of_report` then looks at the checks.
    pub fn of_status(status: &str) -> u8 {
        match status {
            "succeeded" => OK,
            "cancelled" => CANCELLED,
            _ => INFRA,
        }
    }

    /// The code for a finished run's report: its status, then its checks
    /// (1 when one failed or was inconclusive and counts as failed).
    pub fn of_report(doc: &serde_json::Value) -> u8 {
        match of_status(doc["status"].as_str().unwrap_or("")) {
            OK if doc["check_summary"]["ok"] == false => FAILED,
            code => code,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
