//! `pgfleet run`: validate, store, serve, launch agents, schedule, shut
//! down, report. The one place that advances a run's status.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agents::AgentSource;
use crate::agents::local::{self, LocalAgents, LocalOptions};
use crate::scheduler::{self, Scheduler};
use crate::store::{RunStatus, Store};
use crate::{Error, Result, api, report, scenario};

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub scenario: PathBuf,
    pub out: PathBuf,
    pub store: PathBuf,
    pub lease: Duration,
    pub registration_timeout: Duration,
    pub bind: SocketAddr,
    /// What agents dial (default: `http(s)://<bound address>`).
    pub advertise_url: Option<String>,
    /// PEM certificate and key: the agent session speaks TLS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The CA the local agents trust (default: `tls_cert`).
    pub tls_ca: Option<PathBuf>,
    /// The join token agents must present (default: a random one per run,
    /// handed to the local agents in a file only root can read).
    pub join_token_file: Option<PathBuf>,
    pub local: LocalOptions,
}

/// The session's security from the options: TLS material and the token.
fn security(opts: &RunOptions) -> Result<api::Security> {
    let read = |p: &Path, what: &str| {
        std::fs::read(p)
            .map_err(|e| Error::Usage(format!("reading the {what} {}: {e}", p.display())))
    };
    let tls = match (&opts.tls_cert, &opts.tls_key) {
        (Some(c), Some(k)) => Some((read(c, "TLS certificate")?, read(k, "TLS key")?)),
        (None, None) => None,
        _ => {
            return Err(Error::Usage(
                "--tls-cert and --tls-key go together: give both, or neither for plaintext on loopback".into(),
            ));
        }
    };
    let token = match &opts.join_token_file {
        Some(f) => {
            let t = String::from_utf8_lossy(&read(f, "join token file")?)
                .trim()
                .to_string();
            if t.len() < 16 {
                return Err(Error::Usage(format!(
                    "the join token in {} is too short: use at least 16 characters (e.g. `openssl rand -hex 32`)",
                    f.display()
                )));
            }
            t
        }
        None => random_hex(32),
    };
    Ok(api::Security {
        tls,
        token: Some(token),
    })
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_id: String,
    pub status: RunStatus,
    pub report_dir: PathBuf,
}

/// A new run id: UTC time plus random bits, sortable and unique enough.
pub fn new_run_id() -> String {
    let mut b = [0u8; 3];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    format!(
        "{}-{:02x}{:02x}{:02x}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S"),
        b[0],
        b[1],
        b[2]
    )
}

pub async fn execute(opts: RunOptions, cancel: CancellationToken) -> Result<RunSummary> {
    let yaml = scenario::read(&opts.scenario)?;
    let sc = scenario::parse(&opts.scenario, &yaml)?;
    let cells = scenario::plan(&sc);
    let store = Store::open(&opts.store)?;
    for id in local::reap_finished_runs(&opts.local, &store).await {
        eprintln!("cleaned up what interrupted run {id} left in the data dir");
    }
    let run_id = new_run_id();
    store.create_run(
        &run_id,
        &sc.name.value,
        &opts.scenario.display().to_string(),
        &yaml,
    )?;
    for (i, c) in cells.iter().enumerate() {
        store.insert_cell(&run_id, i, c)?;
    }
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
        opts.store.display()
    );

    let security = match security(&opts) {
        Ok(s) => s,
        Err(e) => {
            store.finish_run(&run_id, RunStatus::Failed)?;
            return Err(e);
        }
    };
    let token = security.token.clone().unwrap_or_default();
    let (tx, rx) = mpsc::channel(4096);
    let server = match api::serve(opts.bind, tx.clone(), opts.lease, security).await {
        Ok(s) => s,
        Err(e) => {
            store.finish_run(&run_id, RunStatus::Failed)?;
            return Err(e);
        }
    };
    let controller = opts.advertise_url.clone().unwrap_or_else(|| server.url());
    let log_dir = opts.out.join("logs");
    let access = local::Access {
        controller,
        token,
        ca: opts.tls_ca.clone().or_else(|| opts.tls_cert.clone()),
    };
    let mut source = match LocalAgents::launch(
        &sc,
        &run_id,
        &access,
        opts.local.clone(),
        &log_dir,
        tx.clone(),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            server.shutdown().await;
            store.finish_run(&run_id, RunStatus::Failed)?;
            return Err(e);
        }
    };
    let expected: Vec<(String, String)> = source
        .launched()
        .into_iter()
        .map(|l| (l.agent_id, l.instance_class))
        .collect();
    let sched = Scheduler::new(
        &run_id,
        store.clone(),
        scheduler::Options {
            lease: opts.lease,
            registration_timeout: opts.registration_timeout,
            estimated_wall: Some(Duration::from_secs_f64(estimate.wall_seconds)),
            ..Default::default()
        },
        cells,
        &expected,
    );
    let status = sched.run(rx, cancel).await;
    source.shutdown().await;
    server.shutdown().await;
    store.finish_run(&run_id, status)?;
    report::write(&store, &run_id, &opts.out)?;
    Ok(RunSummary {
        run_id,
        status,
        report_dir: opts.out,
    })
}

/// Default store location: `./pgfleet-data/pgfleet.db`.
pub fn default_store() -> PathBuf {
    Path::new("pgfleet-data").join("pgfleet.db")
}
