//! `pgfleet-agent`: the agent binary. Normally started by the controller
//! (`pgfleet run` spawns one per fleet instance, or a Kubernetes pod runs it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use pgfleet_agent::cell::{AgentEnv, Instance};
use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::cluster::{self, RunAs};
use pgfleet_agent::metrics::AgentMetrics;
use pgfleet_agent::pgbin::PgBin;
use pgfleet_agent::session;

/// pgfleet agent: provisions PostgreSQL clusters on the storage it was given
/// and runs the workloads the controller assigns, streaming results back.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Connect to a controller and run assigned cells until told to stop.
    Run(Box<RunArgs>),
    /// Remove clusters left in a data root by an agent that died (stops their
    /// servers first). Safe to run at any time the owning agent is not running.
    Cleanup {
        /// The agent's data root.
        #[arg(long)]
        data_root: PathBuf,
    },
    /// List the built-in workloads.
    Workloads,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Controller address, e.g. http://127.0.0.1:7070
    #[arg(long, env = "PGFLEET_CONTROLLER")]
    controller: String,
    /// This agent's id, unique among the controller's agents. Default: the
    /// host name (one agent per host, container or pod).
    #[arg(long, env = "PGFLEET_AGENT_ID")]
    agent_id: Option<String>,
    /// The instance class (a scenario's fleet entry name) this agent stands
    /// for; a serving controller gives it cells of runs that need that class.
    #[arg(
        long,
        visible_alias = "class",
        env = "PGFLEET_INSTANCE_CLASS",
        default_value = "local"
    )]
    instance_class: String,
    /// Storage profile name of the data root (nvme, gp3, custom); reported as is.
    #[arg(long, env = "PGFLEET_STORAGE_PROFILE", default_value = "nvme")]
    storage_profile: String,
    /// Cap read IOPS of the clusters' processes (0: uncapped). Emulated by
    /// block-I/O throttling of the device behind the data root; needs root.
    #[arg(long, default_value_t = 0)]
    read_iops: u64,
    /// Cap write IOPS (0: uncapped).
    #[arg(long, default_value_t = 0)]
    write_iops: u64,
    /// Cap read MiB/s (0: uncapped).
    #[arg(long, default_value_t = 0)]
    read_mbps: u64,
    /// Cap write MiB/s (0: uncapped).
    #[arg(long, default_value_t = 0)]
    write_mbps: u64,
    /// Reads and writes share one budget, as gp3's IOPS and MiB/s do: each
    /// cap given is the budget, split between reads and writes by demand
    /// (the device's counters, every 250 ms).
    #[arg(long)]
    combined_io: bool,
    /// Answer each read after this many microseconds (a network volume's
    /// round trip; the mean of a draw with a tail), as well as within the
    /// caps: the clusters' volumes are then served by this agent over FUSE
    /// (needs root and /dev/fuse). 0: the host's device as it is.
    #[arg(long, default_value_t = 0)]
    read_latency_us: u32,
    /// Each write's latency, in microseconds (see --read-latency-us).
    #[arg(long, default_value_t = 0)]
    write_latency_us: u32,
    /// Each cache flush's (an fsync's), in microseconds.
    #[arg(long, default_value_t = 0)]
    flush_latency_us: u32,
    /// Do not apply the caps: run uncapped and report the profile as not emulated.
    #[arg(long)]
    no_emulate: bool,
    /// The instance type this agent stands for (a label in reports, e.g.
    /// m6id.4xlarge).
    #[arg(long, env = "PGFLEET_INSTANCE_TYPE", default_value = "")]
    instance_type: String,
    /// Limit each cluster's memory, page cache included, to this many bytes
    /// (a memory cgroup; needs root), as on an instance of that size.
    /// 0: the host's memory.
    #[arg(long, default_value_t = 0)]
    memory_bytes: u64,
    /// Limit each cluster to this many CPUs' worth of CPU time (a CPU quota;
    /// needs root). 0: unlimited.
    #[arg(long, default_value_t = 0)]
    cpus: u32,
    /// Do not apply --memory-bytes / --cpus: run with the host's, and
    /// report the instance as not emulated.
    #[arg(long)]
    no_emulate_instance: bool,
    /// Where clusters are created. Must be reachable by --pg-user.
    /// Default: $TMPDIR/pgfleet/agents/<agent-id>
    #[arg(long, env = "PGFLEET_DATA_ROOT")]
    data_root: Option<PathBuf>,
    /// The local dataset store: data a cell loaded (pgbench's tables at a
    /// scale, ...) is published here after a clean shutdown and restored by
    /// later cells that need the same bytes (`data: reuse`, the default),
    /// instead of loading it again. Agents on one host may share it (a lock
    /// per dataset: one builds, the others wait and restore). Default:
    /// <data-root>/datasets, or $TMPDIR/pgfleet/datasets without --data-root.
    #[arg(long, env = "PGFLEET_DATASET_DIR")]
    dataset_dir: Option<PathBuf>,
    /// Restore datasets by reflink (FICLONE) where the filesystem can
    /// (XFS, btrfs): instant, but the restored cluster's files share their
    /// blocks with the store, so its first write to each block copies it
    /// and a restored cell measures slower than a built one (14-24 % fewer
    /// TPS at scale 200 on XFS, BENCHMARKS.md). Off: restores copy, and
    /// measure alike.
    #[arg(long, env = "PGFLEET_DATASET_REFLINK")]
    dataset_reflink: bool,
    /// An object store behind the local dataset store, e.g.
    /// s3://bucket/pgfleet-datasets: a dataset missing locally is
    /// downloaded from it (zstd parts, each checked against its SHA-256)
    /// instead of loaded, and one built here is uploaded to it, so agents on
    /// other hosts reuse it. Credentials, region and endpoint from the
    /// environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT_URL (an S3-compatible server).
    #[arg(long, env = "PGFLEET_DATASET_REMOTE")]
    dataset_remote: Option<String>,
    /// The CSI VolumeSnapshot the data root's volume was created from (the
    /// Kubernetes source sets it): the datasets it brought are read in full
    /// before a cell restores one, since such a volume fetches each block
    /// from the snapshot on first touch (see --hydrate).
    #[arg(long, env = "PGFLEET_VOLUME_SNAPSHOT")]
    volume_snapshot: Option<String>,
    /// With --volume-snapshot: `read-all` reads every block of a dataset the
    /// snapshot brought before the first cell restores it, and reports the
    /// time to first byte, seconds and MB/s; `none` leaves the blocks lazy
    /// (the cells' figures then include the lazy restore, and the report
    /// warns).
    #[arg(long, env = "PGFLEET_HYDRATE", default_value = "read-all",
          value_parser = clap::builder::PossibleValuesParser::new(pgfleet_agent::hydrate::Mode::NAMES))]
    hydrate: String,
    /// With --volume-snapshot: the mount point of a volume made from the
    /// same snapshot for one cell alone (repeatable; comma-separated in
    /// PGFLEET_CELL_VOLUMES; the Kubernetes source mounts them). A cell
    /// restoring a dataset such a volume holds takes the volume: its
    /// blocks are hydrated, then the dataset's files become the cell's
    /// cluster in place (a rename, no copy). Cells past the volumes restore
    /// by copy from the data root's store.
    #[arg(
        long = "cell-volume",
        env = "PGFLEET_CELL_VOLUMES",
        value_delimiter = ',',
        requires = "volume_snapshot"
    )]
    cell_volumes: Vec<PathBuf>,
    /// Directory with initdb and postgres, to run that build rather than
    /// a version's install (--pg-version).
    #[arg(long, env = "PGFLEET_PG_BIN", conflicts_with = "pg_version")]
    pg_bin: Option<PathBuf>,
    /// The PostgreSQL major version to run (15, 16, 17, 18, 19): the
    /// host's /usr/lib/postgresql/N/bin, else an install made by
    /// `deploy/postgres/install.sh N` (under PGFLEET_PG_INSTALLS, default
    /// /opt/pgfleet/postgres). A class's `postgres: {version: N}` sets it.
    /// Default: 18.
    #[arg(long, env = "PGFLEET_PG_VERSION")]
    pg_version: Option<u32>,
    /// OS user to run PostgreSQL as when the agent runs as root.
    #[arg(long, env = "PGFLEET_PG_USER", default_value = "postgres")]
    pg_user: String,
    /// The address peers on other hosts reach this agent's clusters at (its
    /// host's, pod's or network namespace's IP). Clusters of multi-role cells
    /// listen on it too and admit exactly their peers' addresses. Default:
    /// none, peers must be on this host (loopback).
    #[arg(long, env = "PGFLEET_ADVERTISE_ADDRESS")]
    advertise_address: Option<std::net::IpAddr>,
    /// The fio program kind `fio` runs (fio >= 3.5; Debian's package).
    #[arg(long, env = "PGFLEET_FIO", default_value = "fio")]
    fio: PathBuf,
    /// File holding the controller's join token (sent with every session).
    /// Without it, the token may come in PGFLEET_JOIN_TOKEN (what pods do):
    /// read once at start, then removed from the agent's environment.
    #[arg(long, env = "PGFLEET_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// PEM CA certificate to trust for an https:// controller.
    #[arg(long, env = "PGFLEET_CA")]
    ca: Option<PathBuf>,
    /// Serve this agent's own Prometheus metrics at http://ADDR/metrics
    /// (session up, reconnects, cells, samples awaiting acknowledgement, the
    /// driver's transactions), e.g. 0.0.0.0:9187 in a pod; port 0 picks a
    /// free port. The address is reported to the controller, which lists
    /// it at /sd/agents for Prometheus' HTTP service discovery.
    #[arg(long, env = "PGFLEET_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Exit (after tearing down) when the controller is unreachable this many seconds.
    #[arg(long, default_value_t = 30)]
    give_up_after_s: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Before any thread exists: a join token given in the environment
    // (pods: a Secret's key) is read once and removed from it, and the agent
    // becomes non-dumpable, so a process of its own uid (PostgreSQL in a
    // pod, whose scenario-steered server shares it) can read neither its
    // memory nor its /proc environ. Children get a cleared environment.
    let env_token = std::env::var(JOIN_TOKEN_ENV).ok();
    // SAFETY: single-threaded here (the runtime is built below).
    unsafe { std::env::remove_var(JOIN_TOKEN_ENV) };
    // SAFETY: prctl on the calling process, no memory passed.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        eprintln!("warning: could not make the agent non-dumpable");
    }
    // Processes this agent starts must be spawned from threads that live as
    // long as the agent (the parent-death signal follows the spawning
    // thread), so the runtime's worker threads do it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Logs, and traces when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    let _telemetry = {
        let _in = rt.enter();
        pgfleet_proto::telemetry::init("pgfleet-agent", "info")
    };
    match cli.command {
        Command::Workloads => {
            for k in pgfleet_proto::workload::KINDS {
                println!("{:<14} {}", k.name, k.description);
            }
            Ok(())
        }
        Command::Cleanup { data_root } => {
            let n = cluster::reap_stale(&data_root.join("clusters"))?;
            let _ = std::fs::remove_dir(data_root.join("clusters"));
            pgfleet_agent::sandbox::reap_stale(&data_root.join("sandboxes"));
            let _ = std::fs::remove_dir(&data_root);
            eprintln!("removed {n} stale cluster(s) under {}", data_root.display());
            Ok(())
        }
        Command::Run(args) => rt.block_on(run(*args, env_token)),
    }
}

/// The join token in the environment (read once at start, then removed).
const JOIN_TOKEN_ENV: &str = "PGFLEET_JOIN_TOKEN";

async fn run(mut args: RunArgs, env_token: Option<String>) -> anyhow::Result<()> {
    let agent_id = match args.agent_id.take() {
        Some(id) => id,
        None => nix::unistd::gethostname()
            .context("reading the host name for the agent id (or pass --agent-id)")?
            .to_string_lossy()
            .to_string(),
    };
    let data_root = prepare_data_root(&args, &agent_id)?;
    let env = Arc::new(agent_env(&args, &data_root)?);
    if let Err(e) = &env.pg {
        tracing::error!("{e}");
    }
    let shutdown = cancel_on_signals();
    let token = match &args.token_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading the join token file {}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => env_token.map(|t| t.trim().to_string()),
    };
    let ca = match &args.ca {
        Some(f) => {
            Some(std::fs::read(f).with_context(|| format!("reading the CA file {}", f.display()))?)
        }
        None => None,
    };
    let metrics = Arc::new(AgentMetrics::new());
    metrics
        .info
        .with_label_values(&[
            env!("CARGO_PKG_VERSION"),
            env.pg.as_ref().map(|p| p.version.as_str()).unwrap_or(""),
        ])
        .set(1);
    let metrics_address = match args.metrics_addr {
        Some(bind) => serve_metrics(bind, &args, metrics.clone()).await?,
        None => String::new(),
    };
    let cfg = session::SessionConfig {
        controller: args.controller,
        agent_id,
        instance_class: args.instance_class,
        give_up_after: Duration::from_secs(args.give_up_after_s),
        token,
        ca,
        metrics,
        metrics_address,
    };
    let store_dir = env.datasets.dir.clone();
    let kept = env.kept.clone();
    let serving_metrics = !cfg.metrics_address.is_empty();
    let result = session::run(cfg, env, shutdown).await;
    // A scraper sees the last seconds' counts only if /metrics outlives
    // them: the counters are served a moment more (every cell has ended).
    if serving_metrics {
        tokio::time::sleep(METRICS_LINGER).await;
    }
    kept.clear().await;
    // Whatever happened, leave nothing behind.
    let _ = cluster::reap_stale(&data_root.join("clusters"));
    let _ = std::fs::remove_dir(data_root.join("clusters"));
    pgfleet_agent::sandbox::reap_stale(&data_root.join("sandboxes"));
    // The dataset store stays when it holds datasets (that is its point).
    let _ = std::fs::remove_dir(&store_dir);
    let _ = std::fs::remove_dir(&data_root);
    result.map_err(Into::into)
}

/// How long an agent that serves /metrics keeps serving it after its
/// session ends, so a scraper at a 1-s interval reads its final counts
/// before the process goes (the controller's series carry them anyway).
const METRICS_LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// The agent's data root, created (readable by PostgreSQL's user along
/// the temp dir's path), with what an earlier agent left there removed.
fn prepare_data_root(args: &RunArgs, agent_id: &str) -> anyhow::Result<std::path::PathBuf> {
    let data_root = args
        .data_root
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("pgfleet/agents").join(agent_id));
    let data_root = std::path::absolute(&data_root)
        .with_context(|| format!("data root {}", data_root.display()))?;
    if args.data_root.is_none() {
        pgfleet_proto::dataset::check_private(&std::env::temp_dir().join("pgfleet"))
            .map_err(|e| anyhow::anyhow!("{e}; or give --data-root DIR"))?;
    }
    // The directories made here are traversable by PostgreSQL's user;
    // those that existed keep the operator's modes.
    let made = pgfleet_proto::dataset::create_new_dirs(&data_root.join("clusters"))
        .with_context(|| format!("creating data root {}", data_root.display()))?;
    for d in made {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755));
    }
    let stale = cluster::reap_stale(&data_root.join("clusters"))?
        + pgfleet_agent::sandbox::reap_stale(&data_root.join("sandboxes"));
    if stale > 0 {
        tracing::warn!(stale, "removed stale clusters left by an earlier agent");
    }
    Ok(data_root)
}

/// What every cell of this agent shares: PostgreSQL's binaries and user,
/// the dataset store (unfinished builds of an earlier agent removed), the
/// remote store, the snapshot the volume came from, the storage and
/// instance emulated.
fn agent_env(args: &RunArgs, data_root: &std::path::Path) -> anyhow::Result<AgentEnv> {
    let datasets =
        pgfleet_proto::dataset::LocalStore::new(match (&args.dataset_dir, &args.data_root) {
            (Some(d), _) => std::path::absolute(d)?,
            (None, Some(root)) => std::path::absolute(root)?.join("datasets"),
            (None, None) => std::env::temp_dir().join("pgfleet/datasets"),
        });
    // Created by the first cell that builds a dataset.
    let abandoned = pgfleet_agent::dataset::remove_abandoned(&datasets);
    if abandoned > 0 {
        tracing::warn!(
            abandoned,
            "removed unfinished dataset builds left by an earlier agent"
        );
    }
    let caps = Caps {
        read_iops: args.read_iops,
        write_iops: args.write_iops,
        read_mbps: args.read_mbps,
        write_mbps: args.write_mbps,
        combined: args.combined_io,
        latency: pgfleet_proto::environment::Latency {
            read_us: args.read_latency_us,
            write_us: args.write_latency_us,
            flush_us: args.flush_latency_us,
        },
    };
    let remote = match &args.dataset_remote {
        Some(url) => Some(Arc::new(pgfleet_agent::remote::Remote::open(url)?)),
        None => None,
    };
    let snapshot = args.volume_snapshot.as_deref().map(|name| {
        let mode = pgfleet_agent::hydrate::Mode::parse(&args.hydrate)
            .unwrap_or(pgfleet_agent::hydrate::Mode::ReadAll);
        let s =
            pgfleet_agent::hydrate::Snapshot::at_start(name, mode, &datasets, &args.cell_volumes);
        tracing::info!(
            snapshot = name,
            hydrate = mode.as_str(),
            cell_volumes = args.cell_volumes.len(),
            "the data root's volume came from a snapshot"
        );
        Arc::new(s)
    });
    Ok(AgentEnv {
        pg: match args.pg_version {
            Some(v) => PgBin::find_version(v),
            None => PgBin::find(args.pg_bin.as_deref()),
        }
        .map_err(|e| e.to_string()),
        run_as: RunAs::resolve(&args.pg_user).map_err(|e| e.to_string()),
        data_root: data_root.to_path_buf(),
        datasets,
        dataset_reflink: args.dataset_reflink,
        remote,
        snapshot,
        storage_profile: args.storage_profile.clone(),
        caps,
        emulated: caps.is_capped() && !args.no_emulate,
        address: args.advertise_address,
        instance: Instance {
            instance_type: args.instance_type.clone(),
            memory_bytes: args.memory_bytes,
            cpus: args.cpus,
            emulated: (args.memory_bytes > 0 || args.cpus > 0) && !args.no_emulate_instance,
        },
        fio: args.fio.clone(),
        delivered: Default::default(),
        kept: Default::default(),
    })
}

/// Cancelled on SIGTERM or SIGINT: the agent tears its cells down.
fn cancel_on_signals() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let sig = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: tearing down"),
            _ = int.recv() => tracing::info!("SIGINT: tearing down"),
        }
        sig.cancel();
    });
    shutdown
}

/// Serves /metrics on `bind`; returns what a scraper elsewhere dials: the
/// bound IP, or for a wildcard bind the advertised address, else the host
/// name.
async fn serve_metrics(
    bind: std::net::SocketAddr,
    args: &RunArgs,
    metrics: Arc<AgentMetrics>,
) -> anyhow::Result<String> {
    let bound = pgfleet_agent::metrics::serve(bind, metrics)
        .await
        .with_context(|| format!("serving metrics on {bind} (--metrics-addr)"))?;
    let host = if !bound.ip().is_unspecified() {
        bound.ip().to_string()
    } else if let Some(a) = args.advertise_address {
        a.to_string()
    } else {
        pgfleet_agent::host::hostname()
    };
    let reach = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(_)) => format!("[{host}]:{}", bound.port()),
        _ => format!("{host}:{}", bound.port()),
    };
    tracing::info!(metrics = %format!("http://{reach}/metrics"), "serving metrics");
    Ok(reach)
}
