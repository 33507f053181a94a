//! Real PostgreSQL, as root: seeds/004's read and write tests. The cold
//! scan reads the table from the device and the OS-cache scan does not; the
//! write test's device bytes are its own cluster's, whatever another
//! cluster writes meanwhile (block-I/O cgroup accounting: cgroup v1 here,
//! `blkio.throttle.io_service_bytes`; v2's `io.stat` is read the same way).

mod common;

use pgfleet_agent::cluster::{Cluster, ClusterSpec};
use pgfleet_proto::workload::read_write::{Metrics, PointParams};

use common::{params, run};

fn spec(root: &std::path::Path, name: &str) -> ClusterSpec {
    let mut s = common::spec(root, name, "32MB", Default::default());
    s.account_io = true;
    s
}

fn points(out: &pgfleet_agent::workload::Output) -> Vec<(PointParams, Metrics)> {
    common::typed_points(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cold_scan_reads_the_device_and_the_os_cache_scan_does_not() {
    let root = common::scratch("rw-read");
    let cl = Cluster::provision(&spec(&root, "c")).await.unwrap();
    assert!(
        cl.io_bytes().is_some(),
        "the cluster runs in an accounting cgroup"
    );
    let out = run(
        &cl,
        &params("{kind: read-write, rows: 150000, tests: [seq-cold, seq-os-cache], repeats: 2}"),
    )
    .await
    .unwrap();
    let pts = points(&out);
    let get = |t: &str| &pts.iter().find(|(p, _)| p.test == t).unwrap().1;
    let (cold, warm) = (get("seq-cold"), get("seq-os-cache"));
    eprintln!("cold {cold:?}\nos-cache {warm:?}");
    let table = cold.table_bytes as f64;
    let cold_read = cold.device_read_bytes.unwrap() as f64;
    let warm_read = warm.device_read_bytes.unwrap() as f64;
    // Cold: evicted, then every page from the device; PostgreSQL read them
    // all from outside shared buffers.
    assert!(
        cold.evicted_bytes.unwrap() as f64 >= table * 0.9,
        "{cold:?}"
    );
    assert!(
        cold_read >= table * 0.8,
        "cold read {cold_read} of a {table} B table: {cold:?}"
    );
    assert!(
        cold.shared_read.unwrap() * 8192.0 >= table * 0.8,
        "{cold:?}"
    );
    // OS cache: shared buffers were cold (blocks read by PostgreSQL), the
    // device was not.
    assert!(
        warm.shared_read.unwrap() * 8192.0 >= table * 0.8,
        "{warm:?}"
    );
    assert!(
        warm_read < table * 0.1,
        "os-cache read {warm_read} of a {table} B table: {warm:?}"
    );
    assert_eq!(cold.executions_ms.len(), 2);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_writes_are_the_clusters_own() {
    let root = common::scratch("rw-write");
    let cl = Cluster::provision(&spec(&root, "a")).await.unwrap();
    let other = Cluster::provision(&spec(&root, "b")).await.unwrap();
    // The other cluster writes several times what the test does, all along.
    let noisy = other.connect().await.unwrap();
    noisy
        .batch_execute("CREATE TABLE junk (pad text) WITH (autovacuum_enabled = false)")
        .await
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let s2 = stop.clone();
    let writer = tokio::spawn(async move {
        while !s2.is_cancelled() {
            noisy
                .batch_execute("INSERT INTO junk SELECT repeat(md5(i::text), 30) FROM generate_series(1, 100000) i; CHECKPOINT")
                .await
                .unwrap();
        }
    });
    let other_before = other.io_bytes().unwrap().1;
    let out = run(
        &cl,
        &params("{kind: read-write, rows: 100000, tests: [write]}"),
    )
    .await
    .unwrap();
    let other_wrote = other.io_bytes().unwrap().1 - other_before;
    stop.cancel();
    writer.await.unwrap();
    let (_, m) = &points(&out)[0];
    let dev = m.device_write_bytes.unwrap() as f64;
    let own = (m.dirty_page_bytes.unwrap() + m.wal_bytes.unwrap()) as f64;
    assert!(
        other_wrote as f64 > 2.0 * dev,
        "the other cluster wrote {other_wrote}, the test {dev}"
    );
    // What the device wrote for the test is what PostgreSQL wrote (pages and
    // WAL, the OS merging some), not the other cluster's bytes too.
    eprintln!("test: device {dev} B, own {own} B; other cluster {other_wrote} B; {m:?}");
    let waf = m.write_amplification.unwrap();
    assert!(
        (0.5..1.5).contains(&waf),
        "WAF {waf}: device {dev} vs own {own}: {m:?}"
    );
    assert!(m.dirty_page_bytes.unwrap() >= m.table_bytes / 2, "{m:?}");
    assert!(m.device_write_bytes_checkpoint.unwrap() > 0, "{m:?}");
    assert!(m.update_seconds.unwrap() > 0.0 && m.checkpoint_seconds.unwrap() > 0.0);
    other.teardown().await.unwrap();
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
