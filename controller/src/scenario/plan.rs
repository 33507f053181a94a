//! Planning: a validated scenario becomes cells. A cell is one unit of work
//! on one fresh cluster of one instance class; the scheduler places each on
//! an idle agent of that class.
//!
//! toast-slice: one cell per (workload entry, instance class, dataset); a
//! cell measures every storage mode and offset of that dataset.
//! pgbench-init / pgbench: one cell per (entry, class). `replicas: N`
//! repeats each cell N times per class, each on its own fresh cluster.

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use super::validate::resolve_offset;
use super::{OffsetSpec, Scenario, SettingValue, WorkloadSpec};

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCell {
    pub cell_id: String,
    pub workload: String,
    pub instance_class: String,
    /// The agent's parameters (defaults applied, offsets resolved).
    pub params: Json,
    pub settings: BTreeMap<String, String>,
}

pub fn plan(s: &Scenario) -> Vec<PlannedCell> {
    let mut cells = Vec::new();
    for (wi, w) in s.workloads.value.iter().enumerate() {
        let classes = s.fleet.value.iter().filter(|f| {
            w.on.as_ref()
                .is_none_or(|on| on.iter().any(|c| c.value == f.name.value))
        });
        // (cell id stem, params) per cell of this entry on one class.
        let units: Vec<(String, Json)> = match w.kind.value.as_str() {
            "toast-slice" => toast_slice(w),
            "pgbench-init" => vec![("init".into(), init_params(w))],
            _ => {
                let mut p = init_params(w);
                let name = match &w.script_text {
                    Some(_) => "script".to_string(),
                    None => w
                        .script
                        .as_ref()
                        .map(|s| s.value.clone())
                        .unwrap_or_else(|| "tpcb-like".into()),
                };
                let o = p.as_object_mut().expect("object");
                let opt = |v: Option<Json>| v.unwrap_or(Json::Null);
                o.insert("script".into(), json!(name));
                if let Some(t) = &w.script_text {
                    o.insert("script_text".into(), json!(t.value));
                }
                o.insert(
                    "clients".into(),
                    json!(w.clients.as_ref().map(|v| v.value).unwrap_or(1)),
                );
                o.insert(
                    "threads".into(),
                    json!(w.threads.as_ref().map(|v| v.value).unwrap_or(1)),
                );
                let duration = match (&w.duration_s, &w.transactions) {
                    (Some(d), _) => json!(d.value),
                    (None, None) => json!(60.0),
                    (None, Some(_)) => Json::Null,
                };
                o.insert("duration_s".into(), duration);
                o.insert(
                    "transactions".into(),
                    opt(w.transactions.as_ref().map(|v| json!(v.value))),
                );
                o.insert(
                    "warmup_s".into(),
                    json!(w.warmup_s.as_ref().map(|v| v.value).unwrap_or(0.0)),
                );
                o.insert("rate".into(), opt(w.rate.as_ref().map(|v| json!(v.value))));
                o.insert(
                    "latency_limit_ms".into(),
                    opt(w.latency_limit_ms.as_ref().map(|v| json!(v.value))),
                );
                o.insert(
                    "max_tries".into(),
                    json!(w.max_tries.as_ref().map(|v| v.value).unwrap_or(10)),
                );
                o.insert("seed".into(), opt(w.seed.as_ref().map(|v| json!(v.value))));
                o.insert(
                    "driver".into(),
                    json!(
                        w.driver
                            .as_ref()
                            .map(|v| v.value.as_str())
                            .unwrap_or("pgfleet")
                    ),
                );
                let defines: serde_json::Map<String, Json> = w
                    .defines
                    .iter()
                    .flatten()
                    .map(|(k, v)| {
                        let j = match &v.value {
                            SettingValue::Int(i) => json!(i),
                            SettingValue::Float(f) => json!(f),
                            SettingValue::Bool(b) => json!(b),
                            SettingValue::Str(s) => json!(s),
                        };
                        (k.clone(), j)
                    })
                    .collect();
                o.insert("defines".into(), Json::Object(defines));
                vec![(name, p)]
            }
        };
        let replicas = w.replicas.as_ref().map(|r| r.value).unwrap_or(1);
        for class in classes {
            for (stem, params) in &units {
                for r in 1..=replicas {
                    let suffix = if replicas > 1 {
                        format!("-r{r}")
                    } else {
                        String::new()
                    };
                    cells.push(PlannedCell {
                        cell_id: format!("w{wi}-{}-{stem}{suffix}", class.name.value),
                        workload: w.kind.value.clone(),
                        instance_class: class.name.value.clone(),
                        params: params.clone(),
                        settings: class.settings(),
                    });
                }
            }
        }
    }
    cells
}

fn init_params(w: &WorkloadSpec) -> Json {
    json!({
        "scale": w.scale.as_ref().map(|v| v.value).unwrap_or(1),
        "fillfactor": w.fillfactor.as_ref().map(|v| v.value).unwrap_or(100),
        "partitions": w.partitions.as_ref().map(|v| v.value).unwrap_or(0),
        "load_connections": w.load_connections.as_ref().map(|v| v.value).unwrap_or(0),
    })
}

/// One unit per dataset; each measures every storage mode and offset.
fn toast_slice(w: &WorkloadSpec) -> Vec<(String, Json)> {
    let list = |l: &Option<Vec<serde_saphyr::Spanned<String>>>, default: &[&str]| -> Vec<String> {
        l.as_ref()
            .map(|v| v.iter().map(|x| x.value.clone()).collect())
            .unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect())
    };
    let modes = list(&w.storage_modes, &["external", "pglz", "lz4"]);
    let datasets = list(&w.datasets, &["mixed"]);
    let value_bytes = w
        .value_bytes
        .as_ref()
        .map(|v| v.value)
        .unwrap_or(10 * 1024 * 1024);
    let offsets: Vec<OffsetSpec> = w
        .offsets
        .as_ref()
        .map(|o| o.iter().map(|x| x.value.clone()).collect())
        .unwrap_or_else(|| {
            ["0%", "50%", "90%"]
                .iter()
                .map(|s| OffsetSpec::Text(s.to_string()))
                .collect()
        });
    let offsets: Vec<Json> = offsets
        .iter()
        .map(|o| {
            let label = match o {
                OffsetSpec::Byte(b) => b.to_string(),
                OffsetSpec::Text(t) => t.trim().to_string(),
            };
            // Validated already.
            json!({"label": label, "byte": resolve_offset(o, value_bytes).unwrap_or(1)})
        })
        .collect();
    datasets
        .iter()
        .map(|ds| {
            (
                format!("{ds}-{}", human_bytes(value_bytes)),
                json!({
                    "storage_modes": modes,
                    "dataset": ds,
                    "value_bytes": value_bytes,
                    "offsets": offsets,
                    "slice_bytes": w.slice_bytes.as_ref().map(|v| v.value).unwrap_or(100),
                    "duration_s": w.duration_s.as_ref().map(|v| v.value).unwrap_or(30.0),
                    "repeats": w.repeats.as_ref().map(|v| v.value).unwrap_or(5),
                    "warmup_s": w.warmup_s.as_ref().map(|v| v.value).unwrap_or(0.5),
                }),
            )
        })
        .collect()
}

/// 10485760 -> "10MiB", 1048576 -> "1MiB", 1500 -> "1500B".
pub fn human_bytes(n: u64) -> String {
    if n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n.is_multiple_of(1 << 10) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}
