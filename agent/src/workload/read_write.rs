//! `read-write`: seeds/004's read and write tests on stock PostgreSQL
//! (what each test is: `pgfleet_proto::workload::read_write`). How:
//!
//! - the table is loaded in slices of 500,000 rows (progress), vacuumed
//!   (hint bits and the visibility map set, so later reads write nothing)
//!   and checkpointed; autovacuum is off for it;
//! - a sequential scan is `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of the
//!   article's `count(*) ... WHERE txt <> ...` on a fresh connection after
//!   `Cluster::make_cold` (restart + the database's files evicted) or
//!   `Cluster::restart` (after one unrecorded scan filled the OS cache);
//! - device bytes are the cluster's own (`Cluster::io_bytes`: as root, its
//!   own loop device under PGDATA, exact; else its block-I/O cgroup, which
//!   on cgroup v1 misses buffered writeback), never another cluster's;
//! - PostgreSQL's dirty-page writes come from `pg_stat_io` (16+) or
//!   `pg_stat_bgwriter` (checkpoint, clean and backend buffers), WAL bytes
//!   from `pg_current_wal_lsn()`;
//! - io_method (18+): `ALTER SYSTEM SET io_method`, applied by the restart
//!   each read test does anyway; a method the server refuses (io_uring
//!   without liburing or kernel support) is skipped with a sample saying
//!   why.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value as Json, json};
use tokio_postgres::Client;

use super::context::{CellContext, Output};
use super::drive;
use crate::{Error, Result};

use pgfleet_proto::workload::pgbench::{Define, DriveParams};
pub use pgfleet_proto::workload::read_write::{Metrics, Params, Point, PointParams};

const LOAD_SLICE: u64 = 500_000;
const SCAN: &str = "SELECT count(*) FROM test_table WHERE txt <> 'no such string'";

pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a Params) -> BoxFuture<'a, Result<Output>> {
    async move {
        let client = ctx.cluster.connect_own().await?;
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await?
            .get(0);
        if !p.io_methods.is_empty() && version < 180000 {
            return Err(werr(format!(
                "io_methods needs PostgreSQL 18 or later; this server is {}: remove io_methods or run PostgreSQL 18",
                version_text(version)
            )));
        }
        // The table: loaded or restored before the workload runs.
        ctx.loaded()?;
        drop(client);
        let methods: Vec<String> = if p.io_methods.is_empty() {
            vec!["default".into()]
        } else {
            p.io_methods.clone()
        };
        let mut points = Vec::new();
        for method in &methods {
            let reads: Vec<&String> = p.tests.iter().filter(|t| *t != "write").collect();
            if reads.is_empty() {
                break;
            }
            if let Err(why) = set_io_method(ctx, version, method).await {
                ctx.sample("skipped", &json!({"io_method": method, "why": why})).await?;
                ctx.progress("read", 0, 1, format!("io_method {method} skipped: {why}"));
                continue;
            }
            for test in reads {
                ctx.check_cancel()?;
                let m = match test.as_str() {
                    "seq-cold" => seq_scan(ctx, p, true).await?,
                    "seq-os-cache" => seq_scan(ctx, p, false).await?,
                    _ => random_read(ctx, p).await?,
                };
                let pt = point(p, test, method, m);
                ctx.sample("test", &pt).await?;
                points.push(pt);
            }
        }
        if p.tests.iter().any(|t| t == "write") {
            if methods.iter().any(|m| m != "default") {
                set_io_method(ctx, version, "default").await.map_err(werr)?;
            }
            let pt = point(p, "write", "default", write(ctx, p).await?);
            ctx.sample("test", &pt).await?;
            points.push(pt);
        }
        Ok(Output::of(&points))
    }
    .boxed()
}

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "read-write".into(),
        message,
    }
}

fn version_text(v: i32) -> String {
    format!("{}.{}", v / 10000, v % 10000)
}

fn point(p: &Params, test: &str, method: &str, metrics: Metrics) -> Point {
    Point {
        params: PointParams {
            test: test.into(),
            io_method: method.into(),
            rows: p.rows,
        },
        metrics,
    }
}

/// The article's test_table, loaded in slices, vacuumed, checkpointed:
/// the kind's dataset (`workload::load`).
pub async fn load(ctx: &CellContext<'_>, p: &Params) -> Result<super::context::Loaded> {
    let client = ctx.cluster.connect_own().await?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS test_table; \
             CREATE TABLE test_table (id serial PRIMARY KEY, col1 integer, txt varchar) WITH (autovacuum_enabled = false)",
        )
        .await?;
    let started = Instant::now();
    let mut done = 0;
    while done < p.rows {
        ctx.check_cancel()?;
        let to = (done + LOAD_SLICE).min(p.rows);
        client
            .execute(
                "INSERT INTO test_table (col1, txt) SELECT i::int, repeat(md5(i::text), 15) FROM generate_series($1::bigint, $2::bigint) i",
                &[&(done as i64 + 1), &(to as i64)],
            )
            .await?;
        done = to;
        let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
        ctx.progress("load", done, p.rows, format!("{rate:.0} rows/s"));
    }
    let insert_s = started.elapsed().as_secs_f64();
    client.batch_execute("VACUUM (ANALYZE) test_table").await?;
    client.batch_execute("CHECKPOINT").await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(super::context::Loaded {
        rows_loaded: p.rows,
        load_seconds: seconds,
        rows_per_second: p.rows as f64 / seconds.max(1e-9),
        load_step_seconds: [
            ("insert".to_string(), insert_s),
            ("vacuum_checkpoint".to_string(), seconds - insert_s),
        ]
        .into(),
        load_method: "insert".into(),
        load_method_note: String::new(),
    })
}

/// Sets io_method for the next start (`default`: the server's own).
/// Err: why the server refused it.
async fn set_io_method(
    ctx: &CellContext<'_>,
    version: i32,
    method: &str,
) -> std::result::Result<(), String> {
    let client = ctx.cluster.connect_own().await.map_err(|e| e.to_string())?;
    let sql = if method == "default" {
        "ALTER SYSTEM RESET io_method".to_string()
    } else {
        format!("ALTER SYSTEM SET io_method = '{method}'")
    };
    if version < 180000 {
        return Ok(());
    }
    client.batch_execute(&sql).await.map_err(|e| {
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string())
    })?;
    drop(client);
    // Applied by a restart; a server that cannot start with it is put back.
    let restarted = ctx.cluster.restart().await;
    if restarted.is_ok() && method != "default" {
        let c = ctx.cluster.connect_own().await.map_err(|e| e.to_string())?;
        let now: String = c
            .query_one("SHOW io_method", &[])
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        if now != method {
            return Err(format!(
                "the server runs with io_method {now} after asking for {method}"
            ));
        }
    }
    if let Err(e) = restarted {
        let why = e.to_string();
        if method != "default" {
            let auto = ctx.cluster.data_dir().join("postgresql.auto.conf");
            let kept: String = std::fs::read_to_string(&auto)
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.trim_start().starts_with("io_method"))
                .map(|l| format!("{l}\n"))
                .collect();
            let _ = std::fs::write(&auto, kept);
            ctx.cluster.restart().await.map_err(|e| e.to_string())?;
        }
        return Err(why);
    }
    Ok(())
}

/// EXPLAIN ANALYZE of the scan: (execution ms, I/O read ms, hit, read).
async fn explain_scan(client: &Client) -> Result<(f64, f64, f64, f64)> {
    let doc: Json = client
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {SCAN}"),
            &[],
        )
        .await?
        .get(0);
    let top = &doc[0];
    let plan = &top["Plan"];
    let f = |k: &str| plan[k].as_f64().unwrap_or(0.0);
    // PostgreSQL 17 renamed "I/O Read Time" to "Shared I/O Read Time".
    let io = plan
        .get("Shared I/O Read Time")
        .or_else(|| plan.get("I/O Read Time"))
        .and_then(|v| v.as_f64())
        .unwrap_or(0.0);
    Ok((
        top["Execution Time"].as_f64().unwrap_or(f64::NAN),
        io,
        f("Shared Hit Blocks"),
        f("Shared Read Blocks"),
    ))
}

async fn seq_scan(ctx: &CellContext<'_>, p: &Params, cold: bool) -> Result<Metrics> {
    if !cold {
        // One unrecorded scan brings the table into the OS page cache.
        ctx.cluster.connect_own().await?.batch_execute(SCAN).await?;
    }
    let mut runs = Vec::new();
    let mut evicted = 0;
    let (mut dev_read, mut accounted) = (0u64, true);
    for r in 0..p.repeats {
        ctx.check_cancel()?;
        let what = if cold { "seq-cold" } else { "seq-os-cache" };
        ctx.progress(
            what,
            r as u64,
            p.repeats as u64,
            format!("{what} {}/{}", r + 1, p.repeats),
        );
        if cold {
            evicted = ctx.cluster.make_cold().await?;
        } else {
            ctx.cluster.restart().await?;
        }
        let client = ctx.cluster.connect_own().await?;
        let before = ctx.cluster.io_bytes();
        runs.push(explain_scan(&client).await?);
        match (before, ctx.cluster.io_bytes()) {
            (Some(b), Some(a)) => dev_read += a.0.saturating_sub(b.0),
            _ => accounted = false,
        }
    }
    let n = runs.len() as f64;
    let mean = |f: fn(&(f64, f64, f64, f64)) -> f64| runs.iter().map(f).sum::<f64>() / n;
    Ok(Metrics {
        table_bytes: p.table_bytes(),
        execution_ms: Some(mean(|r| r.0)),
        io_read_ms: Some(mean(|r| r.1)),
        shared_hit: Some(mean(|r| r.2)),
        shared_read: Some(mean(|r| r.3)),
        executions_ms: runs.iter().map(|r| r.0).collect(),
        device_read_bytes: accounted.then(|| dev_read / p.repeats as u64),
        evicted_bytes: cold.then_some(evicted),
        device_source: ctx.cluster.device_source().map(String::from),
        ..Metrics::default()
    })
}

async fn random_read(ctx: &CellContext<'_>, p: &Params) -> Result<Metrics> {
    let evicted = ctx.cluster.make_cold().await?;
    let drive = DriveParams {
        script: "random-read".into(),
        script_text: Some(
            "\\set id random(1, :rows)\nSELECT txt FROM test_table WHERE id = :id;\n".into(),
        ),
        clients: p.random_clients,
        threads: p.random_threads,
        duration_s: Some(p.random_duration_s),
        transactions: None,
        warmup_s: 0.0,
        rate: None,
        latency_limit_ms: None,
        max_tries: 1,
        defines: BTreeMap::from([("rows".to_string(), Define::Int(p.rows as i64))]),
        seed: None,
        driver: "pgfleet".into(),
        allow_shell: false,
        faults: Vec::new(),
        until_steady: false,
    };
    let before = ctx.cluster.io_bytes();
    let drive::Driven {
        result, internals, ..
    } = drive::drive(ctx, &ctx.cluster.own_server(), &drive, 0).await?;
    let dev = match (before, ctx.cluster.io_bytes()) {
        (Some(b), Some(a)) => Some(a.0.saturating_sub(b.0)),
        _ => None,
    };
    let mean_ms = result.histogram.mean() / 1000.0;
    Ok(Metrics {
        table_bytes: p.table_bytes(),
        tps: Some(result.tps()),
        latency_ms_mean: Some(mean_ms),
        latency_ms_p99: Some(result.latency_ms(0.99)),
        page_read_ms_avg: internals.page_read_ms_avg,
        blocks_read: internals.blocks_read,
        device_read_bytes: dev,
        evicted_bytes: Some(evicted),
        device_source: ctx.cluster.device_source().map(String::from),
        ..Metrics::default()
    })
}

/// 8 KiB pages PostgreSQL has written out so far (all writers), and the
/// WAL position.
async fn writes_so_far(client: &Client, version: i32) -> Result<(u64, u64)> {
    // pg_stat_io counts writes by operation from 16; 18 gives their bytes
    // (`write_bytes`) where 16 and 17 give `op_bytes` per operation.
    let io_query = if version >= 180000 {
        Some(
            "SELECT coalesce(sum(write_bytes) / 8192, 0)::bigint FROM pg_stat_io WHERE object = 'relation'",
        )
    } else if version >= 160000 {
        Some(
            "SELECT coalesce(sum(writes * op_bytes) / 8192, 0)::bigint FROM pg_stat_io WHERE object = 'relation'",
        )
    } else {
        None
    };
    let pages: i64 = if let Some(q) = io_query {
        client.query_one(q, &[]).await?.get(0)
    } else {
        client
            .query_one(
                "SELECT (buffers_checkpoint + buffers_clean + buffers_backend)::bigint FROM pg_stat_bgwriter",
                &[],
            )
            .await?
            .get(0)
    };
    let lsn: i64 = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
            &[],
        )
        .await?
        .get(0);
    Ok((pages as u64, lsn as u64))
}

async fn write(ctx: &CellContext<'_>, p: &Params) -> Result<Metrics> {
    let client = ctx.cluster.connect_own().await?;
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0);
    client.batch_execute("CHECKPOINT").await?;
    // Statistics are flushed by each process now and then: a settled start.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let (pages0, lsn0) = writes_so_far(&client, version).await?;
    let io0 = ctx.cluster.io_bytes();
    ctx.progress("write", 0, 2, "UPDATE every row");
    let t = Instant::now();
    client
        .execute("UPDATE test_table SET txt = txt || '.'", &[])
        .await?;
    let update_s = t.elapsed().as_secs_f64();
    let io1 = ctx.cluster.io_bytes();
    ctx.progress("write", 1, 2, "CHECKPOINT");
    let t = Instant::now();
    client.batch_execute("CHECKPOINT").await?;
    let checkpoint_s = t.elapsed().as_secs_f64();
    let io2 = ctx.cluster.io_bytes();
    // The checkpointer's and the backends' counters reach the views when
    // they report them (at least once a second while active).
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let (pages1, lsn1) = writes_so_far(&client, version).await?;
    let dirty = (pages1 - pages0) * 8192;
    let wal = lsn1 - lsn0;
    let dev = match (io0, io2) {
        (Some(a), Some(b)) => Some(b.1.saturating_sub(a.1)),
        _ => None,
    };
    let dev_ckpt = match (io1, io2) {
        (Some(a), Some(b)) => Some(b.1.saturating_sub(a.1)),
        _ => None,
    };
    Ok(Metrics {
        table_bytes: p.table_bytes(),
        update_seconds: Some(update_s),
        checkpoint_seconds: Some(checkpoint_s),
        device_write_bytes: dev,
        device_write_bytes_checkpoint: dev_ckpt,
        dirty_page_bytes: Some(dirty),
        wal_bytes: Some(wal),
        write_amplification: dev.map(|d| d as f64 / p.table_bytes().max(1) as f64),
        device_vs_postgres: dev.map(|d| d as f64 / (dirty + wal).max(1) as f64),
        device_source: ctx.cluster.device_source().map(String::from),
        ..Metrics::default()
    })
}
