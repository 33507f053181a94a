//! pgfleet-proto: the agent session protocol (wire types only) plus the few
//! hand-written conversions between `google.protobuf.Struct` and JSON.

pub mod v1 {
    tonic::include_proto!("pgfleet.v1");
}

mod convert;

pub use convert::{json_to_struct, json_to_value, struct_to_json, value_to_json};
