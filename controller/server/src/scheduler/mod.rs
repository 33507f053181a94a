//! A run's scheduler: the task that feeds its core (`pgfleet-schedule`, the state
//! machine of cells, roles and agents: gang assignment, rendezvous relay,
//! leases, cancel, one stored outcome per cell) with what agents' sessions
//! and the clock say, and carries out the effects the core returns — to
//! agents, to the store and its sample writer (`writer.rs`), and to the
//! observers: progress display (`ui.rs`), metrics, the run's event stream
//! and traces.
//!
//! It does not know where agents come from: it is told which agent ids to
//! expect.

mod ui;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde_json::Value as Json;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use pgfleet_proto::v1::ControllerMessage;
use pgfleet_proto::v1::controller_message::Msg as CMsg;

use crate::events::{Event, ToAgent};
use crate::metrics::RunLabels;
use crate::writer::Write;
use pgfleet_scenario::PlannedCell;
use pgfleet_store::{CellState, Entry, RunStatus, Store};

use self::ui::Ui;
pub use pgfleet_schedule::{Core, Effect, Input, Observed, Timing};

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
    /// The scenario's `oversubscribe`: start cells even when the emulated
    /// instances running at once on a host ask for more than it has.
    pub oversubscribe: bool,
    /// Classes naming a PostgreSQL version: an agent of one running
    /// another major is refused at registration.
    pub postgres_versions: std::collections::BTreeMap<String, u32>,
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
            oversubscribe: false,
            postgres_versions: Default::default(),
        }
    }
}

pub struct Scheduler {
    run_id: String,
    store: Store,
    opts: Options,
    core: Core,
    /// Each connected agent's current connection.
    conns: HashMap<String, (u64, ToAgent)>,
    /// Running cells' progress bars and trace spans (children of the run's;
    /// their agents' spans are children of them).
    bars: HashMap<usize, ProgressBar>,
    spans: HashMap<usize, tracing::Span>,
    ui: Ui,
    /// How long agents' messages waited between arriving and being
    /// handled, in microseconds: a slow step shows here before it turns a
    /// heartbeat into a false loss.
    delays: hdrhistogram::Histogram<u64>,
    /// To the run's sample writer: samples, batched a transaction each off
    /// this task so a burst never holds up another agent's heartbeat, and
    /// the acknowledgements sent once what came before them is committed.
    writes: mpsc::UnboundedSender<Write>,
    sample_writer: tokio::task::JoinHandle<()>,
    /// The writer's word on each cell end it was given: stored or not.
    stored: Option<mpsc::UnboundedReceiver<(String, bool)>>,
    /// Cell ends handed to the writer: what follows once stored, and
    /// whether agents replay the outcome when it is not.
    pending: HashMap<String, (Vec<Effect>, bool)>,
    /// The run's trace span (set when `run` starts).
    run_span: tracing::Span,
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
        let timing = Timing {
            lease: opts.lease,
            registration_timeout: opts.registration_timeout,
            cancel_grace: opts.cancel_grace,
        };
        let ui = Ui::new(opts.interactive);
        let (writes, rx) = mpsc::unbounded_channel();
        let (stored_tx, stored) = mpsc::unbounded_channel();
        let sample_writer = crate::writer::spawn(run_id.to_string(), store.clone(), rx, stored_tx);
        let mut core = Core::new(timing, cells, expected, Instant::now());
        core.oversubscribe = opts.oversubscribe;
        core.postgres_versions = opts.postgres_versions.clone();
        Scheduler {
            run_id: run_id.to_string(),
            store,
            opts,
            core,
            conns: HashMap::new(),
            bars: HashMap::new(),
            spans: HashMap::new(),
            ui,
            delays: hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"),
            writes,
            sample_writer,
            stored: Some(stored),
            pending: HashMap::new(),
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
        stored: &[pgfleet_store::CellRow],
        agents: &[pgfleet_store::AgentRow],
    ) -> Self {
        let expected: Vec<(String, String)> = agents
            .iter()
            .filter(|a| a.lost_at.is_none())
            .map(|a| (a.agent_id.clone(), a.instance_class.clone()))
            .collect();
        // Agents replay what this controller had not acknowledged.
        let seqs = store.last_sample_seqs(run_id).unwrap_or_default();
        let mut me = Scheduler::new(run_id, store, opts, cells, &expected);
        let rows: Vec<(String, CellState, String)> = stored
            .iter()
            .map(|row| {
                let state = match row.state.as_str() {
                    "succeeded" => CellState::Succeeded,
                    "failed" => CellState::Failed,
                    "cancelled" => CellState::Cancelled,
                    "running" => CellState::Running,
                    _ => CellState::Pending,
                };
                (
                    row.cell_id.clone(),
                    state,
                    row.agent_id.clone().unwrap_or_default(),
                )
            })
            .collect();
        for cell_id in me.core.resume(&rows, seqs, Instant::now()) {
            let _ = me.store.requeue_cell(run_id, &cell_id);
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
            cells = self.core.cells.len(),
        );
        self.cell_gauges();
        let mut stored = self.stored.take().expect("run once");
        // Assign what can be assigned, fail what never can.
        self.step(Input::Tick, None);
        // Until every cell has ended and its end is stored.
        while !self.core.done() || !self.pending.is_empty() {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.handle(ev),
                    None => break,
                },
                Some((cell_id, ok)) = stored.recv() => self.stored(cell_id, ok),
                _ = tick.tick() => {
                    self.step(Input::Tick, None);
                    if let Some(left) = self.eta() {
                        self.ui.overall(self.core.cells_done(), self.core.cells.len(), left);
                    }
                }
                _ = cancel.cancelled(), if self.core.cancelled.is_none() => {
                    self.step(Input::Cancel, None);
                }
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
        drop(self.writes);
        let _ = self.sample_writer.await;
        // The agents go back to whoever gave them (`Hub::release`).
        if self.core.cancelled.is_some() {
            RunStatus::Cancelled
        } else if self
            .core
            .cells
            .iter()
            .all(|c| c.state == CellState::Succeeded)
        {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        }
    }

    /// An event from the hub becomes the core's input.
    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Registered { info, conn, tx } => {
                let id = info.agent_id.clone();
                let effects = self
                    .core
                    .apply(Input::Registered { info, conn }, Instant::now());
                if self
                    .core
                    .agents
                    .get(&id)
                    .is_some_and(|a| a.connected && a.conn == conn)
                {
                    self.conns.insert(id, (conn, tx.clone()));
                }
                self.dispatch(effects, Some(&tx));
            }
            Event::Message {
                agent_id,
                conn,
                msg,
                received,
            } => self.step(
                Input::Message {
                    agent_id,
                    conn,
                    msg,
                    received,
                },
                None,
            ),
            Event::Disconnected { agent_id, conn } => {
                if self.conns.get(&agent_id).is_some_and(|(c, _)| *c == conn) {
                    self.conns.remove(&agent_id);
                }
                self.step(Input::Disconnected { agent_id, conn }, None);
            }
            Event::Gone { agent_id, why } => self.step(Input::Gone { agent_id, why }, None),
        }
    }

    fn step(&mut self, input: Input, registering: Option<&ToAgent>) {
        let effects = self.core.apply(input, Instant::now());
        self.dispatch(effects, registering);
    }

    /// Carries out effects in order; what they feed back (a send that
    /// failed, a cell's end that could not be stored) goes to the core, and
    /// its effects are carried out too.
    fn dispatch(&mut self, effects: Vec<Effect>, registering: Option<&ToAgent>) {
        let mut queue: VecDeque<Effect> = effects.into();
        while let Some(e) = queue.pop_front() {
            let back = match e {
                Effect::Send { agent_id, msg } => self.send(&agent_id, msg),
                Effect::Refuse { reason } => {
                    if let Some(tx) = registering {
                        tx.send(cmsg(pgfleet_schedule::refusal(reason)));
                    }
                    None
                }
                Effect::Start { cell, assigns } => self.start(cell, assigns),
                Effect::Store(entry) => {
                    let _ = self.writes.send(Write::Store(entry));
                    None
                }
                Effect::FinishCell {
                    end,
                    replayable,
                    then,
                } => {
                    self.result_metrics(&end);
                    // Stored by the writer with what came before it; `then`
                    // waits for its word (`stored`).
                    self.pending.insert(end.cell_id.clone(), (then, replayable));
                    let _ = self.writes.send(Write::Store(Entry::End(end)));
                    None
                }
                Effect::Sample(s) => {
                    let _ = self.writes.send(Write::Store(Entry::Sample(s)));
                    None
                }
                Effect::AckAfterCommit { agent_id, msg } => {
                    if let Some((_, tx)) = self.conns.get(&agent_id) {
                        let _ = self.writes.send(Write::Ack {
                            agent_id,
                            tx: tx.clone(),
                            msg: cmsg(msg),
                        });
                    }
                    None
                }
                Effect::Observe(o) => {
                    self.observe(o);
                    None
                }
            };
            if let Some(input) = back {
                queue.extend(self.core.apply(input, Instant::now()));
            }
        }
    }

    /// The writer stored a cell's end, or could not.
    fn stored(&mut self, cell_id: String, ok: bool) {
        let Some((then, replayable)) = self.pending.remove(&cell_id) else {
            return;
        };
        if ok {
            self.dispatch(then, None);
        } else if replayable {
            self.ui.line(format!(
                "error: storing the result of {cell_id} failed; the agents replay it"
            ));
            self.step(Input::CellNotStored { cell_id }, None);
        } else {
            self.ui
                .line(format!("warning: storing the end of cell {cell_id} failed"));
            self.dispatch(then, None);
        }
    }

    /// To an agent's current connection; a failed send ends it.
    fn send(&mut self, agent_id: &str, msg: CMsg) -> Option<Input> {
        let (conn, tx) = self.conns.get(agent_id)?;
        if tx.send(cmsg(msg)) {
            return None;
        }
        let conn = *conn;
        self.conns.remove(agent_id);
        Some(Input::Disconnected {
            agent_id: agent_id.to_string(),
            conn,
        })
    }

    /// A cell starts: its trace span, its bar, its assignments.
    fn start(
        &mut self,
        idx: usize,
        assigns: Vec<(String, pgfleet_proto::v1::Assign)>,
    ) -> Option<Input> {
        let cell = &self.core.cells[idx];
        let profile = assigns
            .first()
            .and_then(|(a, _)| self.core.agents.get(a))
            .map(|a| a.profile.clone())
            .unwrap_or_default();
        let agents: Vec<&str> = assigns.iter().map(|(a, _)| a.as_str()).collect();
        let span = tracing::info_span!(
            target: "pgfleet",
            parent: &self.run_span,
            "cell",
            cell_id = %cell.planned.cell_id,
            workload = %cell.planned.workload().name(),
            instance_class = %cell.planned.instance_class,
            storage_profile = %profile,
            scenario = %self.opts.scenario,
            agents = %agents.join(", "),
            state = tracing::field::Empty,
        );
        let traceparent = pgfleet_proto::telemetry::traceparent(&span);
        self.spans.insert(idx, span);
        let bar = self
            .ui
            .bar(&format!("{} @ {}", cell.planned.cell_id, cell.agents));
        self.bars.insert(idx, bar);
        let mut back = None;
        for (agent, mut assign) in assigns {
            assign.traceparent = traceparent.clone();
            assign.run_id = self.run_id.clone();
            // A send that fails leaves the role without an answer; its agent
            // re-registers without the cell, which fails or re-queues it.
            if let Some(b) = self.send(&agent, CMsg::Assign(assign)) {
                back = Some(b);
            }
        }
        back
    }

    /// What observers see: the progress display, metrics, the run's event
    /// stream, traces.
    fn observe(&mut self, o: Observed) {
        let metrics = self.opts.metrics.clone();
        match o {
            Observed::MessageWaited(waited) => {
                let _ = self.delays.record((waited.as_micros() as u64).max(1));
                if let Some(m) = &metrics {
                    m.message_wait.observe(waited.as_secs_f64());
                }
            }
            Observed::AgentRegistered {
                agent_id,
                class,
                first,
                postgres_version,
            } => self.agent_registered(agent_id, class, first, postgres_version),
            Observed::AgentRefused { agent_id, reason } => {
                self.ui.line(format!("refused agent {agent_id}: {reason}"));
            }
            Observed::AgentLost { agent_id, why } => {
                if let (Some(m), Some(a)) = (&metrics, self.core.agents.get(&agent_id)) {
                    m.agent_losses.with_label_values(&[a.class.as_str()]).inc();
                }
                self.ui.line(format!("agent {agent_id} lost: {why}"));
                self.publish(RunEvent::Agent {
                    agent_id,
                    state: "lost".into(),
                    detail: why,
                });
            }
            Observed::Progress {
                agent_id: _,
                cell_id,
                phase,
                message,
                done,
                total,
            } => self.progress(cell_id, phase, message, done, total),
            Observed::Sample {
                agent_id,
                cell,
                kind,
                data,
            } => {
                if matches!(
                    kind.as_str(),
                    "pg_stat" | "live" | "vacuum" | "lag" | "repeat"
                ) {
                    self.sample_metrics(&agent_id, cell, &kind, &data);
                }
            }
            Observed::CellChanged { cell, error } => self.publish_cell(cell, error.as_deref()),
            Observed::CellRequeued { cell } => {
                if let Some(bar) = self.bars.remove(&cell) {
                    bar.abandon_with_message("assignment lost with the connection; reassigning");
                }
            }
            Observed::CellEnded {
                cell,
                state,
                error,
                seconds,
            } => self.cell_ended(cell, state, error, seconds),
            Observed::Cancelling => self.ui.line(
                "cancelling: pending cells are dropped, running cells are asked to stop"
                    .to_string(),
            ),
        }
    }

    /// An agent registered, or reconnected.
    fn agent_registered(
        &mut self,
        agent_id: String,
        class: String,
        first: bool,
        postgres_version: String,
    ) {
        let metrics = self.opts.metrics.clone();
        self.publish(RunEvent::Agent {
            agent_id: agent_id.clone(),
            state: if first { "registered" } else { "reconnected" }.into(),
            detail: format!("class {class}, PostgreSQL {postgres_version}"),
        });
        if let Some(m) = &metrics {
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
                "agent {agent_id} registered (class {class}, PostgreSQL {postgres_version})"
            ));
        } else {
            self.ui.line(format!("agent {agent_id} reconnected"));
        }
    }

    /// A cell's progress: its phase series, its bar, the event stream.
    fn progress(&mut self, cell_id: String, phase: String, message: String, done: u64, total: u64) {
        let metrics = self.opts.metrics.clone();
        let idx = self.core.cell_index(&cell_id);
        if let (Some(m), Some(idx)) = (&metrics, idx) {
            let c = &self.core.cells[idx];
            m.cell_phase(
                [
                    self.opts.scenario.as_str(),
                    self.run_id.as_str(),
                    c.planned.instance_class.as_str(),
                    c.planned.workload().name(),
                ],
                &cell_id,
                &phase,
            );
        }
        if let Some(bar) = idx.and_then(|i| self.bars.get(&i)) {
            if total > 0 {
                bar.set_length(total);
                bar.set_position(done);
            }
            bar.set_message(
                pgfleet_proto::escape::terminal_line(&format!("{phase}: {message}")).into_owned(),
            );
        }
        self.publish(RunEvent::Progress {
            cell_id,
            phase,
            message,
            done,
            total,
        });
    }

    /// A cell ended: its duration, its bar, its span, the progress line.
    fn cell_ended(&mut self, cell: usize, state: CellState, error: String, seconds: Option<f64>) {
        let metrics = self.opts.metrics.clone();
        let c = &self.core.cells[cell];
        if let (Some(m), Some(secs)) = (&metrics, seconds) {
            m.cell_seconds
                .with_label_values(&[
                    c.planned.instance_class.as_str(),
                    c.planned.workload().name(),
                    state.as_str(),
                ])
                .observe(secs);
        }
        let text = match state {
            CellState::Succeeded => "succeeded".to_string(),
            _ => format!("{}: {}", state.as_str(), error),
        };
        if let Some(bar) = self.bars.remove(&cell) {
            bar.abandon_with_message(text.clone());
        }
        // The cell's span ends.
        if let Some(span) = self.spans.remove(&cell) {
            span.record("state", state.as_str());
            if let Some(m) = &metrics {
                m.cell_ended(&self.run_id, &c.planned.cell_id);
            }
        }
        self.ui.line(format!("cell {} {text}", c.planned.cell_id));
        if let Some(left) = self.eta() {
            self.ui.progress_line(format!(
                "{}/{} cells done; about {} left (estimated)",
                self.core.cells_done(),
                self.core.cells.len(),
                pgfleet_proto::workload::approx_seconds(left.as_secs_f64())
            ));
        }
    }

    fn eta(&self) -> Option<Duration> {
        self.core.eta(self.opts.estimated_wall?, Instant::now())
    }

    /// A cell's series labels: its run, class, `agent_id`'s storage
    /// profile, its workload and `agent_id`'s PostgreSQL major version.
    fn series_labels(&self, idx: usize, agent_id: Option<&str>) -> RunLabels<'_> {
        let cell = &self.core.cells[idx];
        let agent = agent_id.and_then(|a| self.core.agents.get(a));
        [
            self.opts.scenario.as_str(),
            self.run_id.as_str(),
            cell.planned.instance_class.as_str(),
            agent.map(|a| a.profile.as_str()).unwrap_or(""),
            cell.planned.workload().name(),
            agent.map(|a| a.postgres_major.as_str()).unwrap_or(""),
        ]
    }

    /// A cell's sample into the metrics, labelled with the sending agent's
    /// storage profile.
    fn sample_metrics(&self, agent_id: &str, idx: usize, kind: &str, data: &Json) {
        let Some(m) = &self.opts.metrics else {
            return;
        };
        let labels = self.series_labels(idx, Some(agent_id));
        match kind {
            "live" => m.live_second(labels, data),
            "pg_stat" => m.pg_stat(labels, data),
            _ => m.progress_sample(labels, kind, data),
        }
    }

    /// A succeeded cell's figures into the metrics, labelled as its
    /// samples are (the lead role's agent's storage profile).
    fn result_metrics(&self, end: &pgfleet_store::CellEnd) {
        let Some(m) = &self.opts.metrics else {
            return;
        };
        let Some(idx) = self.core.cell_index(&end.cell_id) else {
            return;
        };
        if end.state != CellState::Succeeded {
            return;
        }
        let lead = self.core.cells[idx].roles.first().map(|r| r.agent.as_str());
        let planned = &self.core.cells[idx].planned;
        let entry = pgfleet_scenario::plan::entry_of(&planned.cell_id).unwrap_or(0);
        m.cell_result(
            self.series_labels(idx, lead),
            entry,
            planned.workload(),
            &end.points,
        );
    }

    /// The run's cells by class, workload and state, into the metrics.
    fn cell_gauges(&self) {
        let Some(m) = &self.opts.metrics else {
            return;
        };
        let mut counts: std::collections::BTreeMap<(&str, &str), [i64; 5]> = Default::default();
        for c in &self.core.cells {
            let i = match c.state {
                CellState::Pending => 0,
                CellState::Running => 1,
                CellState::Succeeded => 2,
                CellState::Failed => 3,
                CellState::Cancelled => 4,
            };
            counts
                .entry((
                    c.planned.instance_class.as_str(),
                    c.planned.workload().name(),
                ))
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
        let cell = &self.core.cells[idx];
        self.publish(RunEvent::Cell {
            cell_id: cell.planned.cell_id.clone(),
            state: cell.state.as_str().into(),
            agents: cell.agents.clone(),
            error: error.filter(|e| !e.is_empty()).map(str::to_string),
            done: self.core.cells_done(),
            total: self.core.cells.len(),
        });
    }
}

fn cmsg(m: CMsg) -> ControllerMessage {
    ControllerMessage { msg: Some(m) }
}
