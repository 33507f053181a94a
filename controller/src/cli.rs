//! The command line: `pgfleet run | report | list | validate`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// pgfleet: load-testing orchestrator for PostgreSQL storage experiments.
///
/// A controller schedules agents; each agent provisions real PostgreSQL
/// clusters, runs workloads, and streams results back. Runs are stored in
/// SQLite and rendered into report.json, report.md and SVG plots.
///
/// Exit codes: 0 every cell succeeded; 1 a cell (or the run) failed;
/// 2 invalid scenario or usage; 130 cancelled (Ctrl-C).
#[derive(Parser, Debug)]
#[command(name = "pgfleet", version, about, long_about)]
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
    /// Run a scenario: start an embedded controller on loopback, spawn one
    /// local agent process per fleet instance, run every cell, write the report.
    ///
    /// Example: pgfleet run scenarios/toast-slice.yaml --out runs/toast
    Run(Box<RunArgs>),
    /// Render the report of a stored run again.
    ///
    /// Example: pgfleet report 20261130-211500-a1b2c3 --out runs/again
    Report {
        /// The run id (`pgfleet list` shows them).
        run_id: String,
        /// Directory for report.json, report.md and plots.
        #[arg(long)]
        out: PathBuf,
    },
    /// List stored runs with their status: running, succeeded, failed,
    /// cancelled, or interrupted (its controller exited without finishing
    /// it; its unfinished cells are marked cancelled).
    List,
    /// Check a scenario file and show the cells it plans, without running.
    Validate {
        /// The scenario file (YAML).
        scenario: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The scenario file (YAML). See scenarios/ for examples.
    pub scenario: PathBuf,
    /// Directory for report.json, report.md, plots and agent logs.
    /// Default: runs/<run-id>
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Declare an agent lost after this many seconds without a message.
    #[arg(long, default_value_t = 10.0)]
    pub lease_s: f64,
    /// How long launched agents have to register, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub registration_timeout_s: f64,
    /// Address the embedded controller listens on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
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
    /// Default: a random token per run, handed to the local agents.
    #[arg(long, env = "PGFLEET_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
    /// The agent binary. Default: pgfleet-agent next to pgfleet, else PATH.
    #[arg(long, env = "PGFLEET_AGENT_BIN")]
    pub agent_bin: Option<PathBuf>,
    /// Directory with PostgreSQL's initdb and postgres, passed to agents.
    /// Default: agents look for pg_config, then /usr/lib/postgresql/*/bin.
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
}
