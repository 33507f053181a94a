//! `pgfleet run`: validate, build the controller (`controller`) with local
//! agents on loopback, queue the scenario, drive the controller until the
//! run ends (Ctrl-C cancels it), and hand back its report.

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use crate::agents::local::LocalOptions;
use crate::controller::{AgentSupply, Controller, ControllerConfig, Http};
use crate::queue::Queued;
use crate::runner::RunnerConfig;
use pgfleet_scenario as scenario;
use pgfleet_store::Result;
use pgfleet_store::{Owner, RunStatus};

/// How long `--metrics-addr` stays up after the run for a last scrape.
const METRICS_LINGER: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub scenario: PathBuf,
    /// `--label KEY=VALUE`s, each checked; duplicates are refused here.
    pub labels: Vec<String>,
    pub out: PathBuf,
    /// The controller's service: store, bind address, lease, TLS, token.
    pub service: RunnerConfig,
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
fn check_local_tools(path: &Path, sc: &scenario::Scenario, pg_bin: Option<&Path>) -> Result<()> {
    // Each class's PostgreSQL version is installed here: the one it names,
    // else the default unless --pg-bin gives the build.
    for (i, f) in sc.fleet.value.iter().enumerate() {
        let named = f.postgres.as_ref().and_then(|p| p.version.as_ref());
        if named.is_none() && pg_bin.is_some() {
            continue;
        }
        let major = f.postgres_version();
        if pgfleet_proto::installs::find(major).is_none() {
            let (line, column, field) = match named {
                Some(v) => (
                    v.referenced.line(),
                    v.referenced.column(),
                    format!("fleet[{i}].postgres.version"),
                ),
                None => (
                    f.name.referenced.line(),
                    f.name.referenced.column(),
                    format!("fleet[{i}] (no postgres.version: the default, {major})"),
                ),
            };
            return Err(scenario::ScenarioError {
                file: path.to_path_buf(),
                line,
                column,
                field,
                message: format!(
                    "{}; or give the run --pg-bin DIR to run another build",
                    pgfleet_proto::installs::missing(major)
                ),
            }
            .into());
        }
    }
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
    pgfleet_proto::workload::fio::check(&program).map_err(|message| -> pgfleet_store::Error {
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
    pub report: pgfleet_report::Report,
}

pub async fn run_scenario(opts: RunOptions, cancel: CancellationToken) -> Result<RunSummary> {
    let yaml = scenario::read(&opts.scenario)?;
    let sc = scenario::parse(&opts.scenario, &yaml)?;
    check_local_tools(&opts.scenario, &sc, opts.local.pg_bin.as_deref())?;
    let labels = pgfleet_scenario::labels::Labels::parse(&opts.labels)
        .map_err(pgfleet_store::Error::Usage)?;
    // Datasets already in the local agents' store are restored, not built.
    let published = scenario::plan::published_in(&opts.local.dataset_dir);
    let mut cells = scenario::plan::plan_with(&sc, &published);
    if opts.datasets_only {
        cells = crate::datasets::builds(cells);
        if cells.is_empty() {
            return Err(pgfleet_store::Error::Usage(format!(
                "{}: no workload reuses a dataset (pgbench, vacuum-bloat and read-write have one; `data: fresh` opts out)",
                opts.scenario.display()
            )));
        }
    }
    let mut controller = Controller::build(&ControllerConfig {
        service: opts.service.clone(),
        agents: AgentSupply::Local(opts.local.clone()),
        http: opts.metrics_addr.map(|bind| Http::Metrics { bind }),
        reports: opts.out.clone(),
        max_scenario_bytes: usize::MAX,
        max_queued_runs: 1,
        max_cells: scenario::validate::MAX_CELLS,
        allow_shell_scenarios: true,
        metrics_retention: 2 * METRICS_LINGER,
    })
    .await?;
    if let Some((addr, _)) = controller.http() {
        eprintln!("metrics: http://{addr}/metrics");
    }
    // What earlier cells on this store took corrects the model's estimates.
    let planned = cells.len();
    match pgfleet_store::learned::Learned::read(&controller.served.service.store) {
        Ok(l) => {
            if let Some(line) = l.apply(&mut cells).describe(planned) {
                eprintln!("{line}");
            }
        }
        Err(e) => tracing::warn!("estimates not learned from the store: {e}"),
    }
    let estimate = scenario::plan::estimate(&sc, &cells);
    for w in scenario::plan::warnings(&sc, &cells, scenario::plan::host_memory()) {
        eprintln!("{w}");
    }
    let queued = controller.served.queue_run(Queued {
        scenario: &sc,
        path: &opts.scenario.display().to_string(),
        yaml: &yaml,
        owner: Owner::Run,
        idempotency_key: None,
        labels,
        cells,
        report_dir: Some(opts.out.clone()),
    });
    let run_id = match queued {
        Ok(id) => id,
        Err(r) => {
            controller.shutdown().await;
            return Err(r.into());
        }
    };
    eprintln!(
        "run {run_id}: scenario {} ({planned} cells on {} agents, about {} estimated), store {}",
        sc.name.value,
        sc.fleet.value.iter().map(|f| f.count()).sum::<u32>(),
        pgfleet_proto::workload::approx_seconds(estimate.wall_seconds),
        opts.service.store.display()
    );
    // Ctrl-C cancels the run (its cells stop, it ends `cancelled` with a
    // report), it does not stop the controller under it.
    let served = controller.served.clone();
    let id = run_id.clone();
    let cancelling = tokio::spawn(async move {
        cancel.cancelled().await;
        served.cancel(&id);
    });
    let finished = controller
        .drive(Some(&run_id), &CancellationToken::new())
        .await;
    cancelling.abort();
    if controller.http().is_some() {
        // Let the scraper see the end (cells finished, durations) once:
        // wait for one more scrape, for at most METRICS_LINGER.
        let seen = controller.scrapes();
        let until = std::time::Instant::now() + METRICS_LINGER;
        while seen > 0 && controller.scrapes() <= seen + 1 && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    controller.shutdown().await;
    let Some(f) = finished else {
        return Err(pgfleet_store::Error::Store(format!(
            "run {run_id} ended without its end"
        )));
    };
    if let Some(e) = f.error {
        return Err(e);
    }
    Ok(RunSummary {
        run_id,
        status: f.status,
        report_dir: opts.out,
        report: f.report.unwrap_or_default(),
    })
}

/// Default store location: `./pgfleet-data/pgfleet.db`.
pub fn default_store() -> PathBuf {
    Path::new("pgfleet-data").join("pgfleet.db")
}
