//! Real PostgreSQL, the real agent cell path: datasets built once, published
//! to a local store and restored by later cells, with what can go wrong —
//! concurrent builders, a builder killed half-way, a corrupted file, a full
//! disk during a restore.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use pgfleet_agent::cell::AgentEnv;
use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::dataset;
use pgfleet_proto::dataset::LocalStore;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

use common::{run_cell, scratch, succeeded};

fn env(root: &Path, store: &Path) -> AgentEnv {
    common::agent_env(root, store)
}

/// Restores the store's dataset `m` into a new cluster of `spec`.
async fn restore_into(
    spec: &pgfleet_agent::cluster::ClusterSpec,
    ls: &LocalStore,
    m: &pgfleet_proto::dataset::Manifest,
) -> pgfleet_agent::Result<Cluster> {
    let cancel = CancellationToken::new();
    Cluster::provision_restored(spec, &m.superuser_password, |data| {
        let cancel = &cancel;
        async move {
            dataset::restore(ls, m, &data, spec.run_as.as_ref(), false, |_, _| {}, cancel).await?;
            Ok(())
        }
    })
    .await
}

const VACUUM: &str = "{kind: vacuum-bloat, scale: 2, bloat_bytes: 8MiB}";

/// Figures of a vacuum-bloat cell that depend only on the data it starts
/// from: a built and a restored cell must agree on every one.
fn data_figures(m: &Json) -> Vec<(String, Json)> {
    [
        "rows_loaded",
        "rows_updated",
        "table_bytes",
        "index_bytes",
        "dead_tuples_before",
        "dead_tuples_removed",
        "heap_blks_total",
    ]
    .iter()
    .map(|k| (k.to_string(), m[*k].clone()))
    .collect()
}

#[tokio::test]
async fn a_dataset_is_built_once_and_a_restored_cell_measures_alike() {
    let root = scratch("ds-reuse");
    let store = root.join("store");
    let env = env(&root, &store);

    let built = run_cell(&env, "a", VACUUM, "reuse").await;
    let (prov_a, m_a) = succeeded(&built);
    assert_eq!(prov_a["how"], "built", "{prov_a}");
    assert_eq!(prov_a["cache"], "rewarmed");
    assert!(
        prov_a["rewarm_bytes"].as_u64().unwrap() > 20 << 20,
        "{prov_a}"
    );
    let fp = prov_a["fingerprint"].as_str().unwrap().to_string();
    assert!(fp.starts_with("pgbench-s2-"), "{fp}");
    let manifest = LocalStore::new(&store)
        .find(&fp)
        .unwrap()
        .expect("published");
    assert!(manifest.bytes > 20 << 20, "{}", manifest.bytes);
    assert!(manifest.files.iter().all(|f| f.sha256.len() == 64));
    assert!(
        !manifest.files.iter().any(|f| f.path == "postmaster.pid"),
        "the stopped server's pid file is no part of a dataset"
    );

    let restored = run_cell(&env, "b", VACUUM, "reuse").await;
    let (prov_b, m_b) = succeeded(&restored);
    assert_eq!(prov_b["how"], "restored", "{prov_b}");
    assert_eq!(prov_b["fingerprint"], fp.as_str());
    assert_eq!(prov_b["method"], "copy");
    assert_eq!(prov_b["cache"], "rewarmed");
    assert_eq!(
        prov_a["rewarm_bytes"], prov_b["rewarm_bytes"],
        "the same relations read back"
    );
    assert!(prov_b["restore_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(
        prov_b["built_by"].as_str().unwrap().split(' ').next(),
        Some("a")
    );
    // The same data: every figure that depends only on it is equal, and the
    // timed VACUUM within the usual spread of two runs.
    assert_eq!(data_figures(&m_a), data_figures(&m_b));
    let (va, vb) = (
        m_a["vacuum_seconds"].as_f64().unwrap(),
        m_b["vacuum_seconds"].as_f64().unwrap(),
    );
    assert!(
        (va / vb) > 0.33 && (va / vb) < 3.0,
        "built {va} s vs restored {vb} s"
    );

    // `fresh` loads its own and publishes nothing.
    let fresh = run_cell(&env, "c", VACUUM, "fresh").await;
    let (prov_c, m_c) = succeeded(&fresh);
    assert_eq!(prov_c["how"], "loaded");
    assert_eq!(prov_c["cache"], "as loaded");
    assert_eq!(data_figures(&m_a), data_figures(&m_c));
    assert_eq!(LocalStore::new(&store).list().unwrap().len(), 1);

    // Nothing of the cells is left but the store.
    let clusters: Vec<_> = std::fs::read_dir(root.join("clusters"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(clusters.is_empty(), "{clusters:?}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn a_restored_cluster_is_taken_over_with_new_passwords() {
    let root = scratch("ds-takeover");
    let store = root.join("store");
    let env = env(&root, &store);
    let entry = "{kind: pgbench, scale: 1, transactions: 10, clients: 1}";
    succeeded(&run_cell(&env, "a", entry, "reuse").await);
    let ls = LocalStore::new(&store);
    let m = ls.list().unwrap().remove(0);
    let spec = common::spec(&root, "restored", "32MB", Default::default());
    let cluster = restore_into(&spec, &ls, &m).await.unwrap();
    let c = cluster.connect().await.unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM public.pgbench_accounts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 100_000);
    // The builder's password (kept in the manifest) no longer opens it.
    assert_ne!(cluster.superuser_password(), m.superuser_password);
    let mut old = cluster.pg_config();
    old.password(&m.superuser_password);
    assert!(old.connect(tokio_postgres::NoTls).await.is_err());
    // The workload role has this cluster's password, and gets the tables.
    cluster.hand_over().await.unwrap();
    let w = cluster.workload_server().connect().await.unwrap();
    w.batch_execute("UPDATE public.pgbench_accounts SET abalance = 1 WHERE aid = 1")
        .await
        .unwrap();
    drop((c, w));
    cluster.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn concurrent_cells_of_one_dataset_build_it_once() {
    let root = scratch("ds-concurrent");
    let store = root.join("store");
    let (e1, e2) = (env(&root.join("a1"), &store), env(&root.join("a2"), &store));
    let entry = "{kind: pgbench, scale: 2, transactions: 20, clients: 1}";
    let (r1, r2) = tokio::join!(
        run_cell(&e1, "x", entry, "reuse"),
        run_cell(&e2, "y", entry, "reuse")
    );
    let (p1, _) = succeeded(&r1);
    let (p2, _) = succeeded(&r2);
    let mut how = [p1["how"].as_str().unwrap(), p2["how"].as_str().unwrap()];
    how.sort();
    assert_eq!(how, ["built", "restored"], "{p1} {p2}");
    let waiter = if p1["how"] == "restored" { &p1 } else { &p2 };
    assert!(
        waiter["wait_seconds"].as_f64().unwrap() > 0.5,
        "the restoring cell waited for the build: {waiter}"
    );
    assert_eq!(LocalStore::new(&store).list().unwrap().len(), 1);
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn a_corrupted_file_is_discarded_and_the_dataset_built_again() {
    let root = scratch("ds-corrupt");
    let store = root.join("store");
    let env = env(&root, &store);
    let entry = "{kind: pgbench, scale: 1, transactions: 10, clients: 1}";
    succeeded(&run_cell(&env, "a", entry, "reuse").await);
    let ls = LocalStore::new(&store);
    let m = ls.list().unwrap().remove(0);
    // Flip one byte in the middle of the largest file.
    let big = m.files.iter().max_by_key(|f| f.bytes).unwrap();
    let path = ls.path(&m.fingerprint).join("data").join(&big.path);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();

    let r = run_cell(&env, "b", entry, "reuse").await;
    let (prov, _) = succeeded(&r);
    assert_eq!(prov["how"], "built", "{prov}");
    let why = prov["discarded"].as_str().unwrap();
    assert!(why.contains(&big.path) && why.contains("SHA-256"), "{why}");
    let again = ls.list().unwrap().remove(0);
    assert_eq!(again.fingerprint, m.fingerprint);
    assert_eq!(again.built_by, "b");
    // The rebuilt one restores cleanly.
    let (prov, _) = succeeded(&run_cell(&env, "c", entry, "reuse").await);
    assert_eq!(prov["how"], "restored", "{prov}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn a_full_disk_during_a_restore_is_a_clear_error_and_leaves_nothing() {
    let root = scratch("ds-full");
    let store = root.join("store");
    let env = env(&root, &store);
    let entry = "{kind: pgbench, scale: 1, transactions: 10, clients: 1}";
    succeeded(&run_cell(&env, "a", entry, "reuse").await);
    let ls = LocalStore::new(&store);
    let m = ls.list().unwrap().remove(0);
    // Clusters on a filesystem smaller than the dataset.
    let small = root.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m,mode=755", "pgfleet-test"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success());
    let spec = common::spec(&small, "restored", "32MB", Default::default());
    let r = restore_into(&spec, &ls, &m).await;
    let left: Vec<_> = std::fs::read_dir(small.join("clusters"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::process::Command::new("umount").arg(&small).status();
    let e = r
        .err()
        .expect("a 16 MB filesystem cannot hold the dataset")
        .to_string();
    assert!(
        e.contains("No space left") && e.contains(&m.fingerprint),
        "{e}"
    );
    assert!(left.is_empty(), "left behind: {left:?}");
    // The published dataset is intact.
    succeeded(&run_cell(&env, "b", entry, "reuse").await);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Run by `a_builder_killed_half_way_leaves_nothing_used` in a child
/// process, which it kills while the dataset is being published.
#[tokio::test]
#[ignore = "a helper: runs only in the child process of the killed-build test"]
async fn helper_build_for_the_killed_build_test() {
    let Some(root) = std::env::var_os("PGFLEET_TEST_BUILD_ROOT") else {
        return;
    };
    let root = PathBuf::from(root);
    let env = env(&root.join("child"), &root.join("store"));
    run_cell(
        &env,
        "killed",
        "{kind: pgbench, scale: 8, transactions: 10, clients: 1}",
        "reuse",
    )
    .await;
}

#[tokio::test]
async fn a_builder_killed_half_way_leaves_nothing_used() {
    let root = scratch("ds-killed");
    let store = root.join("store");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_build_for_the_killed_build_test",
            "--ignored",
            "--nocapture",
        ])
        .env("PGFLEET_TEST_BUILD_ROOT", &root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it as soon as its build directory appears (it is publishing).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let building = loop {
        let found = std::fs::read_dir(&store).ok().and_then(|d| {
            d.flatten()
                .find(|e| e.file_name().to_string_lossy().starts_with(".building-"))
        });
        if let Some(e) = found {
            break e.path();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child never published"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child ended before publishing"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let ls = LocalStore::new(&store);
    assert!(building.exists());
    assert!(
        ls.list().unwrap().is_empty(),
        "a killed build is never published"
    );
    // Its server went with it (parent-death signal); its cluster directory
    // is what an agent's start-up reaps.
    pgfleet_agent::cluster::reap_stale(&root.join("child").join("clusters")).unwrap();

    // The next cell builds it from scratch, removing the leftovers first.
    let env = env(&root, &store);
    let entry = "{kind: pgbench, scale: 8, transactions: 10, clients: 1}";
    let (prov, _) = succeeded(&run_cell(&env, "next", entry, "reuse").await);
    assert_eq!(prov["how"], "built", "{prov}");
    assert!(
        !building.exists(),
        "the killed build's directory is removed"
    );
    assert_eq!(ls.list().unwrap().len(), 1);
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn read_writes_table_is_a_dataset_too() {
    let root = scratch("ds-read-write");
    let store = root.join("store");
    let env = env(&root, &store);
    let entry = "{kind: read-write, rows: 150000, tests: [seq-cold], repeats: 1}";
    let (prov_a, m_a) = succeeded(&run_cell(&env, "a", entry, "reuse").await);
    assert_eq!(prov_a["how"], "built", "{prov_a}");
    assert!(
        prov_a["fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("read-write-r150000-")
    );
    let (prov_b, m_b) = succeeded(&run_cell(&env, "b", entry, "reuse").await);
    assert_eq!(prov_b["how"], "restored", "{prov_b}");
    // The same table, read cold the same way: same size, same pages read.
    assert_eq!(m_a["table_bytes"], m_b["table_bytes"]);
    assert_eq!(m_a["shared_read"], m_b["shared_read"]);
    std::fs::remove_dir_all(&root).unwrap();
}

/// A dataset restored into a class with capped storage is written at the
/// class's speed: the caps bind the cluster's device before the copy, as a
/// real volume's would (before, the copy ran at the host disk's speed and
/// only the server was capped). Block-I/O throttling needs root.
#[tokio::test]
async fn a_restore_into_a_capped_class_is_written_at_its_cap() {
    if !nix::unistd::geteuid().is_root() {
        common::skip("block-I/O throttling needs root");
        return;
    }
    let root = scratch("ds-capped");
    let store = root.join("store");
    let built = run_cell(&env(&root, &store), "a", VACUUM, "reuse").await;
    let (prov_a, _) = succeeded(&built);
    let bytes = prov_a["bytes"].as_u64().unwrap();
    const MIB_S: u64 = 20;
    let mut capped = env(&root, &store);
    capped.caps = pgfleet_proto::environment::Caps {
        write_mbps: MIB_S,
        ..Default::default()
    };
    capped.emulated = true;
    let restored = run_cell(&capped, "b", VACUUM, "reuse").await;
    let (prov_b, _) = succeeded(&restored);
    assert_eq!(prov_b["how"], "restored", "{prov_b}");
    let seconds = prov_b["restore_seconds"].as_f64().unwrap();
    let floor = 0.8 * bytes as f64 / (MIB_S << 20) as f64;
    eprintln!(
        "restored {bytes} bytes in {seconds:.1} s (the cap allows no less than {floor:.1} s)"
    );
    assert!(
        seconds >= floor,
        "{bytes} bytes restored in {seconds:.1} s: faster than {MIB_S} MiB/s"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// `reuse_cluster`: a succeeded cell's cluster is kept and the next cell
/// of its dataset reuses it after the kind's reset; a cell that leaves a
/// catalog object behind (here a large object; a trigger or a default
/// would be code a later superuser session runs) is not kept, and the
/// next cell restores instead, saying why; a cell that does not reuse
/// tears the kept cluster down.
#[tokio::test]
async fn a_kept_cluster_is_reused_after_its_reset_unless_a_cell_left_objects() {
    use common::run_cell_reusing;
    let root = scratch("ds-keep");
    let store = root.join("store");
    let env = env(&root, &store);
    let plain = "{kind: pgbench, scale: 2, transactions: 20}";
    let dirty = "{kind: pgbench, scale: 2, transactions: 3, script_text: 'SELECT lo_create(0);'}";
    let clusters = || -> Vec<String> {
        std::fs::read_dir(env.clusters_dir())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };

    let (a, _) = succeeded(&run_cell_reusing(&env, "a", plain, "reuse", true).await);
    assert_eq!(a["how"], "built", "{a}");
    assert_eq!(clusters(), ["a"], "kept for the next cell");

    let (b, m) = succeeded(&run_cell_reusing(&env, "b", plain, "reuse", true).await);
    assert_eq!(b["how"], "reused", "{b}");
    assert_eq!(b["reused_from"], "a", "{b}");
    assert_eq!(b["reused_by_cells"], 2, "{b}");
    assert!(b["reset_seconds"].as_f64().unwrap() > 0.0, "{b}");
    assert_eq!(b["fingerprint"], a["fingerprint"]);
    assert!(m["tps"].as_f64().unwrap() > 0.0, "{m}");

    let (c, _) = succeeded(&run_cell_reusing(&env, "c", dirty, "reuse", true).await);
    assert_eq!(c["how"], "reused", "{c}");
    assert_eq!(c["reused_by_cells"], 3, "{c}");
    assert!(clusters().is_empty(), "not kept: {:?}", clusters());

    let (d, _) = succeeded(&run_cell_reusing(&env, "d", plain, "reuse", true).await);
    assert_eq!(d["how"], "restored", "{d}");
    let why = d["not_reused"].as_str().unwrap();
    assert!(
        why.starts_with("the cluster of cell c was not kept: the cell created large object:"),
        "{why}"
    );
    assert_eq!(clusters(), ["d"]);

    // A cell that does not reuse: the kept cluster goes first.
    let (e, _) = succeeded(&run_cell(&env, "e", plain, "reuse").await);
    assert_eq!(e["how"], "restored", "{e}");
    assert!(e["not_reused"].is_null(), "{e}");
    assert!(clusters().is_empty(), "{:?}", clusters());
    std::fs::remove_dir_all(&root).unwrap();
}

/// An agent whose volume was created from a CSI snapshot (the Kubernetes
/// source says so with `--volume-snapshot`) reads each dataset the
/// snapshot brought in full before the first cell restores it, once; a
/// dataset built after the agent started is not read again; `hydrate: none`
/// leaves them lazy and every cell says so. The snapshot's lazy fetch
/// itself cannot happen here (no CSI driver): the volume is this host's
/// disk, the reads and their figures are real.
#[tokio::test]
async fn a_volume_snapshots_datasets_are_hydrated_once_before_their_first_restore() {
    use pgfleet_agent::hydrate::{Mode, Snapshot};
    let root = scratch("ds-hydrate");
    let store = root.join("store");
    let ls = LocalStore::new(&store);
    let built = run_cell(&env(&root, &store), "a", VACUUM, "reuse").await;
    let (prov_a, _) = succeeded(&built);
    assert_eq!(prov_a["how"], "built");
    assert!(prov_a.get("hydration").is_none(), "{prov_a}");
    let fp = prov_a["fingerprint"].as_str().unwrap().to_string();
    let published = ls.find(&fp).unwrap().unwrap().bytes;

    // The store as the snapshot brought it.
    let snapshot = |mode| {
        Some(std::sync::Arc::new(Snapshot::at_start(
            "pgfleet-ds-nvme-1",
            mode,
            &ls,
            &[],
        )))
    };
    let from_snapshot = AgentEnv {
        snapshot: snapshot(Mode::ReadAll),
        ..env(&root, &store)
    };
    let b = run_cell(&from_snapshot, "b", VACUUM, "reuse").await;
    let (prov_b, _) = succeeded(&b);
    assert_eq!(prov_b["how"], "restored", "{prov_b}");
    let h = &prov_b["hydration"];
    assert_eq!(h["snapshot"], "pgfleet-ds-nvme-1", "{prov_b}");
    assert_eq!(h["mode"], "read-all");
    assert_eq!(h["hydrated"], true);
    assert_eq!(h["by_cell"], "b");
    assert_eq!(h["bytes"].as_u64(), Some(published), "every byte, once");
    let (ttfb, secs) = (
        h["ttfb_ms"].as_f64().unwrap(),
        h["seconds"].as_f64().unwrap(),
    );
    assert!(ttfb > 0.0 && ttfb / 1e3 <= secs, "{h}");
    assert!(h["mb_per_s"].as_f64().unwrap() > 0.0, "{h}");

    // Read once per agent: the next cell says who read it.
    let c = run_cell(&from_snapshot, "c", VACUUM, "reuse").await;
    let (prov_c, _) = succeeded(&c);
    assert_eq!(prov_c["hydration"]["by_cell"], "b", "{prov_c}");
    assert_eq!(prov_c["hydration"]["seconds"], h["seconds"]);

    // Built after the agent started: written here, nothing lazy.
    let small = "{kind: vacuum-bloat, scale: 1, bloat_bytes: 4MiB}";
    let d = run_cell(&from_snapshot, "d", small, "reuse").await;
    assert_eq!(succeeded(&d).0["how"], "built");
    let e = run_cell(&from_snapshot, "e", small, "reuse").await;
    let (prov_e, _) = succeeded(&e);
    assert_eq!(prov_e["how"], "restored");
    assert!(prov_e.get("hydration").is_none(), "{prov_e}");

    // `hydrate: none`: restored from lazy blocks, and said.
    let lazy = AgentEnv {
        snapshot: snapshot(Mode::None),
        ..env(&root, &store)
    };
    let f = run_cell(&lazy, "f", VACUUM, "reuse").await;
    let (prov_f, _) = succeeded(&f);
    assert_eq!(prov_f["hydration"]["mode"], "none", "{prov_f}");
    assert_eq!(prov_f["hydration"]["hydrated"], false);
    assert_eq!(prov_f["hydration"]["bytes"], 0);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Volumes made from the snapshot for one cell each (`--cell-volume`, the
/// Kubernetes source mounts them): a cell takes one and its dataset
/// becomes the cell's cluster in place after its blocks are read, no copy,
/// and it measures as a built cell; a volume whose dataset does not match
/// its manifest is left for a copy from the data root's store, as is every
/// cell past the volumes. Here a volume is a directory holding a copy of
/// the store, as a volume made from its snapshot would (no CSI driver).
#[tokio::test]
async fn a_cell_volume_from_the_snapshot_is_used_in_place_without_a_copy() {
    use pgfleet_agent::hydrate::{Mode, Snapshot};
    let root = scratch("ds-cell-volume");
    let store = root.join("store");
    let ls = LocalStore::new(&store);
    let (prov_a, m_a) = succeeded(&run_cell(&env(&root, &store), "a", VACUUM, "reuse").await);
    assert_eq!(prov_a["how"], "built");
    let fp = prov_a["fingerprint"].as_str().unwrap().to_string();
    let published = ls.find(&fp).unwrap().unwrap();
    let volumes: Vec<PathBuf> = ["vol-1", "vol-2"].iter().map(|v| root.join(v)).collect();
    for v in &volumes {
        std::fs::create_dir_all(v.join("datasets")).unwrap();
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(store.join(&fp))
            .arg(v.join("datasets"))
            .status()
            .unwrap();
        assert!(ok.success());
    }
    // The second volume's copy lost a file's tail.
    let biggest = published.files.iter().max_by_key(|f| f.bytes).unwrap();
    let torn = volumes[1]
        .join("datasets")
        .join(&fp)
        .join("data")
        .join(&biggest.path);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&torn)
        .unwrap()
        .set_len(biggest.bytes / 2)
        .unwrap();
    let on_volumes = AgentEnv {
        snapshot: Some(std::sync::Arc::new(Snapshot::at_start(
            "pgfleet-ds-gp3-1",
            Mode::ReadAll,
            &ls,
            &volumes,
        ))),
        ..env(&root, &store)
    };

    let (prov_b, m_b) = succeeded(&run_cell(&on_volumes, "b", VACUUM, "reuse").await);
    assert_eq!(prov_b["how"], "restored", "{prov_b}");
    assert_eq!(prov_b["method"], "in-place", "{prov_b}");
    let vol_store = volumes[0].join("datasets");
    assert_eq!(prov_b["store"], vol_store.display().to_string().as_str());
    let h = &prov_b["hydration"];
    assert_eq!(h["hydrated"], true, "{prov_b}");
    assert_eq!(h["by_cell"], "b");
    assert_eq!(
        h["bytes"].as_u64(),
        Some(published.bytes),
        "every byte, once"
    );
    assert_eq!(prov_b["cache"], "rewarmed");
    assert_eq!(
        prov_a["rewarm_bytes"], prov_b["rewarm_bytes"],
        "the same relations read back"
    );
    assert_eq!(data_figures(&m_a), data_figures(&m_b), "the same data");
    // Used up: the volume's store no longer lists it and the cluster that
    // had its files was removed with the cell; the data root's store is
    // untouched.
    assert!(LocalStore::new(&vol_store).list().unwrap().is_empty());
    assert!(
        std::fs::read_dir(volumes[0].join("clusters"))
            .unwrap()
            .next()
            .is_none(),
        "the cell's cluster was removed"
    );
    assert_eq!(
        ls.find(&fp).unwrap().unwrap().created_at,
        published.created_at
    );

    // The torn volume: refused before anything moved, restored by copy.
    let (prov_c, m_c) = succeeded(&run_cell(&on_volumes, "c", VACUUM, "reuse").await);
    assert_eq!(prov_c["method"], "copy", "{prov_c}");
    assert_eq!(prov_c["store"], store.display().to_string().as_str());
    assert_eq!(data_figures(&m_a), data_figures(&m_c));
    assert!(torn.exists(), "nothing was moved off the torn volume");
    // The data root's copy came with the snapshot too: hydrated first.
    assert_eq!(prov_c["hydration"]["by_cell"], "c", "{prov_c}");

    // No volume left: a copy, the data root's copy already read.
    let (prov_d, _) = succeeded(&run_cell(&on_volumes, "d", VACUUM, "reuse").await);
    assert_eq!(prov_d["method"], "copy", "{prov_d}");
    assert_eq!(prov_d["hydration"]["by_cell"], "c", "{prov_d}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// An XFS filesystem on a loop device over a sparse file, mounted for the
/// test and removed (unmounted, detached, deleted) on drop, on every path.
struct Xfs {
    mount: PathBuf,
    image: PathBuf,
    device: String,
}

impl Xfs {
    /// None where it cannot be made (not root, no mkfs.xfs or losetup).
    fn new(name: &str) -> Option<Xfs> {
        use std::process::Command;
        let have = |tool: &str| {
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !nix::unistd::Uid::effective().is_root() || !have("mkfs.xfs") || !have("losetup") {
            return None;
        }
        let dir = scratch(name);
        let image = dir.join("xfs.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(2 << 30)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let device = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let mount = dir.join("mnt");
        let x = Xfs {
            mount,
            image,
            device,
        };
        std::fs::create_dir_all(&x.mount).unwrap();
        let ok = |c: &mut Command| {
            let o = c.output().unwrap();
            assert!(o.status.success(), "{c:?}: {o:?}");
        };
        ok(Command::new("mkfs.xfs").args(["-q", "-m", "reflink=1", &x.device]));
        ok(Command::new("mount").arg(&x.device).arg(&x.mount));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&x.mount, std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(x)
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        use std::process::Command;
        let _ = Command::new("umount").arg(&self.mount).output();
        let _ = Command::new("losetup").args(["-d", &self.device]).output();
        if let Some(dir) = self.image.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// On a filesystem that can reflink (XFS), restores still copy unless the
/// agent opted in (`--dataset-reflink`): a reflinked cluster's first write
/// to each block copies it, so it measures slower than a built one
/// (BENCHMARKS.md). Opted in, the restore shares the store's blocks
/// (instant, sizes checked) and says so.
#[tokio::test]
async fn restores_copy_unless_the_agent_opts_in_to_reflinks() {
    let Some(xfs) = Xfs::new("ds-xfs") else {
        common::skip("needs root, losetup and mkfs.xfs (xfsprogs)");
        return;
    };
    let root = xfs.mount.join("agent");
    std::fs::create_dir_all(&root).unwrap();
    let store = xfs.mount.join("datasets");
    let plain = env(&root, &store);
    let small = "{kind: vacuum-bloat, scale: 1, bloat_bytes: 4MiB}";
    let a = run_cell(&plain, "a", small, "reuse").await;
    assert_eq!(succeeded(&a).0["how"], "built");
    let b = run_cell(&plain, "b", small, "reuse").await;
    let (prov_b, m_b) = succeeded(&b);
    assert_eq!(
        (prov_b["how"].as_str(), prov_b["method"].as_str()),
        (Some("restored"), Some("copy")),
        "{prov_b}"
    );
    let opted = AgentEnv {
        dataset_reflink: true,
        ..env(&root, &store)
    };
    let c = run_cell(&opted, "c", small, "reuse").await;
    let (prov_c, m_c) = succeeded(&c);
    assert_eq!(prov_c["method"], "reflink", "{prov_c}");
    assert_eq!(m_b["rows_loaded"], m_c["rows_loaded"]);
    drop(xfs);
}
