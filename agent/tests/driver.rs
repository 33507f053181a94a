//! Real PostgreSQL: the pgbench loader and the pgbench-compatible driver.

mod common;

use std::path::{Path, PathBuf};

use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::cluster::throttle::{self, Caps};
use pgfleet_agent::workload::{self, CellContext, Output};
use serde_json::{Value as Json, json};
use tokio_util::sync::CancellationToken;

async fn cluster(name: &str) -> (Cluster, PathBuf) {
    capped_cluster(name, Caps::default()).await
}

async fn capped_cluster(name: &str, caps: Caps) -> (Cluster, PathBuf) {
    let root = common::scratch(name);
    let spec = common::spec(&root, "c", "64MB", caps);
    (Cluster::provision(&spec).await.unwrap(), root)
}

async fn run(cluster: &Cluster, kind: &str, params: Json) -> pgfleet_agent::Result<Output> {
    run_params(cluster, entry(kind, params)).await
}

/// Runs a kind's parameters as given (the agent's own checks, without the
/// scenario's).
async fn run_params(
    cluster: &Cluster,
    params: pgfleet_proto::workload::Params,
) -> pgfleet_agent::Result<Output> {
    common::run(cluster, &params).await
}

/// A kind's parameters as a scenario entry would give them (same checks
/// and defaults), loading by copy unless a test says otherwise: these
/// tests are the driver's and the copy loader's, and hold sessions across
/// loads, which a direct load (a restart of the server) would close; the
/// direct load is proven in `direct.rs`.
fn entry(kind: &str, mut keys: Json) -> pgfleet_proto::workload::Params {
    keys["kind"] = json!(kind);
    if ["pgbench-init", "pgbench", "vacuum-bloat", "logical-drain"].contains(&kind)
        && keys.get("load_method").is_none()
    {
        keys["load_method"] = json!("copy");
    }
    let mut units = pgfleet_proto::workload::plan_entry(&keys.to_string()).unwrap();
    units.remove(0).1
}

async fn one(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loader_matches_pgbench_row_counts_and_key_ranges() {
    let (cl, root) = cluster("init").await;
    let out = run(
        &cl,
        "pgbench-init",
        json!({"scale": 3, "load_connections": 2}),
    )
    .await
    .unwrap();
    let m = &out.points[0].metrics();
    assert_eq!(m["rows_loaded"], 300_033);
    assert!(m["rows_per_second"].as_f64().unwrap() > 0.0);
    let c = cl.connect().await.unwrap();
    assert_eq!(
        one(&c, "SELECT count(*) FROM public.pgbench_branches").await,
        3
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM public.pgbench_tellers").await,
        30
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM public.pgbench_accounts").await,
        300_000
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM public.pgbench_history").await,
        0
    );
    assert_eq!(
        one(&c, "SELECT min(aid)::int8 FROM public.pgbench_accounts").await,
        1
    );
    assert_eq!(
        one(&c, "SELECT max(aid)::int8 FROM public.pgbench_accounts").await,
        300_000
    );
    assert_eq!(
        one(
            &c,
            "SELECT count(DISTINCT aid) FROM public.pgbench_accounts"
        )
        .await,
        300_000
    );
    // bid = (aid - 1) / 100000 + 1; tellers: bid = (tid - 1) / 10 + 1; all balances 0.
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM public.pgbench_accounts WHERE bid <> (aid - 1) / 100000 + 1"
        )
        .await,
        0
    );
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM public.pgbench_tellers WHERE bid <> (tid - 1) / 10 + 1"
        )
        .await,
        0
    );
    assert_eq!(one(&c, "SELECT sum(abalance) + (SELECT sum(bbalance) FROM public.pgbench_branches) FROM public.pgbench_accounts").await, 0);
    assert_eq!(
        one(&c, "SELECT count(*) FROM pg_constraint WHERE contype = 'p' AND conrelid::regclass::text LIKE 'public.pgbench_%'").await,
        3
    );
    assert_eq!(one(&c, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.pgbench_accounts'::regclass AND attname = 'aid' AND atttypid = 'int4'::regtype").await, 1);
    // pgbench's filler: empty, blank-padded to 84 characters.
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM public.pgbench_accounts WHERE octet_length(filler) <> 84 OR filler <> ''"
        )
        .await,
        0
    );
    // One connection: COPY FREEZE, rows written frozen (no xmin to wait on).
    run(
        &cl,
        "pgbench-init",
        json!({"scale": 1, "load_connections": 1}),
    )
    .await
    .unwrap();
    assert_eq!(
        one(&c, "SELECT count(*) FROM public.pgbench_accounts").await,
        100_000
    );
    assert_eq!(
        one(
            &c,
            "SELECT (relallvisible = relpages)::int::int8 FROM pg_class WHERE relname = 'pgbench_accounts'"
        )
        .await,
        1
    );
    // Partitioned, as pgbench --partitions: each partition loaded and keyed
    // on its own, the parent's key adopting the partitions' indexes.
    run(&cl, "pgbench-init", json!({"scale": 1, "partitions": 3}))
        .await
        .unwrap();
    assert_eq!(
        one(&c, "SELECT count(*) FROM pg_constraint WHERE contype = 'p' AND conrelid::regclass::text LIKE 'public.pgbench_accounts%'").await,
        4
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'public.pgbench_accounts_pkey'::regclass AND c.relkind = 'i'").await,
        3
    );
    assert_eq!(
        one(
            &c,
            "SELECT count(DISTINCT aid) FROM public.pgbench_accounts WHERE bid = 1"
        )
        .await,
        100_000
    );
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.pgbench_accounts'::regclass"
        )
        .await,
        3
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM public.pgbench_accounts").await,
        100_000
    );
    drop(c);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_update_commits_exactly_what_it_counts() {
    let (cl, root) = cluster("driver").await;
    let out = run(
        &cl,
        "pgbench",
        // Four seconds: the sampler looks once a second, and a 2-s window
        // on a busy host once caught no backend waiting (CI of 3249aac).
        json!({"scale": 1, "script": "random-update", "clients": 4, "threads": 2, "duration_s": 4.0}),
    )
    .await
    .unwrap();
    let m = &out.points[0].metrics();
    let n = m["transactions"].as_i64().unwrap();
    assert!(n > 100, "{m}");
    assert_eq!(m["failures"], 0);
    let c = cl.connect().await.unwrap();
    assert_eq!(
        one(
            &c,
            "SELECT sum(abalance)::int8 FROM public.pgbench_accounts"
        )
        .await,
        n
    );
    for k in [
        "tps",
        "latency_ms_p50",
        "latency_ms_p90",
        "latency_ms_p99",
        "latency_ms_max",
    ] {
        assert!(m[k].as_f64().unwrap() > 0.0, "{k}: {m}");
    }
    assert!(m["wal_sync_ms_avg"].is_number(), "{m}");
    // Sampled internals: checkpoints counted, wait events of active backends.
    assert!(m["checkpoints"].is_number(), "{m}");
    let waits = m["top_wait_events"].as_array().unwrap();
    assert!(!waits.is_empty(), "{m}");
    assert!(
        waits
            .iter()
            .all(|w| w["event"].as_str().unwrap().contains(':')
                && w["share"].as_f64().unwrap() > 0.0)
    );

    // Open loop: a Poisson schedule at 200 tps for 2 s lands near 400 transactions.
    let out = run(
        &cl,
        "pgbench",
        json!({"scale": 1, "script": "select-only", "clients": 2, "duration_s": 2.0, "rate": 200.0, "latency_limit_ms": 1000.0}),
    )
    .await
    .unwrap();
    let m = &out.points[0].metrics();
    let tps = m["tps"].as_f64().unwrap();
    assert!((140.0..260.0).contains(&tps), "rate 200 gave {tps} tps");
    assert_eq!(m["skipped"], 0);
    assert_eq!(m["late"], 0);

    // Transaction-count mode, tpcb-like: every transaction writes one history row.
    let out = run(
        &cl,
        "pgbench",
        json!({"scale": 1, "script": "tpcb-like", "clients": 3, "threads": 1, "transactions": 40, "seed": 7}),
    )
    .await
    .unwrap();
    assert_eq!(out.points[0].metrics()["transactions"], 120);
    assert_eq!(
        one(&c, "SELECT count(*) FROM public.pgbench_history").await,
        120
    );
    assert_eq!(
        one(&c, "SELECT (SELECT sum(abalance) FROM public.pgbench_accounts) - (SELECT sum(delta) FROM public.pgbench_history)").await,
        0
    );
    drop(c);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_errors_name_the_line() {
    let (cl, root) = cluster("badscript").await;
    let bad = |text: &str| json!({"scale": 1, "script_text": text, "transactions": 1});
    // Scenario validation refuses this script; the agent checks again.
    let mut p = entry("pgbench", bad("SELECT 1;"));
    if let pgfleet_proto::workload::Params::Pgbench(p) = &mut p {
        p.drive.script_text = Some("\\set aid rnd(1, 10)\nSELECT :aid;".into());
    }
    let e = run_params(&cl, p).await.unwrap_err().to_string();
    assert!(
        e.contains("script:1: unexpected function name (rnd) in command \"set\""),
        "{e}"
    );
    let e = run(
        &cl,
        "pgbench",
        bad("\\set aid random(1, 10)\nSELECT * FROM no_such_table WHERE x = :aid;"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("script:2") && e.contains("no_such_table"), "{e}");
    let e = run(&cl, "pgbench", bad("\\set x 1 / 0\nSELECT :x;"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("script:1: division by zero"), "{e}");
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialization_failures_are_retried_or_counted_as_pgbench_does() {
    let (cl, root) = cluster("retry").await;
    // Four clients updating one row under REPEATABLE READ: concurrent
    // updates fail with 40001, which pgbench retries (same random values).
    let script = "BEGIN ISOLATION LEVEL REPEATABLE READ;\n\
                  UPDATE public.pgbench_branches SET bbalance = bbalance + 1 WHERE bid = 1;\n\
                  END;\n";
    let c = cl.connect().await.unwrap();
    // The same with the real pgbench binary (`driver: pgbench`), whose log
    // carries the retries.
    for (max_tries, retried, driver) in [
        (1000, true, "pgfleet"),
        (1, false, "pgfleet"),
        (1000, true, "pgbench"),
    ] {
        let out = run(
            &cl,
            "pgbench",
            json!({"scale": 1, "script_text": script, "clients": 4, "threads": 2,
                   "duration_s": 2.0, "max_tries": max_tries, "driver": driver}),
        )
        .await
        .unwrap();
        let m = &out.points[0].metrics();
        let n = m["transactions"].as_i64().unwrap();
        assert!(n > 50, "{m}");
        // Only committed transactions are counted, and each added one.
        assert_eq!(
            one(
                &c,
                "SELECT bbalance::int8 FROM public.pgbench_branches WHERE bid = 1"
            )
            .await,
            n,
            "{m}"
        );
        if retried {
            assert!(m["retries"].as_u64().unwrap() > 0, "{m}");
            assert_eq!(m["failures"], 0, "{m}");
        } else {
            assert_eq!(m["retries"], 0, "{m}");
            assert!(
                m["failures_by_class"]["serialization"].as_u64().unwrap() > 0,
                "{m}"
            );
        }
    }
    drop(c);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// Run with `PGFLEET_PG_BIN` set to another version's bin dir to check the
/// version-specific queries (pg_stat_checkpointer from 17, WAL counters in
/// pg_stat_io from 18, pg_stat_io from 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internals_have_the_same_names_on_every_version() {
    use pgfleet_proto::v1::agent_message::Msg;
    let (cl, root) = cluster("internals").await;
    let major = cl.pg.major;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<pgfleet_proto::v1::AgentMessage>(4096);
    let samples = tokio::spawn(async move {
        let mut v = Vec::new();
        while let Some(m) = rx.recv().await {
            if let Some(Msg::Sample(s)) = m.msg
                && s.kind == "pg_stat"
            {
                v.push(serde_json::from_str::<Json>(&s.data_json).unwrap());
            }
        }
        v
    });
    let mut ctx = CellContext::new("c", &cl, tx, CancellationToken::new());
    let params = json!({"scale": 1, "script": "tpcb-like", "clients": 2, "duration_s": 2.5});
    let params = entry("pgbench", params);
    let out = workload::run(&mut ctx, &params).await.unwrap();
    drop(ctx);
    let samples = samples.await.unwrap();
    assert!(samples.len() >= 2, "{samples:?}");
    let m = &out.points[0].metrics();
    assert!(m["wal_syncs"].as_f64().unwrap() > 0.0, "PG {major}: {m}");
    assert!(
        m["wal_sync_ms_avg"].as_f64().unwrap() > 0.0,
        "PG {major}: {m}"
    );
    assert!(m["checkpoints"].is_number(), "{m}");
    let mut expect = vec![
        (
            "database",
            vec!["xact_commit", "blks_read", "blk_read_time_ms"],
        ),
        (
            "bgwriter",
            vec!["checkpoints_timed", "checkpoints_req", "buffers_checkpoint"],
        ),
        ("wal", vec!["wal_bytes", "wal_sync", "wal_sync_time_ms"]),
    ];
    expect.push(if major >= 16 {
        (
            "io",
            vec!["reads", "read_time_ms", "writes", "extends", "hits"],
        )
    } else {
        ("io", vec!["writes"])
    });
    // What a cell reports per transaction: the same on every version.
    for k in ["commits", "page_writes", "wal_writes"] {
        assert!(m[k].is_u64(), "PG {major}: no {k} in {m}");
    }
    assert!(m["commits"].as_u64().unwrap() > 0, "PG {major}: {m}");
    for s in &samples {
        for (group, cols) in &expect {
            for c in cols {
                assert!(s[group][c].is_number(), "PG {major}: {group}.{c} in {s}");
            }
        }
    }
    let commits: f64 = samples
        .iter()
        .map(|s| s["database"]["xact_commit"].as_f64().unwrap())
        .sum();
    assert!(commits > 0.0, "{samples:?}");
    if major >= 16 {
        let hits: f64 = samples
            .iter()
            .map(|s| s["io"]["hits"].as_f64().unwrap())
            .sum();
        assert!(hits > 0.0, "PG {major}: {samples:?}");
    }
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// The sampler's totals cover the measured window, not the warm-up: its
/// commits (less its own statements) are the driver's measured
/// transactions, within what PostgreSQL's statistics lag (a backend
/// flushes its counts at most once a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampled_window_is_the_measured_one() {
    let (cl, root) = cluster("window").await;
    let params = json!({"scale": 1, "script": "random-update", "clients": 2, "threads": 1,
        "warmup_s": 3.0, "duration_s": 4.0});
    let out = run(&cl, "pgbench", params).await.unwrap();
    let m = out.points[0].metrics();
    let (n, commits) = (
        m["transactions"].as_f64().unwrap(),
        m["commits"].as_f64().unwrap(),
    );
    // With the warm-up counted it would be ~1.75; each end may be off by
    // up to a second of commits (of 4).
    assert!(
        (0.7..1.4).contains(&(commits / n)),
        "{commits} commits sampled for {n} measured transactions: {m}"
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// `duration_s: auto`: a select-only run on a cluster that holds its data
/// in memory is steady from its start, so its window ends soon after the
/// shortest one judged (20 s), well before its longest (120 s), and says
/// so; the statistics sampled are the window's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_window_ends_once_steady() {
    let (cl, root) = cluster("auto").await;
    let params = json!({"scale": 1, "script": "select-only", "clients": 2, "threads": 1,
        "warmup_s": 2.0, "duration_s": "auto", "max_duration_s": 120});
    let started = std::time::Instant::now();
    let out = run(&cl, "pgbench", params).await.unwrap();
    let m = out.points[0].metrics();
    let window = m["window_s"].as_f64().unwrap();
    assert!((20.0..40.0).contains(&window), "{m}");
    assert_eq!(m["steady"], json!(true), "{m}");
    assert!(started.elapsed().as_secs() < 100, "it stopped early");
    assert_eq!(out.points[0].params()["until_steady"], json!(true));
    let tps = m["tps"].as_f64().unwrap();
    let n = m["transactions"].as_f64().unwrap();
    assert!(
        (tps * window - n).abs() <= 1.0 + n * 1e-9,
        "TPS over the window it ran: {m}"
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn bigint_aid_from_scale_20000_as_pgbench() {
    use pgfleet_agent::workload::pgbench_init::{InitParams, ddl};
    let p = |scale| InitParams {
        scale,
        fillfactor: 90,
        partitions: 0,
        load_connections: 1,
        load_method: Default::default(),
    };
    assert!(
        ddl(&p(19_999))
            .iter()
            .any(|s| s.contains("aid int NOT NULL"))
    );
    assert!(
        ddl(&p(20_000))
            .iter()
            .any(|s| s.contains("aid bigint NOT NULL"))
    );
    assert!(
        ddl(&p(33_000))
            .iter()
            .any(|s| s.contains("pgbench_history") && s.contains("aid bigint"))
    );
    assert!(ddl(&p(1)).iter().any(|s| s.contains("fillfactor = 90")));
    let _ = Path::new("");
}

/// Storage emulation: the same random-update workload with a 300 IOPS cap
/// (each commit's WAL flush is a write) runs clearly slower than uncapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_iops_cap_clearly_lowers_tps() {
    let params = json!({"scale": 1, "script": "random-update", "clients": 2, "threads": 1, "duration_s": 3.0});
    let tps = |o: &Output| o.points[0].metrics()["tps"].as_f64().unwrap();

    let (free, root1) = cluster("uncapped").await;
    let uncapped = run(&free, "pgbench", params.clone()).await.unwrap();
    free.teardown().await.unwrap();

    let caps = Caps {
        read_iops: 300,
        write_iops: 300,
        read_mbps: 0,
        write_mbps: 0,
        combined: false,
        latency: Default::default(),
    };
    let (capped, root2) = capped_cluster("capped", caps).await;
    let rules = "/sys/fs/cgroup/blkio/blkio.throttle.write_iops_device";
    let limited = match capped.capped_device().map(str::to_string) {
        // cgroup v1 as root: the cap is on the cluster's own device, for
        // every writer, and goes with it.
        Some(dev) => {
            let rule = format!("{dev} 300");
            let has = || {
                std::fs::read_to_string(rules)
                    .unwrap()
                    .lines()
                    .any(|l| l == rule)
            };
            assert!(has(), "no `{rule}` in {rules}");
            let limited = run(&capped, "pgbench", params).await.unwrap();
            capped.teardown().await.unwrap();
            assert!(!has(), "`{rule}` left in {rules}");
            // The cluster's own device counts what it did per transaction.
            let m = limited.points[0].metrics();
            let f = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("no {k} in {m}"));
            let (n, commits) = (f("transactions"), f("commits"));
            // (A backend flushes its counts at most once a second: the
            // last second's may come after the final snapshot.)
            assert!(
                (0.5 * n..=1.3 * n).contains(&commits),
                "{commits} commits for the driver's {n} transactions: {m}"
            );
            // Every WAL sync waits for at least one write of its own.
            assert!(f("device_writes") >= 0.9 * f("wal_syncs"), "{m}");
            let per_txn = (f("device_reads") + f("device_writes")) / commits;
            assert!(
                (f("device_ios_per_txn") - per_txn).abs() < 1e-9 && per_txn > 0.5,
                "{m}"
            );
            limited
        }
        None => {
            let cg = capped
                .cgroups()
                .first()
                .expect("a throttling cgroup")
                .to_path_buf();
            // Every server process is in it, from the postmaster down.
            let procs = throttle::pids(&cg);
            assert!(procs.contains(&capped.pid().unwrap()), "{procs:?}");
            assert!(procs.len() >= 4, "postmaster and its children: {procs:?}");
            let limited = run(&capped, "pgbench", params).await.unwrap();
            capped.teardown().await.unwrap();
            assert!(!cg.exists(), "cgroup {} left behind", cg.display());
            limited
        }
    };

    // No device of its own (uncapped, not accounting): no device figures,
    // rather than a host-wide count.
    let m = uncapped.points[0].metrics();
    assert!(
        m.get("device_ios_per_txn").is_none() && m.get("device_reads").is_none(),
        "{m}"
    );
    let (a, b) = (tps(&uncapped), tps(&limited));
    eprintln!("uncapped {a:.0} tps, capped at 300 IOPS {b:.0} tps");
    assert!(b < 400.0, "capped at 300 write IOPS yet {b:.0} tps");
    assert!(
        b < a * 0.6,
        "capped {b:.0} tps is not clearly below uncapped {a:.0} tps"
    );
    std::fs::remove_dir_all(&root1).unwrap();
    std::fs::remove_dir_all(&root2).unwrap();
}

/// `driver: pgbench` runs the real binary on the same script; its log
/// becomes the same result schema, and the database agrees with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pgbench_binary_driver_reports_what_it_committed() {
    let (cl, root) = cluster("pgbench-bin").await;
    let out = run(
        &cl,
        "pgbench",
        json!({"scale": 1, "script": "random-update", "clients": 2, "threads": 2, "duration_s": 2.0, "driver": "pgbench"}),
    )
    .await
    .unwrap();
    let m = &out.points[0].metrics();
    let n = m["transactions"].as_i64().unwrap();
    assert!(n > 100, "{m}");
    assert_eq!(out.points[0].params()["driver"], "pgbench");
    let c = cl.connect().await.unwrap();
    assert_eq!(
        one(
            &c,
            "SELECT sum(abalance)::int8 FROM public.pgbench_accounts"
        )
        .await,
        n
    );
    assert!(m["latency_ms_p99"].as_f64().unwrap() > 0.0);
    drop(c);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
