//! Scenario files: the YAML model, defaults, validation with
//! `file:line:column: field: message` errors, and planning into cells.
//!
//! Parsing is two-stage. serde (with `deny_unknown_fields`, and
//! `serde_path_to_error` for the field path) rejects unknown keys and wrong
//! types with the parser's location; then `validate` checks values and ranges
//! using the locations `Spanned` kept. Nothing starts before both pass.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use pgfleet_proto::workload::{self, KindOnly, Params};

pub mod labels;
pub mod plan;
pub mod reference;
pub mod stats;
pub mod sweep;
pub mod validate;

pub use pgfleet_proto::workload::Entry as WorkloadEntry;
pub use plan::{PlannedCell, plan};

/// An invalid scenario: where, which field, what is wrong and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioError {
    pub file: PathBuf,
    pub line: u64,
    pub column: u64,
    /// e.g. `workloads[0].offsets[2]`; empty for the document itself.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ScenarioError {}

impl ScenarioError {
    /// A value check's error, in file `path` whose text is `text`. An
    /// error on a line of a block scalar (`script_text: |`) points at that
    /// line of the file.
    pub fn located(path: &Path, text: &str, e: pgfleet_proto::workload::Invalid) -> ScenarioError {
        let (mut line, mut column) = (e.at.line(), e.at.column());
        if e.value_line > 1 && line > 1 && block_scalar_header(text, line as usize - 1) {
            let at = line as usize + e.value_line - 1;
            if let Some(l) = text.lines().nth(at - 1) {
                line = at as u64;
                column = (l.len() - l.trim_start().len() + 1) as u64;
            }
        }
        ScenarioError {
            file: path.to_path_buf(),
            line,
            column,
            field: e.field,
            message: e.message,
        }
    }
}

/// Whether line `n` (1-based) of `text` ends with a block scalar's header
/// (`key: |`, `|-`, `>+2`, ... and an optional comment): the value starts
/// on the next line.
fn block_scalar_header(text: &str, n: usize) -> bool {
    let Some(l) = text.lines().nth(n.wrapping_sub(1)) else {
        return false;
    };
    let code = l.split(" #").next().unwrap_or(l).trim_end();
    let tail = code.split_whitespace().last().unwrap_or("");
    tail.starts_with(['|', '>'])
        && tail[1..]
            .chars()
            .all(|c| matches!(c, '-' | '+') || c.is_ascii_digit())
}

/// A whole scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in reports: [a-z0-9-_.].
    pub name: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Instance classes and how many agents of each.
    pub fleet: Spanned<Vec<FleetEntry>>,
    /// The currency the fleet's `price`s are in (e.g. `USD`).
    #[serde(default)]
    pub currency: Option<Spanned<String>>,
    /// Each entry's `kind` picks the keys it takes (`pgfleet_proto::workload`).
    pub workloads: Spanned<Vec<WorkloadEntry>>,
    /// Verdicts on the results: bounds on a class's figure, or on the ratio
    /// of two classes' figures, judged with confidence intervals.
    #[serde(default)]
    pub checks: Vec<CheckSpec>,
    /// Start cells even when the emulated instances (`instance: {cpus,
    /// memory}`) running at once on one host would ask for more CPUs or
    /// memory than it has. Default false: such a cell waits for the host,
    /// so each instance gets what it emulates.
    #[serde(default)]
    pub oversubscribe: Option<Spanned<bool>>,
    /// What happens to a Kubernetes run's pods and volumes at its end.
    #[serde(default)]
    pub cleanup: Option<CleanupSpec>,
    /// Per workload entry, its cells' (id stem, parameters, sweep point),
    /// from validation (`validate` fills it; `plan` reads it).
    #[serde(skip)]
    pub units: Vec<Vec<Unit>>,
    /// Per workload entry, its sweep (no axes: one point).
    #[serde(skip)]
    pub sweeps: Vec<sweep::Sweep>,
    /// Per workload entry, the entry at each point of its sweep (the entry
    /// itself when it sweeps nothing); `workloads` holds the first point's.
    #[serde(skip)]
    pub points: Vec<Vec<WorkloadEntry>>,
}

/// `cleanup:`: whether a Kubernetes run's pods and volumes are deleted at
/// its end (`delete`, the default) or kept for debugging (`keep`), per
/// outcome, and how long kept ones stay before serve deletes them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanupSpec {
    #[serde(default)]
    pub on_success: Option<Spanned<String>>,
    #[serde(default)]
    pub on_failure: Option<Spanned<String>>,
    /// e.g. `24h`, `90m`, `2d` (default 24h).
    #[serde(default)]
    pub ttl: Option<Spanned<String>>,
}

/// `cleanup:` resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cleanup {
    pub keep_on_success: bool,
    pub keep_on_failure: bool,
    pub ttl: std::time::Duration,
}

impl Default for Cleanup {
    fn default() -> Self {
        Cleanup {
            keep_on_success: false,
            keep_on_failure: false,
            ttl: std::time::Duration::from_secs(24 * 3600),
        }
    }
}

/// `30s`, `90m`, `24h`, `2d` as a duration.
pub fn parse_ttl(t: &str) -> Option<std::time::Duration> {
    let t = t.trim();
    let (n, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(n.checked_mul(secs)?))
}

/// One cell's worth of an entry: its id stem, parameters and, in a sweep,
/// its point as (key, value as written).
#[derive(Debug, Clone)]
pub struct Unit {
    pub stem: String,
    pub params: Params,
    pub point: Vec<(String, String)>,
}

/// One check as written:
/// `{name, metric: {name, class} | ratio: {metric, class, baseline | baseline_workload}, min, max, confidence}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    pub name: Spanned<String>,
    /// A class's figure (the median over its clusters).
    #[serde(default)]
    pub metric: Option<MetricRef>,
    /// A class's figure divided by a baseline class's.
    #[serde(default)]
    pub ratio: Option<RatioRef>,
    /// A class's figure divided by the median of the earlier comparable
    /// runs since their last change point (`pgfleet history`).
    #[serde(default)]
    pub history: Option<HistoryRef>,
    #[serde(default)]
    pub min: Option<Spanned<f64>>,
    #[serde(default)]
    pub max: Option<Spanned<f64>>,
    /// The interval's level (default 0.95).
    #[serde(default)]
    pub confidence: Option<Spanned<f64>>,
    /// What an interval straddling the bound counts as: `fail` (default)
    /// or `pass`.
    #[serde(default)]
    pub inconclusive: Option<Spanned<String>>,
    /// Only the points of a sweep with these values (`at: {clients: 64}`).
    #[serde(default)]
    pub at: BTreeMap<String, Spanned<SettingValue>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricRef {
    pub name: Spanned<String>,
    pub class: Spanned<String>,
    /// The workload entry (index in `workloads`); default: every entry
    /// that measures the metric.
    #[serde(default)]
    pub workload: Option<Spanned<usize>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioRef {
    pub metric: Spanned<String>,
    pub class: Spanned<String>,
    /// The baseline class (default: `class`, with `baseline_workload`).
    #[serde(default)]
    pub baseline: Option<Spanned<String>>,
    #[serde(default)]
    pub workload: Option<Spanned<usize>>,
    /// Compare with another workload entry of the same kind (e.g. the same
    /// script under `driver: pgbench`) at the same point.
    #[serde(default)]
    pub baseline_workload: Option<Spanned<usize>>,
}

/// `history: {metric, class, workload, window, max_drop, same_labels}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRef {
    pub metric: Spanned<String>,
    pub class: Spanned<String>,
    #[serde(default)]
    pub workload: Option<Spanned<usize>>,
    /// The earlier comparable runs looked at (default 20).
    #[serde(default)]
    pub window: Option<Spanned<usize>>,
    /// How much worse than the last segment the run may be, e.g. `5%`
    /// (fewer TPS, or a higher latency, by at most 5 %).
    pub max_drop: Spanned<String>,
    /// Only earlier runs with the same values of these labels as this run
    /// (e.g. `[branch]`: main is compared with main).
    #[serde(default)]
    pub same_labels: Vec<Spanned<String>>,
    /// PostgreSQL settings the check follows: earlier runs that differ in
    /// them stay comparable (`pgfleet history --vary`).
    #[serde(default)]
    pub vary: Vec<Spanned<String>>,
}

/// A history check's bound and the runs it looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryBound {
    pub window: usize,
    /// As a fraction (0.05 for `5%`).
    pub max_drop: f64,
    pub same_labels: Vec<String>,
    pub vary: Vec<String>,
}

/// `5%` (or `5`) as 0.05; None unless 0 <= it < 100.
pub fn parse_percent(text: &str) -> Option<f64> {
    let n: f64 = text.trim().trim_end_matches('%').trim().parse().ok()?;
    (n.is_finite() && (0.0..100.0).contains(&n)).then_some(n / 100.0)
}

/// A validated check, as reports judge it.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: String,
    pub metric: String,
    pub class: String,
    /// Set for a ratio: `class / baseline`.
    pub baseline: Option<String>,
    pub workload: Option<usize>,
    /// A ratio against another workload entry's matching point.
    pub baseline_entry: Option<usize>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub confidence: f64,
    pub inconclusive_passes: bool,
    /// A history check: judged against earlier runs (`report/trend.rs`).
    pub history: Option<HistoryBound>,
    /// The sweep's point(s) it judges: swept key -> value (`at`).
    pub at: Vec<(String, serde_json::Value)>,
}

impl Check {
    /// Whether the check judges summary `s` (its entry and sweep point).
    pub fn applies_to(
        &self,
        entry: Option<usize>,
        point: &serde_json::Map<String, serde_json::Value>,
    ) -> bool {
        self.workload.is_none_or(|w| entry == Some(w))
            && self.at.iter().all(|(k, v)| {
                sweep::same_value(point.get(k.as_str()).unwrap_or(&serde_json::Value::Null), v)
            })
    }
}

impl Scenario {
    /// The first workload entry with the `allow_shell` opt-in, as a located
    /// error saying why a server that does not permit it refuses it.
    pub fn shell_refusal(&self, path: &Path) -> Option<ScenarioError> {
        let i = self
            .units
            .iter()
            .position(|cells| cells.iter().any(|u| u.params.allow_shell()))?;
        let at = match &self.workloads.value[i].spec {
            workload::Spec::Pgbench(p) => p.allow_shell.as_ref().map(|a| a.referenced),
            _ => None,
        }
        .unwrap_or(self.workloads.value[i].kind.referenced);
        Some(ScenarioError {
            file: path.to_path_buf(),
            line: at.line(),
            column: at.column(),
            field: format!("workloads[{i}].allow_shell"),
            message: "allow_shell lets the scenario run commands on the agents' hosts; this server does not accept such scenarios (start `pgfleet serve` with --allow-shell-scenarios to permit them)".into(),
        })
    }

    /// Each priced class's price per hour, and the currency.
    pub fn prices(&self) -> Option<(String, BTreeMap<String, Price>)> {
        let prices: BTreeMap<String, Price> = self
            .fleet
            .value
            .iter()
            .filter_map(|f| Some((f.name.value.clone(), f.price.as_ref()?.resolve())))
            .collect();
        let currency = self.currency.as_ref()?.value.clone();
        (!prices.is_empty()).then_some((currency, prices))
    }

    /// The checks, resolved (validated already).
    pub fn checks(&self) -> Vec<Check> {
        self.checks
            .iter()
            .filter_map(|c| {
                let history = c.history.as_ref().map(|h| HistoryBound {
                    window: h.window.as_ref().map_or(20, |w| w.value),
                    max_drop: parse_percent(&h.max_drop.value).unwrap_or(0.0),
                    same_labels: h.same_labels.iter().map(|l| l.value.clone()).collect(),
                    vary: h.vary.iter().map(|l| l.value.clone()).collect(),
                });
                let (metric, class, baseline, workload, baseline_entry) =
                    match (&c.metric, &c.ratio, &c.history) {
                        (Some(m), _, _) => (&m.name, &m.class, None, &m.workload, None),
                        (None, None, Some(h)) => (&h.metric, &h.class, None, &h.workload, None),
                        (None, Some(r), _) => (
                            &r.metric,
                            &r.class,
                            Some(r.baseline.as_ref().unwrap_or(&r.class)),
                            &r.workload,
                            r.baseline_workload.as_ref().map(|w| w.value),
                        ),
                        (None, None, None) => return None,
                    };
                Some(Check {
                    name: c.name.value.clone(),
                    metric: metric.value.clone(),
                    class: class.value.clone(),
                    baseline: baseline.map(|b| b.value.clone()),
                    workload: workload.as_ref().map(|w| w.value),
                    baseline_entry,
                    min: c.min.as_ref().map(|x| x.value),
                    max: c.max.as_ref().map(|x| x.value),
                    confidence: c.confidence.as_ref().map(|x| x.value).unwrap_or(0.95),
                    inconclusive_passes: c.inconclusive.as_ref().is_some_and(|x| x.value == "pass"),
                    history,
                    at: c
                        .at
                        .iter()
                        .map(|(k, v)| (k.clone(), sweep::value_json(&v.value.to_string())))
                        .collect(),
                })
            })
            .collect()
    }
}

/// The first pass over a scenario: only its workloads' kinds.
#[derive(Deserialize)]
struct KindsOnly {
    #[serde(default)]
    workloads: Vec<KindOnly>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetEntry {
    /// The instance class name.
    pub name: Spanned<String>,
    #[serde(default)]
    pub count: Option<Spanned<u32>>,
    #[serde(default)]
    pub storage: Option<StorageSpec>,
    /// The machine: its type (a label), and the memory and CPUs its
    /// clusters are limited to (emulated with cgroups).
    #[serde(default)]
    pub instance: Option<InstanceSpec>,
    #[serde(default)]
    pub postgres: Option<PostgresSpec>,
    /// Where the class's pods go on Kubernetes (`serve --agents kubernetes`).
    #[serde(default)]
    pub kubernetes: Option<KubeSpec>,
    /// What the class costs, in the scenario's `currency`: reports add the
    /// run's cost and the cost per million transactions (`report/cost.rs`).
    #[serde(default)]
    pub price: Option<PriceSpec>,
}

/// A class's list prices: the instance per hour, and the volume's monthly
/// prices with the quantities billed (storage GB, provisioned IOPS and
/// MB/s beyond what the volume includes). A month is 730 hours.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceSpec {
    #[serde(default)]
    pub instance_hour: Option<Spanned<f64>>,
    #[serde(default)]
    pub storage_gb_month: Option<Spanned<f64>>,
    #[serde(default)]
    pub storage_gb: Option<Spanned<f64>>,
    #[serde(default)]
    pub iops_month: Option<Spanned<f64>>,
    #[serde(default)]
    pub iops: Option<Spanned<f64>>,
    #[serde(default)]
    pub throughput_mbps_month: Option<Spanned<f64>>,
    #[serde(default)]
    pub throughput_mbps: Option<Spanned<f64>>,
}

/// Hours in a billing month (AWS's 730).
pub const HOURS_PER_MONTH: f64 = 730.0;

/// A class's price, resolved: per hour, by what it pays for.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, Deserialize)]
#[serde(default)]
pub struct Price {
    pub instance: f64,
    pub storage: f64,
    pub iops: f64,
    pub throughput: f64,
}

impl Price {
    pub fn per_hour(&self) -> f64 {
        self.instance + self.storage + self.iops + self.throughput
    }
}

impl PriceSpec {
    pub fn resolve(&self) -> Price {
        let v = |x: &Option<Spanned<f64>>| x.as_ref().map_or(0.0, |x| x.value);
        Price {
            instance: v(&self.instance_hour),
            storage: v(&self.storage_gb_month) * v(&self.storage_gb) / HOURS_PER_MONTH,
            iops: v(&self.iops_month) * v(&self.iops) / HOURS_PER_MONTH,
            throughput: v(&self.throughput_mbps_month) * v(&self.throughput_mbps) / HOURS_PER_MONTH,
        }
    }
}

/// A class's pods on Kubernetes, beyond `instance.type` (the node pool,
/// by `node.kubernetes.io/instance-type`) and `storage` (the volume).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSpec {
    /// What the agent's pod requests: CPUs (`15`, `0.5`) and memory.
    #[serde(default)]
    pub requests: Option<KubeRequests>,
    /// Tolerations for tainted node pools.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// More node labels to select on (e.g. a node group's name).
    #[serde(default)]
    pub node_selector: BTreeMap<String, Spanned<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeRequests {
    #[serde(default)]
    pub cpu: Option<Spanned<f64>>,
    #[serde(default)]
    pub memory: Option<Spanned<pgfleet_proto::workload::ByteSize>>,
}

/// A Kubernetes toleration, as in a pod spec.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toleration {
    #[serde(default)]
    pub key: Option<Spanned<String>>,
    /// `Equal` (default) or `Exists`.
    #[serde(default)]
    pub operator: Option<Spanned<String>>,
    #[serde(default)]
    pub value: Option<Spanned<String>>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`; empty: all.
    #[serde(default)]
    pub effect: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// e.g. `m6id.4xlarge`: shown in reports.
    #[serde(default, rename = "type")]
    pub instance_type: Option<Spanned<String>>,
    /// Memory of each cluster, page cache included (`"384MiB"`, bytes).
    #[serde(default)]
    pub memory: Option<Spanned<pgfleet_proto::workload::ByteSize>>,
    #[serde(default)]
    pub cpus: Option<Spanned<u32>>,
    /// Apply the limits (default). `false` runs with the host's memory and
    /// CPUs, and reports say the instance was not emulated.
    #[serde(default)]
    pub emulate: Option<Spanned<bool>>,
}

/// An instance class's machine, resolved: what to emulate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    pub instance_type: String,
    pub memory_bytes: u64,
    pub cpus: u32,
    pub emulate: bool,
}

impl Scenario {
    /// The scenario's `oversubscribe` (default false).
    pub fn oversubscribe(&self) -> bool {
        self.oversubscribe.as_ref().is_some_and(|o| o.value)
    }

    /// The classes that name a PostgreSQL version, and the version: an
    /// agent of such a class must run it (classes naming none run the
    /// default, or a local run's `--pg-bin`).
    pub fn named_postgres_versions(&self) -> BTreeMap<String, u32> {
        self.fleet
            .value
            .iter()
            .filter_map(|f| {
                let v = f.postgres.as_ref()?.version.as_ref()?;
                Some((f.name.value.clone(), v.value))
            })
            .collect()
    }

    /// `cleanup:` with its defaults (validated: values parse).
    pub fn cleanup(&self) -> Cleanup {
        let d = Cleanup::default();
        let Some(c) = &self.cleanup else {
            return d;
        };
        let keep = |v: &Option<Spanned<String>>| v.as_ref().is_some_and(|v| v.value == "keep");
        Cleanup {
            keep_on_success: keep(&c.on_success),
            keep_on_failure: keep(&c.on_failure),
            ttl: c
                .ttl
                .as_ref()
                .and_then(|t| parse_ttl(&t.value))
                .unwrap_or(d.ttl),
        }
    }
}

impl FleetEntry {
    /// The PostgreSQL major version the class runs: the one it names, else
    /// `installs::DEFAULT` (a run's `--pg-bin` aside).
    pub fn postgres_version(&self) -> u32 {
        self.postgres
            .as_ref()
            .and_then(|p| p.version.as_ref())
            .map_or(pgfleet_proto::installs::DEFAULT, |v| v.value)
    }
    pub fn count(&self) -> u32 {
        self.count.as_ref().map(|c| c.value).unwrap_or(1)
    }
    pub fn profile(&self) -> String {
        self.storage
            .as_ref()
            .map(|s| s.profile.value.clone())
            .unwrap_or_else(|| "nvme".into())
    }
    /// The caps of this class's storage profile.
    pub fn caps(&self) -> Caps {
        let Some(s) = &self.storage else {
            return Caps::default();
        };
        let v = |x: &Option<Spanned<u64>>| x.as_ref().map(|x| x.value).unwrap_or(0);
        let scale = s.scale.as_ref().map(|x| x.value).unwrap_or(1.0);
        let scaled = |iops: u64| ((iops as f64 * scale).round() as u64).max(1);
        match s.profile.value.as_str() {
            // EBS gp3's baseline, as in seeds/002.
            "gp3" => {
                let iops = s.iops.as_ref().map_or(GP3_BASELINE_IOPS, |x| x.value);
                let mbps = s.mbps.as_ref().map_or(GP3_BASELINE_MIBPS, |x| x.value);
                // One budget for reads and writes, as EBS counts them.
                Caps {
                    read_iops: scaled(iops),
                    write_iops: scaled(iops),
                    read_mbps: mbps,
                    write_mbps: mbps,
                    combined: true,
                    latency: GP3_LATENCY,
                }
            }
            "nvme" => match s
                .instance_store
                .as_ref()
                .and_then(|t| instance_store(&t.value))
            {
                // AWS publishes these volumes' IOPS, not their throughput.
                Some((_, read, write)) => Caps {
                    read_iops: scaled(read),
                    write_iops: scaled(write),
                    read_mbps: 0,
                    write_mbps: 0,
                    combined: false,
                    latency: Default::default(),
                },
                None => Caps::default(),
            },
            "custom" => Caps {
                read_iops: v(&s.read_iops),
                write_iops: v(&s.write_iops),
                read_mbps: v(&s.read_mbps),
                write_mbps: v(&s.write_mbps),
                combined: false,
                latency: Default::default(),
            },
            _ => Caps::default(),
        }
    }
    /// What the class gives its cells, as estimates see it: its instance's
    /// CPUs (this host's without `instance.cpus`) and its profile's caps,
    /// emulated or the real device's (`emulate: false` on Kubernetes; run
    /// locally, such a class is the host's disk and estimated slower than
    /// it runs).
    pub fn capacity(&self) -> pgfleet_proto::workload::Capacity {
        let host = pgfleet_proto::workload::Capacity::host();
        let i = self.instance();
        pgfleet_proto::workload::Capacity {
            cpus: if i.cpus > 0 { i.cpus as f64 } else { host.cpus },
            memory_bytes: i.memory_bytes,
            caps: self.caps(),
        }
    }
    /// The class's machine (validated: sizes parse).
    pub fn instance(&self) -> Instance {
        let Some(i) = &self.instance else {
            return Instance::default();
        };
        Instance {
            instance_type: i
                .instance_type
                .as_ref()
                .map(|t| t.value.clone())
                .unwrap_or_default(),
            memory_bytes: i
                .memory
                .as_ref()
                .and_then(|m| m.value.bytes().ok())
                .unwrap_or(0),
            cpus: i.cpus.as_ref().map(|c| c.value).unwrap_or(0),
            emulate: i.emulate.as_ref().is_none_or(|e| e.value),
        }
    }
    pub fn emulate(&self) -> bool {
        self.storage
            .as_ref()
            .and_then(|s| s.emulate.as_ref())
            .is_none_or(|e| e.value)
    }
    pub fn settings(&self) -> BTreeMap<String, String> {
        self.postgres
            .as_ref()
            .map(|p| {
                p.settings
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSpec {
    /// nvme (the disk as is), gp3 (3,000 IOPS, 125 MiB/s), custom (the caps below).
    pub profile: Spanned<String>,
    #[serde(default)]
    pub read_iops: Option<Spanned<u64>>,
    #[serde(default)]
    pub write_iops: Option<Spanned<u64>>,
    #[serde(default)]
    pub read_mbps: Option<Spanned<u64>>,
    #[serde(default)]
    pub write_mbps: Option<Spanned<u64>>,
    /// Apply the caps by block-I/O throttling (default). `false` runs
    /// uncapped, and reports say the profile was not emulated.
    #[serde(default)]
    pub emulate: Option<Spanned<bool>>,
    /// Profile `gp3`: provisioned IOPS (3,000 baseline up to 16,000) and
    /// throughput in MiB/s (125 baseline up to 1,000), as AWS sells them.
    #[serde(default)]
    pub iops: Option<Spanned<u64>>,
    #[serde(default)]
    pub mbps: Option<Spanned<u64>>,
    /// Profile `nvme`: the instance type whose instance-store NVMe to
    /// emulate, from AWS's published IOPS (`INSTANCE_STORE`), e.g.
    /// `m6id.4xlarge`. Without it, `nvme` is the host's disk as is.
    #[serde(default)]
    pub instance_store: Option<Spanned<String>>,
    /// Profiles `gp3` and `nvme` with `instance_store`: the share of the
    /// device's IOPS this emulated instance gets (e.g. 0.125 for one CPU
    /// standing for 8 of 16 vCPUs' clients). MiB/s caps are kept: the
    /// scenario's sequential phases (loading) are not scaled.
    #[serde(default)]
    pub scale: Option<Spanned<f64>>,
    /// On Kubernetes: the StorageClass of each agent's volume (default:
    /// the cluster's default class).
    #[serde(default)]
    pub storage_class: Option<Spanned<String>>,
    /// On Kubernetes: each agent's volume size (default 10GiB).
    #[serde(default)]
    pub size: Option<Spanned<pgfleet_proto::workload::ByteSize>>,
    /// On Kubernetes, a volume created from a dataset snapshot: `read-all`
    /// (default) reads every block of its datasets before the first cell
    /// uses them (such a volume fetches blocks lazily on first touch);
    /// `none` leaves them lazy, and the report warns.
    #[serde(default)]
    pub hydrate: Option<Spanned<String>>,
}

/// EBS gp3's baseline and what can be provisioned on top (AWS's EBS
/// volume types page; seeds/002 ran at the baseline).
pub const GP3_BASELINE_IOPS: u64 = 3000;
pub const GP3_BASELINE_MIBPS: u64 = 125;
pub const GP3_MAX_IOPS: u64 = 16_000;
pub const GP3_MAX_MIBPS: u64 = 1000;

/// gp3's per-I/O latency. AWS publishes it only as "single-digit millisecond
/// latency" (the EBS volume types page, for gp2 and gp3 alike; io2 Block
/// Express "sub-millisecond"); taken at that phrase's floor, 1 ms a read and
/// a write. A flush adds nothing: EBS acknowledges a write once it is stored
/// on the volume's replicas, so a cache flush has no cache to wait for.
/// docs/running-locally.md says so, and the storage probe reports what the
/// emulation delivered against it.
pub const GP3_LATENCY: pgfleet_proto::environment::Latency = pgfleet_proto::environment::Latency {
    read_us: 1000,
    write_us: 1000,
    flush_us: 0,
};

/// Instance-store NVMe of the m6id family: (instance type, read IOPS,
/// write IOPS) as AWS publishes them ("Amazon EC2: Instance Types",
/// General purpose, "Instance store specifications", Read / Write
/// performance (IOPS); the 2024 edition, read 2026-12-03). AWS publishes
/// no throughput for these volumes.
pub const INSTANCE_STORE: &[(&str, u64, u64)] = &[
    ("m6id.large", 33_542, 16_771),
    ("m6id.xlarge", 67_083, 33_542),
    ("m6id.2xlarge", 134_167, 67_084),
    ("m6id.4xlarge", 268_333, 134_167),
    ("m6id.8xlarge", 536_666, 268_334),
    ("m6id.12xlarge", 804_998, 402_500),
    ("m6id.16xlarge", 1_073_332, 536_668),
    ("m6id.24xlarge", 1_609_996, 805_000),
    ("m6id.32xlarge", 2_146_664, 1_073_336),
];

/// The published figures of an instance type's instance store.
pub fn instance_store(instance_type: &str) -> Option<(&'static str, u64, u64)> {
    INSTANCE_STORE
        .iter()
        .copied()
        .find(|(t, _, _)| *t == instance_type)
}

/// A storage profile's caps (0 = uncapped), resolved from the scenario:
/// the type agents report in their environment.
pub use pgfleet_proto::environment::Caps;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSpec {
    #[serde(default)]
    pub settings: BTreeMap<String, Spanned<SettingValue>>,
    /// The major version the class runs (`installs::SUPPORTED`); absent:
    /// `installs::DEFAULT` (18), or the run's `--pg-bin`.
    #[serde(default)]
    pub version: Option<Spanned<u32>>,
}

/// A PostgreSQL setting as YAML may write it: `128MB`, `100`, `on`, `0.9`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum SettingValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl fmt::Display for SettingValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingValue::Bool(b) => write!(f, "{}", if *b { "on" } else { "off" }),
            SettingValue::Int(i) => write!(f, "{i}"),
            SettingValue::Float(x) => write!(f, "{x}"),
            SettingValue::Str(s) => write!(f, "{s}"),
        }
    }
}

/// Reads, parses and validates a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    parse(path, &read(path)?)
}

/// Reads a scenario file's text (errors name the file).
pub fn read(path: &Path) -> Result<String, ScenarioError> {
    std::fs::read_to_string(path).map_err(|e| ScenarioError {
        file: path.to_path_buf(),
        line: 0,
        column: 0,
        field: String::new(),
        message: format!("cannot read the scenario file: {e}"),
    })
}

/// Parses and validates scenario text; `path` is only used in errors.
pub fn parse(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    // First pass: each workload's kind, which decides its keys (a YAML map
    // may put `kind` anywhere). Syntax errors surface here, located.
    let kinds: Vec<Option<Spanned<String>>> = deserialize::<KindsOnly>(path, text)?
        .workloads
        .into_iter()
        .map(|w| w.kind)
        .collect();
    for (i, k) in kinds.iter().enumerate() {
        if let Some(k) = k
            && !workload::names().contains(&k.value.as_str())
        {
            return Err(ScenarioError {
                file: path.to_path_buf(),
                line: k.referenced.line(),
                column: k.referenced.column(),
                field: format!("workloads[{i}].kind"),
                message: format!(
                    "unknown workload kind `{}`: allowed {}",
                    k.value,
                    workload::names().join(", ")
                ),
            });
        }
    }
    let missing = Spanned {
        value: String::new(),
        referenced: serde_saphyr::Location::UNKNOWN,
        defined: serde_saphyr::Location::UNKNOWN,
    };
    let sweep::Sweeps {
        entries: sweeps,
        other_lists,
    } = sweep::sweeps(path, text, &kinds)?;
    let kinds: Vec<Spanned<String>> = kinds
        .into_iter()
        .map(|k| k.unwrap_or_else(|| missing.clone()))
        .collect();
    // Entries × points bound the passes' work below: refused before any
    // pass when they alone exceed the cells a scenario may plan.
    let units: usize = sweeps.iter().map(sweep::Sweep::points).sum();
    if units as u64 > validate::MAX_CELLS {
        let line = text
            .lines()
            .position(|l| l.starts_with("workloads"))
            .map_or(0, |n| n as u64 + 1);
        return Err(ScenarioError {
            file: path.to_path_buf(),
            line,
            column: 1,
            field: "workloads".into(),
            message: format!(
                "{units} workload entries and sweep points: a scenario plans at most {} cells (split it into several runs)",
                validate::MAX_CELLS
            ),
        });
    }
    // One pass per point of the widest sweep; each entry keeps the passes
    // up to its own points (an entry without sweeps: the first).
    let passes = sweeps.iter().map(sweep::Sweep::points).max().unwrap_or(1);
    let mut first: Option<Scenario> = None;
    let mut points: Vec<Vec<WorkloadEntry>> = vec![Vec::new(); sweeps.len()];
    for n in 0..passes {
        workload::set_kinds_ahead(kinds.clone());
        workload::set_picks_ahead(
            sweeps
                .iter()
                .map(|s| s.picks(n.min(s.points() - 1)))
                .collect(),
        );
        let parsed = deserialize::<Scenario>(path, text);
        workload::set_kinds_ahead(Vec::new());
        workload::set_picks_ahead(Vec::new());
        let parsed = parsed.map_err(|e| unswept_list_hint(e, &kinds, &other_lists))?;
        for ((w, sweep), out) in parsed.workloads.value.iter().zip(&sweeps).zip(&mut points) {
            if n < sweep.points() {
                out.push(w.clone());
            }
        }
        first.get_or_insert(parsed);
    }
    let mut scenario = first.expect("at least one pass");
    scenario.sweeps = sweeps;
    scenario.points = points;
    scenario.units =
        validate::validate(&scenario).map_err(|e| ScenarioError::located(path, text, e))?;
    Ok(scenario)
}

/// A list where a workload takes one value: say which keys do take lists.
fn unswept_list_hint(
    mut e: ScenarioError,
    kinds: &[Spanned<String>],
    lists: &[(usize, String)],
) -> ScenarioError {
    let entry = e
        .field
        .strip_prefix("workloads[")
        .and_then(|r| r.split_once(']'))
        .and_then(|(i, rest)| Some((i.parse::<usize>().ok()?, rest.strip_prefix('.')?)));
    if let Some((i, key)) = entry
        && lists.iter().any(|(j, k)| *j == i && k == key)
        && let Some(info) = kinds.get(i).and_then(|k| workload::info(&k.value))
    {
        e.message = format!(
            "`{key}` takes one value, not a list; the keys a {} entry sweeps with a list are {}",
            info.name,
            info.swept.join(", ")
        );
    }
    e
}

/// serde-saphyr with the field path of the first error.
fn deserialize<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, ScenarioError> {
    let mut field = String::new();
    let parsed: Result<T, serde_saphyr::Error> =
        serde_saphyr::with_deserializer_from_str(text, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                field = clean_path(&e.path().to_string());
                e.into_inner()
            })
        });
    parsed.map_err(|e| {
        let loc = e.location();
        let mut message = first_line(&e);
        // A workload's unknown key is refused by its kind's keys, after
        // the path tracker has let go of the key: name it in the path.
        if let Some(rest) = message.strip_prefix("unknown field `")
            && let Some((key, expected)) = rest.split_once('`')
            && field.starts_with("workloads[")
            && !field.contains('.')
        {
            field = format!("{field}.{key}");
            if let Some(list) = expected.strip_prefix(", expected one of ") {
                message = format!(
                    "unknown field `{key}`: this kind's keys are {list} (and every kind's: kind, {})",
                    workload::COMMON_KEYS.join(", ")
                );
            }
        }
        ScenarioError {
            file: path.to_path_buf(),
            line: loc.map(|l| l.line()).unwrap_or(0),
            column: loc.map(|l| l.column()).unwrap_or(0),
            field,
            message,
        }
    })
}

/// serde_path_to_error writes `?` for the document root and `.value` for the
/// inside of `Spanned`; users know neither.
fn clean_path(p: &str) -> String {
    if p == "." || p == "?" {
        return String::new();
    }
    // Only whole `value` segments go: a key such as `value_bytes` stays.
    let mut out = String::new();
    for seg in p.split('.') {
        let seg = match seg.strip_prefix("value") {
            Some(rest) if rest.is_empty() || rest.starts_with('[') => rest,
            _ => seg,
        };
        if seg.is_empty() {
            continue;
        }
        if !out.is_empty() && !seg.starts_with('[') {
            out.push('.');
        }
        out.push_str(seg);
    }
    out
}

/// serde-saphyr's Display adds a source snippet after the first line; keep
/// the message and drop its own location prefix (we print ours).
fn first_line(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or("").trim();
    // e.g. "error: line 3 column 5: unknown field ..." -> "unknown field ..."
    let msg = match line.find(": ") {
        Some(i) if line[..i].contains("line") => line[i + 2..].trim(),
        _ => line,
    };
    let msg = msg.strip_prefix("error: ").unwrap_or(msg);
    let msg = match msg.find("column ") {
        Some(i) if msg.starts_with("line ") => {
            msg[i..].split_once(": ").map(|(_, m)| m).unwrap_or(msg)
        }
        _ => msg,
    };
    // serde's terse type errors, in words.
    match msg {
        "invalid u32" | "invalid u64" => "expected a whole number, 0 or more".to_string(),
        "invalid f64" => "expected a number".to_string(),
        "invalid bool" => "expected true or false".to_string(),
        m => m.to_string(),
    }
}

#[cfg(test)]
mod tests {
    //! One test per class of bad input: each asserts the line and the field.
    use super::*;

    fn err(yaml: &str) -> ScenarioError {
        parse(Path::new("bad.yaml"), yaml).expect_err("should be rejected")
    }

    const GOOD: &str = "name: t
fleet:
  - name: local
    count: 1
    storage: { profile: nvme }
    postgres: { settings: { shared_buffers: 128MB, max_connections: 50 } }
workloads:
  - kind: toast-slice
    storage_modes: [external, pglz, lz4]
    datasets: [mixed]
    value_bytes: 10485760
    offsets: [\"0%\", \"50%\", 9437185]
    slice_bytes: 100
    duration_s: 5
    repeats: 5
";

    fn with(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "{from}");
        GOOD.replacen(from, to, 1)
    }

    /// A scenario's name may have upper case (`TPC-B`); a class's, which
    /// names pods and cells, may not.
    #[test]
    fn scenario_names_take_upper_case_class_names_do_not() {
        let s = parse(Path::new("good.yaml"), &with("name: t", "name: TPC-B_1")).unwrap();
        assert_eq!(s.name.value, "TPC-B_1");
        let e = err(&with("  - name: local", "  - name: Local"));
        assert_eq!(e.field, "fleet[0].name", "{e}");
        let e = err(&with("name: t", "name: \"a b\""));
        assert_eq!(e.field, "name", "{e}");
    }

    /// A scenario planning more cells than the bound is refused at the
    /// entry that passes it, before any cell is built.
    #[test]
    fn too_many_cells_are_refused_before_planning() {
        let sc = "name: t
fleet: [{name: a}, {name: b}, {name: c}, {name: d}]
workloads:
  - {kind: pgbench, scale: 1, transactions: 1, clients: [1, 2, 3, 4], replicas: 64}
  - {kind: pgbench, scale: 1, transactions: 1, clients: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], replicas: 64}
";
        let e = err(sc);
        assert_eq!(
            (e.line, e.field.as_str()),
            (5, "workloads[1].replicas"),
            "{e}"
        );
        assert!(e.message.contains("more than 5000 cells"), "{e}");
        let s = parse(Path::new("t.yaml"), &sc.replace("replicas: 64}\n  - {kind: pgbench, scale: 1, transactions: 1, clients: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], replicas: 64}", "replicas: 64}")).unwrap();
        assert_eq!(validate::cells_per_entry(&s), vec![4 * 4 * 64]);
        assert_eq!(plan(&s).len(), 1024);
        let e = validate::refuse_cells_over(&s, 500).unwrap_err();
        assert_eq!(e.field, "workloads[0].replicas");
    }

    /// A bloat larger than any table is refused with the scale it needs,
    /// up to the largest byte count a scenario can write (this overflowed
    /// once: the fuzz test found it).
    #[test]
    fn an_enormous_bloat_is_refused_not_overflowed() {
        let e = err(
            "name: t\nfleet:\n  - name: a\nworkloads:\n  - kind: vacuum-bloat\n    scale: 1\n    bloat_bytes: 18446744073709551615\n",
        );
        assert_eq!(e.field, "workloads[0].bloat_bytes", "{e}");
        assert!(e.message.contains("raise scale to at least"), "{e}");
    }

    /// `reuse_cluster` needs a kind that declares a reset, and a dataset
    /// to reuse; it reaches the plan's cells.
    #[test]
    fn reuse_cluster_is_refused_where_it_cannot_hold() {
        let e = err(&with(
            "    repeats: 5\n",
            "    repeats: 5\n    reuse_cluster: true\n",
        ));
        assert_eq!(
            (e.line, e.field.as_str()),
            (16, "workloads[0].reuse_cluster"),
            "{e}"
        );
        assert!(e.message.contains("declares no reset"), "{e}");
        let pgbench = |extra: &str| {
            format!(
                "name: t\nfleet:\n  - name: a\nworkloads:\n  - kind: pgbench\n    scale: 1\n    duration_s: 1\n    reuse_cluster: true\n{extra}"
            )
        };
        let e = err(&pgbench("    data: fresh\n"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (8, "workloads[0].reuse_cluster"),
            "{e}"
        );
        assert!(e.message.contains("choose one"), "{e}");
        let e = err(&pgbench("").replace("true", "sometimes"));
        assert_eq!(e.field, "workloads[0].reuse_cluster", "{e}");
        let s = parse(Path::new("ok.yaml"), &pgbench("")).unwrap();
        assert!(plan(&s).iter().all(|c| c.reuse_cluster));
    }

    /// Faults are checked where they are: their kind and keys, their
    /// place in the window, the driver, and (stall, degrade) the storage
    /// of every class the entry runs on; good ones reach the cells.
    #[test]
    fn faults_are_checked_and_bad_ones_are_located() {
        let scenario = |storage: &str, extra: &str, faults: &str| {
            format!(
                "name: t\nfleet:\n  - name: a\n    storage: {storage}\n  - name: b\n    storage: {{ profile: gp3 }}\n\
                 workloads:\n  - kind: pgbench\n    scale: 1\n    duration_s: 60\n{extra}    faults:\n{faults}"
            )
        };
        let gp3 = "{ profile: gp3 }";
        let ok = scenario(
            gp3,
            "",
            "      - { kind: crash, at_s: 20 }\n      - { kind: stall, at_s: 30, duration_s: 5 }\n      - { kind: degrade, at_s: 40, duration_s: 5, iops: 300 }\n      - { kind: degrade, at_s: 50, duration_s: 5, latency_ms: 20 }\n",
        );
        let s = parse(Path::new("ok.yaml"), &ok).unwrap();
        let cells = plan(&s);
        let Params::Pgbench(p) = &cells[0].params else {
            panic!("a pgbench cell")
        };
        assert_eq!(p.drive.faults.len(), 4);
        assert_eq!(
            p.drive.faults[2].label(),
            "degrade to 300 IOPS for 5 s at 40 s"
        );
        assert_eq!(
            p.drive.faults[3].label(),
            "degrade to 20 ms an I/O for 5 s at 50 s"
        );
        assert_eq!(p.drive.faults[3].latency_ms, 20.0);
        for (storage, extra, faults, line, field, says) in [
            (
                gp3,
                "",
                "      - { kind: reboot, at_s: 20 }\n",
                12,
                "workloads[0].faults[0].kind",
                "unknown fault kind `reboot`",
            ),
            (
                gp3,
                "",
                "      - { kind: crash }\n",
                12,
                "workloads[0].faults[0].at_s",
                "missing",
            ),
            (
                gp3,
                "",
                "      - { kind: crash, at_s: 60 }\n",
                12,
                "workloads[0].faults[0].at_s",
                "not within the measured window",
            ),
            (
                gp3,
                "",
                "      - { kind: crash, at_s: 1 }\n",
                12,
                "workloads[0].faults[0].at_s",
                "baseline",
            ),
            (
                gp3,
                "",
                "      - { kind: stall, at_s: 20 }\n",
                12,
                "workloads[0].faults[0].duration_s",
                "needs duration_s",
            ),
            (
                gp3,
                "",
                "      - { kind: crash, at_s: 20, duration_s: 3 }\n",
                12,
                "workloads[0].faults[0].duration_s",
                "no duration of its own",
            ),
            (
                gp3,
                "",
                "      - { kind: degrade, at_s: 20, duration_s: 3 }\n",
                12,
                "workloads[0].faults[0].iops",
                "needs its caps",
            ),
            (
                gp3,
                "",
                "      - { kind: stall, at_s: 20, duration_s: 3, iops: 5 }\n",
                12,
                "workloads[0].faults[0].iops",
                "degrade's cap",
            ),
            (
                gp3,
                "",
                "      - { kind: stall, at_s: 20, duration_s: 10 }\n      - { kind: crash, at_s: 25 }\n",
                13,
                "workloads[0].faults[1].at_s",
                "time order",
            ),
            (
                gp3,
                "    driver: pgbench\n",
                "      - { kind: crash, at_s: 20 }\n",
                13,
                "workloads[0].faults",
                "driver: pgfleet",
            ),
            (
                gp3,
                "",
                "      - { kind: checkpoint, at_s: 20, recovery_timeout_s: 5 }\n",
                12,
                "workloads[0].faults[0].recovery_timeout_s",
                "crash's recovery",
            ),
            (
                "{ profile: nvme }",
                "",
                "      - { kind: stall, at_s: 20, duration_s: 3 }\n",
                12,
                "workloads[0].faults[0].kind",
                "class `a` has none",
            ),
            (
                "{ profile: gp3, emulate: false }",
                "",
                "      - { kind: degrade, at_s: 20, duration_s: 3, mbps: 10 }\n",
                12,
                "workloads[0].faults[0].kind",
                "emulate: false",
            ),
            (
                "{ profile: custom, read_iops: 100 }",
                "",
                "      - { kind: degrade, at_s: 20, duration_s: 3, latency_ms: 5 }\n",
                12,
                "workloads[0].faults[0].latency_ms",
                "class `a` has storage `custom` without one",
            ),
            (
                gp3,
                "",
                "      - { kind: stall, at_s: 20, duration_s: 3, latency_ms: 5 }\n",
                12,
                "workloads[0].faults[0].latency_ms",
                "degrade's cap",
            ),
            (
                gp3,
                "",
                "      - { kind: degrade, at_s: 20, duration_s: 3, latency_ms: 0 }\n",
                12,
                "workloads[0].faults[0].latency_ms",
                "out of range",
            ),
        ] {
            let e = err(&scenario(storage, extra, faults));
            assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
            assert!(e.message.contains(says), "{says}: {e}");
        }
        // A partition cuts the roles of a drain; a script has none.
        let e = err(&scenario(
            gp3,
            "",
            "      - { kind: partition, at_s: 20, duration_s: 3 }\n",
        ));
        assert_eq!(e.field, "workloads[0].faults[0].kind", "{e}");
        assert!(
            e.message
                .contains("allowed here crash, checkpoint, stall, degrade"),
            "{e}"
        );
        let drain = |faults: &str| {
            format!(
                "name: t\nfleet:\n  - name: a\n    count: 2\nworkloads:\n  - kind: logical-drain\n    scale: 1\n    faults: [{faults}]\n"
            )
        };
        let e = err(&drain("{ kind: crash, at_s: 5 }"));
        assert!(e.message.contains("allowed here partition"), "{e}");
        let e = err(&drain("{ kind: partition, at_s: 5 }"));
        assert!(e.message.contains("needs duration_s"), "{e}");
        let s = parse(
            Path::new("ok.yaml"),
            &drain("{ kind: partition, at_s: 0.5, duration_s: 4 }"),
        )
        .unwrap();
        let Params::LogicalDrain(d) = &plan(&s)[0].params else {
            panic!("a drain cell")
        };
        assert_eq!(d.faults[0].label(), "partition 4 s at 0.5 s");
        // Counting transactions leaves nothing to place a fault in.
        let e = err(&scenario(gp3, "", "      - { kind: crash, at_s: 20 }\n")
            .replace("duration_s: 60", "transactions: 100"));
        assert!(e.message.contains("give duration_s"), "{e}");
        // On a class without caps, a crash and a checkpoint are fine; and an
        // entry `on:` the capped class may stall.
        let nvme = "{ profile: nvme }";
        parse(
            Path::new("ok.yaml"),
            &scenario(
                nvme,
                "",
                "      - { kind: crash, at_s: 20 }\n      - { kind: checkpoint, at_s: 40 }\n",
            ),
        )
        .unwrap();
        parse(
            Path::new("ok.yaml"),
            &scenario(
                nvme,
                "    on: [b]\n",
                "      - { kind: stall, at_s: 20, duration_s: 3 }\n",
            ),
        )
        .unwrap();
    }

    /// Prices resolve to a price per hour; a monthly price without its
    /// quantity, a negative one, or prices without a currency are refused
    /// where they are.
    #[test]
    fn prices_resolve_and_bad_ones_are_located() {
        let priced = |price: &str, currency: &str| {
            with(
                "    count: 1\n",
                &format!("    count: 1\n    price: {price}\n"),
            )
            .replacen("fleet:\n", &format!("{currency}fleet:\n"), 1)
        };
        let s = parse(
            Path::new("good.yaml"),
            &priced("{ instance_hour: 1.0, storage_gb_month: 0.08, storage_gb: 730, iops_month: 0.005, iops: 1460 }", "currency: USD\n"),
        )
        .unwrap();
        let (currency, prices) = s.prices().unwrap();
        assert_eq!(currency, "USD");
        let p = prices["local"];
        assert!(
            (p.storage - 0.08).abs() < 1e-12 && (p.iops - 0.01).abs() < 1e-12,
            "{p:?}"
        );
        assert!((p.per_hour() - 1.09).abs() < 1e-12);
        let e = err(&priced("{ instance_hour: 1.0 }", ""));
        assert_eq!((e.line, e.field.as_str()), (5, "currency"), "{e}");
        assert!(e.message.contains("currency: USD"), "{e}");
        let e = err(&priced("{ storage_gb_month: 0.08 }", "currency: USD\n"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (6, "fleet[0].price.storage_gb_month"),
            "{e}"
        );
        assert!(e.message.contains("`storage_gb`"), "{e}");
        let e = err(&priced("{ instance_hour: -1 }", "currency: USD\n"));
        assert_eq!(e.field, "fleet[0].price.instance_hour", "{e}");
        assert!(
            parse(Path::new("good.yaml"), GOOD)
                .unwrap()
                .prices()
                .is_none()
        );
    }

    /// A history check resolves its bound and window; a bad percentage,
    /// a window out of range or a min beside it is refused where it is.
    #[test]
    fn history_checks_resolve_and_bad_ones_are_located() {
        let check = |body: &str| {
            format!(
                "{GOOD}checks:\n  - name: h\n    history: {{ metric: latency_ms_p99, class: local{body} }}\n"
            )
        };
        let s = parse(
            Path::new("good.yaml"),
            &check(", max_drop: 5%, same_labels: [branch], vary: [synchronous_commit]"),
        )
        .unwrap();
        let c = &s.checks()[0];
        assert_eq!(
            c.history,
            Some(HistoryBound {
                window: 20,
                max_drop: 0.05,
                same_labels: vec!["branch".into()],
                vary: vec!["synchronous_commit".into()],
            })
        );
        let e = err(&check(", max_drop: 5%, vary: [\"Sync Commit\"]"));
        assert_eq!(e.field, "checks[0].history.vary", "{e}");
        assert!(
            e.message.contains("is not a PostgreSQL setting name"),
            "{e}"
        );
        assert_eq!((c.min, c.max), (None, None));
        let e = err(&check(", max_drop: lots"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (18, "checks[0].history.max_drop"),
            "{e}"
        );
        assert!(e.message.contains("e.g. `5%`"), "{e}");
        let e = err(&check(", max_drop: 5%, window: 2"));
        assert_eq!(e.field, "checks[0].history.window", "{e}");
        let e = err(&check(", max_drop: 5%, same_labels: [\"a b\"]"));
        assert_eq!(e.field, "checks[0].history.same_labels", "{e}");
        let e = err(&format!("{}    min: 1\n", check(", max_drop: 5%")));
        assert_eq!((e.line, e.field.as_str()), (19, "checks[0].min"), "{e}");
    }

    #[test]
    fn the_good_scenario_plans_resolved_offsets_and_settings() {
        let s = parse(Path::new("good.yaml"), GOOD).unwrap();
        let cells = plan(&s);
        assert_eq!(cells.len(), 1);
        let Params::ToastSlice(p) = &cells[0].params else {
            panic!("{:?}", cells[0].params)
        };
        let bytes: Vec<u64> = p.offsets.iter().map(|o| o.byte).collect();
        assert_eq!(bytes, vec![1, 5_242_881, 9_437_185]);
        assert_eq!(cells[0].settings["max_connections"], "50");
        assert_eq!(cells[0].settings["shared_buffers"], "128MB");
    }

    /// Settings that run commands, load code or name host files are refused
    /// where written, naming the setting, unless every workload on the
    /// class has allow_shell; `serve` then refuses allow_shell itself.
    #[test]
    fn settings_that_act_on_the_host_need_allow_shell() {
        for (k, v) in [
            ("archive_command", "'id > /tmp/x; true'"),
            ("shared_preload_libraries", "evil"),
            ("ssl_passphrase_command", "id"),
            ("external_pid_file", "/etc/x"),
            ("Dynamic_Library_Path", "/tmp"),
        ] {
            let e = err(&with(
                "max_connections: 50",
                &format!("max_connections: 50, {k}: {v}"),
            ));
            assert_eq!(
                (e.line, e.field.as_str()),
                (6, format!("fleet[0].postgres.settings.{k}").as_str()),
                "{e}"
            );
            assert!(
                e.message.contains(k) && e.message.contains("allow_shell"),
                "{e}"
            );
        }
        let e = err(&with(
            "max_connections: 50",
            "max_connections: 50, logging_collector: on",
        ));
        assert!(e.message.contains("managed by pgfleet"), "{e}");
        // A pgbench entry with allow_shell may; the shell refusal names it.
        let sc = "name: t
fleet:
  - name: local
    postgres: { settings: { archive_command: 'cp %p /archive/%f' } }
workloads:
  - kind: pgbench
    scale: 1
    script_text: \"SELECT 1;\"
    transactions: 1
    allow_shell: true
";
        let ok = parse(Path::new("shell.yaml"), sc).unwrap();
        let e = ok.shell_refusal(Path::new("shell.yaml")).unwrap();
        assert_eq!(
            (e.line, e.field.as_str()),
            (10, "workloads[0].allow_shell"),
            "{e}"
        );
        assert!(e.message.contains("--allow-shell-scenarios"), "{e}");
        assert!(
            parse(Path::new("good.yaml"), GOOD)
                .unwrap()
                .shell_refusal(Path::new("g"))
                .is_none()
        );
        // ... but not when another workload on the class does not.
        let mixed = format!("{sc}  - kind: pgbench-init\n    scale: 1\n");
        let e = parse(Path::new("shell.yaml"), &mixed).unwrap_err();
        assert_eq!(e.field, "fleet[0].postgres.settings.archive_command", "{e}");
    }

    /// Every scenario under scenarios/ (found by walking the directory, so a
    /// new one cannot be forgotten) loads, validates and plans cells; all
    /// but the break-in corpus (`scenarios/attacks/`).
    #[test]
    fn shipped_scenarios_are_valid() {
        fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                // The break-in corpus is refused or contained on purpose
                // (controller/tests/security.rs runs it).
                if p.is_dir() && !p.ends_with("attacks") {
                    walk(&p, out);
                } else if p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                    out.push(p);
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let mut files = Vec::new();
        walk(&root, &mut files);
        files.sort();
        assert!(files.len() >= 14, "{files:?}");
        for path in &files {
            let s = load(path).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                !crate::plan::plan(&s).is_empty(),
                "{}: plans no cell",
                path.display()
            );
        }
    }

    #[test]
    fn unknown_key() {
        let e = err(&with("    slice_bytes: 100", "    slice_byte: 100"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (13, "workloads[0].slice_byte"),
            "{e}"
        );
        assert!(e.to_string().starts_with("bad.yaml:13:"), "{e}");
        assert!(
            e.message.contains("unknown field") && e.message.contains("slice_bytes"),
            "{e}"
        );
    }

    #[test]
    fn unknown_top_level_key() {
        let e = err(&format!("{GOOD}extra: 1\n"));
        assert_eq!(e.line, 16, "{e}");
        assert!(e.message.contains("extra"), "{e}");
    }

    #[test]
    fn a_key_that_starts_with_value_keeps_its_name_in_the_path() {
        let e = err(&with("value_bytes: 10485760", "value_bytes: 1MiB"));
        assert_eq!(e.field, "workloads[0].value_bytes", "{e}");
        assert_eq!(
            clean_path("workloads.value[0].value.offsets.value[1]"),
            "workloads[0].offsets[1]"
        );
    }

    #[test]
    fn wrong_type() {
        let e = err(&with("repeats: 5", "repeats: five"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (15, "workloads[0].repeats"),
            "{e}"
        );
    }

    #[test]
    fn negative_number_for_unsigned() {
        let e = err(&with("count: 1", "count: -1"));
        assert_eq!((e.line, e.field.as_str()), (4, "fleet[0].count"), "{e}");
    }

    #[test]
    fn out_of_range() {
        let e = err(&with("repeats: 5", "repeats: 0"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (15, "workloads[0].repeats"),
            "{e}"
        );
        assert!(e.message.contains("allowed 1..=1000"), "{e}");
        let e = err(&with("duration_s: 5", "duration_s: 0"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (14, "workloads[0].duration_s"),
            "{e}"
        );
        let e = err(&with("slice_bytes: 100", "slice_bytes: 20000000"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (13, "workloads[0].slice_bytes"),
            "{e}"
        );
    }

    #[test]
    fn unknown_enum_value() {
        let e = err(&with("[external, pglz, lz4]", "[external, zstd, lz4]"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (9, "workloads[0].storage_modes[1]"),
            "{e}"
        );
        assert!(e.message.contains("allowed external, pglz, lz4"), "{e}");
        let e = err(&with("datasets: [mixed]", "datasets: [random]"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (10, "workloads[0].datasets[0]"),
            "{e}"
        );
        let e = err(&with("kind: toast-slice", "kind: toast-slicer"));
        assert_eq!((e.line, e.field.as_str()), (8, "workloads[0].kind"), "{e}");
    }

    #[test]
    fn bad_offsets() {
        let e = err(&with("\"50%\"", "\"150%\""));
        assert_eq!(
            (e.line, e.field.as_str()),
            (12, "workloads[0].offsets[1]"),
            "{e}"
        );
        let e = err(&with("9437185", "99999999"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (12, "workloads[0].offsets[2]"),
            "{e}"
        );
        assert!(e.message.contains("outside the value"), "{e}");
        let e = err(&with("\"50%\"", "\"half\""));
        assert_eq!(e.field, "workloads[0].offsets[1]", "{e}");
    }

    #[test]
    fn fleet_errors() {
        let e = err(&with("profile: nvme", "profile: ebs"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (5, "fleet[0].storage.profile"),
            "{e}"
        );
        assert!(e.message.contains("allowed nvme, gp3, custom"), "{e}");
        let e = err(&with("profile: nvme }", "profile: gp3, write_iops: 10 }"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (5, "fleet[0].storage.write_iops"),
            "{e}"
        );
        let e = err(&with("profile: nvme", "profile: custom"));
        assert!(e.message.contains("needs at least one of"), "{e}");
        let e = err(&with("profile: nvme }", "profile: custom, write_iops: 0 }"));
        assert_eq!(e.field, "fleet[0].storage.write_iops", "{e}");
        let e = err(&with("profile: nvme }", "profile: gp3, emulate: maybe }"));
        assert_eq!(e.field, "fleet[0].storage.emulate", "{e}");
        let ok = parse(
            Path::new("x"),
            &with(
                "profile: nvme }",
                "profile: custom, write_iops: 300, emulate: false }",
            ),
        )
        .unwrap();
        assert_eq!(ok.fleet.value[0].caps().write_iops, 300);
        assert!(!ok.fleet.value[0].emulate());
        // Published profiles, scaled like the instance: both sides of an
        // A/B from AWS's figures.
        let caps = |storage: &str| {
            parse(Path::new("x"), &with("profile: nvme }", storage))
                .unwrap()
                .fleet
                .value[0]
                .caps()
        };
        let nvme = caps("profile: nvme, instance_store: m6id.4xlarge, scale: 0.125 }");
        assert_eq!(
            (nvme.read_iops, nvme.write_iops, nvme.read_mbps),
            (33_542, 16_771, 0)
        );
        let gp3 = caps("profile: gp3, scale: 0.125 }");
        assert_eq!(
            (gp3.read_iops, gp3.write_iops, gp3.read_mbps),
            (375, 375, 125)
        );
        assert_eq!(caps("profile: nvme }"), Caps::default());
        let e = err(&with(
            "profile: nvme }",
            "profile: nvme, instance_store: m6i.4xlarge }",
        ));
        assert_eq!(e.field, "fleet[0].storage.instance_store", "{e}");
        assert!(
            e.message
                .contains("no published figures for `m6i.4xlarge`: allowed m6id.large"),
            "{e}"
        );
        let e = err(&with(
            "profile: nvme }",
            "profile: gp3, instance_store: m6id.large }",
        ));
        assert!(e.message.contains("use `profile: nvme`"), "{e}");
        let e = err(&with("profile: nvme }", "profile: nvme, scale: 0.5 }"));
        assert!(
            e.field.ends_with("storage.scale") && e.message.contains("published profile"),
            "{e}"
        );
        let e = err(&with("profile: nvme }", "profile: gp3, scale: 2 }"));
        assert!(e.message.contains("2 is out of range"), "{e}");
        // gp3 provisioned above its baseline, within what AWS sells.
        let gp3 = caps("profile: gp3, iops: 16000, mbps: 1000 }");
        assert_eq!((gp3.read_iops, gp3.write_mbps), (16_000, 1000));
        let e = err(&with("profile: nvme }", "profile: gp3, iops: 20000 }"));
        assert!(
            e.field.ends_with("storage.iops") && e.message.contains("3000..=16000"),
            "{e}"
        );
        let e = err(&with("profile: nvme }", "profile: nvme, mbps: 500 }"));
        assert!(e.message.contains("profile `gp3`'s"), "{e}");
        let e = err(&with("shared_buffers: 128MB", "port: 5433"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (6, "fleet[0].postgres.settings.port"),
            "{e}"
        );
        let e = err(&with("name: local", "name: Local Box"));
        assert_eq!((e.line, e.field.as_str()), (3, "fleet[0].name"), "{e}");
        let e = err(&with("count: 1", "count: 1000"));
        assert_eq!((e.line, e.field.as_str()), (4, "fleet[0].count"), "{e}");
        // The instance: a label, memory and CPUs, each checked where written.
        let ok = parse(
            Path::new("x"),
            &with(
                "count: 1",
                "count: 1\n    instance: { type: m6id.4xlarge, memory: 384MiB, cpus: 2 }",
            ),
        )
        .unwrap();
        let i = ok.fleet.value[0].instance();
        assert_eq!(
            (i.instance_type.as_str(), i.memory_bytes, i.cpus, i.emulate),
            ("m6id.4xlarge", 384 << 20, 2, true)
        );
        let e = err(&with(
            "count: 1",
            "count: 1\n    instance: { memory: 16MiB }",
        ));
        assert_eq!(
            (e.line, e.field.as_str()),
            (5, "fleet[0].instance.memory"),
            "{e}"
        );
        assert!(e.message.contains("at least 64MiB"), "{e}");
        let e = err(&with("count: 1", "count: 1\n    instance: { cpus: 0 }"));
        assert_eq!(e.field, "fleet[0].instance.cpus", "{e}");
        let e = err(&with(
            "count: 1",
            "count: 1\n    instance: { type: \"m6id 4xlarge\" }",
        ));
        assert_eq!(e.field, "fleet[0].instance.type", "{e}");
        let e = err(&with("count: 1", "count: 1\n    instance: { ram: 1GiB }"));
        assert_eq!(e.field, "fleet[0].instance.ram", "{e}");
    }

    #[test]
    fn missing_required_field() {
        let e = err(&with("name: t\n", ""));
        assert!(e.message.contains("name"), "{e}");
        assert!(e.line >= 1, "{e}");
    }

    #[test]
    fn yaml_syntax_error() {
        let e = err(&with("datasets: [mixed]", "datasets: [mixed"));
        assert!(e.line >= 10, "{e}");
    }

    const PGBENCH: &str = "name: p
fleet:
  - name: local
    count: 2
workloads:
  - kind: pgbench
    scale: 2
    script: random-update
    clients: 4
    threads: 2
    duration_s: 10
    replicas: 2
";

    #[test]
    fn pgbench_plans_replicas_with_the_driver_parameters() {
        let s = parse(Path::new("p.yaml"), PGBENCH).unwrap();
        let cells = plan(&s);
        let ids: Vec<&str> = cells.iter().map(|c| c.cell_id.as_str()).collect();
        assert_eq!(
            ids,
            ["w0-local-random-update-r1", "w0-local-random-update-r2"]
        );
        let Params::Pgbench(p) = &cells[0].params else {
            panic!("{:?}", cells[0].params)
        };
        assert_eq!((p.init.scale, p.drive.clients, p.drive.threads), (2, 4, 2));
        assert_eq!(p.drive.duration_s, Some(10.0));
        assert_eq!(p.drive.max_tries, 10);
        // Typed on the wire: a float stays a float, an integer an integer.
        let json = cells[0].params.to_json();
        assert!(json.contains("\"duration_s\":10.0"), "{json}");
        assert!(json.contains("\"scale\":2,"), "{json}");
        assert_eq!(
            Params::from_json("pgbench", &json).unwrap(),
            cells[0].params
        );
    }

    /// `duration_s: auto` measures until the window is steady, at most
    /// `max_duration_s` (600 by default): the plan's cells carry the
    /// longest window (their estimate is the worst case).
    #[test]
    fn duration_auto_runs_until_steady_within_its_longest() {
        let plan_of = |text: &str| {
            let cells = plan(&parse(Path::new("p.yaml"), text).unwrap());
            let Params::Pgbench(p) = &cells[0].params else {
                panic!()
            };
            p.drive.clone()
        };
        let d = plan_of(&PGBENCH.replace("duration_s: 10", "duration_s: auto"));
        assert!(d.until_steady);
        assert_eq!(d.duration_s, Some(600.0));
        assert!(d.check().is_ok());
        let d =
            plan_of(&PGBENCH.replace("duration_s: 10", "duration_s: auto\n    max_duration_s: 90"));
        assert_eq!((d.until_steady, d.duration_s), (true, Some(90.0)));
        assert!(!plan_of(PGBENCH).until_steady);
        // Beside seconds (a sweep of both) it has no effect.
        let d = plan_of(&PGBENCH.replace(
            "duration_s: 10",
            "duration_s: [10, auto]\n    max_duration_s: 90",
        ));
        assert_eq!((d.until_steady, d.duration_s), (false, Some(10.0)));
        for (bad, field, says) in [
            ("duration_s: soon", "duration_s", "`soon` is not a duration"),
            (
                "duration_s: auto\n    max_duration_s: 5",
                "max_duration_s",
                "out of range",
            ),
            (
                "duration_s: auto\n    driver: pgbench",
                "duration_s",
                "pgbench (-T) cannot",
            ),
            (
                "duration_s: auto\n    faults: [{kind: checkpoint, at_s: 5}]",
                "duration_s",
                "window of known length",
            ),
        ] {
            let e = err(&PGBENCH.replace("duration_s: 10", bad));
            assert_eq!(e.field, format!("workloads[0].{field}"), "{bad}: {e}");
            assert!(e.message.contains(says), "{bad}: {e}");
            let line = if field == "duration_s" { 11 } else { 12 };
            assert_eq!(e.line, line, "{bad}: located: {e}");
        }
    }

    /// A list sweeps a key: one cell per point, the first key outermost,
    /// each point checked by the kind with errors at the element.
    #[test]
    fn sweeps_expand_into_points_checked_one_by_one() {
        let swept = PGBENCH
            .replace("    scale: 2\n", "    scale: [2, 3]\n")
            .replace("    clients: 4\n", "    clients:\n      - 2\n      - 8\n")
            .replace("    replicas: 2\n", "");
        let s = parse(Path::new("p.yaml"), &swept).unwrap();
        assert_eq!(s.sweeps[0].to_string(), "scale [2, 3] × clients [2, 8]");
        let cells = plan(&s);
        let got: Vec<(&str, u64, u32)> = cells
            .iter()
            .map(|c| {
                let Params::Pgbench(p) = &c.params else {
                    panic!()
                };
                (c.cell_id.as_str(), p.init.scale, p.drive.clients)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("w0-local-random-update-scale2-clients2", 2, 2),
                ("w0-local-random-update-scale2-clients8", 2, 8),
                ("w0-local-random-update-scale3-clients2", 3, 2),
                ("w0-local-random-update-scale3-clients8", 3, 8),
            ]
        );
        assert_eq!(
            cells[3].point,
            [("scale".into(), "3".into()), ("clients".into(), "8".into())]
        );
        let describe = plan::describe(&s, &cells, Path::new("p.yaml"));
        assert!(
            describe
                .contains("workloads[0] sweeps scale [2, 3] × clients [2, 8]: 4 points, 4 cells"),
            "{describe}"
        );

        // A point the kind refuses: located at its element (threads 2 > clients 1).
        let e = err(&swept.replace("      - 2\n", "      - 1\n"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (12, "workloads[0].threads"),
            "{e}"
        );
        assert!(
            e.message
                .ends_with("(at the sweep's point scale 2, clients 1)"),
            "{e}"
        );
        let e = err(&swept.replace("      - 8\n", "      - 0\n"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (11, "workloads[0].clients"),
            "{e}"
        );
        assert!(e.message.contains("out of range"), "{e}");
        let e = err(&swept.replace("[2, 3]", "[2, 2]"));
        assert_eq!(e.field, "workloads[0].scale");
        assert!(e.message.contains("`2` is listed twice"), "{e}");
        let e = err(&swept.replace("[2, 3]", "[]"));
        assert!(e.message.contains("an empty list sweeps nothing"), "{e}");
        let e = err(&swept.replace(
            "    duration_s: 10\n",
            "    duration_s: 10\n    warmup_s: [1, 2]\n",
        ));
        assert_eq!(e.field, "workloads[0].warmup_s");
        assert!(
            e.message.contains("`warmup_s` takes one value, not a list")
                && e.message.contains("scale, fillfactor, partitions, clients"),
            "{e}"
        );
        let big = format!(
            "[{}]",
            (1..=200)
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let e = err(&swept.replace("[2, 3]", &big));
        assert!(
            e.message
                .contains("400 points (200 scale × 2 clients): at most 256"),
            "{e}"
        );

        // Checks pick a point with `at`; a key or value not swept is refused.
        let check = |at: &str| {
            format!(
                "{swept}checks:\n  - name: c\n    metric: {{name: tps, class: local}}\n    min: 1\n    at: {at}\n"
            )
        };
        let s = parse(Path::new("p.yaml"), &check("{clients: 8}")).unwrap();
        let c = &s.checks()[0];
        assert_eq!(c.at, [("clients".to_string(), serde_json::json!(8))]);
        assert!(
            c.applies_to(
                Some(0),
                serde_json::json!({"clients": 8, "scale": 2})
                    .as_object()
                    .unwrap()
            )
        );
        assert!(
            !c.applies_to(
                Some(0),
                serde_json::json!({"clients": 2, "scale": 2})
                    .as_object()
                    .unwrap()
            )
        );
        let e = err(&check("{clients: 64}"));
        assert_eq!(e.field, "checks[0].at.clients");
        assert!(
            e.message
                .contains("64 is not a point of the sweep: workloads[0] sweeps clients over 2, 8"),
            "{e}"
        );
        let e = err(&check("{threads: 2}"));
        assert!(
            e.message.contains(
                "`threads` is not swept by the entries checked: they sweep clients, scale"
            ),
            "{e}"
        );
    }

    #[test]
    fn keys_of_another_kind_are_rejected() {
        let e = err(&PGBENCH.replace("    clients: 4", "    repeats: 4"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (9, "workloads[0].repeats"),
            "{e}"
        );
        assert!(
            e.message.contains("unknown field `repeats`") && e.message.contains("clients"),
            "{e}"
        );
        let e = err(&with("    repeats: 5", "    scale: 5"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (15, "workloads[0].scale"),
            "{e}"
        );
    }

    #[test]
    fn pgbench_errors() {
        let e = err(&PGBENCH.replace("random-update", "random-upd"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (8, "workloads[0].script"),
            "{e}"
        );
        assert!(e.message.contains("allowed tpcb-like"), "{e}");
        let e = err(&PGBENCH.replace("threads: 2", "threads: 8"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (10, "workloads[0].threads"),
            "{e}"
        );
        let e = err(&PGBENCH.replace("    scale: 2\n", ""));
        assert_eq!(e.field, "workloads[0].scale", "{e}");
        let e = err(&PGBENCH.replace("duration_s: 10", "duration_s: 10\n    transactions: 5"));
        assert!(e.message.contains("not both"), "{e}");
        let e = err(&PGBENCH.replace("duration_s: 10", "duration_s: 2.5\n    driver: pgbench"));
        assert_eq!(e.field, "workloads[0].duration_s", "{e}");
        assert!(e.message.contains("whole seconds"), "{e}");
        let e = err(&PGBENCH.replace(
            "script: random-update",
            "script_text: \"\\\\set aid rnd(1, 2)\\nSELECT :aid;\"",
        ));
        assert_eq!(
            (e.line, e.field.as_str()),
            (8, "workloads[0].script_text"),
            "{e}"
        );
        assert!(
            e.message
                .contains("script_text:1: unexpected function name (rnd) in command \"set\""),
            "{e}"
        );
        // In a block scalar, the error points at the script's own line.
        let e = err(&PGBENCH.replace(
            "script: random-update",
            "script_text: |  # two commands\n      SELECT 1;\n      \\set aid rnd(1, 2)\n      SELECT :aid;",
        ));
        assert_eq!((e.line, e.column), (10, 7), "{e}");
        assert!(e.message.starts_with("script_text:2: "), "{e}");
        assert!(block_scalar_header("a: |-\nb: >+2 # c\nc: '|'\n- |\n", 1));
        assert!(block_scalar_header("a: |-\nb: >+2 # c\nc: '|'\n- |\n", 2));
        assert!(!block_scalar_header("a: |-\nb: >+2 # c\nc: '|'\n- |\n", 3));
        assert!(block_scalar_header("a: |-\nb: >+2 # c\nc: '|'\n- |\n", 4));
        let e = err(&PGBENCH.replace("replicas: 2", "replicas: 0"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (12, "workloads[0].replicas"),
            "{e}"
        );
    }

    const VACUUM: &str = "name: v
fleet:
  - name: local
workloads:
  - scale: 10
    bloat_bytes: 64MiB
    kind: vacuum-bloat
    index_cleanup: \"off\"
    parallel: 2
";

    #[test]
    fn vacuum_plans_its_options_with_kind_anywhere_in_the_entry() {
        let s = parse(Path::new("v.yaml"), VACUUM).unwrap();
        let cells = plan(&s);
        assert_eq!(cells[0].cell_id, "w0-local-bloat-64MiB");
        let Params::VacuumBloat(p) = &cells[0].params else {
            panic!("{:?}", cells[0].params)
        };
        assert_eq!(p.bloat_bytes, 64 << 20);
        assert_eq!(
            p.vacuum_sql(),
            "VACUUM (INDEX_CLEANUP OFF, VERBOSE, PARALLEL 2) pgbench_accounts"
        );
        // Load, bloat and VACUUM take time; the disk holds data, bloat and WAL.
        let e = cells[0].estimate();
        assert!(
            e.seconds > e.measured_seconds && e.measured_seconds > 0.0,
            "{e:?}"
        );
        assert!(e.disk_bytes > (10 * 13) << 20, "{e:?}");
    }

    #[test]
    fn vacuum_errors() {
        let e = err(&VACUUM.replace("\"off\"", "sometimes"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (8, "workloads[0].index_cleanup"),
            "{e}"
        );
        assert!(e.message.contains("allowed auto, on, off"), "{e}");
        let e = err(&VACUUM.replace("64MiB", "1GiB"));
        assert_eq!(
            (e.line, e.field.as_str()),
            (6, "workloads[0].bloat_bytes"),
            "{e}"
        );
        assert!(e.message.contains("raise scale to at least"), "{e}");
        let e = err(&VACUUM.replace("64MiB", "64 parsecs"));
        assert!(e.message.contains("unknown unit"), "{e}");
        let e = err(&VACUUM.replace("parallel: 2", "parallel: 2000"));
        assert_eq!(e.field, "workloads[0].parallel", "{e}");
        let e = err(&VACUUM.replace("    kind: vacuum-bloat\n", ""));
        assert!(e.message.contains("missing field `kind`"), "{e}");
        assert!(e.message.contains("vacuum-bloat"), "{e}");
        let e = err(&VACUUM.replace("parallel: 2", "verbose: loudly"));
        assert_eq!(e.field, "workloads[0].verbose", "{e}");
    }

    const DRAIN: &str = "name: d
fleet:
  - name: nvme
    count: 2
  - name: gp3
    count: 1
workloads:
  - kind: logical-drain
    on: [nvme]
    scale: 2
    backlog_bytes: 64MiB
";

    #[test]
    fn drain_cells_have_two_roles_placed_by_class() {
        let s = parse(Path::new("d.yaml"), DRAIN).unwrap();
        let cells = plan(&s);
        assert_eq!(cells.len(), 1);
        assert_eq!(
            cells[0].roles,
            vec![
                ("subscriber".to_string(), "nvme".to_string()),
                ("publisher".to_string(), "nvme".to_string())
            ]
        );
        // The kind sets what logical replication needs, per role.
        let pubs = cells[0].params.settings("publisher");
        assert!(
            pubs.contains(&("wal_level", "logical".to_string())),
            "{pubs:?}"
        );
        let s = parse(
            Path::new("d.yaml"),
            &DRAIN.replace(
                "    scale: 2",
                "    scale: 2\n    roles: { subscriber: gp3 }",
            ),
        )
        .unwrap();
        assert_eq!(plan(&s)[0].roles[0], ("subscriber".into(), "gp3".into()));
    }

    #[test]
    fn drain_errors() {
        // A class with fewer agents than the cell has roles.
        let e = err(&DRAIN.replace("on: [nvme]", "on: [gp3]"));
        assert_eq!((e.line, e.field.as_str()), (8, "workloads[0].kind"), "{e}");
        assert!(
            e.message.contains("needs 2 agents of class `gp3`")
                && e.message.contains("the fleet has 1"),
            "{e}"
        );
        let e = err(&DRAIN.replace("    scale: 2", "    scale: 2\n    roles: { leader: gp3 }"));
        assert_eq!(e.field, "workloads[0].roles.leader", "{e}");
        assert!(e.message.contains("allowed subscriber, publisher"), "{e}");
        let e = err(&DRAIN.replace(
            "    scale: 2",
            "    scale: 2\n    roles: { publisher: ebs }",
        ));
        assert_eq!(e.field, "workloads[0].roles.publisher", "{e}");
        let e = err(&DRAIN.replace("64MiB", "0.5MiB"));
        assert_eq!(e.field, "workloads[0].backlog_bytes", "{e}");
        // Roles of a single-role kind.
        let e = err(&VACUUM.replace("parallel: 2", "roles: { publisher: local }"));
        assert!(e.message.contains("has one role"), "{e}");
    }

    #[test]
    fn a_storage_comparison_whose_data_fits_in_memory_is_warned_about() {
        let sc = |instance: &str| {
            format!(
                "name: w
fleet:
  - name: nvme
  - name: gp3
    storage: {{ profile: gp3 }}{instance}
workloads:
  - kind: pgbench
    scale: 64
    script: random-update
"
            )
        };
        let host = 24u64 << 30;
        // Scale 64 (~1 GiB) in this host's 24 GiB: warned, naming the class.
        let s = parse(Path::new("w.yaml"), &sc("")).unwrap();
        let w = plan::warnings(&s, &plan(&s), host);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("class `gp3`") && w[0].contains("this host's memory"),
            "{w:?}"
        );
        // In a 128 MiB instance: 7.6x the memory, no warning.
        let s = parse(
            Path::new("w.yaml"),
            &sc("\n    instance: { memory: 128MiB }"),
        )
        .unwrap();
        assert!(plan::warnings(&s, &plan(&s), host).is_empty());
        // Not emulated: the host's memory counts again.
        let s = parse(
            Path::new("w.yaml"),
            &sc("\n    instance: { memory: 128MiB, emulate: false }"),
        )
        .unwrap();
        assert_eq!(plan::warnings(&s, &plan(&s), host).len(), 1);
    }

    /// read-write's OS-cache scan of a table larger than the class's memory
    /// is a cold read: warned with both sizes (seeds/004's 2.6 GB table in a
    /// 1 GiB instance, as a user ran it).
    #[test]
    fn an_os_cache_read_that_cannot_be_cached_is_warned_about() {
        let sc = |rows: &str| {
            format!(
                "name: w
fleet:
  - name: local
    instance: {{ memory: 1GiB }}
workloads:
  - kind: read-write
    rows: {rows}
    tests: [seq-cold, seq-os-cache]
"
            )
        };
        let host = 24u64 << 30;
        let s = parse(Path::new("w.yaml"), &sc("5000000")).unwrap();
        let w = plan::warnings(&s, &plan(&s), host);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("class `local`")
                && w[0].contains("read-write reads ~")
                && w[0].contains("the instance's memory (1.0 GiB)")
                && w[0].contains("cold read"),
            "{w:?}"
        );
        let s = parse(Path::new("w.yaml"), &sc("500000")).unwrap();
        assert!(plan::warnings(&s, &plan(&s), host).is_empty());
    }

    #[test]
    fn unreadable_file_names_it() {
        let e = load(Path::new("/nonexistent/x.yaml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/x.yaml: cannot read"),
            "{e}"
        );
    }
}
