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
//! - `settings`: which PostgreSQL settings a scenario may set (reserved ones
//!   never, those that act on the agent's host only with `allow_shell`).
//! - `dataset`: datasets built once and restored per cell (fingerprint,
//!   manifest, the local store's layout).
//! - `script`: pgbench's script language (the agent's driver runs it; the
//!   controller checks scenarios' scripts with it before anything starts).

/// The largest session message either side sends or accepts (a cell's
/// result with its points and environment is the largest; a scenario's
/// parameters travel in `Assign`). Larger ones end the stream with an error.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// An id that is safe as one path component and in logs (cell, run and
/// agent ids): 1-128 of ASCII letters, digits, `.`, `_`, `-`, `:`, not
/// starting with `.` or `-`. The controller plans only such ids; the agent
/// refuses any other.
pub fn is_safe_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with(['.', '-'])
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
}

pub mod v1 {
    tonic::include_proto!("pgfleet.v1");
}

pub mod dataset;
pub mod environment;
pub mod escape;
pub mod installs;
pub mod script;
pub mod settings;
pub mod telemetry;
pub mod workload;
