//! `pgbench-init`: the pgbench schema at scale S, with pgbench's row counts
//! and values (`pgbench -i -I dtGvp` semantics: drop, create tables,
//! server-side generate, vacuum analyze, primary keys), generated in
//! parallel over several connections and range-split, indexes built after.
//!
//! Row counts: branches = S, tellers = 10 S, accounts = 100,000 S, history
//! empty. `aid` is bigint from scale 20,000 up, as in pgbench.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use super::{CellContext, Output, Point};
use crate::{Error, Result};

/// pgbench's SCALE_32BIT_THRESHOLD.
pub const SCALE_BIGINT_THRESHOLD: u64 = 20_000;
const ACCOUNTS_PER_BRANCH: u64 = 100_000;
/// Rows per INSERT: the unit of work handed to a loading connection.
const BATCH: u64 = 100_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitParams {
    pub scale: u64,
    #[serde(default = "default_fillfactor")]
    pub fillfactor: u32,
    /// Range partitions of pgbench_accounts (0: not partitioned).
    #[serde(default)]
    pub partitions: u32,
    /// Loading connections (0: one per core).
    #[serde(default)]
    pub load_connections: u32,
}

fn default_fillfactor() -> u32 {
    100
}

#[derive(Debug, Clone)]
pub struct Loaded {
    pub rows: u64,
    pub seconds: f64,
}

pub fn run<'a>(ctx: &'a mut CellContext<'_>, params: &'a Json) -> BoxFuture<'a, Result<Output>> {
    async move {
        let p: InitParams = serde_json::from_value(params.clone()).map_err(|e| werr(format!("bad parameters: {e}")))?;
        let loaded = load(ctx, &p).await?;
        Ok(Output {
            points: vec![Point {
                params: json!({"scale": p.scale, "fillfactor": p.fillfactor, "partitions": p.partitions,
                               "load_connections": connections(&p)}),
                metrics: json!({"rows_loaded": loaded.rows, "load_seconds": loaded.seconds,
                                "rows_per_second": loaded.rows as f64 / loaded.seconds.max(1e-9)}),
            }],
        })
    }
    .boxed()
}

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "pgbench-init".into(),
        message,
    }
}

fn connections(p: &InitParams) -> u32 {
    if p.load_connections == 0 {
        crate::host::cores()
    } else {
        p.load_connections
    }
}

/// pgbench's DDL for scale `s`.
pub fn ddl(p: &InitParams) -> Vec<String> {
    let aid = if p.scale >= SCALE_BIGINT_THRESHOLD {
        "bigint"
    } else {
        "int"
    };
    let ff = format!(" WITH (fillfactor = {})", p.fillfactor);
    let mut v = vec![
        "DROP TABLE IF EXISTS pgbench_accounts, pgbench_branches, pgbench_history, pgbench_tellers"
            .to_string(),
        format!(
            "CREATE TABLE pgbench_history (tid int, bid int, aid {aid}, delta int, mtime timestamp, filler char(22))"
        ),
        format!(
            "CREATE TABLE pgbench_tellers (tid int NOT NULL, bid int, tbalance int, filler char(84)){ff}"
        ),
        format!(
            "CREATE TABLE pgbench_branches (bid int NOT NULL, bbalance int, filler char(88)){ff}"
        ),
    ];
    if p.partitions == 0 {
        v.push(format!("CREATE TABLE pgbench_accounts (aid {aid} NOT NULL, bid int, abalance int, filler char(84)){ff}"));
    } else {
        v.push(format!(
            "CREATE TABLE pgbench_accounts (aid {aid} NOT NULL, bid int, abalance int, filler char(84)) PARTITION BY RANGE (aid)"
        ));
        let n = p.scale * ACCOUNTS_PER_BRANCH;
        let parts = u64::from(p.partitions);
        let size = n.div_ceil(parts);
        for i in 1..=parts {
            let lo = if i == 1 {
                "MINVALUE".to_string()
            } else {
                ((i - 1) * size + 1).to_string()
            };
            let hi = if i == parts {
                "MAXVALUE".to_string()
            } else {
                (i * size + 1).to_string()
            };
            v.push(format!(
                "CREATE TABLE pgbench_accounts_{i} PARTITION OF pgbench_accounts FOR VALUES FROM ({lo}) TO ({hi}){ff}"
            ));
        }
    }
    v
}

/// Drops and creates the schema, loads it in parallel, vacuums, adds keys.
pub async fn load(ctx: &CellContext<'_>, p: &InitParams) -> Result<Loaded> {
    if p.scale == 0 {
        return Err(werr("scale must be at least 1".into()));
    }
    let started = Instant::now();
    let client = ctx.cluster.connect().await?;
    for stmt in ddl(p) {
        client.batch_execute(&stmt).await?;
    }
    client
        .batch_execute(&format!(
            "INSERT INTO pgbench_branches (bid, bbalance) SELECT bid, 0 FROM generate_series(1, {s}) AS bid;
             INSERT INTO pgbench_tellers (tid, bid, tbalance) SELECT tid, (tid - 1) / 10 + 1, 0 FROM generate_series(1, {t}) AS tid;",
            s = p.scale,
            t = 10 * p.scale
        ))
        .await?;
    let accounts = p.scale * ACCOUNTS_PER_BRANCH;
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let batches = accounts.div_ceil(BATCH);
    let mut workers = Vec::new();
    for _ in 0..connections(p) {
        let (next, done) = (next.clone(), done.clone());
        let conn = ctx.cluster.connect().await?;
        workers.push(async move {
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    return Ok::<_, Error>(());
                }
                let (lo, hi) = (b * BATCH + 1, ((b + 1) * BATCH).min(accounts));
                conn.batch_execute(&format!(
                    "INSERT INTO pgbench_accounts (aid, bid, abalance, filler) \
                     SELECT aid, (aid - 1) / {ACCOUNTS_PER_BRANCH} + 1, 0, '' FROM generate_series({lo}, {hi}) AS aid"
                ))
                .await?;
                done.fetch_add(hi - lo + 1, Ordering::Relaxed);
            }
        });
    }
    let load = futures::future::try_join_all(workers);
    tokio::pin!(load);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tokio::select! {
            r = &mut load => { r?; break; }
            _ = tick.tick() => {
                let d = done.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                let rate = d as f64 / secs.max(1e-9);
                let eta = if rate > 0.0 { (accounts - d) as f64 / rate } else { f64::NAN };
                ctx.progress("load", d, accounts, format!("{:.0} rows/s, ETA {eta:.0} s", rate));
            }
            _ = ctx.cancel.cancelled() => return Err(Error::Cancelled("cancelled while loading".into())),
        }
    }
    ctx.progress("load", accounts, accounts, "vacuum analyze");
    // pgbench's "v" step, then "p": primary keys, built in parallel.
    let tables = [
        "pgbench_branches",
        "pgbench_tellers",
        "pgbench_accounts",
        "pgbench_history",
    ];
    let mut vacs = Vec::new();
    for t in tables {
        let c = ctx.cluster.connect().await?;
        vacs.push(async move { c.batch_execute(&format!("VACUUM ANALYZE {t}")).await });
    }
    futures::future::try_join_all(vacs).await?;
    ctx.progress("load", accounts, accounts, "primary keys");
    let mut keys = Vec::new();
    for (t, k) in [
        ("pgbench_branches", "bid"),
        ("pgbench_tellers", "tid"),
        ("pgbench_accounts", "aid"),
    ] {
        let c = ctx.cluster.connect().await?;
        keys.push(async move {
            c.batch_execute(&format!("ALTER TABLE {t} ADD PRIMARY KEY ({k})"))
                .await
        });
    }
    futures::future::try_join_all(keys).await?;
    Ok(Loaded {
        rows: accounts + 11 * p.scale,
        seconds: started.elapsed().as_secs_f64(),
    })
}
