//! `pgbench-init`: the pgbench schema at scale S, with pgbench's row counts
//! and values (`pgbench -i -I dtGvp` semantics: drop, create tables,
//! server-side generate, vacuum analyze, primary keys), generated in
//! parallel over several connections and range-split, indexes built after.
//!
//! Row counts: branches = S, tellers = 10 S, accounts = 100,000 S, history
//! empty. `aid` is bigint from scale 20,000 up, as in pgbench.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::context::{CellContext, Output};
use crate::cluster::Server;
use crate::{Error, Result};

use pgfleet_proto::workload::Point;
pub use pgfleet_proto::workload::pgbench_init::{
    ACCOUNTS_PER_BRANCH, InitParams, LoadMethod, Metrics, SCALE_BIGINT_THRESHOLD,
};

#[derive(Debug, Clone)]
pub struct Loaded {
    pub rows: u64,
    pub seconds: f64,
    /// Seconds per step, as pgbench -i reports them: schema, generate
    /// (COPY), vacuum, primary keys; a direct load's: schema, write,
    /// restart, vacuum.
    pub steps: Vec<(&'static str, f64)>,
    /// How it was loaded, and why not as asked ("" when it was).
    pub method: LoadMethod,
    pub note: String,
}

impl Loaded {
    /// The load's figures, as every kind that loads reports them.
    pub fn metrics(&self) -> Metrics {
        Metrics {
            rows_loaded: self.rows,
            load_seconds: self.seconds,
            rows_per_second: self.rows as f64 / self.seconds.max(1e-9),
            load_step_seconds: self
                .steps
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            load_method: self.method.name().to_string(),
            load_method_note: self.note.clone(),
        }
    }
}

pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a InitParams) -> BoxFuture<'a, Result<Output>> {
    async move {
        let loaded = load(ctx, p).await?;
        let params = InitParams {
            load_connections: connections(p),
            ..p.clone()
        };
        Ok(Output::of(&[Point {
            params,
            metrics: loaded.metrics(),
        }]))
    }
    .boxed()
}

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "pgbench-init".into(),
        message,
    }
}

/// The loading connections: as asked, or by default what measured fastest
/// for the layout (BENCHMARKS.md, "Loader"): one per core over the
/// partitions (each loaded with COPY FREEZE), and one for a flat table —
/// its only way to COPY FREEZE, without which the vacuum after must touch
/// every page, a cost that grows with the table (two connections were 0.6-
/// 0.8x `pgbench -i` at scale 300).
fn connections(p: &InitParams) -> u32 {
    match (p.load_connections, p.partitions) {
        (0, 0) => 1,
        (0, parts) => crate::host::cores().min(parts).max(1),
        (n, _) => n,
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
        "DROP TABLE IF EXISTS public.pgbench_accounts, public.pgbench_branches, public.pgbench_history, public.pgbench_tellers"
            .to_string(),
        format!(
            "CREATE TABLE public.pgbench_history (tid int, bid int, aid {aid}, delta int, mtime timestamp, filler char(22))"
        ),
        format!(
            "CREATE TABLE public.pgbench_tellers (tid int NOT NULL, bid int, tbalance int, filler char(84)){ff}"
        ),
        format!(
            "CREATE TABLE public.pgbench_branches (bid int NOT NULL, bbalance int, filler char(88)){ff}"
        ),
    ];
    if p.partitions == 0 {
        v.push(format!("CREATE TABLE public.pgbench_accounts (aid {aid} NOT NULL, bid int, abalance int, filler char(84)){ff}"));
    } else {
        v.push(format!(
            "CREATE TABLE public.pgbench_accounts (aid {aid} NOT NULL, bid int, abalance int, filler char(84)) PARTITION BY RANGE (aid)"
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
                "CREATE TABLE public.pgbench_accounts_{i} PARTITION OF public.pgbench_accounts FOR VALUES FROM ({lo}) TO ({hi}){ff}"
            ));
        }
    }
    v
}

/// One COPY of a contiguous `aid` range into `table` (the accounts table
/// or one of its partitions). `freeze`: the table is truncated in the same
/// transaction and loaded with `COPY ... FREEZE`, so its rows are written
/// frozen and visible and the vacuum after has nothing to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub table: String,
    pub lo: u64,
    pub hi: u64,
    pub freeze: bool,
}

/// How pgbench_accounts is split over `conns` loading connections.
///
/// - partitioned: one unit per partition, each `COPY FREEZE` (a partition
///   truncated in its own transaction), partitions shared out over the
///   connections;
/// - one connection: the whole table in one `COPY FREEZE` (pgbench's way);
/// - several connections: one range per connection, plain `COPY` (FREEZE
///   needs the table truncated in the loading transaction, which only one
///   connection can do), and the vacuum after sets the visibility map.
pub fn plan(p: &InitParams, conns: u32) -> Vec<Unit> {
    let n = p.scale * ACCOUNTS_PER_BRANCH;
    let split = |parts: u64, table: &dyn Fn(u64) -> String, freeze: bool| {
        let size = n.div_ceil(parts);
        (0..parts)
            .map(|i| Unit {
                table: table(i + 1),
                lo: i * size + 1,
                hi: ((i + 1) * size).min(n),
                freeze,
            })
            .filter(|u| u.lo <= u.hi)
            .collect()
    };
    if p.partitions > 0 {
        split(
            u64::from(p.partitions),
            &|i| format!("public.pgbench_accounts_{i}"),
            true,
        )
    } else {
        split(
            u64::from(conns.max(1)),
            &|_| "public.pgbench_accounts".to_string(),
            conns <= 1,
        )
    }
}

/// COPY text of accounts `lo..=hi` as pgbench writes it: aid, bid, abalance
/// 0 and an empty filler (blank-padded by char(84)).
fn account_rows(lo: u64, hi: u64, out: &mut bytes::BytesMut) {
    use std::fmt::Write as _;
    for aid in lo..=hi {
        let _ = writeln!(out, "{aid}\t{}\t0\t", (aid - 1) / ACCOUNTS_PER_BRANCH + 1);
    }
}

/// Rows per COPY message.
const CHUNK: u64 = 10_000;

async fn copy_unit(c: &tokio_postgres::Client, u: &Unit, done: &AtomicU64) -> Result<()> {
    use futures::SinkExt;
    if u.freeze {
        c.batch_execute(&format!("BEGIN; TRUNCATE {}", u.table))
            .await?;
    }
    let freeze = if u.freeze { " (FREEZE)" } else { "" };
    let sink = c
        .copy_in::<_, bytes::Bytes>(&format!(
            "COPY {} (aid, bid, abalance, filler) FROM STDIN{freeze}",
            u.table
        ))
        .await?;
    futures::pin_mut!(sink);
    let mut buf = bytes::BytesMut::with_capacity(CHUNK as usize * 24);
    let mut lo = u.lo;
    while lo <= u.hi {
        let hi = (lo + CHUNK - 1).min(u.hi);
        account_rows(lo, hi, &mut buf);
        sink.send(buf.split().freeze()).await?;
        done.fetch_add(hi - lo + 1, Ordering::Relaxed);
        lo = hi + 1;
    }
    sink.as_mut().finish().await?;
    if u.freeze {
        c.batch_execute("COMMIT").await?;
    }
    Ok(())
}

/// Loads `units` over the connections, each taking the next unit when free.
async fn copy_all(
    conns: &[tokio_postgres::Client],
    units: &[Unit],
    done: &AtomicU64,
) -> Result<()> {
    let next = AtomicU64::new(0);
    let next = &next;
    futures::future::try_join_all(conns.iter().map(|c| async move {
        while let Some(u) = units.get(next.fetch_add(1, Ordering::Relaxed) as usize) {
            copy_unit(c, u, done).await?;
        }
        Ok::<_, Error>(())
    }))
    .await?;
    Ok(())
}

/// Runs the statements over the connections, each taking the next when free.
async fn sql_all(conns: &[tokio_postgres::Client], stmts: &[String]) -> Result<()> {
    let next = AtomicU64::new(0);
    let next = &next;
    futures::future::try_join_all(conns.iter().map(|c| async move {
        while let Some(sql) = stmts.get(next.fetch_add(1, Ordering::Relaxed) as usize) {
            c.batch_execute(sql).await?;
        }
        Ok::<_, Error>(())
    }))
    .await?;
    Ok(())
}

/// Drops and creates the schema in the cell's cluster, loads it in
/// parallel, vacuums, adds keys.
pub async fn load(ctx: &CellContext<'_>, p: &InitParams) -> Result<Loaded> {
    crate::failpoint::hit("load")?;
    use tracing::Instrument;
    load_unspanned(ctx, &ctx.cluster.server(), p)
        .instrument(super::context::phase("load"))
        .await
}

async fn load_unspanned(ctx: &CellContext<'_>, server: &Server, p: &InitParams) -> Result<Loaded> {
    if p.scale == 0 {
        return Err(werr("scale must be at least 1".into()));
    }
    let started = Instant::now();
    let client = server.connect().await?;
    let mut note = String::new();
    if p.load_method == LoadMethod::Direct {
        ctx.progress("load", 0, 1, "checking this build's page layout");
        match crate::direct::check::verdict(ctx.cluster, &client).await? {
            Ok(()) => return direct_load(ctx, &client, p, started).await,
            Err(why) => {
                note =
                    format!("this PostgreSQL build refused a direct load ({why}): loaded by copy");
                tracing::warn!(target: "pgfleet", cell = %ctx.cell_id, "{note}");
            }
        }
    }
    let mut loaded = copy_load(ctx, server, &client, p, started).await?;
    loaded.note = note;
    Ok(loaded)
}

/// pgbench's DDL and the small tables (branches and tellers, a row per
/// scale unit and ten: INSERTed either way).
async fn schema(client: &tokio_postgres::Client, p: &InitParams) -> Result<()> {
    for stmt in ddl(p) {
        client.batch_execute(&stmt).await?;
    }
    client
        .batch_execute(&format!(
            "INSERT INTO public.pgbench_branches (bid, bbalance) SELECT bid, 0 FROM generate_series(1, {s}) AS bid;
             INSERT INTO public.pgbench_tellers (tid, bid, tbalance) SELECT tid, (tid - 1) / 10 + 1, 0 FROM generate_series(1, {t}) AS tid;",
            s = p.scale,
            t = 10 * p.scale
        ))
        .await?;
    Ok(())
}

/// The accounts tables: the flat table, or each partition.
fn accounts_tables(p: &InitParams) -> Vec<String> {
    if p.partitions > 0 {
        (1..=p.partitions)
            .map(|i| format!("public.pgbench_accounts_{i}"))
            .collect()
    } else {
        vec!["public.pgbench_accounts".into()]
    }
}

/// pgbench's "v" step: every table vacuumed and analyzed (partitions in
/// parallel, then one ANALYZE of the parent for its statistics).
async fn vacuum_analyze(
    conns: &[tokio_postgres::Client],
    client: &tokio_postgres::Client,
    p: &InitParams,
) -> Result<()> {
    let analyze = if p.partitions > 0 { "" } else { " ANALYZE" };
    let vacuum: Vec<String> = accounts_tables(p)
        .iter()
        .map(|t| format!("VACUUM{analyze} {t}"))
        .chain(
            [
                "public.pgbench_branches",
                "public.pgbench_tellers",
                "public.pgbench_history",
            ]
            .map(|t| format!("VACUUM ANALYZE {t}")),
        )
        .collect();
    sql_all(conns, &vacuum).await?;
    if p.partitions > 0 {
        client
            .batch_execute("ANALYZE public.pgbench_accounts")
            .await?;
    }
    Ok(())
}

/// The primary keys: each accounts table's, branches', tellers', then the
/// partitioned parent's (which adopts its partitions' keys).
async fn primary_keys(
    conns: &[tokio_postgres::Client],
    client: &tokio_postgres::Client,
    p: &InitParams,
) -> Result<()> {
    let mut keys: Vec<String> = accounts_tables(p)
        .iter()
        .map(|t| format!("ALTER TABLE {t} ADD PRIMARY KEY (aid)"))
        .collect();
    keys.push("ALTER TABLE public.pgbench_branches ADD PRIMARY KEY (bid)".into());
    keys.push("ALTER TABLE public.pgbench_tellers ADD PRIMARY KEY (tid)".into());
    sql_all(conns, &keys).await?;
    if p.partitions > 0 {
        client
            .batch_execute("ALTER TABLE public.pgbench_accounts ADD PRIMARY KEY (aid)")
            .await?;
    }
    Ok(())
}

/// `load_method: direct`: the schema and its keys on empty tables, a clean
/// stop, pgbench_accounts' files written by the agent (`crate::direct`),
/// the server started again, then pgbench's VACUUM ANALYZE (every page is
/// all-frozen: it records the free space map and the statistics).
async fn direct_load(
    ctx: &CellContext<'_>,
    client: &tokio_postgres::Client,
    p: &InitParams,
    started: Instant,
) -> Result<Loaded> {
    use crate::direct;
    schema(client, p).await?;
    primary_keys(std::slice::from_ref(client), client, p).await?;
    let layout = direct::layout(client).await?;
    let bigint = p.scale >= SCALE_BIGINT_THRESHOLD;
    let mut targets = Vec::new();
    // plan() with one connection: the whole flat table, or one unit per
    // partition in partition order.
    for (t, u) in accounts_tables(p).iter().zip(plan(p, 1)) {
        let accounts = direct::pages::Accounts {
            lo: u.lo,
            hi: u.hi,
            bigint,
            fillfactor: p.fillfactor,
        };
        targets.push(direct::target(client, t, accounts).await?);
    }
    client.batch_execute("CHECKPOINT").await?;
    let schema_s = started.elapsed().as_secs_f64();
    ctx.progress("load", 0, 1, "stopping the server to write its files");
    let cluster = ctx.cluster;
    cluster.pause().await?;
    let progress = std::sync::Arc::new(direct::Progress::default());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let write = {
        let (data, owner) = (cluster.data_dir().to_path_buf(), cluster.run_as().cloned());
        let (progress, stop, targets) = (progress.clone(), stop.clone(), targets.clone());
        let threads = crate::host::cores() as usize;
        tokio::task::spawn_blocking(move || {
            direct::write(
                &data,
                owner.as_ref(),
                layout,
                &targets,
                threads,
                &progress,
                &stop,
            )
        })
    };
    tokio::pin!(write);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    let write_started = Instant::now();
    let bytes = loop {
        tokio::select! {
            r = &mut write => {
                break r.map_err(|e| werr(format!("the direct writer failed: {e}")))??;
            }
            _ = tick.tick() => {
                let (done, total) = (progress.pages.load(Ordering::Relaxed), progress.total.load(Ordering::Relaxed));
                let secs = write_started.elapsed().as_secs_f64().max(1e-9);
                ctx.progress("load", done, total.max(1), format!(
                    "writing files directly: {:.0} MB/s", done as f64 * 8192.0 / secs / 1e6
                ));
            }
            _ = ctx.cancel.cancelled() => {
                stop.store(true, Ordering::Relaxed);
                let _ = (&mut write).await;
                return Err(Error::Cancelled("cancelled while writing the tables' files".into()));
            }
        }
    };
    let write_s = started.elapsed().as_secs_f64() - schema_s;
    cluster.resume().await?;
    let restart_s = started.elapsed().as_secs_f64() - schema_s - write_s;
    ctx.progress("load", 1, 1, "vacuum analyze");
    let client = cluster.server().connect().await?;
    let mut conns = Vec::new();
    for _ in 0..crate::host::cores().min(p.partitions.max(1)) {
        conns.push(cluster.server().connect().await?);
    }
    vacuum_analyze(&conns, &client, p).await?;
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(target: "pgfleet", cell = %ctx.cell_id, bytes, seconds = write_s, "wrote pgbench_accounts directly");
    Ok(Loaded {
        rows: p.scale * ACCOUNTS_PER_BRANCH + 11 * p.scale,
        seconds,
        steps: vec![
            ("schema", schema_s),
            ("write", write_s),
            ("restart", restart_s),
            ("vacuum", seconds - schema_s - write_s - restart_s),
        ],
        method: LoadMethod::Direct,
        note: String::new(),
    })
}

async fn copy_load(
    ctx: &CellContext<'_>,
    server: &Server,
    client: &tokio_postgres::Client,
    p: &InitParams,
    started: Instant,
) -> Result<Loaded> {
    schema(client, p).await?;
    let schema_s = started.elapsed().as_secs_f64();
    let accounts = p.scale * ACCOUNTS_PER_BRANCH;
    let n_conns = connections(p);
    let units = plan(p, n_conns);
    let mut conns = Vec::new();
    for _ in 0..n_conns.min(units.len() as u32).max(1) {
        conns.push(server.connect().await?);
    }
    let done = AtomicU64::new(0);
    let load = copy_all(&conns, &units, &done);
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
    let generate_s = started.elapsed().as_secs_f64() - schema_s;
    ctx.progress("load", accounts, accounts, "vacuum analyze");
    vacuum_analyze(&conns, client, p).await?;
    let vacuum_s = started.elapsed().as_secs_f64() - schema_s - generate_s;
    ctx.progress("load", accounts, accounts, "primary keys");
    primary_keys(&conns, client, p).await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Loaded {
        rows: accounts + 11 * p.scale,
        seconds,
        steps: vec![
            ("schema", schema_s),
            ("generate", generate_s),
            ("vacuum", vacuum_s),
            ("primary_keys", seconds - schema_s - generate_s - vacuum_s),
        ],
        method: LoadMethod::Copy,
        note: String::new(),
    })
}
