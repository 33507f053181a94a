//! pgfleet-proto: what the controller and the agent must agree on.
//!
//! - `v1`: the agent session protocol (gRPC, generated from
//!   `proto/pgfleet.proto`). Parameters, points, samples and environment
//!   facts travel as JSON text of the typed structs below, so numbers keep
//!   their types end to end.
//! - `workload`: each workload kind's scenario keys, validation, defaults,
//!   cell parameters, metrics and estimates, in one file per kind.
//! - `telemetry`: logs and OpenTelemetry traces, set up once for both
//!   binaries, and the W3C trace context a cell's span carries to its agent.
//! - `script`: pgbench's script language (the agent's driver runs it; the
//!   controller checks scenarios' scripts with it before anything starts).

pub mod v1 {
    tonic::include_proto!("pgfleet.v1");
}

pub mod script;
pub mod telemetry;
pub mod workload;

/// PostgreSQL settings the agent manages itself (listening address, its own
/// port, no Unix socket, its own files). An `Assign` may not set them; the
/// controller rejects them in scenarios, the agent refuses them again.
pub const RESERVED_SETTINGS: &[&str] = &[
    "port",
    "listen_addresses",
    "unix_socket_directories",
    "data_directory",
    "hba_file",
    "ident_file",
    "config_file",
];
