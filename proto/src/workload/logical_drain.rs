//! `logical-drain` (SPEC Experiment 1, seeds/002: draining a 10 GB
//! logical-replication backlog took 139 s on NVMe vs 238 s on EBS): two
//! clusters on two agents. The publisher's cluster holds pgbench's schema
//! and a publication; the subscriber's subscribes, syncs, pauses apply while
//! a random-UPDATE backlog of the target size piles up in the slot, then
//! resumes and is timed until it has applied everything.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::pgbench_init::{self, InitParams, with_load_keys};
use super::{
    Better, ByteSize, Capacity, Checked, ESTIMATE_BYTES_PER_SECOND, Estimate, Field, Internals,
    KindParams, KindSpec, Metric, Work, human_bytes, or,
};

pub const DESCRIPTION: &str = "publisher and subscriber on two agents: build a logical-replication backlog, time its drain: seconds, MB/s, rows match";
/// The time the backlog took to apply: what a class's cost per drain
/// multiplies.
pub const DRAIN_SECONDS: Metric = Metric::new(
    "drain_seconds",
    "s",
    Better::Lower,
    "time for the subscriber to apply the backlog",
);
/// Summarized per class and compared between classes in reports.
pub const COMPARED: &[Metric] = &[
    DRAIN_SECONDS,
    Metric::new(
        "drain_mb_per_s",
        "MB/s",
        Better::Higher,
        "backlog applied per second",
    ),
    Metric::new(
        "backlog_bytes",
        "bytes",
        Better::Lower,
        "WAL the publisher produced for the subscriber to apply",
    ),
];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &["backlog_bytes", "clients", "threads"];

/// The roles, the lead first: the subscriber's agent drives the measurement
/// (over the network to the publisher's cluster, as a replication client
/// would); the publisher's agent serves its cluster until released.
pub const ROLES: &[&str] = &["subscriber", "publisher"];
pub const PUBLISHER: &str = "publisher";
pub const SUBSCRIBER: &str = "subscriber";
/// Names of the publication, subscription and slot.
pub const NAME: &str = "pgfleet_drain";
/// Rates of the reference host for estimates (PostgreSQL 15, release;
/// BENCHMARKS.md "Estimates"): 4 clients built a 64 MiB backlog in
/// 97-102 s at 3,000 write IOPS (one flush per ~224 bytes of WAL: 56 per
/// client, as commits waiting together share a flush) and in ~40 s on the
/// host's disk (its flushes: `HOST_IOPS`); CPU alone would allow ~12 s on
/// 2 cores. The drain ran at 10-24 MB/s.
pub const BACKLOG_BYTES_PER_CPU_SECOND: f64 = 2.9e6;
pub const BACKLOG_BYTES_PER_FLUSH_AND_CLIENT: f64 = 56.0;
pub const DRAIN_BYTES_PER_CPU_SECOND: f64 = 12e6;

with_load_keys! {
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Spec {
        /// WAL to leave unconsumed in the slot before apply resumes (`"10GB"`,
        /// bytes). Default 256 MiB.
        #[serde(default)]
        pub backlog_bytes: Option<Spanned<ByteSize>>,
        /// Clients and threads of the random UPDATE that builds the backlog.
        #[serde(default)]
        pub clients: Option<Spanned<u32>>,
        #[serde(default)]
        pub threads: Option<Spanned<u32>>,
        /// Bound on each wait (initial sync, building the backlog, the drain):
        /// past it the cell fails saying which, instead of hanging.
        #[serde(default)]
        pub timeout_s: Option<Spanned<f64>>,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub init: InitParams,
    pub backlog_bytes: u64,
    pub clients: u32,
    pub threads: u32,
    pub timeout_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointParams {
    pub scale: u64,
    pub backlog_target_bytes: u64,
    pub clients: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// WAL the slot retained when apply resumed: pg_wal_lsn_diff(target
    /// LSN, the slot's confirmed_flush_lsn).
    pub backlog_bytes: u64,
    pub backlog_target_bytes: u64,
    pub backlog_seconds: f64,
    pub backlog_transactions: u64,
    /// From `ALTER SUBSCRIPTION ... ENABLE` to the subscriber seeing the
    /// marker committed after the backlog (apply is in commit order).
    pub drain_seconds: f64,
    pub drain_mb_per_s: f64,
    pub initial_sync_seconds: f64,
    /// pgbench_accounts' row count and an order-independent checksum are
    /// equal on both clusters after the drain.
    pub rows_match: bool,
    pub rows: u64,
    /// pg_stat_replication_slots (PostgreSQL 14+) for the slot, over its life.
    pub spill_txns: Option<u64>,
    pub spill_bytes: Option<u64>,
    pub stream_txns: Option<u64>,
    pub total_txns: Option<u64>,
    pub total_bytes: Option<u64>,
    /// The subscriber's own I/O over the drain window (its apply writes).
    #[serde(flatten)]
    pub internals: Internals,
    #[serde(flatten)]
    pub load: pgbench_init::Metrics,
}

pub type Point = super::Point<PointParams, Metrics>;

/// One second of the drain (samples of kind `lag`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lag {
    pub second: f64,
    /// Target LSN minus what the subscriber has received.
    pub lag_bytes: u64,
    /// Target LSN minus the slot's confirmed_flush_lsn on the publisher.
    pub slot_lag_bytes: u64,
}

impl KindSpec for Spec {
    type Params = Params;
    fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
        self.flat(f, "it publishes one flat pgbench_accounts")?;
        let init = self.init(f)?;
        let backlog_bytes = f
            .bytes(&self.backlog_bytes, "backlog_bytes", 1 << 20)?
            .unwrap_or(256 << 20);
        f.in_range(&self.clients, "clients", 1, 1000, "")?;
        let clients = or(&self.clients, 4);
        f.in_range(
            &self.threads,
            "threads",
            1,
            clients,
            " (no more threads than clients)",
        )?;
        f.in_range(
            &self.timeout_s,
            "timeout_s",
            1.0,
            7.0 * 86_400.0,
            " seconds",
        )?;
        Ok(vec![(
            format!("backlog-{}", human_bytes(backlog_bytes)),
            Params {
                init,
                backlog_bytes,
                clients,
                threads: or(&self.threads, 1),
                timeout_s: or(&self.timeout_s, 3600.0),
            },
        )])
    }
}

impl KindParams for Params {
    fn check(&self) -> Result<(), String> {
        use super::within;
        self.init.check()?;
        within("backlog_bytes", self.backlog_bytes, 1 << 20, 1 << 50)?;
        within("clients", self.clients, 1, 1000)?;
        within("threads", self.threads, 1, self.clients)?;
        within("timeout_s", self.timeout_s, 1.0, 7.0 * 86_400.0)
    }
    fn estimate(&self, c: &Capacity) -> Estimate {
        let load = self.init.estimate(c);
        let data = self.init.data_bytes() as f64;
        let backlog = self.backlog_bytes as f64;
        // Initial sync copies the table into the subscriber (heap, key, WAL).
        let sync = Work::cpu(data / ESTIMATE_BYTES_PER_SECOND, 1.0)
            .writing(2.0 * data)
            .seconds(c);
        // The backlog is WAL of the clients' random UPDATEs, each commit
        // waiting for its flush.
        let clients = self.clients as f64;
        let build = Work::cpu(backlog / BACKLOG_BYTES_PER_CPU_SECOND, clients)
            .flushing(backlog / (BACKLOG_BYTES_PER_FLUSH_AND_CLIENT * clients))
            .seconds(c);
        // The drain decodes and applies it (the apply worker commits
        // asynchronously).
        let drain = Work::cpu(backlog / DRAIN_BYTES_PER_CPU_SECOND, 1.0).seconds(c);
        Estimate {
            seconds: load.seconds + sync + build + drain,
            measured_seconds: drain,
            // The publisher: its data, the backlog held by the slot, the
            // updates' new row versions, WAL headroom.
            disk_bytes: load.disk_bytes + 2 * self.backlog_bytes + (1 << 30),
            load_seconds: load.load_seconds,
        }
    }

    fn roles(&self) -> &'static [&'static str] {
        ROLES
    }

    /// pgbench's tables on the publisher: the same dataset as pgbench's
    /// and vacuum-bloat's cells of that scale, built or restored by the
    /// publisher's agent before it reports its cluster.
    fn dataset(&self) -> Option<crate::dataset::Dataset> {
        Some(self.init.as_dataset())
    }

    fn dataset_role(&self) -> &'static str {
        PUBLISHER
    }

    fn settings(&self, role: &str) -> Vec<(&'static str, String)> {
        match role {
            PUBLISHER => vec![
                ("wal_level", "logical".into()),
                ("max_wal_senders", "10".into()),
                ("max_replication_slots", "10".into()),
                // The slot must keep the whole backlog.
                ("max_slot_wal_keep_size", "-1".into()),
            ],
            _ => vec![
                ("max_logical_replication_workers", "4".into()),
                ("max_replication_slots", "10".into()),
            ],
        }
    }
}
