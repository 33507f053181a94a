//! `pgfleet serve`: the long-running controller. One process holds the
//! agents' gRPC endpoint, the HTTP API (`http`), the store and the queue
//! (`controller`), and drives the queue until it is told to stop.
//!
//! Runs are submitted (`POST /v1/runs`), stored `queued` with their cells,
//! and started in submission order (see `controller` for when a run waits).
//! AgentSupply come from the pool (`pgfleet-agent run --class NAME` on any host
//! joins it) or are created as pods (`--agents kubernetes`). A restarted
//! `serve` resumes what the last one left on its store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::agents::kubernetes::KubeOptions;
use crate::controller::{AgentSupply, Controller, ControllerConfig, Http};
use crate::queue::Source;
use crate::resource;
use crate::runner::RunnerConfig;
use pgfleet_store::Result;

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub service: RunnerConfig,
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
    /// The most cells a submitted scenario may plan.
    pub max_cells: u64,
    /// Accept scenarios with `allow_shell`.
    pub allow_shell_scenarios: bool,
    /// How long a finished run's series stay on `/metrics`.
    pub metrics_retention: Duration,
    /// Launch each run's agents as pods (`--agents kubernetes`) rather
    /// than take them from the pool.
    pub kubernetes: Option<KubeOptions>,
    /// With `kubernetes`: run the namespace's PgfleetRuns too; the value
    /// is serve's API URL as clients reach it (for the report's URL).
    pub resources: Option<String>,
}

/// Runs the server until `shutdown`; then stops taking work and cancels
/// nothing: running runs stay `running` in the store, their agents keep
/// their cells, and the next `serve` on this store resumes them.
pub async fn serve(opts: ServeOptions, shutdown: CancellationToken) -> Result<()> {
    let mut controller = Controller::build(&ControllerConfig {
        service: opts.service.clone(),
        agents: match opts.kubernetes {
            Some(k) => AgentSupply::Kubernetes(k),
            None => AgentSupply::Pool,
        },
        http: Some(Http::Api {
            bind: opts.http_bind,
            api_token_file: opts.api_token_file,
            tls: opts.http_tls,
        }),
        reports: opts.reports,
        max_scenario_bytes: opts.max_scenario_bytes,
        max_queued_runs: opts.max_queued_runs,
        max_cells: opts.max_cells,
        allow_shell_scenarios: opts.allow_shell_scenarios,
        metrics_retention: opts.metrics_retention,
    })
    .await?;
    let (http, tls) = controller.http().expect("serve's controller has its API");
    let service = &controller.served.service;
    eprintln!(
        "pgfleet serve: API on {}://{http}, agents dial {} (gRPC on {}), store {}",
        if tls { "https" } else { "http" },
        service.agent_url(),
        service
            .agent_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        opts.service.store.display()
    );
    let resources = match (&controller.served.source, opts.resources) {
        (Source::Kubernetes(k), Some(api_url)) => {
            let ctx = Arc::new(resource::Ctx {
                client: k.client.clone(),
                namespace: k.opts.namespace.clone(),
                served: controller.served.clone(),
                api_url,
                refresh: Duration::from_secs(3),
            });
            eprintln!(
                "pgfleet serve: running the PgfleetRuns of namespace {}",
                k.opts.namespace
            );
            Some(tokio::spawn(resource::run(ctx, shutdown.clone())))
        }
        _ => None,
    };
    // Kept runs' objects (`cleanup: keep`) go when their time is up, and
    // the dataset snapshots are listed again for the next plans.
    let minutely = match &controller.served.source {
        Source::Kubernetes(_) => Some(tokio::spawn(every_minute(
            controller.served.clone(),
            shutdown.clone(),
        ))),
        _ => None,
    };
    controller.drive(None, &shutdown).await;
    if let Some(r) = resources {
        let _ = r.await;
    }
    if let Some(r) = minutely {
        let _ = r.await;
    }
    eprintln!("pgfleet serve: stopping; running runs resume when it starts again on this store");
    controller.shutdown().await;
    Ok(())
}

/// Every minute, on Kubernetes: deletes the objects of runs that are not
/// running and not kept (or kept past their `cleanup.ttl`), and lists the
/// dataset snapshots again for the plans of runs submitted next.
async fn every_minute(served: Arc<crate::queue::RunQueue>, shutdown: CancellationToken) {
    let Source::Kubernetes(k) = &served.source else {
        return;
    };
    let store = &served.service.store;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            _ = shutdown.cancelled() => return,
        }
        let running = |run: &str| matches!(store.run(run), Ok(Some(r)) if r.status == "running" || r.status == "queued");
        match crate::agents::kubernetes::reap(&k.client, &k.opts.namespace, running).await {
            Ok(runs) => {
                for run in runs {
                    tracing::info!(run = %run, "deleted the objects run {run} kept (cleanup.ttl is up)");
                }
            }
            Err(e) => tracing::warn!("reaping kept runs' objects: {e}"),
        }
        k.refresh_snapshots().await;
    }
}
