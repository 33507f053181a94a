//! Sweeps: a workload entry's scalar key given a list of values
//! (`clients: [1, 4, 16, 64]`, `scale: [100, 1000]`) makes the entry one
//! point per combination, the first key's values the outer loop. Each kind
//! names the keys it lets a scenario sweep (`KindInfo::swept`).
//!
//! The entry is deserialized once per combination, each time with one
//! element of every swept list (`pgfleet_proto::workload::set_picks_ahead`),
//! so a point's values are checked by the kind as any entry's are, and an
//! error points at the element that caused it. A point's cells carry the
//! combination (`PlannedCell::point`, stored with the cell): the report
//! groups, labels, plots (`report/curves.rs`) and checks (`at:`) by it.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::ScenarioError;

/// Points one entry may sweep (the product of its lists' lengths).
pub const MAX_POINTS: usize = 256;

/// One swept key and its values as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub key: String,
    pub values: Vec<String>,
}

/// An entry's swept keys, the first the outermost; none for an entry
/// without lists.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sweep {
    pub axes: Vec<Axis>,
}

impl Sweep {
    /// The entry's points: 1 without axes.
    pub fn points(&self) -> usize {
        self.axes.iter().map(|a| a.values.len()).product()
    }

    /// Point `n`'s index into each axis (the last axis moves fastest).
    fn indexes(&self, mut n: usize) -> Vec<usize> {
        let mut out = vec![0; self.axes.len()];
        for (i, a) in self.axes.iter().enumerate().rev() {
            out[i] = n % a.values.len();
            n /= a.values.len();
        }
        out
    }

    /// What the entry's deserialization picks for point `n`.
    pub fn picks(&self, n: usize) -> pgfleet_proto::workload::Picks {
        self.axes
            .iter()
            .zip(self.indexes(n))
            .map(|(a, i)| (a.key.clone(), i))
            .collect()
    }

    /// Point `n` as (key, value as written) pairs.
    pub fn at(&self, n: usize) -> Vec<(String, String)> {
        self.axes
            .iter()
            .zip(self.indexes(n))
            .map(|(a, i)| (a.key.clone(), a.values[i].clone()))
            .collect()
    }

    /// What point `n` adds to its cells' ids: `-clients16-scale100`.
    pub fn id_suffix(&self, n: usize) -> String {
        self.at(n)
            .iter()
            .map(|(k, v)| {
                let v: String = v
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '.' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                format!("-{k}{v}")
            })
            .collect()
    }
}

impl fmt::Display for Sweep {
    /// `clients [1, 4, 16, 64] × scale [100, 1000]`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let axes: Vec<String> = self
            .axes
            .iter()
            .map(|a| format!("{} [{}]", a.key, a.values.join(", ")))
            .collect();
        write!(f, "{}", axes.join(" × "))
    }
}

/// A point as a JSON object (`{"clients": 16}`): numbers as numbers.
pub fn point_json(at: &[(String, String)]) -> serde_json::Value {
    at.iter()
        .map(|(k, v)| (k.clone(), value_json(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A swept value as written, typed: `16` and `0.5` as numbers, `1GiB` as text.
pub fn value_json(v: &str) -> serde_json::Value {
    if let Ok(n) = v.parse::<u64>() {
        return n.into();
    }
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() => x.into(),
        _ => v.into(),
    }
}

/// Two swept values are the same point: numbers by value (`60` is `60.0`),
/// anything else as written.
pub fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The pass over a scenario that finds its sweeps: each entry's keys with
/// the shape of their values.
#[derive(Deserialize)]
struct ShapesOnly {
    #[serde(default)]
    workloads: Vec<EntryShape>,
}

struct EntryShape(Vec<(String, Spanned<Shape>)>);

enum Shape {
    List(Vec<Spanned<Element>>),
    Other,
}

/// A list's element as text (a nested list or map: `?`, refused later).
struct Element(String);

impl<'de> Deserialize<'de> for EntryShape {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EntryShape;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a workload: a map with `kind` and that kind's keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<EntryShape, A::Error> {
                let mut keys = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    keys.push((k, m.next_value()?));
                }
                Ok(EntryShape(keys))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "any value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Shape, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = s.next_element()? {
                    out.push(e);
                }
                Ok(Shape::List(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Shape, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Shape::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_unit<E>(self) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_none<E>(self) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
                d.deserialize_any(V)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Element;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Element, E> {
                Ok(Element(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Element, E> {
                Ok(Element(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Element, E> {
                Ok(Element(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Element, E> {
                Ok(Element(v.to_string()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Element, E> {
                Ok(Element(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Element, E> {
                Ok(Element("~".into()))
            }
            fn visit_none<E>(self) -> Result<Element, E> {
                Ok(Element("~".into()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Element, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Element("?".into()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Element, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Element("?".into()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A scenario's sweeps: per entry (in `workloads` order) the keys its kind
/// sweeps that were given a list, and the other keys given a list (for
/// the hint when such a key takes one value).
#[derive(Debug, Default)]
pub struct Sweeps {
    pub entries: Vec<Sweep>,
    pub other_lists: Vec<(usize, String)>,
}

/// The scenario's sweeps. `kinds` are the entries' kinds (first pass).
pub fn sweeps(
    path: &Path,
    text: &str,
    kinds: &[Option<Spanned<String>>],
) -> Result<Sweeps, ScenarioError> {
    let shapes = super::deserialize::<ShapesOnly>(path, text)?;
    let mut out = Sweeps::default();
    for (i, entry) in shapes.workloads.into_iter().enumerate() {
        let swept = kinds
            .get(i)
            .and_then(|k| k.as_ref())
            .and_then(|k| pgfleet_proto::workload::info(&k.value))
            .map(|k| k.swept)
            .unwrap_or(&[]);
        let located = |at: serde_saphyr::Location, key: &str, message: String| ScenarioError {
            file: path.to_path_buf(),
            line: at.line(),
            column: at.column(),
            field: format!("workloads[{i}].{key}"),
            message,
        };
        let mut sweep = Sweep::default();
        for (key, shape) in entry.0 {
            let Shape::List(values) = &shape.value else {
                continue;
            };
            if !swept.contains(&key.as_str()) {
                // Lists of other keys (e.g. a kind's `sizes`) are the kind's own.
                out.other_lists.push((i, key));
                continue;
            }
            if values.is_empty() {
                return Err(located(
                    shape.referenced,
                    &key,
                    "an empty list sweeps nothing: give one value or several".into(),
                ));
            }
            let mut seen: Vec<&str> = Vec::new();
            for v in values {
                if seen.contains(&v.value.0.as_str()) {
                    return Err(located(
                        v.referenced,
                        &key,
                        format!("`{}` is listed twice in the sweep", v.value.0),
                    ));
                }
                seen.push(&v.value.0);
            }
            sweep.axes.push(Axis {
                key: key.clone(),
                values: values.iter().map(|v| v.value.0.clone()).collect(),
            });
            if sweep.points() > MAX_POINTS {
                return Err(located(
                    shape.referenced,
                    &key,
                    format!(
                        "{} points ({}): at most {MAX_POINTS} per entry (split the entry, or sweep fewer values)",
                        sweep.points(),
                        sweep
                            .axes
                            .iter()
                            .map(|a| format!("{} {}", a.values.len(), a.key))
                            .collect::<Vec<_>>()
                            .join(" × ")
                    ),
                ));
            }
        }
        out.entries.push(sweep);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(key: &str, values: &[&str]) -> Axis {
        Axis {
            key: key.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn points_run_the_last_key_fastest() {
        let s = Sweep {
            axes: vec![
                axis("scale", &["10", "100"]),
                axis("clients", &["1", "4", "16"]),
            ],
        };
        assert_eq!(s.points(), 6);
        assert_eq!(
            s.at(0),
            [
                ("scale".into(), "10".into()),
                ("clients".into(), "1".into())
            ]
        );
        assert_eq!(s.at(4)[0].1, "100");
        assert_eq!(s.at(4)[1].1, "4");
        assert_eq!(s.picks(5), [("scale".into(), 1), ("clients".into(), 2)]);
        assert_eq!(s.id_suffix(5), "-scale100-clients16");
        assert_eq!(s.to_string(), "scale [10, 100] × clients [1, 4, 16]");
        assert_eq!(Sweep::default().points(), 1);
        assert_eq!(Sweep::default().id_suffix(0), "");
        assert_eq!(
            point_json(&s.at(0)),
            serde_json::json!({"scale": 10, "clients": 1})
        );
        assert_eq!(value_json("1GiB"), "1GiB");
        assert_eq!(value_json("0.5"), 0.5);
    }
}
