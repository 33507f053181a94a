//! Proof that a direct load's files are right (issue 46), on real clusters:
//! PostgreSQL 15 (initdb's default: no data checksums) and 18 (checksums
//! on), fillfactor 100 and 90, flat and partitioned. Against a copy load of
//! the same keys in the same cluster: the same rows (content hashes), the
//! same relation sizes, page fill, key height and leaf density, the same
//! answers to a run of random UPDATEs; amcheck finds nothing, every page is
//! all-visible and all-frozen and VACUUM has nothing to do; pg_checksums
//! passes; a crash and recovery, a base backup and a logical subscription
//! without an initial copy all work on a directly loaded cluster. The
//! self-check refuses a reference whose layout was corrupted, and a build it
//! refused loads by copy, saying why.

mod common;

use std::path::{Path, PathBuf};

use pgfleet_agent::cluster::{Cluster, ClusterSpec};
use pgfleet_agent::direct::check;

use common::{params, run};

/// Version `major`'s bin directory (`deploy/postgres/install.sh N` or
/// the host's packages; `.ci/run` installs 18, Debian 12 has 15).
fn pg(major: u32) -> PathBuf {
    pgfleet_proto::installs::find(major)
        .unwrap_or_else(|| panic!("{}", pgfleet_proto::installs::missing(major)))
}

fn spec(root: &Path, name: &str, major: u32) -> ClusterSpec {
    let mut s = common::spec(root, name, "32MB", Default::default());
    s.pg = pgfleet_agent::pgbin::PgBin::find(Some(&pg(major))).unwrap();
    s.settings.insert("wal_level".into(), "logical".into());
    s
}

/// Loads pgbench's tables by `method` with the loader's keys `keys`;
/// returns the load's metrics.
async fn load(cl: &Cluster, method: &str, keys: &str) -> serde_json::Value {
    let out = run(
        cl,
        &params(&format!(
            "{{kind: pgbench-init, scale: 3, load_method: {method}, {keys}}}"
        )),
    )
    .await
    .unwrap_or_else(|e| panic!("{method} load of {keys}: {e}"));
    out.points[0].metrics()
}

fn accounts_tables(partitions: u32) -> Vec<String> {
    if partitions == 0 {
        vec!["public.pgbench_accounts".into()]
    } else {
        (1..=partitions)
            .map(|i| format!("public.pgbench_accounts_{i}"))
            .collect()
    }
}

/// What the experiment sees of a load: every table's content hash, and
/// per accounts table its sizes (heap, map, free space map, key), tuples
/// and free space, the key's height, pages and leaf density.
async fn figures(c: &tokio_postgres::Client, partitions: u32) -> Vec<String> {
    c.batch_execute("CREATE EXTENSION IF NOT EXISTS pgstattuple WITH SCHEMA pgfleet_agent")
        .await
        .unwrap();
    let mut out = Vec::new();
    for (table, cols, key) in [
        ("pgbench_accounts", "aid, bid, abalance, filler", "aid"),
        ("pgbench_branches", "bid, bbalance, filler", "bid"),
        ("pgbench_tellers", "tid, bid, tbalance, filler", "tid"),
        (
            "pgbench_history",
            "tid, bid, aid, delta, mtime, filler",
            "mtime",
        ),
    ] {
        let row = c
            .query_one(
                &format!(
                    "SELECT count(*), md5(coalesce(string_agg(concat_ws('|', {cols}), ',' ORDER BY {key}), '')) \
                     FROM public.{table}"
                ),
                &[],
            )
            .await
            .unwrap();
        out.push(format!(
            "{table}: {} rows, {}",
            row.get::<_, i64>(0),
            row.get::<_, String>(1)
        ));
    }
    for t in accounts_tables(partitions) {
        let row = c
            .query_one(
                "SELECT pg_relation_size($1::text::regclass), \
                        pg_relation_size($1::text::regclass, 'vm'), \
                        pg_relation_size($1::text::regclass, 'fsm'), \
                        s.tuple_count, s.free_space, s.dead_tuple_count, \
                        pg_relation_size(i.indexrelid), \
                        ix.tree_level::int, ix.internal_pages, ix.leaf_pages, ix.avg_leaf_density \
                 FROM pgfleet_agent.pgstattuple($1::text::regclass) s, \
                      pg_index i, \
                      LATERAL pgfleet_agent.pgstatindex(i.indexrelid::regclass) ix \
                 WHERE i.indrelid = $1::text::regclass AND i.indisprimary",
                &[&t],
            )
            .await
            .unwrap();
        out.push(format!(
            "{t}: heap {} B, vm {} B, fsm {} B, {} tuples, {} B free, {} dead; key {} B, level {}, {} internal, {} leaf pages, density {}",
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2),
            row.get::<_, i64>(3),
            row.get::<_, i64>(4),
            row.get::<_, i64>(5),
            row.get::<_, i64>(6),
            row.get::<_, i32>(7),
            row.get::<_, i64>(8),
            row.get::<_, i64>(9),
            row.get::<_, f64>(10),
        ));
    }
    out
}

/// A run of random UPDATEs (fixed: the same on both loads) and what each
/// returns, then the totals.
async fn updates(c: &tokio_postgres::Client) -> Vec<i64> {
    let mut out = Vec::new();
    for i in 0..1500u64 {
        let aid = ((i * 7919) % 300_000 + 1) as i32;
        let delta = (i % 97) as i32 - 48;
        let row = c
            .query_one(
                "UPDATE public.pgbench_accounts SET abalance = abalance + $2 WHERE aid = $1 RETURNING abalance",
                &[&aid, &delta],
            )
            .await
            .unwrap();
        out.push(i64::from(row.get::<_, i32>(0)));
    }
    let row = c
        .query_one(
            "SELECT sum(abalance)::bigint, count(*) FROM public.pgbench_accounts WHERE abalance <> 0",
            &[],
        )
        .await
        .unwrap();
    out.push(row.get(0));
    out.push(row.get(1));
    out
}

/// amcheck on every accounts table and its key; on a table as loaded
/// (`pristine`), also the visibility map and VACUUM.
async fn verify(cl: &Cluster, partitions: u32, pristine: bool) {
    let c = common::sql(cl).await;
    c.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS amcheck WITH SCHEMA pgfleet_agent; \
         CREATE EXTENSION IF NOT EXISTS pg_visibility WITH SCHEMA pgfleet_agent",
    )
    .await
    .unwrap();
    for t in accounts_tables(partitions) {
        let bad: i64 = c
            .query_one(
                "SELECT count(*) FROM pgfleet_agent.verify_heapam($1::text::regclass, check_toast => true)",
                &[&t],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(bad, 0, "verify_heapam found corruption in {t}");
        c.execute(
            "SELECT pgfleet_agent.bt_index_parent_check(i.indexrelid::regclass, true, true) \
             FROM pg_index i WHERE i.indrelid = $1::text::regclass AND i.indisprimary",
            &[&t],
        )
        .await
        .unwrap_or_else(|e| panic!("bt_index_parent_check on {t}'s key: {e}"));
        if !pristine {
            continue;
        }
        let row = c
            .query_one(
                "SELECT v.all_visible, v.all_frozen, pg_relation_size($1::text::regclass) / 8192, \
                        (SELECT count(*) FROM pgfleet_agent.pg_check_frozen($1::text::regclass)), \
                        (SELECT count(*) FROM pgfleet_agent.pg_check_visible($1::text::regclass)) \
                 FROM pgfleet_agent.pg_visibility_map_summary($1::text::regclass) v",
                &[&t],
            )
            .await
            .unwrap();
        let (vis, frozen, pages): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(
            (vis, frozen),
            (pages, pages),
            "{t}: every page all-visible and all-frozen"
        );
        assert_eq!((row.get::<_, i64>(3), row.get::<_, i64>(4)), (0, 0), "{t}");
        // VACUUM finds nothing to remove or freeze.
        let (v, mut notices) = cl.connect_with_notices().await.unwrap();
        v.batch_execute(&format!("VACUUM (VERBOSE) {t}"))
            .await
            .unwrap();
        drop(v);
        let mut text = String::new();
        while let Some(n) = notices.recv().await {
            text += &n;
            text += "\n";
        }
        assert!(text.contains("tuples: 0 removed"), "{t}: {text}");
        if let Some(line) = text.lines().find(|l| l.trim_start().starts_with("frozen:")) {
            assert!(line.contains("had 0 tuples frozen"), "{t}: {line}");
        }
    }
}

/// The whole proof on one build: every configuration against copy, then
/// the cluster-level operations on the last direct load.
async fn prove(major: u32, name: &str) {
    let root = common::scratch(name);
    let cl = Cluster::provision(&spec(&root, "c", major)).await.unwrap();
    let checksums: bool = common::sql(&cl)
        .await
        .query_one("SELECT current_setting('data_checksums') = 'on'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        checksums,
        major >= 18,
        "PostgreSQL 18's initdb turns checksums on, 15's does not"
    );
    for keys in [
        "fillfactor: 100",
        "fillfactor: 90",
        "partitions: 3",
        "fillfactor: 90, partitions: 2",
    ] {
        let partitions = keys
            .split("partitions: ")
            .nth(1)
            .map_or(0, |n| n.parse().unwrap());
        load(&cl, "copy", keys).await;
        let c = common::sql(&cl).await;
        let by_copy = figures(&c, partitions).await;
        let copy_updates = updates(&c).await;
        drop(c);
        let m = load(&cl, "direct", keys).await;
        assert_eq!(m["load_method"], "direct", "{keys}: {m}");
        assert!(
            m["load_step_seconds"]["write"].as_f64().unwrap() > 0.0,
            "{m}"
        );
        assert_eq!(m["rows_loaded"], 300_033);
        let c = common::sql(&cl).await;
        let direct = figures(&c, partitions).await;
        assert_eq!(
            direct, by_copy,
            "{keys}: a direct load differs from a copy load"
        );
        verify(&cl, partitions, true).await;
        assert_eq!(
            updates(&c).await,
            copy_updates,
            "{keys}: the same UPDATEs answered differently"
        );
    }
    // The last load, partitioned: checksums, restart, crash, backup.
    if checksums {
        cl.pause().await.unwrap();
        let out = cl
            .contained(&cl.pg.tool("pg_checksums"), libc::SIGKILL)
            .unwrap()
            .arg("--check")
            .arg("-D")
            .arg(cl.data_dir())
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "pg_checksums --check: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cl.resume().await.unwrap();
    }
    cl.restart().await.unwrap();
    verify(&cl, 2, false).await;
    // A crash: SIGKILL of the postmaster after writes, then recovery.
    let c = common::sql(&cl).await;
    c.batch_execute(
        "UPDATE public.pgbench_accounts SET abalance = abalance + 1 WHERE aid % 1000 = 7",
    )
    .await
    .unwrap();
    drop(c);
    let pid = cl.pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    while cl.server_alive() {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Backends notice their postmaster's death and leave; then it starts.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    cl.resume().await.unwrap();
    let c = common::sql(&cl).await;
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM public.pgbench_accounts WHERE aid % 1000 = 7 AND abalance <> 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(n >= 290, "the committed UPDATEs survived the crash: {n}");
    verify(&cl, 2, false).await;
    // A base backup, verified against its manifest.
    let backup = root.join("backup");
    let owner = cl.run_as().cloned();
    std::fs::create_dir_all(&backup).unwrap();
    if let Some(u) = &owner {
        nix::unistd::chown(&backup, Some(u.uid.into()), Some(u.gid.into())).unwrap();
    }
    for (tool, args) in [
        (
            "pg_basebackup",
            vec![
                "-d".to_string(),
                cl.conninfo(),
                "-D".into(),
                backup.join("b").display().to_string(),
                "-X".into(),
                "stream".into(),
                "-c".into(),
                "fast".into(),
            ],
        ),
        (
            "pg_verifybackup",
            vec![backup.join("b").display().to_string()],
        ),
    ] {
        let out = cl
            .contained(&cl.pg.tool(tool), libc::SIGKILL)
            .unwrap()
            .args(&args)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{tool}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A subscriber loaded directly too follows without an initial copy.
    let sub = Cluster::provision(&spec(&root, "s", major)).await.unwrap();
    load(&sub, "direct", "fillfactor: 90, partitions: 2").await;
    let s = common::sql(&sub).await;
    let c = common::sql(&cl).await;
    // The publisher's table as the subscriber has it: the UPDATEs the
    // publisher took before the subscription applied there too.
    let changed = c
        .query(
            "SELECT aid, abalance FROM public.pgbench_accounts WHERE abalance <> 0",
            &[],
        )
        .await
        .unwrap();
    let aids: Vec<i32> = changed.iter().map(|r| r.get(0)).collect();
    let balances: Vec<i32> = changed.iter().map(|r| r.get(1)).collect();
    s.execute(
        "UPDATE public.pgbench_accounts a SET abalance = u.b FROM unnest($1::int[], $2::int[]) AS u(aid, b) WHERE a.aid = u.aid",
        &[&aids, &balances],
    )
    .await
    .unwrap();
    c.batch_execute("CREATE PUBLICATION direct FOR TABLE public.pgbench_accounts WITH (publish_via_partition_root = true)")
        .await
        .unwrap();
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION direct CONNECTION '{}' PUBLICATION direct WITH (copy_data = false)",
        common::conninfo_public(&cl).replace('\'', "''")
    ))
    .await
    .unwrap();
    c.batch_execute("UPDATE public.pgbench_accounts SET abalance = abalance + 5 WHERE aid BETWEEN 1000 AND 1999")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let hash = "SELECT md5(string_agg(concat_ws('|', aid, abalance), ',' ORDER BY aid)) FROM public.pgbench_accounts";
    loop {
        let a: String = c.query_one(hash, &[]).await.unwrap().get(0);
        let b: String = s.query_one(hash, &[]).await.unwrap().get(0);
        if a == b {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the subscriber did not catch up in 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    s.batch_execute("DROP SUBSCRIPTION direct").await.unwrap();
    drop((s, c));
    sub.teardown().await.unwrap();
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_loads_are_copy_loads_on_postgres_15() {
    prove(15, "direct15").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_loads_are_copy_loads_on_postgres_18() {
    prove(18, "direct18").await;
}

/// The self-check compares pages: a reference whose layout is not the one
/// the generator was told (fillfactor 80 on the server, 90 here) is found,
/// with the page and byte; the server's own layout passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_self_check_refuses_a_corrupted_reference_layout() {
    let root = common::scratch("direct-check");
    let cl = Cluster::provision(&spec(&root, "c", pgfleet_proto::installs::DEFAULT))
        .await
        .unwrap();
    let c = cl.connect().await.unwrap();
    for r in check::REFERENCES {
        assert_eq!(check::compare(&cl, &c, r).await.unwrap(), Ok(()), "{r:?}");
    }
    let corrupted = check::Reference {
        rows: 20_000,
        bigint: false,
        fillfactor: 90,
        created_fillfactor: 80,
    };
    let why = check::compare(&cl, &c, corrupted)
        .await
        .unwrap()
        .unwrap_err();
    assert!(why.contains("heap"), "{why}");
    // A build refused loads by copy and says why, in the load's figures.
    check::remember(&check::build_of(&cl), Err(why.clone()));
    let m = load(&cl, "direct", "fillfactor: 100").await;
    assert_eq!(m["load_method"], "copy", "{m}");
    let note = m["load_method_note"].as_str().unwrap();
    assert!(
        note.contains("refused a direct load") && note.contains(&why),
        "{note}"
    );
    drop(c);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
