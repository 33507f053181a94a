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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hdrhistogram::Histogram;

pub mod pgbench_bin;
pub use pgfleet_proto::script::{self, BUILTIN_SCRIPTS, builtin, rng};
pub mod wire;

use rng::{Rng, Seeds};
use script::{Command, Env, Expr, Script, Value, Var, Vars, eval};

use crate::sandbox::Sandbox;

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
    /// Script variables (`scale`, `naccounts`, defines; a text define is
    /// kept as text, as pgbench's -D keeps it).
    pub vars: HashMap<String, Var>,
    /// Where `\shell` / `\setshell` run: a sandbox (see `sandbox`), given
    /// only when the workload has `allow_shell`. None: they fail, whatever
    /// the script's validation said.
    pub shell: Option<Arc<Sandbox>>,
    pub seed: u64,
    /// Ends the run early as its duration would (results are kept), e.g.
    /// once a backlog reached its size. None: duration or transactions.
    pub stop_when: Option<tokio_util::sync::CancellationToken>,
    /// Where clients publish each of their measured seconds as it ends,
    /// for the live figures (None: only the result at the end).
    pub live: Option<Arc<Live>>,
    /// A client whose connection is lost (the server crashed, or shut it)
    /// records the transaction as failed (class `connection`) and connects
    /// again until it can, or the run ends, instead of aborting.
    pub reconnect: bool,
    /// Keep the commit ledger (see `Ledger`): `LEDGER_TABLE` exists and
    /// the clients' role may insert into it.
    pub ledger: bool,
}

/// The table of the commit ledger: `(client int, seq bigint)`, made by the
/// agent, insert-only for the clients' role.
pub const LEDGER_TABLE: &str = "pgfleet_ledger.commits";
/// `Ledger::clients`' mark of a ledger row whose commit was not
/// acknowledged (it failed, or the connection went first).
pub const UNACKNOWLEDGED: u32 = u32::MAX;

/// The commit ledger of a run: before each COMMIT or END the script sends
/// (outside a pipeline), a client inserts its next row `(client, seq)`
/// into `LEDGER_TABLE` in that same transaction, and notes when the
/// server acknowledged the commit. A row whose commit was acknowledged
/// must be in the table after any crash (with `synchronous_commit: on`).
#[derive(Debug, Clone)]
pub struct Ledger {
    /// When the clients started (after the barrier).
    pub t0: Instant,
    /// Per client: for each `seq` (the index), milliseconds from `t0` to
    /// its commit's acknowledgment, or `UNACKNOWLEDGED`. 4 bytes a
    /// transaction.
    pub clients: Vec<(u32, Vec<u32>)>,
}

/// Whether `sql` (one statement) is what ends a transaction with a commit:
/// `COMMIT` or `END` (with `WORK` / `TRANSACTION`), not `COMMIT PREPARED`
/// nor `AND CHAIN`. What it misses only goes without a ledger row.
pub fn commits(sql: &str) -> bool {
    let t = sql.trim().trim_end_matches(';').to_ascii_lowercase();
    let words: Vec<&str> = t.split_whitespace().collect();
    matches!(
        words.as_slice(),
        ["commit" | "end"] | ["commit" | "end", "work" | "transaction"]
    )
}

/// Whether `sql` (one statement) writes by its first word: `INSERT`,
/// `UPDATE`, `DELETE` or `MERGE`. Outside a transaction block such a
/// statement is a commit of its own, which the ledger follows; what this
/// misses (a CTE, a function that writes) only goes without a ledger row.
pub fn writes(sql: &str) -> bool {
    let first = sql
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    matches!(first.as_str(), "insert" | "update" | "delete" | "merge")
}

/// What the ledger does at a command: nothing, a row in the transaction
/// the command commits (`COMMIT` / `END`), or a row in the implicit
/// transaction of a write outside any block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    No,
    Commit,
    Write,
}

impl Follow {
    fn of(c: &Command) -> Follow {
        match c {
            Command::Sql {
                sql,
                compound: false,
                store: None,
                ..
            } if commits(sql) => Follow::Commit,
            Command::Sql {
                sql,
                compound: false,
                store: None,
                ..
            } if writes(sql) => Follow::Write,
            _ => Follow::No,
        }
    }
}

/// Whether the ledger has anything to follow in a script: a commit, or a
/// statement that writes.
pub fn script_commits(script: &Script) -> bool {
    script
        .commands
        .iter()
        .any(|(_, c)| Follow::of(c) != Follow::No)
}

/// A client's part of the ledger.
struct ClientLedger {
    id: u32,
    /// Per command of the script.
    follow: Vec<Follow>,
    prepared: bool,
    t0: Instant,
    acked_ms: Vec<u32>,
    /// Its share of `LEDGER_MAX_ROWS`: past it, commits go without a row.
    cap: usize,
}

const LEDGER_STMT: &str = "pgfleet_ledger";
/// The most ledger rows a run keeps (4 bytes each in the agent: 256 MiB),
/// shared by its clients, so a long window at a high rate cannot grow the
/// agent without bound; later commits go without a row (never counted).
pub const LEDGER_MAX_ROWS: usize = 64 << 20;

impl ClientLedger {
    /// Prepares the ledger's INSERT on this connection (once).
    async fn prepare(&mut self, db: &mut wire::Conn) -> Result<(), wire::WireError> {
        if !self.prepared {
            let sql = format!("INSERT INTO {LEDGER_TABLE} (client, seq) VALUES ($1, $2)");
            db.prepare(LEDGER_STMT, &sql).await?;
            self.prepared = true;
        }
        Ok(())
    }

    /// The next row's parameters (its seq not acknowledged yet).
    fn next(&mut self) -> [Var; 2] {
        let seq = self.acked_ms.len() as i64;
        self.acked_ms.push(UNACKNOWLEDGED);
        [
            Var::Value(Value::Int(i64::from(self.id))),
            Var::Value(Value::Int(seq)),
        ]
    }

    /// The client's next row, in the transaction block about to commit.
    async fn write(&mut self, db: &mut wire::Conn) -> Result<(), wire::WireError> {
        self.prepare(db).await?;
        let row = self.next();
        db.execute(LEDGER_STMT, &row).await
    }

    /// Statement `name` outside a transaction block with the client's next
    /// row: both before one Sync, so one implicit transaction (and one
    /// round trip, as the statement alone).
    async fn with(
        &mut self,
        db: &mut wire::Conn,
        name: &str,
        params: &[Var],
    ) -> Result<(), wire::WireError> {
        self.prepare(db).await?;
        let row = self.next();
        db.queue_execute(name, params)?;
        db.queue_execute(LEDGER_STMT, &row)?;
        db.end_pipeline(0).await
    }

    /// The commit of the last row written was acknowledged.
    fn ack(&mut self) {
        let ms = self
            .t0
            .elapsed()
            .as_millis()
            .min(u128::from(UNACKNOWLEDGED - 1)) as u32;
        if let Some(last) = self.acked_ms.last_mut() {
            *last = ms;
        }
    }
}

/// One second of the measured window as the clients publish it while they
/// run (by scheduled start): the figures of `SecondStat` and the failures
/// by class. A client publishes a second when its next transaction falls
/// in a later one, so a second may arrive in parts: they merge.
#[derive(Debug, Clone, Default)]
pub struct LiveSecond {
    pub stat: SecondStat,
    pub failures: BTreeMap<String, u64>,
}

impl LiveSecond {
    fn merge(&mut self, o: &LiveSecond) {
        self.stat.merge(&o.stat);
        for (k, v) in &o.failures {
            *self.failures.entry(k.clone()).or_default() += v;
        }
    }
}

/// The live seconds the clients published and nobody took yet, and when
/// the measured window started.
#[derive(Debug, Default)]
pub struct Live {
    seconds: std::sync::Mutex<BTreeMap<u64, LiveSecond>>,
    /// The end of the warm-up: second 0 starts here.
    pub start: std::sync::OnceLock<Instant>,
    /// Transactions committed so far, warm-up included (what a fault
    /// watches for the first one after a crash).
    pub committed: std::sync::atomic::AtomicU64,
    /// Transactions per second of the window so far, as published (kept:
    /// `take` does not drain it), for `duration_s: auto`.
    totals: std::sync::Mutex<Vec<u64>>,
}

impl Live {
    fn add(&self, sec: u64, s: &LiveSecond) {
        let mut m = self.seconds.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(sec).or_default().merge(s);
        drop(m);
        let mut t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let i = sec as usize;
        if t.len() <= i {
            t.resize(i + 1, 0);
        }
        t[i] += s.stat.transactions;
    }

    /// The transactions of each of the window's first `n` seconds (fewer
    /// if fewer were published).
    pub fn totals(&self, n: usize) -> Vec<u64> {
        let t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        t.iter().take(n).copied().collect()
    }
    /// Takes the seconds before `sec` (all with None), in order.
    pub fn take(&self, before: Option<u64>) -> Vec<(u64, LiveSecond)> {
        let mut m = self.seconds.lock().unwrap_or_else(|p| p.into_inner());
        let rest = match before {
            Some(b) => m.split_off(&b),
            None => BTreeMap::new(),
        };
        std::mem::replace(&mut *m, rest).into_iter().collect()
    }
}

/// One second of the measured window (by scheduled start).
#[derive(Debug, Clone, Default)]
pub struct SecondStat {
    pub transactions: u64,
    pub latency_sum_us: u64,
    pub latency_max_us: u64,
    /// Latency histogram of the second: log buckets, `BUCKETS_PER_OCTAVE`
    /// per power of two (±9 % resolution), empty until the first record.
    pub buckets: Vec<u32>,
}

pub const BUCKETS_PER_OCTAVE: u32 = 4;
const BUCKETS: usize = (BUCKETS_PER_OCTAVE * 40) as usize;

impl SecondStat {
    pub fn record(&mut self, us: u64) {
        self.transactions += 1;
        self.latency_sum_us += us;
        self.latency_max_us = self.latency_max_us.max(us);
        if self.buckets.is_empty() {
            self.buckets = vec![0; BUCKETS];
        }
        let us = us.max(1) as f64;
        let b = (us.log2() * f64::from(BUCKETS_PER_OCTAVE)) as usize;
        self.buckets[b.min(BUCKETS - 1)] += 1;
    }

    pub fn merge(&mut self, o: &SecondStat) {
        self.transactions += o.transactions;
        self.latency_sum_us += o.latency_sum_us;
        self.latency_max_us = self.latency_max_us.max(o.latency_max_us);
        if self.buckets.is_empty() {
            self.buckets = o.buckets.clone();
        } else {
            for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
                *a += b;
            }
        }
    }

    /// Latency quantile `q` in microseconds (the geometric middle of its
    /// bucket, capped at the second's maximum; the last rank is the
    /// maximum); None without transactions.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().map(|&c| u64::from(c)).sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        if rank == total {
            return Some(self.latency_max_us as f64);
        }
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                let mid = (i as f64 + 0.5) / f64::from(BUCKETS_PER_OCTAVE);
                return Some(mid.exp2().min(self.latency_max_us as f64));
            }
        }
        None
    }
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
    /// With `DriverConfig::ledger`.
    pub ledger: Option<Ledger>,
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
    // Each client's generator, and :default_seed, derived from the seed as
    // pgbench derives them: a client draws the values pgbench's draws.
    let seeds = Arc::new(Seeds::new(cfg.seed, clients as usize, threads as usize));
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DriverError(format!("starting a driver thread's runtime: {e}")))
    };
    // Clients check this flag between transactions (a CancellationToken's
    // check takes a lock); the progress loop below raises it on cancel.
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..threads {
        let ids: Vec<u32> = (0..clients).filter(|c| c % threads == t).collect();
        let (cfg, pg, barrier, start, stop, seeds) = (
            cfg.clone(),
            pg.clone(),
            barrier.clone(),
            start.clone(),
            stop.clone(),
            seeds.clone(),
        );
        let rt = runtime()?;
        let h = std::thread::Builder::new()
            .name(format!("pgfleet-driver-{t}"))
            .spawn(move || {
                // FuturesUnordered polls only the client that was woken
                // (join_all would poll all of them on every wake-up).
                rt.block_on(
                    ids.into_iter()
                        .map(|id| client(id, &cfg, &seeds, &pg, &barrier, &start, &stop))
                        .collect::<futures::stream::FuturesUnordered<_>>()
                        .collect::<Vec<_>>(),
                )
            })
            .map_err(|e| DriverError(format!("starting driver thread: {e}")))?;
        handles.push(h);
    }
    // All clients connected and prepared: start the clock together, then
    // report progress until every thread is done.
    let total = cfg.warmup + cfg.duration.unwrap_or_default();
    let stop_when = cfg.stop_when.clone().unwrap_or_default();
    let mut stopped_early = false;
    let t0 = runtime()?.block_on(async {
        barrier.wait().await;
        let t0 = *start.get_or_init(Instant::now);
        if let Some(live) = &cfg.live {
            let _ = live.start.set(t0 + cfg.warmup);
        }
        while !handles.iter().all(|h| h.is_finished()) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = cancel.cancelled(), if !stop.load(Ordering::Relaxed) => {
                    stop.store(true, Ordering::Relaxed);
                }
                _ = stop_when.cancelled(), if !stop.load(Ordering::Relaxed) => {
                    stop.store(true, Ordering::Relaxed);
                    stopped_early = true;
                }
            }
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
        Some(d) if !stopped_early => d.as_secs_f64(),
        _ => m
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
        ledger: cfg.ledger.then_some(Ledger {
            t0,
            clients: m.ledgers,
        }),
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
    ledgers: Vec<(u32, Vec<u32>)>,
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
            ledgers: Vec::new(),
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
        for (i, s) in o.per_second.iter().enumerate() {
            self.per_second[i].merge(s);
        }
        self.last_end = self.last_end.max(o.last_end);
        self.ledgers.extend(o.ledgers);
    }
}

enum TxnError {
    Retryable(&'static str, String),
    Fatal(String),
    /// The connection is gone (closed, or the server ended the session:
    /// SQLSTATE classes 08 and 57P).
    Lost(String),
    /// Stopped in a `\sleep` by the window's end or the run's stop.
    Halted,
}

/// A transaction's end as it is recorded: Ok, or its failure's class and
/// message after the tries ran out.
type Outcome = Result<(), (&'static str, String)>;

impl ClientStats {
    /// One transaction of the measured window, by its scheduled start.
    fn record(
        &mut self,
        outcome: &Outcome,
        scheduled: Instant,
        finished: Instant,
        cfg: &DriverConfig,
        warm_end: Instant,
    ) {
        match outcome {
            Ok(()) => {
                let us = finished.duration_since(scheduled).as_micros() as u64;
                self.transactions += 1;
                self.hist.saturating_record(us.max(1));
                if cfg
                    .latency_limit
                    .is_some_and(|l| us as u128 > l.as_micros())
                {
                    self.late += 1;
                }
                let sec = scheduled.duration_since(warm_end).as_secs() as usize;
                if self.per_second.len() <= sec {
                    self.per_second.resize(sec + 1, SecondStat::default());
                }
                self.per_second[sec].record(us);
                self.last_end = Some(finished);
            }
            Err((class, _)) => *self.failures.entry(class.to_string()).or_default() += 1,
        }
    }
}

/// The second a client is filling for the live figures; published to
/// `Live` when its next transaction falls in a later second, and at the end.
struct LiveFill<'a> {
    to: Option<&'a Live>,
    filling: Option<(u64, LiveSecond)>,
}

impl LiveFill<'_> {
    fn record(&mut self, outcome: &Outcome, sec: u64, latency: Duration) {
        if self.to.is_none() {
            return;
        }
        if self.filling.as_ref().is_some_and(|(s, _)| *s != sec) {
            self.publish();
        }
        let (_, l) = self
            .filling
            .get_or_insert_with(|| (sec, LiveSecond::default()));
        match outcome {
            Ok(()) => l.stat.record(latency.as_micros() as u64),
            Err((class, _)) => *l.failures.entry(class.to_string()).or_default() += 1,
        }
    }

    fn publish(&mut self) {
        if let (Some(to), Some((sec, s))) = (self.to, self.filling.take()) {
            to.add(sec, &s);
        }
    }
}

/// --rate: one client's Poisson arrivals (exponential gaps with mean
/// 1/rate), drawn from their own generator (pgbench's thread's), so the
/// rate does not shift the script's values.
struct Arrivals {
    rng: Rng,
    rate: f64,
    next_due: Instant,
}

enum Arrival {
    /// Due at this instant (slept until it).
    Due(Instant),
    /// Due at this instant but already later than the latency limit:
    /// skipped, as pgbench skips it.
    Late(Instant),
    /// The next arrival falls after the end (slept until the end).
    Over,
}

impl Arrivals {
    async fn next(&mut self, end: Option<Instant>, latency_limit: Option<Duration>) -> Arrival {
        let gap = -(1.0 - self.rng.double()).ln() / self.rate;
        self.next_due += Duration::from_secs_f64(gap);
        if let Some(end) = end
            && self.next_due >= end
        {
            tokio::time::sleep_until(end.into()).await;
            return Arrival::Over;
        }
        tokio::time::sleep_until(self.next_due.into()).await;
        match latency_limit {
            Some(limit) if Instant::now().duration_since(self.next_due) > limit => {
                Arrival::Late(self.next_due)
            }
            _ => Arrival::Due(self.next_due),
        }
    }
}

/// A client's variables: the run's, then pgbench's automatic ones unless
/// defined.
fn client_vars(id: u32, cfg: &DriverConfig, seeds: &Seeds) -> Vars {
    let mut vars: Vars = cfg
        .vars
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in [
        ("client_id", Value::Int(id as i64)),
        ("default_seed", Value::Int(seeds.default_seed)),
        ("random_seed", Value::Int(cfg.seed as i64)),
    ] {
        vars.entry(k.to_string()).or_insert(Var::Value(v));
    }
    vars
}

/// One client's connection and what carries over between its
/// transactions: statements prepared, parameters' buffer, variables.
struct Session<'a> {
    db: wire::Conn,
    names: Vec<String>,
    prepared: Vec<bool>,
    params: Vec<Var>,
    vars: Vars,
    halt: Halt<'a>,
    ledger: Option<ClientLedger>,
}

/// When a client must stop whatever it is doing: the run's stop flag
/// (cancel, an early stop) and the end of its window.
#[derive(Clone, Copy)]
struct Halt<'a> {
    stop: &'a AtomicBool,
    end: Option<Instant>,
}

impl Halt<'_> {
    /// How often a sleeping client looks at the stop flag.
    const POLL: Duration = Duration::from_millis(100);

    /// Returns once the run stops or the window ends (never, without
    /// either).
    async fn reached(&self) {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            if self.end.is_some_and(|e| now >= e) {
                return;
            }
            let next = now + Self::POLL;
            let next = self.end.map_or(next, |e| next.min(e));
            tokio::time::sleep_until(next.into()).await;
        }
    }

    /// Sleeps `d`, or less when the window ends or the run stops first;
    /// false then (a `\\sleep 100000 s` must not outlive `duration_s`, nor
    /// a cancel: pgbench abandons a sleeping client at the end too).
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            biased;
            _ = tokio::time::sleep(d) => true,
            () = self.reached() => false,
        }
    }
}

impl Session<'_> {
    /// The script run until it commits or fails for good: serialization
    /// failures and deadlocks are retried with the same random values, up
    /// to `max_tries`; `retries` counts the retries. Err: the client aborts.
    async fn run(
        &mut self,
        cfg: &DriverConfig,
        rng: &mut Rng,
        retries: &mut u64,
    ) -> Result<Outcome, Abort> {
        let snapshot = *rng;
        let mut tries = 0;
        loop {
            tries += 1;
            let ran = transaction(cfg, self, rng).await;
            match ran {
                Ok(()) => return Ok(Ok(())),
                Err(TxnError::Retryable(class, msg)) => {
                    if self.db.status() != wire::TxStatus::Idle {
                        let _ = self.db.simple("ROLLBACK").await;
                    }
                    if tries >= cfg.max_tries {
                        return Ok(Err((class, msg)));
                    }
                    *retries += 1;
                    *rng = snapshot;
                }
                Err(TxnError::Fatal(msg)) => return Err(Abort::Fatal(msg)),
                Err(TxnError::Lost(msg)) => return Err(Abort::Lost(msg)),
                Err(TxnError::Halted) => return Err(Abort::Halted),
            }
        }
    }

    /// After a lost connection: connects again (every 100 ms) until it
    /// can, or `give_up` says the run is over (false then). Statements are
    /// prepared again on the new connection.
    async fn reconnect(&mut self, pg: &tokio_postgres::Config, give_up: impl Fn() -> bool) -> bool {
        loop {
            if give_up() {
                return false;
            }
            if let Ok(db) = wire::Conn::connect(pg).await {
                self.db = db;
                self.prepared.fill(false);
                if let Some(l) = &mut self.ledger {
                    l.prepared = false;
                }
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Why a client's transaction ended it (or, with `reconnect`, its session).
enum Abort {
    Fatal(String),
    Lost(String),
    /// The window ended or the run stopped while the script slept: the
    /// transaction is abandoned, not counted.
    Halted,
}

async fn client(
    id: u32,
    cfg: &DriverConfig,
    seeds: &Seeds,
    pg: &tokio_postgres::Config,
    barrier: &tokio::sync::Barrier,
    start: &std::sync::OnceLock<Instant>,
    stop: &AtomicBool,
) -> Result<ClientStats, DriverError> {
    // Statements are prepared when first run, as pgbench does (a script
    // may create what a later statement refers to).
    let connected = wire::Conn::connect(pg)
        .await
        .map_err(|e| format!("client {id}: connecting: {e}"));
    // Reach the barrier even on failure, so the others are not left waiting.
    barrier.wait().await;
    let mut session = Session {
        db: connected.map_err(DriverError)?,
        names: (0..cfg.script.commands.len()).map(stmt_name).collect(),
        prepared: vec![false; cfg.script.commands.len()],
        params: Vec::new(),
        vars: client_vars(id, cfg, seeds),
        halt: Halt { stop, end: None },
        ledger: None,
    };
    let t0 = *start.get_or_init(Instant::now);
    if cfg.ledger {
        session.ledger = Some(ClientLedger {
            id,
            follow: cfg
                .script
                .commands
                .iter()
                .map(|(_, c)| Follow::of(c))
                .collect(),
            prepared: false,
            t0,
            acked_ms: Vec::new(),
            cap: LEDGER_MAX_ROWS / cfg.clients.max(1) as usize,
        });
    }
    let warm_end = t0 + cfg.warmup;
    let end = cfg.duration.map(|d| warm_end + d);
    session.halt.end = end;
    let mut stats = ClientStats::new();
    let mut rng = seeds.clients[id as usize];
    let mut arrivals = cfg.rate.map(|r| Arrivals {
        rng: Rng::seeded(cfg.seed ^ (u64::from(id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        rate: r / cfg.clients as f64,
        next_due: t0,
    });
    let mut done: u64 = 0;
    let mut live = LiveFill {
        to: cfg.live.as_deref(),
        filling: None,
    };
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        if end.is_some_and(|e| now >= e) || cfg.transactions.is_some_and(|n| done >= n) {
            break;
        }
        let scheduled = match arrivals.as_mut() {
            None => now,
            Some(a) => match a.next(end, cfg.latency_limit).await {
                Arrival::Due(at) => at,
                Arrival::Late(at) => {
                    stats.skipped += u64::from(at >= warm_end);
                    continue;
                }
                Arrival::Over => break,
            },
        };
        let mut retries = 0;
        let outcome = match session.run(cfg, &mut rng, &mut retries).await {
            Ok(o) => o,
            Err(Abort::Lost(msg)) if cfg.reconnect => {
                let past_end =
                    || stop.load(Ordering::Relaxed) || end.is_some_and(|e| Instant::now() >= e);
                if !session.reconnect(pg, past_end).await {
                    break;
                }
                Err(("connection", msg))
            }
            Err(Abort::Halted) => break,
            Err(Abort::Fatal(msg) | Abort::Lost(msg)) => {
                return Err(DriverError(format!("client {id} aborted: {msg}")));
            }
        };
        let finished = Instant::now();
        done += 1;
        if outcome.is_ok()
            && let Some(l) = cfg.live.as_deref()
        {
            l.committed.fetch_add(1, Ordering::Relaxed);
        }
        if scheduled < warm_end {
            continue;
        }
        stats.retries += retries;
        let sec = scheduled.duration_since(warm_end).as_secs();
        live.record(&outcome, sec, finished.duration_since(scheduled));
        stats.record(&outcome, scheduled, finished, cfg, warm_end);
    }
    live.publish();
    if let Some(l) = session.ledger {
        stats.ledgers.push((id, l.acked_ms));
    }
    Ok(stats)
}

/// Where a command is in its script (`name:line`), formatted only when an
/// error needs it: the success path runs per statement.
#[derive(Clone, Copy)]
struct At<'a> {
    script: &'a str,
    line: usize,
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.script, self.line)
    }
}

impl At<'_> {
    fn fatal(self, m: impl std::fmt::Display) -> TxnError {
        TxnError::Fatal(format!("{self}: {m}"))
    }
}

/// One run of the script on one connection; the connection's prepared
/// statements and the client's variables carry over between runs.
async fn transaction(
    cfg: &DriverConfig,
    session: &mut Session<'_>,
    rng: &mut Rng,
) -> Result<(), TxnError> {
    let Session {
        db,
        names,
        prepared,
        params,
        vars,
        halt,
        ledger,
    } = session;
    let commands = &cfg.script.commands;
    // In a pipeline: the Syncs queued so far (\syncpipeline).
    let mut pipeline: Option<usize> = None;
    let mut pc = 0;
    while let Some((line, c)) = commands.get(pc) {
        let i = pc;
        let at = At {
            script: &cfg.script.name,
            line: *line,
        };
        pc += 1;
        match c {
            Command::If { .. } | Command::Elif { .. } | Command::Else { .. } | Command::Endif => {
                let mut env = Env {
                    vars,
                    rng,
                    debug: None,
                };
                pc = cfg.script.branch(i, &mut env).map_err(|e| at.fatal(e))?;
            }
            Command::Set { var, expr } => {
                let mut env = Env {
                    vars,
                    rng,
                    debug: None,
                };
                let v = eval(expr, &mut env).map_err(|e| at.fatal(e))?;
                match vars.get_mut(var) {
                    Some(slot) => *slot = Var::Value(v),
                    None => {
                        vars.insert(var.clone(), Var::Value(v));
                    }
                }
            }
            Command::Sleep { amount, unit_us } => {
                let us = sleep_us(amount, *unit_us, vars, at)?;
                if !halt.sleep(Duration::from_micros(us)).await {
                    return Err(TxnError::Halted);
                }
            }
            Command::Pipeline(op) => pipeline = pipeline_step(*op, pipeline, db, at).await?,
            Command::Sql {
                sql,
                params: names_of,
                compound,
                store,
            } if pipeline.is_some() => {
                if *compound {
                    return Err(at.fatal("a compound (\\;) command cannot run in pipeline mode"));
                }
                if store.is_some() {
                    return Err(at.fatal("gset is not allowed in pipeline mode"));
                }
                bind(names_of, vars, params, at)?;
                let queued = if prepared[i] {
                    Ok(())
                } else {
                    prepared[i] = true;
                    db.queue_prepare(&names[i], sql)
                };
                if let Err(e) = queued.and_then(|()| db.queue_execute(&names[i], params)) {
                    return Err(classify(&e, &at.to_string()));
                }
            }
            Command::Fail(m) => return Err(at.fatal(m)),
            Command::Shell { var, args } => {
                // A command that outlives the window (or a cancel) is
                // abandoned with its transaction; its sandbox kills it.
                let ran = tokio::select! {
                    r = shell(args, vars, cfg.shell.as_deref(), var.is_some()) => r,
                    () = halt.reached() => return Err(TxnError::Halted),
                };
                let out = ran.map_err(|e| at.fatal(e))?;
                if let Some(var) = var {
                    let n: i64 = out.trim().parse().map_err(|_| {
                        at.fatal(format!(
                            "\\setshell: command must return an integer (not \"{}\")",
                            out.trim()
                        ))
                    })?;
                    vars.insert(var.clone(), Var::Value(Value::Int(n)));
                }
            }
            Command::Sql {
                sql,
                params: names_of,
                compound: false,
                store,
            } => {
                bind(names_of, vars, params, at)?;
                if !prepared[i] {
                    if let Err(e) = db.prepare(&names[i], sql).await {
                        return Err(classify(&e, &format!("{at}: preparing")));
                    }
                    prepared[i] = true;
                }
                // A commit the ledger follows: its row in the same
                // transaction (before the COMMIT; with a write outside a
                // block, in its implicit transaction).
                let follow = ledger
                    .as_ref()
                    .filter(|l| l.acked_ms.len() < l.cap)
                    .map_or(Follow::No, |l| l.follow[i]);
                let ledger = ledger.as_mut().filter(|_| match follow {
                    Follow::Commit => true,
                    Follow::Write => db.status() == wire::TxStatus::Idle,
                    Follow::No => false,
                });
                let ran = match (ledger, store) {
                    (Some(l), _) if follow == Follow::Write => {
                        let ran = l.with(db, &names[i], params).await;
                        if ran.is_ok() {
                            l.ack();
                        }
                        ran.map(|()| None)
                    }
                    (Some(l), _) => {
                        if let Err(e) = l.write(db).await {
                            return Err(classify(&e, &format!("{at}: the commit ledger's row")));
                        }
                        let ran = db.execute(&names[i], params).await;
                        if ran.is_ok() {
                            l.ack();
                        }
                        ran.map(|()| None)
                    }
                    (None, None) => db.execute(&names[i], params).await.map(|()| None),
                    (None, Some(_)) => db.execute_rows(&names[i], params).await.map(Some),
                };
                keep(ran, store.as_ref(), vars, at)?;
            }
            Command::Sql { sql, store, .. } => {
                // Statements joined by `\;`: one simple query, variables
                // substituted as text (pgbench's simple protocol).
                let text = script::substitute(sql, vars);
                let ran = match store {
                    None => db.simple(&text).await.map(|()| None),
                    Some(_) => db.simple_rows(&text).await.map(Some),
                };
                keep(ran, store.as_ref(), vars, at)?;
            }
        }
    }
    if pipeline.is_some() {
        return Err(TxnError::Fatal(format!(
            "{}: end of script reached with the pipeline open (\\endpipeline missing)",
            cfg.script.name
        )));
    }
    Ok(())
}

/// `\sleep`'s microseconds. pgbench reads the amount as atoi() of its text
/// (a double variable sleeps its integer part); below zero, no sleep.
fn sleep_us(amount: &Expr, unit_us: u64, vars: &Vars, at: At<'_>) -> Result<u64, TxnError> {
    let n = match amount {
        Expr::Var(v) => vars
            .get(v)
            .map(|x| atoi(&x.to_string()))
            .ok_or_else(|| at.fatal(format!("\\sleep: undefined variable \"{v}\"")))?,
        Expr::Const(Value::Int(i)) => *i,
        other => return Err(at.fatal(format!("\\sleep: unexpected amount {other:?}"))),
    };
    Ok((n.max(0) as u64).saturating_mul(unit_us))
}

/// `\startpipeline`, `\syncpipeline`, `\endpipeline`: the pipeline's state
/// after `op` (the Syncs queued so far; None outside a pipeline).
async fn pipeline_step(
    op: script::PipelineOp,
    pipeline: Option<usize>,
    db: &mut wire::Conn,
    at: At<'_>,
) -> Result<Option<usize>, TxnError> {
    match (op, pipeline) {
        (script::PipelineOp::Start, None) => Ok(Some(0)),
        (script::PipelineOp::Start, Some(_)) => Err(at.fatal("already in pipeline mode")),
        (_, None) => Err(at.fatal("not in pipeline mode")),
        (script::PipelineOp::Sync, Some(n)) => {
            db.queue_sync();
            Ok(Some(n + 1))
        }
        (script::PipelineOp::End, Some(n)) => match db.end_pipeline(n).await {
            Ok(()) => Ok(None),
            Err(e) => Err(classify(&e, &at.to_string())),
        },
    }
}

/// A statement's parameters: the values of the variables it names.
fn bind(
    names_of: &[String],
    vars: &Vars,
    params: &mut Vec<Var>,
    at: At<'_>,
) -> Result<(), TxnError> {
    params.clear();
    for p in names_of {
        let v = vars
            .get(p)
            .ok_or_else(|| at.fatal(format!("undefined variable \"{p}\"")))?;
        params.push(v.clone());
    }
    Ok(())
}

/// A statement's outcome: its error classified, or its rows kept into
/// variables when the command has `\gset` / `\aset`.
fn keep(
    ran: Result<Option<Vec<wire::ResultSet>>, wire::WireError>,
    store: Option<&script::Store>,
    vars: &mut Vars,
    at: At<'_>,
) -> Result<(), TxnError> {
    match (ran, store) {
        (Err(e), _) => Err(classify(&e, &at.to_string())),
        (Ok(Some(sets)), Some(store)) => keep_rows(store, &sets, vars).map_err(|e| at.fatal(e)),
        (Ok(_), _) => Ok(()),
    }
}

/// `\gset`: the last statement's one row into variables (its column
/// names, prefixed); `\aset`: every row of every statement, the last
/// value kept. Values are read as pgbench reads a variable's text.
fn keep_rows(
    store: &script::Store,
    sets: &[wire::ResultSet],
    vars: &mut Vars,
) -> Result<(), String> {
    let sets: &[wire::ResultSet] = if store.all {
        sets
    } else {
        let last = sets.last().map(std::slice::from_ref).unwrap_or_default();
        let rows = last.first().map_or(0, |s| s.rows.len());
        if rows != 1 {
            return Err(format!("expected one row, got {rows}"));
        }
        last
    };
    for set in sets {
        for row in &set.rows {
            for (col, v) in set.columns.iter().zip(row) {
                let var = format!("{}{col}", store.prefix);
                if var.is_empty() || !var.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    return Err(format!("error storing into variable {var}"));
                }
                // The text as it came (pgbench keeps the empty string
                // for NULL, as libpq's PQgetvalue gives it).
                vars.insert(var, Var::Text(v.as_deref().unwrap_or("").into()));
            }
        }
    }
    Ok(())
}

/// `\shell` / `\setshell`: the words (`:name` a variable's text, `::x`
/// a literal `:x`) joined by spaces and run by `/bin/sh -c` in `sandbox`;
/// returns its standard output when `capture`. Without a sandbox nothing
/// runs: the workload did not opt in.
async fn shell(
    args: &[String],
    vars: &Vars,
    sandbox: Option<&Sandbox>,
    capture: bool,
) -> Result<String, String> {
    let Some(sandbox) = sandbox else {
        return Err(
            "\\shell and \\setshell are not allowed: the workload does not set allow_shell".into(),
        );
    };
    let mut words = Vec::with_capacity(args.len());
    for a in args {
        if let Some(rest) = a.strip_prefix("::") {
            words.push(format!(":{rest}"));
        } else if let Some(v) = a.strip_prefix(':') {
            let value = vars
                .get(v)
                .ok_or_else(|| format!("undefined variable \":{v}\""))?;
            words.push(value.to_string());
        } else {
            words.push(a.clone());
        }
    }
    let command = words.join(" ");
    let mut cmd = sandbox
        .command(std::path::Path::new("/bin/sh"))
        .map_err(|e| e.to_string())?;
    cmd.arg("-c")
        .arg(&command)
        .stderr(std::process::Stdio::null())
        .stdout(if capture {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        });
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not run the shell command `{command}`: {e}"))?;
    // What `\setshell` keeps is bounded: pgbench reads one line of at most
    // 63 bytes; the rest is never read (the pipe closes and the command
    // gets SIGPIPE), so 200 MB of output costs the agent nothing.
    let mut stdout = Vec::new();
    if let Some(out) = child.stdout.take() {
        use tokio::io::AsyncReadExt;
        let _ = out.take(SETSHELL_MAX_BYTES).read_to_end(&mut stdout).await;
    }
    let status = child
        .wait()
        .await
        .map_err(|e| format!("could not run the shell command `{command}`: {e}"))?;
    if capture {
        if stdout.is_empty() {
            return Err(format!(
                "could not read result of shell command `{command}`"
            ));
        }
        let text = String::from_utf8_lossy(&stdout);
        return Ok(text.lines().next().unwrap_or_default().to_string());
    }
    if !status.success() {
        return Err(format!(
            "\\shell: `{command}` failed ({status}): meta-command failed"
        ));
    }
    Ok(String::new())
}

/// The most of a `\setshell` command's output read (its first line is
/// what counts; pgbench reads at most 63 bytes of it).
const SETSHELL_MAX_BYTES: u64 = 4096;

/// C's atoi: an optional sign and the leading digits; 0 without any.
fn atoi(s: &str) -> i64 {
    let t = s.trim_start();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let mut n: i64 = 0;
    for b in digits.bytes().take_while(u8::is_ascii_digit) {
        n = n.wrapping_mul(10).wrapping_add(i64::from(b - b'0'));
    }
    if neg { n.wrapping_neg() } else { n }
}

fn stmt_name(command: usize) -> String {
    format!("pgfleet_{command}")
}

/// pgbench's error classes: only serialization failures and deadlocks retry.
fn classify(e: &wire::WireError, at: &str) -> TxnError {
    match e.code() {
        Some("40001") => TxnError::Retryable("serialization", format!("{at}: {e}")),
        Some("40P01") => TxnError::Retryable("deadlock", format!("{at}: {e}")),
        None => TxnError::Lost(format!("{at}: {e}")),
        Some(c) if c.starts_with("08") || c.starts_with("57P") => {
            TxnError::Lost(format!("{at}: {e}"))
        }
        _ => TxnError::Fatal(format!("{at}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_follows_commits_and_lone_writes() {
        for c in ["COMMIT", "end;", "  Commit Work ;", "END TRANSACTION"] {
            assert!(commits(c), "{c}");
        }
        for c in [
            "COMMIT PREPARED 'x'",
            "COMMIT AND CHAIN",
            "ENDX",
            "BEGIN",
            "ROLLBACK",
        ] {
            assert!(!commits(c), "{c}");
        }
        for w in [
            "UPDATE t SET a = 1",
            "insert into t values (1)",
            "  DELETE FROM t",
            "MERGE INTO t",
        ] {
            assert!(writes(w), "{w}");
        }
        for w in [
            "SELECT 1",
            "updated",
            "WITH x AS (UPDATE t SET a = 1) SELECT 1",
            "",
        ] {
            assert!(!writes(w), "{w}");
        }
        let script = |text: &str| Script::parse("s", text).unwrap();
        assert!(script_commits(&script(
            "BEGIN;\nUPDATE t SET a = 1;\nEND;\n"
        )));
        assert!(script_commits(&script("UPDATE t SET a = 1;\n")));
        assert!(
            !script_commits(&script("SELECT 1;\n")),
            "select-only: nothing to follow"
        );
        // A write whose rows a \gset keeps runs as the script says.
        assert!(!script_commits(&script(
            "UPDATE t SET a = 1 RETURNING a \\gset\n"
        )));
    }

    #[test]
    fn per_second_quantiles_are_within_a_bucket_and_merge() {
        let mut a = SecondStat::default();
        assert_eq!(a.quantile_us(0.5), None);
        // 1,000 transactions at 1..=1000 µs.
        for us in 1..=1000 {
            a.record(us);
        }
        let p50 = a.quantile_us(0.5).unwrap();
        let p99 = a.quantile_us(0.99).unwrap();
        // Four buckets per octave: within 2^(1/4) (19 %) of the exact value.
        assert!((500.0 / 1.19..=500.0 * 1.19).contains(&p50), "{p50}");
        assert!((990.0 / 1.19..=1000.0).contains(&p99), "{p99}");
        assert_eq!(a.quantile_us(1.0), Some(1000.0), "capped at the maximum");
        let mut b = SecondStat::default();
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.transactions, 1001);
        assert_eq!(a.latency_max_us, 1_000_000);
        assert_eq!(a.quantile_us(1.0), Some(1_000_000.0));
    }
}
