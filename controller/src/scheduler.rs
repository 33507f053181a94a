//! The scheduler: places cells on idle agents of their instance class, tracks
//! agent leases, records every state change in the store, and cancels.
//!
//! It is a single task that owns all run state and advances it from events
//! (`api::Event`), so there is one place where a cell changes state. It does
//! not know where agents come from: it is told which agent ids to expect.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value as Json, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::controller_message::Msg as CMsg;
use pgfleet_proto::v1::{
    Assign, Cancel, CellStatus, ControllerMessage, Register, ResultAck, Shutdown,
};

use crate::api::{Event, ToAgent};
use crate::scenario::PlannedCell;
use crate::store::{CellState, RunStatus, Store};

#[derive(Debug, Clone)]
pub struct Options {
    /// Silence longer than this and an agent is lost.
    pub lease: Duration,
    /// How long launched agents have to register.
    pub registration_timeout: Duration,
    /// After a cancel, how long running cells have to report back.
    pub cancel_grace: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lease: Duration::from_secs(10),
            registration_timeout: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(60),
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
    cell: Option<usize>,
    why_lost: String,
}

struct CellSlot {
    planned: PlannedCell,
    state: CellState,
    agent: Option<String>,
    bar: Option<ProgressBar>,
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
        Scheduler {
            run_id: run_id.to_string(),
            store,
            opts,
            agents: expected
                .iter()
                .map(|(id, class)| {
                    (
                        id.clone(),
                        AgentSlot {
                            class: class.clone(),
                            state: AgentState::Expected,
                            tx: None,
                            conn: 0,
                            last_seen: now,
                            cell: None,
                            why_lost: String::new(),
                        },
                    )
                })
                .collect(),
            cells: cells
                .into_iter()
                .map(|planned| CellSlot {
                    planned,
                    state: CellState::Pending,
                    agent: None,
                    bar: None,
                })
                .collect(),
            ui: Ui::new(),
            started: now,
            cancelled: None,
        }
    }

    /// Runs until every cell has ended. Returns the run's status.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        cancel: CancellationToken,
    ) -> RunStatus {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            self.assign().await;
            if self.cells.iter().all(|c| c.state.is_terminal()) {
                break;
            }
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.handle(ev).await,
                    None => break,
                },
                _ = tick.tick() => self.check_time(),
                _ = cancel.cancelled(), if self.cancelled.is_none() => self.cancel_all().await,
            }
        }
        for a in self.agents.values() {
            if let Some(tx) = &a.tx {
                let _ = tx
                    .send(Ok(cmsg(CMsg::Shutdown(Shutdown {
                        reason: "run finished".into(),
                    }))))
                    .await;
            }
        }
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
            } => {
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
                        let data = parse_json(&s.data_json);
                        if let Err(e) =
                            self.store
                                .add_sample(&self.run_id, &s.cell_id, &s.kind, &data)
                        {
                            self.ui
                                .line(format!("warning: storing a sample failed: {e}"));
                        }
                    }
                    Msg::Result(r) => self.result(&agent_id, r).await,
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
            Event::Exited { agent_id, status } => {
                if let Some(a) = self.agents.get(&agent_id)
                    && a.state == AgentState::Expected
                {
                    self.lose(
                        &agent_id,
                        format!("agent process exited before registering ({status}); see its log"),
                    );
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
        let slot = self.agents.entry(id.clone()).or_insert_with(|| AgentSlot {
            class: class.clone(),
            state: AgentState::Expected,
            tx: None,
            conn: 0,
            last_seen: Instant::now(),
            cell: None,
            why_lost: String::new(),
        });
        if slot.state == AgentState::Lost {
            // Its cells were already failed; it must not run more.
            let _ = tx
                .send(Ok(cmsg(CMsg::Shutdown(Shutdown {
                    reason: format!("agent {id} was declared lost: {}", slot.why_lost),
                }))))
                .await;
            return;
        }
        if slot.class != class {
            let _ = tx
                .send(Ok(cmsg(CMsg::Shutdown(Shutdown {
                    reason: format!(
                        "agent {id} registered as class {class}, expected {}",
                        slot.class
                    ),
                }))))
                .await;
            return;
        }
        let first = slot.state == AgentState::Expected;
        slot.state = AgentState::Live;
        slot.tx = Some(tx);
        slot.conn = conn;
        slot.last_seen = Instant::now();
        // An assignment the agent does not report (running, or finished
        // with its result not yet acknowledged) never reached it: it was
        // lost with the old connection. The cell goes back to pending and
        // is assigned again.
        let lost_assignment = slot.cell.filter(|&idx| {
            !info
                .running_cells
                .contains(&self.cells[idx].planned.cell_id)
        });
        if let Some(idx) = lost_assignment {
            slot.cell = None;
            let cell = &mut self.cells[idx];
            cell.state = CellState::Pending;
            cell.agent = None;
            if let Some(bar) = cell.bar.take() {
                bar.abandon_with_message("assignment lost with the connection; reassigning");
            }
            if let Err(e) = self.store.requeue_cell(&self.run_id, &cell.planned.cell_id) {
                self.ui
                    .line(format!("warning: storing cell requeue failed: {e}"));
            }
        }
        if let Err(e) = self.store.register_agent(&self.run_id, &id, &class, &json) {
            self.ui
                .line(format!("warning: storing agent {id} failed: {e}"));
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
        let Some(idx) = self
            .cells
            .iter()
            .position(|c| c.planned.cell_id == r.cell_id)
        else {
            return;
        };
        let running_here = self.cells[idx].state == CellState::Running
            && self.cells[idx].agent.as_deref() == Some(agent_id);
        if running_here {
            let state = match CellStatus::try_from(r.status) {
                Ok(CellStatus::Succeeded) => CellState::Succeeded,
                Ok(CellStatus::Cancelled) => CellState::Cancelled,
                _ => CellState::Failed,
            };
            let points: Vec<(Json, Json)> = r
                .points
                .iter()
                .map(|p| (parse_json(&p.params_json), parse_json(&p.metrics_json)))
                .collect();
            let env = (!r.environment_json.is_empty()).then(|| parse_json(&r.environment_json));
            let error = (!r.error.is_empty()).then_some(r.error.as_str());
            if let Err(e) = self.store.finish_cell(
                &self.run_id,
                &r.cell_id,
                state,
                error,
                env.as_ref(),
                &points,
            ) {
                // Not acknowledged: the agent will replay it.
                self.ui.line(format!(
                    "error: storing the result of {} failed: {e}",
                    r.cell_id
                ));
                return;
            }
            self.end_cell(idx, state, error.unwrap_or(""));
        }
        if let Some(a) = self.agents.get_mut(agent_id) {
            if a.cell == Some(idx) {
                a.cell = None;
            }
            if let Some(tx) = &a.tx {
                let _ = tx
                    .send(Ok(cmsg(CMsg::ResultAck(ResultAck {
                        cell_id: r.cell_id.clone(),
                    }))))
                    .await;
            }
        }
    }

    /// Places pending cells on idle live agents of their class, and fails
    /// cells whose class has no agent left.
    async fn assign(&mut self) {
        if self.cancelled.is_some() {
            return;
        }
        for idx in 0..self.cells.len() {
            if self.cells[idx].state != CellState::Pending {
                continue;
            }
            let class = self.cells[idx].planned.instance_class.clone();
            let idle = self
                .agents
                .iter()
                .find(|(_, a)| {
                    a.class == class
                        && a.state == AgentState::Live
                        && a.tx.is_some()
                        && a.cell.is_none()
                })
                .map(|(id, _)| id.clone());
            if let Some(agent_id) = idle {
                self.start_cell(idx, &agent_id).await;
                continue;
            }
            let hope = self
                .agents
                .values()
                .any(|a| a.class == class && a.state != AgentState::Lost);
            if !hope {
                let why: Vec<String> = self
                    .agents
                    .iter()
                    .filter(|(_, a)| a.class == class)
                    .map(|(id, a)| format!("{id}: {}", a.why_lost))
                    .collect();
                let msg = if why.is_empty() {
                    format!("no agent of instance class `{class}` in the fleet")
                } else {
                    format!(
                        "no live agent of instance class `{class}` ({})",
                        why.join("; ")
                    )
                };
                self.fail_cell(idx, &msg);
            }
        }
    }

    async fn start_cell(&mut self, idx: usize, agent_id: &str) {
        let c = &self.cells[idx].planned;
        let assign = Assign {
            cell_id: c.cell_id.clone(),
            run_id: self.run_id.clone(),
            workload: c.workload().to_string(),
            params_json: c.params.to_json(),
            settings: c.settings.clone().into_iter().collect(),
        };
        let Some(a) = self.agents.get_mut(agent_id) else {
            return;
        };
        let Some(tx) = a.tx.clone() else { return };
        if tx.send(Ok(cmsg(CMsg::Assign(assign)))).await.is_err() {
            a.tx = None;
            return;
        }
        a.cell = Some(idx);
        if let Err(e) = self.store.start_cell(&self.run_id, &c.cell_id, agent_id) {
            self.ui
                .line(format!("warning: storing cell start failed: {e}"));
        }
        let cell = &mut self.cells[idx];
        cell.state = CellState::Running;
        cell.agent = Some(agent_id.to_string());
        cell.bar = Some(
            self.ui
                .bar(&format!("{} @ {agent_id}", cell.planned.cell_id)),
        );
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
        cell.state = state;
        let text = match state {
            CellState::Succeeded => "succeeded".to_string(),
            _ => format!("{}: {}", state.as_str(), error),
        };
        if let Some(bar) = cell.bar.take() {
            bar.abandon_with_message(text.clone());
        }
        self.ui
            .line(format!("cell {} {text}", cell.planned.cell_id));
    }

    /// Leases and registration deadlines.
    fn check_time(&mut self) {
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
            self.lose(&id, why);
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

    fn lose(&mut self, id: &str, why: String) {
        let Some(a) = self.agents.get_mut(id) else {
            return;
        };
        a.state = AgentState::Lost;
        a.tx = None;
        a.why_lost = why.clone();
        let cell = a.cell.take();
        if let Err(e) = self.store.agent_lost(&self.run_id, id) {
            self.ui
                .line(format!("warning: storing agent loss failed: {e}"));
        }
        self.ui.line(format!("agent {id} lost: {why}"));
        if let Some(idx) = cell
            && !self.cells[idx].state.is_terminal()
        {
            self.fail_cell(idx, &format!("agent {id} lost: {why}"));
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
                CellState::Running => {
                    let cell_id = self.cells[idx].planned.cell_id.clone();
                    if let Some(a) = self.cells[idx]
                        .agent
                        .as_ref()
                        .and_then(|id| self.agents.get(id))
                        && let Some(tx) = &a.tx
                    {
                        let _ = tx
                            .send(Ok(cmsg(CMsg::Cancel(Cancel {
                                cell_id,
                                reason: "run cancelled".into(),
                            }))))
                            .await;
                    }
                }
                _ => {}
            }
        }
    }

    fn cell_mut(&mut self, id: &str) -> Option<&mut CellSlot> {
        self.cells.iter_mut().find(|c| c.planned.cell_id == id)
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
}

impl Ui {
    fn new() -> Self {
        let tty = std::io::stderr().is_terminal();
        Ui {
            multi: tty.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
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
