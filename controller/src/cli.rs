//! The command line: `pgfleet run | validate | list | report` locally,
//! `pgfleet serve` as a service, `pgfleet submit | status | cancel | report
//! --server` against one.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// pgfleet: load-testing orchestrator for PostgreSQL storage experiments.
///
/// A controller schedules agents; each agent provisions real PostgreSQL
/// clusters, runs workloads, and streams results back. Runs are stored in
/// SQLite and rendered into report.json, report.md and SVG plots.
///
/// Locally, `pgfleet run SCENARIO` does it all in one command. As a
/// service, `pgfleet serve` takes runs over HTTP from CI (`pgfleet submit
/// SCENARIO --server URL --wait`) and agents join it from any host
/// (`pgfleet-agent run --controller URL --class NAME --token-file F`).
#[derive(Parser, Debug)]
#[command(name = "pgfleet", version, about, long_about, after_help = crate::exit::TABLE)]
pub struct Cli {
    /// The run store (SQLite). Reports are rendered only from it.
    #[arg(
        long,
        global = true,
        env = "PGFLEET_STORE",
        default_value = "pgfleet-data/pgfleet.db"
    )]
    pub store: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a scenario on this machine and write its report.
    ///
    /// Starts an embedded controller on loopback, spawns one local agent
    /// process per fleet instance, runs every cell, writes the report.
    ///
    /// Example: pgfleet run scenarios/toast-slice.yaml --out runs/toast
    Run(Box<RunArgs>),
    /// Render a stored run's report again.
    ///
    /// From the local store, or downloaded from a server with --server.
    ///
    /// Example: pgfleet report 20261130-211500-a1b2c3 --out runs/again
    Report {
        /// The run id (`pgfleet list` or `pgfleet status --server` shows them).
        run_id: String,
        /// Directory for report.json, report.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Also write the run's pgbench figures in another result schema:
        /// `postgresbench` (ClickHouse's PostgresBench: one
        /// postgresbench-<class>.json per class, its replicas as the runs).
        #[arg(long, value_enum)]
        format: Option<ReportFormat>,
        #[command(flatten)]
        remote: OptionalRemote,
    },
    /// List, build and remove the datasets cells restore instead of loading.
    ///
    /// The local dataset store: data a cell loaded (e.g. pgbench's tables at
    /// a scale) is published there after a clean shutdown, and later cells
    /// and runs that need the same bytes restore it instead of loading
    /// (`data: reuse`, a workload's default; `data: fresh` loads
    /// every time). A dataset's fingerprint names its label and a hash of
    /// the PostgreSQL format and the keys that shape the data.
    ///
    /// Examples: pgfleet datasets list --scenario scenarios/storage-suite.yaml;
    /// pgfleet datasets build scenarios/storage-suite.yaml (nightly, ahead of
    /// the runs); pgfleet datasets rm pgbench-s300-0123456789abcdef
    Datasets {
        #[command(subcommand)]
        action: DatasetsAction,
    },
    /// List stored runs with their status.
    ///
    /// Queued, running, succeeded, failed, cancelled, or interrupted (its
    /// controller exited without finishing it; its unfinished cells are
    /// marked cancelled).
    List {
        /// Only runs with this label (repeatable: runs with all of them),
        /// e.g. --label branch=main.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_arg)]
        labels: Vec<String>,
    },
    /// Check a scenario file and show the cells it plans, without running.
    ///
    /// Each cell's estimate is corrected by what earlier cells of its kind,
    /// class and dataset step took in the run store (--store), when it
    /// holds any. With --kubernetes, print the objects a run of it would create on a
    /// cluster instead (a dry run: nothing is sent), e.g.
    /// `pgfleet validate scenarios/at-scale/nvme-vs-ebs.yaml --kubernetes | kubectl apply --dry-run=server -f -`
    Validate {
        /// The scenario file (YAML).
        scenario: PathBuf,
        /// Print the PersistentVolumeClaims and Pods (and their owner) a
        /// run would create on Kubernetes, as YAML on stdout.
        #[arg(long)]
        kubernetes: bool,
        #[command(flatten)]
        kube: KubeArgs,
        /// Datasets already published in this store (`pgfleet run`'s) are
        /// estimated as restores, not builds.
        #[command(flatten)]
        datasets: DatasetDir,
    },
    /// Compare two runs point by point, with intervals and CI gates.
    ///
    /// The candidate's median over clusters divided by the baseline's, per instance class and metric, with a
    /// bootstrap confidence interval and a verdict (faster, slower, no
    /// difference). Each side is a run id in the store or a report.json
    /// file (e.g. a baseline kept as a CI artifact). Gates make it a CI step:
    ///
    /// pgfleet compare baseline/report.json RUN_ID --fail-if 'tps < -5%' --fail-if 'latency_ms_p99 > 10%' --junit compare.xml
    Compare(CompareArgs),
    /// A scenario's figures over its stored runs, with their change points.
    ///
    /// The change points in each series (E-divisive means with a permutation test; no
    /// segment shorter than 3 runs, so one spike is not a change) and the
    /// latest run against the runs since the last change. Only runs
    /// comparable with the latest (same scenario text, PostgreSQL version
    /// and settings, storage, instance, host and datasets) are compared;
    /// the others are listed with why. E.g.
    ///
    /// pgfleet history random-update --metric tps --class gp3 --label branch=main --last 30 --out hist/
    History(HistoryArgs),
    /// Run the controller as a service that CI submits runs to.
    ///
    /// The agents' gRPC endpoint, the HTTP API CI submits runs to (OpenAPI at /openapi.json), health endpoints
    /// and the store, until SIGTERM or Ctrl-C. Runs execute in submission
    /// order, side by side when their instance classes differ. Agents join
    /// from any host with `pgfleet-agent run --controller URL --class NAME
    /// --token-file F`. Restarted on the same store, it resumes its runs.
    ///
    /// Example: pgfleet serve --store /var/lib/pgfleet/pgfleet.db --api-token-file api.token --join-token-file join.token --tls-cert c.pem --tls-key k.pem
    Serve(Box<ServeArgs>),
    /// Print the PgfleetRun CustomResourceDefinition.
    ///
    /// The YAML of deploy/base/crd.yaml, generated from the scenario's types: a
    /// PgfleetRun's `spec` is a scenario. Install: pgfleet crd | kubectl apply -f -
    Crd,
    /// Submit a scenario to a server (CI) and, with --wait, follow it.
    ///
    /// Validates it locally first, then submits it; with --wait follows it to the end, downloads its report
    /// into --out and exits with the run's code (see below).
    ///
    /// Example: pgfleet submit scenarios/quickstart.yaml --server http://pgfleet:8080 --wait --out report/
    Submit(Box<SubmitArgs>),
    /// Show a run on a server: status, progress and every cell.
    Status {
        run_id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel a run on a server.
    Cancel {
        run_id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

impl Command {
    /// The subcommand's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Run(_) => "run",
            Command::Report { .. } => "report",
            Command::List { .. } => "list",
            Command::Validate { .. } => "validate",
            Command::Datasets { .. } => "datasets",
            Command::Compare(_) => "compare",
            Command::History(_) => "history",
            Command::Serve(_) => "serve",
            Command::Crd => "crd",
            Command::Submit(_) => "submit",
            Command::Status { .. } => "status",
            Command::Cancel { .. } => "cancel",
        }
    }
}

/// A result schema `pgfleet report --format` writes besides its own.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportFormat {
    /// ClickHouse's PostgresBench (`*/results/*.json`).
    Postgresbench,
}

/// Where the server is and how to authenticate.
#[derive(clap::Args, Debug, Clone)]
pub struct Remote {
    /// The URL of `pgfleet serve`'s HTTP API: http:// or https://.
    #[arg(long, env = "PGFLEET_SERVER")]
    pub server: String,
    /// File holding the API token (one of the server's --api-token-file).
    #[arg(long, env = "PGFLEET_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// With an https:// server: trust this PEM CA (a private one, e.g. the
    /// one that signed serve's --http-tls-cert) instead of the system's.
    #[arg(long, env = "PGFLEET_SERVER_CA")]
    pub ca: Option<PathBuf>,
    /// Keep retrying an unreachable server this long, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub retry_for_s: f64,
}

#[derive(clap::Args, Debug, Clone)]
pub struct OptionalRemote {
    /// Download the report from this server instead of rendering it from
    /// the local store.
    #[arg(long, env = "PGFLEET_SERVER")]
    pub server: Option<String>,
    /// File holding the API token.
    #[arg(long, env = "PGFLEET_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// With an https:// server: trust this PEM CA.
    #[arg(long, env = "PGFLEET_SERVER_CA")]
    pub ca: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// The scenario file (YAML).
    pub scenario: PathBuf,
    #[command(flatten)]
    pub remote: Remote,
    /// Follow the run to its end and exit with its code.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: download report.json, report.md and plots here.
    #[arg(long, requires = "wait")]
    pub out: Option<PathBuf>,
    /// With --wait: give up after this many seconds (cancels the run, exit 3).
    #[arg(long, requires = "wait")]
    pub timeout_s: Option<f64>,
    /// With --wait: write the scenario's checks as JUnit XML (one test case
    /// per check) for CI test tabs.
    #[arg(long, requires = "wait")]
    pub junit: Option<PathBuf>,
    /// Makes a retried submission return the run of the first one. Default:
    /// one per invocation (internal retries reuse it); pass your CI job's
    /// id (e.g. "$CI_JOB_ID") so a retried job does not start a second run.
    #[arg(long, env = "PGFLEET_IDEMPOTENCY_KEY")]
    pub idempotency_key: Option<String>,
    /// Label the run KEY=VALUE (repeatable), e.g. --label commit=$SHA
    /// --label branch=main: stored with the run, shown in its report and
    /// `pgfleet list`, and what `list --label` and the API's
    /// `GET /v1/runs?label=` pick runs by.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_arg)]
    pub labels: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The baseline: a run id in the store, or a report.json file.
    pub baseline: String,
    /// The candidate: a run id in the store, or a report.json file.
    pub candidate: String,
    /// The intervals' level.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// Fail (exit 1) when a metric's change is conclusively beyond a
    /// bound: 'tps < -5%' (fewer transactions by more than 5 %),
    /// 'latency_ms_p99 > 10%'. Repeatable. An interval straddling the
    /// bound fails too, unless --inconclusive-passes.
    #[arg(long = "fail-if", value_name = "GATE")]
    pub fail_if: Vec<String>,
    /// Count gates whose interval straddles the bound as passed.
    #[arg(long)]
    pub inconclusive_passes: bool,
    /// Output: markdown (a table) or json.
    #[arg(long, value_enum, default_value_t = CompareFormat::Markdown)]
    pub format: CompareFormat,
    /// Write the gates as JUnit XML (one test case per gate and point).
    #[arg(long)]
    pub junit: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    /// The scenario: its name, or its file (its `name` is used).
    pub scenario: String,
    /// Only this metric (repeatable), e.g. tps, latency_ms_p99.
    #[arg(long = "metric")]
    pub metrics: Vec<String>,
    /// Only this instance class.
    #[arg(long)]
    pub class: Option<String>,
    /// Only points whose workload, label or parameters contain this text.
    #[arg(long)]
    pub point: Option<String>,
    /// Only runs with this label (repeatable: all of them).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_arg)]
    pub labels: Vec<String>,
    /// The last N comparable runs (0: all).
    #[arg(long, default_value_t = 30)]
    pub last: usize,
    /// A PostgreSQL setting the history follows (repeatable): runs that
    /// differ in it stay comparable, so changing it shows as a step in the
    /// series (e.g. --vary synchronous_commit).
    #[arg(long = "vary", value_name = "SETTING")]
    pub vary: Vec<String>,
    /// The confidence level of each run's interval.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// Output: markdown or json.
    #[arg(long, value_enum, default_value_t = CompareFormat::Markdown)]
    pub format: CompareFormat,
    /// Write history.md (or history.json) and one SVG plot per series here
    /// instead of printing.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareFormat {
    Markdown,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where the agents' gRPC endpoint listens.
    #[arg(long, default_value = "0.0.0.0:7070")]
    pub bind: SocketAddr,
    /// Where the HTTP API listens.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub http: SocketAddr,
    /// File of the bearer tokens API clients send: one per line, 16+
    /// characters; `read-only TOKEN` for a token that may only read (runs,
    /// events, reports). Re-read when it changes: rotate by adding the new
    /// token, moving clients, then removing the old one.
    #[arg(long, env = "PGFLEET_API_TOKEN_FILE")]
    pub api_token_file: PathBuf,
    /// Reports of finished runs go to <reports>/<run-id>/. Default: a
    /// `reports` directory next to the store.
    #[arg(long)]
    pub reports: Option<PathBuf>,
    /// The largest scenario accepted, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_scenario_bytes: usize,
    /// Serve the HTTP API over TLS with this PEM certificate (chain);
    /// clients dial https:// (`pgfleet submit --ca` trusts a private CA).
    /// Needs --http-tls-key.
    #[arg(long, requires = "http_tls_key")]
    pub http_tls_cert: Option<PathBuf>,
    /// The PEM private key of --http-tls-cert.
    #[arg(long, requires = "http_tls_cert")]
    pub http_tls_key: Option<PathBuf>,
    /// How many submitted runs may wait in the queue; past it a submission
    /// gets 429 with Retry-After.
    #[arg(long, default_value_t = 100)]
    pub max_queued_runs: usize,
    /// The most cells one submitted scenario may plan (entries × classes ×
    /// sweep points × replicas), counted before any is built; past it the
    /// submission and POST /v1/plan get 422 at the entry. At most 5000.
    #[arg(long, default_value_t = 1000)]
    pub max_cells: u64,
    /// Accept scenarios whose workloads set `allow_shell: true` (`\shell`
    /// in scripts, settings such as archive_command, a superuser workload
    /// role): they run commands on the agents' hosts. Off: such a
    /// submission is refused with 403.
    #[arg(long)]
    pub allow_shell_scenarios: bool,
    /// How long a finished run's series stay on /metrics, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub metrics_retention_s: f64,
    /// Where runs' agents come from: `pool` (agents that joined with
    /// `pgfleet-agent run --class NAME`) or `kubernetes` (a pod and a volume
    /// per agent, created for each run in --namespace and deleted after it;
    /// agents dial --advertise-url, which is then required).
    #[arg(long, value_enum, default_value_t = AgentsFrom::Pool)]
    pub agents: AgentsFrom,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// With --agents kubernetes, also run the PgfleetRuns of --namespace
    /// (`kubectl apply -f run.yaml`; the CRD is deploy/base/crd.yaml, or
    /// `pgfleet crd`). Off: only the HTTP API takes runs.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_resources: bool,
    /// serve's API as clients reach it: the report URL a PgfleetRun's
    /// status gives. Default: http://pgfleet-controller.NAMESPACE.svc:8080
    /// (deploy/base's Service).
    #[arg(long)]
    pub api_url: Option<String>,
    #[command(flatten)]
    pub session: SessionArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentsFrom {
    Pool,
    Kubernetes,
}

/// Agents as Kubernetes pods (serve --agents kubernetes, validate --kubernetes).
#[derive(clap::Args, Debug, Clone)]
pub struct KubeArgs {
    /// The namespace runs' pods and volumes go to (the controller's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "pgfleet")]
    pub namespace: String,
    /// The agent image the pods run (built by deploy/images/build.sh).
    #[arg(long, env = "PGFLEET_AGENT_IMAGE", default_value = "pgfleet-agent:dev")]
    pub agent_image: String,
    /// The pods' imagePullPolicy.
    #[arg(long, default_value = "IfNotPresent")]
    pub agent_image_pull_policy: String,
    /// The Secret holding the join token (key `join-token`) the pods mount.
    #[arg(long, default_value = "pgfleet-tokens")]
    pub agent_token_secret: String,
    /// A Secret holding the CA (key `ca.pem`) agents trust, when the
    /// agent session is TLS.
    #[arg(long)]
    pub agent_ca_secret: Option<String>,
    /// Give up a pod still Pending after this many seconds (unschedulable,
    /// image not pulled, volume not bound); the reason goes to the report.
    /// With nodes on demand (Karpenter), it includes the time a node takes
    /// to come up: raise it where instances are slow to come.
    #[arg(long, default_value_t = 600.0)]
    pub pending_timeout_s: f64,
    /// An object store behind each agent pod's dataset store, e.g.
    /// s3://bucket/pgfleet-datasets: pods download datasets other pods
    /// built (and upload the ones they build) instead of loading them. The
    /// only dataset store that outlives an instance-store NVMe node.
    #[arg(long, env = "PGFLEET_DATASET_REMOTE")]
    pub dataset_remote: Option<String>,
    /// The Secret whose keys become the agent pods' environment for the
    /// object store: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT_URL (leave it out with IAM roles for service accounts).
    #[arg(long, requires = "dataset_remote")]
    pub dataset_remote_secret: Option<String>,
    /// STORAGECLASS=VOLUMESNAPSHOTCLASS, repeatable, e.g.
    /// `--dataset-snapshots gp3=ebs-snapshots`: agents' volumes of that
    /// storage class keep the datasets their runs built as CSI
    /// VolumeSnapshots, and later runs' volumes of the class start from
    /// the newest one holding their datasets (read in full before
    /// measuring: a scenario's `storage.hydrate`). Needs the cluster's
    /// snapshot controller and CRDs (deploy/overlays/eks has the class).
    #[arg(long, value_parser = parse_snapshot_mapping)]
    pub dataset_snapshots: Vec<(String, String)>,
}

/// `gp3=ebs-snapshots` of `--dataset-snapshots`.
fn parse_snapshot_mapping(s: &str) -> Result<(String, String), String> {
    let (sc, class) = s
        .split_once('=')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .ok_or_else(|| {
            format!("`{s}`: expected STORAGECLASS=VOLUMESNAPSHOTCLASS, e.g. gp3=ebs-snapshots")
        })?;
    Ok((sc.to_string(), class.to_string()))
}

/// The agents' session: lease, TLS and join token (run and serve).
#[derive(clap::Args, Debug)]
pub struct SessionArgs {
    /// Declare an agent lost after this many seconds without a message.
    #[arg(long, default_value_t = 10.0)]
    pub lease_s: f64,
    /// How long a run waits for its agents (launched ones to register;
    /// with serve, enough idle agents of each class to join), in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub registration_timeout_s: f64,
    /// URL agents dial to reach the controller, when it is not the bound
    /// address (a proxy or port-forward in between), e.g. http://10.0.0.5:7070.
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// Serve the agent session over TLS with this PEM certificate (chain);
    /// agents dial https:// and trust it with `--ca` (local agents are given
    /// this file). Use when agents connect from other hosts.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's PEM private key.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate the local agents trust (default: the
    /// --tls-cert file, which then should hold the chain up to its CA).
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// File holding the join token agents must present (16+ characters).
    /// Default for run: a random token per run, handed to the local agents.
    #[arg(long, env = "PGFLEET_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum DatasetsAction {
    /// List the published datasets: fingerprint, size, age, PostgreSQL
    /// version, load time, the cell and host that built it, and (with
    /// --scenario) which scenarios' cells use it.
    List {
        #[command(flatten)]
        dir: DatasetDir,
        /// Say which of these scenario files would use each dataset.
        #[arg(long = "scenario")]
        scenarios: Vec<PathBuf>,
    },
    /// Build the datasets a scenario's cells reuse, ahead of its runs: one
    /// cell per dataset, on the scenario's fleet of local agents, loads it
    /// and publishes it (nothing when it is published already); nothing is
    /// measured. Takes `pgfleet run`'s options.
    Build(Box<RunArgs>),
    /// Remove datasets (refused while a cell builds or restores one).
    Rm {
        #[command(flatten)]
        dir: DatasetDir,
        /// Fingerprints, as `pgfleet datasets list` shows them.
        #[arg(required = true)]
        fingerprints: Vec<String>,
    },
}

#[derive(clap::Args, Debug)]
pub struct DatasetDir {
    /// The store: `pgfleet run`'s --dataset-dir (default
    /// <data-dir>/datasets, i.e. $TMPDIR/pgfleet/datasets).
    #[arg(long, env = "PGFLEET_DATASET_DIR")]
    pub dataset_dir: Option<PathBuf>,
    /// `pgfleet run`'s --data-dir, whose datasets/ is the default store.
    #[arg(long, env = "PGFLEET_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

impl DatasetDir {
    pub fn resolve(&self) -> PathBuf {
        self.dataset_dir.clone().unwrap_or_else(|| {
            self.data_dir
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("pgfleet"))
                .join("datasets")
        })
    }
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The scenario file (YAML). See scenarios/ for examples.
    pub scenario: PathBuf,
    /// Directory for report.json, report.md, plots and agent logs.
    /// Default: runs/<run-id>
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Address the embedded controller listens on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Serve Prometheus metrics at http://ADDR/metrics while the run goes
    /// on (e.g. 127.0.0.1:9187). The local agents then serve their own on
    /// free ports, listed for Prometheus at http://ADDR/sd/agents
    /// (`http_sd_configs`).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Write the scenario's checks as JUnit XML (one test case per check)
    /// for CI test tabs.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Label the run KEY=VALUE (repeatable), e.g. --label commit=$SHA
    /// --label branch=main: stored with the run, shown in its report and
    /// `pgfleet list`, and what `list --label` and the API's
    /// `GET /v1/runs?label=` pick runs by.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_arg)]
    pub labels: Vec<String>,
    #[command(flatten)]
    pub session: SessionArgs,
    /// The agent binary. Default: pgfleet-agent next to pgfleet, else PATH.
    #[arg(long, env = "PGFLEET_AGENT_BIN")]
    pub agent_bin: Option<PathBuf>,
    /// Directory with PostgreSQL's initdb and postgres, passed to agents
    /// of classes that name no `postgres: {version}`. Default: those run
    /// PostgreSQL 18 (deploy/postgres/install.sh 18 installs it).
    #[arg(long, env = "PGFLEET_PG_BIN")]
    pub pg_bin: Option<PathBuf>,
    /// OS user to run PostgreSQL as when agents run as root (default postgres).
    #[arg(long, env = "PGFLEET_PG_USER")]
    pub pg_user: Option<String>,
    /// Start the local agents inside these network namespaces (created by
    /// you, each with an address; comma-separated, assigned in turn; needs
    /// root). Each agent advertises its namespace's address, so multi-role
    /// cells (e.g. logical-drain) connect their clusters over real
    /// interfaces. Bind the controller where the namespaces reach it (--bind).
    #[arg(long, value_delimiter = ',')]
    pub agent_netns: Vec<String>,
    /// Where agents create clusters: <data-dir>/<run-id>/<agent-id>. Must be
    /// traversable by the PostgreSQL user. Removed after the run.
    #[arg(long, env = "PGFLEET_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The local agents' dataset store: a cell's loaded data (e.g.
    /// pgbench's tables at a scale) is published here and restored by
    /// later cells and runs that need the same bytes (`data: reuse`, the
    /// default), instead of loading it again. Kept across runs; list and
    /// remove with `pgfleet datasets`. Default: <data-dir>/datasets.
    #[arg(long, env = "PGFLEET_DATASET_DIR")]
    pub dataset_dir: Option<PathBuf>,
    /// An object store behind the agents' dataset store, e.g.
    /// s3://bucket/pgfleet-datasets (the agents' --dataset-remote): datasets
    /// missing locally are downloaded from it, built ones uploaded, so
    /// other hosts reuse them. The agents read AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ENDPOINT_URL from this
    /// process's environment.
    #[arg(long, env = "PGFLEET_DATASET_REMOTE")]
    pub dataset_remote: Option<String>,
}

/// A `--label`'s text, checked (the duplicates are checked together).
fn label_arg(text: &str) -> Result<String, String> {
    crate::labels::parse_one(text).map(|_| text.to_string())
}
