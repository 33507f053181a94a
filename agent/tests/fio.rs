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
        latency: Default::default(),
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
        latency: Default::default(),
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
    // Rate caps have no latency to spike: a degrade's latency_ms is refused.
    let mut spike = caps(true);
    spike.latency.read_us = 5000;
    let refused = c.caps_window(spike).err().expect("refused");
    assert!(refused.to_string().contains("served volume"), "{refused}");
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
        latency: Default::default(),
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

/// gp3 as the agent serves it (`cluster::ebs`): a QD1 reader gets the
/// profile's per-I/O latency (1 ms, so about 1,000 IOPS), not the host's
/// tens of microseconds; sixteen in flight get the budget's 3,000 IOPS and
/// queue for the rest; a WAL-like write and fdatasync pays a write's
/// latency. And nothing is left mounted or attached after teardown.
#[tokio::test]
async fn an_emulated_network_volume_answers_with_its_latency_within_its_budget() {
    if !pgfleet_agent::cluster::ebs::available() {
        common::skip("the emulated network volume needs root and /dev/fuse");
        return;
    }
    let root = common::scratch("fio-served");
    let caps = Caps {
        read_iops: 3000,
        write_iops: 3000,
        read_mbps: 125,
        write_mbps: 125,
        combined: true,
        latency: pgfleet_proto::environment::Latency {
            read_us: 1000,
            write_us: 1000,
            flush_us: 0,
        },
    };
    let c = cluster(&root, caps).await;
    let out = run_with(
        &c,
        "{kind: fio, jobs: [rand-read, rand-write, wal-fsync], size: 64MiB, runtime_s: 3, ramp_s: 1, queue_depths: [1, 16]}",
        "fio",
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let points: Vec<(PointParams, Metrics)> = common::typed_points(&out);
    for (p, m) in &points {
        eprintln!(
            "{} QD{}: {:.0} IOPS, mean {:.3} ms, p50 {:.3} ms, p99 {:.3} ms",
            p.job, p.queue_depth, m.iops, m.latency_ms_mean, m.latency_ms_p50, m.latency_ms_p99
        );
    }
    let at = |job: &str, qd: u32| {
        &points
            .iter()
            .find(|(p, _)| p.job == job && p.queue_depth == qd)
            .unwrap_or_else(|| panic!("no {job} at QD{qd}"))
            .1
    };
    for job in ["rand-read", "rand-write"] {
        let one = at(job, 1);
        assert!(
            (0.85..1.25).contains(&one.latency_ms_mean),
            "{job} QD1: mean {} ms against the profile's 1 ms",
            one.latency_ms_mean
        );
        assert!(
            (800.0..1150.0).contains(&one.iops),
            "{job} QD1: {} IOPS",
            one.iops
        );
        let deep = at(job, 16);
        assert!(
            (3000.0 * 0.85..3000.0 * 1.1).contains(&deep.iops),
            "{job} QD16: {} IOPS against the budget's 3,000",
            deep.iops
        );
        assert!(deep.latency_ms_mean > 4.0, "{job} QD16 queues: {deep:?}");
    }
    let wal = at("wal-fsync", 1);
    assert!(
        (0.9..2.5).contains(&wal.latency_ms_mean),
        "a write and fdatasync: {} ms",
        wal.latency_ms_mean
    );
    // A degrade's latency spike: the served volume answers 5 ms for its
    // window, then the class's again.
    let spike = Caps {
        latency: pgfleet_proto::environment::Latency {
            read_us: 5000,
            write_us: 5000,
            flush_us: 0,
        },
        ..caps
    };
    let window = c.caps_window(spike).unwrap();
    let out = run_with(
        &c,
        "{kind: fio, jobs: [rand-read], size: 64MiB, runtime_s: 2, ramp_s: 0, queue_depths: [1]}",
        "fio",
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let spiked: Vec<(PointParams, Metrics)> = common::typed_points(&out);
    assert!(
        (4.5..6.0).contains(&spiked[0].1.latency_ms_mean),
        "during a 5 ms latency spike: {:?}",
        spiked[0].1
    );
    window.restore().unwrap();
    assert_eq!(c.served().unwrap().caps(), caps);
    let volume = c.storage_dir().to_path_buf();
    let served = c.dir().join("ebs");
    c.teardown().await.unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    for gone in [&volume, &served] {
        assert!(
            !mounts.contains(&*gone.to_string_lossy()),
            "{} is still mounted",
            gone.display()
        );
    }

    // The emulation's own cost: nothing added and no budget, the most it
    // delivers here at QD16, and the agent's CPU per I/O it served (the
    // test process is the agent; fio runs apart).
    let free = Caps {
        latency: pgfleet_proto::environment::Latency {
            read_us: 1,
            write_us: 1,
            flush_us: 0,
        },
        ..Caps::default()
    };
    let c = cluster(&root, free).await;
    let cpu0 = cpu_seconds();
    let before = c.served().expect("a served volume").counted();
    let out = run_with(
        &c,
        "{kind: fio, jobs: [rand-read], size: 64MiB, runtime_s: 3, ramp_s: 1, queue_depths: [16]}",
        "fio",
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let cpu = cpu_seconds() - cpu0;
    let after = c.served().unwrap().counted();
    let ios = (after.ios[0] + after.ios[1]) - (before.ios[0] + before.ios[1]);
    let points: Vec<(PointParams, Metrics)> = common::typed_points(&out);
    let most = points[0].1.iops;
    eprintln!(
        "the emulation's most at QD16: {most:.0} IOPS; {:.1} µs of the agent's CPU an I/O ({ios} I/Os)",
        cpu / ios as f64 * 1e6
    );
    assert!(
        most > 3000.0 * 1.5,
        "the served volume delivers {most:.0} IOPS at most here: gp3's 3,000 would bind on the emulation"
    );
    c.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// This process's CPU time (user and system), in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(u.ru_utime) + s(u.ru_stime)
}
