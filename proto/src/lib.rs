//! pgfleet-proto: the agent session protocol (wire types only) plus the few
//! hand-written conversions between `google.protobuf.Struct` and JSON.

pub mod v1 {
    tonic::include_proto!("pgfleet.v1");
}

mod convert;

pub use convert::{json_to_struct, json_to_value, struct_to_json, value_to_json};

/// PostgreSQL settings the agent manages itself (loopback listening, its own
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
