//! The hub: where every agent session's events go first. It knows each
//! joined agent (its registration, connection and sender) and which run
//! holds it, and routes the agent's events to that run's scheduler. An agent
//! no run holds is idle: it waits in the pool (`pgfleet serve`'s static
//! agents) until a run claims agents of its class.
//!
//! A run gets its agents in one of two ways:
//! - `expect`: a source launched them for the run (local child processes, a
//!   Kubernetes pod); their registrations go straight to the run.
//! - `claim`: idle agents of the classes the run needs are taken from the
//!   pool and handed to the run as registered.
//!
//! `release` gives them back (or, for launched agents, tells them to shut
//! down). Runs are independent: each has its own scheduler; the hub is the
//! only shared state, behind one short lock that is never held across an
//! await.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::controller_message::Msg as CMsg;
use pgfleet_proto::v1::{ControllerMessage, Register, ResultAck, Shutdown};

use crate::events::{Event, ToAgent};

/// One agent that joined.
struct Joined {
    info: Register,
    conn: u64,
    tx: Option<ToAgent>,
    /// The run that holds it.
    run: Option<String>,
}

#[derive(Default)]
struct State {
    agents: BTreeMap<String, Joined>,
    /// Each running run's scheduler.
    runs: HashMap<String, mpsc::Sender<Event>>,
    /// Agents a source launched for a run, by id, before they register.
    expected: HashMap<String, String>,
}

/// An agent that joined the controller, as the API lists it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct AgentView {
    pub agent_id: String,
    pub instance_class: String,
    pub connected: bool,
    /// The run that holds it; none: idle in the pool.
    pub run_id: Option<String>,
    pub hostname: String,
    pub postgres_version: String,
    pub storage_profile: String,
    /// Where the agent serves its own /metrics ("host:port"); empty: nowhere.
    pub metrics_address: String,
}

#[derive(Clone)]
pub struct Hub {
    state: Arc<Mutex<State>>,
    /// Whether agents no run expects may join the pool (`serve`) or are
    /// refused (`run`: only the agents it launched).
    pool: bool,
}

/// A class a run needs more agents of than are idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub class: String,
    pub needed: usize,
    pub idle: Vec<String>,
    pub busy: Vec<String>,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "instance class `{}` needs {} agent(s); {} idle",
            self.class,
            self.needed,
            self.idle.len()
        )?;
        if !self.idle.is_empty() {
            write!(f, " ({})", self.idle.join(", "))?;
        }
        if !self.busy.is_empty() {
            write!(
                f,
                ", {} busy in other runs ({})",
                self.busy.len(),
                self.busy.join(", ")
            )?;
        }
        write!(
            f,
            ": start more with `pgfleet-agent run --controller URL --class {} --token-file FILE`",
            self.class
        )
    }
}

fn cmsg(m: CMsg) -> ControllerMessage {
    ControllerMessage { msg: Some(m) }
}

impl Hub {
    pub fn new(pool: bool) -> Hub {
        Hub {
            state: Arc::new(Mutex::new(State::default())),
            pool,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Routes one event from an agent session (or an agent source).
    pub async fn route(&self, ev: Event) {
        enum Then {
            Forward(mpsc::Sender<Event>, Event),
            Send(ToAgent, ControllerMessage),
            Nothing,
        }
        let then = {
            let mut st = self.lock();
            match ev {
                Event::Registered { info, conn, tx } => {
                    let id = info.agent_id.clone();
                    let run = st
                        .expected
                        .get(&id)
                        .cloned()
                        .or_else(|| st.agents.get(&id).and_then(|a| a.run.clone()));
                    let target = run.as_ref().and_then(|r| st.runs.get(r).cloned());
                    if run.is_none() && !self.pool {
                        let known: Vec<&str> = st.expected.keys().map(String::as_str).collect();
                        let mut known = known;
                        known.sort();
                        eprintln!(
                            "refused agent {id}: not one this run launched ({})",
                            known.join(", ")
                        );
                        Then::Send(
                            tx,
                            cmsg(CMsg::Shutdown(Shutdown {
                                reason: format!(
                                    "unknown agent `{id}`: this run expects {}",
                                    known.join(", ")
                                ),
                                refused: true,
                            })),
                        )
                    } else {
                        if run.is_none() {
                            tracing::info!(agent = %id, class = %info.instance_class, "agent joined the pool");
                        }
                        // A live session under this id: a second agent took
                        // it (a reconnecting agent's old session is gone or
                        // half-open, and the message then reaches no one).
                        // The first is told to stop, as refused, instead of
                        // the two replacing each other in turn for ever.
                        if let Some(old) = st.agents.get(&id)
                            && let Some(old_tx) = &old.tx
                            && !old_tx.is_closed()
                        {
                            tracing::warn!(agent = %id, host = %info.hostname, earlier_host = %old.info.hostname,
                                "a second agent joined under an id whose session is live: the earlier one is told to stop");
                            old_tx.send(cmsg(CMsg::Shutdown(Shutdown {
                                reason: format!(
                                    "another agent joined as `{id}` (host {}): agent ids must be unique; start this one with another --agent-id",
                                    info.hostname
                                ),
                                refused: true,
                            })));
                        }
                        st.agents.insert(
                            id,
                            Joined {
                                info: info.clone(),
                                conn,
                                tx: Some(tx.clone()),
                                run,
                            },
                        );
                        match target {
                            Some(s) => Then::Forward(s, Event::Registered { info, conn, tx }),
                            None => Then::Nothing,
                        }
                    }
                }
                Event::Message {
                    agent_id,
                    conn,
                    msg,
                    received,
                } => match st.agents.get(&agent_id) {
                    Some(a) if a.conn == conn => {
                        match a.run.as_ref().map(|r| st.runs.get(r)) {
                            // Held by a run that is not taking events.
                            Some(None) => Then::Nothing,
                            Some(Some(s)) => Then::Forward(
                                s.clone(),
                                Event::Message {
                                    agent_id,
                                    conn,
                                    msg,
                                    received,
                                },
                            ),
                            // An idle agent replaying a result of a run that
                            // ended: nothing will take it, so let it go.
                            None => match (msg, &a.tx) {
                                (Msg::Result(r), Some(tx)) => Then::Send(
                                    tx.clone(),
                                    cmsg(CMsg::ResultAck(ResultAck { cell_id: r.cell_id })),
                                ),
                                _ => Then::Nothing,
                            },
                        }
                    }
                    _ => Then::Nothing,
                },
                Event::Disconnected { agent_id, conn } => {
                    let run = match st.agents.get_mut(&agent_id) {
                        Some(a) if a.conn == conn => {
                            a.tx = None;
                            a.run.clone()
                        }
                        _ => None,
                    };
                    match run.as_ref().and_then(|r| st.runs.get(r)) {
                        Some(s) => Then::Forward(s.clone(), Event::Disconnected { agent_id, conn }),
                        None => {
                            // An idle agent that went away leaves the pool;
                            // it joins again when it reconnects.
                            if run.is_none()
                                && st.agents.get(&agent_id).is_some_and(|a| a.conn == conn)
                            {
                                st.agents.remove(&agent_id);
                            }
                            Then::Nothing
                        }
                    }
                }
                Event::Gone { agent_id, why } => {
                    match st.expected.get(&agent_id).and_then(|r| st.runs.get(r)) {
                        Some(s) => Then::Forward(s.clone(), Event::Gone { agent_id, why }),
                        None => Then::Nothing,
                    }
                }
            }
        };
        match then {
            Then::Forward(s, ev) => {
                let _ = s.send(ev).await;
            }
            Then::Send(tx, m) => {
                tx.send(m);
            }
            Then::Nothing => {}
        }
    }

    /// A source launched these agents for `run`: route them to `sched`.
    pub fn expect(&self, run: &str, agents: &[String], sched: mpsc::Sender<Event>) {
        let mut st = self.lock();
        st.runs.insert(run.to_string(), sched);
        for a in agents {
            st.expected.insert(a.clone(), run.to_string());
        }
    }

    /// Takes idle agents for `run`: `needs` is how many of each class. All
    /// or nothing; the claimed agents are handed to `sched` as registered.
    /// Returns agent id and class of each.
    pub async fn claim(
        &self,
        run: &str,
        needs: &BTreeMap<String, usize>,
        sched: mpsc::Sender<Event>,
    ) -> Result<Vec<(String, String)>, Vec<Shortfall>> {
        let picked: Vec<(String, String, Register, u64, ToAgent)> = {
            let mut st = self.lock();
            let mut picked = Vec::new();
            let mut short = Vec::new();
            for (class, &n) in needs {
                let of_class = || {
                    st.agents
                        .iter()
                        .filter(move |(_, a)| a.info.instance_class == *class && a.tx.is_some())
                };
                let idle: Vec<String> = of_class()
                    .filter(|(_, a)| a.run.is_none())
                    .map(|(id, _)| id.clone())
                    .collect();
                if idle.len() < n {
                    short.push(Shortfall {
                        class: class.clone(),
                        needed: n,
                        busy: of_class()
                            .filter(|(_, a)| a.run.is_some())
                            .map(|(id, _)| id.clone())
                            .collect(),
                        idle,
                    });
                    continue;
                }
                picked.extend(idle.into_iter().take(n));
            }
            if !short.is_empty() {
                return Err(short);
            }
            st.runs.insert(run.to_string(), sched.clone());
            picked
                .into_iter()
                .filter_map(|id| {
                    let a = st.agents.get_mut(&id)?;
                    a.run = Some(run.to_string());
                    Some((
                        id,
                        a.info.instance_class.clone(),
                        a.info.clone(),
                        a.conn,
                        a.tx.clone()?,
                    ))
                })
                .collect()
        };
        let mut out = Vec::new();
        for (id, class, info, conn, tx) in picked {
            let _ = sched.send(Event::Registered { info, conn, tx }).await;
            out.push((id, class));
        }
        Ok(out)
    }

    /// Binds agents (by id) to `run` whether or not they have connected: a
    /// resumed run waits for the agents it had before the controller
    /// restarted; their registrations go to it. Call it before agents can
    /// connect.
    pub fn adopt(&self, run: &str, agents: &[String], sched: mpsc::Sender<Event>) {
        let mut st = self.lock();
        st.runs.insert(run.to_string(), sched);
        for a in agents {
            st.expected.insert(a.clone(), run.to_string());
            if let Some(j) = st.agents.get_mut(a) {
                j.run = Some(run.to_string());
            }
        }
    }

    /// The run ended. Its agents go back to the pool, or, with `shutdown`
    /// (agents launched for it), are told to exit.
    pub async fn release(&self, run: &str, shutdown: bool) {
        let txs: Vec<ToAgent> = {
            let mut st = self.lock();
            st.runs.remove(run);
            st.expected.retain(|_, r| r != run);
            let mine: Vec<String> = st
                .agents
                .iter()
                .filter(|(_, a)| a.run.as_deref() == Some(run))
                .map(|(id, _)| id.clone())
                .collect();
            let mut txs = Vec::new();
            for id in mine {
                if shutdown {
                    if let Some(a) = st.agents.remove(&id)
                        && let Some(tx) = a.tx
                    {
                        txs.push(tx);
                    }
                } else if let Some(a) = st.agents.get_mut(&id) {
                    a.run = None;
                    if a.tx.is_none() {
                        st.agents.remove(&id);
                    }
                }
            }
            txs
        };
        for tx in txs {
            tx.send(cmsg(CMsg::Shutdown(Shutdown {
                reason: "run finished".into(),
                refused: false,
            })));
        }
    }

    /// Every joined agent.
    pub fn agents(&self) -> Vec<AgentView> {
        self.lock()
            .agents
            .iter()
            .map(|(id, a)| AgentView {
                agent_id: id.clone(),
                instance_class: a.info.instance_class.clone(),
                connected: a.tx.is_some(),
                run_id: a.run.clone(),
                hostname: a.info.hostname.clone(),
                postgres_version: a.info.postgres_version.clone(),
                storage_profile: a
                    .info
                    .storage
                    .as_ref()
                    .map(|s| s.profile.clone())
                    .unwrap_or_default(),
                metrics_address: a.info.metrics_address.clone(),
            })
            .collect()
    }
}
