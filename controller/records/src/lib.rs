//! What a run records: the entries its writer stores, in order, in one
//! transaction per batch (`pgfleet_store::Store::commit`). The scheduler's
//! core (`pgfleet-schedule`) makes them and the store writes them; this
//! crate holds only their types, so the core needs no store to make them.

use serde_json::Value as Json;

/// State of a cell. One place advances it: the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl CellState {
    pub fn as_str(self) -> &'static str {
        match self {
            CellState::Pending => "pending",
            CellState::Running => "running",
            CellState::Succeeded => "succeeded",
            CellState::Failed => "failed",
            CellState::Cancelled => "cancelled",
        }
    }
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            CellState::Succeeded | CellState::Failed | CellState::Cancelled
        )
    }
}

/// What the store keeps of an agent's registration (`agents.info`): what
/// the agent said of itself before it ran a cell.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Registration {
    pub agent_id: String,
    pub instance_class: String,
    pub storage: Option<RegisteredStorage>,
    pub cores: u64,
    pub memory_bytes: u64,
    pub postgres_version: String,
    pub postgres_bin_dir: String,
    pub hostname: String,
    pub agent_version: String,
}

/// The storage an agent registered with: its profile and caps.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RegisteredStorage {
    pub profile: String,
    pub emulated: bool,
    pub data_root: String,
    pub caps: pgfleet_proto::environment::Caps,
}

/// A sample to store: its cell, kind and data, who sent it and its number
/// (0: not numbered).
#[derive(Debug, Clone)]
pub struct NewSample {
    pub cell_id: String,
    pub kind: String,
    pub data: Json,
    pub agent_id: String,
    pub seq: u64,
}

/// A cell's end as stored: its state, error, environment and points.
#[derive(Debug, Clone)]
pub struct CellEnd {
    pub cell_id: String,
    pub state: CellState,
    pub error: Option<String>,
    pub environment: Option<Json>,
    pub points: Vec<(Json, Json)>,
}

/// One write of a run, as the run's writer queues them (`Store::commit`
/// writes a batch in order, in one transaction).
#[derive(Debug, Clone)]
pub enum Entry {
    Sample(NewSample),
    /// A cell's end.
    End(CellEnd),
    /// A cell starts on its agents (`role:agent, ...` for multi-role cells).
    StartCell {
        cell_id: String,
        agents: String,
    },
    /// A running cell's assignment was lost: pending again.
    RequeueCell {
        cell_id: String,
    },
    RegisterAgent {
        agent_id: String,
        class: String,
        info: Registration,
    },
    AgentLost {
        agent_id: String,
    },
}
