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
            // 15 names the role it takes; 18 says "permission denied".
            "to COPY to or from an external program",
        ),
        (
            format!("COPY (SELECT 1) TO '{}';\n", marker.display()),
            "to COPY to a file",
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
        e.contains("to COPY to or from an external program") && e.contains(WORKLOAD_ROLE),
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

/// The settings allowlist knows exactly each version's settings: a
/// cluster of every version it has a table for (15, 17, 18, 19), where this
/// host has it (`deploy/postgres/install.sh N`; CI installs them all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_tables_are_the_servers() {
    let root = common::scratch("boundary-settings");
    for (major, _) in pgfleet_proto::settings::VERSIONS {
        let Some(dir) = pgfleet_proto::installs::find(*major) else {
            common::skip(&pgfleet_proto::installs::missing(*major));
            continue;
        };
        let mut spec = common::spec(&root, &format!("c{major}"), "64MB", Caps::default());
        spec.pg = pgfleet_agent::pgbin::PgBin::find(Some(&dir)).unwrap();
        let cl = Cluster::provision(&spec).await.unwrap();
        assert_eq!(cl.pg.major, *major);
        assert!(common::assert_settings_table_is_the_servers(&cl).await);
        cl.teardown().await.unwrap();
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// Every file of the agent's sources, as text (what its SQL is made of).
fn agent_sources() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push_str(&std::fs::read_to_string(&p).unwrap());
                out.push('\n');
            }
        }
    }
    let mut text = String::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut text,
    );
    text
}

/// The names the agent's SQL could call: every identifier written before
/// `(` and every run of operator characters in its sources (a superset:
/// the server's catalog narrows it to what exists).
fn called_names(src: &str) -> (Vec<String>, Vec<String>) {
    let mut funcs = std::collections::BTreeSet::new();
    let mut ops = std::collections::BTreeSet::new();
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let mut j = i;
            while j < b.len() && b[j] == b' ' {
                j += 1;
            }
            // (Longer than 63 bytes it is no catalog name: a Rust one.)
            if j < b.len() && b[j] == b'(' && i - start < 64 {
                funcs.insert(src[start..i].to_ascii_lowercase());
            }
            continue;
        }
        if b"+-*/<>=~!@#%^&|`?".contains(&c) {
            let start = i;
            while i < b.len() && b"+-*/<>=~!@#%^&|`?".contains(&b[i]) {
                i += 1;
            }
            ops.insert(src[start..i].to_string());
            continue;
        }
        i += 1;
    }
    (funcs.into_iter().collect(), ops.into_iter().collect())
}

/// The workload role plants, in `public`, a function for every catalog
/// function the agent's SQL names (each overload, plus better-matching
/// variants: text for regclass, integer for oid and bigint, varchar for
/// text) and an operator for every catalog operator it uses (plus
/// (oid, integer)-style variants), each recording who called it; it also
/// tries to put `public` first in the database's search path. Then every
/// kind runs on that cluster, and the kept-cluster inventory reads it:
/// nothing planted is ever called by the agent's superuser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_superuser_never_calls_what_the_workload_role_planted() {
    let root = common::scratch("boundary-planted");
    let cl = cluster(&root, false).await;
    // pgbench's tables first, handed to the workload role.
    let entry = json!({"kind": "pgbench", "scale": 1, "transactions": 1, "warmup_s": 0});
    common::run(&cl, &common::params(&entry.to_string()))
        .await
        .unwrap();
    let (funcs, ops) = called_names(&agent_sources());
    let su = cl.connect().await.unwrap();
    let w = cl.workload_server().connect().await.unwrap();
    w.batch_execute(
        "CREATE TABLE public.planted_calls (who text, what text);
         GRANT INSERT ON public.planted_calls TO PUBLIC;
         CREATE FUNCTION public.pgfleet_note(what text) RETURNS void LANGUAGE sql
           AS $$ INSERT INTO public.planted_calls VALUES (current_user, what) $$;",
    )
    .await
    .unwrap();
    // Each catalog overload of a named function, and its better matches.
    let rows = su
        .query(
            "SELECT p.proname::text, pg_catalog.oidvectortypes(p.proargtypes), pg_catalog.format_type(p.prorettype, NULL)
             FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f' AND NOT p.proretset
               AND p.proname = ANY($1) AND p.provariadic = 0
               AND NOT EXISTS (SELECT 1 FROM unnest(p.proargtypes::oid[] || p.prorettype) t(o)
                               JOIN pg_catalog.pg_type ty ON ty.oid = t.o WHERE ty.typtype = 'p')",
            &[&funcs],
        )
        .await
        .unwrap();
    let mut planted = 0;
    let mut made = std::collections::BTreeSet::new();
    for r in &rows {
        let (name, args, ret): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        let variants = [
            args.clone(),
            args.replace("regclass", "text"),
            args.replace("oid", "integer"),
            args.replace("bigint", "integer"),
            args.replace("text", "character varying"),
        ];
        for a in variants {
            if !made.insert((name.clone(), a.clone())) {
                continue;
            }
            let sql = format!(
                "CREATE FUNCTION public.\"{name}\"({a}) RETURNS {ret} LANGUAGE plpgsql AS \
                 $$BEGIN PERFORM public.pgfleet_note('function {name}({a})'); RETURN NULL; END$$"
            );
            if w.batch_execute(&sql).await.is_ok() {
                planted += 1;
            }
        }
    }
    assert!(
        planted > 50,
        "only {planted} functions planted from {} names",
        funcs.len()
    );
    // Each catalog operator the sources use, and (oid, integer)-style twins.
    let rows = su
        .query(
            "SELECT o.oprname::text, pg_catalog.format_type(o.oprleft, NULL), pg_catalog.format_type(o.oprright, NULL),
                    pg_catalog.format_type(o.oprresult, NULL)
             FROM pg_catalog.pg_operator o
             JOIN pg_catalog.pg_type l ON l.oid = o.oprleft JOIN pg_catalog.pg_type r ON r.oid = o.oprright
             JOIN pg_catalog.pg_type t ON t.oid = o.oprresult
             WHERE o.oprname = ANY($1) AND o.oprkind = 'b'
               AND l.typtype <> 'p' AND r.typtype <> 'p' AND t.typtype <> 'p'",
            &[&ops],
        )
        .await
        .unwrap();
    let mut operators = 0;
    let mut made = std::collections::BTreeSet::new();
    for (n, r) in rows.iter().enumerate() {
        let (op, left, right, ret): (String, String, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        for (i, (l, rt)) in [
            (left.clone(), right.clone()),
            (
                left.replace("oid", "integer"),
                right.replace("oid", "integer"),
            ),
            (
                left.clone(),
                right.replace("bigint", "integer").replace("oid", "integer"),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            if !made.insert((op.clone(), l.clone(), rt.clone())) {
                continue;
            }
            let f = format!("planted_op_{n}_{i}");
            let sql = format!(
                "CREATE FUNCTION public.{f}({l}, {rt}) RETURNS {ret} LANGUAGE plpgsql AS \
                 $$BEGIN PERFORM public.pgfleet_note('operator {op}({l}, {rt})'); RETURN NULL; END$$;
                 CREATE OPERATOR public.{op} (LEFTARG = {l}, RIGHTARG = {rt}, FUNCTION = public.{f})"
            );
            if w.batch_execute(&sql).await.is_ok() {
                operators += 1;
            }
        }
    }
    assert!(
        operators > 50,
        "only {operators} operators planted from {ops:?}"
    );
    // The database's own settings are not the workload role's to change.
    let e = w
        .batch_execute("ALTER DATABASE postgres SET search_path = public, pg_catalog")
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("must be owner"), "{e:?}");
    // Every kind's superuser steps on this cluster, and the inventory.
    for entry in [
        json!({"kind": "pgbench", "scale": 1, "transactions": 5, "warmup_s": 0}),
        json!({"kind": "vacuum-bloat", "scale": 1, "bloat_bytes": "4MiB"}),
        json!({"kind": "toast-slice", "storage_modes": ["external", "pglz"], "datasets": ["mixed"],
               "value_bytes": 100_000, "offsets": ["50%"], "duration_s": 0.2, "repeats": 1}),
        json!({"kind": "toast-probe", "probes": ["placement"], "storage_modes": ["external", "pglz"]}),
        json!({"kind": "read-write", "rows": 2000, "tests": ["seq-cold", "write"], "repeats": 1}),
        json!({"kind": "compression-analysis", "dataset": "pgbench", "scale": 1}),
        json!({"kind": "compression-analysis", "dataset": "json", "json_documents": 50}),
    ] {
        let params = pgfleet_proto::workload::plan_entry(&entry.to_string())
            .unwrap_or_else(|e| panic!("{entry}: {e}"))
            .remove(0)
            .1;
        common::run(&cl, &params)
            .await
            .unwrap_or_else(|e| panic!("{entry}: {e}"));
    }
    pgfleet_agent::keep::inventory(&cl).await.unwrap();
    // (Kinds restart the server: a new connection.)
    let calls: Vec<(String, String)> = common::sql(&cl)
        .await
        .query(
            "SELECT DISTINCT who, what FROM public.planted_calls WHERE who <> $1 LIMIT 20",
            &[&WORKLOAD_ROLE],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(
        calls.is_empty(),
        "the superuser called planted objects: {calls:?}"
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// Every superuser session starts with the pinned search path, whichever
/// client opens it: tokio-postgres, pgfleet's own driver (its wire client
/// sends the startup options), a standard tool given `conninfo()`; and the
/// workload role's own `ALTER ROLE … SET` does not change it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_superuser_session_starts_with_the_pinned_search_path() {
    let root = common::scratch("boundary-pinned");
    let cl = cluster(&root, false).await;
    let w = cl.workload_server().connect().await.unwrap();
    w.batch_execute("ALTER ROLE pgfleet_workload SET search_path = public, pg_catalog")
        .await
        .unwrap();
    let c = cl.connect().await.unwrap();
    let sp: String = c.query_one("SHOW search_path", &[]).await.unwrap().get(0);
    assert_eq!(sp.replace(" ", ""), "pg_catalog,pg_temp");
    let mut wire = pgfleet_agent::driver::wire::Conn::connect(&cl.pg_config())
        .await
        .unwrap();
    let rows = wire.simple_rows("SHOW search_path").await.unwrap();
    assert_eq!(
        rows[0].rows[0][0]
            .as_deref()
            .map(|s| s.replace(" ", ""))
            .as_deref(),
        Some("pg_catalog,pg_temp")
    );
    let psql = cl.pg.tool("psql");
    let out = std::process::Command::new(psql)
        .args(["-At", "-c", "SHOW search_path"])
        .arg(cl.conninfo())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim().replace(" ", ""),
        "pg_catalog,pg_temp",
        "{out:?}"
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
