//! The controller's Prometheus metrics: one `Metrics` on one registry,
//! built with the service and passed down (no globals), served at
//! `/metrics` by `serve` (and `pgfleet run --metrics-addr`).
//!
//! Fleet and scheduler: agents by class and state, runs by status, cells
//! of each run by state, cell durations, agent losses and reconnects, and
//! how long agents' messages wait before the scheduler handles them.
//! PostgreSQL's own figures, merged by the controller from the per-second
//! `pg_stat` samples the agents stream while they measure: transactions,
//! block reads and their time, WAL bytes, syncs and their time, checkpoints,
//! the cluster's own device's requests and bytes (where it has one),
//! and the wait events of active backends — labelled `scenario`, `run_id`,
//! `instance_class`, `storage_profile`, `workload`, `postgres_version`
//! (the major version the agent runs; no per-cell or
//! per-client label). A finished cell's figures, as its kind declares them
//! (`KindInfo::compared`: name, unit, direction), are `pgfleet_cell_result`.
//! A run's series leave `/metrics` a retention period after it ends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use pgfleet_proto::workload::{Better, Kind, Metric};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use serde_json::Value as Json;

/// The labels `pgfleet_cell_result` adds to a run's.
const RESULT_LABELS: &[&str] = &["entry", "point", "metric", "unit", "better"];

/// The labels of a run's workload series.
pub const RUN_LABELS: &[&str] = &[
    "scenario",
    "run_id",
    "instance_class",
    "storage_profile",
    "workload",
    "postgres_version",
];

/// A run series' label values, in `RUN_LABELS`' order.
pub type RunLabels<'a> = [&'a str; 6];

pub struct Metrics {
    registry: Registry,
    pub agents: IntGaugeVec,
    pub runs: IntGaugeVec,
    pub cells: IntGaugeVec,
    pub cell_seconds: HistogramVec,
    pub agent_losses: IntCounterVec,
    pub agent_reconnects: IntCounterVec,
    pub message_wait: Histogram,
    transactions: IntCounterVec,
    rollbacks: IntCounterVec,
    blocks_read: IntCounterVec,
    block_read_seconds: prometheus::CounterVec,
    wal_bytes: IntCounterVec,
    wal_syncs: IntCounterVec,
    wal_sync_seconds: prometheus::CounterVec,
    checkpoints: IntCounterVec,
    device_ios: IntCounterVec,
    device_bytes: IntCounterVec,
    waits: prometheus::GaugeVec,
    driver_transactions: IntCounterVec,
    driver_failures: IntCounterVec,
    driver_latency: CountedHistogramVec,
    vacuum_blocks: IntGaugeVec,
    replication_lag: IntGaugeVec,
    toast_latency: prometheus::GaugeVec,
    /// A finished cell's compared figures, per point and declared metric.
    cell_results: prometheus::GaugeVec,
    /// 1 for each running cell's current phase (what dashboards draw as
    /// annotations); a cell's series goes when it ends.
    cell_phase: IntGaugeVec,
    /// Time cells spent in each phase, by class, workload and phase.
    pub phase_seconds: HistogramVec,
    /// The phase series each run's cells have: (labels of the series, since).
    phases: Mutex<BTreeMap<String, BTreeMap<String, PhaseSeries>>>,
    /// The label sets each run used, to remove its series after it ends.
    series: Mutex<BTreeMap<String, BTreeSet<Vec<String>>>>,
    /// Wait events seen per run's label set.
    wait_events: Mutex<BTreeMap<Vec<String>, BTreeSet<String>>>,
    /// Failure classes seen per run's label set.
    failure_classes: Mutex<BTreeMap<Vec<String>, BTreeSet<String>>>,
    /// (storage mode, offset) points of toast-slice per run's label set.
    toast_points: Mutex<BTreeMap<Vec<String>, BTreeSet<ToastPoint>>>,
    /// The kind and the point labels of the results per run's label set.
    result_points: Mutex<BTreeMap<Vec<String>, ResultPoints>>,
}

/// A running cell's phase series: its labels, and since when.
type PhaseSeries = (Vec<String>, std::time::Instant);

/// A label set's results: its kind, the `point` labels it has and the
/// `entry` labels.
type ResultPoints = (Kind, BTreeSet<String>, BTreeSet<String>);

/// A toast-slice point: (storage mode, offset).
type ToastPoint = (String, String);

/// Transaction latency buckets (seconds): from 50 µs to 10 s, so both a
/// 0.05 ms NVMe read and a 50 ms stall are resolved.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// The most a live second may add to a counter or a bucket: an agent
/// claiming more (10^9 transactions in one second of one cluster is far
/// beyond any server) is clamped, so one message cannot poison a series.
const MAX_LIVE_COUNT: u64 = 1_000_000_000;
/// The largest per-second delta of a `pg_stat` sample taken (bytes included:
/// 1 TB of WAL a second is beyond any device).
const MAX_SAMPLE_DELTA: f64 = 1e12;
/// The most latency buckets one live second is read for (the driver sends
/// at most a few dozen).
const MAX_LIVE_BUCKETS: usize = 512;

/// A histogram family that takes a count per observed value: a live
/// second's bucket of 16,000 transactions is one update, not 16,000
/// `observe` calls (the `prometheus` crate's histograms take one at a time).
#[derive(Clone)]
pub struct CountedHistogramVec {
    desc: prometheus::core::Desc,
    bounds: Vec<f64>,
    series: std::sync::Arc<Mutex<HashMap<Vec<String>, CountedSeries>>>,
}

#[derive(Default)]
struct CountedSeries {
    /// Per upper bound (not cumulative), then +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl CountedHistogramVec {
    pub fn new(
        name: &str,
        help: &str,
        bounds: &[f64],
        labels: &[&str],
    ) -> prometheus::Result<Self> {
        let desc = prometheus::core::Desc::new(
            name.to_string(),
            help.to_string(),
            labels.iter().map(|l| l.to_string()).collect(),
            HashMap::new(),
        )?;
        Ok(CountedHistogramVec {
            desc,
            bounds: bounds.to_vec(),
            series: Default::default(),
        })
    }

    /// Adds `n` observations of `value` for each `(value, n)`.
    pub fn observe_many(&self, labels: &[&str], observed: &[(f64, u64)]) {
        let key: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        let mut all = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let s = all.entry(key).or_insert_with(|| CountedSeries {
            counts: vec![0; self.bounds.len() + 1],
            ..Default::default()
        });
        for &(v, n) in observed {
            let i = self.bounds.partition_point(|b| *b < v);
            s.counts[i] = s.counts[i].saturating_add(n);
            s.sum += v * n as f64;
            s.count = s.count.saturating_add(n);
        }
    }

    pub fn remove(&self, labels: &[String]) {
        let mut all = self.series.lock().unwrap_or_else(|p| p.into_inner());
        all.remove(labels);
    }
}

impl prometheus::core::Collector for CountedHistogramVec {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        use prometheus::proto;
        let all = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let mut metrics: Vec<proto::Metric> = all
            .iter()
            .map(|(values, s)| {
                let mut h = proto::Histogram::default();
                h.set_sample_count(s.count);
                h.set_sample_sum(s.sum);
                let mut cumulative = 0;
                h.set_bucket(
                    self.bounds
                        .iter()
                        .zip(&s.counts)
                        .map(|(b, n)| {
                            cumulative += n;
                            let mut bucket = proto::Bucket::default();
                            bucket.set_upper_bound(*b);
                            bucket.set_cumulative_count(cumulative);
                            bucket
                        })
                        .collect(),
                );
                let mut m = proto::Metric::from_label(
                    self.desc
                        .variable_labels
                        .iter()
                        .zip(values)
                        .map(|(k, v)| {
                            let mut p = proto::LabelPair::default();
                            p.set_name(k.clone());
                            p.set_value(v.clone());
                            p
                        })
                        .collect(),
                );
                m.set_histogram(h);
                m
            })
            .collect();
        // A stable order, as the crate's own vectors give.
        metrics.sort_by(|a, b| {
            let key = |m: &proto::Metric| -> Vec<String> {
                m.get_label()
                    .iter()
                    .map(|l| l.value().to_string())
                    .collect()
            };
            key(a).cmp(&key(b))
        });
        let mut f = proto::MetricFamily::default();
        f.set_name(self.desc.fq_name.clone());
        f.set_help(self.desc.help.clone());
        f.set_field_type(proto::MetricType::HISTOGRAM);
        f.set_metric(metrics);
        vec![f]
    }
}

fn must<T>(r: prometheus::Result<T>) -> T {
    // Names and labels are constants here: a failure is a bug.
    r.expect("metric definition")
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = must($m);
                must(registry.register(Box::new(m.clone())));
                m
            }};
        }
        let run = RUN_LABELS;
        let with = |extra: &'static str| -> Vec<&'static str> {
            let mut v = run.to_vec();
            v.push(extra);
            v
        };
        Metrics {
            agents: reg!(IntGaugeVec::new(
                Opts::new("pgfleet_agents", "Agents joined to the controller, by class and state (idle, busy, disconnected)."),
                &["instance_class", "state"]
            )),
            runs: reg!(IntGaugeVec::new(
                Opts::new("pgfleet_runs", "Runs in the store, by status."),
                &["status"]
            )),
            cells: reg!(IntGaugeVec::new(
                Opts::new("pgfleet_cells", "Cells of a run, by state."),
                &["scenario", "run_id", "instance_class", "workload", "state"]
            )),
            cell_seconds: reg!(HistogramVec::new(
                HistogramOpts::new("pgfleet_cell_duration_seconds", "Wall-clock time of finished cells, from assignment to result.")
                    .buckets(vec![1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0]),
                &["instance_class", "workload", "state"]
            )),
            agent_losses: reg!(IntCounterVec::new(
                Opts::new("pgfleet_agent_losses_total", "Agents declared lost (lease expired, process exited, never registered)."),
                &["instance_class"]
            )),
            agent_reconnects: reg!(IntCounterVec::new(
                Opts::new("pgfleet_agent_reconnects_total", "Agent sessions re-established within the lease."),
                &["instance_class"]
            )),
            message_wait: reg!(Histogram::with_opts(
                HistogramOpts::new("pgfleet_agent_message_wait_seconds", "Time an agent's message waits between arriving and being handled by its run's scheduler.")
                    .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
            )),
            transactions: reg!(IntCounterVec::new(
                Opts::new("pgfleet_postgres_transactions_total", "Committed transactions (pg_stat_database.xact_commit) while the cell measures."),
                run
            )),
            rollbacks: reg!(IntCounterVec::new(
                Opts::new("pgfleet_postgres_rollbacks_total", "Rolled-back transactions (pg_stat_database.xact_rollback)."),
                run
            )),
            blocks_read: reg!(IntCounterVec::new(
                Opts::new("pgfleet_postgres_blocks_read_total", "Blocks read from outside shared buffers (pg_stat_database.blks_read)."),
                run
            )),
            block_read_seconds: reg!(prometheus::CounterVec::new(
                Opts::new("pgfleet_postgres_block_read_seconds_total", "Time spent reading those blocks (blk_read_time; track_io_timing)."),
                run
            )),
            wal_bytes: reg!(IntCounterVec::new(
                Opts::new("pgfleet_postgres_wal_bytes_total", "WAL generated (pg_stat_wal.wal_bytes)."),
                run
            )),
            wal_syncs: reg!(IntCounterVec::new(
                Opts::new("pgfleet_postgres_wal_syncs_total", "WAL syncs to storage (pg_stat_wal.wal_sync)."),
                run
            )),
            wal_sync_seconds: reg!(prometheus::CounterVec::new(
                Opts::new("pgfleet_postgres_wal_sync_seconds_total", "Time spent syncing WAL (pg_stat_wal.wal_sync_time)."),
                run
            )),
            checkpoints: reg!(IntCounterVec::new(
                Opts::new("pgfleet_postgres_checkpoints_total", "Checkpoints, by what started them (timed, requested)."),
                &with("trigger")
            )),
            device_ios: reg!(IntCounterVec::new(
                Opts::new("pgfleet_device_ios_total", "Requests the cluster's own block device completed while the cell measures, by direction (read, write); only clusters with a device of their own."),
                &with("direction")
            )),
            device_bytes: reg!(IntCounterVec::new(
                Opts::new("pgfleet_device_bytes_total", "Bytes the cluster's own block device read and wrote while the cell measures, by direction."),
                &with("direction")
            )),
            waits: reg!(prometheus::GaugeVec::new(
                Opts::new("pgfleet_postgres_wait_event_backends", "Active client backends in each wait event at the last sample (CPU:running when none)."),
                &with("wait_event")
            )),
            driver_transactions: reg!(IntCounterVec::new(
                Opts::new("pgfleet_transactions_total", "Transactions the driver completed in the measured window, as they happen (per second of scheduled start)."),
                run
            )),
            driver_failures: reg!(IntCounterVec::new(
                Opts::new("pgfleet_transaction_failures_total", "Transactions that failed after their retries, by class (serialization, deadlock)."),
                &with("class")
            )),
            driver_latency: reg!(CountedHistogramVec::new(
                "pgfleet_transaction_latency_seconds",
                "Latency of the driver's transactions (from scheduled start), merged across clusters.",
                LATENCY_BUCKETS,
                run
            )),
            vacuum_blocks: reg!(IntGaugeVec::new(
                Opts::new("pgfleet_vacuum_heap_blocks", "VACUUM's progress on the cell's table (pg_stat_progress_vacuum): heap blocks total, scanned and vacuumed."),
                &with("stage")
            )),
            replication_lag: reg!(IntGaugeVec::new(
                Opts::new("pgfleet_replication_lag_bytes", "Logical-drain backlog left: the target LSN minus what the subscriber has received."),
                run
            )),
            toast_latency: reg!(prometheus::GaugeVec::new(
                Opts::new("pgfleet_toast_slice_latency_seconds", "Latency of toast-slice's last repeat per storage mode and offset (median of its calls)."),
                &{
                    let mut v = run.to_vec();
                    v.extend(["storage_mode", "offset"]);
                    v
                }
            )),
            cell_results: reg!(prometheus::GaugeVec::new(
                Opts::new("pgfleet_cell_result", "A finished cell's figures: one series per figure its kind compares between classes, as the kind declares it (`metric`, `unit`, `better`: higher or lower); `entry` is the cell's workload entry (its index in the scenario's `workloads`), `point` tells a cell's points apart (a sweep's, toast-slice's modes and offsets). The last finished replica's value."),
                &{
                    let mut v = run.to_vec();
                    v.extend(RESULT_LABELS);
                    v
                }
            )),
            cell_phase: reg!(IntGaugeVec::new(
                Opts::new("pgfleet_cell_phase", "1 while a cell is in this phase (provision, load, measure, vacuum, drain, teardown...); one series per running cell."),
                &["scenario", "run_id", "instance_class", "workload", "cell_id", "phase"]
            )),
            phase_seconds: reg!(HistogramVec::new(
                HistogramOpts::new("pgfleet_cell_phase_duration_seconds", "Time cells spent in a phase (provision, load, warm-up, measure, vacuum, drain, teardown...), observed when the phase ends.")
                    .buckets(vec![0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0]),
                &["instance_class", "workload", "phase"]
            )),
            phases: Mutex::new(BTreeMap::new()),
            registry,
            series: Mutex::new(BTreeMap::new()),
            wait_events: Mutex::new(BTreeMap::new()),
            failure_classes: Mutex::new(BTreeMap::new()),
            toast_points: Mutex::new(BTreeMap::new()),
            result_points: Mutex::new(BTreeMap::new()),
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Sets the scrape-time gauges: agents from the hub, runs from the store.
    pub fn refresh(&self, hub: &crate::hub::Hub, store: &pgfleet_store::Store) {
        self.agents.reset();
        for a in hub.agents() {
            let state = match (a.connected, a.run_id.is_some()) {
                (false, _) => "disconnected",
                (true, true) => "busy",
                (true, false) => "idle",
            };
            self.agents
                .with_label_values(&[a.instance_class.as_str(), state])
                .inc();
        }
        if let Ok(runs) = store.runs() {
            self.runs.reset();
            for r in runs {
                self.runs.with_label_values(&[r.status.as_str()]).inc();
            }
        }
    }

    fn remember(&self, run: &str, labels: &[String]) {
        let mut s = self.series.lock().unwrap_or_else(|p| p.into_inner());
        s.entry(run.to_string())
            .or_default()
            .insert(labels.to_vec());
    }

    /// Adds one `pg_stat` sample (the per-second deltas of one cell).
    pub fn pg_stat(&self, labels: RunLabels<'_>, data: &Json) {
        let owned: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        self.remember(labels[1], &owned);
        // Per-second deltas an agent reports: bounded, so one message cannot
        // wrap a counter.
        let f = |group: &str, key: &str| {
            data[group][key]
                .as_f64()
                .unwrap_or(0.0)
                .clamp(0.0, MAX_SAMPLE_DELTA)
        };
        let l = &labels[..];
        self.transactions
            .with_label_values(l)
            .inc_by(f("database", "xact_commit") as u64);
        self.rollbacks
            .with_label_values(l)
            .inc_by(f("database", "xact_rollback") as u64);
        self.blocks_read
            .with_label_values(l)
            .inc_by(f("database", "blks_read") as u64);
        self.block_read_seconds
            .with_label_values(l)
            .inc_by(f("database", "blk_read_time_ms") / 1000.0);
        self.wal_bytes
            .with_label_values(l)
            .inc_by(f("wal", "wal_bytes") as u64);
        self.wal_syncs
            .with_label_values(l)
            .inc_by(f("wal", "wal_sync") as u64);
        self.wal_sync_seconds
            .with_label_values(l)
            .inc_by(f("wal", "wal_sync_time_ms") / 1000.0);
        if data["device"].is_object() {
            for (direction, ios, bytes) in [
                ("read", "reads", "read_bytes"),
                ("write", "writes", "write_bytes"),
            ] {
                let mut v = l.to_vec();
                v.push(direction);
                self.device_ios
                    .with_label_values(&v)
                    .inc_by(f("device", ios) as u64);
                self.device_bytes
                    .with_label_values(&v)
                    .inc_by(f("device", bytes) as u64);
            }
        }
        for (trigger, key) in [
            ("timed", "checkpoints_timed"),
            ("requested", "checkpoints_req"),
        ] {
            let mut v = l.to_vec();
            v.push(trigger);
            self.checkpoints
                .with_label_values(&v)
                .inc_by(f("bgwriter", key) as u64);
        }
        // Wait events: this second's picture; events not seen now are 0.
        // The agent names the events: at most MAX_LABEL_VALUES of them per
        // series, the rest added up under `other`.
        let mut seen = self.wait_events.lock().unwrap_or_else(|p| p.into_inner());
        let events = seen.entry(owned.clone()).or_default();
        events.insert("CPU:running".into());
        let mut now: BTreeMap<String, f64> = BTreeMap::new();
        for (k, v) in data["waits"].as_object().into_iter().flatten() {
            let label = bounded_label(events, k);
            *now.entry(label).or_default() += v.as_f64().unwrap_or(0.0).clamp(0.0, 1e9);
        }
        for e in events.iter() {
            let mut v = l.to_vec();
            v.push(e);
            self.waits
                .with_label_values(&v)
                .set(now.get(e).copied().unwrap_or(0.0));
        }
    }

    /// Adds one live second of a cell's driver (a `live` sample): its
    /// transactions, failures by class, and latencies (each bucket's
    /// count observed at the bucket's geometric middle).
    pub fn live_second(&self, labels: RunLabels<'_>, data: &Json) {
        let owned: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        self.remember(labels[1], &owned);
        let l = &labels[..];
        self.driver_transactions.with_label_values(l).inc_by(
            data["transactions"]
                .as_u64()
                .unwrap_or(0)
                .min(MAX_LIVE_COUNT),
        );
        if let Some(f) = data["failures"].as_object() {
            let mut classes = self
                .failure_classes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let seen = classes.entry(owned.clone()).or_default();
            for (class, n) in f {
                let class = bounded_label(seen, class);
                let mut v = l.to_vec();
                v.push(&class);
                self.driver_failures
                    .with_label_values(&v)
                    .inc_by(n.as_u64().unwrap_or(0).min(MAX_LIVE_COUNT));
            }
        }
        let per_octave = data["buckets_per_octave"].as_f64().unwrap_or(4.0).max(1.0);
        let observed: Vec<(f64, u64)> = data["buckets"]
            .as_array()
            .into_iter()
            .flatten()
            .take(MAX_LIVE_BUCKETS)
            .map(|b| {
                let (i, n) = (b[0].as_f64().unwrap_or(0.0), b[1].as_u64().unwrap_or(0));
                (((i + 0.5) / per_octave).exp2() / 1e6, n.min(MAX_LIVE_COUNT))
            })
            .collect();
        // One update per bucket, whatever its count.
        self.driver_latency.observe_many(l, &observed);
    }

    /// A cell reports its phase: its series moves to the new phase.
    pub fn cell_phase(&self, labels: [&str; 4], cell_id: &str, phase: &str) {
        let mut all = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        let cells = all.entry(labels[1].to_string()).or_default();
        let mut now: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        now.extend([cell_id.to_string(), phase.to_string()]);
        if cells.get(cell_id).is_some_and(|(l, _)| *l == now) {
            return;
        }
        let started = std::time::Instant::now();
        if let Some(old) = cells.insert(cell_id.to_string(), (now.clone(), started)) {
            self.phase_ended(old);
        }
        let now: Vec<&str> = now.iter().map(String::as_str).collect();
        self.cell_phase.with_label_values(&now).set(1);
    }

    /// A phase is over: its series goes, its duration is observed.
    fn phase_ended(&self, (labels, since): PhaseSeries) {
        self.phase_seconds
            .with_label_values(&[&labels[2], &labels[3], &labels[5]])
            .observe(since.elapsed().as_secs_f64());
        let old: Vec<&str> = labels.iter().map(String::as_str).collect();
        let _ = self.cell_phase.remove_label_values(&old);
    }

    /// A cell ended: no phase any more.
    pub fn cell_ended(&self, run: &str, cell_id: &str) {
        let mut all = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = all.get_mut(run).and_then(|cells| cells.remove(cell_id)) {
            self.phase_ended(old);
        }
    }

    /// A workload's own progress sample: VACUUM's (`vacuum`), the drain's
    /// lag (`lag`), a toast-slice repeat (`repeat`).
    pub fn progress_sample(&self, labels: RunLabels<'_>, kind: &str, data: &Json) {
        let owned: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        self.remember(labels[1], &owned);
        let l = &labels[..];
        let u = |k: &str| data[k].as_u64().unwrap_or(0) as i64;
        match kind {
            "vacuum" => {
                for (stage, key) in [
                    ("total", "heap_blks_total"),
                    ("scanned", "heap_blks_scanned"),
                    ("vacuumed", "heap_blks_vacuumed"),
                ] {
                    let mut v = l.to_vec();
                    v.push(stage);
                    self.vacuum_blocks.with_label_values(&v).set(u(key));
                }
            }
            "lag" => self
                .replication_lag
                .with_label_values(l)
                .set(u("lag_bytes")),
            "repeat" => {
                let (Some(mode), Some(offset), Some(ms)) = (
                    data["storage_mode"].as_str(),
                    data["offset_label"].as_str(),
                    data["latency_ms_p50"].as_f64(),
                ) else {
                    return;
                };
                self.toast_points
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(owned.clone())
                    .or_default()
                    .insert((mode.to_string(), offset.to_string()));
                let mut v = l.to_vec();
                v.extend([mode, offset]);
                self.toast_latency.with_label_values(&v).set(ms / 1000.0);
            }
            _ => {}
        }
    }

    /// A finished cell's figures: for each of its points, each metric its
    /// kind declares compared (`KindInfo::compared`) that the point has.
    /// `entry` is the cell's workload entry (its index in `workloads`, as
    /// report.json's `summaries[].entry`): two entries of one kind on one
    /// class are two series.
    pub fn cell_result(
        &self,
        labels: RunLabels<'_>,
        entry: usize,
        kind: Kind,
        points: &[(Json, Json)],
    ) {
        let owned: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        self.remember(labels[1], &owned);
        let mut all = self.result_points.lock().unwrap_or_else(|p| p.into_inner());
        let (_, seen, entries) = all
            .entry(owned)
            .or_insert_with(|| (kind, BTreeSet::new(), BTreeSet::new()));
        // (A scenario's entries: bounded by the scenario's size.)
        let entry = entry.to_string();
        entries.insert(entry.clone());
        // What tells the cell's points apart: the parameters whose values
        // differ between them (a sweep's `clients`, toast-slice's
        // `storage_mode` and `offset`).
        // (Once per point and key: an agent decides how many points.)
        let first = points.first().and_then(|(p, _)| p.as_object());
        let mut keys: BTreeSet<&str> = BTreeSet::new();
        for (p, _) in points {
            let own = p.as_object().into_iter().flat_map(|o| o.keys());
            for k in own.chain(first.into_iter().flat_map(|o| o.keys())) {
                if p.get(k) != first.and_then(|f| f.get(k)) {
                    keys.insert(k);
                }
            }
        }
        for (params, figures) in points {
            // (An agent's text: bounded.)
            let point = point_label(&keys, params);
            let point = bounded_label(seen, &point);
            for m in kind.info().compared {
                let Some(v) = figures.get(m.name).and_then(Json::as_f64) else {
                    continue;
                };
                if v.is_finite() {
                    let mut l = labels.to_vec();
                    l.extend(result_labels(&entry, &point, m));
                    self.cell_results.with_label_values(&l).set(v);
                }
            }
        }
    }

    /// Removes every series of `run` (its cells and PostgreSQL figures).
    pub fn forget_run(&self, run: &str) {
        let sets = self
            .series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run)
            .unwrap_or_default();
        for labels in sets {
            let l: Vec<&str> = labels.iter().map(String::as_str).collect();
            let _ = self.transactions.remove_label_values(&l);
            let _ = self.rollbacks.remove_label_values(&l);
            let _ = self.blocks_read.remove_label_values(&l);
            let _ = self.block_read_seconds.remove_label_values(&l);
            let _ = self.wal_bytes.remove_label_values(&l);
            let _ = self.wal_syncs.remove_label_values(&l);
            let _ = self.wal_sync_seconds.remove_label_values(&l);
            let _ = self.driver_transactions.remove_label_values(&l);
            let _ = self.replication_lag.remove_label_values(&l);
            for stage in ["total", "scanned", "vacuumed"] {
                let mut v = l.clone();
                v.push(stage);
                let _ = self.vacuum_blocks.remove_label_values(&v);
            }
            let points = self
                .toast_points
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&labels)
                .unwrap_or_default();
            for (mode, offset) in &points {
                let mut v = l.clone();
                v.extend([mode.as_str(), offset.as_str()]);
                let _ = self.toast_latency.remove_label_values(&v);
            }
            self.driver_latency.remove(&labels);
            let results = self
                .result_points
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&labels);
            for (kind, points, entries) in results.iter() {
                for (entry, point, m) in entries.iter().flat_map(|e| {
                    points
                        .iter()
                        .flat_map(move |p| kind.info().compared.iter().map(move |m| (e, p, m)))
                }) {
                    let mut v = l.clone();
                    v.extend(result_labels(entry, point, m));
                    let _ = self.cell_results.remove_label_values(&v);
                }
            }
            let classes = self
                .failure_classes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&labels)
                .unwrap_or_default();
            for c in &classes {
                let mut v = l.clone();
                v.push(c);
                let _ = self.driver_failures.remove_label_values(&v);
            }
            for t in ["timed", "requested"] {
                let mut v = l.clone();
                v.push(t);
                let _ = self.checkpoints.remove_label_values(&v);
            }
            for d in ["read", "write"] {
                let mut v = l.clone();
                v.push(d);
                let _ = self.device_ios.remove_label_values(&v);
                let _ = self.device_bytes.remove_label_values(&v);
            }
            let events = self
                .wait_events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&labels)
                .unwrap_or_default();
            for e in &events {
                let mut v = l.clone();
                v.push(e);
                let _ = self.waits.remove_label_values(&v);
            }
        }
        let phases = self
            .phases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run)
            .unwrap_or_default();
        for (old, _) in phases.values() {
            let old: Vec<&str> = old.iter().map(String::as_str).collect();
            let _ = self.cell_phase.remove_label_values(&old);
        }
        // Cell gauges carry the run id too.
        let families = self.registry.gather();
        for f in families.iter().filter(|f| f.name() == "pgfleet_cells") {
            for m in f.get_metric() {
                let labels: BTreeMap<&str, &str> = m
                    .get_label()
                    .iter()
                    .map(|p| (p.name(), p.value()))
                    .collect();
                if labels.get("run_id") == Some(&run) {
                    let v: Vec<&str> =
                        ["scenario", "run_id", "instance_class", "workload", "state"]
                            .iter()
                            .map(|k| labels.get(k).copied().unwrap_or(""))
                            .collect();
                    let _ = self.cells.remove_label_values(&v);
                }
            }
        }
    }

    /// Forgets `run`'s series after `retention` (a finished run stays
    /// visible for a while, then stops costing series).
    pub fn retire_run(self: &std::sync::Arc<Self>, run: &str, retention: Duration) {
        let me = self.clone();
        let run = run.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(retention).await;
            me.forget_run(&run);
        });
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A point's label: the given parameters' values (`clients=8, threads=2`);
/// empty for a cell's single point.
fn point_label(keys: &BTreeSet<&str>, params: &Json) -> String {
    keys.iter()
        .filter_map(|k| {
            let v = params.get(*k)?;
            Some(match v {
                Json::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `entry`, `point`, `metric`, `unit` and `better` labels of a result.
fn result_labels<'a>(entry: &'a str, point: &'a str, m: &'a Metric) -> [&'a str; 5] {
    let better = match m.better {
        Better::Higher => "higher",
        Better::Lower => "lower",
    };
    [entry, point, m.name, m.unit, better]
}

/// Distinct values one label may take per series (wait events, failure
/// classes: names an agent sends); past it, values go to `other`.
pub const MAX_LABEL_VALUES: usize = 64;

/// `value` as a label of a set already holding `seen`: itself (clipped to
/// 64 characters) while the set has room or holds it, else `other`.
fn bounded_label(seen: &mut BTreeSet<String>, value: &str) -> String {
    let v: String = value.chars().take(64).collect();
    if seen.contains(&v) || seen.len() < MAX_LABEL_VALUES {
        seen.insert(v.clone());
        v
    } else {
        seen.insert("other".into());
        "other".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABELS: RunLabels = ["sc", "run-1", "fast", "nvme", "pgbench", "18"];

    #[test]
    fn live_seconds_add_up_and_the_histogram_resolves_both_ends() {
        let m = Metrics::new();
        // 3 transactions near 64 µs (bucket 24 at 4 per octave), 1 near 55 ms.
        let sec = serde_json::json!({"second": 1, "transactions": 4, "failures": {"serialization": 2},
            "buckets_per_octave": 4, "buckets": [[24, 3], [63, 1]]});
        m.live_second(LABELS, &sec);
        m.live_second(LABELS, &sec);
        let text = m.render();
        // The value of the sample of `name` whose labels include `labels`.
        let line = |name: &str, labels: &[&str]| {
            text.lines()
                .find(|l| {
                    l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x))
                })
                .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .parse::<f64>()
                .unwrap()
        };
        assert_eq!(
            line("pgfleet_transactions_total", &["run_id=\"run-1\""]),
            8.0
        );
        assert_eq!(
            line(
                "pgfleet_transaction_failures_total",
                &["class=\"serialization\""]
            ),
            4.0
        );
        // 64 µs lies in (50 µs, 100 µs]; 55 ms in (50 ms, 100 ms].
        assert_eq!(
            line(
                "pgfleet_transaction_latency_seconds_bucket",
                &["le=\"0.00005\""]
            ),
            0.0
        );
        assert_eq!(
            line(
                "pgfleet_transaction_latency_seconds_bucket",
                &["le=\"0.0001\""]
            ),
            6.0
        );
        assert_eq!(
            line(
                "pgfleet_transaction_latency_seconds_bucket",
                &["le=\"0.05\""]
            ),
            6.0
        );
        assert_eq!(
            line(
                "pgfleet_transaction_latency_seconds_bucket",
                &["le=\"0.1\""]
            ),
            8.0
        );
    }

    /// A sample's device group becomes per-direction counters; a sample
    /// without one (a cluster with no device of its own) adds no series.
    #[test]
    fn a_clusters_device_requests_and_bytes_are_counted_by_direction() {
        let m = Metrics::new();
        let sample = serde_json::json!({"database": {"xact_commit": 70.0},
            "device": {"reads": 180.0, "writes": 190.0, "read_bytes": 1474560.0, "write_bytes": 4194304.0}});
        m.pg_stat(LABELS, &sample);
        m.pg_stat(LABELS, &sample);
        let other = ["sc", "run-1", "slow", "gp3", "pgbench", "18"];
        m.pg_stat(
            other,
            &serde_json::json!({"database": {"xact_commit": 5.0}}),
        );
        let get = |c: &IntCounterVec, l: RunLabels, d: &str| {
            let mut v = l.to_vec();
            v.push(d);
            c.with_label_values(&v).get()
        };
        assert_eq!(get(&m.device_ios, LABELS, "read"), 360);
        assert_eq!(get(&m.device_ios, LABELS, "write"), 380);
        assert_eq!(get(&m.device_bytes, LABELS, "write"), 8388608);
        let text = m.render();
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("pgfleet_device_ios_total{") && l.contains("\"slow\"")),
            "{text}"
        );
        m.forget_run("run-1");
        assert!(!m.render().contains("pgfleet_device_ios_total{"));
    }

    #[tokio::test]
    async fn a_finished_runs_series_leave_after_the_retention() {
        let m = std::sync::Arc::new(Metrics::new());
        m.live_second(
            LABELS,
            &serde_json::json!({"transactions": 1, "buckets": [[10, 1]]}),
        );
        m.progress_sample(LABELS, "lag", &serde_json::json!({"lag_bytes": 10}));
        m.progress_sample(
            LABELS,
            "repeat",
            &serde_json::json!({"storage_mode": "lz4", "offset_label": "50%", "latency_ms_p50": 1.5}),
        );
        assert!(m.render().contains("run-1"));
        m.retire_run("run-1", Duration::from_millis(50));
        // Still there within the retention, gone after it.
        assert!(m.render().contains("run-1"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let text = m.render();
        assert!(!text.contains("run-1"), "{text}");
    }

    #[test]
    fn a_cells_declared_figures_are_its_results_until_the_run_is_forgotten() {
        let m = Metrics::new();
        let sweep = [
            (
                serde_json::json!({"scale": 4, "clients": 1}),
                serde_json::json!({"tps": 100.5, "latency_ms_mean": 2.0, "transactions": 7}),
            ),
            (
                serde_json::json!({"scale": 4, "clients": 8}),
                serde_json::json!({"tps": 400.0, "latency_ms_mean": "n/a"}),
            ),
        ];
        m.cell_result(LABELS, 0, Kind::Pgbench, &sweep);
        let get = |point: &str, name: &str| {
            let declared = pgfleet_proto::workload::metric("pgbench", name).unwrap();
            let mut l = LABELS.to_vec();
            l.extend(result_labels("0", point, declared));
            l.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        };
        let value = |l: Vec<String>| {
            let l: Vec<&str> = l.iter().map(String::as_str).collect();
            m.cell_results
                .get_metric_with_label_values(&l)
                .map(|g| g.get())
        };
        // The varying swept parameter names the point; the declaration
        // gives unit and direction.
        assert_eq!(value(get("clients=1", "tps")).unwrap(), 100.5);
        assert_eq!(value(get("clients=8", "tps")).unwrap(), 400.0);
        assert_eq!(value(get("clients=1", "latency_ms_mean")).unwrap(), 2.0);
        let text = m.render();
        assert!(
            text.contains(r#"better="lower""#) && text.contains(r#"unit="tx/s""#),
            "{text}"
        );
        // Only declared, numeric figures (not `transactions`, not "n/a").
        assert_eq!(text.matches("pgfleet_cell_result{").count(), 3, "{text}");
        // Another entry of the kind on the class is its own series, and the
        // first entry's stay.
        m.cell_result(
            LABELS,
            2,
            Kind::Pgbench,
            &[(
                serde_json::json!({"scale": 4, "clients": 1, "fillfactor": 80}),
                serde_json::json!({"tps": 90.0}),
            )],
        );
        let second = {
            let declared = pgfleet_proto::workload::metric("pgbench", "tps").unwrap();
            let mut l = LABELS.to_vec();
            l.extend(result_labels("2", "", declared));
            l.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(value(second).unwrap(), 90.0);
        assert_eq!(value(get("clients=1", "tps")).unwrap(), 100.5);
        assert_eq!(m.render().matches("pgfleet_cell_result{").count(), 4);
        // A single point has no point label.
        m.cell_result(
            ["sc", "run-2", "fast", "nvme", "vacuum-bloat", "18"],
            0,
            Kind::VacuumBloat,
            &[(
                serde_json::json!({"scale": 8}),
                serde_json::json!({"vacuum_seconds": 3.5}),
            )],
        );
        let text = m.render();
        let line = text
            .lines()
            .find(|l| l.contains(r#"metric="vacuum_seconds",point="","#))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains(r#"entry="0","#), "{line}");
        m.forget_run("run-1");
        m.forget_run("run-2");
        let text = m.render();
        assert!(!text.contains("pgfleet_cell_result{"), "{text}");
    }

    #[test]
    fn a_phase_ends_into_its_duration_histogram_and_its_gauge_goes() {
        let m = Metrics::new();
        let labels = ["sc", "run-1", "fast", "pgbench"];
        m.cell_phase(labels, "c1", "load");
        std::thread::sleep(Duration::from_millis(120));
        m.cell_phase(labels, "c1", "load");
        m.cell_phase(labels, "c1", "measure");
        let load = m
            .phase_seconds
            .with_label_values(&["fast", "pgbench", "load"]);
        assert_eq!(load.get_sample_count(), 1, "a repeated phase is one phase");
        assert!(load.get_sample_sum() >= 0.12, "{}", load.get_sample_sum());
        m.cell_ended("run-1", "c1");
        let measure = m
            .phase_seconds
            .with_label_values(&["fast", "pgbench", "measure"]);
        assert_eq!(measure.get_sample_count(), 1);
        let text = m.render();
        assert!(!text.contains("pgfleet_cell_phase{"), "{text}");
    }
}
