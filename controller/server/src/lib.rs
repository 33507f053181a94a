//! pgfleet's controller proper: agent sessions and the scheduler, the run
//! queue `serve` feeds, the HTTP API, the agent sources (local processes,
//! Kubernetes) and the PgfleetRun reconciler, metrics and datasets.
//!
//! Layers, top down (each uses only those below it; Cargo keeps the lower
//! crates from reaching up): `run`/`serve` → `controller` → `http`/`resource`
//! → `queue` → `runner` → `scheduler` (its `core` does no I/O) → the
//! store (`pgfleet-store`) → scenarios (`pgfleet-scenario`).
//!
//! Invariants:
//! - The agent never decides scheduling; the scheduler is the one place that
//!   advances a cell's state.
//! - The scheduler never knows where agents come from: sources (`agents/`)
//!   start them; they register over the same gRPC session either way.

pub mod agents;
pub mod controller;
pub mod datasets;
pub mod events;
pub mod grpc;
pub mod http;
pub mod hub;
pub mod metrics;
pub mod queue;
pub mod resource;
pub mod run;
pub mod runner;
pub mod scheduler;
pub mod serve;
pub mod tokens;
pub mod writer;
