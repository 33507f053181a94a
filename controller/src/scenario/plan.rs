//! Planning: a validated scenario becomes cells. A cell is one unit of work
//! on one fresh cluster of one instance class; the scheduler places each on
//! an idle agent of that class.
//!
//! toast-slice: one cell per (workload entry, instance class, dataset); a
//! cell measures every storage mode and offset of that dataset.

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use super::validate::resolve_offset;
use super::{OffsetSpec, Scenario};

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
        let classes: Vec<&super::FleetEntry> = s
            .fleet
            .value
            .iter()
            .filter(|f| {
                w.on.as_ref()
                    .is_none_or(|on| on.iter().any(|c| c.value == f.name.value))
            })
            .collect();
        let list =
            |l: &Option<Vec<serde_saphyr::Spanned<String>>>, default: &[&str]| -> Vec<String> {
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
        for class in classes {
            for ds in &datasets {
                cells.push(PlannedCell {
                    cell_id: format!(
                        "w{wi}-{}-{ds}-{}",
                        class.name.value,
                        human_bytes(value_bytes)
                    ),
                    workload: w.kind.value.clone(),
                    instance_class: class.name.value.clone(),
                    params: json!({
                        "storage_modes": modes,
                        "dataset": ds,
                        "value_bytes": value_bytes,
                        "offsets": offsets,
                        "slice_bytes": w.slice_bytes.as_ref().map(|v| v.value).unwrap_or(100),
                        "duration_s": w.duration_s.as_ref().map(|v| v.value).unwrap_or(30.0),
                        "repeats": w.repeats.as_ref().map(|v| v.value).unwrap_or(5),
                        "warmup_s": w.warmup_s.as_ref().map(|v| v.value).unwrap_or(0.5),
                    }),
                    settings: class.settings(),
                });
            }
        }
    }
    cells
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
