//! The run queue (`RunQueue`) of the controller `run` and `serve` both build
//! (`controller.rs`): submission (validated, stored `queued`, idempotent by
//! key), the live runs' cells, cancel tokens and event streams, cancel, and
//! report rendering. `controller.rs` starts queued runs from it; `http.rs`
//! serves it as serve's API.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

use crate::agents::kubernetes::{KubeOptions, Snapshot, dataset_snapshots};
use crate::agents::local::LocalOptions;
use crate::runner::{RunAgents, Runner, fleet_needs};
use crate::scheduler::RunEvent;
use pgfleet_report as report;
use pgfleet_scenario as scenario;
use pgfleet_scenario::PlannedCell;
use pgfleet_scenario::plan::{Holdings, Stores};
use pgfleet_store::Error;
use pgfleet_store::Result;
use pgfleet_store::{NewRun, Owner, RunStatus};

/// The cluster runs' agents are launched on.
pub(crate) struct Kube {
    pub(crate) client: kube::Client,
    pub(crate) opts: KubeOptions,
    /// The dataset snapshots last listed (`refresh_snapshots`: at start,
    /// every minute and after each run), for the plans of runs submitted
    /// meanwhile.
    pub(crate) snapshots: Mutex<Vec<Snapshot>>,
}

impl Kube {
    pub(crate) fn new(client: kube::Client, opts: KubeOptions) -> Kube {
        Kube {
            client,
            opts,
            snapshots: Mutex::new(Vec::new()),
        }
    }

    /// Lists the dataset snapshots again, where the run's volumes may start
    /// from them (`--dataset-snapshots` without an object store). A list
    /// that fails keeps the last one.
    pub(crate) async fn refresh_snapshots(&self) {
        if self.opts.dataset_snapshots.is_empty() || self.opts.dataset_stores() == Stores::Shared {
            return;
        }
        match dataset_snapshots(&self.client, &self.opts.namespace).await {
            Ok(found) => *self.snapshots.lock().unwrap_or_else(|p| p.into_inner()) = found,
            Err(e) => tracing::warn!(
                "listing dataset snapshots in {}: {e}; plans keep the last list",
                self.opts.namespace
            ),
        }
    }
}

/// Where this controller's runs get their agents.
pub(crate) enum Source {
    /// Child processes launched for each run (`pgfleet run`); their logs
    /// go to `<report dir>/logs`.
    Local(LocalOptions),
    /// RunAgents that joined the controller (`serve`).
    Pool,
    /// Pods created for each run (`serve --agents kubernetes`).
    Kubernetes(Box<Kube>),
}

impl Source {
    /// What its agents' dataset stores hold before a run of `sc`, for the
    /// plan's estimates: local agents' one store; on Kubernetes, per pod,
    /// the dataset snapshot its volume will start from (or one object
    /// store); nothing known of joined agents' stores.
    pub(crate) fn holdings(&self, sc: &scenario::Scenario) -> Holdings {
        match self {
            Source::Local(opts) => {
                Holdings::shared(scenario::plan::published_in(&opts.dataset_dir))
            }
            Source::Pool => Holdings::default(),
            Source::Kubernetes(k) => {
                let found = k.snapshots.lock().unwrap_or_else(|p| p.into_inner());
                crate::agents::kubernetes::holdings(sc, &k.opts, &found)
            }
        }
    }

    /// The run's agents, as `Runner::execute` takes them.
    pub(crate) fn agents<'a>(&'a self, log_dir: &'a Path) -> RunAgents<'a> {
        match self {
            Source::Local(opts) => RunAgents::Local { opts, log_dir },
            Source::Pool => RunAgents::Pool,
            Source::Kubernetes(k) => RunAgents::Kubernetes {
                client: &k.client,
                opts: &k.opts,
            },
        }
    }
}

/// A run this process is executing or has queued.
pub(crate) struct Live {
    /// Its place in the queue: runs start in this order.
    pub(crate) seq: u64,
    pub(crate) scenario: Arc<scenario::Scenario>,
    /// The cells it runs (planned when it was queued).
    pub(crate) cells: Vec<PlannedCell>,
    /// Where its report (and local agents' logs) go.
    pub(crate) report_dir: PathBuf,
    pub(crate) cancel: CancellationToken,
    pub(crate) events: broadcast::Sender<RunEvent>,
    pub(crate) classes: BTreeSet<String>,
    pub(crate) started: bool,
}

/// What the HTTP API and the queue share.
pub struct RunQueue {
    pub service: Runner,
    /// The bearer tokens of the HTTP API (none: no API, as for `run`).
    pub api_tokens: Option<crate::tokens::ApiTokens>,
    pub reports: PathBuf,
    pub max_scenario_bytes: usize,
    /// Accept scenarios with `allow_shell` (`--allow-shell-scenarios`).
    pub allow_shell_scenarios: bool,
    /// Runs that may wait in the queue; a submission past it is refused
    /// (429) until one starts or ends.
    pub max_queued_runs: usize,
    /// The most cells a scenario may plan here (`serve --max-cells`),
    /// counted before any is built.
    pub max_cells: u64,
    pub(crate) metrics_retention: Duration,
    pub(crate) source: Source,
    pub(crate) live: Mutex<HashMap<String, Live>>,
    /// The next run's place in the queue.
    pub(crate) next_seq: AtomicU64,
    pub(crate) wake: Notify,
    /// Submissions admitted but not yet in `live` (see `admit`).
    pub(crate) admitted: std::sync::atomic::AtomicUsize,
}

/// A place in the queue, taken by `admit` together with the count; given
/// back when the submission is queued (it then counts in `live`) or not.
pub(crate) struct Admission<'q>(&'q std::sync::atomic::AtomicUsize);

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A validated run to store and queue.
pub(crate) struct Queued<'a> {
    pub(crate) scenario: &'a scenario::Scenario,
    /// The scenario's file name (as given).
    pub(crate) path: &'a str,
    pub(crate) yaml: &'a str,
    pub(crate) owner: Owner,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) labels: pgfleet_scenario::labels::Labels,
    pub(crate) cells: Vec<PlannedCell>,
    /// Where its report goes (default: `<reports>/<run-id>`).
    pub(crate) report_dir: Option<PathBuf>,
}

/// A submission that was not accepted.
pub enum Rejected {
    /// The scenario is invalid: the same located error the CLI prints.
    Invalid(scenario::ScenarioError),
    /// Valid, but this server does not run what it asks (e.g. allow_shell).
    Forbidden(scenario::ScenarioError),
    /// The queue is full: this many runs wait.
    Busy(usize),
    /// An idempotency key this token used for another scenario (409).
    Conflict(String),
    Store(Error),
}

impl From<Rejected> for Error {
    fn from(r: Rejected) -> Error {
        match r {
            Rejected::Invalid(e) | Rejected::Forbidden(e) => e.into(),
            Rejected::Busy(n) => Error::Usage(format!("{n} runs wait in the queue: retry later")),
            Rejected::Conflict(m) => Error::Usage(m),
            Rejected::Store(e) => e,
        }
    }
}

impl RunQueue {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Validates and stores a run, queued. With an idempotency key already
    /// used for the same scenario, returns that run instead (second value:
    /// whether it is new); used for another scenario, refuses. The caller
    /// scopes keys to its client (`http::scoped_key`: one token's keys
    /// never name another's runs).
    pub fn submit(
        &self,
        name: &str,
        yaml: &str,
        idempotency_key: Option<&str>,
        labels: pgfleet_scenario::labels::Labels,
    ) -> Result<(String, bool), Rejected> {
        if let Some(k) = idempotency_key
            && let Some(id) = self
                .service
                .store
                .run_by_idempotency_key(k)
                .map_err(Rejected::Store)?
        {
            let earlier = self
                .service
                .store
                .scenario_yaml(&id)
                .map_err(Rejected::Store)?;
            if earlier.as_deref() != Some(yaml) {
                return Err(Rejected::Conflict(
                    "this Idempotency-Key was used for another scenario: send a new key for a new submission (a retry must repeat the same body)".into(),
                ));
            }
            return Ok((id, false));
        }
        let sc = self.checked(name, yaml)?;
        let admission = self.admit()?;
        let cells = self.plan_of(&sc);
        let run_id = self.queue_run(Queued {
            scenario: &sc,
            path: name,
            yaml,
            owner: Owner::Serve,
            idempotency_key,
            labels,
            cells,
            report_dir: None,
        })?;
        drop(admission);
        Ok((run_id, true))
    }

    /// The scenario of a submission, refused as a submission would be:
    /// invalid, asking for a shell this server does not allow, or what a
    /// pod cannot do (emulated caps, instance cgroups) — now, not when the
    /// run's turn comes.
    fn checked(&self, name: &str, yaml: &str) -> Result<scenario::Scenario, Rejected> {
        let sc = scenario::parse(Path::new(name), yaml).map_err(Rejected::Invalid)?;
        scenario::validate::refuse_cells_over(&sc, self.max_cells).map_err(|e| {
            Rejected::Invalid(scenario::ScenarioError::located(Path::new(name), yaml, e))
        })?;
        if !self.allow_shell_scenarios
            && let Some(e) = sc.shell_refusal(Path::new(name))
        {
            return Err(Rejected::Forbidden(e));
        }
        if let Source::Kubernetes(k) = &self.source {
            crate::agents::kubernetes::plan(&sc, "submitted", &k.opts).map_err(|e| {
                Rejected::Invalid(scenario::ScenarioError::located(Path::new(name), yaml, e))
            })?;
        }
        Ok(sc)
    }

    /// Its cells on this server's agents and stores, with what earlier
    /// cells on the store teach applied to their estimates.
    fn plan_of(&self, sc: &scenario::Scenario) -> Vec<PlannedCell> {
        let mut cells = scenario::plan::plan_for(sc, &self.source.holdings(sc));
        self.learn_estimates(&mut cells);
        cells
    }

    /// What a submission of `yaml` would run and how long it would take
    /// (`POST /v1/plan`); nothing is stored or queued.
    pub fn plan(
        &self,
        name: &str,
        yaml: &str,
    ) -> Result<(scenario::Scenario, Vec<PlannedCell>), Rejected> {
        let sc = self.checked(name, yaml)?;
        let cells = self.plan_of(&sc);
        Ok((sc, cells))
    }

    /// Admits one submission when fewer than `max_queued_runs` wait,
    /// counting those admitted but not yet queued: the count and the
    /// reservation happen under the queue's lock, so concurrent
    /// submissions never queue more than the bound.
    fn admit(&self) -> Result<Admission<'_>, Rejected> {
        let live = self.lock();
        let waiting =
            live.values().filter(|l| !l.started).count() + self.admitted.load(Ordering::SeqCst);
        if waiting >= self.max_queued_runs {
            return Err(Rejected::Busy(waiting));
        }
        self.admitted.fetch_add(1, Ordering::SeqCst);
        drop(live);
        Ok(Admission(&self.admitted))
    }

    /// Stores a validated run, queued, with its cells, and queues it.
    pub(crate) fn queue_run(&self, q: Queued<'_>) -> Result<String, Rejected> {
        let run_id = crate::runner::new_run_id();
        let store = &self.service.store;
        store
            .create_run(&NewRun {
                id: &run_id,
                name: &q.scenario.name.value,
                path: q.path,
                yaml: q.yaml,
                owner: q.owner,
                idempotency_key: q.idempotency_key,
                labels: &q.labels,
                cells: &q.cells,
                estimated_seconds: pgfleet_scenario::plan::estimate(q.scenario, &q.cells)
                    .wall_seconds,
            })
            .map_err(|e| {
                match q
                    .idempotency_key
                    .and_then(|k| store.run_by_idempotency_key(k).ok().flatten())
                {
                    // Two submissions with one key raced: the other won.
                    Some(_) => Rejected::Store(Error::Store(
                        "a submission with this idempotency key is being stored; retry".into(),
                    )),
                    None => Rejected::Store(e),
                }
            })?;
        let report_dir = q.report_dir.unwrap_or_else(|| self.reports.join(&run_id));
        tracing::info!(run = %run_id, scenario = %q.scenario.name.value, cells = q.cells.len(), "run queued");
        self.enqueue(&run_id, q.scenario, q.cells, report_dir);
        Ok(run_id)
    }

    /// Corrects a fresh plan's estimates by what earlier cells on the store
    /// took (`learned`); the model's where the store cannot say.
    pub(crate) fn learn_estimates(&self, cells: &mut [PlannedCell]) {
        match pgfleet_store::learned::Learned::read(&self.service.store) {
            Ok(l) => {
                l.apply(cells);
            }
            Err(e) => tracing::warn!("estimates not learned from the store: {e}"),
        }
    }

    pub(crate) fn enqueue(
        &self,
        run_id: &str,
        sc: &scenario::Scenario,
        cells: Vec<PlannedCell>,
        report_dir: PathBuf,
    ) {
        let (events, _) = broadcast::channel(1024);
        self.lock().insert(
            run_id.to_string(),
            Live {
                seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
                scenario: Arc::new(sc.clone()),
                cells,
                report_dir,
                cancel: CancellationToken::new(),
                events,
                classes: fleet_needs(sc).into_keys().collect(),
                started: false,
            },
        );
        self.wake.notify_one();
    }

    /// Subscribes to a live run's events; None when it is not live.
    pub fn subscribe(&self, run_id: &str) -> Option<broadcast::Receiver<RunEvent>> {
        self.lock().get(run_id).map(|l| l.events.subscribe())
    }

    /// Cancels a live run. A queued one ends at once; a running one stops
    /// its cells. False when the run is not live (finished or unknown).
    pub fn cancel(&self, run_id: &str) -> bool {
        let queued = {
            let mut live = self.lock();
            let Some(l) = live.get(run_id) else {
                return false;
            };
            l.cancel.cancel();
            // A queued run leaves the queue here, under the lock the queue
            // starts runs under: it cannot start any more.
            if l.started { None } else { live.remove(run_id) }
        };
        if let Some(l) = queued {
            let store = &self.service.store;
            let _ = store.interrupt(run_id, "run cancelled before it started");
            let _ = store.finish_run(run_id, RunStatus::Cancelled);
            let _ = l.events.send(RunEvent::Run {
                status: RunStatus::Cancelled.as_str().into(),
            });
            self.wake.notify_one();
        }
        true
    }

    /// The report directory of a run, rendered from the store (again, if
    /// the run has moved on since).
    pub fn report_dir(&self, run_id: &str) -> Result<PathBuf> {
        let dir = self.reports.join(run_id);
        let finished = self
            .service
            .store
            .run(run_id)?
            .and_then(|r| RunStatus::parse(&r.status))
            .is_some_and(RunStatus::is_terminal);
        // Reports written by an older version may lack a file: rendered again.
        let complete = ["report.json", "report.md", "report.html"]
            .iter()
            .all(|f| dir.join(f).exists());
        if !finished || !complete {
            report::write(&self.service.store, run_id, &dir)?;
        }
        Ok(dir)
    }

    /// Whether the controller can take work: the store answers and agents
    /// can connect.
    pub fn ready(&self) -> bool {
        self.service.agent_addr().is_some() && self.service.store.runs().is_ok()
    }
}
