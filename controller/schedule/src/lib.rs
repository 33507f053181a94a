//! The scheduler's core: the state of a run's cells, roles and agents, and
//! `Core::apply(input, now) -> effects`, the one place that advances it.
//! Pure: no channel, store, clock or terminal; time comes with each input,
//! and everything the core wants done (messages to agents, store writes,
//! acknowledgements, what observers see) comes back as `Effect`s, which the
//! task around it (`pgfleet-server`'s `scheduler/mod.rs`) carries out in
//! order. Cargo keeps it pure: it declares the protocol's messages, the
//! scenario's planned cells and the records' types, and nothing else, so
//! its code cannot name tokio, the store or a socket.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::controller_message::Msg as CMsg;
use pgfleet_proto::v1::{
    Assign, Cancel, CellResult, CellStatus, Endpoint, Peer, PeerReady, Register, ResultAck,
    RoleReady, SampleAck, Shutdown,
};

use pgfleet_records::{CellEnd, CellState, Entry, NewSample};
use pgfleet_scenario::PlannedCell;

/// The core's clocks.
#[derive(Debug, Clone)]
pub struct Timing {
    /// Silence longer than this and an agent is lost.
    pub lease: Duration,
    /// How long expected agents have to register.
    pub registration_timeout: Duration,
    /// After a cancel, how long running cells have to report back.
    pub cancel_grace: Duration,
}

/// What happens to the core.
#[derive(Debug)]
pub enum Input {
    /// An agent's session registered (`conn` numbers the connection).
    Registered { info: Register, conn: u64 },
    /// A message on connection `conn`, stamped when it arrived.
    Message {
        agent_id: String,
        conn: u64,
        msg: Msg,
        received: Instant,
    },
    /// The connection ended (the agent may come back within its lease).
    Disconnected { agent_id: String, conn: u64 },
    /// The agent's source knows it will not come back.
    Gone { agent_id: String, why: String },
    /// Time passed: leases, registration deadlines, the cancel grace.
    Tick,
    /// The run is cancelled.
    Cancel,
    /// A cell's end (from its agents' results) could not be stored: forget
    /// the outcomes; the agents replay their results.
    CellNotStored { cell_id: String },
}

/// What the core wants done, in order.
#[derive(Debug)]
pub enum Effect {
    /// To the agent's current connection. A send that fails is fed back as
    /// `Input::Disconnected`.
    Send { agent_id: String, msg: CMsg },
    /// To the connection that just registered, which is refused.
    Refuse { reason: String },
    /// Assigns a cell: one `Assign` per role's agent (the task opens the
    /// cell's trace span and puts its traceparent in each).
    Start {
        cell: usize,
        assigns: Vec<(String, Assign)>,
    },
    /// A write for the run's writer (in order with the samples).
    Store(Entry),
    /// Stores a cell's end. `then` happens only once it is stored; when it
    /// cannot be and `replayable` (the outcomes came from agents' results),
    /// the task feeds back `Input::CellNotStored`.
    FinishCell {
        end: CellEnd,
        replayable: bool,
        then: Vec<Effect>,
    },
    /// A sample for the run's writer.
    Sample(NewSample),
    /// Sent through the writer once everything queued before it is stored.
    AckAfterCommit { agent_id: String, msg: CMsg },
    /// For observers: progress UI, metrics, the event stream, traces.
    Observe(Observed),
}

/// What observers are told. Indices are into `Core::cells`.
#[derive(Debug, Clone)]
pub enum Observed {
    /// How long a message waited between arriving and being handled.
    MessageWaited(Duration),
    AgentRegistered {
        agent_id: String,
        class: String,
        first: bool,
        postgres_version: String,
    },
    AgentRefused {
        agent_id: String,
        reason: String,
    },
    AgentLost {
        agent_id: String,
        why: String,
    },
    Progress {
        agent_id: String,
        cell_id: String,
        phase: String,
        message: String,
        done: u64,
        total: u64,
    },
    /// A fresh sample (not a replayed duplicate).
    Sample {
        agent_id: String,
        cell: usize,
        kind: String,
        data: Json,
    },
    /// A cell changed state (see `Core::cells`); `error` for the event.
    CellChanged {
        cell: usize,
        error: Option<String>,
    },
    /// A running cell's assignment was lost; it is pending again.
    CellRequeued {
        cell: usize,
    },
    /// A cell ended (stored), after `seconds` of running, if it ran.
    CellEnded {
        cell: usize,
        state: CellState,
        error: String,
        seconds: Option<f64>,
    },
    Cancelling,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    /// Launched, not registered yet.
    Expected,
    Live,
    Lost,
}

#[derive(Debug)]
pub struct Agent {
    pub class: String,
    pub state: AgentState,
    /// Its current connection, and whether it is open.
    pub conn: u64,
    pub connected: bool,
    pub last_seen: Instant,
    /// The cell (index) and role it runs.
    pub cell: Option<(usize, String)>,
    pub why_lost: String,
    /// Where peers reach its clusters (from its registration).
    pub address: String,
    /// Its storage profile (from its registration), for metrics' labels.
    pub profile: String,
    /// The major version of the PostgreSQL it runs ("18"; from its
    /// registration), for metrics' labels.
    pub postgres_major: String,
    /// The dataset store it publishes to and restores from (from its
    /// registration; empty: its own, shared with no one).
    pub dataset_store: String,
    /// The dataset (`Share::key`) of the cluster it keeps from its last
    /// cell (`reuse_cluster`): the next cell of that dataset goes to it.
    pub kept: Option<String>,
    /// Its host (from its registration): name, cores, memory, and the
    /// emulated instance each of its clusters gets (0 = not limited).
    pub host: Host,
}

/// An agent's host and the instance it emulates there, as registered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Host {
    pub name: String,
    pub cores: u32,
    pub memory_bytes: u64,
    pub instance_cpus: u32,
    pub instance_memory_bytes: u64,
}

/// One role of a running cell.
#[derive(Debug)]
pub struct RoleRun {
    pub role: String,
    pub agent: String,
    endpoint: Option<Endpoint>,
    outcome: Option<Outcome>,
}

/// How a role ended: its result, or its agent's loss.
#[derive(Debug)]
struct Outcome {
    state: CellState,
    error: String,
    points: Vec<(Json, Json)>,
    environment: Option<Json>,
}

#[derive(Debug)]
pub struct Cell {
    pub planned: PlannedCell,
    pub state: CellState,
    /// The plan's estimate of this cell's seconds.
    pub estimate: f64,
    /// When it started running.
    pub started: Option<Instant>,
    /// Set while running: one per role, the lead first.
    pub roles: Vec<RoleRun>,
    /// The first role failure; the other roles were asked to stop.
    failure: Option<String>,
    /// The lead succeeded; the other roles were released.
    released: bool,
    /// Who runs it, for people (`role:agent, ...`).
    pub agents: String,
}

pub struct Core {
    timing: Timing,
    pub agents: BTreeMap<String, Agent>,
    pub cells: Vec<Cell>,
    started: Instant,
    pub cancelled: Option<Instant>,
    /// The last sample number kept per (cell, agent) of the current
    /// assignment: a replayed sample at or below it is a duplicate.
    sample_seq: HashMap<(String, String), u64>,
    /// The time of the input being applied.
    now: Instant,
    out: Vec<Effect>,
    /// Start cells even when the emulated instances running at once on a
    /// host would ask for more CPUs or memory than it has (the scenario's
    /// `oversubscribe: true`); by default such a cell waits.
    pub oversubscribe: bool,
    /// Classes that name a PostgreSQL major version: their agents must run
    /// it (checked at registration).
    pub postgres_versions: BTreeMap<String, u32>,
    /// Datasets (`Share::key`) some cell of this run has in its cluster,
    /// built and published or restored: their held cells may start.
    datasets_ready: BTreeSet<String>,
}

impl Core {
    /// `expected`: agent id -> instance class, as the agent source launched them.
    pub fn new(
        timing: Timing,
        cells: Vec<PlannedCell>,
        expected: &[(String, String)],
        now: Instant,
    ) -> Core {
        Core {
            timing,
            agents: expected
                .iter()
                .map(|(id, class)| {
                    let agent = Agent {
                        class: class.clone(),
                        state: AgentState::Expected,
                        conn: 0,
                        connected: false,
                        last_seen: now,
                        cell: None,
                        why_lost: String::new(),
                        address: String::new(),
                        profile: String::new(),
                        postgres_major: String::new(),
                        dataset_store: String::new(),
                        kept: None,
                        host: Host::default(),
                    };
                    (id.clone(), agent)
                })
                .collect(),
            cells: cells
                .into_iter()
                .map(|planned| Cell {
                    estimate: planned.estimate().seconds,
                    started: None,
                    planned,
                    state: CellState::Pending,
                    roles: Vec::new(),
                    failure: None,
                    released: false,
                    agents: String::new(),
                })
                .collect(),
            started: now,
            cancelled: None,
            sample_seq: HashMap::new(),
            now,
            out: Vec::new(),
            oversubscribe: false,
            postgres_versions: BTreeMap::new(),
            datasets_ready: BTreeSet::new(),
        }
    }

    /// Picks up a run a controller was executing when it stopped: `stored`
    /// gives each cell's state and, for running cells, its agents (as
    /// `Entry::StartCell` wrote them), `seqs` the last sample number
    /// stored per (cell, agent). Running cells wait for their agents;
    /// one whose agents cannot be matched goes back to pending (returned,
    /// for the store).
    pub fn resume(
        &mut self,
        stored: &[(String, CellState, String)],
        seqs: HashMap<(String, String), u64>,
        now: Instant,
    ) -> Vec<String> {
        self.sample_seq = seqs;
        let mut requeued = Vec::new();
        for (cell_id, state, who) in stored {
            let Some(idx) = self.cell_index(cell_id) else {
                continue;
            };
            if *state != CellState::Running {
                self.cells[idx].state = *state;
                continue;
            }
            let planned = &self.cells[idx].planned;
            let runs: Vec<RoleRun> = parse_assignment(planned, who)
                .into_iter()
                .map(|(role, agent)| RoleRun {
                    role,
                    agent,
                    endpoint: None,
                    outcome: None,
                })
                .collect();
            if runs.len() != planned.roles.len()
                || runs.iter().any(|r| !self.agents.contains_key(&r.agent))
            {
                requeued.push(cell_id.clone());
                continue;
            }
            for r in &runs {
                if let Some(a) = self.agents.get_mut(&r.agent) {
                    a.cell = Some((idx, r.role.clone()));
                }
            }
            let cell = &mut self.cells[idx];
            cell.state = CellState::Running;
            cell.started = Some(now);
            cell.roles = runs;
            cell.agents = who.clone();
        }
        requeued
    }

    /// Advances the state by one input; returns what is to be done.
    pub fn apply(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        self.now = now;
        match input {
            Input::Registered { info, conn } => self.registered(info, conn, now),
            Input::Message {
                agent_id,
                conn,
                msg,
                received,
            } => self.message(agent_id, conn, msg, received, now),
            Input::Disconnected { agent_id, conn } => {
                if let Some(a) = self.agents.get_mut(&agent_id)
                    && a.conn == conn
                {
                    // Not lost yet: it may reconnect within its lease.
                    a.connected = false;
                }
            }
            Input::Gone { agent_id, why } => {
                // No wait for the lease: its source knows it will not return.
                if self
                    .agents
                    .get(&agent_id)
                    .is_some_and(|a| a.state != AgentState::Lost)
                {
                    self.lose(&agent_id, why);
                }
            }
            Input::Tick => self.check_time(now),
            Input::Cancel => {
                if self.cancelled.is_none() {
                    self.cancel_all(now);
                }
            }
            Input::CellNotStored { cell_id } => {
                if let Some(idx) = self.cell_index(&cell_id) {
                    let cell = &mut self.cells[idx];
                    cell.state = CellState::Running;
                    for r in &mut cell.roles {
                        r.outcome = None;
                    }
                }
            }
        }
        self.assign(now);
        std::mem::take(&mut self.out)
    }

    /// Whether every cell has ended.
    pub fn done(&self) -> bool {
        self.cells.iter().all(|c| c.state.is_terminal())
    }

    pub fn cells_done(&self) -> usize {
        self.cells.iter().filter(|c| c.state.is_terminal()).count()
    }

    pub fn cell_index(&self, cell_id: &str) -> Option<usize> {
        self.cells.iter().position(|c| c.planned.cell_id == cell_id)
    }

    /// Time left: `wall` (the plan's estimate of the run) scaled by the
    /// share of estimated cell-seconds not done yet (finished cells count
    /// whole, running ones by their time so far, up to their estimate).
    pub fn eta(&self, wall: Duration, now: Instant) -> Option<Duration> {
        let total: f64 = self.cells.iter().map(|c| c.estimate).sum();
        if total <= 0.0 {
            return None;
        }
        let done: f64 = self
            .cells
            .iter()
            .map(|c| match (c.state, c.started) {
                (s, _) if s.is_terminal() => c.estimate,
                (CellState::Running, Some(t)) => now
                    .saturating_duration_since(t)
                    .as_secs_f64()
                    .min(c.estimate),
                _ => 0.0,
            })
            .sum();
        Some(Duration::from_secs_f64(
            wall.as_secs_f64() * (1.0 - done / total).max(0.0),
        ))
    }

    fn observe(&mut self, o: Observed) {
        self.out.push(Effect::Observe(o));
    }

    fn send(&mut self, agent_id: &str, msg: CMsg) {
        if self.agents.get(agent_id).is_some_and(|a| a.connected) {
            self.out.push(Effect::Send {
                agent_id: agent_id.to_string(),
                msg,
            });
        }
    }

    fn registered(&mut self, info: Register, conn: u64, now: Instant) {
        let id = info.agent_id.clone();
        let class = info.instance_class.clone();
        let refusal = match self.agents.get(&id) {
            None => {
                let known: Vec<&str> = self.agents.keys().map(String::as_str).collect();
                Some(format!(
                    "unknown agent `{id}`: this run expects {}",
                    known.join(", ")
                ))
            }
            // Its cells were already failed; it must not run more.
            Some(a) if a.state == AgentState::Lost => {
                Some(format!("agent {id} was declared lost: {}", a.why_lost))
            }
            Some(a) if a.class != class => Some(format!(
                "agent {id} registered as class {class}, expected {}",
                a.class
            )),
            Some(_) => self.postgres_versions.get(&class).and_then(|want| {
                let runs = pgfleet_proto::installs::major(&info.postgres_version);
                (runs != want.to_string()).then(|| {
                    format!(
                        "agent {id} runs PostgreSQL {}, but class {class} asks for {want} \
                         (postgres.version): start it with --pg-version {want}",
                        info.postgres_version
                    )
                })
            }),
        };
        if let Some(reason) = refusal {
            self.observe(Observed::AgentRefused {
                agent_id: id,
                reason: reason.clone(),
            });
            self.out.push(Effect::Refuse { reason });
            return;
        }
        let Some(slot) = self.agents.get_mut(&id) else {
            return;
        };
        let first = slot.state == AgentState::Expected;
        slot.state = AgentState::Live;
        slot.connected = true;
        slot.conn = conn;
        slot.last_seen = now;
        slot.address = info.address.clone();
        slot.host = Host {
            name: info.hostname.clone(),
            cores: info.cores,
            memory_bytes: info.memory_bytes,
            instance_cpus: info.instance_cpus,
            instance_memory_bytes: info.instance_memory_bytes,
        };
        slot.dataset_store = info.dataset_store.clone();
        slot.postgres_major = pgfleet_proto::installs::major(&info.postgres_version).to_string();
        slot.profile = info
            .storage
            .as_ref()
            .map(|s| s.profile.clone())
            .unwrap_or_default();
        // An assignment the agent does not report (running, or finished
        // with its result not yet acknowledged) never reached it: it was
        // lost with the old connection. A single-role cell goes back to
        // pending and is assigned again; a role of a multi-role cell fails,
        // which stops the cell's other roles.
        match slot.cell.clone() {
            Some((idx, role))
                if !info
                    .running_cells
                    .contains(&self.cells[idx].planned.cell_id) =>
            {
                if self.cells[idx].planned.multi_role() {
                    self.role_outcome(
                        idx,
                        &role,
                        failed_outcome(format!(
                            "agent {id}: the assignment was lost with its connection"
                        )),
                    );
                } else {
                    if let Some(a) = self.agents.get_mut(&id) {
                        a.cell = None;
                    }
                    let cell = &mut self.cells[idx];
                    cell.state = CellState::Pending;
                    cell.roles.clear();
                    let cell_id = cell.planned.cell_id.clone();
                    self.out.push(Effect::Store(Entry::RequeueCell { cell_id }));
                    self.observe(Observed::CellRequeued { cell: idx });
                    self.observe(Observed::CellChanged {
                        cell: idx,
                        error: None,
                    });
                }
            }
            // Still running: peers' endpoints sent while it was away.
            Some((idx, role)) => self.relay_peers_to(idx, &role),
            None => {}
        }
        self.out.push(Effect::Store(Entry::RegisterAgent {
            agent_id: id.clone(),
            class: class.clone(),
            info: registration(&info),
        }));
        self.observe(Observed::AgentRegistered {
            agent_id: id,
            class,
            first,
            postgres_version: info.postgres_version,
        });
    }

    fn message(&mut self, agent_id: String, conn: u64, msg: Msg, received: Instant, now: Instant) {
        self.observe(Observed::MessageWaited(
            now.saturating_duration_since(received),
        ));
        let Some(a) = self.agents.get_mut(&agent_id) else {
            return;
        };
        if a.conn != conn || a.state == AgentState::Lost {
            return;
        }
        // The lease counts from when the message arrived (the session
        // stamps it), not from when the core got to it.
        a.last_seen = a.last_seen.max(received);
        match msg {
            Msg::Heartbeat(_) | Msg::Register(_) => {}
            Msg::Progress(p) => {
                if p.phase == pgfleet_proto::dataset::READY_PHASE
                    && let Some(share) = self
                        .cell_index(&p.cell_id)
                        .and_then(|i| self.cells[i].planned.share.as_ref())
                {
                    self.datasets_ready.insert(share.key.clone());
                }
                self.observe(Observed::Progress {
                    agent_id,
                    cell_id: p.cell_id,
                    phase: p.phase,
                    message: p.message,
                    done: p.done,
                    total: p.total,
                })
            }
            Msg::Sample(s) => {
                let fresh = s.seq == 0 || {
                    let last = self
                        .sample_seq
                        .entry((s.cell_id.clone(), agent_id.clone()))
                        .or_insert(0);
                    let fresh = s.seq > *last;
                    *last = (*last).max(s.seq);
                    fresh
                };
                if fresh {
                    let data = parse_json(&s.data_json);
                    if let Some(idx) = self.cell_index(&s.cell_id) {
                        self.observe(Observed::Sample {
                            agent_id: agent_id.clone(),
                            cell: idx,
                            kind: s.kind.clone(),
                            data: data.clone(),
                        });
                    }
                    self.out.push(Effect::Sample(NewSample {
                        cell_id: s.cell_id.clone(),
                        kind: s.kind,
                        data,
                        agent_id: agent_id.clone(),
                        seq: s.seq,
                    }));
                }
                // Acknowledged once stored (a duplicate: once what came
                // before it is), by the writer.
                if s.seq > 0 {
                    self.out.push(Effect::AckAfterCommit {
                        agent_id,
                        msg: CMsg::SampleAck(SampleAck {
                            cell_id: s.cell_id,
                            seq: s.seq,
                        }),
                    });
                }
            }
            Msg::Result(r) => self.result(&agent_id, r),
            Msg::RoleReady(rr) => self.role_ready(&agent_id, rr),
        }
    }

    fn result(&mut self, agent_id: &str, r: CellResult) {
        let idx = self.cell_index(&r.cell_id);
        let mine = idx.filter(|&idx| {
            self.cells[idx].state == CellState::Running
                && self.cells[idx]
                    .roles
                    .iter()
                    .any(|x| x.agent == agent_id && x.role == r.role && x.outcome.is_none())
        });
        let ack = Effect::AckAfterCommit {
            agent_id: agent_id.to_string(),
            msg: CMsg::ResultAck(ResultAck {
                cell_id: r.cell_id.clone(),
            }),
        };
        let Some(idx) = mine else {
            // A duplicate of one already kept: acknowledged again.
            self.out.push(ack);
            return;
        };
        let state = match CellStatus::try_from(r.status) {
            Ok(CellStatus::Succeeded) => CellState::Succeeded,
            Ok(CellStatus::Cancelled) => CellState::Cancelled,
            _ => CellState::Failed,
        };
        let outcome = Outcome {
            state,
            error: r.error.clone(),
            points: r
                .points
                .iter()
                .map(|p| (parse_json(&p.params_json), parse_json(&p.metrics_json)))
                .collect(),
            environment: (!r.environment_json.is_empty()).then(|| parse_json(&r.environment_json)),
        };
        self.role_outcome(idx, &r.role, outcome);
        // The acknowledgement waits for the cell's end to be stored when
        // this result ended it (not stored: not acknowledged, replayed).
        let finish = self.out.iter_mut().rev().find_map(|e| match e {
            Effect::FinishCell { end, then, .. } if end.cell_id == r.cell_id => Some(then),
            _ => None,
        });
        match finish {
            Some(then) => then.push(ack),
            None => self.out.push(ack),
        }
    }

    /// Records a role's outcome, frees its agent, stops or releases the
    /// other roles as needed, and ends the cell once every role has one.
    fn role_outcome(&mut self, idx: usize, role: &str, outcome: Outcome) {
        let cell = &mut self.cells[idx];
        let Some(pos) = cell.roles.iter().position(|x| x.role == role) else {
            return;
        };
        if cell.roles[pos].outcome.is_some() {
            return;
        }
        let (ok, is_lead) = (outcome.state == CellState::Succeeded, pos == 0);
        if !ok
            && cell.failure.is_none()
            && !(cell.released && outcome.state == CellState::Cancelled)
        {
            let who = if role.is_empty() {
                String::new()
            } else {
                format!("role {role} ({}): ", cell.roles[pos].agent)
            };
            cell.failure = Some(format!("{who}{}", outcome.error));
        }
        cell.roles[pos].outcome = Some(outcome);
        let agent = cell.roles[pos].agent.clone();
        let kept = cell
            .planned
            .share
            .as_ref()
            .filter(|_| ok && cell.planned.reuse_cluster && !cell.planned.multi_role())
            .map(|s| s.key.clone());
        if let Some(a) = self.agents.get_mut(&agent)
            && a.cell.as_ref().is_some_and(|(i, _)| *i == idx)
        {
            a.cell = None;
            a.kept = kept;
        }
        let release = ok && is_lead;
        let stop = self.cells[idx].failure.is_some();
        if release {
            self.cells[idx].released = true;
        }
        if release || stop {
            let reason = match &self.cells[idx].failure {
                Some(f) if !release => format!("another role of the cell failed: {f}"),
                _ => "the cell's measurement is done".to_string(),
            };
            self.stop_roles(idx, &reason, release && !stop);
        }
        if self.cells[idx].roles.iter().all(|x| x.outcome.is_some()) {
            self.finish_roles(idx);
        }
    }

    /// Every role has an outcome: the cell is stored once.
    fn finish_roles(&mut self, idx: usize) {
        let cancelled = self.cancelled.is_some();
        let cell = &self.cells[idx];
        let outcomes: Vec<(&String, &Outcome)> = cell
            .roles
            .iter()
            .filter_map(|x| x.outcome.as_ref().map(|o| (&x.role, o)))
            .collect();
        // A multi-role cell's dataset, where reports and sources look for
        // it: the provenance of the role that holds it, naming that role
        // and its agent.
        let dataset = cell
            .roles
            .iter()
            .filter(|x| x.role == cell.planned.params.dataset_role())
            .find_map(|x| {
                let mut d = x.outcome.as_ref()?.environment.as_ref()?["dataset"].clone();
                let o = d.as_object_mut()?;
                o.insert("role".into(), x.role.clone().into());
                o.insert("agent".into(), x.agent.clone().into());
                Some(d)
            });
        let all_ok = outcomes.iter().enumerate().all(|(i, (_, o))| {
            o.state == CellState::Succeeded
                || (i > 0 && cell.released && o.state == CellState::Cancelled)
        });
        let state = if all_ok && cell.failure.is_none() {
            CellState::Succeeded
        } else if cancelled && outcomes.iter().all(|(_, o)| o.state != CellState::Failed) {
            CellState::Cancelled
        } else if outcomes.len() == 1 {
            outcomes[0].1.state
        } else {
            CellState::Failed
        };
        let points: Vec<(Json, Json)> = outcomes
            .iter()
            .flat_map(|(_, o)| o.points.iter().cloned())
            .collect();
        let environment = if outcomes.len() == 1 {
            outcomes[0].1.environment.clone()
        } else {
            Some(Json::Object(
                outcomes
                    .iter()
                    .filter_map(|(r, o)| Some(((*r).clone(), o.environment.clone()?)))
                    .chain(dataset.map(|d| ("dataset".to_string(), d)))
                    .collect(),
            ))
        };
        let error = match state {
            CellState::Succeeded => None,
            _ => cell.failure.clone().or_else(|| {
                outcomes
                    .iter()
                    .map(|(_, o)| o.error.clone())
                    .find(|e| !e.is_empty())
            }),
        };
        self.end_cell(idx, state, error, environment, points, true);
    }

    /// Ends a cell: its stored end, then (once stored) what observers see.
    fn end_cell(
        &mut self,
        idx: usize,
        state: CellState,
        error: Option<String>,
        environment: Option<Json>,
        points: Vec<(Json, Json)>,
        replayable: bool,
    ) {
        let seconds = self.cells[idx]
            .started
            .map(|t| self.now.saturating_duration_since(t).as_secs_f64());
        let cell = &mut self.cells[idx];
        cell.state = state;
        let text = error.clone().unwrap_or_default();
        let then = vec![
            Effect::Observe(Observed::CellEnded {
                cell: idx,
                state,
                error: text.clone(),
                seconds,
            }),
            Effect::Observe(Observed::CellChanged {
                cell: idx,
                error: Some(text),
            }),
        ];
        self.out.push(Effect::FinishCell {
            end: CellEnd {
                cell_id: cell.planned.cell_id.clone(),
                state,
                error,
                environment,
                points,
            },
            replayable,
            then,
        });
    }

    fn finish_without_result(&mut self, idx: usize, state: CellState, error: &str) {
        self.end_cell(idx, state, Some(error.to_string()), None, Vec::new(), false);
    }

    /// Asks the roles without an outcome to stop (or, released, to end).
    fn stop_roles(&mut self, idx: usize, reason: &str, release: bool) {
        let cell_id = self.cells[idx].planned.cell_id.clone();
        let open: Vec<String> = self.cells[idx]
            .roles
            .iter()
            .filter(|x| x.outcome.is_none())
            .map(|x| x.agent.clone())
            .collect();
        for agent in open {
            self.send(
                &agent,
                CMsg::Cancel(Cancel {
                    cell_id: cell_id.clone(),
                    reason: reason.to_string(),
                    release,
                }),
            );
        }
    }

    /// A role's cluster is up: tell the cell's other roles where it is.
    fn role_ready(&mut self, agent_id: &str, rr: RoleReady) {
        let Some(idx) = self.cell_index(&rr.cell_id) else {
            return;
        };
        let Some(me) = self.cells[idx]
            .roles
            .iter_mut()
            .find(|x| x.role == rr.role && x.agent == agent_id)
        else {
            return;
        };
        me.endpoint = rr.endpoint;
        let others: Vec<String> = self.cells[idx]
            .roles
            .iter()
            .filter(|x| x.role != rr.role && x.outcome.is_none())
            .map(|x| x.role.clone())
            .collect();
        for role in others {
            self.relay_peers_to(idx, &role);
        }
    }

    /// Sends `role`'s agent every endpoint its peers reported.
    fn relay_peers_to(&mut self, idx: usize, role: &str) {
        let cell = &self.cells[idx];
        let Some(to) = cell
            .roles
            .iter()
            .find(|x| x.role == role)
            .map(|x| x.agent.clone())
        else {
            return;
        };
        let msgs: Vec<CMsg> = cell
            .roles
            .iter()
            .filter(|x| x.role != role)
            .filter_map(|peer| {
                Some(CMsg::PeerReady(PeerReady {
                    cell_id: cell.planned.cell_id.clone(),
                    role: peer.role.clone(),
                    endpoint: Some(peer.endpoint.clone()?),
                }))
            })
            .collect();
        for m in msgs {
            self.send(&to, m);
        }
    }

    /// Places pending cells on idle live agents: every role of a cell on
    /// its own agent of the role's class, all at once or not at all. Fails
    /// cells whose classes cannot have enough agents any more.
    fn assign(&mut self, now: Instant) {
        if self.cancelled.is_some() {
            return;
        }
        // First the cells an idle agent keeps a cluster for
        // (`reuse_cluster`), then every cell in plan order.
        for reusing in [true, false] {
            self.assign_pass(reusing, now);
        }
    }

    fn assign_pass(&mut self, reusing: bool, now: Instant) {
        for idx in 0..self.cells.len() {
            if self.cells[idx].state != CellState::Pending || self.waits_for_dataset(idx) {
                continue;
            }
            let roles = self.cells[idx].planned.roles.clone();
            // A cell of a dataset an agent keeps a cluster of goes to it;
            // others rather go to agents keeping none.
            let wants = self.cells[idx]
                .planned
                .share
                .as_ref()
                .filter(|_| self.cells[idx].planned.reuse_cluster)
                .map(|s| s.key.as_str());
            let rank = |a: &Agent| match (&a.kept, wants) {
                (Some(k), Some(w)) if k == w => 0,
                (None, _) => 1,
                _ => 2,
            };
            if reusing
                && !self.agents.values().any(|a| {
                    rank(a) == 0 && a.state == AgentState::Live && a.connected && a.cell.is_none()
                })
            {
                continue;
            }
            let mut picked: Vec<String> = Vec::new();
            for (_, class) in &roles {
                let idle = self
                    .agents
                    .iter()
                    .filter(|(id, a)| {
                        a.class == *class
                            && a.state == AgentState::Live
                            && a.connected
                            && a.cell.is_none()
                            && !picked.contains(id)
                            && (self.oversubscribe || self.fits_host(id, &picked))
                    })
                    .min_by_key(|(_, a)| rank(a))
                    .map(|(id, _)| id.clone());
                match idle {
                    Some(id) => picked.push(id),
                    None => break,
                }
            }
            if picked.len() == roles.len() {
                self.start_cell(idx, picked, now);
                continue;
            }
            // Enough agents may still come (registering, busy): wait. If
            // not, the cell can never run.
            let mut need: BTreeMap<&str, usize> = BTreeMap::new();
            for (_, class) in &roles {
                *need.entry(class.as_str()).or_default() += 1;
            }
            let short = need.into_iter().find(|(class, n)| {
                self.agents
                    .values()
                    .filter(|a| a.class == *class && a.state != AgentState::Lost)
                    .count()
                    < *n
            });
            if let Some((class, n)) = short {
                let why: Vec<String> = self
                    .agents
                    .iter()
                    .filter(|(_, a)| a.class == class && a.state == AgentState::Lost)
                    .map(|(id, a)| format!("{id}: {}", a.why_lost))
                    .collect();
                let msg = match (why.is_empty(), n) {
                    (true, 1) => format!("no agent of instance class `{class}` in the fleet"),
                    (true, _) => format!(
                        "the cell needs {n} agents of instance class `{class}` at once and the fleet has fewer"
                    ),
                    (false, _) => format!(
                        "no live agent of instance class `{class}` ({})",
                        why.join("; ")
                    ),
                };
                self.finish_without_result(idx, CellState::Failed, &msg);
            }
        }
    }

    /// Whether cell `idx` is held until its dataset is ready: another cell
    /// builds it (the plan's builder, on the class that loads it fastest),
    /// has not ended nor reported it ready, and both cells' agents share one
    /// dataset store, so this cell will restore what the builder publishes
    /// instead of loading it again, slower, at the same time. Agents not
    /// registered yet are taken to share (a builder that never gets an
    /// agent fails, which releases the cell).
    fn waits_for_dataset(&self, idx: usize) -> bool {
        let Some(share) = self.cells[idx].planned.share.as_ref() else {
            return false;
        };
        if share.builds || self.datasets_ready.contains(&share.key) {
            return false;
        }
        let builder = self.cells.iter().find(|c| {
            c.planned
                .share
                .as_ref()
                .is_some_and(|s| s.builds && s.key == share.key)
        });
        let Some(builder) = builder.filter(|b| !b.state.is_terminal()) else {
            return false;
        };
        let classes = [
            builder.planned.dataset_class(),
            self.cells[idx].planned.dataset_class(),
        ];
        let mut stores = self
            .agents
            .values()
            .filter(|a| classes.contains(&a.class.as_str()) && a.state != AgentState::Lost)
            .filter(|a| a.state != AgentState::Expected)
            .map(|a| a.dataset_store.as_str());
        match stores.next() {
            None => true,
            Some(first) => !first.is_empty() && stores.all(|s| s == first),
        }
    }

    /// Whether agent `id` may start a cell now without the emulated
    /// instances running on its host (and those `picked` for the same
    /// cell) asking for more CPUs or memory than the host has. A host with
    /// no cell running always takes one: a cell larger than its host still
    /// runs (the report warns), alone.
    fn fits_host(&self, id: &str, picked: &[String]) -> bool {
        let Some(me) = self.agents.get(id).map(|a| &a.host) else {
            return true;
        };
        if me.instance_cpus == 0 && me.instance_memory_bytes == 0 {
            return true;
        }
        let on_host = |a: &Agent| a.host.name == me.name;
        if !self.agents.values().any(|a| on_host(a) && a.cell.is_some()) {
            return true;
        }
        let busy: Vec<&Host> = self
            .agents
            .iter()
            .filter(|(other, a)| on_host(a) && (a.cell.is_some() || picked.contains(other)))
            .map(|(_, a)| &a.host)
            .collect();
        // An idle agent keeping a cluster for its next cell
        // (`reuse_cluster`) holds its instance's memory, not its CPUs.
        let keeping: u64 = self
            .agents
            .iter()
            .filter(|(other, a)| {
                on_host(a)
                    && a.cell.is_none()
                    && a.kept.is_some()
                    && *other != id
                    && !picked.contains(other)
            })
            .map(|(_, a)| a.host.instance_memory_bytes)
            .sum();
        let cpus: u64 =
            busy.iter().map(|h| h.instance_cpus as u64).sum::<u64>() + me.instance_cpus as u64;
        let memory: u64 = busy.iter().map(|h| h.instance_memory_bytes).sum::<u64>()
            + keeping
            + me.instance_memory_bytes;
        (me.cores == 0 || cpus <= me.cores as u64)
            && (me.memory_bytes == 0 || memory <= me.memory_bytes)
    }

    fn start_cell(&mut self, idx: usize, agents: Vec<String>, now: Instant) {
        let c = self.cells[idx].planned.clone();
        let runs: Vec<RoleRun> = c
            .roles
            .iter()
            .zip(&agents)
            .map(|((role, _), agent)| RoleRun {
                role: role.clone(),
                agent: agent.clone(),
                endpoint: None,
                outcome: None,
            })
            .collect();
        let mut assigns = Vec::new();
        for run in &runs {
            let peers = runs
                .iter()
                .filter(|p| p.role != run.role)
                .map(|p| Peer {
                    role: p.role.clone(),
                    agent_id: p.agent.clone(),
                    address: self
                        .agents
                        .get(&p.agent)
                        .map(|a| a.address.clone())
                        .unwrap_or_default(),
                })
                .collect();
            let mut settings = c.settings.clone();
            for (k, v) in c.params.settings(&run.role) {
                settings.insert(k.to_string(), v);
            }
            assigns.push((
                run.agent.clone(),
                Assign {
                    traceparent: String::new(),
                    cell_id: c.cell_id.clone(),
                    run_id: String::new(),
                    workload: c.workload().to_string(),
                    params_json: c.params.to_json(),
                    settings: settings.into_iter().collect(),
                    role: run.role.clone(),
                    peers,
                    dataset: c.dataset.as_str().to_string(),
                    reuse_cluster: c.reuse_cluster,
                },
            ));
            if let Some(a) = self.agents.get_mut(&run.agent) {
                a.cell = Some((idx, run.role.clone()));
            }
            // A new assignment numbers its samples from 1.
            self.sample_seq
                .remove(&(c.cell_id.clone(), run.agent.clone()));
        }
        let who = if c.multi_role() {
            runs.iter()
                .map(|r| format!("{}:{}", r.role, r.agent))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            agents.join(", ")
        };
        let cell = &mut self.cells[idx];
        cell.state = CellState::Running;
        cell.started = Some(now);
        cell.roles = runs;
        cell.agents = who.clone();
        self.out.push(Effect::Start { cell: idx, assigns });
        self.out.push(Effect::Store(Entry::StartCell {
            cell_id: c.cell_id,
            agents: who,
        }));
        self.observe(Observed::CellChanged {
            cell: idx,
            error: None,
        });
    }

    /// Leases, registration deadlines and the cancel grace.
    fn check_time(&mut self, now: Instant) {
        let mut lost = Vec::new();
        for (id, a) in &self.agents {
            match a.state {
                AgentState::Live
                    if now.saturating_duration_since(a.last_seen) > self.timing.lease =>
                {
                    lost.push((
                        id.clone(),
                        format!("no message for {:?} (lease expired)", self.timing.lease),
                    ))
                }
                AgentState::Expected
                    if now.saturating_duration_since(self.started)
                        > self.timing.registration_timeout =>
                {
                    lost.push((
                        id.clone(),
                        format!(
                            "did not register within {:?}",
                            self.timing.registration_timeout
                        ),
                    ))
                }
                _ => {}
            }
        }
        for (id, why) in lost {
            self.lose(&id, why);
        }
        if let Some(at) = self.cancelled
            && now.saturating_duration_since(at) > self.timing.cancel_grace
        {
            for idx in 0..self.cells.len() {
                if !self.cells[idx].state.is_terminal() {
                    self.finish_without_result(
                        idx,
                        CellState::Cancelled,
                        "cancelled; the agent did not confirm in time",
                    );
                }
            }
        }
    }

    fn lose(&mut self, id: &str, why: String) {
        let Some(a) = self.agents.get_mut(id) else {
            return;
        };
        a.state = AgentState::Lost;
        a.connected = false;
        a.why_lost = why.clone();
        let cell = a.cell.take();
        self.out.push(Effect::Store(Entry::AgentLost {
            agent_id: id.to_string(),
        }));
        self.observe(Observed::AgentLost {
            agent_id: id.to_string(),
            why: why.clone(),
        });
        if let Some((idx, role)) = cell
            && !self.cells[idx].state.is_terminal()
        {
            self.role_outcome(
                idx,
                &role,
                failed_outcome(format!("agent {id} lost: {why}")),
            );
        }
    }

    fn cancel_all(&mut self, now: Instant) {
        self.cancelled = Some(now);
        self.observe(Observed::Cancelling);
        for idx in 0..self.cells.len() {
            match self.cells[idx].state {
                CellState::Pending => self.finish_without_result(
                    idx,
                    CellState::Cancelled,
                    "run cancelled before the cell started",
                ),
                CellState::Running => self.stop_roles(idx, "run cancelled", false),
                _ => {}
            }
        }
    }
}

/// The agents of a stored running cell: `role:agent, role:agent` for
/// multi-role cells (as `Entry::StartCell` writes them), else the agent.
fn parse_assignment(planned: &PlannedCell, who: &str) -> Vec<(String, String)> {
    if planned.multi_role() {
        who.split(", ")
            .filter_map(|x| x.split_once(':'))
            .map(|(role, agent)| (role.to_string(), agent.to_string()))
            .collect()
    } else {
        let role = planned
            .roles
            .first()
            .map(|r| r.0.clone())
            .unwrap_or_default();
        vec![(role, who.to_string())]
    }
}

/// What the store keeps of a registration.
fn registration(info: &Register) -> pgfleet_records::Registration {
    pgfleet_records::Registration {
        agent_id: info.agent_id.clone(),
        instance_class: info.instance_class.clone(),
        storage: info
            .storage
            .as_ref()
            .map(|s| pgfleet_records::RegisteredStorage {
                profile: s.profile.clone(),
                emulated: s.emulated,
                data_root: s.data_root.clone(),
                caps: pgfleet_proto::environment::Caps {
                    read_iops: s.read_iops,
                    write_iops: s.write_iops,
                    read_mbps: s.read_mbps,
                    write_mbps: s.write_mbps,
                    combined: s.combined,
                    latency: pgfleet_proto::environment::Latency {
                        read_us: s.read_latency_us,
                        write_us: s.write_latency_us,
                        flush_us: s.flush_latency_us,
                    },
                },
            }),
        cores: u64::from(info.cores),
        memory_bytes: info.memory_bytes,
        postgres_version: info.postgres_version.clone(),
        postgres_bin_dir: info.postgres_bin_dir.clone(),
        hostname: info.hostname.clone(),
        agent_version: info.agent_version.clone(),
    }
}

fn failed_outcome(error: String) -> Outcome {
    Outcome {
        state: CellState::Failed,
        error,
        points: Vec::new(),
        environment: None,
    }
}

/// JSON from an agent. Kept as text under `unparsed` when it is not JSON,
/// so nothing the agent sent is lost.
fn parse_json(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or_else(|_| json!({ "unparsed": text }))
}

/// A refusal's message to the registering connection.
pub fn refusal(reason: String) -> CMsg {
    CMsg::Shutdown(Shutdown {
        reason,
        refused: true,
    })
}

#[cfg(test)]
mod tests {
    //! Every transition of the core, without gRPC, store or clock: time is
    //! an `Instant` the test moves.
    use super::*;
    use pgfleet_proto::v1::{Endpoint, Heartbeat};

    const LEASE: Duration = Duration::from_secs(10);

    fn timing() -> Timing {
        Timing {
            lease: LEASE,
            registration_timeout: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(30),
        }
    }

    /// `replicas` toast-slice cells on class `a` (one role each).
    fn single(replicas: u32) -> Vec<PlannedCell> {
        plan(&format!(
            "name: t\nfleet:\n  - name: a\n    count: 1\nworkloads:\n  - kind: toast-slice\n    datasets: [abcd]\n    storage_modes: [external]\n    value_bytes: 1048576\n    offsets: [1]\n    duration_s: 1\n    repeats: 1\n    replicas: {replicas}\n"
        ))
    }

    /// One logical-drain cell: roles subscriber (lead) and publisher, both on `a`.
    fn gang() -> Vec<PlannedCell> {
        plan(
            "name: t\nfleet:\n  - name: a\n    count: 2\nworkloads:\n  - kind: logical-drain\n    scale: 1\n    backlog_bytes: 1MiB\n",
        )
    }

    fn plan(yaml: &str) -> Vec<PlannedCell> {
        let s = pgfleet_scenario::parse(std::path::Path::new("t.yaml"), yaml).unwrap();
        pgfleet_scenario::plan::plan(&s)
    }

    fn core(cells: Vec<PlannedCell>, agents: &[&str], t0: Instant) -> Core {
        let expected: Vec<(String, String)> = agents
            .iter()
            .map(|a| (a.to_string(), "a".to_string()))
            .collect();
        Core::new(timing(), cells, &expected, t0)
    }

    fn register(c: &mut Core, id: &str, conn: u64, running: &[&str], now: Instant) -> Vec<Effect> {
        let info = Register {
            agent_id: id.into(),
            instance_class: "a".into(),
            running_cells: running.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        c.apply(Input::Registered { info, conn }, now)
    }

    #[test]
    fn emulated_instances_never_crowd_their_host_unless_the_scenario_allows() {
        let t0 = Instant::now();
        for oversubscribe in [false, true] {
            let mut c = core(single(2), &["a-0", "a-1"], t0);
            c.oversubscribe = oversubscribe;
            let mut started = Vec::new();
            for id in ["a-0", "a-1"] {
                let info = Register {
                    agent_id: id.into(),
                    instance_class: "a".into(),
                    hostname: "h".into(),
                    cores: 2,
                    memory_bytes: 8 << 30,
                    instance_cpus: 2,
                    instance_memory_bytes: 1 << 30,
                    ..Default::default()
                };
                started.extend(starts(&c.apply(Input::Registered { info, conn: 1 }, t0)));
            }
            if oversubscribe {
                // Two 2-CPU instances on a 2-core host, as asked.
                assert_eq!(started.len(), 2, "{started:?}");
                continue;
            }
            // One 2-CPU instance fills the 2-core host: the second cell
            // waits for the first to end, then runs.
            assert_eq!(started.len(), 1, "{started:?}");
            let (idx, agents) = started[0].clone();
            let cell = id(&c, idx);
            let e = message(
                &mut c,
                &agents[0],
                1,
                result(&cell, "", CellStatus::Succeeded, ""),
                t0,
            );
            assert_eq!(starts(&e).len(), 1, "the freed host takes the next cell");
        }
    }

    /// A cluster kept for a `reuse_cluster` cell holds its instance's
    /// memory while its agent is idle: a cell that would not fit beside it
    /// and a running one waits (a host with no cell running still takes
    /// one).
    #[test]
    fn a_kept_cluster_counts_against_its_hosts_memory() {
        let t0 = Instant::now();
        let ids = ["a-0", "a-1", "a-2"];
        let mut c = core(single(3), &ids, t0);
        for id in ids {
            let info = Register {
                agent_id: id.into(),
                instance_class: "a".into(),
                hostname: "h".into(),
                cores: 4,
                memory_bytes: 8 << 30,
                instance_cpus: 1,
                instance_memory_bytes: 3 << 30,
                ..Default::default()
            };
            c.apply(Input::Registered { info, conn: 1 }, t0);
        }
        // Two 3 GiB instances run; a third would make 9 GiB of 8.
        let running: Vec<&String> = c
            .agents
            .iter()
            .filter(|(_, a)| a.cell.is_some())
            .map(|(id, _)| id)
            .collect();
        assert_eq!(running.len(), 2, "{running:?}");
        let idle = ids
            .iter()
            .find(|id| c.agents[**id].cell.is_none())
            .unwrap()
            .to_string();
        let busy = running[0].clone();
        assert!(!c.fits_host(&idle, &[]));
        // One ends; the other keeps running: the idle agent fits beside it,
        // unless the ended one keeps its cluster.
        c.agents.get_mut(&busy).unwrap().cell = None;
        assert!(c.fits_host(&idle, &[]));
        c.agents.get_mut(&busy).unwrap().kept = Some("pgbench".into());
        assert!(!c.fits_host(&idle, &[]));
        // The keeping agent itself takes the next cell of its dataset.
        assert!(c.fits_host(&busy, &[]));
    }

    /// A pgbench cell on gp3 (listed first) and one on nvme, of one dataset:
    /// nvme loads it faster, so it builds; gp3's cell waits for it when
    /// their agents share a dataset store, and not otherwise.
    #[test]
    fn a_shared_dataset_is_built_on_its_fastest_class_while_the_others_wait() {
        let cells = plan(
            "name: t\nfleet:\n  - {name: gp3, storage: {profile: gp3}}\n  - {name: nvme}\nworkloads:\n  - {kind: pgbench, scale: 1, duration_s: 1}\n",
        );
        let t0 = Instant::now();
        let new = |stores: [&str; 2]| {
            let expected = [
                ("g".to_string(), "gp3".to_string()),
                ("n".into(), "nvme".into()),
            ];
            let mut c = Core::new(timing(), cells.clone(), &expected, t0);
            let mut started = Vec::new();
            for ((agent, class), store) in expected.iter().zip(stores) {
                let info = Register {
                    agent_id: agent.clone(),
                    instance_class: class.clone(),
                    dataset_store: store.into(),
                    ..Default::default()
                };
                for (idx, agents) in starts(&c.apply(Input::Registered { info, conn: 1 }, t0)) {
                    started.push((id(&c, idx), agents[0].clone()));
                }
            }
            (c, started)
        };
        let ready = |cell: &str| {
            Msg::Progress(pgfleet_proto::v1::CellProgress {
                cell_id: cell.into(),
                phase: pgfleet_proto::dataset::READY_PHASE.into(),
                ..Default::default()
            })
        };
        let (gp3, nvme) = ("w0-gp3-tpcb-like", "w0-nvme-tpcb-like");

        // One store: gp3's agent, registered first, gets nothing until
        // nvme's cell says the dataset is in its cluster.
        let (mut c, started) = new(["h:/d", "h:/d"]);
        assert_eq!(started, [(nvme.to_string(), "n".to_string())]);
        let e = message(&mut c, "n", 1, Msg::Heartbeat(Heartbeat { seq: 1 }), t0);
        assert!(starts(&e).is_empty());
        let e = message(&mut c, "n", 1, ready(nvme), t0);
        assert_eq!(
            starts(&e),
            vec![(c.cell_index(gp3).unwrap(), vec!["g".to_string()])]
        );

        // A builder that fails before that releases them too.
        let (mut c, _) = new(["h:/d", "h:/d"]);
        let e = message(
            &mut c,
            "n",
            1,
            result(nvme, "", CellStatus::Failed, "boom"),
            t0,
        );
        assert_eq!(
            starts(&e),
            vec![(c.cell_index(gp3).unwrap(), vec!["g".to_string()])]
        );

        // Stores of their own (pods without a remote store, an agent that
        // does not say): each builds its own, nothing waits.
        for stores in [["h1:/d", "h2:/d"], ["", ""]] {
            let (_, started) = new(stores);
            assert_eq!(started.len(), 2, "{stores:?}: {started:?}");
        }
    }

    /// `reuse_cluster`: the agent that keeps a dataset's cluster takes
    /// that dataset's next cell before a cell earlier in the plan that
    /// would make it tear the cluster down.
    #[test]
    fn an_agent_keeping_a_cluster_takes_the_next_cell_of_its_dataset() {
        let cells = plan(
            "name: t\nfleet:\n  - {name: a}\nworkloads:\n  - {kind: pgbench, scale: 1, duration_s: 1, reuse_cluster: true}\n  - {kind: pgbench, scale: 2, duration_s: 1, reuse_cluster: true}\n  - {kind: pgbench, scale: 1, script: select-only, duration_s: 1, reuse_cluster: true}\n",
        );
        let t0 = Instant::now();
        let mut c = Core::new(timing(), cells, &[("a-0".to_string(), "a".to_string())], t0);
        let mut order = Vec::new();
        let mut e = register(&mut c, "a-0", 1, &[], t0);
        while let Some((idx, _)) = starts(&e).first().cloned() {
            let cell = id(&c, idx);
            order.push(cell.clone());
            e = message(
                &mut c,
                "a-0",
                1,
                result(&cell, "", CellStatus::Succeeded, ""),
                t0,
            );
        }
        assert_eq!(
            order,
            ["w0-a-tpcb-like", "w2-a-select-only", "w1-a-tpcb-like"]
        );
    }

    fn message(c: &mut Core, id: &str, conn: u64, msg: Msg, now: Instant) -> Vec<Effect> {
        c.apply(
            Input::Message {
                agent_id: id.into(),
                conn,
                msg,
                received: now,
            },
            now,
        )
    }

    fn result(cell: &str, role: &str, status: CellStatus, error: &str) -> Msg {
        Msg::Result(CellResult {
            cell_id: cell.into(),
            status: status as i32,
            error: error.into(),
            role: role.into(),
            points: vec![],
            environment_json: "{}".into(),
        })
    }

    /// The cells started, with the agent of each role.
    fn starts(e: &[Effect]) -> Vec<(usize, Vec<String>)> {
        e.iter()
            .filter_map(|e| match e {
                Effect::Start { cell, assigns } => {
                    Some((*cell, assigns.iter().map(|(a, _)| a.clone()).collect()))
                }
                _ => None,
            })
            .collect()
    }

    fn sends(e: &[Effect]) -> Vec<(String, &CMsg)> {
        e.iter()
            .filter_map(|e| match e {
                Effect::Send { agent_id, msg } => Some((agent_id.clone(), msg)),
                _ => None,
            })
            .collect()
    }

    /// Cells stored as ended: id, state, error.
    fn finishes(e: &[Effect]) -> Vec<(String, CellState, String)> {
        e.iter()
            .filter_map(|e| match e {
                Effect::FinishCell { end, .. } => Some((
                    end.cell_id.clone(),
                    end.state,
                    end.error.clone().unwrap_or_default(),
                )),
                _ => None,
            })
            .collect()
    }

    fn then_of(e: &[Effect]) -> &[Effect] {
        e.iter()
            .find_map(|e| match e {
                Effect::FinishCell { then, .. } => Some(then.as_slice()),
                _ => None,
            })
            .expect("a FinishCell")
    }

    fn id(c: &Core, idx: usize) -> String {
        c.cells[idx].planned.cell_id.clone()
    }

    #[test]
    fn a_registered_agent_gets_a_pending_cell_and_its_result_ends_it_stored_then_acknowledged() {
        let t0 = Instant::now();
        let mut c = core(single(2), &["a-1"], t0);
        // Nothing to do before the agent registers.
        assert!(starts(&c.apply(Input::Tick, t0)).is_empty());
        let e = register(&mut c, "a-1", 1, &[], t0);
        assert_eq!(starts(&e), vec![(0, vec!["a-1".to_string()])]);
        assert!(
            e.iter()
                .any(|e| matches!(e, Effect::Store(Entry::StartCell { .. })))
        );
        assert!(
            e.iter()
                .any(|e| matches!(e, Effect::Store(Entry::RegisterAgent { .. })))
        );
        assert_eq!(c.cells[0].state, CellState::Running);
        assert_eq!(
            c.cells[1].state,
            CellState::Pending,
            "one cell per agent at a time"
        );
        let cell0 = id(&c, 0);
        let e = message(
            &mut c,
            "a-1",
            1,
            result(&cell0, "", CellStatus::Succeeded, ""),
            t0,
        );
        assert_eq!(
            finishes(&e),
            vec![(id(&c, 0), CellState::Succeeded, String::new())]
        );
        // The acknowledgement happens only once the end is stored.
        let then = then_of(&e);
        assert!(then.iter().any(|e| matches!(
            e,
            Effect::AckAfterCommit {
                msg: CMsg::ResultAck(_),
                ..
            }
        )));
        assert!(!e.iter().any(|e| matches!(e, Effect::AckAfterCommit { .. })));
        // The freed agent takes the next cell at once.
        assert_eq!(starts(&e), vec![(1, vec!["a-1".to_string()])]);
        let cell1 = id(&c, 1);
        let e = message(
            &mut c,
            "a-1",
            1,
            result(&cell1, "", CellStatus::Failed, "boom"),
            t0,
        );
        assert_eq!(
            finishes(&e),
            vec![(id(&c, 1), CellState::Failed, "boom".to_string())]
        );
        assert!(c.done());
    }

    /// A class naming a PostgreSQL version takes only agents running that
    /// major; one running another is refused, saying what to start.
    #[test]
    fn an_agent_on_another_postgres_major_than_its_class_names_is_refused() {
        assert_eq!(pgfleet_proto::installs::major("18.6 (Debian 18.6-3)"), "18");
        assert_eq!(
            pgfleet_proto::installs::major("19rc1 (Debian 19~rc1-1)"),
            "19"
        );
        assert_eq!(pgfleet_proto::installs::major(""), "");
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        c.postgres_versions = [("a".to_string(), 18)].into();
        let on = |version: &str| Register {
            agent_id: "a-1".into(),
            instance_class: "a".into(),
            postgres_version: version.into(),
            ..Default::default()
        };
        let e = c.apply(
            Input::Registered {
                info: on("15.18 (Debian 15.18-0+deb12u1)"),
                conn: 1,
            },
            t0,
        );
        assert!(
            e.iter().any(|e| matches!(e, Effect::Refuse { reason } if reason.contains("runs PostgreSQL 15.18") && reason.contains("--pg-version 18"))),
            "{e:?}"
        );
        let e = c.apply(
            Input::Registered {
                info: on("18.6 (Debian 18.6-3)"),
                conn: 2,
            },
            t0,
        );
        assert!(
            !e.iter().any(|e| matches!(e, Effect::Refuse { .. })),
            "{e:?}"
        );
        assert_eq!(starts(&e).len(), 1, "{e:?}");
        assert_eq!(c.agents["a-1"].postgres_major, "18");
    }

    #[test]
    fn unknown_lost_and_misclassed_agents_are_refused() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        let e = register(&mut c, "stranger", 1, &[], t0);
        assert!(
            matches!(&e[..], [.., Effect::Refuse { reason }] if reason.contains("unknown agent `stranger`") && reason.contains("a-1")),
            "{e:?}"
        );
        let info = Register {
            agent_id: "a-1".into(),
            instance_class: "b".into(),
            ..Default::default()
        };
        let e = c.apply(Input::Registered { info, conn: 2 }, t0);
        assert!(e.iter().any(|e| matches!(e, Effect::Refuse { reason } if reason.contains("registered as class b, expected a"))), "{e:?}");
        // Lost (it never registered in time), then it turns up: refused.
        let late = t0 + Duration::from_secs(61);
        let e = c.apply(Input::Tick, late);
        assert!(e.iter().any(|e| matches!(e, Effect::Observe(Observed::AgentLost { why, .. }) if why.contains("did not register within"))));
        assert_eq!(finishes(&e)[0].1, CellState::Failed);
        assert!(
            finishes(&e)[0]
                .2
                .contains("no live agent of instance class `a`"),
            "{e:?}"
        );
        let e = register(&mut c, "a-1", 3, &[], late);
        assert!(
            e.iter().any(
                |e| matches!(e, Effect::Refuse { reason } if reason.contains("declared lost"))
            )
        );
    }

    #[test]
    fn a_silent_agent_is_lost_at_its_lease_and_its_cell_fails() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        let hb = || Msg::Heartbeat(Heartbeat { seq: 1 });
        let t1 = t0 + Duration::from_secs(8);
        message(&mut c, "a-1", 1, hb(), t1);
        // Within the lease of its last message: live.
        assert!(finishes(&c.apply(Input::Tick, t1 + LEASE)).is_empty());
        let e = c.apply(Input::Tick, t1 + LEASE + Duration::from_millis(1));
        assert!(
            e.iter()
                .any(|e| matches!(e, Effect::Store(Entry::AgentLost { .. })))
        );
        let f = finishes(&e);
        assert_eq!(f[0].1, CellState::Failed);
        assert!(
            f[0].2
                .contains("agent a-1 lost: no message for 10s (lease expired)"),
            "{f:?}"
        );
    }

    #[test]
    fn the_lease_counts_from_arrival_not_from_handling() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        // A heartbeat that arrived at 9 s and is handled at 12 s.
        let e = c.apply(
            Input::Message {
                agent_id: "a-1".into(),
                conn: 1,
                msg: Msg::Heartbeat(Heartbeat { seq: 1 }),
                received: t0 + Duration::from_secs(9),
            },
            t0 + Duration::from_secs(12),
        );
        assert!(e.iter().any(|e| matches!(e, Effect::Observe(Observed::MessageWaited(w)) if *w == Duration::from_secs(3))));
        assert!(finishes(&c.apply(Input::Tick, t0 + Duration::from_secs(19))).is_empty());
        assert!(!finishes(&c.apply(Input::Tick, t0 + Duration::from_secs(20))).is_empty());
    }

    #[test]
    fn a_reconnect_within_the_lease_keeps_the_cell_and_stale_connections_are_ignored() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        let cell = id(&c, 0);
        let t1 = t0 + Duration::from_secs(5);
        c.apply(
            Input::Disconnected {
                agent_id: "a-1".into(),
                conn: 1,
            },
            t1,
        );
        assert!(!c.agents["a-1"].connected);
        let e = register(&mut c, "a-1", 2, &[&cell], t1);
        assert!(starts(&e).is_empty() && finishes(&e).is_empty(), "{e:?}");
        assert_eq!(c.cells[0].state, CellState::Running);
        assert!(e.iter().any(|e| matches!(
            e,
            Effect::Observe(Observed::AgentRegistered { first: false, .. })
        )));
        // A result on the old connection is not taken; on the new one it is.
        assert!(
            finishes(&message(
                &mut c,
                "a-1",
                1,
                result(&cell, "", CellStatus::Succeeded, ""),
                t1
            ))
            .is_empty()
        );
        let e = message(
            &mut c,
            "a-1",
            2,
            result(&cell, "", CellStatus::Succeeded, ""),
            t1,
        );
        assert_eq!(finishes(&e)[0].1, CellState::Succeeded);
    }

    #[test]
    fn an_assignment_lost_with_the_connection_is_queued_again_and_reassigned() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        // Back without the cell: the Assign never reached it.
        let e = register(&mut c, "a-1", 2, &[], t0);
        assert!(
            e.iter()
                .any(|e| matches!(e, Effect::Store(Entry::RequeueCell { .. })))
        );
        assert!(
            e.iter()
                .any(|e| matches!(e, Effect::Observe(Observed::CellRequeued { cell: 0 })))
        );
        assert_eq!(starts(&e), vec![(0, vec!["a-1".to_string()])]);
    }

    #[test]
    fn a_multi_role_cell_starts_only_with_an_agent_per_role_and_relays_endpoints() {
        let t0 = Instant::now();
        let mut c = core(gang(), &["a-1", "a-2"], t0);
        let cell = id(&c, 0);
        assert!(
            starts(&register(&mut c, "a-1", 1, &[], t0)).is_empty(),
            "never half a cell"
        );
        let e = register(&mut c, "a-2", 2, &[], t0);
        let s = starts(&e);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].1.len(), 2);
        // Each role's Assign names the other as its peer.
        let Effect::Start { assigns, .. } = e
            .iter()
            .find(|e| matches!(e, Effect::Start { .. }))
            .unwrap()
        else {
            unreachable!()
        };
        for (agent, a) in assigns {
            assert_eq!(a.peers.len(), 1);
            assert_ne!(&a.peers[0].agent_id, agent);
        }
        let roles: Vec<(String, String)> = c.cells[0]
            .roles
            .iter()
            .map(|r| (r.role.clone(), r.agent.clone()))
            .collect();
        assert_eq!(roles[0].0, "subscriber", "the lead first");
        let (lead, other) = (roles[0].1.clone(), roles[1].1.clone());
        // The publisher's cluster is up: the subscriber learns where.
        let e = message(
            &mut c,
            &other,
            if other == "a-1" { 1 } else { 2 },
            Msg::RoleReady(RoleReady {
                cell_id: cell.clone(),
                role: "publisher".into(),
                endpoint: Some(Endpoint {
                    host: "10.0.0.2".into(),
                    port: 5432,
                    ..Default::default()
                }),
            }),
            t0,
        );
        let s = sends(&e);
        assert!(
            matches!(&s[..], [(to, CMsg::PeerReady(p))] if *to == lead && p.role == "publisher"),
            "{s:?}"
        );
        // The lead succeeds: the publisher is released, and its cancelled
        // answer completes a successful cell.
        let conn = |a: &str| if a == "a-1" { 1 } else { 2 };
        let e = message(
            &mut c,
            &lead,
            conn(&lead),
            result(&cell, "subscriber", CellStatus::Succeeded, ""),
            t0,
        );
        let s = sends(&e);
        assert!(
            matches!(&s[..], [(to, CMsg::Cancel(x))] if *to == other && x.release),
            "{s:?}"
        );
        assert!(
            finishes(&e).is_empty(),
            "stored once, when every role has an outcome"
        );
        let e = message(
            &mut c,
            &other,
            conn(&other),
            result(&cell, "publisher", CellStatus::Cancelled, "released"),
            t0,
        );
        assert_eq!(
            finishes(&e),
            vec![(cell, CellState::Succeeded, String::new())]
        );
    }

    #[test]
    fn a_failed_role_stops_the_others_and_fails_the_cell_naming_it() {
        let t0 = Instant::now();
        let mut c = core(gang(), &["a-1", "a-2"], t0);
        let cell = id(&c, 0);
        register(&mut c, "a-1", 1, &[], t0);
        register(&mut c, "a-2", 2, &[], t0);
        let publisher = c.cells[0].roles[1].agent.clone();
        let lead = c.cells[0].roles[0].agent.clone();
        // The publisher's agent is gone for good.
        let e = c.apply(
            Input::Gone {
                agent_id: publisher.clone(),
                why: "pod evicted".into(),
            },
            t0,
        );
        let s = sends(&e);
        assert!(
            matches!(&s[..], [(to, CMsg::Cancel(x))] if *to == lead && !x.release && x.reason.contains("another role of the cell failed")),
            "{s:?}"
        );
        let conn = if lead == "a-1" { 1 } else { 2 };
        let e = message(
            &mut c,
            &lead,
            conn,
            result(&cell, "subscriber", CellStatus::Cancelled, "stopped"),
            t0,
        );
        let f = finishes(&e);
        assert_eq!(f[0].1, CellState::Failed);
        assert!(
            f[0].2.contains(&format!(
                "role publisher ({publisher}): agent {publisher} lost: pod evicted"
            )),
            "{f:?}"
        );
    }

    #[test]
    fn a_cell_no_agent_can_run_fails_at_once() {
        let t0 = Instant::now();
        let mut c = core(single(1), &[], t0);
        let f = finishes(&c.apply(Input::Tick, t0));
        assert_eq!(f[0].1, CellState::Failed);
        assert!(
            f[0].2
                .contains("no agent of instance class `a` in the fleet"),
            "{f:?}"
        );
        // A gang needs two at once.
        let mut c = core(gang(), &["a-1"], t0);
        let f = finishes(&c.apply(Input::Tick, t0));
        assert!(
            f[0].2
                .contains("needs 2 agents of instance class `a` at once"),
            "{f:?}"
        );
    }

    #[test]
    fn cancel_drops_pending_cells_stops_running_ones_and_gives_up_after_the_grace() {
        let t0 = Instant::now();
        let mut c = core(single(2), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        let e = c.apply(Input::Cancel, t0);
        let f = finishes(&e);
        assert_eq!(
            f,
            vec![(
                id(&c, 1),
                CellState::Cancelled,
                "run cancelled before the cell started".into()
            )]
        );
        assert!(matches!(&sends(&e)[..], [(_, CMsg::Cancel(x))] if x.reason == "run cancelled"));
        // A second cancel changes nothing; nothing new is assigned.
        assert!(c.apply(Input::Cancel, t0).is_empty());
        // Heartbeats keep it alive, but the grace runs out.
        let t1 = t0 + Duration::from_secs(31);
        message(&mut c, "a-1", 1, Msg::Heartbeat(Heartbeat { seq: 2 }), t1);
        let f = finishes(&c.apply(Input::Tick, t1));
        assert_eq!(
            f,
            vec![(
                id(&c, 0),
                CellState::Cancelled,
                "cancelled; the agent did not confirm in time".into()
            )]
        );
        assert!(c.done());
    }

    #[test]
    fn a_cancelled_runs_confirmed_cells_are_cancelled() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        c.apply(Input::Cancel, t0);
        let cell0 = id(&c, 0);
        let e = message(
            &mut c,
            "a-1",
            1,
            result(&cell0, "", CellStatus::Cancelled, "cancelled"),
            t0,
        );
        assert_eq!(finishes(&e)[0].1, CellState::Cancelled);
    }

    #[test]
    fn samples_are_kept_once_and_acknowledged_after_their_commit() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        let cell = id(&c, 0);
        let sample = |seq| {
            Msg::Sample(pgfleet_proto::v1::CellSample {
                cell_id: cell.clone(),
                kind: "live".into(),
                data_json: format!("{{\"second\": {seq}}}"),
                seq,
            })
        };
        let stored = |e: &[Effect]| e.iter().filter(|e| matches!(e, Effect::Sample(_))).count();
        let acked = |e: &[Effect]| {
            e.iter()
                .filter_map(|e| match e {
                    Effect::AckAfterCommit {
                        msg: CMsg::SampleAck(a),
                        ..
                    } => Some(a.seq),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        for seq in 1..=2 {
            let e = message(&mut c, "a-1", 1, sample(seq), t0);
            assert_eq!((stored(&e), acked(&e)), (1, vec![seq]));
            assert!(
                !e.iter().any(|e| matches!(e, Effect::Send { .. })),
                "no ack before the commit"
            );
        }
        // Replayed after a reconnect: not stored again, acknowledged again.
        let e = message(&mut c, "a-1", 1, sample(1), t0);
        assert_eq!((stored(&e), acked(&e)), (0, vec![1]));
        let e = message(&mut c, "a-1", 1, sample(3), t0);
        assert_eq!(stored(&e), 1);
    }

    #[test]
    fn a_cell_end_that_could_not_be_stored_is_taken_again_from_the_replayed_result() {
        let t0 = Instant::now();
        let mut c = core(single(1), &["a-1"], t0);
        register(&mut c, "a-1", 1, &[], t0);
        let cell = id(&c, 0);
        let e = message(
            &mut c,
            "a-1",
            1,
            result(&cell, "", CellStatus::Succeeded, ""),
            t0,
        );
        assert!(matches!(
            e.iter().find(|e| matches!(e, Effect::FinishCell { .. })),
            Some(Effect::FinishCell {
                replayable: true,
                ..
            })
        ));
        c.apply(
            Input::CellNotStored {
                cell_id: cell.clone(),
            },
            t0,
        );
        assert_eq!(c.cells[0].state, CellState::Running);
        let e = message(
            &mut c,
            "a-1",
            1,
            result(&cell, "", CellStatus::Succeeded, ""),
            t0,
        );
        assert_eq!(finishes(&e)[0].1, CellState::Succeeded);
        // Once stored, a replay is only acknowledged.
        let e = message(
            &mut c,
            "a-1",
            1,
            result(&cell, "", CellStatus::Succeeded, ""),
            t0,
        );
        assert!(finishes(&e).is_empty());
        assert!(e.iter().any(|e| matches!(
            e,
            Effect::AckAfterCommit {
                msg: CMsg::ResultAck(_),
                ..
            }
        )));
    }

    #[test]
    fn a_resumed_run_waits_for_its_agents_and_keeps_finished_cells() {
        let t0 = Instant::now();
        let mut c = core(single(3), &["a-1"], t0);
        let ids: Vec<String> = (0..3).map(|i| id(&c, i)).collect();
        let requeued = c.resume(
            &[
                (ids[0].clone(), CellState::Succeeded, "a-1".into()),
                (ids[1].clone(), CellState::Running, "a-1".into()),
                (ids[2].clone(), CellState::Pending, String::new()),
            ],
            HashMap::from([((ids[1].clone(), "a-1".to_string()), 7)]),
            t0,
        );
        assert!(requeued.is_empty());
        // The agent comes back still running cell 1: nothing is restarted.
        let e = register(&mut c, "a-1", 1, &[&ids[1]], t0);
        assert!(starts(&e).is_empty(), "{e:?}");
        // Samples up to the stored 7 are duplicates.
        let e = message(
            &mut c,
            "a-1",
            1,
            Msg::Sample(pgfleet_proto::v1::CellSample {
                cell_id: ids[1].clone(),
                kind: "live".into(),
                data_json: "{}".into(),
                seq: 7,
            }),
            t0,
        );
        assert!(!e.iter().any(|e| matches!(e, Effect::Sample(_))));
        let e = message(
            &mut c,
            "a-1",
            1,
            result(&ids[1], "", CellStatus::Succeeded, ""),
            t0,
        );
        assert_eq!(finishes(&e)[0].0, ids[1]);
        assert_eq!(starts(&e), vec![(2, vec!["a-1".to_string()])]);
        // A running cell whose agent is not known goes back to pending.
        let mut c = core(single(1), &["a-1"], t0);
        let cell = id(&c, 0);
        let requeued = c.resume(
            &[(cell.clone(), CellState::Running, "a-9".into())],
            HashMap::new(),
            t0,
        );
        assert_eq!(requeued, vec![cell]);
        assert_eq!(c.cells[0].state, CellState::Pending);
    }

    #[test]
    fn the_eta_scales_the_plan_by_the_work_left() {
        let t0 = Instant::now();
        let mut c = core(single(2), &["a-1"], t0);
        let wall = Duration::from_secs(100);
        assert_eq!(c.eta(wall, t0), Some(wall));
        register(&mut c, "a-1", 1, &[], t0);
        let cell0 = id(&c, 0);
        message(
            &mut c,
            "a-1",
            1,
            result(&cell0, "", CellStatus::Succeeded, ""),
            t0,
        );
        assert_eq!(c.eta(wall, t0), Some(Duration::from_secs(50)));
    }
}
