//! What the agent's PostgreSQL tests share: a scratch dir the server's user
//! can reach, a cluster spec in it, and running a kind in a cluster.
#![allow(dead_code)]

pub mod s3;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pgfleet_agent::cluster::RunAs;
use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::cluster::{Cluster, ClusterSpec};
use pgfleet_agent::pgbin::PgBin;
use pgfleet_agent::workload::{self, CellContext, Output};
use pgfleet_proto::workload::{Params, plan_entry};
use tokio_util::sync::CancellationToken;

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgfleet-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

pub fn spec(root: &Path, name: &str, shared_buffers: &str, caps: Caps) -> ClusterSpec {
    ClusterSpec {
        pg: PgBin::find(
            std::env::var_os("PGFLEET_PG_BIN")
                .map(PathBuf::from)
                .as_deref(),
        )
        .unwrap(),
        clusters_dir: root.join("clusters"),
        name: name.into(),
        run_as: RunAs::resolve("postgres").unwrap(),
        settings: BTreeMap::from([("shared_buffers".into(), shared_buffers.into())]),
        listen: Vec::new(),
        peers: Vec::new(),
        memory_bytes: 0,
        cpus: 0,
        caps,
        account_io: false,
        allow_shell: false,
    }
}

/// An agent's environment with its data root and dataset store, no
/// emulation: what `cell::run` needs.
pub fn agent_env(root: &Path, store: &Path) -> pgfleet_agent::cell::AgentEnv {
    pgfleet_agent::cell::AgentEnv {
        pg: PgBin::find(
            std::env::var_os("PGFLEET_PG_BIN")
                .map(PathBuf::from)
                .as_deref(),
        )
        .map_err(|e| e.to_string()),
        run_as: RunAs::resolve("postgres").map_err(|e| e.to_string()),
        data_root: root.to_path_buf(),
        datasets: pgfleet_proto::dataset::LocalStore::new(store),
        dataset_reflink: false,
        remote: None,
        snapshot: None,
        storage_profile: "nvme".into(),
        caps: Default::default(),
        emulated: false,
        address: None,
        instance: Default::default(),
        fio: "fio".into(),
        delivered: Default::default(),
        kept: Default::default(),
    }
}

/// A kind's parameters from a scenario entry in YAML / JSON, e.g.
/// `{kind: pgbench, scale: 1}`: the scenario's checks and defaults.
pub fn params(entry: &str) -> Params {
    plan_entry(entry).unwrap().remove(0).1
}

/// A pgbench entry loading by copy, for tests that hold sessions across
/// the cell's load, which a direct load (a restart of the server) would
/// close; the direct load is proven in `direct.rs`.
pub fn copy_params(entry: &str) -> Params {
    let entry = if entry.contains("pgbench") && !entry.contains("load_method") {
        entry.replacen('{', "{load_method: copy, ", 1)
    } else {
        entry.to_string()
    };
    params(&entry)
}

/// Runs a kind's cell workload in `cluster` (events discarded).
pub async fn run(cluster: &Cluster, params: &Params) -> pgfleet_agent::Result<Output> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let mut ctx = CellContext::new("c", cluster, tx, CancellationToken::new());
    workload::run(&mut ctx, params).await
}

/// A kind's points as its typed params and metrics.
pub fn typed_points<P: serde::de::DeserializeOwned, M: serde::de::DeserializeOwned>(
    out: &Output,
) -> Vec<(P, M)> {
    out.points
        .iter()
        .map(|p| {
            (
                serde_json::from_str(&p.params_json).unwrap(),
                serde_json::from_str(&p.metrics_json).unwrap(),
            )
        })
        .collect()
}

/// Runs one cell of `entry` through the agent's real cell path
/// (`cell::run`: provisioning, datasets, the workload, teardown) with
/// dataset mode `mode`; events discarded.
pub async fn run_cell(
    env: &pgfleet_agent::cell::AgentEnv,
    cell: &str,
    entry: &str,
    mode: &str,
) -> pgfleet_proto::v1::CellResult {
    run_cell_reusing(env, cell, entry, mode, false).await
}

/// `run_cell` with the workload's `reuse_cluster`.
pub async fn run_cell_reusing(
    env: &pgfleet_agent::cell::AgentEnv,
    cell: &str,
    entry: &str,
    mode: &str,
    reuse_cluster: bool,
) -> pgfleet_proto::v1::CellResult {
    let p = params(entry);
    let assign = pgfleet_proto::v1::Assign {
        cell_id: cell.into(),
        run_id: "r".into(),
        workload: p.kind().name().into(),
        params_json: p.to_json(),
        settings: [("shared_buffers".to_string(), "32MB".to_string())].into(),
        role: String::new(),
        peers: Vec::new(),
        traceparent: String::new(),
        dataset: mode.into(),
        reuse_cluster,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let control = pgfleet_agent::cell::Control {
        cancel: CancellationToken::new(),
        release: CancellationToken::new(),
        peers: tokio::sync::watch::channel(Default::default()).1,
    };
    // As the session does: the assignment checked (and its parameters
    // parsed) once, a refused one failed.
    match pgfleet_agent::assign::check(&assign) {
        Ok(params) => pgfleet_agent::cell::run(env, assign, params, tx, control).await,
        Err(why) => pgfleet_proto::v1::CellResult {
            cell_id: assign.cell_id,
            status: pgfleet_proto::v1::CellStatus::Failed as i32,
            error: why,
            role: assign.role,
            ..Default::default()
        },
    }
}

/// A succeeded cell's dataset provenance and its first point's metrics.
pub fn succeeded(r: &pgfleet_proto::v1::CellResult) -> (serde_json::Value, serde_json::Value) {
    assert_eq!(
        r.status,
        pgfleet_proto::v1::CellStatus::Succeeded as i32,
        "{}",
        r.error
    );
    let env: serde_json::Value = serde_json::from_str(&r.environment_json).unwrap();
    let metrics: serde_json::Value = serde_json::from_str(&r.points[0].metrics_json).unwrap();
    (env["dataset"].clone(), metrics)
}

/// A superuser connection for a test's own SQL over the scenario's schema
/// (`public` first). The agent's own sessions never search `public`
/// (`cluster::SUPERUSER_OPTIONS`); a test's trusted SQL may.
pub async fn sql(cl: &Cluster) -> tokio_postgres::Client {
    let c = cl.connect().await.unwrap();
    c.batch_execute("SET search_path = public, pg_catalog")
        .await
        .unwrap();
    c
}

/// `cl.conninfo()` for a standard tool run by a test over `public`.
pub fn conninfo_public(cl: &Cluster) -> String {
    cl.conninfo().replace(
        "search_path=pg_catalog,pg_temp",
        "search_path=public,pg_catalog",
    )
}

/// The settings judgement's table for this server's major version equals
/// what the live server lists in `pg_settings` (name, type, context,
/// category), so the allowlist judges every setting the server has and
/// nothing it lacks. Versions without a table are skipped (false).
pub async fn assert_settings_table_is_the_servers(cl: &Cluster) -> bool {
    let Some((_, table)) = pgfleet_proto::settings::VERSIONS
        .iter()
        .find(|(v, _)| *v == cl.pg.major)
    else {
        return false;
    };
    let c = cl.connect().await.unwrap();
    let live: Vec<String> = c
        .query(
            "SELECT name || E'\\t' || vartype || E'\\t' || context || E'\\t' || category \
             FROM pg_settings ORDER BY name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let ours: Vec<String> = pgfleet_proto::settings::rows(table)
        .map(|s| format!("{}\t{}\t{}\t{}", s.name, s.vartype, s.context, s.category))
        .collect();
    assert_eq!(
        ours, live,
        "proto/data/pg_settings_{}.tsv differs from the server's pg_settings",
        cl.pg.major
    );
    for s in pgfleet_proto::settings::rows(table) {
        assert!(
            pgfleet_proto::settings::verdict(s.name).is_some(),
            "{}",
            s.name
        );
    }
    true
}

/// A test that cannot run here (not root, no cgroup v1, a tool missing)
/// says why and returns; where `PGFLEET_REQUIRE_PRIVILEGES` is set (CI,
/// which runs as root on cgroup v1) it fails instead, so nothing there
/// passes without testing.
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("PGFLEET_REQUIRE_PRIVILEGES").is_none(),
        "this test would skip ({why}), but PGFLEET_REQUIRE_PRIVILEGES is set: this host must run it"
    );
    eprintln!("skipped: {why}");
}
