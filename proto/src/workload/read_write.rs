//! `read-write` (SPEC Experiment 4, seeds/004's read and write tests, on
//! stock PostgreSQL): one table like the article's `test_table` (`id serial
//! PRIMARY KEY, col1 int, txt varchar = repeat(md5(i), 15)`, ~15 rows per
//! page), then:
//! - `seq-cold`: a sequential scan (`SELECT count(*) ... WHERE txt <> ...`,
//!   EXPLAIN ANALYZE BUFFERS) right after a restart with the database's
//!   files evicted from the OS page cache: every page from the device;
//! - `seq-os-cache`: the same after a restart only: shared buffers cold,
//!   the OS page cache warm;
//! - `random-read`: pgbench-style random `SELECT txt ... WHERE id = :id`
//!   from a cold start (the 100 %-disk load when the table is larger than
//!   the instance's memory);
//! - `write`: `UPDATE test_table SET txt = txt || '.'` then a timed
//!   `CHECKPOINT`, checkpoints otherwise held off: the bytes the device
//!   wrote (the cluster's own volume, so only its own writes, writeback
//!   included) against the bytes of dirty pages PostgreSQL wrote and the WAL
//!   bytes.
//!
//! On PostgreSQL 18 the reads repeat per `io_methods` (sync, worker,
//! io_uring); before 18 the server has one (synchronous) way to read.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{
    Better, CLUSTER_BASE_BYTES, Capacity, Checked, ESTIMATE_CLUSTER_SECONDS, Estimate, Field,
    KindParams, KindSpec, Metric, Work, or,
};

pub const DESCRIPTION: &str = "cold and OS-cache sequential scans, random reads from disk, UPDATE-all + CHECKPOINT with the device bytes written (seeds/004)";
pub const COMPARED: &[Metric] = &[
    Metric::new(
        "execution_ms",
        "ms",
        Better::Lower,
        "time of the test's statement",
    ),
    Metric::new("tps", "tx/s", Better::Higher, "transactions per second"),
    Metric::new(
        "write_amplification",
        "x",
        Better::Lower,
        "device bytes written per byte of data changed",
    ),
];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &["rows", "random_clients"];

pub const TESTS: &[&str] = &["seq-cold", "seq-os-cache", "random-read", "write"];
pub const IO_METHODS: &[&str] = &["sync", "worker", "io_uring"];
/// Rows of the article's test_table per 8 KiB page.
pub const ROWS_PER_PAGE: u64 = 15;
/// The loader's output version: bump it whenever the agent's load writes
/// other bytes for the same `rows`.
pub const LOADER_VERSION: u32 = 1;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Rows of test_table (default 5,000,000: the article's 2.6 GB table).
    #[serde(default)]
    pub rows: Option<Spanned<u64>>,
    #[serde(default)]
    pub tests: Option<Vec<Spanned<String>>>,
    /// Runs of each sequential scan (the article: 3, averaged).
    #[serde(default)]
    pub repeats: Option<Spanned<u32>>,
    /// PostgreSQL 18's io_method values to read with (default: the
    /// server's own).
    #[serde(default)]
    pub io_methods: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub random_clients: Option<Spanned<u32>>,
    #[serde(default)]
    pub random_threads: Option<Spanned<u32>>,
    #[serde(default)]
    pub random_duration_s: Option<Spanned<f64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub rows: u64,
    pub tests: Vec<String>,
    pub repeats: u32,
    /// Empty: the server's default.
    pub io_methods: Vec<String>,
    pub random_clients: u32,
    pub random_threads: u32,
    pub random_duration_s: f64,
}

impl Params {
    pub fn table_bytes(&self) -> u64 {
        self.rows.div_ceil(ROWS_PER_PAGE) * 8192
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointParams {
    pub test: String,
    /// `default` when the scenario named none.
    pub io_method: String,
    pub rows: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub table_bytes: u64,
    /// Sequential scans: mean over repeats of EXPLAIN ANALYZE's execution
    /// time and I/O read time, and of the buffers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_read_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_hit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_read: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub executions_ms: Vec<f64>,
    /// Bytes read from the device by the cluster's processes during the
    /// test (its block-I/O cgroup; None where the agent cannot account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_read_bytes: Option<u64>,
    /// Where the device bytes come from: the cluster's own loop device
    /// (exact), or its block-I/O cgroup (on cgroup v1 it misses buffered
    /// writeback, so the write test's bytes are short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_source: Option<String>,
    /// Bytes of the database's files evicted from the page cache first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted_bytes: Option<u64>,
    /// random-read: pgbench's figures and what PostgreSQL saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p99: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_read_ms_avg: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_read: Option<u64>,
    /// write: the UPDATE's and the CHECKPOINT's seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_seconds: Option<f64>,
    /// write: bytes the device wrote for the cluster during UPDATE +
    /// CHECKPOINT, and during the CHECKPOINT alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_write_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_write_bytes_checkpoint: Option<u64>,
    /// write: 8 KiB pages PostgreSQL wrote out (checkpointer, bgwriter,
    /// backends) times 8 KiB, and the WAL it generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_page_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_bytes: Option<u64>,
    /// Device bytes per byte of the table the UPDATE rewrote (device bytes
    /// / table bytes), seeds/004's sense: the page, its new versions, and
    /// the WAL that made them durable (full-page images included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_amplification: Option<f64>,
    /// device bytes / (dirty page bytes + WAL bytes): what reached the
    /// device against what PostgreSQL wrote. About 1 where the device
    /// bytes are exact (the OS merging a page written twice takes a little
    /// off, the filesystem's journal adds a little); well below 1 where
    /// buffered writeback is not counted (a cgroup v1 block-I/O cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_vs_postgres: Option<f64>,
}

pub type Point = super::Point<PointParams, Metrics>;

impl KindSpec for Spec {
    type Params = Params;

    fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
        f.in_range(&self.rows, "rows", 1000, 10_000_000_000, "")?;
        let tests = f.names(&self.tests, "tests", TESTS, "test", TESTS)?;
        let io_methods = match &self.io_methods {
            None => Vec::new(),
            Some(l) => {
                for (j, m) in l.iter().enumerate() {
                    f.one_of(m, &format!("io_methods[{j}]"), IO_METHODS, "io_method")?;
                }
                l.iter().map(|m| m.value.clone()).collect()
            }
        };
        f.in_range(&self.repeats, "repeats", 1, 100, "")?;
        f.in_range(&self.random_clients, "random_clients", 1, 1000, "")?;
        f.in_range(&self.random_threads, "random_threads", 1, 256, "")?;
        f.in_range(
            &self.random_duration_s,
            "random_duration_s",
            0.1,
            86_400.0,
            " seconds",
        )?;
        let rows = or(&self.rows, 5_000_000);
        Ok(vec![(
            format!("rows-{rows}"),
            Params {
                rows,
                tests,
                repeats: or(&self.repeats, 3),
                io_methods,
                random_clients: or(&self.random_clients, 16),
                random_threads: or(&self.random_threads, 2),
                random_duration_s: or(&self.random_duration_s, 30.0),
            },
        )])
    }
}

impl KindParams for Params {
    /// The article's test_table: its bytes depend on `rows` alone.
    fn dataset(&self) -> Option<crate::dataset::Dataset> {
        Some(crate::dataset::Dataset {
            loader: "read-write".into(),
            loader_version: LOADER_VERSION,
            label: format!("read-write-r{}", self.rows),
            keys: [("rows".to_string(), serde_json::json!(self.rows))].into(),
            bytes: self.table_bytes(),
            load_seconds: Work::bulk_write(2.0 * self.table_bytes() as f64)
                .seconds(&Capacity::host()),
        })
    }
    fn check(&self) -> Result<(), String> {
        use super::within;
        within("rows", self.rows, 1000, 10_000_000_000)?;
        within("repeats", self.repeats, 1, 100)?;
        within("random_clients", self.random_clients, 1, 1000)?;
        within("random_threads", self.random_threads, 1, 256)?;
        within("random_duration_s", self.random_duration_s, 0.1, 86_400.0)
    }
    fn estimate(&self, c: &Capacity) -> Estimate {
        let bytes = self.table_bytes();
        let methods = self.io_methods.len().max(1) as f64;
        let load = Work::bulk_write(2.0 * bytes as f64).seconds(c);
        let mut measured = 0.0;
        for t in &self.tests {
            measured += match t.as_str() {
                // A restart, then one scan from the device per repeat.
                "seq-cold" | "seq-os-cache" => {
                    methods * self.repeats as f64 * (3.0 + Work::scan(bytes as f64).seconds(c))
                }
                "random-read" => methods * (3.0 + self.random_duration_s),
                // The UPDATE rewrites the table (new versions, WAL), the
                // checkpoint writes it out.
                _ => Work::bulk_write(4.0 * bytes as f64).seconds(c),
            };
        }
        Estimate {
            seconds: ESTIMATE_CLUSTER_SECONDS + load + measured,
            measured_seconds: measured,
            // The table, its index, its updated versions and their WAL.
            disk_bytes: CLUSTER_BASE_BYTES + 5 * bytes,
            load_seconds: load,
            ..Estimate::default()
        }
    }

    fn settings(&self, _role: &str) -> Vec<(&'static str, String)> {
        vec![
            ("track_io_timing", "on".into()),
            // The write test times its own CHECKPOINT: none before it.
            ("checkpoint_timeout", "1d".into()),
            (
                "max_wal_size",
                format!("{}MB", ((4 * self.table_bytes()) >> 20).max(1024)),
            ),
        ]
    }

    fn working_set_bytes(&self) -> Option<u64> {
        self.tests
            .iter()
            .any(|t| t == "random-read")
            .then(|| self.table_bytes())
    }

    fn cached_read_bytes(&self) -> Option<u64> {
        self.tests
            .iter()
            .any(|t| t == "seq-os-cache")
            .then(|| self.table_bytes())
    }

    fn account_io(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan_entry;

    #[test]
    fn keys_are_checked() {
        let e = plan_entry("{kind: read-write, tests: [seq-cold, seq-warm]}").unwrap_err();
        assert!(
            e.contains("tests[1]") && e.contains("unknown test `seq-warm`"),
            "{e}"
        );
        let e = plan_entry("{kind: read-write, io_methods: [posix_aio]}").unwrap_err();
        assert!(e.contains("io_methods[0]"), "{e}");
        let cells = plan_entry("{kind: read-write}").unwrap();
        assert_eq!(cells[0].0, "rows-5000000");
    }
}
