//! `fio` (`pgfleet_proto::workload::fio`): runs the standard tool beside the
//! cell's data (`Cluster::storage_dir`) — on the class's storage — in the cluster's
//! cgroups (`Cluster::contained`), one fio process per job and queue depth,
//! and reads its JSON. The file it lays out is removed on every path: by a
//! guard here, and with the cluster's directory otherwise.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

use super::context::{CellContext, Output};
use crate::cluster::Cluster;
use crate::cluster::throttle::Caps;
use crate::{Error, Result};
use pgfleet_proto::environment::{Delivered, Probe};
use pgfleet_proto::workload::fio::{Metrics, Params, Point, PointParams, Run, check};

fn err(message: impl Into<String>) -> Error {
    Error::Workload {
        workload: "fio".into(),
        message: message.into(),
    }
}

/// The fio at `program` and its version text, or an error that says what
/// to install (`pgfleet_proto::workload::fio::check`, which `pgfleet run`
/// also uses before starting local agents).
pub async fn version(program: &Path) -> Result<String> {
    let program = program.to_path_buf();
    tokio::task::spawn_blocking(move || check(&program))
        .await
        .map_err(|e| err(format!("checking fio: {e}")))?
        .map_err(err)
}

/// Removes the job file when the workload ends, however it ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a Params) -> BoxFuture<'a, Result<Output>> {
    async move {
        let ctx = &*ctx;
        let progress = |done, total, message: String| ctx.progress("fio", done, total, message);
        let points = measure(ctx.cluster, &ctx.fio, p, &ctx.cancel, progress).await?;
        Ok(Output::of(&points))
    }
    .boxed()
}

/// Runs `p`'s jobs one after the other in `cluster`'s directory and
/// cgroups, reporting each start to `progress` (done, total, what).
pub async fn measure(
    cluster: &Cluster,
    program: &Path,
    p: &Params,
    cancel: &CancellationToken,
    progress: impl Fn(u64, u64, String),
) -> Result<Vec<Point>> {
    let fio_version = version(program).await?;
    let file = cluster.storage_dir().join("fio.data");
    let _remove = RemoveOnDrop(file.clone());
    let runs = p.runs();
    let mut points = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        if cancel.is_cancelled() {
            return Err(Error::Cancelled("cell cancelled".into()));
        }
        progress(
            i as u64,
            runs.len() as u64,
            format!("{} at queue depth {}", r.job, r.queue_depth),
        );
        let before = cluster.io_bytes();
        let json = fio(cluster, program, cancel, p, r, &file).await?;
        let after = cluster.io_bytes();
        let mut metrics = metrics(&json, r).map_err(|m| {
            err(format!(
                "{} at queue depth {}: {m} (fio's output: {})",
                r.job,
                r.queue_depth,
                tail(&json.to_string(), 300)
            ))
        })?;
        if let (Some(b), Some(a)) = (before, after) {
            metrics.device_read_bytes = Some(a.0.saturating_sub(b.0));
            metrics.device_write_bytes = Some(a.1.saturating_sub(b.1));
        }
        metrics.fio = fio_version.clone();
        metrics.device_source = cluster.device_source().map(String::from);
        points.push(Point {
            params: PointParams {
                job: r.job.clone(),
                block_size: r.block_size,
                queue_depth: r.queue_depth,
                direct: r.direct,
                size_bytes: p.size_bytes,
            },
            metrics,
        });
    }
    progress(runs.len() as u64, runs.len() as u64, "done".into());
    Ok(points)
}

/// Seconds each probe job measures.
pub const PROBE_SECONDS: f64 = 2.0;

/// What an emulated storage profile delivers in `cluster`'s cgroups: a
/// short fio job per capped figure (random 8 KiB reads or writes at queue
/// depth 16 for IOPS caps, 1 MiB sequential at depth 8 for MiB/s caps),
/// and where the profile has per-I/O latency, the mean of one 8 KiB read,
/// one write and one WAL-like write and fdatasync at queue depth 1;
/// `{<cap>: {asked, delivered}, seconds, fio}`; `{error}` when fio could not
/// run (the report says the profile was not checked). Only a cancelled
/// cell is an error.
pub async fn probe(
    cluster: &Cluster,
    program: &Path,
    caps: Caps,
    cancel: &CancellationToken,
) -> Result<Delivered> {
    let wanted: Vec<(&str, &str, u64)> = [
        ("read_iops", "rand-read", caps.read_iops),
        ("write_iops", "rand-write", caps.write_iops),
        ("read_mbps", "seq-read", caps.read_mbps),
        ("write_mbps", "seq-write", caps.write_mbps),
    ]
    .into_iter()
    .filter(|w| w.2 > 0)
    .collect();
    let p = Params {
        jobs: wanted.iter().map(|w| w.1.to_string()).collect(),
        size_bytes: 64 << 20,
        runtime_s: PROBE_SECONDS,
        ramp_s: 0.5,
        queue_depths: vec![16],
        direct: true,
    };
    let started = std::time::Instant::now();
    let points = match measure(cluster, program, &p, cancel, |_, _, _| {}).await {
        Ok(points) => points,
        Err(e @ Error::Cancelled(_)) => return Err(e),
        Err(e) => {
            return Ok(Delivered {
                error: Some(e.to_string()),
                ..Default::default()
            });
        }
    };
    let mut out = Delivered {
        seconds: Some(started.elapsed().as_secs_f64()),
        fio: points.first().map(|p| p.metrics.fio.clone()),
        ..Default::default()
    };
    // A profile with per-I/O latency: what one I/O at a time takes.
    let latencies = caps.latency.each();
    if !latencies.is_empty() {
        let qd1 = Params {
            jobs: ["rand-read", "rand-write", "wal-fsync"]
                .map(String::from)
                .to_vec(),
            queue_depths: vec![1],
            ..p.clone()
        };
        let timed = match measure(cluster, program, &qd1, cancel, |_, _, _| {}).await {
            Ok(points) => points,
            Err(e @ Error::Cancelled(_)) => return Err(e),
            Err(e) => {
                out.error = Some(e.to_string());
                Vec::new()
            }
        };
        for ((probe, asked, _), pt) in latencies.iter().zip(&timed) {
            out.set(
                probe,
                Probe {
                    asked: *asked,
                    delivered: pt.metrics.latency_ms_mean,
                },
            );
        }
        out.seconds = Some(started.elapsed().as_secs_f64());
    }
    for ((cap, _, asked), pt) in wanted.iter().zip(&points) {
        let delivered = if cap.ends_with("iops") {
            pt.metrics.iops
        } else {
            pt.metrics.mib_per_s
        };
        out.set(
            cap,
            Probe {
                asked: *asked as f64,
                delivered,
            },
        );
    }
    Ok(out)
}

/// fio's `--filename` separates several files with `:`.
fn fio_filename(path: &Path) -> String {
    path.display().to_string().replace(':', "\\:")
}

/// Runs one job to completion (or until the cell is cancelled: the fio
/// process is killed) and returns fio's JSON report.
async fn fio(
    cluster: &Cluster,
    program: &Path,
    cancel: &CancellationToken,
    p: &Params,
    r: &Run,
    file: &Path,
) -> Result<Json> {
    let direct = r.direct;
    let mut cmd = cluster.contained(program, libc::SIGKILL)?;
    cmd.arg(format!("--name={}", r.job))
        .arg(format!("--filename={}", fio_filename(file)))
        .arg(format!("--size={}", p.size_bytes))
        .arg(format!("--rw={}", r.rw))
        .arg(format!("--bs={}", r.block_size))
        .arg(format!("--iodepth={}", r.queue_depth))
        .arg(format!(
            "--ioengine={}",
            if direct { "libaio" } else { "psync" }
        ))
        .arg(format!("--direct={}", u8::from(direct)))
        .arg(format!("--runtime={}", p.runtime_s))
        .arg(format!("--ramp_time={}", p.ramp_s))
        .args([
            "--time_based=1",
            "--randrepeat=0",
            "--lat_percentiles=1",
            "--percentile_list=50:99:99.9",
            "--output-format=json",
            // One process (jobs as threads): killing it stops every job.
            "--thread",
        ])
        .current_dir(cluster.storage_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if r.job == "wal-fsync" {
        // Each write made durable before the next, as a commit's WAL is.
        cmd.arg("--fdatasync=1");
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| err(format!("starting `{}`: {e}", program.display())))?;
    cluster.join_cgroups(&child, "fio")?;
    async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf).await;
        }
        buf
    }
    // Both pipes at once: fio blocks on a full one.
    let (out_pipe, err_pipe) = (child.stdout.take(), child.stderr.take());
    let read_all = async { tokio::join!(read_all(out_pipe), read_all(err_pipe)) };
    let ((stdout, stderr), status) = tokio::select! {
        r = async { tokio::join!(read_all, child.wait()) } => r,
        _ = cancel.cancelled() => {
            // fio and anything it started (its own process group) go now,
            // and are gone before the cluster's cgroups are removed.
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.wait().await;
            return Err(Error::Cancelled("cell cancelled".into()));
        }
    };
    let status = status.map_err(|e| err(format!("waiting for fio: {e}")))?;
    let stderr = String::from_utf8_lossy(&stderr);
    if !status.success() {
        let hint = if stderr.contains("direct") || stderr.contains("Invalid argument") {
            " (the data volume's filesystem may not support O_DIRECT, e.g. tmpfs: \
             put the agent's --data-root on a disk, or set `direct: false`)"
        } else {
            ""
        };
        return Err(err(format!(
            "{} at queue depth {} failed ({}): {}{hint}",
            r.job,
            r.queue_depth,
            status,
            tail(&stderr, 600)
        )));
    }
    let stdout = String::from_utf8_lossy(&stdout);
    // fio may print notes before its JSON.
    let start = stdout.find('{').unwrap_or(0);
    serde_json::from_str(&stdout[start..]).map_err(|e| {
        err(format!(
            "fio's JSON output does not parse ({e}): {}",
            tail(&stdout, 300)
        ))
    })
}

fn tail(s: &str, n: usize) -> String {
    let s = s.trim();
    let cut = s.len().saturating_sub(n);
    let cut = (cut..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(0);
    s[cut..].to_string()
}

/// A job's figures from fio's JSON report (`jobs[0]`): its read or write
/// side, and for `wal-fsync` the latencies of its sync calls.
pub fn metrics(doc: &Json, r: &Run) -> std::result::Result<Metrics, String> {
    let job = &doc["jobs"][0];
    if let Some(e) = job["error"].as_i64().filter(|e| *e != 0) {
        return Err(format!("fio reported error {e}"));
    }
    let side = if r.rw.contains("read") {
        &job["read"]
    } else {
        &job["write"]
    };
    let lat = if r.job == "wal-fsync" {
        &job["sync"]["lat_ns"]
    } else {
        &side["lat_ns"]
    };
    let ms = |v: &Json, what: &str| -> std::result::Result<f64, String> {
        v.as_f64()
            .map(|ns| ns / 1e6)
            .ok_or_else(|| format!("no {what} in fio's report"))
    };
    if side["total_ios"].as_u64().unwrap_or(0) == 0 {
        return Err("fio completed no I/O in the measured time".into());
    }
    let pct = &lat["percentile"];
    Ok(Metrics {
        iops: side["iops"].as_f64().ok_or("no iops in fio's report")?,
        mib_per_s: side["bw_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64,
        latency_ms_mean: ms(&lat["mean"], "mean latency")?,
        latency_ms_p50: ms(&pct["50.000000"], "latency p50")?,
        latency_ms_p99: ms(&pct["99.000000"], "latency p99")?,
        latency_ms_p999: ms(&pct["99.900000"], "latency p99.9")?,
        io_bytes: side["io_bytes"].as_u64().unwrap_or(0),
        runtime_s: side["runtime"].as_f64().unwrap_or(0.0) / 1e3,
        write_latency_ms_p99: if r.job == "wal-fsync" {
            Some(ms(
                &side["lat_ns"]["percentile"]["99.000000"],
                "write latency p99",
            )?)
        } else {
            None
        },
        device_read_bytes: None,
        device_write_bytes: None,
        device_source: None,
        fio: String::new(),
    })
}
