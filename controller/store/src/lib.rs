//! The run store (SQLite): runs, agents, cells and their states, samples and
//! results. It is the only source for reports.
//!
//! Architecture invariant: the controller writes an agent's result here (one
//! transaction, synchronous=FULL) before acknowledging it, so anything an
//! agent was told is stored survives a controller crash.
//!
//! Also here, below everything that reads or runs a run: what plans learn
//! from stored cells (`learned`), the controller's `Error` and `exit`, the
//! one table of exit codes.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Deserialize;
use serde_json::Value as Json;

pub mod learned;

use pgfleet_scenario::{labels, stats};

pub use pgfleet_records::{CellEnd, CellState, Entry, NewSample, RegisteredStorage, Registration};

/// The controller's error, one for its crates: each variant's exit code is
/// `Error::exit_code`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Scenario(#[from] pgfleet_scenario::ScenarioError),
    #[error("store: {0}")]
    Store(String),
    #[error("agents: {0}")]
    Agents(String),
    #[error("gRPC server: {0}")]
    Server(String),
    #[error("report: {0}")]
    Report(String),
    #[error("{0}")]
    Usage(String),
    #[error("datasets: {0}")]
    Datasets(String),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Store(e.to_string())
    }
}

impl Error {
    /// Exit code for the CLI (see `exit`).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Scenario(_) | Error::Usage(_) => exit::INVALID,
            Error::Store(_) | Error::Agents(_) | Error::Server(_) => exit::INFRA,
            Error::Report(_) | Error::Datasets(_) => exit::INFRA,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The exit codes of `pgfleet run` and `pgfleet submit`, one table for both.
pub mod exit {
    /// Every cell succeeded and every check passed.
    pub const OK: u8 = 0;
    /// A check failed, or was inconclusive: the numbers said no.
    pub const FAILED: u8 = 1;
    /// Invalid scenario or usage (nothing ran).
    pub const INVALID: u8 = 2;
    /// A cell failed, or the server or the run's infrastructure did:
    /// unreachable after retries, `--timeout` passed, an agent lost,
    /// agents could not start, the run was interrupted.
    pub const INFRA: u8 = 3;
    /// Cancelled (Ctrl-C, `pgfleet cancel`, `DELETE /v1/runs/{id}`).
    pub const CANCELLED: u8 = 130;

    /// For `--help`.
    pub const TABLE: &str = "Exit codes (run, submit and compare): 0 every cell succeeded and every check \
passed; 1 a check (or a compare gate) failed or was inconclusive: the numbers said no; \
2 invalid scenario or usage; 3 a cell failed, or the server or the run's infrastructure did \
(unreachable, --timeout passed, agent lost, agents could not start, run interrupted); 130 cancelled.";

    /// The code for a run's final status, before its checks: a run
    /// that succeeded is 0 here; `of_report` then looks at the checks.
    pub fn of_status(status: &str) -> u8 {
        match status {
            "succeeded" => OK,
            "cancelled" => CANCELLED,
            _ => INFRA,
        }
    }

    /// The code for a finished run's report: its status, then its checks
    /// (1 when one failed or was inconclusive and counts as failed).
    pub fn of_report(status: &str, checks_pass: bool) -> u8 {
        match of_status(status) {
            OK if !checks_pass => FAILED,
            code => code,
        }
    }
}

/// State of a run. It is advanced by whoever executes it: `run::run_scenario`
/// or `serve`'s queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Submitted to `serve`, waiting for its turn.
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// The controller that ran it exited without finishing it (killed,
    /// crashed, host restarted); set when the store is next opened.
    Interrupted,
}

/// Who executes a run: `pgfleet run` (gone with its process), or `pgfleet
/// serve` (a restarted server resumes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Run,
    Serve,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunStatus::Queued | RunStatus::Running)
    }
    pub fn parse(s: &str) -> Option<RunStatus> {
        [
            RunStatus::Queued,
            RunStatus::Running,
            RunStatus::Succeeded,
            RunStatus::Failed,
            RunStatus::Cancelled,
            RunStatus::Interrupted,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: String,
    pub scenario_name: String,
    pub scenario_path: String,
    pub status: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub labels: crate::labels::Labels,
    /// What a Kubernetes run kept for debugging (`cleanup: keep`):
    /// `{"until": RFC 3339, "namespace": …, "objects": ["pod/…", …]}`.
    pub kept: Option<Json>,
    /// The plan's estimate of the run's wall-clock seconds on its fleet.
    pub estimated_seconds: Option<f64>,
}

/// A succeeded cell's time beside its estimate (`Store::past_estimates`).
#[derive(Debug, Clone, PartialEq)]
pub struct PastEstimate {
    pub run_id: String,
    pub cell_id: String,
    /// How it came by its data (`environment.dataset.how`; `none`).
    pub how: String,
    /// From its start to its end, less any wait for another cell's build.
    pub took_seconds: f64,
    /// Of it, moving its data (`Provenance::data_seconds`); 0 without a
    /// dataset.
    pub data_seconds: f64,
    pub estimate: CellEstimate,
}

/// A cell's estimate as stored beside it (`cells.estimate`): its phases as
/// planned (learned corrections applied) and as the model had them, and
/// what learning matches later cells by.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, Deserialize)]
#[serde(default)]
pub struct CellEstimate {
    /// `PlannedCell::estimate_key` and `capacity_key`.
    pub key: String,
    pub capacity: String,
    /// The kind loads a dataset (its data movement is learned apart).
    pub dataset: bool,
    pub phases: pgfleet_proto::workload::Phases,
    pub model: pgfleet_proto::workload::Phases,
    /// The runs its corrections were learned from, newest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub learned_from: Vec<String>,
    /// How the cell loads pgbench's tables ("direct", "copy"; "" for other
    /// kinds and for cells stored before the key, all of which copied).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub load_method: String,
    /// Its measurement ends when it is steady (`duration_s: auto`): what
    /// it took past its data says nothing of the model's error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open_ended: bool,
}

impl CellEstimate {
    pub fn of(c: &pgfleet_scenario::plan::PlannedCell) -> CellEstimate {
        CellEstimate {
            key: c.estimate_key(),
            capacity: c.capacity_key(),
            dataset: c.params.dataset().is_some(),
            phases: c.estimate().phases(),
            model: c.model_estimate().phases(),
            learned_from: c.learned.runs().into_iter().map(String::from).collect(),
            load_method: pgfleet_scenario::plan::load_method(&c.params)
                .map_or(String::new(), |m| m.name().to_string()),
            open_ended: matches!(&c.params, pgfleet_proto::workload::Params::Pgbench(p) if p.drive.until_steady),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CellRow {
    pub cell_id: String,
    pub workload: String,
    pub instance_class: String,
    pub params: Json,
    pub state: String,
    pub agent_id: Option<String>,
    pub error: Option<String>,
    pub environment: Option<Json>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Its point in its entry's sweep (`{"clients": 16}`); empty when the
    /// entry sweeps nothing.
    pub point: serde_json::Map<String, Json>,
    /// The plan's estimate of its seconds, and by phase (stores from
    /// before phases have only the seconds).
    pub estimate_seconds: Option<f64>,
    pub estimate: Option<CellEstimate>,
}

impl RunRow {
    /// Seconds from its start to its end, once it ended.
    pub fn seconds(&self) -> Option<f64> {
        span(Some(&self.started_at), self.finished_at.as_ref())
    }
}

fn span(from: Option<&String>, to: Option<&String>) -> Option<f64> {
    let t = |s: Option<&String>| chrono::DateTime::parse_from_rfc3339(s?).ok();
    let (a, b) = (t(from)?, t(to)?);
    Some((b - a).num_milliseconds().max(0) as f64 / 1000.0)
}

impl CellRow {
    /// Seconds from its start to its end, once it ended.
    pub fn seconds(&self) -> Option<f64> {
        span(self.started_at.as_ref(), self.finished_at.as_ref())
    }
}

/// A cell's dataset provenance (its environment's `dataset`).
#[derive(Debug, Clone)]
pub struct DatasetUseRow {
    pub run_id: String,
    pub cell_id: String,
    pub agent_id: Option<String>,
    pub finished_at: Option<String>,
    pub provenance: Json,
}

#[derive(Debug, Clone)]
pub struct ResultRow {
    pub cell_id: String,
    pub params: Json,
    pub metrics: Json,
}

#[derive(Debug, Clone)]
pub struct AgentRow {
    pub agent_id: String,
    pub instance_class: String,
    pub info: Registration,
    pub lost_at: Option<String>,
}

/// A run to store (`Store::create_run`).
pub struct NewRun<'a> {
    pub id: &'a str,
    pub name: &'a str,
    /// The scenario's file (or submitted name).
    pub path: &'a str,
    pub yaml: &'a str,
    pub owner: Owner,
    pub idempotency_key: Option<&'a str>,
    pub labels: &'a crate::labels::Labels,
    pub cells: &'a [pgfleet_scenario::PlannedCell],
    /// The plan's estimate of its wall-clock seconds.
    pub estimated_seconds: f64,
}

/// A handle to the store; cheap to clone. Calls are short and synchronous.
///
/// One thread, the store's writer, owns the write connection: every write
/// of every run (a scheduler's batches through its run's `writer`, runs
/// created, started and finished, cells inserted) is a job it runs in
/// turn, and the caller waits for that job's outcome, so a write that
/// returned is committed. Reads (reports, the HTTP API, /metrics) take
/// their own connection: in WAL mode they see what is committed and never
/// wait for a write.
#[derive(Clone)]
pub struct Store {
    writes: std::sync::mpsc::Sender<Job>,
    reader: Arc<Mutex<Connection>>,
}

/// A write, run by the store's writer thread on its connection.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Starts the thread that owns `conn`; it ends when the last `Store`
/// handle is dropped. A job that panics does not take the thread (or the
/// other writes) with it: its caller gets an error.
fn spawn_writer(mut conn: Connection) -> Result<std::sync::mpsc::Sender<Job>> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("pgfleet-store-writer".into())
        .spawn(move || {
            for job in rx {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)));
            }
        })
        .map_err(|e| Error::Store(format!("starting the store's writer thread: {e}")))?;
    Ok(tx)
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    scenario_name TEXT NOT NULL,
    scenario_path TEXT NOT NULL,
    scenario_yaml TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    controller_pid INTEGER,
    owner TEXT,
    idempotency_key TEXT,
    labels TEXT
);
CREATE TABLE IF NOT EXISTS agents (
    run_id TEXT NOT NULL REFERENCES runs(id),
    agent_id TEXT NOT NULL,
    instance_class TEXT NOT NULL,
    info TEXT NOT NULL,
    registered_at TEXT NOT NULL,
    lost_at TEXT,
    PRIMARY KEY (run_id, agent_id)
);
CREATE TABLE IF NOT EXISTS cells (
    run_id TEXT NOT NULL REFERENCES runs(id),
    cell_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    workload TEXT NOT NULL,
    instance_class TEXT NOT NULL,
    params TEXT NOT NULL,
    settings TEXT NOT NULL,
    state TEXT NOT NULL,
    agent_id TEXT,
    error TEXT,
    environment TEXT,
    started_at TEXT,
    finished_at TEXT,
    PRIMARY KEY (run_id, cell_id)
);
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    cell_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_cell ON samples (run_id, cell_id);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL,
    cell_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    params TEXT NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (run_id, cell_id, idx)
);
"#;

/// Whether `pid` is a live pgfleet process on this host (a pid reused by
/// another program does not count).
fn controller_alive(pid: i64) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
        let argv0 = cmd.split(|b| *b == 0).next().unwrap_or_default();
        String::from_utf8_lossy(argv0).contains("pgfleet")
    })
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn js(v: &Json) -> String {
    v.to_string()
}

fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        id: r.get(0)?,
        scenario_name: r.get(1)?,
        scenario_path: r.get(2)?,
        status: r.get(3)?,
        started_at: r.get(4)?,
        finished_at: r.get(5)?,
        labels: crate::labels::Labels::from_json(r.get::<_, Option<String>>(6)?.as_deref()),
        kept: parse(r.get(7)?),
        estimated_seconds: r.get(8)?,
    })
}

fn parse(s: Option<String>) -> Option<Json> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

impl Store {
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Store(format!("creating {}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path)
            .map_err(|e| Error::Store(format!("opening {}: {e}", path.display())))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;",
        )?;
        conn.execute_batch(SCHEMA)?;
        // Columns later than the first stores: an old store gains them.
        for (table, col, ty) in [
            ("runs", "controller_pid", "INTEGER"),
            ("runs", "owner", "TEXT"),
            ("runs", "idempotency_key", "TEXT"),
            ("runs", "labels", "TEXT"),
            // Samples numbered by their agent (replays are kept once).
            ("samples", "agent_id", "TEXT"),
            ("samples", "seq", "INTEGER"),
            // A cell's point in its entry's sweep.
            ("cells", "point", "TEXT"),
            // What a Kubernetes run kept (`cleanup: keep`).
            ("runs", "kept", "TEXT"),
            // The plan's estimates, beside what the run and its cells took.
            ("runs", "estimated_seconds", "REAL"),
            ("cells", "estimate_seconds", "REAL"),
            // ... by phase (`CellEstimate`, JSON).
            ("cells", "estimate", "TEXT"),
        ] {
            let has: bool = conn.query_row(
                "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
                [table, col],
                |r| r.get(0),
            )?;
            if !has {
                // Another process opening the same old store may add it first.
                match conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {col} {ty}")) {
                    Err(e) if e.to_string().contains("duplicate column name") => {}
                    r => r?,
                }
            }
        }
        conn.execute_batch(
            "CREATE UNIQUE INDEX IF NOT EXISTS runs_idempotency ON runs (idempotency_key) WHERE idempotency_key IS NOT NULL",
        )?;
        let reader = Connection::open(path)
            .map_err(|e| Error::Store(format!("opening {}: {e}", path.display())))?;
        reader.execute_batch("PRAGMA busy_timeout=5000; PRAGMA query_only=ON;")?;
        let store = Store {
            writes: spawn_writer(conn)?,
            reader: Arc::new(Mutex::new(reader)),
        };
        store.reap_interrupted()?;
        Ok(store)
    }

    /// Marks runs of `pgfleet run` still `running` whose controller process
    /// is gone as `interrupted`, and their unfinished cells `cancelled`, so
    /// the store never shows a run as running that nothing runs. (Runs of
    /// `serve` wait for the next `serve`, which resumes them.) Returns their
    /// ids.
    pub fn reap_interrupted(&self) -> Result<Vec<String>> {
        let running: Vec<(String, Option<i64>)> = self.read(|c| {
            c.prepare(
                "SELECT id, controller_pid FROM runs WHERE status = 'running' AND coalesce(owner, 'run') = 'run'",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
        })?;
        let mut reaped = Vec::new();
        for (id, pid) in running {
            if pid.is_some_and(controller_alive) {
                continue;
            }
            self.interrupt(&id, "the controller exited before this cell finished")?;
            reaped.push(id);
        }
        Ok(reaped)
    }

    /// Ends a run that cannot go on: `interrupted`, its unfinished cells
    /// cancelled with `why`.
    pub fn interrupt(&self, id: &str, why: &str) -> Result<()> {
        let (at, id, why) = (now(), id.to_string(), why.to_string());
        self.with(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE runs SET status = 'interrupted', finished_at = ?2 WHERE id = ?1 AND status IN ('queued', 'running')",
                params![id, at],
            )?;
            tx.execute(
                "UPDATE cells SET state = 'cancelled', finished_at = ?2, error = ?3 \
                 WHERE run_id = ?1 AND state IN ('pending', 'running')",
                params![id, at, why],
            )?;
            tx.commit()
        })
    }

    /// Runs of `serve` that a controller was executing or had queued when
    /// it stopped, oldest first, with the pid that ran them.
    pub fn unfinished_served_runs(&self) -> Result<Vec<(String, String, Option<i64>)>> {
        self.read(|c| {
            c.prepare(
                "SELECT id, status, controller_pid FROM runs WHERE owner = 'serve' AND status IN ('queued', 'running') ORDER BY started_at, id",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect()
        })
    }

    /// The run a submission with this idempotency key created.
    pub fn run_by_idempotency_key(&self, key: &str) -> Result<Option<String>> {
        self.read(|c| {
            c.query_row(
                "SELECT id FROM runs WHERE idempotency_key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// The scenario text a run was submitted with.
    pub fn scenario_yaml(&self, id: &str) -> Result<Option<String>> {
        self.read(|c| {
            c.query_row(
                "SELECT scenario_yaml FROM runs WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// A write, run by the store's writer thread; returns once it is
    /// committed (or failed).
    fn with<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.writes
            .send(Box::new(move |c| {
                let _ = tx.send(f(c));
            }))
            .map_err(|_| Error::Store("the store's writer thread has stopped".into()))?;
        rx.recv()
            .map_err(|_| {
                Error::Store(
                    "this write failed inside the store's writer (a bug: see the log)".into(),
                )
            })?
            .map_err(Error::from)
    }

    /// A read on the read connection.
    fn read<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T> {
        let mut c = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        Ok(f(&mut c)?)
    }

    /// Stores a new run, `queued`, with its cells (`pending`), in one
    /// transaction: a run is never stored without its cells. `start_run`
    /// makes it `running`. A key already used gives a store error (the API
    /// looks it up first).
    pub fn create_run(&self, run: &NewRun) -> Result<()> {
        let owner = match run.owner {
            Owner::Run => "run",
            Owner::Serve => "serve",
        };
        let (id, name, path, yaml) = (
            run.id.to_string(),
            run.name.to_string(),
            run.path.to_string(),
            run.yaml.to_string(),
        );
        let key = run.idempotency_key.map(str::to_string);
        let labels = run.labels.to_json();
        let estimated = run.estimated_seconds;
        let cells: Vec<_> = run
            .cells
            .iter()
            .enumerate()
            .map(|(idx, cell)| {
                (
                    cell.cell_id.clone(),
                    idx as i64,
                    cell.workload().name(),
                    cell.instance_class.clone(),
                    cell.params.to_json(),
                    serde_json::to_string(&cell.settings).unwrap_or_default(),
                    pgfleet_scenario::sweep::point_json(&cell.point).to_string(),
                    cell.estimate().seconds,
                    serde_json::to_string(&CellEstimate::of(cell)).unwrap_or_default(),
                )
            })
            .collect();
        self.with(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO runs (id, scenario_name, scenario_path, scenario_yaml, status, started_at, controller_pid, owner, idempotency_key, labels, estimated_seconds) \
                 VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?6, ?7, ?8, ?9, ?10)",
                params![id, name, path, yaml, now(), std::process::id(), owner, key, labels, estimated],
            )?;
            for c in &cells {
                tx.execute(
                    "INSERT INTO cells (run_id, cell_id, idx, workload, instance_class, params, settings, state, point, estimate_seconds, estimate) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?9, ?10)",
                    params![id, c.0, c.1, c.2, c.3, c.4, c.5, c.6, c.7, c.8],
                )?;
            }
            tx.commit()
        })
    }

    /// The run starts (or resumes) in this process.
    pub fn start_run(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.with(move |c| {
            c.execute(
                "UPDATE runs SET status = 'running', controller_pid = ?2 WHERE id = ?1 AND status IN ('queued', 'running')",
                params![id, std::process::id()],
            )
            .map(|_| ())
        })
    }

    pub fn finish_run(&self, id: &str, status: RunStatus) -> Result<()> {
        let id = id.to_string();
        self.with(move |c| {
            c.execute(
                "UPDATE runs SET status = ?2, finished_at = ?3 WHERE id = ?1",
                params![id, status.as_str(), now()],
            )
            .map(|_| ())
        })
    }

    /// Records what a run's agent source kept for debugging.
    pub fn set_kept(&self, id: &str, kept: &Json) -> Result<()> {
        let (id, kept) = (id.to_string(), kept.to_string());
        self.with(move |c| {
            c.execute("UPDATE runs SET kept = ?2 WHERE id = ?1", params![id, kept])
                .map(|_| ())
        })
    }

    /// Back to pending: its assignment never reached the agent.
    pub fn requeue_cell(&self, run: &str, cell: &str) -> Result<()> {
        self.commit(
            run,
            &[Entry::RequeueCell {
                cell_id: cell.into(),
            }],
        )
    }
    pub fn start_cell(&self, run: &str, cell: &str, agent: &str) -> Result<()> {
        self.commit(
            run,
            &[Entry::StartCell {
                cell_id: cell.into(),
                agents: agent.into(),
            }],
        )
    }

    /// Ends a cell: state, error, environment and its points, atomically.
    pub fn finish_cell(
        &self,
        run: &str,
        cell: &str,
        state: CellState,
        error: Option<&str>,
        environment: Option<&Json>,
        points: &[(Json, Json)],
    ) -> Result<()> {
        let end = CellEnd {
            cell_id: cell.to_string(),
            state,
            error: error.map(str::to_string),
            environment: environment.cloned(),
            points: points.to_vec(),
        };
        self.commit(run, &[Entry::End(end)])
    }

    /// Writes `entries` of one run in order, in one transaction (one fsync
    /// for a burst of them).
    pub fn commit(&self, run: &str, entries: &[Entry]) -> Result<()> {
        self.commit_owned(run.to_string(), entries.to_vec())
    }

    /// `commit`, for a batch the caller hands over (no copy).
    pub fn commit_owned(&self, run: String, entries: Vec<Entry>) -> Result<()> {
        self.with(move |c| {
            let tx = c.transaction()?;
            let at = now();
            for e in &entries {
                match e {
                    Entry::Sample(n) => {
                        let seq = (n.seq > 0).then_some(n.seq as i64);
                        tx.prepare_cached(
                            "INSERT INTO samples (run_id, cell_id, kind, data, at, agent_id, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        )?
                        .execute(params![run, n.cell_id, n.kind, js(&n.data), at, n.agent_id, seq])?;
                    }
                    Entry::End(e) => {
                        tx.execute(
                            "UPDATE cells SET state = ?3, error = ?4, environment = ?5, finished_at = ?6 WHERE run_id = ?1 AND cell_id = ?2",
                            params![run, e.cell_id, e.state.as_str(), e.error, e.environment.as_ref().map(js), at],
                        )?;
                        for (i, (p, m)) in e.points.iter().enumerate() {
                            tx.execute(
                                "INSERT OR REPLACE INTO results (run_id, cell_id, idx, params, metrics) VALUES (?1, ?2, ?3, ?4, ?5)",
                                params![run, e.cell_id, i as i64, js(p), js(m)],
                            )?;
                        }
                    }
                    Entry::StartCell { cell_id, agents } => {
                        tx.execute(
                            "UPDATE cells SET state = 'running', agent_id = ?3, started_at = ?4 WHERE run_id = ?1 AND cell_id = ?2",
                            params![run, cell_id, agents, at],
                        )?;
                    }
                    Entry::RequeueCell { cell_id } => {
                        tx.execute(
                            "UPDATE cells SET state = 'pending', agent_id = NULL, started_at = NULL WHERE run_id = ?1 AND cell_id = ?2",
                            params![run, cell_id],
                        )?;
                    }
                    Entry::RegisterAgent {
                        agent_id,
                        class,
                        info,
                    } => {
                        tx.execute(
                            "INSERT INTO agents (run_id, agent_id, instance_class, info, registered_at) VALUES (?1, ?2, ?3, ?4, ?5)
                             ON CONFLICT (run_id, agent_id) DO UPDATE SET info = excluded.info, lost_at = NULL",
                            params![run, agent_id, class, serde_json::to_string(info).unwrap_or_default(), at],
                        )?;
                    }
                    Entry::AgentLost { agent_id } => {
                        tx.execute(
                            "UPDATE agents SET lost_at = ?3 WHERE run_id = ?1 AND agent_id = ?2",
                            params![run, agent_id, at],
                        )?;
                    }
                }
            }
            tx.commit()
        })
    }

    /// The last sample number stored per (cell, agent) of a run: where a
    /// resumed run's deduplication starts.
    pub fn last_sample_seqs(
        &self,
        run: &str,
    ) -> Result<std::collections::HashMap<(String, String), u64>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT cell_id, agent_id, max(seq) FROM samples WHERE run_id = ?1 AND seq IS NOT NULL AND agent_id IS NOT NULL GROUP BY 1, 2",
            )?;
            let rows = st.query_map([run], |r| Ok(((r.get(0)?, r.get(1)?), r.get::<_, i64>(2)? as u64)))?;
            rows.collect()
        })
    }

    pub fn register_agent(
        &self,
        run: &str,
        agent: &str,
        class: &str,
        info: &Registration,
    ) -> Result<()> {
        self.commit(
            run,
            &[Entry::RegisterAgent {
                agent_id: agent.into(),
                class: class.into(),
                info: info.clone(),
            }],
        )
    }

    pub fn run(&self, id: &str) -> Result<Option<RunRow>> {
        self.read(|c| {
            c.query_row(
                "SELECT id, scenario_name, scenario_path, status, started_at, finished_at, labels, kept, estimated_seconds FROM runs WHERE id = ?1",
                params![id],
                run_row,
            )
            .optional()
        })
    }

    pub fn runs(&self) -> Result<Vec<RunRow>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT id, scenario_name, scenario_path, status, started_at, finished_at, labels, kept, estimated_seconds FROM runs ORDER BY started_at",
            )?;
            let rows = st.query_map([], run_row)?;
            rows.collect()
        })
    }

    pub fn cells(&self, run: &str) -> Result<Vec<CellRow>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT cell_id, workload, instance_class, params, state, agent_id, error, environment, started_at, finished_at, point, estimate_seconds, estimate
                 FROM cells WHERE run_id = ?1 ORDER BY idx",
            )?;
            let rows = st.query_map(params![run], |r| {
                Ok(CellRow {
                    cell_id: r.get(0)?,
                    workload: r.get(1)?,
                    instance_class: r.get(2)?,
                    params: parse(r.get(3)?).unwrap_or(Json::Null),
                    state: r.get(4)?,
                    agent_id: r.get(5)?,
                    error: r.get(6)?,
                    environment: parse(r.get(7)?),
                    started_at: r.get(8)?,
                    finished_at: r.get(9)?,
                    point: parse(r.get(10)?)
                        .and_then(|p| p.as_object().cloned())
                        .unwrap_or_default(),
                    estimate_seconds: r.get(11)?,
                    estimate: r
                        .get::<_, Option<String>>(12)?
                        .and_then(|e| serde_json::from_str(&e).ok()),
                })
            })?;
            rows.collect()
        })
    }

    /// The newest `limit` succeeded cells stored with an estimate, newest
    /// first: what each took beside it, for `learned`.
    pub fn past_estimates(&self, limit: usize) -> Result<Vec<PastEstimate>> {
        self.read(move |c| {
            let mut st = c.prepare(
                "SELECT run_id, cell_id, json_extract(environment, '$.dataset'),
                        started_at, finished_at, estimate
                 FROM cells
                 WHERE state = 'succeeded' AND estimate IS NOT NULL
                   AND started_at IS NOT NULL AND finished_at IS NOT NULL
                 ORDER BY finished_at DESC LIMIT ?1",
            )?;
            let rows = st.query_map(params![limit as i64], |r| {
                let (from, to): (String, String) = (r.get(3)?, r.get(4)?);
                let cell_id: String = r.get(1)?;
                let estimate: String = r.get(5)?;
                let data = r.get::<_, Option<String>>(2)?.and_then(|d| {
                    serde_json::from_str::<pgfleet_proto::dataset::Provenance>(&d).ok()
                });
                let took = span(Some(&from), Some(&to)).unwrap_or(f64::NAN);
                Ok(PastEstimate {
                    run_id: r.get(0)?,
                    how: data.as_ref().map_or("none".into(), |d| d.how.clone()),
                    took_seconds: took - data.as_ref().map_or(0.0, |d| d.wait_seconds),
                    data_seconds: data.as_ref().map_or(0.0, |d| d.data_seconds(&cell_id)),
                    // A store's row it cannot read teaches nothing (NaN).
                    estimate: serde_json::from_str(&estimate).unwrap_or_else(|_| CellEstimate {
                        model: pgfleet_proto::workload::Phases {
                            other: f64::NAN,
                            ..Default::default()
                        },
                        ..Default::default()
                    }),
                    cell_id,
                })
            })?;
            rows.collect()
        })
    }

    /// Every stored cell whose environment says where its data came from
    /// (`environment.dataset`), oldest first.
    pub fn dataset_uses(&self) -> Result<Vec<DatasetUseRow>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT run_id, cell_id, agent_id, finished_at, json_extract(environment, '$.dataset')
                 FROM cells WHERE json_extract(environment, '$.dataset') IS NOT NULL
                 ORDER BY finished_at, run_id, idx",
            )?;
            let rows = st.query_map([], |r| {
                Ok(DatasetUseRow {
                    run_id: r.get(0)?,
                    cell_id: r.get(1)?,
                    agent_id: r.get(2)?,
                    finished_at: r.get(3)?,
                    provenance: parse(r.get(4)?).unwrap_or(Json::Null),
                })
            })?;
            rows.collect()
        })
    }

    pub fn results(&self, run: &str) -> Result<Vec<ResultRow>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT r.cell_id, r.params, r.metrics FROM results r JOIN cells c ON c.run_id = r.run_id AND c.cell_id = r.cell_id
                 WHERE r.run_id = ?1 ORDER BY c.idx, r.idx",
            )?;
            let rows = st.query_map(params![run], |r| {
                Ok(ResultRow {
                    cell_id: r.get(0)?,
                    params: parse(r.get(1)?).unwrap_or(Json::Null),
                    metrics: parse(r.get(2)?).unwrap_or(Json::Null),
                })
            })?;
            rows.collect()
        })
    }

    pub fn agents(&self, run: &str) -> Result<Vec<AgentRow>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT agent_id, instance_class, info, lost_at FROM agents WHERE run_id = ?1 ORDER BY agent_id",
            )?;
            let rows = st.query_map(params![run], |r| {
                Ok(AgentRow {
                    agent_id: r.get(0)?,
                    instance_class: r.get(1)?,
                    info: parse(r.get(2)?)
                        .and_then(|j| Registration::deserialize(&j).ok())
                        .unwrap_or_default(),
                    lost_at: r.get(3)?,
                })
            })?;
            rows.collect()
        })
    }

    /// The kinds of sample a run holds, e.g. `pg_stat`, `second`, `vacuum`.
    pub fn sample_kinds(&self, run: &str) -> Result<Vec<String>> {
        self.read(|c| {
            let mut st =
                c.prepare("SELECT DISTINCT kind FROM samples WHERE run_id = ?1 ORDER BY kind")?;
            let rows = st.query_map(params![run], |r| r.get::<_, String>(0))?;
            rows.collect()
        })
    }

    pub fn samples(&self, run: &str, kind: &str) -> Result<Vec<(String, Json)>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT cell_id, data FROM samples WHERE run_id = ?1 AND kind = ?2 ORDER BY id",
            )?;
            let rows = st.query_map(params![run, kind], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    parse(r.get(1)?).unwrap_or(Json::Null),
                ))
            })?;
            rows.collect()
        })
    }
}

impl<'a> NewRun<'a> {
    /// A run with no scenario text, labels or cells (tests, tools).
    pub fn bare(id: &'a str, owner: Owner) -> NewRun<'a> {
        static NO_LABELS: crate::labels::Labels =
            crate::labels::Labels(std::collections::BTreeMap::new());
        NewRun {
            id,
            name: "s",
            path: "s.yaml",
            yaml: "",
            owner,
            idempotency_key: None,
            labels: &NO_LABELS,
            cells: &[],
            estimated_seconds: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_a_vanished_controller_become_interrupted_on_open() {
        let dir = std::env::temp_dir().join(format!("pgfleet-store-{}", std::process::id()));
        let path = dir.join("s.db");
        let store = Store::open(&path).unwrap();
        // This process is a live pgfleet process: its run stays running.
        for id in ["live", "gone", "old"] {
            store.create_run(&NewRun::bare(id, Owner::Run)).unwrap();
            store.start_run(id).unwrap();
        }
        // A run whose controller exited (a pid that is gone), with a
        // running and a pending cell; and one from a store without pids.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        store
            .with(move |c| {
                c.execute("UPDATE runs SET controller_pid = ?1 WHERE id = 'gone'", [dead])?;
                c.execute("UPDATE runs SET controller_pid = NULL WHERE id = 'old'", [])?;
                for (cell, state) in [("c0", "running"), ("c1", "pending"), ("c2", "succeeded")] {
                    c.execute(
                        "INSERT INTO cells (run_id, cell_id, idx, workload, instance_class, params, settings, state) \
                         VALUES ('gone', ?1, 0, 'w', 'a', '{}', '{}', ?2)",
                        [cell, state],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        drop(store);

        let store = Store::open(&path).unwrap();
        let status = |id: &str| store.run(id).unwrap().unwrap().status;
        assert_eq!(status("live"), "running");
        assert_eq!(status("gone"), "interrupted");
        assert_eq!(status("old"), "interrupted");
        assert!(store.run("gone").unwrap().unwrap().finished_at.is_some());
        let cells = store.cells("gone").unwrap();
        let state = |id: &str| {
            cells
                .iter()
                .find(|c| c.cell_id == id)
                .unwrap()
                .state
                .clone()
        };
        assert_eq!(state("c0"), "cancelled");
        assert_eq!(state("c1"), "cancelled");
        assert_eq!(
            state("c2"),
            "succeeded",
            "finished cells are kept as they were"
        );
        let c0 = cells.iter().find(|c| c.cell_id == "c0").unwrap();
        assert!(c0.error.as_deref().unwrap().contains("controller exited"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A succeeded cell's time, estimate by phase and data movement are
    /// what later plans learn their estimates from; failed cells teach
    /// nothing.
    #[test]
    fn succeeded_cells_teach_later_estimates() {
        let dir = std::env::temp_dir().join(format!("pgfleet-learn-{}", std::process::id()));
        let store = Store::open(&dir.join("s.db")).unwrap();
        let yaml = "name: t\nfleet: [{name: a, count: 1}]\nworkloads: [{kind: pgbench, scale: 1, duration_s: 5, replicas: 2}]\n";
        let sc = pgfleet_scenario::parse(std::path::Path::new("t.yaml"), yaml).unwrap();
        let cells = pgfleet_scenario::plan(&sc);
        let run = NewRun {
            cells: &cells,
            yaml,
            ..NewRun::bare("r", Owner::Run)
        };
        store.create_run(&run).unwrap();
        let env = serde_json::json!({"dataset": {"how": "restored", "restore_seconds": 0.5,
            "rewarm_seconds": 0.25, "wait_seconds": 0.125}});
        for (i, c) in cells.iter().enumerate() {
            store.start_cell("r", &c.cell_id, "a-0").unwrap();
            let state = if i == 1 {
                CellState::Failed
            } else {
                CellState::Succeeded
            };
            store
                .finish_cell("r", &c.cell_id, state, None, Some(&env), &[])
                .unwrap();
        }
        let past = store.past_estimates(10).unwrap();
        assert_eq!(past.len(), 1, "{past:?}");
        let p = &past[0];
        assert_eq!(
            (p.run_id.as_str(), p.cell_id.as_str()),
            ("r", cells[0].cell_id.as_str())
        );
        assert_eq!(p.how, "restored");
        let planned = CellEstimate::of(&cells[0]);
        assert_eq!(
            (&p.estimate.key, &p.estimate.capacity, p.estimate.dataset),
            (&planned.key, &planned.capacity, true)
        );
        // (Through JSON: the last digit may differ.)
        assert!((p.estimate.model.total() - cells[0].estimate().seconds).abs() < 1e-9);
        assert_eq!(p.data_seconds, 0.75);
        assert!(p.took_seconds >= -0.125 && p.took_seconds < 60.0, "{p:?}");
        // It took far less than the model's estimate: restores on this
        // capacity are corrected (to the lower bound), builds are not, and
        // the rest of pgbench cells on it, however they come by data.
        let learned = crate::learned::Learned::read(&store).unwrap();
        let (key, cap) = (cells[0].estimate_key(), cells[0].capacity_key());
        let c = learned.corrections(&key, &cap, "restored");
        let f = c.data.unwrap();
        assert_eq!(
            (f.cells, f.runs.as_slice()),
            (1, ["r".to_string()].as_slice())
        );
        assert!(f.ratio < 1.0, "{f:?}");
        assert_eq!(learned.corrections(&key, &cap, "built").data, None);
        assert!(learned.corrections(&key, &cap, "built").work.unwrap().ratio < 1.0);
        assert_eq!(
            store.cells("r").unwrap()[0]
                .estimate
                .as_ref()
                .map(|e| &e.key),
            Some(&planned.key)
        );
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A run and its cells are one write: when a cell cannot be stored,
    /// neither is the run (a crash between the two cannot leave a run
    /// without cells for the next `serve` to start).
    #[test]
    fn a_run_is_stored_with_its_cells_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("pgfleet-newrun-{}", std::process::id()));
        let store = Store::open(&dir.join("s.db")).unwrap();
        let yaml = "name: t\nfleet: [{name: a, count: 1}]\nworkloads: [{kind: pgbench-init, scale: 1, replicas: 2}]\n";
        let sc = pgfleet_scenario::parse(std::path::Path::new("t.yaml"), yaml).unwrap();
        let cells = pgfleet_scenario::plan(&sc);
        assert_eq!(cells.len(), 2);
        let run = |id, cells| NewRun {
            cells,
            ..NewRun::bare(id, Owner::Serve)
        };
        store.create_run(&run("ok", &cells)).unwrap();
        let stored = store.cells("ok").unwrap();
        assert_eq!(stored.len(), 2);
        // The plan's estimate is kept beside what the cell will take.
        assert_eq!(
            stored[0].estimate_seconds,
            Some(cells[0].estimate().seconds)
        );
        assert!(cells[0].estimate().seconds > 0.0);
        let twice = [cells[0].clone(), cells[0].clone()];
        assert!(store.create_run(&run("bad", &twice)).is_err());
        assert!(
            store.run("bad").unwrap().is_none(),
            "the run without its cells"
        );
        assert!(store.cells("bad").unwrap().is_empty());
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Labels are stored with the run and read back; a store made before
    /// runs had labels gains the column, and its runs have none.
    #[test]
    fn labels_are_kept_and_old_stores_gain_them() {
        let dir = std::env::temp_dir().join(format!("pgfleet-labels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.db");
        {
            // The runs table as stores had it before labels.
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE runs (id TEXT PRIMARY KEY, scenario_name TEXT NOT NULL, scenario_path TEXT NOT NULL,
                 scenario_yaml TEXT NOT NULL, status TEXT NOT NULL, started_at TEXT NOT NULL, finished_at TEXT,
                 controller_pid INTEGER, owner TEXT, idempotency_key TEXT);
                 INSERT INTO runs VALUES ('old', 's', 's.yaml', '', 'succeeded', '2026-01-01', NULL, 1, 'run', NULL);",
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert!(store.run("old").unwrap().unwrap().labels.is_empty());
        let labels = crate::labels::Labels::parse(&["commit=4f2a9c1", "branch=main"]).unwrap();
        store
            .create_run(&NewRun {
                labels: &labels,
                ..NewRun::bare("new", Owner::Run)
            })
            .unwrap();
        assert_eq!(store.run("new").unwrap().unwrap().labels, labels);
        let listed = store.runs().unwrap();
        assert_eq!(
            listed.iter().find(|r| r.id == "new").unwrap().labels,
            labels
        );
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every write goes through the one writer thread: writes from many
    /// threads at once all commit, each is visible to readers when its call
    /// returns, and a job that panics fails only its own caller.
    #[test]
    fn one_writer_serves_every_handle() {
        let dir = std::env::temp_dir().join(format!("pgfleet-writer-{}", std::process::id()));
        let store = Store::open(&dir.join("s.db")).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..25 {
                        let id = format!("r{t}-{i}");
                        store.create_run(&NewRun::bare(&id, Owner::Serve)).unwrap();
                        // Committed when the call returned: the reader sees it.
                        assert_eq!(store.run(&id).unwrap().unwrap().status, "queued");
                        store.start_run(&id).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.runs().unwrap().len(), 200);
        let e = store
            .with(|_| -> rusqlite::Result<()> { panic!("a bug in a write") })
            .unwrap_err();
        assert!(
            e.to_string().contains("failed inside the store's writer"),
            "{e}"
        );
        store.finish_run("r0-0", RunStatus::Succeeded).unwrap();
        assert_eq!(store.run("r0-0").unwrap().unwrap().status, "succeeded");
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
