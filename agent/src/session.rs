//! The agent's session with the controller: dial, register, heartbeat, run
//! assigned cells, forward their events, and reconnect (re-registering with
//! the cells still running and replaying results not yet acknowledged).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tracing::Instrument;

use crate::cell::{self, AgentEnv};
use crate::metrics::AgentMetrics;
use crate::{Error, Result, host};
use pgfleet_proto::v1::{
    AgentMessage, CellResult, CellStatus, ControllerMessage, Endpoint, Heartbeat, Register,
    RoleReady, StorageProfile, agent_message::Msg, agent_session_client::AgentSessionClient,
    controller_message::Msg as CMsg,
};

#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// e.g. `http://127.0.0.1:7070`
    pub controller: String,
    pub agent_id: String,
    pub instance_class: String,
    /// Give up (tear down, exit non-zero) when the controller has been
    /// unreachable this long.
    pub give_up_after: Duration,
    /// The join token, sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// PEM CA certificate(s) to trust for an `https://` controller.
    pub ca: Option<Vec<u8>>,
    /// This agent's own metrics, and where they are served ("" = nowhere).
    pub metrics: Arc<AgentMetrics>,
    pub metrics_address: String,
}

struct Running {
    cancel: CancellationToken,
    release: CancellationToken,
    peers: watch::Sender<BTreeMap<String, Endpoint>>,
    /// This role's endpoint once its cluster is up, sent again after a
    /// reconnect (the controller may have missed it).
    ready: Option<RoleReady>,
    task: JoinHandle<()>,
}

/// Why a connected session ended.
enum End {
    Reconnect(String),
    Shutdown,
    Refused(String),
}

/// How long the controller has to answer a registration.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(15);

/// The longest wait between two attempts to reach the controller.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A session that lasted this long was a real one: the backoff resets.
const STABLE_SESSION: Duration = Duration::from_secs(10);

/// `d` spread by ±25 %, so agents that lost the controller together do not
/// come back in step.
fn jittered(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    let unit = (h.finish() % 1000) as f64 / 1000.0;
    d.mul_f64(0.75 + unit * 0.5)
}

pub async fn run(
    cfg: SessionConfig,
    env: Arc<AgentEnv>,
    shutdown: CancellationToken,
) -> Result<()> {
    let (ev_tx, mut ev_rx) = mpsc::channel::<AgentMessage>(1024);
    let mut cells: HashMap<String, Running> = HashMap::new();
    let mut unacked: HashMap<String, CellResult> = HashMap::new();
    let mut samples = SampleBuffer::default();
    let mut last_ok = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        if shutdown.is_cancelled() {
            stop_cells(&mut cells, &mut ev_rx, None).await;
            return Ok(());
        }
        // One span per connection; the controller's side of the session is
        // its child (W3C trace context in the request's metadata).
        let span = tracing::info_span!(
            target: "pgfleet",
            "session",
            agent_id = %cfg.agent_id,
            instance_class = %cfg.instance_class,
            controller = %cfg.controller,
        );
        let connected = tokio::select! {
            c = connect(&cfg, &env, &cells, &unacked, &span) => c,
            _ = shutdown.cancelled() => continue,
        };
        let (out_tx, inbound, heartbeat) = match connected {
            Ok(c) => c,
            Err(e @ Error::Refused(_)) => {
                // Retrying with the same token or id cannot help.
                stop_cells(&mut cells, &mut ev_rx, None).await;
                return Err(e);
            }
            Err(e) => {
                if last_ok.elapsed() > cfg.give_up_after {
                    stop_cells(&mut cells, &mut ev_rx, None).await;
                    let hint = if cfg.controller.starts_with("http://") {
                        " (if the controller serves TLS, dial https:// with --ca)"
                    } else {
                        ""
                    };
                    return Err(Error::Session(format!(
                        "controller {} unreachable for {:?}: {e}{hint}",
                        cfg.controller, cfg.give_up_after
                    )));
                }
                tracing::debug!(error = %e, "connecting to the controller");
                tokio::time::sleep(jittered(backoff)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let registered_at = Instant::now();
        cfg.metrics.connected.set(1);
        cfg.metrics.sessions.inc();
        tracing::info!(controller = %cfg.controller, "registered");
        if !unacked.is_empty() {
            tracing::info!(
                results = unacked.len(),
                "replaying results the controller has not acknowledged"
            );
        }
        // Samples first: a cell's result closes it on the controller.
        let replayed = samples.unacked();
        if !replayed.is_empty() {
            tracing::info!(
                samples = replayed.len(),
                "replaying samples the controller has not acknowledged"
            );
        }
        for m in replayed {
            let _ = out_tx.send(m).await;
        }
        for r in unacked.values() {
            let _ = out_tx.send(msg(Msg::Result(r.clone()))).await;
        }
        for ready in cells.values().filter_map(|c| c.ready.clone()) {
            let _ = out_tx.send(msg(Msg::RoleReady(ready))).await;
        }
        let end = connected_loop(
            &env,
            &cfg.metrics,
            &out_tx,
            inbound,
            heartbeat,
            &ev_tx,
            &mut ev_rx,
            &mut cells,
            &mut unacked,
            &mut samples,
            &shutdown,
        )
        .instrument(span)
        .await;
        cfg.metrics.connected.set(0);
        last_ok = Instant::now();
        // A session that ended soon after it began does not reset the
        // backoff: the next attempt waits longer (with jitter), so agents
        // that keep losing their sessions do not hammer the controller.
        if registered_at.elapsed() >= STABLE_SESSION {
            backoff = Duration::from_millis(100);
        } else {
            tokio::time::sleep(jittered(backoff)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        match end {
            End::Shutdown => {
                stop_cells(&mut cells, &mut ev_rx, Some(&out_tx)).await;
                return Ok(());
            }
            End::Refused(why) => {
                stop_cells(&mut cells, &mut ev_rx, Some(&out_tx)).await;
                return Err(Error::Refused(format!(
                    "the controller {} refused this agent: {why}",
                    cfg.controller
                )));
            }
            End::Reconnect(why) => tracing::warn!(%why, "session lost; reconnecting"),
        }
    }
}

async fn connect(
    cfg: &SessionConfig,
    env: &AgentEnv,
    cells: &HashMap<String, Running>,
    unacked: &HashMap<String, CellResult>,
    span: &tracing::Span,
) -> Result<(
    mpsc::Sender<AgentMessage>,
    Streaming<ControllerMessage>,
    Duration,
)> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(cfg.controller.clone())
        .map_err(|e| Error::Refused(format!("controller URL `{}`: {e}", cfg.controller)))?
        .connect_timeout(Duration::from_secs(5))
        // A controller that went away without closing the connection (a
        // host lost, a half-open TCP session) is noticed within ~30 s.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    if cfg.controller.starts_with("https://") {
        let ca = cfg.ca.as_ref().ok_or_else(|| {
            Error::Refused(format!(
                "{} is TLS: give the CA certificate that signed its certificate with --ca FILE",
                cfg.controller
            ))
        })?;
        endpoint = endpoint
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )
            .map_err(|e| Error::Refused(format!("TLS configuration: {e}")))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Error::Session(format!("{e}: {}", source_chain(&e))))?;
    let mut client = AgentSessionClient::new(channel)
        .max_decoding_message_size(pgfleet_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(pgfleet_proto::MAX_MESSAGE_BYTES);
    let (out_tx, out_rx) = mpsc::channel(1024);
    let (pg_version, pg_dir) = match &env.pg {
        Ok(pg) => (pg.version.clone(), pg.dir.display().to_string()),
        Err(_) => (String::new(), String::new()),
    };
    let register = Register {
        agent_id: cfg.agent_id.clone(),
        instance_class: cfg.instance_class.clone(),
        storage: Some(StorageProfile {
            profile: env.storage_profile.clone(),
            emulated: env.emulated,
            data_root: env.data_root.display().to_string(),
            read_iops: env.caps.read_iops,
            write_iops: env.caps.write_iops,
            read_mbps: env.caps.read_mbps,
            write_mbps: env.caps.write_mbps,
            combined: env.caps.combined,
            read_latency_us: env.caps.latency.read_us,
            write_latency_us: env.caps.latency.write_us,
            flush_latency_us: env.caps.latency.flush_us,
        }),
        cores: host::cores(),
        memory_bytes: host::memory_bytes(),
        postgres_version: pg_version,
        postgres_bin_dir: pg_dir,
        hostname: host::hostname(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        // Running, or finished with the result not acknowledged yet (it is
        // replayed next): the controller re-queues any other cell it thinks
        // this agent has, as its assignment was lost.
        running_cells: cells.keys().chain(unacked.keys()).cloned().collect(),
        address: env.address.map(|a| a.to_string()).unwrap_or_default(),
        metrics_address: cfg.metrics_address.clone(),
        instance_cpus: env.instance.limits().1,
        instance_memory_bytes: env.instance.limits().0,
        dataset_store: match &env.remote {
            Some(remote) => remote.url.clone(),
            None => format!("{}:{}", host::hostname(), env.datasets.dir.display()),
        },
    };
    out_tx
        .send(msg(Msg::Register(register)))
        .await
        .map_err(|_| Error::Session("stream closed".into()))?;
    let mut request = tonic::Request::new(ReceiverStream::new(out_rx));
    if let Some(token) = &cfg.token {
        let value = format!("Bearer {token}").parse().map_err(|_| {
            Error::Refused("the join token has characters a header cannot carry".into())
        })?;
        request.metadata_mut().insert("authorization", value);
    }
    let traceparent = pgfleet_proto::telemetry::traceparent(span);
    if !traceparent.is_empty()
        && let Ok(v) = traceparent.parse()
    {
        request.metadata_mut().insert("traceparent", v);
    }
    // Registration is bounded: a controller that accepts the connection
    // and never answers (restarting, overloaded) is tried again.
    let registration = async {
        let inbound = client.session(request).await?;
        let mut inbound = inbound.into_inner();
        let first = inbound.message().await;
        Ok::<_, tonic::Status>((inbound, first))
    };
    let (inbound, first) = tokio::time::timeout(REGISTRATION_TIMEOUT, registration)
        .await
        .map_err(|_| {
            Error::Session(format!(
                "the controller did not answer the registration within {} s",
                REGISTRATION_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| match e.code() {
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                Error::Refused(format!(
                    "the controller {} refused this agent: {}",
                    cfg.controller,
                    e.message()
                ))
            }
            _ => Error::Session(e.message().to_string()),
        })?;
    match first {
        Ok(Some(ControllerMessage {
            msg: Some(CMsg::Registered(r)),
        })) => Ok((
            out_tx,
            inbound,
            Duration::from_millis(r.heartbeat_interval_ms.max(100) as u64),
        )),
        Ok(other) => Err(Error::Session(format!(
            "expected `registered`, got {other:?}"
        ))),
        Err(status) => Err(Error::Session(format!(
            "registration refused: {}",
            status.message()
        ))),
    }
}

#[allow(clippy::too_many_arguments)]
async fn connected_loop(
    env: &Arc<AgentEnv>,
    metrics: &AgentMetrics,
    out_tx: &mpsc::Sender<AgentMessage>,
    mut inbound: Streaming<ControllerMessage>,
    heartbeat: Duration,
    ev_tx: &mpsc::Sender<AgentMessage>,
    ev_rx: &mut mpsc::Receiver<AgentMessage>,
    cells: &mut HashMap<String, Running>,
    unacked: &mut HashMap<String, CellResult>,
    samples: &mut SampleBuffer,
    shutdown: &CancellationToken,
) -> End {
    let mut tick = tokio::time::interval(heartbeat);
    let mut seq = 0;
    loop {
        tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(ControllerMessage { msg: Some(m) })) => match m {
                    CMsg::Assign(a) => {
                        // Checked once; the cell runs the parameters checked here.
                        let checked = match (cells.keys().next(), crate::assign::check(&a)) {
                            (Some(busy), _) => Err(format!("agent busy with cell {busy}")),
                            (None, checked) => checked,
                        };
                        let params = match checked {
                            Ok(params) => params,
                            Err(why) => {
                            tracing::warn!(cell = %a.cell_id.chars().take(80).collect::<String>(), "{why}");
                            let mut r = failed(&a.cell_id, why);
                            r.role = a.role.clone();
                            unacked.insert(a.cell_id.clone(), r.clone());
                            metrics.cell_finished(CellStatus::Failed);
                            let _ = out_tx.send(msg(Msg::Result(r))).await;
                            continue;
                            }
                        };
                        tracing::info!(cell = %a.cell_id, workload = %a.workload, role = %a.role, "assigned");
                        let (peers, peers_rx) = watch::channel(BTreeMap::new());
                        let control = cell::Control {
                            cancel: CancellationToken::new(),
                            release: CancellationToken::new(),
                            peers: peers_rx,
                        };
                        let (cancel, release) = (control.cancel.clone(), control.release.clone());
                        let (env, ev, id) = (env.clone(), ev_tx.clone(), a.cell_id.clone());
                        let task = tokio::spawn(async move {
                            let r = cell::run(&env, a, params, ev.clone(), control).await;
                            let _ = ev.send(msg(Msg::Result(r))).await;
                        });
                        cells.insert(id, Running { cancel, release, peers, ready: None, task });
                        metrics.cells_running.set(cells.len() as i64);
                    }
                    CMsg::Cancel(c) => {
                        if let Some(r) = cells.get(&c.cell_id) {
                            if c.release {
                                tracing::info!(cell = %c.cell_id, reason = %c.reason, "released");
                                r.release.cancel();
                            } else {
                                tracing::info!(cell = %c.cell_id, reason = %c.reason, "cancel");
                                r.cancel.cancel();
                            }
                        }
                    }
                    CMsg::PeerReady(p) => {
                        if let (Some(r), Some(ep)) = (cells.get(&p.cell_id), p.endpoint) {
                            if let Err(why) = crate::assign::check_endpoint(&ep) {
                                tracing::warn!(cell = %p.cell_id, "refused a peer's endpoint: {why}");
                                continue;
                            }
                            tracing::info!(cell = %p.cell_id, role = %p.role, host = %ep.host, port = ep.port, "peer ready");
                            r.peers.send_modify(|m| {
                                m.insert(p.role, ep);
                            });
                        }
                    }
                    CMsg::ResultAck(a) => {
                        unacked.remove(&a.cell_id);
                        samples.forget_cell(&a.cell_id);
                        metrics.samples_unacked.set(samples.len() as i64);
                    }
                    CMsg::SampleAck(a) => {
                        samples.ack(&a.cell_id, a.seq);
                        metrics.samples_unacked.set(samples.len() as i64);
                    }
                    CMsg::Shutdown(s) if s.refused => {
                        tracing::error!(reason = %s.reason, "the controller refused this agent");
                        return End::Refused(s.reason);
                    }
                    CMsg::Shutdown(s) => {
                        tracing::info!(reason = %s.reason, "shutdown requested");
                        return End::Shutdown;
                    }
                    CMsg::Registered(_) => {}
                },
                Ok(Some(ControllerMessage { msg: None })) => {}
                Ok(None) => return End::Reconnect("controller closed the stream".into()),
                Err(s) => return End::Reconnect(s.message().to_string()),
            },
            _ = tick.tick() => {
                seq += 1;
                if out_tx.send(msg(Msg::Heartbeat(Heartbeat { seq }))).await.is_err() {
                    return End::Reconnect("outbound stream closed".into());
                }
            }
            Some(mut ev) = ev_rx.recv() => {
                if let Some(Msg::Sample(s)) = &mut ev.msg {
                    samples.number(s);
                    metrics.sample_sent(s);
                    samples.keep(ev.clone());
                    metrics.samples_unacked.set(samples.len() as i64);
                }
                if let Some(Msg::Result(r)) = &mut ev.msg {
                    fit_to_wire(r);
                }
                match &ev.msg {
                    Some(Msg::Result(r)) => {
                        cells.remove(&r.cell_id);
                        unacked.insert(r.cell_id.clone(), r.clone());
                        metrics.cells_running.set(cells.len() as i64);
                        metrics.cell_finished(r.status());
                    }
                    Some(Msg::RoleReady(rr)) => {
                        if let Some(c) = cells.get_mut(&rr.cell_id) {
                            c.ready = Some(rr.clone());
                        }
                    }
                    _ => {}
                }
                if out_tx.send(ev).await.is_err() {
                    return End::Reconnect("outbound stream closed".into());
                }
            }
            _ = shutdown.cancelled() => return End::Shutdown,
        }
    }
}

/// The samples sent and not yet acknowledged, per cell, in order: what a
/// reconnect replays so the controller's per-second series has no gap (it
/// keeps each number once, so no duplicate either).
#[derive(Default)]
pub struct SampleBuffer {
    next: HashMap<String, u64>,
    unacked: HashMap<String, std::collections::VecDeque<(u64, AgentMessage)>>,
}

/// A cell's unacknowledged samples are bounded (a controller that never
/// acknowledges must not grow the agent without limit): the oldest go.
const MAX_UNACKED_SAMPLES: usize = 100_000;

impl SampleBuffer {
    /// Gives `s` its cell's next number.
    pub fn number(&mut self, s: &mut pgfleet_proto::v1::CellSample) {
        let n = self.next.entry(s.cell_id.clone()).or_insert(0);
        *n += 1;
        s.seq = *n;
    }
    pub fn keep(&mut self, m: AgentMessage) {
        if let Some(Msg::Sample(s)) = &m.msg {
            let q = self.unacked.entry(s.cell_id.clone()).or_default();
            if q.len() >= MAX_UNACKED_SAMPLES {
                q.pop_front();
            }
            q.push_back((s.seq, m));
        }
    }
    /// Every sample of `cell` up to `seq` is kept by the controller.
    pub fn ack(&mut self, cell: &str, seq: u64) {
        if let Some(q) = self.unacked.get_mut(cell) {
            while q.front().is_some_and(|(n, _)| *n <= seq) {
                q.pop_front();
            }
        }
    }
    /// The cell is done on the controller's side.
    pub fn forget_cell(&mut self, cell: &str) {
        self.unacked.remove(cell);
        self.next.remove(cell);
    }
    /// How many samples are kept for replay.
    pub fn len(&self) -> usize {
        self.unacked.values().map(|q| q.len()).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What to send again, per cell in order.
    pub fn unacked(&self) -> Vec<AgentMessage> {
        self.unacked
            .values()
            .flat_map(|q| q.iter().map(|(_, m)| m.clone()))
            .collect()
    }
}

/// Cancels every running cell and waits (bounded) for them to tear down,
/// forwarding their last events when a stream is still open.
async fn stop_cells(
    cells: &mut HashMap<String, Running>,
    ev_rx: &mut mpsc::Receiver<AgentMessage>,
    out: Option<&mpsc::Sender<AgentMessage>>,
) {
    for r in cells.values() {
        r.cancel.cancel();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for (_, r) in cells.drain() {
        let mut task = r.task;
        loop {
            tokio::select! {
                _ = &mut task => break,
                Some(ev) = ev_rx.recv() => {
                    if let Some(out) = out {
                        let _ = out.send(ev).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    task.abort();
                    let _ = task.await;
                    break;
                }
            }
        }
    }
    while let Ok(ev) = ev_rx.try_recv() {
        if let Some(out) = out {
            let _ = out.send(ev).await;
        }
    }
}

fn failed(cell_id: &str, error: String) -> CellResult {
    let mut r = CellResult {
        cell_id: cell_id.to_string(),
        status: CellStatus::Failed as i32,
        error,
        points: Vec::new(),
        environment_json: String::new(),
        role: String::new(),
    };
    fit_to_wire(&mut r);
    r
}

/// The most of an error's text a result carries: a server's error can be
/// as long as a scenario makes it (`RAISE EXCEPTION` of 17 MB once made a
/// result the session could not carry, replayed after every registration
/// forever).
pub const MAX_ERROR_BYTES: usize = 64 << 10;

/// Room left in a session message for what is not the result's own text.
const WIRE_MARGIN: usize = 64 << 10;

/// Clips `text` to `max` bytes (at a character boundary), saying how much
/// was cut.
fn clip(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let total = text.len();
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(&format!(
        " … [clipped: {total} bytes, the first {cut} kept]"
    ));
}

/// Makes a result fit the session's messages, so it is sent once and
/// acknowledged, never refused and replayed: the error clipped, and when
/// the points or environment still do not fit, they are dropped and the
/// cell failed with why.
pub fn fit_to_wire(r: &mut CellResult) {
    use prost::Message;
    clip(&mut r.error, MAX_ERROR_BYTES);
    let limit = pgfleet_proto::MAX_MESSAGE_BYTES - WIRE_MARGIN;
    let len = r.encoded_len();
    if len <= limit {
        return;
    }
    r.points.clear();
    r.environment_json.clear();
    r.status = CellStatus::Failed as i32;
    let why = format!(
        "the cell's result was {len} bytes, more than the {limit} a session message carries: its points and environment were dropped"
    );
    r.error = if r.error.is_empty() {
        why
    } else {
        format!("{why}; {}", r.error)
    };
}

/// An error's causes, which say what a transport error really was.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = Vec::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push(c.to_string());
        cur = c.source();
    }
    out.join(": ")
}

fn msg(m: Msg) -> AgentMessage {
    AgentMessage { msg: Some(m) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgfleet_proto::v1::Point;
    use prost::Message;

    #[test]
    fn a_result_always_fits_the_session() {
        // A 17 MB server error: clipped, said so, the cell's points kept.
        let r = failed("c1", "x".repeat(17 << 20));
        assert!(r.encoded_len() < pgfleet_proto::MAX_MESSAGE_BYTES);
        assert!(r.error.len() < MAX_ERROR_BYTES + 100, "{}", r.error.len());
        assert!(
            r.error.contains("clipped: 17825792 bytes"),
            "{}",
            &r.error[MAX_ERROR_BYTES..]
        );
        // Multi-byte text is cut at a character boundary.
        let mut e = "é".repeat(MAX_ERROR_BYTES);
        clip(&mut e, MAX_ERROR_BYTES - 1);
        assert!(e.starts_with('é'));
        // Points too large to carry: dropped, the cell failed with why.
        let mut r = CellResult {
            cell_id: "c2".into(),
            status: CellStatus::Succeeded as i32,
            error: String::new(),
            points: (0..20)
                .map(|_| Point {
                    params_json: "{}".into(),
                    metrics_json: "1".repeat(1 << 20),
                })
                .collect(),
            environment_json: "{}".into(),
            role: String::new(),
        };
        fit_to_wire(&mut r);
        assert!(r.encoded_len() < pgfleet_proto::MAX_MESSAGE_BYTES);
        assert_eq!(r.status, CellStatus::Failed as i32);
        assert!(r.points.is_empty());
        assert!(r.error.contains("more than the"), "{}", r.error);
        // A result that fits is untouched.
        let mut ok = CellResult {
            cell_id: "c3".into(),
            status: CellStatus::Succeeded as i32,
            points: vec![Point::default()],
            ..Default::default()
        };
        let before = ok.clone();
        fit_to_wire(&mut ok);
        assert_eq!(ok, before);
    }
}
