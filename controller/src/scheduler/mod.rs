//! The scheduler: places cells on idle agents of their instance class, tracks
//! agent leases, records every state change in the store, and cancels.
//!
//! A cell has one role, or several (e.g. logical-drain's subscriber and
//! publisher), each on its own agent. A multi-role cell is gang-scheduled:
//! all its roles are assigned at once, only when an idle agent of each
//! role's class is there, never half. Each role reports where its cluster is
//! (`RoleReady`) and the scheduler relays it to the other roles
//! (`PeerReady`). The cell ends when every role has an outcome: when the
//! lead (first) role reports success the others are released; when any role
//! fails, is lost or cancelled, the others are cancelled, and the cell is
//! stored once, failed, with the first failure and every point measured.
//!
//! It is a single task that owns all run state and advances it from events
//! (`api::Event`), so there is one place where a cell changes state. It does
//! not know where agents come from: it is told which agent ids to expect.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value as Json, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::controller_message::Msg as CMsg;
use pgfleet_proto::v1::{
    Assign, Cancel, CellStatus, ControllerMessage, Endpoint, Peer, PeerReady, Register, ResultAck,
    SampleAck, Shutdown,
};

use crate::api::{Event, ToAgent};
use crate::scenario::PlannedCell;
use crate::store::{CellState, NewSample, RunStatus, Store};

#[derive(Debug, Clone)]
pub struct Options {
    /// Silence longer than this and an agent is lost.
    pub lease: Duration,
    /// How long launched agents have to register.
    pub registration_timeout: Duration,
    /// After a cancel, how long running cells have to report back.
    pub cancel_grace: Duration,
    /// The plan's estimate of the run's wall-clock time on its fleet (for
    /// the ETA); None: no ETA.
    pub estimated_wall: Option<Duration>,
    /// Progress bars when stderr is a terminal (`pgfleet run`); false:
    /// plain lines (a service's log).
    pub interactive: bool,
    /// Where cell states and progress are published as they happen (the
    /// HTTP API's event stream).
    pub events: Option<broadcast::Sender<RunEvent>>,
    /// The controller's metrics, and the scenario's name for their labels.
    pub metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    pub scenario: String,
}

/// What happens in a run, as published to its watchers (`GET
/// /v1/runs/{id}/events`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// A cell changed state.
    Cell {
        cell_id: String,
        state: String,
        /// Its agents (`role:agent, ...` for multi-role cells).
        agents: String,
        error: Option<String>,
        /// Cells finished and in all, after this change.
        done: usize,
        total: usize,
    },
    /// An agent reported progress on a cell.
    Progress {
        cell_id: String,
        phase: String,
        message: String,
        done: u64,
        total: u64,
    },
    /// An agent registered, reconnected or was lost.
    Agent {
        agent_id: String,
        state: String,
        detail: String,
    },
    /// The run changed status (the last event of a finished run).
    Run { status: String },
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lease: Duration::from_secs(10),
            registration_timeout: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(60),
            estimated_wall: None,
            interactive: true,
            events: None,
            metrics: None,
            scenario: String::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentState {
    /// Launched, not registered yet.
    Expected,
    Live,
    Lost,
}

struct AgentSlot {
    class: String,
    state: AgentState,
    tx: Option<ToAgent>,
    conn: u64,
    last_seen: Instant,
    /// The cell (index) and role it runs.
    cell: Option<(usize, String)>,
    why_lost: String,
    /// Where peers reach its clusters (from its registration).
    address: String,
    /// Its storage profile (from its registration), for metrics' labels.
    profile: String,
}

impl AgentSlot {
    fn new(class: String) -> Self {
        AgentSlot {
            class,
            state: AgentState::Expected,
            tx: None,
            conn: 0,
            last_seen: Instant::now(),
            cell: None,
            why_lost: String::new(),
            address: String::new(),
            profile: String::new(),
        }
    }
}

/// One role of a running cell.
struct RoleRun {
    role: String,
    agent: String,
    endpoint: Option<Endpoint>,
    outcome: Option<Outcome>,
}

/// How a role ended: its result, or its agent's loss.
struct Outcome {
    state: CellState,
    error: String,
    points: Vec<(Json, Json)>,
    environment: Option<Json>,
}

struct CellSlot {
    planned: PlannedCell,
    state: CellState,
    /// The plan's estimate of this cell's seconds.
    estimate: f64,
    /// When it started running.
    started: Option<Instant>,
    /// Set while running: one per role, the lead first.
    roles: Vec<RoleRun>,
    /// The first role failure; the other roles were asked to stop.
    failure: Option<String>,
    /// The lead succeeded; the other roles were released.
    released: bool,
    /// Who runs it, for people (`role:agent, ...`).
    agents: String,
    bar: Option<ProgressBar>,
    /// The cell's trace span while it runs (a child of the run's); its
    /// agents' spans are children of it.
    span: Option<tracing::Span>,
}

pub struct Scheduler {
    run_id: String,
    store: Store,
    opts: Options,
    agents: BTreeMap<String, AgentSlot>,
    cells: Vec<CellSlot>,
    ui: Ui,
    started: Instant,
    cancelled: Option<Instant>,
    /// How long agents' messages waited between arriving and being
    /// handled, in microseconds: a slow store write shows here before it
    /// turns a heartbeat into a false loss.
    delays: hdrhistogram::Histogram<u64>,
    /// To the task that stores samples (batched, one transaction each), so
    /// a burst of samples never holds up another agent's heartbeat.
    samples: mpsc::UnboundedSender<NewSample>,
    sample_writer: tokio::task::JoinHandle<()>,
    /// The last sample number kept per (cell, agent) of the current
    /// assignment: a replayed sample at or below it is a duplicate.
    sample_seq: HashMap<(String, String), u64>,
    /// The run's trace span (set when `run` starts).
    run_span: tracing::Span,
}

/// Stores a run's samples as they come, a batch per transaction; ends when
/// the scheduler drops its sender, after storing everything sent.
fn sample_writer(
    run_id: String,
    store: Store,
    mut rx: mpsc::UnboundedReceiver<NewSample>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut batch = Vec::new();
        while rx.recv_many(&mut batch, 512).await > 0 {
            let (store, run, b) = (store.clone(), run_id.clone(), std::mem::take(&mut batch));
            let r = tokio::task::spawn_blocking(move || store.add_samples(&run, &b)).await;
            if let Ok(Err(e)) | Err(e) = r.map_err(|e| crate::Error::Store(e.to_string())) {
                tracing::warn!(run = %run_id, "storing samples failed: {e}");
            }
        }
    })
}

impl Scheduler {
    /// `expected`: agent id -> instance class, as the agent source launched them.
    pub fn new(
        run_id: &str,
        store: Store,
        opts: Options,
        cells: Vec<PlannedCell>,
        expected: &[(String, String)],
    ) -> Self {
        let now = Instant::now();
        let ui = Ui::new(opts.interactive);
        let (samples, rx) = mpsc::unbounded_channel();
        let sample_writer = sample_writer(run_id.to_string(), store.clone(), rx);
        Scheduler {
            run_id: run_id.to_string(),
            store,
            opts,
            agents: expected
                .iter()
                .map(|(id, class)| (id.clone(), AgentSlot::new(class.clone())))
                .collect(),
            cells: cells
                .into_iter()
                .map(|planned| CellSlot {
                    estimate: planned.estimate().seconds,
                    started: None,
                    planned,
                    state: CellState::Pending,
                    roles: Vec::new(),
                    failure: None,
                    released: false,
                    agents: String::new(),
                    bar: None,
                    span: None,
                })
                .collect(),
            ui,
            started: now,
            cancelled: None,
            delays: hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"),
            samples,
            sample_writer,
            sample_seq: HashMap::new(),
            run_span: tracing::Span::none(),
        }
    }

    /// A run a controller was executing when it stopped, from the store:
    /// finished cells stay finished; running cells wait for their agents,
    /// which reconnect with the cells they still run and replay the results
    /// not acknowledged. Agents that do not return within the registration
    /// timeout are lost, and their cells fail.
    pub fn resume(
        run_id: &str,
        store: Store,
        opts: Options,
        cells: Vec<PlannedCell>,
        stored: &[crate::store::CellRow],
        agents: &[crate::store::AgentRow],
    ) -> Self {
        let expected: Vec<(String, String)> = agents
            .iter()
            .filter(|a| a.lost_at.is_none())
            .map(|a| (a.agent_id.clone(), a.instance_class.clone()))
            .collect();
        let seqs = store.last_sample_seqs(run_id).unwrap_or_default();
        let mut me = Scheduler::new(run_id, store, opts, cells, &expected);
        // Agents replay what this controller had not acknowledged.
        me.sample_seq = seqs;
        for row in stored {
            let Some(idx) = me
                .cells
                .iter()
                .position(|c| c.planned.cell_id == row.cell_id)
            else {
                continue;
            };
            let state = match row.state.as_str() {
                "succeeded" => CellState::Succeeded,
                "failed" => CellState::Failed,
                "cancelled" => CellState::Cancelled,
                "running" => CellState::Running,
                _ => CellState::Pending,
            };
            if state != CellState::Running {
                me.cells[idx].state = state;
                continue;
            }
            // `role:agent, role:agent` for multi-role cells, else the agent.
            let who = row.agent_id.clone().unwrap_or_default();
            let planned = me.cells[idx].planned.clone();
            let runs: Vec<RoleRun> = if planned.multi_role() {
                who.split(", ")
                    .filter_map(|x| x.split_once(':'))
                    .map(|(role, agent)| RoleRun {
                        role: role.to_string(),
                        agent: agent.to_string(),
                        endpoint: None,
                        outcome: None,
                    })
                    .collect()
            } else {
                vec![RoleRun {
                    role: planned
                        .roles
                        .first()
                        .map(|r| r.0.clone())
                        .unwrap_or_default(),
                    agent: who.clone(),
                    endpoint: None,
                    outcome: None,
                }]
            };
            if runs.len() != planned.roles.len()
                || runs.iter().any(|r| !me.agents.contains_key(&r.agent))
            {
                me.cells[idx].state = CellState::Pending;
                let _ = me.store.requeue_cell(run_id, &row.cell_id);
                continue;
            }
            for r in &runs {
                if let Some(a) = me.agents.get_mut(&r.agent) {
                    a.cell = Some((idx, r.role.clone()));
                }
            }
            let cell = &mut me.cells[idx];
            cell.state = CellState::Running;
            cell.started = Some(Instant::now());
            cell.roles = runs;
            cell.agents = who;
        }
        me
    }

    /// Runs until every cell has ended. Returns the run's status.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        cancel: CancellationToken,
    ) -> RunStatus {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        self.run_span = tracing::info_span!(
            target: "pgfleet",
            "run",
            run_id = %self.run_id,
            scenario = %self.opts.scenario,
            cells = self.cells.len(),
        );
        self.cell_gauges();
        loop {
            self.assign().await;
            // A finished cell's span ends.
            for c in self.cells.iter_mut().filter(|c| c.state.is_terminal()) {
                if let Some(span) = c.span.take() {
                    span.record("state", format!("{:?}", c.state).to_lowercase());
                    if let Some(m) = &self.opts.metrics {
                        m.cell_ended(&self.run_id, &c.planned.cell_id);
                    }
                }
            }
            if self.cells.iter().all(|c| c.state.is_terminal()) {
                break;
            }
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.handle(ev).await,
                    None => break,
                },
                _ = tick.tick() => {
                    self.check_time().await;
                    if let Some(left) = self.eta() {
                        let done = self.cells.iter().filter(|c| c.state.is_terminal()).count();
                        self.ui.overall(done, self.cells.len(), left);
                    }
                }
                _ = cancel.cancelled(), if self.cancelled.is_none() => self.cancel_all().await,
            }
        }
        if !self.delays.is_empty() {
            tracing::info!(
                run = %self.run_id,
                messages = self.delays.len(),
                p50_ms = self.delays.value_at_quantile(0.5) as f64 / 1000.0,
                p99_ms = self.delays.value_at_quantile(0.99) as f64 / 1000.0,
                max_ms = self.delays.max() as f64 / 1000.0,
                "agent messages: wait from arrival to handling"
            );
        }
        // Every sample is stored before the run's end is (reports read them).
        drop(self.samples);
        let _ = self.sample_writer.await;
        // The agents go back to whoever gave them (`Hub::release`).
        if self.cancelled.is_some() {
            RunStatus::Cancelled
        } else if self.cells.iter().all(|c| c.state == CellState::Succeeded) {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        }
    }

    async fn handle(&mut self, ev: Event) {
        match ev {
            Event::Registered { info, conn, tx } => self.registered(info, conn, tx).await,
            Event::Message {
                agent_id,
                conn,
                msg,
                received,
            } => {
                let waited = received.elapsed();
                let _ = self.delays.record((waited.as_micros() as u64).max(1));
                if let Some(m) = &self.opts.metrics {
                    m.message_wait.observe(waited.as_secs_f64());
                }
                let Some(a) = self.agents.get_mut(&agent_id) else {
                    return;
                };
                if a.conn != conn || a.state == AgentState::Lost {
                    return;
                }
                a.last_seen = Instant::now();
                match msg {
                    Msg::Heartbeat(_) | Msg::Register(_) => {}
                    Msg::Progress(p) => {
                        if let (Some(m), Some(c)) = (
                            &self.opts.metrics,
                            self.cells.iter().find(|c| c.planned.cell_id == p.cell_id),
                        ) {
                            m.cell_phase(
                                [
                                    self.opts.scenario.as_str(),
                                    self.run_id.as_str(),
                                    c.planned.instance_class.as_str(),
                                    c.planned.workload(),
                                ],
                                &p.cell_id,
                                &p.phase,
                            );
                        }
                        self.publish(RunEvent::Progress {
                            cell_id: p.cell_id.clone(),
                            phase: p.phase.clone(),
                            message: p.message.clone(),
                            done: p.done,
                            total: p.total,
                        });
                        if let Some(c) = self.cell_mut(&p.cell_id)
                            && let Some(bar) = &c.bar
                        {
                            if p.total > 0 {
                                bar.set_length(p.total);
                                bar.set_position(p.done);
                            }
                            bar.set_message(format!("{}: {}", p.phase, p.message));
                        }
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
                        if s.seq > 0
                            && let Some(tx) = &a.tx
                        {
                            // Acknowledged once handed to the writer (or a
                            // duplicate of one that was): the agent forgets it.
                            let _ = tx.try_send(Ok(cmsg(CMsg::SampleAck(SampleAck {
                                cell_id: s.cell_id.clone(),
                                seq: s.seq,
                            }))));
                        }
                        if !fresh {
                            return;
                        }
                        let data = parse_json(&s.data_json);
                        if matches!(
                            s.kind.as_str(),
                            "pg_stat" | "live" | "vacuum" | "lag" | "repeat"
                        ) {
                            self.sample_metrics(&agent_id, &s.cell_id, &s.kind, &data);
                        }
                        // Stored by the sample writer, off this task.
                        let _ = self.samples.send(NewSample {
                            cell_id: s.cell_id,
                            kind: s.kind,
                            data,
                            agent_id: agent_id.clone(),
                            seq: s.seq,
                        });
                    }
                    Msg::Result(r) => self.result(&agent_id, r).await,
                    Msg::RoleReady(rr) => self.role_ready(&agent_id, rr).await,
                }
            }
            Event::Disconnected { agent_id, conn } => {
                if let Some(a) = self.agents.get_mut(&agent_id)
                    && a.conn == conn
                {
                    // Not lost yet: it may reconnect within its lease.
                    a.tx = None;
                }
            }
            Event::Gone { agent_id, why } => {
                // No wait for the lease: its source knows it will not return.
                if let Some(a) = self.agents.get(&agent_id)
                    && a.state != AgentState::Lost
                {
                    self.lose(&agent_id, why).await;
                }
            }
        }
    }

    async fn registered(&mut self, info: Register, conn: u64, tx: ToAgent) {
        let id = info.agent_id.clone();
        let class = info.instance_class.clone();
        let json = json!({
            "agent_id": info.agent_id, "instance_class": info.instance_class,
            "storage": info.storage.as_ref().map(|s| json!({
                "profile": s.profile, "emulated": s.emulated, "data_root": s.data_root,
                "caps": {"read_iops": s.read_iops, "write_iops": s.write_iops, "read_mbps": s.read_mbps, "write_mbps": s.write_mbps},
            })),
            "cores": info.cores, "memory_bytes": info.memory_bytes, "postgres_version": info.postgres_version,
            "postgres_bin_dir": info.postgres_bin_dir, "hostname": info.hostname, "agent_version": info.agent_version,
        });
        let refuse = |reason: String| {
            cmsg(CMsg::Shutdown(Shutdown {
                reason,
                refused: true,
            }))
        };
        let Some(slot) = self.agents.get_mut(&id) else {
            let known: Vec<&str> = self.agents.keys().map(String::as_str).collect();
            self.ui.line(format!(
                "refused agent {id}: not one this run launched ({})",
                known.join(", ")
            ));
            let _ = tx
                .send(Ok(refuse(format!(
                    "unknown agent `{id}`: this run expects {}",
                    known.join(", ")
                ))))
                .await;
            return;
        };
        if slot.state == AgentState::Lost {
            // Its cells were already failed; it must not run more.
            let _ = tx
                .send(Ok(refuse(format!(
                    "agent {id} was declared lost: {}",
                    slot.why_lost
                ))))
                .await;
            return;
        }
        if slot.class != class {
            let _ = tx
                .send(Ok(refuse(format!(
                    "agent {id} registered as class {class}, expected {}",
                    slot.class
                ))))
                .await;
            return;
        }
        let first = slot.state == AgentState::Expected;
        slot.state = AgentState::Live;
        slot.tx = Some(tx);
        slot.conn = conn;
        slot.last_seen = Instant::now();
        slot.address = info.address.clone();
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
        let held = slot.cell.clone();
        match held {
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
                    )
                    .await;
                } else {
                    if let Some(a) = self.agents.get_mut(&id) {
                        a.cell = None;
                    }
                    let cell = &mut self.cells[idx];
                    cell.state = CellState::Pending;
                    cell.roles.clear();
                    if let Some(bar) = cell.bar.take() {
                        bar.abandon_with_message(
                            "assignment lost with the connection; reassigning",
                        );
                    }
                    if let Err(e) = self.store.requeue_cell(&self.run_id, &cell.planned.cell_id) {
                        self.ui
                            .line(format!("warning: storing cell requeue failed: {e}"));
                    }
                    self.publish_cell(idx, None);
                }
            }
            // Still running: peers' endpoints sent while it was away.
            Some((idx, role)) => self.relay_peers_to(idx, &role).await,
            None => {}
        }
        if let Err(e) = self.store.register_agent(&self.run_id, &id, &class, &json) {
            self.ui
                .line(format!("warning: storing agent {id} failed: {e}"));
        }
        self.publish(RunEvent::Agent {
            agent_id: id.clone(),
            state: if first { "registered" } else { "reconnected" }.into(),
            detail: format!("class {class}, PostgreSQL {}", info.postgres_version),
        });
        if let Some(m) = &self.opts.metrics {
            // Counters exist from the first registration on, at 0, so
            // rates and alerts see them before anything happens.
            let reconnects = m.agent_reconnects.with_label_values(&[class.as_str()]);
            m.agent_losses.with_label_values(&[class.as_str()]);
            if !first {
                reconnects.inc();
            }
        }
        if first {
            self.ui.line(format!(
                "agent {id} registered (class {class}, PostgreSQL {})",
                info.postgres_version
            ));
        } else {
            self.ui.line(format!("agent {id} reconnected"));
        }
    }

    async fn result(&mut self, agent_id: &str, r: pgfleet_proto::v1::CellResult) {
        let idx = self
            .cells
            .iter()
            .position(|c| c.planned.cell_id == r.cell_id);
        let mine = idx.filter(|&idx| {
            self.cells[idx].state == CellState::Running
                && self.cells[idx]
                    .roles
                    .iter()
                    .any(|x| x.agent == agent_id && x.role == r.role && x.outcome.is_none())
        });
        if let Some(idx) = mine {
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
                environment: (!r.environment_json.is_empty())
                    .then(|| parse_json(&r.environment_json)),
            };
            if !self.role_outcome(idx, &r.role, outcome).await {
                // Not stored, so not acknowledged: the agent replays it.
                return;
            }
        }
        if let Some(a) = self.agents.get_mut(agent_id)
            && let Some(tx) = &a.tx
        {
            let _ = tx
                .send(Ok(cmsg(CMsg::ResultAck(ResultAck {
                    cell_id: r.cell_id.clone(),
                }))))
                .await;
        }
    }

    /// Records a role's outcome, frees its agent, stops or releases the
    /// other roles as needed, and ends the cell once every role has one.
    /// Returns false when the cell's end could not be stored.
    async fn role_outcome(&mut self, idx: usize, role: &str, outcome: Outcome) -> bool {
        let cell = &mut self.cells[idx];
        let Some(pos) = cell.roles.iter().position(|x| x.role == role) else {
            return true;
        };
        if cell.roles[pos].outcome.is_some() {
            return true;
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
        if let Some(a) = self.agents.get_mut(&agent)
            && a.cell.as_ref().is_some_and(|(i, _)| *i == idx)
        {
            a.cell = None;
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
            self.stop_roles(idx, &reason, release && !stop).await;
        }
        if self.cells[idx].roles.iter().any(|x| x.outcome.is_none()) {
            return true;
        }
        self.finish_roles(idx)
    }

    /// Every role has an outcome: store the cell once.
    fn finish_roles(&mut self, idx: usize) -> bool {
        let cell = &mut self.cells[idx];
        let outcomes: Vec<(&String, &Outcome)> = cell
            .roles
            .iter()
            .filter_map(|x| x.outcome.as_ref().map(|o| (&x.role, o)))
            .collect();
        let released = cell.released;
        let all_ok = outcomes.iter().enumerate().all(|(i, (_, o))| {
            o.state == CellState::Succeeded
                || (i > 0 && released && o.state == CellState::Cancelled)
        });
        let state = if all_ok && cell.failure.is_none() {
            CellState::Succeeded
        } else if self.cancelled.is_some()
            && outcomes.iter().all(|(_, o)| o.state != CellState::Failed)
        {
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
        if let Err(e) = self.store.finish_cell(
            &self.run_id,
            &cell.planned.cell_id,
            state,
            error.as_deref(),
            environment.as_ref(),
            &points,
        ) {
            self.ui.line(format!(
                "error: storing the result of {} failed: {e}",
                cell.planned.cell_id
            ));
            // Forget the outcomes: the agents replay their results.
            for r in &mut self.cells[idx].roles {
                r.outcome = None;
            }
            return false;
        }
        self.end_cell(idx, state, error.as_deref().unwrap_or(""));
        true
    }

    /// Asks the roles without an outcome to stop (or, released, to end).
    async fn stop_roles(&mut self, idx: usize, reason: &str, release: bool) {
        let cell_id = self.cells[idx].planned.cell_id.clone();
        let open: Vec<String> = self.cells[idx]
            .roles
            .iter()
            .filter(|x| x.outcome.is_none())
            .map(|x| x.agent.clone())
            .collect();
        for agent in open {
            if let Some(tx) = self.agents.get(&agent).and_then(|a| a.tx.as_ref()) {
                let _ = tx
                    .send(Ok(cmsg(CMsg::Cancel(Cancel {
                        cell_id: cell_id.clone(),
                        reason: reason.to_string(),
                        release,
                    }))))
                    .await;
            }
        }
    }

    /// A role's cluster is up: tell the cell's other roles where it is.
    async fn role_ready(&mut self, agent_id: &str, rr: pgfleet_proto::v1::RoleReady) {
        let Some(idx) = self
            .cells
            .iter()
            .position(|c| c.planned.cell_id == rr.cell_id)
        else {
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
            self.relay_peers_to(idx, &role).await;
        }
    }

    /// Sends `role`'s agent every endpoint its peers reported.
    async fn relay_peers_to(&self, idx: usize, role: &str) {
        let cell = &self.cells[idx];
        let Some(to) = cell
            .roles
            .iter()
            .find(|x| x.role == role)
            .and_then(|x| self.agents.get(&x.agent))
            .and_then(|a| a.tx.as_ref())
        else {
            return;
        };
        for peer in cell.roles.iter().filter(|x| x.role != role) {
            if let Some(ep) = &peer.endpoint {
                let _ = to
                    .send(Ok(cmsg(CMsg::PeerReady(PeerReady {
                        cell_id: cell.planned.cell_id.clone(),
                        role: peer.role.clone(),
                        endpoint: Some(ep.clone()),
                    }))))
                    .await;
            }
        }
    }

    /// Places pending cells on idle live agents: every role of a cell on
    /// its own agent of the role's class, all at once or not at all. Fails
    /// cells whose classes cannot have enough agents any more.
    async fn assign(&mut self) {
        if self.cancelled.is_some() {
            return;
        }
        for idx in 0..self.cells.len() {
            if self.cells[idx].state != CellState::Pending {
                continue;
            }
            let roles = self.cells[idx].planned.roles.clone();
            let mut picked: Vec<String> = Vec::new();
            for (_, class) in &roles {
                let idle = self
                    .agents
                    .iter()
                    .find(|(id, a)| {
                        a.class == *class
                            && a.state == AgentState::Live
                            && a.tx.is_some()
                            && a.cell.is_none()
                            && !picked.contains(id)
                    })
                    .map(|(id, _)| id.clone());
                match idle {
                    Some(id) => picked.push(id),
                    None => break,
                }
            }
            if picked.len() == roles.len() {
                self.start_cell(idx, picked).await;
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
                self.fail_cell(idx, &msg);
            }
        }
    }

    async fn start_cell(&mut self, idx: usize, agents: Vec<String>) {
        let c = self.cells[idx].planned.clone();
        let profile = agents
            .first()
            .and_then(|a| self.agents.get(a))
            .map(|a| a.profile.clone())
            .unwrap_or_default();
        let span = tracing::info_span!(
            target: "pgfleet",
            parent: &self.run_span,
            "cell",
            cell_id = %c.cell_id,
            workload = %c.workload(),
            instance_class = %c.instance_class,
            storage_profile = %profile,
            scenario = %self.opts.scenario,
            agents = %agents.join(", "),
            state = tracing::field::Empty,
        );
        let traceparent = pgfleet_proto::telemetry::traceparent(&span);
        self.cells[idx].span = Some(span);
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
            let assign = Assign {
                traceparent: traceparent.clone(),
                cell_id: c.cell_id.clone(),
                run_id: self.run_id.clone(),
                workload: c.workload().to_string(),
                params_json: c.params.to_json(),
                settings: settings.into_iter().collect(),
                role: run.role.clone(),
                peers,
            };
            let Some(a) = self.agents.get_mut(&run.agent) else {
                continue;
            };
            a.cell = Some((idx, run.role.clone()));
            // A new assignment numbers its samples from 1.
            self.sample_seq
                .remove(&(c.cell_id.clone(), run.agent.clone()));
            // A send that fails leaves the role without an answer; its agent
            // re-registers without the cell, which fails or re-queues it.
            if let Some(tx) = a.tx.clone()
                && tx.send(Ok(cmsg(CMsg::Assign(assign)))).await.is_err()
            {
                a.tx = None;
            }
        }
        let who = if c.multi_role() {
            runs.iter()
                .map(|r| format!("{}:{}", r.role, r.agent))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            agents.join(", ")
        };
        if let Err(e) = self.store.start_cell(&self.run_id, &c.cell_id, &who) {
            self.ui
                .line(format!("warning: storing cell start failed: {e}"));
        }
        let cell = &mut self.cells[idx];
        cell.state = CellState::Running;
        cell.started = Some(Instant::now());
        cell.roles = runs;
        cell.agents = who.clone();
        cell.bar = Some(self.ui.bar(&format!("{} @ {who}", cell.planned.cell_id)));
        self.publish_cell(idx, None);
    }

    /// A cell's `pg_stat` sample into the metrics, labelled by its run,
    /// class, the sending agent's storage profile and the workload.
    fn sample_metrics(&self, agent_id: &str, cell_id: &str, kind: &str, data: &Json) {
        let (Some(m), Some(cell)) = (
            &self.opts.metrics,
            self.cells.iter().find(|c| c.planned.cell_id == cell_id),
        ) else {
            return;
        };
        let profile = self
            .agents
            .get(agent_id)
            .map(|a| a.profile.as_str())
            .unwrap_or("");
        let labels = [
            self.opts.scenario.as_str(),
            self.run_id.as_str(),
            cell.planned.instance_class.as_str(),
            profile,
            cell.planned.workload(),
        ];
        match kind {
            "live" => m.live_second(labels, data),
            "pg_stat" => m.pg_stat(labels, data),
            _ => m.progress_sample(labels, kind, data),
        }
    }

    /// The run's cells by class, workload and state, into the metrics.
    fn cell_gauges(&self) {
        let Some(m) = &self.opts.metrics else {
            return;
        };
        let mut counts: BTreeMap<(&str, &str), [i64; 5]> = BTreeMap::new();
        for c in &self.cells {
            let i = match c.state {
                CellState::Pending => 0,
                CellState::Running => 1,
                CellState::Succeeded => 2,
                CellState::Failed => 3,
                CellState::Cancelled => 4,
            };
            counts
                .entry((c.planned.instance_class.as_str(), c.planned.workload()))
                .or_default()[i] += 1;
        }
        for ((class, workload), n) in counts {
            for (i, state) in ["pending", "running", "succeeded", "failed", "cancelled"]
                .iter()
                .enumerate()
            {
                m.cells
                    .with_label_values(&[
                        self.opts.scenario.as_str(),
                        self.run_id.as_str(),
                        class,
                        workload,
                        state,
                    ])
                    .set(n[i]);
            }
        }
    }

    fn publish(&self, ev: RunEvent) {
        if let Some(tx) = &self.opts.events {
            // No watcher is fine.
            let _ = tx.send(ev);
        }
    }

    fn publish_cell(&self, idx: usize, error: Option<&str>) {
        self.cell_gauges();
        let cell = &self.cells[idx];
        self.publish(RunEvent::Cell {
            cell_id: cell.planned.cell_id.clone(),
            state: cell.state.as_str().into(),
            agents: cell.agents.clone(),
            error: error.filter(|e| !e.is_empty()).map(str::to_string),
            done: self.cells.iter().filter(|c| c.state.is_terminal()).count(),
            total: self.cells.len(),
        });
    }

    fn fail_cell(&mut self, idx: usize, error: &str) {
        self.finish_without_result(idx, CellState::Failed, error);
    }

    fn finish_without_result(&mut self, idx: usize, state: CellState, error: &str) {
        let id = self.cells[idx].planned.cell_id.clone();
        if let Err(e) = self
            .store
            .finish_cell(&self.run_id, &id, state, Some(error), None, &[])
        {
            self.ui
                .line(format!("warning: storing cell {id} failed: {e}"));
        }
        self.end_cell(idx, state, error);
    }

    fn end_cell(&mut self, idx: usize, state: CellState, error: &str) {
        let cell = &mut self.cells[idx];
        if let (Some(m), Some(t)) = (&self.opts.metrics, cell.started) {
            m.cell_seconds
                .with_label_values(&[
                    cell.planned.instance_class.as_str(),
                    cell.planned.workload(),
                    state.as_str(),
                ])
                .observe(t.elapsed().as_secs_f64());
        }
        cell.state = state;
        let text = match state {
            CellState::Succeeded => "succeeded".to_string(),
            _ => format!("{}: {}", state.as_str(), error),
        };
        if let Some(bar) = cell.bar.take() {
            bar.abandon_with_message(text.clone());
        }
        let line = format!("cell {} {text}", cell.planned.cell_id);
        self.ui.line(line);
        self.publish_cell(idx, Some(error));
        let done = self.cells.iter().filter(|c| c.state.is_terminal()).count();
        if let Some(left) = self.eta() {
            self.ui.progress_line(format!(
                "{done}/{} cells done; about {} left (estimated)",
                self.cells.len(),
                pgfleet_proto::workload::approx_seconds(left.as_secs_f64())
            ));
        }
    }

    /// Time left: the plan's wall-clock estimate scaled by the share of
    /// estimated cell-seconds not done yet (finished cells count whole,
    /// running ones by their time so far, up to their estimate).
    fn eta(&self) -> Option<Duration> {
        let wall = self.opts.estimated_wall?.as_secs_f64();
        let total: f64 = self.cells.iter().map(|c| c.estimate).sum();
        if total <= 0.0 {
            return None;
        }
        let done: f64 = self
            .cells
            .iter()
            .map(|c| match (c.state, c.started) {
                (s, _) if s.is_terminal() => c.estimate,
                (CellState::Running, Some(t)) => t.elapsed().as_secs_f64().min(c.estimate),
                _ => 0.0,
            })
            .sum();
        Some(Duration::from_secs_f64(
            wall * (1.0 - done / total).max(0.0),
        ))
    }

    /// Leases and registration deadlines.
    async fn check_time(&mut self) {
        let now = Instant::now();
        let mut lost = Vec::new();
        for (id, a) in &self.agents {
            match a.state {
                AgentState::Live if now.duration_since(a.last_seen) > self.opts.lease => {
                    lost.push((
                        id.clone(),
                        format!("no message for {:?} (lease expired)", self.opts.lease),
                    ))
                }
                AgentState::Expected
                    if now.duration_since(self.started) > self.opts.registration_timeout =>
                {
                    lost.push((
                        id.clone(),
                        format!(
                            "did not register within {:?}",
                            self.opts.registration_timeout
                        ),
                    ))
                }
                _ => {}
            }
        }
        for (id, why) in lost {
            self.lose(&id, why).await;
        }
        if let Some(at) = self.cancelled
            && now.duration_since(at) > self.opts.cancel_grace
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

    async fn lose(&mut self, id: &str, why: String) {
        let Some(a) = self.agents.get_mut(id) else {
            return;
        };
        a.state = AgentState::Lost;
        a.tx = None;
        if let Some(m) = &self.opts.metrics {
            m.agent_losses.with_label_values(&[a.class.as_str()]).inc();
        }
        a.why_lost = why.clone();
        let cell = a.cell.take();
        if let Err(e) = self.store.agent_lost(&self.run_id, id) {
            self.ui
                .line(format!("warning: storing agent loss failed: {e}"));
        }
        self.ui.line(format!("agent {id} lost: {why}"));
        self.publish(RunEvent::Agent {
            agent_id: id.to_string(),
            state: "lost".into(),
            detail: why.clone(),
        });
        if let Some((idx, role)) = cell
            && !self.cells[idx].state.is_terminal()
        {
            self.role_outcome(
                idx,
                &role,
                failed_outcome(format!("agent {id} lost: {why}")),
            )
            .await;
        }
    }

    async fn cancel_all(&mut self) {
        self.cancelled = Some(Instant::now());
        self.ui.line(
            "cancelling: pending cells are dropped, running cells are asked to stop".to_string(),
        );
        for idx in 0..self.cells.len() {
            match self.cells[idx].state {
                CellState::Pending => self.finish_without_result(
                    idx,
                    CellState::Cancelled,
                    "run cancelled before the cell started",
                ),
                CellState::Running => self.stop_roles(idx, "run cancelled", false).await,
                _ => {}
            }
        }
    }

    fn cell_mut(&mut self, id: &str) -> Option<&mut CellSlot> {
        self.cells.iter_mut().find(|c| c.planned.cell_id == id)
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

fn cmsg(m: CMsg) -> ControllerMessage {
    ControllerMessage { msg: Some(m) }
}

/// Progress bars on a terminal; plain lines otherwise (CI logs).
struct Ui {
    multi: Option<MultiProgress>,
    /// The whole run: cells done and the estimated time left.
    run: Option<ProgressBar>,
}

impl Ui {
    fn new(interactive: bool) -> Self {
        let tty = interactive && std::io::stderr().is_terminal();
        let multi = tty.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        let run = multi.as_ref().map(|m| {
            let bar = m.add(ProgressBar::new(1));
            bar.set_style(
                ProgressStyle::with_template("{prefix:.bold} [{elapsed_precise}] {bar:25.green/white} {pos}/{len} cells {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_prefix("run");
            bar
        });
        Ui { multi, run }
    }

    fn overall(&self, done: usize, total: usize, left: Duration) {
        if let Some(bar) = &self.run {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(format!(
                "about {} left (estimated)",
                pgfleet_proto::workload::approx_seconds(left.as_secs_f64())
            ));
        }
    }

    /// A progress line for logs (a terminal shows the run bar instead).
    fn progress_line(&self, text: String) {
        if self.multi.is_none() {
            eprintln!("{text}");
        }
    }

    fn bar(&self, name: &str) -> ProgressBar {
        let Some(m) = &self.multi else {
            return ProgressBar::hidden();
        };
        let bar = m.add(ProgressBar::new(1));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:.bold} [{elapsed_precise}] {bar:25.cyan/blue} {pos}/{len} {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(name.to_string());
        bar.enable_steady_tick(Duration::from_millis(500));
        bar
    }

    fn line(&self, text: String) {
        match &self.multi {
            Some(m) => {
                let _ = m.println(text);
            }
            None => eprintln!("{text}"),
        }
    }
}
