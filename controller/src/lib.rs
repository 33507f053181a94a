//! The `pgfleet` binary: its command line (`cli`) over the controller's
//! crates, which this library re-exports under the names the binary and
//! the integration tests use.
//!
//! The crates, bottom up (Cargo keeps each from reaching up):
//! - `pgfleet-scenario` (`scenario/`): the scenario model, validation,
//!   plans, sweeps, estimates; labels; statistics. No I/O.
//! - `pgfleet-store` (`store/`): the run store (SQLite), what plans learn
//!   from it, the controller's `Error` and the exit codes.
//! - `pgfleet-report` (`report/`): reports read only from the store, checks,
//!   compare, history and change points.
//! - `pgfleet-client` (`client/`): the client of serve's HTTP API.
//! - `pgfleet-server` (`server/`, feature `server`, default): agent sessions
//!   and the scheduler, serve's queue and HTTP API, agent sources, the
//!   PgfleetRun reconciler, metrics, datasets.
//!
//! Without the `server` feature this is the client CI installs (`pgfleet
//! submit/status/cancel`, and validate, report, compare and history on a
//! store): no kube, k8s-openapi, axum or utoipa to build.

pub mod cli;

pub use pgfleet_client as client;
pub use pgfleet_report as report;
pub use pgfleet_report::{changepoint, compare, history};
pub use pgfleet_scenario as scenario;
pub use pgfleet_scenario::{labels, stats};
pub use pgfleet_store as store;
pub use pgfleet_store::{Error, Result, exit, learned};

#[cfg(feature = "server")]
pub use pgfleet_server::{
    agents, controller, datasets, events, grpc, http, hub, metrics, queue, resource, run, runner,
    scheduler, serve, tokens, writer,
};
