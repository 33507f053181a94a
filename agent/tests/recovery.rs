//! Real PostgreSQL under faults (`faults:` of a pgbench entry): a crash
//! (every server process killed, crash recovery, the clients reconnect),
//! an immediate checkpoint, a stall and a degrade of the emulated caps,
//! each measured; and nothing left behind: the caps come back after the
//! window and when the cell is cancelled mid-stall, and a server that does
//! not come back within its bound fails the cell with its log's words.

mod common;

use std::time::Duration;

use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::workload::{self, CellContext};
use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::workload::fault::FaultKind;
use pgfleet_proto::workload::pgbench::{Metrics, PointParams};
use tokio_util::sync::CancellationToken;

const CAPS: Caps = Caps {
    read_iops: 3000,
    write_iops: 3000,
    read_mbps: 0,
    write_mbps: 0,
    combined: false,
    latency: pgfleet_proto::environment::Latency::NONE,
};

/// The value of device `dev`'s rule in a v1 root blkio throttle file.
fn rule(file: &str, dev: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/fs/cgroup/blkio/{file}"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(dev)).then(|| f.next()?.parse().ok())?
        })
}

fn can_cap() -> bool {
    nix::unistd::Uid::effective().is_root()
        && std::path::Path::new("/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device").exists()
}

/// Runs `params` in `cl`, keeping the cell's samples and phases.
async fn run_keeping(
    cl: &Cluster,
    params: &pgfleet_proto::workload::Params,
    cancel: CancellationToken,
) -> (
    pgfleet_agent::Result<workload::Output>,
    Vec<(String, String)>,
    Vec<String>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<pgfleet_proto::v1::AgentMessage>(65536);
    let kept = tokio::spawn(async move {
        let (mut samples, mut phases) = (Vec::new(), Vec::new());
        while let Some(m) = rx.recv().await {
            match m.msg {
                Some(Msg::Sample(s)) => samples.push((s.kind, s.data_json)),
                Some(Msg::Progress(p)) => phases.push(p.phase),
                _ => {}
            }
        }
        (samples, phases)
    });
    let out = {
        let mut ctx = CellContext::new("c", cl, tx, cancel);
        workload::run(&mut ctx, params).await
    };
    let (samples, phases) = kept.await.unwrap();
    (out, samples, phases)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_checkpoint_stall_and_degrade_are_injected_and_measured() {
    if !can_cap() {
        common::skip("emulated caps need root and cgroup v1 blkio");
        return;
    }
    let root = common::scratch("recovery");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", CAPS))
        .await
        .unwrap();
    let dev = cl
        .capped_device()
        .expect("a capped cluster has its own device")
        .to_string();
    let p = common::params(
        "{kind: pgbench, scale: 2, script: tpcb-like, clients: 4, duration_s: 30, faults: [\
           {kind: checkpoint, at_s: 4}, {kind: crash, at_s: 9}, \
           {kind: stall, at_s: 16, duration_s: 3}, {kind: degrade, at_s: 23, duration_s: 3, iops: 150}]}",
    );
    let during_stall = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Sampled while the stall holds (its window is 16-19 s into a
        // window that starts after the load).
        let mut seen = Vec::new();
        for _ in 0..600 {
            seen.push(rule("blkio.throttle.write_iops_device", &dev));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    };
    let ((out, samples, phases), seen) =
        tokio::join!(run_keeping(&cl, &p, CancellationToken::new()), during_stall);
    let out = out.unwrap();
    let (params, m): (PointParams, Metrics) = common::typed_points(&out).remove(0);
    assert_eq!(params.faults.len(), 4);
    assert_eq!(m.faults.len(), 4, "{:?}", m.faults);
    let [ck, crash, stall, degrade] = &m.faults[..] else {
        unreachable!()
    };
    // The checkpoint wrote the buffers the load and the clients dirtied.
    assert_eq!(ck.kind, FaultKind::Checkpoint);
    assert!(ck.checkpoint_s.unwrap() > 0.0, "{ck:?}");
    assert!(ck.buffers_written.unwrap() > 0, "{ck:?}");
    // The crash: recovered, replayed WAL, the clients back.
    assert_eq!(crash.kind, FaultKind::Crash);
    let rec = crash.recovery_s.unwrap();
    assert!(rec > 0.0 && rec < 60.0, "{crash:?}");
    assert!(crash.wal_replayed_bytes.unwrap() > 0, "{crash:?}");
    let first = crash.first_transaction_s.unwrap();
    assert!(first >= rec, "{crash:?}");
    assert!(crash.back_to_90pct_s.unwrap() >= rec, "{crash:?}");
    assert!(crash.transactions_lost > 0.0, "{crash:?}");
    // The ledger (tpcb-like commits with END): every commit acknowledged
    // before the kill is there after recovery (synchronous_commit: on).
    assert!(crash.acknowledged.unwrap() > 10, "{crash:?}");
    assert_eq!(crash.acknowledged_lost, Some(0), "{crash:?}");
    assert_eq!(m.fault_metrics.acknowledged_lost, Some(0.0));
    assert_eq!(ck.acknowledged, None, "only a crash has ledger figures");
    assert!(
        m.failures_by_class.get("connection").copied().unwrap_or(0) >= 1,
        "{:?}",
        m.failures_by_class
    );
    // Every server process died at the kill, as at a power loss: none was
    // left to notice its postmaster gone.
    let log = std::fs::read_to_string(cl.dir().join("postgres.log")).unwrap();
    assert!(!log.contains("unexpected postmaster exit"), "{log}");
    assert!(
        log.contains("database system was interrupted"),
        "crash recovery ran: {log}"
    );
    // The stall: throughput fell while the caps were at 1 IOPS.
    assert_eq!(stall.kind, FaultKind::Stall);
    assert!((stall.end_s - stall.start_s - 3.0).abs() < 0.5, "{stall:?}");
    assert!(
        stall.tps_during.unwrap() < 0.5 * stall.baseline_tps,
        "{stall:?}"
    );
    assert!(seen.contains(&Some(1)), "the stall's cap was never seen");
    assert!(
        seen.contains(&Some(150)),
        "the degrade's cap was never seen"
    );
    assert_eq!(degrade.kind, FaultKind::Degrade);
    // The flat figures are the worst of the faults'.
    assert_eq!(m.fault_metrics.recovery_seconds, Some(rec));
    assert!(m.fault_metrics.checkpoint_buffers.unwrap() > 0.0);
    // Marked in the timeline, and as the cell's phases.
    let marks: Vec<serde_json::Value> = samples
        .iter()
        .filter(|(k, _)| k == "fault")
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(marks.len(), 8, "a start and an end per fault: {marks:?}");
    assert_eq!(marks[2]["kind"], "crash");
    assert_eq!(marks[2]["event"], "start");
    for p in [
        "fault:crash",
        "fault:checkpoint",
        "fault:stall",
        "fault:degrade",
    ] {
        assert!(phases.iter().any(|x| x == p), "{p} in {phases:?}");
    }
    // The class's caps are back, and the server is the cluster's.
    assert_eq!(rule("blkio.throttle.write_iops_device", &dev), Some(3000));
    assert_eq!(rule("blkio.throttle.read_iops_device", &dev), Some(3000));
    assert!(cl.server_alive());
    common::sql(&cl)
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
    cl.teardown().await.unwrap();
    assert_eq!(rule("blkio.throttle.write_iops_device", &dev), None);
    std::fs::remove_dir_all(&root).unwrap();
}

/// A cell cancelled in the middle of a stall (Ctrl-C) puts the caps back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_cancelled_mid_stall_puts_the_caps_back() {
    if !can_cap() {
        common::skip("emulated caps need root and cgroup v1 blkio");
        return;
    }
    let root = common::scratch("stall-cancel");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", CAPS))
        .await
        .unwrap();
    let dev = cl.capped_device().unwrap().to_string();
    let p = common::params(
        "{kind: pgbench, scale: 1, script: tpcb-like, clients: 2, duration_s: 60, \
          faults: [{kind: stall, at_s: 2, duration_s: 50}]}",
    );
    let cancel = CancellationToken::new();
    let canceller = async {
        for _ in 0..600 {
            if rule("blkio.throttle.write_iops_device", &dev) == Some(1) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                cancel.cancel();
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    let ((out, _, _), stalled) = tokio::join!(run_keeping(&cl, &p, cancel.clone()), canceller);
    assert!(stalled, "the stall never began");
    assert!(out.is_err(), "a cancelled cell has no result");
    assert_eq!(rule("blkio.throttle.write_iops_device", &dev), Some(3000));
    assert_eq!(rule("blkio.throttle.read_iops_device", &dev), Some(3000));
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// A server that cannot come back from a crash fails the cell, saying what
/// its log said (here its data directory was made group- and
/// world-writable while it ran, which a starting server refuses); the
/// driver stops with it and the cluster still tears down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_not_back_from_a_crash_fails_the_cell_with_its_log() {
    let root = common::scratch("crash-fails");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", Caps::default()))
        .await
        .unwrap();
    // Loaded by copy: a direct load restarts the server, which would
    // refuse the directory before the crash.
    let p = common::copy_params(
        "{kind: pgbench, scale: 1, script: tpcb-like, clients: 2, duration_s: 60, \
          faults: [{kind: crash, at_s: 3}]}",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(cl.data_dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let started = std::time::Instant::now();
    let (out, _, _) = run_keeping(&cl, &p, CancellationToken::new()).await;
    let e = out.unwrap_err().to_string();
    assert!(e.contains("did not come back from the crash"), "{e}");
    assert!(
        e.contains("invalid permissions"),
        "the server's own words: {e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the driver stopped with the failed fault"
    );
    cl.teardown().await.unwrap();
    assert!(!root.join("clusters/c").exists());
    std::fs::remove_dir_all(&root).unwrap();
}

/// gp3's budget: 3,000 IOPS and 125 MiB/s, reads and writes from one.
const GP3: Caps = Caps {
    read_iops: 3000,
    write_iops: 3000,
    read_mbps: 125,
    write_mbps: 125,
    combined: true,
    latency: pgfleet_proto::environment::Latency::NONE,
};

/// The commit ledger under a crash, on an emulated gp3 volume and on this
/// host's disk (nvme), with `synchronous_commit` on and off, following
/// tpcb-like's explicit transactions (END) on nvme and random-update's
/// lone UPDATEs (each its own transaction) on gp3: with on, every
/// commit the server acknowledged before the kill is there after recovery;
/// with off, what is lost (commits still in the WAL buffers, which die
/// with the server's shared memory) is counted and was acknowledged
/// within a bounded time before the kill (the WAL writer writes them out
/// every `wal_writer_delay`, 200 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_commit_is_lost_with_synchronous_commit_on() {
    let gp3 = can_cap();
    if !gp3 {
        common::skip("emulated gp3 needs root and cgroup v1 blkio: nvme only");
    }
    let root = common::scratch("ledger");
    let mut seen = Vec::new();
    for (storage, caps, script) in [
        ("nvme", Caps::default(), "tpcb-like"),
        ("gp3", GP3, "random-update"),
    ] {
        let p = common::params(&format!(
            "{{kind: pgbench, scale: 2, script: {script}, clients: 8, duration_s: 8, \
              faults: [{{kind: crash, at_s: 4}}]}}"
        ));
        if storage == "gp3" && !gp3 {
            continue;
        }
        for sync in ["on", "off"] {
            let mut spec = common::spec(&root, &format!("{storage}-{sync}"), "64MB", caps);
            spec.settings
                .insert("synchronous_commit".into(), sync.into());
            let cl = Cluster::provision(&spec).await.unwrap();
            let (out, _, _) = run_keeping(&cl, &p, CancellationToken::new()).await;
            let (_, m): (PointParams, Metrics) = common::typed_points(&out.unwrap()).remove(0);
            let crash = &m.faults[0];
            let (acked, lost) = (
                crash.acknowledged.unwrap(),
                crash.acknowledged_lost.unwrap(),
            );
            seen.push(format!(
                "{storage} {script} synchronous_commit={sync}: {lost} of {acked} acknowledged lost, \
                 the earliest {:?} ms before the kill",
                crash.lost_window_ms
            ));
            assert!(acked > 100, "{storage}/{sync}: {crash:?}");
            match sync {
                "on" => assert_eq!(lost, 0, "{storage}: {crash:?}"),
                _ => {
                    assert!(lost <= acked, "{crash:?}");
                    // 3 x wal_writer_delay, with room for a busy host.
                    let w = crash.lost_window_ms.unwrap_or(0.0);
                    assert!(w < 5_000.0, "{storage}: lost from {w} ms before the kill");
                }
            }
            cl.teardown().await.unwrap();
        }
    }
    eprintln!("{}", seen.join("\n"));
    std::fs::remove_dir_all(&root).unwrap();
}

/// The ledger's check against a real table: rows acknowledged but not
/// there are lost (as a crash would leave them), rows never acknowledged
/// are not, and rows no client wrote are ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_finds_acknowledged_rows_that_are_gone() {
    use pgfleet_agent::driver::{Ledger, UNACKNOWLEDGED};
    let root = common::scratch("ledger-check");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", Caps::default()))
        .await
        .unwrap();
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let ctx = CellContext::new("c", &cl, tx, CancellationToken::new());
    workload::ledger::prepare(&ctx).await.unwrap();
    // The clients' role may insert, and nothing else.
    let w = cl.workload_server().connect().await.unwrap();
    w.batch_execute(
        "INSERT INTO pgfleet_ledger.commits VALUES (0, 0), (0, 1), (0, 3), (1, 0), (7, 7), (0, 99)",
    )
    .await
    .unwrap();
    for denied in [
        "SELECT * FROM pgfleet_ledger.commits",
        "DELETE FROM pgfleet_ledger.commits",
        "TRUNCATE pgfleet_ledger.commits",
        "CREATE TABLE pgfleet_ledger.mine (x int)",
    ] {
        let e = w.batch_execute(denied).await.unwrap_err();
        let said = e.as_db_error().map(|d| d.message().to_string());
        assert!(
            said.as_deref()
                .is_some_and(|m| m.contains("permission denied")),
            "{denied}: {e:?}"
        );
    }
    let t0 = std::time::Instant::now();
    let ledger = Ledger {
        t0,
        // Client 0: seq 2 acknowledged and gone, seq 4 gone but never
        // acknowledged; client 1: seq 1 acknowledged and gone.
        clients: vec![(0, vec![10, 20, 30, 40, UNACKNOWLEDGED]), (1, vec![15, 25])],
    };
    let lost = workload::ledger::lost(&ctx, &ledger).await.unwrap();
    let ms: Vec<u128> = lost
        .iter()
        .map(|t| t.duration_since(t0).as_millis())
        .collect();
    assert_eq!(ms, vec![25, 30]);
    // Made afresh: a reused cluster's rows of before do not count.
    workload::ledger::prepare(&ctx).await.unwrap();
    assert_eq!(
        workload::ledger::lost(&ctx, &ledger).await.unwrap().len(),
        6
    );
    drop(ctx);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
