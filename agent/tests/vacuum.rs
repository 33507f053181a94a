//! Real PostgreSQL: `vacuum-bloat` leaves the bloat it was asked for and
//! VACUUM removes it.

mod common;

use pgfleet_agent::cluster::Cluster;
use pgfleet_proto::workload::vacuum_bloat;

use common::{params, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_removes_the_bloat_it_was_given() {
    let root = common::scratch("vacuum");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", Default::default()))
        .await
        .unwrap();
    let target: u64 = 24 << 20;
    let p = params(&format!(
        "{{kind: vacuum-bloat, scale: 4, bloat_bytes: {target}, index_cleanup: \"on\", verbose: true}}"
    ));
    let out = run(&cl, &p).await.unwrap();
    let m: vacuum_bloat::Metrics = serde_json::from_str(&out.points[0].metrics_json).unwrap();
    assert_eq!(m.bloat_method, "pgstattuple_approx");
    let off = (m.bloat_bytes as f64 - target as f64).abs() / target as f64;
    assert!(
        off < 0.10,
        "bloat {} vs target {target}: {:.1} % off",
        m.bloat_bytes,
        off * 100.0
    );
    // Each updated row left one dead version, and VACUUM removed them all.
    assert!(m.dead_tuples_before >= m.rows_updated * 95 / 100, "{m:?}");
    assert_eq!(m.dead_tuples_after, 0, "{m:?}");
    assert_eq!(m.dead_tuples_removed, m.dead_tuples_before);
    assert!(m.vacuum_seconds > 0.0 && m.heap_mb_per_s > 0.0, "{m:?}");
    assert!(m.heap_blks_total * 8192 >= m.table_bytes * 9 / 10, "{m:?}");
    assert!(m.index_vacuum_count >= 1, "INDEX_CLEANUP on: {m:?}");
    assert_eq!(m.load.rows_loaded, 400_000 + 40 + 4);
    // PostgreSQL's own view agrees: no dead tuples left in the table.
    let c = cl.connect().await.unwrap();
    let dead: i64 = c
        .query_one(
            "SELECT dead_tuple_count FROM pgfleet_agent.pgstattuple('public.pgbench_accounts')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead, 0);
    let vacuums: i64 = c
        .query_one(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'pgbench_accounts'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(vacuums >= 1);
    // The statement the report shows is the one that ran.
    assert!(
        out.points[0]
            .params_json
            .contains("VACUUM (INDEX_CLEANUP ON, VERBOSE) pgbench_accounts")
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// `cache: cold` rests on this: after a CHECKPOINT, evicting a table drops
/// its heap and index pages from the OS page cache (fincore counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_a_table_empties_its_page_cache() {
    let root = common::scratch("evict");
    let cl = Cluster::provision(&common::spec(&root, "c", "16MB", Default::default()))
        .await
        .unwrap();
    let c = cl.connect_own().await.unwrap();
    c.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, pad text); \
         INSERT INTO t SELECT i, repeat('x', 200) FROM generate_series(1, 100000) i; CHECKPOINT",
    )
    .await
    .unwrap();
    let file: String = c
        .query_one(
            "SELECT current_setting('data_directory') || '/' || pg_relation_filepath('t')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let resident = || {
        let out = std::process::Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES", &file])
            .output()
            .expect("fincore (util-linux)");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    std::fs::read(&file).unwrap();
    assert!(resident() > 20 << 20, "the heap is cached after a read");
    let bytes = cl.evict_from_page_cache(&c, "t").await.unwrap();
    assert!(bytes > 20 << 20, "{bytes}");
    assert_eq!(resident(), 0);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
