//! The gRPC agent-session service and its server. Each session becomes
//! `events::Event`s for the hub, which routes them to the scheduler of the
//! run that holds the agent: `Registered` (with the agent's own queue back,
//! `ToAgent`), `Message`, and `Disconnected`. The service keeps no state.
//!
//! Security: a session must carry the join token (`authorization: Bearer
//! <token>` metadata, compared in constant time) or it is refused with
//! `unauthenticated` before anything else; the server speaks TLS when given
//! a certificate and key (agents then dial `https://` with `--ca`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::agent_session_server::{AgentSession, AgentSessionServer};
use pgfleet_proto::v1::{AgentMessage, ControllerMessage, Registered, controller_message};

use crate::events::{Event, OutStream, ToAgent};
use crate::hub::Hub;
use pgfleet_store::Error;
use pgfleet_store::Result;

pub struct SessionService {
    hub: Hub,
    lease: Duration,
    next_conn: AtomicU64,
    token: Option<String>,
}

impl SessionService {
    pub fn new(hub: Hub, lease: Duration, token: Option<String>) -> Self {
        SessionService {
            hub,
            lease,
            next_conn: AtomicU64::new(1),
            token,
        }
    }

    /// The session's join token must match (when the server has one).
    fn admit<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let Some(expected) = &self.token else {
            return Ok(());
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
            Ok(())
        } else {
            tracing::warn!(peer = ?req.remote_addr(), "refused an agent session: wrong or missing join token");
            Err(Status::unauthenticated(
                "wrong or missing join token: start the agent with the controller's token (--token-file)",
            ))
        }
    }
}

/// Equal bytes, in time that depends only on the lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How the session endpoint protects itself.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// PEM certificate (chain) and key: serve TLS.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// The join token agents must present.
    pub token: Option<String>,
}

#[tonic::async_trait]
impl AgentSession for SessionService {
    type SessionStream = OutStream;

    async fn session(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<OutStream>, Status> {
        self.admit(&req)?;
        // The agent's session span, if it sent one (W3C trace context).
        let traceparent = req
            .metadata()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let mut inbound = req.into_inner();
        let info = match inbound.message().await? {
            Some(AgentMessage {
                msg: Some(Msg::Register(r)),
            }) => r,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of a session must be `register`",
                ));
            }
        };
        if info.agent_id.is_empty() || info.instance_class.is_empty() {
            return Err(Status::invalid_argument(
                "register: agent_id and instance_class are required",
            ));
        }
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, out) = ToAgent::channel();
        let heartbeat = (self.lease / 5).max(Duration::from_millis(100));
        tx.send(ControllerMessage {
            msg: Some(controller_message::Msg::Registered(Registered {
                heartbeat_interval_ms: heartbeat.as_millis() as u32,
                lease_ms: self.lease.as_millis() as u32,
            })),
        });
        let agent_id = info.agent_id.clone();
        // The controller's side of the session, as long as it lasts: a
        // child of the agent's.
        let span = tracing::info_span!(
            target: "pgfleet",
            "agent session",
            agent_id = %info.agent_id,
            instance_class = %info.instance_class,
            postgres_version = %info.postgres_version,
            conn,
        );
        pgfleet_proto::telemetry::set_parent(&span, &traceparent);
        self.hub.route(Event::Registered { info, conn, tx }).await;
        let hub = self.hub.clone();
        tokio::spawn(
            async move {
                loop {
                    match inbound.message().await {
                        Ok(Some(AgentMessage { msg: Some(msg) })) => {
                            hub.route(Event::Message {
                                agent_id: agent_id.clone(),
                                conn,
                                msg,
                                received: std::time::Instant::now(),
                            })
                            .await;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
                hub.route(Event::Disconnected { agent_id, conn }).await;
            }
            .instrument(span),
        );
        Ok(Response::new(out))
    }
}

/// A running gRPC server; dropping the handle does not stop it, `shutdown` does.
pub struct Server {
    pub addr: SocketAddr,
    /// Whether it serves TLS (agents dial `https://`).
    pub tls: bool,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// The URL agents dial when nothing in between changes it.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Serves agent sessions on `bind` (port 0 picks a free port).
pub async fn listen(
    bind: SocketAddr,
    hub: Hub,
    lease: Duration,
    security: Security,
) -> Result<Server> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| Error::Server(format!("binding {bind}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Server(e.to_string()))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let svc = AgentSessionServer::new(SessionService::new(hub, lease, security.token))
        .max_decoding_message_size(pgfleet_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(pgfleet_proto::MAX_MESSAGE_BYTES);
    let mut builder = tonic::transport::Server::builder();
    let tls = security.tls.is_some();
    if let Some((cert, key)) = security.tls {
        builder = builder
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(tonic::transport::Identity::from_pem(cert, key)),
            )
            .map_err(|e| Error::Server(format!("TLS configuration: {e}")))?;
    }
    let task = tokio::spawn(async move {
        let r = builder
            .http2_keepalive_interval(Some(Duration::from_secs(5)))
            .add_service(svc)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "gRPC server ended");
        }
    });
    Ok(Server {
        addr,
        tls,
        stop,
        task,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        use super::constant_time_eq as eq;
        assert!(eq(b"s3cret", b"s3cret"));
        assert!(!eq(b"s3cret", b"s3creT"));
        assert!(!eq(b"s3cret", b"s3cre"));
        assert!(!eq(b"", b"x"));
    }
}
