//! Workload kinds: the one home of each kind's definition, shared by the
//! controller and the agent.
//!
//! A kind lives in one file here (`toast_slice.rs`, `pgbench.rs`, ...) with:
//! - `Spec`: the scenario keys of the kind (serde, `deny_unknown_fields`,
//!   values `Spanned` so errors carry `line:column`), and `KindSpec::plan`,
//!   which validates them, applies the defaults and splits the entry into
//!   cells: one `Params` each;
//! - `Params`: what the agent receives for one cell, typed (serde JSON on
//!   the wire, so `4510.0` stays a float and `10` an integer);
//!   `KindParams::estimate` says how long the cell takes and how much disk it
//!   needs, from the parameters alone;
//! - `Point` / `Metrics`: what the agent returns per measured point, typed
//!   the same way, read back by the report.
//!
//! DEVELOPER NOTE — how to add a workload kind:
//! 1. `proto/src/workload/<kind>.rs`: `Spec`, `Params`, point params and
//!    `Metrics`, implementing `KindSpec` and `KindParams`.
//! 2. One line in the `kinds!` table below.
//! 3. `agent/src/workload/<kind>.rs`: the code that runs it, and one line in
//!    the agent's `run` match (`agent/src/workload/mod.rs`).
//! 4. `controller/report/src/<kind>.rs`: its report section, and one line in
//!    the report's section table.
//! 5. A test against real clusters (`agent/tests/`).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

pub use serde_saphyr::{Location, Spanned};

pub mod compression_analysis;
pub mod fault;
pub mod fio;
pub mod logical_drain;
pub mod pgbench;
pub mod pgbench_init;
pub mod read_write;
pub mod steady;
pub mod toast_probe;
pub mod toast_slice;
pub mod vacuum_bloat;

/// A value the checks refused: where it is, its field path, what is wrong
/// and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub at: Location,
    pub field: String,
    pub message: String,
    /// For a multi-line value (a script): the line of the value the error
    /// is on, 1-based; 0 for the value as a whole. Where the value is a
    /// YAML block scalar, the scenario's error points at that line.
    pub value_line: usize,
}

pub type Checked<T> = Result<T, Invalid>;

/// Field paths of one workload entry: `workloads[3].scale`.
#[derive(Debug, Clone)]
pub struct Field {
    prefix: String,
    /// Where the entry's `kind` is: errors about missing keys point there.
    pub kind_at: Location,
}

impl Field {
    pub fn new(prefix: impl Into<String>, kind_at: Location) -> Self {
        Field {
            prefix: prefix.into(),
            kind_at,
        }
    }
    pub fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.prefix)
    }
    pub fn err<T>(&self, at: Location, key: &str, message: impl Into<String>) -> Checked<T> {
        Err(Invalid {
            at,
            field: self.at(key),
            message: message.into(),
            value_line: 0,
        })
    }
    /// An error on line `value_line` of a multi-line value (a script).
    pub fn err_on_line<T>(
        &self,
        at: Location,
        key: &str,
        value_line: usize,
        message: impl Into<String>,
    ) -> Checked<T> {
        self.err(at, key, message)
            .map_err(|e| Invalid { value_line, ..e })
    }
    /// `v` (when given) must lie in `lo..=hi`.
    pub fn in_range<T: PartialOrd + fmt::Display + Copy>(
        &self,
        v: &Option<Spanned<T>>,
        key: &str,
        lo: T,
        hi: T,
        unit: &str,
    ) -> Checked<()> {
        match v {
            Some(x) if !(x.value >= lo && x.value <= hi) => self.err(
                x.referenced,
                key,
                format!("{} is out of range: allowed {lo}..={hi}{unit}", x.value),
            ),
            _ => Ok(()),
        }
    }
    /// A size key (`"10GB"` or bytes) of at least `min` bytes, if given.
    pub fn bytes(
        &self,
        v: &Option<Spanned<ByteSize>>,
        key: &str,
        min: u64,
    ) -> Checked<Option<u64>> {
        let Some(b) = v else {
            return Ok(None);
        };
        let n = b
            .value
            .bytes()
            .or_else(|m| self.err(b.referenced, key, m))?;
        if n < min {
            return self.err(
                b.referenced,
                key,
                format!(
                    "{} is out of range: allowed at least {}",
                    approx_bytes(n),
                    approx_bytes(min)
                ),
            );
        }
        Ok(Some(n))
    }

    /// A list of names from `allowed`: not empty, none twice; `default`
    /// when the key is absent.
    pub fn names(
        &self,
        list: &Option<Vec<Spanned<String>>>,
        key: &str,
        allowed: &[&str],
        what: &str,
        default: &[&str],
    ) -> Checked<Vec<String>> {
        let Some(list) = list else {
            return Ok(default.iter().map(|s| s.to_string()).collect());
        };
        if list.is_empty() {
            return self.err(
                self.kind_at,
                key,
                format!("must not be empty: allowed {}", allowed.join(", ")),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for (j, m) in list.iter().enumerate() {
            self.one_of(m, &format!("{key}[{j}]"), allowed, what)?;
            if !seen.insert(&m.value) {
                return self.err(
                    m.referenced,
                    &format!("{key}[{j}]"),
                    format!("`{}` is listed twice", m.value),
                );
            }
        }
        Ok(list.iter().map(|m| m.value.clone()).collect())
    }

    /// `v` must be one of `allowed`.
    pub fn one_of(
        &self,
        v: &Spanned<String>,
        key: &str,
        allowed: &[&str],
        what: &str,
    ) -> Checked<()> {
        if allowed.contains(&v.value.as_str()) {
            Ok(())
        } else {
            self.err(
                v.referenced,
                key,
                format!(
                    "unknown {what} `{}`: allowed {}",
                    v.value,
                    allowed.join(", ")
                ),
            )
        }
    }
}

/// The value of an optional key, or its default.
pub fn or<T: Clone>(v: &Option<Spanned<T>>, default: T) -> T {
    v.as_ref().map(|x| x.value.clone()).unwrap_or(default)
}

/// The page cache when a measurement starts (the `cache` key of the kinds
/// that take one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cache {
    /// As the load or the previous step left it.
    #[default]
    Warm,
    /// The cluster restarted and the measured files evicted from the OS
    /// page cache: reads reach the storage.
    Cold,
}

impl Cache {
    pub const NAMES: &'static [&'static str] = &["warm", "cold"];

    pub fn name(self) -> &'static str {
        match self {
            Cache::Warm => "warm",
            Cache::Cold => "cold",
        }
    }
}

impl fmt::Display for Cache {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.pad(self.name())
    }
}

impl Field {
    /// The `cache` key: `warm` or `cold`, else `default`.
    pub fn cache(&self, v: &Option<Spanned<String>>, default: Cache) -> Checked<Cache> {
        let Some(v) = v else {
            return Ok(default);
        };
        self.one_of(v, "cache", Cache::NAMES, "cache state")?;
        Ok(if v.value == "cold" {
            Cache::Cold
        } else {
            Cache::Warm
        })
    }
}

/// The value of an optional key.
pub fn opt<T: Clone>(v: &Option<Spanned<T>>) -> Option<T> {
    v.as_ref().map(|x| x.value.clone())
}

/// How long a cell takes and how much disk it needs, from its parameters.
/// Rough by nature (this machine's speeds are not known in advance); what
/// matters is the order of magnitude, so that a 90-minute scenario says so.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimate {
    /// Wall-clock seconds on an agent: setup, load and measurement.
    pub seconds: f64,
    /// Timed measurement within `seconds` (what the scenario asks for).
    pub measured_seconds: f64,
    /// Disk the cell's cluster needs at its largest (data, indexes, WAL).
    pub disk_bytes: u64,
    /// The part of `seconds` loading the cell's dataset: what a restore
    /// replaces (`data: reuse`). A plan that restores it puts the restore
    /// here (with `hydrate_seconds` of it reading a snapshot's copy first).
    pub load_seconds: f64,
    /// The kind's own preparation before it measures: a warm-up, the
    /// UPDATE pass that makes bloat, a drain's initial sync and backlog,
    /// the tables a probe writes.
    pub prepare_seconds: f64,
    /// Set by a plan: the part of `load_seconds` reading a snapshot's copy
    /// in full before restoring it, and the seconds after the load copying
    /// a built dataset into the store.
    pub hydrate_seconds: f64,
    pub publish_seconds: f64,
}

impl Estimate {
    /// Where `seconds` go. The rest (`other`) is what no phase names:
    /// provisioning, a drain's final checksum, teardown.
    pub fn phases(&self) -> Phases {
        let data = self.load_seconds + self.publish_seconds;
        Phases {
            data,
            hydrate: self.hydrate_seconds,
            publish: self.publish_seconds,
            prepare: self.prepare_seconds,
            measure: self.measured_seconds,
            other: (self.seconds - data - self.prepare_seconds - self.measured_seconds).max(0.0),
        }
    }
}

/// A cell's estimated (or measured) seconds by phase; `data`, `prepare`,
/// `measure` and `other` add up to the whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Phases {
    /// Moving the cell's data: loading it, or restoring it (and reading
    /// it back), or resetting a kept cluster; and publishing a built one.
    pub data: f64,
    /// Of `data`: hydrating a snapshot's copy, publishing a built dataset.
    pub hydrate: f64,
    pub publish: f64,
    pub prepare: f64,
    pub measure: f64,
    pub other: f64,
}

impl Phases {
    pub fn total(&self) -> f64 {
        self.data + self.prepare + self.measure + self.other
    }
    /// The sum of several cells' phases.
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a Phases>) -> Phases {
        all.into_iter().fold(Phases::default(), |a, p| Phases {
            data: a.data + p.data,
            hydrate: a.hydrate + p.hydrate,
            publish: a.publish + p.publish,
            prepare: a.prepare + p.prepare,
            measure: a.measure + p.measure,
            other: a.other + p.other,
        })
    }
    /// "data 8 min · prepare 2 min · measure 1 min · other 20 s", the
    /// phases with any time.
    pub fn describe(&self) -> String {
        [
            ("data", self.data),
            ("prepare", self.prepare),
            ("measure", self.measure),
            ("other", self.other),
        ]
        .into_iter()
        .filter(|(_, s)| *s >= 0.5)
        .map(|(n, s)| format!("{n} {}", approx_seconds(s)))
        .collect::<Vec<_>>()
        .join(" · ")
    }
    /// "data movement 80 % (hydrate 5 %, publish 3 %), preparation 10 %,
    /// measuring 8 %, the rest 2 %": each phase's share of the whole.
    pub fn shares(&self) -> String {
        let t = self.total().max(1e-9);
        let pct = |s: f64| format!("{:.0} %", 100.0 * s / t);
        let mut data = format!("data movement {}", pct(self.data));
        let within: Vec<String> = [("hydrate", self.hydrate), ("publish", self.publish)]
            .into_iter()
            .filter(|(_, s)| *s > 0.0)
            .map(|(n, s)| format!("{n} {}", pct(s)))
            .collect();
        if !within.is_empty() {
            data += &format!(" (of it {})", within.join(", "));
        }
        format!(
            "{data}, preparation {}, measuring {}, the rest {}",
            pct(self.prepare),
            pct(self.measure),
            pct(self.other)
        )
    }
}

// A cluster's size on disk: where datasets need it too.
pub use crate::dataset::{CLUSTER_BASE_BYTES, pgdata_bytes};
/// Assumed speed of server-side bulk work (load, COPY, index builds) when
/// estimating; deliberately modest.
pub const ESTIMATE_BYTES_PER_SECOND: f64 = 40.0 * 1024.0 * 1024.0;
/// Provisioning and teardown of a cluster.
pub const ESTIMATE_CLUSTER_SECONDS: f64 = 5.0;
/// An uncapped disk's sequential rates when estimating: what restores
/// (~800 MB/s) and loads reached on the reference host (BENCHMARKS.md,
/// "Datasets"), well under fio's 2,205 MiB/s there.
pub const HOST_READ_BYTES_PER_SECOND: f64 = 800e6;
pub const HOST_WRITE_BYTES_PER_SECOND: f64 = 800e6;
/// A sequential scan's bytes per second on one core (reading pages
/// through shared buffers, little work per row).
pub const SCAN_BYTES_PER_CPU_SECOND: f64 = 400e6;
/// An uncapped disk's synchronous I/Os per second (a WAL flush each): the
/// reference host's disk flushed the storage suite's backlog at ~7,500 a
/// second (64 MiB in ~40 s; BENCHMARKS.md "Estimates"). Another host's
/// disk differs: the report sets each cell's time beside its estimate.
pub const HOST_IOPS: f64 = 7_500.0;

/// What a class gives a cell, as estimates see it: the CPUs its cluster
/// may use and its storage's caps (a zero cap: the host's disk as is, at
/// the `HOST_*` rates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    pub cpus: f64,
    /// The instance's memory (0: not bounded, the host's).
    pub memory_bytes: u64,
    pub caps: crate::environment::Caps,
}

impl Capacity {
    /// Two cores of the reference host, uncapped, and the same behind
    /// gp3's baseline (3,000 IOPS and 125 MiB/s of reads and writes
    /// together): the classes the kinds' estimate tests compare.
    #[cfg(test)]
    pub(crate) fn two_cores_and_gp3() -> (Capacity, Capacity) {
        let two = Capacity {
            cpus: 2.0,
            memory_bytes: 0,
            caps: Default::default(),
        };
        let gp3 = crate::environment::Caps {
            read_iops: 3000,
            write_iops: 3000,
            read_mbps: 125,
            write_mbps: 125,
            combined: true,
            latency: Default::default(),
        };
        (two, Capacity { caps: gp3, ..two })
    }

    /// This host, uncapped.
    pub fn host() -> Capacity {
        Capacity {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
            memory_bytes: 0,
            caps: Default::default(),
        }
    }
    fn rate(cap: u64, unit: f64, host: f64) -> f64 {
        if cap == 0 {
            host
        } else {
            (cap as f64 * unit).min(host)
        }
    }
    pub fn read_bytes_per_s(&self) -> f64 {
        Self::rate(self.caps.read_mbps, 1048576.0, HOST_READ_BYTES_PER_SECOND)
    }
    pub fn write_bytes_per_s(&self) -> f64 {
        Self::rate(self.caps.write_mbps, 1048576.0, HOST_WRITE_BYTES_PER_SECOND)
    }
    pub fn read_iops(&self) -> f64 {
        Self::rate(self.caps.read_iops, 1.0, HOST_IOPS)
    }
    pub fn write_iops(&self) -> f64 {
        Self::rate(self.caps.write_iops, 1.0, HOST_IOPS)
    }
}

/// One step of a cell's work as estimates see it. It takes as long as the
/// slowest of what it asks for on the class: its CPU time (seconds on one
/// core of the reference host) over the cores it can use, its bytes over
/// the storage's MB/s, its I/Os that each wait for the device (random
/// reads, WAL flushes) over the storage's IOPS.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    pub cpu_seconds: f64,
    /// Cores it can keep busy (connections, parallel workers); at least 1.
    pub threads: f64,
    pub read_bytes: f64,
    pub write_bytes: f64,
    pub read_ios: f64,
    pub write_ios: f64,
}

impl Work {
    /// Server-side bulk writing (COPY, INSERT, index builds) of `bytes`:
    /// one backend at `ESTIMATE_BYTES_PER_SECOND`, or the write cap.
    pub fn bulk_write(bytes: f64) -> Work {
        Work::cpu(bytes / ESTIMATE_BYTES_PER_SECOND, 1.0).writing(bytes)
    }
    /// A sequential scan of `bytes` from the device (one backend, or the
    /// read cap).
    pub fn scan(bytes: f64) -> Work {
        Work::cpu(bytes / SCAN_BYTES_PER_CPU_SECOND, 1.0).reading(bytes)
    }
    /// CPU-bound work on `threads` cores.
    pub fn cpu(cpu_seconds: f64, threads: f64) -> Work {
        Work {
            cpu_seconds,
            threads,
            ..Work::default()
        }
    }
    /// The step also reads `bytes` sequentially.
    pub fn reading(self, bytes: f64) -> Work {
        Work {
            read_bytes: bytes,
            ..self
        }
    }
    /// The step also writes `bytes`.
    pub fn writing(self, bytes: f64) -> Work {
        Work {
            write_bytes: bytes,
            ..self
        }
    }
    /// The step also reads `ios` pages at random, each a wait.
    pub fn random_reads(self, ios: f64) -> Work {
        Work {
            read_ios: ios,
            ..self
        }
    }
    /// The step also waits for `ios` synchronous writes (WAL flushes).
    pub fn flushing(self, ios: f64) -> Work {
        Work {
            write_ios: ios,
            ..self
        }
    }
    /// Where the storage's caps are one budget for reads and writes
    /// (`Caps::combined`, gp3 as EBS counts it), a step's reads and writes
    /// share it: their times add up.
    pub fn seconds(&self, c: &Capacity) -> f64 {
        let cores = self.threads.max(1.0).min(c.cpus.max(0.1));
        let (rb, wb) = (
            self.read_bytes / c.read_bytes_per_s(),
            self.write_bytes / c.write_bytes_per_s(),
        );
        let (ri, wi) = (
            self.read_ios / c.read_iops(),
            self.write_ios / c.write_iops(),
        );
        let io = if c.caps.combined {
            [rb + wb, ri + wi]
        } else {
            [rb.max(wb), ri.max(wi)]
        };
        [self.cpu_seconds / cores, io[0], io[1]]
            .into_iter()
            .fold(0.0, f64::max)
    }
}

/// The scenario side of a kind.
pub trait KindSpec {
    type Params;
    /// Validates the keys (errors located at the offending value), applies
    /// the defaults and splits the entry into cells: (id stem, params).
    fn plan(&self, f: &Field) -> Checked<Vec<(String, Self::Params)>>;
}

/// The agent side of a kind's parameters.
pub trait KindParams {
    /// How long a cell takes on a class of this capacity, and its disk.
    fn estimate(&self, c: &Capacity) -> Estimate;
    /// The roles of a cell of this kind, each on its own agent and cluster,
    /// the lead first: the lead's result holds the measurement, and when it
    /// reports, the other roles are released. One role named "" is a
    /// single-role cell.
    fn roles(&self) -> &'static [&'static str] {
        &[""]
    }
    /// PostgreSQL settings the kind needs on a role's cluster; they override
    /// the instance class's, and the cell's environment reports them.
    fn settings(&self, _role: &str) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The data the measurement reads at random (e.g. pgbench's accounts
    /// and key): when it fits in the instance's memory, reads never reach
    /// the storage under test. None: the kind does not read that way.
    fn working_set_bytes(&self) -> Option<u64> {
        None
    }
    /// The data a measurement expects to read from the OS page cache (e.g.
    /// read-write's `seq-os-cache` scan): when it exceeds the memory the
    /// cluster has, the "cached" figure is a cold read. None: none.
    fn cached_read_bytes(&self) -> Option<u64> {
        None
    }
    /// The cell's cluster runs in a block-I/O cgroup that counts the bytes
    /// its processes read and write on the device (the workload reads them
    /// with `Cluster::io_bytes`), where the agent can create one (root).
    fn account_io(&self) -> bool {
        false
    }
    /// The scenario opted in to acting on the agent's host (`allow_shell`):
    /// `\shell` in scripts, settings that run commands or load code
    /// (`crate::settings`), and a superuser workload role.
    fn allow_shell(&self) -> bool {
        false
    }
    /// The agent's own check of what it was sent: the sizes and counts that
    /// drive its memory, disk and loops, within the bounds validation
    /// allows. The controller validated them; the agent does not trust that.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
    /// The data the measurement starts from, when the agent may build it
    /// once and restore it for later cells (`data: reuse`): its loader
    /// and the keys that shape its bytes (on a multi-role cell's
    /// `dataset_role`). None: the kind loads its own every time (its load
    /// is its measurement).
    fn dataset(&self) -> Option<crate::dataset::Dataset> {
        None
    }
    /// Statements, each run on its own as the workload role, that bring a cell's data back to
    /// where the next cell of its dataset may start from on the same
    /// cluster (`reuse_cluster: true`), e.g. pgbench's history emptied and
    /// its tables vacuumed. None: a used cluster is not that dataset any
    /// more (the kind refuses `reuse_cluster`).
    fn reset(&self) -> Option<&'static [&'static str]> {
        None
    }
    /// The role whose cluster holds the dataset (`dataset`), built or
    /// restored by that role's agent before it reports its cluster to its
    /// peers; "" in a single-role cell.
    fn dataset_role(&self) -> &'static str {
        ""
    }
}

/// `v` within `lo..=hi`, or an error naming `key` (the agent's checks).
pub fn within<T: PartialOrd + fmt::Display>(key: &str, v: T, lo: T, hi: T) -> Result<(), String> {
    if v >= lo && v <= hi {
        Ok(())
    } else {
        Err(format!("{key} = {v} is out of range: allowed {lo}..={hi}"))
    }
}

/// A size in bytes as a scenario writes it: `10737418240`, `"10GiB"`,
/// `"64MB"` (kB, MB, GB, TB are 1024-based, as PostgreSQL reads them).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ByteSize {
    Bytes(u64),
    Text(String),
}

impl ByteSize {
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            ByteSize::Bytes(b) => Ok(*b),
            ByteSize::Text(t) => {
                let t = t.trim();
                let split = t
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(t.len());
                let (num, unit) = t.split_at(split);
                let n: f64 = num.parse().map_err(|_| {
                    format!("`{t}` is not a size: write e.g. 67108864, \"64MiB\" or \"10GB\"")
                })?;
                let mult: u64 = match unit.trim() {
                    "" | "B" => 1,
                    "kB" | "KB" | "KiB" | "k" => 1 << 10,
                    "MB" | "MiB" | "M" => 1 << 20,
                    "GB" | "GiB" | "G" => 1 << 30,
                    "TB" | "TiB" | "T" => 1 << 40,
                    u => {
                        return Err(format!(
                            "`{t}`: unknown unit `{u}`: allowed B, kB, MB, GB, TB (or KiB, MiB, GiB, TiB)"
                        ));
                    }
                };
                Ok((n * mult as f64).round() as u64)
            }
        }
    }
}

/// 10485760 -> "10MiB", 1048576 -> "1MiB", 1500 -> "1500B".
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 && n.is_multiple_of(1 << 30) {
        format!("{}GiB", n >> 30)
    } else if n.is_multiple_of(1 << 20) && n > 0 {
        format!("{}MiB", n >> 20)
    } else if n.is_multiple_of(1 << 10) && n > 0 {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}

/// A size for people: 1.5 GiB, 230 MiB, 12 KiB.
pub fn approx_bytes(n: u64) -> String {
    let n = n as f64;
    let (v, u) = if n >= (1u64 << 40) as f64 {
        (n / (1u64 << 40) as f64, "TiB")
    } else if n >= (1u64 << 30) as f64 {
        (n / (1u64 << 30) as f64, "GiB")
    } else if n >= (1u64 << 20) as f64 {
        (n / (1u64 << 20) as f64, "MiB")
    } else {
        (n / 1024.0, "KiB")
    };
    if v >= 100.0 {
        format!("{v:.0} {u}")
    } else {
        format!("{v:.1} {u}")
    }
}

/// A duration for people: 45 s, 12 min, 1 h 30 min.
pub fn approx_seconds(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s < 120 {
        format!("{s} s")
    } else if s < 7200 {
        format!("{} min", (s + 30) / 60)
    } else {
        // Rounded to the minute first, so 3 h 59 min 40 s is 4 h 0 min.
        let m = (s + 30) / 60;
        format!("{} h {} min", m / 60, m % 60)
    }
}

#[cfg(test)]
mod approx_tests {
    #[test]
    fn durations_round_to_the_minute_across_the_hour() {
        use super::approx_seconds as a;
        assert_eq!(a(45.0), "45 s");
        assert_eq!(a(720.0), "12 min");
        assert_eq!(a(5400.0), "90 min");
        assert_eq!(a(3.0 * 3600.0 + 59.0 * 60.0 + 40.0), "4 h 0 min");
        assert_eq!(a(3.0 * 3600.0 + 59.0 * 60.0 + 20.0), "3 h 59 min");
    }
}

/// One measured point as a workload returns it: typed params and metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point<P, M> {
    pub params: P,
    pub metrics: M,
}

macro_rules! kinds {
    ($($name:literal => $variant:ident($module:ident)),* $(,)?) => {
        /// A workload entry's kind-specific keys (parsed once per entry, so
        /// the size difference between kinds does not matter).
        #[derive(Debug, Clone)]
        #[allow(clippy::large_enum_variant)]
        pub enum Spec {
            $($variant($module::Spec),)*
        }

        /// One cell's parameters, as the agent receives them.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Params {
            $($variant($module::Params),)*
        }

        /// A workload kind: what code matches on (the scenario's and the
        /// store's `kind` is its name). Serialized as its name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $($variant,)*
        }

        impl Kind {
            /// Every kind, in the table's order.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)*];

            /// The scenario's `kind`, e.g. `toast-slice`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$variant => $name,)*
                }
            }

            pub fn from_name(name: &str) -> Option<Kind> {
                match name {
                    $($name => Some(Kind::$variant),)*
                    _ => None,
                }
            }

            pub fn info(self) -> &'static KindInfo {
                &KINDS[self as usize]
            }
        }

        /// The kinds, in the table's order.
        pub const KINDS: &[KindInfo] = &[$(KindInfo {
            name: $name,
            description: $module::DESCRIPTION,
            compared: $module::COMPARED,
            swept: $module::SWEPT,
        },)*];

        impl Spec {
            fn deserialize_kind<'de, A: MapAccess<'de>>(kind: &str, map: A) -> Result<Spec, A::Error> {
                match kind {
                    $($name => Ok(Spec::$variant(Deserialize::deserialize(MapAccessDeserializer::new(map))?)),)*
                    other => Err(de::Error::custom(format!(
                        "unknown workload kind `{other}`: allowed {}", names().join(", ")
                    ))),
                }
            }

            /// Validates and splits into cells (see `KindSpec::plan`).
            pub fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
                match self {
                    $(Spec::$variant(s) => Ok(s.plan(f)?.into_iter().map(|(stem, p)| (stem, Params::$variant(p))).collect()),)*
                }
            }
        }

        impl Params {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Params::$variant(_) => Kind::$variant,)*
                }
            }

            /// The parameters as JSON (what `Assign.params_json` carries).
            pub fn to_json(&self) -> String {
                let r = match self {
                    $(Params::$variant(p) => serde_json::to_string(p),)*
                };
                r.unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
            }

            /// Reads the parameters of kind `kind` from JSON.
            pub fn from_json(kind: &str, json: &str) -> Result<Params, String> {
                match kind {
                    $($name => serde_json::from_str(json).map(Params::$variant).map_err(|e| format!("parameters of {kind}: {e}")),)*
                    other => Err(format!("unknown workload kind `{other}` (known: {})", names().join(", "))),
                }
            }

            pub fn estimate(&self, c: &Capacity) -> Estimate {
                match self {
                    $(Params::$variant(p) => p.estimate(c),)*
                }
            }

            pub fn roles(&self) -> &'static [&'static str] {
                match self {
                    $(Params::$variant(p) => p.roles(),)*
                }
            }

            pub fn settings(&self, role: &str) -> Vec<(&'static str, String)> {
                match self {
                    $(Params::$variant(p) => p.settings(role),)*
                }
            }

            pub fn working_set_bytes(&self) -> Option<u64> {
                match self {
                    $(Params::$variant(p) => p.working_set_bytes(),)*
                }
            }

            pub fn cached_read_bytes(&self) -> Option<u64> {
                match self {
                    $(Params::$variant(p) => p.cached_read_bytes(),)*
                }
            }

            pub fn account_io(&self) -> bool {
                match self {
                    $(Params::$variant(p) => p.account_io(),)*
                }
            }

            pub fn allow_shell(&self) -> bool {
                match self {
                    $(Params::$variant(p) => p.allow_shell(),)*
                }
            }

            pub fn check(&self) -> Result<(), String> {
                match self {
                    $(Params::$variant(p) => p.check(),)*
                }
            }

            pub fn dataset(&self) -> Option<crate::dataset::Dataset> {
                match self {
                    $(Params::$variant(p) => p.dataset(),)*
                }
            }

            pub fn reset(&self) -> Option<&'static [&'static str]> {
                match self {
                    $(Params::$variant(p) => p.reset(),)*
                }
            }

            pub fn dataset_role(&self) -> &'static str {
                match self {
                    $(Params::$variant(p) => p.dataset_role(),)*
                }
            }

            /// The dataset `role`'s cluster starts from: None for the
            /// other roles of a multi-role cell.
            pub fn dataset_of(&self, role: &str) -> Option<crate::dataset::Dataset> {
                self.dataset().filter(|_| role == self.dataset_role())
            }
        }
    };
}

// The table of workload kinds: one line each. Reports show the kinds'
// sections in this order: the storage's raw figures first.
kinds! {
    "fio" => Fio(fio),
    "toast-slice" => ToastSlice(toast_slice),
    "pgbench-init" => PgbenchInit(pgbench_init),
    "pgbench" => Pgbench(pgbench),
    "vacuum-bloat" => VacuumBloat(vacuum_bloat),
    "logical-drain" => LogicalDrain(logical_drain),
    "toast-probe" => ToastProbe(toast_probe),
    "compression-analysis" => CompressionAnalysis(compression_analysis),
    "read-write" => ReadWrite(read_write),
}

/// Which way a metric is better: what `compare` calls faster or slower,
/// and what a history check counts as a drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// A metric a kind reports, declared once in the kind's file (its
/// `COMPARED` list): the report summarizes it per class and compares it
/// between classes; checks, compare, history and the scenario reference
/// read its unit, direction and description from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// Its name in the kind's `Metrics` and in report.json.
    pub name: &'static str,
    pub unit: &'static str,
    pub better: Better,
    pub description: &'static str,
}

impl Metric {
    pub const fn new(
        name: &'static str,
        unit: &'static str,
        better: Better,
        description: &'static str,
    ) -> Metric {
        Metric {
            name,
            unit,
            better,
            description,
        }
    }
}

/// PostgreSQL's own I/O waits over the measured window (from the
/// sampler's `pg_stat` deltas), which pgbench and vacuum-bloat both compare.
pub const PAGE_READ_MS_AVG: Metric = Metric::new(
    "page_read_ms_avg",
    "ms",
    Better::Lower,
    "mean time PostgreSQL waited to read a page",
);
pub const WAL_SYNC_MS_AVG: Metric = Metric::new(
    "wal_sync_ms_avg",
    "ms",
    Better::Lower,
    "mean time of a WAL sync",
);

/// The declaration of `kind`'s compared metric `name`.
pub fn metric(kind: &str, name: &str) -> Option<&'static Metric> {
    info(kind)?.compared.iter().find(|m| m.name == name)
}

/// What the controller knows of a kind without its parameters.
#[derive(Debug, Clone, Copy)]
pub struct KindInfo {
    /// The scenario's `kind`.
    pub name: &'static str,
    pub description: &'static str,
    /// Metrics the report summarizes per instance class (median, min, max)
    /// and compares between classes (ratio to the first class).
    pub compared: &'static [Metric],
    /// Scalar keys a scenario may give a list of values (`clients: [1, 4,
    /// 16]`): the entry then has one point per combination (a sweep).
    pub swept: &'static [&'static str],
}

pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

pub fn info(kind: &str) -> Option<&'static KindInfo> {
    Kind::from_name(kind).map(Kind::info)
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.pad(self.name())
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Kind::from_name(&name).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown workload kind `{name}` (known: {})",
                names().join(", ")
            ))
        })
    }
}

/// One workload entry of a scenario: the keys every kind takes, and the
/// kind's own.
#[derive(Debug, Clone)]
pub struct Entry {
    pub kind: Spanned<String>,
    /// Instance classes to run on (default: every class in the fleet).
    pub on: Option<Vec<Spanned<String>>>,
    /// Cells per instance class: each runs on its own cluster (its own
    /// agent when the class has that many), for medians across clusters.
    pub replicas: Option<Spanned<u32>>,
    /// For multi-role kinds: role -> instance class, for roles that run on
    /// another class than the cell's (default: the cell's class).
    pub roles: Option<BTreeMap<String, Spanned<String>>>,
    /// `data: reuse` (default) or `fresh`: whether cells restore their
    /// dataset from the agent's dataset store or load it every time.
    pub data: Option<Spanned<String>>,
    /// `reuse_cluster: true`: consecutive cells of one dataset on one agent
    /// share a cluster, after the kind's declared reset.
    pub reuse_cluster: Option<Spanned<bool>>,
    pub spec: Spec,
}

impl Entry {
    pub fn replicas(&self) -> u32 {
        or(&self.replicas, 1)
    }
}

// Deserializing an entry needs its kind before its other keys, and YAML
// may put `kind` anywhere in the map. The scenario is therefore read twice:
// a first pass collects each entry's kind (`collect_kinds`), and the second
// deserializes each entry's remaining keys into that kind's `Spec`, straight
// from the YAML parser so values keep their locations and field paths.
thread_local! {
    static KINDS_AHEAD: std::cell::RefCell<std::collections::VecDeque<Spanned<String>>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// First pass: the kinds of the entries under `workloads`, in order. Used by
/// the scenario parser; the second pass takes them back one by one.
pub fn set_kinds_ahead(kinds: Vec<Spanned<String>>) {
    KINDS_AHEAD.with(|k| *k.borrow_mut() = kinds.into());
}

// A swept key's value is a list; the entry is deserialized once per
// combination, each time taking one element of each swept list (`Pick`),
// so every point's keys keep their own locations.
thread_local! {
    static PICKS_AHEAD: std::cell::RefCell<std::collections::VecDeque<Picks>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// Per swept key of an entry, the index of the element to take.
pub type Picks = Vec<(String, usize)>;

/// The picks of the entries under `workloads`, in order, for the next
/// pass (as `set_kinds_ahead`); an entry without sweeps takes an empty list.
pub fn set_picks_ahead(picks: Vec<Picks>) {
    PICKS_AHEAD.with(|p| *p.borrow_mut() = picks.into());
}

/// Deserializes element `n` of a sequence with `seed`, skipping the others.
struct Pick<S> {
    n: usize,
    seed: S,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Pick<S> {
    type Value = S::Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Pick<S> {
    type Value = S::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a list of values to sweep")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<S::Value, A::Error> {
        for _ in 0..self.n {
            seq.next_element::<IgnoredAny>()?;
        }
        let v = seq
            .next_element_seed(self.seed)?
            .ok_or_else(|| de::Error::custom("the sweep's list is shorter than planned"))?;
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(v)
    }
}

/// The first pass's view of an entry: only its kind.
#[derive(Debug, Deserialize)]
pub struct KindOnly {
    #[serde(default)]
    pub kind: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let kind = KINDS_AHEAD.with(|k| k.borrow_mut().pop_front());
        let picks = PICKS_AHEAD
            .with(|p| p.borrow_mut().pop_front())
            .unwrap_or_default();
        d.deserialize_map(EntryVisitor { kind, picks })
    }
}

struct EntryVisitor {
    kind: Option<Spanned<String>>,
    picks: Picks,
}

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a workload: a map with `kind` and that kind's keys")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
        let Some(kind) = self.kind.filter(|k| !k.value.is_empty()) else {
            return Err(de::Error::custom(format!(
                "missing field `kind`: allowed {}",
                names().join(", ")
            )));
        };
        let mut common = Common::default();
        let filter = Filter {
            inner: map,
            common: &mut common,
            picks: self.picks,
            pick: None,
        };
        let spec = Spec::deserialize_kind(&kind.value, filter)?;
        Ok(Entry {
            kind,
            on: common.on,
            replicas: common.replicas,
            roles: common.roles,
            data: common.data,
            reuse_cluster: common.reuse_cluster,
            spec,
        })
    }
}

/// The keys every kind takes besides `kind` (`Common`'s, which `Filter`
/// takes out of the map before the kind's `Spec` sees the rest).
pub const COMMON_KEYS: &[&str] = &["on", "replicas", "roles", "data", "reuse_cluster"];

/// The keys every kind takes, taken out of the map before the kind's `Spec`
/// sees the rest.
#[derive(Default)]
struct Common {
    on: Option<Vec<Spanned<String>>>,
    replicas: Option<Spanned<u32>>,
    roles: Option<BTreeMap<String, Spanned<String>>>,
    data: Option<Spanned<String>>,
    reuse_cluster: Option<Spanned<bool>>,
}

/// The entry's map as its kind's `Spec` sees it: without the common keys,
/// and a swept key's list replaced by the element this pass picks.
struct Filter<'c, A> {
    inner: A,
    common: &'c mut Common,
    picks: Picks,
    /// The element of the key just read, when it is swept.
    pick: Option<usize>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Filter<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.inner.next_key::<String>()? else {
                return Ok(None);
            };
            match key.as_str() {
                "kind" => {
                    self.inner.next_value::<IgnoredAny>()?;
                }
                "on" => self.common.on = Some(self.inner.next_value()?),
                "replicas" => self.common.replicas = Some(self.inner.next_value()?),
                "roles" => self.common.roles = Some(self.inner.next_value()?),
                "data" => self.common.data = Some(self.inner.next_value()?),
                "reuse_cluster" => self.common.reuse_cluster = Some(self.inner.next_value()?),
                _ => {
                    self.pick = self.picks.iter().find(|(k, _)| *k == key).map(|p| p.1);
                    return seed.deserialize(key.into_deserializer()).map(Some);
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.pick.take() {
            Some(n) => self.inner.next_value_seed(Pick { n, seed }),
            None => self.inner.next_value_seed(seed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step takes as long as the slowest of what it asks of the class; a
    /// zero cap is the host's disk, and a cap above the host's rate does
    /// not make the host faster.
    #[test]
    fn work_takes_its_slowest_resource() {
        let caps = crate::environment::Caps {
            read_iops: 100,
            write_iops: 3000,
            read_mbps: 0,
            write_mbps: 100_000,
            combined: false,
            latency: Default::default(),
        };
        let c = Capacity {
            cpus: 2.0,
            memory_bytes: 0,
            caps,
        };
        assert_eq!(Work::cpu(8.0, 4.0).seconds(&c), 4.0);
        assert_eq!(Work::cpu(8.0, 1.0).seconds(&c), 8.0);
        let w = Work {
            cpu_seconds: 1.0,
            threads: 1.0,
            read_ios: 1000.0,
            write_ios: 3000.0,
            ..Work::default()
        };
        assert_eq!(w.seconds(&c), 10.0);
        assert_eq!(c.read_bytes_per_s(), HOST_READ_BYTES_PER_SECOND);
        assert_eq!(c.write_bytes_per_s(), HOST_WRITE_BYTES_PER_SECOND);
        let bytes = Work {
            write_bytes: 2.0 * HOST_WRITE_BYTES_PER_SECOND,
            ..Work::default()
        };
        assert_eq!(bytes.seconds(&c), 2.0);
    }

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::Text("64MiB".into()).bytes(), Ok(64 << 20));
        assert_eq!(ByteSize::Text("10GB".into()).bytes(), Ok(10 << 30));
        assert_eq!(ByteSize::Text("1.5 GiB".into()).bytes(), Ok(3 << 29));
        assert_eq!(ByteSize::Bytes(7).bytes(), Ok(7));
        assert!(ByteSize::Text("ten".into()).bytes().is_err());
        assert!(
            ByteSize::Text("10 parsecs".into())
                .bytes()
                .unwrap_err()
                .contains("unknown unit")
        );
    }

    #[test]
    fn humane_figures() {
        assert_eq!(human_bytes(10 << 20), "10MiB");
        assert_eq!(human_bytes(10 << 30), "10GiB");
        assert_eq!(human_bytes(1500), "1500B");
        assert_eq!(approx_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(approx_seconds(45.0), "45 s");
        assert_eq!(approx_seconds(5400.0), "90 min");
        assert_eq!(approx_seconds(9000.0), "2 h 30 min");
    }

    #[test]
    fn kinds_have_unique_names() {
        let mut n = names();
        n.sort();
        n.dedup();
        assert_eq!(n.len(), KINDS.len());
        for k in Kind::ALL {
            assert_eq!(Kind::from_name(k.name()), Some(*k));
            assert_eq!(k.info().name, k.name());
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(serde_json::from_str::<Kind>(&json).unwrap(), *k);
        }
        assert!(serde_json::from_str::<Kind>("\"nope\"").is_err());
    }
}

/// What PostgreSQL itself saw during a measured window (the agent's
/// sampler): shared by the kinds that sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Internals {
    /// Average time per block read from outside shared buffers
    /// (`track_io_timing`); None when no block was read.
    pub page_read_ms_avg: Option<f64>,
    pub blocks_read: Option<u64>,
    /// Average time per WAL sync (`track_wal_io_timing`).
    pub wal_sync_ms_avg: Option<f64>,
    pub wal_syncs: Option<u64>,
    pub checkpoints: u64,
    pub wal_bytes: Option<u64>,
    /// Wait events by share of sampled active backends, most frequent first.
    pub top_wait_events: Vec<WaitShare>,
    /// Transactions the workload committed in the window
    /// (pg_stat_database's, less the sampler's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commits: Option<u64>,
    /// Relation pages PostgreSQL wrote out (pg_stat_io, 16+: backends,
    /// checkpointer, background writer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_writes: Option<u64>,
    /// WAL writes (pg_stat_wal; pg_stat_io from 18).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_writes: Option<u64>,
    /// What the cluster's own block device completed in the window (read
    /// and write requests after the block layer's merging, their bytes,
    /// cache flushes); None where the cluster has no device of its own
    /// (then no exact count exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_reads: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_writes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_read_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_write_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_flushes: Option<u64>,
}

impl Internals {
    /// The device's I/Os (reads and writes) per committed transaction.
    pub fn device_ios_per_transaction(&self) -> Option<f64> {
        let ios = self.device_reads? + self.device_writes?;
        per(ios, self.commits?)
    }
}

/// `n / of`, None when `of` is 0.
pub fn per(n: u64, of: u64) -> Option<f64> {
    (of > 0).then(|| n as f64 / of as f64)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitShare {
    pub event: String,
    pub share: f64,
}

/// Plans one workload entry given as YAML (or JSON) text, e.g.
/// `{"kind": "pgbench", "scale": 1}`: the same parsing, checks and defaults
/// as a scenario's entry. For tests and tools that run a kind directly.
pub fn plan_entry(text: &str) -> Result<Vec<(String, Params)>, String> {
    let kind: KindOnly = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    set_kinds_ahead(kind.kind.into_iter().collect());
    let entry: Result<Entry, _> = serde_saphyr::from_str(text);
    set_kinds_ahead(Vec::new());
    let entry = entry.map_err(|e| e.to_string())?;
    entry
        .spec
        .plan(&Field::new("workload", entry.kind.referenced))
        .map_err(|e| format!("{}: {}", e.field, e.message))
}
