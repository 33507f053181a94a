//! Real PostgreSQL, as root: seeds/004's read and write tests. The cold
//! scan reads the table from the device and the OS-cache scan does not; the
//! write test's device bytes are its own cluster's, whatever another
//! cluster writes meanwhile: as root each cluster has its own loop device
//! (exact counts, writeback included, so the write test's amplification is
//! at least 1); elsewhere its block-I/O cgroup's (cgroup v1:
//! `blkio.throttle.io_service_bytes`, short of buffered writeback).

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
    if nix::unistd::geteuid().is_root() {
        // As root, with losetup and mkfs.ext4 (util-linux, e2fsprogs), each
        // cluster gets its own device, whose counts are exact.
        assert!(
            cl.device_source().unwrap().contains("loop device"),
            "{:?}",
            cl.device_source()
        );
    }
    // The other cluster writes several times what the test does, all along.
    let noisy = other.connect_own().await.unwrap();
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
    let ratio = m.device_vs_postgres.unwrap();
    if m.device_source
        .as_deref()
        .is_some_and(|s| s.contains("loop"))
    {
        // On the cluster's own device, what PostgreSQL wrote (dirty pages
        // and WAL) is what reached the device: within a few percent (the
        // OS merges a page written twice before writeback; ext4's journal
        // adds a little). A cgroup v1 block-I/O cgroup saw ~0.6 of it.
        assert!(
            (0.9..1.25).contains(&ratio),
            "device {dev} vs PostgreSQL's {own}: {ratio}: {m:?}"
        );
    } else {
        // A cgroup v1 block-I/O cgroup does not see buffered writeback:
        // short, and said so.
        assert!(
            (0.3..1.5).contains(&ratio),
            "device {dev} vs PostgreSQL's {own}: {ratio}: {m:?}"
        );
    }
    // Write amplification (device bytes per byte of the table the UPDATE
    // rewrote) is at least 2: each table page is written twice — as a
    // full-page image in the WAL (its first change after the CHECKPOINT
    // before the UPDATE) and by the timed CHECKPOINT — and the new row
    // versions fill new pages besides.
    let waf = m.write_amplification.unwrap();
    assert!(
        waf >= 2.0 && m.wal_bytes.unwrap() >= m.table_bytes,
        "WAF {waf}: {m:?}"
    );
    assert!(m.dirty_page_bytes.unwrap() >= m.table_bytes / 2, "{m:?}");
    assert!(m.device_write_bytes_checkpoint.unwrap() > 0, "{m:?}");
    assert!(m.update_seconds.unwrap() > 0.0 && m.checkpoint_seconds.unwrap() > 0.0);
    let volume = cl.storage_dir().to_path_buf();
    other.teardown().await.unwrap();
    cl.teardown().await.unwrap();
    // Its own volume is unmounted and its loop device detached.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(volume.to_str().unwrap()),
        "{} still mounted",
        volume.display()
    );
    let loops = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    assert!(!loops.contains(root.to_str().unwrap()), "{loops}");
    std::fs::remove_dir_all(&root).unwrap();
}
