//! Conversions between `google.protobuf.Struct` / `Value` and `serde_json`.
//!
//! Parameters, metrics and environment facts travel as `Struct` so that the
//! report contract (JSON) is carried end to end without a schema per workload.

use prost_types::{ListValue, Struct, Value, value::Kind};
use serde_json::{Map, Number, Value as Json};

/// JSON object -> `Struct`. Non-object JSON yields an empty struct.
pub fn json_to_struct(json: &Json) -> Struct {
    match json {
        Json::Object(map) => Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        },
        _ => Struct::default(),
    }
}

pub fn json_to_value(json: &Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        Json::Object(_) => Kind::StructValue(json_to_struct(json)),
    };
    Value { kind: Some(kind) }
}

/// `Struct` -> JSON object.
pub fn struct_to_json(s: &Struct) -> Json {
    let mut map = Map::new();
    // Sorted keys keep stored JSON stable.
    let mut keys: Vec<_> = s.fields.keys().collect();
    keys.sort();
    for k in keys {
        map.insert(k.clone(), value_to_json(&s.fields[k]));
    }
    Json::Object(map)
}

/// `Value` -> JSON. Whole numbers come back as JSON integers, so counters
/// stay integers in reports.
pub fn value_to_json(v: &Value) -> Json {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        Some(Kind::NumberValue(n)) => number(*n),
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => struct_to_json(s),
    }
}

fn number(n: f64) -> Json {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        Json::Number(Number::from(n as i64))
    } else {
        Number::from_f64(n).map(Json::Number).unwrap_or(Json::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_keeps_types() {
        let j = json!({"a": 1, "b": 2.5, "c": null, "d": true, "e": "x", "f": [1, {"g": "h"}]});
        assert_eq!(struct_to_json(&json_to_struct(&j)), j);
    }
}
