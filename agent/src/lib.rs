//! pgfleet-agent: provisions PostgreSQL clusters on the storage it was given,
//! runs workloads in them, and streams progress, samples and results back to
//! the controller over one gRPC session.
//!
//! Architecture invariant: the agent never decides scheduling. It runs what it
//! is assigned, one cell at a time, and reports; the controller decides.

pub mod assign;
pub mod blocking;
pub mod cell;
pub mod cluster;
pub mod dataset;
pub mod direct;
pub mod driver;
pub mod failpoint;
pub mod host;
pub mod hydrate;
pub mod keep;
pub mod metrics;
pub mod pgbin;
pub mod pglz;
pub mod remote;
pub mod sampler;
pub mod sandbox;
pub mod session;
pub mod workload;

/// Errors of the agent library. `main` turns them into `anyhow` at the edge.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("PostgreSQL binaries: {0}")]
    PgBin(String),
    #[error("provisioning the cluster failed: {0}")]
    Provision(String),
    #[error("PostgreSQL error: {}", pg_text(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("I/O error: {context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("workload `{workload}`: {message}")]
    Workload { workload: String, message: String },
    /// Something failed on a peer role's cluster (reached over the network).
    #[error("on the {role}'s cluster: {message}")]
    Peer { role: String, message: String },
    #[error("the cell's PostgreSQL server exited while the workload ran")]
    ServerExited,
    /// A workload error with the server's own reason (see
    /// `Cluster::explain_failure`).
    #[error("{cause}; {server}")]
    ServerFailed { cause: Box<Error>, server: String },
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// A published dataset's files do not match its manifest: it is
    /// discarded and built again.
    #[error("dataset {fingerprint} does not match its manifest: {detail}")]
    DatasetCorrupt { fingerprint: String, detail: String },
    /// The remote dataset store (`remote.rs`) could not be reached or used.
    #[error("remote dataset store: {0}")]
    Remote(String),
    #[error("session with the controller: {0}")]
    Session(String),
    /// The controller will not take this agent (token, identity, TLS
    /// setup): retrying the same way cannot help.
    #[error("{0}")]
    Refused(String),
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// tokio-postgres prints only "db error"; say what the server said.
pub fn pg_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} (SQLSTATE {})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
