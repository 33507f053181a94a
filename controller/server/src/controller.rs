//! The controller `run` and `serve` both build, the one way:
//! `Controller::build` makes the store, hub and agents' gRPC endpoint
//! (`Runner`), the run queue (`RunQueue`) with where its runs' agents come
//! from (`Source`), and the HTTP side (serve's API, or only `/metrics` for
//! `run --metrics-addr`); `Controller::drive` starts queued runs as their
//! turn comes and concludes each (status stored, report written).
//!
//! `pgfleet run` queues its one scenario and drives until it ends; `pgfleet
//! serve` drives until it is told to stop. A run starts while others run
//! only when no earlier unfinished run shares an instance class with it
//! (runs on disjoint fleets go side by side, the others wait their turn).
//!
//! Where agents outlive the controller (the pool, Kubernetes pods), a
//! rebuilt controller resumes what the last one left: queued runs wait
//! again, and running runs are rebuilt from the store; their agents, which
//! keep their clusters and cells while the controller is away, reconnect,
//! report the cells they still run and replay the results not yet
//! acknowledged. Results stored before the restart are not redone; agents
//! that do not come back within the lease are lost and their cells fail.
//! Local agents die with their controller: what they left is reaped instead.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agents::kubernetes::{self, KubeAgents, KubeOptions};
use crate::agents::local::{self, LocalOptions};
use crate::http::HttpServer;
use crate::queue::{Kube, RunQueue, Source};
use crate::runner::{RunSpec, Runner, RunnerConfig};
use crate::scheduler::{self, RunEvent, Scheduler};
use pgfleet_scenario as scenario;
use pgfleet_store::Error;
use pgfleet_store::Result;
use pgfleet_store::RunStatus;

/// Where the controller's runs get their agents.
#[derive(Clone)]
pub enum AgentSupply {
    /// Child processes on this host, launched per run (`pgfleet run`).
    Local(LocalOptions),
    /// AgentSupply that join (`pgfleet-agent run --class NAME`).
    Pool,
    /// Pods created per run on the cluster the controller can reach.
    Kubernetes(KubeOptions),
    /// Pods, through this client rather than the in-cluster or kubeconfig
    /// one (the tests' fake API server).
    KubernetesClient(KubeOptions, kube::Client),
}

/// The controller's HTTP side.
#[derive(Debug, Clone)]
pub enum Http {
    /// serve's API (and `/metrics`), for holders of a token in the file;
    /// over TLS with (certificate chain, key).
    Api {
        bind: SocketAddr,
        api_token_file: PathBuf,
        tls: Option<(PathBuf, PathBuf)>,
    },
    /// Only `/metrics` and `/sd/agents` (`run --metrics-addr`).
    Metrics { bind: SocketAddr },
}

#[derive(Clone)]
pub struct ControllerConfig {
    pub service: RunnerConfig,
    pub agents: AgentSupply,
    pub http: Option<Http>,
    /// Reports of runs queued without a report directory: `<reports>/<id>/`.
    pub reports: PathBuf,
    /// The largest scenario accepted over the API, in bytes.
    pub max_scenario_bytes: usize,
    /// Runs that may wait in the queue (then 429).
    pub max_queued_runs: usize,
    /// The most cells a submitted scenario may plan (at most
    /// `validate::MAX_CELLS`).
    pub max_cells: u64,
    /// Accept submitted scenarios with `allow_shell`.
    pub allow_shell_scenarios: bool,
    /// How long a finished run's series stay on `/metrics`.
    pub metrics_retention: Duration,
}

/// A run's end, as the controller concluded it.
pub struct Finished {
    pub run_id: String,
    pub status: RunStatus,
    /// report.json's document, when the report could be written.
    pub report: Option<pgfleet_report::Report>,
    /// Why the run could not start (its agents could not be launched), or
    /// why its end or report could not be stored.
    pub error: Option<Error>,
}

pub struct Controller {
    pub served: Arc<RunQueue>,
    http: Option<HttpServer>,
    /// Scrapes of `/metrics` served (the metrics-only side counts them).
    scrapes: Arc<AtomicU64>,
    done_tx: mpsc::Sender<Finished>,
    done_rx: mpsc::Receiver<Finished>,
}

impl Controller {
    /// Everything a controller holds, listening: the store opened, what
    /// interrupted runs left cleaned up (or, where agents outlive the
    /// controller, their runs resumed), agents' endpoint and HTTP bound.
    pub async fn build(cfg: &ControllerConfig) -> Result<Controller> {
        let api_tokens = match &cfg.http {
            Some(Http::Api { api_token_file, .. }) => {
                Some(crate::tokens::ApiTokens::load(api_token_file)?)
            }
            _ => None,
        };
        let mut service = Runner::build(&cfg.service)?;
        let resumes = !matches!(cfg.agents, AgentSupply::Local(_));
        // Before agents can connect: their registrations must find the runs
        // they belong to.
        let mut inboxes = if resumes {
            resume_prepare(&service)?
        } else {
            Inboxes::new()
        };
        let source = match &cfg.agents {
            AgentSupply::Local(opts) => {
                for id in local::reap_finished_runs(opts, &service.store).await {
                    eprintln!("cleaned up what interrupted run {id} left in the data dir");
                }
                Source::Local(opts.clone())
            }
            AgentSupply::Pool => Source::Pool,
            AgentSupply::Kubernetes(k) => {
                Source::Kubernetes(Box::new(connect_kube(k, None, &service.store).await?))
            }
            AgentSupply::KubernetesClient(k, client) => Source::Kubernetes(Box::new(
                connect_kube(k, Some(client.clone()), &service.store).await?,
            )),
        };
        service.listen().await?;
        let served = Arc::new(RunQueue {
            service,
            api_tokens,
            reports: cfg.reports.clone(),
            max_scenario_bytes: cfg.max_scenario_bytes,
            max_queued_runs: cfg.max_queued_runs.max(1),
            max_cells: cfg.max_cells.clamp(1, scenario::validate::MAX_CELLS),
            allow_shell_scenarios: cfg.allow_shell_scenarios,
            metrics_retention: cfg.metrics_retention,
            source,
            live: Default::default(),
            next_seq: AtomicU64::new(0),
            wake: Notify::new(),
            admitted: Default::default(),
        });
        let scrapes = Arc::new(AtomicU64::new(0));
        let http = match &cfg.http {
            Some(Http::Api { bind, tls, .. }) => {
                let tls = match tls {
                    Some((cert, key)) => Some(crate::http::tls_config(cert, key)?),
                    None => None,
                };
                Some(crate::http::listen(*bind, served.clone(), tls).await?)
            }
            Some(Http::Metrics { bind }) => Some(
                crate::http::listen_metrics(
                    *bind,
                    crate::http::MetricsSource {
                        metrics: served.service.metrics.clone(),
                        hub: served.service.hub.clone(),
                        store: served.service.store.clone(),
                        scrapes: scrapes.clone(),
                    },
                )
                .await?,
            ),
            None => None,
        };
        let (done_tx, done_rx) = mpsc::channel(64);
        if resumes {
            resume_runs(&served, &mut inboxes, &done_tx);
        }
        Ok(Controller {
            served,
            http,
            scrapes,
            done_tx,
            done_rx,
        })
    }

    /// The HTTP side's address and whether it speaks TLS.
    pub fn http(&self) -> Option<(SocketAddr, bool)> {
        self.http.as_ref().map(|h| (h.addr, h.tls))
    }

    /// Scrapes the metrics-only side has served.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(Ordering::Relaxed)
    }

    /// Starts queued runs as their turn comes until `stop` (None) or, with
    /// `until`, until that run has ended (its end). Ends of other runs are
    /// logged.
    pub async fn drive(
        &mut self,
        until: Option<&str>,
        stop: &CancellationToken,
    ) -> Option<Finished> {
        loop {
            start_next(&self.served, &self.done_tx);
            tokio::select! {
                _ = self.served.wake.notified() => {}
                Some(f) = self.done_rx.recv() => {
                    self.served.lock().remove(&f.run_id);
                    if until == Some(f.run_id.as_str()) {
                        return Some(f);
                    }
                    eprintln!("run {} {}", f.run_id, f.status.as_str());
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.cancelled() => return None,
            }
        }
    }

    /// Stops the HTTP side and the agents' endpoint. Runs still executing
    /// are not cancelled: their agents keep their cells and reconnect to
    /// the next controller on this store within their give-up time.
    pub async fn shutdown(self) {
        if let Some(h) = self.http {
            h.shutdown().await;
        }
        match Arc::try_unwrap(self.served) {
            Ok(s) => s.service.shutdown().await,
            Err(_) => tracing::debug!("runs still hold the service; the process exit ends it"),
        }
    }
}

/// The Kubernetes client (in-cluster, else the kubeconfig), checked by
/// deleting what runs that are not running left on the cluster.
async fn connect_kube(
    opts: &KubeOptions,
    client: Option<kube::Client>,
    store: &pgfleet_store::Store,
) -> Result<Kube> {
    let client = match client {
        Some(c) => c,
        None => kube::Client::try_default().await.map_err(|e| {
            Error::Usage(format!(
                "--agents kubernetes: no Kubernetes API to talk to ({e}); run in a pod with a ServiceAccount (deploy/base) or set KUBECONFIG"
            ))
        })?,
    };
    let running = |run: &str| matches!(store.run(run), Ok(Some(r)) if r.status == "running" || r.status == "queued");
    for run in kubernetes::reap(&client, &opts.namespace, running).await? {
        eprintln!("deleted the pods and volumes that interrupted run {run} left on the cluster");
    }
    let kube = Kube::new(client, opts.clone());
    kube.refresh_snapshots().await;
    Ok(kube)
}

/// The schedulers' inboxes of the runs the last controller was running,
/// made before agents can connect so their registrations find their runs.
type Inboxes = HashMap<String, Inbox>;
/// A resumed run's inbox, and its sender for its agent source's events.
type Inbox = (
    mpsc::Sender<crate::events::Event>,
    mpsc::Receiver<crate::events::Event>,
);

fn resume_prepare(service: &Runner) -> Result<Inboxes> {
    let mut inboxes = HashMap::new();
    for (id, status, _pid) in service.store.unfinished_served_runs()? {
        if status != "running" {
            continue;
        }
        let agents: Vec<String> = service
            .store
            .agents(&id)?
            .into_iter()
            .filter(|a| a.lost_at.is_none())
            .map(|a| a.agent_id)
            .collect();
        let (tx, rx) = mpsc::channel(4096);
        service.hub.adopt(&id, &agents, tx.clone());
        inboxes.insert(id, (tx, rx));
    }
    Ok(inboxes)
}

/// Queues the runs the last controller queued, and rebuilds the ones it
/// ran (those `resume_prepare` made inboxes for).
fn resume_runs(served: &Arc<RunQueue>, inboxes: &mut Inboxes, done: &mpsc::Sender<Finished>) {
    let runs = match served.service.store.unfinished_served_runs() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("reading unfinished runs: {e}");
            return;
        }
    };
    for (id, _, _) in runs {
        let yaml = served.service.store.scenario_yaml(&id).ok().flatten();
        let sc = match scenario::parse(Path::new("scenario.yaml"), yaml.as_deref().unwrap_or("")) {
            Ok(sc) => sc,
            Err(e) => {
                let _ = served
                    .service
                    .store
                    .interrupt(&id, &format!("its stored scenario no longer parses: {e}"));
                continue;
            }
        };
        let mut cells = scenario::plan::plan_for(&sc, &served.source.holdings(&sc));
        served.learn_estimates(&mut cells);
        served.enqueue(&id, &sc, cells, served.reports.join(&id));
        if let Some(inbox) = inboxes.remove(&id) {
            eprintln!("resuming run {id}: waiting for its agents to reconnect");
            if let Some(l) = served.lock().get_mut(&id) {
                l.started = true;
            }
            spawn_run(served.clone(), id, Some(inbox), done.clone());
        } else {
            eprintln!("run {id} queued again");
        }
    }
}

/// Starts every queued run whose turn it is, in queue order.
fn start_next(served: &Arc<RunQueue>, done: &mpsc::Sender<Finished>) {
    let mut start = Vec::new();
    {
        // Decide and mark under one lock (a cancel takes the same lock).
        let mut live = served.lock();
        let mut busy: BTreeSet<String> = live
            .values()
            .filter(|l| l.started)
            .flat_map(|l| l.classes.iter().cloned())
            .collect();
        let mut queued: Vec<(u64, String)> = live
            .iter()
            .filter(|(_, l)| !l.started)
            .map(|(id, l)| (l.seq, id.clone()))
            .collect();
        queued.sort();
        for (_, id) in queued {
            let Some(l) = live.get_mut(&id) else {
                continue;
            };
            let free = l.classes.is_disjoint(&busy);
            busy.extend(l.classes.iter().cloned());
            if free {
                l.started = true;
                start.push(id);
            }
        }
    }
    for id in start {
        spawn_run(served.clone(), id, None, done.clone());
    }
}

/// Runs `execute` on its own task; should it panic, the run still ends
/// (failed, with the panic as its error) instead of leaving its driver
/// waiting forever.
fn spawn_run(
    served: Arc<RunQueue>,
    run_id: String,
    resume: Option<Inbox>,
    done: mpsc::Sender<Finished>,
) {
    tokio::spawn(async move {
        let task = tokio::spawn(run_to_end(
            served.clone(),
            run_id.clone(),
            resume,
            done.clone(),
        ));
        let ended = task.await;
        // The run's volumes may have been kept as dataset snapshots: the
        // next submission's plan sees them.
        if let Source::Kubernetes(k) = &served.source {
            k.refresh_snapshots().await;
        }
        if let Err(e) = ended {
            let why = format!("the run's task failed: {e}");
            tracing::error!(run = %run_id, "{why}");
            let store = &served.service.store;
            let _ = store.interrupt(&run_id, &why);
            let _ = store.finish_run(&run_id, RunStatus::Failed);
            let _ = done
                .send(Finished {
                    run_id,
                    status: RunStatus::Failed,
                    report: None,
                    error: Some(Error::Store(why)),
                })
                .await;
        }
    });
}

/// Executes (or resumes) one run, stores its end and writes its report.
async fn run_to_end(
    served: Arc<RunQueue>,
    run_id: String,
    resume: Option<Inbox>,
    done: mpsc::Sender<Finished>,
) {
    let Some((sc, cells, report_dir, cancel, events)) = served.lock().get(&run_id).map(|l| {
        (
            l.scenario.clone(),
            l.cells.clone(),
            l.report_dir.clone(),
            l.cancel.clone(),
            l.events.clone(),
        )
    }) else {
        return;
    };
    let store = served.service.store.clone();
    if let Err(e) = store.start_run(&run_id) {
        tracing::error!(run = %run_id, "storing the run's start: {e}");
    }
    let _ = events.send(RunEvent::Run {
        status: RunStatus::Running.as_str().into(),
    });
    let estimate = scenario::plan::estimate(&sc, &cells);
    let spec = RunSpec {
        run_id: &run_id,
        scenario: &sc,
        cells,
        estimated_wall: estimate.wall_seconds,
    };
    let log_dir = report_dir.join("logs");
    let status = match resume {
        Some(inbox) => resume_run(&served, spec, inbox, cancel, events.clone()).await,
        None => {
            let agents = served.source.agents(&log_dir);
            served
                .service
                .execute(spec, agents, cancel, Some(events.clone()))
                .await
        }
    };
    let (status, mut error) = match status {
        Ok(s) => (s, None),
        Err(e) => {
            tracing::error!(run = %run_id, "the run could not start: {e}");
            (RunStatus::Failed, Some(e))
        }
    };
    let report = match crate::runner::conclude(&store, &run_id, status, &report_dir) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!(run = %run_id, "storing the run's end and its report: {e}");
            error.get_or_insert(e);
            None
        }
    };
    served
        .service
        .metrics
        .retire_run(&run_id, served.metrics_retention);
    let _ = events.send(RunEvent::Run {
        status: status.as_str().into(),
    });
    let _ = done
        .send(Finished {
            run_id,
            status,
            report,
            error,
        })
        .await;
}

/// Rebuilds a run's scheduler from the store and runs it to its end.
async fn resume_run(
    served: &RunQueue,
    spec: RunSpec<'_>,
    (tx, rx): Inbox,
    cancel: CancellationToken,
    events: broadcast::Sender<RunEvent>,
) -> Result<RunStatus> {
    let service = &served.service;
    let run_id = spec.run_id;
    let store = service.store.clone();
    let stored = store.cells(run_id)?;
    let agents = store.agents(run_id)?;
    // Its pods outlived the last controller: watch them again, and delete
    // them when the run ends.
    let mut source = match &served.source {
        Source::Kubernetes(k) => {
            let launched = agents
                .iter()
                .map(|a| crate::agents::Launched {
                    agent_id: a.agent_id.clone(),
                    instance_class: a.instance_class.clone(),
                })
                .collect();
            Some(KubeAgents::attach(
                k.client.clone(),
                run_id,
                &k.opts,
                launched,
                tx,
                spec.scenario,
            ))
        }
        _ => None,
    };
    let sched = Scheduler::resume(
        run_id,
        store,
        scheduler::Options {
            lease: service.lease(),
            // AgentSupply that do not return within the lease are lost.
            registration_timeout: service.lease(),
            estimated_wall: Some(Duration::from_secs_f64(spec.estimated_wall)),
            interactive: false,
            events: Some(events),
            metrics: Some(service.metrics.clone()),
            scenario: spec.scenario.name.value.clone(),
            oversubscribe: spec.scenario.oversubscribe(),
            postgres_versions: spec.scenario.named_postgres_versions(),
            ..Default::default()
        },
        spec.cells,
        &stored,
        &agents,
    );
    let status = sched.run(rx, cancel).await;
    service.hub.release(run_id, source.is_some()).await;
    if let Some(s) = source.as_mut() {
        let cells = service.store.cells(run_id).unwrap_or_default();
        let end = crate::agents::RunEnd::of(status == RunStatus::Succeeded, &cells);
        let kept = s.end(end).await;
        service.record_kept(run_id, kept);
    }
    Ok(status)
}
