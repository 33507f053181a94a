//! pgfleet-controller: scenarios, agent sessions, scheduling, the run store
//! and reports. The `pgfleet` binary is a thin CLI over this library.
//!
//! Architecture invariants:
//! - The agent never decides scheduling; the scheduler is the one place that
//!   advances a cell's state.
//! - Reports read only the store.
//! - The scheduler never knows where agents come from: sources (`agents/`)
//!   start them; they register over the same gRPC session either way.

pub mod agents;
pub mod api;
pub mod cli;
pub mod report;
pub mod run;
pub mod scenario;
pub mod scheduler;
pub mod store;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error("store: {0}")]
    Store(String),
    #[error("agents: {0}")]
    Agents(String),
    #[error("gRPC server: {0}")]
    Server(String),
    #[error("report: {0}")]
    Report(String),
    #[error("{0}")]
    Usage(String),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Store(e.to_string())
    }
}

impl Error {
    /// Exit code for the CLI: 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Scenario(_) | Error::Usage(_) => 2,
            _ => 1,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
