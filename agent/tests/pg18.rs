//! PostgreSQL 18.6 as Debian builds it (lz4, zstd, liburing), installed by
//! `deploy/postgres/install.sh 18` (which `.ci/run` runs; or
//! `PGFLEET_PG18_BIN`) and run on this host from its own root's libraries:
//! the read tests per io_method (io_uring included), and toast-probe's
//! TOAST pointers read through `pg_column_toast_chunk_id()` (17+) instead
//! of pageinspect, with lz4 beside pglz.

mod common;

use std::path::PathBuf;

use pgfleet_agent::cluster::Cluster;
use pgfleet_proto::workload::read_write;
use pgfleet_proto::workload::toast_probe;

use common::{params, run};

fn pg18() -> PathBuf {
    let dir = std::env::var_os("PGFLEET_PG18_BIN")
        .map(PathBuf::from)
        .or_else(|| pgfleet_proto::installs::find(18))
        .unwrap_or_else(|| panic!("{}", pgfleet_proto::installs::missing(18)));
    assert!(
        dir.join("postgres").exists(),
        "PostgreSQL 18 missing at {}: {}",
        dir.display(),
        pgfleet_proto::installs::missing(18)
    );
    dir
}

fn spec(root: &std::path::Path) -> pgfleet_agent::cluster::ClusterSpec {
    let mut s = common::spec(root, "c18", "32MB", Default::default());
    s.pg = pgfleet_agent::pgbin::PgBin::find(Some(&pg18())).unwrap();
    s.account_io = true;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_run_per_io_method_on_postgres_18() {
    let root = common::scratch("pg18-io");
    let cl = Cluster::provision(&spec(&root)).await.unwrap();
    let out = run(
        &cl,
        &params("{kind: read-write, rows: 40000, tests: [seq-cold, seq-os-cache], repeats: 1, io_methods: [sync, worker, io_uring]}"),
    )
    .await
    .unwrap();
    let pts: Vec<(read_write::PointParams, read_write::Metrics)> = out
        .points
        .iter()
        .map(|p| {
            (
                serde_json::from_str(&p.params_json).unwrap(),
                serde_json::from_str(&p.metrics_json).unwrap(),
            )
        })
        .collect();
    for method in ["sync", "worker"] {
        let cold = &pts
            .iter()
            .find(|(p, _)| p.io_method == method && p.test == "seq-cold")
            .unwrap_or_else(|| panic!("no cold scan with io_method {method}: {pts:?}"))
            .1;
        let warm = &pts
            .iter()
            .find(|(p, _)| p.io_method == method && p.test == "seq-os-cache")
            .unwrap()
            .1;
        let table = cold.table_bytes as f64;
        // With worker, the I/O workers read: the cgroup counts them too.
        assert!(
            cold.device_read_bytes.unwrap() as f64 >= table * 0.8,
            "{method}: {cold:?}"
        );
        assert!(
            (warm.device_read_bytes.unwrap() as f64) < table * 0.1,
            "{method}: {warm:?}"
        );
        assert!(cold.execution_ms.unwrap() > 0.0);
    }
    // Debian's build has liburing: io_uring runs here (its device bytes
    // are the ring's to account, not asserted).
    let ring = &pts
        .iter()
        .find(|(p, _)| p.io_method == "io_uring" && p.test == "seq-cold")
        .unwrap_or_else(|| panic!("no io_uring cold scan: {pts:?}"))
        .1;
    assert!(ring.execution_ms.unwrap() > 0.0, "{ring:?}");
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toast_pointers_come_from_pg_column_toast_chunk_id_on_18() {
    let root = common::scratch("pg18-toast");
    let cl = Cluster::provision(&spec(&root)).await.unwrap();
    let out = run(
        &cl,
        &params("{kind: toast-probe, probes: [placement], storage_modes: [external, pglz, lz4]}"),
    )
    .await
    .unwrap();
    let get = |mode: &str, case: &str| -> toast_probe::Metrics {
        out.points
            .iter()
            .find(|p| {
                let k: serde_json::Value = serde_json::from_str(&p.params_json).unwrap();
                k["storage_mode"] == mode && k["case"] == case
            })
            .map(|p| serde_json::from_str(&p.metrics_json).unwrap())
            .unwrap()
    };
    let r = get("pglz", "random-200KB");
    assert_eq!(
        (r.placement.as_deref(), r.toast_chunks, r.toast_bytes),
        (Some("external"), Some(101), Some(200_000))
    );
    let e = get("external", "repetitive-1.1MB");
    assert_eq!(e.placement.as_deref(), Some("external"));
    assert_eq!(e.toast_chunks, Some(1_125_000_u64.div_ceil(1996) as i64));
    let c = get("pglz", "repetitive-1.1MB");
    assert_eq!(c.placement.as_deref(), Some("compressed external"), "{c:?}");
    assert_eq!(c.toast_bytes, c.stored_bytes, "{c:?}");
    // This build has lz4: incompressible text goes out of line as is.
    let l = get("lz4", "random-200KB");
    assert_eq!(l.placement.as_deref(), Some("external"), "{l:?}");
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
