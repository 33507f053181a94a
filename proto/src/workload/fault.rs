//! Faults injected while a script runs (`faults:` of a `pgbench` entry),
//! and the figures of how PostgreSQL came back from them.
//!
//! A fault starts `at_s` seconds into the measured window:
//! - `crash`: every process of the server killed at once (SIGKILL), then
//!   a start: crash recovery replays the WAL since the last checkpoint;
//! - `checkpoint`: an immediate CHECKPOINT while the clients run;
//! - `stall` / `degrade`: the class's emulated I/O caps drop for
//!   `duration_s` to almost nothing (1 IOPS) or to `iops` / `mbps`, then
//!   come back (an EBS volume's bad minutes).
//!
//! The agent runs them in order, each after the one before has ended.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{Better, Checked, Field, Metric};

/// What a fault does (the scenario's `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    Crash,
    Checkpoint,
    Stall,
    Degrade,
    /// logical-drain: the network between the subscriber's server and the
    /// publisher's cut for `duration_s`, then healed.
    Partition,
}

impl FaultKind {
    pub const NAMES: &'static [&'static str] =
        &["crash", "checkpoint", "stall", "degrade", "partition"];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::Checkpoint => "checkpoint",
            FaultKind::Stall => "stall",
            FaultKind::Degrade => "degrade",
            FaultKind::Partition => "partition",
        }
    }

    fn from_name(s: &str) -> Option<FaultKind> {
        match s {
            "crash" => Some(FaultKind::Crash),
            "checkpoint" => Some(FaultKind::Checkpoint),
            "stall" => Some(FaultKind::Stall),
            "degrade" => Some(FaultKind::Degrade),
            "partition" => Some(FaultKind::Partition),
            _ => None,
        }
    }

    /// Whether it changes the class's emulated I/O caps (refused where the
    /// storage is not emulated).
    pub fn changes_caps(self) -> bool {
        matches!(self, FaultKind::Stall | FaultKind::Degrade)
    }

    /// Whether it lasts `duration_s` (the others last until the server is
    /// back, or the CHECKPOINT returns).
    pub fn lasts(self) -> bool {
        self.changes_caps() || self == FaultKind::Partition
    }
}

/// One entry of `faults:` as the scenario gives it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// `crash`, `checkpoint`, `stall` or `degrade`.
    #[serde(default)]
    pub kind: Option<Spanned<String>>,
    /// Seconds into the measured window (after the warm-up).
    #[serde(default)]
    pub at_s: Option<Spanned<f64>>,
    /// `stall`, `degrade` and `partition`: how long it lasts.
    #[serde(default)]
    pub duration_s: Option<Spanned<f64>>,
    /// `degrade`: the IOPS cap meanwhile (each direction; a combined
    /// budget for gp3), default the class's.
    #[serde(default)]
    pub iops: Option<Spanned<u64>>,
    /// `degrade`: the MiB/s cap meanwhile, default the class's.
    #[serde(default)]
    pub mbps: Option<Spanned<u64>>,
    /// `degrade`: each read's and write's latency meanwhile, in ms (a
    /// latency spike), on a class whose volume has latency (gp3).
    #[serde(default)]
    pub latency_ms: Option<Spanned<f64>>,
    /// `crash`: how long the server may take to accept connections again
    /// before the cell fails with PostgreSQL's reason (default 900 s).
    #[serde(default)]
    pub recovery_timeout_s: Option<Spanned<f64>>,
}

/// A fault as the agent runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub kind: FaultKind,
    pub at_s: f64,
    /// `stall` / `degrade`: the window; 0 for the others.
    #[serde(default)]
    pub duration_s: f64,
    /// `degrade`: the caps meanwhile (0: the class's).
    #[serde(default)]
    pub iops: u64,
    #[serde(default)]
    pub mbps: u64,
    /// `degrade`: reads' and writes' latency meanwhile, ms (0: the class's).
    #[serde(default)]
    pub latency_ms: f64,
    #[serde(default = "default_recovery_timeout")]
    pub recovery_timeout_s: f64,
}

fn default_recovery_timeout() -> f64 {
    DEFAULT_RECOVERY_TIMEOUT_S
}

pub const DEFAULT_RECOVERY_TIMEOUT_S: f64 = 900.0;
const MAX_FAULTS: usize = 16;
/// The IOPS cap of a stall: I/O almost stops (0 would remove the cap).
pub const STALL_IOPS: u64 = 1;

impl super::Spec {
    /// The kind each fault of the entry names, as written, with the
    /// fault's index in `faults` (kinds that take no faults have none).
    pub fn fault_kinds(&self) -> impl Iterator<Item = (usize, &Spanned<String>)> {
        self.faults()
            .filter_map(|(j, f)| Some((j, f.kind.as_ref()?)))
    }

    /// The entry's faults as written, with each one's index.
    pub fn faults(&self) -> impl Iterator<Item = (usize, &FaultSpec)> {
        let list = match self {
            super::Spec::Pgbench(s) => s.faults.as_ref(),
            super::Spec::LogicalDrain(s) => s.faults.as_ref(),
            _ => None,
        };
        list.into_iter()
            .flat_map(|l| l.value.iter())
            .map(|f| &f.value)
            .enumerate()
    }
}

impl Fault {
    /// A short label: `crash at 30 s`, `stall 10 s at 30 s`.
    pub fn label(&self) -> String {
        let at = fmt_s(self.at_s);
        match self.kind {
            FaultKind::Stall => format!("stall {} at {at}", fmt_s(self.duration_s)),
            FaultKind::Partition => format!("partition {} at {at}", fmt_s(self.duration_s)),
            FaultKind::Degrade => {
                let mut caps = Vec::new();
                if self.iops > 0 {
                    caps.push(format!("{} IOPS", self.iops));
                }
                if self.mbps > 0 {
                    caps.push(format!("{} MiB/s", self.mbps));
                }
                if self.latency_ms > 0.0 {
                    caps.push(format!("{} ms an I/O", self.latency_ms));
                }
                format!(
                    "degrade to {} for {} at {at}",
                    caps.join(", "),
                    fmt_s(self.duration_s)
                )
            }
            k => format!("{} at {at}", k.name()),
        }
    }

    /// The agent's check (see `KindParams::check`).
    pub fn check(&self) -> Result<(), String> {
        if !(self.at_s >= 0.0 && self.at_s <= 7.0 * 86_400.0) {
            return Err(format!("fault at_s {} is out of range", self.at_s));
        }
        if self.kind.lasts() && !(self.duration_s > 0.0 && self.duration_s <= 86_400.0) {
            return Err(format!(
                "fault {} needs duration_s in 0..86400",
                self.kind.name()
            ));
        }
        if !(self.recovery_timeout_s >= 1.0 && self.recovery_timeout_s <= 86_400.0) {
            return Err("fault recovery_timeout_s is out of range".into());
        }
        Ok(())
    }
}

fn fmt_s(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}

/// The faults a `pgbench` entry takes.
pub const ON_A_SCRIPT: &[FaultKind] = &[
    FaultKind::Crash,
    FaultKind::Checkpoint,
    FaultKind::Stall,
    FaultKind::Degrade,
];

/// Checks `faults:` against the measured window (`duration_s`, None when
/// the entry counts transactions) and the driver.
pub fn check(
    f: &Field,
    list: &Option<Spanned<Vec<Spanned<FaultSpec>>>>,
    window_s: Option<f64>,
    driver: &str,
    allowed: &[FaultKind],
) -> Checked<Vec<Fault>> {
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    if list.value.len() > MAX_FAULTS {
        return f.err(
            list.referenced,
            "faults",
            format!(
                "{} faults: at most {MAX_FAULTS} in one entry",
                list.value.len()
            ),
        );
    }
    if !list.value.is_empty() && driver != "pgfleet" {
        return f.err(
            list.referenced,
            "faults",
            "faults need driver: pgfleet (its clients reconnect after a crash and its seconds are timed live; pgbench aborts a client whose server goes away)",
        );
    }
    let Some(window) = window_s else {
        return f.err(
            list.referenced,
            "faults",
            "faults are placed in time: give duration_s instead of transactions",
        );
    };
    let mut out: Vec<Fault> = Vec::new();
    for (j, s) in list.value.iter().enumerate() {
        let key = |k: &str| format!("faults[{j}].{k}");
        let fs = &s.value;
        let Some(kind) = &fs.kind else {
            return f.err(
                s.referenced,
                &key("kind"),
                format!("missing: allowed {}", FaultKind::NAMES.join(", ")),
            );
        };
        f.one_of(kind, &key("kind"), FaultKind::NAMES, "fault kind")?;
        let k = FaultKind::from_name(&kind.value).expect("checked");
        if !allowed.contains(&k) {
            let names: Vec<&str> = allowed.iter().map(|a| a.name()).collect();
            return f.err(
                kind.referenced,
                &key("kind"),
                format!(
                    "a {} fault does not apply to this kind: allowed here {}",
                    k.name(),
                    names.join(", ")
                ),
            );
        }
        let Some(at) = &fs.at_s else {
            return f.err(
                s.referenced,
                &key("at_s"),
                "missing: seconds into the measured window",
            );
        };
        // A script's fault is measured against the seconds before it; a
        // partition against the drain's own end.
        let (earliest, why) = match k {
            FaultKind::Partition => (0.0, " seconds into the drain (within timeout_s)"),
            _ => (
                2.0,
                " seconds (the seconds before a fault are its baseline; within duration_s)",
            ),
        };
        f.in_range(&fs.at_s, &key("at_s"), earliest, window, why)?;
        if at.value >= window {
            return f.err(
                at.referenced,
                &key("at_s"),
                format!(
                    "{} is not within the measured window ({window} s)",
                    at.value
                ),
            );
        }
        let duration = match (&fs.duration_s, k.lasts()) {
            (Some(d), true) => {
                f.in_range(
                    &fs.duration_s,
                    &key("duration_s"),
                    0.001,
                    86_400.0,
                    " seconds",
                )?;
                d.value
            }
            (None, true) => {
                return f.err(
                    kind.referenced,
                    &key("duration_s"),
                    format!("a {} needs duration_s: how long it lasts", k.name()),
                );
            }
            (Some(d), false) => {
                return f.err(
                    d.referenced,
                    &key("duration_s"),
                    format!(
                        "a {} has no duration of its own (it lasts until the server is back): remove duration_s",
                        k.name()
                    ),
                );
            }
            (None, false) => 0.0,
        };
        let latency = fs.latency_ms.as_ref().map(|l| l.referenced);
        for (at, name) in [
            (fs.iops.as_ref().map(|v| v.referenced), "iops"),
            (fs.mbps.as_ref().map(|v| v.referenced), "mbps"),
            (latency, "latency_ms"),
        ] {
            if let Some(at) = at
                && k != FaultKind::Degrade
            {
                return f.err(
                    at,
                    &key(name),
                    format!("{name} is a degrade's cap: remove it from a {}", k.name()),
                );
            }
        }
        if k == FaultKind::Degrade
            && fs.iops.is_none()
            && fs.mbps.is_none()
            && fs.latency_ms.is_none()
        {
            return f.err(
                kind.referenced,
                &key("iops"),
                "a degrade needs its caps: iops, mbps, latency_ms, or several",
            );
        }
        f.in_range(&fs.iops, &key("iops"), 1, 10_000_000, "")?;
        f.in_range(&fs.mbps, &key("mbps"), 1, 100_000, " MiB/s")?;
        f.in_range(&fs.latency_ms, &key("latency_ms"), 0.01, 10_000.0, " ms")?;
        if let Some(t) = &fs.recovery_timeout_s
            && k != FaultKind::Crash
        {
            return f.err(
                t.referenced,
                &key("recovery_timeout_s"),
                "recovery_timeout_s bounds a crash's recovery: remove it here",
            );
        }
        f.in_range(
            &fs.recovery_timeout_s,
            &key("recovery_timeout_s"),
            1.0,
            86_400.0,
            " seconds",
        )?;
        if let Some(prev) = out.last()
            && at.value < prev.at_s + prev.duration_s
        {
            return f.err(
                at.referenced,
                &key("at_s"),
                format!(
                    "starts before the fault before it ends ({}): list faults in time order, one after another",
                    prev.label()
                ),
            );
        }
        out.push(Fault {
            kind: k,
            at_s: at.value,
            duration_s: duration,
            iops: super::opt(&fs.iops).unwrap_or(0),
            mbps: super::opt(&fs.mbps).unwrap_or(0),
            latency_ms: super::opt(&fs.latency_ms).unwrap_or(0.0),
            recovery_timeout_s: super::or(&fs.recovery_timeout_s, DEFAULT_RECOVERY_TIMEOUT_S),
        });
    }
    Ok(out)
}

/// One fault of one cell, measured. Times are seconds into the measured
/// window, as the fault's `at_s`; throughput and latency come from the
/// driver's seconds (by scheduled start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultFigures {
    pub kind: FaultKind,
    /// What the scenario asked (`Fault::label`).
    pub label: String,
    /// When it started and when its action ended (crash: the server
    /// accepts connections; checkpoint: CHECKPOINT returned; stall and
    /// degrade: the caps are back).
    pub start_s: f64,
    pub end_s: f64,
    /// Mean TPS of the (up to) 10 whole seconds before the fault.
    pub baseline_tps: f64,
    /// Mean TPS from the fault's start to its end (whole seconds).
    pub tps_during: Option<f64>,
    /// p99 latency of the transactions scheduled from the start to the end.
    pub latency_ms_p99_during: Option<f64>,
    /// p99 latency of the 10 seconds after the end.
    pub latency_ms_p99_after: Option<f64>,
    /// Seconds from the start until the first whole second (from the end
    /// on) whose TPS is at least 90 % of the baseline; None: not before
    /// the measured window ended.
    pub back_to_90pct_s: Option<f64>,
    /// The baseline's transactions over those seconds minus those that
    /// ran (what the fault cost); over the rest of the window when the
    /// throughput never came back.
    pub transactions_lost: f64,
    /// crash: from the kill to the server accepting connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_s: Option<f64>,
    /// crash: the WAL crash recovery replayed (the server log's `redo
    /// starts at` to `redo done at`; 0 when no redo was needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_replayed_bytes: Option<u64>,
    /// crash: of those, the server's start until its log said `redo done`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redo_s: Option<f64>,
    /// crash: from the kill to the first transaction a client committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_transaction_s: Option<f64>,
    /// checkpoint: how long CHECKPOINT took, and the buffers it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_written: Option<u64>,
    /// partition: WAL the subscriber had still to receive when the network
    /// came back, and from then until the backlog was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes_at_heal: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_s: Option<f64>,
    /// crash, with the commit ledger (a script that commits explicitly):
    /// commits the server acknowledged since the fault before (the run's
    /// start for the first) and up to the kill ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<u64>,
    /// ... of which not in the database once it recovered (0 is the only
    /// right answer with `synchronous_commit: on`) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged_lost: Option<u64>,
    /// ... and how long before the kill the earliest of those was
    /// acknowledged (the window a crash can take back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_window_ms: Option<f64>,
}

impl FaultFigures {
    /// A fault of `kind` from `start_s` to `end_s` with no figure yet.
    pub fn new(kind: FaultKind, label: String, start_s: f64, end_s: f64) -> FaultFigures {
        FaultFigures {
            kind,
            label,
            start_s,
            end_s,
            baseline_tps: 0.0,
            tps_during: None,
            latency_ms_p99_during: None,
            latency_ms_p99_after: None,
            back_to_90pct_s: None,
            transactions_lost: 0.0,
            recovery_s: None,
            wal_replayed_bytes: None,
            redo_s: None,
            first_transaction_s: None,
            checkpoint_s: None,
            buffers_written: None,
            lag_bytes_at_heal: None,
            catch_up_s: None,
            acknowledged: None,
            acknowledged_lost: None,
            lost_window_ms: None,
        }
    }
}

/// The faults' figures as metrics of the cell (each the worst over the
/// entry's faults that have it), so classes compare them, checks bound
/// them, and `compare` and `history` follow them like TPS.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultMetrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_replayed_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_transaction_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_to_90pct_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_transactions_lost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_latency_ms_p99: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_buffers: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_lag_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_seconds: Option<f64>,
    /// The total over the crashes (not the worst: every one is a loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged_lost: Option<f64>,
}

/// The compared metrics of a partition (in logical-drain's `COMPARED`).
pub const PARTITION_COMPARED: &[Metric] = &[
    Metric::new(
        "partition_lag_mb",
        "MB",
        Better::Lower,
        "partition: WAL still to receive when the network came back",
    ),
    Metric::new(
        "catch_up_seconds",
        "s",
        Better::Lower,
        "partition: from the network's return until the backlog was applied",
    ),
];

/// The compared metrics of faults (in pgbench's `COMPARED`).
pub const COMPARED: &[Metric] = &[
    Metric::new(
        "recovery_seconds",
        "s",
        Better::Lower,
        "crash: from the kill to the server accepting connections",
    ),
    Metric::new(
        "wal_replayed_mb",
        "MB",
        Better::Lower,
        "crash: WAL replayed by crash recovery",
    ),
    Metric::new(
        "first_transaction_seconds",
        "s",
        Better::Lower,
        "crash: from the kill to the first committed transaction",
    ),
    Metric::new(
        "back_to_90pct_seconds",
        "s",
        Better::Lower,
        "from a fault's start until throughput is back to 90 % of before",
    ),
    Metric::new(
        "fault_transactions_lost",
        "tx",
        Better::Lower,
        "transactions a fault cost against the throughput before it",
    ),
    Metric::new(
        "fault_latency_ms_p99",
        "ms",
        Better::Lower,
        "99th percentile latency during a fault",
    ),
    Metric::new(
        "acknowledged_lost",
        "commits",
        Better::Lower,
        "crash: commits the server acknowledged that were gone after recovery",
    ),
    Metric::new(
        "checkpoint_seconds",
        "s",
        Better::Lower,
        "checkpoint: how long an immediate CHECKPOINT took under load",
    ),
    Metric::new(
        "checkpoint_buffers",
        "buffers",
        Better::Lower,
        "checkpoint: buffers the CHECKPOINT wrote",
    ),
];

impl FaultMetrics {
    /// The worst of each figure over `faults` (the largest: every one is
    /// lower-is-better). A fault that never came back counts its loss
    /// over the rest of the window and no `back_to_90pct_seconds`.
    pub fn of(faults: &[FaultFigures]) -> FaultMetrics {
        let worst =
            |f: &dyn Fn(&FaultFigures) -> Option<f64>| faults.iter().filter_map(f).reduce(f64::max);
        FaultMetrics {
            recovery_seconds: worst(&|x| x.recovery_s),
            wal_replayed_mb: worst(&|x| x.wal_replayed_bytes.map(|b| b as f64 / 1e6)),
            first_transaction_seconds: worst(&|x| x.first_transaction_s),
            back_to_90pct_seconds: worst(&|x| x.back_to_90pct_s),
            // A partition has no clients to lose transactions of.
            fault_transactions_lost: worst(&|x| {
                (x.kind != FaultKind::Partition).then_some(x.transactions_lost)
            }),
            fault_latency_ms_p99: worst(&|x| x.latency_ms_p99_during),
            checkpoint_seconds: worst(&|x| x.checkpoint_s),
            checkpoint_buffers: worst(&|x| x.buffers_written.map(|b| b as f64)),
            partition_lag_mb: worst(&|x| x.lag_bytes_at_heal.map(|b| b as f64 / 1e6)),
            catch_up_seconds: worst(&|x| x.catch_up_s),
            acknowledged_lost: faults
                .iter()
                .filter_map(|x| x.acknowledged_lost)
                .map(|n| n as f64)
                .reduce(|a, b| a + b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(kind: FaultKind, recovery: Option<f64>, lost: f64) -> FaultFigures {
        FaultFigures {
            back_to_90pct_s: Some(2.0),
            transactions_lost: lost,
            recovery_s: recovery,
            wal_replayed_bytes: recovery.map(|_| 2_000_000),
            baseline_tps: 100.0,
            acknowledged_lost: (kind == FaultKind::Crash).then_some(lost as u64 / 10),
            ..FaultFigures::new(kind, String::new(), 10.0, 11.0)
        }
    }

    #[test]
    fn the_metrics_are_the_worst_fault_and_absent_without_one() {
        let m = FaultMetrics::of(&[
            figures(FaultKind::Crash, Some(1.5), 40.0),
            figures(FaultKind::Stall, None, 90.0),
            figures(FaultKind::Crash, Some(0.5), 10.0),
        ]);
        assert_eq!(m.recovery_seconds, Some(1.5));
        assert_eq!(m.wal_replayed_mb, Some(2.0));
        assert_eq!(m.fault_transactions_lost, Some(90.0));
        assert_eq!(m.checkpoint_seconds, None);
        assert_eq!(m.acknowledged_lost, Some(5.0), "the crashes' 4 + 1: a sum");
        let none = serde_json::to_value(FaultMetrics::of(&[])).unwrap();
        assert_eq!(none, serde_json::json!({}), "no fault, no figure");
        for c in COMPARED.iter().chain(PARTITION_COMPARED) {
            let names = serde_json::to_value(FaultMetrics {
                recovery_seconds: Some(1.0),
                wal_replayed_mb: Some(1.0),
                first_transaction_seconds: Some(1.0),
                back_to_90pct_seconds: Some(1.0),
                fault_transactions_lost: Some(1.0),
                fault_latency_ms_p99: Some(1.0),
                checkpoint_seconds: Some(1.0),
                checkpoint_buffers: Some(1.0),
                partition_lag_mb: Some(1.0),
                catch_up_seconds: Some(1.0),
                acknowledged_lost: Some(1.0),
            })
            .unwrap();
            assert!(names.get(c.name).is_some(), "{} is a field", c.name);
        }
    }

    #[test]
    fn labels_say_what_and_when() {
        let f = Fault {
            kind: FaultKind::Degrade,
            at_s: 30.0,
            duration_s: 10.0,
            iops: 300,
            mbps: 0,
            latency_ms: 0.0,
            recovery_timeout_s: 900.0,
        };
        assert_eq!(f.label(), "degrade to 300 IOPS for 10 s at 30 s");
        assert!(f.check().is_ok());
        let crash = Fault {
            kind: FaultKind::Crash,
            duration_s: 0.0,
            iops: 0,
            ..f
        };
        assert_eq!(crash.label(), "crash at 30 s");
    }
}
