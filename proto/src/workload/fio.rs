//! `fio`: what the storage itself delivers, measured by fio (the standard
//! tool, as CloudNativePG's `cnpg fio` and PerfKitBenchmarker do) on the
//! class's data volume, inside the cgroups of a cluster of that class (the
//! emulated instance's memory and CPUs, the storage profile's caps), so the
//! raw-device figures sit next to the database's in one report:
//! - `rand-read`, `rand-write`: 8 KiB (PostgreSQL's page) random I/O at
//!   each queue depth;
//! - `seq-read`, `seq-write`: 1 MiB sequential I/O at queue depth 8;
//! - `wal-fsync`: 8 KiB sequential writes, each followed by `fdatasync`
//!   (what a commit waits for with `wal_sync_method = fdatasync`, Linux's
//!   default): its latencies are the fdatasync's.
//!
//! Direct I/O by default: the page cache would otherwise answer reads and
//! absorb writes, and cgroup v1's block-I/O throttling (the emulated caps)
//! only sees direct I/O.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{
    Better, ByteSize, CLUSTER_BASE_BYTES, Capacity, Checked, ESTIMATE_CLUSTER_SECONDS, Estimate,
    Field, KindParams, KindSpec, Metric, Work, human_bytes, or,
};

pub const DESCRIPTION: &str = "the storage itself, measured by fio on the class's data volume in the cluster's cgroups: 8 KiB random reads and writes per queue depth, 1 MiB sequential reads and writes, fdatasync latency of WAL-like writes";
pub const COMPARED: &[Metric] = &[
    Metric::new(
        "iops",
        "I/O/s",
        Better::Higher,
        "I/Os per second (8 KiB random reads and writes)",
    ),
    Metric::new(
        "mib_per_s",
        "MiB/s",
        Better::Higher,
        "sequential throughput (1 MiB blocks)",
    ),
    Metric::new(
        "latency_ms_p99",
        "ms",
        Better::Lower,
        "99th percentile I/O latency",
    ),
];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &["size"];

pub const JOBS: &[&str] = &[
    "rand-read",
    "rand-write",
    "seq-read",
    "seq-write",
    "wal-fsync",
];
/// Queue depth of the sequential jobs.
pub const SEQUENTIAL_QUEUE_DEPTH: u32 = 8;
/// The oldest fio whose JSON output has what the agent reads (total
/// latency percentiles, `lat_percentiles`, and the sync calls' latencies).
pub const MIN_FIO_VERSION: (u32, u32) = (3, 5);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Jobs to run, in this order (default: all of `JOBS`).
    #[serde(default)]
    pub jobs: Option<Vec<Spanned<String>>>,
    /// Size of the file the jobs read and write (default 1GiB). Larger than
    /// the instance's memory when `direct: false`, or reads hit the cache.
    #[serde(default)]
    pub size: Option<Spanned<ByteSize>>,
    /// Measured seconds per job and queue depth (default 10).
    #[serde(default)]
    pub runtime_s: Option<Spanned<f64>>,
    /// Seconds run before measuring, per job (default 2).
    #[serde(default)]
    pub ramp_s: Option<Spanned<f64>>,
    /// Queue depths of the random jobs (default [1, 32]).
    #[serde(default)]
    pub queue_depths: Option<Vec<Spanned<u32>>>,
    /// O_DIRECT (default true).
    #[serde(default)]
    pub direct: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub jobs: Vec<String>,
    pub size_bytes: u64,
    pub runtime_s: f64,
    pub ramp_s: f64,
    pub queue_depths: Vec<u32>,
    pub direct: bool,
}

/// One fio run: a job at a block size and queue depth.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub job: String,
    /// fio's `rw`.
    pub rw: &'static str,
    pub block_size: u64,
    pub queue_depth: u32,
    /// O_DIRECT: as the scenario says, except for `wal-fsync`, which
    /// writes through the page cache and fdatasyncs, as WAL does
    /// (wal_sync_method = fdatasync).
    pub direct: bool,
}

impl Params {
    /// The fio runs of a cell, in order: each job at each of its queue
    /// depths.
    pub fn runs(&self) -> Vec<Run> {
        let mut out = Vec::new();
        for job in &self.jobs {
            let (rw, block_size, depths): (&'static str, u64, Vec<u32>) = match job.as_str() {
                "rand-read" => ("randread", 8192, self.queue_depths.clone()),
                "rand-write" => ("randwrite", 8192, self.queue_depths.clone()),
                "seq-read" => ("read", 1 << 20, vec![self.sequential_depth()]),
                "seq-write" => ("write", 1 << 20, vec![self.sequential_depth()]),
                _ => ("write", 8192, vec![1]),
            };
            for queue_depth in depths {
                out.push(Run {
                    job: job.clone(),
                    rw,
                    block_size,
                    queue_depth,
                    direct: self.direct && job != "wal-fsync",
                });
            }
        }
        out
    }

    fn sequential_depth(&self) -> u32 {
        if self.direct {
            SEQUENTIAL_QUEUE_DEPTH
        } else {
            1
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointParams {
    pub job: String,
    pub block_size: u64,
    pub queue_depth: u32,
    pub direct: bool,
    pub size_bytes: u64,
}

/// One job's figures, as fio reports them. Latencies are total (submission
/// to completion) per I/O; `wal-fsync`'s are its fdatasync calls', and
/// `write_latency_ms_p99` is its writes'.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub iops: f64,
    pub mib_per_s: f64,
    pub latency_ms_mean: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_p999: f64,
    pub io_bytes: u64,
    pub runtime_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_latency_ms_p99: Option<f64>,
    /// Bytes the device read and wrote for the job (ramp included; None
    /// where the agent cannot account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_read_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_write_bytes: Option<u64>,
    /// Where the device bytes come from (the cluster's own loop device, or
    /// its block-I/O cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_source: Option<String>,
    /// fio's version, e.g. `fio-3.33`.
    pub fio: String,
}

pub type Point = super::Point<PointParams, Metrics>;

impl KindSpec for Spec {
    type Params = Params;

    fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
        let jobs = f.names(&self.jobs, "jobs", JOBS, "job", JOBS)?;
        let size = f.bytes(&self.size, "size", 16 << 20)?.unwrap_or(1 << 30);
        if size > 1 << 40 {
            return f.err(
                self.size.as_ref().map_or(f.kind_at, |s| s.referenced),
                "size",
                format!("{} is out of range: allowed up to 1TiB", human_bytes(size)),
            );
        }
        f.in_range(&self.runtime_s, "runtime_s", 1.0, 3600.0, " seconds")?;
        f.in_range(&self.ramp_s, "ramp_s", 0.0, 600.0, " seconds")?;
        let direct = or(&self.direct, true);
        let queue_depths = match &self.queue_depths {
            None if direct => vec![1, 32],
            None => vec![1],
            Some(l) => {
                if l.is_empty() {
                    return f.err(f.kind_at, "queue_depths", "must not be empty: e.g. [1, 32]");
                }
                let mut out: Vec<u32> = Vec::new();
                for (j, d) in l.iter().enumerate() {
                    let key = format!("queue_depths[{j}]");
                    f.in_range(&Some(d.clone()), &key, 1, 1024, "")?;
                    if out.contains(&d.value) {
                        return f.err(d.referenced, &key, format!("{} is listed twice", d.value));
                    }
                    if !direct && d.value > 1 {
                        return f.err(
                            d.referenced,
                            &key,
                            "queue depths above 1 need direct I/O (`direct: true`): buffered I/O is synchronous",
                        );
                    }
                    out.push(d.value);
                }
                out
            }
        };
        Ok(vec![(
            format!("fio-{}", human_bytes(size)),
            Params {
                jobs,
                size_bytes: size,
                runtime_s: or(&self.runtime_s, 10.0),
                ramp_s: or(&self.ramp_s, 2.0),
                queue_depths,
                direct,
            },
        )])
    }
}

impl KindParams for Params {
    fn check(&self) -> Result<(), String> {
        use super::within;
        within("size_bytes", self.size_bytes, 16 << 20, 1 << 40)?;
        within("runtime_s", self.runtime_s, 1.0, 3600.0)?;
        within("ramp_s", self.ramp_s, 0.0, 600.0)?;
        if self.jobs.is_empty() || self.jobs.iter().any(|j| !JOBS.contains(&j.as_str())) {
            return Err(format!("jobs {:?}: allowed {}", self.jobs, JOBS.join(", ")));
        }
        if self.queue_depths.is_empty() || self.queue_depths.len() > 16 {
            return Err("queue_depths: 1 to 16 of them".into());
        }
        for d in &self.queue_depths {
            within("queue_depths", *d, 1, 1024)?;
        }
        Ok(())
    }

    fn estimate(&self, c: &Capacity) -> Estimate {
        let runs = self.runs().len() as f64;
        let measured = runs * self.runtime_s;
        // fio lays the file out once; each run starts fio (~1 s) and
        // ramps up before measuring.
        let prepare =
            Work::default().writing(self.size_bytes as f64).seconds(c) + runs * (1.0 + self.ramp_s);
        Estimate {
            seconds: ESTIMATE_CLUSTER_SECONDS + prepare + measured,
            measured_seconds: measured,
            disk_bytes: CLUSTER_BASE_BYTES + self.size_bytes,
            prepare_seconds: prepare,
            ..Estimate::default()
        }
    }

    /// The block-I/O cgroup counts the device bytes of each job, a check
    /// that the caps bound what fio did.
    fn account_io(&self) -> bool {
        true
    }
}

/// Runs `<program> --version` and checks it is a fio kind fio can read:
/// its version text (`fio-3.33`), or an error that says what to install.
pub fn check(program: &std::path::Path) -> Result<String, String> {
    let out = std::process::Command::new(program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "`{}` was not found on the agent's host: install fio (Debian/Ubuntu: apt-get install fio; \
                     the pgfleet agent image has it) or point the agent at it with --fio / PGFLEET_FIO",
                    program.display()
                )
            } else {
                format!("running `{} --version`: {e}", program.display())
            }
        })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let v = parse_version(&text).ok_or_else(|| {
        format!(
            "`{} --version` printed `{text}`, not fio's `fio-<major>.<minor>`: is it fio?",
            program.display()
        )
    })?;
    if v < MIN_FIO_VERSION {
        return Err(format!(
            "{text} at `{}` is too old: kind fio needs fio >= {}.{} (JSON latency percentiles of every I/O \
             and of sync calls); install a newer fio or point the agent at one with --fio / PGFLEET_FIO",
            program.display(),
            MIN_FIO_VERSION.0,
            MIN_FIO_VERSION.1
        ));
    }
    Ok(text)
}

/// `fio-3.33` (what `fio --version` prints) -> (3, 33).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.trim().strip_prefix("fio-")?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::super::{Params as Any, plan_entry};
    use super::*;

    fn params(text: &str) -> Params {
        match plan_entry(text).unwrap().remove(0).1 {
            Any::Fio(p) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_and_runs() {
        let p = params("{kind: fio}");
        assert_eq!(p.size_bytes, 1 << 30);
        assert!(p.direct);
        let runs: Vec<(String, u32)> = p
            .runs()
            .into_iter()
            .map(|r| (r.job, r.queue_depth))
            .collect();
        assert_eq!(
            runs,
            [
                ("rand-read", 1),
                ("rand-read", 32),
                ("rand-write", 1),
                ("rand-write", 32),
                ("seq-read", 8),
                ("seq-write", 8),
                ("wal-fsync", 1)
            ]
            .map(|(j, d)| (j.to_string(), d))
        );
        // 7 runs of 10 s measured.
        assert_eq!(
            p.estimate(&super::super::Capacity::host()).measured_seconds,
            70.0
        );
        let buffered = params("{kind: fio, direct: false, jobs: [seq-read]}");
        assert_eq!(buffered.runs()[0].queue_depth, 1);
    }

    #[test]
    fn keys_are_checked() {
        let e = plan_entry("{kind: fio, jobs: [rand-read, randwrite]}").unwrap_err();
        assert!(
            e.contains("jobs[1]") && e.contains("unknown job `randwrite`"),
            "{e}"
        );
        let e = plan_entry("{kind: fio, queue_depths: [1, 4096]}").unwrap_err();
        assert!(
            e.contains("queue_depths[1]") && e.contains("1..=1024"),
            "{e}"
        );
        let e = plan_entry("{kind: fio, queue_depths: [4, 4]}").unwrap_err();
        assert!(e.contains("listed twice"), "{e}");
        let e = plan_entry("{kind: fio, direct: false, queue_depths: [1, 32]}").unwrap_err();
        assert!(
            e.contains("queue_depths[1]") && e.contains("need direct I/O"),
            "{e}"
        );
        let e = plan_entry("{kind: fio, size: 1MiB}").unwrap_err();
        assert!(e.contains("size") && e.contains("at least 16.0 MiB"), "{e}");
        let e = plan_entry("{kind: fio, size: 2TiB}").unwrap_err();
        assert!(e.contains("up to 1TiB"), "{e}");
        let e = plan_entry("{kind: fio, runtime: 10}").unwrap_err();
        assert!(e.contains("runtime"), "{e}");
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("fio-3.33\n"), Some((3, 33)));
        assert_eq!(parse_version("fio-3.5-12-gabcdef"), Some((3, 5)));
        assert_eq!(parse_version("fio-2.2.10"), Some((2, 2)));
        assert_eq!(parse_version("fio 3"), None);
        assert!(parse_version("fio-3.1").unwrap() < MIN_FIO_VERSION);
    }
}
