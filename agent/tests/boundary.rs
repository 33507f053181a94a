//! The security boundary on real clusters: scenario SQL (pgbench scripts,
//! `setup_sql`) runs as the workload role, which cannot reach the agent's
//! host — no server programs, no server files, no untrusted languages, no
//! ALTER SYSTEM, no becoming the superuser — and cannot plant a function the
//! agent's superuser steps would run. With `allow_shell` the role is a
//! superuser, as pgbench users expect.

mod common;

use std::path::{Path, PathBuf};

use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::cluster::{Cluster, WORKLOAD_ROLE};
use serde_json::json;

async fn cluster(root: &Path, allow_shell: bool) -> Cluster {
    let mut spec = common::spec(root, "c", "64MB", Caps::default());
    spec.allow_shell = allow_shell;
    Cluster::provision(&spec).await.unwrap()
}

/// A directory the cluster's OS user could write a marker into, were it
/// let run a command.
fn marker_dir(root: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = root.join("markers");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// Runs one transaction of `script` as a pgbench cell; its error.
async fn pgbench_error(cl: &Cluster, driver: &str, script: &str) -> String {
    let entry = json!({"kind": "pgbench", "scale": 1, "script_text": script,
                       "transactions": 1, "warmup_s": 0, "driver": driver});
    match common::run(cl, &common::params(&entry.to_string())).await {
        Ok(_) => format!("the script ran: {script}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_scripts_cannot_reach_the_host() {
    let root = common::scratch("boundary-scripts");
    let cl = cluster(&root, false).await;
    let marker = marker_dir(&root).join("pwned");
    let attempts = [
        (
            format!("COPY (SELECT 1) TO PROGRAM 'touch {}';\n", marker.display()),
            "pg_execute_server_program",
        ),
        (
            format!("COPY (SELECT 1) TO '{}';\n", marker.display()),
            "pg_write_server_files",
        ),
        (
            "SELECT pg_read_file('/etc/passwd');\n".to_string(),
            "permission denied for function pg_read_file",
        ),
        (
            "SELECT lo_import('/etc/passwd');\n".to_string(),
            "permission denied for function lo_import",
        ),
        (
            "CREATE FUNCTION f() RETURNS int LANGUAGE c AS 'libc', 'getpid';\n".to_string(),
            "permission denied for language c",
        ),
        (
            "ALTER SYSTEM SET archive_command = 'id';\n".to_string(),
            "permission denied to set parameter",
        ),
        (
            "SET ROLE pgfleet;\n".to_string(),
            "permission denied to set role",
        ),
    ];
    for driver in ["pgfleet", "pgbench"] {
        for (script, want) in &attempts {
            let e = pgbench_error(&cl, driver, script).await;
            assert!(e.contains(want), "{driver}: {script}: {e}");
        }
    }
    assert!(
        !marker.exists(),
        "a scenario script wrote {}",
        marker.display()
    );
    // Ordinary scripts still work: the role owns the tables it is given.
    let entry = json!({"kind": "pgbench", "scale": 1, "transactions": 5, "warmup_s": 0,
                       "script_text": "\\set aid random(1, 100000)\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\nVACUUM pgbench_history;\nCHECKPOINT;\n"});
    common::run(&cl, &common::params(&entry.to_string()))
        .await
        .unwrap();
    let c = cl.connect().await.unwrap();
    let owner: String = c
        .query_one(
            "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'pgbench_accounts'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, WORKLOAD_ROLE);
    let granted: bool = c
        .query_one(
            "SELECT pg_has_role($1, 'pg_execute_server_program', 'MEMBER') OR pg_has_role($1, 'pg_read_server_files', 'MEMBER') OR pg_has_role($1, 'pg_write_server_files', 'MEMBER') OR rolsuper FROM pg_roles WHERE rolname = $1",
            &[&WORKLOAD_ROLE],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!granted);
    // The real pgbench gets the password in its environment, not on a
    // command line other local users can read.
    let server = cl.workload_server();
    let line = server.conninfo_without_password();
    assert!(
        line.contains(&format!("user='{WORKLOAD_ROLE}'")) && !line.contains("password"),
        "{line}"
    );
    assert!(server.password().is_some_and(|p| p.len() >= 32));
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_sql_cannot_reach_the_host_nor_plant_a_function_for_the_superuser() {
    let root = common::scratch("boundary-setup");
    let cl = cluster(&root, false).await;
    let marker = marker_dir(&root).join("pwned");
    let analysis = |sql: &str| {
        common::params(
            &json!({"kind": "compression-analysis", "dataset": "sql", "setup_sql": sql,
                    "sample_fractions": [1.0], "algorithms": ["lz4"]})
            .to_string(),
        )
    };
    let e = common::run(
        &cl,
        &analysis(&format!(
            "CREATE TABLE t AS SELECT 1 AS x; COPY t TO PROGRAM 'touch {}'",
            marker.display()
        )),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("pg_execute_server_program") && e.contains(WORKLOAD_ROLE),
        "{e}"
    );
    // A function that shadows one the agent's superuser queries call with
    // an exact-type match (pg_relation_size(oid) beside pg_catalog's
    // pg_relation_size(regclass)): a superuser running it would run the
    // COPY. The agent's queries after scenario SQL see only pg_catalog.
    let plant = format!(
        "CREATE TABLE t AS SELECT g AS x FROM generate_series(1, 1000) g;
         CREATE FUNCTION public.pg_relation_size(oid) RETURNS bigint LANGUAGE plpgsql AS $f$
           BEGIN COPY (SELECT 1) TO PROGRAM 'touch {}'; RETURN 1; END $f$;
         CREATE FUNCTION public.get_raw_page(text, text, bigint) RETURNS bytea LANGUAGE plpgsql AS $f$
           BEGIN COPY (SELECT 1) TO PROGRAM 'touch {}'; RETURN ''::bytea; END $f$;",
        marker.display(),
        marker.display()
    );
    let out = common::run(&cl, &analysis(&plant)).await.unwrap();
    assert!(
        !marker.exists(),
        "the agent ran a function scenario SQL planted"
    );
    assert!(
        !out.points.is_empty(),
        "the planted size function was called"
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_shell_makes_the_workload_role_a_superuser() {
    let root = common::scratch("boundary-allow");
    let cl = cluster(&root, true).await;
    let marker = marker_dir(&root).join("allowed");
    let entry = json!({"kind": "pgbench", "scale": 1, "transactions": 1, "warmup_s": 0,
                       "allow_shell": true,
                       "script_text": format!("COPY (SELECT 1) TO PROGRAM 'touch {}';\n", marker.display())});
    common::run(&cl, &common::params(&entry.to_string()))
        .await
        .unwrap();
    assert!(marker.exists());
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// The settings allowlist knows exactly this server's settings (PostgreSQL
/// 15 here; 18 in pg18.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_table_is_the_servers() {
    let root = common::scratch("boundary-settings");
    let cl = cluster(&root, false).await;
    assert!(common::assert_settings_table_is_the_servers(&cl).await);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
