//! `pgbench` (SPEC Experiment 1, seeds/002): load pgbench's schema, then
//! run a pgbench-style script (built-in or the scenario's own text) with the
//! agent's driver or the real pgbench, and report pgbench's figures plus
//! what PostgreSQL saw (page read and WAL sync time).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::fault::{self, Fault, FaultFigures, FaultMetrics, FaultSpec};
use super::pgbench_init::{self, InitParams, with_load_keys};
use super::{
    Better, Cache, Capacity, Checked, Estimate, Field, Internals, KindParams, KindSpec, Metric,
    Work, opt, or,
};
use crate::script::{BUILTIN_SCRIPTS, Script, builtin};

pub const DESCRIPTION: &str = "load, then run a pgbench-style script: tps, latency percentiles, failures, page read and WAL sync time";
/// Transactions per second: what a class's cost per transaction divides by.
pub const TPS: Metric = Metric::new("tps", "tx/s", Better::Higher, "transactions per second");
/// The mean transaction latency, as seeds/002 reports it.
pub const LATENCY_MS_MEAN: Metric = Metric::new(
    "latency_ms_mean",
    "ms",
    Better::Lower,
    "mean transaction latency",
);
/// Summarized per class and compared between classes in reports.
pub const COMPARED: &[Metric] = &[
    TPS,
    LATENCY_MS_MEAN,
    Metric::new(
        "latency_ms_p50",
        "ms",
        Better::Lower,
        "median transaction latency",
    ),
    Metric::new(
        "latency_ms_p99",
        "ms",
        Better::Lower,
        "99th percentile transaction latency",
    ),
    super::PAGE_READ_MS_AVG,
    super::WAL_SYNC_MS_AVG,
    Metric::new(
        "device_ios_per_txn",
        "I/Os",
        Better::Lower,
        "device I/Os per committed transaction",
    ),
    // A check's `max` on it requires steady windows (`steady`).
    Metric::new(
        "drift_abs_pct",
        "%",
        Better::Lower,
        "how far the window's throughput drifted, either way, in percent of its mean",
    ),
    fault::COMPARED[0],
    fault::COMPARED[1],
    fault::COMPARED[2],
    fault::COMPARED[3],
    fault::COMPARED[4],
    fault::COMPARED[5],
    fault::COMPARED[6],
    fault::COMPARED[7],
];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &[
    "scale",
    "fillfactor",
    "partitions",
    "clients",
    "threads",
    "rate",
    "duration_s",
];
pub const DRIVERS: &[&str] = &["pgfleet", "pgbench"];
/// Transactions per second per client assumed when a cell is given a
/// transaction count instead of a duration (estimates only).
const ESTIMATE_TPS_PER_CLIENT: f64 = 500.0;
/// A run's writes, for the pages its cluster's shutdown writes (estimates
/// only; BENCHMARKS.md "Estimates: pgbench"): random-update on a 1-CPU
/// instance ran ~1,900-1,970 TPS uncapped, and on gp3's 3,000 IOPS ~830-900
/// (~3 device I/Os a transaction). Each UPDATE dirties an accounts page and
/// (the page being full, the new version goes elsewhere) a key leaf.
const ESTIMATE_WRITE_TPS_PER_CPU: f64 = 2_000.0;
const ESTIMATE_IOS_PER_WRITE_TXN: f64 = 3.0;

/// A value of `defines`: `:name` in the script.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Define {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

with_load_keys! {
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Spec {
        /// A built-in script (`tpcb-like`, `simple-update`, `select-only`,
        /// `random-update`).
        #[serde(default)]
        pub script: Option<Spanned<String>>,
        /// A script in pgbench's syntax.
        #[serde(default)]
        pub script_text: Option<Spanned<String>>,
        #[serde(default)]
        pub clients: Option<Spanned<u32>>,
        #[serde(default)]
        pub threads: Option<Spanned<u32>>,
        /// Seconds, or `auto`: measured until the window is steady
        /// (`steady::drift`), at most `max_duration_s`.
        #[serde(default)]
        pub duration_s: Option<Spanned<Seconds>>,
        /// With `duration_s: auto`: the longest window (default 600).
        #[serde(default)]
        pub max_duration_s: Option<Spanned<f64>>,
        #[serde(default)]
        pub transactions: Option<Spanned<u64>>,
        #[serde(default)]
        pub warmup_s: Option<Spanned<f64>>,
        #[serde(default)]
        pub rate: Option<Spanned<f64>>,
        #[serde(default)]
        pub latency_limit_ms: Option<Spanned<f64>>,
        #[serde(default)]
        pub max_tries: Option<Spanned<u32>>,
        #[serde(default)]
        pub defines: Option<BTreeMap<String, Spanned<Define>>>,
        #[serde(default)]
        pub seed: Option<Spanned<u64>>,
        /// Let `\shell` and `\setshell` run commands on the agent's host (in
        /// its sandbox: an unprivileged user, a private /tmp). Off by default.
        #[serde(default)]
        pub allow_shell: Option<Spanned<bool>>,
        /// `pgfleet` (built-in driver, default) or `pgbench` (the real binary).
        #[serde(default)]
        pub driver: Option<Spanned<String>>,
        /// The cache when the measurement starts: `warm` (default: as the load
        /// left it) or `cold` (the cluster restarted, its database's files
        /// evicted from the page cache).
        #[serde(default)]
        pub cache: Option<Spanned<String>>,
        /// Faults injected while the script runs (see `fault`): `kind`
        /// crash, checkpoint, stall or degrade, `at_s` into the measured
        /// window.
        #[serde(default)]
        pub faults: Option<Spanned<Vec<Spanned<FaultSpec>>>>,
    }
}

/// A duration as a scenario writes it: seconds, or `auto`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Seconds {
    Value(f64),
    Text(String),
}

/// `duration_s: auto`'s window when `max_duration_s` is not given.
pub const AUTO_MAX_SECONDS: f64 = 600.0;

impl Seconds {
    /// The seconds, or None for `auto`.
    pub fn value(&self) -> Result<Option<f64>, String> {
        match self {
            Seconds::Value(v) => Ok(Some(*v)),
            Seconds::Text(t) if t.trim() == "auto" => Ok(None),
            Seconds::Text(t) => Err(format!(
                "`{t}` is not a duration: give seconds (e.g. 60) or auto (until the window is steady)"
            )),
        }
    }
}

/// The driver's part of a cell: what runs after the load. Also used by
/// kinds that drive a workload of their own (e.g. a backlog to build).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveParams {
    /// The built-in script's name, or `script` for `script_text`.
    pub script: String,
    pub script_text: Option<String>,
    pub clients: u32,
    pub threads: u32,
    pub duration_s: Option<f64>,
    /// Per client.
    pub transactions: Option<u64>,
    pub warmup_s: f64,
    pub rate: Option<f64>,
    pub latency_limit_ms: Option<f64>,
    pub max_tries: u32,
    pub defines: BTreeMap<String, Define>,
    pub seed: Option<u64>,
    pub driver: String,
    /// `\shell` / `\setshell` may run (in the agent's sandbox).
    #[serde(default)]
    pub allow_shell: bool,
    /// Faults injected while it runs, in time order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
    /// `duration_s: auto`: the window ends once it is steady
    /// (`steady::drift` over the window so far, judged each second from
    /// `steady::MIN_SECONDS` on); `duration_s` is then its longest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub until_steady: bool,
}

const MAX_SECONDS: f64 = 86_400.0;

/// Why a script that might run `\\shell` / `\\setshell` is refused.
pub const SHELL_REFUSED: &str = "the script (or a value substituted into it) contains \\shell or \\setshell, which run commands on the agent's host: set allow_shell: true to let them (the check is deliberately wide: a backslash-shell anywhere, any case, even inside a string or comment, counts)";
const MAX_WARMUP_S: f64 = 3_600.0;
const MAX_CLIENTS: u32 = 10_000;
const MAX_TRIES: u32 = 1000;

impl DriveParams {
    /// The agent's check (see `KindParams::check`).
    pub fn check(&self) -> Result<(), String> {
        use super::within;
        within("clients", self.clients, 1, MAX_CLIENTS)?;
        within("threads", self.threads, 1, self.clients)?;
        if let Some(d) = self.duration_s {
            within("duration_s", d, 0.001, MAX_SECONDS)?;
        }
        within("warmup_s", self.warmup_s, 0.0, MAX_WARMUP_S)?;
        within("max_tries", self.max_tries, 1, MAX_TRIES)?;
        match &self.script_text {
            Some(t) => within("script_text bytes", t.len(), 1, 1 << 20)?,
            None => self.text().map(|_| ())?,
        }
        if self.may_run_shell() && !self.allow_shell {
            return Err(SHELL_REFUSED.into());
        }
        if !self.faults.is_empty() && (self.driver != "pgfleet" || self.duration_s.is_none()) {
            return Err("faults need driver: pgfleet and duration_s".into());
        }
        if self.until_steady {
            let min = super::steady::MIN_SECONDS as f64;
            if self.driver != "pgfleet" || !self.faults.is_empty() {
                return Err("duration_s: auto needs driver: pgfleet and no faults".into());
            }
            within(
                "duration_s (auto's longest)",
                self.duration_s.unwrap_or(0.0),
                min,
                MAX_SECONDS,
            )?;
        }
        for f in &self.faults {
            f.check()?;
        }
        Ok(())
    }
    /// Whether the script, or a value substituted into it, might run a
    /// host command under either driver (`script::may_run_shell`, a
    /// superset of both parsers).
    pub fn may_run_shell(&self) -> bool {
        self.text().is_ok_and(crate::script::may_run_shell)
            || self
                .defines
                .values()
                .any(|d| matches!(d, Define::Str(s) if crate::script::may_run_shell(s)))
    }
    /// The script's text: `script_text`, or the built-in's.
    pub fn text(&self) -> Result<&str, String> {
        match &self.script_text {
            Some(t) => Ok(t),
            None => builtin(&self.script)
                .ok_or_else(|| format!("unknown built-in script `{}`", self.script)),
        }
    }
    fn seconds(&self) -> f64 {
        self.warmup_s
            + self
                .duration_s
                .unwrap_or_else(|| self.transactions.unwrap_or(0) as f64 / ESTIMATE_TPS_PER_CLIENT)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub init: InitParams,
    pub drive: DriveParams,
    /// `warm` or `cold` (see `Spec::cache`).
    #[serde(default)]
    pub cache: Cache,
}

/// A point's parameters (one per cell).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointParams {
    pub script: String,
    pub driver: String,
    pub scale: u64,
    pub clients: u32,
    pub threads: u32,
    /// The window (with `until_steady`, its longest).
    pub duration_s: Option<f64>,
    /// `duration_s: auto` (see `DriveParams::until_steady`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub until_steady: bool,
    pub transactions_per_client: Option<u64>,
    pub rate: Option<f64>,
    pub latency_limit_ms: Option<f64>,
    pub warmup_s: f64,
    /// The cache when the measurement started: `warm` or `cold`.
    #[serde(default)]
    pub cache: Cache,
    /// The faults injected (part of what the point is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
}

/// pgbench's figures for the measured window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub tps: f64,
    pub latency_ms_mean: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p90: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_p999: f64,
    pub latency_ms_max: f64,
    /// The latency distribution, in microseconds: `[value, count]` per
    /// non-empty bucket of the driver's HDR histogram (3 significant
    /// digits), so reports merge clusters' distributions rather than take
    /// medians of their quantiles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_histogram_us: Vec<[u64; 2]>,
    pub transactions: u64,
    pub failures: u64,
    /// By pgbench's classes: serialization, deadlock, other.
    pub failures_by_class: BTreeMap<String, u64>,
    pub retries: u64,
    pub skipped: u64,
    pub late: u64,
    /// The cluster's own device's reads and writes per committed
    /// transaction over the sampled window; None without such a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_ios_per_txn: Option<f64>,
    /// The measured window's seconds (a timed one; with `duration_s:
    /// auto`, where it ended). None in results stored before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Whether the window's throughput held (`steady::drift`); None for a
    /// window too short to judge, and in results stored before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steady: Option<bool>,
    /// The window's drift in percent of its mean TPS, and its interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_interval_pct: Option<[f64; 2]>,
    /// `drift_pct`'s magnitude: what a check bounds (`max: 10` fails a
    /// window that rose or fell more than 10 %).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_abs_pct: Option<f64>,
    #[serde(flatten)]
    pub internals: Internals,
    #[serde(flatten)]
    pub load: pgbench_init::Metrics,
    /// Each injected fault, measured (in time order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultFigures>,
    /// The worst of the faults' figures, as compared metrics.
    #[serde(flatten)]
    pub fault_metrics: FaultMetrics,
}

pub type Point = super::Point<PointParams, Metrics>;

/// Per-second figures of the measured window (samples of kind `second`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Second {
    pub second: u64,
    pub tps: u64,
    pub latency_ms_mean: Option<f64>,
    pub latency_ms_p50: Option<f64>,
    pub latency_ms_p99: Option<f64>,
    pub latency_ms_max: f64,
}

/// Checks the driver keys (shared with kinds that drive a script).
#[allow(clippy::too_many_arguments)]
pub fn check_drive(f: &Field, s: &Spec) -> Checked<DriveParams> {
    // `duration_s`: seconds (`fixed`), or `auto` (until steady).
    let mut auto = false;
    let fixed: Option<Spanned<f64>> = match &s.duration_s {
        None => None,
        Some(d) => match d
            .value
            .value()
            .or_else(|why| f.err(d.referenced, "duration_s", why))?
        {
            Some(value) => Some(Spanned {
                value,
                referenced: d.referenced,
                defined: d.defined,
            }),
            None => {
                auto = true;
                None
            }
        },
    };
    f.in_range(&fixed, "duration_s", 0.001, MAX_SECONDS, " seconds")?;
    let min = super::steady::MIN_SECONDS as f64;
    f.in_range(
        &s.max_duration_s,
        "max_duration_s",
        min,
        MAX_SECONDS,
        " seconds (auto judges windows of 20 s and more)",
    )?;
    // `max_duration_s` bounds `auto` only: beside seconds it is allowed
    // (a sweep `duration_s: [60, auto]` gives both) and has no effect.
    if let (true, Some(d)) = (auto, &s.duration_s) {
        if s.driver.as_ref().is_some_and(|d| d.value == "pgbench") {
            return f.err(d.referenced, "duration_s", "duration_s: auto stops the window once it is steady, which pgbench (-T) cannot: use driver: pgfleet, or give seconds");
        }
        if s.faults.as_ref().is_some_and(|v| !v.value.is_empty()) {
            return f.err(
                d.referenced,
                "duration_s",
                "faults are placed in a window of known length: give duration_s in seconds",
            );
        }
    }
    let duration = match (&fixed, auto, &s.transactions) {
        (Some(d), _, _) => Some(d.value),
        (None, true, _) => Some(
            s.max_duration_s
                .as_ref()
                .map_or(AUTO_MAX_SECONDS, |m| m.value),
        ),
        (None, false, None) => Some(60.0),
        (None, false, Some(_)) => None,
    };
    f.in_range(&s.warmup_s, "warmup_s", 0.0, MAX_WARMUP_S, " seconds")?;
    f.in_range(&s.clients, "clients", 1, MAX_CLIENTS, "")?;
    let clients = or(&s.clients, 1);
    f.in_range(
        &s.threads,
        "threads",
        1,
        clients,
        " (no more threads than clients)",
    )?;
    f.in_range(&s.transactions, "transactions", 1, u64::MAX, "")?;
    f.in_range(&s.rate, "rate", 0.001, 1e9, " transactions per second")?;
    f.in_range(&s.latency_limit_ms, "latency_limit_ms", 0.001, 3.6e6, " ms")?;
    f.in_range(&s.max_tries, "max_tries", 1, MAX_TRIES, "")?;
    let driver = or(&s.driver, "pgfleet".to_string());
    if let Some(d) = &s.driver {
        f.one_of(d, "driver", DRIVERS, "driver")?;
        let total = or(&fixed, 0.0) + or(&s.warmup_s, 0.0);
        if d.value == "pgbench"
            && let Some(ds) = &fixed
            && total.fract() != 0.0
        {
            return f.err(
                ds.referenced,
                "duration_s",
                format!(
                    "driver: pgbench runs whole seconds (pgbench -T): duration_s + warmup_s is {total}, make it e.g. {}",
                    total.ceil()
                ),
            );
        }
    }
    if let (Some(d), Some(_)) = (&s.duration_s, &s.transactions) {
        return f.err(
            d.referenced,
            "duration_s",
            "give duration_s or transactions, not both",
        );
    }
    if let (Some(sc), Some(_)) = (&s.script, &s.script_text) {
        return f.err(
            sc.referenced,
            "script",
            "give script (a built-in) or script_text, not both",
        );
    }
    if let Some(sc) = &s.script
        && builtin(&sc.value).is_none()
    {
        let names: Vec<&str> = BUILTIN_SCRIPTS.iter().map(|b| b.0).collect();
        return f.err(
            sc.referenced,
            "script",
            format!(
                "unknown built-in script `{}`: allowed {}",
                sc.value,
                names.join(", ")
            ),
        );
    }
    if !s.allow_shell.as_ref().is_some_and(|a| a.value) {
        if let Some(t) = &s.script_text
            && crate::script::may_run_shell(&t.value)
        {
            return f.err(t.referenced, "script_text", SHELL_REFUSED);
        }
        for (k, v) in s.defines.iter().flatten() {
            if let Define::Str(text) = &v.value
                && crate::script::may_run_shell(text)
            {
                return f.err(v.referenced, &format!("defines.{k}"), SHELL_REFUSED);
            }
        }
    }
    // Under driver: pgbench the script is pgbench's own to judge: the
    // real pgbench, where one is installed (the agent's run judges again).
    if let Some(t) = &s.script_text
        && driver == "pgbench"
        && let Some(Err(why)) = pgbench_verdict(&t.value)
    {
        // pgbench names the line as `script_text:N:`.
        let line = why
            .strip_prefix("script_text:")
            .and_then(|r| r.split(':').next()?.parse().ok())
            .unwrap_or(0);
        return f.err_on_line(
            t.referenced,
            "script_text",
            line,
            format!("pgbench rejects the script: {why}"),
        );
    }
    if let Some(t) = &s.script_text
        && driver != "pgbench"
    {
        Script::parse("script_text", &t.value)
            .or_else(|e| f.err_on_line(t.referenced, "script_text", e.line, e.to_string()))?;
    }
    let mut defines = BTreeMap::new();
    for (k, v) in s.defines.iter().flatten() {
        if !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || k.is_empty() {
            return f.err(
                v.referenced,
                &format!("defines.{k}"),
                format!("`{k}` is not a variable name (letters, digits, _)"),
            );
        }
        // Text is kept as text, as pgbench's -D keeps it: substituted into
        // SQL as given, read as a value (`null`, a boolean, a number) only
        // where an expression uses it.
        defines.insert(k.clone(), v.value.clone());
    }
    let script = match &s.script_text {
        Some(_) => "script".to_string(),
        None => or(&s.script, "tpcb-like".to_string()),
    };
    Ok(DriveParams {
        script,
        script_text: opt(&s.script_text),
        clients,
        threads: or(&s.threads, 1),
        duration_s: duration,
        until_steady: auto,
        transactions: opt(&s.transactions),
        warmup_s: or(&s.warmup_s, 0.0),
        rate: opt(&s.rate),
        latency_limit_ms: opt(&s.latency_limit_ms),
        max_tries: or(&s.max_tries, 10),
        defines,
        seed: opt(&s.seed),
        faults: fault::check(f, &s.faults, duration, &driver, fault::ON_A_SCRIPT)?,
        driver,
        allow_shell: s.allow_shell.as_ref().is_some_and(|a| a.value),
    })
}

impl KindSpec for Spec {
    type Params = Params;
    fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
        let init = self.init(f)?;
        let drive = check_drive(f, self)?;
        let cache = f.cache(&self.cache, Cache::Warm)?;
        Ok(vec![(drive.script.clone(), Params { init, drive, cache })])
    }
}

impl Params {
    /// The cluster's shutdown writes the pages the run dirtied since the
    /// last checkpoint: an accounts page and a key leaf per UPDATE, up to
    /// the tables' pages; one I/O each where the class caps IOPS (gp3: a
    /// 30-s run's ~57,000 pages took ~16 s), as bytes elsewhere.
    fn shutdown_seconds(&self, c: &Capacity) -> f64 {
        if self.drive.script == "select-only" {
            return 0.0;
        }
        let tps =
            (c.cpus * ESTIMATE_WRITE_TPS_PER_CPU).min(c.write_iops() / ESTIMATE_IOS_PER_WRITE_TXN);
        let updates = match (self.drive.duration_s, self.drive.transactions) {
            (Some(d), _) => tps * (d + self.drive.warmup_s),
            (None, Some(t)) => (t * self.drive.clients as u64) as f64,
            (None, None) => 0.0,
        };
        let pages = |bytes_per_scale: u64| (self.init.scale * bytes_per_scale / 8192) as f64;
        let dirty = updates.min(pages(pgbench_init::ACCOUNTS_HEAP_BYTES_PER_SCALE))
            + updates.min(pages(pgbench_init::ACCOUNTS_INDEX_BYTES_PER_SCALE));
        let writes = if c.caps.write_iops > 0 {
            Work::default().flushing(dirty)
        } else {
            Work::default().writing(dirty * 8192.0)
        };
        writes.seconds(c)
    }
}

impl KindParams for Params {
    fn allow_shell(&self) -> bool {
        self.drive.allow_shell
    }
    fn check(&self) -> Result<(), String> {
        self.init.check()?;
        self.drive.check()
    }
    fn estimate(&self, c: &Capacity) -> Estimate {
        let load = self.init.estimate(c);
        let measured = self.drive.duration_s.unwrap_or(0.0);
        let shutdown = self.shutdown_seconds(c);
        Estimate {
            seconds: load.seconds + self.drive.seconds() + shutdown,
            measured_seconds: measured.max(self.drive.seconds() - self.drive.warmup_s),
            // Updates leave dead versions and WAL; allow another max_wal_size.
            disk_bytes: load.disk_bytes + (1 << 30),
            load_seconds: load.load_seconds,
            prepare_seconds: self.drive.warmup_s,
            ..Estimate::default()
        }
    }

    fn working_set_bytes(&self) -> Option<u64> {
        Some(self.init.data_bytes())
    }
    fn dataset(&self) -> Option<crate::dataset::Dataset> {
        Some(self.init.as_dataset())
    }
    /// What `pgbench` itself leaves between runs, minus the history its
    /// transactions appended: balances stay as updated (as between two
    /// pgbench runs on one database), dead rows vacuumed.
    fn reset(&self) -> Option<&'static [&'static str]> {
        Some(&[
            "TRUNCATE pgbench_history",
            "VACUUM (ANALYZE) pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history",
        ])
    }
}

/// The real pgbench's verdict on a script: it parses its scripts before it
/// connects, so pointed at a socket that cannot exist it stops right after
/// judging. None: no pgbench here (`PGFLEET_PG_BIN`, the default
/// version's install, `PATH`, or Debian's /usr/lib/postgresql/*/bin).
/// The query mode `driver: pgbench` runs a script with: prepared
/// statements as pgfleet's driver; the simple protocol for a script with
/// compound commands (`\;`), which pgfleet's driver uses for those alone.
/// (The mode changes what pgbench accepts: its limit on a statement's
/// variables holds only for prepared statements.)
pub fn pgbench_query_mode(script: &str) -> &'static str {
    if script.contains("\\;") {
        "simple"
    } else {
        "prepared"
    }
}

/// How long the installed pgbench may take to parse a script: it exits
/// before connecting, in milliseconds; a bound so a pathological text (or
/// a hung binary) never holds a validation.
const PGBENCH_PARSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub fn pgbench_verdict(script: &str) -> Option<Result<(), String>> {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let mut candidates: Vec<std::path::PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("PGFLEET_PG_BIN") {
        candidates.push(std::path::Path::new(&d).join("pgbench"));
    }
    // The default version's, which runs a class that names none.
    if let Some(d) = crate::installs::find(crate::installs::DEFAULT) {
        candidates.push(d.join("pgbench"));
    }
    for d in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        candidates.push(d.join("pgbench"));
    }
    let mut debian: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/pgbench"))
        .collect();
    debian.sort_by_key(|p| {
        p.components()
            .nth(4)
            .and_then(|c| c.as_os_str().to_str()?.parse::<u32>().ok())
    });
    candidates.extend(debian.into_iter().rev());
    let bin = candidates.into_iter().find(|p| p.is_file())?;
    // The script goes through pgbench's standard input (`-f -`): no file
    // is written anywhere, so no path in a shared directory can be planted
    // (a predictable temp file once let a symlink redirect the write).
    let mut child = std::process::Command::new(&bin)
        .args([
            "-n",
            "-M",
            pgbench_query_mode(script),
            "-t",
            "1",
            "-p",
            "1",
            "-h",
            "/nonexistent/pgfleet-script-check",
            "-f",
            "-",
        ])
        .env_remove("PGHOST")
        .env_remove("PGSERVICE")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take()?;
    let text = script.to_owned();
    // Written from a thread: pgbench reads the whole script before it
    // writes anything, but a pipe's buffer is smaller than a script.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(text.as_bytes());
    });
    let mut stderr = child.stderr.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stderr).take(1 << 20).read_to_end(&mut out);
        out
    });
    let deadline = std::time::Instant::now() + PGBENCH_PARSE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = writer.join();
                let _ = reader.join();
                return Some(Err(format!(
                    "the installed pgbench did not finish parsing the script within {} s",
                    PGBENCH_PARSE_TIMEOUT.as_secs()
                )));
            }
        }
    }
    let _ = writer.join();
    let stderr = reader.join().ok()?;
    let stderr = String::from_utf8_lossy(&stderr);
    if stderr.contains("connection to server") || stderr.contains("could not connect") {
        return Some(Ok(()));
    }
    let why: Vec<String> = stderr
        .lines()
        .map(|l| {
            let l = l.trim_start_matches("pgbench: error: ");
            match l.strip_prefix("-:") {
                Some(rest) => format!("script_text:{rest}"),
                None => l.to_string(),
            }
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    Some(Err(why.join("\n")))
}
