//! `pgfleet run`: validate, store, build the controller's service on
//! loopback, launch local agents, schedule, report. The one place that
//! advances a local run's status.

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use crate::agents::local::{self, LocalOptions};
use crate::service::{Agents, RunSpec, Service, ServiceConfig};
use crate::store::{NewRun, Owner, RunStatus};
use crate::{Result, scenario};

/// How long `--metrics-addr` stays up after the run for a last scrape.
const METRICS_LINGER: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub scenario: PathBuf,
    pub out: PathBuf,
    /// The controller's service: store, bind address, lease, TLS, token.
    pub service: ServiceConfig,
    pub local: LocalOptions,
    /// Serve Prometheus metrics at http://<addr>/metrics during the run.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `pgfleet datasets build`: only the cells that build the scenario's
    /// datasets (`datasets::builds`), nothing measured.
    pub datasets_only: bool,
}

/// Local agents run on this host with its tools: a `kind: fio` entry with
/// no fio here (or one too old) is refused before anything starts, at the
/// entry's `kind`. (The agents' `--fio` is `PGFLEET_FIO`, else `fio`.)
fn check_local_tools(path: &Path, sc: &scenario::Scenario) -> Result<()> {
    let Some((i, w)) = sc
        .workloads
        .value
        .iter()
        .enumerate()
        .find(|(_, w)| w.kind.value == "fio")
    else {
        return Ok(());
    };
    let program =
        std::env::var_os("PGFLEET_FIO").map_or_else(|| PathBuf::from("fio"), PathBuf::from);
    pgfleet_proto::workload::fio::check(&program).map_err(|message| -> crate::Error {
        scenario::ScenarioError {
            file: path.to_path_buf(),
            line: w.kind.referenced.line(),
            column: w.kind.referenced.column(),
            field: format!("workloads[{i}].kind"),
            message,
        }
        .into()
    })?;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_id: String,
    pub status: RunStatus,
    pub report_dir: PathBuf,
    /// report.json's document (with the checks' verdicts).
    pub report: serde_json::Value,
}

pub async fn execute(opts: RunOptions, cancel: CancellationToken) -> Result<RunSummary> {
    let yaml = scenario::read(&opts.scenario)?;
    let sc = scenario::parse(&opts.scenario, &yaml)?;
    check_local_tools(&opts.scenario, &sc)?;
    let mut cells = scenario::plan(&sc);
    if opts.datasets_only {
        cells = crate::datasets::builds(cells);
        if cells.is_empty() {
            return Err(crate::Error::Usage(format!(
                "{}: no workload reuses a dataset (pgbench, vacuum-bloat and read-write have one; `data: fresh` opts out)",
                opts.scenario.display()
            )));
        }
    }
    let mut service = Service::build(&opts.service)?;
    service.listen().await?;
    let scrapes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let metrics = match opts.metrics_addr {
        Some(addr) => {
            let m = crate::http::listen_metrics(
                addr,
                crate::http::MetricsSource {
                    metrics: service.metrics.clone(),
                    hub: service.hub.clone(),
                    store: service.store.clone(),
                    scrapes: scrapes.clone(),
                },
            )
            .await?;
            eprintln!("metrics: http://{}/metrics", m.addr);
            Some(m)
        }
        None => None,
    };
    let store = service.store.clone();
    for id in local::reap_finished_runs(&opts.local, &store).await {
        eprintln!("cleaned up what interrupted run {id} left in the data dir");
    }
    let run_id = crate::service::new_run_id();
    store.create_run(&NewRun {
        id: &run_id,
        name: &sc.name.value,
        path: &opts.scenario.display().to_string(),
        yaml: &yaml,
        owner: Owner::Run,
        idempotency_key: None,
        cells: &cells,
    })?;
    store.start_run(&run_id)?;
    let estimate = scenario::plan::estimate(&sc, &cells);
    for w in scenario::plan::warnings(&sc, &cells, scenario::plan::host_memory()) {
        eprintln!("{w}");
    }
    eprintln!(
        "run {run_id}: scenario {} ({} cells on {} agents, about {} estimated), store {}",
        sc.name.value,
        cells.len(),
        sc.fleet.value.iter().map(|f| f.count()).sum::<u32>(),
        pgfleet_proto::workload::approx_seconds(estimate.wall_seconds),
        opts.service.store.display()
    );
    let log_dir = opts.out.join("logs");
    let spec = RunSpec {
        run_id: &run_id,
        scenario: &sc,
        cells,
        estimated_wall: estimate.wall_seconds,
    };
    let agents = Agents::Local {
        opts: &opts.local,
        log_dir: &log_dir,
    };
    let status = service.execute(spec, agents, cancel, None).await;
    service.shutdown().await;
    if let Some(m) = metrics {
        // Let the scraper see the end (cells finished, durations) once:
        // wait for one more scrape, for at most METRICS_LINGER.
        let seen = scrapes.load(std::sync::atomic::Ordering::Relaxed);
        let until = std::time::Instant::now() + METRICS_LINGER;
        while seen > 0
            && scrapes.load(std::sync::atomic::Ordering::Relaxed) <= seen + 1
            && std::time::Instant::now() < until
        {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        m.shutdown().await;
    }
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            // Its agents could not start: stored failed, with a report.
            let _ = crate::service::conclude(&store, &run_id, RunStatus::Failed, &opts.out);
            return Err(e);
        }
    };
    let report = crate::service::conclude(&store, &run_id, status, &opts.out)?;
    Ok(RunSummary {
        run_id,
        status,
        report_dir: opts.out,
        report,
    })
}

/// Default store location: `./pgfleet-data/pgfleet.db`.
pub fn default_store() -> PathBuf {
    Path::new("pgfleet-data").join("pgfleet.db")
}
