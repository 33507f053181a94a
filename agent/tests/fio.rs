//! kind fio against real clusters' volumes and the real fio (Debian's
//! package): the figures it reads, the emulated caps binding it in the
//! cluster's cgroups, its file removed on every path, and a clear error for
//! a fio that is missing or too old.

mod common;

use std::path::Path;
use std::time::Duration;

use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::workload::{self, CellContext, Output};
use pgfleet_proto::workload::fio::{Metrics, PointParams};
use tokio_util::sync::CancellationToken;

async fn cluster(root: &Path, caps: Caps) -> Cluster {
    let mut s = common::spec(root, "c", "32MB", caps);
    s.account_io = true;
    Cluster::provision(&s).await.unwrap()
}

async fn run_with(
    cluster: &Cluster,
    entry: &str,
    fio: &str,
    cancel: CancellationToken,
) -> pgfleet_agent::Result<Output> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let mut ctx = CellContext::new("c", cluster, tx, cancel);
    ctx.fio = fio.into();
    workload::run(&mut ctx, &common::params(entry)).await
}

fn fio_file(cluster: &Cluster) -> std::path::PathBuf {
    cluster.dir().join("fio.data")
}

#[tokio::test]
async fn fio_measures_the_clusters_volume_and_removes_its_file() {
    let root = common::scratch("fio-plain");
    let c = cluster(&root, Caps::default()).await;
    let out = run_with(
        &c,
        "{kind: fio, size: 32MiB, runtime_s: 1, ramp_s: 0, queue_depths: [1, 4]}",
        "fio",
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let points: Vec<(PointParams, Metrics)> = common::typed_points(&out);
    let jobs: Vec<(&str, u32)> = points
        .iter()
        .map(|(p, _)| (p.job.as_str(), p.queue_depth))
        .collect();
    assert_eq!(
        jobs,
        [
            ("rand-read", 1),
            ("rand-read", 4),
            ("rand-write", 1),
            ("rand-write", 4),
            ("seq-read", 8),
            ("seq-write", 8),
            ("wal-fsync", 1)
        ]
    );
    for (p, m) in &points {
        assert!(m.iops > 0.0 && m.io_bytes > 0, "{p:?} {m:?}");
        // fio's bandwidth is its IOPS times the block size.
        let mib = m.iops * p.block_size as f64 / (1u64 << 20) as f64;
        assert!(
            (m.mib_per_s - mib).abs() <= 0.05 * mib + 0.01,
            "{p:?}: {} MiB/s vs {mib} from IOPS",
            m.mib_per_s
        );
        assert!(
            0.0 < m.latency_ms_p50
                && m.latency_ms_p50 <= m.latency_ms_p99
                && m.latency_ms_p99 <= m.latency_ms_p999,
            "{p:?} {m:?}"
        );
        assert!(m.runtime_s >= 0.9 && m.runtime_s < 5.0, "{m:?}");
        assert!(m.fio.starts_with("fio-3."), "{}", m.fio);
        assert_eq!(p.direct, p.job != "wal-fsync");
        // The cluster's block-I/O cgroup counted fio's device bytes: a
        // write job wrote at least what fio says it wrote.
        if nix::unistd::geteuid().is_root() && p.job.contains("write") {
            let dev = m.device_write_bytes.unwrap();
            assert!(
                dev >= m.io_bytes * 9 / 10,
                "{p:?}: device {dev} < fio {}",
                m.io_bytes
            );
        }
    }
    let wal = &points[6].1;
    assert!(wal.write_latency_ms_p99.is_some());
    assert!(!fio_file(&c).exists(), "fio's file was left behind");
    c.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// The storage profile's caps hold fio in the cluster's cgroups as they
/// hold the server: random reads at the IOPS cap, sequential writes at the
/// MiB/s cap (block-I/O throttling needs root).
#[tokio::test]
async fn emulated_caps_bind_fio() {
    if !nix::unistd::geteuid().is_root() {
        common::skip("block-I/O throttling needs root");
        return;
    }
    let root = common::scratch("fio-capped");
    let caps = Caps {
        read_iops: 300,
        write_iops: 0,
        read_mbps: 0,
        write_mbps: 20,
        combined: false,
    };
    let c = cluster(&root, caps).await;
    let out = run_with(
        &c,
        "{kind: fio, jobs: [rand-read, seq-write], size: 64MiB, runtime_s: 3, ramp_s: 1, queue_depths: [8]}",
        "fio",
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let points: Vec<(PointParams, Metrics)> = common::typed_points(&out);
    let read = &points[0].1;
    assert!(
        read.iops <= 300.0 * 1.15 && read.iops >= 300.0 * 0.5,
        "rand-read at a 300 IOPS cap: {} IOPS",
        read.iops
    );
    let write = &points[1].1;
    assert!(
        write.mib_per_s <= 20.0 * 1.15 && write.mib_per_s >= 20.0 * 0.5,
        "seq-write at a 20 MiB/s cap: {} MiB/s",
        write.mib_per_s
    );
    c.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// fio's read and write IOPS of a mixed random job (8 KiB, direct, 8 in
/// flight) on the cluster's volume, after a second's ramp.
fn mixed_iops(c: &Cluster, read_percent: u32) -> (f64, f64) {
    let out = std::process::Command::new("fio")
        .args([
            "--name=mix",
            "--size=64M",
            "--rw=randrw",
            "--bs=8k",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=8",
            "--time_based",
            "--runtime=4",
            "--ramp_time=1",
            "--output-format=json",
        ])
        .arg(format!("--rwmixread={read_percent}"))
        .arg(format!(
            "--filename={}",
            c.storage_dir().join("mix.data").display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let job = &v["jobs"][0];
    let iops = (
        job["read"]["iops"].as_f64().unwrap(),
        job["write"]["iops"].as_f64().unwrap(),
    );
    eprintln!(
        "randrw {read_percent}% reads: {:.0} read + {:.0} write IOPS",
        iops.0, iops.1
    );
    iops
}

/// gp3's IOPS are one budget for reads and writes (`combined`): a mixed
/// load gets the budget in all, not a cap of each direction (which the
/// kernel's throttle alone gives: up to twice the budget), and a direction
/// alone gets nearly all of it.
#[tokio::test]
async fn a_combined_budget_caps_reads_and_writes_together() {
    if !nix::unistd::geteuid().is_root() {
        common::skip("block-I/O throttling needs root");
        return;
    }
    let root = common::scratch("fio-combined");
    let budget = 300.0;
    let caps = |combined| Caps {
        read_iops: 300,
        write_iops: 300,
        read_mbps: 0,
        write_mbps: 0,
        combined,
    };
    let c = cluster(&root, caps(true)).await;
    if c.capped_device().is_none() {
        common::skip("no loop device for the cluster's own volume");
        c.teardown().await.unwrap();
        return;
    }
    let (r, w) = mixed_iops(&c, 50);
    assert!(
        r + w <= budget * 1.15 && r + w >= budget * 0.6,
        "50/50 under a combined budget of {budget}: {r:.0} read + {w:.0} write IOPS"
    );
    let (r, _) = mixed_iops(&c, 100);
    assert!(
        r >= budget * 0.8 && r <= budget * 1.15,
        "reads alone under a combined budget of {budget}: {r:.0} IOPS"
    );
    c.teardown().await.unwrap();
    // The same caps per direction: the mixed load gets both.
    let c = cluster(&root, caps(false)).await;
    let (r, w) = mixed_iops(&c, 50);
    assert!(
        r + w >= budget * 1.5,
        "50/50 under caps of {budget} each: {r:.0} read + {w:.0} write IOPS"
    );
    c.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// A write cap binds everything written to the emulated volume, not only
/// what the server's processes write themselves: a load and the checkpoint
/// after it are written back by the kernel's flusher threads, which a cgroup
/// v1 block-I/O cgroup never sees. The cluster's own loop device carries
/// the cap for every writer, so the device's bytes over the time they took
/// stay at the cap.
#[tokio::test]
async fn a_write_cap_binds_a_load_and_its_checkpoint() {
    if !nix::unistd::geteuid().is_root() {
        common::skip("block-I/O throttling needs root");
        return;
    }
    let root = common::scratch("fio-load-capped");
    let caps = Caps {
        read_iops: 0,
        write_iops: 0,
        read_mbps: 0,
        write_mbps: 20,
        combined: false,
    };
    // An emulated instance's memory: its dirty pages are written back by
    // the flushers when it reclaims them.
    let mut s = common::spec(&root, "c", "16MB", caps);
    s.account_io = true;
    s.memory_bytes = 96 << 20;
    let c = Cluster::provision(&s).await.unwrap();
    let (_, written0) = c.io_bytes().expect("the cluster's own device");
    let started = std::time::Instant::now();
    common::run(&c, &common::params("{kind: pgbench-init, scale: 5}"))
        .await
        .unwrap();
    c.connect()
        .await
        .unwrap()
        .batch_execute("CHECKPOINT")
        .await
        .unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let (_, written1) = c.io_bytes().unwrap();
    let mib = (written1 - written0) as f64 / (1 << 20) as f64;
    eprintln!(
        "wrote {mib:.0} MiB in {seconds:.1} s: {:.1} MiB/s",
        mib / seconds
    );
    assert!(
        mib > 60.0,
        "the load and checkpoint reached the device: {mib:.0} MiB"
    );
    assert!(
        mib / seconds <= 20.0 * 1.2,
        "{mib:.0} MiB in {seconds:.1} s is {:.1} MiB/s, above the 20 MiB/s cap",
        mib / seconds
    );
    c.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// A cancelled cell kills fio at once and leaves no file.
#[tokio::test]
async fn a_cancelled_fio_is_killed_and_its_file_removed() {
    let root = common::scratch("fio-cancel");
    let c = cluster(&root, Caps::default()).await;
    let cancel = CancellationToken::new();
    let later = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        later.cancel();
    });
    let started = std::time::Instant::now();
    let e = run_with(
        &c,
        "{kind: fio, jobs: [rand-write], size: 32MiB, runtime_s: 120, queue_depths: [1]}",
        "fio",
        cancel,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, pgfleet_agent::Error::Cancelled(_)), "{e}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!fio_file(&c).exists(), "fio's file was left behind");
    // No fio process is left in the cluster's cgroups (or anywhere, as the
    // cluster's user): only the server's processes remain.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = std::process::Command::new("pgrep")
        .args(["-f", &format!("--filename={}", fio_file(&c).display())])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "fio still running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    c.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_missing_or_old_fio_is_a_clear_error() {
    let root = common::scratch("fio-missing");
    let c = cluster(&root, Caps::default()).await;
    let e = run_with(
        &c,
        "{kind: fio}",
        "/nonexistent/fio",
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`/nonexistent/fio` was not found") && e.contains("apt-get install fio"),
        "{e}"
    );
    // A program that answers like fio 2.2 (no real fio that old can be
    // installed here): the version gate refuses it before running a job.
    let old = root.join("old-fio");
    std::fs::write(&old, "#!/bin/sh\necho fio-2.2.10\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = run_with(
        &c,
        "{kind: fio}",
        old.to_str().unwrap(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("fio-2.2.10") && e.contains("too old") && e.contains(">= 3.5"),
        "{e}"
    );
    c.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}
