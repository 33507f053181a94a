//! `pgfleet serve`: the long-running controller. One process holds the
//! agents' gRPC endpoint, the HTTP API (`http`), the store and the queue.
//!
//! Runs are submitted (`POST /v1/runs`), stored `queued` with their cells,
//! and started in submission order; a run starts while others run only when
//! no earlier unfinished run shares an instance class with it (runs on
//! disjoint fleets go side by side, the others wait their turn). Agents come
//! from the pool: `pgfleet-agent run --class NAME` on any host joins it.
//!
//! A restarted `serve` resumes what the last one left: queued runs wait
//! again, and running runs are rebuilt from the store; their agents, which
//! keep their clusters and cells while the controller is away, reconnect,
//! report the cells they still run and replay the results not yet
//! acknowledged. Results stored before the restart are not redone; agents
//! that do not come back within the lease are lost and their cells fail.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agents::AgentSource;
use crate::agents::kubernetes::{self, KubeAgents, KubeOptions};
use crate::queue::{Kube, Served};
use crate::scheduler::{self, RunEvent, Scheduler};
use crate::service::{Agents, RunSpec, Service, ServiceConfig};
use crate::store::RunStatus;
use crate::{Error, Result, scenario};

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub service: ServiceConfig,
    /// Where the HTTP API listens.
    pub http_bind: SocketAddr,
    /// The bearer token API clients must present.
    pub api_token_file: PathBuf,
    /// Reports of finished runs: `<reports>/<run-id>/`.
    pub reports: PathBuf,
    /// The largest scenario accepted, in bytes.
    pub max_scenario_bytes: usize,
    /// Serve the HTTP API over TLS: (certificate chain, key), PEM files.
    pub http_tls: Option<(PathBuf, PathBuf)>,
    /// Runs that may wait in the queue (then 429).
    pub max_queued_runs: usize,
    /// Accept scenarios with `allow_shell`.
    pub allow_shell_scenarios: bool,
    /// How long a finished run's series stay on `/metrics`.
    pub metrics_retention: Duration,
    /// Launch each run's agents as pods (`--agents kubernetes`) rather
    /// than take them from the pool.
    pub kubernetes: Option<KubeOptions>,
}

/// Runs the server until `shutdown`; then stops taking work and cancels
/// nothing: running runs stay `running` in the store, their agents keep
/// their cells, and the next `serve` on this store resumes them.
pub async fn serve(opts: ServeOptions, shutdown: CancellationToken) -> Result<()> {
    let api_tokens = crate::tokens::ApiTokens::load(&opts.api_token_file)?;
    let mut service = Service::build(&opts.service)?;
    // Before agents can connect: their registrations must find the runs
    // they belong to.
    let mut inboxes = resume_prepare(&service)?;
    let kube = match &opts.kubernetes {
        Some(k) => Some(connect_kube(k, &service.store).await?),
        None => None,
    };
    service.listen().await?;
    let served = Arc::new(Served {
        service,
        api_tokens,
        reports: opts.reports.clone(),
        max_scenario_bytes: opts.max_scenario_bytes,
        max_queued_runs: opts.max_queued_runs.max(1),
        allow_shell_scenarios: opts.allow_shell_scenarios,
        metrics_retention: opts.metrics_retention,
        kube,
        live: Mutex::new(HashMap::new()),
        wake: Notify::new(),
    });
    let tls = match &opts.http_tls {
        Some((cert, key)) => Some(crate::http::tls_config(cert, key)?),
        None => None,
    };
    let http = crate::http::listen(opts.http_bind, served.clone(), tls).await?;
    eprintln!(
        "pgfleet serve: API on {}://{}, agents dial {} (gRPC on {}), store {}",
        if http.tls { "https" } else { "http" },
        http.addr,
        served.service.agent_url(),
        served
            .service
            .agent_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        opts.service.store.display()
    );
    let (done_tx, mut done_rx) = mpsc::channel::<String>(64);
    resume_runs(&served, &mut inboxes, &done_tx);
    loop {
        start_next(&served, &done_tx);
        tokio::select! {
            _ = served.wake.notified() => {}
            Some(id) = done_rx.recv() => {
                served.lock().remove(&id);
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    eprintln!("pgfleet serve: stopping; running runs resume when it starts again on this store");
    http.shutdown().await;
    // Dropping the service ends every session: agents keep their cells and
    // reconnect to the next controller within their give-up time.
    match Arc::try_unwrap(served) {
        Ok(s) => s.service.shutdown().await,
        Err(_) => tracing::debug!("runs still hold the service; the process exit ends it"),
    }
    Ok(())
}

/// The Kubernetes client (in-cluster, else the kubeconfig), checked by
/// deleting what runs that are not running left on the cluster.
async fn connect_kube(opts: &KubeOptions, store: &crate::store::Store) -> Result<Kube> {
    let client = kube::Client::try_default().await.map_err(|e| {
        Error::Usage(format!(
            "--agents kubernetes: no Kubernetes API to talk to ({e}); run in a pod with a ServiceAccount (deploy/base) or set KUBECONFIG"
        ))
    })?;
    let running = |run: &str| matches!(store.run(run), Ok(Some(r)) if r.status == "running" || r.status == "queued");
    for run in kubernetes::reap(&client, &opts.namespace, running).await? {
        eprintln!("deleted the pods and volumes that interrupted run {run} left on the cluster");
    }
    Ok(Kube {
        client,
        opts: opts.clone(),
    })
}

/// The schedulers' inboxes of the runs the last `serve` was running, made
/// before agents can connect so their registrations find their runs.
type Inboxes = HashMap<String, Inbox>;
/// A resumed run's inbox, and its sender for its agent source's events.
type Inbox = (
    mpsc::Sender<crate::events::Event>,
    mpsc::Receiver<crate::events::Event>,
);

fn resume_prepare(service: &Service) -> Result<Inboxes> {
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

/// The scenario a run was submitted with, parsed again from the store.
fn stored_scenario(served: &Served, id: &str) -> Result<scenario::Scenario> {
    let yaml = served.service.store.scenario_yaml(id)?.unwrap_or_default();
    Ok(scenario::parse(Path::new("scenario.yaml"), &yaml)?)
}

/// Queues the runs the last `serve` queued, and rebuilds the ones it ran.
fn resume_runs(served: &Arc<Served>, inboxes: &mut Inboxes, done: &mpsc::Sender<String>) {
    let runs = match served.service.store.unfinished_served_runs() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("reading unfinished runs: {e}");
            return;
        }
    };
    for (id, _, _) in runs {
        let sc = match stored_scenario(served, &id) {
            Ok(sc) => sc,
            Err(e) => {
                let _ = served
                    .service
                    .store
                    .interrupt(&id, &format!("its stored scenario no longer parses: {e}"));
                continue;
            }
        };
        served.enqueue(&id, &sc);
        if let Some(inbox) = inboxes.remove(&id) {
            eprintln!("resuming run {id}: waiting for its agents to reconnect");
            if let Some(l) = served.lock().get_mut(&id) {
                l.started = true;
            }
            tokio::spawn(execute(served.clone(), id, sc, Some(inbox), done.clone()));
        } else {
            eprintln!("run {id} queued again");
        }
    }
}

/// Starts every queued run whose turn it is.
fn start_next(served: &Arc<Served>, done: &mpsc::Sender<String>) {
    let queued: Vec<(String, String)> = match served.service.store.unfinished_served_runs() {
        Ok(r) => r
            .into_iter()
            .filter(|(_, s, _)| s == "queued")
            .map(|(id, s, _)| (id, s))
            .collect(),
        Err(e) => {
            tracing::error!("reading the queue: {e}");
            return;
        }
    };
    let mut busy: BTreeSet<String> = served
        .lock()
        .values()
        .filter(|l| l.started)
        .flat_map(|l| l.classes.iter().cloned())
        .collect();
    for (id, _) in queued {
        let Ok(sc) = stored_scenario(served, &id) else {
            continue;
        };
        // Decide and mark under one lock (a cancel takes the same lock).
        {
            let mut live = served.lock();
            let Some(l) = live.get_mut(&id) else {
                continue;
            };
            if l.started {
                continue;
            }
            let free = l.classes.is_disjoint(&busy);
            busy.extend(l.classes.iter().cloned());
            if !free {
                continue;
            }
            l.started = true;
        }
        tokio::spawn(execute(served.clone(), id, sc, None, done.clone()));
    }
}

/// Executes (or resumes) one run, stores its end and writes its report.
async fn execute(
    served: Arc<Served>,
    run_id: String,
    sc: scenario::Scenario,
    resume: Option<Inbox>,
    done: mpsc::Sender<String>,
) {
    let Some((cancel, events)) = served
        .lock()
        .get(&run_id)
        .map(|l| (l.cancel.clone(), l.events.clone()))
    else {
        return;
    };
    let store = served.service.store.clone();
    if let Err(e) = store.start_run(&run_id) {
        tracing::error!(run = %run_id, "storing the run's start: {e}");
    }
    let _ = events.send(RunEvent::Run {
        status: RunStatus::Running.as_str().into(),
    });
    let cells = scenario::plan(&sc);
    let estimate = scenario::plan::estimate(&sc, &cells);
    let spec = RunSpec {
        run_id: &run_id,
        scenario: &sc,
        cells,
        estimated_wall: estimate.wall_seconds,
    };
    let status = match resume {
        Some(inbox) => resume_run(&served, spec, inbox, cancel, events.clone()).await,
        None => {
            let agents = match &served.kube {
                Some(k) => Agents::Kubernetes {
                    client: &k.client,
                    opts: &k.opts,
                },
                None => Agents::Pool,
            };
            served
                .service
                .execute(spec, agents, cancel, Some(events.clone()))
                .await
        }
    };
    let status = status.unwrap_or_else(|e| {
        tracing::error!(run = %run_id, "the run could not start: {e}");
        RunStatus::Failed
    });
    if let Err(e) = crate::service::conclude(&store, &run_id, status, &served.reports.join(&run_id))
    {
        tracing::error!(run = %run_id, "storing the run's end and its report: {e}");
    }
    eprintln!("run {run_id} {}", status.as_str());
    served
        .service
        .metrics
        .retire_run(&run_id, served.metrics_retention);
    let _ = events.send(RunEvent::Run {
        status: status.as_str().into(),
    });
    let _ = done.send(run_id).await;
}

/// Rebuilds a run's scheduler from the store and runs it to its end.
async fn resume_run(
    served: &Served,
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
    let mut source = served.kube.as_ref().map(|k| {
        let launched = agents
            .iter()
            .map(|a| crate::agents::Launched {
                agent_id: a.agent_id.clone(),
                instance_class: a.instance_class.clone(),
            })
            .collect();
        KubeAgents::attach(k.client.clone(), run_id, &k.opts, launched, tx)
    });
    let sched = Scheduler::resume(
        run_id,
        store,
        scheduler::Options {
            lease: service.lease(),
            // Agents that do not return within the lease are lost.
            registration_timeout: service.lease(),
            estimated_wall: Some(Duration::from_secs_f64(spec.estimated_wall)),
            interactive: false,
            events: Some(events),
            metrics: Some(service.metrics.clone()),
            scenario: spec.scenario.name.value.clone(),
            oversubscribe: spec.scenario.oversubscribe(),
            ..Default::default()
        },
        spec.cells,
        &stored,
        &agents,
    );
    let status = sched.run(rx, cancel).await;
    service.hub.release(run_id, source.is_some()).await;
    if let Some(s) = source.as_mut() {
        s.shutdown().await;
    }
    Ok(status)
}
