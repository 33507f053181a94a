//! The pgbench-compatible driver: scripts (`script.rs`), the client loop,
//! and results as pgbench reports them.
//!
//! Each client owns one connection and runs its script's commands in order,
//! `-M prepared` style (every SQL command is prepared once per connection).
//! Clients are tasks on a runtime with `threads` worker threads (pgbench's
//! `-j`). A client records into its own HDR histogram and per-second
//! buckets; the results are merged after the run (pgbench merges its
//! per-thread stats the same way).
//!
//! Client states: Connecting -> (Throttling ->) Running a transaction ->
//! (Retrying ->) Recording -> next transaction | Done | Aborted. Errors are
//! classified as pgbench's: serialization failures (40001) and deadlocks
//! (40P01) are retried up to `max_tries` with the same random values; any
//! other error aborts the client, and an aborted client fails the run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

pub mod pgbench_bin;
pub mod rng;
pub mod script;

use rng::Rng;
use script::{Command, Env, Script, Value, eval};

/// pgbench's built-in scripts, plus the seeds' random UPDATE.
pub const BUILTIN_SCRIPTS: &[(&str, &str, &str)] = &[
    (
        "tpcb-like",
        "pgbench's default: TPC-B-like transaction over accounts, tellers, branches, history",
        "\\set aid random(1, 100000 * :scale)
\\set bid random(1, 1 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
",
    ),
    (
        "simple-update",
        "pgbench -N: accounts update, select and history insert",
        "\\set aid random(1, 100000 * :scale)
\\set bid random(1, 1 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
",
    ),
    (
        "select-only",
        "pgbench -S: one primary-key read of pgbench_accounts",
        "\\set aid random(1, 100000 * :scale)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
",
    ),
    (
        "random-update",
        "seeds/002: one random UPDATE of pgbench_accounts (abalance + 1)",
        "\\set aid random(1, :naccounts)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
",
    ),
];

pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN_SCRIPTS.iter().find(|b| b.0 == name).map(|b| b.2)
}

#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub script: Script,
    pub clients: u32,
    pub threads: u32,
    /// Measured duration; or `transactions` per client.
    pub duration: Option<Duration>,
    pub transactions: Option<u64>,
    /// Run before measuring, not recorded.
    pub warmup: Duration,
    /// Target total transactions per second (open loop, Poisson arrivals);
    /// latency is measured from each transaction's scheduled start.
    pub rate: Option<f64>,
    /// Transactions slower than this are counted late; with `rate`, those
    /// already this late when due are skipped (pgbench's --latency-limit).
    pub latency_limit: Option<Duration>,
    pub max_tries: u32,
    /// Script variables (`scale`, `naccounts`, defines).
    pub vars: HashMap<String, Value>,
    pub seed: u64,
}

#[derive(Debug, Clone, Default)]
pub struct SecondStat {
    pub transactions: u64,
    pub latency_sum_us: u64,
    pub latency_max_us: u64,
}

#[derive(Debug, Clone)]
pub struct DriverResult {
    pub transactions: u64,
    /// Seconds of the measured window.
    pub elapsed_s: f64,
    /// Latency in microseconds.
    pub histogram: Histogram<u64>,
    /// Failed transactions by class (`serialization`, `deadlock`).
    pub failures: BTreeMap<String, u64>,
    pub retries: u64,
    pub skipped: u64,
    pub late: u64,
    pub per_second: Vec<SecondStat>,
}

impl DriverResult {
    pub fn tps(&self) -> f64 {
        self.transactions as f64 / self.elapsed_s.max(1e-9)
    }
    pub fn failures_total(&self) -> u64 {
        self.failures.values().sum()
    }
    pub fn latency_ms(&self, q: f64) -> f64 {
        self.histogram.value_at_quantile(q) as f64 / 1000.0
    }
}

/// An error that stops the run: names the script line.
#[derive(Debug, Clone)]
pub struct DriverError(pub String);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Runs the driver and returns the merged result. Blocking: call it from
/// `spawn_blocking`.
///
/// Like pgbench's `-j`, each of `threads` OS threads owns its share of the
/// clients, on its own single-threaded runtime: a client and its
/// connection's task run on the same thread, with no cross-thread wakeups
/// per query.
pub fn run_blocking(
    cfg: DriverConfig,
    pg: tokio_postgres::Config,
    cancel: tokio_util::sync::CancellationToken,
    progress: impl Fn(f64, f64) + Send + Sync + 'static,
) -> Result<DriverResult, DriverError> {
    let cfg = Arc::new(cfg);
    let clients = cfg.clients.max(1);
    let threads = cfg.threads.clamp(1, clients);
    let barrier = Arc::new(tokio::sync::Barrier::new(clients as usize + 1));
    let start = Arc::new(std::sync::OnceLock::<Instant>::new());
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DriverError(format!("starting a driver thread's runtime: {e}")))
    };
    let mut handles = Vec::new();
    for t in 0..threads {
        let ids: Vec<u32> = (0..clients).filter(|c| c % threads == t).collect();
        let (cfg, pg, barrier, start, cancel) = (
            cfg.clone(),
            pg.clone(),
            barrier.clone(),
            start.clone(),
            cancel.clone(),
        );
        let rt = runtime()?;
        let h = std::thread::Builder::new()
            .name(format!("pgfleet-driver-{t}"))
            .spawn(move || {
                rt.block_on(futures::future::join_all(
                    ids.into_iter()
                        .map(|id| client(id, &cfg, &pg, &barrier, &start, &cancel)),
                ))
            })
            .map_err(|e| DriverError(format!("starting driver thread: {e}")))?;
        handles.push(h);
    }
    // All clients connected and prepared: start the clock together, then
    // report progress until every thread is done.
    let total = cfg.warmup + cfg.duration.unwrap_or_default();
    let t0 = runtime()?.block_on(async {
        barrier.wait().await;
        let t0 = *start.get_or_init(Instant::now);
        while !handles.iter().all(|h| h.is_finished()) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            progress(
                t0.elapsed().as_secs_f64().min(total.as_secs_f64()),
                total.as_secs_f64(),
            );
        }
        t0
    });
    let mut merged: Option<ClientStats> = None;
    let mut first_error = None;
    for h in handles {
        match h.join() {
            Ok(results) => {
                for r in results {
                    match r {
                        Ok(s) => match &mut merged {
                            None => merged = Some(s),
                            Some(m) => m.merge(s),
                        },
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
            }
            Err(_) => {
                first_error.get_or_insert(DriverError("a driver thread panicked".into()));
            }
        }
    }
    if cancel.is_cancelled() {
        return Err(DriverError("cancelled".into()));
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let m = merged.ok_or_else(|| DriverError("no clients".into()))?;
    let elapsed_s = match cfg.duration {
        Some(d) => d.as_secs_f64(),
        None => m
            .last_end
            .map(|e| e.duration_since(t0 + cfg.warmup).as_secs_f64())
            .unwrap_or(0.0),
    };
    Ok(DriverResult {
        transactions: m.transactions,
        elapsed_s,
        histogram: m.hist,
        failures: m.failures,
        retries: m.retries,
        skipped: m.skipped,
        late: m.late,
        per_second: m.per_second,
    })
}

struct ClientStats {
    transactions: u64,
    hist: Histogram<u64>,
    failures: BTreeMap<String, u64>,
    retries: u64,
    skipped: u64,
    late: u64,
    per_second: Vec<SecondStat>,
    last_end: Option<Instant>,
}

impl ClientStats {
    fn new() -> Self {
        ClientStats {
            transactions: 0,
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
            failures: BTreeMap::new(),
            retries: 0,
            skipped: 0,
            late: 0,
            per_second: Vec::new(),
            last_end: None,
        }
    }
    fn merge(&mut self, o: ClientStats) {
        self.transactions += o.transactions;
        let _ = self.hist.add(&o.hist);
        for (k, v) in o.failures {
            *self.failures.entry(k).or_default() += v;
        }
        self.retries += o.retries;
        self.skipped += o.skipped;
        self.late += o.late;
        if self.per_second.len() < o.per_second.len() {
            self.per_second
                .resize(o.per_second.len(), SecondStat::default());
        }
        for (i, s) in o.per_second.into_iter().enumerate() {
            let d = &mut self.per_second[i];
            d.transactions += s.transactions;
            d.latency_sum_us += s.latency_sum_us;
            d.latency_max_us = d.latency_max_us.max(s.latency_max_us);
        }
        self.last_end = self.last_end.max(o.last_end);
    }
}

enum TxnError {
    Retryable(&'static str, String),
    Fatal(String),
}

async fn client(
    id: u32,
    cfg: &DriverConfig,
    pg: &tokio_postgres::Config,
    barrier: &tokio::sync::Barrier,
    start: &std::sync::OnceLock<Instant>,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<ClientStats, DriverError> {
    let connected = async {
        let (db, conn) = pg
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("client {id}: connecting: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut stmts = HashMap::new();
        for (line, c) in &cfg.script.commands {
            if let Command::Sql { sql, .. } = c {
                let st = db.prepare(sql).await.map_err(|e| {
                    format!("{}:{line}: preparing: {}", cfg.script.name, db_text(&e))
                })?;
                stmts.insert(*line, st);
            }
        }
        Ok::<_, String>((db, stmts))
    }
    .await;
    // Reach the barrier even on failure, so the others are not left waiting.
    barrier.wait().await;
    let (db, stmts) = connected.map_err(DriverError)?;
    let t0 = *start.get_or_init(Instant::now);
    let warm_end = t0 + cfg.warmup;
    let end = cfg.duration.map(|d| warm_end + d);
    let mut stats = ClientStats::new();
    let mut rng = Rng::seeded(cfg.seed ^ (u64::from(id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut vars = cfg.vars.clone();
    vars.insert("client_id".into(), Value::Int(id as i64));
    let per_client_rate = cfg.rate.map(|r| r / cfg.clients as f64);
    let mut next_due = t0;
    let mut done: u64 = 0;
    loop {
        if cancel.is_cancelled() {
            break;
        }
        let now = Instant::now();
        if end.is_some_and(|e| now >= e) || cfg.transactions.is_some_and(|n| done >= n) {
            break;
        }
        let scheduled = match per_client_rate {
            Some(r) => {
                // Poisson arrivals: exponential gaps with mean 1/r.
                let gap = -(1.0 - rng.double()).ln() / r;
                next_due += Duration::from_secs_f64(gap);
                if end.is_some_and(|e| next_due >= e) {
                    tokio::time::sleep_until(end.unwrap_or(next_due).into()).await;
                    break;
                }
                tokio::time::sleep_until(next_due.into()).await;
                if let Some(limit) = cfg.latency_limit
                    && Instant::now().duration_since(next_due) > limit
                {
                    if next_due >= warm_end {
                        stats.skipped += 1;
                    }
                    continue;
                }
                next_due
            }
            None => now,
        };
        let snapshot = rng;
        let mut tries = 0;
        let outcome = loop {
            tries += 1;
            match transaction(cfg, &db, &stmts, &mut vars, &mut rng).await {
                Ok(()) => break Ok(()),
                Err(TxnError::Retryable(class, msg)) => {
                    let _ = db.batch_execute("ROLLBACK").await;
                    if tries < cfg.max_tries {
                        stats.retries += u64::from(scheduled >= warm_end);
                        rng = snapshot;
                        continue;
                    }
                    break Err((class, msg));
                }
                Err(TxnError::Fatal(msg)) => {
                    return Err(DriverError(format!("client {id} aborted: {msg}")));
                }
            }
        };
        let finished = Instant::now();
        done += 1;
        if scheduled < warm_end {
            continue;
        }
        match outcome {
            Ok(()) => {
                let us = finished.duration_since(scheduled).as_micros() as u64;
                stats.transactions += 1;
                stats.hist.saturating_record(us.max(1));
                if cfg
                    .latency_limit
                    .is_some_and(|l| us as u128 > l.as_micros())
                {
                    stats.late += 1;
                }
                let sec = scheduled.duration_since(warm_end).as_secs() as usize;
                if stats.per_second.len() <= sec {
                    stats.per_second.resize(sec + 1, SecondStat::default());
                }
                let s = &mut stats.per_second[sec];
                s.transactions += 1;
                s.latency_sum_us += us;
                s.latency_max_us = s.latency_max_us.max(us);
                stats.last_end = Some(finished);
            }
            Err((class, _)) => *stats.failures.entry(class.to_string()).or_default() += 1,
        }
    }
    Ok(stats)
}

async fn transaction(
    cfg: &DriverConfig,
    db: &tokio_postgres::Client,
    stmts: &HashMap<usize, tokio_postgres::Statement>,
    vars: &mut HashMap<String, Value>,
    rng: &mut Rng,
) -> Result<(), TxnError> {
    let name = &cfg.script.name;
    for (line, c) in &cfg.script.commands {
        match c {
            Command::Set { var, expr } => {
                let v = eval(
                    expr,
                    &mut Env {
                        vars,
                        rng,
                        seed: cfg.seed,
                    },
                )
                .map_err(|e| TxnError::Fatal(format!("{name}:{line}: {e}")))?;
                match vars.get_mut(var) {
                    Some(slot) => *slot = v,
                    None => {
                        vars.insert(var.clone(), v);
                    }
                }
            }
            Command::Sleep { amount, unit_us } => {
                let n = eval(
                    amount,
                    &mut Env {
                        vars,
                        rng,
                        seed: cfg.seed,
                    },
                )
                .and_then(|v| match v {
                    Value::Int(i) if i >= 0 => Ok(i as u64),
                    other => Err(format!(
                        "\\sleep needs a non-negative integer, got {}",
                        other.to_text()
                    )),
                })
                .map_err(|e| TxnError::Fatal(format!("{name}:{line}: {e}")))?;
                tokio::time::sleep(Duration::from_micros(n * unit_us)).await;
            }
            Command::Sql { params, .. } => {
                let mut values = Vec::with_capacity(params.len());
                for p in params {
                    values.push(Param(*vars.get(p).ok_or_else(|| {
                        TxnError::Fatal(format!("{name}:{line}: undefined variable `{p}`"))
                    })?));
                }
                let refs: Vec<&(dyn ToSql + Sync)> =
                    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                if let Err(e) = db.execute(&stmts[line], &refs).await {
                    return Err(classify(&e, &format!("{name}:{line}")));
                }
            }
        }
    }
    Ok(())
}

/// pgbench's error classes: only serialization failures and deadlocks retry.
fn classify(e: &tokio_postgres::Error, at: &str) -> TxnError {
    match e.code().map(|c| c.code()) {
        Some("40001") => TxnError::Retryable("serialization", format!("{at}: {}", db_text(e))),
        Some("40P01") => TxnError::Retryable("deadlock", format!("{at}: {}", db_text(e))),
        _ if e.is_closed() => TxnError::Fatal(format!("{at}: connection lost: {e}")),
        _ => TxnError::Fatal(format!("{at}: {}", db_text(e))),
    }
}

fn db_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

/// A script value bound to whatever type the server inferred for its
/// parameter, as pgbench's text parameters would be.
#[derive(Debug)]
struct Param(Value);

impl ToSql for Param {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let v = self.0;
        let int = || -> Result<i64, Box<dyn std::error::Error + Sync + Send>> {
            match v {
                Value::Int(i) => Ok(i),
                Value::Double(d) if d.fract() == 0.0 => Ok(d as i64),
                _ => Err(format!("{} is not an integer", v.to_text()).into()),
            }
        };
        let dbl = || match v {
            Value::Int(i) => i as f64,
            Value::Double(d) => d,
            Value::Bool(b) => f64::from(u8::from(b)),
        };
        match *ty {
            Type::INT2 => i16::try_from(int()?)?.to_sql(ty, out),
            Type::INT4 => i32::try_from(int()?)?.to_sql(ty, out),
            Type::INT8 => int()?.to_sql(ty, out),
            Type::FLOAT4 => (dbl() as f32).to_sql(ty, out),
            Type::FLOAT8 => dbl().to_sql(ty, out),
            Type::BOOL => match v {
                Value::Bool(b) => b.to_sql(ty, out),
                _ => (int()? != 0).to_sql(ty, out),
            },
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => v.to_text().as_str().to_sql(ty, out),
            _ => Err(format!(
                "parameter of type {ty} is not supported: cast it in the script, e.g. :var::text::{ty}"
            )
            .into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}
