//! pgfleet's script semantics against the real pgbench on a real cluster:
//! the reference values of proto/tests/data/pgbench_values.tsv are what
//! the installed pgbench prints with `debug()`, and a seeded run of a
//! script drawing from every random function, `permute` and the hashes
//! writes the same values per client under `driver: pgfleet` as under
//! `driver: pgbench`.

mod common;

use std::path::PathBuf;

use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::pgbin::PgBin;
use serde_json::json;

async fn cluster(name: &str) -> (Cluster, PathBuf) {
    let root = common::scratch(name);
    let spec = common::spec(&root, "c", "64MB", Caps::default());
    (Cluster::provision(&spec).await.unwrap(), root)
}

fn pg() -> PgBin {
    PgBin::find(
        std::env::var_os("PGFLEET_PG_BIN")
            .map(PathBuf::from)
            .as_deref(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_values_are_what_the_real_pgbench_prints() {
    let (cl, root) = cluster("pgbench-values").await;
    let cases: Vec<(String, String)> = include_str!("../../proto/tests/data/pgbench_values.tsv")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (e, v) = l.split_once('\t').unwrap();
            (e.to_string(), v.to_string())
        })
        .collect();
    // One script, one debug() per command: command N is case N-1.
    let mut script = String::new();
    for (e, _) in &cases {
        script.push_str(&format!("\\set x debug({e})\n"));
    }
    script.push_str("SELECT 1;\n");
    let (status, stderr) = pgbench_once(&cl, &root, &script, &[]).await;
    assert_eq!(status, Some(0), "{stderr}");
    let printed: Vec<(usize, String)> = stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split("command=").nth(1)?;
            let (n, v) = rest.split_once("): ")?;
            Some((n.parse().ok()?, v.to_string()))
        })
        .collect();
    assert_eq!(printed.len(), cases.len(), "{stderr}");
    for (n, value) in printed {
        let (expr, want) = &cases[n - 1];
        assert_eq!(&value, want, "pgbench prints `{value}` for {expr}");
    }
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// From a server log written with `log_statement = all` and
/// `log_line_prefix = '%c '`: each session's `aid` parameters of
/// select-only's statement, in order; the sessions sorted.
fn logged_aids(log: &str) -> Vec<Vec<String>> {
    let mut last: std::collections::HashMap<&str, bool> = Default::default();
    let mut aids: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for line in log.lines() {
        let Some((session, rest)) = line.split_once(' ') else {
            continue;
        };
        if rest.starts_with("LOG:  statement:") || rest.starts_with("LOG:  execute") {
            last.insert(
                session,
                rest.contains("SELECT abalance FROM pgbench_accounts"),
            );
        } else if let Some(p) = rest
            .strip_prefix("DETAIL:  parameters: $1 = '")
            // 18 capitalizes it.
            .or_else(|| rest.strip_prefix("DETAIL:  Parameters: $1 = '"))
            && last.get(session) == Some(&true)
        {
            aids.entry(session)
                .or_default()
                .push(p.trim_end_matches('\'').to_string());
        }
    }
    let mut out: Vec<Vec<String>> = aids.into_values().collect();
    out.sort();
    out
}

/// Runs `script` once through the real pgbench (`-n -t 1`, then `args`);
/// its exit status and standard error.
async fn pgbench_once(
    cl: &Cluster,
    root: &std::path::Path,
    script: &str,
    args: &[String],
) -> (Option<i32>, String) {
    let file = root.join("once.sql");
    std::fs::write(&file, script).unwrap();
    let out = tokio::process::Command::new(pg().tool("pgbench"))
        .args(["-n", "-t", "1"])
        .args(args)
        .arg("-f")
        .arg(&file)
        .arg(common::conninfo_public(cl))
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every random function, permute and the hashes, per client.
const DRAWS: &str = "\\set a random(1, 100000)
\\set b random_exponential(1, 1000, 2.5)
\\set c random_gaussian(1, 1000, 4)
\\set d random_zipfian(1, 1000, 1.07)
\\set e permute(:a, 100000)
\\set f hash(:a)
\\set g hash_fnv1a(:b, :random_seed)
\\set h random(-5, 5) * 0.5
INSERT INTO draws (client, a, b, c, d, e, f, g, h) VALUES (:client_id, :a, :b, :c, :d, :e, :f, :g, :h);
";

async fn draws(cl: &Cluster, driver: &str, script: &str) -> Vec<Vec<String>> {
    let c = common::sql(cl).await;
    c.batch_execute(
        "DROP TABLE IF EXISTS draws; CREATE TABLE draws (id bigserial, client int, a int8, b int8, \
         c int8, d int8, e int8, f int8, g int8, h float8)",
    )
    .await
    .unwrap();
    let params = common::copy_params(
        &json!({
            "kind": "pgbench", "scale": 1, "script_text": script, "clients": 3, "threads": 2,
            "transactions": 40, "warmup_s": 0, "seed": 20261201, "driver": driver,
        })
        .to_string(),
    );
    common::run(cl, &params).await.unwrap();
    c.query(
        "SELECT client::text, a::text, b::text, c::text, d::text, e::text, f::text, g::text, h::text \
         FROM draws ORDER BY client, id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (0..9).map(|i| r.get::<_, String>(i)).collect())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_run_draws_what_pgbench_draws_client_by_client() {
    let (cl, root) = cluster("pgbench-draws").await;
    let by_pgbench = draws(&cl, "pgbench", DRAWS).await;
    let by_pgfleet = draws(&cl, "pgfleet", DRAWS).await;
    assert_eq!(by_pgbench.len(), 3 * 40);
    assert_eq!(
        by_pgfleet, by_pgbench,
        "value by value, per client in order"
    );
    // The built-in scripts' draws too: tpcb-like's and simple-update's
    // history rows, each run's alone.
    let history = |script: &'static str, driver: &'static str| {
        let cl = &cl;
        async move {
            let c = common::sql(cl).await;
            c.batch_execute("TRUNCATE public.pgbench_history")
                .await
                .unwrap();
            let params = common::copy_params(
                &json!({
                    "kind": "pgbench", "scale": 1, "script": script, "clients": 2,
                    "transactions": 25, "warmup_s": 0, "seed": 7, "driver": driver,
                })
                .to_string(),
            );
            common::run(cl, &params).await.unwrap();
            let mut rows: Vec<String> = c
                .query(
                    "SELECT tid || ',' || bid || ',' || aid || ',' || delta FROM public.pgbench_history",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect();
            rows.sort();
            rows
        }
    };
    for script in ["tpcb-like", "simple-update"] {
        let a = history(script, "pgbench").await;
        let b = history(script, "pgfleet").await;
        assert_eq!(a.len(), 50, "{script}");
        assert_eq!(a, b, "{script}'s aid, bid, tid and delta");
    }
    // select-only writes nothing: its draws are read from the server's
    // statement log, each session's parameters in order.
    let c = common::sql(&cl).await;
    for set in [
        "ALTER SYSTEM SET log_statement = 'all'",
        "ALTER SYSTEM SET log_line_prefix = '%c '",
        "SELECT pg_reload_conf()",
    ] {
        c.batch_execute(set).await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut by = Vec::new();
    for driver in ["pgbench", "pgfleet"] {
        let log = cl.dir().join("postgres.log");
        let from = std::fs::metadata(&log).unwrap().len() as usize;
        let params = common::copy_params(
            &json!({
                "kind": "pgbench", "scale": 1, "script": "select-only", "clients": 2,
                "transactions": 25, "warmup_s": 0, "seed": 7, "driver": driver,
            })
            .to_string(),
        );
        common::run(&cl, &params).await.unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        by.push(logged_aids(&text[from..]));
    }
    assert_eq!(by[0].len(), 2, "{:?}", by[0]);
    assert!(by[0].iter().all(|s| s.len() == 25), "{:?}", by[0]);
    assert_eq!(by[1], by[0], "select-only's aids, client by client");
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// pgbench's SQL splitting and preparation, under both drivers: the same
/// end state. A DO body with semicolons, two statements on one line, a
/// temporary table used by the next statement (prepared when first run),
/// an E'' string with an escaped quote, an array slice, a compound `\;`
/// command, doubles written as pgbench writes them, `\\gset` with a
/// prefix, `\\aset` over a compound command, and an `\\if` chain.
const SPLITTING: &str = "\\set n 3
\\set d 0.1 + 0.2
CREATE TEMP TABLE IF NOT EXISTS tt (s text); TRUNCATE tt;
INSERT INTO tt VALUES (E'it\\'s; fine');
DO $$
BEGIN
  INSERT INTO results VALUES ('do; body');
END
$$;
INSERT INTO results SELECT s FROM tt;
INSERT INTO results SELECT ((ARRAY['a','b','c'])[2:3])::text;
INSERT INTO results VALUES (:n::text) \\; INSERT INTO results VALUES ('compound');
INSERT INTO results VALUES (:d::text), (-- a comment; not an end
  'after comment');
SELECT 40 + :n AS got, NULL AS nothing \\gset g_
INSERT INTO results VALUES ((:g_got + 1)::text);
\\; SELECT 6 AS i6 \\; SELECT 7 AS i7 \\; \\aset
INSERT INTO results VALUES ((:i6::int + :i7::int)::text);
\\if :client_id = 0
INSERT INTO results VALUES ('client zero');
\\elif :n > 2
INSERT INTO results VALUES ('other client');
\\else
INSERT INTO results VALUES ('never');
\\endif
";

/// Runs a pgbench cell (`entry`: its keys) into a fresh `results (v
/// text)` table and returns the rows, sorted.
async fn results(cl: &Cluster, entry: serde_json::Value) -> Vec<String> {
    let c = common::sql(cl).await;
    c.batch_execute("DROP TABLE IF EXISTS results; CREATE TABLE results (v text)")
        .await
        .unwrap();
    let mut keys = json!({"kind": "pgbench", "scale": 1, "warmup_s": 0});
    keys.as_object_mut()
        .unwrap()
        .extend(entry.as_object().unwrap().clone());
    common::run(cl, &common::copy_params(&keys.to_string()))
        .await
        .unwrap_or_else(|e| panic!("{keys}: {e}"));
    let mut rows: Vec<String> = c
        .query("SELECT v FROM results", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    rows.sort();
    rows
}

/// Each script (with `keys` added) fails one transaction with its message.
async fn refusals(cl: &Cluster, keys: serde_json::Value, cases: &[(&str, &str)]) {
    for (script, want) in cases {
        let mut entry = json!({"kind": "pgbench", "scale": 1, "script_text": script,
                               "transactions": 1, "warmup_s": 0});
        entry
            .as_object_mut()
            .unwrap()
            .extend(keys.as_object().unwrap().clone());
        let e = common::run(cl, &common::copy_params(&entry.to_string()))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{script:?}: {e}");
    }
}

async fn end_state(cl: &Cluster, driver: &str) -> Vec<String> {
    results(
        cl,
        json!({"script_text": SPLITTING, "clients": 2, "transactions": 3, "seed": 1, "driver": driver}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_split_and_prepare_as_pgbench_under_both_drivers() {
    let (cl, root) = cluster("pgbench-split").await;
    let by_pgbench = end_state(&cl, "pgbench").await;
    let by_pgfleet = end_state(&cl, "pgfleet").await;
    assert_eq!(by_pgbench.len(), 2 * 3 * 10, "{by_pgbench:?}");
    assert!(!by_pgfleet.iter().any(|v| v == "never"), "{by_pgfleet:?}");
    assert_eq!(by_pgfleet, by_pgbench);
    for want in [
        "do; body",
        "it's; fine",
        "{b,c}",
        "3",
        "compound",
        "0.3",
        "after comment",
    ] {
        assert!(
            by_pgfleet.iter().any(|v| v == want),
            "{want}: {by_pgfleet:?}"
        );
    }
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn driver_pgbench_takes_what_pgbench_takes_and_refuses_what_it_refuses() {
    let entry = |script: &str, driver: &str| {
        pgfleet_proto::workload::plan_entry(
            &json!({"kind": "pgbench", "scale": 1, "script_text": script, "driver": driver, "transactions": 1})
                .to_string(),
        )
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
    };
    // A text define is text under both drivers, as pgbench's -D has it.
    let text_define = |driver: &str| {
        pgfleet_proto::workload::plan_entry(
            &json!({"kind": "pgbench", "scale": 1, "script_text": "SELECT count(*) FROM :tbl;\n",
                    "driver": driver, "transactions": 1, "defines": {"tbl": "pgbench_branches"}})
            .to_string(),
        )
        .map(|_| ())
    };
    text_define("pgbench").unwrap();
    text_define("pgfleet").unwrap();
    // Judging a script runs nothing, even one allowed to run commands.
    let shell = "\\shell touch /tmp/pgfleet-must-not-exist\nSELECT 1;\n";
    let judged = pgfleet_proto::workload::plan_entry(
        &json!({"kind": "pgbench", "scale": 1, "script_text": shell, "driver": "pgbench",
                "transactions": 1, "allow_shell": true})
        .to_string(),
    );
    assert!(judged.is_ok(), "{judged:?}");
    assert!(!std::path::Path::new("/tmp/pgfleet-must-not-exist").exists());
    // What pgbench refuses is refused before anything starts, in its words.
    let e = entry("\\set x 1 +\nSELECT 1;\n", "pgbench").unwrap_err();
    assert!(
        e.contains("pgbench rejects the script") && e.contains("syntax error in command"),
        "{e}"
    );
}

/// Text in variables, as pgbench keeps it: `\\gset` stores a column's
/// text (NULL as the empty string), SQL gets it unchanged, an expression
/// reads it as a number; a text define likewise.
const TEXT_VARS: &str = "SELECT 'it''s text' AS t, 1.50 AS x, NULL AS n \\gset
\\set y :x * 2
INSERT INTO results VALUES (:t), (:x), (:n), (:y), (:d), ('[' || :d || ']');
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gset_keeps_text_and_refuses_what_pgbench_refuses() {
    let (cl, root) = cluster("pgbench-gset").await;
    let mut by = Vec::new();
    for driver in ["pgbench", "pgfleet"] {
        by.push(
            results(
                &cl,
                json!({"script_text": TEXT_VARS, "transactions": 1, "driver": driver,
                       "defines": {"d": "a define"}}),
            )
            .await,
        );
    }
    assert_eq!(by[1], by[0]);
    let want = ["", "1.50", "3", "[a define]", "a define", "it's text"];
    assert_eq!(by[1], want);
    refusals(
        &cl,
        json!({}),
        &[
            ("SELECT WHERE FALSE \\gset\n", "expected one row, got 0"),
            (
                "SELECT 5432 AS fail UNION SELECT 5433 ORDER BY 1 \\gset\n",
                "expected one row, got 2",
            ),
            (
                "DROP TABLE IF EXISTS no_such_table \\gset\n",
                "expected one row, got 0",
            ),
            ("SELECT 1 \\gset\n", "error storing into variable ?column?"),
            (
                "SELECT 1 AS \"bad name!\" \\gset\n",
                "error storing into variable bad name!",
            ),
            (
                "SELECT 'text' AS t \\gset\n\\set u :t + 1\n",
                "malformed variable \"t\" value: \"text\"",
            ),
            (
                "\\; SELECT 5432 AS i8 WHERE FALSE \\; \\aset\n\\set i debug(:i8)\n",
                "undefined variable \"i8\"",
            ),
        ],
    )
    .await;
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// `\\shell` and `\\setshell` run only when the scenario allows them, as
/// the cluster's OS user, under both drivers alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_commands_run_in_the_sandbox_only_when_allowed() {
    let script = "\\setshell uid id -u
\\setshell n echo :base
\\shell test $(id -u) -ne 0
\\set m :n + 1
INSERT INTO results VALUES (:uid::text), (:m::text);
";
    let entry = |driver: &str, allow: bool| {
        json!({
            "kind": "pgbench", "scale": 1, "script_text": script, "transactions": 2,
            "warmup_s": 0, "driver": driver, "allow_shell": allow, "defines": {"base": 41},
        })
        .to_string()
    };
    for driver in ["pgfleet", "pgbench"] {
        let e = pgfleet_proto::workload::plan_entry(&entry(driver, false)).unwrap_err();
        assert!(e.contains("allow_shell"), "{driver}: {e}");
    }
    let (cl, root) = cluster("pgbench-shell").await;
    // They run as a sandbox user: as root, a reserved uid of each
    // sandbox's own (not root, not PostgreSQL's user, not another cell's);
    // else the agent's own.
    let root_agent = nix::unistd::geteuid().is_root();
    let mut seen = Vec::new();
    for driver in ["pgfleet", "pgbench"] {
        let keys: serde_json::Value = serde_json::from_str(&entry(driver, true)).unwrap();
        let rows = results(&cl, keys).await;
        let (m, uids): (Vec<&String>, Vec<&String>) = rows.iter().partition(|r| *r == "42");
        assert_eq!(m.len(), 2, "{driver}: {rows:?}");
        assert_eq!(uids.len(), 2, "{driver}: {rows:?}");
        assert_eq!(uids[0], uids[1], "{driver}: one uid per cell: {rows:?}");
        let uid: u32 = uids[0].parse().unwrap();
        if root_agent {
            assert!(
                pgfleet_agent::sandbox::RESERVED_UIDS.contains(&uid),
                "{driver}: {uid}"
            );
            assert_ne!(Some(uid), cl.run_as().map(|u| u.uid));
        } else {
            assert_eq!(uid, nix::unistd::geteuid().as_raw(), "{driver}");
        }
        seen.push(uid);
    }
    if root_agent {
        assert_ne!(seen[0], seen[1], "two cells' sandboxes, two uids");
    }
    // pgbench's run-time refusals.
    refusals(
        &cl,
        json!({"allow_shell": true}),
        &[
            (
                "\\setshell x echo one\nSELECT 1;\n",
                "command must return an integer",
            ),
            ("\\shell false\nSELECT 1;\n", "meta-command failed"),
            (
                "\\shell echo ::foo :nosuchvariable\nSELECT 1;\n",
                "undefined variable \":nosuchvariable\"",
            ),
            (
                "\\setshell var no-such-command\nSELECT 1;\n",
                "could not read result",
            ),
        ],
    )
    .await;
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// Pipelines (\startpipeline .. \endpipeline): statements sent without
/// waiting, the same rows under both drivers, and pgbench's misuse errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_end_where_pgbench_s_end() {
    let script = "\\set n 7
\\startpipeline
INSERT INTO results VALUES ('first');
INSERT INTO results VALUES ((:n + 1)::text);
\\endpipeline
\\startpipeline
BEGIN;
INSERT INTO results VALUES ('in a transaction');
END;
\\endpipeline
";
    let (cl, root) = cluster("pgbench-pipeline").await;
    let mut by = Vec::new();
    for driver in ["pgbench", "pgfleet"] {
        by.push(
            results(
                &cl,
                json!({"script_text": script, "clients": 2, "transactions": 3, "driver": driver}),
            )
            .await,
        );
    }
    assert_eq!(by[0].len(), 2 * 3 * 3, "{:?}", by[0]);
    assert_eq!(by[1], by[0]);
    assert!(by[1].contains(&"8".to_string()));
    refusals(
        &cl,
        json!({}),
        &[
            (
                "\\startpipeline\n\\startpipeline\nSELECT 1;\n",
                "already in pipeline mode",
            ),
            ("\\endpipeline\nSELECT 1;\n", "not in pipeline mode"),
            (
                "\\startpipeline\nselect 1 \\gset f\n\\endpipeline\n",
                "gset is not allowed in pipeline mode",
            ),
            ("\\startpipeline\nSELECT 1;\n", "pipeline open"),
            (
                "\\startpipeline\nSELECT 1/0;\nSELECT 2;\n\\endpipeline\n",
                "division by zero",
            ),
        ],
    )
    .await;
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[path = "../../proto/tests/data/invalid_scripts.rs"]
mod invalid_scripts;

/// pgbench's invalid-script list, 73 of 73: each script fails under
/// `driver: pgfleet` where and as the real pgbench fails it (refused when
/// the scenario is validated for pgbench's status 1, failing the run for
/// its status 2), `driver: pgbench` refuses the same ones before running,
/// and the installed pgbench, run as the TAP test runs it, agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invalid_script_list_fails_as_pgbench_fails_it() {
    let (defines, cases) = invalid_scripts::cases();
    assert_eq!(cases.len(), 73);
    let (cl, root) = cluster("pgbench-invalid").await;
    let mut args = vec!["-M".to_string(), "prepared".to_string()];
    args.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    let mut failed = Vec::new();
    for case in &cases {
        let mut why = Vec::new();
        let lacks = |text: &str| case.expect.iter().any(|e| !text.contains(e.as_str()));
        // The real pgbench, with the TAP test's options.
        let (status, stderr) = pgbench_once(&cl, &root, &case.script, &args).await;
        if status != Some(i32::from(case.status)) || lacks(&stderr) {
            why.push(format!("pgbench: {status:?} {stderr}"));
        }
        // pgfleet, under both drivers.
        let entry = |driver: &str| {
            json!({
                "kind": "pgbench", "scale": 1, "script_text": case.script, "transactions": 1,
                "warmup_s": 0, "driver": driver, "defines": defines.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                "allow_shell": pgfleet_proto::script::may_run_shell(&case.script),
            })
            .to_string()
        };
        for driver in ["pgfleet", "pgbench"] {
            let planned = pgfleet_proto::workload::plan_entry(&entry(driver));
            match (case.status, planned) {
                (1, Ok(_)) => why.push(format!("{driver}: validation accepts it")),
                (1, Err(e)) if lacks(&e) => why.push(format!("{driver}: validation: {e}")),
                (2, Err(e)) => why.push(format!("{driver}: validation refuses it: {e}")),
                (2, Ok(_)) if driver == "pgfleet" => {
                    match common::run(&cl, &common::copy_params(&entry(driver))).await {
                        Ok(_) => why.push(format!("{driver}: the run succeeds")),
                        Err(e) if lacks(&e.to_string()) => why.push(format!("{driver}: run: {e}")),
                        Err(_) => {}
                    }
                }
                _ => {}
            }
        }
        if !why.is_empty() {
            failed.push(format!(
                "{} ({}):\n  {}",
                case.name,
                case.from,
                why.join("\n  ")
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases differ:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
