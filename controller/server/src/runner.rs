//! The controller's long-lived parts, built once and shared by every run:
//! the store, the hub and the agents' gRPC endpoint. `pgfleet run` builds
//! one for a single run on loopback; `pgfleet serve` builds one and keeps it
//! for every run submitted to it. Each run gets its own scheduler; the hub
//! routes each agent's events to the run that holds it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agents::AgentSource;
use crate::agents::kubernetes::{self, KubeAgents, KubeOptions};
use crate::agents::local::{self, LocalAgents, LocalOptions};
use crate::grpc;
use crate::hub::Hub;
use crate::scheduler::{self, RunEvent, Scheduler};
use pgfleet_scenario::{PlannedCell, Scenario};
use pgfleet_store::Error;
use pgfleet_store::Result;
use pgfleet_store::{CellState, RunStatus, Store};

#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub store: PathBuf,
    pub bind: SocketAddr,
    /// What agents dial (default: `http(s)://<bound address>`).
    pub advertise_url: Option<String>,
    pub lease: Duration,
    /// How long a run waits for its agents: launched ones to register, or,
    /// from the pool, enough idle ones of each class to join.
    pub registration_timeout: Duration,
    /// PEM certificate and key: the agent session speaks TLS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The CA local agents trust (default: `tls_cert`).
    pub tls_ca: Option<PathBuf>,
    /// The join token agents must present (default: a random one, handed
    /// to local agents in a file only its owner can read).
    pub join_token_file: Option<PathBuf>,
    /// RunAgents nobody launched may join and wait for runs (`serve`).
    pub pool: bool,
    /// Progress bars on a terminal (`run`) rather than log lines.
    pub interactive: bool,
}

/// Where a run's agents come from.
pub enum RunAgents<'a> {
    /// One child process per fleet instance, launched for the run and shut
    /// down after it.
    Local {
        opts: &'a LocalOptions,
        log_dir: &'a Path,
    },
    /// Idle agents of the fleet's classes that joined the controller
    /// (`pgfleet-agent run --class NAME`); they go back to the pool after.
    Pool,
    /// One pod (and volume) per fleet instance on a Kubernetes cluster,
    /// created for the run and deleted after it.
    Kubernetes {
        client: &'a kube::Client,
        opts: &'a KubeOptions,
    },
}

/// A run to execute: stored already, cells planned.
pub struct RunSpec<'a> {
    pub run_id: &'a str,
    pub scenario: &'a Scenario,
    pub cells: Vec<PlannedCell>,
    /// The plan's wall-clock estimate on the fleet, in seconds.
    pub estimated_wall: f64,
}

pub struct Runner {
    pub store: Store,
    pub hub: Hub,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The agents' endpoint, once `listen` started it.
    server: Option<grpc::Server>,
    security: grpc::Security,
    bind: SocketAddr,
    advertise_url: Option<String>,
    token: String,
    ca: Option<PathBuf>,
    lease: Duration,
    registration_timeout: Duration,
    interactive: bool,
}

/// The session's security from the options: TLS material and the token.
fn security(cfg: &RunnerConfig) -> Result<grpc::Security> {
    let read = |p: &Path, what: &str| {
        std::fs::read(p)
            .map_err(|e| Error::Usage(format!("reading the {what} {}: {e}", p.display())))
    };
    let tls = match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(c), Some(k)) => Some((read(c, "TLS certificate")?, read(k, "TLS key")?)),
        (None, None) => None,
        _ => {
            return Err(Error::Usage(
                "--tls-cert and --tls-key go together: give both, or neither for plaintext on loopback".into(),
            ));
        }
    };
    let token = match &cfg.join_token_file {
        Some(f) => pgfleet_client::read_token(f, "join token file")?,
        None => pgfleet_client::random_hex(32),
    };
    Ok(grpc::Security {
        tls,
        token: Some(token),
    })
}

/// Ends a run the one way for `run` and `serve`: its status stored, then
/// its report written into `report_dir` from the store (returned).
pub fn conclude(
    store: &Store,
    run_id: &str,
    status: RunStatus,
    report_dir: &Path,
) -> Result<pgfleet_report::Report> {
    store.finish_run(run_id, status)?;
    pgfleet_report::write(store, run_id, report_dir)
}

/// A new run id: UTC time plus random bits, sortable and unique enough.
pub fn new_run_id() -> String {
    format!(
        "{}-{}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S"),
        pgfleet_client::random_hex(3)
    )
}

/// How many agents of each class a fleet has.
pub fn fleet_needs(sc: &Scenario) -> BTreeMap<String, usize> {
    let mut needs = BTreeMap::new();
    for f in &sc.fleet.value {
        *needs.entry(f.name.value.clone()).or_default() += f.count() as usize;
    }
    needs
}

impl Runner {
    /// The store and the hub; agents cannot connect until `listen`.
    pub fn build(cfg: &RunnerConfig) -> Result<Runner> {
        let security = security(cfg)?;
        let store = Store::open(&cfg.store)?;
        Ok(Runner {
            store,
            hub: Hub::new(cfg.pool),
            metrics: Default::default(),
            server: None,
            token: security.token.clone().unwrap_or_default(),
            security,
            bind: cfg.bind,
            advertise_url: cfg.advertise_url.clone(),
            ca: cfg.tls_ca.clone().or_else(|| cfg.tls_cert.clone()),
            lease: cfg.lease,
            registration_timeout: cfg.registration_timeout,
            interactive: cfg.interactive,
        })
    }

    /// Starts the agents' gRPC endpoint.
    pub async fn listen(&mut self) -> Result<()> {
        if self.server.is_none() {
            self.server = Some(
                grpc::listen(
                    self.bind,
                    self.hub.clone(),
                    self.lease,
                    self.security.clone(),
                )
                .await?,
            );
        }
        Ok(())
    }

    /// Where the agents' endpoint listens (once listening).
    pub fn agent_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(|s| s.addr)
    }

    /// What agents dial.
    pub fn agent_url(&self) -> String {
        match (&self.advertise_url, &self.server) {
            (Some(u), _) => u.clone(),
            (None, Some(s)) => s.url(),
            (None, None) => String::new(),
        }
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Runs a stored run to its end: gets its agents, schedules its cells,
    /// gives the agents back. Returns the run's status (the caller stores
    /// it); an error means the run could not start (its agents could not be
    /// launched).
    pub async fn execute(
        &self,
        spec: RunSpec<'_>,
        agents: RunAgents<'_>,
        cancel: CancellationToken,
        events: Option<broadcast::Sender<RunEvent>>,
    ) -> Result<RunStatus> {
        let run_id = spec.run_id;
        let (tx, rx) = mpsc::channel(4096);
        let mut source: Option<Box<dyn AgentSource>> = None;
        let expected: Vec<(String, String)> = match agents {
            RunAgents::Local { opts, log_dir } => {
                let planned = local::fleet_agents(spec.scenario);
                let ids: Vec<String> = planned.iter().map(|l| l.agent_id.clone()).collect();
                // Before launching: a fast agent must find its run.
                self.hub.expect(run_id, &ids, tx.clone());
                let access = local::Access {
                    controller: self.agent_url(),
                    token: self.token.clone(),
                    ca: self.ca.clone(),
                };
                match LocalAgents::launch(
                    spec.scenario,
                    run_id,
                    &access,
                    opts.clone(),
                    log_dir,
                    tx.clone(),
                )
                .await
                {
                    Ok(s) => source = Some(Box::new(s)),
                    Err(e) => {
                        self.hub.release(run_id, true).await;
                        return Err(e);
                    }
                }
                planned
                    .into_iter()
                    .map(|l| (l.agent_id, l.instance_class))
                    .collect()
            }
            RunAgents::Kubernetes { client, opts } => {
                let planned = kubernetes::planned_agents(spec.scenario, run_id, opts)
                    .map_err(|e| Error::Agents(format!("{}: {}", e.field, e.message)))?;
                let ids: Vec<String> = planned.iter().map(|l| l.agent_id.clone()).collect();
                self.hub.expect(run_id, &ids, tx.clone());
                match KubeAgents::launch(client.clone(), spec.scenario, run_id, opts, tx.clone())
                    .await
                {
                    Ok(s) => source = Some(Box::new(s)),
                    Err(e) => {
                        self.hub.release(run_id, true).await;
                        let why = format!("the run's agents could not be created: {e}");
                        self.end_unstarted(run_id, &spec.cells, CellState::Failed, &why, &events);
                        return Ok(RunStatus::Failed);
                    }
                }
                planned
                    .into_iter()
                    .map(|l| (l.agent_id, l.instance_class))
                    .collect()
            }
            RunAgents::Pool => {
                let needs = fleet_needs(spec.scenario);
                match self.claim(run_id, &needs, tx.clone(), &cancel).await {
                    Ok(v) => v,
                    Err((status, why)) => {
                        self.end_unstarted(run_id, &spec.cells, status, &why, &events);
                        return Ok(if status == CellState::Cancelled {
                            RunStatus::Cancelled
                        } else {
                            RunStatus::Failed
                        });
                    }
                }
            }
        };
        let owns_agents = source.is_some();
        let sched = Scheduler::new(
            run_id,
            self.store.clone(),
            scheduler::Options {
                lease: self.lease,
                registration_timeout: self.registration_timeout,
                estimated_wall: Some(Duration::from_secs_f64(spec.estimated_wall)),
                interactive: self.interactive,
                events,
                metrics: Some(self.metrics.clone()),
                scenario: spec.scenario.name.value.clone(),
                oversubscribe: spec.scenario.oversubscribe(),
                postgres_versions: spec.scenario.named_postgres_versions(),
                ..Default::default()
            },
            spec.cells,
            &expected,
        );
        let status = sched.run(rx, cancel).await;
        self.hub.release(run_id, owns_agents).await;
        if let Some(mut s) = source {
            let cells = self.store.cells(run_id).unwrap_or_else(|e| {
                tracing::error!(
                    run = run_id,
                    "reading the run's cells for its source's end: {e}"
                );
                Vec::new()
            });
            let end = crate::agents::RunEnd::of(status == RunStatus::Succeeded, &cells);
            let kept = s.finish(end).await;
            self.record_kept(run_id, kept);
        }
        Ok(status)
    }

    /// Stores what a run's source kept for debugging (`cleanup: keep`).
    pub fn record_kept(&self, run_id: &str, kept: Option<serde_json::Value>) {
        if let Some(k) = kept
            && let Err(e) = self.store.set_kept(run_id, &k)
        {
            tracing::error!(run = run_id, "storing what the run kept ({k}): {e}");
        }
    }

    /// Takes the run's agents from the pool, waiting up to the registration
    /// timeout for enough to join. Err: the cells' end state and why.
    async fn claim(
        &self,
        run_id: &str,
        needs: &BTreeMap<String, usize>,
        tx: mpsc::Sender<crate::events::Event>,
        cancel: &CancellationToken,
    ) -> Result<Vec<(String, String)>, (CellState, String)> {
        let deadline = Instant::now() + self.registration_timeout;
        let mut said = false;
        loop {
            match self.hub.claim(run_id, needs, tx.clone()).await {
                Ok(v) => return Ok(v),
                Err(short) => {
                    let why = short
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join("; ");
                    if Instant::now() >= deadline {
                        return Err((
                            CellState::Failed,
                            format!(
                                "not enough agents joined within {:?}: {why}",
                                self.registration_timeout
                            ),
                        ));
                    }
                    if !said {
                        tracing::info!(run = run_id, "waiting for agents: {why}");
                        said = true;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = cancel.cancelled() => {
                    return Err((CellState::Cancelled, "run cancelled before its agents joined".into()));
                }
            }
        }
    }

    /// Ends every cell of a run that never got its agents.
    fn end_unstarted(
        &self,
        run_id: &str,
        cells: &[PlannedCell],
        state: CellState,
        why: &str,
        events: &Option<broadcast::Sender<RunEvent>>,
    ) {
        for (i, c) in cells.iter().enumerate() {
            if let Err(e) = self
                .store
                .finish_cell(run_id, &c.cell_id, state, Some(why), None, &[])
            {
                tracing::error!(run = run_id, cell = %c.cell_id, "storing the cell's end: {e}");
            }
            if let Some(tx) = events {
                let _ = tx.send(RunEvent::Cell {
                    cell_id: c.cell_id.clone(),
                    state: state.as_str().into(),
                    agents: String::new(),
                    error: Some(why.to_string()),
                    done: i + 1,
                    total: cells.len(),
                });
            }
        }
        if !self.interactive {
            tracing::warn!(run = run_id, "{why}");
        } else {
            eprintln!("{why}");
        }
    }

    pub async fn shutdown(self) {
        if let Some(s) = self.server {
            s.shutdown().await;
        }
    }
}
